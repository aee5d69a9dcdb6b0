//! Parameter trees: nested names to arrays, like `mlx.utils`' tree helpers.
//!
//! ```
//! use mlx_array::{Array, Dtype, Tree};
//! let flat = vec![
//!     ("layers.0.weight".to_string(), Array::zeros(&[2, 2], Dtype::F32)),
//!     ("layers.1.weight".to_string(), Array::ones(&[2, 2], Dtype::F32)),
//! ];
//! let tree = Tree::unflatten(flat).unwrap();
//! assert!(matches!(tree.get("layers"), Some(Tree::List(l)) if l.len() == 2));
//! assert_eq!(tree.flatten()[1].0, "layers.1.weight");
//! ```

use std::collections::BTreeMap;

use crate::eval::Evaluable;
use crate::{Array, Error, Result};

/// A nested structure of arrays: leaves, string-keyed maps and lists.
#[derive(Clone, Debug)]
pub enum Tree {
    /// One array.
    Leaf(Array),
    /// Named children (kept sorted by name).
    Map(BTreeMap<String, Tree>),
    /// Numbered children.
    List(Vec<Tree>),
}

impl Default for Tree {
    fn default() -> Self {
        Tree::Map(BTreeMap::new())
    }
}

impl From<Array> for Tree {
    fn from(a: Array) -> Self {
        Tree::Leaf(a)
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

impl Tree {
    /// An empty map.
    pub fn new() -> Tree {
        Tree::default()
    }

    /// Every leaf with its dotted path (`layers.0.attention.wq.weight`), in order.
    pub fn flatten(&self) -> Vec<(String, Array)> {
        let mut out = Vec::new();
        self.walk("", &mut |p, a| out.push((p.to_string(), a.clone())));
        out
    }

    /// Every leaf, in the order of [`Tree::flatten`].
    pub fn leaves(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.walk("", &mut |_, a| out.push(a.clone()));
        out
    }

    fn walk(&self, prefix: &str, f: &mut impl FnMut(&str, &Array)) {
        match self {
            Tree::Leaf(a) => f(prefix, a),
            Tree::Map(m) => m.iter().for_each(|(k, v)| v.walk(&join(prefix, k), f)),
            Tree::List(l) => l
                .iter()
                .enumerate()
                .for_each(|(i, v)| v.walk(&join(prefix, &i.to_string()), f)),
        }
    }

    /// Rebuilds a tree from dotted paths. A level whose keys are exactly
    /// `0..n` becomes a list; conflicting paths are an error naming them.
    pub fn unflatten(items: impl IntoIterator<Item = (String, Array)>) -> Result<Tree> {
        let mut root = Tree::new();
        for (path, a) in items {
            root.insert(&path, a)?;
        }
        Ok(root.lists_from_numeric_keys())
    }

    /// Inserts `a` at the dotted `path`, creating maps along the way.
    pub fn insert(&mut self, path: &str, a: Array) -> Result<()> {
        let conflict = || {
            Error::invalid(
                "tree",
                format!("path `{path}` conflicts with another entry"),
            )
        };
        let mut node = self;
        let parts: Vec<&str> = path.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(Error::invalid(
                "tree",
                format!("path `{path}` has an empty component"),
            ));
        }
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            node = match node {
                Tree::Map(m) => {
                    if last {
                        if m.insert(part.to_string(), Tree::Leaf(a)).is_some() {
                            return Err(conflict());
                        }
                        return Ok(());
                    }
                    m.entry(part.to_string()).or_default()
                }
                Tree::List(l) => {
                    let idx: usize = part.parse().map_err(|_| conflict())?;
                    let slot = l.get_mut(idx).ok_or_else(conflict)?;
                    if last {
                        *slot = Tree::Leaf(a);
                        return Ok(());
                    }
                    slot
                }
                Tree::Leaf(_) => return Err(conflict()),
            };
        }
        Err(conflict())
    }

