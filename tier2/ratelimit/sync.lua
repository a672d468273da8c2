-- sync.lua: one tenant's limiter call, run atomically by Redis.
--
-- KEYS: the tenant's keys, all with the {tenant} hash tag (one cluster slot).
-- ARGV[1]: JSON array of ops (the op type in protocol.go is the schema).
-- ARGV[2]: this replica's id (concurrency holdings are per replica).
-- Returns resultWidth (protocol.go) integers per op, in op order:
--   denied, granted, bucket, used, retry_ms, reset_ms, busy, mine.
--
-- Every op is checked first and grants are made only if all needs fit, so
-- an admission is all-or-nothing across RPM, TPM, concurrency and budget.
-- Redis TIME is the only clock, so replicas' clocks do not matter.
-- memBackend (membackend.go) implements the same semantics in process;
-- protocol_test.go runs the same table on both.
local ops = cjson.decode(ARGV[1])
local rep = ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ok = true
local st = {}
for i, op in ipairs(ops) do
  local s = {used = 0, retry = -1, denied = 0, cur = 0, newest = -1, busy = 0, mine = 0}
  st[i] = s
  local key = KEYS[op.key]
  if op.k == 'w' then
    local w, n = op.w, op.n
    local cur = math.floor(now / w)
    local first = cur - n + 1
    s.cur = cur
    if not op.ro then
      if op.ref then
        for _, r in ipairs(op.ref) do
          if r[1] >= first and r[1] <= cur then
            local v = redis.call('HINCRBY', key, r[1], -r[2])
            if v <= 0 then redis.call('HDEL', key, r[1]) end
          end
        end
      end
      if op.debt and op.debt > 0 then
        redis.call('HINCRBY', key, cur, op.debt)
        redis.call('PEXPIRE', key, (n + 1) * w)
      end
    end
    local all = redis.call('HGETALL', key)
    local buckets = {}
    for j = 1, #all, 2 do
      local b, v = tonumber(all[j]), tonumber(all[j + 1])
      if b < first then
        if not op.ro then redis.call('HDEL', key, all[j]) end
      elseif v > 0 then
        s.used = s.used + v
        buckets[#buckets + 1] = {b, v}
        if b > s.newest then s.newest = b end
      end
    end
    if op.need > 0 and s.used + op.need > op.lim then
      ok = false
      s.denied = 1
      if op.need <= op.lim then
        table.sort(buckets, function(a, b) return a[1] < b[1] end)
        local excess = s.used + op.need - op.lim
        for _, bv in ipairs(buckets) do
          excess = excess - bv[2]
          if excess <= 0 then s.retry = (bv[1] + n) * w - now; break end
        end
      end
    end
  elseif op.k == 'b' then
    local used = tonumber(redis.call('GET', key) or '0')
    if not op.ro and op.delta and op.delta ~= 0 then
      used = redis.call('INCRBY', key, op.delta)
      if used < 0 then redis.call('SET', key, 0); used = 0 end
      redis.call('EXPIREAT', key, op.exp)
    end
    s.used = used
    if op.need > 0 and used + op.need > op.lim then
      ok = false
      s.denied = 1
      s.retry = op.rst or 0
    end
  elseif op.k == 'c' then
    local dkey = KEYS[op.dkey]
    local ukey = op.ukey and KEYS[op.ukey]
    if not op.ro then
      local dead = redis.call('ZRANGEBYSCORE', dkey, '-inf', now)
      for _, r in ipairs(dead) do
        redis.call('HDEL', key, r)
        redis.call('ZREM', dkey, r)
        if ukey then redis.call('HDEL', ukey, r) end
      end
    end
    local all = redis.call('HGETALL', key)
    local others = 0
    for j = 1, #all, 2 do
      if op.ro then
        -- Usage: live holders only (dead ones are purged by the next
        -- write), with the slots each reported in use.
        local dl = tonumber(redis.call('ZSCORE', dkey, all[j]) or '0')
        if dl > now then
          others = others + tonumber(all[j + 1])
          local b = 0
          if ukey then b = tonumber(redis.call('HGET', ukey, all[j]) or '0') end
          if all[j] == rep then s.mine = b else s.busy = s.busy + b end
        end
      elseif all[j] ~= rep then
        others = others + tonumber(all[j + 1])
      end
    end
    s.others = others
    op.inuse = op.inuse or 0
    s.used = others + op.inuse
    if op.need > 0 and others + op.inuse + op.need > op.lim then
      ok = false
      s.denied = 1
    end
  end
end
local out = {}
for i, op in ipairs(ops) do
  local s = st[i]
  local key = KEYS[op.key]
  local grant = 0
  if op.ro then
    -- usage only
  elseif op.k == 'w' then
    if ok then
      local ask = math.max(math.min(op.ask, op.lim - s.used - op.need - (op.rsv or 0)), 0)
      grant = math.min(op.need + ask, math.max(op.lim - s.used, 0))
      if grant > 0 then
        redis.call('HINCRBY', key, s.cur, grant)
        redis.call('PEXPIRE', key, (op.n + 1) * op.w)
        s.used = s.used + grant
        s.newest = s.cur
      end
    end
  elseif op.k == 'b' then
    if ok then
      local ask = math.max(math.min(op.ask, op.lim - s.used - op.need - (op.rsv or 0)), 0)
      grant = math.min(op.need + ask, math.max(op.lim - s.used, 0))
      if grant > 0 then
        s.used = redis.call('INCRBY', key, grant)
        redis.call('EXPIREAT', key, op.exp)
      end
    end
  elseif op.k == 'c' then
    local mine = op.inuse
    if ok then
      mine = op.inuse + math.min(op.need + op.ask, math.max(op.lim - s.others - op.inuse, 0))
    end
    grant = mine - op.inuse
    local dkey = KEYS[op.dkey]
    local ukey = op.ukey and KEYS[op.ukey]
    if mine > 0 then
      redis.call('HSET', key, rep, mine)
      redis.call('ZADD', dkey, now + op.ttl, rep)
      redis.call('PEXPIRE', key, op.ttl * 4)
      redis.call('PEXPIRE', dkey, op.ttl * 4)
      if ukey then
        local busy = op.busy or 0
        if ok then busy = busy + (op.adm or 0) end
        busy = math.min(busy, mine)
        if busy > 0 then
          redis.call('HSET', ukey, rep, busy)
          redis.call('PEXPIRE', ukey, op.ttl * 4)
        else
          redis.call('HDEL', ukey, rep)
        end
      end
    else
      redis.call('HDEL', key, rep)
      redis.call('ZREM', dkey, rep)
      if ukey then redis.call('HDEL', ukey, rep) end
    end
    s.used = s.others + mine
  end
  local reset = 0
  if op.k == 'w' and s.newest >= 0 then reset = (s.newest + op.n) * op.w - now end
  if op.k == 'b' then reset = op.rst or 0 end
  out[#out + 1] = s.denied
  out[#out + 1] = grant
  out[#out + 1] = s.cur
  out[#out + 1] = s.used
  out[#out + 1] = s.retry
  out[#out + 1] = reset
  out[#out + 1] = s.busy
  out[#out + 1] = s.mine
end
return out
