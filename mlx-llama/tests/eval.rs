//! `mlx-llama eval`: the loss against a hand computation from the model's
//! logits, perplexity = exp(loss), 2 ranks equal 1, adapters change it,
//! the real binary's report, and a missing data file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use mlx_array::Array;
use mlx_llama::adapters::{AdapterKind, AdapterSpec, SaveOptions, Target};
use mlx_llama::eval::{EvalArgs, EvalReport, evaluate};
use mlx_llama::export::{self, Format};
use mlx_llama::{Llama, LlamaConfig};

/// Words `w0`..`w30` and `<|endoftext|>` (31).
const VOCAB: usize = 32;
/// Tokens predicted per sequence.
const BLOCK: usize = 8;

#[derive(Parser)]
#[command(args_override_self = true)]
struct Cli {
    #[command(flatten)]
    eval: EvalArgs,
}

/// `eval`'s options from a command line.
fn args(list: &[&str]) -> EvalArgs {
    Cli::parse_from(std::iter::once("eval").chain(list.iter().copied())).eval
}

/// The documents of the data file: 5 of varied lengths, 70 tokens with
/// their ends of text, so that packing makes (70 - 1) / 8 = 8 windows.
fn documents() -> Vec<Vec<u32>> {
    let lens = [9, 17, 4, 21, 14];
    let mut seed = 7u32;
    lens.iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (seed >> 16) % (VOCAB as u32 - 1)
                })
                .collect()
        })
        .collect()
}

