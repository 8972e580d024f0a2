//! GPU records: the kernel's kinds 20-29 (`trainbpf_common::KIND_CUDA`…)
//! and the collector's kinds 110-119 (what was attached, NVML samples,
//! counters). Format: docs/recording-format.md.

use serde::{Deserialize, Serialize};
use trainbpf_common as common;

use super::{DecodeError, Event, ProcKey, cstr, json, key, read_pod};

/// Collector records of the GPU side (kinds 110-119 are reserved for it).
pub(crate) const KIND_GPU_ATTACH: u16 = 110;
pub(crate) const KIND_GPU_SOURCE: u16 = 111;
pub(crate) const KIND_GPU_LOST: u16 = 112;
pub(crate) const KIND_NVML: u16 = 113;
pub(crate) const KIND_GPU_LATE: u16 = 114;
/// The highest kind of the GPU's collector range.
pub(crate) const KIND_GPU_USER_MAX: u16 = 119;

/// `CUDA_ERROR_OUT_OF_MEMORY` (cuda.h).
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;

/// The CUDA driver call a [`CudaCall`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CudaOp {
    #[serde(rename = "cuInit")]
    Init,
    #[serde(rename = "cuDevicePrimaryCtxRetain")]
    PrimaryCtxRetain,
    #[serde(rename = "cuCtxCreate")]
    CtxCreate,
    #[serde(rename = "cuMemAlloc")]
    MemAlloc,
    #[serde(rename = "cuMemFree")]
    MemFree,
    #[serde(rename = "cuMemAllocAsync")]
    MemAllocAsync,
    #[serde(rename = "cuMemFreeAsync")]
    MemFreeAsync,
    #[serde(rename = "cuMemAllocFromPoolAsync")]
    MemAllocFromPool,
    #[serde(rename = "cuMemAllocManaged")]
    MemAllocManaged,
    #[serde(rename = "cuMemAllocHost")]
    MemAllocHost,
    #[serde(rename = "cuMemHostAlloc")]
    MemHostAlloc,
    #[serde(rename = "cuMemFreeHost")]
    MemFreeHost,
    #[serde(rename = "cuMemHostRegister")]
    MemHostRegister,
    #[serde(rename = "cuMemHostUnregister")]
    MemHostUnregister,
    #[serde(rename = "cuMemCreate")]
    MemCreate,
    #[serde(rename = "cuMemRelease")]
    MemRelease,
    #[serde(rename = "cuMemMap")]
    MemMap,
    #[serde(rename = "cuMemUnmap")]
    MemUnmap,
}

impl CudaOp {
    fn from_kernel(op: u32) -> Option<CudaOp> {
        Some(match op {
            common::CU_INIT => CudaOp::Init,
            common::CU_PRIMARY_CTX_RETAIN => CudaOp::PrimaryCtxRetain,
            common::CU_CTX_CREATE_V2 | common::CU_CTX_CREATE_V3 | common::CU_CTX_CREATE_V4 => {
                CudaOp::CtxCreate
            }
            common::CU_MEM_ALLOC => CudaOp::MemAlloc,
            common::CU_MEM_FREE => CudaOp::MemFree,
            common::CU_MEM_ALLOC_ASYNC => CudaOp::MemAllocAsync,
            common::CU_MEM_FREE_ASYNC => CudaOp::MemFreeAsync,
            common::CU_MEM_ALLOC_FROM_POOL => CudaOp::MemAllocFromPool,
            common::CU_MEM_ALLOC_MANAGED => CudaOp::MemAllocManaged,
            common::CU_MEM_ALLOC_HOST => CudaOp::MemAllocHost,
            common::CU_MEM_HOST_ALLOC => CudaOp::MemHostAlloc,
            common::CU_MEM_FREE_HOST => CudaOp::MemFreeHost,
            common::CU_MEM_HOST_REGISTER => CudaOp::MemHostRegister,
            common::CU_MEM_HOST_UNREGISTER => CudaOp::MemHostUnregister,
            common::CU_MEM_CREATE => CudaOp::MemCreate,
            common::CU_MEM_RELEASE => CudaOp::MemRelease,
            common::CU_MEM_MAP => CudaOp::MemMap,
            common::CU_MEM_UNMAP => CudaOp::MemUnmap,
            _ => return None,
        })
    }

