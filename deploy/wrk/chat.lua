-- wrk script: small non-streaming chat completions against a simulator or the gateway.
-- wrk -t1 -c64 -d10s -s deploy/wrk/chat.lua http://127.0.0.1:PORT/v1/chat/completions
-- Override the model, and send an API key, with:  wrk ... -s deploy/wrk/chat.lua URL -- MODEL [KEY]
local model = "sim-model"

function init(args)
  if #args > 0 then model = args[1] end
  if #args > 1 then wrk.headers["Authorization"] = "Bearer " .. args[2] end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = '{"model":"' .. model .. '","messages":[{"role":"user","content":"Say hello in a few words."}],"max_tokens":8}'
end
