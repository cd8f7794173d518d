-- The span that charged, so a replayed duplicate's trace can link to it.
ALTER TABLE payments ADD COLUMN span_id text;
