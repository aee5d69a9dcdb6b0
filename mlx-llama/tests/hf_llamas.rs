//! The Llamas people have, against transformers: random models built by
//! transformers from the configurations of SmolLM-135M, TinyLlama-1.1B,
//! Llama-3.2-1B and Llama-3.1-8B (depth, width and vocabulary cut down,
//! every other field kept: grouped-query attention, tied embeddings, llama3
//! RoPE, an explicit head width) and two more RoPE types (linear, dynamic),
//! with transformers' logits, loss and gradients stored beside them by
//! `tests/fixtures/hf_llamas/make_fixtures.py`. Our import must compute the
//! same numbers, and our export must give transformers the same model back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_array::Array;
use mlx_llama::Llama;
use mlx_llama::export::{self, Format};
use mlx_llama::import::{self, Tensor};
use mlx_nn::{ModuleExt, value_and_grad};

mod common;

const ARCHITECTURES: [&str; 6] = [
    "smollm-135m",
    "tinyllama-1.1b",
    "llama-3.2-1b",
    "llama-3.1-8b",
    "linear-rope",
    "dynamic-rope",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf_llamas")
        .join(name)
}

/// The stored token ids `[B, L]`, loss, and tensors (logits, `grad.*`).
struct Reference {
    ids: Array,
    loss: f32,
    tensors: BTreeMap<String, Tensor>,
}

fn reference(name: &str) -> Reference {
    let dir = fixture(name);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let rows: Vec<Vec<u32>> = serde_json::from_value(json["ids"].clone()).unwrap();
    let flat: Vec<u32> = rows.concat();
    let ids = Array::from_slice(&flat, &[rows.len(), rows[0].len()]).unwrap();
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    Reference {
        ids,
        loss: json["loss"].as_f64().unwrap() as f32,
        tensors: import::parse_safetensors(&bytes).unwrap(),
    }
}

/// The mean next-token cross-entropy of `ids` `[B, L]` (the first `L - 1`
/// predicting the last `L - 1`, as the fixtures' script computes it) and
/// its gradients.
fn training_step(model: &mut Llama, ids: &Array) -> (f32, mlx_array::Tree) {
    let (b, l) = (ids.shape()[0], ids.shape()[1]);
    let x = ids.slice_axis(1, 0, (l - 1) as i64).unwrap();
    let y = ids.slice_axis(1, 1, l as i64).unwrap();
    let w = Array::full(
        &[b, l - 1],
        1.0 / (b * (l - 1)) as f64,
        mlx_array::Dtype::F32,
    );
    let step = value_and_grad(|m: &Llama, _: &()| m.loss(&x, &y, &w));
    let (loss, grads) = step(model, &()).unwrap();
    (loss.item::<f32>().unwrap(), grads)
}

#[test]
fn each_architecture_s_logits_equal_transformers() {
    for name in ARCHITECTURES {
        let model = import::load(&fixture(name)).unwrap();
        let r = reference(name);
        let logits = model.forward(&r.ids).unwrap();
        let want = &r.tensors["logits"];
        assert_eq!(logits.shape(), want.shape, "{name}");
        common::assert_close(name, &logits.to_vec::<f32>().unwrap(), &want.values, 1e-4);
    }
}

/// The same on the GPU (lavapipe in CI): grouped heads read in place by
/// every attention kernel family the shapes reach, llama3 and dynamic
/// RoPE through the GPU's frequency table, a tied output projection.
#[test]
fn each_architecture_s_logits_and_gradients_on_the_gpu_equal_transformers() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    mlx_array::device::with_device(mlx_array::Device::Gpu, || {
        for name in ARCHITECTURES {
            let mut model = import::load(&fixture(name)).unwrap();
            let r = reference(name);
            let logits = model.forward(&r.ids).unwrap();
            common::assert_close(
                &format!("{name} on the GPU"),
                &logits.to_vec::<f32>().unwrap(),
                &r.tensors["logits"].values,
                1e-4,
            );
            let (loss, grads) = training_step(&mut model, &r.ids);
            assert!(
                (loss - r.loss).abs() <= 1e-5 * r.loss.abs(),
                "{name}: {loss} vs {}",
                r.loss
            );
            let embedding = grads.get_array("embedding.weight").unwrap();
            let theirs = &r.tensors["grad.model.embed_tokens.weight"].values;
            common::assert_close(
                &format!("{name} embedding gradient on the GPU"),
                &embedding.to_vec::<f32>().unwrap(),
                theirs,
                1e-4,
            );
        }
    });
}

