//! Growth stacks in the terminal report: under a kill's top growers, where
//! their memory came from; `report --stacks`, every process's.

use std::fmt::Write as _;

use super::style::{Paint, TextOptions, finish};
use crate::model::lead::{self, Led};
use crate::model::{GrowthStack, Kill, Report};
use crate::term::escape as esc;
use crate::units::{human_bytes, human_kb};

/// Growers whose stacks a kill's section shows, and stacks per grower.
const KILL_GROWERS: usize = 3;
const KILL_STACKS: usize = 3;
/// Frames per stack shown, innermost first.
const FRAMES: usize = 8;

/// A frame as `file:line in function`, the shortest form that finds the
/// line; what is unknown is said.
pub(super) fn frame_text(f: &crate::model::stacks::Frame) -> String {
    let func = f.function.as_deref().map_or_else(
        || format!("{:#x} (unsymbolized)", f.addr),
        |s| esc(s).into_owned(),
    );
    match (&f.file, f.line) {
        (Some(file), Some(line)) => format!("{}:{line} in {func}", esc(file)),
        (Some(file), None) => format!("{} in {func}", esc(file)),
        _ => match &f.module {
            Some(m) if f.function.is_some() => format!("{func} ({})", esc(m)),
            _ => func,
        },
    }
}

/// How a stack's bytes read: growth in kB, GPU allocations in bytes.
fn growth_size(bytes: u64) -> String {
    human_kb(bytes / 1024)
}

fn stack_lines(out: &mut String, stacks: &[GrowthStack], max: usize, indent: &str) {
    sized_stack_lines(out, stacks, max, indent, growth_size);
}

fn sized_stack_lines(
    out: &mut String,
    stacks: &[GrowthStack],
    max: usize,
    indent: &str,
    size: fn(u64) -> String,
) {
    for s in stacks.iter().take(max) {
        let times = if s.count == 1 { "time" } else { "times" };
        let _ = writeln!(out, "{indent}{} ({} {times}):", size(s.bytes), s.count);
        if let Some(e) = &s.error {
            let _ = writeln!(out, "{indent}    [{}]", esc(e));
        }
        for f in s.frames.iter().take(FRAMES) {
            let _ = writeln!(out, "{indent}    {}", frame_text(f));
        }
        if s.frames.len() > FRAMES {
            let _ = writeln!(out, "{indent}    … {} more frames", s.frames.len() - FRAMES);
        }
    }
    if stacks.len() > max {
        let rest: u64 = stacks[max..].iter().map(|s| s.bytes).sum();
        let _ = writeln!(
            out,
            "{indent}{} in {} more stacks (report --stacks lists them)",
            size(rest),
            stacks.len() - max
        );
    }
}

/// Stacks led by the job's own line (`model::lead`): that frame and its
/// callers, then what ran inside it (the allocator, a library), named
/// briefly; `report --stacks` shows every frame.
fn led_lines(out: &mut String, stacks: &[Led], max: usize, indent: &str) {
    for s in stacks.iter().take(max) {
        let times = if s.count == 1 { "time" } else { "times" };
        let merged = if s.merged > 1 {
            format!(", {} stacks that differ only inside this line", s.merged)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{indent}{} ({} {times}{merged}):",
            growth_size(s.bytes),
            s.count
        );
        if let Some(e) = &s.error {
            let _ = writeln!(out, "{indent}    [{}]", esc(e));
        }
        let shown = s.outward();
        for f in shown.iter().take(FRAMES) {
            let _ = writeln!(out, "{indent}    {}", frame_text(f));
        }
        if shown.len() > FRAMES {
            let _ = writeln!(out, "{indent}    … {} more frames", shown.len() - FRAMES);
        }
        let inside = s.below_lead();
        if !inside.is_empty() {
            let names: Vec<String> = inside
                .iter()
                .rev()
                .take(3)
                .map(|f| {
                    f.function
                        .as_deref()
                        .map_or_else(|| format!("{:#x}", f.addr), |n| esc(n).into_owned())
                })
                .collect();
            let more = if inside.len() > 3 { " …" } else { "" };
            let _ = writeln!(
                out,
                "{indent}    (inside it: {}{more}; report --stacks shows every frame)",
                names.join(" -> ")
            );
        }
    }
    if stacks.len() > max {
        let rest: u64 = stacks[max..].iter().map(|s| s.bytes).sum();
        let _ = writeln!(
            out,
            "{indent}{} in {} more stacks (report --stacks lists them)",
            growth_size(rest),
            stacks.len() - max
        );
    }
}

