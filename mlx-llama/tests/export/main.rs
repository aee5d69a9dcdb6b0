//! `mlx-llama export`: the files it writes, read back with the `safetensors`
//! crate, and the logits of an independent Llama forward pass (plain Rust,
//! Hugging Face's RoPE by halves on the `hf` export, interleaved on the
//! `mlx` one) against our model's.

#[path = "../common/mod.rs"]
mod common;
mod import;
mod reference;

use std::collections::HashMap;
use std::path::Path;

use mlx_array::Array;
use mlx_data::TextTokenizer;
use mlx_llama::export::{self, Format};
use mlx_llama::{Llama, LlamaConfig, TokenizerChoice, TrainConfig};
use mlx_nn::ModuleExt;
use reference::{Rope, Shape, Tensors};
use safetensors::{Dtype, SafeTensors};

const VOCAB: usize = 67;
const BLOCK: usize = 48;
const TOKENS: [u32; 9] = [3, 17, 66, 0, 42, 42, 9, 65, 23];

fn config() -> LlamaConfig {
    LlamaConfig {
        num_layers: 2,
        vocab_size: VOCAB,
        dims: 32,
        mlp_dims: 48,
        num_heads: 4,
        norm_eps: 1e-5,
        rope_base: 500.0,
        ..LlamaConfig::default()
    }
}

/// A random model whose norms are not all ones (so that swapping two of
/// them shows).
fn model() -> Llama {
    let mut m = Llama::new(&config(), 11).unwrap();
    let dims = m.config.dims;
    let wavy = |k: f32| {
        let v: Vec<f32> = (0..dims)
            .map(|i| 1.0 + 0.3 * (k + i as f32).sin())
            .collect();
        Array::from_slice(&v, &[dims]).unwrap()
    };
    for (l, layer) in m.layers.iter_mut().enumerate() {
        layer.norm1.weight.set(wavy(10.0 * l as f32 + 1.0));
        layer.norm2.weight.set(wavy(10.0 * l as f32 + 5.0));
    }
    m.norm.weight.set(wavy(100.0));
    m
}

/// A word-level tokenizer of 66 words and `<|endoftext|>` (id 66).
fn tokenizer(dir: &Path) -> (std::path::PathBuf, TextTokenizer) {
    common::word_tokenizer(dir, VOCAB)
}

/// Every tensor of an export with its metadata, checked to be float32.
fn read(dir: &Path) -> (Tensors, HashMap<String, String>) {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out = Tensors::new();
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), Dtype::F32, "{name}");
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        out.insert(name, (view.shape().to_vec(), values));
    }
    (out, meta.metadata().clone().unwrap_or_default())
}

fn expected_shapes(c: &LlamaConfig) -> HashMap<String, Vec<usize>> {
    let (d, m) = (c.dims, c.mlp_dims);
    let mut want = HashMap::from([
        ("model.embed_tokens.weight".to_string(), vec![VOCAB, d]),
        ("model.norm.weight".to_string(), vec![d]),
        ("lm_head.weight".to_string(), vec![VOCAB, d]),
    ]);
    for l in 0..c.num_layers {
        for (n, s) in [
            ("self_attn.q_proj", vec![d, d]),
            ("self_attn.k_proj", vec![d, d]),
            ("self_attn.v_proj", vec![d, d]),
            ("self_attn.o_proj", vec![d, d]),
            ("mlp.gate_proj", vec![m, d]),
            ("mlp.up_proj", vec![m, d]),
            ("mlp.down_proj", vec![d, m]),
            ("input_layernorm", vec![d]),
            ("post_attention_layernorm", vec![d]),
        ] {
            want.insert(format!("model.layers.{l}.{n}.weight"), s);
        }
    }
    want
}

fn ours(m: &Llama) -> Vec<Vec<f64>> {
    let tokens = Array::from_slice(&TOKENS, &[1, TOKENS.len()]).unwrap();
    let logits = m.forward(&tokens).unwrap().to_vec::<f32>().unwrap();
    logits
        .chunks(VOCAB)
        .map(|r| r.iter().map(|&v| v as f64).collect())
        .collect()
}

