//! Refunds through the processor (real Postgres, Redis tokens, the gateway simulator
//! over HTTP): partial refunds add up and never pass the charge, a refund's key
//! refunds once, a refund waits for its charge, a declined payment or another
//! currency is refused, an unknown outcome is looked up, and refunds racing under
//! different keys for one payment (several workers, Redis flushed) never refund
//! more than was charged.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use payment_worker::fault::{FaultPoint, Faults};
use payment_worker::gateway::{ChargeStatus, PaymentGateway, RefundEntry, RefundRequest};
use payment_worker::payment::{
    refunded_of, Attempt, CommandContext, Outcome, Processor, RefundCommand, RejectionKind,
    WAITING_FOR_PAYMENT,
};
use payment_worker::token::{IdempotencyKey, TokenPolicy, TokenState};
use payment_worker_devtools::SimulatorConfig;

use super::rig::*;
use crate::support::helpers::NoLease;

fn refund(key: &str, payment_key: &str, amount_minor: i64) -> RefundCommand {
    RefundCommand::new(key, payment_key, amount_minor, "USD", Some("returned")).unwrap()
}

/// Refund attempts until one is final, as the handler's retry loop would.
async fn refund_until_final(processor: &Processor, command: &RefundCommand) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match processor
            .process_refund(command, &CommandContext::default())
            .await
        {
            Attempt::Retry { reason, .. } => {
                assert!(Instant::now() < deadline, "still retrying: {reason}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Attempt::Final(outcome) | Attempt::Unbooked(outcome) => return outcome,
        }
    }
}

async fn charged(rig: &Rig, key: &str, amount_minor: i64) {
    let outcome = rig
        .processor("charger")
        .process(
            &command(key, amount_minor, "pm_card_visa"),
            &CommandContext::default(),
        )
        .await;
    assert!(
        matches!(outcome, Attempt::Final(Outcome::Succeeded { .. })),
        "{outcome:?}"
    );
}

async fn gateway_refunds(rig: &Rig, payment_key: &str) -> Vec<RefundEntry> {
    let charge = rig.ledger_for(payment_key);
    let all = rig.simulator.refunds();
    all.into_iter()
        .filter(|r| {
            charge
                .iter()
                .any(|c| c.transaction_id == r.payment_transaction_id)
        })
        .collect()
}

fn refunded_total(entries: &[RefundEntry]) -> i64 {
    entries
        .iter()
        .filter(|r| r.status == ChargeStatus::Approved)
        .map(|r| r.amount_minor)
        .sum()
}

fn is_key_reused(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Rejected {
            kind: RejectionKind::KeyReused,
            ..
        }
    )
}

