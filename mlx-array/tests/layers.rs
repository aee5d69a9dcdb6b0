//! The layers of `mlx-array` point one way (issue 20), checked on the
//! source tree:
//!
//! - nothing under `src/backend/` imports the primitives (primitives call
//!   backends, never the reverse; shared kernel descriptions live in
//!   `backend/common`);
//! - the GPU backend (`backend/gpu/`, and its no-GPU stub) never reaches
//!   into the CPU backend, nor the CPU backend into the GPU one, and
//!   `backend/common` into neither;
//! - the GPU backend imports neither the arrays (`array`) nor the evaluator
//!   (`eval`): it runs what it is handed, and the planning that reads the
//!   graph (which elementwise chains fuse) sits beside the evaluator, which
//!   hands over plain descriptions (`backend::common::fusion::FusedChain`);
//! - memory (`memory/`) imports no backend: its accounting core is what the
//!   backends import, and a device backend registers there how to clear its
//!   pool;
//! - the settings (`settings.rs`) are a leaf: they import only the error
//!   type (what needs more than parsing a variable is checked where it is
//!   used);
//! - the kernel boundary is a leaf: `data.rs` (the data a kernel sees,
//!   `ArrayData` and `Operand`), what it stands on (`dtype`, `shape`,
//!   `error`, `memory`, `settings`) and `timing.rs` (the thread's current
//!   primitive and the GPU pass times, which the profile reads) import only
//!   each other, never the arrays, primitives, evaluator, devices, profile
//!   or backends above them;
//! - the backends import only that leaf (and their own modules): not the
//!   arrays, the evaluator, devices, primitives or the profile;
//! - no `cfg(feature = "gpu")` (in any form: `cfg`, `cfg_attr`, `cfg!`,
//!   `not(...)`) outside `src/backend/`: the no-GPU build mounts a stub
//!   instead.
//!
//! Paths are resolved, not grepped: `use crate::primitives::…`, grouped
//! `use crate::{primitives::…}`, `super::super::…`, `self::…`, `$crate::…`,
//! paths in expressions, names bound by an earlier `use`, the crate root's
//! re-exports (`crate::blas` is `backend::cpu::blas`), and every module's
//! (`backend::cpu::blas` is `backend::cpu::matmul::blas`): a path breaks a
//! rule if it does as written or where those `use`s lead it. Comments and
//! string literals are ignored.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// One finding: where, and which rule.
#[derive(Debug, Clone, PartialEq)]
struct Violation {
    file: String,
    line: usize,
    what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "src/{}:{}: {}", self.file, self.line, self.what)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    /// `::`
    Path,
    Punct(char),
}

