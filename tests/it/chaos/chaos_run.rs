//! The chaos run: ten (fifty with `CHAOS_LARGE=1`, or `CHAOS_KILLS`) SIGKILLs of random workers at
//! random moments, Redis data loss twice, a Postgres restart, then a replay of the
//! whole topic; the invariants checked against what the systems hold.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use payment_worker::configuration::DatabaseSettings;
use payment_worker::operator;
use payment_worker::operator::WorkloadSpec;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::helpers::{unique, TestRedis};
use crate::support::procs::PrivatePostgres;

use crate::support::books::*;
use crate::support::deployment::*;

/// Chaos sizes: CI-sized by default, `CHAOS_LARGE=1` for the long run.
struct ChaosSize {
    commands: usize,
    kills: usize,
}

fn chaos_size() -> ChaosSize {
    let mut size = if std::env::var("CHAOS_LARGE").is_ok_and(|v| v == "1") {
        ChaosSize {
            commands: 10_000,
            kills: 50,
        }
    } else {
        ChaosSize {
            commands: 2000,
            kills: 10,
        }
    };
    // `scripts/interop-tansu` runs a smaller one on a slower broker. At least three
    // kill rounds: two lose Redis, one restarts Postgres.
    let number = |name: &str| std::env::var(name).ok().map(|v| v.parse::<usize>());
    if let Some(commands) = number("CHAOS_COMMANDS") {
        size.commands = commands.expect("CHAOS_COMMANDS must be a number");
    }
    if let Some(kills) = number("CHAOS_KILLS") {
        size.kills = kills.expect("CHAOS_KILLS must be a number").max(3);
    }
    size
}

fn chaos_seed() -> u64 {
    match std::env::var("CHAOS_SEED") {
        Ok(seed) => seed.parse().expect("CHAOS_SEED must be a number"),
        Err(_) => 20_261_129,
    }
}

