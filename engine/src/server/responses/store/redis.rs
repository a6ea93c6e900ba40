//! The Redis backend, for several replicas sharing one store: a response is a hash holding its
//! own part (expiring at the age bound, or later while a child still links to it), indexed by
//! creation time in a sorted set, its size in a hash beside a running byte total, its children
//! in a set of their own, and its conversation's responses in a sorted set of their own (so
//! the conversation falls back to its previous response when the newest is deleted, as SQLite
//! does).
//!
//! Every write is one server-side script, atomic across replicas: a save stores the response
//! and trims what is over the bounds in the same step, oldest first, its work proportional to
//! what it drops (never a read of the whole index); a delete removes every key the response
//! owns, its place in its conversation included. Either folds a removed response's part into
//! its children in the same script, and a read walks a chain in one script, so no reader sees
//! a chain half changed. The connection is the crate's connection manager: it reconnects by
//! itself after a restart of Redis or a network blip, and every connect and every command has
//! a deadline ([`RedisTimeouts`]), so a Redis that is down costs a request at most those,
//! never a hang.
//!
//! A part's fields: `head` (the response's JSON but its items and ids), `input`, `output` and
//! `history` (JSON arrays of each item's JSON text, so that a fold moves items without
//! re-encoding them), `inherit` and `shared` (the counts it takes from its link), `prompt` and
//! `reply` (JSON arrays of ids), `link`, and `until` (when it expires, Unix seconds: its key
//! lives on while a descendant needs it). A response of the earlier, full-copy form is a string
//! key (`r:`), read as before and dropped with the rest; its continuations are stored
//! self-contained.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chain::{self, MAX_CHAIN, Part};
use super::{StoreError, StoreLimits, StoredResponse, unix_now};

/// The prefix of every key the store writes.
const PREFIX: &str = "slotlight:responses:";

/// A response's key in the earlier, full-copy form (a string of its JSON).
#[cfg(test)]
fn response_key(id: &str) -> String {
    format!("{PREFIX}r:{id}")
}

/// A response's part (a hash).
#[cfg(test)]
fn part_key(id: &str) -> String {
    format!("{PREFIX}h:{id}")
}

/// The sorted set of a conversation's responses by creation time. (`cs:`, not the `c:`
/// pointer of earlier versions, which expires by itself.)
fn conversation_key(conversation: &str) -> String {
    format!("{PREFIX}cs:{conversation}")
}

fn index_key() -> String {
    format!("{PREFIX}index")
}

fn sizes_key() -> String {
    format!("{PREFIX}sizes")
}

/// Each response's conversation, to find its place there when it is dropped.
fn conversations_key() -> String {
    format!("{PREFIX}conversations")
}

/// The bytes of every indexed response, kept by the scripts.
fn total_key() -> String {
    format!("{PREFIX}bytes")
}

/// Drops one response and everything it owns, its part folded into each child first; shared
/// by the save and delete scripts. The byte total is decreased by its recorded size (and
/// changed by its children's growth); the result says whether it was there.
const DROP_FN: &str = r#"
local prefix = ARGV[1]
local function arr(s)
  if not s or s == '' then return {} end
  return cjson.decode(s)
end
local function enc(t)
  if #t == 0 then return '[]' end
  return cjson.encode(t)
