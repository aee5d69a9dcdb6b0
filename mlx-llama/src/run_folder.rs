//! A run folder's rules: one run at a time (an exclusive lock held for the
//! life of the run), what a new, a fresh and a resumed run may find in it
//! (Hugging Face Trainer's behaviour: refuse to mix runs, say what to pass),
//! the options each run was started with, and metrics that never repeat a
//! step.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlx_dist::Group;

/// The lock file of a run folder.
pub const LOCK: &str = "run.lock";

/// The largest lock file read back to say who holds it.
const MAX_LOCK_BYTES: u64 = 4096;

/// The exclusive lock on a run folder, held until dropped (or the process
/// ends, however it ends: the lock is the operating system's, `flock` on
/// Unix, not the file's existence). The file says who holds it.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    /// The lock file.
    pub path: PathBuf,
}

/// This host's name (empty when it cannot be read).
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// Takes the exclusive lock of run folder `out` (created if missing) and
/// writes into it who holds it (pid, host, start time). When another run
/// holds it, the error says who, from the lock file.
pub fn lock(out: &Path) -> Result<RunLock> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join(LOCK);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = Vec::new();
            let _ = (&file).take(MAX_LOCK_BYTES).read_to_end(&mut holder);
            let holder = describe_holder(&String::from_utf8_lossy(&holder));
            bail!(
                "{} is in use by another run ({holder}): two runs in one folder would mix their checkpoints and metrics; wait for it to end, or pass another --out",
                out.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    let me = format!(
        "pid = {}\nhost = {:?}\nstarted_unix = {}\n",
        std::process::id(),
        hostname(),
        unix_secs()
    );
    file.set_len(0)
        .and_then(|()| file.write_all(me.as_bytes()))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(RunLock { _file: file, path })
}

/// "pid P on host H, started N s ago" from a lock file's text (whatever
/// it holds: it is only shown).
fn describe_holder(text: &str) -> String {
    let field = |k: &str| {
        text.lines()
            .filter_map(|l| l.split_once('='))
            .find(|(key, _)| key.trim() == k)
            .map(|(_, v)| v.trim().trim_matches('"').to_string())
    };
    let (Some(pid), Some(host)) = (field("pid"), field("host")) else {
        return "its lock file does not say which".into();
    };
    let ago = field("started_unix")
        .and_then(|s| s.parse::<u64>().ok())
        .map(|t| format!(", started {} s ago", unix_secs().saturating_sub(t)))
        .unwrap_or_default();
    format!("pid {pid} on host {host}{ago}")
}

/// How the command line asked to use the run folder.
#[derive(Clone, Copy, Debug, Default)]
pub struct Intent {
    /// `--resume`: continue from the newest checkpoint.
    pub resume: bool,
    /// `--fresh`: delete an earlier run's checkpoints and metrics.
    pub fresh: bool,
    /// A job that `mlx-launch --max-restarts` started again: resumes from
    /// the newest checkpoint when there is one, else starts over.
    pub restarted: bool,
}

/// Whether `out` holds a checkpoint (complete or not: `latest` or a step folder).
fn has_checkpoint(out: &Path) -> Result<bool> {
    Ok(
        out.join("checkpoints").join("latest").exists()
            || !crate::checkpoint::list(out)?.is_empty(),
    )
}

/// What an earlier run left that a new run would mix with.
fn has_metrics(out: &Path) -> bool {
    std::fs::metadata(out.join("metrics.jsonl")).is_ok_and(|m| m.len() > 0)
}

/// Rank 0's checks of the run folder before a run, with the deletions of
/// `--fresh`: an error says what the folder holds and what to pass.
fn check(out: &Path, intent: Intent) -> Result<()> {
    let checkpointed = has_checkpoint(out)?;
    if intent.fresh && !intent.restarted {
        for f in ["metrics.jsonl", "metrics.csv", "loss.png"] {
            let p = out.join(f);
            if p.exists() {
                std::fs::remove_file(&p).with_context(|| format!("deleting {}", p.display()))?;
            }
        }
        let c = out.join("checkpoints");
        if c.exists() {
            std::fs::remove_dir_all(&c).with_context(|| format!("deleting {}", c.display()))?;
        }
        return Ok(());
    }
    if intent.restarted {
        return Ok(());
    }
    if intent.resume {
        if !checkpointed {
            bail!(
                "--resume: {} holds no checkpoint to resume from{}: pass --fresh to start over in it, or another --out",
                out.display(),
                if has_metrics(out) {
                    " (its metrics.jsonl is of a run that stopped before its first checkpoint)"
                } else {
                    ""
                }
            );
        }
        return Ok(());
    }
    if checkpointed {
        bail!(
            "{} already holds checkpoints of an earlier run: pass --resume to continue it, --fresh to delete them and start over, or a new --out",
            out.display()
        );
    }
    if has_metrics(out) {
        bail!(
            "{} already holds the metrics.jsonl of an earlier run that left no checkpoint (it crashed or was killed before its first one): pass --fresh to delete it and start over, or a new --out",
            out.display()
        );
    }
    Ok(())
}

/// `--resume` of a folder that does not exist is an error (checked before
/// the lock creates it).
fn exists_to_resume(out: &Path, intent: Intent) -> Result<()> {
    if intent.resume && !intent.restarted && !out.is_dir() {
        bail!(
            "--resume: {} does not exist, so there is no run to resume: check --out, or leave out --resume to start a new run",
            out.display()
        );
    }
    Ok(())
}