    /// The name as the CUDA driver API spells it (without `_v2`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            CudaOp::Init => "cuInit",
            CudaOp::PrimaryCtxRetain => "cuDevicePrimaryCtxRetain",
            CudaOp::CtxCreate => "cuCtxCreate",
            CudaOp::MemAlloc => "cuMemAlloc",
            CudaOp::MemFree => "cuMemFree",
            CudaOp::MemAllocAsync => "cuMemAllocAsync",
            CudaOp::MemFreeAsync => "cuMemFreeAsync",
            CudaOp::MemAllocFromPool => "cuMemAllocFromPoolAsync",
            CudaOp::MemAllocManaged => "cuMemAllocManaged",
            CudaOp::MemAllocHost => "cuMemAllocHost",
            CudaOp::MemHostAlloc => "cuMemHostAlloc",
            CudaOp::MemFreeHost => "cuMemFreeHost",
            CudaOp::MemHostRegister => "cuMemHostRegister",
            CudaOp::MemHostUnregister => "cuMemHostUnregister",
            CudaOp::MemCreate => "cuMemCreate",
            CudaOp::MemRelease => "cuMemRelease",
            CudaOp::MemMap => "cuMemMap",
            CudaOp::MemUnmap => "cuMemUnmap",
        }
    }
}

/// One CUDA driver call of a job process, at its return.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CudaCall {
    pub proc: ProcKey,
    pub tid: u32,
    pub comm: String,
    pub op: CudaOp,
    /// `CUresult`; 0 is success.
    pub result: u32,
    /// The device a context call or `cuMemCreate` named.
    pub device: Option<i32>,
    /// Bytes requested.
    pub size: u64,
    /// Returned (success) or given pointer, handle or context.
    pub ptr: u64,
    pub handle: u64,
    pub aux: u64,
    pub entry_ns: u64,
}

/// `cuMemCreate`'s `CUmemLocationType` for host memory: HOST (2),
/// HOST_NUMA (3), HOST_NUMA_CURRENT (4).
pub(crate) fn mem_create_on_host(aux: u64) -> bool {
    (2..=4).contains(&aux)
}

/// An Xid as the driver's tracepoint reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct XidRecord {
    pub(crate) code: u32,
    /// PCI name of the GPU.
    pub(crate) pci: String,
    /// The rest of the message (`pid=…, name=…, text`).
    pub(crate) msg: String,
}

/// What the collector did about one `libcuda.so*` file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuAttach {
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    /// "env", "ldconfig", "dir", or "maps" (seen in a job process).
    pub found_by: String,
    /// The job process whose maps named it (found_by "maps").
    #[serde(default)]
    pub pid: Option<u32>,
    /// Symbols with both probes attached (`_ptsz` variants included).
    pub attached: Vec<String>,
    /// Symbols the library does not export, skipped.
    pub missing: Vec<String>,
    /// Set when nothing could be attached, and why.
    #[serde(default)]
    pub error: Option<String>,
}

/// One GPU data source: used or not, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSource {
    /// "xid", "nvml", "kprobe:nv_alloc_pages", "ioctl", "libcuda".
    pub source: String,
    pub used: bool,
    pub detail: String,
}

/// Cumulative counters of the GPU probes; the last record wins.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLost {
    /// Calls not recorded: the entry/return pairing map was full.
    pub pending_full: u64,
    /// Returned pointers that could not be read.
    pub read_failed: u64,
    /// Library files that could not be probed.
    pub attach_failed: u64,
    /// Driver libraries mapped where the process could not be held
    /// ([`GpuLate`]): windows in which its calls went unrecorded.
    #[serde(default)]
    pub windows: u64,
    /// Calls into the NVIDIA driver (ioctls on `/dev/nvidia*`) counted in
    /// those windows: CUDA work the ledger did not see.
    #[serde(default)]
    pub window_calls: u64,
    /// The windows' total length, mapping to attach.
    #[serde(default)]
    pub window_ns: u64,
    /// Processes held at a late mapping until probed, and for how long in
    /// all: no call lost, a pause the job paid.
    #[serde(default)]
    pub held: u64,
    #[serde(default)]
    pub held_ns: u64,
    /// Driver library mappings not probed because the job could not read
    /// the file: the descriptor mapped was not open for reading (`O_PATH`,
    /// write-only), or the job's user may not open the file.
    #[serde(default)]
    pub unreadable: u64,
    /// Library files not read because their symbol tables claim more than
    /// the recorder reads from one, or lie outside the file.
    #[serde(default)]
    pub tables_too_big: u64,
    /// Driver library mappings not probed because the run had tried as
    /// many library files as it probes.
    #[serde(default)]
    pub over_cap: u64,
    /// Holds that ran past their limit and that the hold's watchdog ended
    /// before the probes were on: each left a window (`windows`).
    #[serde(default)]
    pub hold_timeouts: u64,
}

