//! The fused Adam primitives' conformance suite, generated from their
//! specifications (`mlx-optim/src/fused/spec.rs`) by
//! `mlx_array::conformance`: for each primitive, a test of its values
//! (`fused_adam::cpu`) and one of its gradient (`fused_adam::grad::cpu`),
//! plus `every_primitive_has_a_spec`. Run one alone with
//! `cargo test -p mlx-optim --test conformance -- --exact fused_adam::cpu`.

fn main() {
    mlx_array::conformance::main(
        mlx_optim::conformance_specs(),
        &[concat!(env!("CARGO_MANIFEST_DIR"), "/src")],
    )
}
