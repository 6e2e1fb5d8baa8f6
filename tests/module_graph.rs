//! A crate's modules and what each imports, for `architecture.rs`'s circle rule: `use`
//! statements with their groups expanded, inline `crate::`/`super::`/`self::` paths, items
//! defined at a module's top level, re-exports followed to where an item is defined.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::rust_files;

/// The names `text` reaches through `prefix` (`crate::` or `super::`) outside `use`
/// statements: each path of segments after it (modules, then the item: `crate::stats::
/// link_json(` gives `stats`, `link_json`).
pub(crate) fn paths_after<'a>(text: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices(prefix) {
        // Not the tail of a longer word (`xcrate::`).
        if text[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[at + prefix.len()..];
        let end =
            rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
        let segs: Vec<&str> = rest[..end].split("::").filter(|s| !s.is_empty()).collect();
        if !segs.is_empty() {
            out.push(segs);
        }
    }
    out
}

/// The `use` statements of `code`: whether each is `pub` (a re-export), and its paths with
/// their groups expanded (`use crate::{a::X, b::{Y, Z}};` gives `crate::a::X`,
/// `crate::b::Y`, `crate::b::Z`; `self` in a group names the group's module; an alias is
/// dropped: what matters is what the path names).
pub(crate) fn use_paths(code: &str) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = &rest[..at];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let lead = before[line_start..].trim();
        let statement = lead.is_empty() || lead.starts_with("pub");
        let word = before.chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let Some(semi) = rest[at..].find(';') else { break };
        let body: String = rest[at + 4..at + semi].chars().filter(|c| !c.is_whitespace()).collect();
        if statement && word {
            let mut paths = Vec::new();
            expand(Vec::new(), &body, &mut paths);
            out.extend(paths.into_iter().map(|p| (lead.starts_with("pub"), p)));
        }
        rest = &rest[at + semi + 1..];
    }
    out
}

/// The paths of one use tree (no spaces), after `prefix`.
pub(crate) fn expand(prefix: Vec<String>, tree: &str, out: &mut Vec<Vec<String>>) {
    match tree.find('{') {
        Some(open) if tree.ends_with('}') => {
            let mut head = prefix;
            head.extend(tree[..open].split("::").filter(|s| !s.is_empty()).map(String::from));
            let inner = &tree[open + 1..tree.len() - 1];
            let (mut depth, mut from) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(head.clone(), &inner[from..i], out);
                        from = i + 1;
                    }
                    _ => {}
                }
            }
            expand(head, &inner[from..], out);
        }
        _ => {
            let tree = tree
                .split("as")
                .next()
                .filter(|_| tree.contains("as") && !tree.contains("::as"))
                .map_or(tree, |t| t);
            let tree = match tree.split_once(" as ") {
                Some((t, _)) => t,
                None => tree,
            };
            let mut path = prefix;
            for seg in tree.split("::").filter(|s| !s.is_empty()) {
                if seg != "self" {
                    path.push(seg.to_string());
                }
            }
            if !path.is_empty() {
                out.push(path);
            }
        }
    }
}

