-- The Stripe gateway's own records: one row per PaymentIntent create attempt of a
-- payment. The adapter writes them on a pool of its own, each statement committed at
-- once: the attempt's number and time before the create is sent (a create whose
-- answer is lost is then found by listing PaymentIntents around that time), the
-- PaymentIntent's id before it is confirmed, the count of confirm attempts before
-- each confirm (every attempt sends an Idempotency-Key of its own). A payment whose
-- transaction rolls back keeps its records, so a later attempt confirms the
-- PaymentIntent already made instead of making another. No foreign key to payments:
-- the payment row is not committed yet when its first record is written.
CREATE TABLE stripe_payment_intents (
    idempotency_key   text        NOT NULL
                                  CHECK (char_length(idempotency_key) BETWEEN 1 AND 128
                                         AND idempotency_key !~ '[^A-Za-z0-9._:-]'),
    create_attempt    integer     NOT NULL CHECK (create_attempt >= 1),
    -- The payment row of the attempt that made it (its metadata[payment_id]).
    payment_id        uuid        NOT NULL,
    -- The Stripe account and mode: a payment is only continued under them.
    account           text        NOT NULL CHECK (char_length(account) BETWEEN 1 AND 255),
    livemode          boolean     NOT NULL,
    requested_at      timestamptz NOT NULL DEFAULT now(),
    payment_intent_id text        UNIQUE CHECK (char_length(payment_intent_id) <= 255),
    confirm_attempts  integer     NOT NULL DEFAULT 0 CHECK (confirm_attempts >= 0),
    decline_code      text        CHECK (char_length(decline_code) <= 255),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (idempotency_key, create_attempt)
);
