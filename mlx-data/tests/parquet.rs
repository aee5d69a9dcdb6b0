//! Local parquet sources: stores equal to those built from the same documents as
//! JSON Lines, clear errors for a missing or non-string column, every arrow string
//! type, and documents handed over in bounded batches, row group by row group.

mod common;

use arrow_array::{ArrayRef, Int64Array, LargeStringArray, StringViewArray};
use common::parquet_files::{expected_docs, parquet_of, text_parquet};
use mlx_data::source::Resolved;
use mlx_data::source::parquet::{parquet_shape, read_parquet_column};
use mlx_data::{DataError, LocalFormat, LocalSource, SourceSpec, Split, TokenizerSpec, prepare};
use std::path::PathBuf;
use std::sync::Arc;

/// Stories with the awkward rows a real file has: a null, a blank, padding.
fn texts(seed: u64, bytes: usize) -> Vec<Option<String>> {
    let mut t: Vec<Option<String>> = mlx_data::corpus::stories(seed, bytes)
        .into_iter()
        .map(Some)
        .collect();
    t.insert(3, None);
    t.insert(7, Some("   \n ".into()));
    t.insert(9, Some("  padded story.\n".into()));
    t
}

fn json_lines(texts: &[Option<String>]) -> String {
    texts
        .iter()
        .flatten()
        .map(|t| serde_json::json!({ "text": t, "id": 1 }).to_string() + "\n")
        .collect()
}

fn local(train: PathBuf, validation: PathBuf, format: LocalFormat) -> SourceSpec {
    SourceSpec::Local(LocalSource {
        train,
        validation: Some(validation),
        format,
        options: Default::default(),
    })
}

fn parquet_format() -> LocalFormat {
    LocalFormat::Parquet {
        column: "text".into(),
    }
}

#[test]
fn local_parquet_store_equals_the_json_lines_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Training data: a folder of two files (read in name order), several row groups each.
    let train_a = texts(5, 30_000);
    let train_b = texts(6, 20_000);
    let valid = texts(7, 8_000);
    std::fs::create_dir_all(d.join("train")).unwrap();
    std::fs::write(d.join("train/b.parquet"), text_parquet(&train_b, 13)).unwrap();
    std::fs::write(d.join("train/a.parquet"), text_parquet(&train_a, 13)).unwrap();
    std::fs::write(d.join("train/notes.txt"), "not parquet").unwrap();
    std::fs::write(d.join("valid.parquet"), text_parquet(&valid, 5)).unwrap();
    assert!(parquet_shape(&d.join("train/a.parquet")).unwrap().1 > 3);

    let all_train: Vec<Option<String>> = train_a.iter().chain(&train_b).cloned().collect();
    std::fs::write(d.join("train.jsonl"), json_lines(&all_train)).unwrap();
    std::fs::write(d.join("valid.jsonl"), json_lines(&valid)).unwrap();

    // Parquet with a tokenizer trained on it (the trained-tokenizer path reads parquet).
    let pq = prepare(&common::offline_config(
        &d.join("pq"),
        local(d.join("train"), d.join("valid.parquet"), parquet_format()),
        TokenizerSpec::TrainByteLevel { vocab_size: 300 },
    ))
    .unwrap();
    assert_eq!(pq.source_kind, "local");
    let tok_file = d.join("tokenizer.json");
    pq.tokenizer.save(&tok_file).unwrap();

    let js = prepare(&common::offline_config(
        &d.join("js"),
        local(
            d.join("train.jsonl"),
            d.join("valid.jsonl"),
            LocalFormat::JsonLines,
        ),
        TokenizerSpec::File(tok_file),
    ))
    .unwrap();

    for (split, a, b, docs) in [
        ("train", &pq.train, &js.train, expected_docs(&all_train)),
        (
            "validation",
            &pq.validation,
            &js.validation,
            expected_docs(&valid),
        ),
    ] {
        assert_eq!(a.n_docs(), docs.len() as u64, "{split}");
        assert_eq!(
            a.tokens(0, a.n_tokens()).to_vec(),
            b.tokens(0, b.n_tokens()).to_vec(),
            "{split}"
        );
        for (i, doc) in docs.iter().enumerate() {
            let ids = a.doc(i as u64).unwrap().to_vec();
            assert_eq!(&pq.tokenizer.decode(&ids).unwrap(), doc, "{split} doc {i}");
        }
    }
    assert!(pq.train.meta().source.contains("a.parquet"));
    assert!(pq.train.meta().source.contains("b.parquet"));

    // Built again from scratch, the store is byte for byte the same.
    let store = pq.train.path().to_path_buf();
    let first = std::fs::read(&store).unwrap();
    drop(pq);
    std::fs::remove_file(&store).unwrap();
    let again = prepare(&common::offline_config(
        &d.join("pq"),
        local(d.join("train"), d.join("valid.parquet"), parquet_format()),
        TokenizerSpec::TrainByteLevel { vocab_size: 300 },
    ))
    .unwrap();
    assert_eq!(again.train.path(), store);
    assert_eq!(std::fs::read(&store).unwrap(), first);
}

