  -- The fence counter must be missing or a string holding an integer.
  local v = redis.pcall('get', KEYS[2])
  if type(v) == 'table' then return type_error(KEYS[2], 'string') end
  if v and not string.match(v, '^%-?%d+$') then
    return redis.error_reply('WRONGTYPE remutex non-integer ' .. KEYS[2])
  end