/// The items `code` defines at its top level (structs, enums, functions, traits, constants,
/// types, statics, unions, macros).
pub(crate) fn defined_items(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let mut l = line;
        if let Some(r) = l.strip_prefix("pub(crate) ").or_else(|| l.strip_prefix("pub(super) ")) {
            l = r;
        } else if let Some(r) = l.strip_prefix("pub ") {
            l = r;
        }
        // (`un` `safe` apart: the architecture's scan for that keyword reads this file too.)
        let unsafe_fn = ["un", "safe fn "].concat();
        let kws = [
            "struct ",
            "enum ",
            "fn ",
            "trait ",
            "const ",
            "type ",
            "static ",
            "union ",
            "async fn ",
            "const fn ",
        ];
        for kw in kws.iter().copied().chain([unsafe_fn.as_str()]) {
            if let Some(r) = l.strip_prefix(kw) {
                let name: String = r.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
        if let Some(r) = l.strip_prefix("macro_rules! ") {
            out.insert(r.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

/// One module's source outside its tests: the items it defines, the names it re-exports
/// (name → the absolute path it re-exports), and every path it names.
pub(crate) struct ModSrc {
    pub(crate) defines: BTreeSet<String>,
    pub(crate) reexports: BTreeMap<String, Vec<String>>,
    /// Paths named, absolute from the crate root (`crate::`, `super::`, `self::` resolved).
    pub(crate) names: Vec<Vec<String>>,
    /// Whether it has `use super::*` outside its tests.
    pub(crate) glob_super: bool,
}

/// `path` as the module `m` writes it, made absolute (`crate::a::X` → `a::X`; in `a::b`,
/// `super::X` → `a::X`, `self::c::X` → `a::b::c::X`); `None` for another crate's path.
pub(crate) fn absolute(m: &str, path: &[String]) -> Option<Vec<String>> {
    let mut cur: Vec<String> = m.split("::").filter(|s| !s.is_empty()).map(String::from).collect();
    let mut segs = path.iter().peekable();
    match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
            cur.clear();
        }
        Some("super") => {
            while segs.peek().is_some_and(|s| *s == "super") {
                segs.next();
                cur.pop();
            }
        }
        Some("self") => {
            segs.next();
        }
        _ => return None,
    }
    cur.extend(segs.cloned());
    Some(cur)
}

/// The module an absolute path reaches: its modules walked, then the item — where it is
/// defined, or followed through a re-export to where it is; a glob or an unknown name
/// (an enum's variant, a macro) counts for the module that holds it.
pub(crate) fn target(mods: &BTreeMap<String, ModSrc>, path: &[String], depth: usize) -> String {
    let mut cur = String::new();
    for (i, seg) in path.iter().enumerate() {
        let cand = if cur.is_empty() { seg.clone() } else { format!("{cur}::{seg}") };
        if mods.contains_key(&cand) {
            cur = cand;
            continue;
        }
        if seg != "*"
            && depth < 8
            && let Some(src) = mods.get(&cur)
            && !src.defines.contains(seg)
            && let Some(to) = src.reexports.get(seg)
        {
            let mut to = to.clone();
            to.extend(path[i + 1..].iter().cloned());
            return target(mods, &to, depth + 1);
        }
        return cur;
    }
    cur
}

/// A crate's modules (by path, "" for the root), read outside their `#[cfg(test)] mod tests`.
pub(crate) fn module_sources(src: &Path) -> BTreeMap<String, ModSrc> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |f: &Path| {
        let rel = f.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        if parts.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
            parts.pop();
        }
        parts.join("::")
    };
    let children: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut mods = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        if parts.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
            parts.pop();
        }
        // A module of tests in a file of its own (`#[cfg(test)] mod tests;`) is a test.
        if parts.last().is_some_and(|l| l == "tests") {
            continue;
        }
        let m = parts.join("::");
        let text = std::fs::read_to_string(&f).unwrap();
        // Comments (and the paths their links name) are not imports.
        let code: String = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or("")
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| format!("{l}\n"))
            .collect();
        let uses = use_paths(&code);
        let mut names = Vec::new();
        let mut reexports = BTreeMap::new();
        let glob_super = uses.iter().any(|(_, p)| p == &["super".to_string(), "*".to_string()]);
        for (public, p) in &uses {
            // `use child::X` names a child of this module (2018 paths); any other path that
            // does not start with `crate`, `super` or `self` is another crate's.
            let child = |first: &str| {
                let f = if m.is_empty() { first.to_string() } else { format!("{m}::{first}") };
                children.contains(&f).then_some(f)
            };
            let Some(abs) = absolute(&m, p).or_else(|| {
                let f = child(p.first()?)?;
                Some(f.split("::").map(String::from).chain(p[1..].iter().cloned()).collect())
            }) else {
                continue;
            };
            if *public && let Some(last) = p.last() {
                reexports.insert(last.clone(), abs.clone());
            }
            names.push(abs);
        }
        for prefix in ["crate::", "super::", "self::"] {
            for segs in paths_after(&code, prefix) {
                let mut p = vec![prefix.trim_end_matches("::").to_string()];
                p.extend(segs.iter().map(|s| s.to_string()));
                if let Some(abs) = absolute(&m, &p) {
                    names.push(abs);
                }
            }
        }
        // A path that names no item (`crate` alone, from a `self` in a group) names nothing.
        names.retain(|n| !n.is_empty());
        mods.insert(m, ModSrc { defines: defined_items(&code), reexports, names, glob_super });
    }
    mods
}

/// A crate's modules and the modules each imports items of — its parent's and the crate
/// root's included, groups and globs expanded, re-exports followed to where an item is
/// defined. A module that declares another (`mod x;`) does not import it by that alone.
pub(crate) fn module_imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = module_sources(src);
    let mut edges = BTreeMap::new();
    for (m, ms) in &mods {
        let mut to = BTreeSet::new();
        for p in &ms.names {
            let t = target(&mods, p, 0);
            if t != *m && mods.contains_key(&t) {
                to.insert(t);
            }
        }
        edges.insert(m.clone(), to);
    }
    edges
}

/// A circle of `edges`, if there is one: the modules on it.
pub(crate) fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for n in edges.get(m).into_iter().flatten() {
            match state.get(n).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|p| p == n).unwrap_or(0);
                    return Some(path[from..].to_vec());
                }
                0 => {
                    if let Some(c) = visit(n, edges, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in edges.keys() {
        if state.get(m).copied().unwrap_or(0) == 0
            && let Some(c) = visit(m, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}
