//! How amounts, rates and durations read, and logfmt quoting: shared by the
//! plain lines, the bars and the launcher's renderer so they all agree.

use std::time::Duration;

use crate::Unit;

/// `n` of `unit` for a person: binary units for bytes (`12.3MiB`), a short
/// SI form for tokens and items (`4.56M`), the plain number for steps.
pub fn amount(unit: Unit, n: u64) -> String {
    match unit {
        Unit::Bytes => binary(n as f64, "B"),
        Unit::Tokens | Unit::Items => si(n as f64),
        Unit::Steps => n.to_string(),
    }
}

/// A rate of `per_sec` `unit`s per second (`4.1MiB/s`, `12.3k/s`).
pub fn rate(unit: Unit, per_sec: f64) -> String {
    let per_sec = if per_sec.is_finite() {
        per_sec.max(0.0)
    } else {
        0.0
    };
    match unit {
        Unit::Bytes => format!("{}/s", binary(per_sec, "B")),
        Unit::Steps => format!("{per_sec:.2}/s"),
        Unit::Tokens | Unit::Items => format!("{}/s", si(per_sec)),
    }
}

/// A duration rounded for a person: `8s`, `2m05s`, `1h02m`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs_f64().round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `x` with a binary prefix and `suffix`: `512B`, `1.5KiB`, `12.3MiB`.
fn binary(x: f64, suffix: &str) -> String {
    const PREFIXES: [&str; 6] = ["", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let mut v = x;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < PREFIXES.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{}{suffix}", v.round() as u64)
    } else {
        format!("{v:.1}{}{suffix}", PREFIXES[i])
    }
}

/// `x` with a decimal prefix: `999`, `12.3k`, `4.56M`.
fn si(x: f64) -> String {
    const PREFIXES: [&str; 5] = ["", "k", "M", "G", "T"];
    let mut v = x;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < PREFIXES.len() {
        v /= 1000.0;
        i += 1;
    }
    match i {
        0 if x.fract() == 0.0 => format!("{}", x as u64),
        0 => format!("{x:.1}"),
        _ if v < 10.0 => format!("{v:.2}{}", PREFIXES[i]),
        _ => format!("{v:.1}{}", PREFIXES[i]),
    }
}

/// `s` as a quoted logfmt value: `"` and `\` escaped, and control
/// characters (ESC among them) written as `\u{..}` so that a plain line
/// never carries one.
pub fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            c if c.is_control() => q.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_read_as_a_person_expects() {
        assert_eq!(amount(Unit::Bytes, 512), "512B");
        assert_eq!(amount(Unit::Bytes, 1536), "1.5KiB");
        assert_eq!(
            amount(Unit::Bytes, 12 * 1024 * 1024 + 300 * 1024),
            "12.3MiB"
        );
        assert_eq!(amount(Unit::Tokens, 999), "999");
        assert_eq!(amount(Unit::Tokens, 12_345), "12.3k");
        assert_eq!(amount(Unit::Tokens, 4_560_000), "4.56M");
        assert_eq!(amount(Unit::Steps, 12_345), "12345");
        assert_eq!(rate(Unit::Bytes, 4.1 * 1024.0 * 1024.0), "4.1MiB/s");
        assert_eq!(rate(Unit::Tokens, 2500.0), "2.50k/s");
        assert_eq!(rate(Unit::Steps, f64::NAN), "0.00/s");
    }

    #[test]
    fn durations_round_to_what_matters() {
        assert_eq!(duration(Duration::from_millis(8_400)), "8s");
        assert_eq!(duration(Duration::from_secs(125)), "2m05s");
        assert_eq!(duration(Duration::from_secs(3720)), "1h02m");
    }

    #[test]
    fn quoting_escapes_quotes_and_control_characters() {
        assert_eq!(quote("a \"b\"\\"), r#""a \"b\"\\""#);
        assert_eq!(quote("red \x1b[31m\n"), r#""red \u{1b}[31m\n""#);
    }
}
