//! What the frames' names share: text from the job's files bounded and
//! stripped of control characters before it reaches a recording.

use trainbpf_report::decode::stacks::{Frame, MAX_FRAME_TEXT};

/// Cuts a name or path to `MAX_FRAME_TEXT` bytes (at a char boundary) and
/// replaces control characters: what a process's files hold reaches a
/// terminal later (where `term` escapes it again).
pub fn bounded(s: &str) -> String {
    let mut end = s.len().min(MAX_FRAME_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = s[..end]
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if end < s.len() {
        out.push('…');
    }
    out
}

/// A stack's frames, and why none of them resolved (if none did).
pub type Resolved = (Vec<Frame>, Option<String>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_bounded_and_controls_replaced() {
        assert_eq!(bounded("a\x1b[31mb"), "a?[31mb");
        let long = "é".repeat(MAX_FRAME_TEXT);
        let b = bounded(&long);
        assert!(b.len() <= MAX_FRAME_TEXT + '…'.len_utf8());
        assert!(b.ends_with('…'));
    }
}
