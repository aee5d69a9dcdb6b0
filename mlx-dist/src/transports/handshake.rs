//! The connection handshake: both ends prove they belong to the same job.
//!
//! ```text
//! client -> server  HELLO  magic b"MLXH", version u16, 0u16, job id [16],
//!                          rank u32, world u32, link u32, links u32, nonce_c [32]   (72 bytes)
//! server -> client  status u8: 0 then server rank u32, nonce_s [32], mac_s [32]
//!                              or a refusal: code u8 != 0, reason len u16, reason
//! client -> server  mac_c [32]
//! server -> client  status u8: 0, or a refusal as above
//! ```
//! `mac_s = HMAC-SHA256(secret, "mlx-dist-server" | HELLO | server rank | nonce_s)`
//! and `mac_c` is the same with `"mlx-dist-client"`, so each end proves it knows
//! the job secret without sending it, and neither tag can be replayed.
//! A stranger, a rank of another job or another protocol version is refused
//! with a reason that the server logs and the client receives.

use std::io::{Read, Write};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Magic bytes that open a HELLO.
pub const HELLO_MAGIC: [u8; 4] = *b"MLXH";
/// Version of the handshake and the wire protocol it leads to.
pub const PROTOCOL_VERSION: u16 = 2;
const HELLO_LEN: usize = 72;
const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// What both ends must agree on. Its `Debug` shows no secret.
#[derive(Clone)]
pub struct JobCredentials {
    /// Random id of the job, distributed by the launcher.
    pub job_id: [u8; 16],
    /// Shared secret of the job, distributed by the launcher.
    pub secret: Vec<u8>,
    /// World size of the job.
    pub world: u32,
    /// Number of links between each pair of ranks.
    pub links: u32,
}

impl std::fmt::Debug for JobCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobCredentials")
            .field("job_id", &crate::config::hex_encode(&self.job_id))
            .field(
                "secret",
                &format_args!("<{} bytes, redacted>", self.secret.len()),
            )
            .field("world", &self.world)
            .field("links", &self.links)
            .finish()
    }
}

/// Who connected, as established by a successful server-side handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerHello {
    /// The client's world rank.
    pub rank: u32,
    /// Which of the links between the pair this connection is.
    pub link: u32,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Not our protocol at all.
    #[error("bad magic {0:02x?}: not an mlx-dist peer")]
    BadMagic([u8; 4]),
    /// Protocol versions differ.
    #[error("protocol version mismatch: ours {ours}, theirs {theirs}")]
    Version {
        /// Ours.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// Peer belongs to another job.
    #[error("job id mismatch: peer belongs to another job")]
    JobMismatch,
    /// World sizes or link counts differ.
    #[error("configuration mismatch: {0}")]
    ConfigMismatch(String),
    /// Rank out of range or unexpected.
    #[error("unexpected rank {0}")]
    BadRank(u32),
    /// The peer could not prove it knows the job secret.
    #[error("authentication failed: the peer does not know the job secret")]
    BadMac,
    /// The other end refused us.
    #[error("refused by the peer: {0}")]
    Refused(String),
    /// The server already has this link, or does not expect it.
    #[error("link {link} from rank {rank} is a duplicate or not expected")]
    Unexpected {
        /// The client's rank.
        rank: u32,
        /// The link it offered.
        link: u32,
    },
    /// The server is not the rank we dialled.
    #[error("expected rank {expected} at this address, found rank {found}")]
    WrongRank {
        /// Expected.
        expected: u32,
        /// Found.
        found: u32,
    },
    /// Transport failure during the handshake.
    #[error("I/O during handshake: {0}")]
    Io(#[from] std::io::Error),
}

impl HandshakeError {
    fn code(&self) -> u8 {
        match self {
            HandshakeError::BadMagic(_) => 1,
            HandshakeError::Version { .. } => 2,
            HandshakeError::JobMismatch => 3,
            HandshakeError::ConfigMismatch(_) => 4,
            HandshakeError::BadRank(_) => 5,
            HandshakeError::BadMac => 6,
            HandshakeError::Unexpected { .. } => 8,
            _ => 7,
        }
    }
}

fn random_nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    // getrandom only fails when the OS has no entropy source at all.
    getrandom::fill(&mut n).expect("the operating system's random source failed");
    n
}

