//! The Kafka consumer: group membership, commit discipline, rebalances, bad records,
//! managed-Kafka connectivity.

mod consumer_group;
mod corpus;
mod corpus_cases;
mod exactly_once;
mod failures;
mod kafka_connectivity;
mod oauthbearer;
mod operator_tools;
mod oversized_dead_letters;
mod poison;
mod rebalance;
mod refund_replay;
mod refused_answers;
mod transaction_fencing;
