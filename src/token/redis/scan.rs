//! The sweep for expired leases on Redis: SCAN each master for this store's token keys
//! and judge each by its own script. Apart from `redis.rs`, which holds the per-key
//! operations; the sweep is the only code that walks the keyspace.

use std::time::Duration;

use anyhow::{anyhow, Context};

use super::connection::ScanTarget;
use super::store::RedisTokenStore;
use crate::token::{IdempotencyKey, TokenError, TokenState, TokenStore};

const SCAN_BATCH: usize = 500;

fn idempotency_key_of(prefix: &str, redis_key: &str) -> Option<IdempotencyKey> {
    let rest = redis_key
        .strip_prefix(prefix)?
        .strip_prefix(":token:{")?
        .strip_suffix('}')?;
    IdempotencyKey::try_from(rest).ok()
}

/// MATCH treats these as glob syntax; a prefix must match literally.
fn glob_escape(raw: &str) -> String {
    let mut escaped = String::with_capacity(raw.len());
    for c in raw.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl RedisTokenStore {
    pub(super) async fn expired_leases_on(
        &self,
        target: &ScanTarget,
        limit: usize,
        found: &mut Vec<IdempotencyKey>,
    ) -> Result<(), TokenError> {
        let pattern = format!("{}:token:*", glob_escape(&self.prefix));
        let mut cursor: u64 = 0;
        loop {
            let mut command = redis::cmd("SCAN");
            command
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH);
            let scan = self.conn.query_on::<(u64, Vec<String>)>(target, &command);
            let (next, batch) = tokio::time::timeout(self.op_timeout, scan)
                .await
                .map_err(|_| anyhow!("SCAN {pattern}: no answer within {:?}", self.op_timeout))
                .and_then(|r| r.with_context(|| format!("SCAN {pattern} on {target:?}")))
                .map_err(TokenError::Unavailable)?;
            for redis_key in batch {
                if found.len() >= limit {
                    return Ok(());
                }
                let Some(key) = idempotency_key_of(&self.prefix, &redis_key) else {
                    tracing::warn!(
                        redis_key,
                        "skipping a key that is not a token of this store"
                    );
                    continue;
                };
                // Each key is judged by its own script, on the server clock, at that moment.
                if let Some(view) = self.show(&key).await? {
                    if view.state == TokenState::Processing
                        && view.lease_left == Some(Duration::ZERO)
                    {
                        found.push(key);
                    }
                }
            }
            if next == 0 || found.len() >= limit {
                return Ok(());
            }
            cursor = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_finds_only_this_stores_tokens() {
        let k = IdempotencyKey::try_from("ord-1").unwrap();
        assert_eq!(idempotency_key_of("pw", "pw:token:{ord-1}"), Some(k));
        assert_eq!(idempotency_key_of("pw", "pw:lock:{ord-1}"), None);
        assert_eq!(idempotency_key_of("pw", "pw:token:{a{b}"), None);
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
