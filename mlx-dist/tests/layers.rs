//! The layers of `mlx-dist` point one way (issue 40), checked on the source
//! tree. From the bottom:
//!
//! 0. the root's leaves: `error`, `wire` (the frame layout), `reduce`,
//!    `report`, `group` (the handle every backend implements), `stats` (the
//!    bytes it hands to collectives);
//! 1. `config/` (the environment, host files, Slurm);
//! 2. `transports/` (links, handshake, TCP, TLS, QUIC, shared memory, MPI);
//! 3. `mesh/` (the connected mesh, liveness, membership);
//! 4. `collectives/` (the graph primitives and the algorithms over a mesh);
//! 5. `launch/`;
//!
//! and the crate root (`lib.rs`, `local.rs`) above them all, wiring them
//! together (with the conformance specifications, which run whole worlds). A module imports only its own layer or lower ones, so (for
//! example) nothing under `transports/` reaches `mesh/`, `collectives/` or
//! `launch/`. And no module imports another that imports it back, within a
//! layer too (the cycles cut in issue 40: config and slurm, mesh and
//! liveness, the launcher's agent, check, remote and supervise).
//!
//! Imports are the paths that start at `crate::`, `super::` or `self::`,
//! grouped ones (`use crate::{a::b, c}`) included, resolved to the module
//! they name; names the crate root re-exports (`crate::Config`) count as
//! their module's. Comments, string literals and `#[cfg(test)]` code
//! (test modules, and files mounted only under it) are left out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

