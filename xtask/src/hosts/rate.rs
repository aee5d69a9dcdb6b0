//! Link rates in tc syntax ([`Rate`], [`parse_rate`]) and the token
//! bucket that shapes a link to one.

/// A link rate that `tc` understands.
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    /// As given, lower-cased (`10gbit`).
    pub text: String,
    /// In bits per second.
    pub bits_per_sec: u64,
}

/// tc's rate units (`tc(8)`, "RATES"), lower case, and their worth in bits
/// per second. The `bps` family is BYTES per second, as in tc.
const RATE_UNITS: [(&str, f64); 18] = [
    ("bit", 1.0),
    ("kbit", 1e3),
    ("mbit", 1e6),
    ("gbit", 1e9),
    ("tbit", 1e12),
    ("kibit", 1024.0),
    ("mibit", 1_048_576.0),
    ("gibit", 1_073_741_824.0),
    ("tibit", 1_099_511_627_776.0),
    ("bps", 8.0),
    ("kbps", 8e3),
    ("mbps", 8e6),
    ("gbps", 8e9),
    ("tbps", 8e12),
    ("kibps", 8.0 * 1024.0),
    ("mibps", 8.0 * 1_048_576.0),
    ("gibps", 8.0 * 1_073_741_824.0),
    ("tibps", 8.0 * 1_099_511_627_776.0),
];

/// Parses a rate in tc syntax: digits (with an optional fraction) and a unit,
/// e.g. `10gbit`, `1gbit`, `500mbit`, `2.5gbit`; `none` gives `None` (no
/// shaping). The error says what is accepted.
pub fn parse_rate(s: &str) -> Result<Option<Rate>, String> {
    let text = s.trim().to_ascii_lowercase();
    if text == "none" {
        return Ok(None);
    }
    let bad = |why: &str| {
        format!(
            "invalid rate `{s}`: {why}; write digits and a tc unit, e.g. 10gbit, 1gbit, 500mbit \
             (units: bit, kbit, mbit, gbit, tbit, kibit..tibit; bps, kbps, mbps, gbps, tbps \
             are BYTES per second), or `none` for no shaping"
        )
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| bad("no unit"))?;
    let (number, unit) = text.split_at(split);
    let (int, frac) = number.split_once('.').unwrap_or((number, "0"));
    if int.is_empty()
        || frac.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad("the number must be digits, with an optional fraction"));
    }
    let Some(&(_, per_unit)) = RATE_UNITS.iter().find(|(u, _)| *u == unit) else {
        return Err(bad(&format!("unknown unit `{unit}`")));
    };
    let value: f64 = number
        .parse()
        .map_err(|_| bad("the number does not parse"))?;
    let bits = value * per_unit;
    if !(1.0..=1e15).contains(&bits) {
        return Err(bad("it must be between 1bit and 1000tbit"));
    }
    Ok(Some(Rate {
        text,
        bits_per_sec: bits.round() as u64,
    }))
}

impl Rate {
    /// Bytes per second.
    pub fn bytes_per_sec(&self) -> u64 {
        self.bits_per_sec / 8
    }

    /// e.g. `shaped to 1gbit (0.125 GB/s) per host, each way`.
    pub(super) fn describe(&self) -> String {
        format!(
            "shaped to {} ({:.3} GB/s) per host, each way",
            self.text,
            self.bytes_per_sec() as f64 / 1e9
        )
    }

    /// The token bucket's size in bytes.
    ///
    /// tbf only reaches its rate when the bucket holds what the link sends
    /// between two of its timer wake-ups; a bigger bucket lets a host send
    /// that much faster than the rate after an idle spell (a real link never
    /// does), so it should be no bigger than it must. Measured here (veth
    /// pair through the bridge, one TCP stream, MTU 1500; the most TCP
    /// payload a 1500-byte MTU leaves is 1448/1514 = 95.6% of the rate):
    /// at 10gbit, a 64 KiB bucket gave 3.3 Gbit/s, 256 KiB 9.35, 1.25 MB
    /// (1 ms) 9.37, 2.5 MB (2 ms) 9.53 and 5 MB (4 ms, one tick at HZ=250)
    /// 9.52; at 1gbit, 64 KiB gave 0.92 Gbit/s and 125 KB (1 ms) or more
    /// 0.96. So: 2 ms of the rate, and at least 128 KiB (two 64 KiB GSO
    /// packets; tbf would cut a GSO packet bigger than the bucket).
    pub fn burst_bytes(&self) -> u64 {
        (self.bytes_per_sec() / 500).max(128 * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> u64 {
        parse_rate(s).unwrap().unwrap().bits_per_sec
    }

    #[test]
    fn rates_parse_in_tc_syntax() {
        assert_eq!(rate("10gbit"), 10_000_000_000);
        assert_eq!(rate("1gbit"), 1_000_000_000);
        assert_eq!(rate("500mbit"), 500_000_000);
        assert_eq!(rate("2.5gbit"), 2_500_000_000);
        assert_eq!(rate("1Gbit"), 1_000_000_000);
        assert_eq!(rate("100kbit"), 100_000);
        assert_eq!(rate("1mibit"), 1_048_576);
        // tc's `bps` units are bytes per second.
        assert_eq!(rate("1gbps"), 8_000_000_000);
        assert_eq!(rate("125mbps"), 1_000_000_000);
        assert_eq!(parse_rate("none"), Ok(None));
        assert_eq!(parse_rate("10gbit").unwrap().unwrap().text, "10gbit");
    }

    #[test]
    fn bad_rates_are_refused_with_the_syntax() {
        for bad in [
            "",
            "10",
            "gbit",
            "10g",
            "10 gbit",
            "-1gbit",
            "1.gbit",
            ".5gbit",
            "1e9bit",
            "0gbit",
            "10gbits",
            "1.2.3gbit",
            "fast",
        ] {
            let err = parse_rate(bad).expect_err(bad);
            assert!(err.contains("10gbit, 1gbit, 500mbit"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_bucket_holds_two_ms_of_the_rate_and_at_least_128_kib() {
        let burst = |s: &str| parse_rate(s).unwrap().unwrap().burst_bytes();
        assert_eq!(burst("10gbit"), 2_500_000);
        assert_eq!(burst("1gbit"), 250_000);
        assert_eq!(burst("100mbit"), 128 * 1024);
    }
}