#[test]
fn missing_or_non_string_column_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stories.parquet");
    std::fs::write(&file, text_parquet(&texts(1, 8_000), 4)).unwrap();
    let read = |column: &str| {
        let r = Resolved::Local(LocalSource {
            train: file.clone(),
            validation: Some(file.clone()),
            format: LocalFormat::Parquet {
                column: column.into(),
            },
            options: Default::default(),
        });
        r.for_each_batch(Split::Train, 10, |_| Ok(())).unwrap_err()
    };
    let err = read("story");
    let msg = err.to_string();
    assert!(matches!(err, DataError::Parquet { .. }), "{msg}");
    for part in [
        file.display().to_string(),
        "\"story\"".into(),
        "id (Int64)".into(),
        "text (Utf8)".into(),
    ] {
        assert!(msg.contains(&part), "{part:?} missing from: {msg}");
    }

    let err = read("id");
    let msg = err.to_string();
    assert!(matches!(err, DataError::Parquet { .. }), "{msg}");
    for part in [
        file.display().to_string(),
        "column \"id\" has type Int64".into(),
        "expected a string column".into(),
        "text (Utf8)".into(),
    ] {
        assert!(msg.contains(&part), "{part:?} missing from: {msg}");
    }

    // Not a parquet file at all: the error names it.
    let bad = dir.path().join("bad.parquet");
    std::fs::write(&bad, b"definitely not parquet").unwrap();
    let err = read_parquet_column(&bad, "text", 16, &mut |_, _| {}, &mut |_| Ok(())).unwrap_err();
    assert!(
        matches!(err, DataError::Parquet { .. }) && err.to_string().contains("bad.parquet"),
        "{err}"
    );
}

#[test]
fn large_utf8_and_utf8_view_columns_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let texts = texts(2, 8_000);
    let expected = expected_docs(&texts);
    let n = texts.len() as i64;
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("n", Arc::new(Int64Array::from_iter_values(0..n))),
        ("large", Arc::new(LargeStringArray::from(texts.clone()))),
        ("view", Arc::new(StringViewArray::from(texts.clone()))),
    ];
    let file = dir.path().join("types.parquet");
    std::fs::write(&file, parquet_of(columns, 3)).unwrap();
    for column in ["large", "view"] {
        let r = Resolved::Local(LocalSource {
            train: file.clone(),
            validation: Some(file.clone()),
            format: LocalFormat::Parquet {
                column: column.into(),
            },
            options: Default::default(),
        });
        let mut got = Vec::new();
        r.for_each_batch(Split::Validation, 4, |docs| {
            got.extend_from_slice(docs);
            Ok(())
        })
        .unwrap();
        assert_eq!(got, expected, "{column}");
    }
}

#[test]
fn documents_come_in_bounded_batches_row_group_by_row_group() {
    let dir = tempfile::tempdir().unwrap();
    let texts = texts(3, 60_000);
    let expected = expected_docs(&texts);
    let rows_per_group = 17;
    let file = dir.path().join("many.parquet");
    std::fs::write(&file, text_parquet(&texts, rows_per_group)).unwrap();
    let (rows, groups) = parquet_shape(&file).unwrap();
    assert_eq!(rows, texts.len() as u64);
    assert_eq!(groups, texts.len().div_ceil(rows_per_group));
    assert!(groups >= 8, "{groups}");

    // The reader hands values over row group by row group, each within its own group,
    // in arrow batches no larger than asked for.
    let mut seen_groups: Vec<(usize, u64)> = Vec::new();
    let mut rows_in_group = Vec::new();
    let mut values = Vec::new();
    let batch_rows = 5;
    let rows_in = std::cell::RefCell::new(0u64);
    read_parquet_column(
        &file,
        "text",
        batch_rows,
        &mut |i, n| {
            if !seen_groups.is_empty() {
                rows_in_group.push(rows_in.replace(0));
            }
            seen_groups.push((i, n));
        },
        &mut |v| {
            *rows_in.borrow_mut() += 1;
            values.push(v.map(str::to_owned));
            Ok(())
        },
    )
    .unwrap();
    rows_in_group.push(rows_in.take());
    assert_eq!(values, texts);
    assert_eq!(seen_groups.len(), groups);
    for (k, ((i, n), got)) in seen_groups.iter().zip(&rows_in_group).enumerate() {
        assert_eq!(*i, k);
        assert!(*n <= rows_per_group as u64);
        assert_eq!(got, n, "row group {k}");
    }

    // The source hands documents over at most `batch_docs` at a time, all in order.
    let r = Resolved::Local(LocalSource {
        train: file.clone(),
        validation: Some(file.clone()),
        format: LocalFormat::Parquet {
            column: "text".into(),
        },
        options: Default::default(),
    });
    let mut sizes = Vec::new();
    let mut got = Vec::new();
    r.for_each_batch(Split::Train, 7, |docs| {
        sizes.push(docs.len());
        got.extend_from_slice(docs);
        Ok(())
    })
    .unwrap();
    assert_eq!(got, expected);
    let (last, full) = sizes.split_last().unwrap();
    assert!(full.iter().all(|&s| s == 7), "{sizes:?}");
    assert!((1..=7).contains(last), "{sizes:?}");

    // An error from the callback stops the reading and comes back unchanged.
    let mut calls = 0;
    let err = r
        .for_each_batch(Split::Train, 7, |_| {
            calls += 1;
            Err(DataError::Config("stop here".into()))
        })
        .unwrap_err();
    assert_eq!(calls, 1);
    assert!(err.to_string().contains("stop here"), "{err}");
}

