//! Who else a consumer group holds, as the broker describes it (DescribeGroups), and
//! what `replay` tells the operator when the group does not hand it every partition.
//!
//! The protocol gives no way to tell a member that still heartbeats from one that
//! stopped without leaving (SIGKILL, a crash, a lost host): the broker lists both
//! until the second one's session timeout passed. So the refusal names the members
//! and says how long a dead one may stay.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

/// How long DescribeGroups may take. librdkafka's mock cluster never answers it, and
/// tansu 0.6 on SQLite drops the connection (it cannot decode the group it stored).
const DESCRIBE_WAIT: Duration = Duration::from_secs(5);
/// Member ids named in a message; the rest are counted.
const NAMED_MEMBERS: usize = 5;

/// A group as the broker describes it, seen from one of its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GroupView {
    /// The broker's state name (`Stable`, `PreparingRebalance`, ...).
    pub(super) state: String,
    /// Every member id but the asking member's.
    pub(super) others: Vec<String>,
}

impl GroupView {
    /// The broker lists the asking member alone in a settled group.
    pub(super) fn alone_and_stable(&self) -> bool {
        self.others.is_empty() && self.state.eq_ignore_ascii_case("stable")
    }
}

/// The group as the broker describes it, without the member `me`; `None` when the
/// broker does not answer DescribeGroups.
pub(super) fn describe(consumer: &BaseConsumer, group: &str, me: &str) -> Option<GroupView> {
    let list = match consumer.fetch_group_list(Some(group), DESCRIBE_WAIT) {
        Ok(list) => list,
        Err(error) => {
            tracing::debug!(%error, "the broker did not describe the group");
            return None;
        }
    };
    let described = list.groups().iter().find(|g| g.name() == group)?;
    Some(GroupView {
        state: described.state().to_owned(),
        others: described
            .members()
            .iter()
            .map(|m| m.id().to_owned())
            .filter(|id| id != me)
            .collect(),
    })
}

/// What a replay that waited in vain for every partition tells the operator.
pub(super) struct Refusal<'a> {
    pub(super) group: &'a str,
    pub(super) assigned: usize,
    pub(super) partitions: i32,
    pub(super) waited: Duration,
    /// This replay's `KAFKA_SESSION_TIMEOUT`, taken to be the workers'.
    pub(super) session_timeout: Duration,
    /// Whether the replay already joined the group a second time.
    pub(super) rejoined: bool,
    pub(super) view: Option<GroupView>,
}

impl std::fmt::Display for Refusal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            group,
            assigned,
            partitions,
            waited,
            session_timeout,
            rejoined,
            view,
        } = self;
        let waited = waited.as_secs();
        let session = session_timeout.as_secs_f64();
        let lingering = format!(
            "A member that stopped without leaving the group (SIGKILL, a crash, a lost \
             host) stays in it until the broker has had no heartbeat from it for its \
             session timeout: {session}s if the workers ran with this replay's \
             KAFKA_SESSION_TIMEOUT (brokers such as tansu keep the session timeout of \
             the member that created the group, and drop a dead member only when \
             another request for the group arrives)"
        );
        match view {
            Some(view) if !view.others.is_empty() => {
                let mut named: Vec<&str> = view
                    .others
                    .iter()
                    .take(NAMED_MEMBERS)
                    .map(String::as_str)
                    .collect();
                let more = view.others.len() - named.len();
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                named.sort_unstable();
                write!(
                    f,
                    "group {group} still has {} other member(s) after {waited}s ({}{more}; \
                     group state {}), so this replay got {assigned} of {partitions} \
                     partitions. {lingering}: stop the workers first, then run replay \
                     again once that much time has passed since the last of them stopped",
                    view.others.len(),
                    named.join(", "),
                    view.state
                )
            }
            Some(view) if !view.alone_and_stable() => write!(
                f,
                "this replay is the only member of group {group}, which is still in state \
                 {} after {waited}s: the broker did not finish the rebalance that would \
                 give it every partition (it got {assigned} of {partitions}); run replay \
                 again",
                view.state
            ),
            Some(view) => {
                let again = if *rejoined {
                    ", also after joining it a second time"
                } else {
                    ""
                };
                write!(
                    f,
                    "this replay is the only member of group {group} (group state {}), yet \
                     the broker assigned it {assigned} of {partitions} partitions \
                     within {waited}s{again}: the group's coordinator left partitions \
                     unassigned (tansu 0.6 does so when a rebalance completes after its \
                     leader was dropped). No worker holds them; run replay again",
                    view.state
                )
            }
            None => write!(
                f,
                "group {group} still has other live members (got {assigned} of \
                 {partitions} partitions after {waited}s; the broker did not say which). \
                 {lingering}: stop the workers first, then run replay again once that much \
                 time has passed since the last of them stopped"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(view: Option<GroupView>) -> String {
        Refusal {
            group: "payments",
            assigned: 0,
            partitions: 4,
            waited: Duration::from_secs(23),
            session_timeout: Duration::from_secs(6),
            rejoined: true,
            view,
        }
        .to_string()
    }

    #[test]
    fn a_refusal_names_the_members_left_and_how_long_a_dead_one_may_stay() {
        let others: Vec<String> = (1..=7).map(|n| format!("rdkafka-{n}")).collect();
        let text = refusal(Some(GroupView {
            state: "Stable".into(),
            others,
        }));
        assert!(text.contains("7 other member(s)"), "{text}");
        assert!(
            text.contains("rdkafka-1, rdkafka-2, rdkafka-3, rdkafka-4, rdkafka-5 and 2 more"),
            "{text}"
        );
        assert!(text.contains("session timeout: 6s"), "{text}");
        assert!(text.contains("stop the workers first"), "{text}");
        assert!(text.contains("got 0 of 4 partitions"), "{text}");
    }

    #[test]
    fn a_replay_left_alone_without_partitions_blames_the_coordinator_not_the_workers() {
        let text = refusal(Some(GroupView {
            state: "Stable".into(),
            others: Vec::new(),
        }));
        assert!(text.contains("the only member"), "{text}");
        assert!(
            text.contains("also after joining it a second time"),
            "{text}"
        );
        assert!(!text.contains("stop the workers"), "{text}");
    }

    #[test]
    fn without_a_description_the_refusal_still_says_how_long_a_dead_member_may_stay() {
        let text = refusal(None);
        assert!(text.contains("the broker did not say which"), "{text}");
        assert!(text.contains("session timeout: 6s"), "{text}");
        assert!(text.contains("stop the workers first"), "{text}");
    }

    #[test]
    fn a_replay_alone_in_a_group_still_rebalancing_says_so() {
        let text = refusal(Some(GroupView {
            state: "PreparingRebalance".into(),
            others: Vec::new(),
        }));
        assert!(text.contains("still in state PreparingRebalance"), "{text}");
        assert!(!text.contains("left partitions unassigned"), "{text}");
    }

    #[test]
    fn only_a_stable_group_without_others_counts_as_alone() {
        let view = |state: &str, others: &[&str]| GroupView {
            state: state.into(),
            others: others.iter().map(|s| (*s).to_owned()).collect(),
        };
        assert!(view("Stable", &[]).alone_and_stable());
        assert!(!view("PreparingRebalance", &[]).alone_and_stable());
        assert!(!view("Stable", &["w-1"]).alone_and_stable());
    }
}
