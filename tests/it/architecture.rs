//! The layout docs/ARCHITECTURE.md draws holds in the source: the product never
//! uses the development tools.

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

#[test]
fn no_product_file_uses_the_development_tools() {
    let src = src();
    let tools = src.join("devtools");
    // The command line dispatches to both sides; `main.rs` and `lib.rs` only name modules.
    let edges = [src.join("cli.rs"), src.join("main.rs"), src.join("lib.rs")];
    let product: Vec<PathBuf> = rust_files(&src)
        .into_iter()
        .filter(|p| !p.starts_with(&tools) && !edges.contains(p))
        .collect();
    assert!(product.len() > 30, "the walk found only {product:?}");
    let offenders: Vec<String> = product
        .iter()
        .filter(|p| code_of(p).contains("devtools"))
        .map(|p| p.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "product files that use src/devtools/ (the tools may use the product, never the other way): {offenders:?}"
    );
}

/// The library's top-level modules (`src/<name>.rs` or `src/<name>/`) and, for
/// each, the others its code names as `crate::<name>` (also inside a
/// `use crate::{…}` list).
fn module_graph() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
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
                for (at, _) in code.match_indices("crate::") {
                    let rest = &code[at + "crate::".len()..];
                    // `crate::{a, b::c}` names every item of the list, `crate::a::…` one.
                    let list = match rest.strip_prefix('{') {
                        Some(list) => &list[..list.find('}').unwrap_or(list.len())],
                        None => &rest[..rest.find("::").unwrap_or(rest.len())],
                    };
                    for item in list.split(',') {
                        let head: String = item
                            .trim()
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if names.contains(&head) && &head != module {
                            used.insert(head);
                        }
                    }
                }
            }
            (module.clone(), used)
        })
        .collect()
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = module_graph();
    assert!(
        graph["worker"].contains("payment") && graph["payment"].contains("token"),
        "the scan finds the known edges: {graph:?}"
    );
    // Depth-first search for a back edge: a module reached again while on the path.
    fn visit<'a>(
        graph: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
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
        for next in &graph[module] {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::BTreeSet::new();
    for module in graph.keys() {
        let cycle = visit(&graph, module, &mut Vec::new(), &mut done);
        assert!(
            cycle.is_none(),
            "import cycle between top-level modules: {}",
            cycle.unwrap().join(" -> ")
        );
    }
}