/// The chaos run. Random SIGKILLs of workers (restarted each time), Redis
/// losing every key twice, a Postgres restart, all while commands flow; then the
/// whole topic is replayed. Postgres is a private server so that its restart does
/// not disturb the tests sharing the machine's Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_kills_redis_loss_and_a_postgres_restart_never_charge_twice_nor_lose_a_command() {
    let started = Instant::now();
    let seed = chaos_seed();
    let size = chaos_size();
    eprintln!(
        "chaos: seed {seed} (CHAOS_SEED), {} commands, {} kills",
        size.commands, size.kills
    );
    let mut rng = StdRng::seed_from_u64(seed);

    let mut postgres = PrivatePostgres::start().await;
    let database_url = postgres.url("pw_chaos");
    // Created here, before three workers race to create it.
    let pool =
        payment_worker::startup::connect_and_migrate(&DatabaseSettings::with_url(&database_url))
            .await
            .unwrap();
    let mut redis = TestRedis::new().await;
    let gateway_seed = seed.to_string();
    let mut deployment = Deployment::start(
        PARTITIONS,
        &database_url,
        &redis.prefix,
        &[
            "--error-rate",
            "0.05",
            "--decline-rate",
            "0.05",
            "--timeout-after-charge-rate",
            "0.02",
            "--late-by-ms",
            "1500",
            // Every charge is in flight for a while, so a kill interrupts some.
            "--latency-ms",
            "100",
            "--seed",
            &gateway_seed,
        ],
        &[("GATEWAY_TIMEOUT", "500ms")],
    )
    .await;
    let spec = WorkloadSpec {
        count: size.commands,
        duplicate_ratio: 0.25,
        invalid_ratio: 0.05,
        decline_ratio: 0.05,
        seed,
    };
    let records = operator::generate(&spec, &unique("chaos"));

    deployment.start_workers();
    deployment
        .wait_for_stable_group(Duration::from_secs(90))
        .await;

    // The events, drawn from the seed: which rounds lose Redis, which one restarts
    // Postgres. Each round waits for the whole group to work again (after a kill it
    // stalls until the dead member's session expired), publishes its share of the
    // workload, and strikes at a random point while that share is being processed,
    // so every strike interrupts commands in flight.
    let mut rounds: Vec<usize> = (0..size.kills).collect();
    let mut pick = |rng: &mut StdRng| rounds.remove(rng.random_range(0..rounds.len()));
    let flush_rounds = [pick(&mut rng), pick(&mut rng)];
    let postgres_round = pick(&mut rng);
    let mut flushed = Vec::new();
    for (round, share) in records
        .chunks(records.len().div_ceil(size.kills))
        .enumerate()
    {
        let fraction = rng.random_range(0.1..0.7);
        let strike_at = deployment.publish_until(share, fraction).await;
        let mut events = Vec::new();
        if flush_rounds.contains(&round) {
            let keys = flush_prefix(&mut redis.conn, &redis.prefix).await;
            events.push(format!("Redis lost {keys} keys"));
            flushed.push(keys);
        }
        if round == postgres_round {
            let down_for = Duration::from_millis(rng.random_range(200..1500));
            postgres.restart(down_for).await;
            events.push(format!("Postgres restarted ({down_for:?} down)"));
        }
        let victim = rng.random_range(0..WORKERS);
        deployment.kill(victim);
        events.push(format!("SIGKILL slot {victim}"));
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..2000))).await;
        deployment.restart(victim);
        eprintln!(
            "chaos: round {round} at {strike_at} results: {}; {:?}",
            events.join(", "),
            started.elapsed()
        );
    }
    assert_eq!(deployment.kills, size.kills);
    assert_eq!(flushed.len(), 2, "Redis lost its data twice");
    assert_eq!(postgres.restarts, 1, "Postgres restarted once");

    let first_pass = deployment
        .wait_until_settled(records.len(), HashMap::new(), Duration::from_secs(240))
        .await;
    eprintln!("chaos: settled after {:?}", started.elapsed());

    // Replay from 0: workers stopped, the group rewound by `replay`, workers again.
    deployment.stop_workers().await;
    let ledger_before = deployment.ledger().await;
    let results_end = deployment
        .high_watermarks(&deployment.settings.results_topic.clone())
        .await;
    deployment.rewind_to_beginning().await;
    deployment.start_workers();
    let replayed = deployment
        .wait_until_settled(records.len(), results_end, Duration::from_secs(180))
        .await;
    deployment.stop_workers().await;

    // The replay charged nothing (not even a POST the gateway deduplicated) and
    // answered every command as a duplicate (or the same rejection).
    let held = deployment.holdings(&pool).await;
    assert_eq!(held.ledger, ledger_before, "the replay reached the gateway");
    for (position, answers) in by_position(&replayed) {
        let outcome_ok = match &held.expected[&position] {
            Expected::Valid { .. } => answers.iter().all(|a| a.outcome == "duplicate"),
            Expected::Invalid { .. } => answers.iter().all(|a| a.outcome == "rejected"),
        };
        assert!(outcome_ok, "replayed {position:?} answered {answers:?}");
    }

    // The replay passed over every key after the last fault and nothing runs now, so
    // a token still `processing` (expired lease or not) would be stuck for good.
    // Before the replay: positions answered more than once (kills make some).
    let repeated = by_position(&first_pass)
        .values()
        .filter(|answers| answers.len() > 1)
        .count();
    let mut results = first_pass;
    results.extend(replayed);
    let tokens = token_statuses(&mut redis.conn, &redis.prefix).await;
    held.check(&records, &results, &tokens);
    let Holdings {
        dead_letters,
        ledger,
        ..
    } = held;

    // The operator's audit agrees.
    deployment.audit().await;

    eprintln!(
        "chaos: seed {seed}: {} kills, Redis flushed twice ({flushed:?} keys), Postgres restarted once; \
         {} commands ({repeated} answered more than once before the replay), {} charges ({} POSTed \
         more than once), {} payments under a later reservation, {} dead letters; took {:?}",
        deployment.kills,
        records.len(),
        ledger.len(),
        ledger.iter().filter(|e| e.attempts > 1).count(),
        later_reservations(&pool).await,
        dead_letters.len(),
        started.elapsed()
    );
    pool.close().await;
    flush_prefix(&mut redis.conn, &redis.prefix).await;
}
