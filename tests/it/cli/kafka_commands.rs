//! The commands that talk to Kafka, black-box: `produce` run twice makes
//! new payments (no `key_reused`), and `replay --dry-run` answers with counts per
//! verdict (`would_charge`, `would_look_up`, ...), as text or JSON, under `--limit`.

use std::process::Output;
use std::time::Duration;

use payment_worker::payment::{
    record_unresolved_stake, ChargeAtStake, PaymentCommand, SourcePosition,
};
use payment_worker::token::{Claim, IdempotencyKey, Reservation};
use payment_worker_devtools::SimulatorConfig;

use crate::support::helpers::{quick_worker_settings, stop_all, Stack, REDIS_URL};
use crate::support::scripted_stripe::ScriptedStripe;

fn stack_env(stack: &Stack) -> Vec<(String, String)> {
    vec![
        ("KAFKA_BROKERS".into(), stack.settings.brokers.clone()),
        ("KAFKA_GROUP_ID".into(), stack.settings.group_id.clone()),
        (
            "COMMANDS_TOPIC".into(),
            stack.settings.commands_topic.clone(),
        ),
        ("DATABASE_URL".into(), stack.db.url.clone()),
        ("REDIS_URL".into(), REDIS_URL.into()),
        ("REDIS_KEY_PREFIX".into(), stack.redis.prefix.clone()),
    ]
}

async fn pw(stack: &Stack, args: &[&str]) -> Output {
    pw_with(stack, args, &[]).await
}

