//! Tokenizers: GPT-2 exactness from vocab.json + merges.txt, the embedded GPT-2
//! against GPT-2's own files and tiktoken-rs, Hugging Face files, trained BPE
//! round trips.

mod common;

use mlx_data::{OfflineCorpus, Split, TextTokenizer};
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

/// The embedded GPT-2, built once for the whole test binary.
fn embedded() -> &'static TextTokenizer {
    static T: OnceLock<TextTokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let start = Instant::now();
        let t = TextTokenizer::gpt2().unwrap();
        eprintln!("TextTokenizer::gpt2() built in {:.2?}", start.elapsed());
        t
    })
}

/// tiktoken-rs's own GPT-2 encoder (r50k_base).
fn tiktoken() -> &'static tiktoken_rs::CoreBPE {
    static T: OnceLock<tiktoken_rs::CoreBPE> = OnceLock::new();
    T.get_or_init(|| tiktoken_rs::r50k_base().unwrap())
}

/// GPT-2 from its real vocab.json + merges.txt, when /work/shared is present.
fn from_files() -> Option<&'static TextTokenizer> {
    static T: OnceLock<Option<TextTokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = common::gpt2_dir()?;
        Some(
            TextTokenizer::from_vocab_merges(&dir.join("vocab.json"), &dir.join("merges.txt"))
                .unwrap(),
        )
    })
    .as_ref()
}

/// Strings that stress pre-tokenization and byte-level BPE.
const ADVERSARIAL: &[&str] = &[
    "",
    " ",
    "Hello world",
    " Hello",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "It's Tom's, they'll, we've, I'm, you're, he'd, 'S 'LL 'Re ''s",
    "don't  won't\tcan't''' 's'll",
    "naïve café résumé Ωμέγα Привет мир",
    "日本語のテキストと中文文本和한국어 텍스트",
    "emoji 🐱🐶👩‍👩‍👧‍👦 🇫🇷 ❤️ flags and ZWJ",
    "12345 3.14159 1,000,000 -42 0x1F 1e-9 ٣٤٥ ①② 2024年",
    "    leading spaces",
    "trailing spaces    ",
    "\n\n\nnewlines\n\n",
    " \t \r\n \u{a0}\u{2003}\u{3000} mixed whitespace \u{85}",
    "a\u{0}b\u{1}c\u{7f}d\u{ad}e",
    "<|endoftext|>",
    "one<|endoftext|>two <|endoftext|> three<|endoftext|><|endoftext|>",
    "<|endoftext|",
    "<|endoftext|>\n\nOnce upon a time",
    "!!!???...,,,;;;::: ---___*** @@@ ###",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝟙𝟚𝟛 and \u{10ffff} \u{fffd}",
    "combining: e\u{301} a\u{308}\u{304} ﬁ ligature",
    "مرحبا بالعالم שלום עולם",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
];

/// Asserts the embedded GPT-2, GPT-2's files (if present) and tiktoken-rs give
/// the same ids for `text`, and that the ids decode back to `text`.
fn assert_agrees(text: &str) {
    let ours = embedded().encode(text).unwrap();
    let theirs: Vec<u32> = tiktoken().encode_with_special_tokens(text);
    assert_eq!(ours, theirs, "embedded vs tiktoken-rs on {text:?}");
    if let Some(files) = from_files() {
        assert_eq!(
            ours,
            files.encode(text).unwrap(),
            "embedded vs files on {text:?}"
        );
    }
    assert_eq!(
        embedded().decode(&ours).unwrap(),
        text,
        "round trip of {text:?}"
    );
}

/// GPT-2's ids of a few texts, its EOS and vocabulary size, as published.
fn assert_gpt2s_known_ids(t: &TextTokenizer) {
    assert_eq!(t.encode("Hello world").unwrap(), [15496, 995]);
    assert_eq!(t.encode("<|endoftext|>").unwrap(), [50256]);
    assert_eq!(t.encode("Hello, world!").unwrap(), [15496, 11, 995, 0]);
    assert_eq!(
        t.encode("The quick brown fox").unwrap(),
        [464, 2068, 7586, 21831]
    );
    assert_eq!(t.encode(" Hello").unwrap(), [18435]);
    assert_eq!(t.eos_id(), 50256);
    assert_eq!(t.vocab_size(), 50257);
}

