-- Who held a token before its current reservation: the owner whose lease ran out, or
-- who restored the token (RESTORE keeps it here). A reservation returns it, so an
-- attempt can tell its own earlier reservation from a stranger's, whose charge it
-- cannot know and must treat as unknown. Nullable, no default: no table rewrite.
ALTER TABLE idempotency_tokens ADD COLUMN previous_owner text;
