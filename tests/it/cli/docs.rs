//! The docs cannot drift from the command line.
//!
//! - Every command's `--help` is compared with its snapshot in `tests/snapshots/help/`
//!   by snapbox (run with `SNAPSHOTS=overwrite` to rewrite them after a deliberate
//!   change, then review the diff).
//! - Every ```` ```console ```` block of README.md and docs/*.md is run: each
//!   `$ payment-worker …` line must print what the block shows after it, and
//!   `$ echo $?` the exit status. Only commands that need no service belong there.
//! - Every `payment-worker …` command line in their other code blocks and in
//!   inline code must be accepted by the argument parser.
//! - Every example command message (```` ```json ```` / ```` ```jsonl ````) is a
//!   valid command.
//! - Shell completions and the manual are generated for every command.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use payment_worker::cli::Cli;
use payment_worker::payment::Command;
use payment_worker_devtools::cli::DevCli;

const BIN: &str = crate::support::procs::BINARY;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the binary with no inherited environment (help shows `[env: X=value]`
/// for variables that are set) and returns exit status and stdout + stderr.
fn run_isolated(binary: &Path, args: &[String]) -> (i32, String) {
    let output = std::process::Command::new(binary)
        .args(args)
        .env_clear()
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.code().expect("exited"), text)
}

/// Every help page and the snapshot file it is kept in: the product's command paths
/// (`[]`, `["run"]`, `["tokens"]`, `["tokens", "issue"]`, …), then the development
/// tools' binary and its own tools (the product commands it also runs are the pages
/// above).
fn help_pages() -> Vec<(PathBuf, Vec<String>, String)> {
    let product = command_paths().into_iter().map(|path| {
        (
            PathBuf::from(BIN),
            path.clone(),
            snapshot_name("payment-worker", &path),
        )
    });
    let product_commands: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    let tools: Vec<Vec<String>> = std::iter::once(Vec::new())
        .chain(
            DevCli::command()
                .get_subcommands()
                .map(|c| c.get_name().to_owned())
                .filter(|name| !product_commands.contains(name) && name != "help")
                .map(|name| vec![name]),
        )
        .collect();
    let devtools = crate::support::procs::devtools_binary();
    product
        .chain(tools.into_iter().map(|path| {
            let name = snapshot_name("payment-worker-devtools", &path);
            (devtools.clone(), path, name)
        }))
        .collect()
}

/// `payment-worker-tokens-issue` for `["tokens", "issue"]`.
fn snapshot_name(binary: &str, path: &[String]) -> String {
    std::iter::once(binary.to_owned())
        .chain(path.iter().cloned())
        .collect::<Vec<_>>()
        .join("-")
}

/// Every command path of the product: `[]`, `["run"]`, `["tokens"]`, `["tokens", "issue"]`, …
fn command_paths() -> Vec<Vec<String>> {
    fn walk(command: &clap::Command, path: Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(path.clone());
        for sub in command.get_subcommands() {
            let mut next = path.clone();
            next.push(sub.get_name().to_owned());
            walk(sub, next, out);
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), Vec::new(), &mut out);
    out
}

/// snapbox's assertions, rewriting snapshots when `SNAPSHOTS=overwrite` is set.
fn snapshots() -> snapbox::Assert {
    snapbox::Assert::new().action_env(snapbox::assert::DEFAULT_ACTION_ENV)
}

#[test]
fn every_commands_help_matches_its_snapshot() {
    let dir = repo().join("tests/snapshots/help");
    let mut expected_files = std::collections::BTreeSet::new();
    for (binary, path, name) in help_pages() {
        let file = dir.join(format!("{name}.txt"));
        expected_files.insert(file.clone());
        let mut args = path.clone();
        args.push("--help".into());
        let (status, help) = run_isolated(&binary, &args);
        assert_eq!(status, 0, "{args:?}: {help}");
        // Exact text: no wildcard ("...", "[..]") in a help text means anything.
        snapshots().eq(help, snapbox::Data::read_from(&file, None).raw());
    }
    // A snapshot of a command that no longer exists is stale.
    let stale: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|file| !expected_files.contains(file))
        .collect();
    assert!(stale.is_empty(), "snapshots of no command: {stale:?}");
}

/// A fenced code block of a Markdown file.
struct Block {
    file: PathBuf,
    line: usize,
    lang: String,
    lines: Vec<String>,
}

fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn blocks(file: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("```") {
            match open.take() {
                Some(block) => out.push(block),
                None => {
                    open = Some(Block {
                        file: file.to_owned(),
                        line: n + 1,
                        lang: rest.trim().to_owned(),
                        lines: Vec::new(),
                    })
                }
            }
        } else if let Some(block) = open.as_mut() {
            block.lines.push(line.to_owned());
        }
    }
    out
}

