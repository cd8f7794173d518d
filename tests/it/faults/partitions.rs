//! Each dependency cut on its own while two workers process a paced workload (50
//! commands a second, a fifth of them duplicates): a silent partition from Redis,
//! from Postgres, from both; answers lost on the way back from Redis; a gateway that
//! goes silent mid-POST; 200 ms of latency to each dependency in turn; every
//! connection reset and new ones refused. Each run ends with the books and `audit`
//! (see `rig.rs`), and prints how long recovery took after the heal.

use std::time::{Duration, Instant};

use crate::support::fault_proxy::{Direction, Fault, FaultProxy, Latency};
use crate::support::helpers::http_get;
use crate::support::procs;

use super::rig::{FaultRig, Window};

/// Which proxy a step acts on.
#[derive(Clone, Copy)]
enum Dependency {
    Redis,
    Postgres,
    Gateway,
}

/// One fault of a schedule: applied, held for `lasting`, then healed.
struct Step {
    name: &'static str,
    cut: &'static [Dependency],
    fault: Fault,
    /// Every open connection of the cut dependencies is reset first.
    reset: bool,
    lasting: Duration,
}

fn proxy(rig: &FaultRig, dependency: Dependency) -> &FaultProxy {
    match dependency {
        Dependency::Redis => &rig.redis,
        Dependency::Postgres => &rig.postgres,
        Dependency::Gateway => &rig.gateway,
    }
}

