//! A rank's output read in lines of bounded length: a rank that prints
//! gigabytes without a newline must not grow the launcher without bound. A
//! longer line comes in pieces of at most [`MAX_LINE`] bytes, cut where a
//! UTF-8 character begins when one does nearby; no byte is lost.

use std::io::Read;

/// The longest piece of a line the launcher holds: a failure report line
/// (at most 64 KiB of JSON, see [`crate::report::MAX_REPORT`]) fits whole.
pub(crate) const MAX_LINE: usize = 256 << 10;

/// Reads `src` in lines of at most `max` bytes.
pub(crate) struct BoundedLines<R> {
    src: R,
    /// Bytes read and not yet returned: never more than `max`.
    buf: Vec<u8>,
    max: usize,
    eof: bool,
}

impl<R: Read> BoundedLines<R> {
    /// Lines of `src`, each at most `max` bytes (`max` > 4).
    pub fn new(src: R, max: usize) -> BoundedLines<R> {
        assert!(max > 4, "a line must hold a UTF-8 character");
        BoundedLines {
            src,
            buf: Vec::new(),
            max,
            eof: false,
        }
    }

    /// The next line with its newline, or the next piece of a longer line
    /// (without one), or the stream's last bytes; `None` at its end. A read
    /// error ends the stream after the bytes read before it.
    pub fn next_line(&mut self) -> Option<Vec<u8>> {
        let mut searched = 0;
        loop {
            if let Some(i) = self.buf[searched..].iter().position(|&b| b == b'\n') {
                return Some(self.buf.drain(..=searched + i).collect());
            }
            searched = self.buf.len();
            if self.buf.len() >= self.max {
                let cut = char_start(&self.buf[..self.max]);
                return Some(self.buf.drain(..cut).collect());
            }
            if self.eof {
                return (!self.buf.is_empty()).then(|| std::mem::take(&mut self.buf));
            }
            let mut chunk = [0u8; 8192];
            let room = (self.max - self.buf.len()).min(chunk.len());
            match self.src.read(&mut chunk[..room]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => self.eof = true,
            }
        }
    }
}

/// Where to cut `piece` (a full piece of a longer line) so that a UTF-8
/// character is not split: before a character whose bytes run past the
/// end, else at the end.
fn char_start(piece: &[u8]) -> usize {
    let n = piece.len();
    for back in 1..=3.min(n - 1) {
        let b = piece[n - back];
        if b & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: look further back
        }
        let len = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if back < len { n - back } else { n };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(bytes: &[u8], max: usize) -> Vec<Vec<u8>> {
        let mut r = BoundedLines::new(bytes, max);
        std::iter::from_fn(|| r.next_line()).collect()
    }

    #[test]
    fn short_lines_come_whole_and_long_ones_in_pieces() {
        assert_eq!(all(b"ab\ncd\n", 8), [b"ab\n".to_vec(), b"cd\n".to_vec()]);
        assert_eq!(all(b"ab\ncd", 8), [b"ab\n".to_vec(), b"cd".to_vec()]);
        assert_eq!(
            all(b"0123456789abc\nx", 5),
            [&b"01234"[..], b"56789", b"abc\n", b"x"]
        );
        assert!(all(b"", 8).is_empty());
    }

    #[test]
    fn pieces_do_not_split_a_character() {
        // "ab" then "é" (2 bytes) across the cut at 3.
        let text = "abé€xyz".as_bytes();
        let pieces = all(text, 5);
        assert_eq!(pieces.concat(), text);
        for p in &pieces {
            assert!(std::str::from_utf8(p).is_ok(), "{p:?}");
            assert!(p.len() <= 5);
        }
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whatever the bytes: no piece is longer than the bound, only the
        /// last may lack its newline unless it is full, and together they
        /// are the input.
        #[test]
        fn nothing_is_lost_and_no_piece_is_longer_than_the_bound(
            bytes in proptest::collection::vec(any::<u8>(), 0..2000),
            max in 5usize..64,
        ) {
            let pieces = all(&bytes, max);
            prop_assert_eq!(pieces.concat(), bytes);
            for p in &pieces {
                prop_assert!(!p.is_empty() && p.len() <= max);
                if let Some(i) = p.iter().position(|&b| b == b'\n') {
                    prop_assert_eq!(i, p.len() - 1);
                }
            }
        }
    }
}