end
local function num(s) return tonumber(s or '0') or 0 end
local function append(to, from)
  for _, v in ipairs(from) do to[#to + 1] = v end
  return to
end
local function size_of(key)
  local n = 0
  for _, v in ipairs(redis.call('HVALS', key)) do n = n + #v end
  return n
end
-- The response `cid`'s recorded size is now that of its part (the byte total follows).
local function resize(cid)
  if redis.call('HEXISTS', KEYS[2], cid) == 0 then return end
  local before = tonumber(redis.call('HGET', KEYS[2], cid) or '0')
  local after = size_of(prefix .. 'h:' .. cid)
  redis.call('HSET', KEYS[2], cid, after)
  redis.call('INCRBY', KEYS[4], after - before)
end
-- Folds the part of `pid` (being removed; its link `plink`) into its child `cid`: the child
-- then links to `plink` (or none) and reads back the same. A child asking for more than the
-- parent holds was damaged already: it is left as it is (its link dangling, reading it an
-- error).
local function fold(pid, plink, cid)
  local ckey = prefix .. 'h:' .. cid
  if redis.call('HGET', ckey, 'link') ~= pid then return end
  local p = redis.call('HMGET', prefix .. 'h:' .. pid,
    'inherit', 'history', 'input', 'output', 'shared', 'prompt', 'reply')
  local c = redis.call('HMGET', ckey, 'inherit', 'history', 'shared', 'prompt')
  local own = append(append(arr(p[2]), arr(p[3])), arr(p[4]))
  local ids = append(arr(p[6]), arr(p[7]))
  local kp, kc, sp, sc = num(p[1]), num(c[1]), num(p[5]), num(c[3])
  if kc > #own + kp or (sc > sp and sc - sp > #ids) then return end
  local take = math.min(kc, #own)
  local history = {}
  for i = #own - take + 1, #own do history[#history + 1] = own[i] end
  redis.call('HSET', ckey, 'history', enc(append(history, arr(c[2]))), 'inherit', kc - take)
  if sc > sp then
    local prompt = {}
    for i = 1, sc - sp do prompt[#prompt + 1] = ids[i] end
    redis.call('HSET', ckey, 'prompt', enc(append(prompt, arr(c[4]))), 'shared', sp)
  end
  if plink then
    redis.call('HSET', ckey, 'link', plink)
    redis.call('SADD', prefix .. 'k:' .. plink, cid)
  else
    redis.call('HDEL', ckey, 'link')
  end
  resize(cid)
end
local function drop(id)
  local size = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  local existed = redis.call('DEL', prefix .. 'r:' .. id)
  local hkey, kkey = prefix .. 'h:' .. id, prefix .. 'k:' .. id
  if redis.call('EXISTS', hkey) == 1 then
    existed = 1
    local link = redis.call('HGET', hkey, 'link')
    for _, cid in ipairs(redis.call('SMEMBERS', kkey)) do
      if cid ~= id then fold(id, link, cid) end
    end
    if link then redis.call('SREM', prefix .. 'k:' .. link, id) end
    redis.call('DEL', hkey)
  end
  redis.call('DEL', kkey)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  if size > 0 then redis.call('DECRBY', KEYS[4], size) end
  local conv = redis.call('HGET', KEYS[3], id)
  if conv then
    redis.call('ZREM', prefix .. 'cs:' .. conv, id)
    redis.call('HDEL', KEYS[3], id)
  end
  return existed
end
-- A store written before the byte total existed: counted once, here.
if redis.call('EXISTS', KEYS[4]) == 0 then
  local total = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(v) end
  redis.call('SET', KEYS[4], total)
end
"#;

/// Saves a response's part and trims the store, atomically. KEYS: index, sizes,
/// conversations, total. ARGV: prefix, id, created_at, ttl seconds, conversation (empty for
/// none), most responses, most bytes, the oldest creation time kept, most expired drops per
/// save, the most responses of a chain, link (empty for none), then the part's fields as
/// name, value pairs. Answers -1, storing nothing, when the link is no longer stored.
const PUT_BODY: &str = r#"
local id = ARGV[2]
local created, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local conv = ARGV[5]
local max_n, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
local cutoff, sweep = tonumber(ARGV[8]), tonumber(ARGV[9])
local max_chain, link = tonumber(ARGV[10]), ARGV[11]
if link ~= '' and redis.call('EXISTS', prefix .. 'h:' .. link) == 0 then return -1 end
-- Replacing a response of the same id: its old part goes first, into its children.
drop(id)
local key = prefix .. 'h:' .. id
local fields = {}
for i = 12, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', key, unpack(fields))
redis.call('EXPIRE', key, ttl)
if link ~= '' then
  redis.call('HSET', key, 'link', link)
  redis.call('SADD', prefix .. 'k:' .. link, id)
  -- Every ancestor (and its set of children) lives at least as long as this response.
  local up, n = link, 0
  while up and n < max_chain do
    if redis.call('EXPIRE', prefix .. 'h:' .. up, ttl) == 0 then break end
    redis.call('EXPIRE', prefix .. 'k:' .. up, ttl)
    up = redis.call('HGET', prefix .. 'h:' .. up, 'link')
    n = n + 1
  end
end
local size = size_of(key)
redis.call('ZADD', KEYS[1], created, id)
redis.call('HSET', KEYS[2], id, size)
redis.call('INCRBY', KEYS[4], size)
if conv ~= '' then
  local ckey = prefix .. 'cs:' .. conv
  redis.call('ZADD', ckey, created, id)
  redis.call('EXPIRE', ckey, ttl)
  redis.call('HSET', KEYS[3], id, conv)
end
local dropped = 0
-- Past the age bound (a bounded sweep per save; their parts expire by themselves once no
-- descendant needs them).
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff, 'LIMIT', 0, sweep)) do
  if old ~= id then drop(old); dropped = dropped + 1 end
end
-- Then the oldest, until within the count and byte bounds (never the response just saved).
while redis.call('ZCARD', KEYS[1]) > max_n
    or tonumber(redis.call('GET', KEYS[4]) or '0') > max_bytes do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 1)
  local victim = nil
  for _, o in ipairs(oldest) do
    if o ~= id then victim = o; break end
  end
  if victim == nil then break end
  drop(victim)
  dropped = dropped + 1
end
return dropped
"#;