fn mac(secret: &[u8], label: &[u8], hello: &[u8], server_rank: u32, nonce_s: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    m.update(label);
    m.update(hello);
    m.update(&server_rank.to_le_bytes());
    m.update(nonce_s);
    m
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn write_refusal<S: Write>(s: &mut S, e: &HandshakeError) {
    let reason = e.to_string();
    let r = &reason.as_bytes()[..reason.len().min(256)];
    let mut v = vec![e.code()];
    v.extend_from_slice(&(r.len() as u16).to_le_bytes());
    v.extend_from_slice(r);
    // Best effort: the peer may already be gone.
    let _ = s.write_all(&v);
    let _ = s.flush();
}

fn read_status<S: Read>(s: &mut S) -> Result<(), HandshakeError> {
    let mut st = [0u8; 1];
    s.read_exact(&mut st)?;
    if st[0] == 0 {
        return Ok(());
    }
    let mut l = [0u8; 2];
    s.read_exact(&mut l)?;
    let len = (u16::from_le_bytes(l) as usize).min(256);
    let mut r = vec![0u8; len];
    s.read_exact(&mut r)?;
    Err(HandshakeError::Refused(
        String::from_utf8_lossy(&r).into_owned(),
    ))
}

/// Runs the client side: we are `my_rank`, dialling `server_rank` for link `link`.
pub fn client<S: Read + Write>(
    s: &mut S,
    cred: &JobCredentials,
    my_rank: u32,
    server_rank: u32,
    link: u32,
) -> Result<(), HandshakeError> {
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(&HELLO_MAGIC);
    hello.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    hello.extend_from_slice(&[0, 0]);
    hello.extend_from_slice(&cred.job_id);
    for v in [my_rank, cred.world, link, cred.links] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    hello.extend_from_slice(&random_nonce());
    debug_assert_eq!(hello.len(), HELLO_LEN);
    s.write_all(&hello)?;
    s.flush()?;

    read_status(s)?;
    let mut rest = [0u8; 4 + NONCE_LEN + MAC_LEN];
    s.read_exact(&mut rest)?;
    let found = u32_at(&rest, 0);
    let nonce_s = &rest[4..4 + NONCE_LEN];
    let mac_s = &rest[4 + NONCE_LEN..];
    mac(&cred.secret, b"mlx-dist-server", &hello, found, nonce_s)
        .verify_slice(mac_s)
        .map_err(|_| HandshakeError::BadMac)?;
    if found != server_rank {
        return Err(HandshakeError::WrongRank {
            expected: server_rank,
            found,
        });
    }
    let tag = mac(&cred.secret, b"mlx-dist-client", &hello, found, nonce_s)
        .finalize()
        .into_bytes();
    s.write_all(&tag)?;
    s.flush()?;
    read_status(s)
}

/// Runs the server side as `my_rank`; returns who connected, or why they
/// were refused. Once the client has proved it knows the secret, `admit`
/// decides whether this link is wanted (not a duplicate): a refusal there
/// is sent to the client, whose handshake then fails too.
pub fn server<S: Read + Write>(
    s: &mut S,
    cred: &JobCredentials,
    my_rank: u32,
    admit: impl FnOnce(PeerHello) -> Result<(), HandshakeError>,
) -> Result<PeerHello, HandshakeError> {
    let mut hello = [0u8; HELLO_LEN];
    s.read_exact(&mut hello)?;
    let magic = [hello[0], hello[1], hello[2], hello[3]];
    if magic != HELLO_MAGIC {
        // Not our protocol: do not answer in it.
        return Err(HandshakeError::BadMagic(magic));
    }
    let check = || -> Result<PeerHello, HandshakeError> {
        let theirs = u16::from_le_bytes([hello[4], hello[5]]);
        if theirs != PROTOCOL_VERSION {
            return Err(HandshakeError::Version {
                ours: PROTOCOL_VERSION,
                theirs,
            });
        }
        if hello[8..24] != cred.job_id {
            return Err(HandshakeError::JobMismatch);
        }
        let (rank, world, link, links) = (
            u32_at(&hello, 24),
            u32_at(&hello, 28),
            u32_at(&hello, 32),
            u32_at(&hello, 36),
        );
        if world != cred.world || links != cred.links {
            return Err(HandshakeError::ConfigMismatch(format!(
                "peer has world {world} and {links} links per peer, we have world {} and {} links",
                cred.world, cred.links
            )));
        }
        if rank >= world || rank == my_rank || link >= links {
            return Err(HandshakeError::BadRank(rank));
        }
        Ok(PeerHello { rank, link })
    };
    let peer = match check() {
        Ok(p) => p,
        Err(e) => {
            write_refusal(s, &e);
            return Err(e);
        }
    };
    let nonce_s = random_nonce();
    let tag = mac(&cred.secret, b"mlx-dist-server", &hello, my_rank, &nonce_s)
        .finalize()
        .into_bytes();
    let mut reply = vec![0u8];
    reply.extend_from_slice(&my_rank.to_le_bytes());
    reply.extend_from_slice(&nonce_s);
    reply.extend_from_slice(&tag);
    s.write_all(&reply)?;
    s.flush()?;
    let mut mac_c = [0u8; MAC_LEN];
    s.read_exact(&mut mac_c)?;
    if mac(&cred.secret, b"mlx-dist-client", &hello, my_rank, &nonce_s)
        .verify_slice(&mac_c)
        .is_err()
    {
        let e = HandshakeError::BadMac;
        write_refusal(s, &e);
        return Err(e);
    }
    if let Err(e) = admit(peer) {
        write_refusal(s, &e);
        return Err(e);
    }
    s.write_all(&[0])?;
    s.flush()?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn cred(secret: &[u8]) -> JobCredentials {
        JobCredentials {
            job_id: [7; 16],
            secret: secret.to_vec(),
            world: 4,
            links: 2,
        }
    }

    fn pair(
        server_cred: JobCredentials,
        client_cred: JobCredentials,
        client_rank: u32,
    ) -> (
        Result<PeerHello, HandshakeError>,
        Result<(), HandshakeError>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server(&mut s, &server_cred, 0, |_| Ok(()))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let rc = client(&mut c, &client_cred, client_rank, 0, 1);
        drop(c);
        (t.join().unwrap(), rc)
    }

    #[test]
    fn same_job_is_accepted() {
        let (s, c) = pair(cred(b"k"), cred(b"k"), 3);
        assert_eq!(s.unwrap(), PeerHello { rank: 3, link: 1 });
        c.unwrap();
    }

    #[test]
    fn wrong_secret_is_refused_on_both_ends() {
        let (s, c) = pair(cred(b"k"), cred(b"stranger"), 3);
        assert!(
            matches!(s, Err(HandshakeError::BadMac | HandshakeError::Io(_))),
            "{s:?}"
        );
        assert!(matches!(c, Err(HandshakeError::BadMac)), "{c:?}");
    }

    #[test]
    fn other_job_and_bad_rank_are_refused() {
        let mut other = cred(b"k");
        other.job_id = [8; 16];
        let (s, c) = pair(cred(b"k"), other, 3);
        assert!(matches!(s, Err(HandshakeError::JobMismatch)));
        assert!(matches!(c, Err(HandshakeError::Refused(r)) if r.contains("job id")));
        let (s, _) = pair(cred(b"k"), cred(b"k"), 9);
        assert!(matches!(s, Err(HandshakeError::BadRank(9))));
        let mut w = cred(b"k");
        w.world = 5;
        let (s, _) = pair(cred(b"k"), w, 1);
        assert!(matches!(s, Err(HandshakeError::ConfigMismatch(_))));
    }

    #[test]
    fn a_link_the_server_does_not_admit_fails_on_both_ends() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server(&mut s, &cred(b"k"), 0, |h| {
                Err(HandshakeError::Unexpected {
                    rank: h.rank,
                    link: h.link,
                })
            })
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let rc = client(&mut c, &cred(b"k"), 3, 0, 1);
        let rs = t.join().unwrap();
        assert!(
            matches!(rs, Err(HandshakeError::Unexpected { rank: 3, link: 1 })),
            "{rs:?}"
        );
        assert!(
            matches!(&rc, Err(HandshakeError::Refused(r)) if r.contains("duplicate")),
            "{rc:?}"
        );
    }

    #[test]
    fn debug_output_holds_no_secret() {
        let c = cred(b"hunter2-the-job-secret");
        let text = format!("{c:?} {c:#?}");
        assert!(
            !text.contains("hunter2") && !text.contains("104, 117"),
            "{text}"
        );
        assert!(text.contains("redacted"), "{text}");
    }

    /// One end of a conversation: reads `input`, keeps what is written.
    struct Scripted {
        input: std::io::Cursor<Vec<u8>>,
        written: Vec<u8>,
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn scripted(input: Vec<u8>) -> Scripted {
        Scripted {
            input: std::io::Cursor::new(input),
            written: Vec::new(),
        }
    }

    /// A HELLO that this test's server (rank 0 of `cred`) would accept.
    fn valid_hello() -> Vec<u8> {
        let c = cred(b"k");
        let mut h = HELLO_MAGIC.to_vec();
        h.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        h.extend_from_slice(&[0, 0]);
        h.extend_from_slice(&c.job_id);
        for v in [3u32, c.world, 1, c.links] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&[5; NONCE_LEN]);
        h
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Whatever a stranger sends, the server refuses it: no panic, no
        /// admission, and no more written than a reply and a refusal.
        #[test]
        fn server_refuses_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut s = scripted(bytes);
            let r = server(&mut s, &cred(b"k"), 0, |_| panic!("admitted a stranger"));
            prop_assert!(r.is_err());
            prop_assert!(s.written.len() <= 1 + 4 + NONCE_LEN + MAC_LEN + 3 + 256);
        }

        /// A valid HELLO with one byte changed, or followed by a made-up
        /// MAC: refused, never admitted.
        #[test]
        fn server_refuses_mutated_hellos(at in 0usize..HELLO_LEN, byte: u8,
                                         tail in proptest::collection::vec(any::<u8>(), 0..80)) {
            let mut hello = valid_hello();
            hello[at] = byte;
            hello.extend_from_slice(&tail);
            let mut s = scripted(hello);
            let r = server(&mut s, &cred(b"k"), 0, |_| panic!("admitted without the secret"));
            prop_assert!(r.is_err());
        }

        /// Whatever a fake server answers, the client fails, without
        /// panicking and whatever length a refusal claims.
        #[test]
        fn client_refuses_arbitrary_replies(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                            refusal_len: u16) {
            let mut s = scripted(bytes.clone());
            prop_assert!(client(&mut s, &cred(b"k"), 3, 0, 1).is_err());
            let mut refusal = vec![9u8];
            refusal.extend_from_slice(&refusal_len.to_le_bytes());
            refusal.extend_from_slice(&bytes);
            let mut s = scripted(refusal);
            match client(&mut s, &cred(b"k"), 3, 0, 1) {
                Err(HandshakeError::Refused(r)) => prop_assert!(r.len() <= 3 * 256),
                Err(_) => {}
                Ok(()) => prop_assert!(false, "a refusal was taken for a welcome"),
            }
        }
    }
}
