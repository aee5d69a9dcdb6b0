//! End to end with no network: offline corpus, embedded GPT-2 or trained
//! tokenizer, stores, loader; plus local text and JSON Lines sources.

mod common;

use mlx_data::{
    BatchSize, DataLoader, LoaderConfig, LocalFormat, LocalSource, OfflineCorpus, SourceSpec,
    Split, TokenizerSpec, prepare,
};

#[test]
fn offline_mode_falls_back_to_the_builtin_corpus_and_trains_a_tokenizer_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let offline = OfflineCorpus {
        seed: 11,
        train_bytes: 300_000,
        validation_bytes: 30_000,
    };
    let source = SourceSpec::Auto {
        hub: Default::default(),
        offline: offline.clone(),
    };
    let cfg = common::offline_config(
        dir.path(),
        source,
        TokenizerSpec::TrainByteLevel { vocab_size: 512 },
    );
    let data = prepare(&cfg).unwrap();
    assert_eq!(data.source_kind, "offline");
    assert_eq!(data.tokenizer.vocab_size(), 512);
    assert!(data.train.meta().source.starts_with("offline:"));
    assert_eq!(data.train.header().dtype, mlx_data::store::TokenDtype::U16);

    // The stores hold exactly the generated stories, in order.
    let valid_docs = offline.split(Split::Validation);
    assert_eq!(data.validation.n_docs() as usize, valid_docs.len());
    for i in [0, 5, valid_docs.len() - 1] {
        let ids = data.validation.doc(i as u64).unwrap().to_vec();
        assert_eq!(data.tokenizer.decode(&ids).unwrap(), valid_docs[i]);
    }
    let train_docs = offline.split(Split::Train);
    assert_eq!(data.train.n_docs() as usize, train_docs.len());

    // A second prepare reuses the cached tokenizer and stores.
    let again = prepare(&cfg).unwrap();
    assert_eq!(again.tokenizer.hash(), data.tokenizer.hash());
    assert_eq!(again.train.path(), data.train.path());

    let mut l = DataLoader::new(
        again.train.clone(),
        LoaderConfig {
            block_size: 64,
            batch: BatchSize::Global(4),
            world: 2,
            rank: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let b = l.next_batch().unwrap();
    assert_eq!(b.batch_size, 2);
    assert_eq!(b.tokens.len(), 2 * 65);
}

#[test]
fn default_tokenizer_is_gpt2_with_no_network() {
    let dir = tempfile::tempdir().unwrap();
    let offline = OfflineCorpus {
        seed: 12,
        train_bytes: 40_000,
        validation_bytes: 10_000,
    };
    let cfg = common::offline_config(
        dir.path(),
        SourceSpec::Offline(offline.clone()),
        TokenizerSpec::default(),
    );
    assert_eq!(cfg.tokenizer, TokenizerSpec::Gpt2);
    let data = prepare(&cfg).unwrap();
    assert_eq!(data.tokenizer.vocab_size(), 50257);
    assert_eq!(data.tokenizer.eos_id(), 50256);
    assert_eq!(data.train.header().dtype, mlx_data::store::TokenDtype::U16);
    // The stored ids are GPT-2's, as tiktoken-rs's own GPT-2 encoder gives them.
    let gpt2 = tiktoken_rs::r50k_base().unwrap();
    let valid_docs = offline.split(Split::Validation);
    assert_eq!(data.validation.n_docs() as usize, valid_docs.len());
    for (i, doc) in valid_docs.iter().enumerate() {
        let ids = data.validation.doc(i as u64).unwrap().to_vec();
        assert_eq!(ids, gpt2.encode_with_special_tokens(doc), "document {i}");
    }
    // Nothing was downloaded or trained.
    assert!(!dir.path().join("cache").join("tokenizers").exists());
    assert!(!dir.path().join("hf").exists());
}

#[test]
fn local_text_folder_and_json_lines_sources() {
    let dir = tempfile::tempdir().unwrap();
    let text_dir = dir.path().join("texts");
    std::fs::create_dir_all(&text_dir).unwrap();
    std::fs::write(text_dir.join("a.txt"), "First story.\n===\nSecond story.").unwrap();
    std::fs::write(text_dir.join("b.txt"), "Third story.\n===\n").unwrap();
    std::fs::write(text_dir.join("skip.md"), "not text").unwrap();
    let jsonl = dir.path().join("v.jsonl");
    std::fs::write(
        &jsonl,
        "{\"text\": \"Valid one.\"}\n\n{\"text\": \"Valid two.\", \"id\": 3}\n",
    )
    .unwrap();

    let t = mlx_data::source::Resolved::Local(LocalSource {
        train: text_dir.clone(),
        validation: Some(jsonl.clone()),
        format: LocalFormat::Text {
            separator: "===".into(),
        },
        options: Default::default(),
    });
    let c = t.load(Split::Train).unwrap();
    assert_eq!(
        c.docs().collect::<Vec<_>>(),
        ["First story.", "Second story.", "Third story."]
    );
    let j = mlx_data::Corpus::from_json_lines(&jsonl).unwrap();
    assert_eq!(j.docs().collect::<Vec<_>>(), ["Valid one.", "Valid two."]);

    std::fs::write(&jsonl, "{\"text\": \"ok\"}\n{\"txt\": \"bad\"}\n").unwrap();
    let err = mlx_data::Corpus::from_json_lines(&jsonl).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("line 2") && msg.contains("byte offset 15") && msg.contains("\"text\""),
        "{msg}"
    );

    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, b"fine\xff\xfe").unwrap();
    let err = mlx_data::Corpus::from_text_file(&bad, "\n", None).unwrap_err();
    assert!(err.to_string().contains("byte offset 4"), "{err}");
}

#[test]
fn local_source_with_gpt2_files_end_to_end() {
    let Some(gpt2) = common::gpt2_dir() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.txt");
    let valid = dir.path().join("valid.txt");
    std::fs::write(
        &train,
        "Hello world<|endoftext|>\nThe quick brown fox<|endoftext|>Hello, world!",
    )
    .unwrap();
    std::fs::write(&valid, "Hello world").unwrap();
    let source = SourceSpec::Local(LocalSource {
        train,
        validation: Some(valid),
        format: LocalFormat::Text {
            separator: "<|endoftext|>".into(),
        },
        options: Default::default(),
    });
    let tok = TokenizerSpec::VocabMerges {
        vocab: gpt2.join("vocab.json"),
        merges: gpt2.join("merges.txt"),
    };
    let data = prepare(&common::offline_config(dir.path(), source, tok)).unwrap();
    assert_eq!(data.source_kind, "local");
    let stream = data.train.tokens(0, data.train.n_tokens()).to_vec();
    assert_eq!(
        stream,
        [
            15496, 995, 50256, 464, 2068, 7586, 21831, 50256, 15496, 11, 995, 0, 50256
        ]
    );
}
