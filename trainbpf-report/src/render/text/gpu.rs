//! The GPU part of the text report: per-process GPU and pinned memory, the
//! workers that initialised CUDA, CUDA OOMs, Xid errors, a timeline with the
//! host RSS beside it, and what each kill's story gains from them.

use std::fmt::Write as _;

use crate::term::escape as esc;

use crate::model::Report;
use crate::model::gpu::{GpuAtKill, GpuProcess, Held, MAX_TIMELINE};
use crate::units::{human_bytes, human_kb, signed_bytes};

use super::style::{Paint, wrap};
use crate::units::secs_whole;

fn context_phrase(p: &GpuProcess) -> Option<String> {
    let c = p.contexts.first()?;
    let mut s = c.op.name().to_string();
    if let Some(d) = c.device {
        let _ = write!(s, " on GPU {d}");
    }
    if let Some(kb) = c.host_kb {
        let _ = write!(s, ", +{} of host memory", human_kb(kb));
    }
    Some(s)
}

/// CUDA allocation stacks shown per process (`report --stacks`: all).
const GPU_STACKS: usize = 3;

/// The GPU section, when the recording has anything GPU-related.
pub(crate) fn section(out: &mut String, r: &Report, width: usize, p: &Paint) {
    let g = &r.gpu;
    if g.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "{}",
        p.bold("GPU and pinned host memory (CUDA driver calls, per process):")
    );
    processes_part(out, r, width, p);
    super::stacks::gpu_lines(out, r, GPU_STACKS);
    workers_part(out, r, width, p);
    cuda_ooms_part(out, r, width, p);
    xid_part(out, r, p);
    timeline_part(out, r, p);

    sources_part(out, r, width, p);
    out.push('\n');
}

/// The per-process table, and notes on its columns.
fn processes_part(out: &mut String, r: &Report, width: usize, p: &Paint) {
    let g = &r.gpu;
    if g.processes.is_empty() {
        let _ = writeln!(out, "  No job process called the CUDA driver.");
    } else {
        let _ = writeln!(
            out,
            "  {:>7}  {:<16}  {:>11}  {:>10}  {:>11}  {:>10}  {:>12}  {:>3}  {:>13}",
            "PID",
            "COMM",
            "DEVICE PEAK",
            "DEVICE END",
            "PINNED PEAK",
            "PINNED END",
            "MANAGED PEAK",
            "CTX",
            "NVML - PROBES"
        );
        for x in &g.processes {
            let nvml = x.nvml.map_or("-".into(), |n| signed_bytes(n.difference()));
            let _ = writeln!(
                out,
                "  {:>7}  {:<16}  {:>11}  {:>10}  {:>11}  {:>10}  {:>12}  {:>3}  {:>13}",
                x.pid,
                esc(&x.comm),
                human_bytes(x.device.peak),
                human_bytes(x.device.end),
                human_bytes(x.pinned.peak),
                human_bytes(x.pinned.end),
                human_bytes(x.managed.peak),
                x.contexts.len(),
                nvml
            );
        }
        let mut notes = Vec::new();
        if g.processes.iter().any(|x| x.exited_ns.is_some()) {
            notes.push(
                "END is what a process held when it exited, freed with it (or at the end of the recording)."
                    .to_string(),
            );
        }
        if g.processes.iter().any(|x| x.nvml.is_some()) {
            notes.push(
                "NVML - PROBES: NVML's figure for the process minus the device memory the probes saw, \
                 at the last sample: its CUDA contexts and driver overhead, or allocations the probes missed."
                    .to_string(),
            );
        }
        let registered: u64 = g.processes.iter().map(|x| x.registered_peak).sum();
        if registered > 0 {
            notes.push(format!(
                "PINNED includes {} registered with cuMemHostRegister: memory the process already had, now page-locked.",
                human_bytes(registered)
            ));
        }
        for n in notes {
            for line in wrap(&n, width.saturating_sub(4)) {
                let _ = writeln!(out, "  {}", p.dim(&line));
            }
        }
    }
    out.push('\n');
}

