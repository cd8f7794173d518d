//! A second target directory that starts with the dependencies the checkout's own
//! `target/debug` already built, so a build there compiles only this crate. Shared
//! by the Lua/SQL mutation check (`tests/mutants.rs`, its scratch copy's target) and
//! the product-build check (`cli::product_build`), which must not replace the
//! binaries the other tests run.
#![allow(dead_code)]

use std::fs;
use std::path::Path;
use std::process::Command;

// The one list of cargo's per-package variables, shared with `cargo xtask test`.
#[path = "../../../xtask/src/package_variables.rs"]
mod package_variables;

/// Seeds `own` (a target directory) once with what `shared`'s `debug` profile built,
/// leaving out this crate's own artifacts; cargo then finds every dependency fresh.
pub fn seed_target(shared: &Path, own: &Path) {
    let profile = own.join("debug");
    if profile.join("deps").exists() {
        return;
    }
    let ours = |name: &str| {
        name.contains("payment_worker")
            || name.contains("payment-worker")
            || name.starts_with("it-")
            || name.starts_with("mutants-")
    };
    for dir in ["build", ".fingerprint", "deps"] {
        copy_tree(&shared.join("debug").join(dir), &profile.join(dir), &ours);
    }
}

/// Links every file of `from` into `to` (copies them, keeping their modification
/// times, which cargo compares, where a link cannot be made), leaving out entries
/// whose name `skip` matches. Links, because the dependencies take some 3 GB: cargo
/// never rewrites a fresh dependency's files, and a rebuilt one gets files of its own.
fn copy_tree(from: &Path, to: &Path, skip: &dyn Fn(&str) -> bool) {
    if !from.exists() {
        return;
    }
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if skip(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let (source, dest) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            copy_tree(&source, &dest, skip);
        } else if kind.is_file() {
            if fs::hard_link(&source, &dest).is_ok() {
                continue;
            }
            fs::copy(&source, &dest).unwrap();
            let modified = entry.metadata().unwrap().modified().unwrap();
            fs::File::options()
                .write(true)
                .open(&dest)
                .unwrap()
                .set_modified(modified)
                .unwrap();
        }
    }
    let modified = fs::metadata(from).unwrap().modified().unwrap();
    let _ = fs::File::open(to).and_then(|dir| dir.set_modified(modified));
}

/// `cargo <args>` in `dir`, building into `target_dir`, without the variables cargo
/// gave this test process.
pub fn cargo(dir: &Path, target_dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // Cargo gives this test process the package's variables (CARGO_MANIFEST_DIR,
    // CARGO_PKG_*, ...). Build scripts such as ring's rerun when those change, so
    // passing them on would rebuild ring and its dependents here, and again in the
    // worktree afterwards.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        // And those cargo sets for a test process: the cargo that ran it (the one
        // to run is chosen above) and its scratch directory.
        let injected = package_variables::set_for_one_package(&name)
            || name == "CARGO"
            || name == "CARGO_TARGET_TMPDIR";
        if injected {
            command.env_remove(name.as_ref());
        }
    }
    command
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir)
        .env("RUST_BACKTRACE", "0");
    command
}
