//! What the collector itself takes from each record as it passes: which
//! processes are the job's, who they are (asked for while they exist),
//! how the main process ended, and what to name or look at now (a cgroup
//! a process allocates in, a signal's sender, shared memory at a fatal
//! signal or a kill).

use trainbpf_report::decode::{self, Event, MemSample, Timed};

use super::{Collector, ENDING_SIGNALS, MAX_JOB_PROCS, MAX_NAMED_CGROUPS, names::Ident};
use crate::record::observe::Observe;

impl Observe for Collector {
    fn observe(&mut self, t: &Timed) {
        match &t.event {
            Event::Fork { child: proc, .. } | Event::Exec { proc, .. } => {
                if let (Event::Fork { parent, .. }, Some(ef)) = (&t.event, &mut self.error_files) {
                    ef.on_fork(parent.tgid, proc.tgid);
                }
                if self.job.len() < MAX_JOB_PROCS {
                    self.job.insert(proc.tgid);
                }
                // At an exec, its command line and who it is, for
                // grouping: asked for now, while the process exists (a
                // worker may live a second), and recorded when read. A fork
                // runs its parent's program: the model gives it the
                // parent's, and nothing is read (a node forking a thousand
                // times a second would pay a /proc read and two thread
                // hand-offs for each).
                let (how, info) = if matches!(t.event, Event::Exec { .. }) {
                    (Ident::Exec, true)
                } else {
                    (Ident::Fork, false)
                };
                self.identify(how, *proc, t.ts_ns, info);
            }
            Event::Exit {
                proc, exit_code, ..
            } => {
                self.job.remove(&proc.tgid);
                self.identified.remove(&proc.tgid);
                self.shm_pick.gone(proc.tgid);
                if let Some(ef) = &mut self.error_files {
                    ef.on_exit(proc.tgid);
                }
                if proc.tgid == self.root {
                    self.root_exit = Some(trainbpf_report::model::wait_status(*exit_code));
                }
            }
            // A process running before the recorder (`--all`, an attach):
            // who it is, at its first memory record. Every memory cgroup a
            // process allocates in is named once (a bounded few): a memcg
            // OOM's growers are those charged to it.
            Event::Mem(MemSample {
                proc,
                memcg_id,
                rss,
                ..
            }) => {
                self.identify(Ident::Mem, *proc, t.ts_ns, false);
                if self.job.contains(&proc.tgid) {
                    self.shm_pick.saw(proc.tgid, rss.shmem_kb);
                }
                if self.known_cgroups.len() < MAX_NAMED_CGROUPS {
                    self.name_cgroup(*memcg_id);
                }
            }
            Event::Signal(s) => {
                self.name_exe(s.sender.tgid);
                // A fatal signal to the job (a bus error from a full
                // /dev/shm among them): look at shared memory while it is
                // as it was.
                if self.job.contains(&s.target.tgid) && ENDING_SIGNALS.contains(&s.sig) {
                    self.shm.trigger(decode::ShmTrigger::Signal);
                }
            }
            Event::Oom(r) => {
                self.shm.trigger(decode::ShmTrigger::Kill);
                self.name_cgroup(r.memcg_id);
                if let Some(oc) = &r.oc {
                    self.name_cgroup(oc.memcg_id);
                }
            }
            _ => {}
        }
    }
}
