//! Every path that ends without a booked answer while a charge may exist says so:
//! a 5xx answered after the POST, a panic after the POST, a look-up answer that
//! does not match the command, an issued-mode token that expired while its holder
//! was killed mid-POST. Each is dead-lettered with `x-charge-unknown: true` and kept
//! in `unresolved_charges` (or booked once the charge shows), and any later attempt
//! for such a key (a redrive after its token expired included) looks the charge up
//! before it charges. The ledger is the simulator's; a second charge would show in
//! it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::gateway::{HttpGateway, LedgerEntry};
use payment_worker::operator::{self, RecordKind, WorkloadRecord};
use payment_worker::payment::unresolved_charges;
use payment_worker::retry::RetryPolicy;
use payment_worker::token::{TokenMode, TokenPolicy};
use payment_worker::worker;
use payment_worker_devtools::SimulatorConfig;
use rdkafka::message::{Message, OwnedMessage};

use crate::support::helpers::{quick_worker_settings, read_topic, stop_all, Stack};
use crate::support::procs::{binary, Proc};
use crate::support::scripted_gateway::{LookupAnswer, PostAnswer, ScriptedGateway};

use super::answers::ikey;

pub(super) fn header(message: &OwnedMessage, name: &str) -> Option<String> {
    message
        .headers()
        .and_then(|h| payment_worker::kafka_headers::last_value(h, name))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

pub(super) fn record(key: &str, amount_minor: i64) -> WorkloadRecord {
    let value = serde_json::json!({
        "idempotency_key": key, "account_id": "acct_9", "amount_minor": amount_minor,
        "currency": "USD", "payment_method": "pm_card_visa",
    });
    WorkloadRecord {
        kind: RecordKind::Valid,
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.to_string().into_bytes()),
        partition_hint: None,
    }
}

pub(super) fn short_budget(budget: Duration) -> RetryPolicy {
    RetryPolicy {
        min_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(300),
        budget,
    }
}

pub(super) fn charges_for(stack: &Stack, key: &str) -> Vec<LedgerEntry> {
    stack
        .ledger()
        .into_iter()
        .filter(|e| e.idempotency_key == key)
        .collect()
}

pub(super) fn letter_of<'a>(letters: &'a [OwnedMessage], key: &str) -> &'a OwnedMessage {
    letters
        .iter()
        .find(|m| m.key() == Some(key.as_bytes()))
        .unwrap_or_else(|| panic!("no dead letter for {key}"))
}

pub(super) async fn unresolved_keys(stack: &Stack) -> Vec<String> {
    unresolved_charges(&stack.db.pool, "")
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.idempotency_key)
        .collect()
}

/// A stack whose worker gateway is a scripted front over the simulator's ledger.
pub(super) async fn behind_a_front(
    simulator: SimulatorConfig,
    policy: TokenPolicy,
) -> (Stack, ScriptedGateway) {
    let mut stack = Stack::with_policy(1, simulator, policy).await;
    let front = ScriptedGateway::start(&stack.simulator).await;
    stack.gateway = Arc::new(
        HttpGateway::new(&front.url(), Duration::from_secs(2), Duration::from_secs(1)).unwrap(),
    );
    (stack, front)
}

// ---------------------------------------------------------------------------
// A 5xx after the POST is an unknown outcome.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_502_or_504_after_the_charge_with_look_ups_down_is_dead_lettered_with_the_charge_unknown()
{
    let (stack, front) = behind_a_front(
        SimulatorConfig::default(),
        TokenPolicy {
            lease: Duration::from_millis(500),
            ..TokenPolicy::default()
        },
    )
    .await;
    // Charged, then a proxy answers 502 / 504; look-ups are down until the budget ends.
    let (k502, k504) = ("u5-502", "u5-504");
    front.script(k502, &[PostAnswer::ChargeThen(502)]);
    front.script(k504, &[PostAnswer::ChargeThen(504)]);
    front.lookups_down(k502, true);
    front.lookups_down(k504, true);
    let running = stack.start_worker_retrying(
        "u5",
        &quick_worker_settings(),
        short_budget(Duration::from_secs(3)),
    );
    stack
        .produce(&[record(k502, 5020), record(k504, 5040)])
        .await;
    let results = stack.wait_for_results(2, Duration::from_secs(60)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![running]).await;

    assert!(
        results.iter().all(|r| r.outcome == "rejected"),
        "{results:?}"
    );
    let letters = stack.dead_letters().await;
    for key in [k502, k504] {
        let letter = letter_of(&letters, key);
        assert_eq!(
            header(letter, worker::ERROR_KIND).as_deref(),
            Some("retries_exhausted"),
            "{key}"
        );
        assert_eq!(
            header(letter, worker::CHARGE_UNKNOWN).as_deref(),
            Some("true"),
            "{key}: the gateway may have charged before the 5xx"
        );
        let charged = charges_for(&stack, key);
        assert_eq!(charged.len(), 1, "{key}: one charge");
        assert_eq!(charged[0].attempts, 1, "{key}: never POSTed blindly again");
        assert_eq!(front.posts_seen(key), 1, "{key}");
        assert!(
            front.lookups_seen(key) >= 1,
            "{key}: retried with a look-up first"
        );
    }
    assert_eq!(unresolved_keys(&stack).await, vec![k502, k504]);
}

