//! Where a model comes from, through the real `mlx-llama` program:
//! `train --init-from` a run folder, a checkpoint folder, an export, and a
//! Hub name served by a local Hub server (then offline, from the cache);
//! `generate --checkpoint org/name` stopping at the model's own
//! end-of-sequence token, on one process and tensor-parallel; the errors
//! for what is neither a folder nor a Hub name.
//!
//! Every process runs with `HF_HOME` in a temporary folder and
//! `HF_ENDPOINT` at a local server or a closed port: nothing reaches the
//! internet.

mod common;

#[allow(dead_code)]
#[path = "../../mlx-data/tests/common/hub_server.rs"]
mod hub_server;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hub_server::{HubServer, ServedFile};
use mlx_array::Array;
use mlx_data::TextTokenizer;
use mlx_llama::export::{self, Format};
use mlx_llama::{Llama, LlamaConfig, TokenizerChoice};
use mlx_nn::{Module, ModuleExt};

/// Where the program looks for the Hub.
struct Hub<'a> {
    /// `HF_HOME`.
    home: &'a Path,
    /// `HF_ENDPOINT`.
    endpoint: &'a str,
    /// `HF_HUB_OFFLINE=1`.
    offline: bool,
}

fn mlx_llama<S: AsRef<OsStr>>(args: &[S], hub: &Hub) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-llama"));
    c.args(args)
        .env_remove("MLX_PROGRESS")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env("HF_HOME", hub.home)
        .env("HF_ENDPOINT", hub.endpoint);
    if hub.offline {
        c.env("HF_HUB_OFFLINE", "1");
    } else {
        c.env_remove("HF_HUB_OFFLINE");
    }
    c.output().expect("running mlx-llama")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// An endpoint nobody listens on.
fn dead_endpoint() -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    dead
}

/// `train` of one step at learning rate 0 (so the checkpoint holds the
/// weights it started from) on the offline corpus, with model options
/// that a source's shape must override, into `out`.
fn train_from(source: &str, out: &Path, hub: &Hub) -> Output {
    let summary = out.with_extension("summary.json");
    let mut args: Vec<String> = [
        "train",
        "--init-from",
        source,
        "--steps",
        "1",
        "--lr",
        "0",
        "--global-batch",
        "2",
        "--block-size",
        "32",
        "--eval-every",
        "0",
        "--report-to",
        "none",
        "--data",
        "offline",
        "--layers",
        "3",
        "--dims",
        "64",
    ]
    .map(String::from)
    .to_vec();
    for (k, v) in [
        ("--out", out),
        ("--data-cache", &common::data_cache()),
        ("--summary", &summary),
    ] {
        args.push(k.into());
        args.push(v.to_string_lossy().into_owned());
    }
    let o = mlx_llama(&args, hub);
    if o.status.success() {
        let s: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
        assert_eq!(s["resumed_at"], 0, "a new run, not a resume: {s}");
    }
    o
}

