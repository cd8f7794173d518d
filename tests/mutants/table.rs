//! The table of hand-written mutants: each entry removes one enforcement from a Lua
//! script, a SQL statement or the processor, and names the tests that must then fail.

/// One deliberate breakage and the tests that must catch it.
pub struct Mutant {
    /// Path from the crate root.
    pub file: &'static str,
    /// The enforcement the substitution removes.
    pub breaks: &'static str,
    /// Must occur exactly once in `file`.
    pub from: &'static str,
    pub to: &'static str,
    /// Full test names in the `it` target (run with `--exact`); at least one must fail.
    pub tests: &'static [&'static str],
}

const CONFIRM_LUA: &str = "src/token/redis/scripts/confirm.lua";
const RESTORE_LUA: &str = "src/token/redis/scripts/restore.lua";
const EXTEND_LUA: &str = "src/token/redis/scripts/extend.lua";
const RESERVE_LUA: &str = "src/token/redis/scripts/reserve.lua";
const CONSUME_LUA: &str = "src/token/redis/scripts/consume.lua";
const ISSUE_LUA: &str = "src/token/redis/scripts/issue.lua";
const LOCK_LUA: &str = "src/token/redis/scripts/lock.lua";
const RELEASE_LUA: &str = "src/token/redis/scripts/release.lua";
const TOKEN_SQL: &str = "src/token/postgres/statements.rs";
const PAYMENT_SQL: &str = "src/payment/persistence.rs";
const PAYMENTS_SCHEMA: &str = "migrations/0002_payments.sql";
const PROCESSOR: &str = "src/payment/processor.rs";
const CHARGING: &str = "src/payment/processor/charging.rs";
const TRANSACTION: &str = "src/payment/processor/transaction.rs";
const DECISIONS: &str = "src/payment/decisions.rs";

const REDIS_FENCING: &[&str] = &["token::redis::fencing"];
const PG_FENCING: &[&str] = &["token::postgres::fencing"];

