//! How a failing rank tells the launcher whom it blames.
//!
//! A rank that loses a peer exits with an error of its own, often before the
//! launcher even sees the peer go (a frozen rank never exits by itself), so
//! exit statuses alone cannot name the rank at fault. When the launcher sets
//! [`ENV_REPORT_DIR`], the first failure of a rank's group is also written
//! there as `rank-<r>.json` (`{"rank": r, "culprit": c or null, "reason": "..."}`),
//! and the launcher names the rank that the reports blame.

use std::path::{Path, PathBuf};

/// Environment variable: the folder where ranks write their failure reports.
pub const ENV_REPORT_DIR: &str = "MLX_LAUNCH_REPORT_DIR";

/// What one rank reported about its group's first failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureReport {
    /// The reporting rank.
    pub rank: usize,
    /// The rank it blames, if it knows one.
    pub culprit: Option<usize>,
    /// The error it saw.
    pub reason: String,
}

fn path_of(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}.json"))
}

/// Writes this rank's report when the launcher asked for one (best effort:
/// a report that cannot be written only costs the launcher its blame).
pub(crate) fn failure(rank: usize, culprit: Option<u32>, reason: &str) {
    let Some(dir) = std::env::var_os(ENV_REPORT_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let json = serde_json::json!({ "rank": rank, "culprit": culprit, "reason": reason });
    let tmp = dir.join(format!(".rank-{rank}.json.tmp"));
    let written = std::fs::write(&tmp, json.to_string())
        .and_then(|()| std::fs::rename(&tmp, path_of(&dir, rank)));
    if let Err(e) = written {
        tracing::debug!(rank, error = %e, "could not write the failure report");
    }
}

/// Saves rank `rank`'s report, received as JSON text (a remote rank's,
/// carried back by its agent: remote hosts need not share the launcher's
/// file system).
#[cfg_attr(not(feature = "launcher"), allow(dead_code))] // Used by the launcher.
pub(crate) fn save(dir: &Path, rank: usize, json: &str) {
    if let Err(e) = std::fs::write(path_of(dir, rank), json.trim()) {
        tracing::debug!(rank, error = %e, "could not save a remote rank's failure report");
    }
}

/// Rank `rank`'s report in `dir` as written, if there is one (an agent
/// sends it on without knowing the world size).
#[cfg_attr(not(feature = "launcher"), allow(dead_code))] // Used by the launcher.
pub(crate) fn read_raw(dir: &Path, rank: usize) -> Option<String> {
    let text = std::fs::read_to_string(path_of(dir, rank)).ok()?;
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .map(|v| v.to_string())
}

/// Every report in `dir`, by rank; files that are not reports are skipped.
pub fn read_reports(dir: &Path, world: usize) -> Vec<FailureReport> {
    (0..world)
        .filter_map(|rank| {
            let text = std::fs::read_to_string(path_of(dir, rank)).ok()?;
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            let culprit = v["culprit"]
                .as_u64()
                .map(|c| c as usize)
                .filter(|&c| c < world);
            Some(FailureReport {
                rank,
                culprit,
                reason: v["reason"].as_str().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// The rank most reports blame (ties: the lowest rank), with the reports
/// that blame it.
pub fn most_blamed(reports: &[FailureReport]) -> Option<(usize, Vec<&FailureReport>)> {
    let mut counts = std::collections::BTreeMap::<usize, Vec<&FailureReport>>::new();
    for r in reports {
        if let Some(c) = r.culprit {
            counts.entry(c).or_default().push(r);
        }
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(&a.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_the_most_blamed_rank_wins() {
        let dir = std::env::temp_dir().join(format!("mlx-report-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |rank: usize, culprit: Option<usize>| {
            let j = serde_json::json!({ "rank": rank, "culprit": culprit, "reason": format!("r{rank}") });
            std::fs::write(path_of(&dir, rank), j.to_string()).unwrap();
        };
        write(0, Some(2));
        write(1, Some(2));
        write(3, Some(0));
        std::fs::write(path_of(&dir, 4), "not json").unwrap();
        let reports = read_reports(&dir, 5);
        assert_eq!(reports.len(), 3);
        assert_eq!(reports[2].reason, "r3");
        let (c, by) = most_blamed(&reports).unwrap();
        assert_eq!((c, by.len()), (2, 2));
        // A culprit outside the world is ignored.
        write(0, Some(99));
        assert_eq!(read_reports(&dir, 5)[0].culprit, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