/// A job process mapped a driver library that was not probed yet: held
/// until it was, or, where it could not be, a window in which its calls
/// went unrecorded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLate {
    pub pid: u32,
    pub tid: u32,
    /// The file's name as the kernel had it, or the path it was found at.
    pub path: String,
    /// The mmap (CLOCK_MONOTONIC ns).
    pub mapped_ns: u64,
    /// When the probes were on; `None`: never, the window stayed open.
    #[serde(default)]
    pub attached_ns: Option<u64>,
    /// Held (SIGSTOP) from the mapping to the attach: nothing missed.
    pub held: bool,
    /// Why it was not held, or what else happened to the hold.
    #[serde(default)]
    pub note: Option<String>,
    /// Calls into the NVIDIA driver counted in the window (0 when held).
    pub calls: u64,
}

/// One NVML sample.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlSample {
    pub devices: Vec<NvmlDevice>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlDevice {
    pub index: u32,
    pub name: String,
    pub used_bytes: u64,
    pub total_bytes: u64,
    pub processes: Vec<NvmlProcess>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlProcess {
    pub pid: u32,
    /// `None` where NVML can't tell (`NVML_VALUE_NOT_AVAILABLE`).
    pub used_bytes: Option<u64>,
}

/// Every GPU event, as one [`Event::Gpu`] variant so that the rest of the
/// decoder and the model need one arm for all of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuEvent {
    Cuda(CudaCall),
    Xid(XidRecord),
    NvPages {
        proc: ProcKey,
        alloc: bool,
        pages: u32,
    },
    Attach(GpuAttach),
    Source(GpuSource),
    Lost(GpuLost),
    Nvml(NvmlSample),
    Late(GpuLate),
}

/// The JSON body of a GPU collector record: `{"ts_ns", "body": {"<kind>": …}}`
/// like the collector's other records.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct GpuUserRecord {
    pub(crate) ts_ns: u64,
    pub(crate) body: GpuUserBody,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuUserBody {
    GpuAttach(GpuAttach),
    GpuSource(GpuSource),
    GpuLost(GpuLost),
    Nvml(NvmlSample),
    GpuLate(GpuLate),
}

impl GpuUserBody {
    pub(crate) fn kind(&self) -> u16 {
        match self {
            GpuUserBody::GpuAttach(_) => KIND_GPU_ATTACH,
            GpuUserBody::GpuSource(_) => KIND_GPU_SOURCE,
            GpuUserBody::GpuLost(_) => KIND_GPU_LOST,
            GpuUserBody::Nvml(_) => KIND_NVML,
            GpuUserBody::GpuLate(_) => KIND_GPU_LATE,
        }
    }
}

/// Encodes a GPU collector record (the collector's side of [`decode_user`]).
pub fn encode_user(ts_ns: u64, body: GpuUserBody) -> (u16, Vec<u8>) {
    let kind = body.kind();
    let bytes = serde_json::to_vec(&GpuUserRecord { ts_ns, body })
        .expect("serializing plain data cannot fail");
    (kind, bytes)
}