/// Deletes a response and every key it owns. KEYS as for a save; ARGV: prefix, id.
const DELETE_BODY: &str = r#"
return drop(ARGV[2])
"#;

/// The fields of a part a read returns, in order.
const PART_FIELDS: [&str; 10] = [
    "head", "input", "output", "history", "inherit", "shared", "prompt", "reply", "link", "until",
];

/// Reads a chain as one moment sees it. ARGV: prefix, id, the most responses of a chain.
/// Answers `old` and the JSON of a response of the earlier form; `none`; `chain` then, for
/// each part up the chain, its id and its [`PART_FIELDS`]; or, for a broken chain, `cycle`,
/// `long` or `missing` and the id where it broke.
const READ_CHAIN: &str = r#"
local prefix, id, max_chain = ARGV[1], ARGV[2], tonumber(ARGV[3])
local old = redis.call('GET', prefix .. 'r:' .. id)
if old then return {'old', old} end
local out = {'chain'}
local seen = {}
local cur, n = id, 0
while cur do
  if seen[cur] then return {'cycle', cur} end
  if n >= max_chain then return {'long', cur} end
  seen[cur] = true
  n = n + 1
  local f = redis.call('HMGET', prefix .. 'h:' .. cur,
    'head', 'input', 'output', 'history', 'inherit', 'shared', 'prompt', 'reply', 'link', 'until')
  if not f[1] then
    if n == 1 then return {'none'} end
    return {'missing', cur}
  end
  out[#out + 1] = cur
  for i = 1, 10 do out[#out + 1] = f[i] or '' end
  cur = f[9]
end
return out
"#;

/// A part's `head` field: the response's JSON but its items and token ids.
#[derive(Serialize, Deserialize)]
struct Head {
    id: String,
    created_at: u64,
    session: Option<String>,
    conversation: Option<String>,
    model: String,
    instructions: Option<String>,
    tools: Value,
    format: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous: Option<String>,
    response: Value,
}

/// A part as the hash's fields (name, value), its link apart.
fn fields_of(part: &Part) -> Result<Vec<(&'static str, String)>, StoreError> {
    let head = Head {
        id: part.id.clone(),
        created_at: part.created_at,
        session: part.session.clone(),
        conversation: part.conversation.clone(),
        model: part.model.clone(),
        instructions: part.instructions.clone(),
        tools: part.tools.clone(),
        format: part.format.clone(),
        previous: part.previous.clone(),
        response: part.response.clone(),
    };
    Ok(vec![
        ("head", serde_json::to_string(&head)?),
        ("input", items_field(&part.input)?),
        ("output", items_field(&part.output)?),
        ("history", items_field(&part.history)?),
        ("inherit", part.inherited_items.to_string()),
        ("shared", part.shared_tokens.to_string()),
        ("prompt", serde_json::to_string(&part.prompt_tokens)?),
        ("reply", serde_json::to_string(&part.reply_tokens)?),
    ])
}

/// Items as a JSON array of each item's JSON text.
fn items_field(items: &[Value]) -> Result<String, StoreError> {
    let texts = items
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(serde_json::to_string(&texts)?)
}

/// Items back from [`items_field`]'s form.
fn items_of(field: &str) -> Result<Vec<Value>, StoreError> {
    let texts: Vec<String> = serde_json::from_str(field)?;
    Ok(texts
        .iter()
        .map(|t| serde_json::from_str(t))
        .collect::<Result<_, _>>()?)
}

/// A count field (an empty one is 0).
fn count_of(field: &str) -> Result<usize, StoreError> {
    if field.is_empty() {
        return Ok(0);
    }
    field
        .parse()
        .map_err(|_| StoreError::Chain(format!("a stored count is not a number: {field:?}")))
}

/// When a part expires, Unix seconds.
fn until_of(field: &str) -> Result<u64, StoreError> {
    field
        .parse()
        .map_err(|_| StoreError::Chain(format!("a stored expiry is not a number: {field:?}")))
}

/// Token ids as a read returns them (Redis's JSON writes an empty array as `{}`).
fn ids_of(field: &str) -> Result<Vec<u32>, StoreError> {
    match field {
        "" | "{}" => Ok(Vec::new()),
        f => Ok(serde_json::from_str(f)?),
    }
}

/// Items as a read returns them (`{}` the empty array, as [`ids_of`]).
fn items_read(field: &str) -> Result<Vec<Value>, StoreError> {
    match field {
        "" | "{}" => Ok(Vec::new()),
        f => items_of(f),
    }
}

/// A part read back, with when it expires: its [`PART_FIELDS`] in order.
fn part_of(f: &[String]) -> Result<(Part, u64), StoreError> {
    let [
        head,
        input,
        output,
        history,
        inherit,
        shared,
        prompt,
        reply,
        link,
        until,
    ] = f
    else {
        return Err(StoreError::Chain(
            "a stored part's fields are missing".into(),
        ));
    };
    let head: Head = serde_json::from_str(head)?;
    let part = Part {
        id: head.id,
        created_at: head.created_at,
        session: head.session,
        conversation: head.conversation,
        model: head.model,
        instructions: head.instructions,
        tools: head.tools,
        format: head.format,
        previous: head.previous,
        link: Some(link.clone()).filter(|l| !l.is_empty()),
        inherited_items: count_of(inherit)?,
        history: items_read(history)?,
        input: items_read(input)?,
        output: items_read(output)?,
        shared_tokens: count_of(shared)?,
        prompt_tokens: ids_of(prompt)?,
        reply_tokens: ids_of(reply)?,
        response: head.response,
    };
    Ok((part, until_of(until)?))
}

/// What a chain read found.
enum Read {
    /// Not stored.
    None,
    /// A response of the earlier form, whole.
    Old(Box<StoredResponse>),
    /// The chain, the response asked for first, and when that one expires.
    Chain(Vec<Part>, u64),
}

/// A chain read's answer decoded; a broken chain is an error naming where it broke.
fn read_of(id: &str, answer: Vec<String>, limit: usize) -> Result<Read, StoreError> {
    let (kind, rest) = answer
        .split_first()
        .ok_or_else(|| chain::broken(id, "the store answered nothing"))?;
    match kind.as_str() {
        "none" => Ok(Read::None),
        "old" => {
            let body = rest.first().map(String::as_str).unwrap_or_default();
            Ok(Read::Old(Box::new(serde_json::from_str(body)?)))
        }
        "chain" => {
            let mut parts = Vec::new();
            let mut until = 0;
            for group in rest.chunks(1 + PART_FIELDS.len()) {
                let (part, expires) = part_of(&group[1..])?;
                if parts.is_empty() {
                    until = expires;
                }
                parts.push(part);
            }
            Ok(Read::Chain(parts, until))
        }
        why => {
            let at = rest.first().map(String::as_str).unwrap_or_default();
            Err(chain::broken(
                id,
                match why {
                    "cycle" => format!("it links back to `{at}` (a cycle)"),
                    "long" => format!("it is longer than {limit} responses (at `{at}`)"),
                    _ => format!("it links to `{at}`, which is not stored"),
                },
            ))
        }
    }
}

/// How long the store waits for Redis (`--responses-redis-connect-timeout-ms`,
/// `--responses-redis-timeout-ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisTimeouts {
    /// Most time to open a connection, each attempt.
    pub connect: Duration,
    /// Most time for a command's answer.
    pub response: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(2),
        }
    }
}