fn max_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn shape() -> Shape {
    let c = config();
    Shape {
        layers: c.num_layers,
        dims: c.dims,
        heads: c.num_heads,
        vocab: VOCAB,
        eps: c.norm_eps,
        theta: c.rope_base,
    }
}

#[test]
fn both_exports_hold_hugging_face_names_shapes_and_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tok) = tokenizer(tmp.path());
    let m = model();
    for (format, tag) in [(Format::Hf, "pt"), (Format::Mlx, "mlx")] {
        let out = tmp.path().join(tag);
        export::write(&m, &tok, BLOCK, &out, format).unwrap();
        let (tensors, meta) = read(&out);
        assert_eq!(meta, HashMap::from([("format".into(), tag.into())]));
        let shapes: HashMap<String, Vec<usize>> =
            tensors.into_iter().map(|(n, (s, _))| (n, s)).collect();
        assert_eq!(shapes, expected_shapes(&m.config), "{format:?}");
        for f in [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            assert!(out.join(f).is_file(), "{format:?} export lacks {f}");
        }
    }
}

#[test]
fn config_json_describes_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tok) = tokenizer(tmp.path());
    let m = model();
    let c = &m.config;
    for format in [Format::Hf, Format::Mlx] {
        let out = tmp.path().join(format!("{format:?}"));
        export::write(&m, &tok, BLOCK, &out, format).unwrap();
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(j["architectures"], serde_json::json!(["LlamaForCausalLM"]));
        assert_eq!(j["model_type"], "llama");
        assert_eq!(j["hidden_size"], c.dims);
        assert_eq!(j["intermediate_size"], c.mlp_dims);
        assert_eq!(j["num_attention_heads"], c.num_heads);
        assert_eq!(j["num_key_value_heads"], c.num_heads);
        assert_eq!(j["num_hidden_layers"], c.num_layers);
        assert_eq!(j["head_dim"], c.dims / c.num_heads);
        assert_eq!(j["rms_norm_eps"], c.norm_eps);
        assert_eq!(j["rope_theta"], c.rope_base);
        assert_eq!(j["vocab_size"], VOCAB);
        assert_eq!(j["max_position_embeddings"], BLOCK);
        assert_eq!(j["tie_word_embeddings"], false);
        assert_eq!(j["hidden_act"], "silu");
        assert_eq!(j["bos_token_id"], VOCAB - 1);
        assert_eq!(j["eos_token_id"], VOCAB - 1);
        assert_eq!(j["torch_dtype"], "float32");
        assert_eq!(j["attention_bias"], false);
        assert_eq!(j["mlp_bias"], false);
        let traditional = j.get("rope_traditional").cloned();
        match format {
            Format::Hf => assert_eq!(traditional, None),
            Format::Mlx => assert_eq!(traditional, Some(true.into())),
        }
    }
}

#[test]
fn the_reference_forward_pass_on_each_export_gives_our_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tok) = tokenizer(tmp.path());
    let m = model();
    let want = ours(&m);
    let (hf_dir, mlx_dir) = (tmp.path().join("hf"), tmp.path().join("mlx"));
    export::write(&m, &tok, BLOCK, &hf_dir, Format::Hf).unwrap();
    export::write(&m, &tok, BLOCK, &mlx_dir, Format::Mlx).unwrap();
    let (hf, _) = read(&hf_dir);
    let (mlx, _) = read(&mlx_dir);
    let s = shape();
    let d_hf = max_diff(&reference::logits(&hf, &s, &TOKENS, Rope::Halves), &want);
    let d_mlx = max_diff(
        &reference::logits(&mlx, &s, &TOKENS, Rope::Interleaved),
        &want,
    );
    assert!(d_hf < 1e-4, "hf export, RoPE by halves: max |diff| {d_hf}");
    assert!(
        d_mlx < 1e-4,
        "mlx export, interleaved RoPE: max |diff| {d_mlx}"
    );
    // The reordering matters: without it the halves RoPE gives other logits.
    let unpermuted = max_diff(&reference::logits(&mlx, &s, &TOKENS, Rope::Halves), &want);
    assert!(
        unpermuted > 1e-2,
        "RoPE by halves on unreordered rows should differ, max |diff| {unpermuted}"
    );
}

