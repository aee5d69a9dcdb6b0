//! In-process tests of the TCP mesh and the collectives: each rank is a thread.

use std::net::TcpListener;
use std::time::Duration;

use crate::collectives::comm::MeshComm;
use crate::config::Config;
use crate::error::DistError;
use crate::group::Group;
use crate::mesh::Mesh;
use crate::transports::tcp;

/// Connects `n` ranks in this process and runs `f(group)` on each in its own thread.
pub(crate) fn with_world<T: Send>(
    n: usize,
    tweak: impl Fn(&mut Config) + Sync,
    f: impl Fn(Group) -> T + Sync,
) -> Vec<T> {
    with_world_hook(n, |_| {}, tweak, f)
}

/// [`with_world`] that first calls `hook` with the addresses, before any rank starts.
pub(crate) fn with_world_hook<T: Send>(
    n: usize,
    hook: impl FnOnce(&[String]),
    tweak: impl Fn(&mut Config) + Sync,
    f: impl Fn(Group) -> T + Sync,
) -> Vec<T> {
    with_world_on(n, false, hook, tweak, f)
}

/// [`with_world_hook`] over the plain ring or (`encrypted`) the ring over TLS.
pub(crate) fn with_world_on<T: Send>(
    n: usize,
    encrypted: bool,
    hook: impl FnOnce(&[String]),
    tweak: impl Fn(&mut Config) + Sync,
    f: impl Fn(Group) -> T + Sync,
) -> Vec<T> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let hosts: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    hook(&hosts);
    std::thread::scope(|s| {
        let hs: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let mut cfg = Config::new(r, hosts.clone(), [1; 16], b"secret".to_vec());
                cfg.connect_timeout = Duration::from_secs(10);
                tweak(&mut cfg);
                let f = &f;
                s.spawn(move || {
                    let mesh = Mesh::new(&cfg, tcp::connect_mesh(&cfg, l, encrypted).unwrap());
                    let name = if encrypted { "tls" } else { "ring" };
                    f(Group::from_impl(std::sync::Arc::new(
                        MeshComm::world(mesh, name).unwrap(),
                    )))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn data(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13) % 101) as f32 - 50.0)
        .collect()
}

#[test]
fn all_reduce_all_paths_match_reference() {
    for n in [2, 3] {
        let sizes = [0usize, 1, 5, 1000, 40_000, 300_001];
        let out = with_world(
            n,
            |c| {
                c.block_bytes = 4096;
                c.connections_per_peer = 2;
            },
            |g| {
                sizes
                    .iter()
                    .map(|&len| {
                        let mut x = data(g.rank(), len);
                        g.all_sum(&mut x).unwrap();
                        let mut m = data(g.rank(), len);
                        g.all_max(&mut m).unwrap();
                        (x, m)
                    })
                    .collect::<Vec<_>>()
            },
        );
        for (k, &len) in sizes.iter().enumerate() {
            let d: Vec<Vec<f32>> = (0..n).map(|r| data(r, len)).collect();
            let want: Vec<f32> = (0..len).map(|i| (0..n).map(|r| d[r][i]).sum()).collect();
            let wmax: Vec<f32> = (0..len)
                .map(|i| (0..n).map(|r| d[r][i]).fold(f32::MIN, f32::max))
                .collect();
            for (r, o) in out.iter().enumerate() {
                assert_eq!(o[k].0, want, "all_sum n={n} len={len} rank={r}");
                assert_eq!(o[k].1, wmax, "all_max n={n} len={len} rank={r}");
            }
        }
    }
}

/// `sum_scatter_into` over every path: the small-message exchange, the
/// polled ring (one lane and several) and the threaded ring, with two ranks
/// (the sums land straight in the output) and three (one more block passes
/// through scratch), and a wrong output length named.
#[test]
fn sum_scatter_into_every_path() {
    for n in [2usize, 3] {
        with_world(
            n,
            |c| c.block_bytes = 64 << 10,
            |g| {
                let r = g.rank();
                // Per-rank blocks of 16 B, ~0.5 MiB, ~1.5 MiB and ~5 MiB (f32).
                for len in [4usize, 130_001, 400_003, 1_300_007] {
                    let x: Vec<f32> = (0..len * n)
                        .map(|i| ((i % 1009) as f32) * (r as f32 + 1.0))
                        .collect();
                    let mut out = vec![f32::NAN; len];
                    g.sum_scatter_into(&x, &mut out).unwrap();
                    let ranks: f32 = (1..=n).map(|q| q as f32).sum();
                    let want: Vec<f32> = (r * len..(r + 1) * len)
                        .map(|i| ((i % 1009) as f32) * ranks)
                        .collect();
                    assert!(out == want, "n={n} len={len} rank {r}");
                }
                let err = g
                    .sum_scatter_into(&[1.0f32; 6], &mut [0.0f32; 4])
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("the output holds 16 bytes"), "{err}");
            },
        );
    }
}

