//! How a rank tells the launcher whom it blames, and how long it needs to
//! stop.
//!
//! A rank that loses a peer exits with an error of its own, often before the
//! launcher even sees the peer go (a frozen rank never exits by itself), so
//! exit statuses alone cannot name the rank at fault. When the launcher sets
//! [`ENV_REPORT_DIR`], the first failure of a rank's group is also written
//! there as `rank-<r>.json` (`{"rank": r, "culprit": c or null, "reason": "..."}`),
//! and the launcher names the rank that the reports blame.
//!
//! In the same folder a training loop says how long it needs to stop
//! cleanly ([`step_took`], [`checkpoint_took`]: its last step plus its last
//! checkpoint, as `stop-<pid>.json`), so that on Ctrl-C or SIGTERM the
//! launcher waits that long before SIGKILL (see `mlx-launch --grace`).
//!
//! The folder is private to the job's user: created atomically with mode
//! 0700 and checked ([`new_private_dir`]); files are written there without
//! following links ([`write_file`]) and read back without following them.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

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

/// `n` random bytes as lowercase hex.
fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("the operating system's random source failed");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Creates the folder `path` atomically (an existing folder or link is an
/// error, never taken over) with mode 0700, and checks it
/// ([`check_private_dir`]).
pub fn create_private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o700).create(path)?;
    check_private_dir(path)
}

