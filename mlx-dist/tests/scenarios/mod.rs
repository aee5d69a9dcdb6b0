//! The scenarios a rank of the multi-process tests runs, shared by every
//! transport's test (`launch.rs` for ring and quic, `mpi.rs` for mpi): the
//! test binary re-runs itself as each rank with `MLX_DIST_TEST_SCENARIO` set.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use half::{bf16, f16};
use mlx_array::{ALL_DTYPES, Dtype};
use mlx_dist::{Backend, DistError, Group, ReduceOp, init};

/// The variable naming the scenario a rank runs.
pub const SCENARIO: &str = "MLX_DIST_TEST_SCENARIO";

/// The arguments that make this test binary run `rank_main` alone, as a rank.
pub const RANK_ARGS: [&str; 6] = [
    "--exact",
    "rank_main",
    "--nocapture",
    "--test-threads",
    "1",
    "-q",
];

/// A finished process's standard output and error, as one text.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Element `i` of rank `r`'s data, as a small integer so every sum is exact in every dtype.
pub fn val(r: usize, i: usize, d: Dtype) -> f64 {
    let v = ((i * 7 + r * 13) % 17) as f64;
    match d {
        Dtype::Bool => (i + r).is_multiple_of(3) as u8 as f64,
        Dtype::U32 => v,
        _ => v - 8.0,
    }
}

pub fn encode(vals: impl Iterator<Item = f64>, d: Dtype) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        match d {
            Dtype::Bool => out.push(v as u8),
            Dtype::U32 => out.extend((v as u32).to_le_bytes()),
            Dtype::I32 => out.extend((v as i32).to_le_bytes()),
            Dtype::I64 => out.extend((v as i64).to_le_bytes()),
            Dtype::F16 => out.extend(f16::from_f64(v).to_le_bytes()),
            Dtype::BF16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            Dtype::F32 => out.extend((v as f32).to_le_bytes()),
        }
    }
    out
}

pub fn reference(n: usize, i: usize, d: Dtype, op: ReduceOp) -> f64 {
    let vs = (0..n).map(|r| val(r, i, d));
    match (op, d) {
        (ReduceOp::Sum, Dtype::Bool) | (ReduceOp::Max, _) => vs.fold(f64::MIN, f64::max),
        (ReduceOp::Sum, _) => vs.sum(),
        (ReduceOp::Min, _) => vs.fold(f64::MAX, f64::min),
    }
}

pub fn check_collectives(g: &Group, sizes: &[usize]) {
    for d in ALL_DTYPES {
        check_collectives_of(g, d, sizes);
    }
}

/// Every collective on `dtype` at each of `sizes` against the reference.
pub fn check_collectives_of(g: &Group, d: Dtype, sizes: &[usize]) {
    let (n, r) = (g.size(), g.rank());
    {
        for &len in sizes {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                let mut buf = encode((0..len).map(|i| val(r, i, d)), d);
                g.all_reduce_bytes(&mut buf, d, op).unwrap();
                let want = encode((0..len).map(|i| reference(n, i, d, op)), d);
                assert!(buf == want, "{op:?} {d:?} len {len} differs on rank {r}");
            }
            let mine = encode((0..len).map(|i| val(r, i, d)), d);
            let all = g.all_gather_bytes(&mine, d).unwrap();
            let want: Vec<u8> = (0..n)
                .flat_map(|q| encode((0..len).map(|i| val(q, i, d)), d))
                .collect();
            assert!(
                all == want,
                "all_gather {d:?} len {len} differs on rank {r}"
            );
            if d != Dtype::Bool {
                let full = encode((0..len * n).map(|i| val(r, i, d)), d);
                let got = g.sum_scatter_bytes(&full, d).unwrap();
                let want = encode(
                    (r * len..(r + 1) * len).map(|i| reference(n, i, d, ReduceOp::Sum)),
                    d,
                );
                assert!(
                    got == want,
                    "sum_scatter {d:?} len {len} differs on rank {r}"
                );
            }
        }
    }
}

