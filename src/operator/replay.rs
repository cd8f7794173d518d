//! `payment-worker replay`: rewinds the workers' consumer group, or (`--dry-run`)
//! reports what replaying would do without touching the group.

use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::dry_run::{dry_run_report, DryRunScope};
use super::group_members::{describe, GroupView, Refusal};
use super::restarts::{restart_of, Movement, Restart};
use super::topics::partition_count;
use crate::configuration::{KafkaSettings, StoreSettings};
use crate::worker::{consumer_config, create_client, group_generation};

/// `payment-worker replay`: which group to rewind and to where, or what a dry run reports.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["to_beginning", "to_offset"])))]
pub struct ReplayArgs {
    /// The cluster, the group and the commands topic.
    #[command(flatten)]
    pub kafka: KafkaSettings,
    /// The group to rewind (default: --kafka-group-id).
    #[arg(long)]
    pub group: Option<String>,
    /// Rewind every partition to its first offset.
    #[arg(long)]
    pub to_beginning: bool,
    /// Rewind every partition to this offset (clamped to what the topic holds); a
    /// partition the group has not read that far yet is left where it is.
    #[arg(long)]
    pub to_offset: Option<i64>,
    /// Report what replaying would do (counts per verdict: would_charge,
    /// would_look_up, duplicate, key_reused, in_flight, token_missing, invalid),
    /// without touching the group or the gateway.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: print the report as one JSON document.
    #[arg(long, requires = "dry_run")]
    pub json: bool,
    /// With --dry-run: also give each record's verdict (one line, or a `records` list in JSON).
    #[arg(long, requires = "dry_run")]
    pub list: bool,
    /// With --dry-run: examine at most N records, shared evenly between the partitions.
    #[arg(long, value_name = "N", requires = "dry_run")]
    pub limit: Option<usize>,
    /// With --dry-run: the workers' `--gateway-lookup` (`always`: every charge is a look-up first).
    #[arg(
        long = "gateway-lookup",
        env = "GATEWAY_LOOKUP",
        value_enum,
        default_value = "uncertain"
    )]
    pub gateway_lookup: crate::payment::GatewayLookup,
    /// With --dry-run: the workers' `--gateway` (`stripe`: a command whose amount
    /// Stripe cannot express is `invalid`). Nothing is sent to it.
    #[arg(
        id = "gateway_kind",
        long = "gateway",
        env = "GATEWAY_KIND",
        value_enum,
        default_value = "charges"
    )]
    pub gateway: crate::configuration::GatewayKind,
    /// Where payments and tokens live (read by `--dry-run` only).
    #[command(flatten)]
    pub stores: StoreSettings,
}

/// What a rewind did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rewound {
    /// Partitions moved back.
    pub rewound: usize,
    /// Partitions the group had not read past the target yet, left where they were.
    pub left: usize,
}

/// Where each partition of a replay restarts.
fn replay_targets(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: i32,
    to_offset: Option<i64>,
) -> anyhow::Result<Vec<(i32, Restart)>> {
    let committed = consumer
        .committed(Duration::from_secs(10))
        .context("reading the group's committed offsets")?;
    (0..partitions)
        .map(|p| {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .with_context(|| format!("watermarks of {topic}/{p}"))?;
            let at = committed
                .find_partition(topic, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            Ok((p, restart_of(to_offset, low, high, at)))
        })
        .collect()
}

/// Rewinds the group (every member must be gone), or prints the dry run's report.
pub async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    // A passed-through setting the worker owns would quietly override a flag: a
    // `KAFKA_CONFIG_BOOTSTRAP_SERVERS` left in the environment would rewind the
    // group on another cluster than `--kafka-brokers` names.
    args.kafka.check_passthrough()?;
    let mut kafka = args.kafka.clone();
    if let Some(group) = &args.group {
        kafka.group_id = group.clone();
    }
    if args.dry_run {
        return dry_run(&args, &kafka).await;
    }
    let to_offset = if args.to_beginning {
        None
    } else {
        args.to_offset
    };
    let done = tokio::task::spawn_blocking(move || rewind_group(&kafka, to_offset)).await??;
    println!("rewound {} partitions", done.rewound);
    if done.left > 0 {
        println!(
            "left {} partitions where they were: the group has not read that far yet",
            done.left
        );
    }
    Ok(())
}