#[test]
fn the_fixtures_keep_what_makes_each_architecture_what_it_is() {
    let c = |name: &str| import::read_config(&fixture(name)).unwrap().model;
    let smol = c("smollm-135m");
    assert_eq!((smol.num_heads, smol.kv_heads()), (3, 1));
    assert!(smol.tie_embeddings);
    let tiny = c("tinyllama-1.1b");
    assert_eq!(
        (tiny.num_heads, tiny.kv_heads(), tiny.tie_embeddings),
        (16, 2, false)
    );
    let l32 = c("llama-3.2-1b");
    assert!(l32.tie_embeddings);
    assert_eq!(
        l32.rope_scaling,
        mlx_nn::RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(l32.rope_base, 500_000.0);
    let l31 = c("llama-3.1-8b");
    assert_eq!((l31.dims, l31.num_heads, l31.head_dim()), (96, 8, 16));
    assert_eq!(
        c("dynamic-rope").rope_scaling,
        mlx_nn::RopeScaling::Dynamic {
            factor: 2.0,
            original_max_position_embeddings: 8
        }
    );
    // A tied model has one tensor for both uses.
    let m = import::load(&fixture("smollm-135m")).unwrap();
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"embedding.weight".to_string()));
    assert!(
        !names.iter().any(|n| n.starts_with("out_proj")),
        "{names:?}"
    );
}

#[test]
fn one_training_step_s_loss_and_gradients_equal_transformers() {
    for name in ARCHITECTURES {
        let mut model = import::load(&fixture(name)).unwrap();
        let r = reference(name);
        let (loss, grads) = training_step(&mut model, &r.ids);
        assert!(
            (loss - r.loss).abs() <= 1e-5 * r.loss.abs(),
            "{name}: loss {loss} against transformers' {}",
            r.loss
        );
        // transformers' gradients in our layout: the same mapping as the
        // weights' (a row permutation of the queries and keys).
        let theirs: BTreeMap<String, Tensor> = r
            .tensors
            .iter()
            .filter_map(|(n, t)| Some((n.strip_prefix("grad.")?.to_string(), t.clone())))
            .collect();
        let config = import::read_config(&fixture(name)).unwrap();
        let expected = import::to_model(&config, theirs).unwrap();
        let expected: BTreeMap<String, Array> = expected.named_parameters().into_iter().collect();
        let got = grads.flatten();
        assert_eq!(got.len(), expected.len(), "{name}");
        for (n, g) in got {
            let want = expected[&n].to_vec::<f32>().unwrap();
            common::assert_close(
                &format!("{name} {n}"),
                &g.to_vec::<f32>().unwrap(),
                &want,
                1e-4,
            );
        }
    }
}

/// transformers 4's spelling of the fixture's RoPE settings:
/// `rope_theta` and `rope_scaling` beside each other.
fn v4_spelling(v: &mut serde_json::Value) {
    let mut p = v["rope_parameters"].take();
    let o = v.as_object_mut().unwrap();
    o.remove("rope_parameters");
    o.insert("rope_theta".into(), p["rope_theta"].take());
    p.as_object_mut().unwrap().remove("rope_theta");
    let kind = p["rope_type"].clone();
    o.insert(
        "rope_scaling".into(),
        if kind == "default" {
            serde_json::Value::Null
        } else {
            // The older key name, as Llama 2-era configs wrote it.
            let mut p = p;
            let t = p["rope_type"].take();
            let p = p.as_object_mut().unwrap();
            p.remove("rope_type");
            p.insert("type".into(), t);
            serde_json::Value::Object(p.clone())
        },
    );
}

#[test]
fn transformers_4_s_spelling_reads_as_5_s() {
    for name in ARCHITECTURES {
        let bytes = std::fs::read(fixture(name).join("config.json")).unwrap();
        let v5 = import::parse_config(&bytes).unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v4_spelling(&mut v);
        let v4 = import::parse_config(v.to_string().as_bytes()).unwrap();
        assert_eq!(v4, v5, "{name}: {v}");
    }
    // A theta-500,000 model is not read as a theta-10,000 one.
    let bytes = std::fs::read(fixture("llama-3.1-8b").join("config.json")).unwrap();
    assert_eq!(
        import::parse_config(&bytes).unwrap().model.rope_base,
        500_000.0
    );
}

#[test]
fn export_gives_transformers_back_the_same_tensors_and_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ARCHITECTURES {
        let dir = fixture(name);
        let model = import::load(&dir).unwrap();
        let (_, tok) = common::word_tokenizer(tmp.path(), model.config.vocab_size);
        let out = tmp.path().join(name);
        export::write(&model, &tok, 64, &out, Format::Hf).unwrap();
        let read = |d: &Path| {
            import::parse_safetensors(&std::fs::read(d.join("model.safetensors")).unwrap()).unwrap()
        };
        let (mut original, exported) = (read(&dir), read(&out));
        if model.config.tie_embeddings {
            original.remove("lm_head.weight");
            assert!(!exported.contains_key("lm_head.weight"), "{name}");
        }
        // Bit for bit: the export undoes the import's row permutation.
        assert_eq!(exported, original, "{name}");
        let config = |d: &Path| -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap()
        };
        let (theirs, ours) = (config(&dir), config(&out));
        for key in [
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "tie_word_embeddings",
            "max_position_embeddings",
            "rms_norm_eps",
            "vocab_size",
        ] {
            assert_eq!(ours[key], theirs[key], "{name}: {key}");
        }
        // The RoPE settings read back as the same model.
        let back = import::read_config(&out).unwrap().model;
        assert_eq!(back, import::read_config(&dir).unwrap().model, "{name}");
    }
}

