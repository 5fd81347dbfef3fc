-- HAProxy action: ask shardlimit's forward-auth endpoint before a request goes on.
-- Sets txn.denied (bool), txn.retry_after and txn.ratelimit for the deny rule and the
-- response headers. If shardlimit cannot be reached the request goes on (fail open);
-- change `on_error` to true to fail closed.
local on_error = false

local function first(headers, name)
  local values = headers[name]
  if values == nil then return nil end
  return values[0] or values[1]
end

core.register_action("shardlimit_authz", { "http-req" }, function(txn)
  local url = os.getenv("SHARDLIMIT_AUTHZ")
  local key = txn.sf:req_hdr("X-Api-Key")
  local client = core.httpclient()
  local res = client:get{ url = url, headers = { ["X-Api-Key"] = { key } } }
  if res == nil or res.status == nil or (res.status ~= 204 and res.status ~= 429) then
    txn:set_var("txn.denied", on_error)
    return
  end
  local ratelimit = first(res.headers, "ratelimit")
  if ratelimit ~= nil then txn:set_var("txn.ratelimit", ratelimit) end
  if res.status == 429 then
    txn:set_var("txn.denied", true)
    txn:set_var("txn.retry_after", first(res.headers, "retry-after") or "1")
  else
    txn:set_var("txn.denied", false)
  end
end)