/// Two steps of the tiny model on the offline corpus into `out`, with
/// `extra` options.
fn train_base(out: &Path, extra: &[&str], hub: &Hub) {
    let mut args: Vec<String> = [
        "train",
        "--steps",
        "2",
        "--global-batch",
        "2",
        "--eval-every",
        "0",
        "--report-to",
        "none",
        "--data",
        "offline",
        "--out",
    ]
    .map(String::from)
    .to_vec();
    args.push(out.to_string_lossy().into_owned());
    args.push("--data-cache".into());
    args.push(common::data_cache().to_string_lossy().into_owned());
    args.extend(common::TINY_MODEL_ARGS.iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    let o = mlx_llama(&args, hub);
    assert!(o.status.success(), "{}", text(&o));
}

/// The newest checkpoint of `run`: its training and model configurations.
fn configs(run: &Path) -> (mlx_llama::TrainConfig, LlamaConfig) {
    let dir = mlx_llama::checkpoint::latest(run).unwrap().unwrap();
    mlx_llama::checkpoint::configs(&dir).unwrap()
}

/// Layers, width, MLP width, heads and vocabulary.
fn shape(c: &LlamaConfig) -> [usize; 5] {
    [c.num_layers, c.dims, c.mlp_dims, c.num_heads, c.vocab_size]
}

fn weights_of(m: &Llama) -> Vec<(String, Vec<f32>)> {
    let mut w: Vec<_> = m
        .named_parameters()
        .into_iter()
        .map(|(n, a)| (n, a.to_vec::<f32>().unwrap()))
        .collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

fn sorted(mut w: Vec<(String, Vec<f32>)>) -> Vec<(String, Vec<f32>)> {
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

#[test]
fn train_init_from_a_run_folder_a_checkpoint_or_an_export_starts_a_new_run_from_its_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let dead = dead_endpoint();
    let hub = Hub {
        home: &tmp.path().join("hf"),
        endpoint: &dead,
        offline: false,
    };
    let base = tmp.path().join("base");
    train_base(&base, &[], &hub);
    let (base_cfg, base_model) = configs(&base);
    let base_weights = sorted(common::weights(&base));
    let checkpoint = mlx_llama::checkpoint::latest(&base).unwrap().unwrap();
    let exported = tmp.path().join("exported");
    export::export(&base, &exported, Format::Hf).unwrap();

    for (name, source, tokenizer) in [
        ("run", &base, base_cfg.tokenizer.clone()),
        ("checkpoint", &checkpoint, base_cfg.tokenizer.clone()),
        (
            "export",
            &exported,
            TokenizerChoice::File(exported.join("tokenizer.json")),
        ),
    ] {
        let out = tmp.path().join(format!("from-{name}"));
        let o = train_from(&source.to_string_lossy(), &out, &hub);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let (cfg, model) = configs(&out);
        // The source's shape, not the options' (3 layers of 64).
        assert_eq!(shape(&model), shape(&base_model), "{name}");
        assert_eq!(cfg.tokenizer, tokenizer, "{name}");
        assert_eq!(
            cfg.init_from.as_ref().map(|s| s.as_str().to_owned()),
            Some(source.to_string_lossy().into_owned()),
            "{name}"
        );
        // At learning rate 0 the new run's checkpoint holds the source's weights.
        assert_eq!(sorted(common::weights(&out)), base_weights, "{name}");
    }

    // A path that does not exist and is no Hub name: refused before the
    // run folder is made.
    let out = tmp.path().join("nowhere");
    let o = train_from("./no/such/run", &out, &hub);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("`./no/such/run` does not exist"),
        "a path, said to be missing: {}",
        text(&o)
    );
    assert!(!out.exists());
    let o = train_from("no/such/run", &out, &hub);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("neither an existing folder nor a Hub model name"),
        "{}",
        text(&o)
    );
    assert!(!out.exists());
    // An existing folder that is none of the three.
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = train_from(&empty.to_string_lossy(), &out, &hub);
    assert!(!o.status.success());
    assert!(text(&o).contains("neither a run folder"), "{}", text(&o));
}

#[test]
fn init_from_a_run_that_trained_its_tokenizer_keeps_that_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let dead = dead_endpoint();
    let hub = Hub {
        home: &tmp.path().join("hf"),
        endpoint: &dead,
        offline: false,
    };
    let base = tmp.path().join("base");
    train_base(&base, &["--tokenizer", "train:300"], &hub);
    let (base_cfg, _) = configs(&base);
    assert_eq!(base_cfg.tokenizer, TokenizerChoice::Train(300));
    let trained = mlx_llama::trainer::tokenizer_for(&base_cfg).unwrap();
    // The checkpoint keeps the trained tokenizer, listed in its manifest:
    // it is read from there, not from the data cache the manifest names
    // (here a path that cannot hold one).
    let ckpt = mlx_llama::checkpoint::latest(&base).unwrap().unwrap();
    let copy = ckpt.join("tokenizer.json");
    assert_eq!(
        TextTokenizer::from_file(&copy).unwrap().hash(),
        trained.hash()
    );
    let manifest = ckpt.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    assert!(
        m["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "tokenizer.json"),
        "{m}"
    );
    m["config"]["data_cache"] = "/dev/null/no-cache".into();
    std::fs::write(&manifest, m.to_string()).unwrap();
    assert_eq!(
        mlx_llama::checkpoint::tokenizer_of(&ckpt).unwrap(),
        TokenizerChoice::File(copy)
    );
    let out = tmp.path().join("from-run");
    let o = train_from(&base.to_string_lossy(), &out, &hub);
    assert!(o.status.success(), "{}", text(&o));
    // The run trained on the base run's tokenizer, kept in its folder.
    let (cfg, model) = configs(&out);
    let file = out.join("tokenizer.json");
    assert_eq!(cfg.tokenizer, TokenizerChoice::File(file.clone()));
    assert_eq!(
        TextTokenizer::from_file(&file).unwrap().hash(),
        trained.hash()
    );
    assert_eq!(model.vocab_size, trained.vocab_size());
    assert_eq!(
        sorted(common::weights(&out)),
        sorted(common::weights(&base))
    );
}

/// Every file of `dir`, served as repository `repo`.
fn serve_folder(files: &mut HashMap<String, ServedFile>, repo: &str, dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        files.insert(
            format!("{repo}/{name}"),
            ServedFile::lfs(std::fs::read(&p).unwrap()),
        );
    }
}

