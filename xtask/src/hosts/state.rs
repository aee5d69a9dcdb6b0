//! The state folder and its `state.json` ([`State`]), from which `down`,
//! `shape` and `status` find the hosts again.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::util::root;

use super::exec::write;
use super::layout::Layout;
use super::rate::{Rate, parse_rate};

/// The state folder: `target/mlx-hosts` in the workspace root.
pub fn state_dir() -> PathBuf {
    root().join("target").join("mlx-hosts")
}

/// What `state.json` records: enough to rebuild
/// [`Hosts`](super::running::Hosts) and to find
/// everything again for `down` and `shape`.
pub(super) struct State {
    pub(super) layout: Layout,
    pub(super) rate: Option<Rate>,
    pub(super) dir: PathBuf,
}

impl State {
    /// The state folder's `state.json`, if hosts are up.
    pub(super) fn load() -> Result<Option<State>> {
        let dir = state_dir();
        let path = dir.join("state.json");
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let parse = || -> Option<(String, usize, Option<String>)> {
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            let prefix = v.get("prefix")?.as_str()?.to_string();
            let n = usize::try_from(v.get("n")?.as_u64()?).ok()?;
            let rate = v.get("rate").and_then(|r| r.as_str()).map(String::from);
            Some((prefix, n, rate))
        };
        let (prefix, n, rate) = parse().with_context(|| {
            format!(
                "{} is damaged: run `cargo xtask hosts down`",
                path.display()
            )
        })?;
        let layout = Layout::new(&prefix, n)?;
        let rate = match rate {
            Some(r) => parse_rate(&r).map_err(anyhow::Error::msg)?,
            None => None,
        };
        Ok(Some(State { layout, rate, dir }))
    }

    /// Writes `state.json`.
    pub(super) fn save(&self) -> Result<()> {
        let v = serde_json::json!({
            "prefix": self.layout.prefix,
            "n": self.layout.n,
            "rate": self.rate.as_ref().map(|r| r.text.clone()),
        });
        write(&self.dir.join("state.json"), &format!("{v:#}\n"))
    }
}
