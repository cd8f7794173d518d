//! Secrets given as a setting (`NAME`) or as a file holding it (`NAME_FILE`, as
//! container orchestrators mount them). Read once, at start; the value never
//! reaches a `Debug`, a `Display`, an error message or `--help`.
//!
//! `read_secret` is the one way a secret file is read. The gateway's key is read
//! where its client is made; `DATABASE_URL_FILE`, `REDIS_URL_FILE` and
//! `KAFKA_CONFIG_FILE` are read by [`SecretFileParser`] while the command line is
//! parsed, so every command gets them the same way and none reads them twice.

use std::path::{Path, PathBuf};

pub use crate::redaction::Secret;

/// Why a secret setting could not be read. Names the settings and the file, never
/// what the file holds.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SecretError {
    /// Both forms were given: which one wins would be a guess.
    #[error("{name} and {name}_FILE are both set; give one of them")]
    BothGiven {
        /// The setting's name (`GATEWAY_API_KEY`).
        name: &'static str,
    },
    /// The file could not be read.
    #[error("{name}_FILE {}: cannot be read ({kind})", path.display())]
    Unreadable {
        /// The setting's name.
        name: &'static str,
        /// The file named.
        path: PathBuf,
        /// What the operating system said, without the contents.
        kind: std::io::ErrorKind,
    },
    /// The file is larger than any secret or client configuration (`/dev/zero`, a
    /// log file named by mistake): not read past the limit.
    #[error("{name}_FILE {}: larger than {} MiB; is it the right file?", path.display(), MAX_SETTING_FILE >> 20)]
    TooLarge {
        /// The setting's name.
        name: &'static str,
        /// The file named.
        path: PathBuf,
    },
    /// The setting or its file is empty (a file of whitespace counts as empty).
    #[error("{name} is empty")]
    Empty {
        /// The setting's name.
        name: &'static str,
    },
}

impl SecretError {
    /// A usage error (exit status 2): the command line itself is contradictory.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::BothGiven { .. })
    }
}

/// The secret `name` from its value or from the file `name_FILE` names (read now,
/// the trailing line break trimmed: editors and `echo` add one); `None` when
/// neither is set. Both set is refused rather than one silently winning.
pub fn read_secret(
    name: &'static str,
    value: Option<&Secret>,
    file: Option<&Path>,
) -> Result<Option<Secret>, SecretError> {
    let secret = match (value, file) {
        (Some(_), Some(_)) => return Err(SecretError::BothGiven { name }),
        (None, None) => return Ok(None),
        (Some(value), None) => value.clone(),
        (None, Some(path)) => {
            let text = read_bounded(name, path)?;
            warn_when_others_may_read(name, path);
            Secret::from(text.trim_end_matches(['\n', '\r']))
        }
    };
    if secret.expose().trim().is_empty() {
        return Err(SecretError::Empty { name });
    }
    Ok(Some(secret))
}

/// The most a file named by a setting may hold: keys, URLs, a Kafka client's
/// properties and PEM bundles (a whole system CA bundle is about 200 KiB) are far
/// smaller.
pub const MAX_SETTING_FILE: usize = 4 << 20;

/// A file a setting names (a secret, a CA bundle, a client certificate), read no
/// further than [`MAX_SETTING_FILE`]: `/dev/zero`, a pipe whose writer never stops
/// or a log file named by mistake is refused (`ErrorKind::FileTooLarge`) instead of
/// read until memory runs out. (A pipe is read, not refused: `NAME_FILE=<(pass
/// show db)` is one. One whose writer never writes waits, as `cat` would.)
pub fn read_setting_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_SETTING_FILE as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > MAX_SETTING_FILE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("larger than {} MiB", MAX_SETTING_FILE >> 20),
        ));
    }
    Ok(bytes)
}

/// The file `setting` names ([`read_setting_file`]), an error naming both.
pub fn read_named_setting_file(setting: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context as _;
    read_setting_file(path).with_context(|| format!("reading {setting} {}", path.display()))
}

/// A secret file's text ([`read_setting_file`]).
fn read_bounded(name: &'static str, path: &Path) -> Result<String, SecretError> {
    let unreadable = |kind| SecretError::Unreadable {
        name,
        path: path.to_owned(),
        kind,
    };
    let bytes = read_setting_file(path).map_err(|error| match error.kind() {
        std::io::ErrorKind::FileTooLarge => SecretError::TooLarge {
            name,
            path: path.to_owned(),
        },
        kind => unreadable(kind),
    })?;
    String::from_utf8(bytes).map_err(|_| unreadable(std::io::ErrorKind::InvalidData))
}

