//! A kill told as it happens: its one line (`live::kill_line`) recorded,
//! printed, handed to `--events-jsonl`, and written to torchelastic's
//! error file (`record::torchelastic`); and a job process's death by
//! another signal, in torchelastic's error file only.

use trainbpf_common as common;
use trainbpf_report::{
    decode::{Event, ExitStatus, KillVerdict, ProcKey, Timed, UserBody, decode, encode_user},
    model::verdict,
    term::escape,
};

use super::Collector;

/// Kills told as read, waiting for their place in time order: a batch
/// holds a few.
const MAX_URGENT: usize = 64;
use crate::util::clock::{mono_ns, realtime_ns};

/// `si_code` of a signal the kernel sent itself (`SI_KERNEL`): an OOM
/// kill's SIGKILL, told by its own record instead.
const SI_KERNEL: i32 = 0x80;

impl Collector {
    /// A precious record as it is read, before its batch is sorted: a
    /// kill's line is made and its error file written now (with what the
    /// records before this batch told), and the line kept for the kill's
    /// place in time order (`told_urgently`); a SIGKILL's or a death's
    /// error file likewise. The kernel's log lines come first, for the
    /// kill's constraint and limit.
    pub(super) fn urgent(&mut self, bytes: &[u8]) {
        if bytes.len() < 2 {
            return;
        }
        let kind = u16::from_le_bytes([bytes[0], bytes[1]]);
        if !matches!(
            kind,
            common::KIND_OOM_KILL
                | common::KIND_OOM_VICTIM
                | common::KIND_PRINTK
                | common::KIND_SIGNAL
                | common::KIND_EXIT
        ) {
            return;
        }
        let Ok(t) = decode(kind, bytes, self.page_kb) else {
            return;
        };
        match &t.event {
            Event::Oom(_) | Event::Printk { .. } => {
                if let Some((proc, line)) = self.lines.observe(&t) {
                    self.write_error_file(t.ts_ns, proc.tgid, &line);
                    if self.urgent_lines.len() < MAX_URGENT {
                        self.urgent_lines.push((proc, line));
                    }
                }
            }
            Event::Signal(_) => {
                // Its sender first, for a death read in the same batch.
                self.lines.observe(&t);
                self.before_record(&t);
            }
            Event::Exit { .. } => self.before_record(&t),
            _ => {}
        }
    }

    /// The line made for this kill as its record was read, if it was.
    pub(super) fn told_urgently(&mut self, t: &Timed) -> Option<(ProcKey, String)> {
        let Event::Oom(r) = &t.event else {
            return None;
        };
        let i = self.urgent_lines.iter().position(|(p, _)| *p == r.victim)?;
        Some(self.urgent_lines.swap_remove(i))
    }

    /// Before a record reaches the rest: a death by a signal of a process
    /// the agent waits on, for its error file, while its name is known.
    pub(super) fn before_record(&mut self, t: &Timed) {
        let Some(ef) = &self.error_files else {
            return;
        };
        let (pid, line) = match &t.event {
            // A SIGKILL ends the process for certain: its file now, before
            // the victim is reaped, not at its exit.
            Event::Signal(s)
                if s.sig == 9
                    && s.code != SI_KERNEL
                    && self.job.contains(&s.target.tgid)
                    && ef.armed(s.target.tgid, true) =>
            {
                let victim = self.lines.who(s.target.tgid, &s.comm);
                let from = format!("{} (pid {})", s.sender.comm, s.sender.tgid);
                let after = self.lines.after_first_kill(t.ts_ns, s.target.start_ns);
                (
                    s.target.tgid,
                    verdict::died_line(&victim, 9, Some(&from), after),
                )
            }
            Event::Exit {
                proc,
                comm,
                exit_code,
                ..
            } if ef.armed(proc.tgid, true) => {
                let ExitStatus::Signal(sig) = trainbpf_report::model::wait_status(*exit_code)
                else {
                    return;
                };
                let victim = self.lines.who(proc.tgid, comm);
                let from = self.lines.sender(proc.tgid, sig);
                let after = self.lines.after_first_kill(t.ts_ns, proc.start_ns);
                (proc.tgid, verdict::died_line(&victim, sig, from, after))
            }
            _ => return,
        };
        self.write_error_file(t.ts_ns, pid, &line);
    }

    /// A kill's line: recorded at the kill's time (the report repeats
    /// it), printed, written to the victim's error file.
    pub(super) fn tell_kill(&mut self, ts: u64, proc: ProcKey, line: String) {
        self.write_error_file(ts, proc.tgid, &line);
        self.status.clear();
        eprintln!("trainbpf: {}", escape(&line));
        let body = UserBody::Verdict(KillVerdict { proc, line });
        if let Some(o) = &mut self.live {
            o.live.on_user(&body);
        }
        let (kind, bytes) = encode_user(ts, body);
        self.writer.record(kind, &bytes);
    }

    fn write_error_file(&mut self, ts: u64, pid: u32, line: &str) {
        let Some(ef) = &mut self.error_files else {
            return;
        };
        if !ef.armed(pid, false) {
            return;
        }
        // The kill's own time, on the wall clock, as torchelastic keeps it.
        let unix_s = realtime_ns().saturating_sub(mono_ns().saturating_sub(ts)) / 1_000_000_000;
        // The agent prints the file to a terminal.
        ef.killed(pid, &escape(line), unix_s);
        // Written here already, where it could be: its agent is released
        // after this batch of records.
        self.poll_error_files();
    }

    /// Records what became of the error files written since the last time.
    pub(super) fn poll_error_files(&mut self) {
        let Some(ef) = &mut self.error_files else {
            return;
        };
        for o in ef.poll() {
            let path = o.path.display();
            let note = match o.result {
                Ok(crate::util::safe_file::NewFile::Written) => {
                    format!("pid {}: wrote torchelastic's error file {path}", o.pid)
                }
                Ok(crate::util::safe_file::NewFile::Exists) => format!(
                    "pid {}: torchelastic's error file {path} was there already: left alone",
                    o.pid
                ),
                Err(e) => format!("pid {}: torchelastic's error file not written: {e}", o.pid),
            };
            // Stamped when written: its distance from the kill is how
            // far ahead of torchelastic's agent the file was.
            let (kind, bytes) = encode_user(o.done_ns, UserBody::Note(note));
            self.writer.record(kind, &bytes);
            if let Some(agent) = o.agent {
                self.agents_done.push(agent);
            }
        }
    }
}