pub const MUTANTS: &[Mutant] = &[
    // ---- Lua: confirm / restore / extend need the same owner AND fence (I5).
    Mutant {
        file: CONFIRM_LUA,
        breaks: "confirm: owner check",
        from: "if h[2] ~= ARGV[1] or tonumber(h[3]) ~= tonumber(ARGV[2]) then",
        to: "if tonumber(h[3]) ~= tonumber(ARGV[2]) then",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: CONFIRM_LUA,
        breaks: "confirm: fence check",
        from: "if h[2] ~= ARGV[1] or tonumber(h[3]) ~= tonumber(ARGV[2]) then",
        to: "if h[2] ~= ARGV[1] then",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: CONFIRM_LUA,
        breaks: "confirm: a completed token takes only the same payment again",
        from: "if h[4] == ARGV[3] then",
        to: "if true then",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: RESTORE_LUA,
        breaks: "restore: status check (only processing)",
        from: "if h[1] ~= 'processing' or h[2] ~= ARGV[1] or",
        to: "if h[2] ~= ARGV[1] or",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: RESTORE_LUA,
        breaks: "restore: owner check",
        from: "or h[2] ~= ARGV[1] or tonumber(h[3])",
        to: "or tonumber(h[3])",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: RESTORE_LUA,
        breaks: "restore: fence check",
        from: " or tonumber(h[3]) ~= tonumber(ARGV[2]) then",
        to: " then",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: EXTEND_LUA,
        breaks: "extend: status check (only processing)",
        from: "if h[1] ~= 'processing' or h[2] ~= ARGV[1] or",
        to: "if h[2] ~= ARGV[1] or",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: EXTEND_LUA,
        breaks: "extend: owner check",
        from: "or h[2] ~= ARGV[1] or tonumber(h[3])",
        to: "or tonumber(h[3])",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: EXTEND_LUA,
        breaks: "extend: fence check",
        from: " or tonumber(h[3]) ~= tonumber(ARGV[2]) then",
        to: " then",
        tests: REDIS_FENCING,
    },
    // ---- Lua: reserve (I4, I5, modes).
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: lease check (a live lease is taken over)",
        from: "if held_until > now and h[7] ~= ARGV[6] then",
        to: "if false then",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: lease expiry (a lapsed lease is never taken over)",
        from: "if held_until > now and h[7] ~= ARGV[6] then",
        to: "if true then",
        tests: &["token::redis::lapsed_lease_is_reservable"],
    },
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: a lost reservation is taken back by the attempt that names it",
        from: "if held_until > now and h[7] ~= ARGV[6] then",
        to: "if held_until > now then",
        tests: &["token::redis::a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only"],
    },
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: only the named owner's live lease is taken back",
        from: "if held_until > now and h[7] ~= ARGV[6] then",
        to: "if held_until > now and h[7] == ARGV[6] then",
        tests: &["token::redis::a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only"],
    },
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: fence grows on every reservation",
        from: "fence = fence + 1",
        to: "fence = math.max(fence, 1)",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: status check (completed is final)",
        from: "elseif status == 'completed' then\n  return {'completed', h[5], h[6]}",
        to: "elseif status == 'completed' and false then\n  return {'completed', h[5], h[6]}",
        tests: REDIS_FENCING,
    },
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: issued mode never creates a token",
        from: "  if not implicit then\n    return {'missing'}\n  end\n  expires_at = now + tonumber(ARGV[4])\nelseif",
        to: "  expires_at = now + tonumber(ARGV[4])\nelseif",
        tests: &["token::redis::modes"],
    },
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: the key outlives the lease (fence cannot restart mid-lease)",
        from: "string.format('%d', math.max(expires_at, lease_until) + (tonumber(ARGV[5]) or 0)))",
        to: "string.format('%d', expires_at + (tonumber(ARGV[5]) or 0)))",
        tests: &["token::redis::restore_keeps_original_ttl"],
    },
    // ---- Lua: issued mode, a token that expires while held is a tombstone.
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: an issued token expired while processing answers unsettled, not missing",
        from: "      if status == 'processing' then\n        return {'unsettled'}\n      end\n",
        to: "",
        tests: &[
            "token::redis::a_token_expired_while_held_is_unsettled_not_missing",
            "gateway::unknown_outcomes::an_issued_token_that_expires_while_its_holder_was_killed_mid_post_is_not_answered_missing",
        ],
    },
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: an issued processing token outlives deadline and lease as a tombstone",
        from: "math.max(expires_at, lease_until) + (tonumber(ARGV[5]) or 0)",
        to: "math.max(expires_at, lease_until)",
        tests: &["token::redis::a_token_expired_while_held_is_unsettled_not_missing"],
    },
    Mutant {
        file: EXTEND_LUA,
        breaks: "extend: a renewed issued token keeps its tombstone time",
        from: "math.max(expires_at, lease_until) + (tonumber(ARGV[4]) or 0)",
        to: "math.max(expires_at, lease_until)",
        tests: &["token::redis::a_token_expired_while_held_is_unsettled_not_missing"],
    },
    // ---- Lua: schemes 1 and 2, issue.
    Mutant {
        file: CONSUME_LUA,
        breaks: "consume: status check (only pending)",
        from: "if h[1] ~= 'pending' then",
        to: "if h[1] == false then",
        tests: &["token::redis::consume_only_pending"],
    },
    Mutant {
        file: ISSUE_LUA,
        breaks: "issue: only when absent (SET NX)",
        from: "if redis.call('EXISTS', KEYS[1]) == 1 then",
        to: "if false then",
        tests: &["token::redis::modes"],
    },
    Mutant {
        file: LOCK_LUA,
        breaks: "lock: NX (a held lock is taken)",
        from: "'NX', 'PX'",
        to: "'PX'",
        tests: &["token::redis::lock_and_release"],
    },
    Mutant {
        file: RELEASE_LUA,
        breaks: "release: owner check",
        from: "if redis.call('GET', KEYS[1]) == ARGV[1] then",
        to: "if redis.call('GET', KEYS[1]) then",
        tests: &["token::redis::lock_and_release"],
    },
    // ---- Settle announcements: a waiting duplicate is woken by the holder's settle.
    Mutant {
        file: CONFIRM_LUA,
        breaks: "confirm: announces the settle to waiting duplicates",
        from: "redis.call('PUBLISH', KEYS[1], 'completed')",
        to: "",
        tests: &["token::redis::confirm_wakes_a_waiting_reservation"],
    },
    Mutant {
        file: RESTORE_LUA,
        breaks: "restore: announces the settle to waiting duplicates",
        from: "redis.call('PUBLISH', KEYS[1], 'pending')",
        to: "",
        tests: &["token::redis::restore_wakes_a_waiting_reservation"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "CONFIRM: announces the settle of a row somebody waits on",
        from: "SELECT fence, CASE WHEN waiters THEN pg_notify(",
        to: "SELECT fence, CASE WHEN false THEN pg_notify(",
        tests: &["token::postgres::confirm_wakes_a_waiting_reservation"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESTORE: announces the settle of a row somebody waits on",
        from: "SELECT dead, CASE WHEN waiters THEN pg_notify(",
        to: "SELECT dead, CASE WHEN false THEN pg_notify(",
        tests: &["token::postgres::restore_wakes_a_waiting_reservation"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "WATCH: marks the row so its settle is announced",
        from: "   SET waiters = true\n",
        to: "   SET waiters = false\n",
        tests: &["token::postgres::confirm_wakes_a_waiting_reservation"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "WATCH: a token no longer held is reported at once",
        from: " WHERE key = $1 AND status = 'processing' AND lease_expires_at > now()\nRETURNING fence\";",
        to: " WHERE key = $1\nRETURNING fence\";",
        tests: &["token::postgres::a_settle_before_the_watch_is_not_missed"],
    },
    // ---- SQL of the Postgres token store.
    Mutant {
        file: TOKEN_SQL,
        breaks: "CONFIRM: owner check",
        from: " WHERE key = $1 AND owner = $2 AND fence = $3\n   AND ((status",
        to: " WHERE key = $1 AND fence = $3\n   AND ((status",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "CONFIRM: fence check",
        from: " WHERE key = $1 AND owner = $2 AND fence = $3\n   AND ((status",
        to: " WHERE key = $1 AND owner = $2\n   AND ((status",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "CONFIRM: a completed token takes only the same payment again",
        from: "OR (status = 'completed' AND payment_id = $4 AND expires_at > now()))",
        to: "OR (status = 'completed' AND expires_at > now()))",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "CONFIRM: expiry check (a dead row cannot be confirmed)",
        from: "AND ((status = 'processing' AND (expires_at > now() OR lease_expires_at > now()))",
        to: "AND ((status = 'processing')",
        tests: &["token::postgres::dead_rows_count_as_absent"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESTORE: expiry check (a dead row cannot be restored)",
        from: "AND owner = $2 AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING key, expires_at <= now() AS dead, waiters)",
        to: "AND owner = $2 AND fence = $3\nRETURNING key, expires_at <= now() AS dead, waiters)",
        tests: &["token::postgres::dead_rows_count_as_absent"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "EXTEND: expiry check (a dead row cannot be extended)",
        from: "AND owner = $2 AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING fence",
        to: "AND owner = $2 AND fence = $3\nRETURNING fence",
        tests: &["token::postgres::dead_rows_count_as_absent"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESTORE: status check (only processing)",
        from: "updated_at = now()\n WHERE key = $1 AND status = 'processing' AND owner = $2 AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING key, expires_at <= now() AS dead, waiters)",
        to: "updated_at = now()\n WHERE key = $1 AND owner = $2 AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING key, expires_at <= now() AS dead, waiters)",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESTORE: owner check",
        from: "AND owner = $2 AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING key, expires_at <= now() AS dead, waiters)",
        to: "AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING key, expires_at <= now() AS dead, waiters)",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESTORE: fence check",
        from: "AND owner = $2 AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING key, expires_at <= now() AS dead, waiters)",
        to: "AND owner = $2\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING key, expires_at <= now() AS dead, waiters)",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "EXTEND: status check (only processing)",
        from: "interval '1 millisecond', updated_at = now()\n WHERE key = $1 AND status = 'processing' AND owner = $2",
        to: "interval '1 millisecond', updated_at = now()\n WHERE key = $1 AND owner = $2",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "EXTEND: owner check",
        from: "AND owner = $2 AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING fence",
        to: "AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING fence",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "EXTEND: fence check",
        from: "AND owner = $2 AND fence = $3\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING fence",
        to: "AND owner = $2\n   AND (expires_at > now() OR lease_expires_at > now())\nRETURNING fence",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (implicit): lease check (a live lease is taken over)",
        from: "        OR (status = 'processing' AND (lease_expires_at <= now() OR owner = $5))\n        OR (status = 'completed'",
        to: "        OR (status = 'processing')\n        OR (status = 'completed'",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (implicit): a lost reservation is taken back by the attempt that names it",
        from: "(lease_expires_at <= now() OR owner = $5)",
        to: "(lease_expires_at <= now())",
        tests: &["token::postgres::a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (implicit): only the named owner's live lease is taken back",
        from: "(lease_expires_at <= now() OR owner = $5)",
        to: "(lease_expires_at <= now() OR owner <> $5)",
        tests: &["token::postgres::a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (implicit): expiry check (a live tombstone is taken over)",
        from: "OR (status = 'completed' AND expires_at <= now()))",
        to: "OR (status = 'completed'))",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (implicit): fence grows on every reservation",
        from: "       fence = fence + 1,\n       lease_expires_at = now() + $3::bigint * interval '1 millisecond',\n       expires_at = CASE",
        to: "       fence = 1,\n       lease_expires_at = now() + $3::bigint * interval '1 millisecond',\n       expires_at = CASE",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (issued): expiry check (an expired token is reserved)",
        from: " WHERE key = $1\n   AND expires_at > now()\n   AND (status = 'pending'",
        to: " WHERE key = $1\n   AND (status = 'pending'",
        tests: &["token::postgres::missing_expired_consumed"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (issued): lease check (a live lease is taken over)",
        from: "   AND (status = 'pending'\n        OR (status = 'processing' AND (lease_expires_at <= now() OR owner = $4)))",
        to: "   AND (status = 'pending' OR status = 'processing')",
        tests: &["token::postgres::lapsed_lease_is_reservable"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (issued): a lost reservation is taken back by the attempt that names it",
        from: "(lease_expires_at <= now() OR owner = $4)",
        to: "(lease_expires_at <= now())",
        tests: &["token::postgres::a_lost_reservation_is_reclaimed_by_the_attempt_that_names_it_only"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (create): unique-key handling (ON CONFLICT DO NOTHING)",
        from: "ON CONFLICT (key) DO NOTHING\nRETURNING fence",
        to: "RETURNING fence",
        tests: PG_FENCING,
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "CONSUME: status check (only pending)",
        from: " WHERE key = $1 AND status = 'pending' AND expires_at > now()",
        to: " WHERE key = $1 AND expires_at > now()",
        tests: &["token::postgres::consume_only_pending"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "CONSUME: expiry check",
        from: " WHERE key = $1 AND status = 'pending' AND expires_at > now()",
        to: " WHERE key = $1 AND status = 'pending'",
        tests: &["token::postgres::missing_expired_consumed"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "ISSUE: only when absent or dead",
        from: " WHERE NOT (t.expires_at > now()\n            OR (t.status = 'processing' AND t.lease_expires_at > now()))\nRETURNING fence",
        to: "\nRETURNING fence",
        tests: &["token::postgres::modes"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "LOCK: take-over only of an expired lock",
        from: " WHERE key = $1 AND expires_at <= now()",
        to: " WHERE key = $1",
        tests: &["token::postgres::lock_and_release"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RELEASE: owner check",
        from: " WHERE key = $1 AND owner = $2 AND expires_at > now()\nRETURNING owner",
        to: " WHERE key = $1 AND expires_at > now()\nRETURNING owner",
        tests: &["token::postgres::lock_and_release"],
    },
    // ---- SQL: the issued-mode tombstone of the Postgres store.
    Mutant {
        file: TOKEN_SQL,
        breaks: "UNSETTLED: the tombstone ends after the completed-token TTL",
        from: "   AND GREATEST(expires_at, lease_expires_at) + $2::bigint * interval '1 millisecond' > now()\";",
        to: "\";",
        tests: &["token::postgres::a_token_expired_while_held_is_unsettled_not_missing"],
    },
    // ---- SQL of the payments table: a key in unresolved_charges is looked up first.
    Mutant {
        file: PAYMENT_SQL,
        breaks: "the row insert reports a key in unresolved_charges (looked up before any POST)",
        from: "EXISTS (SELECT 1 FROM unresolved_charges\n                         WHERE idempotency_key = $2 AND kind = 'charge') AS \"charge_unknown?\"",
        to: "false AS \"charge_unknown?\"",
        tests: &["gateway::unknown_outcomes::a_redrive_after_the_token_expired_looks_the_charge_up_and_never_charges_again"],
    },
    Mutant {
        file: PAYMENT_SQL,
        breaks: "the row insert reports a key a refund holds (a charge never shares it)",
        from: "EXISTS (SELECT 1 FROM refunds\n                         WHERE idempotency_key = $2) AS \"key_of_a_refund?\"",
        to: "false AS \"key_of_a_refund?\"",
        tests: &["payment::refunds::a_charge_and_a_refund_never_share_a_key_once_the_token_is_gone"],
    },
    Mutant {
        file: PAYMENT_SQL,
        breaks: "only a charge's unknown outcome is looked up under a key (a refund's is not a charge's)",
        from: "WHERE idempotency_key = $2 AND kind = 'charge') AS \"charge_unknown?\"",
        to: "WHERE idempotency_key = $2) AS \"charge_unknown?\"",
        tests: &["payment::refunds::a_charge_and_a_refund_never_share_a_key_once_the_token_is_gone"],
    },
    // ---- SQL of the payments table: the unique key serialises two holders (I6).
    Mutant {
        file: PAYMENT_SQL,
        breaks: "INSERT of the processing row: unique-key handling (ON CONFLICT DO NOTHING)",
        from: "ON CONFLICT (idempotency_key) DO NOTHING\n             RETURNING id)",
        to: "RETURNING id)",
        tests: &["payment::races::thirty_two_holders_of_a_reservation_are_serialised_by_postgres"],
    },
    Mutant {
        file: PAYMENTS_SCHEMA,
        breaks: "schema: one payment row per idempotency key (UNIQUE)",
        from: "idempotency_key        text        NOT NULL UNIQUE",
        to: "idempotency_key        text        NOT NULL",
        tests: &["payment::fencing::survivor_with_the_redis_token_store_does_not_commit"],
    },
    // ---- Processor checks the issue named (cargo-mutants does not generate these).
    Mutant {
        file: DECISIONS,
        // Once "the reservation is not the first (fence > 1)" alone: a takeover's
        // predecessor is a stranger since the previous holder is named, which makes
        // it look up on its own, so that narrower mutant is caught by no test. The
        // rule that makes both look up is mutated instead.
        breaks: "look-up before charging unless the history is fresh (fence > 1, a stranger predecessor)",
        from: "if lookup == GatewayLookup::Always || history != ChargeHistory::Fresh {",
        to: "if lookup == GatewayLookup::Always {",
        tests: &[
            "payment::fencing::survivor_with_the_redis_token_store_does_not_commit",
            "payment::crashes::a_failure_after_each_step_then_a_retry_charges_once",
        ],
    },
    Mutant {
        file: CHARGING,
        breaks: "a gateway timeout is looked up, never restored blindly",
        from: "OnChargeError::Resolve(cause) => self.resolve_unknown(command, &error, cause).await,",
        to: "OnChargeError::Resolve(_) => Err(Settlement::Restore(retry(error.to_string()))),",
        tests: &["payment::gateway_faults::an_answer_that_comes_too_late_is_looked_up_and_succeeds"],
    },
    Mutant {
        file: CHARGING,
        breaks: "a timeout whose look-up finds nothing leaves the charge unknown",
        from: "(SettleBy::RestoreUnknown, _) => Err(Settlement::Restore(retry_unknown(",
        to: "(SettleBy::RestoreUnknown, _) => Err(Settlement::Restore(retry(",
        tests: &["gateway::unknown_charges::a_timed_out_charge_that_lands_after_its_token_vanished_is_booked_not_answered_missing"],
    },
    Mutant {
        file: CHARGING,
        breaks: "a 5xx after the POST leaves the charge unknown",
        from: "OnChargeError::RestoreUnknown => Err(Settlement::Restore(retry_unknown(",
        to: "OnChargeError::RestoreUnknown => Err(Settlement::Restore(retry(",
        tests: &[
            "gateway::unknown_outcomes::a_502_or_504_after_the_charge_with_look_ups_down_is_dead_lettered_with_the_charge_unknown",
            "gateway::answers::every_gateway_answer_is_settled_without_a_second_charge",
        ],
    },
    Mutant {
        file: CHARGING,
        breaks: "a look-up answer must name the key asked for",
        from: "if found.idempotency_key != command.idempotency_key.as_str() {",
        to: "if false {",
        tests: &["gateway::unknown_outcomes::a_look_up_answering_another_amount_or_another_key_is_never_booked_and_flagged"],
    },
    Mutant {
        file: DECISIONS,
        breaks: "a key in unresolved_charges, or after an attempt that may have charged, is looked up first",
        from: "if remembered_unknown || earlier == ChargeEvidence::MayHaveCharged {\n        ChargeHistory::Unresolved",
        to: "if remembered_unknown || earlier == ChargeEvidence::MayHaveCharged {\n        ChargeHistory::Fresh",
        tests: &["gateway::unknown_outcomes::a_redrive_after_the_token_expired_looks_the_charge_up_and_never_charges_again"],
    },
    // The fence check before COMMIT (I5): `extend` refused treated as fine.
    Mutant {
        file: TRANSACTION,
        breaks: "pre-COMMIT fence check",
        from: "return Settlement::LeaveToLease(retry_unknown(\"lease lost before commit\"))",
        to: "()",
        tests: &[
            "payment::fencing::survivor_with_the_redis_token_store_does_not_commit",
            "payment::fencing::survivor_with_the_postgres_token_store_does_not_commit",
        ],
    },
    // ---- Who held a token before: a stranger's charge is evidence (I2 unknown outcomes).
    Mutant {
        file: RESERVE_LUA,
        breaks: "reserve: a takeover names the holder whose lease ran out",
        from: "    previous = h[7]\n",
        to: "    previous = false\n",
        tests: &["token::redis::lapsed_lease_is_reservable"],
    },
    Mutant {
        file: RESTORE_LUA,
        breaks: "restore: the holder is kept for the next reservation",
        from: "'status', 'pending', 'previous_owner', ARGV[1])",
        to: "'status', 'pending')",
        tests: &["token::redis::reservations_name_the_previous_holder"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESTORE: the holder is kept for the next reservation",
        from: "SET status = 'pending', previous_owner = owner, owner = NULL,",
        to: "SET status = 'pending', owner = NULL,",
        tests: &["token::postgres::reservations_name_the_previous_holder"],
    },
    Mutant {
        file: TOKEN_SQL,
        breaks: "RESERVE (issued): a takeover names the holder whose lease ran out",
        from: "CASE status WHEN 'processing' THEN owner ELSE previous_owner END",
        to: "CASE status WHEN 'processing' THEN NULL ELSE previous_owner END",
        tests: &["token::postgres::lapsed_lease_is_reservable"],
    },
    Mutant {
        file: PROCESSOR,
        breaks: "a reservation after a stranger's inherits its unknown charge",
        from: "if predecessor.is_stranger(self.previous_claim)\n            && predecessor.is_stranger(self.lost_reservation)\n        {",
        to: "if false {",
        tests: &["gateway::takeovers::a_successor_that_cannot_look_up_a_killed_holders_charge_flags_it_and_a_redrive_books_it"],
    },
];
