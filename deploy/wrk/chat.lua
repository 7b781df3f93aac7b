-- wrk script: small chat completions against a simulator or the gateway.
-- wrk -t1 -c64 -d10s -s deploy/wrk/chat.lua http://127.0.0.1:PORT/v1/chat/completions
-- Override the model, send an API key, and ask for longer or streamed answers with:
--   wrk ... -s deploy/wrk/chat.lua URL -- MODEL [KEY|""] [MAX_TOKENS] [stream|""] [SYSTEM_WORDS]
-- SYSTEM_WORDS > 0 sends a system prompt of that many words (the same on every call, as
-- an app's is) and a numbered question, so every call's prompt is new past the system
-- prompt, as real traffic is; without it every call sends the same tiny body.
local model = "sim-model"
local template = nil
local n = 0

-- Set as wrk's request() only with a system prompt: without one, wrk sends its one static
-- request and the script costs nothing per call.
local function numbered()
  n = n + 1
  return wrk.format(nil, nil, nil, string.format(template, n, n))
end

function init(args)
  if #args > 0 then model = args[1] end
  if #args > 1 and args[2] ~= "" then wrk.headers["Authorization"] = "Bearer " .. args[2] end
  local max_tokens = tonumber(args[3] or "8")
  local stream = args[4] == "stream"
  local system_words = tonumber(args[5] or "0")
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  local tail = '],"max_tokens":' .. max_tokens .. (stream and ',"stream":true' or '') .. '}'
  if system_words > 0 then
    local words = {}
    for i = 1, system_words do words[i] = "word" .. (i % 97) end
    template = '{"model":"' .. model .. '","messages":[{"role":"system","content":"'
      .. table.concat(words, " ") .. '"},{"role":"user","content":"Question %d: what '
      .. 'does the passage above say about item %d?"}' .. tail
    request = numbered
  else
    wrk.body = '{"model":"' .. model .. '","messages":[{"role":"user","content":"Say hello in a few words."}' .. tail
  end
end