// ---------------------------------------------------------------------------
// A key in `unresolved_charges` is looked up first, whatever the fence.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redrive_after_the_token_expired_looks_the_charge_up_and_never_charges_again() {
    // The gateway has forgotten its keys: every POST is a new charge, a look-up by
    // key still finds the charge (as a gateway that keeps keys for 24 h does a day later).
    let (stack, front) = behind_a_front(
        SimulatorConfig {
            ignore_idempotency_key: true,
            ..SimulatorConfig::default()
        },
        TokenPolicy {
            lease: Duration::from_millis(500),
            pending_ttl: Duration::from_secs(1),
            ..TokenPolicy::default()
        },
    )
    .await;
    let key = "u5-redrive";
    front.script(key, &[PostAnswer::ChargeThen(504)]);
    front.lookups_down(key, true);
    let running = stack.start_worker_retrying(
        "u5-first",
        &quick_worker_settings(),
        short_budget(Duration::from_secs(2)),
    );
    stack.produce(&[record(key, 7777)]).await;
    let results = stack.wait_for_results(1, Duration::from_secs(60)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![running]).await;
    assert_eq!(results[0].outcome, "rejected", "{results:?}");
    assert_eq!(charges_for(&stack, key).len(), 1);

    // The token's life ends (the key is gone from Redis): the next reservation is
    // a first one again, fence 1.
    let token = ikey(key);
    let deadline = Instant::now() + Duration::from_secs(20);
    while stack.tokens.show(&token).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the token never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    front.lookups_down(key, false);
    // The client resubmits the command as it was (no flag: only `unresolved_charges`
    // remembers the charge), then the operator redrives the dead letter (flagged).
    stack.produce(&[record(key, 7777)]).await;
    operator::redrive(operator::RedriveArgs {
        kafka: stack.settings.clone(),
        kind: None,
        max: None,
    })
    .await
    .unwrap();
    let commands = read_topic(
        &stack.settings,
        &stack.settings.commands_topic,
        "read_committed",
    )
    .await;
    assert_eq!(
        commands.len(),
        3,
        "the resubmission, and the dead letter is back"
    );
    assert_eq!(header(&commands[1], worker::CHARGE_UNKNOWN), None);
    assert_eq!(
        header(&commands[2], worker::CHARGE_UNKNOWN).as_deref(),
        Some("true"),
        "a redrive keeps the flag"
    );
    assert_eq!(header(&commands[2], worker::ERROR_KIND), None);

    let running = stack.start_worker_retrying(
        "u5-second",
        &quick_worker_settings(),
        short_budget(Duration::from_secs(20)),
    );
    let results = stack.wait_for_results(3, Duration::from_secs(60)).await;
    stop_all(vec![running]).await;
    let charged = charges_for(&stack, key);
    assert_eq!(
        charged.len(),
        1,
        "neither the resubmission nor the redrive may charge a second time: {charged:?}"
    );
    let answer_to = |offset: i64| {
        results
            .iter()
            .find(|r| r.source.offset == offset)
            .unwrap_or_else(|| panic!("no result for offset {offset}: {results:?}"))
    };
    // The resubmission, a first reservation of a key nobody flagged, is looked up
    // because `unresolved_charges` holds the key.
    assert_eq!(answer_to(1).outcome, "succeeded", "{results:?}");
    assert_eq!(
        answer_to(1).gateway_transaction_id.as_deref(),
        Some(charged[0].transaction_id.as_str()),
        "booked from the look-up"
    );
    // The redrive finds it booked and answers the original.
    assert_eq!(answer_to(2).outcome, "duplicate", "{results:?}");
    assert_eq!(
        answer_to(2)
            .original
            .as_ref()
            .and_then(|o| o.gateway_transaction_id.as_deref()),
        Some(charged[0].transaction_id.as_str()),
        "{results:?}"
    );
    assert_eq!(front.posts_seen(key), 1);
    assert!(
        unresolved_keys(&stack).await.is_empty(),
        "booked: off the list"
    );
}

