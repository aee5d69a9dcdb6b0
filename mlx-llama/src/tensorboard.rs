//! TensorBoard event files: scalars per step that TensorBoard, and
//! `wandb sync --sync-tensorboard`, read.
//!
//! Written by hand: the crates for the format (`tensorboard-rs`, `tboard`)
//! are unmaintained and bring a protobuf toolchain, while what a scalar
//! needs is small and fixed: TFRecord framing (a little-endian u64 length,
//! its masked CRC32C, the bytes, their masked CRC32C; the CRC from the
//! maintained `crc32c` crate) around an `Event` protobuf message holding a
//! `Summary` of `simple_value`s (tensorflow/core/util/event.proto,
//! tensorflow/core/framework/summary.proto), encoded below with the
//! protobuf wire format's varints and fixed-width fields.
//!
//! A run's options go to TensorBoard's HParams dashboard as its plugin
//! reads them (tensorboard/plugins/hparams/summary_v2.py's `hparams_pb`):
//! a summary value tagged `_hparams_/session_start_info` whose metadata
//! names the plugin `hparams` and holds, as its content, an
//! `HParamsPluginData` (plugin_data.proto, version 0) with a
//! `SessionStartInfo`: each option a `google.protobuf.Value` (a number, a
//! string or a bool), the group (a hash of them) and the start time.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::Digest;

/// An event file being written.
pub struct EventWriter {
    file: std::fs::File,
    path: PathBuf,
}

