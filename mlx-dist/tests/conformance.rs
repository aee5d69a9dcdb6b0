//! The collectives' conformance suite, generated from their specifications
//! (`mlx-dist/src/collectives/spec.rs`) by `mlx_array::conformance`: for
//! each collective and device, a test of its values in worlds of 1, 2 and 3
//! ranks against an f64 reference (`all_sum::cpu`, `all_sum::gpu`) and one
//! of its gradient (`all_sum::grad::cpu`), plus `every_primitive_has_a_spec`.
//! Run one alone with
//! `cargo test -p mlx-dist --test conformance -- --exact all_sum::cpu`.

fn main() {
    mlx_array::conformance::main(
        mlx_dist::conformance_specs(),
        &[concat!(env!("CARGO_MANIFEST_DIR"), "/src")],
    )
}
