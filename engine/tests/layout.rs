//! Guards the engine's layering (docs/architecture.md, "Layering"): imports
//! inside `engine/src` run one way, so no file and no top-level module
//! depends on itself through others, and `cli/` and `tui/` reach the engine
//! only through the names its crate root re-exports.
//!
//! The checks read source text, not the compiler's view: comments, literals
//! and `#[cfg(test)]` items are blanked (test-only imports cannot tangle the
//! build), then each `crate::`, `super::` and `self::` path is resolved to the
//! deepest file of the module tree on disk. Reading the disk is a thin layer
//! over pure functions of `(path, contents)` pairs, which the checker's own
//! tests at the bottom drive in memory.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

/// from node -> to node -> the `file:line` sites that create that arrow.
type Graph = BTreeMap<String, BTreeMap<String, Vec<String>>>;

#[test]
fn engine_files_have_no_cycles() {
    assert_acyclic(&engine_graph(file_node), "files of engine/src");
}

#[test]
fn engine_modules_have_no_cycles() {
    assert_acyclic(&engine_graph(top_level), "top-level modules of engine/src");
}

#[test]
fn cli_and_tui_use_only_the_engine_root() {
    let workspace = engine_dir().join("..");
    let mut files = read_rs_files(&workspace.join("cli/src"), &workspace);
    files.extend(read_rs_files(&workspace.join("tui/src"), &workspace));
    let deep = deep_engine_paths(&files);
    let fix = "re-export each from engine/src/lib.rs and name it seckill_engine::Item";
    let why = "(docs/architecture.md, \"Layering\")";
    let n = deep.len();
    assert!(
        n == 0,
        "{n} line(s) of cli/ or tui/ reach below seckill_engine's root; {fix} {why}:\n  {}",
        deep.join("\n  ")
    );
}

// ---- The disk: a thin layer ----

fn engine_dir() -> PathBuf {
    // Cargo sets the variable when compiling and when running the test; a
    // standalone `rustc --test` build only sees it at run time.
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_MANIFEST_DIR").map(PathBuf::from))
        .expect("set CARGO_MANIFEST_DIR to the engine crate's directory")
}

fn engine_graph(node: fn(&str) -> String) -> Graph {
    let src = engine_dir().join("src");
    dependency_graph(&read_rs_files(&src, &src), node)
}

/// Every `.rs` file under `dir`, named by its path relative to `base`.
fn read_rs_files(dir: &Path, base: &Path) -> Vec<(PathBuf, String)> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files = Vec::new();
    for path in entries.map(|entry| entry.expect("a directory entry").path()) {
        if path.is_dir() {
            files.extend(read_rs_files(&path, base));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            files.push((path.strip_prefix(base).expect("under base").into(), text));
        }
    }
    files.sort();
    files
}

// ---- The graph ----

/// Arrows between the nodes that `node` maps each file to (the file itself,
/// or its top-level module); files are named relative to the crate's `src`.
fn dependency_graph(files: &[(PathBuf, String)], node: fn(&str) -> String) -> Graph {
    let name = |path: &PathBuf| path.to_string_lossy().replace('\\', "/");
    let modules: BTreeMap<_, _> = files
        .iter()
        .map(|(path, _)| (module_path(&name(path)), name(path)))
        .collect();
    let mut graph = Graph::new();
    for (path, text) in files {
        let file = name(path);
        if file == "lib.rs" {
            continue; // the re-export face: it points at everything by design
        }
        for (segs, line) in paths_from(&tokens(&clean(text, true)), &["crate", "super", "self"]) {
            let Some(to) = resolve(&module_path(&file), &segs, &modules) else {
                continue;
            };
            let (from, to, site) = (node(&file), node(to), format!("{file}:{line}"));
            if from != to {
                let sites = graph.entry(from).or_default().entry(to).or_default();
                if !sites.contains(&site) {
                    sites.push(site);
                }
            }
        }
    }
    graph
}

fn file_node(file: &str) -> String {
    file.to_string()
}

