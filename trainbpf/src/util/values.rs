//! The command line's values. Each is checked against a range when it is
//! parsed, so that a value past what the program can hold is a usage error
//! naming the flag (exit 2), never a panic or a silent wrap later.

use std::time::Duration;

/// No size flag takes more: 1 PiB, past any machine's memory or disk, and
/// far below where a size in bytes, pages or kB would overflow.
pub const MAX_SIZE: u64 = 1 << 50;

/// No duration flag takes more: a million hours (114 years). Monotonic
/// timestamps are clamped to 2^62 ns at decode; a time plus or minus this
/// still fits in a u64 of nanoseconds.
pub const MAX_DURATION: Duration = Duration::from_secs(1_000_000 * 3600);

/// `--heartbeat-ms` at most: a day. Recorded in nanoseconds as an i64.
pub const MAX_HEARTBEAT_MS: u64 = 86_400_000;

/// `--rss-relative-shift` at most: the kernel side shifts a 64-bit count.
pub const MAX_RELATIVE_SHIFT: i64 = 62;

/// `300M`, `4G`, `1.5T`, or plain bytes; positive and at most [`MAX_SIZE`].
pub fn parse_size(s: &str) -> Result<u64, String> {
    // A value past u64 saturates to u64::MAX, past the bound too.
    let v = parse_any_size(s)?;
    if v > MAX_SIZE {
        return Err(format!("size {s:?} is too large (at most 1024T)"));
    }
    Ok(v)
}

/// Sizes like `300M`, `1.5G`, `512MiB`, `1048576` (bytes), unbounded: a
/// value past u64 saturates to u64::MAX.
fn parse_any_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => {
            return Err(format!(
                "invalid size unit {u:?} in {s:?} (use K, M, G or T)"
            ));
        }
    };
    let v = n * mult as f64;
    if v.is_nan() || v < 1.0 {
        return Err(format!("size {s:?} must be positive"));
    }
    Ok(v as u64)
}

/// `--max-size`: a size of at least 1M, or `0` / `none` for no bound (0).
pub fn parse_max_size(s: &str) -> Result<u64, String> {
    match s.trim() {
        "0" | "none" | "unlimited" => Ok(0),
        t => {
            let v = parse_size(t)?;
            if v < 1 << 20 {
                return Err(format!(
                    "{s:?} is under 1M (use at least 1M, or 0 for no bound)"
                ));
            }
            Ok(v)
        }
    }
}

/// `--ring-size`: a power of two between 4K and 2G.
pub fn parse_ring_size(s: &str) -> Result<u32, String> {
    let v = parse_size(s)?;
    if !v.is_power_of_two() || !(4096..=1 << 31).contains(&v) {
        return Err(format!("{s:?} is not a power of two between 4K and 2G"));
    }
    Ok(v as u32)
}

/// `60s`, `2m`, `500ms`, `1h`, or plain seconds; positive and at most
/// [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        u => {
            return Err(format!(
                "invalid duration unit {u:?} in {s:?} (use ms, s, m or h)"
            ));
        }
    };
    // A long run of digits parses as infinity: compared here, before
    // Duration::from_secs_f64, which panics past what it holds.
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("duration {s:?} must be positive"));
    }
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!("duration {s:?} is too long (at most 1000000h)"));
    }
    let d = Duration::from_secs_f64(secs);
    if d.is_zero() {
        return Err(format!("duration {s:?} is under a nanosecond"));
    }
    Ok(d)
}

/// `--hostname`: what `uname -n` would say, 1 to 64 bytes (the kernel's
/// own bound), of letters, digits, `.`, `_` and `-`: a Kubernetes node
/// name fits, and nothing that needs escaping reaches a file name or a
/// label.
pub fn parse_hostname(s: &str) -> Result<String, String> {
    const MAX: usize = 64;
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if s.is_empty() || s.len() > MAX || !s.chars().all(ok) {
        return Err(format!(
            "{:?} is not a host name (1 to {MAX} letters, digits, '.', '_' or '-')",
            trainbpf_report::term::escape(s)
        ));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("300M"), Ok(300 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn sizes_past_the_bound_are_refused() {
        assert_eq!(parse_size("300M"), Ok(300 << 20));
        assert_eq!(parse_size("1024T"), Ok(MAX_SIZE));
        for bad in [
            "99999999999999999999G",
            "1025T",
            &"9".repeat(400),
            "0",
            "-1M",
            "nanM",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_max_size("none"), Ok(0));
        assert!(parse_max_size("512K").is_err());
        assert_eq!(parse_ring_size("4M"), Ok(4 << 20));
        assert!(parse_ring_size("3M").is_err());
        assert!(parse_ring_size("4T").is_err());
    }

    #[test]
    fn durations_past_the_bound_are_refused() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1000000h"), Ok(MAX_DURATION));
        for bad in [
            "99999999999999999999s",
            "1000001h",
            &"9".repeat(400),
            "0",
            "0.0000000000001s",
            "-5s",
            "nan",
            "inf",
            "1e9s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_hostname_is_a_node_name_or_refused() {
        assert_eq!(
            parse_hostname("ip-10-0-1-7.ec2.internal").as_deref(),
            Ok("ip-10-0-1-7.ec2.internal")
        );
        for bad in [
            "",
            "a/b",
            "node 1",
            "n\u{1b}[31m",
            "$(NODE_NAME)",
            &"a".repeat(65),
        ] {
            assert!(parse_hostname(bad).is_err(), "{bad:?}");
        }
    }
}