#[test]
fn the_text_size_hint_of_parquet_and_json_lines_is_close_to_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = texts(11, 200_000);
    let valid = texts(12, 20_000);
    let bytes = |t: &[Option<String>]| t.iter().flatten().map(|s| s.len() as u64).sum::<u64>();
    std::fs::write(d.join("train.parquet"), text_parquet(&train, 50)).unwrap();
    std::fs::write(d.join("valid.parquet"), text_parquet(&valid, 50)).unwrap();
    std::fs::write(d.join("train.jsonl"), json_lines(&train)).unwrap();
    std::fs::write(d.join("valid.jsonl"), json_lines(&valid)).unwrap();
    let close = |hint: Option<u64>, truth: u64, what: &str| {
        let h = hint.unwrap_or_else(|| panic!("{what}: no hint")) as f64;
        let ratio = h / truth as f64;
        // An estimate for a bar's total: within a fifth of the text either way.
        assert!(
            (0.8..1.2).contains(&ratio),
            "{what}: hint {h} for {truth} bytes"
        );
    };
    for (split, truth) in [
        (Split::Train, bytes(&train)),
        (Split::Validation, bytes(&valid)),
    ] {
        let pq = Resolved::Local(LocalSource {
            train: d.join("train.parquet"),
            validation: Some(d.join("valid.parquet")),
            format: parquet_format(),
            options: Default::default(),
        });
        close(pq.text_bytes_hint(split), truth, "parquet");
        let jl = Resolved::Local(LocalSource {
            train: d.join("train.jsonl"),
            validation: Some(d.join("valid.jsonl")),
            format: LocalFormat::JsonLines,
            options: Default::default(),
        });
        close(jl.text_bytes_hint(split), truth, "json lines");
    }
    // A column the files do not have: nothing to estimate.
    let missing = Resolved::Local(LocalSource {
        train: d.join("train.parquet"),
        validation: Some(d.join("valid.parquet")),
        format: LocalFormat::Parquet {
            column: "body".into(),
        },
        options: Default::default(),
    });
    assert_eq!(missing.text_bytes_hint(Split::Train), Some(0));
}

/// Reads `bytes` as a parquet file every way the pipeline does (its shape,
/// its text size, its text column): errors are fine, panics not.
fn read_every_way(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fuzzed.parquet");
    std::fs::write(&p, bytes).unwrap();
    let _ = parquet_shape(&p);
    let _ = mlx_data::source::parquet::parquet_text_bytes(&p, "text");
    let _ = read_parquet_column(&p, "text", 2, &mut |_, _| {}, &mut |_| Ok(()));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Arbitrary bytes (the fuzz target `parquet` runs the same readers
    /// under coverage guidance).
    #[test]
    fn arbitrary_bytes_are_read_or_give_an_error(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
    ) {
        read_every_way(&bytes);
    }

    /// A valid file (two row groups, a null) with bytes flipped or cut.
    #[test]
    fn mutated_files_are_read_or_give_an_error(
        flips in proptest::collection::vec((0usize..4096, 1u8..=255), 1..4),
        cut in 0usize..4096,
    ) {
        let texts = [Some("Once upon a time".to_string()), None, Some("the end".into())];
        let mut b = text_parquet(&texts, 2);
        for (at, x) in flips {
            let at = at % b.len();
            b[at] ^= x;
        }
        b.truncate(cut.max(4));
        read_every_way(&b);
    }
}

/// Regression (found by `mutated_files_are_read_or_give_an_error`): a valid
/// file with one byte flipped and its end cut made arrow-buffer panic
/// ("offset + len out of bounds", decoding definition levels) inside
/// `read_parquet_column`; the reader's panic is now an error naming the file.
#[test]
fn a_file_the_parquet_crate_panics_on_is_an_error() {
    let texts = [
        Some("Once upon a time".to_string()),
        None,
        Some("the end".into()),
    ];
    let mut b = text_parquet(&texts, 2);
    let at = 1436 % b.len();
    b[at] ^= 155;
    b.truncate(1220);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("flipped.parquet");
    std::fs::write(&p, &b).unwrap();
    let err = read_parquet_column(&p, "text", 2, &mut |_, _| {}, &mut |_| Ok(())).unwrap_err();
    assert!(err.to_string().contains("flipped.parquet"), "{err}");
}