/// Tokens with their line numbers; comments dropped, string literals kept
/// whole (so text inside them never looks like a path or an attribute).
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line) = (0, 1);
    let mut out = Vec::new();
    // A string body from `i` (just after the opening quote) to `"` followed
    // by `hashes` `#`s; escapes only when not raw.
    let string = |i: &mut usize, line: &mut usize, hashes: usize, raw: bool| -> String {
        let mut s = String::new();
        while *i < c.len() {
            if c[*i] == '\\' && !raw {
                s.push(c[*i]);
                if *i + 1 < c.len() {
                    s.push(c[*i + 1]);
                    if c[*i + 1] == '\n' {
                        *line += 1;
                    }
                }
                *i += 2;
                continue;
            }
            if c[*i] == '"' && (0..hashes).all(|k| c.get(*i + 1 + k) == Some(&'#')) {
                *i += 1 + hashes;
                return s;
            }
            if c[*i] == '\n' {
                *line += 1;
            }
            s.push(c[*i]);
            *i += 1;
        }
        s
    };
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            let at = line;
            i += 1;
            let s = string(&mut i, &mut line, 0, false);
            out.push((Tok::Str(s), at));
        } else if (ch == 'r' || ch == 'b')
            && matches!(
                (c.get(i + 1), c.get(i + 2)),
                (Some('"'), _) | (Some('#'), Some('"' | '#')) | (Some('r'), Some('"' | '#'))
            )
        {
            // r"…", r#"…"#, b"…", br"…", br#"…"#
            let at = line;
            let mut j = i + 1;
            let raw = ch == 'r' || c[j] == 'r';
            if c[j] == 'r' {
                j += 1;
            }
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            i = j + 1; // past the opening quote
            let s = string(&mut i, &mut line, hashes, raw);
            out.push((Tok::Str(s), at));
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1; // lifetime: its name follows as an identifier
            }
        } else if ch.is_alphanumeric() || ch == '_' || ch == '$' {
            let start = i;
            i += 1;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            out.push((Tok::Ident(word.trim_start_matches('$').to_string()), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// The module path of a file under `src/` (`backend/cpu/mod.rs` →
/// `backend::cpu`); `backend/no_gpu.rs` is mounted as `backend::gpu`.
fn module_of(rel: &str) -> Vec<String> {
    if rel == "backend/no_gpu.rs" {
        return vec!["backend".into(), "gpu".into()];
    }
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// One `use` tree expanded into (path, bound name, line).
fn parse_use(
    toks: &[(Tok, usize)],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>, usize)>,
) {
    let mut segs = prefix.clone();
    while *i < toks.len() {
        let (tok, line) = (&toks[*i].0, toks[*i].1);
        match tok {
            Tok::Path => *i += 1, // a leading `::`
            Tok::Punct('{') => {
                *i += 1;
                loop {
                    match toks.get(*i).map(|t| &t.0) {
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        None => return,
                        _ => parse_use(toks, i, segs.clone(), out),
                    }
                }
            }
            Tok::Punct('*') => {
                *i += 1;
                out.push((segs, None, line));
                return;
            }
            Tok::Ident(name) => {
                *i += 1;
                if name == "self" && segs.len() == prefix.len() && !segs.is_empty() {
                    // `a::{self, …}` names `a` itself.
                } else {
                    segs.push(name.clone());
                }
                match toks.get(*i).map(|t| &t.0) {
                    Some(Tok::Path) => *i += 1,
                    Some(Tok::Ident(kw)) if kw == "as" => {
                        let alias = match toks.get(*i + 1).map(|t| &t.0) {
                            Some(Tok::Ident(a)) => Some(a.clone()),
                            _ => None,
                        };
                        *i += 2;
                        out.push((segs, alias, line));
                        return;
                    }
                    _ => {
                        let bound = segs.last().cloned();
                        out.push((segs, bound, line));
                        return;
                    }
                }
            }
            _ => return,
        }
    }
}

/// Resolves `segs`, written in module `module`, to a path from the crate
/// root; `None` for paths that do not start at the crate (std, other crates).
fn resolve(
    segs: &[String],
    module: &[String],
    bindings: &HashMap<String, Vec<String>>,
    root_aliases: &HashMap<String, Vec<String>>,
    relative: bool,
) -> Option<Vec<String>> {
    let first = segs.first()?.as_str();
    let mut path: Vec<String> = match first {
        "crate" => segs[1..].to_vec(),
        "self" | "super" => {
            let mut base = module.to_vec();
            let mut k = 0;
            if segs[0] == "self" {
                k = 1;
            }
            while segs.get(k).map(String::as_str) == Some("super") {
                base.pop()?;
                k += 1;
            }
            base.extend_from_slice(&segs[k..]);
            base
        }
        _ => match bindings.get(first) {
            Some(target) => target.iter().chain(&segs[1..]).cloned().collect(),
            None if relative => module.iter().chain(segs).cloned().collect(),
            None => return None,
        },
    };
    // The crate root's re-exports: `crate::blas` is `backend::cpu::blas`.
    if let Some(target) = path.first().and_then(|f| root_aliases.get(f)) {
        path = target.iter().chain(&path[1..]).cloned().collect();
    }
    Some(path)
}

fn starts_with(path: &[String], prefix: &[&str]) -> bool {
    path.len() >= prefix.len() && path.iter().zip(prefix).all(|(a, b)| a == b)
}

/// The modules of the leaf under the kernels: the data a kernel sees, what
/// it is built from, and where the GPU puts its pass times for the profile.
/// They import only each other.
const LEAF: &[&str] = &[
    "data", "dtype", "shape", "error", "memory", "settings", "timing",
];

/// The rule a reference to `path` from `module` breaks, if any.
fn rule(module: &[String], path: &[String]) -> Option<&'static str> {
    let m: Vec<&str> = module.iter().map(String::as_str).collect();
    let target = path.first().map(String::as_str).unwrap_or("");
    if starts_with(path, &["primitives"]) && m.first() == Some(&"backend") {
        return Some(
            "a backend imports the primitives (they call the backends, never the reverse; \
             move the shared description to backend/common)",
        );
    }
    if m.starts_with(&["backend", "gpu"]) && starts_with(path, &["backend", "cpu"]) {
        return Some(
            "the GPU backend imports the CPU backend (move what both need to backend/common)",
        );
    }
    if m.starts_with(&["backend", "gpu"])
        && (starts_with(path, &["array"]) || starts_with(path, &["eval"]))
    {
        return Some(
            "the GPU backend imports the arrays or the evaluator (it runs what it is \
             handed: plan from the graph beside the evaluator, as eval::fusion does, and \
             pass a description from backend/common)",
        );
    }
    if m.starts_with(&["backend", "cpu"]) && starts_with(path, &["backend", "gpu"]) {
        return Some("the CPU backend imports the GPU backend");
    }
    if m.starts_with(&["backend", "common"])
        && (starts_with(path, &["backend", "cpu"]) || starts_with(path, &["backend", "gpu"]))
    {
        return Some("backend/common imports a backend (it is what both backends import)");
    }
    if m.first() == Some(&"memory") && starts_with(path, &["backend"]) {
        return Some(
            "memory imports a backend (backends import memory's accounting; a device \
             backend registers its pool's release there, and sees buffers only as \
             memory::DeviceAllocation)",
        );
    }
    if m == ["settings"] && !path.is_empty() && !matches!(path[0].as_str(), "error" | "settings") {
        return Some(
            "the settings import a module above them (they are a leaf: parse the variable \
             here, check what needs more where it is used)",
        );
    }
    if m.first().is_some_and(|f| LEAF.contains(f)) && !path.is_empty() && !LEAF.contains(&target) {
        return Some(
            "the kernel boundary's leaf (data, dtype, shape, error, memory, settings, timing) \
             imports a module above it (kernels read it; it knows nothing of arrays, primitives, the \
             evaluator, devices or backends)",
        );
    }
    if m.first() == Some(&"backend")
        && !path.is_empty()
        && target != "backend"
        && !LEAF.contains(&target)
    {
        return Some(
            "a backend imports a module above the kernel boundary (backends read only the \
             leaf: data, dtype, shape, error, memory accounting, settings, timing; what they need \
             from above is handed to them as an Operand or a kernel description)",
        );
    }
    None
}

/// The crate root's `pub use` re-exports, by the name they bind.
fn root_aliases(lib_rs: &str) -> HashMap<String, Vec<String>> {
    let toks = tokenize(lib_rs);
    let mut uses = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].0 == Tok::Ident("use".into()) {
            i += 1;
            parse_use(&toks, &mut i, vec![], &mut uses);
        } else {
            i += 1;
        }
    }
    uses.into_iter()
        .filter_map(|(path, bound, _)| {
            let path = if path.first().map(String::as_str) == Some("crate") {
                path[1..].to_vec()
            } else {
                path
            };
            Some((bound?, path))
        })
        .collect()
}

