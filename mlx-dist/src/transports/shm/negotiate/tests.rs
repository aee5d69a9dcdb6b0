//! Tests of the shared-memory negotiation, over socket pairs and between
//! processes.

use super::*;
use std::net::TcpListener;

#[test]
fn ranks_that_disable_it_or_cannot_map_it_keep_tcp() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    for (offering, answering) in [(false, true), (true, false)] {
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let o = offer(&mut a, offering).unwrap();
        assert!(answer(&mut b, answering).unwrap().is_none());
        assert!(o.settle(&mut a).unwrap().is_none());
    }
    // An offer of a segment with the wrong nonce (another host's namesake) is declined.
    let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut b, _) = l.accept().unwrap();
    let o = offer(&mut a, true).unwrap();
    if let Some((seg, _)) = &o.seg {
        let mut n = seg.nonce();
        n[0] ^= 1;
        seg.write_nonce(&n);
    }
    assert!(answer(&mut b, true).unwrap().is_none());
    let handle = o.seg.as_ref().unwrap().1.clone();
    assert!(o.settle(&mut a).unwrap().is_none());
    assert!(named::open(&handle).is_err(), "the name is removed");
    // An offer given up before its answer (another link failed) removes its name too.
    let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let o = offer(&mut a, true).unwrap();
    let handle = o.seg.as_ref().unwrap().1.clone();
    assert!(named::open(&handle).is_ok());
    drop(o);
    assert!(named::open(&handle).is_err(), "the name is removed on drop");
}

#[test]
fn an_offer_of_a_segment_shorter_than_the_layout_is_declined() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut b, _) = l.accept().unwrap();
    let o = offer(&mut a, true).unwrap();
    let handle = o.seg.as_ref().unwrap().1.clone();
    // The nonce's page stays; the slots are cut off.
    named::open(&handle).unwrap().set_len(4096).unwrap();
    assert!(answer(&mut b, true).unwrap().is_none());
    assert!(o.settle(&mut a).unwrap().is_none());
}

/// The variable that makes [`offering_child`] a rank that offers a
/// segment to this address and waits for an answer that never comes.
const OFFER_TO: &str = "MLX_SHM_TEST_OFFER_TO";

/// A rank in set-up, in a process of its own (see the test below).
#[test]
fn offering_child() {
    let Ok(addr) = std::env::var(OFFER_TO) else {
        return;
    };
    let mut s = TcpStream::connect(addr).unwrap();
    let o = offer(&mut s, true).unwrap();
    let _ = o.settle(&mut s);
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn a_segment_whose_creator_was_killed_during_set_up_is_swept_by_the_next_job() {
    use std::time::{Duration, Instant};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "transports::shm::negotiate::tests::offering_child",
            "--nocapture",
            "-q",
        ])
        .env(OFFER_TO, l.local_addr().unwrap().to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    l.set_nonblocking(true).unwrap();
    let t = Instant::now();
    let mut s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(_) if t.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => {
                let _ = child.kill();
                panic!("the offering rank never connected: {e}");
            }
        }
    };
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = [0u8; 2];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[0], OFFER);
    let mut handle = vec![0u8; head[1] as usize];
    s.read_exact(&mut handle).unwrap();
    let handle = String::from_utf8(handle).unwrap();
    // SIGKILL between the offer and the answer: the name stays behind.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        named::open(&handle).is_ok(),
        "the killed rank left {handle}"
    );
    // The next job on this host: its ranks still share memory, and the
    // segment of the dead rank is gone.
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let b = loop {
        match l.accept() {
            Ok((b, _)) => break b,
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    b.set_nonblocking(false).unwrap();
    let (mut rows0, mut rows1) = (vec![vec![], vec![a]], vec![vec![b], vec![]]);
    let (s0, s1) = std::thread::scope(|sc| {
        let h = sc.spawn(|| negotiate(0, &mut rows0, true).unwrap());
        let s1 = negotiate(1, &mut rows1, true).unwrap();
        (h.join().unwrap(), s1)
    });
    assert!(
        s0[1][0].is_some() && s1[0][0].is_some(),
        "shared memory is used"
    );
    assert!(named::open(&handle).is_err(), "{handle} was swept");
}

use proptest::prelude::*;

/// The peer's bytes to read, and what we answer.
struct Peer {
    input: io::Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Read for Peer {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Peer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Answers `bytes` as an offer: no panic, and an answer only when the
/// offer was read whole.
fn answer_bytes(bytes: Vec<u8>) -> io::Result<Option<Segment>> {
    let mut p = Peer {
        input: io::Cursor::new(bytes),
        output: Vec::new(),
    };
    let r = answer(&mut p, true);
    if r.is_ok() {
        assert!(p.output.len() <= 1);
    }
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Arbitrary bytes are declined or an error (nothing of them names
    /// a live segment with its nonce).
    #[test]
    fn any_bytes_as_an_offer_are_declined_or_an_error(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        prop_assert!(answer_bytes(bytes).map_or(true, |s| s.is_none()));
    }

    /// A well-formed offer with arbitrary handles (paths of files
    /// included) and nonces, then mutated: declined or an error.
    #[test]
    fn mutated_offers_are_declined_or_an_error(
        handle in prop_oneof![
            Just("/etc/passwd".to_string()),
            Just("/dev/zero".to_string()),
            Just("/dev/shm/../../etc/hosts".to_string()),
            Just(format!("/dev/shm/{}", segment_name(1, &[0; 8]))),
            "[ -~]{0,80}",
        ],
        nonce in any::<[u8; NONCE_LEN]>(),
        edits in crate::mutation::edits(0..4),
    ) {
        let mut b = vec![OFFER, handle.len() as u8];
        b.extend_from_slice(handle.as_bytes());
        b.extend_from_slice(&nonce);
        crate::mutation::apply(&mut b, &edits);
        prop_assert!(answer_bytes(b).map_or(true, |s| s.is_none()));
    }
}

/// A handle that is not a segment's name is declined without being
/// opened, even when it names a file as long as a segment.
#[test]
fn an_offer_naming_another_file_is_declined() {
    let p = std::env::temp_dir().join(format!("mlx-not-a-segment-{}", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(super::super::segment::segment_len() as u64)
        .unwrap();
    let handle = p.to_string_lossy().into_owned();
    let mut b = vec![OFFER, handle.len() as u8];
    b.extend_from_slice(handle.as_bytes());
    b.extend_from_slice(&[0; NONCE_LEN]); // the file's first bytes
    let r = answer_bytes(b);
    std::fs::remove_file(&p).unwrap();
    assert!(
        r.unwrap().is_none(),
        "a file that is not a segment was mapped"
    );
}
