package redisstore

// The Lua scripts. Every mutation is one script, so Redis applies it
// whole or not at all, and writes it to its AOF and its replicas as one
// transaction.
//
// Each script gets the session's hash as KEYS[1] and the session's key
// prefix "<prefix>:{<sid>}:" as ARGV[1], and derives the session's other
// keys from it: they all carry the same hash tag, so they live in the
// session's slot. Keys under the prefix P = "<prefix>:{<sid>}:":
//
//	P s        hash   r: session record; u: the latest use TouchSession
//	                  recorded (unix nanos); L: "1" once the session
//	                  listens (eventlog.Session.Listening; a field of its
//	                  own, so that r keeps the format older replicas read);
//	                  ne, nb: retained events and bytes;
//	                  ns: last stream number; zs: stale runs in P o
//	P k        hash   stream key → stream number
//	P m:<num>  hash   k: stream key; g: generation; q: request ID (absent
//	                  for nil); l: LastSeq; n, b: retained events and bytes;
//	                  r: runs of this stream in P o; z: events at the
//	                  front of this stream's runs in P o that were dropped
//	                  by a skip (see scriptAppend); t: terminal time (ms,
//	                  Redis clock), absent while the stream is open;
//	                  i: the batch ID of the last append (see scriptAppend)
//	P e:<num>  stream one entry per retained event, ID "<seq>-0",
//	                  fields d: data, then t: type when not ""
//	P o        list   the session's retained events in append order,
//	                  run-length encoded: "<num>:<count>", oldest first
//	P x        zset   terminal streams by terminal time
//	P f        string the fencing counter (INCR), created by the first lease
//	P l        string the lease: "<token> @<id>.<epoch> <owner>", live
//	                  while "<prefix>:h:<id>", the owner's heartbeat (a
//	                  string with a TTL, outside the tag), holds epoch; an
//	                  earlier version's "<token> <owner>" has a TTL of its
//	                  own (lease.go)
//
// Errors are returned as error replies whose text is one of the codes
// below; the Go side maps them to sentinels.

// Error reply codes.
const (
	codeNotFound  = "NOTFOUND"
	codeExists    = "EXISTS"
	codeTerminal  = "TERMINAL"
	codeFenced    = "FENCED"
	codeLeaseLost = "LEASELOST"
)

// luaCommon is prepended to every writing script.
const luaCommon = `
local base = ARGV[1]
local function fenced(tok)
  local f = redis.call('GET', base .. 'f')
  return f and f ~= tok
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function compact()
  local runs = redis.call('LRANGE', base .. 'o', 0, -1)
  local out, counts = {}, {}
  local lastnum, lastc = nil, 0
  for _, run in ipairs(runs) do
    local num, c = string.match(run, '^(%d+):(%d+)$')
    if redis.call('EXISTS', base .. 'm:' .. num) == 1 then
      if num == lastnum then
        lastc = lastc + tonumber(c)
        out[#out] = num .. ':' .. lastc
      else
        out[#out + 1] = run
        lastnum, lastc = num, tonumber(c)
        counts[num] = (counts[num] or 0) + 1
      end
    end
  end
  redis.call('DEL', base .. 'o')
  for i = 1, #out, 1000 do
    redis.call('RPUSH', base .. 'o', unpack(out, i, math.min(i + 999, #out)))
  end
  for num, r in pairs(counts) do
    redis.call('HSET', base .. 'm:' .. num, 'r', r)
  end
  redis.call('HSET', KEYS[1], 'zs', 0)
end
local function drop_stream(num)
  local mk = base .. 'm:' .. num
  local m = redis.call('HMGET', mk, 'k', 'n', 'b', 'r')
  if not m[1] then return end
  redis.call('UNLINK', mk, base .. 'e:' .. num)
  redis.call('HDEL', base .. 'k', m[1])
  redis.call('ZREM', base .. 'x', num)
  redis.call('HINCRBY', KEYS[1], 'ne', -tonumber(m[2]))
  redis.call('HINCRBY', KEYS[1], 'nb', -tonumber(m[3]))
  local zs = redis.call('HINCRBY', KEYS[1], 'zs', tonumber(m[4]))
  if zs > 16 and 4 * zs > redis.call('LLEN', base .. 'o') then compact() end
end
local function expire(now, grace)
  local due = redis.call('ZRANGEBYSCORE', base .. 'x', '-inf', now - grace)
  for _, num in ipairs(due) do drop_stream(num) end
end
`