#[test]
fn train_init_from_a_hub_name_fetches_it_then_trains_from_the_cache_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let config = LlamaConfig {
        num_layers: 1,
        vocab_size: mlx_data::tokenizer::gpt2::VOCAB_SIZE,
        dims: 32,
        mlp_dims: 64,
        num_heads: 2,
        ..LlamaConfig::default()
    };
    let m = Llama::new(&config, 5).unwrap();
    let folder = tmp.path().join("folder");
    export::write(&m, &TextTokenizer::gpt2().unwrap(), 32, &folder, Format::Hf).unwrap();
    let mut files = HashMap::new();
    serve_folder(&mut files, "org/tiny-llama", &folder);
    let srv = HubServer::start(files);
    let home = tmp.path().join("hf");
    let online = Hub {
        home: &home,
        endpoint: &srv.endpoint,
        offline: false,
    };
    let out = tmp.path().join("from-hub");
    let o = train_from("org/tiny-llama", &out, &online);
    assert!(o.status.success(), "{}", text(&o));
    let snapshot = home
        .join("hub/models--org--tiny-llama/snapshots")
        .join(&srv.state.commit);
    let (cfg, model) = configs(&out);
    assert_eq!(model.dims, 32);
    assert_eq!(model.num_layers, 1);
    assert_eq!(
        cfg.tokenizer,
        TokenizerChoice::File(snapshot.join("tokenizer.json"))
    );
    assert_eq!(sorted(common::weights(&out)), weights_of(&m));
    // The model's files came from the server; the GPT-2 files beside them did not.
    let got: Vec<String> = srv
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET")
        .map(|s| s.path)
        .collect();
    assert!(
        got.iter().any(|p| p.ends_with("/model.safetensors")),
        "{got:?}"
    );
    assert!(!got.iter().any(|p| p.ends_with("/vocab.json")), "{got:?}");

    // Offline, the server gone: from the cache.
    drop(srv);
    let dead = dead_endpoint();
    let offline = Hub {
        home: &home,
        endpoint: &dead,
        offline: true,
    };
    let again = tmp.path().join("from-cache");
    let o = train_from("org/tiny-llama", &again, &offline);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(sorted(common::weights(&again)), weights_of(&m));
    // A model the cache does not hold: named, with the reason.
    let o = train_from("org/other-llama", &tmp.path().join("other"), &offline);
    assert!(!o.status.success());
    let said = text(&o);
    assert!(
        said.contains("org/other-llama") && said.contains("HF_HUB_OFFLINE"),
        "{said}"
    );
}

/// Words `w0`..`w5`, `<|im_end|>` (6) and `<|endoftext|>` (7).
const IM_END: u32 = 6;
const ENDOFTEXT: u32 = 7;
const VOCAB: usize = 8;

