//! The import-circle check: which files of an application's `src/` import
//! each other in a ring.
//!
//! Issue 24's rule is that no import circle of more than two files remains in
//! either app, other than the crate's own `errors.rs` with the types it names.
//! A two-file circle (a parent and the child that uses `super::` items) is a
//! folder's ordinary shape; three or more files in a ring means no file of it
//! can be read, or moved, without the others.
//!
//! The graph is built from the source text, not from rustc, so that it runs in
//! milliseconds on any tree (including another engineer's worktree, through
//! `cargo xtask imports --root DIR`):
//!
//! * Each `.rs` file under `src/` is a node, named by its path below `src/`.
//!   `main.rs` is left out when `lib.rs` exists: it is another crate, which
//!   the library cannot import, so it cannot be in a circle with it.
//! * An edge comes from every path in code (comments and string literals are
//!   skipped) that starts with `crate::`, `super::` or `self::`, and from
//!   relative paths whose first segment is a child module that has a file.
//!   `use` trees (`use crate::{a::X, b::{self, Y}}`) are expanded. `super::`
//!   inside an inline `mod tests { .. }` means the file itself.
//! * A path resolves to the longest prefix that has a file: for
//!   `crate::a::b::Item`, `src/a/b.rs` or `src/a/b/mod.rs`, else `src/a.rs` or
//!   `src/a/mod.rs`, else the crate root.
//! * A parent's `pub use` re-exports of its direct children are not edges: a
//!   parent that declares and re-exports its children is the folder's map,
//!   and every child that names `super::` would otherwise make a ring with it.
//!   (`mod` lines never make edges.)
//! * The crate's own `src/errors.rs` (or `src/errors/mod.rs`) is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The applications whose layouts the check holds, as paths below a
/// workspace root.
pub const APP_SOURCES: &[&str] = &["crates/hopper/src", "crates/sync-worker/src"];

/// A file-level import graph of one crate's `src/`.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every file (path below `src/`, with `/` separators) and the files it imports.
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

/// A strongly connected component of more than two files: each imports,
/// directly or not, every other.
#[derive(Debug, PartialEq, Eq)]
pub struct Circle {
    /// The files of the circle, sorted.
    pub files: Vec<String>,
    /// The edges among them: each file and the files of the circle it imports.
    pub edges: BTreeMap<String, Vec<String>>,
    /// One ring of more than two files in the component (first file repeated
    /// at the end), or `None` when the component is only two-file pairs
    /// joined in a tree (a parent and children that each import the other).
    pub ring: Option<Vec<String>>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ring {
            Some(ring) => writeln!(f, "{} files, with the ring {}:", self.files.len(), ring.join(" -> "))?,
            None => writeln!(f, "{} files, only two-file pairs joined in a tree:", self.files.len())?,
        }
        for (file, to) in &self.edges {
            writeln!(f, "  {file} -> {}", to.join(", "))?;
        }
        Ok(())
    }
}

/// Reads every `.rs` file under `src` and builds its import graph.
pub fn graph_of(src: &Path) -> Result<Graph> {
    let mut files = Vec::new();
    collect_rs(src, src, &mut files)?;
    let known: BTreeSet<String> = files.iter().cloned().collect();
    let has_lib = known.contains("lib.rs");
    let mut graph = Graph::default();
    for file in &files {
        if is_excluded(file) || (has_lib && file == "main.rs") || file.starts_with("bin/") {
            continue;
        }
        let path = src.join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("could not read {}", path.display()))?;
        let module = module_of(file);
        let mut to = BTreeSet::new();
        for found in paths_in(&text) {
            let Some(target) = resolve(&known, &module, &found) else { continue };
            let reexports_child = found.pub_use
                && found.inline_depth == 0
                && module_of(&target).len() == module.len() + 1
                && module_of(&target).starts_with(&module);
            if target != *file && !is_excluded(&target) && !reexports_child {
                to.insert(target);
            }
        }
        graph.edges.insert(file.clone(), to);
    }
    Ok(graph)
}

/// The crate's own error catalogue, which the rule allows to be named by all.
fn is_excluded(file: &str) -> bool {
    file == "errors.rs" || file == "errors/mod.rs"
}

