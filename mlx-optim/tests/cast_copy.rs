//! The fused AdamW's half-precision copies ([`mlx_optim::AdamConfig::cast_copy`]):
//! each step also writes every new float32 parameter cast to float16 or
//! bfloat16, and a mixed-precision forward pass
//! ([`mlx_nn::value_and_grad_in`]) reads them instead of casting the
//! weights again.
//!
//! The independent expectation is the same parameters as fresh arrays that
//! remember no cast, cast by `astype`'s own kernel. Against it, on the CPU
//! and the GPU, in float16 and bfloat16 (always packed two to a word on the
//! GPU): the copies of a first step (a new buffer), of a later one (written
//! in place) and of a skipped gated step equal those casts bit for bit; the
//! next step's loss and gradients equal those computed from the fresh
//! arrays bit for bit (through the embedding's gather, the norm and the
//! projection); and on the GPU that step runs at least one kernel fewer
//! per projection parameter.

use mlx_array::backend::gpu;
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Result, Tree, eval, random};
use mlx_nn::{Embedding, Linear, ModuleExt, RMSNorm, impl_module, value_and_grad_in};
use mlx_optim::{AdamW, Optimizer};

/// An embedding, a norm and a projection with a bias.
#[derive(Clone, Debug)]
struct Tiny {
    embedding: Embedding,
    norm: RMSNorm,
    proj: Linear,
}

impl_module!(Tiny {
    embedding,
    norm,
    proj
});

impl Tiny {
    fn new() -> Tiny {
        let k = random::split_keys(&random::key(7), 2).unwrap();
        Tiny {
            embedding: Embedding::new(11, 8, &k[0]).unwrap(),
            norm: RMSNorm::new(8),
            proj: Linear::new(8, 5, true, &k[1]).unwrap(),
        }
    }

    /// A copy whose parameters are fresh arrays (no remembered cast) with
    /// the same values.
    fn fresh(&self) -> Tiny {
        let mut m = self.clone();
        let params = self.parameters();
        eval(&params).unwrap();
        m.update(&params.map(|_, p| Ok(fresh(p))).unwrap()).unwrap();
        m
    }
}

/// `p`'s values in a new node that remembers no cast.
fn fresh(p: &Array) -> Array {
    p.eval().unwrap();
    Array::from_data(p.data().unwrap(), p.shape().to_vec(), p.dtype())
}

/// The mean square of the projection of the normalised embeddings of `ids`.
fn loss(m: &Tiny, ids: &Array) -> Result<Array> {
    let h = m.norm.forward(&m.embedding.forward(ids)?)?;
    m.proj.forward(&h)?.astype(Dtype::F32)?.square()?.mean_all()
}

/// Token ids with repeats (the embedding's gradient adds them up).
fn ids() -> Array {
    Array::from_slice(&[3i32, 1, 3, 9, 0, 3, 7, 1], &[2, 4]).unwrap()
}

/// The bits of a half-precision array.
fn bits(a: &Array) -> Vec<u16> {
    match a.dtype() {
        Dtype::F16 => a
            .to_vec::<half::f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        Dtype::BF16 => a
            .to_vec::<half::bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        d => panic!("not a half-precision dtype: {d}"),
    }
}

