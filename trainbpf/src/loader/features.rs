//! `probe_features`: which program types this kernel lets `record` load
//! and attach, tried for real on the eBPF object, for `trainbpf doctor`.

use aya::{
    Btf, Ebpf, EbpfLoader,
    programs::{BtfTracePoint, FEntry, KProbe, ProgramError, TracePoint},
};

use super::{OBJECT, Tunables, config, why};
use crate::loader::kernel::{self, KernelBtf};

/// Why a feature probed by [`probe_features`] is unavailable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The kernel refused with EPERM or EACCES: missing privileges, a
    /// security policy, or a kernel that forbids this program type.
    Denied(String),
    /// The kernel does not have it (not configured, or too old).
    Missing(String),
    /// It failed for another reason.
    Failed(String),
}

impl Unavailable {
    pub fn reason(&self) -> &str {
        match self {
            Unavailable::Denied(r) | Unavailable::Missing(r) | Unavailable::Failed(r) => r,
        }
    }

    /// Classifies by the errno found in the error's source chain, so that
    /// "the kernel said no" (EPERM) reads differently from a real failure.
    fn from_error(e: &(dyn std::error::Error + 'static), reason: String) -> Self {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>()
                && matches!(io.raw_os_error(), Some(libc::EPERM | libc::EACCES))
            {
                return Unavailable::Denied(reason);
            }
            cur = err.source();
        }
        Unavailable::Failed(reason)
    }
}

/// The outcome of trying one feature.
pub type Probe = Result<(), Unavailable>;

/// What this kernel lets trainbpf do, found by trying it with the real
/// object rather than guessing from version numbers: fentry in particular
/// can be compiled in and still be refused (EPERM) at load time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// `fentry/oom_kill_process`, loaded and attached.
    pub fentry: Probe,
    /// `kprobe/oom_kill_process`, loaded and attached.
    pub kprobe: Probe,
    /// `tp_btf/mark_victim`, where its BTF prototype passes a
    /// `task_struct *` (upstream 6.8+, Debian's 6.1 too).
    pub tp_btf: Probe,
    /// The classic `oom:mark_victim` tracepoint (needs tracefs).
    pub tracepoint: Probe,
    /// A BPF ring buffer map (5.8+).
    pub ringbuf: Probe,
    /// Fields of the classic `oom:mark_victim` record: `pid` alone before
    /// 6.8, the victim's memory figures since. Empty when tracefs is absent.
    pub mark_victim_fields: Vec<String>,
}