fn collect_rs(src: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("could not list {}", dir.display()))?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        paths.push(entry.with_context(|| format!("could not list {}", dir.display()))?.path());
    }
    paths.sort();
    for path in paths {
        if path.is_dir() {
            collect_rs(src, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(src).context("a listed file lies below the listed folder")?;
            let parts: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            out.push(parts.join("/"));
        }
    }
    Ok(())
}

/// The module path a file defines: `lib.rs` is `[]`, `a/mod.rs` and `a.rs`
/// are `[a]`, `a/b.rs` is `[a, b]`.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.split('/').map(str::to_owned).collect();
    let last = parts.pop().unwrap_or_default();
    match last.as_str() {
        "mod.rs" => {}
        "lib.rs" | "main.rs" if parts.is_empty() => {}
        name => parts.push(name.trim_end_matches(".rs").to_owned()),
    }
    parts
}

/// The file that defines `module`, if the tree has one.
fn file_of(known: &BTreeSet<String>, module: &[String]) -> Option<String> {
    if module.is_empty() {
        return ["lib.rs", "main.rs"].iter().find(|f| known.contains(**f)).map(|f| (*f).to_owned());
    }
    let base = module.join("/");
    [format!("{base}.rs"), format!("{base}/mod.rs")].into_iter().find(|f| known.contains(f))
}

/// One path found in a file's code.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FoundPath {
    /// The segments as written, from the first (`crate`, `super`, `self` or a name).
    segments: Vec<String>,
    /// The inline modules (`mod tests { .. }`) the path sits in, outermost first.
    inline: Vec<String>,
    /// How many inline modules deep it is (`inline.len()`, kept for clarity at the use site).
    inline_depth: usize,
    /// Whether it is part of a `pub use` (of any `pub(..)` visibility).
    pub_use: bool,
}

/// Resolves a found path, written in `module`, to the file it imports.
fn resolve(known: &BTreeSet<String>, module: &[String], found: &FoundPath) -> Option<String> {
    let mut here: Vec<String> = module.iter().chain(&found.inline).cloned().collect();
    let mut rest = found.segments.as_slice();
    let absolute: Vec<String> = match rest.first().map(String::as_str) {
        Some("crate") => rest[1..].to_vec(),
        Some("self" | "super") => {
            if rest[0] == "self" {
                rest = &rest[1..];
            }
            while rest.first().is_some_and(|s| s == "super") {
                here.pop()?;
                rest = &rest[1..];
            }
            here.into_iter().chain(rest.iter().cloned()).collect()
        }
        // A relative path counts only when it names a child module with a
        // file; otherwise it is an extern crate, a type or a variant.
        Some(first) => {
            let child: Vec<String> = here.iter().cloned().chain([first.to_owned()]).collect();
            file_of(known, &child)?;
            here.into_iter().chain(rest.iter().cloned()).collect()
        }
        None => return None,
    };
    (0..=absolute.len()).rev().find_map(|k| file_of(known, &absolute[..k]))
}

/// A token of Rust source, as far as paths need: identifiers and the
/// punctuation that shapes paths and blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Splits source into tokens, dropping comments (doc comments too: an
/// intra-doc link is not an import), string and char literals, and lifetimes.
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            _ if c.is_whitespace() => i += 1,
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            '"' => i = skip_string(&chars, i + 1),
            'r' | 'b' if raw_string_start(&chars, i).is_some() => {
                let (hashes, quote) = raw_string_start(&chars, i).unwrap_or_default();
                i = skip_raw_string(&chars, quote + 1, hashes);
            }
            'b' if next == Some('"') => i = skip_string(&chars, i + 2),
            'b' if next == Some('\'') => i = skip_char(&chars, i + 1),
            '\'' => i = skip_char(&chars, i),
            ':' if next == Some(':') => {
                out.push(Token::PathSep);
                i += 2;
            }
            _ if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let mut word: String = chars[start..i].iter().collect();
                // A raw identifier: `r#type` is the name `type`.
                if word == "r" && chars.get(i) == Some(&'#') {
                    let start = i + 1;
                    i = start;
                    while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                        i += 1;
                    }
                    word = chars[start..i].iter().collect();
                }
                out.push(Token::Ident(word));
            }
            _ => {
                out.push(Token::Punct(c));
                i += 1;
            }
        }
    }
    out
}

