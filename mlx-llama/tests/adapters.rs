//! Adapter files against the tools that write them: LoRA and DoRA adapters
//! written by PEFT 0.21.2 and mlx-lm 0.32.2 on the `llama-3.1-8b` fixture
//! (grouped-query attention, an explicit head width) by
//! `tests/fixtures/adapters/make_fixtures.py`, with the adapted models'
//! logits. What we write has their names, shapes and configuration keys;
//! what they wrote loads here and gives their logits; our files read back
//! as written, with the query and key rows in RoPE-by-halves order in the
//! files; and broken files are refused by name.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_array::{Array, Tree};
use mlx_llama::adapters::files::{self, Layout, Rows, SaveOptions};
use mlx_llama::adapters::{AdapterKind, AdapterSpec, Target, mlx_lm, peft};
use mlx_llama::export::hf::halves_row_order;
use mlx_llama::import::{self, Tensor};
use mlx_llama::{Llama, LlamaConfig};
use mlx_nn::ModuleExt;
use proptest::prelude::*;

const BASE: &str = "llama-3.1-8b";
const FIXTURES: [(&str, Layout); 4] = [
    ("peft-lora", Layout::Peft),
    ("peft-dora", Layout::Peft),
    ("mlx-lm-lora", Layout::MlxLm),
    ("mlx-lm-dora", Layout::MlxLm),
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixture(name: &str) -> PathBuf {
    fixtures().join("adapters").join(name)
}

fn base_dir() -> PathBuf {
    fixtures().join("hf_llamas").join(BASE)
}

fn base_config() -> LlamaConfig {
    import::read_config(&base_dir()).unwrap().model
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn read_tensors(path: &Path) -> BTreeMap<String, Tensor> {
    import::parse_safetensors(&std::fs::read(path).unwrap()).unwrap()
}

/// The specs the fixture script used, by hand.
fn expected_spec(name: &str) -> AdapterSpec {
    use Target::*;
    let (kind, rank, alpha, layers, targets) = match name {
        "peft-lora" => (AdapterKind::Lora, 4, 8.0, vec![0], vec![Q, K, V, Down]),
        "peft-dora" => (AdapterKind::Dora, 2, 3.0, vec![0, 1], vec![Q, K, O, Gate]),
        "mlx-lm-lora" => (AdapterKind::Lora, 4, 10.0, vec![1], vec![Q, K, Up]),
        "mlx-lm-dora" => (AdapterKind::Dora, 2, 3.0, vec![0, 1], vec![Q, K, V]),
        _ => unreachable!(),
    };
    AdapterSpec {
        kind,
        rank,
        alpha,
        dropout: 0.0,
        layers,
        targets,
    }
}

/// The fixture's token ids `[2, 12]`.
fn ids() -> Array {
    let json = read_json(&base_dir().join("reference.json"));
    let rows: Vec<Vec<u32>> = serde_json::from_value(json["ids"].clone()).unwrap();
    Array::from_slice(&rows.concat(), &[rows.len(), rows[0].len()]).unwrap()
}

/// The imported base with `spec`'s adapters holding `tensors` (our names).
fn adapted(spec: &AdapterSpec, tensors: &[(String, Array)]) -> Llama {
    let mut model = import::load(&base_dir()).unwrap();
    model.add_adapters(spec, 0).unwrap();
    model
        .update(&Tree::unflatten(tensors.iter().cloned()).unwrap())
        .unwrap();
    model
}

fn values(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

#[test]
fn adapters_written_by_peft_and_mlx_lm_load_with_their_specs() {
    let config = base_config();
    for (name, layout) in FIXTURES {
        assert_eq!(Layout::detect(&fixture(name)).unwrap(), layout, "{name}");
        let (spec, tensors) = files::load(&fixture(name), &config).unwrap();
        assert_eq!(spec, expected_spec(name), "{name}");
        // Every adapter tensor of the model add_adapters builds, in its shape.
        let mut model = import::load(&base_dir()).unwrap();
        model.add_adapters(&spec, 0).unwrap();
        let want: BTreeMap<String, Vec<usize>> = model
            .adapter_parameters()
            .into_iter()
            .map(|(n, a)| (n, a.shape().to_vec()))
            .collect();
        let got: BTreeMap<String, Vec<usize>> = tensors
            .iter()
            .map(|(n, a)| (n.clone(), a.shape().to_vec()))
            .collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn adapters_written_by_peft_and_mlx_lm_give_their_logits_here() {
    let config = base_config();
    let ids = ids();
    for (name, _) in FIXTURES {
        let (spec, tensors) = files::load(&fixture(name), &config).unwrap();
        let model = adapted(&spec, &tensors);
        let logits = model.forward(&ids).unwrap();
        let want = &read_tensors(&fixture(name).join("logits.safetensors"))["logits"];
        assert_eq!(logits.shape(), want.shape, "{name}");
        common::assert_close(name, &values(&logits), &want.values, 1e-4);
        // The adapters change the logits: the comparison is not the base's.
        let base = import::load(&base_dir()).unwrap().forward(&ids).unwrap();
        let base = values(&base);
        let moved = base
            .iter()
            .zip(&want.values)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            moved > 1e-2,
            "{name}: the adapter moves the logits by {moved} only"
        );
    }
}

/// The query and key adapters read with the rows left in the file's
/// order give other logits: the reorder is what makes them match.
#[test]
fn without_the_row_reorder_the_logits_differ() {
    let config = base_config();
    let ids = ids();
    for name in ["peft-lora", "mlx-lm-dora"] {
        let (spec, tensors) = files::load_rows(&fixture(name), &config, Rows::Interleaved).unwrap();
        let logits = adapted(&spec, &tensors).forward(&ids).unwrap();
        let want = &read_tensors(&fixture(name).join("logits.safetensors"))["logits"];
        let worst = values(&logits)
            .iter()
            .zip(&want.values)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst > 1e-3, "{name}: {worst}");
    }
}

/// Names with shapes, as `written.json` lists them.
fn names_and_shapes(t: &BTreeMap<String, Tensor>) -> Vec<(String, Vec<usize>)> {
    t.iter()
        .map(|(n, t)| (n.clone(), t.shape.clone()))
        .collect()
}

#[test]
fn what_we_write_has_the_names_shapes_keys_and_values_the_tools_wrote() {
    let config = base_config();
    for (name, layout) in FIXTURES {
        let theirs = fixture(name);
        let (spec, tensors) = files::load(&theirs, &config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let options = SaveOptions::default().layout(layout).base_model(BASE);
        files::save(dir.path(), &spec, &config, &tensors, &options).unwrap();
        let written = read_json(&theirs.join("written.json"));
        let want_tensors: Vec<(String, Vec<usize>)> =
            serde_json::from_value(written["tensors"].clone()).unwrap();
        let want_keys: Vec<String> =
            serde_json::from_value(written["config_keys"].clone()).unwrap();
        let ours = read_tensors(&dir.path().join(layout.weights_file()));
        assert_eq!(names_and_shapes(&ours), want_tensors, "{name}");
        let our_config = read_json(&dir.path().join(files::CONFIG));
        let our_keys: Vec<String> = our_config.as_object().unwrap().keys().cloned().collect();
        assert_eq!(our_keys, want_keys, "{name}");
        // The same values, bit for bit: their rows went to ours and back.
        let theirs_tensors = read_tensors(&theirs.join(layout.weights_file()));
        assert_eq!(ours, theirs_tensors, "{name}");
        // And the configuration's values that matter.
        let their_config = read_json(&theirs.join(files::CONFIG));
        let keys: &[&str] = match layout {
            Layout::Peft => &[
                "peft_type",
                "task_type",
                "r",
                "lora_alpha",
                "lora_dropout",
                "layers_to_transform",
                "use_dora",
                "bias",
                "fan_in_fan_out",
                "base_model_name_or_path",
                "modules_to_save",
                "use_rslora",
            ],
            Layout::MlxLm => &["fine_tune_type", "num_layers", "model"],
        };
        for k in keys {
            assert_eq!(our_config[k], their_config[k], "{name}: `{k}`");
        }
        match layout {
            Layout::Peft => {
                let set = |c: &serde_json::Value| {
                    let mut v: Vec<String> =
                        serde_json::from_value(c["target_modules"].clone()).unwrap();
                    v.sort();
                    v
                };
                assert_eq!(set(&our_config), set(&their_config), "{name}");
            }
            Layout::MlxLm => {
                let (o, t) = (
                    &our_config["lora_parameters"],
                    &their_config["lora_parameters"],
                );
                let keys = |p: &serde_json::Value| -> Vec<String> {
                    p.as_object().unwrap().keys().cloned().collect()
                };
                assert_eq!(keys(o), keys(t), "{name}");
                for k in ["rank", "scale", "dropout"] {
                    assert_eq!(o[k].as_f64(), t[k].as_f64(), "{name}: lora_parameters.{k}");
                }
                assert_eq!(o["keys"], t["keys"], "{name}");
            }
        }
    }
}

/// A model of the fixture's shape with `spec`'s adapters holding random
/// values, none of them symmetric within a head.
fn random_adapters(spec: &AdapterSpec, seed: u64) -> Vec<(String, Array)> {
    let mut model = import::load(&base_dir()).unwrap();
    model.add_adapters(spec, seed).unwrap();
    let key = mlx_array::random::key(seed);
    model
        .adapter_parameters()
        .into_iter()
        .enumerate()
        .map(|(i, (n, a))| {
            let k = mlx_array::random::split_keys(&key, i + 2).unwrap()[i + 1].clone();
            let r = mlx_array::random::normal(&k, a.shape(), mlx_array::Dtype::F32).unwrap();
            (n, r)
        })
        .collect()
}

fn spec(kind: AdapterKind, layers: Vec<usize>, targets: Vec<Target>) -> AdapterSpec {
    AdapterSpec {
        kind,
        rank: 3,
        alpha: 5.0,
        dropout: 0.05,
        layers,
        targets,
    }
}

#[test]
fn our_adapters_read_back_as_written_in_both_layouts() {
    let config = base_config();
    let ids = ids();
    for kind in [AdapterKind::Lora, AdapterKind::Dora] {
        for layout in [Layout::Peft, Layout::MlxLm] {
            let spec = spec(kind, vec![1], Target::ALL.to_vec());
            let tensors = random_adapters(&spec, 7);
            for rows in [Rows::Halves, Rows::Interleaved] {
                let dir = tempfile::tempdir().unwrap();
                let options = SaveOptions::default().layout(layout).rows(rows);
                files::save(dir.path(), &spec, &config, &tensors, &options).unwrap();
                let (back, got) = files::load_rows(dir.path(), &config, rows).unwrap();
                assert_eq!(back, spec, "{kind:?} {layout:?} {rows:?}");
                let want: BTreeMap<String, Vec<f32>> = tensors
                    .iter()
                    .map(|(n, a)| (n.clone(), values(a)))
                    .collect();
                let got: BTreeMap<String, Vec<f32>> =
                    got.iter().map(|(n, a)| (n.clone(), values(a))).collect();
                assert_eq!(got, want, "{kind:?} {layout:?} {rows:?}");
            }
            // The same model's logits, through the files.
            let dir = tempfile::tempdir().unwrap();
            let options = SaveOptions::default().layout(layout);
            files::save(dir.path(), &spec, &config, &tensors, &options).unwrap();
            let (back, got) = files::load(dir.path(), &config).unwrap();
            assert_eq!(
                values(&adapted(&back, &got).forward(&ids).unwrap()),
                values(&adapted(&spec, &tensors).forward(&ids).unwrap())
            );
        }
    }
}

/// In the files, a query or key adapter's output rows are in RoPE-by-halves
/// order within each head (query heads for q, key/value heads for k),
/// every other tensor as ours; with `Rows::Interleaved`, all as ours.
#[test]
fn query_and_key_rows_are_reordered_within_each_head_in_the_files() {
    let config = base_config();
    let d = config.head_dim();
    let spec = spec(AdapterKind::Dora, vec![0, 1], Target::ALL.to_vec());
    let tensors = random_adapters(&spec, 3);
    let ours: BTreeMap<String, Tensor> = tensors
        .iter()
        .map(|(n, a)| {
            let t = Tensor {
                shape: a.shape().to_vec(),
                values: values(a),
            };
            (n.clone(), t)
        })
        .collect();
    let rows = |t: &Tensor, order: &[usize]| -> Vec<f32> {
        let cols = t.values.len() / t.shape[0];
        order
            .iter()
            .flat_map(|&r| t.values[r * cols..(r + 1) * cols].to_vec())
            .collect()
    };
    for reorder in [Rows::Halves, Rows::Interleaved] {
        let dir = tempfile::tempdir().unwrap();
        let options = SaveOptions::default().rows(reorder);
        files::save(dir.path(), &spec, &config, &tensors, &options).unwrap();
        let file = read_tensors(&dir.path().join(peft::WEIGHTS));
        for &l in &spec.layers {
            for t in Target::ALL {
                let heads = match t {
                    Target::Q => Some(config.num_heads),
                    Target::K => Some(config.kv_heads()),
                    _ => None,
                };
                for leaf in [files::Leaf::A, files::Leaf::B, files::Leaf::Magnitude] {
                    let mine = &ours[&files::our_name(l, t, leaf)];
                    let theirs = &file[&peft::name(l, t, leaf)];
                    let want = match (heads, leaf, reorder) {
                        (Some(h), files::Leaf::B | files::Leaf::Magnitude, Rows::Halves) => {
                            let order = halves_row_order(h, d);
                            let moved = rows(mine, &order);
                            assert_ne!(moved, mine.values, "the test's rows are not symmetric");
                            moved
                        }
                        _ => mine.values.clone(),
                    };
                    assert_eq!(theirs.values, want, "{l} {t} {leaf:?} {reorder:?}");
                }
            }
        }
    }
}

#[test]
fn mlx_lm_s_layout_takes_only_the_last_blocks() {
    let config = base_config();
    let first = spec(AdapterKind::Lora, vec![0], vec![Target::Q]);
    let tensors = random_adapters(&first, 1);
    let dir = tempfile::tempdir().unwrap();
    let options = SaveOptions::default().layout(Layout::MlxLm);
    let e = files::save(dir.path(), &first, &config, &tensors, &options).unwrap_err();
    assert!(
        format!("{e:#}").contains("last `num_layers` blocks"),
        "{e:#}"
    );
    // PEFT's takes them (layers_to_transform).
    files::save(
        dir.path(),
        &first,
        &config,
        &tensors,
        &SaveOptions::default(),
    )
    .unwrap();
    let c = read_json(&dir.path().join(files::CONFIG));
    assert_eq!(c["layers_to_transform"], serde_json::json!([0]));
}

#[test]
fn saving_never_replaces_a_different_adapter_unasked() {
    let config = base_config();
    let s = spec(AdapterKind::Lora, vec![1], vec![Target::Q, Target::V]);
    let one = random_adapters(&s, 1);
    let two = random_adapters(&s, 2);
    let dir = tempfile::tempdir().unwrap();
    let peft_opts = SaveOptions::default();
    files::save(dir.path(), &s, &config, &one, &peft_opts).unwrap();
    // The same adapter again: nothing to replace.
    files::save(dir.path(), &s, &config, &one, &peft_opts).unwrap();
    let e = files::save(dir.path(), &s, &config, &two, &peft_opts).unwrap_err();
    assert!(format!("{e:#}").contains("different adapter"), "{e:#}");
    let (_, back) = files::load(dir.path(), &config).unwrap();
    assert_eq!(
        values(&back[0].1),
        values(&one[0].1),
        "unchanged after the refusal"
    );
    // Another layout's adapter in the folder is another adapter.
    let mlx_opts = SaveOptions::default().layout(Layout::MlxLm);
    let e = files::save(dir.path(), &s, &config, &one, &mlx_opts).unwrap_err();
    assert!(format!("{e:#}").contains("another adapter"), "{e:#}");
    files::save(
        dir.path(),
        &s,
        &config,
        &two,
        &peft_opts.clone().overwrite(true),
    )
    .unwrap();
    let (_, back) = files::load(dir.path(), &config).unwrap();
    assert_eq!(values(&back[0].1), values(&two[0].1));
    files::save(dir.path(), &s, &config, &two, &mlx_opts.overwrite(true)).unwrap();
    assert_eq!(Layout::detect(dir.path()).unwrap(), Layout::MlxLm);
    assert!(!dir.path().join(peft::WEIGHTS).exists());
    // No temporary files left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("tmp")), "{names:?}");
}

#[test]
fn saving_refuses_tensors_that_do_not_fit_the_spec_or_the_model() {
    let config = base_config();
    let s = spec(AdapterKind::Lora, vec![1], vec![Target::Q]);
    let tensors = random_adapters(&s, 1);
    let save = |spec: &AdapterSpec, t: &[(String, Array)]| {
        let dir = tempfile::tempdir().unwrap();
        let e = files::save(dir.path(), spec, &config, t, &SaveOptions::default()).unwrap_err();
        format!("{e:#}")
    };
    let mut base = tensors.clone();
    base.push((
        "layers.1.attention.query_proj.base.weight".into(),
        Array::zeros(&[128, 96], mlx_array::Dtype::F32),
    ));
    assert!(save(&s, &base).contains("not an adapter tensor"));
    let dora = AdapterSpec {
        kind: AdapterKind::Dora,
        ..s.clone()
    };
    assert!(save(&dora, &tensors).contains("magnitude` is missing"));
    let rank = AdapterSpec {
        rank: 5,
        ..s.clone()
    };
    assert!(save(&rank, &tensors).contains("the configuration says 5"));
    let more = AdapterSpec {
        targets: vec![Target::Q, Target::K],
        ..s.clone()
    };
    assert!(save(&more, &tensors).contains("key_proj.lora_a` is missing"));
}

/// A copy of fixture `name` in a temporary folder, its configuration
/// changed by `edit`.
fn edited(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(fixture(name)).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
    }
    let path = dir.path().join(files::CONFIG);
    let mut c = read_json(&path);
    edit(&mut c);
    std::fs::write(&path, serde_json::to_vec(&c).unwrap()).unwrap();
    dir
}

fn load_error(dir: &Path, config: &LlamaConfig) -> String {
    format!("{:#}", files::load(dir, config).unwrap_err())
}

#[test]
fn peft_configurations_we_cannot_honour_are_refused_by_name() {
    let config = base_config();
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "peft_type",
            "PREFIX_TUNING".into(),
            "`peft_type` is \"PREFIX_TUNING\"",
        ),
        ("task_type", "SEQ_CLS".into(), "`task_type` is \"SEQ_CLS\""),
        ("bias", "all".into(), "`bias` is \"all\""),
        ("fan_in_fan_out", true.into(), "`fan_in_fan_out` is true"),
        (
            "target_modules",
            serde_json::json!(["q_proj", "lm_head"]),
            "\"lm_head\"",
        ),
        (
            "target_modules",
            serde_json::json!(["embed_tokens"]),
            "embedding",
        ),
        (
            "target_modules",
            serde_json::json!(["qkv"]),
            "\"qkv\": not a projection",
        ),
        ("target_modules", ".*proj".into(), "the pattern"),
        ("layers_to_transform", serde_json::json!([0, 5]), "block 5"),
        (
            "rank_pattern",
            serde_json::json!({"q_proj": 8}),
            "`rank_pattern`",
        ),
        (
            "modules_to_save",
            serde_json::json!(["lm_head"]),
            "`modules_to_save`",
        ),
        ("lora_bias", true.into(), "`lora_bias`"),
        ("init_lora_weights", "pissa".into(), "PiSSA"),
        ("r", 8.into(), "rank 4, but the configuration says 8"),
        ("r", 0.into(), "`r` is 0"),
        ("r", "four".into(), "`r` must be a non-negative integer"),
        ("use_dora", true.into(), "lora_magnitude_vector` is missing"),
    ];
    for (key, value, want) in cases {
        let dir = edited("peft-lora", |c| c[key] = value.clone());
        let e = load_error(dir.path(), &config);
        assert!(e.contains(want), "{key} = {value}: {e}");
        assert!(
            e.contains(dir.path().to_str().unwrap()),
            "names the folder: {e}"
        );
    }
    // rsLoRA's alpha / sqrt(r) is the same scale as ours under another alpha.
    let dir = edited("peft-lora", |c| c["use_rslora"] = true.into());
    let (s, _) = files::load(dir.path(), &config).unwrap();
    assert_eq!(s.scale(), 8.0 / 2.0);
    // all-linear: every projection (and then tensors are missing).
    let dir = edited("peft-lora", |c| c["target_modules"] = "all-linear".into());
    assert!(load_error(dir.path(), &config).contains("o_proj.lora_A.weight` is missing"));
}

#[test]
fn mlx_lm_configurations_we_cannot_honour_are_refused_by_name() {
    let config = base_config();
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("fine_tune_type", "full".into(), "not adapters"),
        (
            "fine_tune_type",
            "qlora".into(),
            "`fine_tune_type` is \"qlora\"",
        ),
        (
            "num_layers",
            5.into(),
            "`num_layers` is 5, but the model has 2 blocks",
        ),
        (
            "num_layers",
            serde_json::Value::Null,
            "`num_layers` is missing",
        ),
        (
            "lora_parameters",
            serde_json::json!({"rank": 4, "scale": 2.5, "dropout": 0.0, "keys": ["self_attn.rope"]}),
            "\"self_attn.rope\"",
        ),
        (
            "lora_parameters",
            serde_json::json!({"rank": 4, "alpha": 10, "dropout": 0.0}),
            "`lora_parameters.scale` is missing",
        ),
        (
            "lora_parameters",
            serde_json::json!({"rank": 8, "scale": 2.5, "keys": ["self_attn.q_proj", "self_attn.k_proj", "mlp.up_proj"]}),
            "rank 4, but the configuration says 8",
        ),
        // Both blocks: block 0's tensors are missing.
        (
            "num_layers",
            2.into(),
            "model.layers.0.self_attn.q_proj.lora_a` is missing",
        ),
        (
            "num_layers",
            (-1).into(),
            "model.layers.0.self_attn.q_proj.lora_a` is missing",
        ),
    ];
    for (key, value, want) in cases {
        let dir = edited("mlx-lm-lora", |c| c[key] = value.clone());
        let e = load_error(dir.path(), &config);
        assert!(e.contains(want), "{key} = {value}: {e}");
    }
}