/// `pipeline/consume/tx.rs` -> `pipeline`, `config.rs` -> `config`.
fn top_level(file: &str) -> String {
    file.split(['/', '.']).next().unwrap_or(file).to_string()
}

/// `a/b.rs` and `a/b/mod.rs` are module `a::b`; `lib.rs` is the root.
fn module_path(file: &str) -> Vec<String> {
    let mut segs: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if segs == ["lib"] || segs.last().is_some_and(|last| last == "mod") {
        segs.pop();
    }
    segs
}

/// The deepest file defining a prefix of `segs`, read from module `here`;
/// the rest of the path names items inside that file.
fn resolve<'m>(
    here: &[String],
    segs: &[String],
    modules: &'m BTreeMap<Vec<String>, String>,
) -> Option<&'m String> {
    let mut full = here.to_vec();
    for seg in segs {
        match seg.as_str() {
            "crate" => full.clear(),
            "super" => _ = full.pop()?,
            "self" => {} // `self::x`, or the `self` of `a::{self, B}`
            _ => full.push(seg.clone()),
        }
    }
    (0..=full.len()).rev().find_map(|k| modules.get(&full[..k]))
}

// ---- Source text ----

/// The source as bytes with comments and string and char literals blanked,
/// and `#[cfg(test)]` items too if asked; newlines stay, so lines still count.
fn clean(src: &str, skip_test_items: bool) -> Vec<u8> {
    let mut code = src.as_bytes().to_vec();
    blank_spans(&mut code, literal_end);
    if skip_test_items {
        blank_spans(&mut code, test_item_end);
    }
    code
}

fn blank_spans(code: &mut [u8], span_end: fn(&[u8], usize) -> usize) {
    let mut i = 0;
    while i < code.len() {
        let end = span_end(code, i);
        code[i..end]
            .iter_mut()
            .filter(|b| **b != b'\n')
            .for_each(|b| *b = b' ');
        i = end.max(i + 1);
    }
}

/// Where the comment or literal starting at `i` ends, or `i` if none does.
fn literal_end(c: &[u8], i: usize) -> usize {
    let at = |k: usize| c.get(k).copied();
    let hashes = c[i + 1..].iter().take_while(|&&b| b == b'#').count();
    match (c[i], at(i + 1)) {
        (b'/', Some(b'/')) => find(c, i, b"\n"),
        (b'/', Some(b'*')) => find(c, i + 2, b"*/"),
        (b'"', _) => (i + 1..c.len())
            .find(|&k| c[k] == b'"' && !escaped(c, k))
            .map_or(c.len(), |k| k + 1),
        // r"..", r#".."#, br#".."#, but neither r#ident nor the `r` ending a name.
        (b'r', _) if at(i + 1 + hashes) == Some(b'"') && starts_word(c, i) => {
            let close = [&b"\""[..], &b"#".repeat(hashes)].concat();
            find(c, i + 2 + hashes, &close)
        }
        (b'\'', Some(b'\\')) => find(c, i + 3, b"'"),
        (b'\'', _) if at(i + 2) == Some(b'\'') => i + 3,
        _ => i, // code, lifetimes included
    }
}

/// Whether the `r` at `i`, with a `b` or `c` before it, starts a word.
fn starts_word(c: &[u8], i: usize) -> bool {
    let start = i - usize::from(i > 0 && matches!(c[i - 1], b'b' | b'c'));
    start == 0 || !is_ident_byte(c[start - 1])
}

