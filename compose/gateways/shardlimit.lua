-- HAProxy action: ask shardlimit's forward-auth endpoint before a request goes on.
-- Sets txn.denied (bool), txn.retry_after and txn.ratelimit for the 429 deny rule and
-- the response headers, and txn.refused (bool) for the 400 one: shardlimit could not
-- read the question (no key header, or one sent twice). When shardlimit cannot be
-- asked the request goes on (fail open; change `on_error` to true to fail closed): the
-- router's health check (server `router` of backend `shardlimit`) is failing, or the
-- router does not answer within `timeout_s` a step, or answers with a 5xx. The question
-- goes on a connection of its own (HAProxy's Lua socket, whose steps the timeout bounds;
-- HAProxy 2.6's HTTP client takes none). A refused connection is retried 3 times a
-- second apart, hence the health check: while it fails nothing waits for those.
local on_error = false
local timeout_s = 1

-- Every line of a request header (HAProxy numbers them from 0), as a Lua list.
local function lines(headers, name)
  local values, list = headers[name], {}
  if values == nil then return list end
  local i = 0
  while values[i] ~= nil do
    list[#list + 1] = values[i]
    i = i + 1
  end
  return list
end

-- One GET of `path` from the router at `address` (host:port), every key a header line:
-- the status and the response's headers by lower-case name, or nil when no answer came.
local function ask(address, path, keys)
  local host, port = address:match("^(.+):(%d+)$")
  local socket = core.tcp()
  socket:settimeout(timeout_s)
  if not socket:connect(host, tonumber(port)) then
    socket:close()
    return nil
  end
  local request = { "GET " .. path .. " HTTP/1.1", "Host: " .. address, "Connection: close" }
  for _, key in ipairs(keys) do request[#request + 1] = "X-Api-Key: " .. key end
  local status, headers = nil, {}
  if socket:send(table.concat(request, "\r\n") .. "\r\n\r\n") then
    local line = socket:receive("*l")
    status = line and tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
    while status ~= nil do
      line = socket:receive("*l")
      if line == nil then status = nil elseif line == "" then break
      else
        local name, value = line:match("^([^:]+):%s*(.-)%s*$")
        if name ~= nil then headers[name:lower()] = value end
      end
    end
  end
  socket:close()
  return status, headers
end

core.register_action("shardlimit_authz", { "http-req" }, function(txn)
  -- Every X-Api-Key line goes on, so shardlimit sees a key sent twice and refuses it:
  -- the app behind may read one line and a limit keyed by another would not bind it.
  local keys = lines(txn.http:req_get_headers(), "x-api-key")
  local router = core.backends["shardlimit"].servers["router"]
  local status, headers = nil, {}
  if router:get_stats()["status"] ~= "DOWN" then
    status, headers = ask(router:get_addr(), os.getenv("SHARDLIMIT_AUTHZ"), keys)
  end
  txn:set_var("txn.refused", false)
  if status == nil or status >= 500 then
    txn:set_var("txn.denied", on_error)
    return
  end
  if status ~= 204 and status ~= 429 then
    txn:set_var("txn.denied", false)
    txn:set_var("txn.refused", true)
    return
  end
  if headers["ratelimit"] ~= nil then txn:set_var("txn.ratelimit", headers["ratelimit"]) end
  if status == 429 then
    txn:set_var("txn.denied", true)
    txn:set_var("txn.retry_after", headers["retry-after"] or "1")
  else
    txn:set_var("txn.denied", false)
  end
end)