    fn lists_from_numeric_keys(self) -> Tree {
        match self {
            Tree::Map(m) => {
                let n = m.len();
                let numeric = n > 0 && (0..n).all(|i| m.contains_key(&i.to_string()));
                let mut m: BTreeMap<String, Tree> = m
                    .into_iter()
                    .map(|(k, v)| (k, v.lists_from_numeric_keys()))
                    .collect();
                if numeric {
                    Tree::List(
                        (0..n)
                            .map(|i| m.remove(&i.to_string()).expect("checked"))
                            .collect(),
                    )
                } else {
                    Tree::Map(m)
                }
            }
            Tree::List(l) => Tree::List(l.into_iter().map(Tree::lists_from_numeric_keys).collect()),
            leaf => leaf,
        }
    }

    /// The subtree at a dotted path.
    pub fn get(&self, path: &str) -> Option<&Tree> {
        let mut node = self;
        for part in path.split('.') {
            node = match node {
                Tree::Map(m) => m.get(part)?,
                Tree::List(l) => l.get(part.parse::<usize>().ok()?)?,
                Tree::Leaf(_) => return None,
            };
        }
        Some(node)
    }

    /// The array at a dotted path.
    pub fn get_array(&self, path: &str) -> Option<&Array> {
        match self.get(path)? {
            Tree::Leaf(a) => Some(a),
            _ => None,
        }
    }

    /// A tree of the same structure with `f(path, leaf)` at every leaf.
    pub fn map(&self, mut f: impl FnMut(&str, &Array) -> Result<Array>) -> Result<Tree> {
        self.map_inner("", &mut f)
    }

    fn map_inner(
        &self,
        prefix: &str,
        f: &mut impl FnMut(&str, &Array) -> Result<Array>,
    ) -> Result<Tree> {
        Ok(match self {
            Tree::Leaf(a) => Tree::Leaf(f(prefix, a)?),
            Tree::Map(m) => Tree::Map(
                m.iter()
                    .map(|(k, v)| Ok((k.clone(), v.map_inner(&join(prefix, k), f)?)))
                    .collect::<Result<_>>()?,
            ),
            Tree::List(l) => Tree::List(
                l.iter()
                    .enumerate()
                    .map(|(i, v)| v.map_inner(&join(prefix, &i.to_string()), f))
                    .collect::<Result<_>>()?,
            ),
        })
    }

    /// A tree with `f(path, a, b)` at every leaf of two trees of the same
    /// structure; a structural difference is an error naming the path.
    pub fn zip_map(
        &self,
        other: &Tree,
        mut f: impl FnMut(&str, &Array, &Array) -> Result<Array>,
    ) -> Result<Tree> {
        self.zip_inner(other, "", &mut f)
    }

    fn zip_inner(
        &self,
        other: &Tree,
        prefix: &str,
        f: &mut impl FnMut(&str, &Array, &Array) -> Result<Array>,
    ) -> Result<Tree> {
        let mismatch = || {
            Error::invalid(
                "tree",
                format!("the trees differ in structure at `{prefix}`"),
            )
        };
        Ok(match (self, other) {
            (Tree::Leaf(a), Tree::Leaf(b)) => Tree::Leaf(f(prefix, a, b)?),
            (Tree::Map(a), Tree::Map(b)) => {
                if a.len() != b.len() || a.keys().zip(b.keys()).any(|(x, y)| x != y) {
                    let only: Vec<&String> = a
                        .keys()
                        .filter(|k| !b.contains_key(*k))
                        .chain(b.keys().filter(|k| !a.contains_key(*k)))
                        .collect();
                    return Err(Error::invalid(
                        "tree",
                        format!(
                            "the trees differ at `{prefix}`: keys {only:?} are in only one of them"
                        ),
                    ));
                }
                Tree::Map(
                    a.iter()
                        .zip(b.values())
                        .map(|((k, x), y)| Ok((k.clone(), x.zip_inner(y, &join(prefix, k), f)?)))
                        .collect::<Result<_>>()?,
                )
            }
            (Tree::List(a), Tree::List(b)) if a.len() == b.len() => Tree::List(
                a.iter()
                    .zip(b)
                    .enumerate()
                    .map(|(i, (x, y))| x.zip_inner(y, &join(prefix, &i.to_string()), f))
                    .collect::<Result<_>>()?,
            ),
            _ => return Err(mismatch()),
        })
    }
}

impl Evaluable for Tree {
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.walk("", &mut |_, a| out.push(a.clone()));
    }
}