pub fn check_p2p(g: &Group) {
    let (n, r) = (g.size(), g.rank());
    for src in 0..n {
        for dst in (0..n).filter(|&d| d != src) {
            let msg: Vec<i64> = (0..(src * 10 + dst) * 1000 + 3)
                .map(|i| i as i64 * (src as i64 + 1))
                .collect();
            if r == src {
                g.send(&msg, dst).unwrap();
            } else if r == dst {
                let mut got = vec![0i64; msg.len()];
                g.recv(&mut got, src).unwrap();
                assert_eq!(got, msg, "send {src} -> {dst}");
            }
        }
    }
}

pub fn scenario_all() {
    let g = init(Backend::Any).unwrap();
    let sizes = [0usize, 1, 7, 1000, 70_001];
    check_collectives(&g, &sizes);
    check_p2p(&g);
    // A large message takes every lane of the ring.
    let mut big = vec![1.0f32; 600_001];
    g.all_sum(&mut big).unwrap();
    assert!(big.iter().all(|&v| v == g.size() as f32));
    // Messages from 4 MiB take the ring's threaded path (through shared
    // memory between ranks on one host), sizes not divisible by the world.
    // Ring only: over QUIC they add load that the kill tests running
    // beside them cannot afford on two cores.
    if g.backend() == "ring" {
        check_collectives_of(&g, Dtype::F32, &[1_200_007]);
        check_collectives_of(&g, Dtype::BF16, &[2_100_013]);
        check_collectives_of(&g, Dtype::I64, &[600_011]);
    }
    // Split: even and odd ranks, reversed order within each.
    let sub = g.split((g.rank() % 2) as i32, -(g.rank() as i32)).unwrap();
    let members: Vec<u32> = (0..g.size() as u32)
        .filter(|q| q % 2 == (g.rank() % 2) as u32)
        .rev()
        .collect();
    assert_eq!(sub.size(), members.len());
    assert_eq!(members[sub.rank()], g.rank() as u32);
    let gathered = sub.all_gather(&[g.rank() as u32]).unwrap();
    assert_eq!(gathered, members);
    check_collectives(&sub, &[0, 5, 40_000]);
    if sub.size() > 1 {
        check_p2p(&sub);
    }
    g.barrier().unwrap();
    println!(
        "RANK {} OK ({}, shm peers {})",
        g.rank(),
        g.backend(),
        g.shared_memory_peers()
    );
}

/// Array-level collectives (`mlx_dist::all_sum(&Array, ..)` etc.) through the graph.
pub fn scenario_arrays() {
    use mlx_array::Array;
    let g = init(Backend::Any).unwrap();
    let (n, r) = (g.size(), g.rank());
    for len in [0usize, 1, 7, 1001, 70_001] {
        let mine: Vec<f32> = (0..len).map(|i| val(r, i, Dtype::F32) as f32).collect();
        let x = Array::from_vec(mine.clone(), &[len]).unwrap();
        let want = |op| -> Vec<f32> {
            (0..len)
                .map(|i| reference(n, i, Dtype::F32, op) as f32)
                .collect()
        };
        assert_eq!(
            mlx_dist::all_sum(&x, &g).unwrap().to_vec::<f32>().unwrap(),
            want(ReduceOp::Sum),
            "all_sum f32 len {len}"
        );
        assert_eq!(
            mlx_dist::all_max(&x, &g).unwrap().to_vec::<f32>().unwrap(),
            want(ReduceOp::Max),
            "all_max f32 len {len}"
        );
        assert_eq!(
            mlx_dist::all_min(&x, &g).unwrap().to_vec::<f32>().unwrap(),
            want(ReduceOp::Min),
            "all_min f32 len {len}"
        );
        let gathered: Vec<f32> = (0..n)
            .flat_map(|q| (0..len).map(move |i| val(q, i, Dtype::F32) as f32))
            .collect();
        assert_eq!(
            mlx_dist::all_gather(&x, &g)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            gathered,
            "all_gather len {len}"
        );
        let ints: Vec<i32> = (0..len).map(|i| val(r, i, Dtype::I32) as i32).collect();
        let xi = Array::from_vec(ints, &[len]).unwrap();
        let wi: Vec<i32> = (0..len)
            .map(|i| reference(n, i, Dtype::I32, ReduceOp::Sum) as i32)
            .collect();
        assert_eq!(
            mlx_dist::all_sum(&xi, &g).unwrap().to_vec::<i32>().unwrap(),
            wi,
            "all_sum i32 len {len}"
        );
        // sum_scatter over a [n * len] array: rank r gets the sums of block r.
        let full: Vec<f32> = (0..len * n).map(|i| val(r, i, Dtype::F32) as f32).collect();
        let xs = Array::from_vec(full, &[len * n]).unwrap();
        let ws: Vec<f32> = (r * len..(r + 1) * len)
            .map(|i| reference(n, i, Dtype::F32, ReduceOp::Sum) as f32)
            .collect();
        assert_eq!(
            mlx_dist::sum_scatter(&xs, &g)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            ws,
            "sum_scatter len {len}"
        );
    }
    // A 2-D array keeps its shape.
    let x = Array::from_vec(vec![r as f32 + 1.0; 6], &[2, 3]).unwrap();
    let y = mlx_dist::all_sum(&x, &g).unwrap();
    assert_eq!(y.shape(), &[2, 3]);
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![(n * (n + 1) / 2) as f32; 6]
    );
    g.barrier().unwrap();
    println!("RANK {r} OK ({})", g.backend());
}