/// Whether the byte at `k` follows an odd run of backslashes.
fn escaped(c: &[u8], k: usize) -> bool {
    c[..k].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// The index just past the first `pat` at or after `from`, else the end.
fn find(c: &[u8], from: usize, pat: &[u8]) -> usize {
    (from..c.len())
        .find(|&k| c[k..].starts_with(pat))
        .map_or(c.len(), |k| k + pat.len())
}

/// Where the `#[cfg(test)]` item at `i` ends: its `;`, or the close of the
/// brace block after it (literals are blanked, so their braces don't count).
fn test_item_end(c: &[u8], i: usize) -> usize {
    if !c[i..].starts_with(b"#[cfg(test)]") {
        return i;
    }
    let mut depth = 0;
    for (k, &b) in c.iter().enumerate().skip(i) {
        match b {
            b'{' => depth += 1,
            b'}' if depth <= 1 => return k + 1,
            b'}' => depth -= 1,
            b';' if depth == 0 => return k + 1,
            _ => {}
        }
    }
    c.len()
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || !b.is_ascii()
}

struct Tok {
    text: String,
    line: usize,
}

/// Identifiers, `::`, and single punctuation bytes, with 1-based lines.
fn tokens(code: &[u8]) -> Vec<Tok> {
    let (mut toks, mut i, mut line) = (Vec::new(), 0, 1);
    while let Some(&b) = code.get(i) {
        let len = match b {
            _ if is_ident_byte(b) => code[i..].iter().take_while(|&&b| is_ident_byte(b)).count(),
            _ if code[i..].starts_with(b"::") => 2,
            _ => 1,
        };
        let text = String::from_utf8_lossy(&code[i..i + len]).into_owned();
        match b {
            b'\n' => line += 1,
            _ if b.is_ascii_whitespace() => {}
            _ => toks.push(Tok { text, line }),
        }
        i += len;
    }
    toks
}

/// Each path that starts with one of `roots` then `::`, with `use` groups
/// expanded to one path per leaf, each with the line of its last segment.
fn paths_from(toks: &[Tok], roots: &[&str]) -> Vec<(Vec<String>, usize)> {
    let text = |k: usize| toks.get(k).map_or("", |t| t.text.as_str());
    let mut paths = Vec::new();
    for i in 0..toks.len() {
        // The last test skips the inner `super` of `super::super`.
        if roots.contains(&text(i)) && text(i + 1) == "::" && (i == 0 || text(i - 1) != "::") {
            use_tree(toks, i, Vec::new(), &mut paths);
        }
    }
    paths
}

/// Parses the path or use tree at `toks[i]`; returns the index after it.
fn use_tree(
    toks: &[Tok],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, usize)>,
) -> usize {
    let text = |k: usize| toks.get(k).map_or("", |t| t.text.as_str());
    let mut line = 0; // the line of the last segment taken; 0 while none is
    loop {
        match text(i) {
            "{" => {
                while !matches!(text(i), "}" | "") {
                    i = use_tree(toks, i + 1, prefix.clone(), out); // past `{` or `,`
                }
                return i + 1;
            }
            "*" => (line, i) = (toks[i].line, i + 1), // a glob names its module
            seg if seg.starts_with(|c: char| c.is_alphabetic() || c == '_') => {
                (line, i) = (toks[i].line, i + 1);
                prefix.push(seg.into());
                if text(i) == "::" {
                    i += 1;
                    continue; // more segments follow
                }
            }
            _ => {}
        }
        break; // a leaf: a name without `::` after it, a glob, or `f::<T>`
    }
    if text(i) == "as" {
        i += 2;
    }
    if line > 0 {
        out.push((prefix, line));
    }
    i
}

// ---- Cycles ----

fn assert_acyclic(graph: &Graph, what: &str) {
    let sccs = strongly_connected(graph);
    let mut msg = format!(
        "{} dependency cycle(s) among the {what}; imports must run one way, ",
        sccs.len()
    );
    msg += "so move what both sides need down a layer (docs/architecture.md, \"Layering\").\n";
    for scc in &sccs {
        let cycle = cycle_within(graph, scc);
        msg += &format!(
            "\ncycle among {{{}}}:\n  {}\n",
            scc.join(", "),
            cycle.join(" -> ")
        );
        for arrow in cycle.windows(2) {
            let (from, to) = (&arrow[0], &arrow[1]);
            msg += &format!("    {from} -> {to}: {}\n", graph[from][to].join(", "));
        }
    }
    assert!(sccs.is_empty(), "{msg}");
}