#[test]
fn gather_scatter_split_and_p2p() {
    let n = 4;
    let out = with_world(
        n,
        |c| c.block_bytes = 1024,
        |g| {
            let r = g.rank();
            let mut res = Vec::new();
            for len in [0usize, 3, 50_000] {
                let x: Vec<i32> = (0..len).map(|i| (i + 1000 * r) as i32).collect();
                let ag = g.all_gather(&x).unwrap();
                let want: Vec<i32> = (0..n)
                    .flat_map(|q| (0..len).map(move |i| (i + 1000 * q) as i32))
                    .collect();
                assert_eq!(ag, want, "all_gather len={len}");
                let full: Vec<i64> = (0..len * n).map(|i| (i * (r + 1)) as i64).collect();
                let ss = g.sum_scatter(&full).unwrap();
                let tot: i64 = (1..=n as i64).sum();
                let want: Vec<i64> = (r * len..(r + 1) * len).map(|i| i as i64 * tot).collect();
                assert_eq!(ss, want, "sum_scatter len={len}");
                res.push(ag.len());
            }
            let sub = g.split((r % 2) as i32, -(r as i32)).unwrap();
            assert_eq!(sub.size(), 2);
            // Keys are -rank, so the order within each colour is reversed.
            assert_eq!(sub.rank(), 1 - r / 2);
            let mut v = vec![r as u32 + 1];
            sub.all_sum(&mut v).unwrap();
            assert_eq!(v[0] as usize, if r % 2 == 0 { 1 + 3 } else { 2 + 4 });
            for src in 0..n {
                for dst in 0..n {
                    if src == dst {
                        continue;
                    }
                    if r == src {
                        g.send(&[src as u32 * 10 + dst as u32; 3], dst).unwrap();
                    } else if r == dst {
                        let mut b = [0u32; 3];
                        g.recv(&mut b, src).unwrap();
                        assert_eq!(b, [src as u32 * 10 + dst as u32; 3]);
                    }
                }
            }
            g.barrier().unwrap();
            res
        },
    );
    assert_eq!(out.len(), n);
}

#[test]
fn mismatched_sizes_fail_on_every_rank() {
    let out = with_world(
        3,
        |_| {},
        |g| {
            let len = if g.rank() == 1 { 11 } else { 10 };
            let mut x = vec![1.0f32; len];
            let e = g.all_sum(&mut x).unwrap_err();
            let again = g.all_sum(&mut x).unwrap_err();
            assert!(matches!(again, DistError::Poisoned { .. }));
            e.to_string()
        },
    );
    for (r, e) in out.iter().enumerate() {
        assert!(
            e.contains("mismatch") || e.contains("rank"),
            "rank {r}: {e}"
        );
    }
}

