//! Shared memory between two ranks on one host: a [`Link`] whose large
//! payloads move through a segment both processes map, while headers, small
//! frames and one-byte doorbells stay on the TCP connection.
//!
//! Over loopback TCP every byte is copied into the kernel by the sender and
//! out of it by the receiver, with the stack's work between; through the
//! segment it is copied once in and once out (and a reduction reads it where
//! it lies, see [`Link::recv_payload_with`]). The socket keeps everything
//! that makes the ring safe: the receiver blocks on it (no spinning) for the
//! header and then one doorbell byte per piece, so a dead peer is an end of
//! stream, a stalled one a timeout, and an abort frame arrives where a header
//! is expected.
//!
//! Each direction of a link has [`SLOTS`] slots of [`SLOT`] bytes. A frame
//! whose payload is at least [`MIN_PAYLOAD`] bytes is sent as its header on
//! the socket followed by its payload in slot-sized pieces: the sender waits
//! for a free slot (polling the receiver's counter with backoff, up to the
//! collective timeout), copies the piece in, publishes it and writes a doorbell
//! byte; the receiver reads the doorbell, takes the piece and frees the slot.
//! Both sides know the payload's length from the header, so the framing on
//! the socket is unambiguous.
//!
//! Who shares a segment is settled once per link, right after the handshake
//! ([`negotiate`](fn@negotiate)): the lower rank creates a segment under a
//! random name and writes a random nonce into it, and offers both over the
//! link; the higher rank maps it and checks the nonce. Ranks on different hosts (or with
//! `MLX_DIST_SHM=0` on either side) fail that check or decline, and keep the
//! plain TCP link. The name is removed as soon as the answer is in, so no
//! segment outlives its processes; one whose creator was killed before
//! that is removed by the next rank that sets up shared memory on the host
//! ([`orphans`]: the name carries the creator's pid). A segment shorter
//! than the layout is refused before it is mapped (touching a page past the
//! end of its file would be a `SIGBUS`).
//!
//! One file a job: [`segment`] (the layout and mapping of a segment),
//! [`orphans`] (segments of dead creators),
//! `dev_shm` and `posix_shm` (making, opening and removing named segments on
//! Linux and macOS), [`negotiate`](mod@negotiate) (who shares a segment) and
//! [`link`] (the link over it).
//!
//! [`Link`]: crate::transports::link::Link
//! [`Link::recv_payload_with`]: crate::transports::link::Link::recv_payload_with
//! [`SLOTS`]: segment::SLOTS
//! [`SLOT`]: segment::SLOT
//! [`MIN_PAYLOAD`]: link::MIN_PAYLOAD

mod link;
mod negotiate;
mod orphans;
mod segment;

// Creating, opening and removing named segments: files in `/dev/shm` (a
// memory file system) on Linux, POSIX `shm_open` objects on macOS.
#[cfg(not(target_os = "macos"))]
mod dev_shm;
// Compiled everywhere so that its tests run on Linux too.
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
mod posix_shm;
#[cfg(not(target_os = "macos"))]
use dev_shm as named;
#[cfg(target_os = "macos")]
use posix_shm as named;

pub(crate) use link::ShmLink;
pub(crate) use negotiate::negotiate;
/// The two halves of a negotiation, for the fuzz target of the answer.
pub(crate) use negotiate::{answer, offer};