fn successors<'g>(graph: &'g Graph, v: &str) -> impl Iterator<Item = &'g str> {
    graph
        .get(v)
        .into_iter()
        .flat_map(|tos| tos.keys().map(String::as_str))
}

/// Tarjan's strongly connected components of more than one node, sorted.
fn strongly_connected(graph: &Graph) -> Vec<Vec<String>> {
    let mut tarjan = Tarjan::default();
    for v in graph.keys() {
        if !tarjan.index.contains_key(v.as_str()) {
            tarjan.visit(graph, v);
        }
    }
    tarjan.sccs.retain(|scc| scc.len() > 1);
    tarjan.sccs.sort();
    tarjan.sccs
}

#[derive(Default)]
struct Tarjan<'g> {
    index: BTreeMap<&'g str, usize>,
    low: BTreeMap<&'g str, usize>,
    stack: Vec<&'g str>,
    sccs: Vec<Vec<String>>,
}

impl<'g> Tarjan<'g> {
    fn visit(&mut self, graph: &'g Graph, v: &'g str) {
        let n = self.index.len();
        self.index.insert(v, n);
        self.low.insert(v, n);
        self.stack.push(v);
        for w in successors(graph, v) {
            let reach = match self.index.get(w) {
                None => {
                    self.visit(graph, w);
                    self.low[w]
                }
                Some(&index) if self.stack.contains(&w) => index,
                Some(_) => continue, // in a component already complete
            };
            let low = self.low[v].min(reach);
            self.low.insert(v, low);
        }
        if self.low[v] == self.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = self.stack.pop() {
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            scc.sort();
            self.sccs.push(scc);
        }
    }
}

/// A shortest cycle `[a, b, c, a]` through the component's first node, by a
/// breadth-first search that stays inside the component.
fn cycle_within(graph: &Graph, scc: &[String]) -> Vec<String> {
    let start = scc[0].as_str();
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in successors(graph, v) {
            if w == start {
                let mut path = vec![start, v];
                while let Some(&p) = parent.get(path[path.len() - 1]) {
                    path.push(p);
                }
                return path.into_iter().rev().map(String::from).collect();
            }
            if scc.iter().any(|s| s == w) && !parent.contains_key(w) {
                parent.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("a component of two or more nodes has a cycle through each node")
}

// ---- cli/ and tui/ ----

/// `file:line: paths` for each line that names an engine item below the root.
fn deep_engine_paths(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut by_line: BTreeMap<(String, usize), Vec<String>> = BTreeMap::new();
    for (path, text) in files {
        for (segs, line) in paths_from(&tokens(&clean(text, false)), &["seckill_engine"]) {
            // `seckill_engine::Item` is two segments; anything longer is deep.
            if segs.len() > 2 {
                let shown = segs.join("::").trim_end_matches("::self").to_string();
                by_line
                    .entry((path.to_string_lossy().into(), line))
                    .or_default()
                    .push(shown);
            }
        }
    }
    by_line
        .into_iter()
        .map(|((file, line), paths)| format!("{file}:{line}: {}", paths.join(", ")))
        .collect()
}

// ---- The checker's own tests, on in-memory files ----

fn in_memory(list: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    list.iter()
        .map(|(path, text)| (PathBuf::from(path), text.to_string()))
        .collect()
}

/// `from -> to @ sites`, one per arrow.
fn arrows(graph: &Graph) -> Vec<String> {
    let all = graph
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |(to, sites)| (from, to, sites)));
    all.map(|(from, to, sites)| format!("{from} -> {to} @ {}", sites.join(", ")))
        .collect()
}

#[test]
fn checker_finds_a_two_file_cycle() {
    let a = "use crate::b::B;\npub struct A;\n";
    let b = "pub struct B;\nfn f() -> crate::a::A {\n    todo!()\n}\n";
    let graph = dependency_graph(&in_memory(&[("a.rs", a), ("b.rs", b)]), file_node);
    let want = ["a.rs -> b.rs @ a.rs:1", "b.rs -> a.rs @ b.rs:2"];
    assert_eq!(arrows(&graph), want);
    let sccs = strongly_connected(&graph);
    assert_eq!(sccs, [["a.rs", "b.rs"]]);
    assert_eq!(cycle_within(&graph, &sccs[0]), ["a.rs", "b.rs", "a.rs"]);
}