// ---------------------------------------------------------------------------
// Look-up answers are checked.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_look_up_answering_another_amount_or_another_key_is_never_booked_and_flagged() {
    let (stack, front) = behind_a_front(
        SimulatorConfig::default(),
        TokenPolicy {
            lease: Duration::from_millis(500),
            ..TokenPolicy::default()
        },
    )
    .await;
    // Each charge's answer is unreadable, so the worker looks it up, and the
    // look-up answers with a charge that is not this command's.
    let cases = [
        ("u5-amount", LookupAnswer::Amount(1)),
        ("u5-currency", LookupAnswer::Currency("EUR")),
        ("u5-key", LookupAnswer::Key("u5-someone-else")),
    ];
    for (key, answer) in &cases {
        front.script(key, &[PostAnswer::ChargeThenGarbledBody]);
        front.lookups_altered(key, answer.clone());
    }
    let running = stack.start_worker_retrying(
        "u5-check",
        &quick_worker_settings(),
        short_budget(Duration::from_secs(20)),
    );
    stack
        .produce(
            &cases
                .iter()
                .map(|(key, _)| record(key, 3300))
                .collect::<Vec<_>>(),
        )
        .await;
    let results = stack.wait_for_results(3, Duration::from_secs(60)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    stop_all(vec![running]).await;

    let letters = stack.dead_letters().await;
    for (key, _) in &cases {
        let result = results
            .iter()
            .find(|r| r.idempotency_key.as_deref() == Some(*key))
            .unwrap();
        assert_eq!(
            result.outcome, "rejected",
            "{key}: never booked: {result:?}"
        );
        let letter = letter_of(&letters, key);
        assert_eq!(
            header(letter, worker::ERROR_KIND).as_deref(),
            Some("internal"),
            "{key}: not key_reused, not booked"
        );
        assert!(
            header(letter, worker::ERROR_REASON)
                .unwrap_or_default()
                .starts_with("gateway_charge_mismatch"),
            "{key}: {:?}",
            header(letter, worker::ERROR_REASON)
        );
        assert_eq!(
            header(letter, worker::CHARGE_UNKNOWN).as_deref(),
            Some("true"),
            "{key}"
        );
        assert_eq!(charges_for(&stack, key).len(), 1, "{key}");
        assert_eq!(front.posts_seen(key), 1, "{key}");
    }
    assert!(stack.payment_rows().await.is_empty(), "nothing booked");
    assert_eq!(
        unresolved_keys(&stack).await,
        vec!["u5-amount", "u5-currency", "u5-key"]
    );
    // What an operator reads in `unresolved_charges` is why it was given up on, the
    // dead letter's reason, not a generic "charged and not booked".
    for unresolved in unresolved_charges(&stack.db.pool, "u5-").await.unwrap() {
        let letter = letter_of(&letters, &unresolved.idempotency_key);
        assert_eq!(
            Some(unresolved.reason),
            header(letter, worker::ERROR_REASON),
            "{}",
            unresolved.idempotency_key
        );
    }
}

// ---------------------------------------------------------------------------
// A panic after the POST.

