//! A failure after each step of the processor, then the command again: in process
//! (an injected error) and as a real process SIGKILLed frozen at the fault point.

use payment_worker::fault::{FaultPoint, Faults};
use payment_worker::payment::{Attempt, CommandContext, Outcome};
use payment_worker::token::TokenState;
use payment_worker_devtools::SimulatorConfig;

use crate::support::helpers::assert_duplicate_of;

use super::rig::*;

const POINTS: [FaultPoint; 4] = [
    FaultPoint::AfterReserve,
    FaultPoint::AfterInsert,
    FaultPoint::AfterCharge,
    FaultPoint::AfterCommit,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_each_step_then_a_retry_charges_once() {
    let rig = Rig::new(SimulatorConfig::default(), short_lease()).await;
    for point in POINTS {
        let key = format!("fail-{}", point.as_str().replace('_', "-"));
        let cmd = command(&key, 1200, "pm_card_visa");
        let failing = rig.processor("crashy").with_faults(Faults::fail_at(point));
        let first = failing.process(&cmd, &CommandContext::default()).await;
        match point {
            // The payment committed before the failure: its outcome stands.
            FaultPoint::AfterCommit => {
                assert!(
                    matches!(first, Attempt::Final(Outcome::Succeeded { .. })),
                    "{first:?}"
                )
            }
            _ => assert!(
                matches!(first, Attempt::Retry { .. }),
                "{point:?}: {first:?}"
            ),
        }
        let (second, _) = until_final(&rig.processor("healthy"), &cmd).await;
        let payment_id = rig.assert_charged_once(&key).await;
        match point {
            FaultPoint::AfterCommit => assert_duplicate_of(&second, payment_id),
            _ => assert!(
                matches!(second, Outcome::Succeeded { payment_id: p, .. } if p == payment_id),
                "{second:?}"
            ),
        }
        if point == FaultPoint::AfterCharge {
            // The charge was found by look-up (fence 2), not repeated.
            assert_eq!(
                rig.rows(&key).await[0].3,
                2,
                "recorded under the second reservation"
            );
        }
    }
    assert_eq!(
        rig.gateway.charges(),
        POINTS.len(),
        "one POST per key: none repeats a charge made before the failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_each_step_then_a_restart_charges_once() {
    let rig = Rig::new(SimulatorConfig::default(), short_lease()).await;
    for point in POINTS {
        let key = format!("kill-{}", point.as_str().replace('_', "-"));
        let json = command_json(&key, 3300);
        let child = start_frozen(&rig, &json, point, "uncertain").await;

        // The state each point claims to leave, seen while the process is frozen.
        let token = rig.token(&key).await.expect("token reserved");
        assert_eq!(token.state, TokenState::Processing, "{point:?}");
        let ledger = rig.ledger_for(&key);
        let rows = rig.rows(&key).await;
        match point {
            FaultPoint::AfterReserve | FaultPoint::AfterInsert => {
                assert!(
                    ledger.is_empty() && rows.is_empty(),
                    "{point:?}: {ledger:?} {rows:?}"
                )
            }
            FaultPoint::AfterCharge => {
                assert!(ledger.len() == 1 && rows.is_empty(), "{ledger:?} {rows:?}")
            }
            FaultPoint::AfterCommit => {
                assert!(ledger.len() == 1 && rows.len() == 1, "{ledger:?} {rows:?}")
            }
            FaultPoint::AfterAnswer => unreachable!("a point of the worker, not of `process`"),
            FaultPoint::AfterCreate => unreachable!("a point of the Stripe gateway"),
        }
        sigkill(child).await;

        let view = process_with_binary(&rig, &json, "uncertain").await;
        let payment_id = rig.assert_charged_once(&key).await;
        let expected = if point == FaultPoint::AfterCommit {
            "duplicate"
        } else {
            "succeeded"
        };
        assert_eq!(view["outcome"], expected, "{point:?}: {view}");
        assert_eq!(view["payment_id"], payment_id.to_string());
    }
}