/// Checks that `path` is a folder, not a link, owned by this user, that no
/// other user may enter or write (mode `0o077` bits clear).
pub fn check_private_dir(path: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(path)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.file_type().is_dir() || m.uid() != me || m.mode() & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private folder of this user: expected a folder of uid {me} with mode 0700, found a {} of uid {} with mode {:o}",
                path.display(),
                if m.file_type().is_symlink() {
                    "link"
                } else if m.file_type().is_dir() {
                    "folder"
                } else {
                    "file"
                },
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// A new private folder `parent/<prefix><16 random hex digits>` (see
/// [`create_private_dir`]): nobody can guess its name in advance, and a
/// folder someone else made is never used.
pub fn new_private_dir(parent: &Path, prefix: &str) -> std::io::Result<PathBuf> {
    let mut last = None;
    for _ in 0..8 {
        let p = parent.join(format!("{prefix}{}", random_hex(8)));
        match create_private_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("the loop ran"))
}

/// Writes `bytes` as `dir/name` without following a link: into a new file
/// of a random name (created exclusively, never through a link, mode
/// 0600), then renamed over `name` (a rename replaces a link at `name`; it
/// does not write through it).
pub fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.{}.tmp", random_hex(8)));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = f
        .write_all(bytes)
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Writes this rank's report when the launcher asked for one (best effort:
/// a report that cannot be written only costs the launcher its blame).
pub(crate) fn failure(rank: usize, culprit: Option<u32>, reason: &str) {
    let Some(dir) = std::env::var_os(ENV_REPORT_DIR) else {
        return;
    };
    if let Err(e) = write_failure(Path::new(&dir), rank, culprit, reason) {
        tracing::debug!(rank, error = %e, "could not write the failure report");
    }
}

/// Writes rank `rank`'s report in `dir` (see [`write_file`]).
fn write_failure(
    dir: &Path,
    rank: usize,
    culprit: Option<u32>,
    reason: &str,
) -> std::io::Result<()> {
    let json = serde_json::json!({ "rank": rank, "culprit": culprit, "reason": reason });
    write_file(
        dir,
        &format!("rank-{rank}.json"),
        json.to_string().as_bytes(),
    )
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
    if let Err(e) = write_file(dir, &format!("rank-{rank}.json"), json.trim().as_bytes()) {
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

/// The text of `path`, if it is a regular file (a link is not followed)
/// of at most [`MAX_REPORT`] bytes.
fn read_bounded(path: &Path) -> Option<String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        // Not through a link; a FIFO does not block the open.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(MAX_REPORT as u64 + 1)
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

/// How long this process needs to stop cleanly, as [`step_took`] and
/// [`checkpoint_took`] learn it.
struct StopTime {
    /// The last step, without the checkpoints written during it.
    step: Duration,
    /// The last checkpoint.
    checkpoint: Duration,
    /// Checkpoints reported since the last step was.
    checkpoints_in_step: Duration,
    /// What the file says now.
    written: Option<Duration>,
}

static STOP_TIME: Mutex<StopTime> = Mutex::new(StopTime {
    step: Duration::ZERO,
    checkpoint: Duration::ZERO,
    checkpoints_in_step: Duration::ZERO,
    written: None,
});

/// Tells the launcher how long this process's last step took (call it
/// after each step of a training loop; a checkpoint reported during the
/// step is not counted twice). With [`checkpoint_took`] it sizes the time
/// the launcher gives the ranks to stop on Ctrl-C or SIGTERM: the last
/// step plus the last checkpoint. Costs nothing without a launcher
/// ([`ENV_REPORT_DIR`] unset), and a file write only when the time changed
/// by a tenth.
pub fn step_took(d: Duration) {
    let mut t = STOP_TIME.lock().unwrap_or_else(|p| p.into_inner());
    t.step = d.saturating_sub(t.checkpoints_in_step);
    t.checkpoints_in_step = Duration::ZERO;
    publish(&mut t);
}

/// Tells the launcher how long this process's last checkpoint took (call
/// it after each checkpoint); see [`step_took`].
pub fn checkpoint_took(d: Duration) {
    let mut t = STOP_TIME.lock().unwrap_or_else(|p| p.into_inner());
    t.checkpoint = d;
    t.checkpoints_in_step = t.checkpoints_in_step.saturating_add(d);
    publish(&mut t);
}

/// Writes `stop-<pid>.json` in the launcher's folder when the stop time
/// changed by more than a tenth since it was last written.
fn publish(t: &mut StopTime) {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let Some(dir) = DIR.get_or_init(|| std::env::var_os(ENV_REPORT_DIR).map(PathBuf::from)) else {
        return;
    };
    let need = t.step.saturating_add(t.checkpoint);
    let changed = t.written.is_none_or(|w| need.abs_diff(w) * 10 > w);
    if !changed {
        return;
    }
    let json = serde_json::json!({
        "step_ms": t.step.as_millis() as u64,
        "checkpoint_ms": t.checkpoint.as_millis() as u64,
    });
    let name = format!("stop-{}.json", std::process::id());
    match write_file(dir, &name, json.to_string().as_bytes()) {
        Ok(()) => t.written = Some(need),
        Err(e) => tracing::debug!(error = %e, "could not tell the launcher the stop time"),
    }
}

/// The stop time in a `stop-<pid>.json` text: its step plus its checkpoint.
pub fn parse_stop_time(text: &str) -> Option<Duration> {
    if text.len() > MAX_REPORT {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let ms = |k: &str| v[k].as_u64().map(Duration::from_millis);
    Some(ms("step_ms")?.saturating_add(ms("checkpoint_ms").unwrap_or(Duration::ZERO)))
}

/// The most files `stop_time` reads in one folder.
const MAX_STOP_FILES: usize = 4096;

/// The longest stop time the processes reported in `dir` ([`step_took`],
/// [`checkpoint_took`]), with the text of its file; `None` when none did.
pub fn stop_time(dir: &Path) -> Option<(Duration, String)> {
    let mut best: Option<(Duration, String)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten().take(MAX_STOP_FILES) {
        let name = e.file_name();
        let ours = name
            .to_str()
            .and_then(|n| n.strip_prefix("stop-"))
            .and_then(|n| n.strip_suffix(".json"))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        if !ours {
            continue;
        }
        let Some(text) = read_bounded(&e.path()) else {
            continue;
        };
        if let Some(d) = parse_stop_time(&text)
            && best.as_ref().is_none_or(|(b, _)| d > *b)
        {
            best = Some((d, text));
        }
    }
    best
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

    /// A folder for one test, removed by the caller.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mlx-report-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Links planted in the report folder, at the names a report was
    /// written through (`.rank-0.json.tmp`) and at the report's own name,
    /// make no write go through them: the files they point at keep their
    /// text, and the report is written; a report that is a link is not
    /// read back.
    #[test]
    fn reports_are_written_and_read_without_following_links() {
        let dir = scratch("links");
        let victim = dir.join("victim");
        let victim2 = dir.join("victim2");
        std::fs::write(&victim, "precious").unwrap();
        std::fs::write(&victim2, "precious too").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(".rank-0.json.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim2, path_of(&dir, 0)).unwrap();
        write_failure(&dir, 0, Some(1), "peer gone").unwrap();
        save(&dir, 2, r#"{"rank":2,"culprit":1,"reason":"r"}"#);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&victim2).unwrap(), "precious too");
        let reports = read_reports(&dir, 3);
        assert_eq!(reports.len(), 2, "{reports:?}");
        assert_eq!(reports[0].culprit, Some(1));
        assert_eq!(reports[0].reason, "peer gone");
        // A report that is a link to a report-like file is not read.
        let elsewhere = dir.join("elsewhere.json");
        std::fs::write(&elsewhere, r#"{"rank":1,"culprit":0,"reason":"forged"}"#).unwrap();
        std::os::unix::fs::symlink(&elsewhere, path_of(&dir, 1)).unwrap();
        assert!(read_reports(&dir, 3).iter().all(|r| r.rank != 1));
        assert!(read_raw(&dir, 1).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A private folder is new (an existing folder or a link at its name is
    /// refused), mode 0700, and its name cannot be guessed.
    #[test]
    fn private_folders_are_new_and_closed_to_others() {
        let dir = scratch("private");
        let taken = dir.join("taken");
        std::fs::create_dir(&taken).unwrap();
        let e = create_private_dir(&taken).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        std::os::unix::fs::symlink(&taken, dir.join("link")).unwrap();
        assert!(create_private_dir(&dir.join("link")).is_err());
        assert!(check_private_dir(&dir.join("link")).is_err(), "a link");
        std::fs::set_permissions(&taken, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert!(check_private_dir(&taken).is_err(), "mode 0755");
        let a = new_private_dir(&dir, "job-").unwrap();
        let b = new_private_dir(&dir, "job-").unwrap();
        assert_ne!(a, b);
        let m = std::fs::symlink_metadata(&a).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The stop time is the longest a process reported (its step plus its
    /// checkpoint); other files and links are not read.
    #[test]
    fn the_stop_time_is_the_longest_reported() {
        let dir = scratch("stop");
        assert!(stop_time(&dir).is_none());
        std::fs::write(
            dir.join("stop-10.json"),
            r#"{"step_ms":200,"checkpoint_ms":9000}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("stop-11.json"),
            r#"{"step_ms":300,"checkpoint_ms":100}"#,
        )
        .unwrap();
        std::fs::write(dir.join("stop-x.json"), r#"{"step_ms":99999}"#).unwrap();
        std::fs::write(dir.join("elsewhere"), r#"{"step_ms":99999}"#).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("stop-12.json")).unwrap();
        let (d, _) = stop_time(&dir).unwrap();
        assert_eq!(d, Duration::from_millis(9200));
        assert_eq!(parse_stop_time("{}"), None);
        assert_eq!(
            parse_stop_time(r#"{"step_ms":5}"#),
            Some(Duration::from_millis(5))
        );
        std::fs::remove_dir_all(&dir).unwrap();
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
