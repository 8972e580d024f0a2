//! What the running kernel offers: struct offsets from its BTF, tracepoint
//! field offsets from tracefs, and the feature checks the loader needs.
//!
//! Rust emits no BTF field relocations (CO-RE), so the offsets compiled into
//! the eBPF object would fit only one kernel. Instead they are looked up here
//! and frozen into the object's read-only `CONFIG` before load. Examples of
//! what moves: `task_struct.tgid` is at 1268 on 6.18 and 2420 on 6.1;
//! `mm->rss_stat` is `struct percpu_counter[4]` since 6.2 (commit f1a7941243c1)
//! and a `struct mm_rss_stat { atomic_long_t count[4]; }` before.

use std::{fs, path::Path};

use btf_rs::{Btf, Type};
use trainbpf_common::Config;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
pub const TRACEFS: &str = "/sys/kernel/tracing";

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No `/sys/kernel/btf/vmlinux`: the kernel was built without
    /// CONFIG_DEBUG_INFO_BTF.
    #[error("kernel BTF ({VMLINUX_BTF}) is missing or unreadable: {0}")]
    NoBtf(String),
    /// A field every supported kernel has could not be found.
    #[error("kernel BTF has no {0}; this kernel is not supported")]
    Missing(String),
}

pub struct KernelBtf {
    btf: Btf,
}

/// Strip typedefs and qualifiers down to the real type.
fn skip_mods(btf: &Btf, mut t: Type) -> Type {
    for _ in 0..16 {
        match &t {
            Type::Typedef(_)
            | Type::Const(_)
            | Type::Volatile(_)
            | Type::Restrict(_)
            | Type::TypeTag(_) => {
                match t
                    .as_btf_type()
                    .and_then(|b| btf.resolve_chained_type(b).ok())
                {
                    Some(n) => t = n,
                    None => return t,
                }
            }
            _ => return t,
        }
    }
    t
}

impl KernelBtf {
    pub fn open() -> Result<Self, KernelError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    pub fn from_file(path: &Path) -> Result<Self, KernelError> {
        Btf::from_file(path)
            .map(|btf| KernelBtf { btf })
            .map_err(|e| KernelError::NoBtf(e.to_string()))
    }

    fn named_struct(&self, name: &str) -> Option<btf_rs::Struct> {
        self.btf
            .resolve_types_by_name(name)
            .ok()?
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
    }

    /// Finds `name` in `s`, looking through anonymous struct/union members
    /// (`mm_struct` keeps most fields in one). Returns bit offset and type.
    fn find_member(&self, s: &btf_rs::Struct, name: &str, depth: u32) -> Option<(u32, Type)> {
        for m in &s.members {
            let mname = self.btf.resolve_name(m).unwrap_or_default();
            let ty = self.btf.resolve_chained_type(m).ok()?;
            if mname == name {
                return Some((m.bit_offset(), ty));
            }
            if mname.is_empty()
                && depth < 4
                && let Type::Struct(inner) | Type::Union(inner) = skip_mods(&self.btf, ty)
                && let Some((off, t)) = self.find_member(&inner, name, depth + 1)
            {
                return Some((m.bit_offset() + off, t));
            }
        }
        None
    }

    /// Byte offset of `path` (e.g. `["signal", ...]` is one level; nested
    /// embedded structs like `["rss_stat", "count"]` go deeper) inside
    /// `struct_name`, and the type found there.
    pub fn member(&self, struct_name: &str, path: &[&str]) -> Option<(i64, Type)> {
        let mut s = self.named_struct(struct_name)?;
        let mut bits = 0u64;
        let mut ty = None;
        for (i, name) in path.iter().enumerate() {
            let (off, t) = self.find_member(&s, name, 0)?;
            bits += off as u64;
            let t = skip_mods(&self.btf, t);
            if i + 1 < path.len() {
                match &t {
                    Type::Struct(n) | Type::Union(n) => s = n.clone(),
                    _ => return None,
                }
            }
            ty = Some(t);
        }
        if !bits.is_multiple_of(8) {
            return None; // a bitfield: not readable by a plain load
        }
        Some(((bits / 8) as i64, ty?))
    }

    pub fn offset(&self, struct_name: &str, path: &[&str]) -> i64 {
        self.member(struct_name, path).map(|(o, _)| o).unwrap_or(-1)
    }