/// The modules' `use` declarations, by the path of the name each binds.
type Uses = HashMap<Vec<String>, Vec<String>>;

/// Every module's top-level `use` declarations (outside functions and
/// inline modules) that name something in the crate, by the path of the
/// name they bind: `pub use matmul::blas;` in `backend/cpu/mod.rs` makes
/// `backend::cpu::blas` stand for `backend::cpu::matmul::blas`. Private
/// ones count too (a module's children reach them through `super::`). The
/// crate root's are [`root_aliases`]. `files` are (path under `src/`,
/// text).
fn module_uses(files: &[(String, String)], root_aliases: &HashMap<String, Vec<String>>) -> Uses {
    let modules: Vec<Vec<String>> = files.iter().map(|(rel, _)| module_of(rel)).collect();
    let mut out = Uses::new();
    for (rel, src) in files {
        let module = module_of(rel);
        if module.is_empty() {
            continue;
        }
        let toks = tokenize(src);
        let (mut i, mut depth) = (0, 0usize);
        while i < toks.len() {
            match &toks[i].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth = depth.saturating_sub(1),
                Tok::Ident(w) if w == "use" && depth == 0 => {
                    i += 1;
                    let mut uses = Vec::new();
                    parse_use(&toks, &mut i, vec![], &mut uses);
                    for (segs, bound, _) in uses {
                        let Some(name) = bound else { continue };
                        // A relative path starts at a child module; others
                        // (std, rayon, …) leave the crate.
                        let first = segs[0].as_str();
                        let in_crate = matches!(first, "crate" | "self" | "super")
                            || modules.iter().any(|m| {
                                m.len() > module.len()
                                    && m.starts_with(&module)
                                    && m[module.len()] == first
                            });
                        let path = resolve(&segs, &module, &HashMap::new(), root_aliases, true);
                        let key: Vec<String> = module.iter().cloned().chain([name]).collect();
                        if let Some(path) = path.filter(|p| in_crate && *p != key) {
                            out.insert(key, path);
                        }
                    }
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// Where `path` leads through the modules' `use`s: the longest prefix one
/// binds replaced by what it stands for, again, at most 8 times (`use`s in
/// a cycle stop there).
fn through_uses(path: &[String], uses: &Uses) -> Vec<String> {
    let mut path = path.to_vec();
    for _ in 0..8 {
        let Some(k) = (1..=path.len())
            .rev()
            .find(|&k| uses.contains_key(&path[..k]))
        else {
            break;
        };
        path = uses[&path[..k]].iter().chain(&path[k..]).cloned().collect();
    }
    path
}

/// The rule `path` breaks from `module`, as written or where the modules'
/// `use`s lead it (then named).
fn broken(module: &[String], path: &[String], uses: &Uses) -> Option<String> {
    if let Some(why) = rule(module, path) {
        return Some(why.to_string());
    }
    let target = through_uses(path, uses);
    rule(module, &target)
        .map(|why| format!("{why} (through a `use`, it is `{}`)", target.join("::")))
}

/// Every violation in one file, `rel` being its path under `src/`.
fn check_source(
    rel: &str,
    src: &str,
    root_aliases: &HashMap<String, Vec<String>>,
    crate_uses: &Uses,
) -> Vec<Violation> {
    let toks = tokenize(src);
    let file_module = module_of(rel);
    let mut found = Vec::new();
    let mut report = |line: usize, what: String| {
        found.push(Violation {
            file: rel.to_string(),
            line,
            what,
        })
    };

    // cfg(feature = "gpu") in any form, outside the backends.
    if file_module.first().map(String::as_str) != Some("backend") {
        for w in toks.windows(3) {
            if w[0].0 == Tok::Ident("feature".into())
                && w[1].0 == Tok::Punct('=')
                && w[2].0 == Tok::Str("gpu".into())
            {
                report(
                    w[0].1,
                    "`feature = \"gpu\"` outside src/backend/ (call `backend::gpu`, which is a \
                     stub without the feature)"
                        .to_string(),
                );
            }
        }
    }

    let mut module = file_module.clone();
    // Brace depth at which each inline `mod name {` opened.
    let mut opened: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut bindings: HashMap<String, Vec<String>> = HashMap::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Ident(w) if w == "use" => {
                i += 1;
                let mut uses = Vec::new();
                parse_use(&toks, &mut i, vec![], &mut uses);
                for (segs, bound, line) in uses {
                    let Some(path) = resolve(&segs, &module, &bindings, root_aliases, true) else {
                        continue;
                    };
                    if let Some(why) = broken(&module, &path, crate_uses) {
                        // Reported here once, not again at each use of the name.
                        report(line, format!("`use {}`: {why}", segs.join("::")));
                    } else if let Some(b) = bound {
                        bindings.insert(b, path);
                    }
                }
            }
            Tok::Ident(w)
                if w == "mod"
                    && matches!(toks.get(i + 1), Some((Tok::Ident(_), _)))
                    && toks.get(i + 2).map(|t| &t.0) == Some(&Tok::Punct('{')) =>
            {
                if let Some((Tok::Ident(name), _)) = toks.get(i + 1) {
                    module.push(name.clone());
                }
                opened.push(depth);
                depth += 1;
                i += 3;
            }
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if opened.last() == Some(&depth) {
                    opened.pop();
                    module.pop();
                }
                i += 1;
            }
            Tok::Ident(first) if i == 0 || toks[i - 1].0 != Tok::Path => {
                // A path in an expression, a type or an attribute.
                let line = toks[i].1;
                let mut segs = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j).map(|t| &t.0) == Some(&Tok::Path) {
                    match toks.get(j + 1) {
                        Some((Tok::Ident(s), _)) => {
                            segs.push(s.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                if segs.len() > 1
                    && let Some(path) = resolve(&segs, &module, &bindings, root_aliases, false)
                    && let Some(why) = broken(&module, &path, crate_uses)
                {
                    report(line, format!("`{}`: {why}", segs.join("::")));
                }
                i = j;
            }
            _ => i += 1,
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_layers_point_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let rel = |p: &Path| {
        p.strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/")
    };
    let names: Vec<String> = files.iter().map(|p| rel(p)).collect();
    for expected in [
        "lib.rs",
        "backend/mod.rs",
        "backend/gpu/mod.rs",
        "backend/cpu/mod.rs",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "src/{expected} not found: the layer check would see nothing"
        );
    }
    let aliases = root_aliases(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let texts: Vec<(String, String)> = files
        .iter()
        .zip(&names)
        .map(|(path, name)| {
            let text = std::fs::read_to_string(path).expect("a source file");
            (name.clone(), text)
        })
        .collect();
    let uses = module_uses(&texts, &aliases);
    // The CPU backend's re-export of its BLAS module is seen.
    assert_eq!(
        through_uses(&aliases["blas"], &uses).join("::"),
        "backend::cpu::matmul::blas",
        "crate::blas does not lead to the BLAS module: the layer check misreads the tree"
    );
    let mut found = Vec::new();
    for (name, text) in &texts {
        found.extend(check_source(name, text, &aliases, &uses));
    }
    assert!(
        found.is_empty(),
        "{} reference(s) against the layers:\n{}",
        found.len(),
        found
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ------------------------------------------------ the checker on known input

fn aliases() -> HashMap<String, Vec<String>> {
    root_aliases(
        "pub use backend::cpu::blas;\npub use primitives::primitive_names;\n\
         pub use error::{Error, Result};\npub use data::{ArrayData, Operand};\n\
         pub use array::{Array, OutputSpec};\npub use eval::{Evaluable, eval};\n\
         pub use primitive::Primitive;\npub use dtype::{Bool8, Dtype};\n",
    )
}

fn lines(rel: &str, src: &str) -> Vec<usize> {
    check_source(rel, src, &aliases(), &Uses::new())
        .into_iter()
        .map(|v| v.line)
        .collect()
}

#[test]
fn finds_the_primitives_from_a_backend_in_every_form() {
    let src = r#"
use crate::primitives::elementwise::BinaryOp;
use crate::{Dtype, primitives::reduce::ReduceOp};
use crate::primitives;
fn f() {
    let op = crate::primitives::reduce::ReduceOp::Sum;
    let n = crate::primitive_names();
    let x = $crate::primitives::x::Y;
}
use super::super::super::primitives::rope::RopeSpec;
"#;
    assert_eq!(
        lines("backend/cpu/binary.rs", src),
        vec![2, 3, 4, 6, 7, 8, 10]
    );
    // From backend/mod.rs two `super`s would leave the crate; one reaches it.
    assert_eq!(
        lines(
            "backend/mod.rs",
            "use super::primitives::x;\nuse self::cpu::y;\n"
        ),
        vec![1]
    );
    assert_eq!(
        lines(
            "backend/gpu/mod.rs",
            "fn f() { super::super::primitives::a::b(); }"
        ),
        vec![1]
    );
}

#[test]
fn finds_the_cpu_backend_from_the_gpu_one() {
    let src = r#"
use crate::backend::cpu::loss::{LceArgs, chunk_cols};
use crate::backend::{common, cpu};
use super::super::cpu::rope::RopeSpec;
fn f() {
    crate::backend::cpu::copy_contiguous(&x);
    cpu::copy::copy_cast(&x, to);
    crate::blas::gemm();
}
"#;
    assert_eq!(
        lines("backend/gpu/rope.rs", src),
        // Line 7 goes through `cpu`, already reported where line 3 imports it.
        vec![2, 2, 3, 4, 6, 8]
    );
    // The stub is backend::gpu too; `super::cpu` from it is the CPU backend.
    assert_eq!(
        lines("backend/no_gpu.rs", "use super::cpu::loss::LceArgs;"),
        vec![1]
    );
    // A binding through the parent module, then a path through it.
    assert_eq!(
        lines(
            "backend/gpu/mod.rs",
            "use crate::backend;\nfn f() { backend::cpu::x(); }"
        ),
        vec![2]
    );
    // Allowed: common, the core, and the GPU's own modules.
    let fine = r#"
use crate::backend::common::loss::LceArgs;
use crate::data::ArrayData;
use crate::memory::accounting;
use super::codegen;
mod inner { use super::super::super::common::rope::RopeSpec; }
"#;
    assert_eq!(lines("backend/gpu/rope.rs", fine), Vec::<usize>::new());
}

#[test]
fn ignores_comments_strings_and_inline_modules_resolve() {
    let src = r##"
// use crate::primitives::x;
/* crate::backend::cpu::y /* nested */ crate::primitives::z */
const S: &str = "crate::primitives::x";
const R: &str = r#"use crate::backend::cpu::y;"#;
fn f<'a>(c: char) -> &'a str { if c == '"' { "" } else { "" } }
mod elementwise {
    use super::unavailable;
}
"##;
    assert_eq!(lines("backend/gpu/mod.rs", src), Vec::<usize>::new());
    // An inline module inside the CPU backend: `super::super` is `backend`.
    assert_eq!(
        lines(
            "backend/cpu/mod.rs",
            "mod a {\n use super::super::gpu::x;\n}\n"
        ),
        vec![2]
    );
}

#[test]
fn finds_gpu_feature_gates_outside_the_backends() {
    let src = r#"
#[cfg(feature = "gpu")]
fn a() {}
#[cfg(not(feature = "gpu"))]
fn b() {}
#[cfg_attr(all(feature = "gpu", test), allow(dead_code))]
fn c() { if cfg!(feature = "gpu") {} }
// #[cfg(feature = "gpu")] in a comment
const M: &str = "rebuild with feature = \"gpu\"";
#[cfg(feature = "conformance")]
fn d() {}
"#;
    assert_eq!(lines("eval.rs", src), vec![2, 4, 6, 7]);
    assert_eq!(lines("primitives/elementwise.rs", src).len(), 4);
    // backend/mod.rs chooses the stub: allowed there.
    assert_eq!(lines("backend/mod.rs", src), Vec::<usize>::new());
}

#[test]
fn finds_the_arrays_and_the_evaluator_from_the_gpu_backend() {
    let src = r#"
use crate::array::State;
use crate::{Array, Device, Dtype};
use crate::eval::fusion::Fusion;
use super::super::super::array;
fn f() {
    crate::eval::eval(x);
    let o: crate::OutputSpec = crate::Evaluable::collect_arrays(x, y);
}
mod inner { use super::super::super::super::eval; }
"#;
    // Line 3 twice: the arrays, and the device (above the leaf, see
    // `finds_what_a_backend_imports_above_the_leaf`).
    assert_eq!(
        lines("backend/gpu/fusion.rs", src),
        vec![2, 3, 3, 4, 5, 7, 8, 8, 10]
    );
    // The stub is the GPU backend too.
    assert_eq!(lines("backend/no_gpu.rs", "use crate::Array;"), vec![1]);
    // Allowed: the plain descriptions, the data a kernel reads, and the
    // names of the GPU's own modules and locals.
    let fine = r#"
use crate::backend::common::fusion::{FusedChain, StepInput};
use crate::{ArrayData, Dtype, Result};
use crate::data::ArrayData as Data;
fn f(eval: u32, array: &[u32]) { let x = array[0] + eval; }
"#;
    assert_eq!(lines("backend/gpu/fusion.rs", fine), Vec::<usize>::new());
    // Elsewhere the arrays are everyone's: the evaluator plans with them.
    assert_eq!(
        lines(
            "eval/fusion.rs",
            "use crate::array::State;
use crate::Array;
"
        ),
        Vec::<usize>::new()
    );
}

#[test]
fn finds_a_backend_from_memory() {
    let src =
        "use crate::backend::gpu::DeviceBuffer;\nfn f() { crate::backend::clear_caches(); }\n";
    assert_eq!(lines("memory/accounting.rs", src), vec![1, 2]);
    assert_eq!(lines("memory/mod.rs", src), vec![1, 2]);
    // The backends may import memory's accounting.
    assert_eq!(
        lines("backend/gpu/mod.rs", "use crate::memory::accounting;\n"),
        Vec::<usize>::new()
    );
}

#[test]
fn finds_what_the_settings_import_above_them() {
    let src = "use crate::error::{Error, Result};\nuse crate::Error as E;\n\
               fn f() { crate::device::default_device_from_env(); }\n\
               fn g() { crate::backend::cpu::blas::has_system_blas(); }\n\
               use crate::array::Array;\n";
    assert_eq!(lines("settings.rs", src), vec![3, 4, 5]);
    // Everyone may import the settings.
    assert_eq!(
        lines(
            "backend/cpu/matmul/blas.rs",
            "use crate::settings::{self, BlasChoice};\n"
        ),
        Vec::<usize>::new()
    );
}

/// `lines` with the modules' `use`s of `files` (path under `src/`, text).
fn lines_among(files: &[(&str, &str)], rel: &str, src: &str) -> Vec<usize> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|&(r, t)| (r.to_string(), t.to_string()))
        .collect();
    let uses = module_uses(&files, &aliases());
    check_source(rel, src, &aliases(), &uses)
        .into_iter()
        .map(|v| v.line)
        .collect()
}

#[test]
fn follows_what_modules_reexport() {
    let files = [
        (
            "backend/cpu/mod.rs",
            "mod matmul;\npub use matmul::blas;\nuse std::sync::Arc;\n",
        ),
        ("backend/cpu/matmul/mod.rs", "pub mod blas;\n"),
        ("backend/cpu/matmul/blas.rs", ""),
        (
            "shape.rs",
            "pub use crate::backend::cpu::blas::Mat;\npub(crate) use crate::blas as gemms;\n\
             fn f() { use crate::backend::cpu::x; }\n",
        ),
        (
            "dtype.rs",
            "pub use crate::shape::{Mat as M, gemms};\npub struct Dtype;\n",
        ),
        (
            "error.rs",
            "pub use crate::device::Device as Leak;\npub struct Error;\n",
        ),
        // The leaf, with a `use` inside a function (it re-exports nothing).
        ("data.rs", "fn f() { use crate::backend::cpu::x; }\n"),
        // Two modules that re-export each other's name: a cycle.
        ("settings.rs", "pub use crate::memory::y as x;\n"),
        ("memory/mod.rs", "pub use crate::settings::x as y;\n"),
    ];
    // From the GPU backend and from memory, the BLAS reached through the
    // shape module (a leaf: the first step is allowed), through two
    // re-exports, and through the crate root.
    let src = "use crate::shape::Mat;\nuse crate::dtype::M;\n\
               fn f() { crate::dtype::gemms::sgemm(); }\nuse crate::dtype::Dtype;\n";
    assert_eq!(
        lines_among(&files, "backend/gpu/matmul/mod.rs", src),
        vec![1, 2, 3]
    );
    assert_eq!(lines_among(&files, "memory/mod.rs", src), vec![1, 2, 3]);
    // The settings reach the device through the error type's re-export.
    assert_eq!(
        lines_among(&files, "settings.rs", "use crate::error::{Error, Leak};\n"),
        vec![1]
    );
    // Without the `use`s the same text passes: they are what is followed.
    assert_eq!(lines("backend/gpu/matmul/mod.rs", src), Vec::<usize>::new());
    // A `use` inside a function re-exports nothing; a cycle ends; the CPU
    // backend reaches its own BLAS.
    let fine = "fn f() { crate::data::x::y(); }\nuse crate::settings::x;\n";
    assert_eq!(
        lines_among(&files, "backend/gpu/mod.rs", fine),
        Vec::<usize>::new()
    );
    assert_eq!(
        lines_among(
            &files,
            "backend/cpu/attention/mod.rs",
            "use super::blas::Mat;\n"
        ),
        Vec::<usize>::new()
    );
}

#[test]
fn finds_what_the_leaf_imports_above_it() {
    let src = "use crate::memory::Storage;\nuse crate::dtype::{Dtype, Element};\n\
               use crate::shape::size_of_shape;\nuse crate::Error;\n\
               use crate::array::Array;\nuse crate::primitive::Primitive;\n\
               fn f() { crate::backend::cpu::copy::contiguous(&x); }\n\
               fn g() -> crate::Device { crate::device::default_device() }\n\
               use crate::{Array as A, ArrayData};\n";
    // Line 8 twice: `crate::Device` and `crate::device`.
    assert_eq!(lines("data.rs", src), vec![5, 6, 7, 8, 8, 9]);
    // What the leaf stands on is held to the same rule.
    assert_eq!(lines("shape.rs", src), vec![5, 6, 7, 8, 8, 9]);
    assert_eq!(lines("memory/accounting.rs", src), vec![5, 6, 7, 8, 8, 9]);
    // Where the GPU's pass times go is in the leaf: it cannot reach the
    // profile that reads them (which reads the backends' counters).
    assert_eq!(lines("timing.rs", src), vec![5, 6, 7, 8, 8, 9]);
    assert_eq!(lines("timing.rs", "use crate::profile::Clock;\n"), vec![1]);
    // Modules above the leaf may import anything below them.
    assert_eq!(lines("array.rs", src), Vec::<usize>::new());
}

#[test]
fn finds_what_a_backend_imports_above_the_leaf() {
    let src = r#"
use crate::data::{ArrayData, Operand};
use crate::{ArrayData as D, Bool8, Dtype, Result};
use crate::memory::accounting;
use crate::settings::{self, BlasChoice};
use crate::shape::size_of_shape;
use crate::array::Array;
use crate::Array as A;
fn f() { crate::eval::eval(x); crate::device::default_device(); }
use crate::primitive::{ArrayData as P, Primitive};
fn g() { crate::profile::enabled(); }
use crate::array::State;
"#;
    assert_eq!(
        lines("backend/cpu/binary.rs", src),
        vec![7, 8, 9, 9, 10, 10, 11, 12]
    );
    // The fusion planning that read the graph moved beside the evaluator,
    // and the GPU's pass times go to the leaf (`timing`), not the profile.
    assert_eq!(
        lines("backend/gpu/fusion.rs", src),
        vec![7, 8, 9, 9, 10, 10, 11, 12]
    );
    for file in ["backend/gpu/mod.rs", "backend/gpu/timestamps.rs"] {
        assert_eq!(
            lines(file, src),
            vec![7, 8, 9, 9, 10, 10, 11, 12],
            "{file}: the GPU backend imports the profile"
        );
    }
    assert_eq!(
        lines(
            "backend/gpu/timestamps.rs",
            "use crate::timing::Tag;\nfn f() { crate::timing::record_gpu(p); }\n"
        ),
        Vec::<usize>::new()
    );
    assert_eq!(
        lines(
            "backend/no_gpu.rs",
            "mod fusion {\n use crate::{Array, Result};\n}\n"
        ),
        vec![2]
    );
    assert_eq!(
        lines(
            "backend/gpu/elementwise/mod.rs",
            "use crate::array::State;\n"
        ),
        vec![1]
    );
}
