//! docs/ARCHITECTURE.md stays true: no import cycle joins the top-level modules, the
//! document's figures are the code's, and no product file or function grows past
//! what a reader can follow. (That the product never uses the
//! development tools is the compiler's to keep: they are a crate that depends on it.)

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The file's code without `//` comments (doc comments may name anything).
fn code_of(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segment of every path that starts with `prefix` (`crate::`,
/// `super::`) in `code`: `a` for `prefix a::b`, `a` and `b` for `prefix {a, b::c}`.
fn named_after(code: &str, prefix: &str) -> Vec<String> {
    let head = |text: &str| -> String {
        text.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        match rest.strip_prefix('{') {
            Some(list) => names.extend(
                list[..list.find('}').unwrap_or(list.len())]
                    .split(',')
                    .map(head),
            ),
            None => names.push(head(rest)),
        }
    }
    names
}

/// The library's top-level modules (`src/<name>.rs` or `src/<name>/`) and, for
/// each, the others its code names as `crate::<name>` (also inside a
/// `use crate::{…}` list).
fn module_graph() -> Graph {
    let src = src();
    let mut files: std::collections::BTreeMap<String, Vec<PathBuf>> = Default::default();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            files.insert(name, rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            files.insert(name, vec![path]);
        }
    }
    let names: Vec<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, paths)| {
            let mut used = std::collections::BTreeSet::new();
            for path in paths {
                let code = code_of(path);
                for head in named_after(&code, "crate::") {
                    if names.contains(&head) && &head != module {
                        used.insert(head);
                    }
                }
            }
            (module.clone(), used)
        })
        .collect()
}

type Graph = std::collections::BTreeMap<String, std::collections::BTreeSet<String>>;

/// A cycle of `graph`, if it has one: the modules on it, the first one again last.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    // Depth-first search for a back edge: a module reached again while on the path.
    fn visit<'a>(
        graph: &'a Graph,
        module: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut std::collections::BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| *m == module) {
            let mut cycle: Vec<String> = path[at..].iter().map(|m| m.to_string()).collect();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if !done.insert(module) {
            return None;
        }
        path.push(module);
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(graph, module, &mut Vec::new(), &mut done))
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = module_graph();
    assert!(
        graph["worker"].contains("payment") && graph["payment"].contains("token"),
        "the scan finds the known edges: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle between top-level modules: {}",
            cycle.join(" -> ")
        );
    }
}

/// For one folder of `src/` (a room): its files and, for each, the sibling files its
/// code names as `super::<name>` (also inside a `use super::{…}` list).
fn room_graph(dir: &Path) -> Graph {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
    let names: Vec<String> = files
        .iter()
        .map(|p| stem(p))
        .filter(|n| n != "mod")
        .collect();
    files
        .iter()
        .filter(|p| stem(p) != "mod")
        .map(|path| {
            let code = code_of(path);
            let mut used = std::collections::BTreeSet::new();
            for head in named_after(&code, "super::") {
                if names.contains(&head) && head != stem(path) {
                    used.insert(head);
                }
            }
            (stem(path), used)
        })
        .collect()
}

#[test]
fn no_import_cycle_between_the_files_of_a_room() {
    let mut rooms = vec![src()];
    let mut checked = 0;
    while let Some(dir) = rooms.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rooms.push(path);
            }
        }
        if dir == src() {
            continue;
        }
        let graph = room_graph(&dir);
        checked += graph.len();
        if let Some(cycle) = find_cycle(&graph) {
            panic!(
                "import cycle between the files of {}: {}",
                dir.strip_prefix(src()).unwrap().display(),
                cycle.join(" -> ")
            );
        }
    }
    assert!(checked > 40, "the walk found only {checked} files in rooms");
    let worker = room_graph(&src().join("worker"));
    assert!(
        worker["consumer"].contains("member") && worker["member"].contains("commits"),
        "the scan finds the known edges: {worker:?}"
    );
}