fn rejected_with(outcome: &Outcome, code: &str) -> bool {
    matches!(outcome, Outcome::Rejected { kind: RejectionKind::Invalid, reason } if reason.starts_with(code))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_refunds_add_up_and_never_pass_the_charge() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    charged(&rig, "pay-1", 1000).await;
    let p = rig.processor("p");

    let first = refund_until_final(&p, &refund("rf-1a", "pay-1", 600)).await;
    let Outcome::Refunded { refund_id, .. } = first else {
        panic!("{first:?}")
    };
    let too_much = refund_until_final(&p, &refund("rf-1b", "pay-1", 500)).await;
    assert!(
        rejected_with(&too_much, "refund_exceeds_charge"),
        "{too_much:?}"
    );
    // Delivered again (a replay, another worker: a stranger restored its token), it
    // is refused again, and as a refusal that risked nothing: the refund row, not
    // the token's history, tells whether a refund may exist.
    let again = rig
        .processor("replay")
        .process_refund(&refund("rf-1b", "pay-1", 500), &CommandContext::default())
        .await;
    assert!(
        matches!(&again, Attempt::Final(outcome) if rejected_with(outcome, "refund_exceeds_charge")),
        "{again:?}"
    );
    let rest = refund_until_final(&p, &refund("rf-1c", "pay-1", 400)).await;
    assert!(matches!(rest, Outcome::Refunded { .. }), "{rest:?}");
    // A full refund closes the payment: not one minor unit more.
    let after_full = refund_until_final(&p, &refund("rf-1d", "pay-1", 1)).await;
    assert!(
        rejected_with(&after_full, "refund_exceeds_charge"),
        "{after_full:?}"
    );

    let at_gateway = gateway_refunds(&rig, "pay-1").await;
    assert_eq!(refunded_total(&at_gateway), 1000, "{at_gateway:?}");
    assert_eq!(at_gateway.len(), 2, "the refused refunds were never sent");
    assert_eq!(refunded_of(&rig.db.pool, "pay-1").await.unwrap(), (1000, 0));
    // The refused one reserved nothing; its refusal is kept, its token completed.
    let token = rig.token("rf-1b").await.unwrap();
    assert_eq!(token.state, TokenState::Completed);

    // The same refund again: its first answer, nothing sent.
    let posts = rig
        .gateway
        .refunds
        .load(std::sync::atomic::Ordering::SeqCst);
    let again = refund_until_final(&rig.processor("q"), &refund("rf-1a", "pay-1", 600)).await;
    let Outcome::Duplicate {
        original: Some(original),
        ..
    } = again
    else {
        panic!("{again:?}")
    };
    assert_eq!(original.outcome, "refunded");
    assert_eq!(original.refund_id, Some(refund_id));
    assert_eq!(
        rig.gateway
            .refunds
            .load(std::sync::atomic::Ordering::SeqCst),
        posts
    );
    let token = rig.token("rf-1a").await.unwrap();
    assert_eq!(
        (token.state, token.payment_id),
        (TokenState::Completed, Some(refund_id))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_before_its_charge_waits_then_goes_through() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let p = rig.processor("p");
    let early = refund("rf-early", "pay-late", 300);
    let waiting = p.process_refund(&early, &CommandContext::default()).await;
    let Attempt::Retry { reason, .. } = &waiting else {
        panic!("{waiting:?}")
    };
    assert_eq!(reason, WAITING_FOR_PAYMENT);
    assert!(rig.simulator.refunds().is_empty());
    assert_eq!(
        rig.token("rf-early").await.unwrap().state,
        TokenState::Pending
    );

    charged(&rig, "pay-late", 1000).await;
    let outcome = refund_until_final(&p, &early).await;
    assert!(matches!(outcome, Outcome::Refunded { .. }), "{outcome:?}");
    assert_eq!(
        refunded_total(&gateway_refunds(&rig, "pay-late").await),
        300
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_payment_another_currency_or_a_reused_key_is_refused() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    let p = rig.processor("p");
    let declined = p
        .process(
            &command("pay-d", 1000, "pm_card_declined"),
            &CommandContext::default(),
        )
        .await;
    assert!(
        matches!(declined, Attempt::Final(Outcome::Declined { .. })),
        "{declined:?}"
    );
    let outcome = refund_until_final(&p, &refund("rf-d", "pay-d", 100)).await;
    assert!(
        rejected_with(&outcome, "payment_not_charged"),
        "{outcome:?}"
    );

    charged(&rig, "pay-c", 1000).await;
    let euros = RefundCommand::new("rf-c", "pay-c", 100, "EUR", None).unwrap();
    let outcome = refund_until_final(&p, &euros).await;
    assert!(rejected_with(&outcome, "currency_mismatch"), "{outcome:?}");

    // A refund under a charge's key, and a refund key reused for another amount.
    let outcome = refund_until_final(&p, &refund("pay-d", "pay-c", 100)).await;
    assert!(is_key_reused(&outcome), "{outcome:?}");
    let first = refund_until_final(&p, &refund("rf-k", "pay-c", 100)).await;
    assert!(matches!(first, Outcome::Refunded { .. }), "{first:?}");
    let other = refund_until_final(&p, &refund("rf-k", "pay-c", 200)).await;
    assert!(is_key_reused(&other), "{other:?}");
    assert_eq!(refunded_total(&gateway_refunds(&rig, "pay-c").await), 100);
    assert!(gateway_refunds(&rig, "pay-d").await.is_empty());
}

/// `key` remembered in `unresolved_charges` as the worker remembers a `kind` it gave
/// up on with its outcome unknown (the gateway timed out).
async fn remember_unknown(rig: &Rig, key: &str, amount_minor: i64, kind: &str) {
    sqlx::query(
        "INSERT INTO unresolved_charges (idempotency_key, amount_minor, currency, reason, attempts, kind)
         VALUES ($1, $2, 'USD', 'gateway timed out', 3, $3)",
    )
    .bind(key)
    .bind(amount_minor)
    .bind(kind)
    .execute(&rig.db.pool)
    .await
    .unwrap();
}

/// A charge and a refund never share a key once the token that serialised them is
/// gone (while it lives, a charge and a refund under one key reserve the same token,
/// so they never run at once): once the refund's token is gone (Redis lost it, or its completed record expired), a charge
/// under its key is refused by the refund's row, not charged (even when the refund
/// was once given up on with its outcome unknown); and a refund under the
/// key of a charge whose outcome is unknown (no row yet, remembered in
/// `unresolved_charges`) is refused before that charge can be booked under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_and_a_refund_never_share_a_key_once_the_token_is_gone() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    charged(&rig, "pay-s", 1000).await;
    let p = rig.processor("p");
    let first = refund_until_final(&p, &refund("rf-s", "pay-s", 100)).await;
    assert!(matches!(first, Outcome::Refunded { .. }), "{first:?}");
    // An earlier delivery of the refund was given up on with its outcome unknown
    // (its gateway timed out): remembered as a refund's, which asks no look-up of
    // a charge under its key.
    remember_unknown(&rig, "rf-s", 100, "refund").await;
    rig.forget_token("rf-s").await;

    let (outcome, _) = until_final(&p, &command("rf-s", 500, "pm_card_visa")).await;
    assert!(is_key_reused(&outcome), "{outcome:?}");
    assert!(
        rig.ledger_for("rf-s").is_empty(),
        "nothing charged under a refund's key"
    );
    assert!(rig.rows("rf-s").await.is_empty(), "no payment row under it");

    // The charge `pay-u` ended unknown: rolled back, remembered, not booked yet.
    remember_unknown(&rig, "pay-u", 700, "charge").await;
    let outcome = refund_until_final(&p, &refund("pay-u", "pay-s", 100)).await;
    assert!(is_key_reused(&outcome), "{outcome:?}");
    assert_eq!(refunded_total(&gateway_refunds(&rig, "pay-s").await), 100);
}

/// A refund whose retries ran out waiting for its payment keeps its refusal only
/// where the key has no row: another delivery that refunded it meanwhile (the
/// payment booked just after this one's last attempt) answers instead of "no
/// payment"; where nothing was written the refusal is kept and answers later
/// deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_for_want_of_a_payment_yields_to_a_refund_made_meanwhile() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    charged(&rig, "pay-m", 1000).await;
    let p = rig.processor("p");
    let made = refund("rf-m", "pay-m", 100);
    let first = refund_until_final(&p, &made).await;
    assert!(matches!(first, Outcome::Refunded { .. }), "{first:?}");
    let answer = p.keep_refund_refusal(&made, WAITING_FOR_PAYMENT).await;
    let Some(Outcome::Duplicate {
        original: Some(original),
        ..
    }) = answer
    else {
        panic!("{answer:?}")
    };
    assert_eq!(original.outcome, "refunded");

    let never = refund("rf-n", "pay-none", 100);
    let answer = p.keep_refund_refusal(&never, WAITING_FOR_PAYMENT).await;
    assert!(answer.is_none(), "{answer:?}");
    let again = refund_until_final(&p, &never).await;
    assert!(rejected_with(&again, "payment_unknown"), "{again:?}");
    assert_eq!(refunded_total(&gateway_refunds(&rig, "pay-m").await), 100);
}