async fn dry_run(args: &ReplayArgs, kafka: &KafkaSettings) -> anyhow::Result<()> {
    let (pool, store) = crate::startup::open_existing_stores(&args.stores).await?;
    let scope = DryRunScope {
        to_offset: if args.to_beginning {
            None
        } else {
            args.to_offset
        },
        limit: args.limit,
        lookup: args.gateway_lookup,
        gateway: args.gateway,
    };
    let report = dry_run_report(
        kafka,
        &scope,
        &pool,
        store.as_ref(),
        args.stores.tokens.mode,
        args.list,
    )
    .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

/// Waits until the group assigned this replay every partition: only possible once no
/// other member is left, which takes a dead member's session timeout. Once, after a
/// session timeout, a replay the broker lists as the group's only member but which
/// still lacks partitions joins again (a coordinator can complete a rebalance
/// without assigning them: tansu 0.6 does when the group's leader was dropped
/// mid-round). A refusal names who else the broker lists in the group.
fn wait_for_every_partition(
    consumer: &BaseConsumer,
    kafka: &KafkaSettings,
    partitions: i32,
) -> anyhow::Result<()> {
    let topic = kafka.commands_topic.as_str();
    let started = Instant::now();
    let deadline = started + kafka.session_timeout * 3 + Duration::from_secs(5);
    let (mut looked, mut rejoined) = (false, false);
    loop {
        // Messages fetched meanwhile are dropped at once; nothing is stored.
        if let Some(Err(error)) = consumer.poll(Duration::from_millis(100)) {
            tracing::debug!(%error, "poll while waiting for the assignment");
        }
        let assigned = consumer.assignment()?.count();
        if assigned == partitions as usize {
            return Ok(());
        }
        let me = || {
            group_generation(consumer)
                .map(|g| g.member_id)
                .unwrap_or_default()
        };
        if !looked && started.elapsed() > kafka.session_timeout {
            looked = true;
            let view = describe(consumer, &kafka.group_id, &me());
            if view.as_ref().is_some_and(GroupView::alone_and_stable) {
                tracing::warn!(
                    assigned,
                    partitions,
                    "the only member of the group, yet not assigned every partition; joining again"
                );
                consumer.unsubscribe();
                consumer.subscribe(&[topic])?;
                rejoined = true;
            }
        }
        if Instant::now() >= deadline {
            let refusal = Refusal {
                group: &kafka.group_id,
                assigned,
                partitions,
                waited: started.elapsed(),
                session_timeout: kafka.session_timeout,
                rejoined,
                view: describe(consumer, &kafka.group_id, &me()),
            };
            anyhow::bail!("{refusal}");
        }
    }
}

/// Joins the group, waits to be assigned every partition (only possible when no
/// other member is alive), commits the start offsets as a member, and leaves.
pub fn rewind_group(kafka: &KafkaSettings, to_offset: Option<i64>) -> anyhow::Result<Rewound> {
    let topic = kafka.commands_topic.as_str();
    let partitions = partition_count(kafka, topic)?;
    // Always a dynamic member: with a worker's `KAFKA_GROUP_INSTANCE_ID` in its
    // environment it would take that worker's place (fencing it while it runs), and
    // "every partition is mine" would no longer prove that no worker is alive.
    let dynamic = KafkaSettings {
        group_instance_id: None,
        ..kafka.clone()
    };
    let mut config = consumer_config(&dynamic);
    config.set("enable.auto.commit", "false");
    let consumer: BaseConsumer = create_client(&config)?;
    consumer.subscribe(&[topic])?;
    wait_for_every_partition(&consumer, kafka, partitions)?;
    let targets = replay_targets(&consumer, topic, partitions, to_offset)?;
    let mut list = TopicPartitionList::new();
    for (p, restart) in &targets {
        list.add_partition_offset(topic, *p, Offset::Offset(restart.start))?;
    }
    consumer
        .commit(&list, CommitMode::Sync)
        .context("committing the replay offsets")?;
    drop(list);
    consumer.unsubscribe();
    let _ = consumer.poll(Duration::from_millis(100));
    drop(consumer);
    let count = |movement| {
        targets
            .iter()
            .filter(|(_, r)| r.movement == movement)
            .count()
    };
    Ok(Rewound {
        rewound: count(Movement::Rewound),
        left: count(Movement::NotReadThatFar),
    })
}
