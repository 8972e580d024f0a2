//! The kernel's half of holding torchelastic's agent until a killed
//! worker's error file is in (trainbpf-ebpf/src/agent_hold.rs): the
//! program on `sched:sched_process_wait`, and the two maps the collector
//! keeps. The hold itself is `HELD`'s, continued by the GPU module's
//! hold code and bounded by its watchdog (`gpu::release_agent`).

use aya::{
    Btf, Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData},
    programs::{BtfTracePoint, TracePoint},
};

/// See the module docs.
pub struct AgentHold {
    /// A worker → its parent, which waits on it (`ERRFILE_WAITED`).
    waited: BpfHashMap<MapData, u32, u32>,
    /// A parent marked at its worker's kill (`AGENT_WAIT`).
    agents: BpfHashMap<MapData, u32, u32>,
    /// Whether any is marked (`AGENT_ANY`).
    any: Array<MapData, u32>,
    /// Where the program is attached, for the recording.
    pub attached: &'static str,
}

/// What the recording says of it, after where it is attached.
pub const DESCRIBED: &str = "torchelastic's agent, waiting on a worker the OOM killer chose, is held (SIGSTOP) until the worker's error file is written";

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
        let any = ebpf
            .take_map("AGENT_ANY")
            .and_then(|m| Array::try_from(m).ok());
        let (Some(waited), Some(agents), Some(any)) = (waited, agents, any) else {
            return Err("its maps are missing from the object".into());
        };
        // The BTF tracepoint builds no trace record: every wait on the
        // machine pays less for it.
        let attached = match attach_btf(ebpf) {
            Ok(()) => "tp_btf:sched_process_wait",
            Err(btf) => {
                attach_classic(ebpf).map_err(|e| format!("{btf}; {e}"))?;
                "sched:sched_process_wait"
            }
        };
        Ok(AgentHold {
            waited,
            agents,
            any,
            attached,
        })
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

fn attach_btf(ebpf: &mut Ebpf) -> Result<(), String> {
    let btf = Btf::from_sys_fs().map_err(|e| format!("the kernel's BTF: {e}"))?;
    let p: &mut BtfTracePoint = ebpf
        .program_mut("agent_wait_btf")
        .ok_or("program agent_wait_btf missing from the object")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load("sched_process_wait", &btf)
        .map_err(|e| format!("agent_wait_btf: {e}"))?;
    p.attach()
        .map_err(|e| format!("tp_btf:sched_process_wait: {e}"))?;
    Ok(())
}

fn attach_classic(ebpf: &mut Ebpf) -> Result<(), String> {
    let p: &mut TracePoint = ebpf
        .program_mut("agent_wait")
        .ok_or("program agent_wait missing from the object")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load().map_err(|e| format!("agent_wait: {e}"))?;
    p.attach("sched", "sched_process_wait")
        .map_err(|e| format!("sched:sched_process_wait: {e}"))?;
    Ok(())
}