/// A refund the gateway refuses for good (more than is left of the charge by the
/// gateway's books: a refund was made there directly) is kept on its row: a later
/// delivery is answered the same from the row and the gateway is not asked again
/// (Stripe, asked again under the same attempt key with a new row's id, answers an
/// idempotency error instead of its refusal). The refused amount is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_the_gateway_refuses_is_kept_and_answered_again_without_asking() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    charged(&rig, "pay-g", 1000).await;
    let outside = RefundRequest {
        payment_transaction_id: rig.ledger_for("pay-g")[0].transaction_id.clone(),
        amount_minor: 800,
        currency: "USD".into(),
        refund_id: None,
    };
    let outside_key = IdempotencyKey::try_from("rf-outside").unwrap();
    rig.gateway
        .inner
        .refund(&outside_key, &outside, &NoLease)
        .await
        .unwrap();
    let p = rig.processor("p");
    let made = refund("rf-g", "pay-g", 500);

    let first = refund_until_final(&p, &made).await;
    assert!(
        rejected_with(&first, "gateway_rejected: HTTP 400: amount_too_large"),
        "{first:?}"
    );
    let asked = rig.gateway.refunds.load(Ordering::SeqCst);
    let again = refund_until_final(&p, &made).await;
    assert_eq!(again, first, "the same answer");
    assert_eq!(
        rig.gateway.refunds.load(Ordering::SeqCst),
        asked,
        "not asked again"
    );
    assert_eq!(rig.simulator.refund_refusals().len(), 1);
    let (status, reason): (String, Option<String>) =
        sqlx::query_as("SELECT status, failure_reason FROM refunds WHERE idempotency_key = $1")
            .bind("rf-g")
            .fetch_one(&rig.db.pool)
            .await
            .unwrap();
    let Outcome::Rejected {
        reason: answered, ..
    } = &first
    else {
        unreachable!()
    };
    assert_eq!(
        (status.as_str(), reason.as_ref()),
        ("rejected", Some(answered))
    );
    assert_eq!(refunded_of(&rig.db.pool, "pay-g").await.unwrap(), (0, 0));
    let rest = refund_until_final(&p, &refund("rf-h", "pay-g", 200)).await;
    assert!(matches!(rest, Outcome::Refunded { .. }), "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_answer_comes_too_late_is_looked_up_not_sent_again() {
    // Every POST, the charge's too, is answered too late; each is looked up.
    let sim = SimulatorConfig {
        timeout_after_charge_rate: 1.0,
        late_by_ms: 2000,
        ..SimulatorConfig::default()
    };
    let rig = Rig::with_timeout(sim, TokenPolicy::default(), Duration::from_millis(300)).await;
    charged(&rig, "pay-t", 1000).await;
    let outcome = refund_until_final(&rig.processor("p"), &refund("rf-t", "pay-t", 250)).await;
    let Outcome::Refunded { transaction_id, .. } = outcome else {
        panic!("{outcome:?}")
    };
    let at_gateway = gateway_refunds(&rig, "pay-t").await;
    assert_eq!(at_gateway.len(), 1, "{at_gateway:?}");
    assert_eq!(at_gateway[0].transaction_id, transaction_id);
    assert_eq!(
        at_gateway[0].attempts, 1,
        "the unknown outcome was looked up, not re-sent"
    );
    assert!(rig.gateway.lookups() >= 1);
    assert_eq!(refunded_of(&rig.db.pool, "pay-t").await.unwrap(), (250, 0));
}

