//! The checks: each path resolved to the module it names (through the
//! crate's `use`s and re-exports), held to one crate's rules, and the
//! module graph's circles (strongly connected components) compared with
//! those the table allows.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::source::{Crate, Module};
use super::table::{CrateRules, match_len, matches};

/// One finding: `file:line: what` (`file` under the crate's folder).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub file: String,
    pub line: usize,
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Where paths lead in one crate.
pub struct Resolver<'a> {
    krate: &'a Crate,
    /// (module, name) → the path as written, from every `use`.
    bindings: HashMap<(Module, String), Vec<String>>,
    /// `module::name` → the absolute path it stands for.
    uses: HashMap<Vec<String>, Vec<String>>,
}

impl<'a> Resolver<'a> {
    pub fn new(krate: &'a Crate) -> Self {
        let mut r = Resolver {
            krate,
            bindings: HashMap::new(),
            uses: HashMap::new(),
        };
        for b in &krate.bindings {
            r.bindings
                .insert((b.module.clone(), b.name.clone()), b.segs.clone());
        }
        let mut uses = HashMap::new();
        for b in &krate.bindings {
            let key: Vec<String> = b.module.iter().cloned().chain([b.name.clone()]).collect();
            if let Some(path) = r.resolve_at(&b.segs, &b.module, 0)
                && path != key
            {
                uses.insert(key, path);
            }
        }
        r.uses = uses;
        r
    }

    /// `segs`, written in `module`, from the crate root; `None` when it
    /// leaves the crate (std, another crate) or names a local item.
    pub fn resolve(&self, segs: &[String], module: &[String]) -> Option<Vec<String>> {
        self.resolve_at(segs, module, 0)
    }

    fn resolve_at(&self, segs: &[String], module: &[String], depth: usize) -> Option<Vec<String>> {
        let first = segs.first()?.as_str();
        match first {
            "crate" => Some(segs[1..].to_vec()),
            "self" | "super" => {
                let mut base = module.to_vec();
                let mut k = usize::from(first == "self");
                while segs.get(k).map(String::as_str) == Some("super") {
                    base.pop()?;
                    k += 1;
                }
                base.extend_from_slice(&segs[k..]);
                Some(base)
            }
            _ => {
                if depth < 8
                    && let Some(target) = self.bindings.get(&(module.to_vec(), first.to_string()))
                {
                    let head = self.resolve_at(target, module, depth + 1)?;
                    return Some(head.into_iter().chain(segs[1..].iter().cloned()).collect());
                }
                let child: Module = module.iter().cloned().chain([first.to_string()]).collect();
                self.krate
                    .modules
                    .contains(&child)
                    .then(|| module.iter().chain(segs).cloned().collect())
            }
        }
    }

    /// Where `path` leads through the modules' `use`s (re-exports
    /// included): the longest prefix one binds replaced by what it stands
    /// for, again, at most 8 times.
    pub fn through_uses(&self, path: &[String]) -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let Some(k) = (1..=path.len())
                .rev()
                .find(|&k| self.uses.contains_key(&path[..k]))
            else {
                break;
            };
            path = self.uses[&path[..k]]
                .iter()
                .chain(&path[k..])
                .cloned()
                .collect();
        }
        path
    }

    /// The file module a path is in (inline modules count as their file's).
    pub fn node(&self, path: &[String]) -> Module {
        (0..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|m| self.krate.file_modules.contains(m))
            .unwrap_or_default()
    }
}

/// One reference of a module to another.
struct Reference {
    file: usize,
    line: usize,
    written: String,
    /// The module as written (unless that is the crate root passing on a
    /// re-export), and the module that defines the name.
    as_written: Option<Module>,
    defined: Module,
}

fn references(krate: &Crate, r: &Resolver) -> Vec<Reference> {
    let mut out = Vec::new();
    for w in &krate.paths {
        let from = &krate.files[w.file].module;
        let Some(path) = r.resolve(&w.segs, &w.module) else {
            continue;
        };
        let written = r.node(&path);
        let passing = written.is_empty() && !path.is_empty() && r.uses.contains_key(&path[..1]);
        let defined = r.node(&r.through_uses(&path));
        out.push(Reference {
            file: w.file,
            line: w.line,
            written: w.segs.join("::"),
            as_written: (!passing && written != *from).then_some(written),
            defined,
        });
    }
    out
}