pub(super) fn decode_kernel(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    let (ts, ev) = match kind {
        common::KIND_CUDA => {
            let e: common::CudaEvent = read_pod(kind, bytes)?;
            let op = CudaOp::from_kernel(e.op).ok_or(DecodeError::Json {
                kind,
                msg: format!("unknown CUDA op {}", e.op),
            })?;
            let call = CudaCall {
                proc: key(&e.hdr),
                tid: e.tid,
                comm: cstr(&e.comm),
                op,
                result: e.result,
                device: (e.device >= 0).then_some(e.device),
                // Clamped like every memory figure (decode::MAX_KB).
                size: e.size.min(super::MAX_KB << 10),
                ptr: e.ptr,
                handle: e.handle,
                aux: e.aux,
                entry_ns: e.entry_ns.min(super::MAX_TS_NS),
            };
            (e.hdr.ts_ns, GpuEvent::Cuda(call))
        }
        common::KIND_XID => {
            let e: common::XidEvent = read_pod(kind, bytes)?;
            let n = (e.msg_len as usize).min(e.msg.len());
            let x = XidRecord {
                code: e.code,
                pci: cstr(&e.dev),
                msg: cstr(&e.msg[..n]).trim_end().to_string(),
            };
            (e.hdr.ts_ns, GpuEvent::Xid(x))
        }
        common::KIND_NV_PAGES => {
            let e: common::NvPagesEvent = read_pod(kind, bytes)?;
            let ev = GpuEvent::NvPages {
                proc: key(&e.hdr),
                alloc: e.op == common::NV_PAGES_ALLOC,
                pages: e.page_count,
            };
            (e.hdr.ts_ns, ev)
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok((ts, Event::Gpu(Box::new(ev))))
}

pub(super) fn decode_user(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    let w: GpuUserRecord = json(kind, bytes)?;
    let ev = match (kind, w.body) {
        (KIND_GPU_ATTACH, GpuUserBody::GpuAttach(a)) => GpuEvent::Attach(a),
        (KIND_GPU_SOURCE, GpuUserBody::GpuSource(s)) => GpuEvent::Source(s),
        (KIND_GPU_LOST, GpuUserBody::GpuLost(l)) => GpuEvent::Lost(l),
        (KIND_NVML, GpuUserBody::Nvml(n)) => GpuEvent::Nvml(n),
        (KIND_GPU_LATE, GpuUserBody::GpuLate(l)) => GpuEvent::Late(l),
        (KIND_GPU_ATTACH..=KIND_GPU_USER_MAX, _) => {
            return Err(DecodeError::Json {
                kind,
                msg: "body does not match the record kind".into(),
            });
        }
        (other, _) => return Err(DecodeError::UnknownKind(other)),
    };
    Ok((w.ts_ns, Event::Gpu(Box::new(ev))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode, pod_bytes};

    fn cuda(op: u32, result: u32, size: u64, ptr: u64) -> common::CudaEvent {
        let mut comm = [0; common::COMM_LEN];
        comm[..4].copy_from_slice(b"job1");
        common::CudaEvent {
            hdr: common::Header {
                kind: common::KIND_CUDA,
                flags: common::FLAG_IN_JOB,
                tgid: 42,
                ts_ns: 1000,
                start_ns: 7,
            },
            op,
            result,
            tid: 43,
            device: -1,
            size,
            ptr,
            handle: 0,
            aux: 0,
            entry_ns: 900,
            comm,
        }
    }

    #[test]
    fn cuda_call_decodes_with_its_op_name() {
        let e = cuda(common::CU_MEM_ALLOC, 0, 1 << 20, 0x7f00_0000_0000);
        let t = decode(common::KIND_CUDA, &pod_bytes(&e), 4).unwrap();
        assert_eq!(t.ts_ns, 1000);
        let Event::Gpu(g) = t.event else { panic!() };
        let GpuEvent::Cuda(c) = *g else { panic!() };
        assert_eq!(c.op, CudaOp::MemAlloc);
        assert_eq!(
            c.proc,
            ProcKey {
                tgid: 42,
                start_ns: 7
            }
        );
        assert_eq!(
            (c.tid, c.size, c.ptr, c.device),
            (43, 1 << 20, 0x7f00_0000_0000, None)
        );
        assert_eq!(c.comm, "job1");
        assert_eq!(serde_json::to_value(c.op).unwrap(), "cuMemAlloc");
        // A record cut short is an error, never a misread.
        let b = pod_bytes(&e);
        assert!(matches!(
            decode(common::KIND_CUDA, &b[..50], 4),
            Err(DecodeError::Short { .. })
        ));
        // Context creation versions read as one op.
        let v3 = cuda(common::CU_CTX_CREATE_V3, 0, 0, 1);
        let Event::Gpu(g) = decode(common::KIND_CUDA, &pod_bytes(&v3), 4).unwrap().event else {
            panic!()
        };
        assert!(matches!(
            *g,
            GpuEvent::Cuda(CudaCall {
                op: CudaOp::CtxCreate,
                ..
            })
        ));
    }

    #[test]
    fn user_records_round_trip() {
        let (kind, bytes) = encode_user(
            5,
            GpuUserBody::GpuSource(GpuSource {
                source: "nvml".into(),
                used: false,
                detail: "libnvidia-ml.so.1 not found".into(),
            }),
        );
        assert_eq!(kind, KIND_GPU_SOURCE);
        let t = decode(kind, &bytes, 4).unwrap();
        assert_eq!(t.ts_ns, 5);
        assert!(matches!(t.event, Event::Gpu(ref g) if matches!(**g, GpuEvent::Source(_))));
        assert!(matches!(
            decode(KIND_NVML, &bytes, 4),
            Err(DecodeError::Json { .. })
        ));
    }
}
