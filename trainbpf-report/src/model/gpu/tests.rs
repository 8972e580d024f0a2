//! The ledger fed whole streams: allocations, VMM, reordering, contexts,
//! Xid, NVML and the timeline's bound.

use super::xid::parse_xid_line;
use super::*;
use crate::decode::MemSample;
use crate::decode::gpu::{CudaCall, CudaOp, GpuEvent, NvmlSample, XidRecord};
use crate::decode::{Event, JobStart, ProcKey, Rss, Timed};

const MIB: u64 = 1 << 20;

fn key(tgid: u32) -> ProcKey {
    ProcKey {
        tgid,
        start_ns: u64::from(tgid) * 10,
    }
}

fn at(ms: u64, event: Event) -> Timed {
    Timed {
        ts_ns: ms * 1_000_000,
        event,
    }
}

fn call(ms: u64, pid: u32, op: CudaOp, result: u32, size: u64, ptr: u64) -> Timed {
    at(
        ms,
        Event::Gpu(Box::new(GpuEvent::Cuda(CudaCall {
            proc: key(pid),
            tid: pid,
            comm: format!("p{pid}"),
            op,
            result,
            device: None,
            size,
            ptr,
            handle: 0,
            aux: 0,
            entry_ns: (ms * 1_000_000).saturating_sub(1000),
        }))),
    )
}

fn run(events: Vec<Timed>, kills: &[(u64, u64)]) -> GpuReport {
    let mut l = Ledger::default();
    for e in &events {
        l.observe(e);
    }
    l.finish(kills)
}

fn job_start(pid: u32) -> Timed {
    at(
        0,
        Event::JobStart(JobStart {
            pid,
            start_ns: 0,
            argv: vec!["job".into()],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            cgroup: None,
            memory_limit_bytes: None,
            attached: None,
            target: None,
        }),
    )
}

#[test]
fn allocations_frees_peaks_and_exit() {
    use CudaOp::*;
    let r = run(
        vec![
            job_start(1),
            call(10, 1, MemAlloc, 0, 10 * MIB, 0x1000),
            call(11, 1, MemAllocAsync, 0, 5 * MIB, 0x2000),
            call(12, 1, MemFree, 0, 0, 0x1000),
            call(13, 1, MemAllocHost, 0, 2 * MIB, 0x9000),
            call(14, 1, MemAllocManaged, 0, 3 * MIB, 0x3000),
            // Freeing a pinned pointer with cuMemFree is the caller's
            // bug: not a device free.
            call(15, 1, MemFree, 1, 0, 0x9000),
            call(16, 1, MemFree, 0, 0, 0xdead),
            call(17, 1, MemAlloc, 2, 1 << 40, 0),
            at(
                20,
                Event::Exit {
                    proc: key(1),
                    comm: "p1".into(),
                    exit_code: 0,
                    group_exit_code: 0,
                    kthread: false,
                },
            ),
        ],
        &[],
    );
    let p = &r.processes[0];
    assert!(p.is_root && !p.worker_init);
    assert_eq!(
        (
            p.device.allocated,
            p.device.freed,
            p.device.peak,
            p.device.end
        ),
        (15 * MIB, 10 * MIB, 15 * MIB, 5 * MIB)
    );
    assert_eq!(p.device.freed_at_exit, 5 * MIB);
    assert_eq!((p.pinned.peak, p.pinned.end), (2 * MIB, 2 * MIB));
    assert_eq!(p.managed.peak, 3 * MIB);
    assert_eq!(
        (p.device.failed, p.unknown_frees, p.failed_calls),
        (1, 1, 2)
    );
    assert_eq!(r.cuda_ooms.len(), 1);
    let o = &r.cuda_ooms[0];
    assert_eq!((o.requested_bytes, o.error), (1 << 40, 2));
    assert_eq!(o.held.device, 5 * MIB);
    assert!(r.timeline.iter().any(|t| t.what.contains("exited holding")));
}

#[test]
fn vmm_memory_lives_until_released_and_unmapped() {
    let mut ev = vec![job_start(1)];
    ev.push(call(10, 1, CudaOp::MemCreate, 0, 64 * MIB, 0xabc));
    let mut map = call(11, 1, CudaOp::MemMap, 0, 64 * MIB, 0x7000_0000);
    if let Event::Gpu(g) = &mut map.event
        && let GpuEvent::Cuda(c) = &mut **g
    {
        c.handle = 0xabc;
    }
    ev.push(map);
    ev.push(call(12, 1, CudaOp::MemRelease, 0, 0, 0xabc));
    let before_unmap = run(ev.clone(), &[(12_500_000, SEC)]);
    assert_eq!(before_unmap.processes[0].device.end, 64 * MIB);
    ev.push(call(13, 1, CudaOp::MemUnmap, 0, 64 * MIB, 0x7000_0000));
    let r = run(ev, &[]);
    let d = &r.processes[0].device;
    assert_eq!((d.peak, d.end, d.freed), (64 * MIB, 0, 64 * MIB));
}

#[test]
fn out_of_order_records_replay_in_time_order() {
    // A free on one CPU and the reuse of the same pointer on another:
    // the reuse's record reached the file first.
    let r = run(
        vec![
            job_start(1),
            call(10, 1, CudaOp::MemAlloc, 0, MIB, 0x1000),
            call(12, 1, CudaOp::MemAlloc, 0, 2 * MIB, 0x1000),
            call(11, 1, CudaOp::MemFree, 0, 0, 0x1000),
        ],
        &[],
    );
    let p = &r.processes[0];
    assert_eq!(
        (p.device.end, p.device.peak, p.unknown_frees),
        (2 * MIB, 2 * MIB, 0)
    );
}

