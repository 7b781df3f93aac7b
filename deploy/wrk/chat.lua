-- wrk script: small chat completions against a simulator or the gateway.
-- wrk -t1 -c64 -d10s -s deploy/wrk/chat.lua http://127.0.0.1:PORT/v1/chat/completions
-- Override the model, send an API key, and ask for longer or streamed answers with:
--   wrk ... -s deploy/wrk/chat.lua URL -- MODEL [KEY|""] [MAX_TOKENS] [stream]
local model = "sim-model"

function init(args)
  if #args > 0 then model = args[1] end
  if #args > 1 and args[2] ~= "" then wrk.headers["Authorization"] = "Bearer " .. args[2] end
  local max_tokens = tonumber(args[3] or "8")
  local stream = args[4] == "stream"
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = '{"model":"' .. model .. '","messages":[{"role":"user","content":"Say hello in a few words."}],"max_tokens":' .. max_tokens .. (stream and ',"stream":true' or '') .. '}'
end