/// Many refunds under different keys for one payment, from several workers at once,
/// twice over with Redis losing every token in between (each key delivered again):
/// never more refunded than charged, each key refunded at most once, the books and
/// the gateway agree, and the gateway never saw an over-refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_refunds_under_different_keys_never_refund_more_than_was_charged() {
    let sim = SimulatorConfig {
        ignore_idempotency_key: true,
        latency_ms: 30,
        ..SimulatorConfig::default()
    };
    let rig = Rig::new(sim, short_lease()).await;
    charged(&rig, "pay-r", 1000).await;
    let processors: Vec<Arc<Processor>> = (0..4)
        .map(|i| Arc::new(rig.processor(&format!("w{i}"))))
        .collect();
    let keys: Vec<String> = (0..12).map(|i| format!("rf-r{i}")).collect();
    for round in 0..2 {
        // Redis loses the tokens while the first round runs: two workers can
        // then hold one key's token at once, and only Postgres keeps them apart.
        let flusher = (round == 0).then(|| {
            let mut conn = rig.redis.conn.clone();
            let token_keys: Vec<String> =
                keys.iter().map(|k| rig.store.token_key(&ikey(k))).collect();
            tokio::spawn(async move {
                // A few losses, not a Redis that never keeps anything (every lease
                // check would fail, and no attempt could ever finish).
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    let _: Result<i64, _> = redis::cmd("DEL")
                        .arg(&token_keys)
                        .query_async(&mut conn)
                        .await;
                }
            })
        });
        let mut tasks = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            // Each key delivered to two workers at once.
            for copy in 0..2 {
                let processor = Arc::clone(&processors[(i + copy + round) % processors.len()]);
                let command = refund(key, "pay-r", 150);
                tasks.push(tokio::spawn(async move {
                    refund_until_final(&processor, &command).await
                }));
            }
        }
        for task in tasks {
            let outcome = task.await.unwrap();
            assert!(
                matches!(
                    outcome,
                    Outcome::Refunded { .. } | Outcome::Duplicate { .. } | Outcome::Rejected { .. }
                ),
                "{outcome:?}"
            );
            if let Outcome::Rejected { reason, .. } = &outcome {
                assert!(reason.starts_with("refund_exceeds_charge"), "{reason}");
            }
        }
        if let Some(flusher) = flusher {
            flusher.abort();
        }
        // Redis loses every token: each key is decided again from Postgres.
        for key in &keys {
            if rig.token(key).await.is_some() {
                rig.forget_token(key).await;
            }
        }
    }
    let at_gateway = gateway_refunds(&rig, "pay-r").await;
    let total = refunded_total(&at_gateway);
    assert!(total <= 1000, "refunded {total} of 1000: {at_gateway:?}");
    assert_eq!(
        total, 900,
        "six refunds of 150 fit in 1000, and all six went through"
    );
    for key in &keys {
        let entries = at_gateway
            .iter()
            .filter(|r| &r.idempotency_key == key)
            .count();
        assert!(entries <= 1, "{key} refunded {entries} times");
    }
    assert_eq!(
        refunded_of(&rig.db.pool, "pay-r").await.unwrap(),
        (total, 0)
    );
    assert!(
        rig.simulator.refund_refusals().is_empty(),
        "an over-refund was sent"
    );
}