// scriptCreateSession: ARGV base, token, record, listening ("1" or "").
const scriptCreateSession = luaCommon + `
if fenced(ARGV[2]) then return redis.error_reply('FENCED') end
if redis.call('HSETNX', KEYS[1], 'r', ARGV[3]) == 0 then return redis.error_reply('EXISTS') end
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'L', '1') end
return 1
`

// scriptUpdateSession: ARGV base, token, record, listening ("1" or "").
const scriptUpdateSession = luaCommon + `
if fenced(ARGV[2]) then return redis.error_reply('FENCED') end
if redis.call('HEXISTS', KEYS[1], 'r') == 0 then return redis.error_reply('NOTFOUND') end
redis.call('HSET', KEYS[1], 'r', ARGV[3])
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'L', '1') else redis.call('HDEL', KEYS[1], 'L') end
return 1
`

// scriptTouchSession: KEYS[1] the session's hash; ARGV[1] a use, in unix
// nanoseconds as 19 digits (so that string order is time order; Lua's
// numbers would round them). Field "u" keeps the latest use recorded this
// way, beside the record's own LastUsed. Not fenced: any replica serving
// the session's streams records uses.
const scriptTouchSession = `
if redis.call('HEXISTS', KEYS[1], 'r') == 0 then return redis.error_reply('NOTFOUND') end
local u = redis.call('HGET', KEYS[1], 'u')
if not u or u < ARGV[1] then redis.call('HSET', KEYS[1], 'u', ARGV[1]) end
return 1
`

// scriptDeleteSession: ARGV base, watch channel prefix. Returns the
// session's stream keys, and wakes their watchers.
const scriptDeleteSession = luaCommon + `
if redis.call('HEXISTS', KEYS[1], 'r') == 0 then return redis.error_reply('NOTFOUND') end
local ks = redis.call('HGETALL', base .. 'k')
local keys = {}
for i = 1, #ks, 2 do
  keys[#keys + 1] = ks[i]
  redis.call('UNLINK', base .. 'm:' .. ks[i + 1], base .. 'e:' .. ks[i + 1])
  redis.call('PUBLISH', ARGV[2] .. ks[i], 0)
end
redis.call('UNLINK', KEYS[1], base .. 'k', base .. 'o', base .. 'x', base .. 'f', base .. 'l')
return keys
`

// scriptCreateStream: ARGV base, token, key, generation, request ID, "1"
// if the request ID is nil.
const scriptCreateStream = luaCommon + `
if fenced(ARGV[2]) then return redis.error_reply('FENCED') end
if redis.call('HEXISTS', KEYS[1], 'r') == 0 then return redis.error_reply('NOTFOUND') end
if redis.call('HEXISTS', base .. 'k', ARGV[3]) == 1 then return redis.error_reply('EXISTS') end
local num = redis.call('HINCRBY', KEYS[1], 'ns', 1)
redis.call('HSET', base .. 'k', ARGV[3], num)
local mk = base .. 'm:' .. num
redis.call('HSET', mk, 'k', ARGV[3], 'g', ARGV[4], 'l', 0, 'n', 0, 'b', 0, 'r', 0)
if ARGV[6] ~= '1' then redis.call('HSET', mk, 'q', ARGV[5]) end
return 1
`

