//! The database as the code sees it at compile time: the offline cache of the checked
//! SQL statements (`.sqlx/`) against the schema `migrations/` make.

mod checked_sql;
