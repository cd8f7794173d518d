//! The variables cargo sets for the one package it builds, runs or tests
//! (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, `OUT_DIR`, …). A process cargo started
//! that runs cargo again must not pass them on: build scripts that watch them (ring's
//! watches `CARGO_MANIFEST_DIR`) would see them change and rebuild, and cargo sets
//! the right values for every crate it builds itself. Used by `cargo xtask test` and,
//! through `#[path]`, by the tests' own cargo runs (`tests/it/support/target_seed.rs`).

/// Whether `name` is one of the variables cargo sets for a single package.
pub fn set_for_one_package(name: &str) -> bool {
    name == "OUT_DIR"
        || ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_BIN_"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .contains(&name)
}