/// Under the GPU section: each process's heaviest CUDA allocation stacks
/// (`max` each). Nothing without `record --stacks`.
pub(super) fn gpu_lines(out: &mut String, r: &Report, max: usize) {
    let procs: Vec<_> = r
        .gpu
        .processes
        .iter()
        .filter(|x| !x.stacks.is_empty())
        .collect();
    if procs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  Where the CUDA allocations were asked for (bytes allocated through each stack over \
         the run, frees not subtracted; innermost frame first):"
    );
    for x in procs {
        let _ = writeln!(out, "    {}:", esc(&r.who(x.pid, x.start_ns, &x.comm)));
        sized_stack_lines(out, &x.stacks, max, "      ", human_bytes);
    }
    out.push('\n');
}

/// Under a kill's growers: the top growers' heaviest stacks. Nothing
/// without `record --stacks`.
pub(super) fn kill_lines(out: &mut String, r: &Report, k: &Kill) {
    growth_lines(out, r, k);
    death_lines(out, r, k);
}

/// Threads besides the main one shown at death, and their frames.
const DEATH_THREADS: usize = 3;
const DEATH_THREAD_FRAMES: usize = 3;

/// The victim's stack at death: the allocating (or kernel-named) thread's
/// frames, then a few of its other threads'. Nothing without stacks.
fn death_lines(out: &mut String, r: &Report, k: &Kill) {
    let s = match r.victim_stack_at_death(k) {
        Ok(None) => return,
        Ok(Some(s)) => s,
        Err(e) => {
            let _ = writeln!(out, "  The victim's stack at death: none ({})\n", esc(&e));
            return;
        }
    };
    let role = if s.trigger {
        "allocating when killed"
    } else {
        "its main thread"
    };
    let _ = writeln!(
        out,
        "  The victim's stack at death (thread {}, {role}, signal {}):",
        s.main.tid, s.main.sig
    );
    if let Some(e) = &s.main.error {
        let _ = writeln!(out, "      [{}]", esc(e));
    }
    for f in s.main.frames.iter().take(FRAMES) {
        let _ = writeln!(out, "      {}", frame_text(f));
    }
    if s.main.frames.len() > FRAMES {
        let _ = writeln!(out, "      … {} more frames", s.main.frames.len() - FRAMES);
    }
    for t in s.threads.iter().take(DEATH_THREADS) {
        let _ = writeln!(out, "    thread {}:", t.tid);
        if t.frames.is_empty()
            && let Some(e) = &t.error
        {
            let _ = writeln!(out, "      [{}]", esc(e));
        }
        for f in t.frames.iter().take(DEATH_THREAD_FRAMES) {
            let _ = writeln!(out, "      {}", frame_text(f));
        }
    }
    let more = s.threads.len().saturating_sub(DEATH_THREADS) + s.more_threads as usize;
    if more > 0 {
        let _ = writeln!(out, "    … {more} more threads (report --json has them)");
    }
    out.push('\n');
}