/// Responses in Redis.
pub struct RedisStore {
    conn: ConnectionManager,
    put: redis::Script,
    delete: redis::Script,
    read: redis::Script,
    limits: StoreLimits,
    /// The most responses a stored chain holds ([`MAX_CHAIN`]; smaller in tests).
    chain_limit: usize,
}

/// Most responses past the age bound one save drops (the rest go with later saves; their
/// bodies expire by themselves meanwhile).
const SWEEP: usize = 64;

impl RedisStore {
    /// Connects to `url` through a reconnecting connection manager. A server that does not
    /// answer now is no failure: the manager connects once it does (a warning says so), and
    /// until then each store call fails within the timeouts. Only a URL that cannot be used
    /// at all is an error.
    pub async fn open(
        url: &str,
        limits: StoreLimits,
        timeouts: RedisTimeouts,
    ) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            // Reconnection is retried a few times, quickly, within one call; a call after
            // that tries again, so a Redis that comes back is used at once.
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        let store = Self {
            conn,
            put: redis::Script::new(&format!("{DROP_FN}{PUT_BODY}")),
            delete: redis::Script::new(&format!("{DROP_FN}{DELETE_BODY}")),
            read: redis::Script::new(READ_CHAIN),
            limits,
            chain_limit: MAX_CHAIN,
        };
        let mut c = store.conn.clone();
        if let Err(e) = redis::cmd("PING").query_async::<String>(&mut c).await {
            tracing::warn!(error = %e, "Responses.RedisNotAnswering");
        }
        Ok(store)
    }

    fn ttl(&self) -> u64 {
        self.limits.max_age.as_secs().max(1)
    }

    fn keys(script: &redis::Script) -> redis::ScriptInvocation<'_> {
        let mut inv = script.prepare_invoke();
        inv.key(index_key())
            .key(sizes_key())
            .key(conversations_key())
            .key(total_key())
            .arg(PREFIX);
        inv
    }

    /// Stores `r` as its own part linked to its parent (when that is stored in this form),
    /// then drops what is over the bounds (never `r` itself), in one atomic step. A parent
    /// removed between the read of its chain and the save: `r` is stored self-contained.
    pub async fn put(&self, r: &StoredResponse) -> Result<(), StoreError> {
        let parent = match &r.previous {
            Some(p) => self.linkable_parent(r, p).await?,
            None => None,
        };
        let part = Part::of(r, parent.as_ref());
        if self.save(&part).await? {
            return Ok(());
        }
        if self.save(&Part::whole(r)).await? {
            Ok(())
        } else {
            Err(chain::broken(&r.id, "a self-contained save was refused"))
        }
    }

    /// Saves `part` and trims, in one script; `false` when its link is no longer stored.
    async fn save(&self, part: &Part) -> Result<bool, StoreError> {
        let now = unix_now();
        let cutoff = now.saturating_sub(self.limits.max_age.as_secs());
        let mut inv = Self::keys(&self.put);
        inv.arg(&part.id)
            .arg(part.created_at)
            .arg(self.ttl())
            .arg(part.conversation.as_deref().unwrap_or(""))
            .arg(self.limits.max_responses)
            .arg(self.limits.max_bytes)
            .arg(cutoff)
            .arg(SWEEP)
            .arg(self.chain_limit)
            .arg(part.link.as_deref().unwrap_or(""));
        for (name, value) in fields_of(part)? {
            inv.arg(name).arg(value);
        }
        inv.arg("until").arg(now.saturating_add(self.ttl()));
        let mut c = self.conn.clone();
        let dropped: i64 = inv.invoke_async(&mut c).await?;
        Ok(dropped >= 0)
    }

    /// The stored parent `previous` of `r`, whole, when `r` may link to it: `None` when it is
    /// not stored, of the earlier form, its chain broken or at the limit, or it holds `r`.
    async fn linkable_parent(
        &self,
        r: &StoredResponse,
        previous: &str,
    ) -> Result<Option<StoredResponse>, StoreError> {
        let chain = match self.read_chain(previous).await {
            Ok(Read::Chain(chain, _)) => chain,
            Ok(Read::None | Read::Old(_)) | Err(StoreError::Chain(_) | StoreError::Decode(_)) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if !chain::may_link(r, &chain, self.chain_limit) {
            return Ok(None);
        }
        match chain::rebuild(&chain) {
            Ok(parent) => Ok(Some(parent)),
            Err(StoreError::Chain(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The chain of `id` as one moment sees it.
    async fn read_chain(&self, id: &str) -> Result<Read, StoreError> {
        let mut inv = self.read.prepare_invoke();
        inv.arg(PREFIX).arg(id).arg(self.chain_limit);
        let mut c = self.conn.clone();
        let answer: Vec<String> = inv.invoke_async(&mut c).await?;
        read_of(id, answer, self.chain_limit)
    }

    /// The response `id` whole (its chain walked), unless unknown or expired.
    pub async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        match self.read_chain(id).await? {
            Read::None => Ok(None),
            Read::Old(r) => Ok(Some(*r)),
            Read::Chain(_, until) if until <= unix_now() => Ok(None),
            Read::Chain(chain, _) => chain::rebuild(&chain).map(Some),
        }
    }

    /// Deletes `id` and every key it owns, its part folded into its children; whether it was
    /// there.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let mut inv = Self::keys(&self.delete);
        inv.arg(id);
        let mut c = self.conn.clone();
        let n: u64 = inv.invoke_async(&mut c).await?;
        Ok(n > 0)
    }

    /// The newest response of `conversation` within the age bound.
    pub async fn latest_in(&self, conversation: &str) -> Result<Option<String>, StoreError> {
        let cutoff = unix_now().saturating_sub(self.limits.max_age.as_secs());
        let mut c = self.conn.clone();
        let ids: Vec<String> = redis::cmd("ZREVRANGEBYSCORE")
            .arg(conversation_key(conversation))
            .arg("+inf")
            .arg(cutoff)
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async(&mut c)
            .await?;
        Ok(ids.into_iter().next())
    }
}

#[cfg(test)]
impl RedisStore {
    /// The bytes `id`'s own part takes, as the byte total counts it (0 when not stored).
    pub async fn stored_bytes(&self, id: &str) -> Result<u64, StoreError> {
        let mut c = self.conn.clone();
        let size: Option<u64> = redis::cmd("HGET")
            .arg(sizes_key())
            .arg(id)
            .query_async(&mut c)
            .await?;
        Ok(size.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::super::chain::tests as chains;
    use super::super::tests::response;
    use super::super::{Backend, ResponseStore};
    use super::*;
    use redis::AsyncCommands;

    /// A `redis-server` of the test's own on a free loopback port, stopped when dropped.
    struct Server {
        child: std::process::Child,
        url: String,
        dir: std::path::PathBuf,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A folder of the test's own for a server's files.
    fn folder(port: u16) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d =
            std::env::temp_dir().join(format!("slotlight-redis-{}-{port}-{n}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a folder");
        d
    }

    /// Starts one, or `None` when `redis-server` is not installed (a failure instead under
    /// `SLOTLIGHT_REQUIRE_TOOLS=1`).
    fn server() -> Option<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        server_on(port)
    }

    /// A server on `port`, answering once it listens.
    fn server_on(port: u16) -> Option<Server> {
        let required = std::env::var("SLOTLIGHT_REQUIRE_TOOLS").as_deref() == Ok("1");
        let dir = folder(port);
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                assert!(!required, "redis-server is required: {e}");
                eprintln!("skipped: redis-server is not installed");
                return None;
            }
        };
        let s = Server {
            child,
            url: format!("redis://127.0.0.1:{port}/0"),
            dir,
        };
        for _ in 0..300 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start");
    }

    fn limits(max_responses: usize, max_bytes: u64) -> StoreLimits {
        StoreLimits {
            max_responses,
            max_bytes,
            max_age: Duration::from_secs(3600),
        }
    }

    async fn keys(url: &str) -> Vec<String> {
        let client = redis::Client::open(url).expect("url");
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let mut k: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{PREFIX}*"))
            .query_async(&mut c)
            .await
            .expect("keys");
        k.sort();
        k
    }

    #[tokio::test]
    async fn a_deleted_response_leaves_no_key_and_its_conversation_falls_back() {
        let Some(srv) = server() else { return };
        let s = RedisStore::open(&srv.url, limits(100, 1 << 30), RedisTimeouts::default())
            .await
            .expect("open");
        let mut a = response("resp_a", Some("conv_1"), 10);
        a.created_at -= 10;
        let b = response("resp_b", Some("conv_1"), 10);
        s.put(&a).await.expect("put a");
        s.put(&b).await.expect("put b");
        assert_eq!(s.get("resp_b").await.expect("get"), Some(b));
        assert_eq!(
            s.latest_in("conv_1").await.expect("latest").as_deref(),
            Some("resp_b")
        );
        assert!(s.delete("resp_b").await.expect("delete"));
        assert!(!s.delete("resp_b").await.expect("delete again"));
        // The conversation continues from its previous response, as SQLite's does.
        assert_eq!(
            s.latest_in("conv_1").await.expect("latest").as_deref(),
            Some("resp_a")
        );
        assert!(s.delete("resp_a").await.expect("delete"));
        assert_eq!(s.latest_in("conv_1").await.expect("latest"), None);
        // Nothing of either is left but the (zero) byte total.
        assert_eq!(keys(&srv.url).await, vec![total_key()]);
    }

    #[tokio::test]
    async fn trimming_drops_the_oldest_within_the_bounds_and_keeps_the_byte_total() {
        let Some(srv) = server() else { return };
        let s = RedisStore::open(&srv.url, limits(3, 1 << 30), RedisTimeouts::default())
            .await
            .expect("open");
        for i in 0..5u64 {
            let mut r = response(&format!("resp_{i}"), Some("conv"), 10);
            r.created_at = 1_000_000_000_000 + i;
            s.put(&r).await.expect("put");
        }
        for i in 0..2 {
            assert_eq!(s.get(&format!("resp_{i}")).await.expect("get"), None);
        }
        for i in 2..5 {
            assert!(s.get(&format!("resp_{i}")).await.expect("get").is_some());
        }
        let client = redis::Client::open(srv.url.as_str()).expect("url");
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let sizes: Vec<u64> = c.hvals(sizes_key()).await.expect("sizes");
        let total: u64 = c.get(total_key()).await.expect("total");
        assert_eq!(sizes.len(), 3);
        assert_eq!(total, sizes.iter().sum::<u64>());
        let in_conv: u64 = c.zcard(conversation_key("conv")).await.expect("zcard");
        assert_eq!(in_conv, 3, "the dropped left their conversation");
        // The byte bound: one response's worth keeps only the newest.
        let one = total / 3;
        let s = RedisStore::open(&srv.url, limits(100, one + 1), RedisTimeouts::default())
            .await
            .expect("open");
        let mut r = response("resp_9", None, 10);
        r.created_at = 1_000_000_000_100;
        s.put(&r).await.expect("put");
        let left: Vec<String> = c.zrange(index_key(), 0, -1).await.expect("index");
        assert_eq!(left, vec!["resp_9".to_string()]);
        // Replacing a response of the same id counts its bytes once.
        s.put(&r).await.expect("put again");
        let total: u64 = c.get(total_key()).await.expect("total");
        let sizes: Vec<u64> = c.hvals(sizes_key()).await.expect("sizes");
        assert_eq!(total, sizes.iter().sum::<u64>());
    }

    #[tokio::test]
    async fn a_store_whose_server_is_down_fails_within_its_timeouts_and_recovers() {
        let Some(srv) = server() else { return };
        let port: u16 = srv
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .expect("port");
        let timeouts = RedisTimeouts {
            connect: Duration::from_millis(300),
            response: Duration::from_millis(300),
        };
        let s = RedisStore::open(&srv.url, limits(100, 1 << 30), timeouts)
            .await
            .expect("open");
        s.put(&response("resp_a", None, 10)).await.expect("put");
        drop(srv);
        // Down: a call fails (never hangs).
        assert!(s.put(&response("resp_b", None, 10)).await.is_err());
        // Back on the same port: the same store works again, without being reopened.
        let again = server_on(port).expect("restarted");
        let mut ok = false;
        for _ in 0..100 {
            match s.put(&response("resp_c", None, 10)).await {
                Ok(()) => {
                    ok = true;
                    break;
                }
                Err(e) => eprintln!("not yet: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(again);
        assert!(ok, "the store reconnected once Redis was back");
    }

    /// The store on database `db` of `srv`.
    async fn store(srv: &Server, db: u8, limits: StoreLimits) -> ResponseStore {
        let s = RedisStore::open(&db_url(srv, db), limits, RedisTimeouts::default())
            .await
            .expect("open");
        ResponseStore::with(Backend::Redis(s))
    }

    fn db_url(srv: &Server, db: u8) -> String {
        format!("{}{db}", srv.url.trim_end_matches('0'))
    }

    async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    }

    /// The link field of `id`'s part.
    async fn link_of(url: &str, id: &str) -> Option<String> {
        let mut c = connection(url).await;
        c.hget(part_key(id), "link").await.expect("link")
    }

    #[tokio::test]
    async fn a_chain_is_kept_as_links_in_linear_bytes_and_leaves_nothing_when_deleted() {
        let Some(srv) = server() else { return };
        let s = store(&srv, 0, limits(1_000, 1 << 30)).await;
        chains::a_chain_is_kept_in_linear_bytes(&s).await;
        for k in 1..=30 {
            assert!(s.delete(&format!("resp_t{k}")).await.expect("delete"));
        }
        assert_eq!(keys(&srv.url).await, vec![total_key()]);
        let mut c = connection(&srv.url).await;
        let total: u64 = c.get(total_key()).await.expect("total");
        assert_eq!(total, 0);
    }

    #[tokio::test]
    async fn deleting_a_parent_keeps_its_children_exact() {
        let Some(srv) = server() else { return };
        let s = store(&srv, 0, limits(1_000, 1 << 30)).await;
        chains::deleting_keeps_the_children_exact(&s).await;
        // The byte total is the sum of the sizes the folds changed.
        let mut c = connection(&srv.url).await;
        let sizes: Vec<u64> = c.hvals(sizes_key()).await.expect("sizes");
        let total: u64 = c.get(total_key()).await.expect("total");
        assert_eq!(total, sizes.iter().sum::<u64>());
    }

    #[tokio::test]
    async fn evicting_a_parent_by_count_bytes_or_age_keeps_its_children_exact() {
        let Some(srv) = server() else { return };
        chains::evicting_by_count_keeps_the_rest_exact(&store(&srv, 0, limits(5, 1 << 30)).await)
            .await;
        let bound = 40_000;
        chains::evicting_by_bytes_keeps_the_rest_exact(
            &store(&srv, 1, limits(1_000, bound)).await,
            bound,
        )
        .await;
        chains::a_parent_past_its_age_is_swept_into_its_child(
            &store(&srv, 2, limits(1_000, 1 << 30)).await,
        )
        .await;
    }

    #[tokio::test]
    async fn a_response_of_the_earlier_form_reads_on_and_is_dropped_whole() {
        let Some(srv) = server() else { return };
        let chain = chains::turns(3);
        let old: Vec<StoredResponse> = chain[..2]
            .iter()
            .map(|t| StoredResponse {
                previous: None,
                ..t.clone()
            })
            .collect();
        // Written as the earlier code wrote them: a string key each, indexed, no byte total.
        let mut c = connection(&srv.url).await;
        for t in &old {
            let body = serde_json::to_string(t).expect("json");
            let conv = t.conversation.clone().expect("a conversation");
            let _: () = redis::pipe()
                .cmd("SET")
                .arg(response_key(&t.id))
                .arg(&body)
                .arg("EX")
                .arg(3600)
                .cmd("ZADD")
                .arg(index_key())
                .arg(t.created_at)
                .arg(&t.id)
                .cmd("HSET")
                .arg(sizes_key())
                .arg(&t.id)
                .arg(body.len())
                .cmd("HSET")
                .arg(conversations_key())
                .arg(&t.id)
                .arg(&conv)
                .cmd("ZADD")
                .arg(conversation_key(&conv))
                .arg(t.created_at)
                .arg(&t.id)
                .query_async(&mut c)
                .await
                .expect("write the earlier form");
        }
        let s = store(&srv, 0, limits(1_000, 1 << 30)).await;
        chains::reads_back(&s, &[&old[0], &old[1]], &[]).await;
        // Its continuation is stored self-contained.
        s.put(&chain[2]).await.expect("put");
        assert_eq!(link_of(&srv.url, "resp_t3").await, None);
        chains::reads_back(&s, &[&chain[2]], &[]).await;
        assert!(s.delete("resp_t2").await.expect("delete"));
        chains::reads_back(&s, &[&old[0], &chain[2]], &["resp_t2"]).await;
        assert!(s.delete("resp_t1").await.expect("delete"));
        assert!(s.delete("resp_t3").await.expect("delete"));
        assert_eq!(keys(&srv.url).await, vec![total_key()]);
        let total: u64 = c.get(total_key()).await.expect("total");
        assert_eq!(total, 0);
    }

    #[tokio::test]
    async fn a_broken_chain_is_an_error_never_a_panic() {
        let Some(srv) = server() else { return };
        let s = store(&srv, 0, limits(1_000, 1 << 30)).await;
        let chain = chains::turns(4);
        for t in &chain {
            s.put(t).await.expect("put");
        }
        let mut c = connection(&srv.url).await;
        // A parent gone without its fold (as an eviction by Redis itself would).
        let _: () = c.del(part_key("resp_t2")).await.expect("del");
        let err = s.get("resp_t4").await.expect_err("a missing link");
        assert!(matches!(err, StoreError::Chain(_)), "{err:?}");
        assert!(
            err.to_string().contains("`resp_t2`, which is not stored"),
            "{err}"
        );
        chains::reads_back(&s, &[&chain[0]], &[]).await;
        // A cycle: resp_t3 links to its own child.
        let _: () = c
            .hset(part_key("resp_t3"), "link", "resp_t4")
            .await
            .expect("hset");
        let err = s.get("resp_t4").await.expect_err("a cycle");
        assert!(err.to_string().contains("a cycle"), "{err}");
        // A continuation of a broken chain is stored self-contained; the broken ones can still
        // be deleted.
        let next = chains::next_turn(Some(&chain[3]), "resp_t5", 5);
        s.put(&next).await.expect("put");
        assert_eq!(link_of(&srv.url, "resp_t5").await, None);
        chains::reads_back(&s, &[&next], &[]).await;
        assert!(s.delete("resp_t3").await.expect("delete"));
        assert!(s.delete("resp_t4").await.expect("delete"));
        // A part that does not decode: reading it is an error, deleting it is not.
        let _: () = c
            .hset(part_key("resp_t1"), "head", "{")
            .await
            .expect("hset");
        assert!(matches!(
            s.get("resp_t1").await.expect_err("damaged"),
            StoreError::Decode(_)
        ));
        assert!(s.delete("resp_t1").await.expect("delete"));
        chains::reads_back(&s, &[&next], &[]).await;
    }

    #[tokio::test]
    async fn a_chain_at_its_limit_goes_on_self_contained_and_a_longer_one_is_an_error() {
        let Some(srv) = server() else { return };
        let mut s = RedisStore::open(&srv.url, limits(1_000, 1 << 30), RedisTimeouts::default())
            .await
            .expect("open");
        s.chain_limit = 4;
        let chain = chains::turns(10);
        for t in &chain {
            s.put(t).await.expect("put");
        }
        for t in &chain {
            assert_eq!(s.get(&t.id).await.expect("get").as_ref(), Some(t));
        }
        assert_eq!(
            link_of(&srv.url, "resp_t4").await.as_deref(),
            Some("resp_t3")
        );
        assert_eq!(
            link_of(&srv.url, "resp_t5").await,
            None,
            "the chain was at its limit"
        );
        s.chain_limit = 2;
        let err = s.get("resp_t4").await.expect_err("too long");
        assert!(err.to_string().contains("longer than 2"), "{err}");
    }

    #[tokio::test]
    async fn an_ancestor_lives_as_long_as_its_newest_descendant() {
        let Some(srv) = server() else { return };
        let s = store(&srv, 0, limits(1_000, 1 << 30)).await;
        let chain = chains::turns(3);
        for t in &chain {
            s.put(t).await.expect("put");
        }
        let mut c = connection(&srv.url).await;
        let _: () = c.expire(part_key("resp_t1"), 5).await.expect("expire");
        let _: () = c.expire(part_key("resp_t2"), 5).await.expect("expire");
        let next = chains::next_turn(Some(&chain[2]), "resp_t4", 4);
        s.put(&next).await.expect("put");
        for id in ["resp_t1", "resp_t2", "resp_t3"] {
            let ttl: i64 = c.ttl(part_key(id)).await.expect("ttl");
            assert!(ttl > 3_000, "{id}'s key lives on: {ttl}");
        }
        chains::reads_back(&s, &[&next], &[]).await;
    }
}
