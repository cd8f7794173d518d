//! The manifest and the command line tell the truth: `rust-version` is what the
//! locked dependencies really need, every flag explains itself in `--help`, and no
//! URL or password flag prints its environment value there.

use clap::CommandFactory;
use payment_worker::cli::Cli;

/// `1.89` and `1.89.0` compare equal.
fn parse_version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text.split('.').filter_map(|p| p.parse().ok()).collect();
    parts.resize(3, 0);
    parts
}

#[test]
fn rust_version_covers_every_locked_dependency() {
    // Not `--offline`: the metadata of every platform's dependencies is read, and a
    // fresh machine has downloaded only its own platform's crates while building.
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let ours = parse_version(env!("CARGO_PKG_RUST_VERSION"));
    let packages = metadata["packages"].as_array().unwrap();
    let (needed, by) = packages
        .iter()
        .filter_map(|p| {
            let version = parse_version(p["rust_version"].as_str()?);
            Some((version, p["name"].as_str()?.to_owned()))
        })
        .max()
        .unwrap();
    assert!(
        ours >= needed,
        "rust-version {ours:?} is below {needed:?}, which {by} needs"
    );
}

fn every_command(command: &clap::Command) -> Vec<clap::Command> {
    let mut all = vec![command.clone()];
    for sub in command.get_subcommands() {
        all.extend(every_command(sub));
    }
    all
}

#[test]
fn every_flag_has_help_and_secret_flags_hide_their_environment_value() {
    let mut root = Cli::command();
    root.build();
    let mut undocumented = Vec::new();
    let mut revealing = Vec::new();
    for command in every_command(&root) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                undocumented.push(format!("{} {id}", command.get_name()));
            }
            let secret = ["url", "password", "secret", "token"]
                .iter()
                .any(|word| id.to_ascii_lowercase().contains(word))
                && !id.contains("token_store")
                && !id.contains("token_mode")
                && !id.contains("token_ttl");
            if secret && arg.get_env().is_some() && !arg.is_hide_env_values_set() {
                revealing.push(format!("{} {id}", command.get_name()));
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "flags without help: {undocumented:?}"
    );
    assert!(
        revealing.is_empty(),
        "--help would print the value of: {revealing:?}"
    );
}
