//! `payment-worker-model check` explores every reachable state of a bounded
//! system; `explore` serves stateright's web explorer to step through one.

use clap::{Args, Parser, Subcommand};
use payment_worker::payment::GatewayLookup;
use payment_worker_model::run::{self, Search};
use payment_worker_model::{Assumptions, Config, GatewayKind, Mutant, PaymentModel, StoreKind};
use stateright::Model;

#[derive(Parser)]
#[command(
    name = "payment-worker-model",
    about = "Model checker of the payment protocol"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check every reachable state against the invariants.
    Check {
        #[command(flatten)]
        system: System,
        #[arg(long, value_enum, default_value = "dfs")]
        search: Search,
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
    /// Serve stateright's explorer (a web page) to step through the system by hand.
    Explore {
        #[command(flatten)]
        system: System,
        #[arg(long, default_value = "127.0.0.1:3000")]
        address: String,
    },
}

#[derive(Args)]
struct System {
    #[arg(long, default_value_t = 2)]
    workers: usize,
    #[arg(long, default_value_t = 2)]
    attempts: u8,
    #[arg(long, default_value_t = 1)]
    crashes: u8,
    #[arg(long, default_value_t = 2)]
    expiries: u8,
    #[arg(long, default_value_t = 1)]
    zombies: u8,
    #[arg(long, default_value_t = 1)]
    wipes: u8,
    #[arg(long, default_value_t = 2)]
    faults: u8,
    #[arg(long, default_value_t = 1)]
    redeliveries: u8,
    #[arg(long, default_value_t = 1)]
    replays: u8,
    #[arg(long, default_value_t = 1)]
    redrives: u8,
    #[arg(long, value_enum, default_value = "charges")]
    gateway: GatewayKind,
    #[arg(long, value_enum, default_value = "redis")]
    store: StoreKind,
    #[arg(long, value_enum, default_value = "uncertain")]
    gateway_lookup: GatewayLookup,
    /// Let the gateway forget a key before the token expires.
    #[arg(long)]
    no_key_retention: bool,
    /// Let a committed Postgres transaction be lost.
    #[arg(long)]
    no_postgres_durability: bool,
    /// Let a lease run out while its holder still counts it surely held.
    #[arg(long)]
    no_lease_clock: bool,
    /// Let a delivery's retries run out while another holder's lease is live.
    #[arg(long)]
    no_retry_outlasting_lease: bool,
    /// Let a delivery superseded by a rebalance start the first attempt of an
    /// admitted command (today's code).
    #[arg(long)]
    no_superseded_stop: bool,
    /// A gateway that charges every POST anew, key or not.
    #[arg(long)]
    gateway_ignores_keys: bool,
    /// Remove one of the code's guards.
    #[arg(long, value_enum)]
    mutant: Option<Mutant>,
}

impl System {
    fn config(&self) -> Config {
        Config {
            workers: self.workers,
            attempts: self.attempts,
            crashes: self.crashes,
            expiries: self.expiries,
            zombies: self.zombies,
            wipes: self.wipes,
            faults: self.faults,
            redeliveries: self.redeliveries,
            replays: self.replays,
            redrives: self.redrives,
            gateway: self.gateway,
            store: self.store,
            lookup: self.gateway_lookup,
            assumptions: Assumptions {
                key_retention: !self.no_key_retention,
                postgres_durability: !self.no_postgres_durability,
                lease_clock: !self.no_lease_clock,
                retry_outlasts_lease: !self.no_retry_outlasting_lease,
                superseded_start_nothing: !self.no_superseded_stop,
            },
            mutant: self.mutant,
            gateway_ignores_keys: self.gateway_ignores_keys,
        }
    }
}

fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Command::Check {
            system,
            search,
            threads,
        } => {
            let config = system.config();
            println!("{config:?}");
            let report = run::check(&config, search, threads, false);
            println!(
                "{} unique states ({} visited, depth {}) in {:.1} s",
                report.unique_states,
                report.states,
                report.max_depth,
                report.elapsed.as_secs_f64()
            );
            for name in &report.unreached {
                println!("never reached: {name}");
            }
            for counterexample in &report.counterexamples {
                println!(
                    "COUNTEREXAMPLE to \"{}\" in {} steps:",
                    counterexample.property,
                    counterexample.trace.len()
                );
                for (n, action) in counterexample.trace.iter().enumerate() {
                    println!("  {:>3}. {action}", n + 1);
                }
            }
            if report.counterexamples.is_empty() {
                println!("every property holds");
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Command::Explore { system, address } => {
            let model = PaymentModel {
                config: system.config(),
            };
            println!("serving the explorer on http://{address}/");
            model.checker().serve(address.as_str());
            std::process::ExitCode::SUCCESS
        }
    }
}
