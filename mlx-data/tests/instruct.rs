//! Instruction data: JSON Lines rows in three formats, prompt masking in the
//! token store and the loader's loss mask, segment ids of packed examples,
//! text separators and the held-out validation fraction.

use mlx_data::pipeline::open_or_build_split;
use mlx_data::source::jsonl::{Row, read_rows_from};
use mlx_data::source::{Resolved, corpus::BLANK_LINE, held_out};
use mlx_data::{
    BatchMode, BatchSize, Corpus, DataLoader, LoaderConfig, LocalFormat, LocalOptions, LocalSource,
    Split, TextTokenizer, TokenStore, Verify,
};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn jsonl(train: PathBuf, validation: Option<PathBuf>, options: LocalOptions) -> Resolved {
    Resolved::Local(LocalSource {
        train,
        validation,
        format: LocalFormat::JsonLines,
        options,
    })
}

fn build(cache: &Path, r: &Resolved, split: Split, tok: &TextTokenizer) -> TokenStore {
    open_or_build_split(cache, r, split, tok, Duration::from_secs(30))
        .unwrap()
        .0
}

#[test]
fn prompt_completion_rows_mask_the_prompt_in_the_loss() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("train.jsonl");
    let rows = [("Q: two plus two?", " A: four."), ("Say hi", " hi there")];
    let text: String = rows
        .iter()
        .map(|(p, c)| serde_json::json!({"prompt": p, "completion": c}).to_string() + "\n")
        .collect();
    std::fs::write(&f, text).unwrap();
    let tok = TextTokenizer::gpt2().unwrap();
    let masked = LocalOptions {
        mask_prompt: true,
        ..Default::default()
    };
    let r = jsonl(f.clone(), Some(f.clone()), masked);
    let store = Arc::new(build(d.path(), &r, Split::Train, &tok));
    assert!(store.is_examples());
    // Unmasked data is another store (a different key), every flag 1.
    let plain = build(
        d.path(),
        &jsonl(f.clone(), Some(f.clone()), Default::default()),
        Split::Train,
        &tok,
    );
    assert_ne!(plain.path(), store.path());
    assert!(
        plain
            .loss_flags(0, plain.n_tokens())
            .unwrap()
            .iter()
            .all(|&x| x == 1)
    );

    let block = 16;
    let cfg = LoaderConfig {
        block_size: block,
        batch: BatchSize::PerRank(2),
        mode: BatchMode::Pad,
        world: 1,
        ..Default::default()
    };
    let mut loader = DataLoader::new(store.clone(), cfg).unwrap();
    let batch = loader.next_batch().unwrap();
    assert!(batch.segments.is_none());
    for (row, &sample) in batch.samples.iter().enumerate() {
        let (p, c) = rows[sample as usize];
        // By hand: the prompt's tokens, then the completion's, then EOS;
        // target j is token j + 1 and counts iff it is completion or EOS.
        let np = tok.encode(p).unwrap().len();
        let n = tok.encode(&format!("{p}{c}")).unwrap().len();
        let expected: Vec<u8> = (0..block).map(|j| u8::from(j + 1 >= np && j < n)).collect();
        assert_eq!(batch.mask(row), expected, "row {row} ({p:?})");
    }
    assert_eq!(
        batch.n_target_tokens(),
        rows.iter()
            .map(|(p, c)| tok.encode(&format!("{p}{c}")).unwrap().len() + 1
                - tok.encode(p).unwrap().len())
            .sum::<usize>()
    );
}

#[test]
fn a_row_in_no_format_names_the_file_and_line() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("bad.jsonl");
    std::fs::write(&f, "{\"text\": \"a\"}\n\n{\"question\": \"b\"}\n").unwrap();
    let tok = TextTokenizer::gpt2().unwrap();
    let r = jsonl(f.clone(), Some(f.clone()), Default::default());
    let e = open_or_build_split(d.path(), &r, Split::Train, &tok, Duration::from_secs(5))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bad.jsonl") && e.contains("line 3") && e.contains("\"messages\""),
        "{e}"
    );
    // Mixing formats in one file.
    std::fs::write(
        &f,
        "{\"text\": \"a\"}\n{\"prompt\": \"p\", \"completion\": \"c\"}\n",
    )
    .unwrap();
    let e = r
        .for_each_batch(Split::Train, 8, |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("like line 1"), "{e}");
    // Chat rows without a template.
    std::fs::write(
        &f,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n",
    )
    .unwrap();
    let e = r
        .for_each_batch(Split::Train, 8, |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1") && e.contains("chat template"), "{e}");
}

#[test]
fn packed_examples_get_segment_ids() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("train.jsonl");
    let rows: String = (0..40)
        .map(|i| {
            serde_json::json!({"prompt": format!("p{i}"), "completion": format!(" c{}", "x".repeat(i % 7))})
                .to_string()
                + "\n"
        })
        .collect();
    std::fs::write(&f, rows).unwrap();
    let tok = TextTokenizer::gpt2().unwrap();
    let store = Arc::new(build(
        d.path(),
        &jsonl(f.clone(), Some(f), Default::default()),
        Split::Train,
        &tok,
    ));
    let block = 12;
    let cfg = LoaderConfig {
        block_size: block,
        batch: BatchSize::PerRank(3),
        mode: BatchMode::Pack,
        world: 1,
        ..Default::default()
    };
    let mut loader = DataLoader::new(store.clone(), cfg).unwrap();
    let batch = loader.next_batch().unwrap();
    let seg = batch.segments.clone().unwrap();
    let eos = store.eos();
    for (row, _) in batch.samples.iter().enumerate() {
        // By hand: a new example starts after each EOS of the inputs.
        let inputs = batch.inputs(row);
        let mut expected = vec![0u32; block];
        for j in 1..block {
            expected[j] = expected[j - 1] + u32::from(inputs[j - 1] == eos);
        }
        assert_eq!(
            &seg[row * block..(row + 1) * block],
            &expected[..],
            "row {row}"
        );
    }
    let arrays = batch.to_arrays().unwrap();
    assert_eq!(arrays.segments.unwrap().shape(), [3, block]);
}

