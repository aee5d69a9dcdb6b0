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
    if json.len() > MAX_REPORT {
        tracing::debug!(
            rank,
            bytes = json.len(),
            "a remote rank's report is too long; dropped"
        );
        return;
    }
    if let Err(e) = std::fs::write(path_of(dir, rank), json.trim()) {
        tracing::debug!(rank, error = %e, "could not save a remote rank's failure report");
    }
}

/// Rank `rank`'s report in `dir` as written, if there is one (an agent
/// sends it on without knowing the world size).
#[cfg_attr(not(feature = "launcher"), allow(dead_code))] // Used by the launcher.
pub(crate) fn read_raw(dir: &Path, rank: usize) -> Option<String> {
    let text = read_bounded(&path_of(dir, rank))?;
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .map(|v| v.to_string())
}

/// The largest report read: a reason is one error message, and a file
/// another process wrote must not size an allocation unchecked.
pub const MAX_REPORT: usize = 64 << 10;

/// The text of `path`, if it is at most [`MAX_REPORT`] bytes.
fn read_bounded(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_REPORT as u64 + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() <= MAX_REPORT).then_some(text)
}

/// Rank `rank`'s report from its JSON text, in a world of `world` ranks:
/// `None` for anything that is not a report; a culprit outside the world
/// is dropped.
pub fn parse_report(text: &str, rank: usize, world: usize) -> Option<FailureReport> {
    if text.len() > MAX_REPORT {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let culprit = v["culprit"]
        .as_u64()
        .and_then(|c| usize::try_from(c).ok())
        .filter(|&c| c < world);
    Some(FailureReport {
        rank,
        culprit,
        reason: v["reason"].as_str().unwrap_or("").to_string(),
    })
}

/// Every report in `dir`, by rank; files that are not reports are skipped.
pub fn read_reports(dir: &Path, world: usize) -> Vec<FailureReport> {
    (0..world)
        .filter_map(|rank| parse_report(&read_bounded(&path_of(dir, rank))?, rank, world))
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

    use proptest::prelude::*;

    /// A valid report's JSON, to mutate.
    fn valid(culprit: Option<u64>, reason: &str) -> Vec<u8> {
        serde_json::json!({ "rank": 1, "culprit": culprit, "reason": reason })
            .to_string()
            .into_bytes()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Arbitrary bytes are a report or nothing, never a panic, and a
        /// culprit is always inside the world.
        #[test]
        fn any_bytes_parse_to_a_report_in_the_world_or_none(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            world in 1usize..16,
        ) {
            let text = String::from_utf8_lossy(&bytes);
            if let Some(r) = parse_report(&text, 0, world) {
                prop_assert!(r.culprit.is_none_or(|c| c < world));
            }
        }

        /// Valid reports with bytes flipped, cut or inserted; and whatever
        /// parses, the blame over them ends and names a culprit someone named.
        #[test]
        fn mutated_reports_never_panic_and_blame_ends(
            culprits in proptest::collection::vec(proptest::option::of(any::<u64>()), 1..8),
            edits in crate::mutation::edits(0..6),
            world in 1usize..8,
        ) {
            let mut reports = Vec::new();
            for (rank, c) in culprits.iter().enumerate() {
                let mut b = valid(c.map(|c| c % 10), "peer gone");
                crate::mutation::apply(&mut b, &edits);
                if let Some(r) = parse_report(&String::from_utf8_lossy(&b), rank, world) {
                    reports.push(r);
                }
            }
            if let Some((rank, by)) = most_blamed(&reports) {
                prop_assert!(rank < world);
                prop_assert!(!by.is_empty());
            }
        }
    }

    #[test]
    fn a_report_longer_than_the_bound_is_not_read() {
        let long = String::from_utf8(valid(Some(1), &"x".repeat(MAX_REPORT))).unwrap();
        assert!(parse_report(&long, 0, 4).is_none());
        let dir = std::env::temp_dir().join(format!("mlx-report-long-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(path_of(&dir, 0), &long).unwrap();
        assert!(read_reports(&dir, 4).is_empty());
        assert!(read_raw(&dir, 0).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
