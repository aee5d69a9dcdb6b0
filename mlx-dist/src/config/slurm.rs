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

use super::hex::hex_encode;
use super::vars::{ENV_BACKEND, ENV_HOSTFILE, ENV_HOSTS, ENV_JOB_ID, ENV_RANK, ENV_WORLD};
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
    hex_encode(&d[..16])
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
mod tests;
