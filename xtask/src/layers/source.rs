//! One crate's source read with `syn`: its modules, what each `use` binds,
//! every path that may name something of the crate, and the `feature = "…"`
//! conditions, each with its line. Comments and string literals are never
//! paths (the parser drops comments; a literal is one token).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{Attribute, Item, ItemMod, ItemUse, Meta, UseTree};

/// A module's path from the crate root (`[]` is the root).
pub type Module = Vec<String>;

/// One `.rs` file: its path under `src/` and the module it is mounted as.
pub struct SourceFile {
    pub rel: String,
    pub module: Module,
}

/// A path as written (`crate`, `self` and `super` kept), in `module` (inline
/// modules included) of `files[file]`.
pub struct Written {
    pub file: usize,
    pub module: Module,
    pub segs: Vec<String>,
    pub line: usize,
}

/// A name a `use` binds: `name` in `module` stands for `segs` (as written).
pub struct Binding {
    pub module: Module,
    pub name: String,
    pub segs: Vec<String>,
}

/// `feature = "name"` in an attribute or a macro (`cfg!`), where.
pub struct Gate {
    pub file: usize,
    pub feature: String,
    pub line: usize,
}

/// What one crate's source says about its modules.
#[derive(Default)]
pub struct Crate {
    pub files: Vec<SourceFile>,
    /// The modules files are mounted as.
    pub file_modules: BTreeSet<Module>,
    /// Those and the inline ones (`mod name { … }`).
    pub modules: BTreeSet<Module>,
    pub paths: Vec<Written>,
    pub bindings: Vec<Binding>,
    pub gates: Vec<Gate>,
}

/// Reads every `.rs` file under `src` but `src/bin/` (each binary is a crate
/// of its own, above the library). With `tests` false, `#[cfg(test)]` code
/// (items, and files mounted only under it) is left out.
pub fn read(src: &Path, tests: bool) -> Result<Crate> {
    let mut files = Vec::new();
    walk(src, src, &mut files)?;
    files.sort();
    from_texts(&files, tests)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        let rel = p.strip_prefix(root)?.to_string_lossy().replace('\\', "/");
        if p.is_dir() {
            if rel != "bin" {
                walk(root, &p, out)?;
            }
        } else if rel.ends_with(".rs") {
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            out.push((rel, text));
        }
    }
    Ok(())
}

/// The module a file is mounted as by default (`a/b/mod.rs` and `a/b.rs`
/// are `a::b`, `lib.rs` and `main.rs` the root).
pub fn default_module(rel: &str) -> Module {
    let mut m: Module = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if m.len() == 1 && matches!(m[0].as_str(), "lib" | "main")
        || m.last().is_some_and(|s| s == "mod")
    {
        m.pop();
    }
    m
}

/// `a/./b/../c.rs` as `a/c.rs`.
fn normalize(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            p => out.push(p),
        }
    }
    out.join("/")
}

/// Reads `files` (path under `src/`, text).
pub fn from_texts(files: &[(String, String)], tests: bool) -> Result<Crate> {
    let mut parsed = Vec::new();
    for (rel, text) in files {
        let ast = syn::parse_file(text).with_context(|| format!("parsing src/{rel}"))?;
        parsed.push((rel.clone(), ast));
    }
    // Where `#[path]` mounts a file, and which modules exist only for tests.
    let mut mounted: Vec<(String, Module)> = Vec::new();
    let mut test_only: Vec<Module> = Vec::new();
    for (rel, ast) in &parsed {
        let here = default_module(rel);
        let dir = rel.rsplit_once('/').map_or("", |(d, _)| d);
        for item in &ast.items {
            let Item::Mod(m) = item else { continue };
            if m.content.is_some() {
                continue;
            }
            let mut module = here.clone();
            module.push(m.ident.to_string());
            if is_cfg_test(&m.attrs) {
                test_only.push(module.clone());
            }
            for p in path_attrs(&m.attrs) {
                mounted.push((normalize(&format!("{dir}/{p}")), module.clone()));
            }
        }
    }
    // A file mounted by `#[path]` takes the declared module, and so do the
    // files below it that it mounts by default.
    let module_of = |rel: &str| -> Module {
        match mounted.iter().find(|(r, _)| r == rel) {
            Some((_, m)) => m.clone(),
            None => default_module(rel),
        }
    };
    let mut out = Crate::default();
    for (rel, ast) in &parsed {
        let module = module_of(rel);
        if !tests && test_only.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        let file = out.files.len();
        out.files.push(SourceFile {
            rel: rel.clone(),
            module: module.clone(),
        });
        out.file_modules.insert(module.clone());
        out.modules.insert(module.clone());
        let mut c = Collector {
            file,
            module,
            tests,
            out: &mut out,
        };
        for attr in &ast.attrs {
            c.visit_attribute(attr);
        }
        for item in &ast.items {
            c.visit_item(item);
        }
    }
    Ok(out)
}

/// `#[cfg(test)]`, or `#[cfg(all(test, …))]`.
fn is_cfg_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        let Meta::List(l) = &a.meta else { return false };
        if !l.path.is_ident("cfg") {
            return false;
        }
        let t: Vec<TokenTree> = l.tokens.clone().into_iter().collect();
        match t.as_slice() {
            [TokenTree::Ident(i)] => i == "test",
            [TokenTree::Ident(all), TokenTree::Group(g)] if all == "all" => {
                matches!(g.stream().into_iter().next(), Some(TokenTree::Ident(i)) if i == "test")
            }
            _ => false,
        }
    })
}

