//! The layers of `mlx-array` point one way (issue 20), checked on the
//! source tree:
//!
//! - nothing under `src/backend/` imports the primitives (primitives call
//!   backends, never the reverse; shared kernel descriptions live in
//!   `backend/common`);
//! - the GPU backend (`backend/gpu/`, and its no-GPU stub) never reaches
//!   into the CPU backend, nor the CPU backend into the GPU one, and
//!   `backend/common` into neither;
//! - memory (`memory/`) imports no backend: its accounting core is what the
//!   backends import, and a device backend registers there how to clear its
//!   pool;
//! - the settings (`settings.rs`) are a leaf: they import only the error
//!   type (what needs more than parsing a variable is checked where it is
//!   used);
//! - the kernel boundary is a leaf: `data.rs` (the data a kernel sees,
//!   `ArrayData` and `Operand`) and what it stands on (`dtype`, `shape`,
//!   `error`, `memory`, `settings`) import only each other, never the
//!   arrays, primitives, evaluator, devices or backends above them;
//! - the backends import only that leaf (and their own modules): not the
//!   arrays, the evaluator, devices or primitives. Two exceptions remain,
//!   listed in [`NOT_YET`] with their reason;
//! - no `cfg(feature = "gpu")` (in any form: `cfg`, `cfg_attr`, `cfg!`,
//!   `not(...)`) outside `src/backend/`: the no-GPU build mounts a stub
//!   instead.
//!
//! Paths are resolved, not grepped: `use crate::primitives::…`, grouped
//! `use crate::{primitives::…}`, `super::super::…`, `self::…`, `$crate::…`,
//! paths in expressions, names bound by an earlier `use`, and the crate
//! root's re-exports (`crate::blas` is `backend::cpu::blas`). Comments and
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

/// The modules of the leaf under the kernels: the data a kernel sees and
/// what it is built from. They import only each other.
const LEAF: &[&str] = &["data", "dtype", "shape", "error", "memory", "settings"];

/// References from a backend to a module above the leaf that the tree
/// still has, each with its reason: (the importing module, exactly or a
/// module under it with `prefix`; the module it reaches; why).
const NOT_YET: &[(&[&str], bool, &str, &str)] = &[
    // The GPU evaluator's fusion plan reads the graph (`array::State`,
    // `Primitive::gpu_expression`, devices); issue 40 moves the planning
    // beside the evaluator, which hands the backend only what to run.
    (
        &["backend", "gpu", "fusion"],
        true,
        "array",
        "fusion planning",
    ),
    (
        &["backend", "gpu", "fusion"],
        true,
        "primitive",
        "fusion planning",
    ),
    (
        &["backend", "gpu", "fusion"],
        true,
        "device",
        "fusion planning",
    ),
    // The GPU's pass timings go into the profile (`profile::current`,
    // `record_gpu`), whose summary reads the GPU's transfer counters back.
    (&["backend", "gpu"], false, "profile", "GPU pass timings"),
    (
        &["backend", "gpu", "timestamps"],
        false,
        "profile",
        "GPU pass timings",
    ),
];

/// True when [`NOT_YET`] lets `module` reach `target`.
fn not_yet(module: &[&str], target: &str) -> bool {
    NOT_YET
        .iter()
        .any(|&(m, prefix, t, _)| t == target && (module == m || (prefix && module.starts_with(m))))
}

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
            "the kernel boundary's leaf (data, dtype, shape, error, memory, settings) imports \
             a module above it (kernels read it; it knows nothing of arrays, primitives, the \
             evaluator, devices or backends)",
        );
    }
    if m.first() == Some(&"backend")
        && !path.is_empty()
        && target != "backend"
        && !LEAF.contains(&target)
        && !not_yet(&m, target)
    {
        return Some(
            "a backend imports a module above the kernel boundary (backends read only the \
             leaf: data, dtype, shape, error, memory accounting, settings; what they need \
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

/// Every violation in one file, `rel` being its path under `src/`.
fn check_source(
    rel: &str,
    src: &str,
    root_aliases: &HashMap<String, Vec<String>>,
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
                    if let Some(why) = rule(&module, &path) {
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
                    && let Some(why) = rule(&module, &path)
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
    let mut found = Vec::new();
    for (path, name) in files.iter().zip(&names) {
        let text = std::fs::read_to_string(path).expect("a source file");
        found.extend(check_source(name, &text, &aliases));
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
         pub use array::Array;\npub use dtype::{Bool8, Dtype};\n",
    )
}

fn lines(rel: &str, src: &str) -> Vec<usize> {
    check_source(rel, src, &aliases())
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
    crate::backend::cpu::copy_contiguous(a, b, c);
    cpu::copy::copy_cast(a, b, c, d);
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
            "backend/cpu/blas.rs",
            "use crate::settings::{self, BlasChoice};\n"
        ),
        Vec::<usize>::new()
    );
}

#[test]
fn finds_what_the_leaf_imports_above_it() {
    let src = "use crate::memory::Storage;\nuse crate::dtype::{Dtype, Element};\n\
               use crate::shape::size_of_shape;\nuse crate::Error;\n\
               use crate::array::Array;\nuse crate::primitive::Primitive;\n\
               fn f() { crate::backend::cpu::copy::contiguous(a, b, c); }\n\
               fn g() -> crate::Device { crate::device::default_device() }\n\
               use crate::{Array as A, ArrayData};\n";
    // Line 8 twice: `crate::Device` and `crate::device`.
    assert_eq!(lines("data.rs", src), vec![5, 6, 7, 8, 8, 9]);
    // What the leaf stands on is held to the same rule.
    assert_eq!(lines("shape.rs", src), vec![5, 6, 7, 8, 8, 9]);
    assert_eq!(lines("memory/accounting.rs", src), vec![5, 6, 7, 8, 8, 9]);
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
    // The exceptions the tree still has, where they are and nowhere else.
    assert_eq!(
        lines("backend/gpu/fusion.rs", src),
        vec![9, 11],
        "fusion planning may read the graph (not the evaluator, not the profile)"
    );
    assert_eq!(
        lines("backend/gpu/mod.rs", src),
        vec![7, 8, 9, 9, 10, 10, 12],
        "the GPU records pass timings in the profile"
    );
    assert_eq!(
        lines(
            "backend/no_gpu.rs",
            "mod fusion {\n use crate::{Array, Result};\n}\n"
        ),
        Vec::<usize>::new()
    );
    assert_eq!(
        lines(
            "backend/gpu/elementwise/mod.rs",
            "use crate::array::State;\n"
        ),
        vec![1]
    );
}
