//! The Redis backend, for several replicas sharing one store: a response is a key holding its
//! JSON (expiring at the age bound), indexed by creation time in a sorted set with its size in
//! a hash, so the oldest can be dropped to keep the count and byte bounds. A response is
//! written by one atomic transaction (`MULTI`/`EXEC`); a reader sees all of it or none.

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use super::{StoreError, StoreLimits, StoredResponse, unix_now};

/// The prefix of every key the store writes.
const PREFIX: &str = "slotlight:responses:";

fn response_key(id: &str) -> String {
    format!("{PREFIX}r:{id}")
}

fn conversation_key(conversation: &str) -> String {
    format!("{PREFIX}c:{conversation}")
}

fn index_key() -> String {
    format!("{PREFIX}index")
}

fn sizes_key() -> String {
    format!("{PREFIX}sizes")
}

/// Responses in Redis.
pub struct RedisStore {
    conn: MultiplexedConnection,
    limits: StoreLimits,
}

impl RedisStore {
    /// Connects to `url` (a connection multiplexed over every request).
    pub async fn open(url: &str, limits: StoreLimits) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(Self { conn, limits })
    }

    fn ttl(&self) -> u64 {
        self.limits.max_age.as_secs().max(1)
    }

    /// Stores `r` whole, then drops what is over the bounds (never `r` itself).
    pub async fn put(&self, r: &StoredResponse) -> Result<(), StoreError> {
        let body = serde_json::to_string(r)?;
        let mut c = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .set_ex(response_key(&r.id), &body, self.ttl())
            .ignore()
            .zadd(index_key(), &r.id, r.created_at)
            .ignore()
            .hset(sizes_key(), &r.id, body.len())
            .ignore();
        if let Some(conv) = &r.conversation {
            pipe.set_ex(conversation_key(conv), &r.id, self.ttl())
                .ignore();
        }
        let () = pipe.query_async(&mut c).await?;
        self.trim(&r.id).await
    }

    /// Drops responses past the age bound, then the oldest beyond the count and byte bounds.
    async fn trim(&self, keep: &str) -> Result<(), StoreError> {
        let mut c = self.conn.clone();
        let cutoff = unix_now().saturating_sub(self.limits.max_age.as_secs());
        let expired: Vec<String> = c
            .zrangebyscore(index_key(), "-inf", format!("({cutoff}"))
            .await?;
        let mut drop: Vec<String> = expired.into_iter().filter(|id| id != keep).collect();
        let sizes: Vec<(String, u64)> = c.hgetall(sizes_key()).await?;
        let mut count = sizes.len();
        let mut bytes: u64 = sizes.iter().map(|(_, b)| *b).sum();
        let size_of = |id: &str| sizes.iter().find(|(k, _)| k == id).map_or(0, |(_, b)| *b);
        for id in &drop {
            count = count.saturating_sub(1);
            bytes = bytes.saturating_sub(size_of(id));
        }
        if count > self.limits.max_responses || bytes > self.limits.max_bytes {
            let oldest: Vec<String> = c.zrange(index_key(), 0, -1).await?;
            for id in oldest {
                if count <= self.limits.max_responses && bytes <= self.limits.max_bytes {
                    break;
                }
                if id == keep || drop.contains(&id) {
                    continue;
                }
                count = count.saturating_sub(1);
                bytes = bytes.saturating_sub(size_of(&id));
                drop.push(id);
            }
        }
        if drop.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        for id in &drop {
            pipe.del(response_key(id))
                .ignore()
                .zrem(index_key(), id)
                .ignore()
                .hdel(sizes_key(), id)
                .ignore();
        }
        let () = pipe.query_async(&mut c).await?;
        Ok(())
    }

    /// The response `id`, unless unknown or expired.
    pub async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let mut c = self.conn.clone();
        let body: Option<String> = c.get(response_key(id)).await?;
        Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
    }

    /// Deletes `id`; whether it was there.
    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let mut c = self.conn.clone();
        let (n,): (u64,) = redis::pipe()
            .atomic()
            .del(response_key(id))
            .zrem(index_key(), id)
            .ignore()
            .hdel(sizes_key(), id)
            .ignore()
            .query_async(&mut c)
            .await?;
        Ok(n > 0)
    }

    /// The newest response of `conversation`.
    pub async fn latest_in(&self, conversation: &str) -> Result<Option<String>, StoreError> {
        let mut c = self.conn.clone();
        let id: Option<String> = c.get(conversation_key(conversation)).await?;
        Ok(id)
    }
}
