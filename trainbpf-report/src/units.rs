//! Sizes, rates and durations as people read them, formatted in one place
//! for every output (the report's text and HTML, the status line, the
//! compaction notice, `doctor`).
//!
//! Sizes are binary (KiB, MiB, GiB) throughout. Where two outputs have
//! always printed the same quantity differently, both forms are kept as
//! named variants, so that no output changes: [`human_kb`] for the report's
//! sizes, [`human_bytes`] for GPU sizes (bytes and TiB too),
//! [`human_bytes_brief`] for `doctor`'s; and for durations [`human_secs`]
//! (`12.0 s`), [`secs_whole`] (`60 s`), [`human_span`] (`1.5 min`),
//! [`human_duration`] (`4 min 5 s`), [`short_duration`] (an axis's `1:30`),
//! [`eta`] (`~12 min`) and [`clock`] (`1:02:03`).
//!
//! This module imports nothing from the crate: the model, the renderers
//! and the collector may all use it.

const K: f64 = 1024.0;
const SEC: u64 = 1_000_000_000;

/// Samples this long before an OOM kill or a SIGKILL are never folded by
/// compaction: the report's window before a kill (60 s by default) reads
/// them, and the report names the span when it tells of a compaction.
pub const PROTECT_NS: u64 = 5 * 60 * SEC;

// ---------------------------------------------------------------------------
// Sizes

/// Sizes as people read them: `512 KiB`, `250.1 MiB`, `1.25 GiB`.
pub fn human_kb(kb: u64) -> String {
    let v = kb as f64;
    if kb < 1024 {
        format!("{kb} KiB")
    } else if v < K * K {
        format!("{} MiB", trim(format!("{:.1}", v / K)))
    } else {
        format!("{} GiB", trim(format!("{:.2}", v / (K * K))))
    }
}

/// `+1.2 GiB` / `-300 MiB`.
pub(crate) fn signed_kb(kb: i64) -> String {
    if kb < 0 {
        format!("-{}", human_kb(kb.unsigned_abs()))
    } else {
        format!("+{}", human_kb(kb as u64))
    }
}

/// Bytes in [`human_kb`]'s units, whole KiB rounded down: the sizes of a
/// recording in the compaction notice.
pub fn human_bytes_kib(b: u64) -> String {
    human_kb(b / 1024)
}

/// Bytes as people read them; TiB for the requests a CUDA OOM makes.
pub(crate) fn human_bytes(b: u64) -> String {
    const TIB: u64 = 1 << 40;
    if b == 0 {
        "0".into()
    } else if b >= TIB {
        let t = format!("{:.2}", b as f64 / TIB as f64);
        format!("{} TiB", t.trim_end_matches('0').trim_end_matches('.'))
    } else if b < 1024 {
        format!("{b} B")
    } else {
        human_kb(b.div_ceil(1024))
    }
}

/// [`human_bytes`] with a sign: `+8 MiB`, `-1.5 GiB`, `0`.
pub(crate) fn signed_bytes(d: i64) -> String {
    match d {
        0 => "0".into(),
        d if d > 0 => format!("+{}", human_bytes(d as u64)),
        d => format!("-{}", human_bytes(d.unsigned_abs())),
    }
}

/// 1536 → "1.5 KiB": `doctor`'s sizes, whole units from 100 up or where
/// they fit, up to PiB.
pub fn human_bytes_brief(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else if v >= 100.0 || v.fract() < 0.05 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// kB as MiB to three decimals, a number for a chart's counter.
pub(crate) fn mib(kb: u64) -> f64 {
    (kb as f64 / 1024.0 * 1000.0).round() / 1000.0
}

// ---------------------------------------------------------------------------
// Rates

/// A rate in kB/s, in the same units as [`human_kb`].
pub fn human_rate(kb_per_s: f64) -> String {
    if kb_per_s < K {
        format!("{} KiB/s", trim(format!("{kb_per_s:.1}")))
    } else if kb_per_s < K * K {
        format!("{} MiB/s", trim(format!("{:.1}", kb_per_s / K)))
    } else {
        format!("{} GiB/s", trim(format!("{:.2}", kb_per_s / (K * K))))
    }
}

/// `+8 MiB/s`, `-120 KiB/s`.
pub(crate) fn signed_rate(kb_per_s: f64) -> String {
    let sign = if kb_per_s < 0.0 { "-" } else { "+" };
    format!("{sign}{}", human_rate(kb_per_s.abs()))
}

// ---------------------------------------------------------------------------
// Durations

/// Seconds with one decimal: `12.0 s`.
pub(crate) fn human_secs(ns: u64) -> String {
    format!("{:.1} s", ns as f64 / 1e9)
}

/// A short time, as a clock read's uncertainty: `850 ns`, `12 µs`,
/// `1.5 ms`, then as [`human_secs`].
pub(crate) fn small_duration(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{} µs", ns / 1_000)
    } else if ns < SEC {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        human_secs(ns)
    }
}

/// A window length: `60 s`, `2.5 s`.
pub(crate) fn secs_whole(ns: u64) -> String {
    let s = format!("{:.1}", ns as f64 / 1e9);
    format!("{} s", s.strip_suffix(".0").unwrap_or(&s))
}

