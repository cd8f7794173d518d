//! How the Postgres store reserves a token: the reserving statements in turn, and when
//! they say "not yours", the read that tells the caller why (completed, in flight,
//! missing or a tombstone). Apart from `postgres.rs`, whose other operations are one
//! statement each; only `reserve` decides again when the token changed in between.

use std::time::Duration;

use anyhow::anyhow;

use super::rows::{fence_of, millis, predecessor};
use super::statements::{RESERVE_CREATE, RESERVE_IMPLICIT, RESERVE_ISSUED, UNSETTLED};
use super::store::PostgresTokenStore;
use crate::token::{IdempotencyKey, Reservation, TokenError, TokenMode, TokenState};

/// How often `reserve` re-decides when the follow-up read saw the token change between
/// the deciding statement and the read. Each retry needs another writer to have won a
/// race in between, so a handful is plenty.
const RESERVE_ATTEMPTS: usize = 8;

impl PostgresTokenStore {
    /// Issued mode, no live token: missing, or the tombstone of one that expired
    /// while an attempt held it.
    pub(super) async fn missing_or_unsettled(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Reservation, TokenError> {
        let tombstone = self
            .timed(
                "reserve",
                key,
                sqlx::query_scalar::<_, i64>(UNSETTLED)
                    .bind(key.as_str())
                    .bind(self.tombstone_ms())
                    .fetch_optional(&self.pool),
            )
            .await?;
        Ok(match tombstone {
            Some(_) => Reservation::Unsettled,
            None => Reservation::Missing,
        })
    }
    /// The reserving statements as `owner`, taking the token from `lost` too when it
    /// holds it.
    pub(super) async fn reserve_as(
        &self,
        key: &IdempotencyKey,
        owner: &str,
        lost: Option<&str>,
    ) -> Result<Reservation, TokenError> {
        let lease = millis(self.policy.lease);
        let pending_ttl = millis(self.policy.pending_ttl);
        // (statement, whether it takes the implicit token's TTL as $4, whether it
        // takes the lost owner after that)
        let statements: &[(&str, bool, bool)] = match self.policy.mode {
            TokenMode::Implicit => &[
                (RESERVE_CREATE, true, false),
                (RESERVE_IMPLICIT, true, true),
            ],
            TokenMode::Issued => &[(RESERVE_ISSUED, false, true)],
        };
        for _ in 0..RESERVE_ATTEMPTS {
            for &(statement, takes_ttl, takes_lost) in statements {
                let query = sqlx::query_as::<_, (i64, Option<String>)>(statement)
                    .bind(key.as_str())
                    .bind(owner)
                    .bind(lease);
                let query = if takes_ttl {
                    query.bind(pending_ttl)
                } else {
                    query
                };
                let query = if takes_lost { query.bind(lost) } else { query };
                let reserved = self
                    .timed("reserve", key, query.fetch_optional(&self.pool))
                    .await?;
                if let Some((fence, previous_owner)) = reserved {
                    let fence = fence_of(key, fence)?;
                    return Ok(Reservation::Reserved {
                        fence,
                        predecessor: predecessor(fence, previous_owner),
                    });
                }
            }
            // The statements decided "not yours"; this read only tells the caller why.
            // If it sees a reservable token, the token changed in between: decide again.
            match self.read(key).await? {
                None if self.policy.mode == TokenMode::Issued => {
                    return self.missing_or_unsettled(key).await
                }
                None => continue,
                Some(row) => match TokenState::parse(&row.status) {
                    Some(TokenState::Completed) => {
                        let payment_id = row.payment_id.ok_or_else(|| {
                            TokenError::Corrupt(format!("completed token {key} has no payment id"))
                        })?;
                        return Ok(Reservation::Completed {
                            payment_id,
                            fingerprint: row.fingerprint,
                        });
                    }
                    Some(TokenState::Processing) => {
                        let left = row.lease_left_ms.unwrap_or(0);
                        if left > 0 {
                            return Ok(Reservation::InFlight {
                                lease_left: Duration::from_millis(left.unsigned_abs()),
                            });
                        }
                    }
                    Some(TokenState::Pending) => {}
                    None => {
                        return Err(TokenError::Corrupt(format!(
                            "token {key} has status {:?}",
                            row.status
                        )))
                    }
                },
            }
        }
        Err(TokenError::Unavailable(anyhow!(
            "reserve {key}: the token kept changing for {RESERVE_ATTEMPTS} attempts"
        )))
    }
}
