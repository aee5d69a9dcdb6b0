//! Tokenizers: GPT-2 exactness from vocab.json + merges.txt, trained BPE round trips.

mod common;

use mlx_data::TextTokenizer;

#[test]
fn gpt2_from_vocab_and_merges_tokenizes_like_gpt2() {
    let Some(dir) = common::gpt2_dir() else {
        return;
    };
    let t =
        TextTokenizer::from_vocab_merges(&dir.join("vocab.json"), &dir.join("merges.txt")).unwrap();
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
    // Byte-level: any text round-trips exactly, whitespace and non-ASCII included.
    let text = "Once upon a time,\n\n  Lily's cat — naïve 猫 🐱 —\tsaid \"hi\"!<|endoftext|>Tom";
    let ids = t.encode(text).unwrap();
    assert!(ids.contains(&50256));
    assert_eq!(t.decode(&ids).unwrap(), text);
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
