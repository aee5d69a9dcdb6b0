//! Ranks started by Slurm's `srun`, without `mlx-launch`: the rank, the host
//! list and the job id come from Slurm's variables, everything else from the
//! `MLX_DIST_*` variables as usual ([`crate::config`]).
//!
//! | variable | use |
//! |---|---|
//! | `SLURM_PROCID` | this rank |
//! | `SLURM_STEP_NUM_TASKS`, else `SLURM_NTASKS` | the world size |
//! | `SLURM_STEP_NODELIST`, else `SLURM_NODELIST`, else `SLURM_JOB_NODELIST` | the step's nodes, a hostlist (`node[01-04],gpu5`) |
//! | `SLURM_STEP_TASKS_PER_NODE`, else `SLURM_TASKS_PER_NODE` | tasks on each of those nodes (`2(x3),1`) |
//! | `SLURM_DISTRIBUTION` | must be `block` (srun's default) when it matters |
//! | `SLURM_NODEID`, `SLURM_LOCALID`, `SLURMD_NODENAME` | checked against the block layout |
//! | `SLURM_STEP_RESV_PORTS` | ports reserved by `srun --resv-ports`: local task `i` listens on the `i`-th |
//! | `MLX_DIST_PORT` | else: local task `i` listens on this port + `i` |
//! | `SLURM_JOB_ID`, `SLURM_STEP_ID` | else the base port, derived in 20000..60000; and the job id |
//!
//! Tasks are assumed to be laid out over the nodes by srun's default block
//! distribution: the first node's tasks are ranks `0..n0`, the next node's
//! follow, and so on. Rank `r` listens on `<its node's name>:<port>`, so node
//! names must resolve, on every node, to the interface the ranks should talk
//! over; where they do not, `MLX_DIST_HOSTS` (or `MLX_HOSTFILE`) set by the
//! user is used instead of the node list, with the rank still from Slurm.
//!
//! Under srun with MPI (`MLX_DIST_BACKEND=mpi`, or a build with feature `mpi`
//! in a step that has PMI/PMIx variables and no `MLX_DIST_BACKEND`), the
//! world is MPI's and nothing here applies. Neither does it in a batch
//! script outside any step (no `SLURM_STEP_ID`): that is a single process.

use sha2::{Digest, Sha256};

use crate::config::{ENV_BACKEND, ENV_HOSTFILE, ENV_HOSTS, ENV_JOB_ID, ENV_RANK, ENV_WORLD};
use crate::error::{DistError, Result};

const PROCID: &str = "SLURM_PROCID";
const STEP_ID: &str = "SLURM_STEP_ID";
const JOB_ID: &str = "SLURM_JOB_ID";
const DISTRIBUTION: &str = "SLURM_DISTRIBUTION";
const NODEID: &str = "SLURM_NODEID";
const LOCALID: &str = "SLURM_LOCALID";
const NODENAME: &str = "SLURMD_NODENAME";
const RESV_PORTS: &str = "SLURM_STEP_RESV_PORTS";
const WORLD_VARS: [&str; 2] = ["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"];
const NODELIST_VARS: [&str; 3] = [
    "SLURM_STEP_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_NODELIST",
];
const TASKS_PER_NODE_VARS: [&str; 2] = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"];

/// Environment variable: base port of the ranks of one node under Slurm,
/// when srun reserved none (`--resv-ports`).
pub const ENV_PORT: &str = "MLX_DIST_PORT";

/// Variables that say an MPI process manager started this process (as in `mpi.rs`).
const MPI_VARS: [&str; 4] = [
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "MPI_LOCALNRANKS",
];

/// The most names a host list may expand to.
const MAX_HOSTS: usize = 1 << 20;