#[test]
fn gpt2_from_vocab_and_merges_tokenizes_like_gpt2() {
    let Some(dir) = common::gpt2_dir() else {
        return;
    };
    let t =
        TextTokenizer::from_vocab_merges(&dir.join("vocab.json"), &dir.join("merges.txt")).unwrap();
    assert_gpt2s_known_ids(&t);
    // Byte-level: any text round-trips exactly, whitespace and non-ASCII included.
    let text = "Once upon a time,\n\n  Lily's cat — naïve 猫 🐱 —\tsaid \"hi\"!<|endoftext|>Tom";
    let ids = t.encode(text).unwrap();
    assert!(ids.contains(&50256));
    assert_eq!(t.decode(&ids).unwrap(), text);
}

#[test]
fn embedded_gpt2_gives_gpt2s_known_ids() {
    let t = embedded();
    assert_gpt2s_known_ids(t);
    assert_eq!(t.inner().get_vocab_size(true), 50257);
    assert_eq!(
        t.decode(&[15496, 995, 50256]).unwrap(),
        "Hello world<|endoftext|>"
    );
    assert!(t.is_byte_level_bpe());
}

#[test]
fn embedded_gpt2_agrees_on_adversarial_strings() {
    for text in ADVERSARIAL {
        assert_agrees(text);
    }
}

#[test]
fn embedded_gpt2_agrees_on_the_offline_corpus() {
    // Every document of both splits of the default offline corpus (6.3 MB), the
    // stories an offline run tokenizes.
    let corpus = OfflineCorpus::default();
    let mut docs = corpus.split(Split::Validation);
    docs.extend(corpus.split(Split::Train));
    let start = Instant::now();
    let ours = embedded().encode_docs(&docs).unwrap();
    let n_tokens: usize = ours.iter().map(Vec::len).sum();
    eprintln!(
        "{} docs, {n_tokens} tokens encoded in {:.2?}",
        docs.len(),
        start.elapsed()
    );
    assert!(n_tokens > 1_500_000, "only {n_tokens} tokens");
    let files = from_files().map(|f| f.encode_docs(&docs).unwrap());
    for (i, (doc, ids)) in docs.iter().zip(&ours).enumerate() {
        assert_eq!(
            *ids,
            tiktoken().encode_with_special_tokens(doc),
            "embedded vs tiktoken-rs on document {i}: {doc:?}"
        );
        if let Some(files) = &files {
            assert_eq!(*ids, files[i], "embedded vs files on document {i}: {doc:?}");
        }
    }
    // Round trips, and EOS between documents as the token store writes it.
    let joined = docs[..200].join("<|endoftext|>");
    let ids = embedded().encode(&joined).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == 50256).count(), 199);
    assert_eq!(embedded().decode(&ids).unwrap(), joined);
}

/// Pieces that random texts are made of, to reach contractions, special tokens
/// and whitespace runs more often than uniform characters would.
const PIECES: &[&str] = &[
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "'s",
    "'ll",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'d",
    "'",
    "the",
    " the",
    "Tom",
    "42",
    " 7",
    "<|endoftext|>",
    "🐱",
    "猫",
    "é",
    "\u{a0}",
    ".",
    "!?",
    "\r\n",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn embedded_gpt2_agrees_on_random_printable_unicode(text in "\\PC{0,40}") {
        assert_agrees(&text);
    }

    #[test]
    fn embedded_gpt2_agrees_on_random_any_chars(text in any::<String>()) {
        assert_agrees(&text);
    }

    #[test]
    fn embedded_gpt2_agrees_on_random_pieces(
        parts in proptest::collection::vec(
            prop_oneof![
                proptest::sample::select(PIECES).prop_map(str::to_owned),
                "\\PC{1,4}",
            ],
            0..24,
        )
    ) {
        assert_agrees(&parts.concat());
    }
}

