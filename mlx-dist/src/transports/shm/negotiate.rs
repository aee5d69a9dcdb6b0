//! Settling, once per link after the handshake, whether the two ranks share
//! a segment: the lower rank's offer of a named segment with a nonce, the
//! higher rank's answer, and the name's removal once the answer is in.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use super::named;
use super::orphans::segment_name;
use super::segment::{NONCE_LEN, Segment, segment_len};

/// Random bytes for names and nonces.
pub(super) fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b)
}

const OFFER: u8 = b'S';
const DECLINE: u8 = b'N';
const ACCEPT: u8 = b'Y';

/// The creating side's half of a negotiation, between sending the offer and reading the answer.
pub(crate) struct Offer {
    seg: Option<(Segment, String)>,
}

/// Sends the offer of a new segment over `stream` (or a refusal when
/// `enabled` is false or the segment cannot be made): the lower rank's first half.
pub(crate) fn offer(stream: &mut impl Write, enabled: bool) -> io::Result<Offer> {
    let made = if enabled {
        (|| -> io::Result<(Segment, String, [u8; NONCE_LEN])> {
            let name = segment_name(std::process::id(), &random::<8>()?);
            let (file, handle) = named::create(&name, segment_len())?;
            // The offer gives the handle's length in one byte (a long
            // temporary directory's path may not fit).
            let seg = u8::try_from(handle.len())
                .map_err(|_| io::Error::other(format!("segment path too long: {handle}")))
                .and_then(|_| Segment::map(&file))
                .inspect_err(|_| named::remove(&handle))?;
            let nonce = random::<NONCE_LEN>()?;
            seg.write_nonce(&nonce);
            Ok((seg, handle, nonce))
        })()
        .inspect_err(
            |e| tracing::warn!(error = %e, "no shared memory segment; this link keeps TCP"),
        )
        .ok()
    } else {
        None
    };
    match made {
        Some((seg, handle, nonce)) => {
            let mut msg = vec![OFFER, handle.len() as u8];
            msg.extend_from_slice(handle.as_bytes());
            msg.extend_from_slice(&nonce);
            if let Err(e) = stream.write_all(&msg) {
                named::remove(&handle);
                return Err(e);
            }
            Ok(Offer {
                seg: Some((seg, handle)),
            })
        }
        None => {
            stream.write_all(&[DECLINE])?;
            Ok(Offer { seg: None })
        }
    }
}

impl Offer {
    /// Reads the peer's answer and removes the segment's name; the segment
    /// if the peer mapped it.
    pub(super) fn settle(mut self, stream: &mut impl Read) -> io::Result<Option<Segment>> {
        let Some((seg, handle)) = self.seg.take() else {
            return Ok(None);
        };
        let mut a = [0u8; 1];
        let r = stream.read_exact(&mut a);
        named::remove(&handle);
        r?;
        Ok((a[0] == ACCEPT).then_some(seg))
    }
}

impl Drop for Offer {
    /// An offer given up unsettled (another link's negotiation failed) still removes its name.
    fn drop(&mut self) {
        if let Some((_, handle)) = &self.seg {
            named::remove(handle);
        }
    }
}

/// Reads the lower rank's offer and answers it: the higher rank's half. The
/// segment when it could be mapped and holds the offered nonce (the same host).
pub(crate) fn answer(
    stream: &mut (impl Read + Write),
    enabled: bool,
) -> io::Result<Option<Segment>> {
    let mut kind = [0u8; 1];
    stream.read_exact(&mut kind)?;
    match kind[0] {
        DECLINE => return Ok(None),
        OFFER => {}
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected a shared memory offer, got byte {other:#04x}"),
            ));
        }
    }
    let mut n = [0u8; 1];
    stream.read_exact(&mut n)?;
    let mut handle = vec![0u8; n[0] as usize];
    stream.read_exact(&mut handle)?;
    let mut nonce = [0u8; NONCE_LEN];
    stream.read_exact(&mut nonce)?;
    // Only a segment's name is opened: the handle comes from the peer, and
    // any other path (a file of ours) must never be mapped and written.
    let seg = if enabled {
        String::from_utf8(handle)
            .ok()
            .filter(|h| named::is_segment_handle(h))
            .and_then(|h| named::open(&h).ok())
            .and_then(|f| Segment::map(&f).ok())
            .filter(|s| s.nonce() == nonce)
    } else {
        None
    };
    stream.write_all(&[if seg.is_some() { ACCEPT } else { DECLINE }])?;
    Ok(seg)
}

/// Settles, for every data link of this rank, whether it shares a segment
/// with its peer: `streams[peer][link]` (handshaken, blocking, with
/// timeouts; an empty row for this rank); returns the segments in the same
/// shape, or the first failure naming the peer. Offers go out to every
/// higher rank first, then offers from lower ranks are answered, then the
/// answers read, so no two ranks wait on each other.
pub(crate) fn negotiate(
    rank: usize,
    streams: &mut [Vec<TcpStream>],
    enabled: bool,
) -> io::Result<Vec<Vec<Option<Segment>>>> {
    if enabled {
        named::sweep();
    }
    let with_peer =
        |peer: usize| move |e: io::Error| io::Error::new(e.kind(), format!("rank {peer}: {e}"));
    let mut offers: Vec<Vec<Offer>> = Vec::new();
    for (peer, row) in streams.iter_mut().enumerate().skip(rank + 1) {
        offers.push(
            row.iter_mut()
                .map(|s| offer(s, enabled).map_err(with_peer(peer)))
                .collect::<io::Result<_>>()?,
        );
    }
    let mut segs: Vec<Vec<Option<Segment>>> = Vec::with_capacity(streams.len());
    for (peer, row) in streams.iter_mut().enumerate().take(rank) {
        segs.push(
            row.iter_mut()
                .map(|s| answer(s, enabled).map_err(with_peer(peer)))
                .collect::<io::Result<_>>()?,
        );
    }
    segs.push(Vec::new());
    for ((peer, row), offers) in streams.iter_mut().enumerate().skip(rank + 1).zip(offers) {
        segs.push(
            row.iter_mut()
                .zip(offers)
                .map(|(s, o)| o.settle(s).map_err(with_peer(peer)))
                .collect::<io::Result<_>>()?,
        );
    }
    Ok(segs)
}

#[cfg(test)]
mod tests;