#[test]
fn exporting_a_checkpoint_reads_its_model_and_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let (tok_path, tok) = tokenizer(tmp.path());
    let m = model();
    let run = tmp.path().join("run");
    let cfg = TrainConfig {
        model: LlamaConfig {
            vocab_size: 0,
            ..config()
        },
        block_size: BLOCK,
        tokenizer: TokenizerChoice::File(tok_path),
        out_dir: run.clone(),
        ..TrainConfig::default()
    };
    let ckpt = mlx_llama::checkpoint::step_dir(&run, 3);
    std::fs::create_dir_all(&ckpt).unwrap();
    m.save_weights(ckpt.join("model.safetensors")).unwrap();
    // A checkpoint keeps a copy of its run's tokenizer, as the trainer's do.
    mlx_llama::checkpoint::copy_tokenizer(&cfg.tokenizer, &ckpt).unwrap();
    let manifest = mlx_llama::checkpoint::Manifest {
        format: mlx_llama::checkpoint::FORMAT,
        step: 3,
        world: 1,
        resume_key: cfg.resume_key(),
        config: serde_json::to_value(&cfg).unwrap(),
        vocab_size: VOCAB,
        files: mlx_llama::checkpoint::file_entries(&ckpt).unwrap(),
        layout: None,
    };
    mlx_llama::checkpoint::write_manifest(&ckpt, &manifest).unwrap();
    // A checkpoint's weights say they are MLX's, as MLX's own do.
    let bytes = std::fs::read(ckpt.join("model.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        meta.metadata().clone().unwrap_or_default(),
        HashMap::from([("format".into(), "mlx".into())])
    );

    let (from_run, direct) = (tmp.path().join("from-run"), tmp.path().join("direct"));
    let used = export::export(&run, &from_run, Format::Hf).unwrap();
    assert_eq!(used, ckpt);
    export::write(&m, &tok, BLOCK, &direct, Format::Hf).unwrap();
    for f in ["model.safetensors", "config.json", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(from_run.join(f)).unwrap(),
            std::fs::read(direct.join(f)).unwrap(),
            "{f} differs between exporting the run and the model"
        );
    }
    let again = tmp.path().join("from-checkpoint");
    assert_eq!(export::export(&ckpt, &again, Format::Mlx).unwrap(), ckpt);
    let (_, meta) = read(&again);
    assert_eq!(meta["format"], "mlx");

    // Without the copy (a checkpoint from before copies were kept), the
    // tokenizer outside the run folder its manifest names is refused, and
    // one named for the export is written instead.
    std::fs::remove_file(ckpt.join("tokenizer.json")).unwrap();
    let manifest = mlx_llama::checkpoint::Manifest {
        files: mlx_llama::checkpoint::file_entries(&ckpt).unwrap(),
        ..manifest
    };
    mlx_llama::checkpoint::write_manifest(&ckpt, &manifest).unwrap();
    let refused = tmp.path().join("refused");
    let e = format!(
        "{:#}",
        export::export(&ckpt, &refused, Format::Hf).unwrap_err()
    );
    assert!(
        e.contains("outside its run folder") && e.contains("--tokenizer"),
        "{e}"
    );
    let named = tmp.path().join("named");
    let merge = export::Merge {
        tokenizer: Some(cfg.tokenizer.clone()),
        ..export::Merge::default()
    };
    export::export_with(&ckpt, &named, Format::Hf, &merge).unwrap();
    assert_eq!(
        std::fs::read(named.join("tokenizer.json")).unwrap(),
        std::fs::read(direct.join("tokenizer.json")).unwrap()
    );
}

#[test]
fn a_tokenizer_larger_than_the_model_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tok) = tokenizer(tmp.path());
    let small = Llama::new(
        &LlamaConfig {
            vocab_size: VOCAB - 1,
            ..config()
        },
        1,
    )
    .unwrap();
    let e = export::write(&small, &tok, BLOCK, &tmp.path().join("x"), Format::Hf).unwrap_err();
    assert!(e.to_string().contains("67 tokens"), "{e}");
}
