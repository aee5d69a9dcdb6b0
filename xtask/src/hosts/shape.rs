//! Shaping the hosts' links with `tc tbf`, on both ends of each veth pair.

use anyhow::{Result, bail};

use super::exec::exec;
use super::layout::Layout;
use super::rate::{Rate, parse_rate};
use super::state::State;

/// Reshapes the running hosts' links to `rate` (tc syntax, each direction);
/// `None` or `"none"` removes the shaping.
pub fn shape(rate: Option<&str>) -> Result<()> {
    let rate = match rate {
        Some(r) => parse_rate(r).map_err(anyhow::Error::msg)?,
        None => None,
    };
    let Some(mut state) = State::load()? else {
        bail!("no emulated hosts are up (`cargo xtask hosts up N`)");
    };
    for i in 0..state.layout.n {
        shape_link(&state.layout, i, rate.as_ref())?;
    }
    state.rate = rate;
    state.save()
}

/// How long a packet may wait in a tbf queue: the queue's length is what the
/// link sends in this time (plus the bucket). TCP's small queues keep each
/// stream's share far below it; it only bounds many streams at once.
const TBF_LATENCY: &str = "50ms";

/// Shapes (or, with `None`, unshapes) both ends of host `i`'s veth pair.
pub(super) fn shape_link(layout: &Layout, i: usize, rate: Option<&Rate>) -> Result<()> {
    let ns = layout.name(i);
    let ns_side = ["ip", "netns", "exec", &ns, "tc"];
    let (host_dev, bridge_dev) = ("eth0", layout.veth(i));
    for (prefix, dev) in [(&ns_side[..], host_dev), (&["tc"][..], bridge_dev.as_str())] {
        match rate {
            Some(r) => {
                let args = format!(
                    "qdisc replace dev {dev} root tbf rate {}bit burst {} latency {TBF_LATENCY}",
                    r.bits_per_sec,
                    r.burst_bytes()
                );
                let args: Vec<&str> = args.split(' ').collect();
                exec(&[prefix, &args[..]].concat())?;
            }
            None => {
                let show = exec(&[prefix, &["qdisc", "show", "dev", dev, "root"][..]].concat())?;
                if show.contains("tbf") {
                    exec(&[prefix, &["qdisc", "del", "dev", dev, "root"][..]].concat())?;
                }
            }
        }
    }
    Ok(())
}
