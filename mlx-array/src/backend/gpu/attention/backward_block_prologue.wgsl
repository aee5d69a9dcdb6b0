//! A template, filled by `source` (attention/backward.rs) through `codegen::fill`;
//! its placeholders: `{l}`, `{block}`, `{heads}`, `{SIDE}`.
 {
    let g = wid.x + wid.y * nw.x;
    let blocks = ({l} + {block} - 1u) / {block};
    if (g >= b() * {heads} * blocks) { return; }
    let start = (g % blocks) * {block};
    let hi = g / blocks % {heads};
    let bi = g / blocks / {heads};
    let tx = lid % {SIDE}u;
    let ty = lid / {SIDE}u;
