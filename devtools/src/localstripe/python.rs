//! Which Python runs localstripe. The launch script imports `localstripe.server`, so
//! what matters is an interpreter that has the package: pip installs it for one
//! Python (often a virtual environment's), and the system's `python3` may not be
//! that one. `LOCALSTRIPE` (the bench's `--localstripe`) names it as the interpreter
//! (`/opt/venv/bin/python`), the `localstripe` executable pip wrote beside it
//! (`/opt/venv/bin/localstripe`: the `python` next to it, or its shebang's), or the
//! virtual environment itself; without it, `python3` on `PATH`, then
//! `$VIRTUAL_ENV/bin/python`. The choice is [`PythonSearch::choose`], pure given the
//! environment read by [`PythonSearch::new`] and a test of each candidate.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::LOCALSTRIPE_VERSION;

/// The environment variable naming where localstripe is installed.
pub const LOCALSTRIPE_ENV: &str = "LOCALSTRIPE";

/// What the search starts from: read once from the environment and the files it
/// names, so that the choice itself does no I/O but asking each candidate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PythonSearch {
    /// `LOCALSTRIPE` (or the flag): an interpreter, an executable, or a directory.
    pub setting: Option<PathBuf>,
    /// The setting is a directory (a virtual environment).
    pub setting_is_dir: bool,
    /// The interpreter the setting's first lines name, when it is a script.
    pub shebang: Option<PathBuf>,
    /// `VIRTUAL_ENV`: the virtual environment activated in this shell.
    pub virtual_env: Option<PathBuf>,
}

/// A file name that is an interpreter itself (`python`, `python3.12`, `pypy3`) rather
/// than a script run by one.
fn is_interpreter(path: &Path) -> bool {
    path.file_name()
        .and_then(OsStr::to_str)
        .is_some_and(|name| name.starts_with("python") || name.starts_with("pypy"))
}

/// The interpreter a script's first lines name: `#!/venv/bin/python3`,
/// `#!/usr/bin/env python3` (then found on `PATH`), or pip's form for a path too long
/// for a shebang, `#!/bin/sh` followed by `'''exec' "/long/path/python" "$0" "$@"`.
pub fn interpreter_in_script(head: &str) -> Option<PathBuf> {
    let mut lines = head.lines();
    let words: Vec<&str> = lines
        .next()?
        .strip_prefix("#!")?
        .split_whitespace()
        .collect();
    let program = *words.first()?;
    if program.ends_with("/env") {
        return words[1..]
            .iter()
            .find(|word| !word.starts_with('-'))
            .map(PathBuf::from);
    }
    if program.ends_with("/sh") {
        let exec = lines.find_map(|line| line.strip_prefix("'''exec' \""))?;
        return exec.split('"').next().map(PathBuf::from);
    }
    Some(PathBuf::from(program))
}

