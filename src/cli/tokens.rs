//! `tokens issue` and `tokens show`.

use std::io::Write;

use super::{CommandFailure, TokensCommand};
use crate::redaction::contains_card_number;
use crate::startup;
use crate::token::{IdempotencyKey, IssueOutcome};

/// Issues pending tokens, or shows one.
pub(super) async fn run(command: TokensCommand) -> anyhow::Result<()> {
    let settings = match &command {
        TokensCommand::Issue { store, .. } | TokensCommand::Show { store, .. } => store,
    };
    if let TokensCommand::Issue { keys, .. } = &command {
        // The worker refuses such a key (`card_number_as_key`): a token for it could
        // never be used, and would keep the card number in the store. Refused before
        // any store is opened (or migrated).
        if let Some(key) = keys.iter().find(|key| contains_card_number(key.as_str())) {
            // (A key's Display masks the card number.)
            return Err(CommandFailure::InvalidInput(format!(
                "the key {key} holds a card number; no token issued"
            ))
            .into());
        }
    }
    // Showing a token never migrates; issuing one may prepare the database.
    let (_pool, store) = match &command {
        TokensCommand::Show { .. } => startup::open_existing_stores(settings).await?,
        TokensCommand::Issue { .. } => startup::open_stores(settings).await?,
    };
    let mut out = std::io::stdout().lock();
    match command {
        TokensCommand::Issue {
            ttl, count, keys, ..
        } => {
            let keys: Vec<IdempotencyKey> = if keys.is_empty() {
                (0..count)
                    .map(|_| IdempotencyKey::random("tok"))
                    .collect::<Result<_, _>>()?
            } else {
                keys
            };
            for key in keys {
                match store.issue(&key, ttl).await? {
                    IssueOutcome::Created => writeln!(out, "{}", key.as_str())?,
                    IssueOutcome::AlreadyExists => {
                        eprintln!("{key}: already exists, left as it is")
                    }
                }
            }
        }
        TokensCommand::Show { key, .. } => match store.show(&key).await? {
            Some(view) => writeln!(out, "{}", serde_json::to_string(&view)?)?,
            None => {
                writeln!(out, "{{\"state\":\"missing\"}}")?;
                return Err(CommandFailure::NotFound(format!("token {key}")).into());
            }
        },
    }
    Ok(())
}
