//! `cargo xtask lint`'s check of the house (ARCHITECTURE.md): kdrop-core
//! depends on nothing that runs or does I/O and none of its files uses
//! std's I/O; the module graphs of `kdrop-core/src` and `kdrop/src`, read
//! from their `crate::` paths outside tests, have no cycle, and kdrop's
//! modules use only their own or lower layers (`LAYERS`); the modes reach
//! no other mode's internals; no source file holds more than 600 lines of
//! non-test code, and no function of kdrop-core's diagnosis more than 60
//! (`MAX_FN_LINES`, but for those `FN_ALLOW` lists).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};

/// Most lines of non-test code in one source file.
pub const MAX_LINES: usize = 600;

/// Most lines of one non-test function in kdrop-core's diagnosis, from its
/// `fn` line to its closing brace: reasoning in typed facts, wording in a
/// renderer, each small enough to read at once.
pub const MAX_FN_LINES: usize = 60;

/// Where `MAX_FN_LINES` holds.
const FN_DIR: &str = "kdrop-core/src/diagnosis";

/// Functions still over `MAX_FN_LINES`, not yet split (issue #27): file
/// under `FN_DIR`, name, and the length each may not grow past. An entry
/// whose function has come down to the limit must go.
const FN_ALLOW: &[(&str, &str, usize)] = &[];

/// A function's name and length in lines (its `fn` line to its closing
/// brace) for every function with a body in `code`; nested ones too.
pub fn fn_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let mut depth = 0usize;
        let mut opened = false;
        'body: for (j, l) in lines.iter().enumerate().skip(i) {
            for ch in code_chars(l) {
                match ch {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth = depth.saturating_sub(1),
                    // A declaration without a body.
                    ';' if !opened => break 'body,
                    _ => {}
                }
                if opened && depth == 0 {
                    out.push((name.clone(), j - i + 1));
                    break 'body;
                }
            }
        }
    }
    out
}

