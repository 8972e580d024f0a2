//! The report for people: per kill, a short story with the figures that
//! back it, then the tables. Also the one-screen verdict `record` prints
//! when the job ends.

use std::fmt::Write as _;

use crate::model::Report;
use crate::render::rfc3339_ms;
use crate::units::{human_kb, human_secs};
// Every name, argument, path and cgroup below came from a process: through
// `esc` before it is formatted (see crate::term).
use crate::term::{escape as esc, escape_join};

/// "Most likely:", the verdict's line and `report --explain`.
mod diagnoses;
/// What the kernel programs logged (`record --ebpf-log`).
mod ebpf_log;
/// GPU and pinned memory, CUDA OOMs, Xid.
mod gpu;
/// Late driver libraries: holds and uncovered windows.
mod gpu_late;
/// One OOM kill's section.
mod kill;
/// Suspected leaks and the time to the limit.
mod leaks;
/// Several recordings of one job: the first failure, one timeline.
mod merged;
/// The sections about the whole run, and the footer.
mod run;
/// Growth stacks: under each kill's growers, and `report --stacks`.
mod stacks;
/// Options, colour, escaping and wrapping, shared by every section.
pub(crate) mod style;
/// The verdict `record` prints when the job ends.
mod verdict;
/// "rank 1 (pid 14450)": job processes by their rank.
mod who;

pub(crate) use diagnoses::explain;
pub(crate) use kill::story;
pub(crate) use leaks::report as leaks_report;
pub use leaks::warning_text;
pub(crate) use merged::{each, merged};
pub(crate) use stacks::report as stacks_report;
pub use style::TextOptions;
use style::{MIN_WIDTH, Paint, finish, or_unknown, yes_no};
pub use verdict::verdict;

/// Growers and memory users shown when there is no kill to explain.
const TOP_USERS: usize = 5;

pub(crate) fn render(r: &Report, o: &TextOptions) -> String {
    let p = Paint(o.color);
    let width = o.width.max(MIN_WIDTH);
    let mut out = String::new();

    header(&mut out, r, &p);
    if r.kills.is_empty() {
        diagnoses::run_head(&mut out, r, width, &p);
        no_kill(&mut out, r, &p);
    }

    let n = r.kills.len();
    for (i, k) in r.kills.iter().enumerate() {
        kill::kill_section(&mut out, r, k, i, n, width, &p);
    }

    leaks::section(&mut out, r, width, &p);
    run::job_memory_section(&mut out, r, &p);
    run::shared_memory_section(&mut out, r, &p);
    if let Some(s) = &r.attribution_at_peak {
        let _ = writeln!(
            out,
            "At the job cgroup's peak: {}\n",
            run::sum_check_line(s)
        );
    }
    super::chart::run_summary(&mut out, r, width, o.color);

    gpu::section(&mut out, r, width, &p);
    run::deaths_section(&mut out, r, &p);
    ebpf_log::section(&mut out, r, &p);
    run::footer(&mut out, r, &p);
    finish(out, o.color)
}

/// The title, the kernel and the span recorded, and probes not used.
fn header(out: &mut String, r: &Report, p: &Paint) {
    let title = match &r.job {
        Some(j) if j.attached.is_none() => format!("trainbpf report: {}", escape_join(&j.argv)),
        Some(_) => format!("trainbpf report: {}", esc(&r.title())),
        None => "trainbpf report".to_string(),
    };
    let _ = writeln!(out, "{}", p.bold(&title));
    let mut about = format!(
        "kernel {}, {} recorded",
        or_unknown(&r.header.kernel),
        human_secs(r.duration_ns())
    );
    if let Some(t) = r.first_ns.and_then(|t| r.realtime_ns(t)) {
        let _ = write!(about, " from {}", rfc3339_ms(t));
    }
    let _ = writeln!(out, "{}", p.dim(&about));
    let all = r
        .job
        .as_ref()
        .is_some_and(|j| j.attached.as_deref() == Some("all"));
    if let Some(line) = crate::render::readable::left_out_line(&r.left_out, all) {
        let _ = writeln!(out, "{}", p.dim(&line));
    }
    for f in &r.header.fallbacks {
        let _ = writeln!(
            out,
            "{}",
            p.dim(&format!("probe {} not used: {}", f.probe, f.reason))
        );
    }
    if r.kills_elsewhere > 0 {
        let _ = writeln!(
            out,
            "{}",
            p.dim(&format!(
                "{} OOM kill{} of other jobs on this machine (in memory cgroups that are not \
                 the job's nor its parents') left out",
                r.kills_elsewhere,
                if r.kills_elsewhere == 1 { "" } else { "s" }
            ))
        );
    }
    out.push('\n');
}

