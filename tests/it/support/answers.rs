//! What a reader of the results topic must get when every command is answered once:
//! exactly one answer per command position, for exactly the commands' positions.

use std::collections::BTreeMap;

use payment_worker::worker::ResultRecord;

use super::books::Position;

/// Asserts that `results` answer `commands` command positions, each exactly once (a
/// position answered more than once is listed with all its answers, a missing one
/// with the positions that were answered); returns each position's one answer, in
/// position order.
#[track_caller]
pub(crate) fn assert_one_answer_per_command(
    results: &[ResultRecord],
    commands: usize,
) -> BTreeMap<Position, &ResultRecord> {
    let mut answers: BTreeMap<Position, Vec<&ResultRecord>> = BTreeMap::new();
    for r in results {
        answers
            .entry((r.source.partition, r.source.offset))
            .or_default()
            .push(r);
    }
    let repeated: Vec<_> = answers.iter().filter(|(_, a)| a.len() != 1).collect();
    assert!(
        repeated.is_empty(),
        "one answer per command: {} results for {commands} commands; positions without exactly one answer: {repeated:?}",
        results.len()
    );
    assert_eq!(
        answers.len(),
        commands,
        "every command answered: the positions answered are {:?}",
        answers.keys().collect::<Vec<_>>()
    );
    answers
        .into_iter()
        .map(|(position, mut answers)| (position, answers.remove(0)))
        .collect()
}

/// [`assert_one_answer_per_command`] for the commands at offsets `0..commands` of one
/// partition: exactly those offsets are answered, once each. Returns the answers in
/// offset order.
#[track_caller]
pub(crate) fn assert_one_answer_per_offset(
    results: &[ResultRecord],
    commands: usize,
) -> Vec<&ResultRecord> {
    let answers = assert_one_answer_per_command(results, commands);
    let offsets: Vec<i64> = answers.keys().map(|(_, offset)| *offset).collect();
    let expected: Vec<i64> = (0..commands as i64).collect();
    assert_eq!(
        offsets, expected,
        "one answer per command, at offsets 0..{commands}"
    );
    answers.into_values().collect()
}
