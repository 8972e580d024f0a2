//! Xid errors: the driver's tracepoint and its kernel log line, parsed
//! (the ledger merges the two into one entry when both report the same
//! error).

use crate::decode::gpu::XidRecord;

use super::Xid;

pub(super) fn xid_from_tracepoint(ts: u64, x: &XidRecord) -> Xid {
    let (pid, name, msg) = parse_xid_tail(&x.msg);
    Xid {
        ts_ns: ts,
        code: x.code,
        pci: x.pci.clone(),
        pid,
        name,
        msg,
        source: "tracepoint".into(),
    }
}

/// `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen
/// off the bus.` (the driver's `nvErrorLog`), with or without a console
/// timestamp before it.
pub(crate) fn parse_xid_line(msg: &str) -> Option<Xid> {
    let rest = &msg[msg.find("NVRM: Xid")? + "NVRM: Xid".len()..];
    let rest = rest.trim_start();
    let (pci, rest) = match rest.strip_prefix("(PCI:") {
        Some(r) => {
            let end = r.find(')')?;
            (r[..end].to_string(), r[end + 1..].trim_start_matches(':'))
        }
        None => (String::new(), rest.trim_start_matches(':')),
    };
    let rest = rest.trim_start();
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let code: u32 = rest[..digits].parse().ok()?;
    let tail = rest[digits..].trim_start_matches(',').trim_start();
    let (pid, name, text) = parse_xid_tail(tail);
    Some(Xid {
        ts_ns: 0,
        code,
        pci,
        pid,
        name,
        msg: text,
        source: "printk".into(),
    })
}

/// `pid=1234, name=python3, text` → (1234, python3, text). Either field
/// may be `'<unknown>'` or missing.
fn parse_xid_tail(s: &str) -> (Option<u32>, Option<String>, String) {
    let mut rest = s.trim();
    let mut pid = None;
    let mut name = None;
    if let Some(r) = rest.strip_prefix("pid=") {
        let end = r.find(',').unwrap_or(r.len());
        pid = r[..end].trim().trim_matches('\'').parse().ok();
        rest = r[end..].trim_start_matches(',').trim_start();
    }
    if let Some(r) = rest.strip_prefix("name=") {
        let end = r.find(", ").unwrap_or(r.len());
        let n = r[..end].trim().trim_matches('\'');
        if !n.is_empty() && n != "<unknown>" {
            name = Some(n.to_string());
        }
        rest = r[end..].trim_start_matches(',').trim_start();
    }
    (pid, name, rest.to_string())
}
