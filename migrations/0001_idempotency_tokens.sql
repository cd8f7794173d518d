-- Tokens of the Postgres token store, one row per idempotency key.
-- Rows are never trusted by their mere presence: every statement checks status and
-- expiry in its WHERE, so an expired row is the same as an absent one. A row is live
-- while expires_at is ahead, or while a processing lease is (a lease may outlive the
-- token's own deadline, which restore must keep).
CREATE TABLE idempotency_tokens (
    key              text        PRIMARY KEY
                                 CHECK (char_length(key) BETWEEN 1 AND 128),
    status           text        NOT NULL
                                 CHECK (status IN ('pending', 'processing', 'completed')),
    owner            text,
    -- Grows with every reservation for as long as the row exists.
    fence            bigint      NOT NULL DEFAULT 0 CHECK (fence >= 0),
    lease_expires_at timestamptz,
    -- The token's own deadline: pending/processing keep the original, completed the
    -- tombstone's.
    expires_at       timestamptz NOT NULL,
    payment_id       uuid,
    fingerprint      text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT idempotency_tokens_processing_is_owned
        CHECK (status <> 'processing' OR (owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT idempotency_tokens_completed_has_payment
        CHECK (status <> 'completed' OR payment_id IS NOT NULL)
);

-- audit: processing tokens whose lease ran out.
CREATE INDEX idempotency_tokens_leases
    ON idempotency_tokens (lease_expires_at)
    WHERE status = 'processing';

-- housekeeping: deleting rows that are past their deadline.
CREATE INDEX idempotency_tokens_expires_at
    ON idempotency_tokens (expires_at);

-- Scheme 2: a plain lock per key; a row past expires_at is free to take.
CREATE TABLE idempotency_locks (
    key        text        PRIMARY KEY CHECK (char_length(key) BETWEEN 1 AND 128),
    owner      text        NOT NULL,
    expires_at timestamptz NOT NULL
);