/// Past the closing quote of a string whose body starts at `i`.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// `r"`, `r#"`, `br##"`: the number of hashes and the index of the quote.
fn raw_string_start(chars: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    // `r` must begin a token, not end an identifier such as `for`.
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|c| **c == '#').count();
    (chars.get(j + hashes) == Some(&'"')).then_some((hashes, j + hashes))
}

fn skip_raw_string(chars: &[char], mut i: usize, hashes: usize) -> usize {
    while i < chars.len() {
        if chars[i] == '"' && chars[i + 1..].iter().take(hashes).filter(|c| **c == '#').count() == hashes {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// At a `'`: past a char literal (`'a'`, `'\n'`, `'\u{1F600}'`), or past the
/// quote of a lifetime (whose name then reads as a harmless identifier).
fn skip_char(chars: &[char], i: usize) -> usize {
    match chars.get(i + 1) {
        Some('\\') => {
            let mut j = i + 2;
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            j + 1
        }
        Some(_) if chars.get(i + 2) == Some(&'\'') => i + 3,
        _ => i + 1,
    }
}

/// Every path in `text` that may name a module of the crate, with where it sits.
fn paths_in(text: &str) -> Vec<FoundPath> {
    let toks = tokens(text);
    let mut out = Vec::new();
    // Inline modules: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Token::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Token::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Token::Ident(word) if word == "mod" => {
                if let (Some(Token::Ident(name)), Some(Token::Punct('{'))) = (toks.get(i + 1), toks.get(i + 2)) {
                    inline.push((name.clone(), depth + 1));
                    depth += 1;
                    i += 3;
                } else {
                    i += 1;
                }
            }
            Token::Ident(word) if word == "use" => {
                let pub_use = is_pub_before(&toks, i);
                i += 1;
                // `use ::extern_crate::..` names no module of the crate.
                if toks.get(i) == Some(&Token::PathSep) {
                    i += 1;
                    skip_path(&toks, &mut i);
                    continue;
                }
                let mut trees = Vec::new();
                use_tree(&toks, &mut i, Vec::new(), &mut trees);
                for segments in trees {
                    out.push(FoundPath {
                        segments,
                        inline: inline.iter().map(|(n, _)| n.clone()).collect(),
                        inline_depth: inline.len(),
                        pub_use,
                    });
                }
            }
            Token::Ident(_) if matches!(toks.get(i + 1), Some(Token::PathSep)) => {
                // A path in code: not after `::` (then it is the tail of
                // another path) and not after `$` (a macro's `$crate`).
                let after_sep_or_dollar = i > 0 && matches!(toks[i - 1], Token::PathSep | Token::Punct('$'));
                if after_sep_or_dollar {
                    i += 1;
                    continue;
                }
                let mut trees = Vec::new();
                use_tree(&toks, &mut i, Vec::new(), &mut trees);
                for segments in trees {
                    out.push(FoundPath {
                        segments,
                        inline: inline.iter().map(|(n, _)| n.clone()).collect(),
                        inline_depth: inline.len(),
                        pub_use: false,
                    });
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// Whether the `use` at `at` has a `pub` or `pub(..)` before it.
fn is_pub_before(toks: &[Token], at: usize) -> bool {
    let word = |t: &Token, w: &str| matches!(t, Token::Ident(x) if x == w);
    match at.checked_sub(1).map(|j| &toks[j]) {
        Some(t) if word(t, "pub") => true,
        Some(Token::Punct(')')) => {
            let open = toks[..at].iter().rposition(|t| *t == Token::Punct('('));
            open.and_then(|o| o.checked_sub(1)).is_some_and(|p| word(&toks[p], "pub"))
        }
        _ => false,
    }
}

/// Moves past a path's segments without recording it.
fn skip_path(toks: &[Token], i: &mut usize) {
    let mut ignored = Vec::new();
    use_tree(toks, i, Vec::new(), &mut ignored);
}

/// Reads a path or use tree at `i` (`a::b`, `a::{b, c::{self, d}}`, `a::*`,
/// `a as b`), appending each full path below `prefix` to `out`.
fn use_tree(toks: &[Token], i: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    loop {
        match toks.get(*i) {
            Some(Token::Ident(word)) => {
                // `{self}` in a group names the prefix itself.
                if word != "self" || prefix.is_empty() {
                    prefix.push(word.clone());
                }
                *i += 1;
            }
            Some(Token::Punct('{')) => {
                *i += 1;
                loop {
                    match toks.get(*i) {
                        Some(Token::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Token::Punct(',')) => *i += 1,
                        None => return,
                        Some(_) => {
                            let before = *i;
                            use_tree(toks, i, prefix.clone(), out);
                            if *i == before {
                                *i += 1;
                            }
                        }
                    }
                }
            }
            Some(Token::Punct('*')) => {
                *i += 1;
                break;
            }
            _ => break,
        }
        match toks.get(*i) {
            Some(Token::PathSep) => *i += 1,
            Some(Token::Ident(word)) if word == "as" => {
                *i += 2;
                break;
            }
            _ => break,
        }
    }
    if !prefix.is_empty() {
        out.push(prefix);
    }
}

/// The strongly connected components of more than two files (Tarjan's
/// algorithm), each sorted, in the order of their first file.
pub fn circles(graph: &Graph) -> Vec<Circle> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, node: &'a str) {
        let n = w.index.len();
        w.index.insert(node, n);
        w.low.insert(node, n);
        w.stack.push(node);
        w.on_stack.insert(node);
        let graph = w.graph;
        for next in graph.edges.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !w.index.contains_key(next) {
                visit(w, next);
                let low = w.low[node].min(w.low[next]);
                w.low.insert(node, low);
            } else if w.on_stack.contains(next) {
                let low = w.low[node].min(w.index[next]);
                w.low.insert(node, low);
            }
        }
        if w.low[node] == w.index[node] {
            let mut component = Vec::new();
            while let Some(top) = w.stack.pop() {
                w.on_stack.remove(top);
                component.push(top.to_owned());
                if top == node {
                    break;
                }
            }
            w.found.push(component);
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.edges.keys() {
        if !walk.index.contains_key(node.as_str()) {
            visit(&mut walk, node);
        }
    }
    let mut out: Vec<Circle> = walk
        .found
        .into_iter()
        .filter(|c| c.len() > 2)
        .map(|mut files| {
            files.sort();
            let members: BTreeSet<&String> = files.iter().collect();
            let edges = files
                .iter()
                .map(|f| (f.clone(), graph.edges[f].iter().filter(|t| members.contains(t)).cloned().collect()))
                .collect();
            let ring = ring_in(&edges);
            Circle { files, edges, ring }
        })
        .collect();
    out.sort_by(|a, b| a.files.cmp(&b.files));
    out
}

/// A ring of more than two files in one strongly connected component's
/// `edges`, if there is one. A one-way edge `a -> b` closes one with the
/// shortest way back from `b` to `a` (which cannot be the edge itself). When
/// every edge goes both ways, a ring exists exactly when the pairs do not
/// form a tree, and a walk that meets a file twice finds it.
fn ring_in(edges: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    let imports = |a: &str, b: &str| edges.get(a).is_some_and(|to| to.iter().any(|t| t == b));
    for (a, to) in edges {
        for b in to.iter().filter(|b| !imports(b, a)) {
            // Breadth-first from b back to a.
            let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([b.as_str()]);
            while let Some(at) = queue.pop_front() {
                if at == a {
                    let mut back = vec![a.clone()];
                    let mut step = a.as_str();
                    while step != b {
                        step = came_from[step];
                        back.push(step.to_owned());
                    }
                    back.push(a.clone());
                    // back is a <- ... <- b <- a read backwards: a -> b -> ... -> a.
                    back.reverse();
                    return Some(back);
                }
                for next in edges.get(at).into_iter().flatten() {
                    if next != b && !came_from.contains_key(next.as_str()) {
                        came_from.insert(next, at);
                        queue.push_back(next);
                    }
                }
            }
        }
    }
    // Every edge goes both ways: a depth-first walk of the pairs.
    let start = edges.keys().next()?;
    let mut parent: BTreeMap<&str, &str> = BTreeMap::from([(start.as_str(), "")]);
    let mut stack = vec![start.as_str()];
    while let Some(at) = stack.pop() {
        for next in edges.get(at).into_iter().flatten() {
            if parent.get(at) == Some(&next.as_str()) {
                continue;
            }
            if parent.contains_key(next.as_str()) {
                // Two tree paths meet: the ring is at -> .. -> common <- .. <- next.
                let (mut from_at, mut from_next) = (path_to_root(&parent, at), path_to_root(&parent, next));
                while from_at.len() > 1
                    && from_next.len() > 1
                    && from_at[from_at.len() - 2] == from_next[from_next.len() - 2]
                {
                    from_at.pop();
                    from_next.pop();
                }
                // from_at: at .. common; from_next: next .. common.
                from_next.pop();
                from_next.reverse();
                let mut ring = from_at;
                ring.extend(from_next);
                ring.push(ring[0].clone());
                return Some(ring);
            }
            parent.insert(next, at);
            stack.push(next);
        }
    }
    None
}

/// The walk's path from `n` up to its start, `n` first.
fn path_to_root<'a>(parent: &BTreeMap<&'a str, &'a str>, mut n: &'a str) -> Vec<String> {
    let mut path = vec![n.to_owned()];
    while let Some(up) = parent.get(n).copied().filter(|u| !u.is_empty()) {
        path.push(up.to_owned());
        n = up;
    }
    path
}

/// The circles of each app below a workspace `root`: (app's src, its circles).
pub fn app_circles(root: &Path) -> Result<Vec<(String, Vec<Circle>)>> {
    APP_SOURCES
        .iter()
        .map(|src| {
            let graph = graph_of(&root.join(src)).with_context(|| format!("could not read the imports of {src}"))?;
            Ok(((*src).to_owned(), circles(&graph)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` (path below src, contents) into a fresh `src/` and
    /// returns the circles found there.
    fn circles_of(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        for (path, text) in files {
            let path = src.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        circles(&graph_of(&src).unwrap()).into_iter().map(|c| c.files).collect()
    }

    fn edges_of(files: &[(&str, &str)], from: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        for (path, text) in files {
            let path = src.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        graph_of(&src).unwrap().edges[from].iter().cloned().collect()
    }

    #[test]
    fn a_ring_of_three_files_is_a_circle() {
        let found = circles_of(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "pub fn f() -> crate::c::C { todo!() }"),
            ("c.rs", "use crate::{a::A, lib_item}; pub struct C;"),
        ]);
        assert_eq!(found, vec![vec!["a.rs".to_owned(), "b.rs".into(), "c.rs".into()]]);
    }

    #[test]
    fn each_component_names_a_ring_or_says_it_has_only_pairs() {
        let rings = |files: &[(&str, &str)]| -> Vec<Option<Vec<String>>> {
            let dir = tempfile::tempdir().unwrap();
            let src = dir.path().join("src");
            for (path, text) in files {
                let path = src.join(path);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, text).unwrap();
            }
            circles(&graph_of(&src).unwrap()).into_iter().map(|c| c.ring).collect()
        };
        let one_way = rings(&[
            ("lib.rs", ""),
            ("a.rs", "use crate::b::B;"),
            ("b.rs", "use crate::c::C;"),
            ("c.rs", "use crate::a::A;"),
        ]);
        assert_eq!(one_way, vec![Some(["a.rs", "b.rs", "c.rs", "a.rs"].map(String::from).to_vec())]);
        // A parent that calls its children, each of which uses the parent's types.
        let star = rings(&[
            ("lib.rs", "pub mod d;"),
            ("d/mod.rs", "mod x; mod y; pub struct T; fn f() { x::go(); y::go(); }"),
            ("d/x.rs", "use super::T;"),
            ("d/y.rs", "use super::T;"),
        ]);
        assert_eq!(star, vec![None]);
        let triangle_of_pairs = rings(&[
            ("lib.rs", ""),
            ("a.rs", "use crate::{b::B, c::C};"),
            ("b.rs", "use crate::{a::A, c::C};"),
            ("c.rs", "use crate::{a::A, b::B};"),
        ]);
        let ring = triangle_of_pairs[0].as_ref().expect("three mutual pairs in a triangle are a ring");
        assert_eq!(ring.len(), 4);
        assert_eq!(ring.first(), ring.last());
    }

    #[test]
    fn a_chain_and_a_pair_are_not_circles() {
        let found = circles_of(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
            ("a.rs", "use crate::b::B;"),
            ("b.rs", "use crate::a::A; use crate::c::C;"),
            ("c.rs", "pub struct C;"),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn the_errors_catalogue_closes_no_circle() {
        let found = circles_of(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod errors;"),
            ("a.rs", "use crate::errors::E; use crate::b::B;"),
            ("b.rs", "use crate::errors::E;"),
            ("errors.rs", "use crate::a::A;"),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_parents_reexports_of_its_children_are_the_map() {
        let files = [
            ("lib.rs", "pub mod w;"),
            ("w/mod.rs", "mod one; mod two; pub use one::One; pub(crate) use self::two::Two; pub struct Shared;"),
            ("w/one.rs", "use super::Shared; use super::two::Two;"),
            ("w/two.rs", "use super::Shared; use crate::w::one::One;"),
        ];
        assert!(edges_of(&files, "w/mod.rs").is_empty());
        assert_eq!(edges_of(&files, "w/one.rs"), ["w/mod.rs", "w/two.rs"]);
        // The parent is not an import of its children's ring, so one.rs and
        // two.rs are a pair, not a circle of three.
        assert!(circles_of(&files).is_empty());
    }

    #[test]
    fn a_parent_that_uses_a_child_privately_imports_it() {
        let files = [
            ("lib.rs", "pub mod w;"),
            ("w/mod.rs", "mod one; mod two; use one::run; pub struct Shared;"),
            ("w/one.rs", "use super::two::Two; pub fn run() {}"),
            ("w/two.rs", "use super::Shared;"),
        ];
        assert_eq!(edges_of(&files, "w/mod.rs"), ["w/one.rs"]);
        assert_eq!(circles_of(&files), vec![vec!["w/mod.rs".to_owned(), "w/one.rs".into(), "w/two.rs".into()]]);
    }

    #[test]
    fn paths_resolve_to_the_longest_file() {
        let files = [
            ("lib.rs", "pub mod a; pub mod d; pub struct Root;"),
            ("a/mod.rs", "pub mod b;"),
            ("a/b.rs", "pub struct Item;"),
            ("d.rs", "fn f() { crate::a::b::Item; crate::a::Other; crate::Root; }"),
        ];
        assert_eq!(edges_of(&files, "d.rs"), ["a/b.rs", "a/mod.rs", "lib.rs"]);
    }

    #[test]
    fn super_in_an_inline_test_module_is_the_file_itself() {
        let files = [
            ("lib.rs", "pub mod a;"),
            ("a/mod.rs", "pub mod b;"),
            ("a/b.rs", "pub fn f() {}\n#[cfg(test)]\nmod tests { use super::*; use super::super::X; }"),
        ];
        assert_eq!(edges_of(&files, "a/b.rs"), ["a/mod.rs"]);
    }

    #[test]
    fn comments_strings_and_macros_name_no_import() {
        let files = [
            ("lib.rs", "pub mod a; pub mod b;"),
            (
                "a.rs",
                "//! See [crate::b::B].\n/* crate::b */ fn f() { let s = \"crate::b::B\"; let r = r#\"crate::b\"#; \
                 let c = '\"'; }\nmacro_rules! m { () => { $crate::b::B } }\nfn g<'a>(x: &'a str) {}",
            ),
            ("b.rs", "pub struct B;"),
        ];
        assert!(edges_of(&files, "a.rs").is_empty(), "{:?}", edges_of(&files, "a.rs"));
    }

    #[test]
    fn nested_use_groups_are_expanded() {
        let files = [
            ("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;"),
            ("a.rs", "use crate::{b::{self, B}, c::{C as Sea, *}};\nuse std::io::{self, Read};"),
            ("b.rs", ""),
            ("c.rs", ""),
            ("d.rs", ""),
        ];
        assert_eq!(edges_of(&files, "a.rs"), ["b.rs", "c.rs"]);
    }

    #[test]
    fn main_beside_a_library_is_another_crate() {
        let files = [("lib.rs", "pub mod a;"), ("a.rs", ""), ("main.rs", "use crate::a::A;")];
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        for (path, text) in files {
            std::fs::write(src.join(path), text).unwrap();
        }
        assert!(!graph_of(&src).unwrap().edges.contains_key("main.rs"));
    }

    /// Issue 24's rule, on this workspace's own apps.
    #[test]
    fn apps_have_no_import_circles() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for (src, found) in app_circles(root).unwrap() {
            let listing: Vec<String> = found.iter().map(ToString::to_string).collect();
            assert!(found.is_empty(), "{src} has import circles of more than two files:\n{}", listing.join("\n"));
        }
    }
}