impl EventWriter {
    /// Creates a new event file in `dir` (named as TensorBoard looks for
    /// them: `events.out.tfevents.<seconds>.<host>.<pid>`) and writes the
    /// file-version event first.
    pub fn create(dir: &Path) -> Result<EventWriter> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let now = unix_seconds();
        let host = Some(crate::run_folder::hostname())
            .filter(|h| !h.is_empty() && !h.contains('/'))
            .unwrap_or_else(|| "localhost".into());
        let base = format!(
            "events.out.tfevents.{}.{host}.{}",
            now as u64,
            std::process::id()
        );
        let (file, path) = create_unique(dir, &base)?;
        let mut w = EventWriter { file, path };
        let mut event = Vec::new();
        put_double(&mut event, 1, now);
        put_bytes(&mut event, 3, b"brain.Event:2");
        w.record(&event)?;
        Ok(w)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `scalars` (tag, value) of `step` at wall time `unix_time`
    /// (seconds since the Unix epoch) as one event.
    pub fn scalars(&mut self, step: u64, unix_time: f64, scalars: &[(&str, f64)]) -> Result<()> {
        let mut summary = Vec::new();
        for (tag, value) in scalars {
            let mut v = Vec::new();
            put_bytes(&mut v, 1, tag.as_bytes());
            put_float(&mut v, 2, *value as f32);
            put_bytes(&mut summary, 1, &v);
        }
        let mut event = Vec::new();
        put_double(&mut event, 1, unix_time);
        put_varint_field(&mut event, 2, step);
        put_bytes(&mut event, 5, &summary);
        self.record(&event)?;
        self.file
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Writes the run's hyperparameters (`name`, value), as TensorBoard's
    /// `hparams_pb` does, in a session started at `start_time` (seconds
    /// since the Unix epoch); their group (the HParams dashboard's "trial")
    /// is the SHA-256 of the sorted names and values, so runs with the same
    /// options fall into one group.
    pub fn hparams(&mut self, start_time: f64, hparams: &[(String, HParam)]) -> Result<()> {
        let mut sorted: Vec<&(String, HParam)> = hparams.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut info = Vec::new();
        let mut digest = sha2::Sha256::new();
        for (name, value) in &sorted {
            // A map entry: key = 1, value = 2 (google.protobuf.Value).
            let mut v = Vec::new();
            match value {
                HParam::Number(x) => put_double(&mut v, 2, *x),
                HParam::Text(t) => put_bytes(&mut v, 3, t.as_bytes()),
                HParam::Bool(b) => put_varint_field(&mut v, 4, *b as u64),
            }
            let mut entry = Vec::new();
            put_bytes(&mut entry, 1, name.as_bytes());
            put_bytes(&mut entry, 2, &v);
            put_bytes(&mut info, 1, &entry);
            digest.update(format!("{name}={value:?}\n").as_bytes());
        }
        let group = format!("{:x}", digest.finalize());
        put_bytes(&mut info, 4, group.as_bytes());
        put_double(&mut info, 5, start_time);
        // HParamsPluginData: version = 1 (0, left out), session_start_info = 3.
        let mut content = Vec::new();
        put_bytes(&mut content, 3, &info);
        // SummaryMetadata.plugin_data = 1: PluginData { plugin_name = 1, content = 2 }.
        let mut plugin = Vec::new();
        put_bytes(&mut plugin, 1, b"hparams");
        put_bytes(&mut plugin, 2, &content);
        let mut metadata = Vec::new();
        put_bytes(&mut metadata, 1, &plugin);
        // Summary.Value: tag = 1, tensor = 8 (hparams' NULL_TENSOR: an empty
        // float tensor of shape [0]), metadata = 9.
        let mut value = Vec::new();
        put_bytes(&mut value, 1, b"_hparams_/session_start_info");
        put_bytes(&mut value, 8, &[0x08, 0x01, 0x12, 0x02, 0x12, 0x00]);
        put_bytes(&mut value, 9, &metadata);
        let mut summary = Vec::new();
        put_bytes(&mut summary, 1, &value);
        let mut event = Vec::new();
        put_double(&mut event, 1, start_time);
        put_bytes(&mut event, 5, &summary);
        self.record(&event)?;
        self.file
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// One TFRecord: the length, its masked CRC, the data, its masked CRC;
    /// in one write, so a killed run leaves whole records.
    fn record(&mut self, data: &[u8]) -> Result<()> {
        self.file
            .write_all(&frame(data))
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// A hyperparameter's value, as the HParams dashboard shows it.
#[derive(Clone, Debug, PartialEq)]
pub enum HParam {
    /// A number (integers too).
    Number(f64),
    /// Text.
    Text(String),
    /// A switch.
    Bool(bool),
}

/// The TFRecord framing of `data`.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// TFRecord's masked CRC32C.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    put_varint(out, field << 3);
    put_varint(out, v);
}

fn put_double(out: &mut Vec<u8>, field: u64, v: f64) {
    put_varint(out, (field << 3) | 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_float(out: &mut Vec<u8>, field: u64, v: f32) {
    put_varint(out, (field << 3) | 5);
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, field: u64, v: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, v.len() as u64);
    out.extend_from_slice(v);
}

/// Creates `dir/base`, or `dir/base.1`, `dir/base.2`, ... when the name is
/// taken: a run resumed in the same second by the same process (as tests
/// do) must not fail, nor write into the earlier run's file. TensorBoard
/// reads every `events.out.tfevents.*` file in the folder, in name order.
fn create_unique(dir: &Path, base: &str) -> Result<(std::fs::File, PathBuf)> {
    let mut n = 0u32;
    loop {
        let name = if n == 0 {
            base.to_string()
        } else {
            format!("{base}.{n}")
        };
        let path = dir.join(name);
        match std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
        {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masked_crc_and_varints_match_the_published_values() {
        // CRC32C of "123456789" is 0xE3069283 (RFC 3720's check value);
        // masked: rotated right by 15, plus 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(
            masked_crc(b"123456789"),
            0xE306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
        let mut v = Vec::new();
        put_varint(&mut v, 300);
        assert_eq!(v, [0xAC, 0x02]);
        let f = frame(b"abc");
        assert_eq!(f.len(), 8 + 4 + 3 + 4);
        assert_eq!(&f[..8], &3u64.to_le_bytes());
        assert_eq!(&f[12..15], b"abc");
    }

    #[test]
    fn writers_started_in_the_same_second_get_their_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = EventWriter::create(dir.path()).unwrap();
        let b = EventWriter::create(dir.path()).unwrap();
        let c = EventWriter::create(dir.path()).unwrap();
        assert_ne!(a.path(), b.path());
        assert_ne!(b.path(), c.path());
        assert_ne!(a.path(), c.path());
        for w in [&a, &b, &c] {
            let name = w.path().file_name().unwrap().to_str().unwrap();
            assert!(name.starts_with("events.out.tfevents."), "{name}");
            // Each holds its own file-version record, untouched by the others.
            let bytes = std::fs::read(w.path()).unwrap();
            let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            assert_eq!(bytes.len(), 8 + 4 + len + 4);
        }
    }
}
