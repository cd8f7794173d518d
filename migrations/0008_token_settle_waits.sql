-- A reservation that met a live lease marks the token so that the holder's settle
-- (confirm or restore) is announced with pg_notify; settles nobody waits for are not
-- announced (NOTIFY serialises the commits of the transactions that use it).
-- Reset by every new reservation. A constant default: no table rewrite.
ALTER TABLE idempotency_tokens ADD COLUMN waiters boolean NOT NULL DEFAULT false;
