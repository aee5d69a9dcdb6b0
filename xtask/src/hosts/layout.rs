//! The hosts' names and addresses ([`Layout`]): namespaces, veth pairs,
//! the bridge, and which name prefixes are valid.

use anyhow::{Result, bail};

/// The first three octets of the hosts' /24: host `i` is `.{i+1}`.
pub(super) const SUBNET: &str = "10.77.0";

/// `.1` to `.253`: `.254` is the bridge, `.255` the broadcast address.
const MAX_HOSTS: usize = 253;

/// Linux interface names hold at most 15 bytes (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;

/// The names and addresses of `n` hosts with one prefix.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Layout {
    pub(super) prefix: String,
    pub(super) n: usize,
}

impl Layout {
    /// Checks the prefix (lower-case letters and digits, starting and ending
    /// with a letter, so that no prefix's names match another's) and `n`.
    pub(super) fn new(prefix: &str, n: usize) -> Result<Layout> {
        if n == 0 || n > MAX_HOSTS {
            bail!("the number of hosts must be 1 to {MAX_HOSTS} (they share 10.77.0.0/24)");
        }
        valid_prefix(prefix)?;
        let layout = Layout {
            prefix: prefix.to_string(),
            n,
        };
        let longest = layout.veth(n - 1);
        if longest.len() > IFNAME_MAX || layout.bridge().len() > IFNAME_MAX {
            bail!(
                "the name prefix `{prefix}` is too long: interface names like `{longest}` \
                 must fit in {IFNAME_MAX} characters"
            );
        }
        Ok(layout)
    }

    /// Host `i`'s name: its namespace, hostname and ssh alias.
    pub(super) fn name(&self, i: usize) -> String {
        format!("{}{i}", self.prefix)
    }

    /// Host `i`'s address.
    pub(super) fn ip(&self, i: usize) -> String {
        format!("{SUBNET}.{}", i + 1)
    }

    /// The root namespace's end of host `i`'s veth pair (on the bridge).
    pub(super) fn veth(&self, i: usize) -> String {
        format!("{}{i}h", self.prefix)
    }

    /// The bridge.
    pub(super) fn bridge(&self) -> String {
        bridge_name(&self.prefix)
    }
}

/// The bridge of the hosts with this prefix.
pub(super) fn bridge_name(prefix: &str) -> String {
    format!("{prefix}br")
}

/// Lower-case letters and digits, starting and ending with a letter.
pub(super) fn valid_prefix(prefix: &str) -> Result<()> {
    let b = prefix.as_bytes();
    let ok = !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_lowercase();
    if !ok {
        bail!(
            "invalid host name prefix `{prefix}`: use lower-case letters and digits, \
             starting and ending with a letter (e.g. mlxh)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::down::numbered;

    #[test]
    fn names_addresses_and_prefixes() {
        let l = Layout::new("mlxh", 3).unwrap();
        assert_eq!(
            (l.name(2), l.ip(2), l.veth(2), l.bridge()),
            (
                "mlxh2".into(),
                "10.77.0.3".into(),
                "mlxh2h".into(),
                "mlxhbr".into()
            )
        );
        assert!(Layout::new("mlxh", 0).is_err());
        assert!(Layout::new("mlxh", 253).is_ok());
        assert!(Layout::new("mlxh", 254).is_err());
        for bad in ["", "Mlx", "mlx1", "1mlx", "ml-x", "averyveryverylongprefix"] {
            assert!(Layout::new(bad, 2).is_err(), "{bad}");
        }
        assert!(numbered("mlxh12", "mlxh", ""));
        assert!(numbered("mlxh12h", "mlxh", "h"));
        assert!(!numbered("mlxhbr", "mlxh", "h"));
        assert!(!numbered("mlxh", "mlxh", ""));
        assert!(!numbered("mlxh1x", "mlxh", ""));
    }
}
