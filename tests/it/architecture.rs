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
