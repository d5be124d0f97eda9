  -- The lock's hash is a key of another type: name it; write nothing.
  local t = redis.call('type', KEYS[1])
  if type(t) == 'table' then t = t['ok'] end
  return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. KEYS[1])