/// `vocab.json` as token -> id.
fn read_vocab(path: &Path) -> HashMap<String, u32> {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `merges.txt` as pairs in order, without the `#version` line.
fn read_merges(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("#version") && !l.is_empty())
        .map(|l| {
            let (a, b) = l.split_once(' ').unwrap();
            (a.to_owned(), b.to_owned())
        })
        .collect()
}

#[test]
fn embedded_gpt2_derives_gpt2s_vocab_and_merges() {
    let Some(dir) = common::gpt2_dir() else {
        return;
    };
    let shared_vocab = read_vocab(&dir.join("vocab.json"));
    let shared_merges = read_merges(&dir.join("merges.txt"));
    assert_eq!(shared_vocab.len(), 50257);
    assert_eq!(shared_merges.len(), 50000);

    // The derivation itself.
    let derived = mlx_data::tokenizer::gpt2::vocab_merges().unwrap();
    let derived_vocab: HashMap<String, u32> = derived
        .vocab
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect();
    assert_eq!(derived_vocab, shared_vocab);
    assert_eq!(derived.merges, shared_merges);

    // What the embedded tokenizer writes beside exported weights.
    let out = tempfile::tempdir().unwrap();
    embedded().write_hf_files(out.path()).unwrap();
    assert_eq!(read_vocab(&out.path().join("vocab.json")), shared_vocab);
    assert_eq!(read_merges(&out.path().join("merges.txt")), shared_merges);

    // Built from GPT-2's files, it is the same tokenizer to the byte.
    let files = from_files().unwrap();
    assert_eq!(files.hash(), embedded().hash());
    assert!(files.is_gpt2().unwrap());
}

#[test]
fn write_hf_files_writes_what_auto_tokenizer_reads() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("export");
    let written = embedded().write_hf_files(&dir).unwrap();
    let mut names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "merges.txt",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.json"
        ]
    );
    let json = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
    };
    let config = json("tokenizer_config.json");
    assert_eq!(config["tokenizer_class"], "GPT2Tokenizer");
    for key in ["bos_token", "eos_token", "unk_token"] {
        assert_eq!(config[key], "<|endoftext|>", "{key}");
        assert_eq!(
            json("special_tokens_map.json")[key],
            "<|endoftext|>",
            "{key}"
        );
    }
    assert_eq!(config["model_max_length"], 1024);
    assert_eq!(config["add_prefix_space"], false);

    // tokenizer.json reloads as the same tokenizer; vocab.json + merges.txt too.
    let back = TextTokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    assert_eq!(back.hash(), embedded().hash());
    let tokenizer_json = json("tokenizer.json");
    assert_eq!(tokenizer_json["model"]["type"], "BPE");
    assert_eq!(tokenizer_json["pre_tokenizer"]["type"], "ByteLevel");
    assert_eq!(tokenizer_json["pre_tokenizer"]["add_prefix_space"], false);
    assert_eq!(tokenizer_json["decoder"]["type"], "ByteLevel");
    assert_eq!(tokenizer_json["added_tokens"][0]["id"], 50256);
    assert_eq!(
        tokenizer_json["added_tokens"][0]["content"],
        "<|endoftext|>"
    );
    assert_eq!(tokenizer_json["added_tokens"][0]["special"], true);
    let pair =
        TextTokenizer::from_vocab_merges(&dir.join("vocab.json"), &dir.join("merges.txt")).unwrap();
    assert_eq!(pair.hash(), embedded().hash());
    let text = "Once upon a time, Lily's cat said \"hi\"!<|endoftext|>";
    assert_eq!(back.encode(text).unwrap(), embedded().encode(text).unwrap());
}

#[test]
fn write_hf_files_for_a_trained_bpe_has_no_gpt2_length() {
    let docs = mlx_data::corpus::stories(5, 50_000);
    let t = TextTokenizer::train_byte_level(&docs, 400).unwrap();
    assert!(t.is_byte_level_bpe());
    assert!(!t.is_gpt2().unwrap());
    let out = tempfile::tempdir().unwrap();
    t.write_hf_files(out.path()).unwrap();
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["tokenizer_class"], "GPT2Tokenizer");
    assert_eq!(config["eos_token"], "<|endoftext|>");
    assert!(config.get("model_max_length").is_none(), "{config}");
    let vocab = read_vocab(&out.path().join("vocab.json"));
    assert_eq!(vocab.len(), 400);
    assert_eq!(vocab["<|endoftext|>"], t.eos_id());
    assert_eq!(read_merges(&out.path().join("merges.txt")).len(), 400 - 257);
}

