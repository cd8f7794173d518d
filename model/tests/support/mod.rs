//! What the model checks assert of a report, shared by both test files.

use std::fmt::Debug;

use payment_worker_model::run::{Counterexample, Report};

/// Every safety property of `system` held; prints what was checked and any
/// counterexample's steps.
pub fn assert_no_counterexample(system: &dyn Debug, report: &Report) {
    println!(
        "{system:?}: {} unique states in {:.1} s",
        report.unique_states,
        report.elapsed.as_secs_f64()
    );
    for counterexample in &report.counterexamples {
        println!("{}: {:#?}", counterexample.property, counterexample.trace);
    }
    assert!(
        report.counterexamples.is_empty(),
        "counterexamples: {:?}",
        report
            .counterexamples
            .iter()
            .map(|c| c.property)
            .collect::<Vec<_>>()
    );
}

/// The counterexample to `property` that `system`'s check found, printed.
pub fn counterexample_to<'a>(
    system: &dyn Debug,
    report: &'a Report,
    property: &str,
) -> &'a Counterexample {
    let found = report
        .counterexamples
        .iter()
        .find(|c| c.property == property)
        .unwrap_or_else(|| {
            panic!(
                "{system:?}: no counterexample to {property:?} ({} states; found: {:?})",
                report.unique_states,
                report
                    .counterexamples
                    .iter()
                    .map(|c| c.property)
                    .collect::<Vec<_>>()
            )
        });
    println!(
        "counterexample to {property:?} in {} steps ({} states, {:.1} s):\n{}",
        found.trace.len(),
        report.unique_states,
        report.elapsed.as_secs_f64(),
        found.trace.join("\n")
    );
    found
}