/// Splits a command line into words as a POSIX shell would for the simple lines
/// the docs hold: blanks separate; '…' is literal; "…" keeps \" and \\.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some(next @ ('"' | '\\' | '$')) => word.push(next),
                            Some(next) => {
                                word.push('\\');
                                word.push(next);
                            }
                            None => word.push('\\'),
                        },
                        _ => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

#[test]
fn shell_words_split_like_a_shell() {
    assert_eq!(
        shell_words(r#"payment-worker process '{"a": 1}' "x \"y\"" z\ w"#),
        [
            "payment-worker",
            "process",
            r#"{"a": 1}"#,
            r#"x "y""#,
            "z w"
        ]
    );
}

#[test]
fn the_console_examples_print_what_the_docs_show() {
    let mut ran = 0;
    let mut failures = Vec::new();
    for block in doc_files().iter().flat_map(|f| blocks(f)) {
        if block.lang != "console" {
            continue;
        }
        // Each `$ ` line and the output lines after it.
        let mut steps: Vec<(String, Vec<String>)> = Vec::new();
        for line in &block.lines {
            match line.strip_prefix("$ ") {
                Some(command) => steps.push((command.to_owned(), Vec::new())),
                None => match steps.last_mut() {
                    Some((_, output)) => output.push(line.clone()),
                    None => panic!(
                        "{}:{}: a console block starts with `$ `",
                        block.file.display(),
                        block.line
                    ),
                },
            }
        }
        let mut last_status = None;
        for (command, expected) in steps {
            let actual = if command == "echo $?" {
                let status: i32 = last_status.expect("`echo $?` after a command");
                format!("{status}\n")
            } else {
                let mut words = shell_words(&command);
                assert_eq!(
                    words.first().map(String::as_str),
                    Some("payment-worker"),
                    "{}:{}: console blocks run `payment-worker …` and `echo $?` only",
                    block.file.display(),
                    block.line
                );
                words.remove(0);
                let (status, text) = run_isolated(Path::new(BIN), &words);
                last_status = Some(status);
                ran += 1;
                text
            };
            let expected: String = expected.iter().map(|l| format!("{l}\n")).collect();
            if actual != expected {
                failures.push(format!(
                    "{}:{}: `$ {command}`\n--- the docs show:\n{expected}--- it prints:\n{actual}",
                    block.file.display(),
                    block.line
                ));
            }
        }
    }
    assert!(ran >= 3, "only {ran} console examples found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Which binary a documented command line runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binary {
    /// `payment-worker`, the product.
    Product,
    /// `payment-worker-devtools`: the development tools and every product command.
    Devtools,
}

impl Binary {
    fn of_word(word: &str) -> Option<Self> {
        let name = word.rsplit('/').next().unwrap_or(word);
        match name {
            "payment-worker" => Some(Self::Product),
            "payment-worker-devtools" => Some(Self::Devtools),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Product => "payment-worker",
            Self::Devtools => "payment-worker-devtools",
        }
    }
}

/// The binary a shell line runs and the arguments after it (`payment-worker …`,
/// `./target/release/payment-worker-devtools …`, `cargo run [--release] [-p P] -- …`,
/// `cargo demo …`).
fn invocation(line: &str) -> Option<(Binary, Vec<String>)> {
    let line = line.trim().trim_start_matches("$ ");
    if line.starts_with('#') {
        return None;
    }
    // Comments, then the first command of a pipeline or list.
    let line = line.split(" #").next().unwrap_or_default();
    let line = line
        .split(" | ")
        .next()
        .unwrap_or_default()
        .split(" && ")
        .next()
        .unwrap_or_default()
        .trim_end()
        .trim_end_matches('&')
        .trim_end();
    let words = shell_words(line);
    let word = |i: usize| words.get(i).map(String::as_str);
    // The first word that names a binary (`./target/release/payment-worker`), unless
    // a bare name follows: `kubectl exec deploy/payment-worker -- payment-worker …`
    // runs the last one.
    let named = |i: usize| Binary::of_word(&words[i]).map(|b| (b, i + 1));
    let bare = words
        .iter()
        .rposition(|w| w == "payment-worker" || w == "payment-worker-devtools");
    let first = (0..words.len()).find(|&i| named(i).is_some());
    let (binary, start) = match bare.or(first).and_then(named) {
        Some(found) if word(0) != Some("cargo") => found,
        _ if word(0) == Some("cargo") && word(1) == Some("demo") => (Binary::Devtools, 1),
        _ if word(0) == Some("cargo") && word(1) == Some("run") => {
            let binary = if words.iter().any(|w| w == "payment-worker-devtools") {
                Binary::Devtools
            } else {
                Binary::Product
            };
            (binary, words.iter().position(|w| w == "--")? + 1)
        }
        _ => return None,
    };
    let mut args = Vec::new();
    let mut rest = words[start..].iter();
    while let Some(word) = rest.next() {
        if word == ">" || word == "2>" || word == "<" {
            rest.next();
        } else if !(word.starts_with('>') || word.starts_with("2>")) {
            args.push(word.clone());
        }
    }
    Some((binary, args))
}

/// Command lines in code blocks and inline code of the docs.
fn documented_invocations() -> Vec<(String, Binary, Vec<String>)> {
    let mut found = Vec::new();
    for file in doc_files() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for block in blocks(&file) {
            // `console` blocks are run (and may show refusals on purpose).
            if !matches!(block.lang.as_str(), "" | "sh" | "bash" | "shell") {
                continue;
            }
            for (n, line) in block.lines.iter().enumerate() {
                if let Some((binary, args)) = invocation(line) {
                    found.push((format!("{name}:{}", block.line + 1 + n), binary, args));
                }
            }
        }
        // Inline code: `payment-worker audit --repair`, placeholders (<…>, …) aside.
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for (i, span) in line.split('`').enumerate() {
                let is_code = i % 2 == 1;
                if is_code
                    && (span.starts_with("payment-worker ")
                        || span.starts_with("payment-worker-devtools "))
                    && !span.contains('<')
                    && !span.contains('…')
                    && !span.contains("...")
                {
                    if let Some((binary, args)) = invocation(span) {
                        found.push((format!("{name}:{}", n + 1), binary, args));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn every_documented_command_line_is_accepted() {
    let invocations = documented_invocations();
    assert!(
        invocations.len() >= 15,
        "only {} command lines found: {invocations:?}",
        invocations.len()
    );
    let mut failures = Vec::new();
    for (place, binary, args) in &invocations {
        let argv = std::iter::once(binary.name().to_owned()).chain(args.iter().cloned());
        let parsed = match binary {
            Binary::Product => Cli::try_parse_from(argv).map(drop),
            Binary::Devtools => DevCli::try_parse_from(argv).map(drop),
        };
        match parsed {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                ) => {}
            Err(e) => failures.push(format!(
                "{place}: {} {}\n{e}",
                binary.name(),
                args.join(" ")
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_example_command_message_is_a_valid_command() {
    let mut checked = 0;
    for block in doc_files().iter().flat_map(|f| blocks(f)) {
        let messages: Vec<String> = match block.lang.as_str() {
            "json" => vec![block.lines.join("\n")],
            "jsonl" => block
                .lines
                .iter()
                .filter(|l| !l.trim().is_empty())
                .cloned()
                .collect(),
            _ => continue,
        };
        for message in messages {
            if !message.contains("\"idempotency_key\"") {
                continue;
            }
            if let Err(e) = Command::parse(message.as_bytes()) {
                panic!(
                    "{}:{}: example message refused ({}): {message}",
                    block.file.display(),
                    block.line,
                    e
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 2, "only {checked} example messages found");
}

fn subcommand_names() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect()
}

#[test]
fn completions_cover_every_command_and_bash_accepts_the_script() {
    for shell in ["bash", "zsh", "fish"] {
        let (status, script) = run_isolated(Path::new(BIN), &["completions".into(), shell.into()]);
        assert_eq!(status, 0, "{shell}: {script}");
        for name in subcommand_names() {
            assert!(script.contains(&name), "{shell}: {name} missing");
        }
        // fish spells flags `-l dry-run`, bash and zsh `--dry-run`.
        for flag in ["kafka-brokers", "dry-run", "key-prefix", "gateway-lookup"] {
            assert!(script.contains(flag), "{shell}: {flag} missing");
        }
    }
    let (_, script) = run_isolated(Path::new(BIN), &["completions".into(), "bash".into()]);
    let checked = std::process::Command::new("bash")
        .args(["-n", "-c", &script])
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
}

#[test]
fn the_manual_documents_every_command_and_its_exit_status() {
    let (status, page) = run_isolated(Path::new(BIN), &["man".into()]);
    assert_eq!(status, 0, "{page}");
    assert!(page.contains(".TH payment-worker 1"), "{page}");
    assert!(page.contains(".SH \"EXIT STATUS\""), "{page}");
    for code in [0, 1, 2, 3, 4, 65, 75, 130] {
        assert!(
            page.contains(&format!(".TP\n\\fB{code}\\fR\n")),
            "{code}: {page}"
        );
    }
    for name in subcommand_names() {
        assert!(page.contains(&format!("payment\\-worker\\-{}", name.replace('-', "\\-"))));
    }
    let dir = std::env::temp_dir().join(crate::support::helpers::unique("pw_man"));
    let (status, text) = run_isolated(
        Path::new(BIN),
        &["man".into(), "--out-dir".into(), dir.display().to_string()],
    );
    assert_eq!(status, 0, "{text}");
    for name in subcommand_names() {
        let page = dir.join(format!("payment-worker-{name}.1"));
        let content =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(content.contains(".TH"), "{}", page.display());
    }
    assert!(dir.join("payment-worker-tokens-show.1").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