/// 90 → "1.5 min"; whole units where they fit.
pub fn human_span(ns: u64) -> String {
    let s = ns as f64 / SEC as f64;
    let (v, unit) = if s >= 3600.0 {
        (s / 3600.0, "h")
    } else if s >= 60.0 {
        (s / 60.0, "min")
    } else {
        (s, "s")
    };
    if (v - v.round()).abs() < 0.05 {
        format!("{} {unit}", v.round())
    } else {
        format!("{v:.1} {unit}")
    }
}

/// A duration as people say it: `12.3 s`, `4 min 5 s`, `24 h 0 min`.
pub(crate) fn human_duration(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        let s = s as u64;
        match s % 60 {
            0 => format!("{} min", s / 60),
            r => format!("{} min {r} s", s / 60),
        }
    } else {
        let m = (s / 60.0) as u64;
        match m % 60 {
            0 => format!("{} h", m / 60),
            r => format!("{} h {r} min", m / 60),
        }
    }
}

/// A time axis's label: `5 s`, `2.5 s`, `3 min`, `1:30`, `2 h`, `1:05 h`.
pub(crate) fn short_duration(ns: u64) -> String {
    let s = ns / 1_000_000_000;
    let ms = ns / 1_000_000 % 1000;
    if s < 60 {
        if ms == 0 {
            format!("{s} s")
        } else {
            format!("{:.1} s", ns as f64 / 1e9)
        }
    } else if s < 3600 {
        if s.is_multiple_of(60) {
            format!("{} min", s / 60)
        } else {
            format!("{}:{:02}", s / 60, s % 60)
        }
    } else if s.is_multiple_of(3600) {
        format!("{} h", s / 3600)
    } else {
        format!("{}:{:02} h", s / 3600, s / 60 % 60)
    }
}

/// A time to come, as people plan by it: `~45 s`, `~12 min`, `~3.5 h`.
pub fn eta(s: f64) -> String {
    if s < 90.0 {
        format!("~{s:.0} s")
    } else if s < 90.0 * 60.0 {
        format!("~{:.0} min", s / 60.0)
    } else if s < 48.0 * 3600.0 {
        format!("~{:.1} h", s / 3600.0)
    } else {
        format!("~{:.1} days", s / 86_400.0)
    }
}

/// Time elapsed on a clock: `4:05`, `1:02:03`.
pub fn clock(secs: u64) -> String {
    if secs >= 3600 {
        format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
    } else {
        format!("{}:{:02}", secs / 60, secs % 60)
    }
}

/// `250.0` → `250`, `1.50` → `1.5`.
fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A short pause, as a hold or a window lasts: `0.84 ms`, `12.3 ms`, `2.5 s`.
pub fn human_ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

/// Name of a Linux signal (x86/arm generic numbering).
pub fn signal_name(sig: i32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(sig)
        .ok()
        .and_then(|s| s.checked_sub(1))
        .and_then(|i| NAMES.get(i).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_kb(512), "512 KiB");
        assert_eq!(human_kb(300 * 1024), "300 MiB");
        assert_eq!(human_kb(256_102), "250.1 MiB");
        assert_eq!(human_kb(1536 * 1024), "1.5 GiB");
        assert_eq!(human_rate(21_299.2), "20.8 MiB/s");
        assert_eq!(human_rate(12.0), "12 KiB/s");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(human_bytes(0), "0");
        assert_eq!(human_bytes(160 << 20), "160 MiB");
        assert_eq!(human_bytes(1 << 40), "1 TiB");
        assert_eq!(human_bytes(3 << 39), "1.5 TiB");
        assert_eq!(signed_bytes(-(8 << 20)), "-8 MiB");
        assert_eq!(human_bytes_brief(1536), "1.5 KiB");
        assert_eq!(human_bytes_brief(1000), "1000 B");
        assert_eq!(human_bytes_brief(300 << 20), "300 MiB");
    }

    #[test]
    fn durations() {
        assert_eq!(human_duration(12_340_000_000), "12.3 s");
        assert_eq!(human_duration(245_000_000_000), "4 min 5 s");
        assert_eq!(human_duration(86_400_000_000_000), "24 h");
        assert_eq!(human_duration(60_000_000_000), "1 min");
        assert_eq!(human_span(90 * SEC), "1.5 min");
        assert_eq!(human_span(PROTECT_NS), "5 min");
        assert_eq!(secs_whole(60 * SEC), "60 s");
        assert_eq!(secs_whole(2_500_000_000), "2.5 s");
        assert_eq!(clock(3723), "1:02:03");
        assert_eq!(clock(245), "4:05");
    }

    #[test]
    fn etas() {
        assert_eq!(eta(45.2), "~45 s");
        assert_eq!(eta(720.0), "~12 min");
        assert_eq!(eta(3.5 * 3600.0), "~3.5 h");
        assert_eq!(eta(3.0 * 86_400.0), "~3.0 days");
    }

    #[test]
    fn pauses() {
        assert_eq!(human_ms(840_000), "0.84 ms");
        assert_eq!(human_ms(12_345_678), "12.3 ms");
        assert_eq!(human_ms(2_500_000_000), "2.5 s");
    }

    #[test]
    fn axis_labels() {
        assert_eq!(short_duration(90_000_000_000), "1:30");
        assert_eq!(short_duration(7_200_000_000_000), "2 h");
    }
}
