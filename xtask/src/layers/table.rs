//! The layering table (`layers.toml` at the workspace root): per crate, its
//! layers from the bottom, the imports forbidden besides, where a cargo
//! feature may be tested, and the import circles allowed, each with why.
//!
//! A module pattern is a module path from the crate root (`backend::gpu`):
//! it stands for that module and every module below it, whatever files they
//! are in; `crate` stands for the root module alone.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::source::Module;

/// Every crate's rules, by package name.
pub type Table = BTreeMap<String, CrateRules>;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CrateRules {
    /// Whether `#[cfg(test)]` code is held to the rules too (and counts in
    /// circles); otherwise tests may import anything of the crate.
    #[serde(default)]
    pub check_tests: bool,
    /// Layers from the bottom: a module imports only modules of its own
    /// layer or lower ones. Modules in no layer are not checked, and count
    /// as above every layer. A module takes the layer of its longest
    /// matching pattern.
    #[serde(default)]
    pub layers: Vec<Vec<String>>,
    /// Modules under `from` import nothing under `to`.
    #[serde(default)]
    pub forbid: Vec<Rule>,
    /// Modules under `from` import only what is under `to` (and their own
    /// submodules).
    #[serde(default)]
    pub only: Vec<Rule>,
    /// `feature = "…"` (in `cfg`, `cfg_attr`, `cfg!`) only under `only_in`.
    #[serde(default)]
    pub features: Vec<FeatureRule>,
    /// Import circles left, each a set of module patterns: a circle is
    /// allowed when every module in it matches one of an entry's patterns.
    #[serde(default)]
    pub circles: Vec<Circle>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub from: Vec<String>,
    pub to: Vec<String>,
    pub why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureRule {
    pub feature: String,
    pub only_in: Vec<String>,
    pub why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Circle {
    pub modules: Vec<String>,
    pub why: String,
}

pub fn parse(text: &str) -> anyhow::Result<Table> {
    Ok(toml::from_str(text)?)
}

/// The module a pattern names (`crate` is the root).
pub fn pattern(p: &str) -> Module {
    if p == "crate" {
        Vec::new()
    } else {
        p.split("::").map(String::from).collect()
    }
}

/// Whether `module` is under pattern `p`.
pub fn matches(p: &str, module: &[String]) -> bool {
    if p == "crate" {
        module.is_empty()
    } else {
        let p = pattern(p);
        module.starts_with(&p)
    }
}

/// How closely `p` matches `module` (its length), if it does.
pub fn match_len(p: &str, module: &[String]) -> Option<usize> {
    matches(p, module).then(|| pattern(p).len())
}

impl CrateRules {
    /// Every pattern the rules name, with where it is used.
    pub fn patterns(&self) -> Vec<(&str, &'static str)> {
        let mut out = Vec::new();
        for layer in &self.layers {
            out.extend(layer.iter().map(|p| (p.as_str(), "layers")));
        }
        for r in &self.forbid {
            out.extend(r.from.iter().chain(&r.to).map(|p| (p.as_str(), "forbid")));
        }
        for r in &self.only {
            out.extend(r.from.iter().chain(&r.to).map(|p| (p.as_str(), "only")));
        }
        for r in &self.features {
            out.extend(r.only_in.iter().map(|p| (p.as_str(), "features")));
        }
        for c in &self.circles {
            out.extend(c.modules.iter().map(|p| (p.as_str(), "circles")));
        }
        out
    }
}