#[test]
fn checker_expands_a_grouped_multi_line_use() {
    let x = "use crate::{\n    a::{b, c},\n    d,\n};\n";
    let files = in_memory(&[
        ("a/mod.rs", ""),
        ("a/b.rs", ""),
        ("a/c.rs", ""),
        ("d.rs", ""),
        ("x.rs", x),
    ]);
    let want = [
        "x.rs -> a/b.rs @ x.rs:2",
        "x.rs -> a/c.rs @ x.rs:2",
        "x.rs -> d.rs @ x.rs:3",
    ];
    assert_eq!(arrows(&dependency_graph(&files, file_node)), want);
}

#[test]
fn checker_ignores_test_modules_but_not_what_follows_them() {
    let x = "#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::y;\n    const S: &str = \"}\";\n}\nuse crate::y::Z;\n";
    let graph = dependency_graph(&in_memory(&[("x.rs", x), ("y.rs", "")]), file_node);
    assert_eq!(arrows(&graph), ["x.rs -> y.rs @ x.rs:7"]);
}

#[test]
fn checker_ignores_comments_and_strings() {
    let x = "// crate::y\n/// crate::y\n//! crate::y\n/* crate::y */\nconst S: &[u8] = br#\"\"crate::y\"#;\n";
    let graph = dependency_graph(&in_memory(&[("x.rs", x), ("y.rs", "")]), file_node);
    assert!(graph.is_empty(), "{:?}", arrows(&graph));
}

#[test]
fn checker_finds_a_three_module_cycle_through_inline_paths() {
    let http = "fn g() {\n    crate::pipeline::scan::h();\n}\n";
    let scan = "fn h() {\n    let _ = crate::store::db::f(1);\n}\n";
    let db = "fn f(n: u8) -> u8 {\n    crate::daemon::http::g();\n    n\n}\n";
    let files = in_memory(&[
        ("daemon/http.rs", http),
        ("pipeline/scan.rs", scan),
        ("store/db.rs", db),
    ]);
    let graph = dependency_graph(&files, top_level);
    let sccs = strongly_connected(&graph);
    assert_eq!(sccs, [["daemon", "pipeline", "store"]]);
    let cycle = cycle_within(&graph, &sccs[0]);
    assert_eq!(cycle, ["daemon", "pipeline", "store", "daemon"]);
    assert_eq!(graph["store"]["daemon"], ["store/db.rs:2"]);
}

#[test]
fn checker_resolves_super_from_the_files_module_and_skips_lib_rs() {
    let store = "use super::{Lease, backoff_ms};\nuse super::super::ids::Id;\n";
    let lib = "pub use crate::ids::Id;\n";
    let files = in_memory(&[
        ("lib.rs", lib),
        ("ids.rs", ""),
        ("r/mod.rs", ""),
        ("r/store.rs", store),
    ]);
    let want = [
        "r/store.rs -> ids.rs @ r/store.rs:2",
        "r/store.rs -> r/mod.rs @ r/store.rs:1",
    ];
    assert_eq!(arrows(&dependency_graph(&files, file_node)), want);
}

#[test]
fn checker_flags_deep_engine_paths_but_not_root_names() {
    let main = "use seckill_engine::{Config, db};\nuse seckill_engine::a::B;\n\
                use seckill_engine::{\n    c::D,\n    E,\n};\n// seckill_engine::x::Y\n\
                fn main() {\n    seckill_engine::run();\n}\n";
    let deep = deep_engine_paths(&in_memory(&[("main.rs", main)]));
    let want = [
        "main.rs:2: seckill_engine::a::B",
        "main.rs:4: seckill_engine::c::D",
    ];
    assert_eq!(deep, want);
}
