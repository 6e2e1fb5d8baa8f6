//! The architecture's rules, checked: the dependencies between the workspace's crates, the
//! places that may hold `unsafe`, the cli crate's files, as docs/architecture.md ("The rules
//! CI checks") lists them, against `cargo metadata` and the crates' sources; and no source
//! file over 800 lines, no function over 120, no circle of imports inside a crate. A
//! dependency, an `unsafe`, a file, a length or a circle the document does not allow fails
//! this test — change the code, or the document with a reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A list of the rules' block: crate → names.
type Rule = BTreeMap<String, BTreeSet<String>>;

/// The lists in the document's `text` block: crate → allowed dependencies, crate → files
/// that may hold `unsafe` ("*" for all), crate → its source files (the cli crate's).
#[path = "module_graph.rs"]
mod module_graph;
use module_graph::{circle, module_imports, module_sources, paths_after, use_paths};

fn documented(list: usize) -> Rule {
    let doc = std::fs::read_to_string(workspace().join("docs/architecture.md")).unwrap();
    let start = doc.find("allowed dependencies (crate:").expect("the rules' block in docs/architecture.md");
    let block = &doc[start..];
    let block = &block[..block.find("```").expect("the rules' block ends")];
    let mut lists = [Rule::new(), Rule::new(), Rule::new()];
    let mut section = 0;
    for line in block.lines() {
        if line.starts_with("allowed dependencies") {
            section = 0;
        } else if line.starts_with("where unsafe lives") {
            section = 1;
        } else if line.starts_with("the cli crate's sources") {
            section = 2;
        } else if let Some((krate, rest)) = line.split_once(':') {
            let set: BTreeSet<String> = rest.split_whitespace().map(str::to_owned).collect();
            lists[section].insert(krate.trim().to_owned(), set);
        }
    }
    assert!(lists.iter().all(|l| !l.is_empty()), "the rules' block did not parse");
    std::mem::take(&mut lists[list])
}

fn documented_rules() -> (Rule, Rule) {
    (documented(0), documented(1))
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

struct Package {
    name: String,
    dir: PathBuf,
    /// Normal (not dev, not build) dependencies among the workspace's crates.
    deps: BTreeSet<String>,
    /// Lib and bin target roots.
    roots: Vec<PathBuf>,
}

fn packages() -> Vec<Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pkgs = m["packages"].as_array().unwrap();
    let names: BTreeSet<String> = pkgs.iter().map(|p| p["name"].as_str().unwrap().to_owned()).collect();
    pkgs.iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null() && names.contains(d["name"].as_str().unwrap()))
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .collect();
            let roots = p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "lib" || k == "bin"))
                .map(|t| PathBuf::from(t["src_path"].as_str().unwrap()))
                .collect();
            Package {
                name: p["name"].as_str().unwrap().to_owned(),
                dir: manifest.parent().unwrap().into(),
                deps,
                roots,
            }
        })
        .collect()
}