/// A tiny model, its HF export (with the word tokenizer), and the data as
/// a text file of documents separated by `<|endoftext|>`.
struct Setup {
    _tmp: tempfile::TempDir,
    model: Llama,
    folder: PathBuf,
    data: PathBuf,
    cache: PathBuf,
    root: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let (_, tokenizer) = common::word_tokenizer(&root, VOCAB);
    let config = LlamaConfig {
        vocab_size: VOCAB,
        ..mlx_llama::testing::tiny_model(1, 16)
    };
    let model = Llama::new(&config, 3).unwrap();
    let folder = root.join("model");
    export::write(&model, &tokenizer, 64, &folder, Format::Hf).unwrap();
    let text: Vec<String> = documents()
        .iter()
        .map(|d| {
            d.iter()
                .map(|t| format!("w{t}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let data = root.join("data.txt");
    std::fs::write(&data, text.join("<|endoftext|>")).unwrap();
    Setup {
        _tmp: tmp,
        model,
        folder,
        data,
        cache: root.join("cache"),
        root,
    }
}

impl Setup {
    /// `eval`'s options for the tiny model and data, with `more`.
    fn args(&self, more: &[&str]) -> EvalArgs {
        let data = format!("text:{}", self.data.display());
        let mut list = vec![
            "--checkpoint",
            self.folder.to_str().unwrap(),
            "--data",
            &data,
            "--data-cache",
            self.cache.to_str().unwrap(),
            "--block-size",
            "8",
            "--batch",
            "4",
        ];
        list.extend_from_slice(more);
        args(&list)
    }
}

/// One rank's report.
fn one_rank(a: &EvalArgs) -> EvalReport {
    let world = mlx_dist::Group::single();
    evaluate(a, &world).unwrap()
}

/// The packed token stream: each document then `<|endoftext|>`.
fn stream() -> Vec<u32> {
    documents()
        .into_iter()
        .flat_map(|mut d| {
            d.push(VOCAB as u32 - 1);
            d
        })
        .collect()
}

/// Mean cross-entropy per target of every window of `BLOCK` targets of the
/// stream under `model`, from its logits and a log-softmax on the host,
/// with the standard error of that mean.
fn by_hand(model: &Llama) -> (f64, f64, usize) {
    let s = stream();
    let windows = (s.len() - 1) / BLOCK;
    let inputs: Vec<u32> = (0..windows)
        .flat_map(|k| s[k * BLOCK..k * BLOCK + BLOCK].to_vec())
        .collect();
    let x = Array::from_slice(&inputs, &[windows, BLOCK]).unwrap();
    let logits = model.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let mut losses = vec![];
    for k in 0..windows {
        for j in 0..BLOCK {
            let row = &logits[(k * BLOCK + j) * VOCAB..][..VOCAB];
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let lse = max
                + row
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            let target = s[k * BLOCK + j + 1] as usize;
            losses.push(lse - row[target] as f64);
        }
    }
    let n = losses.len() as f64;
    let mean = losses.iter().sum::<f64>() / n;
    let var = losses.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt(), losses.len())
}

fn close(what: &str, got: f64, want: f64, rel: f64) {
    assert!(
        (got - want).abs() <= rel * want.abs().max(1e-12),
        "{what}: got {got}, want {want}"
    );
}

#[test]
fn the_loss_is_the_mean_token_cross_entropy_and_perplexity_its_exp() {
    let s = setup();
    let r = one_rank(&s.args(&[]));
    let (loss, se, tokens) = by_hand(&s.model);
    assert_eq!(tokens, 64);
    assert_eq!(r.tokens, 64, "{r:?}");
    assert_eq!(r.sequences, 8, "{r:?}");
    assert_eq!(r.batches, 2, "{r:?}");
    close("loss", r.loss, loss, 1e-5);
    close("perplexity", r.perplexity, r.loss.exp(), 1e-12);
    close("loss standard error", r.loss_std_err, se, 1e-3);
    close(
        "perplexity standard error",
        r.std_err,
        r.perplexity * se,
        1e-3,
    );
    // Near the uniform guess for an untrained model.
    assert!((r.loss - (VOCAB as f64).ln()).abs() < 1.0, "{r:?}");
    // --batches 1 takes one batch of 4 windows.
    let one = one_rank(&s.args(&["--batches", "1"]));
    assert_eq!((one.tokens, one.sequences, one.batches), (32, 4, 1));
    // Padding: one document a row, its tokens after the first and its end
    // of text counting, at most a block of them: 8 + 8 + 4 + 8 + 8.
    let pad = one_rank(&s.args(&["--batching", "pad", "--batch", "5"]));
    assert_eq!((pad.tokens, pad.sequences, pad.batches), (36, 5, 1));
    // More sequences a batch than the split holds: shrunk to fit.
    let all = one_rank(&s.args(&["--batching", "pad", "--batch", "8"]));
    assert_eq!((all.tokens, all.sequences, all.batches), (36, 5, 1));
}

#[test]
fn two_ranks_give_one_ranks_numbers() {
    let s = setup();
    let a = s.args(&[]);
    let one = one_rank(&a);
    let two = mlx_dist::run_local(2, |g| evaluate(&a, &g).unwrap()).unwrap();
    assert_eq!(two[0], two[1], "every rank gets the same report");
    assert_eq!(
        (two[0].tokens, two[0].sequences, two[0].batches),
        (one.tokens, one.sequences, one.batches)
    );
    close("loss", two[0].loss, one.loss, 1e-6);
    close("perplexity", two[0].perplexity, one.perplexity, 1e-6);
    close("standard error", two[0].std_err, one.std_err, 1e-4);
    // An odd batch does not split over 2 ranks.
    let odd = s.args(&["--batch", "3"]);
    let e = mlx_dist::run_local(2, |g| format!("{:#}", evaluate(&odd, &g).unwrap_err())).unwrap();
    assert!(
        e[0].contains("does not split evenly over 2 ranks"),
        "{}",
        e[0]
    );
}

/// An adapter for `folder`'s model (LoRA on layer 0's query and value)
/// with every B entry `b`, saved to `dir`.
fn adapter(folder: &Path, dir: &Path, b: f64) {
    let spec = AdapterSpec {
        kind: AdapterKind::Lora,
        rank: 2,
        alpha: 4.0,
        dropout: 0.0,
        layers: vec![0],
        targets: vec![Target::Q, Target::V],
    };
    let mut model = mlx_llama::import::load(folder).unwrap();
    model.add_adapters(&spec, 5).unwrap();
    let set: Vec<(String, Array)> = model
        .adapter_parameters()
        .into_iter()
        .filter(|(n, _)| n.ends_with("lora_b"))
        .map(|(n, a)| (n, mlx_array::full(a.shape(), b, a.dtype())))
        .collect();
    assert!(!set.is_empty());
    model.load_adapter_tensors(set).unwrap();
    mlx_llama::adapters::save(
        dir,
        &spec,
        &model.config,
        &model.adapter_parameters(),
        &SaveOptions::default(),
    )
    .unwrap();
}

#[test]
fn an_adapter_changes_the_loss_unless_its_b_is_zero() {
    let s = setup();
    let base = one_rank(&s.args(&[]));
    let zero = s.root.join("zero");
    let some = s.root.join("some");
    adapter(&s.folder, &zero, 0.0);
    adapter(&s.folder, &some, 0.3);
    let with_zero = one_rank(&s.args(&["--adapter", zero.to_str().unwrap()]));
    close("zero B", with_zero.loss, base.loss, 1e-6);
    let with_some = one_rank(&s.args(&["--adapter", some.to_str().unwrap()]));
    assert_eq!(with_some.tokens, base.tokens);
    assert!(
        (with_some.loss - base.loss).abs() > 1e-4,
        "{} vs {}",
        with_some.loss,
        base.loss
    );
    // The adapter's numbers are those of the model with it applied.
    let mut adapted = mlx_llama::import::load(&s.folder).unwrap();
    mlx_llama::adapters::apply_from(&some, &mut adapted).unwrap();
    close("adapted loss", with_some.loss, by_hand(&adapted).0, 1e-5);
}

#[test]
fn the_binary_prints_perplexity_and_json() {
    let s = setup();
    let data = format!("text:{}", s.data.display());
    let run = |more: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
            .args(["eval", "--checkpoint"])
            .arg(&s.folder)
            .args(["--data", &data, "--data-cache"])
            .arg(&s.cache)
            .args(["--block-size", "8", "--batch", "4"])
            .args(more)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stdout}\n{stderr}");
        stdout
    };
    let text = run(&[]);
    let want = one_rank(&s.args(&[]));
    assert!(
        text.contains(&format!(
            "Perplexity: {:.3} ± {:.3}",
            want.perplexity, want.std_err
        )),
        "{text}"
    );
    assert!(text.contains(&format!("Loss: {:.3}", want.loss)), "{text}");
    assert!(text.contains("64 tokens in 8 sequences"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&run(&["--json"])).unwrap();
    close(
        "json loss",
        json["loss"].as_f64().unwrap(),
        want.loss,
        1e-12,
    );
    assert_eq!(json["tokens"], 64);
}

#[test]
fn a_missing_data_file_is_a_clear_error() {
    let s = setup();
    let missing = s.root.join("no-such.jsonl");
    let a = args(&[
        "--checkpoint",
        s.folder.to_str().unwrap(),
        "--data",
        &format!("jsonl:{}", missing.display()),
        "--data-cache",
        s.cache.to_str().unwrap(),
    ]);
    let e = format!(
        "{:#}",
        evaluate(&a, &mlx_dist::Group::single()).unwrap_err()
    );
    assert!(
        e.contains("no-such.jsonl") && e.contains("does not exist"),
        "{e}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
        .args(["eval", "--checkpoint"])
        .arg(&s.folder)
        .arg("--data")
        .arg(format!("jsonl:{}", missing.display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");
    // A source that is no model is named too.
    let a = args(&["--checkpoint", s.root.join("nothing").to_str().unwrap()]);
    let e = format!(
        "{:#}",
        evaluate(&a, &mlx_dist::Group::single()).unwrap_err()
    );
    assert!(e.contains("--checkpoint"), "{e}");
}