/// Loads the object with the same `CONFIG` fill as [`load`] and tries each
/// OOM attach point. Needs the privileges `record` needs; without them every
/// probe reads [`Unavailable::Denied`]. Nothing stays attached: the links
/// and maps go when the `Ebpf` is dropped on return.
pub fn probe_features() -> Features {
    // Mounted first: the classic tracepoint's fields are read from it.
    let tracefs = kernel::ensure_tracefs();
    let fields: Vec<String> = kernel::tp_format("oom", "mark_victim")
        .map(|f| f.into_iter().map(|f| f.name).collect())
        .unwrap_or_default();
    let all_fail = |why: Unavailable| Features {
        fentry: Err(why.clone()),
        kprobe: Err(why.clone()),
        tp_btf: Err(why.clone()),
        tracepoint: Err(why.clone()),
        ringbuf: ringbuf_supported(),
        mark_victim_fields: fields.clone(),
    };
    let kbtf = match KernelBtf::open() {
        Ok(k) => k,
        Err(e) => return all_fail(Unavailable::Missing(e.to_string())),
    };
    // Thresholds don't matter here: nothing is recorded.
    let t = Tunables::default();
    let config = match config(&kbtf, &t, 4096) {
        Ok(c) => c,
        Err(e) => return all_fail(Unavailable::Missing(e.to_string())),
    };
    // The object's own ring size (the record default), so the ring buffer
    // map is created just as `record` creates it.
    let mut ebpf = match EbpfLoader::new()
        .override_global("CONFIG", &config, true)
        .load(OBJECT)
    {
        Ok(e) => e,
        Err(e) => {
            let why = format!("loading the eBPF object: {e}");
            return all_fail(Unavailable::from_error(&e, why));
        }
    };
    let btf = match Btf::from_sys_fs() {
        Ok(b) => b,
        Err(e) => return all_fail(Unavailable::Missing(format!("aya BTF: {e}"))),
    };

    let fentry = tried(
        probe_program::<FEntry>(&mut ebpf, "oom_kill_fentry").and_then(
            |p| -> Result<(), ProbeErr> {
                p.load("oom_kill_process", &btf)?;
                p.attach()?;
                Ok(())
            },
        ),
    );
    let kprobe = if !kernel::kprobes_available() {
        Err(Unavailable::Missing(
            "CONFIG_KPROBES unset: /sys/bus/event_source/devices/kprobe missing".into(),
        ))
    } else {
        tried(
            probe_program::<KProbe>(&mut ebpf, "oom_kill_kprobe").and_then(
                |p| -> Result<(), ProbeErr> {
                    p.load()?;
                    p.attach("oom_kill_process", 0)?;
                    Ok(())
                },
            ),
        )
    };
    // Same test as `load`: where the prototype passes a pid (upstream
    // before 6.8) the program would load but read it as a task_struct
    // pointer. BTF decides, not the version.
    let tp_btf = if let Err(why) = kbtf.tp_first_arg_struct("mark_victim", "task_struct") {
        Err(Unavailable::Missing(why))
    } else {
        tried(
            probe_program::<BtfTracePoint>(&mut ebpf, "mark_victim_btf").and_then(
                |p| -> Result<(), ProbeErr> {
                    p.load("mark_victim", &btf)?;
                    p.attach()?;
                    Ok(())
                },
            ),
        )
    };
    let tracepoint = match &tracefs {
        Err(e) => Err(Unavailable::Missing(format!("tracefs unavailable: {e}"))),
        Ok(()) => tried(
            probe_program::<TracePoint>(&mut ebpf, "mark_victim_tp").and_then(
                |p| -> Result<(), ProbeErr> {
                    p.load()?;
                    p.attach("oom", "mark_victim")?;
                    Ok(())
                },
            ),
        ),
    };
    // The object holds EVENTS, a ring buffer: it loaded, so the map exists.
    let ringbuf = match ebpf.map("EVENTS") {
        Some(aya::maps::Map::RingBuf(_)) => Ok(()),
        _ => Err(Unavailable::Failed(
            "the object's EVENTS ring buffer is missing".into(),
        )),
    };
    Features {
        fentry,
        kprobe,
        tp_btf,
        tracepoint,
        ringbuf,
        mark_victim_fields: fields,
    }
}

/// A program of the object as its concrete type, for [`probe_features`]:
/// errors stay [`ProgramError`]s so their errno can be classified.
fn probe_program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, ProbeErr>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| ProbeErr::Missing(format!("program {name} missing from the object")))?;
    Ok(p.try_into()?)
}

/// An error while probing: aya's, or a program the object lacks.
enum ProbeErr {
    Program(ProgramError),
    Missing(String),
}

impl From<ProgramError> for ProbeErr {
    fn from(e: ProgramError) -> Self {
        ProbeErr::Program(e)
    }
}

fn tried(r: Result<(), ProbeErr>) -> Probe {
    match r {
        Ok(()) => Ok(()),
        Err(ProbeErr::Program(e)) => Err(Unavailable::from_error(&e, why(&e))),
        Err(ProbeErr::Missing(m)) => Err(Unavailable::Failed(m)),
    }
}

/// Asks the kernel for a ring buffer map alone, for when the object did not
/// load and so says nothing about ring buffers.
fn ringbuf_supported() -> Probe {
    match aya::sys::is_map_supported(aya::maps::MapType::RingBuf) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Unavailable::Missing(
            "the kernel has no BPF ring buffer (5.8+)".into(),
        )),
        Err(e) => {
            let why = e.to_string();
            Err(Unavailable::from_error(&e, why))
        }
    }
}