// scriptAppend: ARGV base, token, key, terminal ("1" or "0"), MaxEvents,
// MaxBytes, TerminalGrace (ms), channel, floor, batch ID, then type and
// data of each event. Returns {new LastSeq, stream number}.
//
// The batch ID makes a retried append idempotent: when the stream's last
// append carried the same ID, the events are there already (the append
// ran, its answer was lost: Redis killed before it replied, a connection
// cut), and the script returns as if it had appended them now. A stream
// has one appender at a time (its session's owner, fenced), so the last
// append is the one to compare with.
//
// floor is "<stream number>:<seq>": the highest seq of the stream the
// caller has seen, or "" if it knows none. If LastSeq
// is below it, Redis lost acknowledged appends (a restart without fsync,
// a failover to a lagging replica): the seqs up to floor may be held by
// clients, so the stream skips to floor, and its retained events are
// dropped so that every reader behind floor sees a hole (FirstSeq jumps)
// instead of silently missing the lost events.
const scriptAppend = luaCommon + `
if fenced(ARGV[2]) then return redis.error_reply('FENCED') end
local now = now_ms()
local grace = tonumber(ARGV[7])
expire(now, grace)
local num = redis.call('HGET', base .. 'k', ARGV[3])
if not num then return redis.error_reply('NOTFOUND') end
local mk = base .. 'm:' .. num
local m = redis.call('HMGET', mk, 'l', 'n', 'b', 'r', 't', 'z', 'i')
local l, n, b, r = tonumber(m[1]), tonumber(m[2]), tonumber(m[3]), tonumber(m[4])
if ARGV[10] ~= '' and m[7] == ARGV[10] then return {l, tonumber(num)} end
if m[5] then return redis.error_reply('TERMINAL') end
local cnt = (#ARGV - 10) / 2
if cnt == 0 then return {l, tonumber(num)} end
local ek = base .. 'e:' .. num
local fnum, floor = string.match(ARGV[9], '^(%d+):(%d+)$')
floor = tonumber(floor)
if fnum == num and l < floor then
  redis.call('XTRIM', ek, 'MINID', (floor + 1) .. '-0')
  redis.call('HINCRBY', KEYS[1], 'ne', -n)
  redis.call('HINCRBY', KEYS[1], 'nb', -b)
  redis.call('HSET', mk, 'z', tonumber(m[6] or 0) + n)
  l, n, b = floor, 0, 0
end
local added = 0
for i = 11, #ARGV, 2 do
  l = l + 1
  if ARGV[i] == '' then
    redis.call('XADD', ek, l .. '-0', 'd', ARGV[i + 1])
  else
    redis.call('XADD', ek, l .. '-0', 'd', ARGV[i + 1], 't', ARGV[i])
  end
  added = added + #ARGV[i + 1]
end
local ok = base .. 'o'
local tail = redis.call('LINDEX', ok, -1)
local tnum, tc
if tail then tnum, tc = string.match(tail, '^(%d+):(%d+)$') end
if tnum == num then
  redis.call('LSET', ok, -1, num .. ':' .. (tonumber(tc) + cnt))
else
  redis.call('RPUSH', ok, num .. ':' .. cnt)
  r = r + 1
end
redis.call('HSET', mk, 'l', l, 'n', n + cnt, 'b', b + added, 'r', r, 'i', ARGV[10])
if ARGV[4] == '1' then
  redis.call('HSET', mk, 't', now)
  redis.call('ZADD', base .. 'x', now, num)
end
local ne = redis.call('HINCRBY', KEYS[1], 'ne', cnt)
local nb = redis.call('HINCRBY', KEYS[1], 'nb', added)
local maxe, maxb = tonumber(ARGV[5]), tonumber(ARGV[6])
if ne > maxe or nb > maxb then
  local zs = tonumber(redis.call('HGET', KEYS[1], 'zs') or 0)
  while (ne > maxe or nb > maxb) and ne > 1 do
    local head = redis.call('LINDEX', ok, 0)
    if not head then break end
    local hnum, hc = string.match(head, '^(%d+):(%d+)$')
    hc = tonumber(hc)
    local hmk = base .. 'm:' .. hnum
    local hm = redis.call('HMGET', hmk, 'l', 'n', 'b', 'r', 'z')
    local hz = tonumber(hm[5] or 0)
    if not hm[1] then
      redis.call('LPOP', ok)
      zs = zs - 1
    elseif hz > 0 then
      local k = math.min(hz, hc)
      local hr = tonumber(hm[4])
      if k == hc then
        redis.call('LPOP', ok)
        hr = hr - 1
      else
        redis.call('LSET', ok, 0, hnum .. ':' .. (hc - k))
      end
      redis.call('HSET', hmk, 'z', hz - k, 'r', hr)
    else
      local hl, hn, hb, hr = tonumber(hm[1]), tonumber(hm[2]), tonumber(hm[3]), tonumber(hm[4])
      local hek = base .. 'e:' .. hnum
      local first = hl - hn + 1
      local k, freed = 0, 0
      while k < hc and (ne > maxe or nb > maxb) and ne > 1 do
        local id = (first + k) .. '-0'
        local e = redis.call('XRANGE', hek, id, id)
        local sz = 0
        if e[1] then sz = #e[1][2][2] end
        k, ne, nb, freed = k + 1, ne - 1, nb - sz, freed + sz
      end
      redis.call('XTRIM', hek, 'MINID', (first + k) .. '-0')
      if k == hc then
        redis.call('LPOP', ok)
        hr = hr - 1
      else
        redis.call('LSET', ok, 0, hnum .. ':' .. (hc - k))
      end
      redis.call('HSET', hmk, 'n', hn - k, 'b', hb - freed, 'r', hr)
    end
  end
  redis.call('HSET', KEYS[1], 'ne', ne, 'nb', nb, 'zs', zs)
end
redis.call('PUBLISH', ARGV[8], l)
return {l, tonumber(num)}
`

