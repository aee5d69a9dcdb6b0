//! Small helpers over [`Tree`] that `mlx-array` does not provide.

use mlx_array::{Array, Tree};

use crate::{Error, Result};

/// Replaces the leaf at dotted `path` with `a`; the leaf must exist.
pub(crate) fn replace_leaf(tree: &mut Tree, path: &str, a: Array) -> Result<()> {
    let mut node = tree;
    for part in path.split('.') {
        node = match node {
            Tree::Map(m) => m.get_mut(part),
            Tree::List(l) => part.parse::<usize>().ok().and_then(|i| l.get_mut(i)),
            Tree::Leaf(_) => None,
        }
        .ok_or_else(|| Error::NoParameter(path.to_string()))?;
    }
    match node {
        Tree::Leaf(x) => {
            *x = a;
            Ok(())
        }
        _ => Err(Error::NoParameter(path.to_string())),
    }
}