/// `pw` with more environment, as a worker's deployment would set it.
async fn pw_with(stack: &Stack, args: &[&str], env: &[(&str, &str)]) -> Output {
    let output = tokio::process::Command::new(crate::support::procs::BINARY)
        .args(args)
        .env_clear()
        .envs(stack_env(stack))
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

async fn dry_run_json(stack: &Stack, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["replay", "--to-beginning", "--dry-run", "--json"];
    args.extend_from_slice(extra);
    let output = pw(stack, &args).await;
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

/// The key prefix `produce` reports: "... (keys cmd-1a2b3c4d:NNNNNN)".
fn reported_prefix(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stdout);
    let start = text.find("(keys ").expect("keys reported") + "(keys ".len();
    let rest = &text[start..];
    rest[..rest.find(":NNNNNN").expect("key pattern")].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producing_twice_makes_new_payments_and_dry_run_counts_every_verdict() {
    let stack = Stack::new(2, SimulatorConfig::default()).await;
    let generated = [
        "produce",
        "--count",
        "30",
        "--duplicate-ratio",
        "0",
        "--invalid-ratio",
        "0",
        "--decline-ratio",
        "0",
    ];

    // Nothing processed yet: every command would charge.
    let first = pw(&stack, &generated).await;
    let first_prefix = reported_prefix(&first);
    let report = dry_run_json(&stack, &[]).await;
    assert_eq!(report["records_in_range"], 30, "{report}");
    assert_eq!(report["examined"], 30);
    assert_eq!(report["counts"]["would_charge"], 30, "{report}");
    assert_eq!(report["counts"]["duplicate"], 0);
    assert!(report.get("records").is_none(), "no list unless --list");

    let workers = vec![stack.start_worker("w1", &quick_worker_settings())];
    stack.wait_for_results(30, Duration::from_secs(120)).await;

    // The newcomer's second try: the same command line, new keys, new payments.
    let second = pw(&stack, &generated).await;
    let second_prefix = reported_prefix(&second);
    assert_ne!(first_prefix, second_prefix, "a fresh run id per run");
    assert!(first_prefix.starts_with("cmd-") && second_prefix.starts_with("cmd-"));
    let results = stack.wait_for_results(60, Duration::from_secs(120)).await;
    let mut outcomes: Vec<&str> = results.iter().map(|r| r.outcome.as_str()).collect();
    outcomes.dedup();
    assert_eq!(outcomes, ["succeeded"], "no key_reused, no rejection");
    assert!(stack.dead_letters().await.is_empty());
    assert_eq!(stack.payment_rows().await.len(), 60);
    stop_all(workers).await;

    // An explicit prefix is taken as given (here: the first run's keys again).
    let again = pw(
        &stack,
        &[
            "produce",
            "--count",
            "2",
            "--duplicate-ratio",
            "0",
            "--invalid-ratio",
            "0",
            "--key-prefix",
            "cli-fixed",
        ],
    )
    .await;
    assert_eq!(reported_prefix(&again), "cli-fixed");

    // Three more commands by file: one whose token an earlier attempt held and gave
    // back (fence 1: the next worker looks the charge up first), one given up on
    // with its charge unknown and no token left (looked up first all the same),
    // one never seen.
    let held = IdempotencyKey::try_from("cli-held-1").unwrap();
    let Reservation::Reserved { fence, .. } = stack.tokens.reserve(&held, "earlier").await.unwrap()
    else {
        panic!("not reserved")
    };
    stack
        .tokens
        .restore(
            &held,
            &Claim {
                owner: "earlier".into(),
                fence,
            },
        )
        .await
        .unwrap();
    // Remembered as the worker remembers a command it gave up on.
    let unknown =
        PaymentCommand::new("cli-unknown-1", "acct_1", 500, "EUR", "pm_card_visa", None).unwrap();
    let given_up_at = SourcePosition {
        topic: stack.settings.commands_topic.clone(),
        partition: 0,
        offset: 0,
    };
    record_unresolved_stake(
        &stack.db.pool,
        &ChargeAtStake::of_charge(&unknown),
        &given_up_at,
        "retries_exhausted: gateway answered 502",
        5,
    )
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(crate::support::helpers::unique("pw_cli_file"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("commands.jsonl");
    let line_of_currency = |key: &str, amount: i64, currency: &str| {
        serde_json::json!({"idempotency_key": key, "account_id": "acct_1",
            "amount_minor": amount, "currency": currency, "payment_method": "pm_card_visa"})
        .to_string()
    };
    let line_of = |key: &str, amount: i64| line_of_currency(key, amount, "EUR");
    let line = |key: &str| line_of(key, 500);
    // cli-new-1 three times: the replay charges the first; the workers answer the
    // second as its duplicate and refuse the third (another amount) as key reuse.
    std::fs::write(
        &file,
        format!(
            "{}\n{}\n{}\nnot json\n{}\n{}\n",
            line("cli-held-1"),
            line("cli-unknown-1"),
            line("cli-new-1"),
            line("cli-new-1"),
            line_of("cli-new-1", 501)
        ),
    )
    .unwrap();
    pw(&stack, &["produce", "--file", file.to_str().unwrap()]).await;
    let _ = std::fs::remove_dir_all(&dir);

    let report = dry_run_json(&stack, &["--list"]).await;
    assert_eq!(report["records_in_range"], 68, "{report}");
    let counts = &report["counts"];
    assert_eq!(counts["duplicate"], 61, "{report}");
    assert_eq!(
        counts["would_charge"], 3,
        "cli-fixed-* and cli-new-1 once: {report}"
    );
    assert_eq!(
        counts["key_reused"], 1,
        "cli-new-1 with another amount: {report}"
    );
    assert_eq!(counts["would_look_up"], 2, "{report}");
    assert_eq!(counts["invalid"], 1, "{report}");
    for verdict in ["in_flight", "token_missing"] {
        assert_eq!(counts[verdict], 0, "{verdict}: {report}");
    }
    let records = report["records"].as_array().unwrap();
    assert_eq!(records.len(), 68);
    let verdict_of = |key: &str| {
        records
            .iter()
            .find(|r| r["idempotency_key"] == key)
            .map(|r| r["verdict"].clone())
    };
    assert_eq!(
        verdict_of("cli-held-1"),
        Some(serde_json::json!("would_look_up"))
    );
    assert_eq!(
        verdict_of("cli-unknown-1"),
        Some(serde_json::json!("would_look_up")),
        "a key in unresolved_charges is never charged blind: {report}"
    );
    assert_eq!(
        verdict_of("cli-new-1"),
        Some(serde_json::json!("would_charge"))
    );

    // Workers that always look up would look up before each of the three charges.
    let report = dry_run_json(&stack, &["--gateway-lookup", "always"]).await;
    assert_eq!(report["counts"]["would_charge"], 0, "{report}");
    assert_eq!(report["counts"]["would_look_up"], 5, "{report}");

    // --limit examines that many records, and says how many the range holds.
    let report = dry_run_json(&stack, &["--limit", "10", "--list"]).await;
    assert_eq!(report["records_in_range"], 68, "{report}");
    assert_eq!(report["examined"], 10);
    assert_eq!(report["records"].as_array().unwrap().len(), 10);
    let counted: u64 = report["counts"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(counted, 10);

    // The text report lists every verdict, zeros included, and the limit.
    let output = pw(
        &stack,
        &["replay", "--to-beginning", "--dry-run", "--limit", "10"],
    )
    .await;
    let text = String::from_utf8_lossy(&output.stdout);
    for verdict in payment_worker::operator::VERDICTS {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{verdict} "))),
            "{verdict}: {text}"
        );
    }
    assert!(text.contains("examined 10 of 68 records"), "{text}");
    // Dry runs never reach the gateway: it holds the 60 charges of the two runs.
    assert_eq!(stack.ledger().len(), 60);

    // Under the workers' Stripe settings: a command whose amount Stripe cannot
    // express (KWD with a last digit) is invalid, and the dry run asks Stripe
    // nothing (no account, no look-up, no create, no confirm).
    let stripe = ScriptedStripe::start(&[("sk_test_dry_run_key", "acct_dry")]).await;
    let dir = std::env::temp_dir().join(crate::support::helpers::unique("pw_cli_kwd"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("commands.jsonl");
    std::fs::write(
        &file,
        format!("{}\n", line_of_currency("cli-kwd-1", 1235, "KWD")),
    )
    .unwrap();
    pw(&stack, &["produce", "--file", file.to_str().unwrap()]).await;
    let _ = std::fs::remove_dir_all(&dir);
    let stripe_url = stripe.url();
    let stripe_env = [
        ("GATEWAY_KIND", "stripe"),
        ("GATEWAY_URL", stripe_url.as_str()),
        ("GATEWAY_API_KEY", "sk_test_dry_run_key"),
    ];
    let args = ["replay", "--to-beginning", "--dry-run", "--json", "--list"];
    let report =
        |output: Output| -> serde_json::Value { serde_json::from_slice(&output.stdout).unwrap() };
    let with_stripe = report(pw_with(&stack, &args, &stripe_env).await);
    let with_charges = report(pw(&stack, &args).await);
    let verdict = |report: &serde_json::Value| {
        report["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["idempotency_key"] == "cli-kwd-1")
            .map(|r| (r["verdict"].clone(), r["detail"].clone()))
            .unwrap()
    };
    assert_eq!(verdict(&with_charges).0, "would_charge", "{with_charges}");
    let (stripe_verdict, detail) = verdict(&with_stripe);
    assert_eq!(stripe_verdict, "invalid", "{with_stripe}");
    assert!(
        detail
            .as_str()
            .unwrap()
            .starts_with("amount_not_representable:"),
        "{detail}"
    );
    assert_eq!(
        with_stripe["counts"]["would_charge"],
        with_charges["counts"]["would_charge"].as_u64().unwrap() - 1,
        "only that command is judged otherwise"
    );
    assert_eq!(stripe.requests(), 0, "the dry run sent Stripe nothing");

    // `dlq redrive` with nothing dead-lettered succeeds and says so.
    let output = pw(&stack, &["dlq", "redrive"]).await;
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "redrove 0 records\n"
    );
}

/// A topic longer than the dry run's window of 1,000 offsets per partition is read a
/// window at a time, every record once, and a key's second command is still
/// answered from its first when the two fall into different windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dry_run_reads_a_long_topic_window_by_window_and_remembers_across_windows() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    // 1,500 keys, each sent twice 1,500 records apart: every second copy is in
    // the next window, or the one after.
    const KEYS: usize = 1_500;
    let line = |i: usize| {
        serde_json::json!({"idempotency_key": format!("win-{i}"), "account_id": "acct_1",
            "amount_minor": 500, "currency": "EUR", "payment_method": "pm_card_visa"})
        .to_string()
    };
    let lines: Vec<String> = (0..2 * KEYS).map(|i| line(i % KEYS)).collect();
    let dir = std::env::temp_dir().join(crate::support::helpers::unique("pw_cli_window"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("commands.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    pw(&stack, &["produce", "--file", file.to_str().unwrap()]).await;
    let _ = std::fs::remove_dir_all(&dir);

    let report = dry_run_json(&stack, &["--list"]).await;
    assert_eq!(report["records_in_range"], 2 * KEYS, "{}", report["counts"]);
    assert_eq!(report["examined"], 2 * KEYS);
    assert_eq!(
        report["counts"]["would_charge"], KEYS,
        "{}",
        report["counts"]
    );
    assert_eq!(report["counts"]["duplicate"], KEYS, "{}", report["counts"]);
    let records = report["records"].as_array().unwrap();
    let offsets: Vec<i64> = records
        .iter()
        .map(|r| r["offset"].as_i64().unwrap())
        .collect();
    assert_eq!(
        offsets,
        (0..2 * KEYS as i64).collect::<Vec<_>>(),
        "every offset once, in order"
    );
    // The copy at offset 1,500 + i answers from offset i, across the windows.
    let second = &records[KEYS + 10];
    assert_eq!(second["idempotency_key"], "win-10");
    assert_eq!(second["verdict"], "duplicate");
    assert_eq!(second["detail"], "of offset 10, earlier in this replay");
}

/// A replay never moves a partition forward, so where the group has not read as far
/// as `--to-offset`, the dry run counts from the group's committed offset: those
/// commands are what the workers go on with.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dry_run_starts_where_the_group_is_when_it_has_not_read_as_far_as_the_target() {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{Offset, TopicPartitionList};

    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let generated = [
        "produce",
        "--count",
        "10",
        "--duplicate-ratio",
        "0",
        "--invalid-ratio",
        "0",
    ];
    pw(&stack, &generated).await;
    // Nothing committed yet: the workers would start at the beginning.
    let report = dry_run_json(&stack, &[]).await;
    assert_eq!(report["records_in_range"], 10, "{report}");

    // The group has answered the first 3 commands.
    let settings = stack.settings.clone();
    tokio::task::spawn_blocking(move || {
        let mut config = payment_worker::worker::base_config(&settings);
        config.set("group.id", &settings.group_id);
        let consumer: BaseConsumer = config.create().unwrap();
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&settings.commands_topic, 0, Offset::Offset(3))
            .unwrap();
        consumer.commit(&list, CommitMode::Sync).unwrap();
        drop(list);
        drop(consumer);
    })
    .await
    .unwrap();

    let mut args = vec!["replay", "--to-offset", "5", "--dry-run", "--json"];
    let behind =
        serde_json::from_slice::<serde_json::Value>(&pw(&stack, &args).await.stdout).unwrap();
    assert_eq!(
        behind["records_in_range"], 7,
        "from offset 3, not 5: {behind}"
    );
    args[2] = "2";
    let rewound =
        serde_json::from_slice::<serde_json::Value>(&pw(&stack, &args).await.stdout).unwrap();
    assert_eq!(rewound["records_in_range"], 8, "moved back to 2: {rewound}");
}