/// With no kill to explain: the top memory users.
fn no_kill(out: &mut String, r: &Report, p: &Paint) {
    let _ = writeln!(out, "{}", p.bold("no OOM kill recorded"));
    out.push('\n');
    if !r.top_memory.is_empty() {
        let _ = writeln!(out, "Top memory users (peak resident):");
        let _ = writeln!(
            out,
            "  {:>7}  {:<16}  {:>11}  JOB",
            "PID", "COMM", "PEAK RSS"
        );
        for u in r.top_memory.iter().take(TOP_USERS) {
            let _ = writeln!(
                out,
                "  {:>7}  {:<16}  {:>11}  {}",
                u.pid,
                esc(&u.comm),
                human_kb(u.peak_rss_kb),
                yes_no(u.in_job)
            );
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::ExitStatus;
    use crate::render::fixture::sample_report;

    fn plain(r: &Report) -> String {
        render(
            r,
            &TextOptions {
                color: false,
                width: 1000,
            },
        )
    }

    #[test]
    fn names_victim_and_top_grower_with_figures() {
        let t = plain(&sample_report());
        assert!(
            t.contains(
                "pt_data_worker (pid 812, in the job) grew 250.1 MiB RSS in 12.0 s (20.8 MiB/s); \
                 the kernel's memcg OOM killer (limit 300 MiB in /trainbpf-77) then killed \
                 pid 812 (pt_data_worker), anon-rss 251 MiB."
            ),
            "{t}"
        );
        assert!(t.contains("python3(700) → pt_data_worker(812)"), "{t}");
        assert!(t.contains("memcg (a memory cgroup hit its limit)"), "{t}");
        assert!(
            t.contains("/trainbpf-77, usage 300 MiB of limit 300 MiB, 3 failed charges"),
            "{t}"
        );
        assert!(t.contains("growth in the 60 s before the kill"), "{t}");
        assert!(t.contains("killed by signal 9 (SIGKILL)"), "{t}");
        // Losses are always stated, and broken down when there are some.
        assert!(
            t.contains("lost events: 6 (memory 3, undecodable 3, kill/death/signal ring 0)"),
            "{t}"
        );
        assert!(!t.contains('\x1b'), "no colour unless asked");
        let c = render(
            &sample_report(),
            &TextOptions {
                color: true,
                width: 80,
            },
        );
        assert!(c.contains("\x1b[1;31m"));
    }

    #[test]
    fn a_victim_that_did_not_grow_is_explained() {
        let mut r = sample_report();
        let k = &mut r.kills[0];
        k.victim.pid = 813;
        k.victim.comm = "sacrifice".into();
        k.victim.oom_score_adj = 1000;
        k.growers.retain(|g| !g.is_victim);
        k.growers[0].grew_kb = 200 * 1024;
        let t = plain(&r);
        assert!(
            t.contains("python3 (pid 700, in the job) grew 200 MiB"),
            "{t}"
        );
        assert!(t.contains("then killed pid 813 (sacrifice)"), "{t}");
        assert!(t.contains("it did not grow in the window"), "{t}");
        assert!(t.contains("oom_score_adj of 1000"), "{t}");
    }

    #[test]
    fn no_kill_says_so_with_outcome_and_users() {
        let mut r = sample_report();
        r.kills.clear();
        r.lost = Default::default();
        r.undecodable = 0;
        r.job.as_mut().unwrap().exit = Some(ExitStatus::Code(1));
        r.top_memory.push(crate::model::MemoryUser {
            pid: 700,
            start_ns: 1,
            comm: "python3".into(),
            peak_rss_kb: 40_960,
            in_job: true,
        });
        r.stopped_early = Some(crate::recording::Stop {
            offset: 4096,
            reason: "frame checksum mismatch".into(),
        });
        let t = plain(&r);
        assert!(t.contains("no OOM kill recorded"), "{t}");
        assert!(t.contains("exited with code 1"), "{t}");
        assert!(t.contains("lost events: 0\n"), "{t}");
        assert!(t.contains("python3") && t.contains("40 MiB"), "{t}");
        assert!(
            t.contains("stopped early at byte 4096: frame checksum mismatch"),
            "{t}"
        );
    }

    #[test]
    fn skipped_damage_is_noted() {
        let mut r = sample_report();
        let skip = |offset| crate::recording::Skip {
            offset,
            bytes: 100,
            reason: "frame checksum mismatch".into(),
        };
        r.skipped = crate::recording::Skipped {
            ranges: vec![skip(500), skip(900), skip(1300), skip(1700)],
            count: 5,
            bytes: 500,
        };
        let t = plain(&r);
        assert!(
            t.contains("the recording has 5 damaged stretches (500 bytes), skipped: 100 bytes at byte 500 (frame checksum mismatch)"),
            "{t}"
        );
        assert!(
            t.contains(", and 2 more; what follows each was read"),
            "{t}"
        );
    }

    #[test]
    fn prose_wraps_to_width() {
        let t = render(
            &sample_report(),
            &TextOptions {
                color: false,
                width: 60,
            },
        );
        let story: Vec<_> = t
            .lines()
            .skip_while(|l| !l.starts_with("OOM kill"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(story.len() > 1, "{t}");
        assert!(story.iter().all(|l| l.chars().count() <= 60), "{story:#?}");
    }

    #[test]
    fn verdict_is_short_and_complete() {
        let v = verdict(&sample_report());
        assert!(
            v.contains("memcg OOM in /trainbpf-77 (limit 300 MiB) killed pid 812 (pt_data_worker), RSS 253 MiB"),
            "{v}"
        );
        assert!(
            v.contains(
                "trainbpf: pt_data_worker (pid 812) was OOM-killed: its memory cgroup reached its \
                 300 MiB limit; its RSS grew 250.1 MiB in 12.0 s\n"
            ),
            "{v}"
        );
        assert!(v.contains("killed by signal 9 (SIGKILL)"), "{v}");
        assert!(v.contains("lost events: 6"), "{v}");
        assert!(v.lines().count() <= 4, "{v}");

        let mut r = sample_report();
        r.kills.clear();
        r.lost = Default::default();
        r.undecodable = 0;
        let v = verdict(&r);
        assert!(v.contains("no OOM kill recorded"), "{v}");
        assert!(!v.contains("lost events"), "{v}");
    }
}

/// The text renderer through crate::term: a report whose every process-derived
/// string carries an escape sequence reaches no terminal raw.
#[cfg(test)]
mod render_tests {
    use crate::render::fixture::sample_report;
    use crate::render::text::{TextOptions, leaks_report, render, verdict};

    const EVIL: &str = "\x1b]0;pwned\x07";

    fn evil_report() -> crate::model::Report {
        let mut r = sample_report();
        let job = r.job.as_mut().unwrap();
        job.argv = vec!["python3".into(), format!("{EVIL}\x1b[2J")];
        let k = &mut r.kills[0];
        k.victim.comm = EVIL.into();
        k.trigger.comm = EVIL.into();
        k.memcg = Some(format!("/x{EVIL}"));
        for g in &mut k.growers {
            g.comm = EVIL.into();
        }
        for t in &mut k.victim.tree {
            t.comm = EVIL.into();
        }
        for p in &mut r.processes {
            p.comm = EVIL.into();
        }
        r.ebpf_log.messages.push((
            r.first_ns.unwrap(),
            crate::decode::EbpfLog {
                program: EVIL.into(),
                level: EVIL.into(),
                site: EVIL.into(),
                message: EVIL.into(),
            },
        ));
        r
    }

    #[test]
    fn no_raw_escape_reaches_the_text_outputs() {
        let r = evil_report();
        for color in [false, true] {
            let o = TextOptions { color, width: 120 };
            let t = render(&r, &o);
            assert!(t.contains("\\x1b]0;pwned\\x07"), "{t}");
            assert!(t.contains("python3 \\x1b]0;pwned\\x07\\x1b[2J"), "{t}");
            // With colour on the only ESC left opens an SGR sequence.
            for (i, _) in t.match_indices('\x1b') {
                let rest = &t[i + 1..];
                assert!(color && rest.starts_with('['), "{t}");
                let end = rest.find('m').unwrap();
                assert!(
                    rest[1..end]
                        .bytes()
                        .all(|b| b.is_ascii_digit() || b == b';')
                );
            }
            let l = leaks_report(&r, &o);
            assert!(!l.contains("\x07"), "{l}");
        }
        let v = verdict(&r);
        assert!(!v.contains('\x1b') && !v.contains('\x07'), "{v}");
        assert!(v.contains("killed pid 812 (\\x1b]0;pwned\\x07)"), "{v}");
    }
}