/// Redis lost the refund's token while its holder is between locking its row and
/// asking the gateway: a second holder of the key (a fresh token, fence 1) finds the
/// row locked and waits; it never asks the gateway meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_holder_of_a_refund_key_never_asks_the_gateway_while_the_first_does() {
    let sim = SimulatorConfig {
        ignore_idempotency_key: true,
        ..SimulatorConfig::default()
    };
    let rig = Rig::new(sim, TokenPolicy::default()).await;
    charged(&rig, "pay-h", 1000).await;
    let command = refund("rf-h", "pay-h", 400);
    let (held, pause) = Faults::pause_at(FaultPoint::AfterInsert);
    let first = {
        let (processor, command) = (rig.processor("a").with_faults(held), command.clone());
        tokio::spawn(async move {
            processor
                .process_refund(&command, &CommandContext::default())
                .await
        })
    };
    tokio::time::timeout(Duration::from_secs(20), pause.arrival())
        .await
        .expect("the first holder reached its row lock");
    rig.forget_token("rf-h").await;

    let second = rig
        .processor("b")
        .process_refund(&command, &CommandContext::default())
        .await;
    let Attempt::Retry { reason, .. } = &second else {
        panic!("{second:?}")
    };
    assert_eq!(
        reason,
        "another holder is asking the gateway for this refund"
    );
    assert_eq!(
        rig.gateway
            .refunds
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );

    pause.release();
    let first = first.await.unwrap();
    assert!(
        matches!(first, Attempt::Final(Outcome::Refunded { .. })),
        "{first:?}"
    );
    let again = refund_until_final(&rig.processor("b"), &command).await;
    assert!(matches!(again, Outcome::Duplicate { .. }), "{again:?}");
    let at_gateway = gateway_refunds(&rig, "pay-h").await;
    assert_eq!(at_gateway.len(), 1, "{at_gateway:?}");
}

/// The same refund path over the Postgres token store, which completes the token
/// inside the refund's recording transaction (one atomic step with the answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_over_the_postgres_token_store_complete_their_token_with_the_answer() {
    let rig = Rig::new(SimulatorConfig::default(), TokenPolicy::default()).await;
    charged(&rig, "pay-pg", 1000).await;
    let token_pool =
        payment_worker::startup::connect(&payment_worker::configuration::DatabaseSettings {
            max_connections: 4,
            ..payment_worker::configuration::DatabaseSettings::with_url(&rig.db.url)
        })
        .await
        .unwrap();
    let tokens: Arc<dyn payment_worker::token::TokenStore> = Arc::new(
        payment_worker::token::PostgresTokenStore::new(token_pool, TokenPolicy::default()),
    );
    let p = rig.processor_with(
        Arc::clone(&tokens),
        payment_worker::payment::GatewayLookup::Uncertain,
        "pg",
    );
    let first = refund_until_final(&p, &refund("rf-pg-a", "pay-pg", 700)).await;
    let Outcome::Refunded { refund_id, .. } = first else {
        panic!("{first:?}")
    };
    let token = tokens.show(&ikey("rf-pg-a")).await.unwrap().unwrap();
    assert_eq!(
        (token.state, token.payment_id),
        (TokenState::Completed, Some(refund_id))
    );
    let too_much = refund_until_final(&p, &refund("rf-pg-b", "pay-pg", 400)).await;
    assert!(
        rejected_with(&too_much, "refund_exceeds_charge"),
        "{too_much:?}"
    );
    let again = refund_until_final(&p, &refund("rf-pg-a", "pay-pg", 700)).await;
    assert!(matches!(again, Outcome::Duplicate { .. }), "{again:?}");
    assert_eq!(refunded_total(&gateway_refunds(&rig, "pay-pg").await), 700);
    assert_eq!(refunded_of(&rig.db.pool, "pay-pg").await.unwrap(), (700, 0));
}