/// The launcher variables (`MLX_RANK`, `MLX_WORLD_SIZE`, `MLX_DIST_HOSTS`,
/// `MLX_DIST_JOB_ID`) that Slurm's stand for, those the user set excepted;
/// `None` when this is not a task of a multi-task srun step that should
/// join a ring, quic or (through `MLX_DIST_BACKEND`) other non-MPI world.
pub(crate) fn launcher_variables(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Vec<(&'static str, String)>>> {
    if get(ENV_RANK).is_some() || !in_srun_step(get) {
        return Ok(None);
    }
    let backend = get(ENV_BACKEND).map(|b| b.trim().to_ascii_lowercase());
    if backend.as_deref() == Some("mpi")
        || (backend.is_none() && cfg!(feature = "mpi") && MPI_VARS.iter().any(|v| get(v).is_some()))
    {
        return Ok(None);
    }
    let err = |msg: String| DistError::Config(format!("under Slurm: {msg}"));
    let (world_var, world) = first_of(get, &WORLD_VARS)
        .ok_or_else(|| err(format!("{PROCID} is set but {} is not", WORLD_VARS[1])))?;
    let world: usize = parse_num(world_var, &world).map_err(err)?;
    let rank: usize = parse_num(PROCID, &get(PROCID).unwrap_or_default()).map_err(err)?;
    if rank >= world {
        return Err(err(format!("{PROCID}={rank} but {world_var}={world}")));
    }
    if world == 1 {
        return Ok(None);
    }
    let job = get(JOB_ID).ok_or_else(|| err(format!("{JOB_ID} is not set")))?;
    let step = get(STEP_ID)
        .or_else(|| get("SLURM_STEPID"))
        .unwrap_or_default();
    let (list_var, list) = first_of(get, &NODELIST_VARS).unwrap_or_default();

    let mut vars = vec![(ENV_RANK, rank.to_string())];
    if get(ENV_WORLD).is_none() {
        vars.push((ENV_WORLD, world.to_string()));
    }
    if get(ENV_JOB_ID).is_none() {
        vars.push((ENV_JOB_ID, job_id(&job, &step, &list)));
    }
    if let Some(user) = get(ENV_HOSTS) {
        let n = user.split(',').filter(|h| !h.trim().is_empty()).count();
        if n != world {
            return Err(err(format!(
                "{ENV_HOSTS} lists {n} ranks but {world_var}={world}"
            )));
        }
        return Ok(Some(vars));
    }
    if get(ENV_HOSTFILE).is_some() {
        return Ok(Some(vars));
    }

    if list_var.is_empty() {
        return Err(err(format!(
            "none of {} is set (or set {ENV_HOSTS})",
            NODELIST_VARS.join(", ")
        )));
    }
    let nodes = expand_hostlist(&list).map_err(|e| err(format!("{list_var}={list:?}: {e}")))?;
    let counts = match first_of(get, &TASKS_PER_NODE_VARS) {
        Some((var, v)) => {
            let counts = parse_tasks_per_node(&v).map_err(|e| err(format!("{var}={v:?}: {e}")))?;
            if counts.len() != nodes.len() {
                return Err(err(format!(
                    "{var}={v:?} describes {} nodes but {list_var}={list:?} has {}",
                    counts.len(),
                    nodes.len()
                )));
            }
            let total: usize = counts.iter().sum();
            if total != world {
                return Err(err(format!(
                    "{var}={v:?} adds up to {total} tasks but {world_var}={world}"
                )));
            }
            counts
        }
        None if nodes.len() == 1 => vec![world],
        None => {
            return Err(err(format!(
                "{list_var} has {} nodes but neither {} says how many tasks each runs",
                nodes.len(),
                TASKS_PER_NODE_VARS.join(" nor ")
            )));
        }
    };
    if let Some(d) = get(DISTRIBUTION) {
        check_distribution(&d, &counts).map_err(err)?;
    }
    let layout = block_layout(&counts);
    let (node, local) = layout[rank];
    for (var, expected) in [(NODEID, node), (LOCALID, local)] {
        if let Some(v) = get(var)
            && v.trim().parse::<usize>().ok() != Some(expected)
        {
            return Err(err(format!(
                "{var}={v} but srun's block distribution puts rank {rank} at {var}={expected}: \
                 are the tasks distributed otherwise ({DISTRIBUTION})? Set {ENV_HOSTS} to say where each rank is"
            )));
        }
    }
    if let Some(name) = get(NODENAME)
        && name.trim() != nodes[node]
    {
        return Err(err(format!(
            "{NODENAME}={name} but rank {rank} should be on node {node} of {list_var}={list:?}, {}: \
             set {ENV_HOSTS} to say where each rank is",
            nodes[node]
        )));
    }
    let busiest = counts.iter().copied().max().unwrap_or(0);
    let ports = ports(get, &job, &step, busiest).map_err(err)?;
    let hosts: Vec<String> = layout
        .iter()
        .map(|&(n, l)| format!("{}:{}", nodes[n], ports[l]))
        .collect();
    tracing::debug!(rank, hosts = %hosts.join(","), "ranks from Slurm's variables");
    vars.push((ENV_HOSTS, hosts.join(",")));
    Ok(Some(vars))
}

/// Whether this is a task of an srun step (a batch script has
/// `SLURM_PROCID` too, but no step id: it is one process).
fn in_srun_step(get: &dyn Fn(&str) -> Option<String>) -> bool {
    get(PROCID).is_some() && (get(STEP_ID).is_some() || get("SLURM_STEPID").is_some())
}

/// The first of `vars` that is set, and its value.
fn first_of(
    get: &dyn Fn(&str) -> Option<String>,
    vars: &[&'static str],
) -> Option<(&'static str, String)> {
    vars.iter().find_map(|&v| get(v).map(|x| (v, x)))
}

fn parse_num(var: &str, v: &str) -> std::result::Result<usize, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{var}={v:?} is not a number"))
}

/// The job id: every task of one step derives the same, other steps and jobs another.
fn job_id(job: &str, step: &str, nodelist: &str) -> String {
    let d = Sha256::digest(format!("mlx-dist slurm job\0{job}\0{step}\0{nodelist}").as_bytes());
    crate::config::hex_encode(&d[..16])
}

/// The port of each local task index `0..tasks`.
fn ports(
    get: &dyn Fn(&str) -> Option<String>,
    job: &str,
    step: &str,
    tasks: usize,
) -> std::result::Result<Vec<u16>, String> {
    if let Some(v) = get(RESV_PORTS) {
        let ports = parse_ports(&v).map_err(|e| format!("{RESV_PORTS}={v:?}: {e}"))?;
        if ports.len() < tasks {
            return Err(format!(
                "{RESV_PORTS}={v:?} reserves {} ports but a node runs {tasks} tasks",
                ports.len()
            ));
        }
        return Ok(ports[..tasks].to_vec());
    }
    let base = match get(ENV_PORT) {
        Some(v) => v
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("{ENV_PORT}={v:?} is not a port"))?,
        None => derived_base_port(job, step),
    };
    (0..tasks)
        .map(|i| {
            u16::try_from(usize::from(base) + i)
                .map_err(|_| format!("{ENV_PORT}={base} leaves no room for a node's {tasks} tasks"))
        })
        .collect()
}

