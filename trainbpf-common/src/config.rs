//! What userspace resolves for the programs before load (`main.rs`'s
//! `CONFIG`).

/// Kernel-structure offsets and tunables, resolved by userspace from the
/// running kernel's BTF and tracefs before load, and frozen into the
/// program's read-only data. Rust emits no CO-RE relocations, so this is how
/// one object runs on 5.10 and on 6.18. `-1` marks a field this kernel lacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub task_pid: i64,
    pub task_tgid: i64,
    pub task_comm: i64,
    pub task_mm: i64,
    pub task_signal: i64,
    pub task_cgroups: i64,
    pub task_exit_code: i64,
    pub task_group_leader: i64,
    pub task_start_time: i64,
    pub task_real_cred: i64,
    pub cred_uid: i64,
    pub task_flags: i64,
    pub mm_rss_stat: i64,
    /// Stride of `mm->rss_stat[]` (percpu_counter on 6.2+, atomic_long_t before).
    pub rss_elem_size: i64,
    /// Offset of the 64-bit count inside one element.
    pub rss_count_off: i64,
    pub mm_total_vm: i64,
    pub mm_pgtables_bytes: i64,
    pub signal_oom_score_adj: i64,
    pub signal_live: i64,
    pub signal_group_exit_code: i64,
    pub css_set_subsys: i64,
    pub memory_cgrp_id: i64,
    pub css_cgroup: i64,
    pub cgroup_kn: i64,
    pub kn_id: i64,
    pub memcg_css: i64,
    pub oc_chosen: i64,
    pub oc_chosen_points: i64,
    pub oc_totalpages: i64,
    pub oc_constraint: i64,
    pub oc_memcg: i64,
    pub bprm_filename: i64,
    /// `kernel_siginfo.si_code` (UAPI layout: 8 on every kernel).
    pub siginfo_code: i64,
    /// `signal_struct.tty`, `tty_struct.name`, `tty_struct.ctrl.pgrp` and
    /// `.session` (plain `pgrp`/`session` before 5.13), and the offset of
    /// `numbers[0].nr` in `struct pid`: a terminal's session and
    /// foreground group.
    pub signal_tty: i64,
    pub tty_name: i64,
    pub tty_pgrp: i64,
    pub tty_session: i64,
    pub pid_nr: i64,
    /// Classic `oom:mark_victim` field offsets (tracefs format file).
    pub tp_mv_pid: i64,
    pub tp_mv_comm: i64,
    pub tp_mv_total_vm: i64,
    pub tp_mv_anon_rss: i64,
    pub tp_mv_file_rss: i64,
    pub tp_mv_shmem_rss: i64,
    pub tp_mv_uid: i64,
    pub tp_mv_pgtables: i64,
    pub tp_mv_oom_score_adj: i64,
    /// `printk:console` `__data_loc char[] msg`.
    pub tp_console_msg: i64,
    /// Report a process when anon+file+shmem moved by this many pages...
    pub rss_threshold_pages: i64,
    /// ...or by `total >> rss_relative_shift` pages, whichever is larger
    /// (0 disables the relative part).
    pub rss_relative_shift: i64,
    /// A smaller change is still reported once this much time has passed.
    pub heartbeat_ns: i64,
    /// Records of one process are at least this far apart unless it moved
    /// by eight thresholds: bounds what a churning process costs.
    pub min_interval_ns: i64,
    /// `record --all`: every process counts as the job's.
    pub all_processes: i64,
    /// The recorder's own pid: signals sent to it are recorded like the
    /// job's (it forwards them to the job; -1: none).
    pub recorder_tgid: i64,
    /// Entries of the per-process map, and how many of them only the job's
    /// processes may take.
    pub procs_max: i64,
    pub procs_job_reserve: i64,
    /// `task_struct.stack` and the kernel stack's size (THREAD_SIZE): a
    /// page event whose frame is not on the current task's stack runs in
    /// an interrupt.
    pub task_stack: i64,
    pub thread_size: i64,
    /// `folio.flags`, `folio._flags_1` (the order of a large folio in its
    /// low byte) and the bit number of `PG_head`.
    pub folio_flags: i64,
    pub folio_flags_1: i64,
    pub pg_head: i64,
    /// The page size, bytes.
    pub page_size: i64,
    /// The largest folio a process maps, as an order: a PMD's worth of
    /// pages (`PAGE_SHIFT - 3`, 9 with 4 KiB pages). Larger blocks in the
    /// page probes are the allocator's own.
    pub max_folio_order: i64,
    /// `record --stacks`: a process's user stack is taken each time its
    /// added memory climbs this many pages above its last high (0: off).
    pub stack_every_pages: i64,
    /// Where the user stack pointer a thread entered the kernel with lies,
    /// from `task_struct.stack`: `THREAD_SIZE - sizeof(pt_regs) +
    /// offsetof(pt_regs, sp)` (x86-64, whose user registers sit at the top
    /// of the kernel stack). A growth stack reads the word there: the
    /// return address of a leaf that set up no frame (-1: not read).
    pub user_sp: i64,
    /// As `user_sp`, for the user instruction and frame pointers: a
    /// growth stack's first sample copies them for the unwinder (-1: not
    /// read, and no copy is made).
    pub user_ip: i64,
    pub user_bp: i64,
    /// `record --ebpf-log`: the programs log what only they can see (a
    /// full map, a refused reserve, a read that failed) through aya-log.
    /// 0, the default, leaves every log call dead code that the verifier
    /// drops, since this struct is read-only.
    pub ebpf_log: i64,
    /// From a descriptor to its file's name and inode (the late driver
    /// library probe): `task_struct.files`, `files_struct.fdt`,
    /// `fdtable.max_fds`, `fdtable.fd`, `file.f_path.dentry`,
    /// `dentry.d_name.name`, `file.f_inode`, `inode.i_ino`, `inode.i_sb`,
    /// `super_block.s_dev`.
    pub task_files: i64,
    pub files_fdt: i64,
    pub fdt_max_fds: i64,
    pub fdt_fd: i64,
    pub file_dentry: i64,
    pub dentry_name: i64,
    pub file_inode: i64,
    pub inode_ino: i64,
    pub inode_sb: i64,
    pub sb_dev: i64,
    /// `file.f_mode`: a descriptor not open for reading (`O_PATH`,
    /// write-only) is never a reason to probe its file.
    pub file_f_mode: i64,
    /// From a faulting mapping to its file's inode and a name of it (the
    /// late driver library probe on the file fault tracepoints):
    /// `address_space.host`, `inode.i_dentry` (the first of the inode's
    /// dentries), and `dentry.d_u.d_alias` (the dentry's link in that list).
    pub mapping_host: i64,
    pub inode_dentry: i64,
    pub dentry_alias: i64,
    /// `task_struct.start_boottime` (`real_start_time` before 5.5): what
    /// `/proc/PID/stat` shows as a process's start, so that a held
    /// process is continued only if its pid still names it.
    pub task_start_boottime: i64,
    /// `mm_struct.exe_file`, `mm_struct.start_code`: the file a process
    /// exec'd and where its code was loaded, so that an interpreter
    /// located before in that file is described at the exec itself
    /// (`python::at_exec`).
    pub mm_exe_file: i64,
    pub mm_start_code: i64,
}

