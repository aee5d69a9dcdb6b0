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
/// that blame it, those naming it directly first. A blamed rank that filed
/// a report itself failed because of the rank it names, so the blame
/// passes on along such chains (rank 3 sees rank 1 die and exits; ranks 0
/// and 2 see rank 3 go: rank 1 is the cause); a cycle keeps the rank first
/// named.
pub fn most_blamed(reports: &[FailureReport]) -> Option<(usize, Vec<&FailureReport>)> {
    let named = |rank: usize| {
        reports
            .iter()
            .find(|r| r.rank == rank)
            .and_then(|r| r.culprit)
            .filter(|&c| c != rank)
    };
    let cause = |first: usize| {
        let mut seen = vec![first];
        let mut at = first;
        while let Some(next) = named(at) {
            if seen.contains(&next) {
                return first;
            }
            seen.push(next);
            at = next;
        }
        at
    };
    let mut counts = std::collections::BTreeMap::<usize, Vec<&FailureReport>>::new();
    for r in reports {
        if let Some(c) = r.culprit {
            counts.entry(cause(c)).or_default().push(r);
        }
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(&a.0)))
        .map(|(rank, mut by)| {
            by.sort_by_key(|r| r.culprit != Some(rank));
            (rank, by)
        })
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
        // Rank 3 blames rank 0, which itself blamed rank 2.
        assert_eq!((c, by.len()), (2, 3));
        // Rank 3 blames rank 1; ranks 0 and 2 blame rank 3: rank 1 is the
        // cause, and rank 3's report, which names it, comes first.
        write(0, Some(3));
        write(1, None);
        write(2, Some(3));
        write(3, Some(1));
        let reports = read_reports(&dir, 5);
        let (c, by) = most_blamed(&reports).unwrap();
        let by: Vec<usize> = by.iter().map(|r| r.rank).collect();
        assert_eq!((c, by), (1, vec![3, 0, 2]));
        // Two ranks blaming each other: each keeps its own culprit.
        write(0, Some(1));
        write(1, Some(0));
        write(2, Some(1));
        std::fs::remove_file(path_of(&dir, 3)).unwrap();
        assert_eq!(most_blamed(&read_reports(&dir, 5)).unwrap().0, 1);
        // A culprit outside the world is ignored.
        write(0, Some(99));
        assert_eq!(read_reports(&dir, 5)[0].culprit, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