    /// The size of `struct name`, bytes.
    pub fn struct_size(&self, name: &str) -> Option<usize> {
        self.named_struct(name).map(|s| s.size())
    }

    pub fn size_of(&self, t: &Type) -> Option<usize> {
        match skip_mods(&self.btf, t.clone()) {
            Type::Int(i) => Some(i.size()),
            Type::Ptr(_) => Some(8),
            Type::Struct(s) | Type::Union(s) => Some(s.size()),
            Type::Enum(e) => Some(e.size()),
            Type::Array(a) => {
                let elem = self.btf.resolve_chained_type(&a).ok()?;
                Some(a.len() * self.size_of(&elem)?)
            }
            _ => None,
        }
    }

    pub fn enum_value(&self, enum_name: &str, member: &str) -> Option<i64> {
        for t in self.btf.resolve_types_by_name(enum_name).ok()? {
            if let Type::Enum(e) = t {
                for m in &e.members {
                    if self.btf.resolve_name(m).ok()? == member {
                        return Some(m.val() as i64);
                    }
                }
            }
        }
        None
    }

    /// Whether tracepoint `tp`'s first argument is `struct <name> *`, from
    /// its BTF prototype `btf_trace_<tp>` (`void (*)(void *, args...)`); if
    /// not, what this kernel's BTF shows instead, in words. The prototype, not the version, decides: Debian's 6.1
    /// already passes `mark_victim` a task_struct, upstream 6.8 first.
    pub fn tp_first_arg_struct(&self, tp: &str, name: &str) -> Result<(), String> {
        let proto = format!("btf_trace_{tp}");
        let Some(arg) = self.tp_arg(&proto, 1) else {
            return Err(format!("the kernel's BTF has no {proto} prototype"));
        };
        let pointee = match skip_mods(&self.btf, arg.clone()) {
            Type::Ptr(p) => self.btf.resolve_chained_type(&p).ok(),
            _ => None,
        };
        if let Some(Type::Struct(s)) = pointee.map(|t| skip_mods(&self.btf, t))
            && self.btf.resolve_name(&s).is_ok_and(|n| n == name)
        {
            return Ok(());
        }
        Err(format!(
            "the kernel's BTF prototype {proto} passes {} first, not struct {name} *",
            self.c_type(arg, 0)
        ))
    }

    /// Parameter `index` of the tracepoint prototype `proto` (0 is the
    /// context pointer).
    fn tp_arg(&self, proto: &str, index: usize) -> Option<Type> {
        let t = self
            .btf
            .resolve_types_by_name(proto)
            .ok()?
            .into_iter()
            .next()?;
        let Type::Ptr(p) = skip_mods(&self.btf, t) else {
            return None;
        };
        let Type::FuncProto(proto) = self.btf.resolve_chained_type(&p).ok()? else {
            return None;
        };
        let param = proto.parameters.get(index)?;
        self.btf.resolve_chained_type(param).ok()
    }