impl Config {
    /// Every offset unknown, thresholds zero: the loader fills it in.
    pub const UNSET: Config = Config {
        task_pid: -1,
        task_tgid: -1,
        task_comm: -1,
        task_mm: -1,
        task_signal: -1,
        task_cgroups: -1,
        task_exit_code: -1,
        task_group_leader: -1,
        task_start_time: -1,
        task_real_cred: -1,
        cred_uid: -1,
        task_flags: -1,
        mm_rss_stat: -1,
        rss_elem_size: -1,
        rss_count_off: -1,
        mm_total_vm: -1,
        mm_pgtables_bytes: -1,
        signal_oom_score_adj: -1,
        signal_live: -1,
        signal_group_exit_code: -1,
        css_set_subsys: -1,
        memory_cgrp_id: -1,
        css_cgroup: -1,
        cgroup_kn: -1,
        kn_id: -1,
        memcg_css: -1,
        oc_chosen: -1,
        oc_chosen_points: -1,
        oc_totalpages: -1,
        oc_constraint: -1,
        oc_memcg: -1,
        bprm_filename: -1,
        siginfo_code: -1,
        signal_tty: -1,
        tty_name: -1,
        tty_pgrp: -1,
        tty_session: -1,
        pid_nr: -1,
        tp_mv_pid: -1,
        tp_mv_comm: -1,
        tp_mv_total_vm: -1,
        tp_mv_anon_rss: -1,
        tp_mv_file_rss: -1,
        tp_mv_shmem_rss: -1,
        tp_mv_uid: -1,
        tp_mv_pgtables: -1,
        tp_mv_oom_score_adj: -1,
        tp_console_msg: -1,
        rss_threshold_pages: 1024,
        rss_relative_shift: 6,
        heartbeat_ns: 5_000_000_000,
        min_interval_ns: 200_000_000,
        all_processes: 0,
        recorder_tgid: -1,
        procs_max: 32768,
        procs_job_reserve: 8192,
        task_stack: -1,
        thread_size: -1,
        folio_flags: -1,
        folio_flags_1: -1,
        pg_head: -1,
        page_size: 4096,
        max_folio_order: 9,
        stack_every_pages: 0,
        user_sp: -1,
        user_ip: -1,
        user_bp: -1,
        ebpf_log: 0,
        task_files: -1,
        files_fdt: -1,
        fdt_max_fds: -1,
        fdt_fd: -1,
        file_dentry: -1,
        dentry_name: -1,
        file_inode: -1,
        inode_ino: -1,
        inode_sb: -1,
        sb_dev: -1,
        file_f_mode: -1,
        mapping_host: -1,
        inode_dentry: -1,
        dentry_alias: -1,
        task_start_boottime: -1,
        mm_exe_file: -1,
        mm_start_code: -1,
    };
}
