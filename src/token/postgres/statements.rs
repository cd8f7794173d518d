//! The statements of the Postgres token store (`postgres.rs`). Each decides on one
//! row, with `status` and the deadlines checked in its `WHERE`, so the row lock
//! serialises concurrent callers and each re-evaluates the condition on the row as
//! the previous one left it. Time is the database's `now()`.
//!
//! Not checked at compile time (`sqlx::query!`), unlike the `payments` statements
//! (docs/ARCHITECTURE.md, "Checked SQL"): a macro checks a string literal written in
//! its call, and these are constants, some chosen at run time (`reserve.rs` picks
//! the implicit or issued reservation). Checking them means moving each text into
//! its call; left for a change of its own.

/// Create `pending` when absent, or replace a row whose life is over. The fence is kept
/// from the old row: it only ever grows while the row exists.
pub(super) const ISSUE: &str = "
INSERT INTO idempotency_tokens AS t (key, status, fence, expires_at)
VALUES ($1, 'pending', 0, now() + $2::bigint * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE
   SET status = 'pending', owner = NULL, previous_owner = NULL, lease_expires_at = NULL,
       payment_id = NULL,
       fingerprint = NULL, expires_at = EXCLUDED.expires_at, created_at = now(),
       updated_at = now()
 WHERE NOT (t.expires_at > now()
            OR (t.status = 'processing' AND t.lease_expires_at > now()))
RETURNING fence";

pub(super) const CONSUME: &str = "
DELETE FROM idempotency_tokens
 WHERE key = $1 AND status = 'pending' AND expires_at > now()
RETURNING fence";

/// Lock and reserve create a missing row with `ON CONFLICT DO NOTHING` and take over an
/// existing one with a separate conditional `UPDATE`, rather than one `ON CONFLICT DO
/// UPDATE … WHERE`: the latter locks the conflicting row even when its `WHERE` fails, so
/// every loser of a race would queue for the row and commit a transaction of its own,
/// one after the other. Each statement is still the whole decision for its case.
pub(super) const LOCK_CREATE: &str = "
INSERT INTO idempotency_locks (key, owner, expires_at)
VALUES ($1, $2, now() + $3::bigint * interval '1 millisecond')
ON CONFLICT (key) DO NOTHING
RETURNING owner";

/// A lock past its deadline is free: the caller takes it over.
pub(super) const LOCK_TAKE_OVER: &str = "
UPDATE idempotency_locks
   SET owner = $2, expires_at = now() + $3::bigint * interval '1 millisecond'
 WHERE key = $1 AND expires_at <= now()
RETURNING owner";

pub(super) const RELEASE: &str = "
DELETE FROM idempotency_locks
 WHERE key = $1 AND owner = $2 AND expires_at > now()
RETURNING owner";

/// Implicit mode, unknown key: created straight in `processing` with fence 1.
pub(super) const RESERVE_CREATE: &str = "
INSERT INTO idempotency_tokens (key, status, owner, fence, lease_expires_at, expires_at)
VALUES ($1, 'processing', $2, 1,
        now() + $3::bigint * interval '1 millisecond',
        now() + $4::bigint * interval '1 millisecond')
ON CONFLICT (key) DO NOTHING
RETURNING fence, previous_owner";

/// Implicit mode, existing row: taken over when pending, when its lease expired (or
/// is held by `$5`, the caller's own reservation whose answer was lost; NULL for
/// none), or when its life is over (the row only lingers; the fence keeps growing). A token whose own
/// deadline is still ahead keeps it (restore goes back to it); otherwise it gets a
/// fresh one.
///
/// Both reservations return who held the token before (`Reservation::Reserved`'s
/// predecessor), read from the row as it was: every expression of an `UPDATE`'s `SET`
/// sees the old row, so it is exact under any concurrency. The holder whose lease ran
/// out (`processing`), or who restored the token (`pending`, kept by `RESTORE`); none
/// for a completed row whose tombstone ran out.
pub(super) const RESERVE_IMPLICIT: &str = "
UPDATE idempotency_tokens
   SET previous_owner = CASE status WHEN 'processing' THEN owner
                                    WHEN 'pending' THEN previous_owner END,
       status = 'processing',
       owner = $2,
       fence = fence + 1,
       lease_expires_at = now() + $3::bigint * interval '1 millisecond',
       expires_at = CASE WHEN status <> 'completed' AND expires_at > now()
                         THEN expires_at
                         ELSE now() + $4::bigint * interval '1 millisecond' END,
       payment_id = NULL,
       fingerprint = NULL,
       waiters = false,
       updated_at = now()
 WHERE key = $1
   AND (status = 'pending'
        OR (status = 'processing' AND (lease_expires_at <= now() OR owner = $5))
        OR (status = 'completed' AND expires_at <= now()))
RETURNING fence, previous_owner";

/// Issued mode: only a live token that is pending or whose lease expired (or is held
/// by `$4`, as `$5` above) is taken.
pub(super) const RESERVE_ISSUED: &str = "
UPDATE idempotency_tokens
   SET previous_owner = CASE status WHEN 'processing' THEN owner ELSE previous_owner END,
       status = 'processing',
       owner = $2,
       fence = fence + 1,
       lease_expires_at = now() + $3::bigint * interval '1 millisecond',
       waiters = false,
       updated_at = now()
 WHERE key = $1
   AND expires_at > now()
   AND (status = 'pending'
        OR (status = 'processing' AND (lease_expires_at <= now() OR owner = $4)))
RETURNING fence, previous_owner";

/// Issued mode, after `RESERVE_ISSUED` took nothing and no live row is there: a
/// `processing` row whose deadline and lease both passed less than `$2` ms ago (the
/// completed-token TTL) is the tombstone of a token that expired while an attempt
/// held it (`Reservation::Unsettled`): its charge is unknown, not missing.
pub(super) const UNSETTLED: &str = "
SELECT fence
  FROM idempotency_tokens
 WHERE key = $1 AND status = 'processing'
   AND expires_at <= now() AND lease_expires_at <= now()
   AND GREATEST(expires_at, lease_expires_at) + $2::bigint * interval '1 millisecond' > now()";

/// The owner-checked statements accept a lapsed lease as long as nobody reserved since
/// (owner and fence still match) and the row is still live. A settle of a row some
/// reservation is waiting on (`waiters`, see `settle.rs`) is announced with
/// `pg_notify`, delivered when the transaction commits; other settles announce nothing.
pub(super) const CONFIRM: &str = "
WITH settled AS (
UPDATE idempotency_tokens
   SET status = 'completed',
       payment_id = $4,
       fingerprint = $5,
       lease_expires_at = NULL,
       expires_at = CASE WHEN status = 'completed' THEN expires_at
                         ELSE now() + $6::bigint * interval '1 millisecond' END,
       updated_at = now()
 WHERE key = $1 AND owner = $2 AND fence = $3
   AND ((status = 'processing' AND (expires_at > now() OR lease_expires_at > now()))
        -- the same claim confirming the same payment again: a retry whose answer was lost
        OR (status = 'completed' AND payment_id = $4 AND expires_at > now()))
RETURNING key, fence, waiters)
SELECT fence, CASE WHEN waiters THEN pg_notify('payment_worker_token_settled', key)::text END
  FROM settled";

pub(super) const RESTORE: &str = "
WITH settled AS (
UPDATE idempotency_tokens
   SET status = 'pending', previous_owner = owner, owner = NULL, lease_expires_at = NULL,
       updated_at = now()
 WHERE key = $1 AND status = 'processing' AND owner = $2 AND fence = $3
   AND (expires_at > now() OR lease_expires_at > now())
RETURNING key, expires_at <= now() AS dead, waiters)
SELECT dead, CASE WHEN waiters THEN pg_notify('payment_worker_token_settled', key)::text END
  FROM settled";

/// A reservation that met a live lease asks to be told of its settle. No row: the
/// token is not (or no longer) held under a live lease, so there is nothing to wait for.
/// Behind a holder's uncommitted settle this waits for its COMMIT, then finds no row.
pub(super) const WATCH: &str = "
UPDATE idempotency_tokens
   SET waiters = true
 WHERE key = $1 AND status = 'processing' AND lease_expires_at > now()
RETURNING fence";

/// After a restore past the token's deadline the row is already dead; removing it is
/// housekeeping, guarded so a token revived in between is left alone.
pub(super) const DELETE_DEAD_PENDING: &str = "
DELETE FROM idempotency_tokens
 WHERE key = $1 AND status = 'pending' AND expires_at <= now()";

pub(super) const EXTEND: &str = "
UPDATE idempotency_tokens
   SET lease_expires_at = now() + $4::bigint * interval '1 millisecond', updated_at = now()
 WHERE key = $1 AND status = 'processing' AND owner = $2 AND fence = $3
   AND (expires_at > now() OR lease_expires_at > now())
RETURNING fence";

pub(super) const READ: &str = "
SELECT status, owner, fence, payment_id, fingerprint,
       (expires_at > now() OR (status = 'processing' AND lease_expires_at > now())) AS live,
       CASE WHEN status = 'processing' THEN
           GREATEST(0, ceil(EXTRACT(EPOCH FROM lease_expires_at - now()) * 1000))::bigint
       END AS lease_left_ms,
       GREATEST(0, ceil(EXTRACT(EPOCH FROM GREATEST(expires_at, lease_expires_at) - now())
                        * 1000))::bigint AS ttl_ms
  FROM idempotency_tokens
 WHERE key = $1";

pub(super) const EXPIRED_LEASES: &str = "
SELECT key
  FROM idempotency_tokens
 WHERE status = 'processing' AND lease_expires_at <= now() AND expires_at > now()
 ORDER BY lease_expires_at
 LIMIT $1";
