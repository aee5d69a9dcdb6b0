//! Tests of the Slurm variables' parsers and of the configuration they give.

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
