//! Where the recorder's start-up and exit time go, said with `record -v`
//! and read by the bench: parts measured one after another on one clock.
//! The programs' loads (the verifier) and attaches interleave, group by
//! group, so each is summed as it happens ([`verify`], [`attach`]) and
//! said within the part it falls in.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

static VERIFY_NS: AtomicU64 = AtomicU64::new(0);
static ATTACH_NS: AtomicU64 = AtomicU64::new(0);

/// Runs a program's load, counted as the verifier's time.
pub fn verify<T>(f: impl FnOnce() -> T) -> T {
    timed(&VERIFY_NS, f)
}

/// Runs a program's attach, counted as attach time.
pub fn attach<T>(f: impl FnOnce() -> T) -> T {
    timed(&ATTACH_NS, f)
}

fn timed<T>(sum: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    sum.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

/// Named parts, each from the end of the one before.
#[derive(Debug, Clone)]
pub struct Phases {
    began: Instant,
    last: Instant,
    /// Verify and attach sums at `last`.
    sums: (u64, u64),
    parts: Vec<Part>,
}

/// A part: its name, its time, and the verifier's and the attaches' time
/// within it where they are said.
type Part = (&'static str, Duration, Option<(Duration, Duration)>);

impl Phases {
    pub fn new() -> Phases {
        Phases::since(Instant::now())
    }

    /// Parts from `began` on.
    pub fn since(began: Instant) -> Phases {
        Phases {
            began,
            last: began,
            sums: sums(),
            parts: Vec::new(),
        }
    }

    /// Ends the part `name` now.
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.parts.push((name, now - self.last, None));
        self.last = now;
        self.sums = sums();
    }

    /// Ends the part `name` now, with the verifier's and the attaches'
    /// time in it said too.
    pub fn mark_programs(&mut self, name: &'static str) {
        let now = Instant::now();
        let (v0, a0) = self.sums;
        let (v1, a1) = sums();
        let verify = Duration::from_nanos(v1.saturating_sub(v0));
        let attach = Duration::from_nanos(a1.saturating_sub(a0));
        self.parts
            .push((name, now - self.last, Some((verify, attach))));
        self.last = now;
        self.sums = (v1, a1);
    }

    /// Time from the start to the last mark.
    pub fn total(&self) -> Duration {
        self.last - self.began
    }

    /// "N ms: part a ms, part b ms, ...".
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(n, d, programs)| match programs {
                Some((v, a)) => format!("{n} {} (verifier {}, attach {})", ms(*d), ms(*v), ms(*a)),
                None => format!("{n} {}", ms(*d)),
            })
            .collect();
        format!("{}: {}", ms(self.total()), parts.join(", "))
    }
}

impl Default for Phases {
    fn default() -> Phases {
        Phases::new()
    }
}

fn sums() -> (u64, u64) {
    (
        VERIFY_NS.load(Ordering::Relaxed),
        ATTACH_NS.load(Ordering::Relaxed),
    )
}

/// Milliseconds, to a tenth.
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums are the process's: one test at a time reads them.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn parts_add_up_to_the_total_and_programs_are_split_out() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = Phases::new();
        std::thread::sleep(Duration::from_millis(5));
        p.mark("first");
        verify(|| std::thread::sleep(Duration::from_millis(10)));
        attach(|| std::thread::sleep(Duration::from_millis(5)));
        p.mark_programs("other");
        let names: Vec<&str> = p.parts.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(names, ["first", "other"]);
        let sum: Duration = p.parts.iter().map(|(_, d, _)| *d).sum();
        assert_eq!(sum, p.total());
        let (v, a) = p.parts[1].2.unwrap();
        assert!(v >= Duration::from_millis(10) && a >= Duration::from_millis(5));
        assert!(p.parts[1].1 >= v + a);
        assert!(p.line().contains("other 1"), "{}", p.line());
        assert!(p.line().contains("(verifier 1"), "{}", p.line());
    }

    #[test]
    fn a_part_with_no_program_says_none() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = Phases::new();
        p.mark_programs("nothing loaded");
        assert_eq!(p.parts[0].2, Some((Duration::ZERO, Duration::ZERO)));
    }
}