#[test]
fn tensors_that_do_not_fit_the_model_are_refused_by_name() {
    let config = base_config();
    // A model with one block: the adapter's block 1 is not there.
    let one_block = LlamaConfig {
        num_layers: 1,
        ..config.clone()
    };
    let e = load_error(&fixture("mlx-lm-lora"), &one_block);
    assert!(
        e.contains("`num_layers` is 1") || e.contains("block 1"),
        "{e}"
    );
    let e = load_error(&fixture("peft-dora"), &one_block);
    assert!(e.contains("block 1"), "{e}");
    // Narrower heads: the shapes do not fit.
    let narrow = LlamaConfig {
        head_dim: 8,
        ..config.clone()
    };
    let e = load_error(&fixture("peft-lora"), &narrow);
    assert!(
        e.contains("self_attn.q_proj.lora_B.weight` has shape [128, 4], expected [64, 4]"),
        "{e}"
    );
    // A tensor the configuration does not name, or no adapter's at all.
    let rewrite = |name: &str, from: &str, to: &str| {
        let dir = edited(name, |_| {});
        let layout = Layout::detect(dir.path()).unwrap();
        let path = dir.path().join(layout.weights_file());
        let tensors = read_tensors(&path);
        let renamed: Vec<(String, Array)> = tensors
            .into_iter()
            .map(|(n, t)| {
                (
                    n.replace(from, to),
                    Array::from_slice(&t.values, &t.shape).unwrap(),
                )
            })
            .collect();
        mlx_array::save_safetensors(&path, &renamed, None).unwrap();
        dir
    };
    let dir = rewrite(
        "peft-lora",
        "layers.0.mlp.down_proj",
        "layers.1.mlp.down_proj",
    );
    let e = load_error(dir.path(), &config);
    assert!(
        e.contains("layers.1.mlp.down_proj.lora_A.weight` is for block 1"),
        "{e}"
    );
    let dir = rewrite(
        "peft-lora",
        "layers.0.mlp.down_proj",
        "layers.7.mlp.down_proj",
    );
    let e = load_error(dir.path(), &config);
    assert!(
        e.contains("is for block 7, but the model has 2 blocks"),
        "{e}"
    );
    let dir = rewrite(
        "mlx-lm-lora",
        "mlp.up_proj.lora_a",
        "mlp.up_proj.linear.weight",
    );
    let e = load_error(dir.path(), &config);
    assert!(
        e.contains("`model.layers.1.mlp.up_proj.linear.weight` is not an adapter tensor"),
        "{e}"
    );
    let dir = rewrite("peft-lora", "lora_A.weight", "lora_A.default.weight");
    let e = load_error(dir.path(), &config);
    assert!(e.contains("is not a LoRA tensor"), "{e}");
    assert!(e.contains(peft::WEIGHTS), "{e}");
}

