//! Instruction data through the model: with --mask-prompt a batch's loss is
//! the cross-entropy of the completion tokens alone (by hand from the
//! logits), and packed examples with segment ids do not see each other.

use std::sync::Arc;
use std::time::Duration;

use mlx_array::Array;
use mlx_data::pipeline::open_or_build_split;
use mlx_data::source::Resolved;
use mlx_data::{
    BatchMode, BatchSize, DataLoader, LoaderConfig, LocalFormat, LocalOptions, LocalSource, Split,
    TextTokenizer,
};
use mlx_llama::testing::tiny_model;
use mlx_llama::{Llama, LlamaConfig};

fn model() -> Llama {
    let cfg = LlamaConfig {
        vocab_size: 50257,
        ..tiny_model(2, 32)
    };
    Llama::new(&cfg, 7).unwrap()
}

/// Per-token cross-entropy of `logits [B, L, V]` against `targets`, on the host.
fn cross_entropy(logits: &Array, targets: &[u32]) -> Vec<f64> {
    let v = *logits.shape().last().unwrap();
    let l: Vec<f32> = logits.to_vec().unwrap();
    targets
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let row = &l[i * v..(i + 1) * v];
            let max = row.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
            let lse = max
                + row
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            lse - row[t as usize] as f64
        })
        .collect()
}

#[test]
fn masked_loss_is_the_completion_tokens_cross_entropy() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("train.jsonl");
    let rows = [("Q: two plus two?", " A: four."), ("Say hi", " hi there")];
    let text: String = rows
        .iter()
        .map(|(p, c)| serde_json::json!({"prompt": p, "completion": c}).to_string() + "\n")
        .collect();
    std::fs::write(&f, text).unwrap();
    let tok = TextTokenizer::gpt2().unwrap();
    let r = Resolved::Local(LocalSource {
        train: f.clone(),
        validation: Some(f),
        format: LocalFormat::JsonLines,
        options: LocalOptions {
            mask_prompt: true,
            ..Default::default()
        },
    });
    let (store, _) =
        open_or_build_split(d.path(), &r, Split::Train, &tok, Duration::from_secs(30)).unwrap();
    let block = 16;
    let cfg = LoaderConfig {
        block_size: block,
        batch: BatchSize::PerRank(2),
        mode: BatchMode::Pad,
        ..Default::default()
    };
    let batch = DataLoader::new(Arc::new(store), cfg)
        .unwrap()
        .next_batch()
        .unwrap();
    let a = batch.to_arrays().unwrap();
    let m = model();
    let loss: f32 = m
        .loss_in(&a.inputs, &a.targets, &a.loss_mask, a.segments.as_ref())
        .unwrap()
        .to_vec()
        .unwrap()[0];
    // By hand: the completion's tokens and the EOS after it, nothing else.
    let ce = cross_entropy(
        &m.forward(&a.inputs).unwrap(),
        &a.targets.to_vec::<u32>().unwrap(),
    );
    let mut expected = 0.0;
    let mut counted = 0;
    for (row, &sample) in batch.samples.iter().enumerate() {
        let (p, c) = rows[sample as usize];
        let np = tok.encode(p).unwrap().len();
        let n = tok.encode(&format!("{p}{c}")).unwrap().len();
        for j in np - 1..n {
            expected += ce[row * block + j];
            counted += 1;
        }
    }
    assert_eq!(counted, batch.n_target_tokens());
    assert!(
        (loss as f64 - expected).abs() < 1e-3 * expected,
        "{loss} vs {expected}"
    );
}

#[test]
fn packed_examples_do_not_attend_to_each_other() {
    let m = model();
    // Row: example 0 is tokens 0..5, example 1 tokens 5..10.
    let row_a: Vec<u32> = vec![10, 11, 12, 13, 50256, 20, 21, 22, 23, 24];
    let mut row_b = row_a.clone();
    row_b[1] = 999; // another first example
    row_b[3] = 5000;
    let seg: Vec<u32> = vec![0, 0, 0, 0, 0, 1, 1, 1, 1, 1];
    let seg = Array::from_slice(&seg, &[1, 10]).unwrap();
    let targets = Array::from_slice(&[1u32; 10], &[1, 10]).unwrap();
    // The loss of each position of example 1 alone.
    let at = |row: &[u32], j: usize, segments: Option<&Array>| -> f32 {
        let mut w = vec![0f32; 10];
        w[j] = 1.0;
        let w = Array::from_slice(&w, &[1, 10]).unwrap();
        let x = Array::from_slice(row, &[1, 10]).unwrap();
        m.loss_in(&x, &targets, &w, segments)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[0]
    };
    for j in 5..10 {
        assert_eq!(
            at(&row_a, j, Some(&seg)),
            at(&row_b, j, Some(&seg)),
            "position {j}"
        );
        // The first token of example 1 sees nothing before it: as if alone.
        let alone = at(&[20, 21, 22, 23, 24, 0, 0, 0, 0, 0], j - 5, None);
        assert!(
            (at(&row_a, j, Some(&seg)) - alone).abs() < 1e-4,
            "position {j}"
        );
    }
    // Without segments the earlier example changes the later one.
    assert_ne!(at(&row_a, 6, None), at(&row_b, 6, None));
}
