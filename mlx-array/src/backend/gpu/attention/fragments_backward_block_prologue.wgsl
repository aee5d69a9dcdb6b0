//! A template, filled by `source` (attention/fragments_backward.rs) through `codegen::fill`;
//! its placeholders: `{l}`, `{own}`, `{heads}`, `{LANES}`.
    let blocks = ({l} + {own}u - 1u) / {own}u;
    if (wg >= b() * {heads} * blocks) { return; }
    let own0 = (wg % blocks) * {own}u;
    let hi = wg / blocks % {heads};
    let bi = wg / blocks / {heads};
    let sg = lid / 32u;
    let lane = lid % 32u;
    {LANES}
    // The subgroup's first row in the owned block.
    let row0 = sg * 16u;
