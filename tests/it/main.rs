//! One integration-test binary (one link step), one folder per capability and one
//! `support/` for the harness they share.

/// `#[sqlx::test]` gives a test a database of its own, migrated, and drops it when
/// the test passes; it makes them from the server and database `DATABASE_URL` names,
/// read before the test's own code runs. The local server's `postgres` database
/// unless the environment names another. Also starts Postgres and Redis when they are
/// down, as every other test's harness does, since sqlx connects first.
#[ctor::ctor]
unsafe fn sqlx_test_server() {
    if std::env::var_os("DATABASE_URL").is_none() {
        std::env::set_var("DATABASE_URL", support::helpers::SQLX_TEST_SERVER);
    }
    support::helpers::ensure_services();
}
mod audit;
mod chaos;
mod cli;
mod database;
mod deploy;
mod faults;
mod gateway;
mod payment;
mod support;
mod telemetry;
mod token;
mod worker;