/// Every violation of `rules` in `krate`; files are named `prefix` + their
/// path under `src/`.
pub fn check(krate: &Crate, rules: &CrateRules, prefix: &str) -> Vec<Violation> {
    let r = Resolver::new(krate);
    let refs = references(krate, &r);
    let mut found = BTreeSet::new();
    let at = |file: usize, line: usize, what: String| Violation {
        file: format!("{prefix}{}", krate.files[file].rel),
        line,
        what,
    };

    // The table names modules that exist.
    for (p, section) in rules.patterns() {
        if !krate.modules.iter().any(|m| matches(p, m)) {
            found.insert(Violation {
                file: "layers.toml".into(),
                line: 0,
                what: format!("`{p}` (in {section}) names no module of the crate"),
            });
        }
    }

    for c in &rules.circles {
        if c.why.trim().is_empty() {
            found.insert(Violation {
                file: "layers.toml".into(),
                line: 0,
                what: format!(
                    "the circle among {} is allowed without a why",
                    c.modules.join(", ")
                ),
            });
        }
    }

    let layer = |m: &[String]| -> Option<usize> {
        rules
            .layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.iter().filter_map(move |p| Some((match_len(p, m)?, i))))
            .max()
            .map(|(_, i)| i)
    };

    for re in &refs {
        let from = &krate.files[re.file].module;
        let mut targets: Vec<&Module> = re.as_written.iter().collect();
        if re.defined != *from && !targets.contains(&&re.defined) {
            targets.push(&re.defined);
        }
        // Each rule is broken once per reference: as written, or else where
        // the `use`s lead it.
        let shown = |t: &Module| {
            if Some(t) == re.as_written.as_ref() {
                format!("`{}` ({})", re.written, name(t))
            } else {
                format!("`{}` (through a `use`, {})", re.written, name(t))
            }
        };
        for rule in &rules.forbid {
            if rule.from.iter().any(|p| matches(p, from))
                && let Some(t) = targets
                    .iter()
                    .find(|t| rule.to.iter().any(|p| matches(p, t)))
            {
                found.insert(at(re.file, re.line, format!("{}: {}", shown(t), rule.why)));
            }
        }
        for rule in &rules.only {
            if rule.from.iter().any(|p| matches(p, from))
                && let Some(t) = targets
                    .iter()
                    .find(|t| !t.starts_with(from) && !rule.to.iter().any(|p| matches(p, t)))
            {
                found.insert(at(re.file, re.line, format!("{}: {}", shown(t), rule.why)));
            }
        }
        if let Some(lf) = layer(from)
            && let Some(t) = targets.iter().find(|t| layer(t).is_none_or(|lt| lt > lf))
        {
            found.insert(at(
                re.file,
                re.line,
                format!(
                    "{}: {} imports a higher layer (layers.toml lists the layers from the bottom)",
                    shown(t),
                    name(from)
                ),
            ));
        }
    }

    for g in &krate.gates {
        let from = &krate.files[g.file].module;
        for rule in &rules.features {
            if rule.feature == g.feature && !rule.only_in.iter().any(|p| matches(p, from)) {
                found.insert(at(
                    g.file,
                    g.line,
                    format!("`feature = \"{}\"`: {}", g.feature, rule.why),
                ));
            }
        }
    }

    // Circles.
    let edges = graph(krate, &refs);
    let mut used = vec![false; rules.circles.len()];
    for scc in circles(&edges) {
        let allowed = rules
            .circles
            .iter()
            .position(|c| scc.iter().all(|m| c.modules.iter().any(|p| matches(p, m))));
        match allowed {
            Some(i) => used[i] = true,
            None => {
                let cycle = shortest_cycle(&scc, &edges);
                let (file, line) = edges[&(cycle[0].clone(), cycle[1].clone())];
                let steps: Vec<String> = cycle
                    .windows(2)
                    .map(|w| {
                        let (f, l) = edges[&(w[0].clone(), w[1].clone())];
                        format!("{prefix}{}:{l}", krate.files[f].rel)
                    })
                    .collect();
                let mut members: Vec<String> = scc.iter().map(|m| name(m)).collect();
                members.sort();
                found.insert(at(
                    file,
                    line,
                    format!(
                        "import circle {} (each step at {}; the circle's modules: {}); \
                         break it (move what both use below both) or allow it in layers.toml with why",
                        cycle.iter().map(|m| name(m)).collect::<Vec<_>>().join(" -> "),
                        steps.join(", "),
                        members.join(", ")
                    ),
                ));
            }
        }
    }
    for (c, used) in rules.circles.iter().zip(used) {
        if !used {
            found.insert(Violation {
                file: "layers.toml".into(),
                line: 0,
                what: format!(
                    "the circle allowed among {} is no longer there: remove it from the table",
                    c.modules.join(", ")
                ),
            });
        }
    }
    found.into_iter().collect()
}