type Module = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of `src` that can make a path, with their lines: comments,
/// string and character literals dropped (so text in them is never a path).
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let skip_to = |i: &mut usize, line: &mut usize, end: &dyn Fn(usize) -> Option<usize>| {
        while *i < c.len() {
            if let Some(n) = end(*i) {
                *i += n;
                return;
            }
            if c[*i] == '\n' {
                *line += 1;
            }
            *i += 1;
        }
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            i += 2;
            skip_to(&mut i, &mut line, &|j| {
                (c[j] == '*' && c.get(j + 1) == Some(&'/')).then_some(2)
            });
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            i += if ch == 'b' { 2 } else { 1 };
            while i < c.len() && c[i] != '"' {
                if c[i] == '\n' {
                    line += 1;
                }
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if (ch == 'r'
            && (next == Some('"')
                || (next == Some('#') && matches!(c.get(i + 2), Some('"' | '#')))))
            || (ch == 'b' && next == Some('r') && matches!(c.get(i + 2), Some('"' | '#')))
        {
            // r"…", r#"…"#, br"…"
            let mut j = i + 1;
            if c[j] == 'r' {
                j += 1;
            }
            let hashes = c[j..].iter().take_while(|&&h| h == '#').count();
            i = j + hashes + 1;
            skip_to(&mut i, &mut line, &|k| {
                (c[k] == '"' && (0..hashes).all(|h| c.get(k + 1 + h) == Some(&'#')))
                    .then_some(1 + hashes)
            });
        } else if ch == '\'' {
            // A character literal, or a lifetime (whose name follows).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::Sep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// `toks` without the items under `#[cfg(test)]`, and the names of the
/// modules mounted only under it (`#[cfg(test)] mod tests;`).
fn without_tests(toks: Vec<(Tok, usize)>) -> (Vec<(Tok, usize)>, Vec<String>) {
    let attr: Vec<Tok> = ["#", "[", "cfg", "(", "test", ")", "]"]
        .iter()
        .map(|s| match s.chars().next().unwrap() {
            c if c.is_alphanumeric() => Tok::Ident(s.to_string()),
            c => Tok::Punct(c),
        })
        .collect();
    let (mut out, mut test_mods, mut i) = (Vec::new(), Vec::new(), 0);
    while i < toks.len() {
        let is_attr = toks.len() >= i + attr.len()
            && toks[i..i + attr.len()].iter().map(|t| &t.0).eq(attr.iter());
        if !is_attr {
            out.push(toks[i].clone());
            i += 1;
            continue;
        }
        i += attr.len();
        let mut depth = 0;
        while i < toks.len() {
            match &toks[i].0 {
                Tok::Ident(m) if m == "mod" && depth == 0 => {
                    if let (Some((Tok::Ident(name), _)), Some((Tok::Punct(';'), _))) =
                        (toks.get(i + 1), toks.get(i + 2))
                    {
                        test_mods.push(name.clone());
                    }
                }
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                Tok::Punct(';') if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
    }
    (out, test_mods)
}

/// The paths of a `use` tree or path expression at `toks[*i]` (just after
/// a `::`), each appended to `prefix`, with their lines.
fn paths_from(
    toks: &[(Tok, usize)],
    i: &mut usize,
    prefix: Module,
    out: &mut Vec<(Module, usize)>,
) {
    let mut path = prefix;
    while *i < toks.len() {
        match &toks[*i].0 {
            Tok::Ident(s) => {
                if s != "self" {
                    path.push(s.clone());
                }
                *i += 1;
                if toks.get(*i).map(|t| &t.0) != Some(&Tok::Sep) {
                    break;
                }
                *i += 1;
            }
            Tok::Punct('{') => {
                *i += 1;
                while *i < toks.len() && toks[*i].0 != Tok::Punct('}') {
                    paths_from(toks, i, path.clone(), out);
                    // Past `as name` and the comma.
                    while *i < toks.len() && !matches!(toks[*i].0, Tok::Punct(',' | '}')) {
                        *i += 1;
                    }
                    if toks.get(*i).map(|t| &t.0) == Some(&Tok::Punct(',')) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            _ => break,
        }
    }
    let line = toks.get(i.saturating_sub(1)).map_or(0, |t| t.1);
    out.push((path, line));
}

/// Every path in `toks` that starts at `crate`, `super` or `self`, made
/// absolute from module `here`, with its line.
fn absolute_paths(toks: &[(Tok, usize)], here: &Module) -> Vec<(Module, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let starts = matches!(&toks[i].0, Tok::Ident(s) if s == "crate" || s == "super" || s == "self")
            && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Sep)
            && (i == 0 || toks[i - 1].0 != Tok::Sep);
        if !starts {
            i += 1;
            continue;
        }
        let mut base = here.clone();
        while let Some((Tok::Ident(s), _)) = toks.get(i) {
            match s.as_str() {
                "crate" => base.clear(),
                "super" => {
                    base.pop();
                }
                "self" => {}
                _ => break,
            }
            i += 2; // the keyword and its `::`
        }
        paths_from(toks, &mut i, base, &mut out);
    }
    out
}

/// The module of a file under `src/` (`config/slurm/mod.rs` is `config::slurm`).
fn module_of(rel: &str) -> Module {
    let mut m: Module = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
        m.pop();
    }
    m
}

/// The layer of a module (see the file's doc); `None` for the crate root,
/// `local` and the collectives' conformance specifications
/// (`collectives::spec`, which run whole worlds through `local`): they sit
/// above every layer.
fn layer(m: &[String]) -> Option<usize> {
    if m.starts_with(&["collectives".to_string(), "spec".to_string()]) {
        return None;
    }
    Some(match m.first()?.as_str() {
        "error" | "wire" | "reduce" | "report" | "group" | "stats" => 0,
        "config" => 1,
        "transports" => 2,
        "mesh" => 3,
        "collectives" => 4,
        "launch" => 5,
        _ => return None,
    })
}

/// The imports of each library module of the crate whose files are
/// `files` (path under `src/`, text), resolved to modules, with lines.
fn imports(files: &[(String, String)]) -> BTreeMap<Module, Vec<(Module, usize)>> {
    let mut parsed = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    for (rel, src) in files {
        let m = module_of(rel);
        let (toks, test_mods) = without_tests(tokenize(src));
        for t in test_mods {
            let mut child = m.clone();
            child.push(t);
            test_only.insert(child);
        }
        parsed.insert(m, toks);
    }
    let modules: BTreeSet<Module> = parsed.keys().cloned().collect();
    let resolve = |p: &Module| -> Module {
        (0..=p.len())
            .rev()
            .map(|k| p[..k].to_vec())
            .find(|m| modules.contains(m))
            .unwrap_or_default()
    };
    // What the root re-exports: `pub use a::b::{c, d}` names `c` and `d` after a::b.
    let mut reexports: HashMap<String, Module> = HashMap::new();
    if let Some(root) = parsed.get(&Vec::new()) {
        for at in 1..root.len() {
            if root[at - 1].0 == Tok::Ident("pub".into()) && root[at].0 == Tok::Ident("use".into())
            {
                let mut paths = Vec::new();
                paths_from(root, &mut (at + 1), Vec::new(), &mut paths);
                for (p, _) in paths {
                    if let Some(name) = p.last() {
                        reexports.insert(name.clone(), resolve(&p));
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (m, toks) in &parsed {
        let testing = test_only.iter().any(|t| m.starts_with(t));
        if testing || m.first().is_some_and(|s| s == "bin") {
            continue;
        }
        let mut targets = Vec::new();
        for (p, line) in absolute_paths(toks, m) {
            let mut t = resolve(&p);
            if t.is_empty()
                && let Some(r) = p.first().and_then(|name| reexports.get(name))
            {
                t = r.clone();
            }
            if &t != m {
                targets.push((t, line));
            }
        }
        out.insert(m.clone(), targets);
    }
    out
}

/// What breaks the rules: imports upward, and import cycles.
fn violations(files: &[(String, String)]) -> Vec<String> {
    let graph = imports(files);
    let file_of: HashMap<Module, &String> = files.iter().map(|(r, _)| (module_of(r), r)).collect();
    let name = |m: &Module| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.join("::")
        }
    };
    let mut found = Vec::new();
    for (m, targets) in &graph {
        let Some(lm) = layer(m) else { continue };
        for (t, line) in targets {
            if layer(t).is_none_or(|lt| lt > lm) {
                found.push(format!(
                    "src/{}:{line}: {} imports {}, a higher layer",
                    file_of[m],
                    name(m),
                    name(t)
                ));
            }
        }
    }
    found.dedup(); // a grouped import names one module several times
    // Cycles: Tarjan's strongly connected components of more than one module.
    let ids: Vec<&Module> = graph.keys().collect();
    let index_of: HashMap<&Module, usize> = ids.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let succ: Vec<Vec<usize>> = ids
        .iter()
        .map(|m| {
            graph[*m]
                .iter()
                .filter_map(|(t, _)| index_of.get(t).copied())
                .collect()
        })
        .collect();
    struct Tarjan<'a> {
        succ: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        sccs: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in &self.succ[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                    _ => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    self.sccs.push(scc);
                }
            }
        }
    }
    let n = ids.len();
    let mut t = Tarjan {
        succ: &succ,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        sccs: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    for scc in t.sccs {
        let mut names: Vec<String> = scc.iter().map(|&v| name(ids[v])).collect();
        names.sort();
        found.push(format!("an import cycle: {}", names.join(", ")));
    }
    found
}

fn read_tree(dir: &Path, rel: &str, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir.join(rel)).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let r = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if e.file_type().unwrap().is_dir() {
            read_tree(dir, &r, out);
        } else if name.ends_with(".rs") {
            out.push((r, std::fs::read_to_string(e.path()).unwrap()));
        }
    }
}

#[test]
fn the_layers_point_one_way_and_nothing_imports_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_tree(&src, "", &mut files);
    let g = imports(&files);
    // The checker sees the tree: the folders exist and their imports are found.
    let tcp = g
        .get(&module_of("transports/tcp.rs"))
        .expect("src/transports/tcp.rs");
    assert!(
        tcp.iter()
            .any(|(t, _)| t == &module_of("transports/handshake.rs"))
    );
    assert!(g.contains_key(&module_of("config/slurm.rs")));
    let found = violations(&files);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

fn tree(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(r, s)| (r.to_string(), s.to_string()))
        .collect()
}

/// The smallest crate that keeps the rules, to break one at a time.
const ROOT: &str = "mod transports; mod collectives; mod launch; mod config;
    pub use collectives::{all_sum, spec::specs};";

#[test]
fn an_upward_import_in_any_form_is_found() {
    let upward = [
        "use crate::collectives::ring::Lane;",
        "use crate::{config::Config, collectives::ring};",
        "use super::super::launch::LaunchSpec;",
        "fn f() { crate::all_sum(); }",
        "use crate::{launch as l};",
    ];
    for import in upward {
        let files = tree(&[
            ("lib.rs", ROOT),
            ("collectives/mod.rs", "pub mod ring; pub fn all_sum() {}"),
            ("collectives/ring.rs", "use crate::transports::tcp;"),
            ("launch/mod.rs", ""),
            ("config/mod.rs", ""),
            ("transports/mod.rs", "pub mod tcp; pub mod shm;"),
            ("transports/tcp.rs", "use crate::config::Config;"),
            ("transports/shm/mod.rs", import),
        ]);
        let found = violations(&files);
        assert_eq!(found.len(), 1, "{import}: {found:?}");
        assert!(
            found[0].starts_with("src/transports/shm/mod.rs:1: transports::shm imports "),
            "{found:?}"
        );
    }
}

#[test]
fn comments_strings_and_tests_are_not_imports() {
    let files = tree(&[
        ("lib.rs", ROOT),
        ("collectives/mod.rs", "pub mod ring;"),
        ("collectives/ring.rs", ""),
        ("launch/mod.rs", ""),
        ("config/mod.rs", ""),
        ("transports/mod.rs", "pub mod tcp;"),
        (
            "transports/tcp.rs",
            "// use crate::collectives::ring;\n/* crate::launch */ const S: &str = \"crate::launch::x\";
             const R: &str = r#\"crate::launch\"#;
             #[cfg(test)] mod tests { use crate::collectives::ring; }
             #[cfg(test)] mod more;",
        ),
        ("transports/tcp/more.rs", "use crate::launch::x;"),
    ]);
    assert_eq!(violations(&files), Vec::<String>::new());
}

#[test]
fn a_cycle_within_a_layer_is_found() {
    let files = tree(&[
        ("lib.rs", "mod launch;"),
        ("launch/mod.rs", "mod agent; mod supervise; mod check;"),
        ("launch/agent.rs", "use super::supervise::spawn_guarded;"),
        ("launch/supervise.rs", "use super::check::problems;"),
        ("launch/check.rs", "fn f() { super::agent::hostname(); }"),
    ]);
    assert_eq!(
        violations(&files),
        vec!["an import cycle: launch::agent, launch::check, launch::supervise".to_string()]
    );
}

#[test]
fn code_after_words_that_begin_like_raw_strings_is_read() {
    // `break`, `r#type` and `b'x'` open no string: the path after them counts.
    let files = tree(&[
        ("lib.rs", "mod transports; mod collectives;"),
        ("collectives/mod.rs", "pub mod ring;"),
        ("collectives/ring.rs", ""),
        ("transports/mod.rs", ""),
        (
            "transports/tcp.rs",
            "fn f() { loop { break; } let r#type = b'x'; crate::collectives::ring::run(); }",
        ),
    ]);
    assert_eq!(
        violations(&files),
        vec![
            "src/transports/tcp.rs:1: transports::tcp imports collectives::ring, a higher layer"
                .to_string()
        ]
    );
}
