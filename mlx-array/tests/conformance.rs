//! The conformance suite, generated from the primitives' specifications
//! (`mlx_array::conformance`): for each primitive and device, a test of its
//! values against an f64 reference (`exp::cpu`, `exp::gpu`) and one of its
//! gradient against finite differences (`exp::grad::cpu`), plus
//! `every_primitive_has_a_spec`. Run one alone with
//! `cargo test -p mlx-array --test conformance -- --exact exp::cpu`.

fn main() {
    mlx_array::conformance::main(
        mlx_array::primitives::specs(),
        &[concat!(env!("CARGO_MANIFEST_DIR"), "/src")],
    )
}