fn word_tokenizer(dir: &Path) -> PathBuf {
    let mut vocab = serde_json::Map::new();
    for i in 0..6 {
        vocab.insert(format!("w{i}"), i.into());
    }
    vocab.insert("<|im_end|>".into(), IM_END.into());
    vocab.insert("<|endoftext|>".into(), ENDOFTEXT.into());
    let special = |id: u32, content: &str| {
        serde_json::json!({
            "id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        })
    };
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(IM_END, "<|im_end|>"), special(ENDOFTEXT, "<|endoftext|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<|endoftext|>"}
    });
    let path = dir.join("words.json");
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

/// A model whose next token depends only on the last one: w1 -> w2 ->
/// w3 -> `<|im_end|>`, and `<|im_end|>` again after anything else. The
/// attention's and the MLP's output projections are zero, so the residual
/// stream is the last token's embedding, a one-hot row; the output
/// projection's (bias-free) rows pick the next token from it.
fn chain_model() -> Llama {
    let config = LlamaConfig {
        num_layers: 1,
        vocab_size: VOCAB,
        dims: 8,
        mlp_dims: 16,
        num_heads: 2,
        ..LlamaConfig::default()
    };
    let mut m = Llama::new(&config, 3).unwrap();
    let next = |i: usize| match i {
        0..=2 => i + 1,
        _ => IM_END as usize,
    };
    m.visit_mut("", &mut |name, p| {
        let shape = p.value().shape().to_vec();
        let n: usize = shape.iter().product();
        let values: Option<Vec<f32>> = match name {
            "embedding.weight" => Some((0..n).map(|k| (k / 8 == k % 8) as u8 as f32).collect()),
            // Row j (a token) reads column i (the last token's one-hot).
            "out_proj.weight" => Some(
                (0..n)
                    .map(|k| (next(k % 8) == k / 8) as u8 as f32)
                    .collect(),
            ),
            "layers.0.attention.out_proj.weight" | "layers.0.linear3.weight" => Some(vec![0.0; n]),
            _ => None,
        };
        if let Some(v) = values {
            p.set(Array::from_slice(&v, &shape).unwrap());
        }
    });
    m
}

#[test]
fn generate_from_a_hub_name_stops_at_the_model_s_own_end_of_sequence_token() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = TextTokenizer::from_file(&word_tokenizer(tmp.path())).unwrap();
    assert_eq!(tok.eos_id(), ENDOFTEXT);
    let m = chain_model();
    // Greedy, the model says w2 w3 and then only <|im_end|>.
    let ids = tok.encode("w1").unwrap();
    let want = m.generate(&ids, 5, 0.0, 0).unwrap();
    assert_eq!(want, [2, 3, IM_END, IM_END, IM_END]);

    let base = tmp.path().join("base");
    export::write(&m, &tok, 16, &base, Format::Hf).unwrap();
    let variant = |name: &str, edit: &dyn Fn(&Path)| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&base).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
        edit(&dir);
        dir
    };
    let json = |dir: &Path, file: &str, v: serde_json::Value| {
        std::fs::write(dir.join(file), v.to_string()).unwrap()
    };
    let mut files = HashMap::new();
    // <|im_end|> named by generation_config.json (a list, as Llama 3's).
    let by_generation = variant("gen", &|d| {
        json(
            d,
            "generation_config.json",
            serde_json::json!({"eos_token_id": [ENDOFTEXT, IM_END]}),
        )
    });
    serve_folder(&mut files, "org/eos-gen", &by_generation);
    // Named by tokenizer_config.json's eos_token alone (no
    // generation_config.json; config.json names <|endoftext|>).
    let by_tokenizer = variant("tok", &|d| {
        std::fs::remove_file(d.join("generation_config.json")).unwrap();
        json(
            d,
            "tokenizer_config.json",
            serde_json::json!({"eos_token": {"content": "<|im_end|>", "special": true}}),
        );
    });
    serve_folder(&mut files, "org/eos-tok", &by_tokenizer);
    // Named nowhere: generation goes on to --max-tokens.
    serve_folder(&mut files, "org/eos-none", &base);
    let srv = HubServer::start(files);
    let home = tmp.path().join("hf");
    let hub = Hub {
        home: &home,
        endpoint: &srv.endpoint,
        offline: false,
    };
    let generate = |source: &str, extra: &[&str], hub: &Hub| {
        let mut args = vec![
            "generate",
            "--checkpoint",
            source,
            "--prompt",
            "w1",
            "--temperature",
            "0",
            "--max-tokens",
            "6",
        ];
        args.extend_from_slice(extra);
        mlx_llama(&args, hub)
    };
    let stopped = format!("w1{}\n", tok.decode(&[2, 3]).unwrap());
    for repo in ["org/eos-gen", "org/eos-tok"] {
        let o = generate(repo, &[], &hub);
        assert!(o.status.success(), "{repo}: {}", text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), stopped, "{repo}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("Generation: 2 tokens"),
            "{repo}: {}",
            text(&o)
        );
    }
    let o = generate("org/eos-none", &[], &hub);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Generation: 6 tokens"),
        "{}",
        text(&o)
    );
    // The same model folder by path, and offline from the cache.
    let o = generate(&by_generation.to_string_lossy(), &[], &hub);
    assert_eq!(String::from_utf8_lossy(&o.stdout), stopped, "{}", text(&o));
    let dead = dead_endpoint();
    let offline = Hub {
        home: &home,
        endpoint: &dead,
        offline: true,
    };
    let o = generate("org/eos-gen", &[], &offline);
    assert_eq!(String::from_utf8_lossy(&o.stdout), stopped, "{}", text(&o));

    // Pipeline parallelism reads our checkpoints only: refused by name.
    let o = generate("org/eos-gen", &["--parallel", "pipeline"], &offline);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--parallel pipeline reads our checkpoints"),
        "{}",
        text(&o)
    );

    // Tensor parallelism over two ranks: each rank cuts the folder's model.
    let o = Command::new(common::launcher())
        .args(["-n", "2", "--"])
        .arg(env!("CARGO_BIN_EXE_mlx-llama"))
        .args([
            "generate",
            "--checkpoint",
            "org/eos-gen",
            "--prompt",
            "w1",
            "--temperature",
            "0",
            "--max-tokens",
            "6",
            "--parallel",
            "tensor",
        ])
        .env_remove("MLX_PROGRESS")
        .env_remove("HF_HUB_CACHE")
        .env("HF_HOME", &home)
        .env("HF_ENDPOINT", &dead)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("running mlx-launch");
    assert!(o.status.success(), "{}", text(&o));
    let got: String = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("[0] "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(got, stopped);
}