/// Makes run folder `out` ready for a run as `intent` asks, on every rank
/// of `group` (rank 0 does the work; every rank returns its verdict): rank
/// 0 takes the folder's lock ([`lock`]) and checks what the folder holds
/// (see [`Intent`]). Returns the lock on rank 0: keep it for the run.
pub fn prepare(out: &Path, intent: Intent, group: &Group) -> Result<Option<RunLock>> {
    let mine = if group.rank() == 0 {
        exists_to_resume(out, intent)
            .and_then(|()| lock(out))
            .and_then(|l| check(out, intent).map(|()| Some(l)))
    } else {
        Ok(None)
    };
    // Every rank takes part before any returns an error.
    let mut failed = [i64::from(mine.is_err())];
    group.all_sum(&mut failed)?;
    if failed[0] > 0 && mine.is_ok() {
        bail!(
            "rank 0 refused the run folder {} (see its error)",
            out.display()
        );
    }
    mine
}

/// A run.toml's options as a table (an unreadable file as none).
fn options(text: &str) -> BTreeMap<String, toml::Value> {
    toml::from_str::<toml::Table>(text)
        .map(|t| t.into_iter().collect())
        .unwrap_or_default()
}

/// The options that differ between two run.toml texts, as `key: old -> new`.
/// Where the folder is (`out`) is not an option of the run: a folder copied
/// or moved elsewhere resumes with the same options.
pub fn changed_options(original: &str, now: &str) -> Vec<String> {
    let (a, b) = (options(original), options(now));
    let keys: std::collections::BTreeSet<&String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| k.as_str() != "out")
        .collect();
    let show = |v: Option<&toml::Value>| v.map_or("(unset)".to_string(), |v| v.to_string());
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{k}: {} -> {}", show(a.get(k)), show(b.get(k))))
        .collect()
}

/// Records a run's resolved options (rank 0): a new run writes run.toml; a
/// resumed one (`resuming`) keeps the original run.toml and, when its
/// options differ, writes them to the first free `run.resume-N.toml` and
/// says which changed. Returns the file written, if any.
pub fn record_options(out: &Path, resolved: &str, resuming: bool) -> Result<Option<PathBuf>> {
    let path = out.join("run.toml");
    let original = if resuming {
        std::fs::read_to_string(&path).ok()
    } else {
        None
    };
    let Some(original) = original else {
        std::fs::write(&path, resolved).with_context(|| format!("writing {}", path.display()))?;
        return Ok(Some(path));
    };
    let changed = changed_options(&original, resolved);
    if changed.is_empty() {
        return Ok(None);
    }
    let free = (1..)
        .map(|n| out.join(format!("run.resume-{n}.toml")))
        .find(|p| !p.exists())
        .expect("a free name");
    std::fs::write(&free, resolved).with_context(|| format!("writing {}", free.display()))?;
    crate::console::line(&format!(
        "resuming with changed options ({}): {} keeps the options the run started with, {} this resume's",
        changed.join(", "),
        path.display(),
        free.display()
    ));
    Ok(Some(free))
}

/// Drops from `metrics.jsonl` in `out` every record past step `last` (and
/// any line that is not a whole record), so that a run resumed after step
/// `last` does not record the steps it runs again twice. Rewritten through
/// a synced temporary file renamed over it; nothing to do without one.
pub fn keep_metrics_through(out: &Path, last: u64) -> Result<()> {
    let path = out.join("metrics.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let step_of = |l: &str| {
        serde_json::from_str::<serde_json::Value>(l)
            .ok()
            .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
    };
    let kept: String = text
        .lines()
        .filter(|l| step_of(l).is_some_and(|s| s <= last))
        .map(|l| format!("{l}\n"))
        .collect();
    if kept == text {
        return Ok(());
    }
    let tmp = path.with_extension("jsonl.tmp");
    crate::checkpoint::write_synced(&tmp, kept.as_bytes())?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_folder_is_refused_naming_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let held = lock(d.path()).unwrap();
        let e = format!("{:#}", lock(d.path()).unwrap_err());
        assert!(
            e.contains(&format!("pid {} on host ", std::process::id())),
            "{e}"
        );
        assert!(e.contains("another --out"), "{e}");
        drop(held);
        lock(d.path()).unwrap();
    }

    #[test]
    fn metrics_past_the_resumed_step_and_torn_lines_are_dropped() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("metrics.jsonl");
        std::fs::write(&m, "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"st").unwrap();
        keep_metrics_through(d.path(), 2).unwrap();
        assert_eq!(
            std::fs::read_to_string(&m).unwrap(),
            "{\"step\":1}\n{\"step\":2}\n"
        );
        keep_metrics_through(d.path(), 0).unwrap();
        assert_eq!(std::fs::read_to_string(&m).unwrap(), "");
    }

    #[test]
    fn changed_options_name_old_and_new_values() {
        let c = changed_options("steps = 4\nlr = 0.1\n", "steps = 6\nlr = 0.1\nseed = 1\n");
        assert_eq!(c, ["seed: (unset) -> 1", "steps: 4 -> 6"]);
        assert!(changed_options("steps = 4\n", "steps = 4\n").is_empty());
        // A folder moved elsewhere keeps its options.
        let moved = changed_options("out = \"runs/a\"\nsteps = 4\n", "out = \"/b\"\nsteps = 4\n");
        assert!(moved.is_empty(), "{moved:?}");
    }
}