#[test]
fn folders_without_one_adapter_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = format!("{:#}", Layout::detect(dir.path()).unwrap_err());
    assert!(e.contains("holds no adapter"), "{e}");
    std::fs::write(dir.path().join(peft::PICKLE_WEIGHTS), b"pickle").unwrap();
    let e = format!("{:#}", Layout::detect(dir.path()).unwrap_err());
    assert!(e.contains("safe_serialization"), "{e}");
    std::fs::write(dir.path().join(peft::WEIGHTS), b"").unwrap();
    std::fs::write(dir.path().join(mlx_lm::WEIGHTS), b"").unwrap();
    let e = format!("{:#}", Layout::detect(dir.path()).unwrap_err());
    assert!(e.contains("both"), "{e}");
    // A configuration too large to be one.
    let dir = edited("peft-lora", |c| c["padding"] = "x".repeat(2 << 20).into());
    assert!(load_error(dir.path(), &base_config()).contains("larger than"));
}

fn fixture_bytes(name: &str, layout: Layout) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(fixture(name).join(files::CONFIG)).unwrap(),
        std::fs::read(fixture(name).join(layout.weights_file())).unwrap(),
    )
}

/// Arbitrary JSON values, a few levels deep.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "[a-z_.]{0,12}".prop_map(serde_json::Value::from),
        Just(serde_json::json!(["q_proj", "self_attn.k_proj", "lm_head"])),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary bytes as either configuration: an error, never a panic.
    #[test]
    fn configurations_of_arbitrary_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = peft::parse_config(&bytes, 2);
        let _ = mlx_lm::parse_config(&bytes, 2);
    }

    /// One field of a real configuration (or of mlx-lm's
    /// `lora_parameters`) set to an arbitrary value: a spec that passes
    /// its checks, or an error.
    #[test]
    fn configurations_with_a_field_changed_are_specs_or_errors(
        which in 0usize..4,
        field in 0usize..64,
        value in json_value(),
    ) {
        let (name, layout) = FIXTURES[which];
        let (config_bytes, weights) = fixture_bytes(name, layout);
        let mut c: serde_json::Value = serde_json::from_slice(&config_bytes).unwrap();
        let target = if layout == Layout::MlxLm && field % 2 == 0 {
            &mut c["lora_parameters"]
        } else {
            &mut c
        };
        let keys: Vec<String> = target.as_object().unwrap().keys().cloned().collect();
        let key = keys[field % keys.len()].clone();
        target[key.as_str()] = value;
        let bytes = serde_json::to_vec(&c).unwrap();
        let parsed = match layout {
            Layout::Peft => peft::parse_config(&bytes, 2),
            Layout::MlxLm => mlx_lm::parse_config(&bytes, 2),
        };
        if let Ok(spec) = parsed {
            prop_assert!(spec.check(2).is_ok());
        }
        let _ = files::parse(layout, &bytes, &weights, &base_config(), Rows::Halves);
    }

    /// Arbitrary weights bytes beside a real configuration, and a real
    /// weights file with bytes changed: an error or tensors that fit.
    #[test]
    fn weights_of_arbitrary_or_mutated_bytes_are_errors_not_panics(
        which in 0usize..4,
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let (name, layout) = FIXTURES[which];
        let (config_bytes, mut weights) = fixture_bytes(name, layout);
        let config = base_config();
        let _ = files::parse(layout, &config_bytes, &bytes, &config, Rows::Halves);
        // Flips within the header (its first bytes) and anywhere.
        for (i, (at, b)) in flips.iter().enumerate() {
            let n = if i % 2 == 0 { weights.len().min(512) } else { weights.len() };
            let at = at.index(n);
            weights[at] = *b;
        }
        if let Ok((spec, tensors)) = files::parse(layout, &config_bytes, &weights, &config, Rows::Halves) {
            let per_adapter = if spec.kind == AdapterKind::Dora { 3 } else { 2 };
            prop_assert_eq!(tensors.len(), spec.layers.len() * spec.targets.len() * per_adapter);
        }
    }
}
