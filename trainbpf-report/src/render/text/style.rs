//! What every part of the text report shares: its options, colour, the
//! last escaping pass and word wrap.

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextOptions {
    /// ANSI colour; the caller decides (terminal, `NO_COLOR`, `--color`).
    pub color: bool,
    /// Prose is wrapped to this many columns.
    pub width: usize,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            color: false,
            width: 100,
        }
    }
}

/// Narrower than this and wrapping does more harm than good.
pub(crate) const MIN_WIDTH: usize = 40;

pub(crate) struct Paint(pub(crate) bool);

impl Paint {
    pub(crate) fn wrap(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    pub(crate) fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
    pub(crate) fn red(&self, s: &str) -> String {
        self.wrap("1;31", s)
    }
    pub(crate) fn yellow(&self, s: &str) -> String {
        self.wrap("33", s)
    }
    pub(crate) fn dim(&self, s: &str) -> String {
        self.wrap("2", s)
    }
}

/// The last guard before a terminal: anything that reached `out` without
/// [`esc`] (a string from a hand-made recording's header, a field added
/// later) is escaped here, keeping line breaks and, with colour on, the
/// renderer's own colour codes.
pub(crate) fn finish(out: String, color: bool) -> String {
    let clean = if color {
        crate::term::sanitize_colored(&out)
    } else {
        crate::term::sanitize(&out)
    };
    match clean {
        std::borrow::Cow::Borrowed(_) => out,
        std::borrow::Cow::Owned(s) => s,
    }
}

/// Greedy word wrap; a word longer than the line stays whole.
pub(crate) fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in s.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

pub(crate) fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

pub(crate) fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "unknown" } else { s }
}