/// The module graph: an edge from each module to each module that defines
/// a name it uses, with the first place (file, line) it does.
fn graph(krate: &Crate, refs: &[Reference]) -> BTreeMap<(Module, Module), (usize, usize)> {
    let mut edges = BTreeMap::new();
    for re in refs {
        let from = &krate.files[re.file].module;
        // A module and its own submodules are one unit here: the parent
        // mounts, re-exports and drives its children, which use what it
        // holds for them all.
        if !re.defined.starts_with(from) && !from.starts_with(&re.defined) {
            edges
                .entry((from.clone(), re.defined.clone()))
                .or_insert((re.file, re.line));
        }
    }
    edges
}

/// The module graph's edges within its circles, as `from -> to (file:line)`
/// lines (files named `prefix` + their path under `src/`).
pub fn circle_edges(krate: &Crate, prefix: &str) -> Vec<String> {
    let r = Resolver::new(krate);
    let edges = graph(krate, &references(krate, &r));
    let mut out = Vec::new();
    for scc in circles(&edges) {
        out.push(format!(
            "circle: {}",
            scc.iter().map(|m| name(m)).collect::<Vec<_>>().join(", ")
        ));
        for ((a, b), (file, line)) in &edges {
            if scc.contains(a) && scc.contains(b) {
                out.push(format!(
                    "  {} -> {} ({prefix}{}:{line})",
                    name(a),
                    name(b),
                    krate.files[*file].rel
                ));
            }
        }
    }
    out
}

/// The strongly connected components of more than one module (Tarjan).
pub fn circles(edges: &BTreeMap<(Module, Module), (usize, usize)>) -> Vec<Vec<Module>> {
    let nodes: Vec<&Module> = edges
        .keys()
        .flat_map(|(a, b)| [a, b])
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let id: HashMap<&Module, usize> = nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut succ = vec![Vec::new(); nodes.len()];
    for (a, b) in edges.keys() {
        succ[id[a]].push(id[b]);
    }
    struct Tarjan {
        succ: Vec<Vec<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        sccs: Vec<Vec<usize>>,
    }
    impl Tarjan {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for k in 0..self.succ[v].len() {
                let w = self.succ[v][k];
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
    let n = nodes.len();
    let mut t = Tarjan {
        succ,
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
    let mut out: Vec<Vec<Module>> = t
        .sccs
        .into_iter()
        .map(|scc| {
            let mut s: Vec<Module> = scc.into_iter().map(|v| nodes[v].clone()).collect();
            s.sort();
            s
        })
        .collect();
    out.sort();
    out
}

/// A shortest circle through the first module of `scc`, as the modules
/// visited (the first again at the end).
fn shortest_cycle(
    scc: &[Module],
    edges: &BTreeMap<(Module, Module), (usize, usize)>,
) -> Vec<Module> {
    let start = &scc[0];
    let inside: BTreeSet<&Module> = scc.iter().collect();
    let mut prev: HashMap<&Module, &Module> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(m) = queue.pop_front() {
        for (a, b) in edges.keys() {
            if a != m || !inside.contains(b) {
                continue;
            }
            if b == start {
                // m, back to start, then turned round: start … m start.
                let mut path = vec![m.clone()];
                let mut at = m;
                while at != start {
                    at = prev[at];
                    path.push(at.clone());
                }
                path.reverse();
                path.push(start.clone());
                return path;
            }
            if !prev.contains_key(b) && b != start {
                prev.insert(b, m);
                queue.push_back(b);
            }
        }
    }
    vec![start.clone(), start.clone()]
}
