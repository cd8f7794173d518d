-- One row per idempotency key: the unique key is what serialises two workers that
-- both hold a reservation (possible after Redis loses its data): invariant I6,
-- Postgres is the truth (docs/CONTRACT.md).
-- The payment method is deliberately not stored: the fingerprint covers it.
CREATE TABLE payments (
    id                     uuid        PRIMARY KEY,
    idempotency_key        text        NOT NULL UNIQUE
                                       CHECK (idempotency_key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    fingerprint            text        NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    account_id             text        NOT NULL CHECK (char_length(account_id) BETWEEN 1 AND 64),
    amount_minor           bigint      NOT NULL CHECK (amount_minor BETWEEN 1 AND 1000000000000),
    currency               text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    description            text        CHECK (char_length(description) <= 512),
    status                 text        NOT NULL CHECK (status IN ('processing', 'succeeded', 'declined')),
    gateway_transaction_id text,
    failure_reason         text,
    source_topic           text,
    source_partition       integer,
    source_offset          bigint,
    trace_id               text,
    fence                  bigint      NOT NULL DEFAULT 0,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    -- A final status always carries the gateway's transaction id; a row still
    -- 'processing' never does (it only exists inside the charging transaction).
    CONSTRAINT final_status_has_transaction
        CHECK ((status = 'processing') = (gateway_transaction_id IS NULL))
);

CREATE INDEX payments_status_created_at ON payments (status, created_at);
CREATE UNIQUE INDEX payments_gateway_transaction_id ON payments (gateway_transaction_id)
    WHERE gateway_transaction_id IS NOT NULL;