/// Workers, not the job's root, that initialised CUDA.
fn workers_part(out: &mut String, r: &Report, width: usize, p: &Paint) {
    let g = &r.gpu;
    let workers: Vec<&GpuProcess> = g.processes.iter().filter(|x| x.worker_init).collect();
    if !workers.is_empty() {
        let _ = writeln!(
            out,
            "  {}",
            p.yellow(&format!(
                "{} worker process(es), not the job's root, initialised CUDA:",
                workers.len()
            ))
        );
        for w in workers {
            let mut s = format!("pid {} ({})", w.pid, esc(&w.comm));
            if let Some(parent) = w.parent {
                let _ = write!(s, ", a child of pid {parent},");
            }
            match context_phrase(w) {
                Some(c) => {
                    let _ = write!(s, " created a CUDA context: {c}.");
                }
                None => s.push_str(" called cuInit."),
            }
            if w.parent_had_context {
                s.push_str(
                    " Its parent already had a context: a forked worker that touches CUDA pays \
                     for one of its own.",
                );
            }
            for (i, line) in wrap(&s, width.saturating_sub(6)).into_iter().enumerate() {
                let _ = writeln!(out, "  {} {line}", if i == 0 { "-" } else { " " });
            }
        }
        out.push('\n');
    }
}

/// Each CUDA out-of-memory error, with what was held then.
fn cuda_ooms_part(out: &mut String, r: &Report, width: usize, p: &Paint) {
    let g = &r.gpu;
    if !g.cuda_ooms.is_empty() {
        let _ = writeln!(out, "  {}", p.red("CUDA out of memory:"));
        for o in &g.cuda_ooms {
            let mut s = format!(
                "+{:.1} s: pid {} ({}, thread {}) asked {} for {} and got CUDA_ERROR_OUT_OF_MEMORY ({}). It held {} of device memory, {} pinned, {} managed.",
                r.since_start_s(o.ts_ns),
                o.pid,
                esc(&o.comm),
                o.tid,
                o.op.name(),
                human_bytes(o.requested_bytes),
                o.error,
                human_bytes(o.held.device),
                human_bytes(o.held.pinned),
                human_bytes(o.held.managed)
            );
            let others: Vec<String> = o
                .holders
                .iter()
                .filter(|h| h.held.device > 0)
                .map(|h| {
                    format!(
                        "pid {} ({}) {}",
                        h.pid,
                        esc(&h.comm),
                        human_bytes(h.held.device)
                    )
                })
                .collect();
            if !others.is_empty() {
                let _ = write!(s, " Device memory in use then: {}.", others.join(", "));
            }
            match (o.nvml_used_bytes, o.nvml_total_bytes) {
                (Some(u), Some(t)) => {
                    let _ = write!(
                        s,
                        " NVML: {} of {} used on the GPUs.",
                        human_bytes(u),
                        human_bytes(t)
                    );
                }
                _ => s.push_str(" No NVML sample before it."),
            }
            for (i, line) in wrap(&s, width.saturating_sub(6)).into_iter().enumerate() {
                let _ = writeln!(out, "  {} {line}", if i == 0 { "-" } else { " " });
            }
        }
        out.push('\n');
    }
}

/// NVIDIA Xid errors from the kernel log.
fn xid_part(out: &mut String, r: &Report, p: &Paint) {
    let g = &r.gpu;
    if !g.xid.is_empty() {
        let _ = writeln!(out, "  {}", p.red("NVIDIA Xid errors:"));
        for x in &g.xid {
            let who = match (x.pid, &x.name) {
                (Some(pid), Some(n)) => format!(", pid {pid} ({})", esc(n)),
                (Some(pid), None) => format!(", pid {pid}"),
                (None, Some(n)) => format!(", {}", esc(n)),
                (None, None) => String::new(),
            };
            let _ = writeln!(
                out,
                "  - +{:.1} s: Xid {} on {}{who}: {} [{}]",
                r.since_start_s(x.ts_ns),
                x.code,
                if x.pci.is_empty() {
                    "?".into()
                } else {
                    esc(&x.pci)
                },
                esc(&x.msg),
                esc(&x.source)
            );
        }
        out.push('\n');
    }
}