/// `init(Backend::Mpi)` with no launcher: a world of one.
pub fn scenario_single() {
    let g = init(Backend::Mpi).unwrap();
    assert_eq!((g.rank(), g.size()), (0, 1));
    let mut x = vec![2.5f32; 3];
    g.all_sum(&mut x).unwrap();
    assert_eq!(x, vec![2.5; 3]);
    g.barrier().unwrap();
    println!("SINGLE OK");
}

pub fn scenario_kill() {
    let g = init(Backend::Any).unwrap();
    if g.rank() == 1 {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: sends SIGKILL to this very process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
    }
    let mut x = vec![1.0f32; 1 << 20];
    let t = Instant::now();
    loop {
        if let Err(e) = g.all_sum(&mut x) {
            println!(
                "KILLTEST culprit={:?} after {:?}: {e}",
                e.culprit(),
                t.elapsed()
            );
            std::process::exit(3);
        }
        assert!(t.elapsed() < Duration::from_secs(60));
    }
}

pub fn scenario_mismatch() {
    let g = init(Backend::Any).unwrap();
    let mut x = vec![0u8; if g.rank() == 0 { 400 } else { 800 }];
    let e = g.all_sum_bytes(&mut x, Dtype::F32).unwrap_err();
    // A rank that comes to the collective after the mismatch has spread
    // finds the communicator failed, with the mismatch as the reason.
    let named = match &e {
        DistError::Mismatch { .. } | DistError::Aborted { .. } | DistError::PeerClosed { .. } => {
            true
        }
        DistError::Poisoned { reason, .. } => reason.contains("collective mismatch"),
        _ => false,
    };
    println!("MISMATCH rank {} named={named}: {e}", g.rank());
}

/// The folder where the fault scenarios write pids, progress and verdicts.
pub const FAULT_DIR: &str = "MLX_FAULT_DIR";
/// The message size of the fault loop, in bytes.
pub const FAULT_BYTES: &str = "MLX_FAULT_BYTES";