/// The name of the function a line starts (`pub(super) fn describe(`).
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// A line's characters outside comments, strings and character literals.
fn code_chars(line: &str) -> Vec<char> {
    let cs: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        match cs[i] {
            '/' if cs.get(i + 1) == Some(&'/') => break,
            '"' => {
                i += 1;
                while i < cs.len() && cs[i] != '"' {
                    i += if cs[i] == '\\' { 2 } else { 1 };
                }
            }
            // '{' or '\'' (a lifetime, 'a, has no closing quote after one).
            '\'' if cs.get(i + 2) == Some(&'\'') => i += 2,
            '\'' if cs.get(i + 1) == Some(&'\\') => {
                i += 2;
                while i < cs.len() && cs[i] != '\'' {
                    i += 1;
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// The problems with functions' lengths: one over `MAX_FN_LINES` that
/// `allow` does not list, one that grew past its entry, an entry no longer
/// needed. `fns`: file (under `FN_DIR`), name, lines.
pub fn fn_problems(fns: &[(String, String, usize)], allow: &[(&str, &str, usize)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (rel, name, n) in fns.iter().filter(|(_, _, n)| *n > MAX_FN_LINES) {
        let entry = allow.iter().find(|(f, fun, _)| f == rel && fun == name);
        if entry.is_some() {
            used.insert((rel.as_str(), name.as_str()));
        }
        match entry {
            Some(&(_, _, max)) if *n <= max => {}
            Some(&(_, _, max)) => problems.push(format!(
                "{FN_DIR}/{rel}: fn {name} is {n} lines, grown past its allowed {max}"
            )),
            None => problems.push(format!(
                "{FN_DIR}/{rel}: fn {name} is {n} lines (at most {MAX_FN_LINES}): \
                 split its facts from its words"
            )),
        }
    }
    for (file, fun, _) in allow {
        if !used.contains(&(*file, *fun)) {
            problems.push(format!(
                "xtask/src/arch.rs FN_ALLOW: {file} fn {fun} is within {MAX_FN_LINES} lines \
                 (or gone): remove its entry"
            ));
        }
    }
    problems
}

/// `fn_problems` over the non-test functions of `FN_DIR`'s files, with
/// `FN_ALLOW`; what is still allowed is said, to stay visible.
fn check_fn_lengths(root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let dir = root.join(FN_DIR);
    let mut files = Vec::new();
    rust_files(&dir, &mut files)?;
    files.sort();
    // A `tests.rs` (`nft_tests.rs`) is its parent's `#[cfg(test)] mod tests;`.
    let tests = |f: &&PathBuf| {
        f.file_stem()
            .is_some_and(|s| s.to_string_lossy().ends_with("tests"))
    };
    let mut fns = Vec::new();
    for f in files.iter().filter(|f| !tests(f)) {
        let rel = f.strip_prefix(&dir).unwrap_or(f).display().to_string();
        let src = fs::read_to_string(f)?;
        for (name, n) in fn_lengths(non_test(&src)) {
            fns.push((rel.clone(), name, n));
        }
    }
    problems.extend(fn_problems(&fns, FN_ALLOW));
    if !FN_ALLOW.is_empty() {
        eprintln!(
            "xtask: still over {MAX_FN_LINES} lines in {FN_DIR} (FN_ALLOW): {}",
            FN_ALLOW
                .iter()
                .map(|(f, n, l)| format!("{f} {n} ({l})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// Modules that are pure: events and snapshots in, findings out.
const PURE: [&str; 2] = ["diagnosis", "model"];

/// What I/O looks like in Rust source: the pure modules use none of it.
const IO: [&str; 12] = [
    "std::fs",
    "std::process",
    "std::net::TcpStream",
    "std::net::UdpSocket",
    "std::thread",
    "std::time::Instant",
    "SystemTime",
    "libc::",
    "tokio",
    "aya::",
    "crate::context",
    "crate::probes",
];

/// The modes: each reaches the session and below, never another mode.
const MODES: [&str; 4] = ["trace", "monitor", "lab", "check"];

/// A source file's code before its `#[cfg(test)]` module; nothing for a
/// file that is a test module as a whole (`#![cfg(test)]` after its `//!`
/// lines, as a `#[path = "tests.rs"]` module of tests says it).
fn non_test(src: &str) -> &str {
    let whole = src
        .lines()
        .find(|l| !l.starts_with("//") && !l.trim().is_empty())
        .is_some_and(|l| l.trim() == "#![cfg(test)]");
    if whole {
        return "";
    }
    match src.find("#[cfg(test)]") {
        Some(i) => &src[..i],
        None => src,
    }
}

/// The top-level module a file under `src/` belongs to (`diagnosis` for
/// `diagnosis/routing.rs`, `trace` for `trace.rs`; `lib`/`main` for the
/// crate root).
fn top_module(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_string()
}

/// The top-level modules a file's code names through `crate::`, including
/// those of `use crate::{a, b::c}` groups.
pub fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group, up to its matching brace.
            let mut depth = 1;
            let mut name = String::new();
            let mut at_top = true;
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if depth == 1 && ch == ',' {
                    if !name.is_empty() {
                        out.insert(std::mem::take(&mut name));
                    }
                    at_top = true;
                    continue;
                }
                if at_top {
                    if ch.is_alphanumeric() || ch == '_' {
                        name.push(ch);
                    } else if !name.is_empty() {
                        out.insert(std::mem::take(&mut name));
                        at_top = false;
                    }
                }
            }
            if !name.is_empty() {
                out.insert(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// A cycle in `graph`, as the modules along it, if there is one.
pub fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if !state.contains_key(n.as_str()) {
            if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = entry?.path();
        if p.is_dir() {
            rust_files(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// The module graph of a crate's `src/` (top-level modules and the
/// `crate::` modules each names outside tests), with the problems found on
/// the way: I/O in a pure module (`all_pure`: every module of the crate),
/// a mode reaching into another.
fn module_graph(
    root: &Path,
    krate: &str,
    all_pure: bool,
    problems: &mut Vec<String>,
) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let src = root.join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files)?;
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap_or(f);
        let top = top_module(rel);
        let text = fs::read_to_string(f)?;
        let code = non_test(&text);
        if all_pure || PURE.contains(&top.as_str()) {
            for pat in IO {
                if code.contains(pat) {
                    problems.push(format!(
                        "{krate}/src/{}: {top} is pure, but uses {pat}",
                        rel.display()
                    ));
                }
            }
        }
        if top == "lib" || top == "main" {
            continue;
        }
        let refs = crate_refs(code);
        // Names that are items of the crate root, not modules.
        let refs: BTreeSet<String> = refs
            .into_iter()
            .filter(|r| r != &top && r != "UserError")
            .collect();
        if MODES.contains(&top.as_str()) {
            for other in refs.iter().filter(|r| MODES.contains(&r.as_str())) {
                problems.push(format!(
                    "{}: the {top} mode reaches into the {other} mode",
                    rel.display()
                ));
            }
        }
        graph.entry(top).or_default().extend(refs);
    }
    if let Some(cycle) = find_cycle(&graph) {
        problems.push(format!(
            "{krate}/src: the modules form a cycle: {}",
            cycle.join(" -> ")
        ));
    }
    Ok(graph)
}

/// The layers of `kdrop/src`, lowest first: a module may use its own
/// layer's modules (the graph has no cycle) and lower layers', never a
/// higher one's. `model`, `event` and `diagnosis` are the core's, re-exported.
const LAYERS: &[&[&str]] = &[
    &["model", "event", "diagnosis"],
    // startup: the process's capabilities and limits, before all else.
    &["kernel", "context", "output", "startup"],
    // cli: the flags' definitions, which the filter reads.
    &["enrich", "probes", "filter", "cli"],
    &["session"],
    &["trace", "monitor", "lab", "check"],
];

fn layer_of(m: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&m))
}

/// Every edge of `graph` goes down (or across) the layers; a module no
/// layer lists is a problem too, so a new module gets its place.
fn check_layers(graph: &BTreeMap<String, BTreeSet<String>>, problems: &mut Vec<String>) {
    for (m, to) in graph {
        let Some(from) = layer_of(m) else {
            problems.push(format!(
                "kdrop/src: module {m} has no layer (xtask/src/arch.rs LAYERS)"
            ));
            continue;
        };
        for t in to {
            if layer_of(t).is_some_and(|l| l > from) {
                problems.push(format!(
                    "kdrop/src: {m} (layer {from}) uses {t}, a higher layer's module"
                ));
            }
        }
    }
}

/// What kdrop-core may depend on: nothing that runs, loads or does I/O.
const CORE_DEPS: &[&str] = &["kdrop-common", "anyhow", "log", "serde", "serde_json"];

/// kdrop-core's `[dependencies]` are among `CORE_DEPS`, and kdrop-common
/// comes without its `user` feature (aya's Pod).
fn check_core_deps(root: &Path, problems: &mut Vec<String>) -> Result<()> {
    let path = root.join("kdrop-core/Cargo.toml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let deps = text
        .split("[dependencies]")
        .nth(1)
        .unwrap_or_default()
        .split("\n[")
        .next()
        .unwrap_or_default();
    for line in deps.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', ' ']).next().unwrap_or_default();
        if !CORE_DEPS.contains(&name) {
            problems.push(format!(
                "kdrop-core/Cargo.toml: depends on {name}, not among {CORE_DEPS:?}"
            ));
        }
        if name == "kdrop-common" && line.contains("features") {
            problems.push(format!(
                "kdrop-core/Cargo.toml: kdrop-common with features: {line}"
            ));
        }
    }
    Ok(())
}

/// The checks, over the workspace at `root`; every problem found is listed.
pub fn check(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    // File sizes: every crate's sources.
    for krate in [
        "kdrop",
        "kdrop-core",
        "kdrop-common",
        "kdrop-ebpf",
        "xtask",
        "synflood",
        "tests",
    ] {
        let mut files = Vec::new();
        rust_files(&root.join(krate).join("src"), &mut files)?;
        for f in files {
            let src = fs::read_to_string(&f)?;
            let n = non_test(&src).lines().count();
            if n > MAX_LINES {
                problems.push(format!(
                    "{}: {n} lines of non-test code (at most {MAX_LINES})",
                    f.strip_prefix(root).unwrap_or(&f).display()
                ));
            }
        }
    }
    check_fn_lengths(root, &mut problems)?;
    check_core_deps(root, &mut problems)?;
    let core = module_graph(root, "kdrop-core", true, &mut problems)?;
    let shell = module_graph(root, "kdrop", false, &mut problems)?;
    check_layers(&shell, &mut problems);
    if !problems.is_empty() {
        bail!("the house is out of shape:\n  {}", problems.join("\n  "));
    }
    for (name, graph) in [("kdrop-core/src", &core), ("kdrop/src", &shell)] {
        let edges: Vec<String> = graph
            .iter()
            .map(|(m, to)| {
                format!(
                    "{m} -> {}",
                    to.iter().cloned().collect::<Vec<_>>().join(" ")
                )
            })
            .collect();
        eprintln!(
            "xtask: module graph of {name} (no cycles, layers kept):\n  {}",
            edges.join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_lengths() {
        let code = "/// Doc.\npub(super) fn a(x: u8) -> u8 {\n    let s = \"}{\";\n    let c = '}';\n    // }\n    x\n}\nfn b<'a>(s: &'a str)\n    -> &'a str\n{\n    fn inner() {}\n    s\n}\ntrait T {\n    fn decl(&self);\n}\n";
        assert_eq!(
            fn_lengths(code),
            [
                ("a".to_string(), 6),
                ("b".to_string(), 6),
                ("inner".to_string(), 1)
            ]
        );
    }

    #[test]
    fn long_functions_are_listed_or_refused() {
        let f = |file: &str, name: &str, n: usize| (file.to_string(), name.to_string(), n);
        let fns = [
            f("a.rs", "short", MAX_FN_LINES),
            f("a.rs", "long", 80),
            f("b.rs", "listed", 70),
            f("b.rs", "grown", 75),
        ];
        let allow = [
            ("b.rs", "listed", 70),
            ("b.rs", "grown", 72),
            ("c.rs", "split", 90),
        ];
        let got = fn_problems(&fns, &allow);
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(got[0].contains("a.rs: fn long is 80 lines (at most 60)"));
        assert!(got[1].contains("b.rs: fn grown is 75 lines, grown past its allowed 72"));
        assert!(got[2].contains("FN_ALLOW: c.rs fn split"));
        assert!(fn_problems(&fns[..1], &[]).is_empty());
    }

    #[test]
    fn crate_paths_and_groups() {
        let code = "use crate::{\n    context::{netns, Live},\n    model::record::DropRecord,\n    UserError,\n};\nlet x = crate::output::text::line(); crate::filter::resolve();";
        let got: Vec<String> = crate_refs(code).into_iter().collect();
        assert_eq!(got, ["UserError", "context", "filter", "model", "output"]);
    }

    #[test]
    fn cycles_are_found() {
        let g = |edges: &[(&str, &str)]| {
            let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in edges {
                m.entry(a.to_string()).or_default().insert(b.to_string());
            }
            m
        };
        assert_eq!(find_cycle(&g(&[("a", "b"), ("b", "c")])), None);
        let c = find_cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap();
        assert_eq!(c.first(), c.last());
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn tests_do_not_count() {
        assert_eq!(
            non_test("a\nb\n#[cfg(test)]\nmod tests {}\n")
                .lines()
                .count(),
            2
        );
        assert_eq!(non_test("//! Tests.\n#![cfg(test)]\nuse super::*;\n"), "");
        // Only as the file's first item: an inner attribute elsewhere is
        // not the file's.
        assert_eq!(
            non_test("//! Code.\nfn a() {}\n#![cfg(test)]\n")
                .lines()
                .count(),
            3
        );
    }

    #[test]
    fn layers_are_kept() {
        let g = |edges: &[(&str, &str)]| {
            let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in edges {
                m.entry(a.to_string()).or_default().insert(b.to_string());
            }
            m
        };
        let mut p = Vec::new();
        check_layers(&g(&[("session", "enrich"), ("enrich", "context")]), &mut p);
        assert!(p.is_empty(), "{p:?}");
        check_layers(&g(&[("context", "session"), ("newmod", "model")]), &mut p);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("context (layer 1) uses session"), "{p:?}");
        assert!(p[1].contains("module newmod has no layer"), "{p:?}");
    }

    #[test]
    fn this_workspace_is_in_shape() {
        check(&crate::root()).unwrap();
    }
}
