//! The data flows one way (docs/architecture.md): probes, collector,
//! recording, decode, model, render. This reads the crate's own sources and
//! fails on an import that runs against the flow, or on two modules that
//! import each other, so that the layering holds without anyone watching
//! for it in review.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// What each layer may import from the crate, besides itself: its top-level
/// module and the top-level modules listed. Layers not named here (the
/// collector, the CLI) may import anything upstream of them.
const RULES: &[(&str, &[&str])] = &[
    ("units", &[]),
    ("term", &[]),
    ("decode", &[]),
    ("recording", &["decode"]),
    ("model", &["decode", "recording", "units"]),
    ("render", &["model", "units", "term"]),
];

/// A module's path (`model::gpu::xid`; the crate root is ``) and the
/// non-test part of its source.
fn modules() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut stack = vec![root.clone()];
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
            let rel = path.strip_prefix(&root).unwrap().with_extension("");
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
fn strip_comments(code: &str) -> String {
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
fn named_paths(module: &str, code: &str) -> Vec<String> {
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

fn top(m: &str) -> &str {
    m.split("::").next().unwrap_or("")
}

/// Module → the modules it imports, leaving out its own ancestors and
/// descendants (a parent naming its children is how Rust modules nest).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
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

#[test]
fn the_parser_sees_what_a_module_imports() {
    let code = strip_comments(
        "use crate::{model::{Kill, gpu::{self, Ledger}}, units::human_kb as hk};\n\
         use super::style::Paint;\n\
         let x = crate::term::escape(y); // crate::status\n\
         let because = \"we use it\"; pub(crate) use self::inner::X;\n",
    );
    assert_eq!(
        named_paths("render::text::kill", &code),
        [
            "model::Kill",
            "model::gpu",
            "model::gpu::Ledger",
            "render::text::kill::inner::X",
            "render::text::style::Paint",
            "term::escape",
            "units::human_kb",
        ]
    );
    let code = strip_comments("let a = 1; // crate::status\n/// [`crate::compact`]\n");
    assert!(!code.contains("crate::"), "{code}");
}

#[test]
fn each_layer_imports_only_what_is_upstream_of_it() {
    let imports = imports();
    assert!(
        imports.len() > 50,
        "found only {} modules: is the source tree there?",
        imports.len()
    );
    let mut wrong = Vec::new();
    for (m, deps) in &imports {
        let Some((_, allowed)) = RULES.iter().find(|(layer, _)| *layer == top(m)) else {
            continue;
        };
        for d in deps {
            if top(d) != top(m) && !allowed.contains(&top(d)) {
                wrong.push(format!("{m} imports {d}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the data flow (docs/architecture.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_two_modules_import_each_other() {
    let imports = imports();
    // A module reaches itself through its imports: a circle.
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
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}