fn fault_dir() -> std::path::PathBuf {
    std::env::var_os(FAULT_DIR).expect("MLX_FAULT_DIR").into()
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Writes `text` to `name` in the fault folder, atomically.
fn fault_note(name: &str, text: &str) {
    let dir = fault_dir();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

/// all_sums of `MLX_FAULT_BYTES` bytes in a loop until one fails (the test
/// kills or stops a rank): writes `pid-R`, `started-R` after three rounds,
/// and on failure `fault-R` = "culprit unix_ms message", then exits 3.
pub fn scenario_fault_loop() {
    let g = init(Backend::Any).unwrap();
    let r = g.rank();
    fault_note(&format!("pid-{r}"), &std::process::id().to_string());
    let bytes: usize = std::env::var(FAULT_BYTES).unwrap().parse().unwrap();
    let mut x = vec![1.0f32; bytes / 4];
    let t = Instant::now();
    for i in 0u64.. {
        if let Err(e) = g.all_sum(&mut x) {
            let c = e.culprit().map_or("none".to_string(), |c| c.to_string());
            fault_note(&format!("fault-{r}"), &format!("{c} {} {e}", unix_ms()));
            std::process::exit(3);
        }
        if i == 2 {
            fault_note(&format!("started-{r}"), "");
        }
        assert!(t.elapsed() < Duration::from_secs(120), "no fault came");
    }
}

/// Rank 0 computes on its main thread for `MLX_BUSY_MS` before each of
/// two all_sums the others already wait in; every rank must succeed.
pub fn scenario_busy() {
    let g = init(Backend::Any).unwrap();
    let busy = Duration::from_millis(std::env::var("MLX_BUSY_MS").unwrap().parse().unwrap());
    for round in 0..2 {
        if g.rank() == 0 {
            let t = Instant::now();
            let mut acc = 0u64;
            while t.elapsed() < busy {
                acc = std::hint::black_box(acc.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let mut x = vec![1.0f32; 1 << 16];
        g.all_sum(&mut x).unwrap();
        assert_eq!(x[0], g.size() as f32, "round {round}");
    }
    println!("BUSY rank {} OK", g.rank());
}

/// One all_sum of `MLX_LAST_BYTES` bytes (rank `MLX_LAST_SLOW` arrives 20 ms
/// late), then the process exits: its last act is the collective.
pub fn scenario_last() {
    let g = init(Backend::Any).unwrap();
    let bytes: usize = std::env::var("MLX_LAST_BYTES").unwrap().parse().unwrap();
    let slow: usize = std::env::var("MLX_LAST_SLOW").unwrap().parse().unwrap();
    if g.rank() == slow {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut x = vec![1.0f32; bytes / 4];
    g.all_sum(&mut x).unwrap();
    assert_eq!(x[x.len() - 1], g.size() as f32);
    println!("LAST rank {} OK", g.rank());
}

/// Connects, sums, then holds the connections open for `MLX_HOLD_MS`
/// (so that a test can look at them), then sums again.
pub fn scenario_hold() {
    let g = init(Backend::Any).unwrap();
    let mut x = vec![1.0f32; 1 << 20];
    g.all_sum(&mut x).unwrap();
    println!("HOLD rank {}", g.rank());
    let ms: u64 = std::env::var("MLX_HOLD_MS").unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_millis(ms));
    g.all_sum(&mut x).unwrap();
    assert!(x.iter().all(|&v| v == (g.size() * g.size()) as f32));
    println!("HOLD rank {} OK", g.rank());
}

/// Not a rank: holds a TCP listener on `MLX_LISTEN` (as another job's
/// rank would) for `MLX_HOLD_MS`.
pub fn scenario_listen() {
    let addr = std::env::var("MLX_LISTEN").unwrap();
    let _l = std::net::TcpListener::bind(&addr).unwrap();
    println!("LISTENING {addr}");
    let ms: u64 = std::env::var("MLX_HOLD_MS").unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_millis(ms));
}

/// A small deterministic generator, the same on every rank.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `MLX_SOAK_OPS` random collectives (op, dtype, size, group split, seed
/// from `MLX_SOAK_SEED`) checked against the reference on every rank.
pub fn scenario_soak() {
    let g = init(Backend::Any).unwrap();
    let ops: u64 = std::env::var("MLX_SOAK_OPS").unwrap().parse().unwrap();
    let seed: u64 = std::env::var("MLX_SOAK_SEED").unwrap().parse().unwrap();
    let mut rng = SplitMix(seed);
    // Groups to draw from: the world, halves by parity, and halves by order.
    let n = g.size();
    let groups = [
        g.clone(),
        g.split((g.rank() % 2) as i32, g.rank() as i32).unwrap(),
        g.split((g.rank() < n / 2) as i32, -(g.rank() as i32))
            .unwrap(),
    ];
    let t = Instant::now();
    for k in 0..ops {
        let sub = &groups[rng.below(3) as usize];
        let d = ALL_DTYPES[rng.below(ALL_DTYPES.len() as u64) as usize];
        // Mostly small, some on the ring's paths, now and then past the threaded size.
        let len = match rng.below(100) {
            0..=69 => rng.below(64) as usize,
            70..=96 => rng.below(40_000) as usize,
            _ => (1 << 20) + rng.below(1 << 20) as usize,
        };
        let (sn, sr) = (sub.size(), sub.rank());
        let shift = (k % 7) as usize;
        let mine = encode((0..len).map(|i| val(sr, i + shift, d)), d);
        match rng.below(6) {
            0..=2 => {
                let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min][rng.below(3) as usize];
                let mut buf = mine;
                sub.all_reduce_bytes(&mut buf, d, op).unwrap();
                let want = encode((0..len).map(|i| reference(sn, i + shift, d, op)), d);
                assert!(buf == want, "op {k}: {op:?} {d:?} len {len}");
            }
            3 => {
                let all = sub.all_gather_bytes(&mine, d).unwrap();
                let want: Vec<u8> = (0..sn)
                    .flat_map(|q| encode((0..len).map(|i| val(q, i + shift, d)), d))
                    .collect();
                assert!(all == want, "op {k}: all_gather {d:?} len {len}");
            }
            4 if d != Dtype::Bool => {
                let full = encode((0..len * sn).map(|i| val(sr, i + shift, d)), d);
                let got = sub.sum_scatter_bytes(&full, d).unwrap();
                let want = encode(
                    (sr * len..(sr + 1) * len).map(|i| reference(sn, i + shift, d, ReduceOp::Sum)),
                    d,
                );
                assert!(got == want, "op {k}: sum_scatter {d:?} len {len}");
            }
            _ if sn > 1 => {
                // A message from one rank of the group to another.
                let src = rng.below(sn as u64) as usize;
                let dst = (src + 1 + rng.below(sn as u64 - 1) as usize) % sn;
                let msg = encode((0..len).map(|i| val(src, i + shift, d)), d);
                if sr == src {
                    sub.send_bytes(&msg, d, dst).unwrap();
                } else if sr == dst {
                    let mut got = vec![0u8; msg.len()];
                    sub.recv_bytes(&mut got, d, src).unwrap();
                    assert!(got == msg, "op {k}: send {src} -> {dst} {d:?} len {len}");
                }
            }
            _ => sub.barrier().unwrap(),
        }
    }
    g.barrier().unwrap();
    println!("SOAK rank {} OK {ops} ops in {:?}", g.rank(), t.elapsed());
}

/// Rank 1 fails before the first collective, with a panic or (`how` =
/// "exit") an exit with status 3 as a `main` that returns an error does;
/// the others write `pid-R` in the fault folder and wait in an all_sum.
pub fn scenario_fail_early(how: &str) {
    let g = init(Backend::Any).unwrap();
    fault_note(
        &format!("pid-{}", g.rank()),
        &std::process::id().to_string(),
    );
    if g.rank() == 1 {
        match how {
            "panic" => panic!("rank 1 fails before its first collective"),
            _ => std::process::exit(3),
        }
    }
    let mut x = vec![1.0f32; 4];
    let r = g.all_sum(&mut x);
    println!("FAIL_EARLY rank {} left the collective: {r:?}", g.rank());
}

/// Runs the scenario named by `MLX_DIST_TEST_SCENARIO`, if any (as a rank).
pub fn run_scenario() {
    match std::env::var(SCENARIO).as_deref() {
        Ok("all") => scenario_all(),
        Ok("arrays") => scenario_arrays(),
        Ok("kill") => scenario_kill(),
        Ok("mismatch") => scenario_mismatch(),
        Ok("single") => scenario_single(),
        Ok("fault_loop") => scenario_fault_loop(),
        Ok("busy") => scenario_busy(),
        Ok("soak") => scenario_soak(),
        Ok("last") => scenario_last(),
        Ok("hold") => scenario_hold(),
        Ok("listen") => scenario_listen(),
        Ok("fail_early_panic") => scenario_fail_early("panic"),
        Ok("fail_early_exit") => scenario_fail_early("exit"),
        Ok(other) => panic!("unknown scenario {other}"),
        Err(_) => {}
    }
}