/// Memory after each notable step.
fn timeline_part(out: &mut String, r: &Report, p: &Paint) {
    let g = &r.gpu;
    if !g.timeline.is_empty() {
        let _ = writeln!(
            out,
            "  Timeline (memory after each step; host RSS of the process beside it):"
        );
        let _ = writeln!(
            out,
            "  {:>8}  {:>7}  {:<16}  {:>10}  {:>10}  {:>10}  {:>10}  WHAT",
            "TIME", "PID", "COMM", "DEVICE", "PINNED", "MANAGED", "HOST RSS"
        );
        for row in &g.timeline {
            let what = if let Some(req) = row.requested_bytes {
                format!("{} ({} asked)", row.what, human_bytes(req))
            } else if row.notable {
                row.what.clone()
            } else {
                let mut parts = Vec::new();
                let (pk, held) = (row.peak, row.held);
                let kinds = [
                    ("device", pk.device, held.device),
                    ("pinned", pk.pinned, held.pinned),
                    ("managed", pk.managed, held.managed),
                ];
                for (i, (name, peak, now)) in kinds.into_iter().enumerate() {
                    match (row.delta[i], peak > now) {
                        (0, false) => {}
                        (0, true) => parts.push(format!("{name} peak {}", human_bytes(peak))),
                        (d, false) => parts.push(format!("{name} {}", signed_bytes(d))),
                        (d, true) => parts.push(format!(
                            "{name} {} (peak {})",
                            signed_bytes(d),
                            human_bytes(peak)
                        )),
                    }
                }
                format!("{}: {}", row.what, parts.join(", "))
            };
            let line = format!(
                "  {:>8}  {:>7}  {:<16}  {:>10}  {:>10}  {:>10}  {:>10}  {what}",
                format!("+{:.2} s", r.since_start_s(row.ts_ns)),
                row.pid,
                esc(&row.comm),
                human_bytes(row.held.device),
                human_bytes(row.held.pinned),
                human_bytes(row.held.managed),
                row.host_rss_kb.map_or("-".into(), human_kb)
            );
            let _ = writeln!(
                out,
                "{}",
                if row.what.contains("out of memory") {
                    p.red(&line)
                } else {
                    line
                }
            );
        }
        if g.timeline_dropped > 0 {
            let _ = writeln!(
                out,
                "  {}",
                p.dim(&format!(
                    "{} smaller steps not shown (the {MAX_TIMELINE} largest, and every context, OOM and exit, are).",
                    g.timeline_dropped
                ))
            );
        }
        out.push('\n');
    }
}