/// Runs `steps` one after the other, 4 s apart, during a paced workload long enough
/// to cover them, then checks the books.
async fn run_schedule(steps: &[Step]) {
    let mut rig = FaultRig::start(&[]).await;
    let busy: Duration = steps
        .iter()
        .map(|s| s.lasting + Duration::from_secs(4))
        .sum();
    // 50 commands a second for the whole schedule plus 6 s around it.
    let records = rig.workload(50 * (busy.as_secs() as usize + 6));
    let producer = rig.run(&records, 60).await;
    let mut windows = Vec::new();
    for step in steps {
        for dependency in step.cut {
            let proxy = proxy(&rig, *dependency);
            proxy.set(step.fault);
            if step.reset {
                proxy.reset_all();
            }
        }
        let began = Instant::now();
        tokio::time::sleep(step.lasting).await;
        for dependency in step.cut {
            proxy(&rig, *dependency).set(Fault::Pass);
        }
        windows.push(Window {
            name: step.name,
            began,
            healed: Instant::now(),
        });
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let results = rig.settle_and_check(&records, producer).await;
    rig.report(&windows, &results).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_partition_from_redis_alone_loses_nothing_and_charges_nothing_twice() {
    run_schedule(&[Step {
        name: "redis silent",
        cut: &[Dependency::Redis],
        fault: Fault::Blackhole,
        reset: false,
        lasting: Duration::from_secs(5),
    }])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_partition_from_postgres_alone_loses_nothing_and_charges_nothing_twice() {
    run_schedule(&[Step {
        name: "postgres silent",
        cut: &[Dependency::Postgres],
        fault: Fault::Blackhole,
        reset: false,
        lasting: Duration::from_secs(5),
    }])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_stores_silent_at_once_lose_nothing_and_charge_nothing_twice() {
    run_schedule(&[Step {
        name: "redis and postgres silent",
        cut: &[Dependency::Redis, Dependency::Postgres],
        fault: Fault::Blackhole,
        reset: false,
        lasting: Duration::from_secs(5),
    }])
    .await;
}

/// Redis runs every reservation sent to it and none of its answers come back: each
/// is an unknown outcome, the token held under an owner nobody will settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_lost_on_the_way_back_from_redis_are_unknown_outcomes_not_double_charges() {
    run_schedule(&[Step {
        name: "redis answers lost",
        cut: &[Dependency::Redis],
        fault: Fault::HalfOpen(Direction::ToClient),
        reset: false,
        lasting: Duration::from_secs(4),
    }])
    .await;
}

/// Longer than the gateway timeout (5 s): the POSTs in flight get no answer, their
/// outcome is unknown, and the held requests reach the gateway at the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_silent_mid_post_leaves_unknown_outcomes_that_are_looked_up_not_charged_again() {
    run_schedule(&[Step {
        name: "gateway silent",
        cut: &[Dependency::Gateway],
        fault: Fault::Blackhole,
        reset: false,
        lasting: Duration::from_secs(7),
    }])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn latency_of_200_ms_to_each_dependency_in_turn_slows_and_breaks_nothing() {
    let latency = Fault::Delay(Latency {
        fixed: Duration::from_millis(200),
        jitter: Duration::from_millis(20),
    });
    let step = |name, dependency: &'static [Dependency]| Step {
        name,
        cut: dependency,
        fault: latency,
        reset: false,
        lasting: Duration::from_secs(3),
    };
    run_schedule(&[
        step("redis +200 ms", &[Dependency::Redis]),
        step("postgres +200 ms", &[Dependency::Postgres]),
        step("gateway +200 ms", &[Dependency::Gateway]),
    ])
    .await;
}

/// As a failover or a middlebox that lost its state does: every connection ends
/// with an RST, and for 2 s new ones are turned away.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_store_connection_reset_and_new_ones_refused_loses_nothing() {
    run_schedule(&[Step {
        name: "stores reset, refused",
        cut: &[Dependency::Redis, Dependency::Postgres],
        fault: Fault::Refuse,
        reset: true,
        lasting: Duration::from_secs(2),
    }])
    .await;
}

/// The long run (`scripts/fault-run`, not in the suite): a random schedule of the
/// faults above for `PW_FAULT_RUN_MINUTES` (default 3), seeded by `PW_FAULT_RUN_SEED`,
/// then the same books and `audit`; every fault's figures are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes long: run by scripts/fault-run"]
async fn a_random_schedule_of_faults_keeps_the_books() {
    use rand::{Rng, SeedableRng};
    let minutes: u64 = std::env::var("PW_FAULT_RUN_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(3);
    let seed: u64 = std::env::var("PW_FAULT_RUN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(49);
    let mut random = rand::rngs::StdRng::seed_from_u64(seed);
    const STORES: &[Dependency] = &[Dependency::Redis, Dependency::Postgres];
    let kinds: [(&'static str, &'static [Dependency], Fault, bool); 8] = [
        (
            "redis silent",
            &[Dependency::Redis],
            Fault::Blackhole,
            false,
        ),
        (
            "postgres silent",
            &[Dependency::Postgres],
            Fault::Blackhole,
            false,
        ),
        ("both stores silent", STORES, Fault::Blackhole, false),
        (
            "redis answers lost",
            &[Dependency::Redis],
            Fault::HalfOpen(Direction::ToClient),
            false,
        ),
        (
            "gateway silent",
            &[Dependency::Gateway],
            Fault::Blackhole,
            false,
        ),
        (
            "postgres +200 ms",
            &[Dependency::Postgres],
            Fault::Delay(Latency {
                fixed: Duration::from_millis(200),
                jitter: Duration::from_millis(50),
            }),
            false,
        ),
        (
            "redis +200 ms",
            &[Dependency::Redis],
            Fault::Delay(Latency {
                fixed: Duration::from_millis(200),
                jitter: Duration::from_millis(50),
            }),
            false,
        ),
        ("stores reset, refused", STORES, Fault::Refuse, true),
    ];
    let mut steps = Vec::new();
    let mut planned = Duration::ZERO;
    while planned < Duration::from_secs(minutes * 60) {
        let (name, cut, fault, reset) = kinds[random.random_range(0..kinds.len())];
        let lasting = Duration::from_millis(random.random_range(1_000..8_000));
        planned += lasting + Duration::from_secs(4);
        steps.push(Step {
            name,
            cut,
            fault,
            reset,
            lasting,
        });
    }
    eprintln!("fault run: seed {seed}, {} faults planned", steps.len());
    run_schedule(&steps).await;
}

/// `/readyz` names what is cut, each dependency on its own, and is ready again
/// after the heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_names_the_store_that_is_cut() {
    let health = format!("127.0.0.1:{}", procs::free_port());
    let mut rig = FaultRig::start(&[("HEALTH_LISTEN", health.as_str())]).await;
    rig.deployment.add_worker();
    let url = format!("http://{health}/readyz");
    let readiness = || async {
        match http_get(&url).await {
            Ok(answer) => (
                answer.status().as_u16(),
                answer.text().await.unwrap_or_default(),
            ),
            Err(error) => (0, error.to_string()),
        }
    };
    let wait_for = |want: u16, naming: &'static str| {
        let readiness = &readiness;
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let (status, body) = readiness().await;
                if status == want && body.contains(naming) {
                    return body;
                }
                assert!(
                    Instant::now() < deadline,
                    "/readyz never said {want} {naming:?}; last: {status} {body}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    wait_for(200, "ready").await;

    rig.redis.set(Fault::Blackhole);
    let body = wait_for(503, "token store").await;
    assert!(!body.contains("postgres"), "Postgres still answers: {body}");
    rig.redis.set(Fault::Pass);
    wait_for(200, "ready").await;

    rig.postgres.set(Fault::Blackhole);
    let body = wait_for(503, "postgres").await;
    assert!(!body.contains("token store"), "Redis still answers: {body}");
    rig.postgres.set(Fault::Pass);
    wait_for(200, "ready").await;
    rig.deployment.stop_workers().await;
}
