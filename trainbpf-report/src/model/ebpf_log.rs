//! What the kernel programs logged (`record --ebpf-log`), kept in the
//! order it came, and bounded: the programs throttle themselves, but a
//! recording can say anything.

use crate::decode::EbpfLog;

/// Messages kept; later ones are only counted.
pub(crate) const MAX_MESSAGES: usize = 1000;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EbpfLogReport {
    /// `record --ebpf-log` was given: an empty log means nothing went
    /// wrong that the programs could see, rather than that nobody asked.
    pub(crate) enabled: bool,
    /// When (CLOCK_MONOTONIC ns) and what, in the recording's order.
    pub(crate) messages: Vec<(u64, EbpfLog)>,
    /// Messages past `MAX_MESSAGES`, not kept.
    pub(crate) omitted: u64,
}

impl EbpfLogReport {
    pub(super) fn push(&mut self, ts: u64, m: EbpfLog) {
        if self.messages.len() < MAX_MESSAGES {
            self.messages.push((ts, m));
        } else {
            self.omitted += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_messages_and_counts_the_rest() {
        let mut r = EbpfLogReport::default();
        for i in 0..MAX_MESSAGES as u64 + 5 {
            r.push(
                i,
                EbpfLog {
                    message: format!("m{i}"),
                    ..Default::default()
                },
            );
        }
        assert_eq!(r.messages.len(), MAX_MESSAGES);
        assert_eq!(r.messages[0].1.message, "m0");
        assert_eq!(r.omitted, 5);
    }
}