impl PythonSearch {
    /// The search for `setting` (`LOCALSTRIPE`) and `virtual_env` (`VIRTUAL_ENV`),
    /// reading the setting's first lines when it is a script.
    pub fn new(setting: Option<&Path>, virtual_env: Option<&OsStr>) -> Self {
        let setting_is_dir = setting.is_some_and(Path::is_dir);
        let shebang = setting
            .filter(|path| !setting_is_dir && !is_interpreter(path))
            .and_then(|path| std::fs::read(path).ok())
            .and_then(|bytes| {
                // The first lines are enough; a binary file has no shebang.
                let head = &bytes[..bytes.len().min(1024)];
                interpreter_in_script(&String::from_utf8_lossy(head))
            });
        Self {
            setting: setting.map(Path::to_path_buf),
            setting_is_dir,
            shebang,
            virtual_env: virtual_env.filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }

    /// Every interpreter to try, in order, with where it came from. With a setting,
    /// only what it names: a setting that is wrong is reported, not passed over for
    /// another Python.
    pub fn candidates(&self) -> Vec<(PathBuf, String)> {
        let mut found: Vec<(PathBuf, String)> = Vec::new();
        if let Some(setting) = &self.setting {
            let named = format!("{LOCALSTRIPE_ENV}={}", setting.display());
            if self.setting_is_dir {
                found.push((setting.join("bin/python"), format!("in {named}")));
            } else if is_interpreter(setting) {
                found.push((setting.clone(), named));
            } else {
                let dir = setting.parent().unwrap_or(Path::new(""));
                for python in ["python", "python3"] {
                    found.push((dir.join(python), format!("beside {named}")));
                }
                if let Some(shebang) = &self.shebang {
                    found.push((shebang.clone(), format!("the shebang of {named}")));
                }
            }
        } else {
            found.push((PathBuf::from("python3"), "on PATH".to_owned()));
            if let Some(venv) = &self.virtual_env {
                let python = venv.join("bin/python");
                found.push((python, format!("VIRTUAL_ENV={}", venv.display())));
            }
        }
        found.dedup_by(|a, b| a.0 == b.0);
        found
    }

    /// The first candidate `has_localstripe` accepts; else an error naming every one
    /// tried and how to name the right one.
    pub fn choose(
        &self,
        mut has_localstripe: impl FnMut(&Path) -> bool,
    ) -> anyhow::Result<PathBuf> {
        let candidates = self.candidates();
        if let Some((python, _)) = candidates
            .iter()
            .find(|(python, _)| has_localstripe(python))
        {
            return Ok(python.clone());
        }
        let tried: Vec<String> = candidates
            .iter()
            .map(|(python, from)| format!("{} ({from})", python.display()))
            .collect();
        anyhow::bail!(
            "localstripe not found: no localstripe package for {}; install it \
             (pip install localstripe=={LOCALSTRIPE_VERSION}) or set {LOCALSTRIPE_ENV} \
             (bench: --localstripe) to the Python that has it, its `localstripe` \
             executable, or its virtual environment",
            tried.join(", ")
        )
    }
}

/// Whether `python` runs and has the localstripe package (found, not imported:
/// importing its server takes a second, and the start reports a broken install).
pub fn has_localstripe(python: &Path) -> bool {
    Command::new(python)
        .args([
            "-c",
            "import importlib.util, sys; sys.exit(importlib.util.find_spec('localstripe') is None)",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(setting: Option<&str>, virtual_env: Option<&str>) -> PythonSearch {
        PythonSearch {
            setting: setting.map(PathBuf::from),
            virtual_env: virtual_env.map(PathBuf::from),
            ..PythonSearch::default()
        }
    }

    /// The candidates asked, in order, and the one chosen, when only `has` has it.
    fn asked(search: &PythonSearch, has: &str) -> (Vec<PathBuf>, anyhow::Result<PathBuf>) {
        let mut asked = Vec::new();
        let chosen = search.choose(|python| {
            asked.push(python.to_path_buf());
            python == Path::new(has)
        });
        (asked, chosen)
    }

    #[test]
    fn without_a_setting_python3_then_the_virtual_environment() {
        let venv = search(None, Some("/work/.venv"));
        let (tried, chosen) = asked(&venv, "python3");
        assert_eq!(tried, [PathBuf::from("python3")]);
        assert_eq!(chosen.unwrap(), PathBuf::from("python3"));
        let (tried, chosen) = asked(&venv, "/work/.venv/bin/python");
        assert_eq!(
            tried,
            [
                PathBuf::from("python3"),
                PathBuf::from("/work/.venv/bin/python")
            ]
        );
        assert_eq!(chosen.unwrap(), PathBuf::from("/work/.venv/bin/python"));
    }

    #[test]
    fn a_setting_naming_the_interpreter_is_the_only_one_tried() {
        let setting = search(Some("/opt/venv/bin/python3.12"), Some("/elsewhere"));
        let (tried, chosen) = asked(&setting, "python3");
        assert_eq!(tried, [PathBuf::from("/opt/venv/bin/python3.12")]);
        let error = format!("{:#}", chosen.unwrap_err());
        assert!(
            error.contains("/opt/venv/bin/python3.12 (LOCALSTRIPE=/opt/venv/bin/python3.12)"),
            "{error}"
        );
    }

    #[test]
    fn a_setting_naming_the_executable_uses_the_python_beside_it_or_its_shebang() {
        let mut setting = search(Some("/opt/venv/bin/localstripe"), None);
        let (_, chosen) = asked(&setting, "/opt/venv/bin/python");
        assert_eq!(chosen.unwrap(), PathBuf::from("/opt/venv/bin/python"));
        setting.shebang = Some(PathBuf::from("/usr/local/python/bin/python3.11"));
        let (tried, chosen) = asked(&setting, "/usr/local/python/bin/python3.11");
        assert_eq!(
            tried,
            [
                PathBuf::from("/opt/venv/bin/python"),
                PathBuf::from("/opt/venv/bin/python3"),
                PathBuf::from("/usr/local/python/bin/python3.11"),
            ]
        );
        assert_eq!(
            chosen.unwrap(),
            PathBuf::from("/usr/local/python/bin/python3.11")
        );
    }

    #[test]
    fn a_setting_naming_the_virtual_environment_uses_its_python() {
        let setting = PythonSearch {
            setting_is_dir: true,
            ..search(Some("/opt/venv"), None)
        };
        let (tried, chosen) = asked(&setting, "/opt/venv/bin/python");
        assert_eq!(tried, [PathBuf::from("/opt/venv/bin/python")]);
        assert!(chosen.is_ok());
    }

    #[test]
    fn none_found_names_what_was_tried_and_how_to_set_it() {
        let (_, chosen) = asked(&search(None, Some("/work/.venv")), "nowhere");
        let error = format!("{:#}", chosen.unwrap_err());
        for said in [
            "python3 (on PATH)",
            "/work/.venv/bin/python (VIRTUAL_ENV=/work/.venv)",
            "pip install localstripe==",
            "set LOCALSTRIPE",
            "--localstripe",
        ] {
            assert!(error.contains(said), "{said:?} not in {error}");
        }
    }

    #[test]
    fn shebangs_plain_env_and_pips_long_path_form() {
        let read = |head: &str| interpreter_in_script(head);
        assert_eq!(
            read("#!/opt/venv/bin/python3\nimport re\n"),
            Some(PathBuf::from("/opt/venv/bin/python3"))
        );
        assert_eq!(
            read("#!/usr/bin/env -S python3 -u\n"),
            Some(PathBuf::from("python3"))
        );
        assert_eq!(
            read("#!/bin/sh\n'''exec' \"/a very/long/bin/python\" \"$0\" \"$@\"\n' '''\n"),
            Some(PathBuf::from("/a very/long/bin/python"))
        );
        assert_eq!(read("\u{7f}ELF\u{2}"), None);
        assert_eq!(read(""), None);
    }

    #[test]
    fn the_environment_is_read_once() {
        let dir = std::env::temp_dir().join(format!("localstripe-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let script = dir.join("bin/localstripe");
        std::fs::write(&script, "#!/somewhere/bin/python3\nimport sys\n").unwrap();
        let found = PythonSearch::new(Some(&script), Some(OsStr::new("")));
        assert_eq!(found.shebang, Some(PathBuf::from("/somewhere/bin/python3")));
        assert_eq!(found.virtual_env, None, "an empty VIRTUAL_ENV is none");
        assert!(PythonSearch::new(Some(&dir), None).setting_is_dir);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_machines_python3_is_asked_by_running_it() {
        assert!(!has_localstripe(Path::new("/nonexistent/bin/python")));
    }
}