/// A secret file any user of the machine may read is a leak waiting to happen (a
/// Kubernetes Secret volume is 0644 unless its `defaultMode` says otherwise): said
/// once, at start, and the worker goes on.
fn warn_when_others_may_read(name: &'static str, path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(metadata) = std::fs::metadata(path) else {
        return;
    };
    if metadata.permissions().mode() & 0o004 != 0 {
        crate::telemetry::warn_at_start(format!(
            "{name}_FILE {} is readable by every user of this machine: give it mode 0400 \
             or 0440 (Kubernetes: defaultMode: 0440 on the Secret volume)",
            path.display()
        ));
    }
}

/// A `NAME_FILE` setting: the file named and what it held when the command line
/// was parsed. `Debug` shows the path only.
#[derive(Clone)]
pub struct SecretFile {
    path: PathBuf,
    contents: Secret,
}

impl SecretFile {
    /// Reads `name`'s file form at `path` now, as the command line does
    /// ([`read_secret`]).
    pub fn read(name: &'static str, path: &Path) -> Result<Self, SecretError> {
        let contents = read_secret(name, None, Some(path))?.ok_or(SecretError::Empty { name })?;
        Ok(Self {
            path: path.to_owned(),
            contents,
        })
    }

    /// The file named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What it held, its trailing line break trimmed.
    pub fn contents(&self) -> &Secret {
        &self.contents
    }
}

impl std::fmt::Debug for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Reads a `NAME_FILE` setting's file when the command line is parsed ([`read_secret`]).
/// A file that cannot be read, or an empty one, is a usage error naming the setting
/// and the path; both `NAME` and `NAME_FILE` given is refused by clap
/// (`conflicts_with`) before this runs.
#[derive(Clone)]
pub struct SecretFileParser {
    name: &'static str,
}

impl SecretFileParser {
    /// The parser of `name`'s file form (`name` without `_FILE`).
    pub fn new(name: &'static str) -> Self {
        Self { name }
    }
}

impl clap::builder::TypedValueParser for SecretFileParser {
    type Value = SecretFile;

    fn parse_ref(
        &self,
        _: &clap::Command,
        _: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        SecretFile::read(self.name, &PathBuf::from(value)).map_err(|error| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("{error}\n"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_comes_from_its_value_or_its_file_never_both() {
        let dir = std::env::temp_dir().join(format!("pw-secret-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, "sk_test_from_file\r\n").unwrap();
        let given = Secret::from("sk_test_given");

        let read = read_secret("GATEWAY_API_KEY", None, Some(&file)).unwrap();
        assert_eq!(read.unwrap().expose(), "sk_test_from_file");
        let read = read_secret("GATEWAY_API_KEY", Some(&given), None).unwrap();
        assert_eq!(read.unwrap().expose(), "sk_test_given");
        assert!(read_secret("GATEWAY_API_KEY", None, None)
            .unwrap()
            .is_none());

        let both = read_secret("GATEWAY_API_KEY", Some(&given), Some(&file)).unwrap_err();
        assert!(both.is_usage());
        let missing = read_secret("GATEWAY_API_KEY", None, Some(&dir.join("nope"))).unwrap_err();
        assert!(!missing.is_usage());
        std::fs::write(&file, "\n").unwrap();
        let empty = read_secret("GATEWAY_API_KEY", None, Some(&file)).unwrap_err();
        // A file that never ends is refused, not read forever.
        let endless =
            read_secret("GATEWAY_API_KEY", None, Some(Path::new("/dev/zero"))).unwrap_err();
        assert!(
            matches!(endless, SecretError::TooLarge { .. }),
            "{endless:?}"
        );
        std::fs::write(&file, format!("sk_test_{}", "x".repeat(MAX_SETTING_FILE))).unwrap();
        let large = read_secret("GATEWAY_API_KEY", None, Some(&file)).unwrap_err();
        assert!(matches!(large, SecretError::TooLarge { .. }), "{large:?}");
        std::fs::write(&file, b"sk_test_\xff").unwrap();
        let binary = read_secret("GATEWAY_API_KEY", None, Some(&file)).unwrap_err();
        assert!(
            matches!(binary, SecretError::Unreadable { .. }),
            "{binary:?}"
        );
        for error in [both, missing, empty, endless, large, binary] {
            let text = format!("{error} {error:?}");
            assert!(!text.contains("sk_test"), "{text}");
        }
        assert_eq!(format!("{given:?}"), "<redacted>");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