    /// A type as C spells it, as far as a message needs: `int`, `pid_t`,
    /// `struct task_struct *`.
    fn c_type(&self, t: Type, depth: usize) -> String {
        let named = |kind: &str, b: Option<&dyn btf_rs::BtfType>| {
            let name = b
                .and_then(|b| self.btf.resolve_name(b).ok())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "(anonymous)".into());
            if kind.is_empty() {
                name
            } else {
                format!("{kind} {name}")
            }
        };
        let inner = |t: &Type| {
            t.as_btf_type()
                .and_then(|b| self.btf.resolve_chained_type(b).ok())
        };
        match &t {
            Type::Void => "void".into(),
            Type::Int(_) | Type::Float(_) | Type::Typedef(_) => named("", t.as_btf_type()),
            Type::Struct(_) => named("struct", t.as_btf_type()),
            Type::Union(_) => named("union", t.as_btf_type()),
            Type::Enum(_) | Type::Enum64(_) => named("enum", t.as_btf_type()),
            Type::Ptr(_) | Type::Const(_) | Type::Volatile(_) | Type::Restrict(_) if depth < 8 => {
                let base = match inner(&t) {
                    Some(n) => self.c_type(n, depth + 1),
                    None => "void".into(),
                };
                match &t {
                    Type::Ptr(_) => format!("{base} *"),
                    Type::Const(_) => format!("const {base}"),
                    Type::Volatile(_) => format!("volatile {base}"),
                    _ => base,
                }
            }
            other => format!("a BTF {}", other.name()),
        }
    }

    /// Whether the kernel has a function of this name in BTF (fentry needs it).
    pub fn has_func(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(name)
            .map(|ts| ts.iter().any(|t| matches!(t, Type::Func(_))))
            .unwrap_or(false)
    }

    /// Fills every struct offset the programs use.
    pub fn fill(&self, c: &mut Config) -> Result<(), KernelError> {
        let req = |v: i64, what: &str| {
            if v < 0 {
                Err(KernelError::Missing(what.to_string()))
            } else {
                Ok(v)
            }
        };
        c.task_pid = req(self.offset("task_struct", &["pid"]), "task_struct.pid")?;
        c.task_tgid = req(self.offset("task_struct", &["tgid"]), "task_struct.tgid")?;
        c.task_comm = req(self.offset("task_struct", &["comm"]), "task_struct.comm")?;
        c.task_mm = req(self.offset("task_struct", &["mm"]), "task_struct.mm")?;
        c.task_signal = req(
            self.offset("task_struct", &["signal"]),
            "task_struct.signal",
        )?;
        c.task_group_leader = self.offset("task_struct", &["group_leader"]);
        c.task_start_time = self.offset("task_struct", &["start_time"]);
        c.task_exit_code = self.offset("task_struct", &["exit_code"]);
        c.task_cgroups = self.offset("task_struct", &["cgroups"]);
        c.task_real_cred = self.offset("task_struct", &["real_cred"]);
        c.cred_uid = self.offset("cred", &["uid"]);
        c.task_flags = self.offset("task_struct", &["flags"]);
        c.task_stack = self.offset("task_struct", &["stack"]);
        c.folio_flags = self.offset("folio", &["flags"]);
        c.folio_flags_1 = self.offset("folio", &["_flags_1"]);
        c.pg_head = self.enum_value("pageflags", "PG_head").unwrap_or(-1);
        c.signal_oom_score_adj = self.offset("signal_struct", &["oom_score_adj"]);
        c.signal_live = req(
            self.offset("signal_struct", &["live"]),
            "signal_struct.live",
        )?;
        c.signal_group_exit_code = self.offset("signal_struct", &["group_exit_code"]);
        c.mm_total_vm = self.offset("mm_struct", &["total_vm"]);
        c.mm_pgtables_bytes = self.offset("mm_struct", &["pgtables_bytes"]);
        self.fill_rss_stat(c)?;
        c.css_set_subsys = self.offset("css_set", &["subsys"]);
        c.memory_cgrp_id = self
            .enum_value("cgroup_subsys_id", "memory_cgrp_id")
            .unwrap_or(-1);
        c.css_cgroup = self.offset("cgroup_subsys_state", &["cgroup"]);
        c.cgroup_kn = self.offset("cgroup", &["kn"]);
        c.kn_id = self.offset("kernfs_node", &["id"]);
        c.memcg_css = self.offset("mem_cgroup", &["css"]);
        c.oc_chosen = self.offset("oom_control", &["chosen"]);
        c.oc_chosen_points = self.offset("oom_control", &["chosen_points"]);
        c.oc_totalpages = self.offset("oom_control", &["totalpages"]);
        c.oc_constraint = self.offset("oom_control", &["constraint"]);
        c.oc_memcg = self.offset("oom_control", &["memcg"]);
        c.bprm_filename = self.offset("linux_binprm", &["filename"]);
        c.siginfo_code = self.offset("kernel_siginfo", &["si_code"]);
        if c.siginfo_code < 0 {
            // The member sits in an anonymous struct (`__SIGINFO`); the UAPI
            // layout puts it at 8 on every architecture trainbpf runs on.
            c.siginfo_code = 8;
        }
        // A terminal's session and foreground group: optional, a signal is
        // still recorded without them.
        c.signal_tty = self.offset("signal_struct", &["tty"]);
        c.tty_name = self.offset("tty_struct", &["name"]);
        c.tty_pgrp = self.offset("tty_struct", &["ctrl", "pgrp"]);
        c.tty_session = self.offset("tty_struct", &["ctrl", "session"]);
        if c.tty_pgrp < 0 || c.tty_session < 0 {
            c.tty_pgrp = self.offset("tty_struct", &["pgrp"]);
            c.tty_session = self.offset("tty_struct", &["session"]);
        }
        let numbers = self.offset("pid", &["numbers"]);
        let nr = self.offset("upid", &["nr"]);
        c.pid_nr = if numbers < 0 || nr < 0 {
            -1
        } else {
            numbers + nr
        };
        // A descriptor's file, name and inode: optional, only the late
        // driver library probe reads them.
        c.task_files = self.offset("task_struct", &["files"]);
        c.files_fdt = self.offset("files_struct", &["fdt"]);
        c.fdt_max_fds = self.offset("fdtable", &["max_fds"]);
        c.fdt_fd = self.offset("fdtable", &["fd"]);
        c.file_dentry = self.offset("file", &["f_path", "dentry"]);
        c.dentry_name = self.offset("dentry", &["d_name", "name"]);
        c.file_inode = self.offset("file", &["f_inode"]);
        c.inode_ino = self.offset("inode", &["i_ino"]);
        c.inode_sb = self.offset("inode", &["i_sb"]);
        c.sb_dev = self.offset("super_block", &["s_dev"]);
        // Without these the late probe holds no one: a hold needs both
        // (the descriptor's access mode, the start time that names the
        // process when it is continued).
        c.file_f_mode = self.offset("file", &["f_mode"]);
        // A faulting mapping's file, for the fault tracepoints' late probe.
        c.mapping_host = self.offset("address_space", &["host"]);
        c.inode_dentry = self.offset("inode", &["i_dentry"]);
        c.dentry_alias = self.offset("dentry", &["d_u", "d_alias"]);
        c.task_start_boottime = match self.offset("task_struct", &["start_boottime"]) {
            -1 => self.offset("task_struct", &["real_start_time"]),
            o => o,
        };
        // Optional: without them no interpreter is described at its exec.
        c.mm_exe_file = self.offset("mm_struct", &["exe_file"]);
        c.mm_start_code = self.offset("mm_struct", &["start_code"]);
        Ok(())
    }

    /// `mm->rss_stat`: an array of `percpu_counter` (6.2+: stride is the
    /// struct's size, the value is `.count`) or a struct holding
    /// `atomic_long_t count[4]` (before: stride 8, value at 0).
    fn fill_rss_stat(&self, c: &mut Config) -> Result<(), KernelError> {
        let missing = || KernelError::Missing("mm_struct.rss_stat".into());
        let (off, ty) = self
            .member("mm_struct", &["rss_stat"])
            .ok_or_else(missing)?;
        match ty {
            Type::Array(a) => {
                let elem = skip_mods(
                    &self.btf,
                    self.btf.resolve_chained_type(&a).map_err(|_| missing())?,
                );
                let Type::Struct(es) = &elem else {
                    return Err(missing());
                };
                let count = self
                    .find_member(es, "count", 0)
                    .or_else(|| self.find_member(es, "counter", 0))
                    .ok_or_else(missing)?;
                c.mm_rss_stat = off;
                c.rss_elem_size = es.size() as i64;
                c.rss_count_off = (count.0 / 8) as i64;
            }
            Type::Struct(s) => {
                let (inner, arr) = self.find_member(&s, "count", 0).ok_or_else(missing)?;
                let Type::Array(a) = skip_mods(&self.btf, arr) else {
                    return Err(missing());
                };
                let elem = self.btf.resolve_chained_type(&a).map_err(|_| missing())?;
                c.mm_rss_stat = off + (inner / 8) as i64;
                c.rss_elem_size = self.size_of(&elem).ok_or_else(missing)? as i64;
                c.rss_count_off = 0;
            }
            _ => return Err(missing()),
        }
        Ok(())
    }
}

