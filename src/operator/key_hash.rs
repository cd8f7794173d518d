//! `key-hash`: the `x-key-hmac-sha256` of a key, computed as the workers compute
//! it, so an operator holding the secret can find the answers of a record whose key
//! every answer shows masked (it held a card number) or leaves out (too large).

use std::io::{Read, Write};

use anyhow::Context;

use crate::configuration::{SecretFile, SecretFileParser};
use crate::redaction::KeyHasher;

/// Flags of `key-hash`.
#[derive(Debug, clap::Args)]
pub struct KeyHashArgs {
    /// The record key, or `-` to read it from standard input (one trailing line
    /// break removed), which keeps a key holding a card number out of the shell's
    /// history and the process list.
    pub key: String,
    /// File holding the secret the workers were given (`KEY_HASH_SECRET_FILE`).
    #[arg(
        long = "key-hash-secret-file",
        env = "KEY_HASH_SECRET_FILE",
        value_name = "PATH",
        value_parser = SecretFileParser::new("KEY_HASH_SECRET"),
        hide_env_values = true
    )]
    pub secret_file: SecretFile,
}

/// Prints the hex HMAC-SHA256 of the key under the workers' secret, one line.
pub fn key_hash(
    args: &KeyHashArgs,
    mut input: impl Read,
    mut out: impl Write,
) -> anyhow::Result<()> {
    let hasher = KeyHasher::configured(args.secret_file.contents())?;
    let key = if args.key == "-" {
        let mut key = Vec::new();
        input
            .read_to_end(&mut key)
            .context("reading the key from standard input")?;
        if key.ends_with(b"\n") {
            key.pop();
            if key.ends_with(b"\r") {
                key.pop();
            }
        }
        key
    } else {
        args.key.clone().into_bytes()
    };
    writeln!(out, "{}", hasher.hex(&key))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_the_workers_and_reads_the_key_from_the_argument_or_stdin() {
        let dir = std::env::temp_dir().join(format!("pw-key-hash-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let file = dir.join("secret");
        std::fs::write(&file, "test-secret\n").expect("written");
        let secret_file = SecretFile::read("KEY_HASH_SECRET", &file).expect("read");
        // HMAC-SHA256("test-secret", "4111111111111111"), as `worker/record_echo.rs` puts it.
        let expected = "15e0d54329ac7909503c74553f815c417d2c9f5c0d1302213953524dd01972e3\n";
        for (key, stdin) in [
            ("4111111111111111", ""),
            ("-", "4111111111111111\n"),
            ("-", "4111111111111111\r\n"),
            ("-", "4111111111111111"),
        ] {
            let args = KeyHashArgs {
                key: key.to_owned(),
                secret_file: secret_file.clone(),
            };
            let mut out = Vec::new();
            key_hash(&args, stdin.as_bytes(), &mut out).expect("hashed");
            assert_eq!(
                String::from_utf8(out).expect("UTF-8"),
                expected,
                "{stdin:?}"
            );
        }
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