/// A base port in 20000..60000 from the job and step ids: every task derives the same.
pub(crate) fn derived_base_port(job: &str, step: &str) -> u16 {
    let d = Sha256::digest(format!("mlx-dist slurm port\0{job}\0{step}").as_bytes());
    let h = u64::from_le_bytes(d[..8].try_into().expect("sha256 has 32 bytes"));
    20000 + (h % 40000) as u16
}

/// Checks that `SLURM_DISTRIBUTION` lays the tasks out as the block
/// distribution does: `block` (or `*`), or any other over one node or one
/// task per node (all the same then), `arbitrary` on one node only.
fn check_distribution(d: &str, counts: &[usize]) -> std::result::Result<(), String> {
    let kind = d
        .split([':', ','])
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let one_node = counts.iter().filter(|&&c| c > 0).count() <= 1;
    let one_each = counts.iter().all(|&c| c <= 1);
    let ok = match kind.as_str() {
        "" | "*" | "block" => true,
        "arbitrary" => one_node,
        k if k == "cyclic" || k.starts_with("plane") => one_node || one_each,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{DISTRIBUTION}={d:?}: only srun's block distribution (the default, `-m block`) \
             says which rank runs where; use it, or set {ENV_HOSTS} to say where each rank is"
        ))
    }
}

/// Rank → (node index, index of the task on its node) for the block
/// distribution: ranks fill the nodes in order.
pub(crate) fn block_layout(counts: &[usize]) -> Vec<(usize, usize)> {
    counts
        .iter()
        .enumerate()
        .flat_map(|(node, &c)| (0..c).map(move |local| (node, local)))
        .collect()
}

