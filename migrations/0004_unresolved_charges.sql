-- Commands whose retries ran out while an earlier attempt may have charged (an
-- unknown outcome that no look-up resolved). Their dead letter says so as well
-- (`x-charge-unknown: true`); this table is what `audit` reads to list them against
-- the gateway ledger until a payment row books them. No payment method is kept:
-- amount and currency are enough to match a ledger entry.
CREATE TABLE unresolved_charges (
    idempotency_key  text        PRIMARY KEY
                                 CHECK (idempotency_key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    amount_minor     bigint      NOT NULL,
    currency         text        NOT NULL,
    reason           text        NOT NULL CHECK (char_length(reason) <= 512),
    attempts         integer     NOT NULL,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    dead_lettered_at timestamptz NOT NULL DEFAULT now()
);
