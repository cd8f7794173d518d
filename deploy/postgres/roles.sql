-- Least privilege for the local stack (run once by the postgres image at first start,
-- in the `payments` database). `payments_owner` owns the schema and is the only role
-- the `migrate` service uses; the workers log in as `payments_worker`, which may only
-- read and write rows (they run with MIGRATE=skip). Local passwords only: a real
-- deployment takes them from its secret store.
CREATE ROLE payments_owner LOGIN PASSWORD 'owner';
CREATE ROLE payments_worker LOGIN PASSWORD 'worker';
ALTER SCHEMA public OWNER TO payments_owner;
GRANT CONNECT ON DATABASE payments TO payments_owner, payments_worker;
GRANT USAGE ON SCHEMA public TO payments_worker;
-- Tables and sequences the owner creates later (every migration) are granted as made.
ALTER DEFAULT PRIVILEGES FOR ROLE payments_owner IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO payments_worker;
ALTER DEFAULT PRIVILEGES FOR ROLE payments_owner IN SCHEMA public
    GRANT USAGE ON SEQUENCES TO payments_worker;