#[test]
fn a_peer_that_leaves_early_is_named() {
    let out = with_world(
        3,
        |c| c.collective_timeout = Duration::from_secs(5),
        |g| {
            if g.rank() == 2 {
                return None; // closes its group cleanly, one collective early
            }
            let mut x = vec![1.0f32; 1 << 20];
            let t = std::time::Instant::now();
            let e = g.all_sum(&mut x).unwrap_err();
            assert!(t.elapsed() < Duration::from_secs(4), "{e}");
            Some(e)
        },
    );
    // Every survivor fails within the deadline and names rank 2, also the one
    // that only saw the first survivor's links close (its witness says why).
    let errs: Vec<(usize, DistError)> = out
        .into_iter()
        .enumerate()
        .filter_map(|(r, e)| e.map(|e| (r, e)))
        .collect();
    assert_eq!(errs.len(), 2);
    for (r, e) in &errs {
        assert_eq!(e.culprit(), Some(2), "rank {r}: {e}");
        assert!(e.to_string().contains("rank 2"), "rank {r}: {e}");
    }
}

/// Timeouts short enough for a test: liveness 300 ms, collective `collective`.
fn quick(collective: Duration) -> impl Fn(&mut Config) + Sync {
    move |c| {
        c.liveness_timeout = Duration::from_millis(300);
        c.collective_timeout = collective;
    }
}

#[test]
fn a_busy_rank_is_waited_for_far_past_the_liveness_timeout() {
    let out = with_world(3, quick(Duration::from_secs(20)), |g| {
        if g.rank() == 0 {
            // Ten liveness timeouts of work before the collective.
            std::thread::sleep(Duration::from_secs(3));
        }
        let mut x = vec![1.0f32; 1000];
        g.all_sum(&mut x).map(|()| x[0])
    });
    for (r, v) in out.into_iter().enumerate() {
        assert_eq!(v.unwrap_or_else(|e| panic!("rank {r}: {e}")), 3.0);
    }
}