/// docs/ARCHITECTURE.md with every run of white space one space, so a phrase is
/// found wherever the text wraps.
fn architecture_doc() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md");
    let text = std::fs::read_to_string(path).unwrap();
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The number written right after `phrase` in `text` (digits, `,` as thousands
/// separator, a decimal point allowed); fails when the phrase is gone, so a figure
/// cannot drop out of the document unnoticed either.
fn number_after(text: &str, phrase: &str) -> f64 {
    let at = text
        .find(phrase)
        .unwrap_or_else(|| panic!("the document no longer says {phrase:?}"));
    let digits: String = text[at + phrase.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '.')
        .filter(|c| *c != ',')
        .collect();
    digits
        .trim_end_matches('.')
        .parse()
        .unwrap_or_else(|_| panic!("no number after {phrase:?}"))
}

/// The integer in the source text of `file` right after `phrase` (for constants
/// the library keeps private).
fn source_number(file: &str, phrase: &str) -> f64 {
    number_after(&std::fs::read_to_string(src().join(file)).unwrap(), phrase)
}

#[test]
fn the_architecture_documents_figures_are_the_codes() {
    use clap::Parser;
    use payment_worker::cli::{Cli, Command};
    let doc = architecture_doc();
    // The defaults as the command line gives them to `run`.
    let Command::Run {
        worker, processor, ..
    } = Cli::try_parse_from(["payment-worker", "run"])
        .unwrap()
        .command
    else {
        unreachable!("`run` parses as Command::Run")
    };
    let max_in_flight = worker.max_in_flight as f64;
    assert_eq!(
        number_after(&doc, "`max_in_flight` (default "),
        max_in_flight
    );
    assert_eq!(number_after(&doc, "6 partitions × "), max_in_flight);
    assert_eq!(
        number_after(&doc, &format!("6 partitions × {max_in_flight} = ")),
        6.0 * max_in_flight
    );
    let budget_min = worker.retry_budget.as_secs_f64() / 60.0;
    assert_eq!(number_after(&doc, "until final or budget ("), budget_min);
    assert_eq!(number_after(&doc, "`--retry-budget` (default "), budget_min);
    let table = &processor.stores.token_table;
    assert_eq!(
        number_after(&doc, "`--token-lease-connections`, default "),
        f64::from(table.lease_connections)
    );
    assert_eq!(
        number_after(&doc, "`--token-purge-interval` ("),
        table.purge_interval.as_secs_f64()
    );
    assert_eq!(
        number_after(&doc, "`--token-purge-batch` ("),
        table.purge_batch as f64
    );
    assert_eq!(
        number_after(&doc, "per statement, at most "),
        payment_worker::startup::PURGE_BATCHES_PER_ROUND as f64,
        "purge statements per round"
    );
    // Figures the library keeps in private constants, read from their source:
    // (what the document says, the file, what the code says, document unit per code unit).
    let constants: [(&str, &str, &str, f64); 7] = [
        (
            "capacity max(max_in_flight, ",
            "worker/member.rs",
            "mpsc::channel(self.max_in_flight.max(1).max(",
            1.0,
        ),
        (
            "poll(",
            "worker/consumer.rs",
            "const POLL_WAIT: Duration = Duration::from_millis(",
            1.0,
        ),
        (
            "a failed commit is retried after ",
            "worker/commits.rs",
            "COMMIT_RETRY_PAUSE: Duration = Duration::from_millis(",
            1.0,
        ),
        (
            " ms, and a ",
            "worker/commits.rs",
            "COMMIT_SWEEP: Duration = Duration::from_secs(",
            1.0,
        ),
        (
            "**Redis calls** time out after ",
            "token/redis/store.rs",
            "DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(",
            1.0,
        ),
        (
            "from librdkafka statistics every ",
            "worker/kafka.rs",
            "\"statistics.interval.ms\", \"",
            1000.0,
        ),
        (
            "`queued.max.messages.kbytes=",
            "worker/kafka.rs",
            "\"queued.max.messages.kbytes\", \"",
            1.0,
        ),
    ];
    for (said, file, code, scale) in constants {
        assert_eq!(
            number_after(&doc, said) * scale,
            source_number(file, code),
            "the document's {said:?} against {file}"
        );
    }
}

/// A file a reader can hold in mind: every product file at most this many lines.
const MAX_FILE_LINES: usize = 600;
/// A function a reader can follow: at most this many lines from `fn` to its end.
const MAX_FUNCTION_LINES: usize = 80;

/// `line` without its string and character literals and its `//` comment: what is
/// left holds the braces that open and close blocks.
fn code_braces(line: &str) -> (usize, usize) {
    let mut opens = 0;
    let mut closes = 0;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                while let Some(s) = chars.next() {
                    match s {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            // A character literal ('{', '\''); a lifetime ('a) has no closing quote
            // two or three characters on.
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if let Some(escaped) = rest.strip_prefix('\\') {
                    if let Some(end) = escaped.find('\'') {
                        for _ in 0..end + 2 {
                            chars.next();
                        }
                    }
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
            }
            '{' => opens += 1,
            '}' => closes += 1,
            _ => {}
        }
    }
    (opens, closes)
}

/// The name and length (lines from `fn` to its closing brace) of every function of
/// `code` outside its `#[cfg(test)]` module.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(fn_at) = words.iter().position(|w| *w == "fn") else {
            at += 1;
            continue;
        };
        let is_item = words[..fn_at].iter().all(|w| {
            w.starts_with("pub") || ["async", "unsafe", "const", "extern", "\"C\""].contains(w)
        });
        if !is_item || line.trim_start().starts_with("//") {
            at += 1;
            continue;
        }
        let name: String = words
            .get(fn_at + 1)
            .map(|w| {
                w.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            })
            .unwrap_or_default();
        let (mut depth, mut opened, mut end) = (0usize, false, at);
        for (offset, body_line) in lines[at..].iter().enumerate() {
            let (opens, closes) = code_braces(body_line);
            if opens > 0 {
                opened = true;
            }
            depth = (depth + opens).saturating_sub(closes);
            end = at + offset;
            if (opened && depth == 0) || (!opened && body_line.trim_end().ends_with(';')) {
                break;
            }
        }
        if opened {
            found.push((name, end - at + 1));
        }
        at = end + 1;
    }
    found
}

#[test]
fn the_function_counter_counts_what_a_reader_reads() {
    let code = "fn a() {\n    let b = '{';\n    let c = \"}\";\n}\n\npub(crate) async fn d<'e>(f: &'e str) -> usize {\n    // }\n    f.len()\n}\n";
    assert_eq!(
        function_lengths(code),
        [("a".to_owned(), 4), ("d".to_owned(), 4)]
    );
}

#[test]
fn no_product_file_or_function_is_longer_than_a_reader_can_follow() {
    let mut long = Vec::new();
    for file in rust_files(&src()) {
        let code = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(src()).unwrap().display().to_string();
        let lines = code.lines().count();
        if lines > MAX_FILE_LINES {
            long.push(format!("{name}: {lines} lines (at most {MAX_FILE_LINES})"));
        }
        for (function, length) in function_lengths(&code) {
            if length > MAX_FUNCTION_LINES {
                long.push(format!(
                    "{name}: fn {function} {length} lines (at most {MAX_FUNCTION_LINES})"
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split them into named parts:\n{}",
        long.join("\n")
    );
}
