//! The command line as users run it: commands, help and docs, demo, bench, walkthrough.

mod architecture;
mod bench;
mod commands;
mod demo;
mod docs;
mod kafka_commands;
mod manifest;
mod product_build;
mod secret_files;
mod walkthrough;