/// Parses Slurm's tasks-per-node list: `2(x3),1` is 2, 2, 2, 1.
pub(crate) fn parse_tasks_per_node(s: &str) -> std::result::Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim) {
        let bad = || format!("{item:?} is neither N nor N(xM)");
        let (n, times) = match item.split_once('(') {
            Some((n, rest)) => {
                let m = rest
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(bad)?;
                (n, m.parse::<usize>().map_err(|_| bad())?)
            }
            None => (item, 1),
        };
        let n: usize = n.parse().map_err(|_| bad())?;
        if times == 0 || out.len() + times > MAX_HOSTS {
            return Err(bad());
        }
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

/// Parses a port list as `SLURM_STEP_RESV_PORTS` gives it: `12000-12015`,
/// or ranges and single ports separated by commas.
pub(crate) fn parse_ports(s: &str) -> std::result::Result<Vec<u16>, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim) {
        let bad = |why: &str| format!("{item:?} {why}");
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let lo: u16 = lo.trim().parse().map_err(|_| bad("is not a port range"))?;
        let hi: u16 = hi.trim().parse().map_err(|_| bad("is not a port range"))?;
        if lo == 0 || hi < lo {
            return Err(bad("is not a port range"));
        }
        out.extend(lo..=hi);
    }
    Ok(out)
}

/// Expands a Slurm host list: `node[01-03,07],gpu5,rack[1-2]-n[3-4]` is
/// node01 node02 node03 node07 gpu5 rack1-n3 rack1-n4 rack2-n3 rack2-n4.
/// Zero padding is kept (the width of a range's first number); several
/// bracket groups in one name give every combination, the first group
/// varying slowest.
pub fn expand_hostlist(s: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in split_top_level(s)? {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!("empty host name in {s:?}"));
        }
        expand_one(item, &mut out)?;
    }
    Ok(out)
}

