//! Loading and attaching the GPU programs: the libcuda uprobes (each
//! return probe before its entry), the NVIDIA Xid tracepoint, and the
//! driver's page kprobes where the kernel has them.

use crate::util::phases;
use std::{collections::HashSet, fs, path::Path};

use aya::{
    Ebpf,
    programs::{
        KProbe, ProgramError, TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeScope},
    },
};

use super::{CUDA_SYMBOLS, why};
use crate::loader::{UprobeMulti, kernel};
use crate::record::links::Links;

pub(super) fn load_uprobes(ebpf: &mut Ebpf) -> Result<(), String> {
    let mut seen = HashSet::new();
    for (_, prog) in CUDA_SYMBOLS {
        if !seen.insert(prog) {
            continue;
        }
        for name in [prog.to_string(), format!("{prog}_ret")] {
            let p: &mut UProbe = ebpf
                .program_mut(&name)
                .ok_or_else(|| format!("program {name} missing from the object"))?
                .try_into()
                .map_err(|e: ProgramError| why(&e))?;
            phases::verify(|| p.load()).map_err(|e| format!("{name}: {}", why(&e)))?;
        }
    }
    Ok(())
}

/// Attaches the return probe, then the entry probe, at `offset` in the file
/// `target` (a descriptor's `/proc/self/fd/N`, which aya passes to the
/// kernel as it is): an entry without its return would fill the pairing
/// map with calls that never complete. Both links go to `links`, detached
/// with the others at the end.
pub(super) fn attach_pair(
    ebpf: &mut Ebpf,
    prog: &str,
    offset: u64,
    target: &Path,
    links: &mut Links,
) -> Result<(), String> {
    let at = || UProbeAttachLocation::AbsoluteOffset(offset);
    let ret_name = format!("{prog}_ret");
    let ret: &mut UProbe = uprobe_mut(ebpf, &ret_name)?;
    let ret_id = phases::attach(|| ret.attach(at(), target, UProbeScope::AllProcesses))
        .map_err(|e| why(&e))?;
    let ret_link = ret.take_link(ret_id).map_err(|e| why(&e))?;
    let entry: &mut UProbe = uprobe_mut(ebpf, prog)?;
    // On an error the return probe's link is dropped: detached.
    let id = phases::attach(|| entry.attach(at(), target, UProbeScope::AllProcesses))
        .map_err(|e| why(&e))?;
    let link = entry.take_link(id).map_err(|e| why(&e))?;
    links.keep(ret_link);
    links.keep(link);
    Ok(())
}

/// Attaches each program once for all of its calls `found` in the file
/// `target` (symbol, program, offset): a multi link holding the return
/// probes, then one holding the entries, for the reason `attach_pair`
/// gives. The symbols probed go to `attached`, failures to `errors`.
pub(super) fn attach_multi(
    m: &UprobeMulti,
    found: &[(&str, &str, u64)],
    target: &Path,
    attached: &mut Vec<String>,
    errors: &mut Vec<String>,
    links: &mut Links,
) {
    // Programs in the order of their first call; `_ptsz` variants share
    // their base call's program.
    let mut progs: Vec<(&str, Vec<&str>, Vec<u64>)> = Vec::new();
    for &(symbol, prog, offset) in found {
        match progs.iter_mut().find(|(p, _, _)| *p == prog) {
            Some((_, symbols, offsets)) => {
                symbols.push(symbol);
                offsets.push(offset);
            }
            None => progs.push((prog, vec![symbol], vec![offset])),
        }
    }
    for (prog, symbols, offsets) in progs {
        let r = m
            .attach(&format!("{prog}_ret"), target, &offsets)
            // On an error the return link is dropped: detached.
            .and_then(|ret| Ok((ret, m.attach(prog, target, &offsets)?)));
        match r {
            Ok((ret, entry)) => {
                links.keep(ret);
                links.keep(entry);
                attached.extend(symbols.iter().map(|s| s.to_string()));
            }
            Err(e) => errors.push(format!("{}: {e}", symbols.join(", "))),
        }
    }
}

pub(super) fn uprobe_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, String> {
    ebpf.program_mut(name)
        .ok_or_else(|| format!("program {name} missing from the object"))?
        .try_into()
        .map_err(|e: ProgramError| why(&e))
}

pub(super) fn attach_xid(ebpf: &mut Ebpf, printk: bool) -> (bool, String) {
    let fallback = |why: &str| {
        if printk {
            (true, format!("NVRM: Xid lines at printk:console ({why})"))
        } else {
            (
                false,
                format!("{why}, and the printk:console probe is not attached"),
            )
        }
    };
    if kernel::tp_format("nvidia", "nvidia_dev_xid").is_none() {
        return fallback(
            "no nvidia:nvidia_dev_xid tracepoint: no NVIDIA driver loaded, or one older than 575",
        );
    }
    let r = (|| -> Result<(), String> {
        let p: &mut TracePoint = ebpf
            .program_mut("nvidia_dev_xid")
            .ok_or("program nvidia_dev_xid missing from the object")?
            .try_into()
            .map_err(|e: ProgramError| why(&e))?;
        phases::verify(|| p.load()).map_err(|e| why(&e))?;
        phases::attach(|| p.attach("nvidia", "nvidia_dev_xid")).map_err(|e| why(&e))?;
        Ok(())
    })();
    match r {
        Ok(()) => (true, "tracepoint:nvidia:nvidia_dev_xid".into()),
        Err(e) => fallback(&format!("nvidia:nvidia_dev_xid did not attach: {e}")),
    }
}

/// Loads the kprobe program either way (so the verifier checks it on every
/// kernel), attaches it only where the kernel has kprobes and the symbol is
/// in `/proc/kallsyms`.
pub(super) fn attach_nv_kprobe(ebpf: &mut Ebpf, sym: &str) -> (bool, String) {
    let p: &mut KProbe = match ebpf
        .program_mut(sym)
        .ok_or_else(|| format!("program {sym} missing from the object"))
        .and_then(|p| p.try_into().map_err(|e: ProgramError| why(&e)))
    {
        Ok(p) => p,
        Err(e) => return (false, e),
    };
    if let Err(e) = phases::verify(|| p.load()) {
        return (false, format!("the program did not load: {}", why(&e)));
    }
    if !kernel::kprobes_available() {
        return (
            false,
            "kernel has no kprobes (CONFIG_KPROBES unset); the program passed the verifier".into(),
        );
    }
    if !in_kallsyms(sym) {
        return (
            false,
            format!(
                "{sym} is not in /proc/kallsyms (nvidia module not loaded); the program passed the verifier"
            ),
        );
    }
    match phases::attach(|| p.attach(sym, 0)) {
        Ok(_) => (true, format!("kprobe:{sym}")),
        Err(e) => (false, why(&e)),
    }
}

pub(super) fn in_kallsyms(sym: &str) -> bool {
    fs::read_to_string("/proc/kallsyms")
        .is_ok_and(|s| s.lines().any(|l| l.split_whitespace().nth(2) == Some(sym)))
}