#[test]
fn generation_caches_only_the_key_value_heads_and_matches_the_full_forward() {
    let model = import::load(&fixture("llama-3.1-8b")).unwrap();
    let prompt = [5u32, 17, 3, 60, 2];
    let tokens = model.generate(&prompt, 6, 0.0, 0).unwrap();
    // Greedy tokens from the whole sequence each time, no cache.
    let mut seq = prompt.to_vec();
    for &t in &tokens {
        let logits = model
            .forward(&Array::from_slice(&seq, &[1, seq.len()]).unwrap())
            .unwrap();
        let last = logits
            .slice_axis(1, seq.len() as i64 - 1, seq.len() as i64)
            .unwrap()
            .reshape(&[-1])
            .unwrap();
        assert_eq!(last.argmax(-1, false).unwrap().item::<u32>().unwrap(), t);
        seq.push(t);
    }
    let mut caches = vec![None; model.layers.len()];
    model
        .forward_cached(
            &Array::from_slice(&prompt, &[1, prompt.len()]).unwrap(),
            &mut caches,
        )
        .unwrap();
    let c = caches[0].as_ref().unwrap();
    assert_eq!(c.keys.shape(), [1, 2, prompt.len(), 16]);
    assert_eq!(c.values.shape(), [1, 2, prompt.len(), 16]);
}

/// Text of the fixtures' word tokenizer's words: `stories` stories of 40
/// words `w0`..`w94`, separated by `<|endoftext|>`.
fn word_text(path: &Path, stories: usize, seed: u64) -> PathBuf {
    let mut state = seed;
    let text: Vec<String> = (0..stories)
        .map(|_| {
            (0..40)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    format!("w{}", (state >> 33) % 95)
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    std::fs::write(path, text.join("<|endoftext|>")).unwrap();
    path.to_path_buf()
}

/// SmolLM's (multi-query, tied) and Llama 3.1's (grouped 4:1, llama3 RoPE,
/// heads wider than dims / heads) fixtures fine-tuned from their folders
/// (`init_from`) train the same at world 1, at world 2 with sharded AdamW
/// state, and, where the heads split, tensor-parallel over 2 ranks.
#[test]
fn fixtures_fine_tune_alike_under_every_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let (tok, _) = common::word_tokenizer(tmp.path(), 96);
    let train = word_text(&tmp.path().join("train.txt"), 40, 1);
    let valid = word_text(&tmp.path().join("valid.txt"), 4, 2);
    for (name, tensor) in [("smollm-135m", false), ("llama-3.1-8b", true)] {
        let cfg = |out: &str| mlx_llama::TrainConfig {
            init_from: Some(fixture(name).into()),
            tokenizer: mlx_llama::TokenizerChoice::File(tok.clone()),
            data: mlx_llama::DataSource::Text {
                train: train.clone(),
                validation: Some(valid.clone()),
            },
            block_size: 16,
            learning_rate: 1e-3,
            ..common::tiny(&tmp.path().join(format!("{name}-{out}")), 4)
        };
        let one = mlx_llama::train(&cfg("one"), &mlx_dist::Group::single()).unwrap();
        let mut layouts = vec![("data parallel, sharded state", cfg("two"))];
        if tensor {
            layouts.push((
                "tensor parallel",
                mlx_llama::TrainConfig {
                    tensor_parallel: 2,
                    ..cfg("tensor")
                },
            ));
        }
        for (layout, c) in layouts {
            let two = mlx_dist::run_local(2, |g| mlx_llama::train(&c, &g).unwrap()).unwrap();
            for (a, b) in one.losses.iter().zip(&two[0].losses) {
                assert!(
                    (a - b).abs() <= 1e-4 * a.abs(),
                    "{name}, {layout}: {:?} vs world 1's {:?}",
                    two[0].losses,
                    one.losses
                );
            }
        }
    }
}

/// Greedy generation from the fixtures is the same split over two ranks by
/// pipeline stages (a tied model's last stage keeps the embedding as its
/// head) and, where the heads split, by tensor parallelism.
#[test]
fn fixtures_generate_alike_split_over_ranks() {
    let prompt = [5u32, 17, 3, 60];
    for name in ARCHITECTURES {
        let load = || import::load(&fixture(name)).unwrap();
        let one = load().generate(&prompt, 8, 0.0, 0).unwrap();
        let pipeline = mlx_dist::run_local(2, |g| {
            mlx_llama::pipeline::PipelineStage::new(load(), &g)
                .unwrap()
                .generate(&prompt, 8, 0.0, 0)
                .unwrap()
        })
        .unwrap();
        assert_eq!(pipeline, [one.clone(), one.clone()], "{name}, pipeline");
        let m = load();
        if m.config.kv_heads() % 2 == 0 {
            let tensor = mlx_dist::run_local(2, |g| {
                let mut m = load();
                m.shard(&g).unwrap();
                m.generate(&prompt, 8, 0.0, 0).unwrap()
            })
            .unwrap();
            assert_eq!(tensor, [one.clone(), one.clone()], "{name}, tensor");
        }
    }
}
