//! Text bound for a terminal. Process names, arguments, executable paths,
//! cgroup names and file names come from processes (and a recording could
//! have been written by anyone); the recorder prints them as root on the
//! terminal of whoever ran it. An escape sequence among them would set the
//! window title, clear the screen, or on some terminals answer back into
//! the terminal's input. So every text output shows control characters the
//! way `ls --quoting-style=escape` does: `\n`, `\t`, `\r`, `\\`, and `\xNN`
//! for the rest of C0, DEL and C1. Bidirectional-text controls, which make
//! a line read other than it is, show as `\u{NNNN}`.
//!
//! HTML, JSON and Perfetto outputs escape by their own rules and do not
//! come here.

use std::{borrow::Cow, fmt::Write as _};

/// Which characters a caller lets through as they are.
#[derive(Clone, Copy)]
struct Keep {
    /// Line breaks: text we composed ourselves has them.
    newline: bool,
    /// Backslashes: doubled in a name, so that `\x1b` typed into a name
    /// reads differently from an escaped ESC; left alone in text we made.
    backslash: bool,
    /// SGR colour sequences (`ESC [ 1;31 m`): the text renderer's own.
    color: bool,
}

/// One string that came from a process (comm, an argument, a path, a cgroup
/// name): every control character, and backslash, escaped. Format it into
/// text meant for a terminal through this.
pub fn escape(s: &str) -> Cow<'_, str> {
    clean(
        s,
        Keep {
            newline: false,
            backslash: false,
            color: false,
        },
    )
}

/// Joins process-derived strings (argv) with spaces, each escaped.
pub(crate) fn escape_join(parts: &[String]) -> String {
    parts
        .iter()
        .map(|p| escape(p))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A whole text we composed (a report, a verdict, a message): line breaks
/// stay, every other control character is escaped. The last guard at the
/// boundary, so that a field that missed [`escape`] still cannot reach the
/// terminal raw.
pub fn sanitize(s: &str) -> Cow<'_, str> {
    clean(
        s,
        Keep {
            newline: true,
            backslash: true,
            color: false,
        },
    )
}

/// As [`sanitize`], keeping SGR colour sequences: for coloured output.
pub(crate) fn sanitize_colored(s: &str) -> Cow<'_, str> {
    clean(
        s,
        Keep {
            newline: true,
            backslash: true,
            color: true,
        },
    )
}

/// Characters that make a line display other than its bytes read.
fn is_bidi(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            | '\u{2028}' | '\u{2029}'
    )
}

fn needs(c: char, keep: Keep) -> bool {
    match c {
        '\n' => !keep.newline,
        '\\' => !keep.backslash,
        c if c.is_control() => true,
        c => is_bidi(c),
    }
}

/// Length of an SGR sequence (`ESC [ [0-9;]* m`) at the start of `s`.
fn sgr_len(s: &str) -> Option<usize> {
    let rest = s.strip_prefix("\x1b[")?;
    let params = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b';')
        .count();
    (rest.as_bytes().get(params) == Some(&b'm')).then_some(2 + params + 1)
}

fn clean(s: &str, keep: Keep) -> Cow<'_, str> {
    if !s.chars().any(|c| needs(c, keep)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    let mut i = 0;
    while let Some(c) = s[i..].chars().next() {
        if keep.color
            && c == '\x1b'
            && let Some(n) = sgr_len(&s[i..])
        {
            out.push_str(&s[i..i + n]);
            i += n;
            continue;
        }
        i += c.len_utf8();
        if !needs(c, keep) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_show_controls_as_escapes() {
        assert_eq!(escape("python3"), "python3");
        assert!(matches!(escape("pt_data_worker"), Cow::Borrowed(_)));
        assert_eq!(escape("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
        assert_eq!(escape("a\nb\tc\rd"), "a\\nb\\tc\\rd");
        assert_eq!(escape("del\x7f"), "del\\x7f");
        assert_eq!(escape("c1\u{9b}2J"), "c1\\x9b2J");
        assert_eq!(escape("back\\slash"), "back\\\\slash");
        assert_eq!(escape("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        // Printable non-ASCII stays: names are often not English.
        assert_eq!(escape("Größe→日本"), "Größe→日本");
        assert_eq!(
            escape_join(&["sh".into(), "-c".into(), "echo \x1b[2J".into()]),
            "sh -c echo \\x1b[2J"
        );
    }

    #[test]
    fn whole_texts_keep_lines_and_only_their_own_colour() {
        assert_eq!(sanitize("a\nb\\c"), "a\nb\\c");
        assert_eq!(sanitize("x\x1b[1;31my"), "x\\x1b[1;31my");
        assert_eq!(
            sanitize_colored("\x1b[1;31mkill\x1b[0m \x1b]0;t\x07 \x1b[2J"),
            "\x1b[1;31mkill\x1b[0m \\x1b]0;t\\x07 \\x1b[2J"
        );
        assert_eq!(sanitize_colored("\x1b["), "\\x1b[");
    }
}