fn growth_lines(out: &mut String, r: &Report, k: &Kill) {
    if r.stacks.is_empty() {
        return;
    }
    let mut any = false;
    for g in k.growers.iter().take(KILL_GROWERS) {
        let stacks = r.grower_stacks(k, g);
        if stacks.is_empty() {
            continue;
        }
        if !any {
            let _ = writeln!(
                out,
                "  Where the top growers' memory came from (from the innermost line of the \
                 job's own code outward):"
            );
            any = true;
        }
        let _ = writeln!(out, "    {}:", esc(&r.who(g.pid, g.start_ns, &g.comm)));
        led_lines(out, &lead::by_lead(&stacks), KILL_STACKS, "      ");
    }
    if any {
        out.push('\n');
    }
}

/// `report --stacks`: every process's growth stacks over the whole run.
pub(crate) fn report(r: &Report, o: &TextOptions) -> String {
    let p = Paint(o.color);
    let mut out = String::new();
    let _ = writeln!(out, "{}", p.bold("Growth stacks (innermost frame first)"));
    let gpu = r.gpu.processes.iter().any(|x| !x.stacks.is_empty());
    if r.stacks.is_empty() && !gpu {
        let _ = writeln!(out, "none recorded: {}", crate::render::NO_STACKS);
        return finish(out, o.color);
    }
    for key in r.stacks.processes() {
        let stacks = r.process_stacks(key.tgid, key.start_ns);
        let comm = r
            .processes
            .iter()
            .find(|q| q.pid == key.tgid && q.start_ns == key.start_ns)
            .map_or("?", |q| q.comm.as_str());
        let total: u64 = stacks.iter().map(|s| s.bytes).sum();
        let _ = writeln!(
            out,
            "\n{}: {} of new highs in {} stack{}",
            esc(&r.who(key.tgid, key.start_ns, comm)),
            human_kb(total / 1024),
            stacks.len(),
            if stacks.len() == 1 { "" } else { "s" }
        );
        stack_lines(&mut out, &stacks, usize::MAX, "  ");
    }
    if gpu {
        let _ = writeln!(
            out,
            "\n{}",
            p.bold("GPU allocation stacks (bytes allocated through each, frees not subtracted)")
        );
        for x in r.gpu.processes.iter().filter(|x| !x.stacks.is_empty()) {
            let total: u64 = x.stacks.iter().map(|s| s.bytes).sum();
            let _ = writeln!(
                out,
                "\n{}: {} allocated through the CUDA driver",
                esc(&r.who(x.pid, x.start_ns, &x.comm)),
                human_bytes(total)
            );
            sized_stack_lines(&mut out, &x.stacks, usize::MAX, "  ", human_bytes);
        }
    }
    if r.lost.stack_map_full > 0 || r.lost.stack_errors > 0 {
        let _ = writeln!(
            out,
            "\n{}",
            p.yellow(&format!(
                "stacks the kernel could not aggregate (map full): {}; could not read: {}",
                r.lost.stack_map_full, r.lost.stack_errors
            ))
        );
    }
    if r.lost.stack_copies_lost > 0 {
        let _ = writeln!(
            out,
            "{}",
            p.yellow(&format!(
                "new stacks unwound by frame pointers only (their stack copy found the ring full): {}",
                r.lost.stack_copies_lost
            ))
        );
    }
    finish(out, o.color)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::stacks::Frame;

    #[test]
    fn frames_read_file_line_function() {
        let f = Frame {
            kind: "native".into(),
            addr: 0x1234,
            function: Some("grow_here".into()),
            file: Some("/src/grow.c".into()),
            line: Some(8),
            module: Some("/bin/grow".into()),
            found: None,
        };
        assert_eq!(frame_text(&f), "/src/grow.c:8 in grow_here");
        let bare = Frame {
            addr: 0x1234,
            ..Default::default()
        };
        assert_eq!(frame_text(&bare), "0x1234 (unsymbolized)");
        let evil = Frame {
            function: Some("f\x1b]0;x\x07".into()),
            ..Default::default()
        };
        assert!(!frame_text(&evil).contains('\x1b'));
    }
}