/// Whether a line of Rust has the `unsafe` keyword outside a comment (strings holding the
/// word are not expected in this code base; a false alarm here errs on the safe side).
fn has_unsafe(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    code.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == "unsafe")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_dependency_between_the_crates_is_one_the_architecture_allows() {
    let (allowed, _) = documented_rules();
    let mut wrong = Vec::new();
    for p in packages() {
        let Some(ok) = allowed.get(&p.name) else {
            wrong.push(format!("{} is not in docs/architecture.md's list", p.name));
            continue;
        };
        for d in p.deps.difference(ok) {
            wrong.push(format!("{} depends on {d}, which docs/architecture.md does not allow", p.name));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn unsafe_is_only_where_the_architecture_says() {
    let (_, places) = documented_rules();
    let mut wrong = Vec::new();
    for p in packages() {
        let allowed = places.get(&p.name);
        let whole = allowed.is_some_and(|f| f.contains("*"));
        for root in &p.roots {
            let text = std::fs::read_to_string(root).unwrap();
            let forbids = text.contains("#![forbid(unsafe_code)]");
            let denies = forbids || text.contains("#![deny(unsafe_code)]");
            match allowed {
                None if !forbids => wrong.push(format!(
                    "{}: {} must say #![forbid(unsafe_code)] (the crate may not hold unsafe)",
                    p.name,
                    root.display()
                )),
                Some(_) if !whole && !denies => wrong.push(format!(
                    "{}: {} must say #![deny(unsafe_code)] (only the listed files may allow it)",
                    p.name,
                    root.display()
                )),
                _ => {}
            }
        }
        if whole {
            continue;
        }
        // The crate's sources and its tests: src/ and tests/ (the tests crate has neither:
        // every file of its directory then). Tests are held to the rule too.
        let mut files = Vec::new();
        if p.dir.join("src").is_dir() {
            rust_files(&p.dir.join("src"), &mut files);
            if p.dir.join("tests").is_dir() {
                rust_files(&p.dir.join("tests"), &mut files);
            }
        } else {
            rust_files(&p.dir, &mut files);
        }
        for f in files {
            let rel = f.strip_prefix(&p.dir).unwrap().to_string_lossy().into_owned();
            // This checker names the keyword in its own strings.
            if p.name == "dxpu-tests" && rel == "architecture.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let used = text.lines().any(has_unsafe);
            if used && !allowed.is_some_and(|a| a.contains(&rel)) {
                wrong.push(format!(
                    "{}: {rel} holds unsafe, which docs/architecture.md does not allow there",
                    p.name
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_unsafe_detector_sees_the_keyword_and_only_the_keyword() {
    assert!(has_unsafe("    unsafe { libc::close(fd) };"));
    assert!(has_unsafe("pub unsafe fn f() {}"));
    assert!(!has_unsafe("#![allow(unsafe_code)]"));
    assert!(!has_unsafe("// SAFETY: nothing unsafe here"));
    assert!(!has_unsafe("#![forbid(unsafe_code)]"));
}

/// The longest a source file may be, and the one file allowed past it.
const MAX_LINES: usize = 800;
const LONG_FILE: &str = "tlp/src/repr.rs";

#[test]
fn no_source_file_is_over_800_lines_but_the_tlp_representation() {
    let root = workspace();
    let mut files = Vec::new();
    for p in packages() {
        rust_files(&p.dir, &mut files);
    }
    rust_files(&root.join("fuzz/fuzz_targets"), &mut files);
    let mut long = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        if rel.contains("/target/") || rel == LONG_FILE {
            continue;
        }
        let lines = std::fs::read_to_string(&f).unwrap().lines().count();
        if lines > MAX_LINES {
            long.push(format!("{rel}: {lines} lines"));
        }
    }
    long.sort();
    long.dedup();
    assert!(long.is_empty(), "over {MAX_LINES} lines (docs/architecture.md): {long:#?}");
}

#[test]
fn the_cli_crate_holds_the_files_the_architecture_lists_and_no_other() {
    let listed = documented(2).remove("dxpu").expect("the cli crate's sources are listed");
    let cli = packages().into_iter().find(|p| p.name == "dxpu").expect("the cli crate");
    let mut files = Vec::new();
    rust_files(&cli.dir.join("src"), &mut files);
    let have: BTreeSet<String> =
        files.iter().map(|f| f.strip_prefix(&cli.dir).unwrap().to_string_lossy().into_owned()).collect();
    let extra: Vec<_> = have.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&have).collect();
    assert!(extra.is_empty(), "in cli/ but not in docs/architecture.md's list: {extra:?}");
    assert!(gone.is_empty(), "listed in docs/architecture.md but not in cli/: {gone:?}");
}

/// The most lines the binary's own code may have, its tests aside: arguments, and printing
/// what `lab` and `ops` report (docs/architecture.md).
const MAX_CLI_LINES: usize = 3_000;

/// A source file's lines before its `#[cfg(test)]` module, if it has one.
fn lines_before_tests(text: &str) -> usize {
    text.lines().take_while(|l| l.trim() != "#[cfg(test)]").count()
}

#[test]
fn the_cli_crate_is_arguments_and_output_under_3000_lines() {
    assert_eq!(lines_before_tests("a\nb\n#[cfg(test)]\nmod tests {}\n"), 2);
    assert_eq!(lines_before_tests("a\nb\n"), 2);
    let cli = packages().into_iter().find(|p| p.name == "dxpu").expect("the cli crate");
    let mut files = Vec::new();
    rust_files(&cli.dir.join("src"), &mut files);
    let mut each: Vec<(usize, String)> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (lines_before_tests(&text), f.strip_prefix(&cli.dir).unwrap().display().to_string())
        })
        .collect();
    let total: usize = each.iter().map(|(n, _)| n).sum();
    each.sort_by(|a, b| b.cmp(a));
    assert!(
        total < MAX_CLI_LINES,
        "cli/src has {total} lines of non-test code, {MAX_CLI_LINES} at most (docs/architecture.md): the largest files {:?}",
        &each[..each.len().min(5)]
    );
}

/// The longest a function may be, in lines from its signature to its closing brace.
const MAX_FUNCTION_LINES: usize = 120;

/// Whether `line` opens a function with a body on the lines after it: `fn` after any
/// visibility and qualifiers, not a declaration (`;`) or a one-line body.
fn opens_function(line: &str) -> bool {
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub") {
        rest = match r.strip_prefix('(') {
            Some(r) => r.split_once(')').map_or("", |(_, r)| r),
            None => r,
        }
        .trim_start();
    }
    for q in ["const ", "async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(q).unwrap_or(rest);
    }
    let end = line.trim_end();
    rest.starts_with("fn ") && !end.ends_with(';') && !end.ends_with('}')
}

#[test]
fn no_function_is_over_120_lines() {
    let root = workspace();
    let mut files = Vec::new();
    for p in packages() {
        rust_files(&p.dir, &mut files);
    }
    rust_files(&root.join("fuzz/fuzz_targets"), &mut files);
    let mut long = BTreeSet::new();
    for f in files {
        let rel = f.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        if rel.contains("/target/") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !opens_function(line) {
                continue;
            }
            let indent = &line[..line.len() - line.trim_start().len()];
            let close = format!("{indent}}}");
            if let Some(n) = lines[i + 1..].iter().position(|l| *l == close).map(|k| k + 2)
                && n > MAX_FUNCTION_LINES
            {
                long.insert(format!("{rel}:{}: {n} lines: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(long.is_empty(), "over {MAX_FUNCTION_LINES} lines (docs/architecture.md): {long:#?}");
}

#[test]
fn the_function_detector_sees_functions_and_not_declarations() {
    assert!(opens_function("    pub(crate) fn run(args: &Args) -> Result<(), String> {"));
    assert!(opens_function("pub async fn storm("));
    assert!(opens_function("    pub(super) const fn get(self) -> u64 {"));
    assert!(!opens_function("    fn send(&mut self, tlp: &TlpRepr<'_>);"));
    assert!(!opens_function("    fn id(&self) -> Bdf { self.id }"));
    assert!(!opens_function("    // fn not_code() {"));
    assert!(!opens_function("    let f = |x| x;"));
}

#[test]
fn no_circle_of_imports_inside_a_crate() {
    let mut found = Vec::new();
    for p in packages() {
        if !p.dir.join("src").is_dir() {
            continue;
        }
        if let Some(c) = circle(&module_imports(&p.dir.join("src"))) {
            found.push(format!("{}: {}", p.name, c.join(" → ")));
        }
    }
    assert!(found.is_empty(), "circles of imports (docs/architecture.md): {found:#?}");
}

#[test]
fn the_circle_detector_finds_a_circle_and_only_one() {
    let e = |pairs: &[(&str, &str)]| {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            m.entry(a.to_string()).or_default().insert(b.to_string());
            m.entry(b.to_string()).or_default();
        }
        m
    };
    assert_eq!(circle(&e(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(circle(&e(&[("a", "b"), ("b", "c"), ("c", "a")])).map(|c| c.len()), Some(3));
    let v = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        use_paths("use crate::{a::X, b::{Y, self}};\npub use c::Z as W;\nlet x = used();"),
        vec![
            (false, v(&["crate", "a", "X"])),
            (false, v(&["crate", "b", "Y"])),
            (false, v(&["crate", "b"])),
            (true, v(&["c", "Z"]))
        ]
    );
    assert_eq!(paths_after("x = crate::stats::link_json(&l)", "crate::"), vec![vec!["stats", "link_json"]]);
}

/// Each way a module can reach into another, as a probe crate on disk, with the circle the
/// rule must find — what the rule before 51 did not see: an item defined in the crate root
/// (`use crate::{Export, GpuEndpoint}`), a grouped and nested `use`, a parent's item through
/// `super::`, a re-export followed to where the item is defined, and `use super::*`.
#[test]
fn the_module_graph_sees_roots_groups_parents_reexports_and_globs() {
    let probe = |files: &[(&str, &str)]| {
        let dir =
            std::env::temp_dir().join(format!("dxpu-arch-probe-{}-{}", std::process::id(), files[0].1.len()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, text) in files {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
        }
        let c = circle(&module_imports(&dir)).map(|mut c| {
            c.sort();
            c
        });
        let globs: Vec<String> =
            module_sources(&dir).into_iter().filter(|(_, m)| m.glob_super).map(|(k, _)| k).collect();
        let _ = std::fs::remove_dir_all(&dir);
        (c, globs)
    };
    let s = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    // The root defines what a child imports back, and uses the child.
    let (c, _) = probe(&[
        ("lib.rs", "mod a;\nuse a::run;\npub struct Export;\n"),
        ("a.rs", "use crate::{Export, other::Thing};\npub fn run() {}\n"),
    ]);
    assert_eq!(c, s(&["", "a"]), "an item of the root, in a group");
    // Nested groups.
    let (c, _) = probe(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::{b::{x::Y, Z}};\npub fn f() {}\n"),
        ("b/mod.rs", "pub mod x;\npub struct Z;\nuse crate::a::f;\n"),
        ("b/x.rs", "pub struct Y;\n"),
    ]);
    assert!(c.is_some_and(|c| c.contains(&"a".to_string())), "a nested group");
    // A parent's item through super::, the parent using the child.
    let (c, _) = probe(&[
        ("lib.rs", "mod p;\n"),
        ("p/mod.rs", "mod kid;\nuse kid::Part;\npub(crate) struct Chunk;\n"),
        ("p/kid.rs", "use super::Chunk;\npub(crate) struct Part;\n"),
    ]);
    assert_eq!(c, s(&["p", "p::kid"]), "a parent's item");
    // A re-export followed to where the item is defined: no circle through a face.
    let (c, _) = probe(&[
        ("lib.rs", "mod a;\nmod b;\npub use b::Thing;\n"),
        ("a.rs", "use crate::Thing;\npub fn f() {}\n"),
        ("b.rs", "pub struct Thing;\n"),
    ]);
    assert_eq!(c, None, "a re-export is not the root's own item");
    let (c, _) = probe(&[
        ("lib.rs", "mod a;\nmod b;\npub use b::Thing;\n"),
        ("a.rs", "use crate::Thing;\npub fn f() {}\n"),
        ("b.rs", "pub struct Thing;\nfn g() { crate::a::f() }\n"),
    ]);
    assert_eq!(c, s(&["a", "b"]), "followed through the root's re-export");
    // `use super::*` is seen (and refused outside tests).
    let (_, globs) = probe(&[("lib.rs", "mod a;\n"), ("a.rs", "use super::*;\n")]);
    assert_eq!(globs, vec!["a".to_string()]);
}

#[test]
fn no_module_imports_all_of_its_parent_outside_its_tests() {
    let mut found = Vec::new();
    for p in packages() {
        if !p.dir.join("src").is_dir() {
            continue;
        }
        for (m, src) in module_sources(&p.dir.join("src")) {
            if src.glob_super {
                found.push(format!("{}: {m}", p.name));
            }
        }
    }
    assert!(
        found.is_empty(),
        "`use super::*` outside tests (docs/architecture.md): name what is used: {found:#?}"
    );
}

/// The return type of the public function whose `pub fn` starts `text`, its spaces as one
/// (`None`: it returns nothing, or is not a `pub fn`).
fn public_return_type(text: &str) -> Option<String> {
    let rest = text.strip_prefix("pub ")?.trim_start();
    let rest = ["const ", "async ", "unsafe "].iter().fold(rest, |r, q| r.strip_prefix(q).unwrap_or(r));
    let rest = rest.strip_prefix("fn ")?;
    // The parameters' opening parenthesis: past the generics (whose bounds may hold `Fn(..)
    // -> T`).
    let (mut angle, mut open) = (0i32, None);
    let b = rest.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'<' => angle += 1,
            b'>' if i > 0 && b[i - 1] != b'-' => angle -= 1,
            b'(' if angle == 0 => {
                open = Some(i);
                break;
            }
            b'{' | b';' => return None,
            _ => {}
        }
    }
    let mut depth = 0;
    let mut close = None;
    for (i, &c) in b.iter().enumerate().skip(open?) {
        match c {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let after = &rest[close? + 1..];
    let end = after.find(['{', ';']).unwrap_or(after.len());
    let ret = after[..end].trim_start().strip_prefix("->")?;
    let ret = ret.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(ret.split(" where ").next().unwrap_or(&ret).trim().to_string())
}

/// Whether a return type is a `Result` whose error is `String`.
fn is_string_result(ret: &str) -> bool {
    let Some(inner) = ret.strip_prefix("Result<").and_then(|r| r.strip_suffix('>')) else {
        return false;
    };
    // The last argument at the top level.
    let mut depth = 0;
    let mut last = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => last = i + 1,
            _ => {}
        }
    }
    last > 0 && inner[last..].trim() == "String"
}

#[test]
fn no_library_crate_returns_a_string_as_an_error_from_a_public_function() {
    let root = workspace();
    let mut found = BTreeSet::new();
    for p in packages() {
        let src = p.dir.join("src");
        if p.name == "dxpu" || !src.join("lib.rs").is_file() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let rel = f.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&f).unwrap();
            for (at, _) in text.match_indices("pub ") {
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                if !text[line_start..at].trim().is_empty() {
                    continue;
                }
                if let Some(ret) = public_return_type(&text[at..])
                    && is_string_result(&ret)
                {
                    let line = text[..at].lines().count() + 1;
                    found.insert(format!("{rel}:{line}: -> {ret}"));
                }
            }
        }
    }
    assert!(found.is_empty(), "public functions of library crates returning Result<_, String>: {found:#?}");
}

#[test]
fn the_return_type_reader_sees_string_errors_and_only_those() {
    let r = |s| public_return_type(s).filter(|r| is_string_result(r));
    assert_eq!(r("pub fn run(a: &A) -> Result<(), String> {").as_deref(), Some("Result<(), String>"));
    assert_eq!(
        r("pub fn spawn<T, F: Fn(u8) -> u8>(\n    make: impl FnOnce() -> Result<T, String>,\n) -> Result<(T, Vec<String>), String>\nwhere T: Send {")
            .as_deref(),
        Some("Result<(T, Vec<String>), String>")
    );
    assert_eq!(r("pub fn start(read: impl FnOnce() -> Result<T, String>) -> Result<P, ReloadError> {"), None);
    assert_eq!(r("pub fn names(&self) -> Result<Vec<String>, Error> {"), None);
    assert_eq!(r("pub fn name(&self) -> String {"), None);
    assert_eq!(r("pub(crate) fn run() -> Result<(), String> {"), None);
    assert_eq!(r("pub struct S;"), None);
}
