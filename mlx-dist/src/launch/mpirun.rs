//! `mlx-launch --backend mpi`: the job is started by Open MPI's `mpirun`
//! (`MLX_LAUNCH_MPIRUN` names another binary), which sets up MPI's own
//! environment; the ranks join it with `init(Backend::Mpi)` or `Backend::Any`
//! (a build of `mlx-dist` with the `mpi` feature).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use anyhow::Context;

use super::LaunchSpec;

/// The `mpirun` command line (program and arguments) for `spec`.
pub fn mpirun_command(spec: &LaunchSpec, running_as_root: bool) -> Vec<String> {
    let n = spec.hosts.len();
    let mut c = vec![
        std::env::var("MLX_LAUNCH_MPIRUN").unwrap_or_else(|_| "mpirun".into()),
        "-np".into(),
        n.to_string(),
    ];
    if running_as_root {
        c.push("--allow-run-as-root".into());
    }
    // More ranks than cores is fine for tests and small jobs, as with the other backends.
    c.push("--oversubscribe".into());
    if spec.prefix_output {
        c.push("--tag-output".into());
    }
    let remote: Vec<&str> = spec.hosts.iter().filter_map(|h| h.ssh.as_deref()).collect();
    if !remote.is_empty() {
        // One slot per rank placed on each host, in rank order.
        let mut slots: Vec<(&str, usize)> = Vec::new();
        for h in &spec.hosts {
            let name = h.ssh.as_deref().unwrap_or("localhost");
            match slots.iter_mut().find(|(s, _)| *s == name) {
                Some((_, k)) => *k += 1,
                None => slots.push((name, 1)),
            }
        }
        let list: Vec<String> = slots.iter().map(|(h, k)| format!("{h}:{k}")).collect();
        c.push("--host".into());
        c.push(list.join(","));
    }
    if let Some(cwd) = &spec.cwd {
        c.push("--wdir".into());
        c.push(cwd.display().to_string());
    }
    let mut env: Vec<(String, String)> =
        vec![(crate::config::ENV_BACKEND.to_string(), "mpi".to_string())];
    env.extend(super::thread_env(spec, 0));
    env.extend(spec.env.iter().cloned());
    for (k, v) in env {
        c.push("-x".into());
        c.push(format!("{k}={v}"));
    }
    c.extend(spec.command.iter().cloned());
    c
}

/// `[jobid,rank]<stdout>:text` (mpirun `--tag-output`) as `(rank, is_stderr, text)`.
fn untag(line: &str) -> Option<(usize, bool, &str)> {
    let rest = line.strip_prefix('[')?;
    let (ids, rest) = rest.split_once(']')?;
    let rank = ids.split(',').nth(1)?.trim().parse().ok()?;
    let (stream, text) = rest.strip_prefix('<')?.split_once(">:")?;
    Some((rank, stream == "stderr", text))
}

/// Runs `spec` under `mpirun` and returns the exit code the launcher should
/// exit with (mpirun's: non-zero when a rank failed).
pub fn run(spec: &LaunchSpec) -> anyhow::Result<i32> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let argv = mpirun_command(spec, root);
    tracing::info!(?argv, "launching through mpirun");
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    if !spec.prefix_output {
        let st = cmd
            .status()
            .with_context(|| format!("cannot run {} (is Open MPI installed?)", argv[0]))?;
        return Ok(st.code().unwrap_or(1));
    }
    // With --tag-output everything arrives on mpirun's stdout, tagged; it
    // becomes `[rank] text` on our stdout or stderr, like the other backends.
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {} (is Open MPI installed?)", argv[0]))?;
    let out = child.stdout.take().expect("piped");
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        match untag(&line) {
            Some((rank, true, text)) => {
                let _ = writeln!(std::io::stderr(), "[{rank}] {text}");
            }
            Some((rank, false, text)) => {
                let _ = writeln!(std::io::stdout(), "[{rank}] {text}");
            }
            None => {
                let _ = writeln!(std::io::stdout(), "{line}");
            }
        }
    }
    let st = child.wait()?;
    Ok(st.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_and_tags() {
        let mut spec = LaunchSpec::local(3, vec!["prog".into(), "--x".into()]);
        spec.env.push(("K".into(), "V".into()));
        let c = mpirun_command(&spec, true);
        assert_eq!(
            &c[1..5],
            ["-np", "3", "--allow-run-as-root", "--oversubscribe"]
        );
        assert!(c.windows(2).any(|w| w == ["-x", "K=V"]), "{c:?}");
        assert!(
            c.windows(2).any(|w| w == ["-x", "MLX_DIST_BACKEND=mpi"]),
            "{c:?}"
        );
        assert_eq!(&c[c.len() - 2..], ["prog", "--x"]);
        assert!(!mpirun_command(&spec, false).contains(&"--allow-run-as-root".to_string()));
        assert_eq!(
            untag("[1,2]<stdout>:hello: x"),
            Some((2, false, "hello: x"))
        );
        assert_eq!(untag("[1,0]<stderr>:"), Some((0, true, "")));
        assert_eq!(untag("plain"), None);
    }
}
