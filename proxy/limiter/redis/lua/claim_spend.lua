-- Take a held estimate (ledger.py): its record, once (a write sent again cannot hold it
-- again: record_spend.lua adds each write once).
-- KEYS[1]: the estimate's key. Reply: {record}, or {false}: none held, or taken already.
local record = redis.call('GET', KEYS[1])
if record then
  redis.call('DEL', KEYS[1])
end
return {record}
