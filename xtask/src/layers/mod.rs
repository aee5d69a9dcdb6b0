//! `cargo xtask layers`: every workspace crate's modules checked against the
//! layering table, `layers.toml` at the workspace root (issue 60).
//!
//! Each crate's `src/` (but `src/bin/`) is parsed with `syn`
//! ([`source`]); every path that may name something of the crate is
//! resolved to the module that holds it ([`check::Resolver`]): `use
//! crate::…`, grouped `use crate::{a::b, c}`, `super::super::…`, `self::…`,
//! `$crate::…`, paths in expressions, types, patterns, attributes and macro
//! arguments, names bound by a `use` (in function bodies too), a child
//! module named bare, files mounted by `#[path]` (`backend/no_gpu.rs` is
//! `backend::gpu`), and `use` re-exports of every module, the root's
//! included (`crate::blas` is `backend::cpu::matmul::blas`). A reference is
//! held to the rules both as written (unless that is the crate root passing
//! a re-export on) and where the `use`s lead it. Comments and string
//! literals are never paths. The module graph's circles are its strongly
//! connected components (a reference counts for the module that defines
//! the name, so a child going through its parent's re-export is no circle).
//! See `layers.toml` for what each crate's table holds ([`table`]).

mod check;
mod source;
mod table;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub use check::Violation;

/// `cargo xtask layers`.
#[derive(clap::Args, Default)]
pub struct Args {
    /// The workspace to check (its `Cargo.toml` and `layers.toml`); this
    /// one by default.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Instead of checking, list the import circles of this crate (allowed
    /// or not) with every edge inside them and where it is.
    #[arg(long, value_name = "CRATE")]
    circles: Option<String>,
}

/// Checks every workspace member and prints what breaks the table.
pub fn run(a: Args) -> Result<()> {
    let root = a.root.unwrap_or_else(crate::util::root);
    if let Some(member) = a.circles {
        let text = std::fs::read_to_string(root.join("layers.toml"))?;
        let tests = table::parse(&text)?
            .get(&member)
            .is_some_and(|r| r.check_tests);
        let krate = source::read(&root.join(&member).join("src"), tests)?;
        for line in check::circle_edges(&krate, &format!("{member}/src/")) {
            println!("{line}");
        }
        return Ok(());
    }
    let found = check_workspace(&root)?;
    for v in &found {
        println!("{v}");
    }
    if !found.is_empty() {
        bail!(
            "{} violation(s) of the layering table (layers.toml)",
            found.len()
        );
    }
    println!("xtask layers: every crate keeps its layers (layers.toml)");
    Ok(())
}

/// The workspace's members, as the root `Cargo.toml` lists them.
fn members(root: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let manifest: toml::Table = toml::from_str(&text)?;
    let members = manifest
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .context("Cargo.toml has no [workspace] members")?;
    members
        .iter()
        .map(|m| {
            m.as_str()
                .map(String::from)
                .context("a member is not a string")
        })
        .collect()
}

/// Every violation of `layers.toml` in the workspace at `root`.
pub fn check_workspace(root: &Path) -> Result<Vec<Violation>> {
    let text = std::fs::read_to_string(root.join("layers.toml")).context("reading layers.toml")?;
    let table = table::parse(&text).context("reading layers.toml")?;
    let members = members(root)?;
    let mut found = Vec::new();
    for name in table.keys() {
        if !members.contains(name) {
            found.push(Violation {
                file: "layers.toml".into(),
                line: 0,
                what: format!("[{name}] is not a workspace member"),
            });
        }
    }
    for member in &members {
        let Some(rules) = table.get(member) else {
            found.push(Violation {
                file: "layers.toml".into(),
                line: 0,
                what: format!("the workspace member {member} has no table: add [{member}]"),
            });
            continue;
        };
        let krate = source::read(&root.join(member).join("src"), rules.check_tests)?;
        // What is wrong with the table itself is told at its section.
        let header = format!("[{member}]");
        let line = text
            .lines()
            .position(|l| l.trim() == header)
            .map_or(0, |i| i + 1);
        found.extend(
            check::check(&krate, rules, &format!("{member}/src/"))
                .into_iter()
                .map(|v| {
                    if v.file == "layers.toml" {
                        Violation { line, ..v }
                    } else {
                        v
                    }
                }),
        );
    }
    Ok(found)
}
