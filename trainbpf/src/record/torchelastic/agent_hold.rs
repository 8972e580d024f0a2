//! The kernel's half of holding torchelastic's agent until a killed
//! worker's error file is in (trainbpf-ebpf/src/agent_hold.rs): the
//! program on `sched:sched_process_wait`, and the two maps the collector
//! keeps. The hold itself is `HELD`'s, continued by the GPU module's
//! hold code and bounded by its watchdog (`gpu::release_agent`).

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
    programs::TracePoint,
};

/// See the module docs.
pub struct AgentHold {
    /// A worker → its parent, which waits on it (`ERRFILE_WAITED`).
    waited: BpfHashMap<MapData, u32, u32>,
    /// A parent marked at its worker's kill (`AGENT_WAIT`).
    agents: BpfHashMap<MapData, u32, u32>,
}

/// What the start-up line and the recording say of it.
pub const DESCRIBED: &str = "sched:sched_process_wait: torchelastic's agent, waiting on a worker the OOM killer chose, is held (SIGSTOP) until the worker's error file is written";

impl AgentHold {
    /// Loads and attaches the program and takes its maps; `Err` says why
    /// an agent is not held.
    pub fn attach(ebpf: &mut Ebpf) -> Result<AgentHold, String> {
        let waited = ebpf
            .take_map("ERRFILE_WAITED")
            .and_then(|m| BpfHashMap::try_from(m).ok());
        let agents = ebpf
            .take_map("AGENT_WAIT")
            .and_then(|m| BpfHashMap::try_from(m).ok());
        let (Some(waited), Some(agents)) = (waited, agents) else {
            return Err("its maps are missing from the object".into());
        };
        let p: &mut TracePoint = ebpf
            .program_mut("agent_wait")
            .ok_or("program agent_wait missing from the object")?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| e.to_string())?;
        p.load().map_err(|e| format!("agent_wait: {e}"))?;
        p.attach("sched", "sched_process_wait")
            .map_err(|e| format!("sched:sched_process_wait: {e}"))?;
        Ok(AgentHold { waited, agents })
    }

    /// `worker`'s parent waits on it for its error file: held at its wait
    /// if the OOM killer chooses `worker`.
    pub fn waited(&mut self, worker: u32, parent: u32) {
        let _ = self.waited.insert(worker, parent, 0);
    }

    /// `worker` no longer needs its parent held (it exec'd without the
    /// variable, exited, or its file is being written).
    pub fn unwaited(&mut self, worker: u32) {
        let _ = self.waited.remove(&worker);
    }

    /// The file `parent` waited for is written (or will not be): it is
    /// held at no later wait. Whoever holds it now is continued next.
    pub fn clear(&mut self, parent: u32) {
        let _ = self.agents.remove(&parent);
    }
}