// scriptStreams: ARGV base, TerminalGrace (ms). Returns one {key,
// generation, request ID or nil, LastSeq, retained count, terminal time or
// nil} per live stream.
const scriptStreams = `
local base = ARGV[1]
local ks = redis.call('HGETALL', base .. 'k')
if #ks == 0 then return {} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grace = tonumber(ARGV[2])
local out = {}
for i = 1, #ks, 2 do
  local m = redis.call('HMGET', base .. 'm:' .. ks[i + 1], 'g', 'q', 'l', 'n', 't')
  if m[1] and not (m[5] and now - tonumber(m[5]) >= grace) then
    out[#out + 1] = {ks[i], m[1], m[2], m[3], m[4], m[5]}
  end
end
return out
`

// luaLease is prepended to the lease scripts: parse reads a lease's value,
// "<token> @<id>.<epoch> <owner>" (live while the heartbeat id holds
// epoch), or an earlier version's "<token> <owner>" (with a TTL; stamp
// ”). parseLease in lease.go reads it the same way.
const luaLease = `
local function parse(v)
  local tok, stamp, own = string.match(v, '^(%d+) @([^ ]*%.[^ ]*) (.*)$')
  if tok then return tok, stamp, own end
  tok, own = string.match(v, '^(%d+) (.*)$')
  return tok, '', own
end
`

// scriptBeat: KEYS[1] an owner's heartbeat key; ARGV epoch, next epoch, ttl
// (ms). Returns 1 if the heartbeat still held epoch (its TTL raised to ttl
// if lower), 0 if it had lapsed: it then holds the next epoch, for ttl.
const scriptBeat = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  return 1
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 0
`

// scriptAcquire: KEYS[1] the lease key; ARGV base, owner, stamp, and the
// value of a lease the caller found dead (its heartbeat gone), or ”.
// Returns {1, token, owner} when acquired (or already held by owner, whose
// token stays and whose lease is re-stamped), else {0, token, owner,
// stamp, value, remaining ttl}: the caller checks the stamp's heartbeat
// and may call again with the value.
const scriptAcquire = luaLease + `
local base = ARGV[1]
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[4] then
  local tok, stamp, own = parse(cur)
  if own ~= ARGV[2] then return {0, tok, own, stamp, cur, redis.call('PTTL', KEYS[1])} end
  redis.call('SET', KEYS[1], tok .. ' @' .. ARGV[3] .. ' ' .. own)
  return {1, tok, own}
end
local tok = tostring(redis.call('INCR', base .. 'f'))
redis.call('SET', KEYS[1], tok .. ' @' .. ARGV[3] .. ' ' .. ARGV[2])
return {1, tok, ARGV[2]}
`

// scriptRestamp: KEYS[1] the lease key; ARGV base, token, owner, stamp.
// Stamps the lease with the caller's live heartbeat epoch, as long as
// nobody acquired the session since the lease was taken (the fencing
// counter still equals its token).
const scriptRestamp = `
local want = ARGV[2] .. ' @' .. ARGV[4] .. ' ' .. ARGV[3]
local cur = redis.call('GET', KEYS[1])
if cur == want then return 1 end
if redis.call('GET', ARGV[1] .. 'f') == ARGV[2] then
  redis.call('SET', KEYS[1], want)
  return 1
end
return redis.error_reply('LEASELOST')
`

// scriptRelease: KEYS[1] the lease key; ARGV token, owner.
const scriptRelease = luaLease + `
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local tok, _, own = parse(cur)
if tok ~= ARGV[1] or own ~= ARGV[2] then return redis.error_reply('LEASELOST') end
redis.call('DEL', KEYS[1])
return 1
`

// scriptHolder: KEYS[1] the lease key. Returns {value, ttl} or nil.
const scriptHolder = `
local cur = redis.call('GET', KEYS[1])
if not cur then return false end
return {cur, redis.call('PTTL', KEYS[1])}
`

// scriptDeleteIndex: KEYS[1] a stream index key; ARGV session. Deletes the
// index entry only if it still names that session.
const scriptDeleteIndex = `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`

// scriptSwapIndex: KEYS[1] a stream index key; ARGV old session, new
// session. Replaces the entry only if it still names the old session.
const scriptSwapIndex = `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
`