/// One field of a tracefs `format` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpField {
    pub name: String,
    pub offset: i64,
    pub size: i64,
}

/// Parses a tracefs `format` file's field lines, e.g.
/// `field:unsigned long total_vm;<TAB>offset:16;<TAB>size:8;<TAB>signed:0;`.
pub fn parse_tp_format(text: &str) -> Vec<TpField> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut parts = rest.split(';').map(str::trim);
        let decl = parts.next().unwrap_or("");
        // The name is the last word of the declaration, before any `[...]`.
        let name = decl
            .rsplit(' ')
            .next()
            .unwrap_or("")
            .split('[')
            .next()
            .unwrap_or("")
            .to_string();
        let mut offset = -1;
        let mut size = -1;
        for p in parts {
            if let Some(v) = p.strip_prefix("offset:") {
                offset = v.parse().unwrap_or(-1);
            } else if let Some(v) = p.strip_prefix("size:") {
                size = v.parse().unwrap_or(-1);
            }
        }
        if !name.is_empty() && offset >= 0 {
            out.push(TpField { name, offset, size });
        }
    }
    out
}

pub fn tp_format(category: &str, name: &str) -> Option<Vec<TpField>> {
    let text = fs::read_to_string(format!("{TRACEFS}/events/{category}/{name}/format")).ok()?;
    Some(parse_tp_format(&text))
}