#[test]
fn worker_context_and_its_host_cost() {
    let mem = |ms: u64, pid: u32, kb: u64| {
        at(
            ms,
            Event::Mem(MemSample {
                proc: key(pid),
                in_job: true,
                comm: format!("p{pid}"),
                rss: Rss {
                    anon_kb: kb,
                    ..Rss::default()
                },
                faults: 0,
                reason: 1,
                oom_score_adj: 0,
                pgtables_kb: 0,
                memcg_id: 0,
                stall_ns: 0,
                alloc_kb: 0,
                freed_kb: 0,
                cache_kb: 0,
            }),
        )
    };
    let r = run(
        vec![
            job_start(1),
            call(5, 1, CudaOp::Init, 0, 0, 0),
            call(6, 1, CudaOp::PrimaryCtxRetain, 0, 0, 0xc1),
            at(
                100,
                Event::Fork {
                    child: key(2),
                    parent: key(1),
                    comm: "p2".into(),
                    kthread: false,
                },
            ),
            mem(150, 2, 10_000),
            call(200, 2, CudaOp::Init, 0, 0, 0),
            mem(250, 2, 30_000),
            mem(299, 2, 70_000),
            call(300, 2, CudaOp::CtxCreate, 0, 0, 0xc2),
            // After the call: not the context's.
            mem(500, 2, 90_000),
        ],
        &[(3 * SEC, 10 * SEC)],
    );
    let w = r.processes.iter().find(|p| p.pid == 2).unwrap();
    assert!(w.worker_init && w.parent_had_context);
    assert_eq!(w.contexts.len(), 1);
    assert_eq!(w.contexts[0].host_kb, Some(60_000));
    let root = r.processes.iter().find(|p| p.pid == 1).unwrap();
    assert!(!root.worker_init);
    assert_eq!(r.at_kills[0].contexts.len(), 2);
}

#[test]
fn xid_lines_parse_and_merge_with_the_tracepoint() {
    let x = parse_xid_line(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    )
    .unwrap();
    assert_eq!((x.code, x.pci.as_str()), (79, "0000:3b:00"));
    assert_eq!((x.pid, x.name.as_deref()), (Some(1234), Some("python3")));
    assert_eq!(x.msg, "GPU has fallen off the bus.");
    let u = parse_xid_line(
        "[ 12.3] NVRM: Xid (PCI:0000:01:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception",
    )
    .unwrap();
    assert_eq!((u.code, u.pid, u.name), (13, None, None));
    assert!(parse_xid_line("NVRM: loading NVIDIA UNIX driver").is_none());

    let tp = at(
        1000,
        Event::Gpu(Box::new(GpuEvent::Xid(XidRecord {
            code: 79,
            pci: "0000:3b:00.0".into(),
            msg: "pid=1234, name=python3, GPU has fallen off the bus.".into(),
        }))),
    );
    let log = at(
        1001,
        Event::Printk {
            tgid: 0,
            msg: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.".into(),
        },
    );
    let r = run(vec![tp, log], &[]);
    assert_eq!(r.xid.len(), 1, "{:?}", r.xid);
    assert_eq!(r.xid[0].source, "tracepoint+printk");
}

#[test]
fn nvml_compares_with_the_ledger_for_job_processes_only() {
    use crate::decode::gpu::{NvmlDevice, NvmlProcess};
    let sample = |ms: u64, used: u64| {
        at(
            ms,
            Event::Gpu(Box::new(GpuEvent::Nvml(NvmlSample {
                devices: vec![NvmlDevice {
                    index: 0,
                    name: "stand-in".into(),
                    used_bytes: used,
                    total_bytes: 80 << 30,
                    processes: vec![
                        NvmlProcess {
                            pid: 1,
                            used_bytes: Some(used),
                        },
                        NvmlProcess {
                            pid: 999,
                            used_bytes: Some(MIB),
                        },
                    ],
                }],
            }))),
        )
    };
    let r = run(
        vec![
            job_start(1),
            call(10, 1, CudaOp::MemAlloc, 0, 100 * MIB, 0x1000),
            sample(2000, 400 * MIB),
            at(
                2500,
                Event::Exit {
                    proc: key(1),
                    comm: "p1".into(),
                    exit_code: 0,
                    group_exit_code: 0,
                    kthread: false,
                },
            ),
            // The driver still lists it while tearing it down: not a
            // comparison with the ledger it left at 0.
            sample(3000, 400 * MIB),
        ],
        &[],
    );
    assert_eq!(r.processes.len(), 1, "pid 999 is not the job's");
    let n = r.processes[0].nvml.unwrap();
    assert_eq!(
        (n.last_nvml_bytes, n.last_ledger_bytes),
        (400 * MIB, 100 * MIB)
    );
    assert_eq!(n.difference(), 300 * MIB as i64);
    assert_eq!(r.nvml_devices[0].peak_used_bytes, 400 * MIB);
}

#[test]
fn timeline_stays_short() {
    let mut ev = vec![job_start(1)];
    for i in 0..500u64 {
        ev.push(call(
            (i + 1) * 2000,
            1,
            CudaOp::MemAlloc,
            0,
            (i + 1) * MIB,
            0x1000 + i,
        ));
    }
    let r = run(ev, &[]);
    assert!(r.timeline.len() <= MAX_TIMELINE);
    assert_eq!(r.timeline.len() + r.timeline_dropped, 500);
    // The largest steps are the ones kept.
    assert!(r.timeline.iter().all(|t| t.delta[0] as u64 > 400 * MIB));
}