#[test]
fn write_hf_files_for_another_tokenizer_is_a_fast_tokenizer_only() {
    let dir = tempfile::tempdir().unwrap();
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": 3, "content": "</s>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true
        }],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "<unk>": 2, "</s>": 3}, "unk_token": "<unk>"}
    });
    let path = dir.path().join("words.json");
    std::fs::write(&path, json.to_string()).unwrap();
    let t = TextTokenizer::from_file(&path).unwrap();
    assert!(!t.is_byte_level_bpe());
    assert!(!t.is_gpt2().unwrap());
    let out = dir.path().join("export");
    let mut names: Vec<String> = t
        .write_hf_files(&out)
        .unwrap()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    assert!(!out.join("vocab.json").exists());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(config["eos_token"], "</s>");
    assert_eq!(config["add_bos_token"], false);
    assert!(config.get("model_max_length").is_none(), "{config}");
    let back = TextTokenizer::from_file(&out.join("tokenizer.json")).unwrap();
    assert_eq!(back.hash(), t.hash());
}

#[test]
fn trained_byte_level_bpe_round_trips_and_saves() {
    let docs = mlx_data::corpus::stories(9, 200_000);
    let t = TextTokenizer::train_byte_level(&docs, 600).unwrap();
    assert_eq!(t.vocab_size(), 600);
    assert_eq!(t.encode("<|endoftext|>").unwrap(), [t.eos_id()]);
    let text = &docs[3];
    let ids = t.encode(text).unwrap();
    // It learned merges: far fewer tokens than bytes.
    assert!(
        ids.len() * 2 < text.len(),
        "{} ids for {} bytes",
        ids.len(),
        text.len()
    );
    assert_eq!(t.decode(&ids).unwrap(), *text);
    let unseen = "Zebra quantum 42 ü";
    assert_eq!(t.decode(&t.encode(unseen).unwrap()).unwrap(), unseen);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    t.save(&path).unwrap();
    let back = TextTokenizer::from_file(&path).unwrap();
    assert_eq!(back.hash(), t.hash());
    assert_eq!(back.encode(text).unwrap(), ids);
    let parallel = t.encode_docs(&docs[..50]).unwrap();
    for (d, p) in docs[..50].iter().zip(parallel) {
        assert_eq!(t.encode(d).unwrap(), p);
    }
}

#[test]
fn bad_tokenizer_file_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, "{ not json").unwrap();
    let err = TextTokenizer::from_file(&path).unwrap_err();
    assert!(matches!(err, mlx_data::DataError::Tokenizer { .. }));
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

/// Regression (found by the fuzz target `tokenizer_json` in its first
/// seconds): a `tokenizer.json` whose decoder the tokenizers crate cannot
/// read made it panic (`expect("Helper")` in tokenizers 0.22.2) inside
/// `TextTokenizer::from_file`; it is an error naming the file. Both a
/// decoder cut short (as the fuzzer's input had it) and a well-formed one
/// of the wrong shape.
#[test]
fn a_tokenizer_json_with_an_unreadable_decoder_is_an_error() {
    let docs = ["Once upon a time there was a cat.", "The cat sat on a mat."];
    let t = TextTokenizer::train_byte_level(&docs, 262).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("tokenizer.json");
    t.save(&good).unwrap();
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&good).unwrap()).unwrap();
    json["decoder"] = serde_json::json!({"type": 5});
    let text = json.to_string();
    let cut = text.replace(
        r#""decoder":{"type":5}"#,
        r#""decoder":{"type":"ByteLevel","use_regex":,"x":1}"#,
    );
    assert_ne!(cut, text);
    for (name, bytes) in [("wrong-shape.json", text), ("cut.json", cut)] {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let err = TextTokenizer::from_file(&p).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }
}
