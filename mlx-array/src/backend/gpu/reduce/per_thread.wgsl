//! A template, filled by `run` (reduce/mod.rs) through `codegen::fill`:
//! the body of the entry point (after `codegen::ENTRY`), one invocation
//! per output, with `{index}` the thread index and an accumulator of type
//! `{acc}` from `{init}`.
 {
    {index}
    if (i >= params[0]) { return; }
    let b = base(i);
    var acc: {acc} = {init};
    for (var r = 0u; r < params[1]; r = r + 1u) {
        acc = merge(acc, value(b + at(r)));
    }
    store_out(i, finish(acc));
}