/// Splits at the commas outside brackets, checking that brackets balance.
fn split_top_level(s: &str) -> std::result::Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut start, mut open) = (0, None);
    for (i, c) in s.char_indices() {
        match c {
            '[' => match open {
                Some(o) => return Err(format!("nested '[' in {:?}", &s[o..])),
                None => open = Some(i),
            },
            ']' if open.is_none() => return Err(format!("']' without '[' in {s:?}")),
            ']' => open = None,
            ',' if open.is_none() => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if let Some(o) = open {
        return Err(format!("'[' without ']' in {:?}", &s[o..]));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

/// Expands one name with bracket groups (balanced, not nested) into `out`.
fn expand_one(item: &str, out: &mut Vec<String>) -> std::result::Result<(), String> {
    // Literal text, then alternatives, in turn: name = t0 [g0] t1 [g1] ... tn.
    let mut names = vec![String::new()];
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        let close = open + rest[open..].find(']').expect("brackets balance");
        let group = &rest[open + 1..close];
        let alternatives =
            expand_group(group).map_err(|e| format!("{e} in [{group}] of {item:?}"))?;
        if names.len().saturating_mul(alternatives.len()) > MAX_HOSTS {
            return Err(format!("{item:?} names more than {MAX_HOSTS} hosts"));
        }
        names = names
            .iter()
            .flat_map(|n| {
                alternatives
                    .iter()
                    .map(move |a| format!("{n}{}{a}", &rest[..open]))
            })
            .collect();
        rest = &rest[close + 1..];
    }
    if out.len() + names.len() > MAX_HOSTS {
        return Err(format!("the list names more than {MAX_HOSTS} hosts"));
    }
    out.extend(names.into_iter().map(|n| n + rest));
    Ok(())
}

/// The numbers a bracket group stands for: `01-03,7` is 01 02 03 7.
fn expand_group(group: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in group.split(',') {
        let part = part.trim();
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let num = |t: &str| -> std::result::Result<u64, String> {
            if t.is_empty() || t.len() > 18 || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{part:?} is not a number or range"));
            }
            Ok(t.parse().expect("digits"))
        };
        let (a, b) = (num(lo)?, num(hi)?);
        if b < a {
            return Err(format!("reversed range {part:?}"));
        }
        if (b - a) as usize >= MAX_HOSTS || out.len() + (b - a) as usize >= MAX_HOSTS {
            return Err(format!("{part:?} names more than {MAX_HOSTS} hosts"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn expand(s: &str) -> Vec<String> {
        expand_hostlist(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn hostlists_expand() {
        assert_eq!(
            expand("node[01-03,07],gpu5,rack[1-2]-n[3-4]"),
            [
                "node01", "node02", "node03", "node07", "gpu5", "rack1-n3", "rack1-n4", "rack2-n3",
                "rack2-n4"
            ]
        );
        assert_eq!(expand("localhost"), ["localhost"]);
        assert_eq!(expand("a[8-11]"), ["a8", "a9", "a10", "a11"]);
        assert_eq!(expand("a[098-101]b"), ["a098b", "a099b", "a100b", "a101b"]);
        assert_eq!(expand("[1-2]x"), ["1x", "2x"]);
        assert_eq!(expand("n[5]"), ["n5"]);
        assert_eq!(expand("n[0-1],m"), ["n0", "n1", "m"]);
        assert_eq!(expand("c[1,3]-[0-1]"), ["c1-0", "c1-1", "c3-0", "c3-1"]);
        assert_eq!(expand("n[007-009]"), ["n007", "n008", "n009"]);
        assert_eq!(expand("n[9-10]"), ["n9", "n10"]);
        assert_eq!(expand("h-1.example"), ["h-1.example"]);
    }

    #[test]
    fn hostlist_errors_quote_the_offending_text() {
        for (list, wanted) in [
            ("node[01-03", "'[' without ']' in \"[01-03\""),
            ("node01-03]", "']' without '[' in \"node01-03]\""),
            (
                "a[1-2],b[3-1]",
                "reversed range \"3-1\" in [3-1] of \"b[3-1]\"",
            ),
            ("a[1-[2]]", "nested '['"),
            ("a[x]", "\"x\" is not a number or range in [x] of \"a[x]\""),
            ("a[]", "\"\" is not a number or range"),
            ("a[1-]", "\"1-\" is not a number or range"),
            ("a,,b", "empty host name in \"a,,b\""),
            ("", "empty host name"),
            ("a[0-99999999]", "names more than"),
            ("a[0-999]b[0-999]c[0-999]", "names more than"),
        ] {
            let e = expand_hostlist(list).expect_err(list);
            assert!(e.contains(wanted), "{list}: {e}");
        }
    }

    #[test]
    fn tasks_per_node() {
        assert_eq!(parse_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(parse_tasks_per_node("4").unwrap(), [4]);
        assert_eq!(parse_tasks_per_node("1,3(x2)").unwrap(), [1, 3, 3]);
        for bad in ["", "2(3)", "2(x3", "x", "2(x0)", "-1", "2,,1", "2(x3)4"] {
            assert!(parse_tasks_per_node(bad).is_err(), "{bad}");
        }
        assert!(parse_tasks_per_node("2(y3)").unwrap_err().contains("2(y3)"));
    }

    #[test]
    fn block_layout_fills_nodes_in_order() {
        assert_eq!(
            block_layout(&[2, 1, 3]),
            [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
        );
        assert_eq!(block_layout(&[1, 0, 1]), [(0, 0), (2, 0)]);
    }

    #[test]
    fn port_lists() {
        assert_eq!(
            parse_ports("12000-12003").unwrap(),
            [12000, 12001, 12002, 12003]
        );
        assert_eq!(parse_ports("5,7-8").unwrap(), [5, 7, 8]);
        for bad in ["", "12003-12000", "x", "0", "1-70000"] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
        let a = derived_base_port("123", "0");
        assert_eq!(a, derived_base_port("123", "0"));
        assert_ne!(a, derived_base_port("123", "1"));
        for job in 0..1000 {
            assert!((20000..60000).contains(&derived_base_port(&job.to_string(), "0")));
        }
    }

    fn lookup<V: AsRef<str>>(vars: &[(&str, V)]) -> impl Fn(&str) -> Option<String> + use<V> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_ref().to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    /// The variables srun sets for task `rank` of a step on two nodes, 2 + 1 tasks.
    fn step(rank: usize) -> Vec<(&'static str, String)> {
        let (node, local) = [(0, 0), (0, 1), (1, 0)][rank];
        vec![
            ("SLURM_PROCID", rank.to_string()),
            ("SLURM_NTASKS", "3".into()),
            ("SLURM_JOB_ID", "4242".into()),
            ("SLURM_STEP_ID", "0".into()),
            ("SLURM_JOB_NODELIST", "gpu[1-4]".into()),
            ("SLURM_STEP_NODELIST", "gpu[01-02]".into()),
            ("SLURM_TASKS_PER_NODE", "1(x4)".into()),
            ("SLURM_STEP_TASKS_PER_NODE", "2,1".into()),
            ("SLURM_NODEID", node.to_string()),
            ("SLURM_LOCALID", local.to_string()),
            ("SLURMD_NODENAME", format!("gpu0{}", node + 1)),
        ]
    }

    fn vars_of(env: &[(&'static str, String)]) -> Result<Option<HashMap<&'static str, String>>> {
        let get = lookup(env);
        Ok(launcher_variables(&get)?.map(|v| v.into_iter().collect()))
    }

    fn with(
        mut env: Vec<(&'static str, String)>,
        k: &'static str,
        v: &str,
    ) -> Vec<(&'static str, String)> {
        env.retain(|(x, _)| *x != k);
        env.push((k, v.to_string()));
        env
    }

    fn without(mut env: Vec<(&'static str, String)>, k: &str) -> Vec<(&'static str, String)> {
        env.retain(|(x, _)| *x != k);
        env
    }

    #[test]
    fn ranks_map_to_their_nodes_and_ports() {
        let base = derived_base_port("4242", "0");
        let want = format!("gpu01:{base},gpu01:{},gpu02:{base}", base + 1);
        let mut ids = Vec::new();
        for r in 0..3 {
            let v = vars_of(&step(r)).unwrap().unwrap();
            assert_eq!(v[ENV_RANK], r.to_string());
            assert_eq!(v[ENV_WORLD], "3");
            assert_eq!(v[ENV_HOSTS], want);
            ids.push(v[ENV_JOB_ID].clone());
        }
        assert!(ids.iter().all(|i| *i == ids[0] && i.len() == 32));
        let other = vars_of(&with(step(0), "SLURM_STEP_ID", "1"))
            .unwrap()
            .unwrap();
        assert_ne!(other[ENV_JOB_ID], ids[0]);

        // Reserved ports win, then MLX_DIST_PORT.
        let v = vars_of(&with(step(2), RESV_PORTS, "13000-13001"))
            .unwrap()
            .unwrap();
        assert_eq!(v[ENV_HOSTS], "gpu01:13000,gpu01:13001,gpu02:13000");
        let v = vars_of(&with(
            with(step(2), RESV_PORTS, "13000,13005"),
            ENV_PORT,
            "9",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(v[ENV_HOSTS], "gpu01:13000,gpu01:13005,gpu02:13000");
        let v = vars_of(&with(step(2), ENV_PORT, "9000")).unwrap().unwrap();
        assert_eq!(v[ENV_HOSTS], "gpu01:9000,gpu01:9001,gpu02:9000");

        // Without the step's variables, the job's.
        let env = without(
            without(step(1), "SLURM_STEP_NODELIST"),
            "SLURM_STEP_TASKS_PER_NODE",
        );
        let env = with(
            with(env, "SLURM_JOB_NODELIST", "gpu[01-02]"),
            "SLURM_TASKS_PER_NODE",
            "2,1",
        );
        assert_eq!(vars_of(&env).unwrap().unwrap()[ENV_HOSTS], want);
        let env = with(
            without(env, "SLURM_JOB_NODELIST"),
            "SLURM_NODELIST",
            "gpu[01-02]",
        );
        assert_eq!(vars_of(&env).unwrap().unwrap()[ENV_HOSTS], want);
    }

    #[test]
    fn user_settings_win() {
        let env = with(step(1), ENV_HOSTS, "10.0.0.1:1,10.0.0.1:2,10.0.0.2:1");
        let v = vars_of(&env).unwrap().unwrap();
        assert_eq!(v[ENV_RANK], "1");
        assert!(!v.contains_key(ENV_HOSTS), "the user's list is kept");
        let v = vars_of(&with(step(1), ENV_JOB_ID, "00")).unwrap().unwrap();
        assert!(!v.contains_key(ENV_JOB_ID));
        let e = vars_of(&with(step(1), ENV_HOSTS, "a:1,b:1")).unwrap_err();
        assert!(
            e.to_string()
                .contains("MLX_DIST_HOSTS lists 2 ranks but SLURM_NTASKS=3"),
            "{e}"
        );
    }

    #[test]
    fn not_a_slurm_ring() {
        // No Slurm, a launcher's rank, a batch script, one task, MPI.
        assert!(vars_of(&[]).unwrap().is_none());
        assert!(vars_of(&with(step(0), ENV_RANK, "0")).unwrap().is_none());
        assert!(
            vars_of(&without(step(0), "SLURM_STEP_ID"))
                .unwrap()
                .is_none()
        );
        let one = with(
            with(step(0), "SLURM_NTASKS", "1"),
            "SLURM_STEP_TASKS_PER_NODE",
            "x",
        );
        assert!(vars_of(&one).unwrap().is_none());
        assert!(
            vars_of(&with(step(0), ENV_BACKEND, "MPI"))
                .unwrap()
                .is_none()
        );
        let pmix = with(step(0), "PMIX_RANK", "0");
        assert_eq!(vars_of(&pmix).unwrap().is_none(), cfg!(feature = "mpi"));
        assert!(vars_of(&with(pmix, ENV_BACKEND, "ring")).unwrap().is_some());
    }

    #[test]
    fn inconsistent_slurm_variables_are_named() {
        for (k, v, wanted) in [
            (
                "SLURM_STEP_NODELIST",
                "gpu[01-02",
                "SLURM_STEP_NODELIST=\"gpu[01-02\": '[' without ']' in \"[01-02\"",
            ),
            (
                "SLURM_STEP_NODELIST",
                "gpu[01-03]",
                "SLURM_STEP_TASKS_PER_NODE=\"2,1\" describes 2 nodes but SLURM_STEP_NODELIST=\"gpu[01-03]\" has 3",
            ),
            (
                "SLURM_STEP_TASKS_PER_NODE",
                "2,2",
                "SLURM_STEP_TASKS_PER_NODE=\"2,2\" adds up to 4 tasks but SLURM_NTASKS=3",
            ),
            (
                "SLURM_STEP_TASKS_PER_NODE",
                "2,1)",
                "SLURM_STEP_TASKS_PER_NODE=\"2,1)\": \"1)\"",
            ),
            (
                "SLURM_DISTRIBUTION",
                "cyclic",
                "SLURM_DISTRIBUTION=\"cyclic\"",
            ),
            (
                "SLURM_DISTRIBUTION",
                "arbitrary",
                "SLURM_DISTRIBUTION=\"arbitrary\"",
            ),
            (
                "SLURM_LOCALID",
                "1",
                "SLURM_LOCALID=1 but srun's block distribution puts rank 0 at SLURM_LOCALID=0",
            ),
            ("SLURM_NODEID", "1", "SLURM_NODEID=1"),
            ("SLURMD_NODENAME", "gpu02", "SLURMD_NODENAME=gpu02"),
            ("SLURM_PROCID", "3", "SLURM_PROCID=3 but SLURM_NTASKS=3"),
            ("SLURM_PROCID", "x", "SLURM_PROCID=\"x\" is not a number"),
            (
                "SLURM_NTASKS",
                "three",
                "SLURM_NTASKS=\"three\" is not a number",
            ),
            (
                RESV_PORTS,
                "13000",
                "SLURM_STEP_RESV_PORTS=\"13000\" reserves 1 ports but a node runs 2 tasks",
            ),
            (
                RESV_PORTS,
                "13001-13000",
                "SLURM_STEP_RESV_PORTS=\"13001-13000\"",
            ),
            (ENV_PORT, "65535", "MLX_DIST_PORT=65535 leaves no room"),
            (ENV_PORT, "http", "MLX_DIST_PORT=\"http\" is not a port"),
        ] {
            let e = vars_of(&with(step(0), k, v)).expect_err(v).to_string();
            assert!(e.contains(wanted), "{k}={v}: {e}");
        }
        let e = vars_of(&without(step(0), "SLURM_JOB_ID"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLURM_JOB_ID is not set"), "{e}");
        let e = vars_of(&without(step(0), "SLURM_NTASKS"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SLURM_PROCID is set but SLURM_NTASKS is not"),
            "{e}"
        );
        let env = without(
            without(step(0), "SLURM_STEP_TASKS_PER_NODE"),
            "SLURM_TASKS_PER_NODE",
        );
        let e = vars_of(&env).unwrap_err().to_string();
        assert!(e.contains("says how many tasks"), "{e}");
        let env = without(
            without(step(0), "SLURM_STEP_NODELIST"),
            "SLURM_JOB_NODELIST",
        );
        assert!(
            vars_of(&env)
                .unwrap_err()
                .to_string()
                .contains("none of SLURM_STEP_NODELIST")
        );
        // Distributions that place the tasks as block does are accepted.
        let spread = with(
            with(
                with(step(0), "SLURM_STEP_TASKS_PER_NODE", "1(x3)"),
                "SLURM_STEP_NODELIST",
                "gpu[01-03]",
            ),
            "SLURM_DISTRIBUTION",
            "cyclic:block",
        );
        assert!(vars_of(&spread).unwrap().is_some());
        let block = with(step(0), "SLURM_DISTRIBUTION", "block:cyclic,Pack");
        assert!(vars_of(&block).unwrap().is_some());
    }

    #[test]
    fn the_config_takes_rank_hosts_and_identity_from_slurm_and_the_rest_as_usual() {
        use crate::config::{Config, ENV_SECRET, ENV_TIMEOUT_MS};
        let secret = "abcd".repeat(8);
        let env = with(with(step(2), ENV_TIMEOUT_MS, "1234"), ENV_SECRET, &secret);
        let (cfg, backend) = Config::from_lookup(lookup(&env)).unwrap().unwrap();
        assert_eq!((cfg.rank, cfg.world()), (2, 3));
        assert_eq!(
            cfg.hosts[2],
            format!("gpu02:{}", derived_base_port("4242", "0"))
        );
        assert_eq!(
            cfg.collective_timeout,
            std::time::Duration::from_millis(1234)
        );
        assert_eq!(cfg.secret, [0xab, 0xcd].repeat(8));
        assert_eq!(backend, None);
        let slurm_id = vars_of(&step(2)).unwrap().unwrap()[ENV_JOB_ID].clone();
        assert_eq!(crate::config::hex_encode(&cfg.job_id), slurm_id);
        // Without a secret: refused, unless the user opts in to a derived
        // one, the job id then still Slurm's.
        let e = Config::from_lookup(lookup(&step(0)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("MLX_DIST_JOB_SECRET_FILE"), "{e}");
        let insecure = with(step(0), "MLX_DIST_INSECURE_DERIVED_SECRET", "1");
        let (cfg0, _) = Config::from_lookup(lookup(&insecure)).unwrap().unwrap();
        assert_eq!(crate::config::hex_encode(&cfg0.job_id), slurm_id);
        assert!(!cfg0.secret.is_empty());
        let e = Config::from_lookup(lookup(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "1"),
            ("SLURM_NODELIST", "n[1-"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("SLURM_NODELIST=\"n[1-\""), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Any list of names with ranges expands to the names written out.
        #[test]
        fn ranges_expand_to_their_names(
            groups in proptest::collection::vec(
                ("[a-z]{1,4}", 0u64..2000, 0u64..20, 1usize..5, "(-[a-z]{1,3})?"),
                1..5,
            )
        ) {
            let mut list = Vec::new();
            let mut want = Vec::new();
            for (prefix, lo, len, width, suffix) in &groups {
                let hi = lo + len;
                list.push(format!("{prefix}[{lo:0width$}-{hi:0width$}]{suffix}"));
                let w = format!("{lo:0width$}").len();
                want.extend((*lo..=hi).map(|n| format!("{prefix}{n:0w$}{suffix}")));
            }
            prop_assert_eq!(expand_hostlist(&list.join(",")).unwrap(), want);
        }

        /// Two bracket groups give every combination, the first varying slowest.
        #[test]
        fn bracket_groups_multiply(a in 0u64..50, na in 0u64..5, b in 0u64..50, nb in 0u64..5) {
            let got = expand_hostlist(&format!("r[{a}-{}]n[{b}-{}]", a + na, b + nb)).unwrap();
            let want: Vec<String> = (a..=a + na)
                .flat_map(|x| (b..=b + nb).map(move |y| format!("r{x}n{y}")))
                .collect();
            prop_assert_eq!(got, want);
        }

        /// Nothing panics, whatever the text.
        #[test]
        fn never_panics(s in "[a-c0-9\\[\\],\\- ]{0,24}") {
            let _ = expand_hostlist(&s);
            let _ = parse_tasks_per_node(&s);
            let _ = parse_ports(&s);
        }
    }
}