pub fn field(fields: &[TpField], name: &str) -> i64 {
    fields
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.offset)
        .unwrap_or(-1)
}

/// tracefs must be mounted for classic tracepoints (their ids live there).
/// Mounted at boot on most distributions; not on minimal VMs.
pub fn ensure_tracefs() -> Result<(), String> {
    if Path::new(TRACEFS).join("events").exists() {
        return Ok(());
    }
    nix::mount::mount(
        Some("tracefs"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| format!("mounting tracefs at {TRACEFS}: {e}"))
}

pub fn kprobes_available() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK_VICTIM: &str = "name: mark_victim\nID: 609\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n\
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;\n\
\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;\n\nprint fmt: \"pid=%d\"";

    #[test]
    fn parses_tracefs_format() {
        let f = parse_tp_format(MARK_VICTIM);
        assert_eq!(field(&f, "pid"), 8);
        assert_eq!(field(&f, "comm"), 12);
        assert_eq!(field(&f, "total_vm"), 16);
        assert_eq!(field(&f, "oom_score_adj"), 64);
        assert_eq!(
            field(&f, "anon_rss"),
            -1,
            "absent on 5.10: must read as missing"
        );
    }

    /// Runs against this machine's own kernel when it has BTF (every kernel
    /// trainbpf supports does).
    #[test]
    fn resolves_offsets_from_running_kernel() {
        let Ok(k) = KernelBtf::open() else {
            panic!("{VMLINUX_BTF} unreadable: trainbpf needs kernel BTF");
        };
        let mut c = Config::UNSET;
        k.fill(&mut c).expect("all required fields");
        assert!(c.task_tgid > c.task_pid - 8 && c.task_tgid > 0);
        assert!(
            c.rss_elem_size == 8 || c.rss_elem_size >= 32,
            "{}",
            c.rss_elem_size
        );
        assert!(c.memory_cgrp_id >= 0);
        assert!(c.oc_chosen >= 0, "oom_control.chosen");
        // A Ctrl-C is named by its terminal: every field of that resolves.
        for (v, what) in [
            (c.signal_tty, "signal_struct.tty"),
            (c.tty_name, "tty_struct.name"),
            (c.tty_pgrp, "tty_struct pgrp"),
            (c.tty_session, "tty_struct session"),
            (c.pid_nr, "pid.numbers[0].nr"),
        ] {
            assert!(v >= 0, "{what}");
        }
        assert_eq!(
            k.tp_first_arg_struct("sched_process_fork", "task_struct"),
            Ok(())
        );
    }

    /// A prototype that does not pass the struct says what it passes, as
    /// this kernel's BTF spells it: the reason `record` gives for falling
    /// back from tp_btf/mark_victim.
    #[test]
    fn a_prototype_that_does_not_fit_says_what_btf_shows() {
        let k = KernelBtf::open().expect("kernel BTF");
        assert_eq!(k.tp_first_arg_struct("mark_victim", "task_struct"), Ok(()));
        assert_eq!(
            k.tp_first_arg_struct("cpu_idle", "task_struct"),
            Err("the kernel's BTF prototype btf_trace_cpu_idle passes unsigned int first, not struct task_struct *".into())
        );
        assert_eq!(
            k.tp_first_arg_struct("sys_enter", "task_struct"),
            Err("the kernel's BTF prototype btf_trace_sys_enter passes struct pt_regs * first, not struct task_struct *".into())
        );
        assert_eq!(
            k.tp_first_arg_struct("no_such_tracepoint", "task_struct"),
            Err("the kernel's BTF has no btf_trace_no_such_tracepoint prototype".into())
        );
    }
}
