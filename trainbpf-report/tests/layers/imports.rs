//! A crate's imports, read from its sources: which module names which.
//! Shared by the layer checks of both crates (this crate's
//! tests/layers.rs, and trainbpf's, which includes this file).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// Each module under `root` (a crate's `src`): its path
/// (`model::gpu::xid`; the crate root is ``) and the non-test part of its
/// source.
fn modules(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            match parts.last().map(String::as_str) {
                Some("mod") => {
                    parts.pop();
                }
                Some("lib" | "main") if parts.len() == 1 => parts.clear(),
                // Test-only modules (`#[cfg(test)] mod tests;`).
                Some("tests" | "testdata") => continue,
                _ => {}
            }
            let text = fs::read_to_string(&path).unwrap();
            let code = match text.find("\n#[cfg(test)]") {
                Some(i) => &text[..i],
                None => &text[..],
            };
            out.insert(parts.join("::"), strip_comments(code));
        }
    }
    out
}

/// Drops `//` comments (doc comments name modules in prose and links).
pub fn strip_comments(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        let cut = line
            .match_indices("//")
            .find(|(i, _)| *i == 0 || line.as_bytes()[i - 1].is_ascii_whitespace())
            .map_or(line.len(), |(i, _)| i);
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

/// The paths a `use` tree names: `a::{b, c::{d, e}}` → `a::b`, `a::c::d`,
/// `a::c::e`.
fn expand(prefix: &str, tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or("").trim();
        let path = path.strip_suffix("::self").unwrap_or(path);
        return vec![format!("{prefix}{path}")];
    };
    let head = &tree[..open];
    let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let (mut items, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for ch in inner.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    items.push(cur);
    let prefix = format!("{prefix}{head}");
    items
        .iter()
        .filter(|i| !i.trim().is_empty())
        .flat_map(|i| {
            if i.trim() == "self" {
                vec![prefix.trim_end_matches("::").to_string()]
            } else {
                expand(&prefix, i)
            }
        })
        .collect()
}

/// Every crate path a module's code names, absolute (`model::Report`).
pub fn named_paths(module: &str, code: &str) -> Vec<String> {
    let parent: Vec<&str> = module.split("::").filter(|p| !p.is_empty()).collect();
    let parent = parent[..parent.len().saturating_sub(1)].join("::");
    let absolute = |p: &str| -> Option<String> {
        if let Some(rest) = p.strip_prefix("crate::") {
            Some(rest.to_string())
        } else if let Some(rest) = p.strip_prefix("super::") {
            Some(if parent.is_empty() {
                rest.to_string()
            } else {
                format!("{parent}::{rest}")
            })
        } else {
            p.strip_prefix("self::")
                .map(|rest| format!("{module}::{rest}"))
        }
    };
    let mut out = Vec::new();
    // `use` trees, whole.
    for (i, _) in code.match_indices("use ") {
        // The keyword, not the end of a word (`because use`).
        if i > 0 && is_ident(code.as_bytes()[i - 1]) {
            continue;
        }
        let after = &code[i + 4..];
        let end = after.find(';').unwrap_or(after.len());
        let tree: String = after[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for p in expand("", &tree) {
            out.extend(absolute(&p.replace(' ', "")));
        }
    }
    // Paths written inline: `crate::a::b`, `super::a`.
    for anchor in ["crate::", "super::"] {
        for (i, _) in code.match_indices(anchor) {
            if i > 0 && (is_ident(code.as_bytes()[i - 1]) || code.as_bytes()[i - 1] == b':') {
                continue;
            }
            let tail: String = code[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.extend(absolute(tail.trim_end_matches(':')));
        }
    }
    out.sort();
    out.dedup();
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The module a path lands in: its longest prefix that is a module.
fn resolve<'a>(mods: &'a BTreeMap<String, String>, path: &str) -> Option<&'a str> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .find_map(|k| mods.get_key_value(&parts[..k].join("::")))
        .map(|(k, _)| k.as_str())
}

fn related(a: &str, b: &str) -> bool {
    a == b
        || a.is_empty()
        || b.is_empty()
        || a.starts_with(&format!("{b}::"))
        || b.starts_with(&format!("{a}::"))
}

pub fn top(m: &str) -> &str {
    m.split("::").next().unwrap_or("")
}

/// Module → the modules it imports, leaving out its own ancestors and
/// descendants (a parent naming its children is how Rust modules nest).
pub fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let mut out = BTreeMap::new();
    for (m, code) in &mods {
        let deps: BTreeSet<String> = named_paths(m, code)
            .iter()
            .filter_map(|p| resolve(&mods, p))
            .filter(|t| !related(m, t))
            .map(str::to_string)
            .collect();
        out.insert(m.clone(), deps);
    }
    out
}

/// Each way a module reaches itself through its imports, as
/// `a -> b -> a`.
pub fn circles(imports: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut circles = Vec::new();
    for start in imports.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((m, trail)) = todo.pop() {
            for d in imports.get(&m).into_iter().flatten() {
                if d == start {
                    circles.push(trail.join(" -> ") + " -> " + start);
                } else if seen.insert(d.clone()) {
                    let mut t = trail.clone();
                    t.push(d.clone());
                    todo.push((d.clone(), t));
                }
            }
        }
    }
    circles
}