/// NVML's samples, the GPU sources used and not, attach errors and lost
/// events.
fn sources_part(out: &mut String, r: &Report, width: usize, p: &Paint) {
    let g = &r.gpu;
    if g.nvml_samples > 0 {
        let devs: Vec<String> = g
            .nvml_devices
            .iter()
            .map(|d| {
                format!(
                    "GPU {} {}: peak {} of {} used",
                    d.index,
                    esc(&d.name),
                    human_bytes(d.peak_used_bytes),
                    human_bytes(d.total_bytes)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  NVML: {} samples; {}.",
            g.nvml_samples,
            devs.join("; ")
        );
    }
    let used: Vec<String> = g
        .sources
        .iter()
        .filter(|s| s.used)
        .map(|s| format!("{}: {}", esc(&s.source), esc(&s.detail)))
        .collect();
    let unused: Vec<String> = g
        .sources
        .iter()
        .filter(|s| !s.used)
        .map(|s| format!("{}: {}", esc(&s.source), esc(&s.detail)))
        .collect();
    for (head, list) in [("used", used), ("not used", unused)] {
        if !list.is_empty() {
            for line in wrap(
                &format!("GPU sources {head}: {}.", list.join("; ")),
                width - 4,
            ) {
                let _ = writeln!(out, "  {}", p.dim(&line));
            }
        }
    }
    for a in g.attach.iter().filter(|a| a.error.is_some()) {
        let _ = writeln!(
            out,
            "  {}",
            p.yellow(&format!(
                "{} ({}): {}",
                esc(&a.path),
                esc(&a.found_by),
                esc(a.error.as_deref().unwrap_or(""))
            ))
        );
    }
    super::gpu_late::part(out, r, width, p);
    if let Some(line) = refused_line(r) {
        for l in wrap(&line, width - 4) {
            let _ = writeln!(out, "  {}", p.yellow(&l));
        }
    }
    let lost = crate::model::gpu::lost_events(r);
    let line = format!(
        "GPU lost events: {lost} (ring buffer, calls the entry/return map had no room for, and driver calls in uncovered windows){}",
        if g.lost.read_failed > 0 {
            format!("; {} returned pointers unreadable", g.lost.read_failed)
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "  {}", if lost > 0 { p.yellow(&line) } else { line });
}

/// What the recorder refused to read or probe, and holds it ended: one
/// sentence, or none.
fn refused_line(r: &Report) -> Option<String> {
    let l = &r.gpu.lost;
    let mut parts = Vec::new();
    if l.unreadable > 0 {
        parts.push(format!(
            "{} driver library mapping(s) not probed because the job could not read the file",
            l.unreadable
        ));
    }
    if l.tables_too_big > 0 {
        parts.push(format!(
            "{} library file(s) not read because their symbol tables claim more than the recorder reads",
            l.tables_too_big
        ));
    }
    if l.over_cap > 0 {
        parts.push(format!(
            "{} driver library mapping(s) not probed: the run had already tried as many libraries found through the job as it probes",
            l.over_cap
        ));
    }
    if l.hold_timeouts > 0 {
        parts.push(format!(
            "{} hold(s) ended at their limit before the probes were on (calls since counted in the windows above)",
            l.hold_timeouts
        ));
    }
    (!parts.is_empty()).then(|| format!("GPU probing: {}.", parts.join("; ")))
}

fn total(k: &GpuAtKill) -> Held {
    let mut h = Held::default();
    for p in &k.processes {
        h.device += p.held.device;
        h.pinned += p.held.pinned;
        h.managed += p.held.managed;
    }
    h
}

/// What a host OOM kill's story gains from the GPU side: contexts created
/// before it (each costs host memory), pinned buffers that grew, and what
/// the processes held.
pub(crate) fn kill_lines(out: &mut String, r: &Report, i: usize, width: usize) {
    let Some(k) = r.gpu.at_kills.get(i) else {
        return;
    };
    if k.processes.is_empty() && k.contexts.is_empty() {
        return;
    }
    let window = secs_whole(k.window_ns);
    let mut s = String::from("GPU side:");
    if !k.contexts.is_empty() {
        let costs: Vec<String> = k
            .contexts
            .iter()
            .filter_map(|(_, _, c)| c.host_kb.map(human_kb))
            .collect();
        let _ = write!(
            s,
            " {} process(es) created a CUDA context in the {window} before the kill ({})",
            k.contexts.len(),
            k.contexts
                .iter()
                .map(|(pid, comm, _)| format!("{} {pid}", esc(comm)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !costs.is_empty() {
            let _ = write!(s, ", each with host memory of {}", costs.join(", "));
        }
        s.push('.');
    }
    if let Some(top) = k
        .processes
        .iter()
        .filter(|p| p.grew[1] > 0)
        .max_by_key(|p| p.grew[1])
    {
        let _ = write!(
            s,
            " pid {} ({}) pinned {} of host buffers in the {window} before the kill, {} pinned at the kill.",
            top.pid,
            esc(&top.comm),
            human_bytes(top.grew[1] as u64),
            human_bytes(top.held.pinned)
        );
    }
    let t = total(k);
    if t != Held::default() {
        let _ = write!(
            s,
            " At the kill the recorded processes held {} of device memory, {} pinned host, {} managed.",
            human_bytes(t.device),
            human_bytes(t.pinned),
            human_bytes(t.managed)
        );
    }
    for line in wrap(&s, width.saturating_sub(2)) {
        let _ = writeln!(out, "  {line}");
    }
    out.push('\n');
}

/// Lines for the end-of-run verdict.
pub(crate) fn verdict(out: &mut String, r: &Report) {
    let g = &r.gpu;
    for o in g.cuda_ooms.iter().take(3) {
        let _ = writeln!(
            out,
            "trainbpf: CUDA OOM: pid {} ({}) asked {} for {} holding {} of device memory",
            o.pid,
            esc(&o.comm),
            o.op.name(),
            human_bytes(o.requested_bytes),
            human_bytes(o.held.device)
        );
    }
    if g.cuda_ooms.len() > 3 {
        let _ = writeln!(
            out,
            "trainbpf: … and {} more CUDA OOMs",
            g.cuda_ooms.len() - 3
        );
    }
    let workers = g.processes.iter().filter(|p| p.worker_init).count();
    if workers > 0 {
        let _ = writeln!(
            out,
            "trainbpf: {workers} worker process(es) initialised CUDA (see the report)"
        );
    }
    if !g.xid.is_empty() {
        let codes: Vec<String> = g.xid.iter().take(5).map(|x| x.code.to_string()).collect();
        let _ = writeln!(
            out,
            "trainbpf: {} NVIDIA Xid error(s): {}",
            g.xid.len(),
            codes.join(", ")
        );
    }
}
