//! Parquet read through arrow, one row group at a time: only the text column is
//! decoded, in record batches of bounded size, so memory holds at most one row
//! group's column (and usually one batch of it), never the whole file.

use crate::error::{DataError, IoContext, Result};
use arrow_array::{Array, LargeStringArray, StringArray, StringViewArray};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use std::path::{Path, PathBuf};

/// Rows per arrow record batch while decoding a row group.
pub const READ_BATCH_ROWS: usize = 1024;

fn parquet_error(path: &Path, e: impl std::fmt::Display) -> DataError {
    DataError::Parquet {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Runs one step of the parquet reader on the file `path`, a panic in it
/// becoming an error: the parquet and arrow crates still panic on some
/// malformed files (a definition-level decoder's "offset + len out of
/// bounds" in arrow-buffer 60, found by this crate's property tests), and a
/// dataset's files are untrusted. The panic's message is printed, as every
/// panic's is.
fn guarded<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let why = crate::error::panic_message(&*panic);
        Err(parquet_error(
            path,
            format!("is malformed: the parquet reader failed ({why})"),
        ))
    })
}

/// The footer's metadata of the parquet file `file` (at `path`).
fn load_metadata(path: &Path, file: &std::fs::File) -> Result<ArrowReaderMetadata> {
    guarded(path, || {
        ArrowReaderMetadata::load(file, ArrowReaderOptions::new())
            .map_err(|e| parquet_error(path, e))
    })
}

/// The `*.parquet` files of `path`: the file itself, or those directly inside the
/// folder, sorted by name.
pub fn parquet_files(path: &Path) -> Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<_> = std::fs::read_dir(path)
        .at(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet") && p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(DataError::Config(format!(
            "folder {} holds no *.parquet files",
            path.display()
        )));
    }
    Ok(files)
}

/// Number of rows and row groups of a parquet file, from its footer.
pub fn parquet_shape(path: &Path) -> Result<(u64, usize)> {
    let file = std::fs::File::open(path).at(path)?;
    let meta = load_metadata(path, &file)?;
    let m = meta.metadata();
    Ok((m.file_metadata().num_rows() as u64, m.num_row_groups()))
}

/// About how many bytes of text the column `column` of a parquet file holds, from
/// its footer alone: the column chunks' uncompressed sizes less the 4-byte length
/// of each value (exact for plainly encoded strings but for page headers; an
/// estimate for a progress bar, not a count). 0 when the column is missing.
pub fn parquet_text_bytes(path: &Path, column: &str) -> Result<u64> {
    let file = std::fs::File::open(path).at(path)?;
    let meta = load_metadata(path, &file)?;
    let m = meta.metadata();
    let schema = m.file_metadata().schema_descr();
    let Some(index) =
        (0..schema.num_columns()).find(|&i| schema.column(i).path().string() == column)
    else {
        return Ok(0);
    };
    Ok(m.row_groups()
        .iter()
        .map(|rg| {
            let c = rg.column(index);
            (c.uncompressed_size().max(0) as u64).saturating_sub(4 * c.num_values().max(0) as u64)
        })
        .sum())
}

/// Calls `row` with every value of the string column `column` of the parquet file
/// `path`, in order (`None` for nulls), decoding one row group at a time in arrow
/// batches of at most `batch_rows` rows. `row_group` is called before each row group
/// with its index and row count. A missing column, or one that is not a string
/// column (Utf8, LargeUtf8 or Utf8View), is an error naming the file, the column
/// asked for and the columns the file has.
pub fn read_parquet_column(
    path: &Path,
    column: &str,
    batch_rows: usize,
    row_group: &mut dyn FnMut(usize, u64),
    row: &mut dyn FnMut(Option<&str>) -> Result<()>,
) -> Result<()> {
    let file = std::fs::File::open(path).at(path)?;
    let meta = load_metadata(path, &file)?;
    let fields = meta.schema().fields();
    let columns = || {
        fields
            .iter()
            .map(|f| format!("{} ({})", f.name(), f.data_type()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(index) = fields.iter().position(|f| f.name() == column) else {
        return Err(parquet_error(
            path,
            format!("has no column {column:?}; its columns are: {}", columns()),
        ));
    };
    let is_string = |a: &dyn Array| {
        let any = a.as_any();
        any.is::<StringArray>() || any.is::<LargeStringArray>() || any.is::<StringViewArray>()
    };
    let empty = arrow_array::new_empty_array(fields[index].data_type());
    if !is_string(&empty) {
        return Err(parquet_error(
            path,
            format!(
                "column {column:?} has type {}, expected a string column \
                 (Utf8, LargeUtf8 or Utf8View); its columns are: {}",
                fields[index].data_type(),
                columns()
            ),
        ));
    }
    let mask = ProjectionMask::roots(meta.parquet_schema(), [index]);
    for rg in 0..meta.metadata().num_row_groups() {
        row_group(rg, meta.metadata().row_group(rg).num_rows() as u64);
        let file = file.try_clone().at(path)?;
        let mut reader = guarded(path, || {
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
                .with_projection(mask.clone())
                .with_row_groups(vec![rg])
                .with_batch_size(batch_rows.max(1))
                .build()
                .map_err(|e| parquet_error(path, e))
        })?;
        // Only the reader's own steps are guarded: a panic in `row` is the
        // caller's and goes on.
        while let Some(batch) = guarded(path, || Ok(reader.next()))? {
            let batch = batch.map_err(|e| parquet_error(path, format!("row group {rg}: {e}")))?;
            let values = batch.column(0).as_any();
            if let Some(a) = values.downcast_ref::<StringArray>() {
                a.iter().try_for_each(&mut *row)?;
            } else if let Some(a) = values.downcast_ref::<LargeStringArray>() {
                a.iter().try_for_each(&mut *row)?;
            } else if let Some(a) = values.downcast_ref::<StringViewArray>() {
                a.iter().try_for_each(&mut *row)?;
            } else {
                return Err(parquet_error(
                    path,
                    format!(
                        "row group {rg}: column {column:?} decoded as {}, not a string array",
                        batch.column(0).data_type()
                    ),
                ));
            }
        }
    }
    Ok(())
}
