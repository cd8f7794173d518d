-- Refunds: one row per refund key, tied to the payment it gives back (part of).
-- A refund refused for good (no payment, a declined one, another currency, nothing
-- left) keeps a `rejected` row too, so every later delivery of it (a replay, a
-- redrive) gets the same answer instead of a refund that the first one refused.
--
-- A refund's row is committed 'processing' BEFORE the gateway is asked, in the same
-- transaction that locked the payment's row and checked that the refunds already
-- booked or in flight plus this one stay within the amount charged. The reservation
-- of that amount is therefore durable whatever happens after the POST (a crash, a
-- timeout, a lost lease): a refund whose outcome is unknown keeps its amount
-- reserved until a look-up settles it, so two refunds under different keys can
-- never give back more than was captured (a constraint across keys that tokens,
-- one per key, cannot enforce).
CREATE TABLE refunds (
    id                     uuid        PRIMARY KEY,
    idempotency_key        text        NOT NULL UNIQUE
                                       CHECK (idempotency_key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    -- NULL only on a refusal for want of a payment (`payment_unknown`).
    payment_id             uuid        REFERENCES payments (id) ON DELETE CASCADE,
    fingerprint            text        NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    amount_minor           bigint      NOT NULL CHECK (amount_minor BETWEEN 1 AND 1000000000000),
    currency               text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    reason                 text        CHECK (char_length(reason) <= 512),
    status                 text        NOT NULL
                                       CHECK (status IN ('processing', 'refunded', 'declined', 'rejected')),
    gateway_transaction_id text,
    failure_reason         text        CHECK (char_length(failure_reason) <= 512),
    source_topic           text,
    source_partition       integer,
    source_offset          bigint,
    trace_id               text,
    fence                  bigint      NOT NULL DEFAULT 0,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    -- A refund the gateway answered carries the gateway's id; one in flight, or one
    -- refused before anything was sent (`rejected`, its reason in failure_reason),
    -- never does.
    CONSTRAINT answered_refund_has_transaction
        CHECK ((status IN ('processing', 'rejected')) = (gateway_transaction_id IS NULL)),
    CONSTRAINT only_a_refusal_lacks_its_payment
        CHECK (payment_id IS NOT NULL OR status = 'rejected')
);

-- The sum of a payment's refunds is read under its row lock on every refund.
CREATE INDEX refunds_payment_id ON refunds (payment_id);
CREATE INDEX refunds_status_created_at ON refunds (status, created_at);

-- Unknown outcomes of refunds are remembered beside those of charges.
ALTER TABLE unresolved_charges
    ADD COLUMN kind text NOT NULL DEFAULT 'charge' CHECK (kind IN ('charge', 'refund'));