/// The files a `mod` declaration's `#[path = "…"]` (or
/// `#[cfg_attr(…, path = "…")]`) names.
fn path_attrs(attrs: &[Attribute]) -> Vec<String> {
    let mut out = Vec::new();
    for a in attrs {
        match &a.meta {
            Meta::NameValue(nv) if nv.path.is_ident("path") => {
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) = &nv.value
                {
                    out.push(s.value());
                }
            }
            Meta::List(l) if l.path.is_ident("cfg_attr") => {
                let t: Vec<TokenTree> = l.tokens.clone().into_iter().collect();
                for w in t.windows(3) {
                    if let (TokenTree::Ident(k), TokenTree::Punct(eq), TokenTree::Literal(lit)) =
                        (&w[0], &w[1], &w[2])
                        && k == "path"
                        && eq.as_char() == '='
                        && let Some(s) = string_literal(lit)
                    {
                        out.push(s);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn string_literal(lit: &proc_macro2::Literal) -> Option<String> {
    syn::parse_str::<syn::LitStr>(&lit.to_string())
        .ok()
        .map(|s| s.value())
}

struct Collector<'a> {
    file: usize,
    module: Module,
    tests: bool,
    out: &'a mut Crate,
}

impl Collector<'_> {
    fn path(&mut self, segs: Vec<String>, line: usize) {
        self.out.paths.push(Written {
            file: self.file,
            module: self.module.clone(),
            segs,
            line,
        });
    }

    /// Paths (`a::b`, `$crate::c`) and `feature = "…"` in macro or
    /// attribute tokens.
    fn tokens(&mut self, ts: TokenStream) {
        let t: Vec<TokenTree> = ts.into_iter().collect();
        let sep = |i: usize| {
            matches!((t.get(i), t.get(i + 1)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                    if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
        };
        let mut i = 0;
        while i < t.len() {
            match &t[i] {
                TokenTree::Group(g) => {
                    self.tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(id) => {
                    let line = id.span().start().line;
                    if id == "feature"
                        && let (Some(TokenTree::Punct(eq)), Some(TokenTree::Literal(lit))) =
                            (t.get(i + 1), t.get(i + 2))
                        && eq.as_char() == '='
                        && let Some(feature) = string_literal(lit)
                    {
                        self.out.gates.push(Gate {
                            file: self.file,
                            feature,
                            line,
                        });
                    }
                    // A path's first segment: not after `::` (a global path).
                    let global = i >= 2 && sep(i - 2);
                    let mut segs = vec![id.to_string()];
                    let mut j = i + 1;
                    while sep(j) {
                        match t.get(j + 2) {
                            Some(TokenTree::Ident(s)) => {
                                segs.push(s.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if segs.len() > 1 && !global {
                        self.path(segs, line);
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

/// Expands a `use` tree into (path, bound name, line); a glob binds none.
fn expand(
    tree: &UseTree,
    mut prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>, usize)>,
) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            expand(&p.tree, prefix, out);
        }
        UseTree::Name(n) => {
            let line = n.ident.span().start().line;
            if n.ident == "self" && !prefix.is_empty() {
                let bound = prefix.last().cloned();
                out.push((prefix, bound, line));
            } else {
                prefix.push(n.ident.to_string());
                let bound = prefix.last().cloned();
                out.push((prefix, bound, line));
            }
        }
        UseTree::Rename(r) => {
            let line = r.ident.span().start().line;
            if r.ident != "self" || prefix.is_empty() {
                prefix.push(r.ident.to_string());
            }
            let bound = (r.rename != "_").then(|| r.rename.to_string());
            out.push((prefix, bound, line));
        }
        UseTree::Glob(g) => out.push((prefix, None, g.star_token.spans[0].start().line)),
        UseTree::Group(g) => {
            for t in &g.items {
                expand(t, prefix.clone(), out);
            }
        }
    }
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        if !self.tests && is_cfg_test(item_attrs(item)) {
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !self.tests && is_cfg_test(&f.attrs) {
            return;
        }
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_item_mod(&mut self, m: &'ast ItemMod) {
        for a in &m.attrs {
            self.visit_attribute(a);
        }
        if let Some((_, items)) = &m.content {
            self.module.push(m.ident.to_string());
            self.out.modules.insert(self.module.clone());
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast ItemUse) {
        for a in &u.attrs {
            self.visit_attribute(a);
        }
        if u.leading_colon.is_some() {
            return; // `use ::name::…`: another crate
        }
        let mut found = Vec::new();
        expand(&u.tree, Vec::new(), &mut found);
        for (segs, bound, line) in found {
            if let Some(name) = bound {
                self.out.bindings.push(Binding {
                    module: self.module.clone(),
                    name,
                    segs: segs.clone(),
                });
            }
            self.path(segs, line);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            let segs = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.path(segs, p.segments[0].ident.span().start().line);
        }
        visit::visit_path(self, p);
    }

    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {
        // `pub(in crate::a)` names where an item is visible, not a use of it.
    }

    fn visit_attribute(&mut self, a: &'ast Attribute) {
        if let Meta::List(l) = &a.meta {
            self.tokens(l.tokens.clone());
        }
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }
}
