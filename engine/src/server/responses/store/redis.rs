//! The Redis backend, for several replicas sharing one store: a response is a key holding its
//! JSON (expiring at the age bound), indexed by creation time in a sorted set, its size in a
//! hash beside a running byte total, and its conversation's responses in a sorted set of
//! their own (so the conversation falls back to its previous response when the newest is
//! deleted, as SQLite does).
//!
//! Every write is one server-side script, atomic across replicas: a save stores the response
//! and trims what is over the bounds in the same step, oldest first, its work proportional to
//! what it drops (never a read of the whole index); a delete removes every key the response
//! owns, its place in its conversation included. The connection is the crate's connection
//! manager: it reconnects by itself after a restart of Redis or a network blip, and every
//! connect and every command has a deadline ([`RedisTimeouts`]), so a Redis that is down
//! costs a request at most those, never a hang.

use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{StoreError, StoreLimits, StoredResponse, unix_now};

/// The prefix of every key the store writes.
const PREFIX: &str = "slotlight:responses:";

fn response_key(id: &str) -> String {
    format!("{PREFIX}r:{id}")
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

/// Drops one response and everything it owns; shared by both scripts. The byte total is
/// decreased by its recorded size; the result says whether its body was there.
const DROP_FN: &str = r#"
local prefix = ARGV[1]
local function drop(id)
  local size = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  local existed = redis.call('DEL', prefix .. 'r:' .. id)
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

/// Saves a response and trims the store, atomically. KEYS: index, sizes, conversations,
/// total. ARGV: prefix, id, body, created_at, ttl seconds, conversation (empty for none),
/// most responses, most bytes, the oldest creation time kept, most expired drops per save.
const PUT_BODY: &str = r#"
local id, body = ARGV[2], ARGV[3]
local created, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local conv = ARGV[6]
local max_n, max_bytes = tonumber(ARGV[7]), tonumber(ARGV[8])
local cutoff, sweep = tonumber(ARGV[9]), tonumber(ARGV[10])
-- Replacing a response of the same id: its old size and place go first.
drop(id)
redis.call('SET', prefix .. 'r:' .. id, body, 'EX', ttl)
redis.call('ZADD', KEYS[1], created, id)
redis.call('HSET', KEYS[2], id, #body)
redis.call('INCRBY', KEYS[4], #body)
if conv ~= '' then
  local ckey = prefix .. 'cs:' .. conv
  redis.call('ZADD', ckey, created, id)
  redis.call('EXPIRE', ckey, ttl)
  redis.call('HSET', KEYS[3], id, conv)
end
local dropped = 0
-- Past the age bound (a bounded sweep per save; their bodies expire by themselves).
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
    limits: StoreLimits,
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
            limits,
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

    /// Stores `r` whole, then drops what is over the bounds (never `r` itself), in one atomic
    /// step.
    pub async fn put(&self, r: &StoredResponse) -> Result<(), StoreError> {
        let body = serde_json::to_string(r)?;
        let cutoff = unix_now().saturating_sub(self.limits.max_age.as_secs());
        let mut inv = Self::keys(&self.put);
        inv.arg(&r.id)
            .arg(&body)
            .arg(r.created_at)
            .arg(self.ttl())
            .arg(r.conversation.as_deref().unwrap_or(""))
            .arg(self.limits.max_responses)
            .arg(self.limits.max_bytes)
            .arg(cutoff)
            .arg(SWEEP);
        let mut c = self.conn.clone();
        let _dropped: u64 = inv.invoke_async(&mut c).await?;
        Ok(())
    }

    /// The response `id`, unless unknown or expired.
    pub async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let mut c = self.conn.clone();
        let body: Option<String> = c.get(response_key(id)).await?;
        Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
    }

    /// Deletes `id` and every key it owns; whether it was there.
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
mod tests {
    use super::super::tests::response;
    use super::*;

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
}