#[test]
fn a_live_rank_late_past_the_collective_timeout_is_named_late() {
    let t = std::time::Instant::now();
    let out = with_world(3, quick(Duration::from_millis(1500)), |g| {
        if g.rank() == 2 {
            std::thread::sleep(Duration::from_secs(4));
        }
        let mut x = vec![1.0f32; 1000];
        g.all_sum(&mut x).unwrap_err()
    });
    for (r, e) in out.iter().enumerate() {
        assert_eq!(e.culprit(), Some(2), "rank {r}: {e}");
    }
    // The first survivor to time out names rank 2 late; the other may hear
    // it from that one first (an Aborted relaying the same words).
    assert!(
        out.iter()
            .take(2)
            .any(|e| matches!(e, DistError::Late { late, .. } if late == &[2])),
        "{out:?}"
    );
    for (r, e) in out.iter().take(2).enumerate() {
        let m = e.to_string();
        assert!(
            m.contains("rank 2 is late") && m.contains("not in a collective"),
            "rank {r}: {m}"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn ranks_that_exit_right_after_their_last_collective_fail_nobody() {
    // Each round: every rank's last act is a collective, then it drops its
    // group at once; the slowest rank must still complete (issue 5).
    for round in 0..20 {
        let out = with_world(3, quick(Duration::from_secs(10)), |g| {
            let len = if round % 2 == 0 { 10 } else { 300_000 };
            let mut x = vec![g.rank() as f32; len];
            if g.rank() == round % 3 {
                std::thread::sleep(Duration::from_millis(20));
            }
            g.all_sum(&mut x).map(|()| x[len - 1])
        });
        for (r, v) in out.into_iter().enumerate() {
            assert_eq!(
                v.unwrap_or_else(|e| panic!("round {round} rank {r}: {e}")),
                3.0
            );
        }
    }
}

#[test]
fn strangers_are_refused_and_the_job_still_forms() {
    use crate::transports::handshake::{HandshakeError, JobCredentials, client};
    let mut strangers = Vec::new();
    let out = with_world_hook(
        2,
        |hosts| {
            // Connect before the ranks start, so rank 0 meets the strangers first.
            for (job_id, secret) in [
                ([1u8; 16], b"wrong secret".to_vec()),
                ([2u8; 16], b"secret".to_vec()),
            ] {
                let addr = hosts[0].clone();
                strangers.push(std::thread::spawn(move || {
                    let mut s = std::net::TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let cred = JobCredentials {
                        job_id,
                        secret,
                        world: 2,
                        // Two data links and the witness.
                        links: 3,
                    };
                    client(&mut s, &cred, 1, 0, 0)
                }));
            }
        },
        |_| {},
        |g| {
            let mut x = vec![g.rank() as i32 + 1; 4];
            g.all_sum(&mut x).unwrap();
            x[0]
        },
    );
    assert_eq!(out, vec![3, 3]);
    let results: Vec<_> = strangers.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        matches!(results[0], Err(HandshakeError::BadMac)),
        "{:?}",
        results[0]
    );
    assert!(
        matches!(&results[1], Err(HandshakeError::Refused(r)) if r.contains("job id")),
        "{:?}",
        results[1]
    );
}

/// bfloat16 and float16 sums accumulate in f32 and round once, at every
/// size: small ones in the direct exchange, where every rank's buffer is
/// at hand, and large ones at each block's owner (the ring's partial sums
/// would be rounded at every hop). At four ranks `1 + 3 * 2^-8` in bfloat16
/// is the tie between `1 + 2^-7` and `1 + 2^-6` and rounds to the even
/// one, where rounding after each rank's term would leave 1 (each `+ 2^-8`
/// is a tie that rounds back to 1); in float16 the same with `2^-11`.
/// `sum_scatter` alike. The large sizes are not multiples of the world
/// (uneven blocks): they go to the owners, the smallest to the direct exchange.
#[test]
fn half_precision_sums_round_once_at_every_size() {
    use half::{bf16, f16};
    fn check<T: mlx_array::Element + PartialEq + std::fmt::Debug>(
        one: T,
        term: T,
        want: T,
        len: usize,
    ) {
        let out = with_world(
            4,
            |_| {},
            |g| {
                let x0 = if g.rank() == 0 { one } else { term };
                let mut x = vec![x0; len];
                g.all_sum(&mut x).unwrap();
                let input = vec![x0; 4 * len];
                let mut mine = vec![x0; len];
                g.sum_scatter_into(&input, &mut mine).unwrap();
                (x, mine)
            },
        );
        for (r, (all, mine)) in out.iter().enumerate() {
            let bad = all.iter().position(|v| *v != want);
            assert!(
                bad.is_none(),
                "{len}, rank {r}: all_sum [{bad:?}] {:?}",
                bad.map(|i| all[i])
            );
            let bad = mine.iter().position(|v| *v != want);
            assert!(
                bad.is_none(),
                "{len}, rank {r}: sum_scatter [{bad:?}] {:?}",
                bad.map(|i| mine[i])
            );
        }
    }
    for len in [3, 30_001, 1_500_003] {
        let b = |x: f32| bf16::from_f32(x);
        check(b(1.0), b(1.0 / 256.0), b(1.0 + 2.0 / 128.0), len);
        let h = |x: f32| f16::from_f32(x);
        check(h(1.0), h(1.0 / 2048.0), h(1.0 + 2.0 / 1024.0), len);
    }
}

/// The smallest socket buffer accepted carries the largest message of the
/// direct path (both ranks write it whole before reading) without waiting
/// for the collective timeout; shared memory off, so TCP carries it. (At
/// 8 KiB the same sum stalls until the timeout.)
#[test]
fn the_smallest_socket_buffer_accepted_carries_small_collectives() {
    let out = with_world(
        2,
        |c| {
            c.socket_buffer = crate::config::MIN_SOCKET_BUFFER as usize;
            c.shared_memory = false;
            c.collective_timeout = Duration::from_secs(5);
        },
        |g| {
            let n = g.size();
            let mut x = vec![1.0f32; 64 * 1024 / 4 / (n - 1)];
            let r = g.all_sum(&mut x).map(|()| x[0]);
            r.map_err(|e| e.to_string())
        },
    );
    assert_eq!(out, vec![Ok(2.0), Ok(2.0)]);
}