/// The float32 values of every array of `t`, by path.
fn values(t: &Tree) -> Vec<(String, Vec<u32>)> {
    t.flatten()
        .into_iter()
        .map(|(path, a)| {
            let v = a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
            (path, v.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

/// Every parameter of `model` remembers its cast to `dtype`, which holds
/// exactly `astype`'s values of the parameter; `when` names the step.
fn check_copies(model: &Tiny, dtype: Dtype, when: &str) {
    for (path, p) in model.parameters().flatten() {
        let copy = p.astype(dtype).unwrap();
        assert_eq!(
            copy.primitive_name(),
            Some("remembered_cast"),
            "{when}: {path} remembers its {dtype} copy"
        );
        assert_eq!(
            bits(&copy),
            bits(&fresh(&p).astype(dtype).unwrap()),
            "{when}: {path}'s {dtype} copy is its cast"
        );
    }
}

/// GPU kernels dispatched while evaluating `arrays` (0 on the CPU).
fn kernels(arrays: &(Array, Tree)) -> usize {
    let before = gpu::dispatch_count();
    eval(arrays).unwrap();
    gpu::dispatch_count() - before
}

/// A storage's address, to tell whether a step wrote in place.
fn storage_at(a: &Array) -> usize {
    std::sync::Arc::as_ptr(a.data().unwrap().storage()) as *const u8 as usize
}

fn copies_are_casts_and_the_next_step_reads_them(device: Device, dtype: Dtype) {
    with_device(device, || {
        let what = format!("{device:?} {dtype}");
        let mut model = Tiny::new();
        let vg = value_and_grad_in(dtype, loss);
        let mut opt = AdamW::new(1e-2).cast_copy(Some(dtype));
        let ids = ids();

        // Step 1: the state's buffer is new.
        let (l, g) = vg(&mut model, &ids).unwrap();
        let new = opt
            .apply_gradients(&g, &model.trainable_parameters())
            .unwrap();
        model.update(&new).unwrap();
        eval((&l, &model.parameters(), opt.state())).unwrap();
        drop((l, g, new));
        check_copies(&model, dtype, &format!("{what}, step 1"));

        // Step 2 from fresh arrays (each weight cast by its own kernel),
        // kept only as values so that the step below may work in place.
        let (want_loss, want_grads, cast_kernels) = {
            let mut plain = model.fresh();
            let out = vg(&mut plain, &ids).unwrap();
            let k = kernels(&out);
            (out.0.item::<f32>().unwrap(), values(&out.1), k)
        };
        let out = vg(&mut model, &ids).unwrap();
        let copy_kernels = kernels(&out);
        assert_eq!(
            out.0.item::<f32>().unwrap().to_bits(),
            want_loss.to_bits(),
            "{what}: the loss from the copies"
        );
        assert_eq!(values(&out.1), want_grads, "{what}: the gradients");
        if device == Device::Gpu {
            // The projection's weight and bias are no longer cast; the
            // embedding gathers from its master table either way, and the
            // norm's weight goes back to float32.
            assert!(
                cast_kernels >= copy_kernels + 2,
                "{what}: {copy_kernels} kernels with the copies, {cast_kernels} without"
            );
        }

        // Step 2's update writes over step 1's buffer, copy included.
        let before = storage_at(model.proj.weight.value());
        let new = opt
            .apply_gradients(&out.1, &model.trainable_parameters())
            .unwrap();
        drop(out);
        model.update(&new).unwrap();
        drop(new);
        eval((&model.parameters(), opt.state())).unwrap();
        assert_eq!(
            storage_at(model.proj.weight.value()),
            before,
            "{what}: step 2 works in place"
        );
        check_copies(&model, dtype, &format!("{what}, step 2 (in place)"));

        // A skipped step keeps the parameters, and their copies.
        let kept = values(&model.parameters());
        let (_, g) = vg(&mut model, &ids).unwrap();
        let skip = Array::zeros(&[], Dtype::F32);
        let new = opt
            .apply_gradients_gated(&g, &model.trainable_parameters(), &skip)
            .unwrap();
        model.update(&new).unwrap();
        eval((&model.parameters(), opt.state())).unwrap();
        opt.state_mut().settle(false).unwrap();
        assert_eq!(values(&model.parameters()), kept, "{what}: skipped");
        check_copies(&model, dtype, &format!("{what}, skipped step"));
    });
}

#[test]
fn copies_on_the_cpu() {
    for dtype in [Dtype::F16, Dtype::BF16] {
        copies_are_casts_and_the_next_step_reads_them(Device::Cpu, dtype);
    }
}

#[test]
fn copies_on_the_gpu() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    for dtype in [Dtype::F16, Dtype::BF16] {
        copies_are_casts_and_the_next_step_reads_them(Device::Gpu, dtype);
    }
}

#[test]
fn a_copy_is_half_precision() {
    let mut model = Tiny::new();
    let vg = value_and_grad_in(Dtype::F16, loss);
    let (_, g) = vg(&mut model, &ids()).unwrap();
    let mut opt = AdamW::new(1e-2).cast_copy(Some(Dtype::F32));
    let e = opt
        .apply_gradients(&g, &model.trainable_parameters())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cast_copy is float16 or bfloat16, not"), "{e}");
}
