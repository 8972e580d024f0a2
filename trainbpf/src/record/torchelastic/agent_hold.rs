//! The kernel's half of holding torchelastic's agent until a killed
//! worker's error file is in (trainbpf-ebpf/src/agent_hold.rs): the
//! program on `sched:sched_process_wait`, loaded before the job starts and
//! attached at the first worker, and the two maps the collector keeps.
//! The hold itself is `HELD`'s, continued by the GPU module's hold code
//! and bounded by its watchdog (`gpu::release_agent`).

use crate::util::phases;
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
    programs::{BtfTracePoint, TracePoint},
};

use crate::loader::{AGENT_WAIT_BTF, AGENT_WAIT_CLASSIC};

/// See the module docs.
pub struct AgentHold {
    /// A worker → its parent, which waits on it (`ERRFILE_WAITED`).
    waited: BpfHashMap<MapData, u32, u32>,
    /// A parent marked at its worker's kill (`AGENT_WAIT`).
    agents: BpfHashMap<MapData, u32, u32>,
    /// Whether any is marked (`AGENT_ANY`).
    any: Array<MapData, u32>,
    /// The attach point of the program loaded, for the recording.
    pub point: &'static str,
}

/// What the recording says of it, after where it is attached.
pub const DESCRIBED: &str = "torchelastic's agent, waiting on a worker the OOM killer chose, is held (SIGSTOP) until the worker's error file is written";

impl AgentHold {
    /// Takes the maps of the program the loader loaded at `point`
    /// (`Loaded::agent_wait`); `Err` says why an agent is not held.
    pub fn take(ebpf: &mut Ebpf, point: &'static str) -> Result<AgentHold, String> {
        let waited = ebpf
            .take_map("ERRFILE_WAITED")
            .and_then(|m| BpfHashMap::try_from(m).ok());
        let agents = ebpf
            .take_map("AGENT_WAIT")
            .and_then(|m| BpfHashMap::try_from(m).ok());
        let any = ebpf
            .take_map("AGENT_ANY")
            .and_then(|m| Array::try_from(m).ok());
        let (Some(waited), Some(agents), Some(any)) = (waited, agents, any) else {
            return Err("its maps are missing from the object".into());
        };
        Ok(AgentHold {
            waited,
            agents,
            any,
            point,
        })
    }

    /// Attaches the program loaded: from now on every wait on the machine
    /// runs it, which a recording without torchelastic never pays for.
    pub fn attach(&self, ebpf: &mut Ebpf) -> Result<(), String> {
        let at = |e: aya::programs::ProgramError| format!("{}: {e}", self.point);
        if self.point == AGENT_WAIT_BTF.1 {
            let p: &mut BtfTracePoint = program(ebpf, AGENT_WAIT_BTF.0)?;
            phases::attach(|| p.attach()).map_err(at)?;
        } else {
            let p: &mut TracePoint = program(ebpf, AGENT_WAIT_CLASSIC.0)?;
            phases::attach(|| p.attach("sched", "sched_process_wait")).map_err(at)?;
        }
        Ok(())
    }

    /// `worker`'s parent waits on it for its error file: held at its wait
    /// if the OOM killer chooses `worker` (once attached).
    pub fn waited(&mut self, worker: u32, parent: u32) {
        let _ = self.waited.insert(worker, parent, 0);
    }

    /// `worker` no longer needs its parent held (it exec'd without the
    /// variable, exited, or its file is being written).
    pub fn unwaited(&mut self, worker: u32) {
        let _ = self.waited.remove(&worker);
    }

    /// The file of `worker`, which `parent` waited for, is written (or
    /// will not be): the parent is held at no later wait, unless another
    /// of its workers was killed since. Whoever holds it now is continued
    /// next.
    pub fn clear(&mut self, parent: u32, worker: u32) {
        if self.agents.get(&parent, 0).is_ok_and(|w| w == worker) {
            let _ = self.agents.remove(&parent);
        }
        // Cleared, then the map looked at: a mark made meanwhile is seen
        // here, or sets the flag after this.
        let _ = self.any.set(0, 0, 0);
        if self.agents.keys().next().is_some() {
            let _ = self.any.set(0, 1, 0);
        }
    }
}

impl super::ErrorFiles {
    /// Agents may be held, by `hold`.
    pub fn hold_with(&mut self, hold: AgentHold) {
        self.hold = Some(hold);
    }

    /// Whether the hold is to be attached now: a process the agent waits
    /// on is known, and it is not attached yet.
    pub fn wants_hold(&self) -> bool {
        self.hold.is_some() && !self.hold_on && !self.unprepared.is_empty()
    }

    /// Attaches the hold, then makes the files waiting for it ready;
    /// returns what the recording says of it. Where it cannot be attached,
    /// no agent is marked from now on.
    pub fn attach_hold(&mut self, ebpf: &mut Ebpf) -> String {
        let said = match self.hold.as_ref().map(|h| (h.attach(ebpf), h.point)) {
            None => return String::new(),
            Some((Ok(()), point)) => {
                self.hold_on = true;
                format!("{point}: {DESCRIBED}")
            }
            Some((Err(e), _)) => {
                if let Some(mut h) = self.hold.take() {
                    for &pid in self.targets.keys() {
                        h.unwaited(pid);
                    }
                }
                format!("torchelastic's agent is not held at its wait: {e}")
            }
        };
        for pid in std::mem::take(&mut self.unprepared) {
            let target = match self.targets.get(&pid) {
                Some(e) if !e.parents && e.ready.is_none() && !self.fired.contains(&pid) => {
                    e.target.clone()
                }
                _ => continue,
            };
            self.prepare(pid, target);
        }
        said
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, String>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| format!("program {name} missing from the object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())
}