/// A `payment-worker run` of this stack (its gateway: `gateway_url`), once it owns
/// the partition.
pub(super) async fn start_run(
    stack: &Stack,
    name: &str,
    gateway_url: &str,
    extra: &[(&str, &str)],
) -> Proc {
    let mut env = stack.run_env();
    env.insert("GATEWAY_URL".into(), gateway_url.to_owned());
    for (k, v) in extra {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    let mut proc = Proc::spawn(name, binary(&["run"], &env));
    proc.wait_for(Duration::from_secs(60), |l| {
        (l.contains("assigned") && !l.contains("\"partitions\":0")).then_some(())
    })
    .await;
    proc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_that_panics_after_its_post_is_dead_lettered_with_the_charge_unknown() {
    let stack = Stack::new(1, SimulatorConfig::default()).await;
    let key = "u5-panic";
    let url = stack.simulator.url();
    let mut run = start_run(
        &stack,
        "u5-panic-run",
        &url,
        &[
            ("PAYMENT_WORKER_FAULT", "panic:after_charge"),
            ("PAYMENT_WORKER_FAULT_KEY", key),
            ("LEASE", "1s"),
        ],
    )
    .await;
    stack
        .produce(&[record(key, 4400), record("u5-after", 4500)])
        .await;
    let results = stack.wait_for_results(2, Duration::from_secs(90)).await;
    stack.wait_for_commits(Duration::from_secs(30)).await;
    run.assert_running();
    run.stop(Duration::from_secs(20)).await;

    let panicked = results
        .iter()
        .find(|r| r.idempotency_key.as_deref() == Some(key))
        .unwrap();
    assert_eq!(panicked.outcome, "rejected", "{panicked:?}");
    let letters = stack.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        header(&letters[0], worker::ERROR_KIND).as_deref(),
        Some("internal")
    );
    assert_eq!(
        header(&letters[0], worker::CHARGE_UNKNOWN).as_deref(),
        Some("true"),
        "the POST was sent before the panic: {}",
        run.tail(30)
    );
    assert_eq!(charges_for(&stack, key).len(), 1, "charged once");
    assert_eq!(unresolved_keys(&stack).await, vec![key]);
}

// ---------------------------------------------------------------------------
// Issued mode: a token that expires while its holder is killed mid-POST.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_issued_token_that_expires_while_its_holder_was_killed_mid_post_is_not_answered_missing()
{
    let policy = TokenPolicy {
        mode: TokenMode::Issued,
        lease: Duration::from_secs(1),
        ..TokenPolicy::default()
    };
    let (stack, front) = behind_a_front(SimulatorConfig::default(), policy).await;
    let key = "u5-issued";
    // The gateway answers nothing and books the charge 10 s after the POST arrived.
    front.script(key, &[PostAnswer::ChargeLate(Duration::from_secs(10))]);
    let mut holder = start_run(
        &stack,
        "u5-holder",
        &front.url(),
        &[
            ("TOKEN_MODE", "issued"),
            ("LEASE", "1s"),
            ("GATEWAY_TIMEOUT", "60s"),
        ],
    )
    .await;
    let token_ttl = Duration::from_secs(3);
    let issued_at = Instant::now();
    stack.tokens.issue(&ikey(key), token_ttl).await.unwrap();
    stack.produce(&[record(key, 6100)]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while front.posts_seen(key) == 0 {
        assert!(Instant::now() < deadline, "no POST: {}", holder.tail(30));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.sigkill();
    let posted_at = Instant::now();
    assert!(
        posted_at < issued_at + token_ttl,
        "the POST came after the token's deadline: the scenario did not happen"
    );
    // The token's deadline and the dead holder's lease both pass before anyone
    // else looks at the command.
    tokio::time::sleep(
        (issued_at + token_ttl + Duration::from_millis(1500))
            .saturating_duration_since(Instant::now()),
    )
    .await;
    assert!(charges_for(&stack, key).is_empty(), "not landed yet");

    let running = stack.start_worker_retrying(
        "u5-next",
        &quick_worker_settings(),
        short_budget(Duration::from_secs(60)),
    );
    let results = stack.wait_for_results(1, Duration::from_secs(90)).await;
    stop_all(vec![running]).await;
    let charged = charges_for(&stack, key);
    assert_eq!(charged.len(), 1, "one charge");
    let result = &results[0];
    assert_ne!(
        result
            .reason
            .as_deref()
            .map(|r| r.starts_with("token_missing")),
        Some(true),
        "a killed holder's charge may still land: {result:?}"
    );
    assert_eq!(
        result.outcome, "succeeded",
        "booked once it landed: {result:?}"
    );
    assert_eq!(
        result.gateway_transaction_id.as_deref(),
        Some(charged[0].transaction_id.as_str())
    );
    assert!(
        posted_at.elapsed() >= Duration::from_secs(9),
        "answered only after the charge landed"
    );
    assert_eq!(front.posts_seen(key), 1, "never POSTed again");
}
