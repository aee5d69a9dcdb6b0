//! Parquet files written with arrow's `ArrowWriter`, as the Hub's datasets are.

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use std::sync::Arc;

/// Writes `columns` as one parquet file (snappy) of at most `rows_per_group` rows
/// per row group.
pub fn parquet_of(columns: Vec<(&str, ArrayRef)>, rows_per_group: usize) -> Vec<u8> {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows_per_group))
        .set_compression(Compression::SNAPPY)
        .build();
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    out
}

/// A parquet file with an `id` (Int64) column and a `text` (Utf8) column holding
/// `texts` (`None` is a null), at most `rows_per_group` rows per row group.
pub fn text_parquet(texts: &[Option<String>], rows_per_group: usize) -> Vec<u8> {
    let ids = Int64Array::from_iter_values(0..texts.len() as i64);
    parquet_of(
        vec![
            ("id", Arc::new(ids) as ArrayRef),
            (
                "text",
                Arc::new(StringArray::from(texts.to_vec())) as ArrayRef,
            ),
        ],
        rows_per_group,
    )
}

/// The documents a reader should find in `texts`: non-null, trimmed, non-blank.
pub fn expected_docs(texts: &[Option<String>]) -> Vec<String> {
    texts
        .iter()
        .flatten()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect()
}