#[test]
fn text_splits_on_blank_lines_and_markers() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("a.txt");
    std::fs::write(&f, "one\nstill one\n\n  \ntwo\r\n\r\nthree\n\n").unwrap();
    let c = Corpus::from_text_file(&f, BLANK_LINE, None).unwrap();
    assert_eq!(
        c.docs().collect::<Vec<_>>(),
        ["one\nstill one", "two", "three"]
    );
    std::fs::write(&f, "a<doc>b <doc> <doc>c").unwrap();
    let c = Corpus::from_text_file(&f, "<doc>", None).unwrap();
    assert_eq!(c.docs().collect::<Vec<_>>(), ["a", "b", "c"]);
    // JSON Lines text rows split the same way when asked.
    let j = d.path().join("t.jsonl");
    std::fs::write(&j, "{\"text\": \"x\\n\\ny\"}\n{\"text\": \"z\"}\n").unwrap();
    let o = LocalOptions {
        jsonl_separator: Some(BLANK_LINE.into()),
        ..Default::default()
    };
    let mut docs = vec![];
    jsonl(j.clone(), Some(j), o)
        .for_each_batch(Split::Train, 8, |b| {
            docs.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
    assert_eq!(docs, ["x", "y", "z"]);
}

#[test]
fn without_a_validation_file_a_fraction_is_held_out() {
    // 5%: documents 0, 20, 40, ...; ceil(n * f) of the first n.
    let held: Vec<u64> = (0..100).filter(|&i| held_out(i, 50_000)).collect();
    assert_eq!(held, [0, 20, 40, 60, 80]);
    assert_eq!((0..7).filter(|&i| held_out(i, 300_000)).count(), 3); // ceil(2.1)
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("t.jsonl");
    let text: String = (0..45)
        .map(|i| format!("{{\"text\": \"doc {i}\"}}\n"))
        .collect();
    std::fs::write(&f, text).unwrap();
    let r = jsonl(f, None, Default::default());
    let docs = |split| {
        let mut v = vec![];
        r.for_each_batch(split, 4, |b| {
            v.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        v
    };
    let (train, valid) = (docs(Split::Train), docs(Split::Validation));
    assert_eq!(valid, ["doc 0", "doc 20", "doc 40"]);
    assert_eq!(train.len(), 42);
    assert!(train.iter().all(|t| !valid.contains(t)));
    assert!(
        r.identity(Split::Train)
            .unwrap()
            .ends_with(":held_out_ppm=50000")
    );
}

proptest! {
    #[test]
    fn arbitrary_json_lines_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = read_rows_from(&bytes[..], Path::new("fuzz.jsonl"), &mut |r, _| {
            let _ = r.format();
            Ok(())
        });
    }

    #[test]
    fn arbitrary_json_values_parse_or_say_why(v in proptest::string::string_regex("\\{(\"(text|prompt|completion|messages|role)\": (\"a\"|1|null|\\[\\]|\\[\\{\"role\": \"user\"\\}\\]), ?){0,3}\\}").unwrap()) {
        let line = v.replace(", }", "}");
        let mut rows = 0;
        let r = read_rows_from(line.as_bytes(), Path::new("fuzz.jsonl"), &mut |r, _| {
            rows += usize::from(matches!(r, Row::Text(_) | Row::Chat(_) | Row::Completion { .. }));
            Ok(())
        });
        match r {
            Ok(()) => prop_assert_eq!(rows, 1),
            Err(e) => prop_assert!(e.to_string().contains("fuzz.jsonl") && e.to_string().contains("line 1"), "{}", e),
        }
    }

    #[test]
    fn mutated_example_stores_never_panic(at in 0usize..5000, byte in any::<u8>(), cut in 0usize..6000) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.tokens");
        let mut w = mlx_data::store::StoreWriter::create(&p, 100, 0).unwrap();
        w.push_example(&[5, 6, 7], &[0, 1, 1]).unwrap();
        w.push_doc(&[8, 9]).unwrap();
        w.finish(mlx_data::store::StoreMeta { source: "s".into(), tokenizer_hash: "h".into(), split: "train".into() }).unwrap();
        let good = TokenStore::open(&p, Verify::Full).unwrap();
        prop_assert_eq!(good.loss_flags(0, 7).unwrap(), &[0, 1, 1, 1, 1, 1, 1][..]);
        drop(good);
        let mut bytes = std::fs::read(&p).unwrap();
        if at < bytes.len() { bytes[at] ^= byte; }
        bytes.truncate(cut.max(1));
        std::fs::write(&p, &bytes).unwrap();
        if let Ok(s) = TokenStore::open(&p, Verify::HeaderOnly) {
            let _ = s.loss_flags(0, u64::MAX);
            let _ = s.doc_of(u64::MAX);
            let _ = s.doc_start(u64::MAX);
        }
    }
}
