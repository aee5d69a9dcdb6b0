//! Where a model comes from: the one place that turns what a user names
//! (`train --init-from X`, `generate --checkpoint X`) into weights, a
//! tokenizer and the tokens that end a generation.
//!
//! `X` is, in this order:
//! - an existing folder: a checkpoint folder (it has `manifest.json`), a
//!   Hugging Face / mlx-lm / export folder ([`import::is_model_folder`]),
//!   or a run folder (its newest intact checkpoint,
//!   [`checkpoint::latest_good`]);
//! - else a Hub model name `org/name` or `org/name@revision` (a branch, tag
//!   or commit), whose model files [`mlx_data::hub::snapshot()`] makes local
//!   (Hugging Face's cache: `HF_HOME`, `HF_HUB_CACHE`; `HF_HUB_OFFLINE=1`
//!   uses only what it holds).
//!
//! A model folder's files are untrusted: the stop tokens are read from
//! `generation_config.json`, `config.json`, `tokenizer_config.json` and
//! `tokenizer.json` by parsing functions that give an error, never a panic,
//! on any bytes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlx_data::hub::{HubClient, HubConfig, RepoKind, SnapshotFilter};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::TokenizerChoice;
use crate::{Llama, LlamaConfig, TrainConfig, checkpoint, import};

/// The largest configuration file read (a real one is a few KiB).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The largest `tokenizer.json` read for its added tokens.
const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// A model source as the user wrote it: a path or a Hub name, kept as
/// given (in run.toml and checkpoint manifests, where `--init-from` was a
/// path string before, which still reads as one).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelSource(String);

impl std::str::FromStr for ModelSource {
    type Err = String;
    /// Any non-empty string; what it names is found by
    /// [`ModelSource::locate`].
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Err("expected a folder or a Hub model name (org/name[@revision])".into());
        }
        Ok(ModelSource(s.to_owned()))
    }
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&Path> for ModelSource {
    fn from(p: &Path) -> Self {
        ModelSource(p.to_string_lossy().into_owned())
    }
}

impl From<PathBuf> for ModelSource {
    fn from(p: PathBuf) -> Self {
        ModelSource::from(p.as_path())
    }
}

impl From<&str> for ModelSource {
    fn from(s: &str) -> Self {
        ModelSource(s.to_owned())
    }
}

/// A model on the Hugging Face Hub at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubName {
    /// `org/name`.
    pub repo: String,
    /// A branch, tag or commit (`main` unless named after `@`).
    pub revision: String,
}

impl std::fmt::Display for HubName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.repo, self.revision)
    }
}

/// Whether `s` is a name part of a Hub repository id, as huggingface_hub's
/// `validate_repo_id` has it: letters, digits, `-`, `_` and `.`, at most 96,
/// not starting or ending with `-` or `.`, without `--` or `..`.
fn is_repo_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
        && !s.contains("--")
        && !s.contains("..")
}

impl HubName {
    /// `org/name` or `org/name@revision`, checked: two name parts (see
    /// huggingface_hub's rules), and a revision that is a plain relative
    /// name (a branch such as `refs/pr/1`, a tag or a commit) of printable
    /// characters; else an error saying what a Hub name looks like.
    pub fn parse(s: &str) -> Result<HubName, String> {
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (s, "main"),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 || !parts.iter().all(|p| is_repo_part(p)) {
            return Err(format!(
                "`{s}` is not a Hub model name: expected org/name or org/name@revision, \
                 each name of letters, digits, '-', '_' and '.'"
            ));
        }
        let printable = revision
            .chars()
            .all(|c| !c.is_control() && !c.is_whitespace() && c != '@');
        if revision.is_empty()
            || revision.len() > 255
            || !printable
            || mlx_data::hub::cache::check_relative("revision", revision).is_err()
        {
            return Err(format!(
                "`{s}`: the revision after '@' must be a branch, tag or commit \
                 (a relative name without '..', spaces or control characters)"
            ));
        }
        Ok(HubName {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
        })
    }
}

/// What a [`ModelSource`] names, found without the network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Located {
    /// An existing folder.
    Path(PathBuf),
    /// A model on the Hub.
    Hub(HubName),
}

/// What kind of folder a resolved source is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// One of our checkpoint folders (its `manifest.json` records the run).
    Checkpoint,
    /// A Hugging Face, mlx-lm or export folder (`config.json` and
    /// safetensors weights).
    ModelFolder,
}

/// A source made local: the folder to read and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// What the user gave.
    pub source: ModelSource,
    /// Checkpoint or model folder.
    pub kind: SourceKind,
    /// The checkpoint folder, or the model folder (a Hub snapshot folder
    /// for a Hub name).
    pub dir: PathBuf,
    /// The Hub model it came from, if any.
    pub hub: Option<HubName>,
}

impl ModelSource {
    /// The string as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What the string names, without touching the network or reading any
    /// weights: an existing path, else a valid Hub name, else an error
    /// saying it is neither.
    pub fn locate(&self) -> Result<Located> {
        let path = Path::new(&self.0);
        if path.exists() {
            return Ok(Located::Path(path.to_path_buf()));
        }
        // A path that names the file system (absolute, `./`, `../`, `~`)
        // was meant as one: it does not exist.
        if path.is_absolute() || self.0.starts_with('.') || self.0.starts_with('~') {
            bail!("`{}` does not exist", self.0);
        }
        HubName::parse(&self.0).map(Located::Hub).map_err(|why| {
            anyhow::anyhow!(
                "`{}` is neither an existing folder nor a Hub model name ({why})",
                self.0
            )
        })
    }

    /// The folder to read: a checkpoint folder (for a run folder, its newest
    /// intact checkpoint) or a model folder; a Hub name's files fetched
    /// into the Hub cache `hub` names (or, offline, found there).
    pub fn resolve(&self, hub: &HubConfig) -> Result<Resolved> {
        let resolved = |kind, dir, name| Resolved {
            source: self.clone(),
            kind,
            dir,
            hub: name,
        };
        match self.locate()? {
            Located::Path(p) => {
                let (kind, dir) = classify(&p)?;
                Ok(resolved(kind, dir, None))
            }
            Located::Hub(name) => {
                let client = HubClient::new(hub.clone());
                let dir = mlx_data::hub::snapshot(
                    &client,
                    RepoKind::Model,
                    &name.repo,
                    &name.revision,
                    &SnapshotFilter::model(),
                )
                .with_context(|| {
                    format!(
                        "`{}` is not an existing folder; as a Hub model ({name}) it could not be made local",
                        self.0
                    )
                })?;
                if !import::is_model_folder(&dir) {
                    bail!(
                        "the Hub snapshot {} of {name} is not a model folder (config.json and safetensors weights)",
                        dir.display()
                    );
                }
                Ok(resolved(SourceKind::ModelFolder, dir, Some(name)))
            }
        }
    }
}

/// What an existing path is: a checkpoint folder, a model folder, or a run
/// folder's newest intact checkpoint.
fn classify(p: &Path) -> Result<(SourceKind, PathBuf)> {
    if !p.is_dir() {
        bail!(
            "{} is a file; expected a run folder, a checkpoint folder or a model folder",
            p.display()
        );
    }
    if p.join("manifest.json").is_file() {
        return Ok((SourceKind::Checkpoint, p.to_path_buf()));
    }
    if import::is_model_folder(p) {
        return Ok((SourceKind::ModelFolder, p.to_path_buf()));
    }
    if p.join("checkpoints").is_dir() {
        let found = checkpoint::latest_good(p)?
            .with_context(|| format!("the run folder {} holds no checkpoint", p.display()))?;
        return Ok((SourceKind::Checkpoint, found.dir));
    }
    bail!(
        "{} is neither a run folder (checkpoints/), a checkpoint folder (manifest.json) \
         nor a model folder (config.json with model.safetensors or model.safetensors.index.json)",
        p.display()
    )
}

impl Resolved {
    /// The model's shape: a model folder's `config.json`, or the
    /// checkpoint's configuration with its vocabulary (read from the
    /// manifest; the weights are checked when loaded).
    pub fn model_config(&self) -> Result<LlamaConfig> {
        match self.kind {
            SourceKind::ModelFolder => Ok(import::read_config(&self.dir)?.model),
            SourceKind::Checkpoint => Ok(checkpoint::configs(&self.dir)?.1),
        }
    }

    /// The training configuration of a checkpoint (`None` for a model folder).
    pub fn trained_config(&self) -> Result<Option<TrainConfig>> {
        match self.kind {
            SourceKind::ModelFolder => Ok(None),
            SourceKind::Checkpoint => Ok(Some(checkpoint::configs(&self.dir)?.0)),
        }
    }

    /// The whole model, float32 ([`import::load`] or
    /// [`checkpoint::load_trained`], which verifies the checkpoint's files).
    pub fn load(&self) -> Result<Llama> {
        match self.kind {
            SourceKind::ModelFolder => import::load(&self.dir),
            SourceKind::Checkpoint => Ok(checkpoint::load_trained(&self.dir)?.model),
        }
    }

    /// The tokenizer that goes with the weights: a model folder's
    /// `tokenizer.json` (GPT-2's when it has none, with a warning), or the
    /// one the checkpoint's run used ([`checkpoint::tokenizer_of`]: the
    /// checkpoint's copy, never a path outside its run folder).
    pub fn tokenizer(&self) -> Result<TokenizerChoice> {
        match self.kind {
            SourceKind::ModelFolder => {
                let file = self.dir.join("tokenizer.json");
                if file.is_file() {
                    Ok(TokenizerChoice::File(file))
                } else {
                    tracing::warn!(
                        folder = %self.dir.display(),
                        "the model folder has no tokenizer.json: using GPT-2's (pass --tokenizer if that is wrong)"
                    );
                    Ok(TokenizerChoice::Auto)
                }
            }
            SourceKind::Checkpoint => checkpoint::tokenizer_of(&self.dir),
        }
    }

    /// The tokens that end a generation besides the tokenizer's own end of
    /// text: for a model folder, [`stop_tokens`]; for a checkpoint of a run
    /// that started from a model (--init-from), that model's when it can
    /// still be found (a warning and none when not: a full run's checkpoint
    /// holds its whole model); else none.
    pub fn stop_tokens(&self) -> Result<Vec<u32>> {
        match self.kind {
            SourceKind::ModelFolder => stop_tokens(&self.dir),
            SourceKind::Checkpoint => match checkpoint::configs(&self.dir)?.0.init_from {
                Some(base) => match base.resolve(&HubConfig::from_env()) {
                    Ok(found) => found.stop_tokens(),
                    Err(e) => {
                        tracing::warn!(
                            "the end-of-sequence tokens of {base}, which this run started from, are unknown: {e:#}"
                        );
                        Ok(vec![])
                    }
                },
                None => Ok(vec![]),
            },
        }
    }
}

/// Reads `path` if it exists (at most `limit` bytes; more is an error).
fn read_optional(path: &Path, limit: u64) -> Result<Option<Vec<u8>>> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut bytes = vec![];
    f.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > limit {
        bail!("{} is larger than {limit} bytes", path.display());
    }
    Ok(Some(bytes))
}

/// A model folder's end-of-sequence tokens: `eos_token_id` (a number or a
/// list) of `generation_config.json`, else of `config.json`; and the
/// `eos_token` of `tokenizer_config.json`, looked up in `tokenizer.json`'s
/// tokens. Each file may be missing; one that is malformed is an error
/// naming it.
pub fn stop_tokens(dir: &Path) -> Result<Vec<u32>> {
    let ids_in = |name: &str| -> Result<Option<Vec<u32>>> {
        let path = dir.join(name);
        match read_optional(&path, MAX_CONFIG_BYTES)? {
            Some(b) => eos_token_ids(&b).with_context(|| format!("in {}", path.display())),
            None => Ok(None),
        }
    };
    let mut ids = match ids_in("generation_config.json")? {
        Some(ids) => ids,
        None => ids_in("config.json")?.unwrap_or_default(),
    };
    let config = dir.join("tokenizer_config.json");
    let name = match read_optional(&config, MAX_CONFIG_BYTES)? {
        Some(b) => eos_token_name(&b).with_context(|| format!("in {}", config.display()))?,
        None => None,
    };
    if let Some(name) = name {
        let path = dir.join("tokenizer.json");
        let id = match read_optional(&path, MAX_TOKENIZER_BYTES)? {
            Some(b) => token_id(&b, &name).with_context(|| format!("in {}", path.display()))?,
            None => None,
        };
        match id {
            Some(id) => ids.push(id),
            None => tracing::warn!(
                token = %name,
                folder = %dir.display(),
                "tokenizer_config.json's eos_token is not a token of tokenizer.json"
            ),
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(*id));
    Ok(ids)
}

/// A token id: a whole number from 0 to `u32::MAX`.
fn id_of(v: &Value) -> Result<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .with_context(|| format!("`eos_token_id`: {v} is not a token id"))
}

/// The `eos_token_id` of a `generation_config.json` or `config.json`: a
/// token id or a list of them; `None` when absent or null.
pub fn eos_token_ids(bytes: &[u8]) -> Result<Option<Vec<u32>>> {
    let v: Value = serde_json::from_slice(bytes).context("not JSON")?;
    let obj = v.as_object().context("not a JSON object")?;
    match obj.get("eos_token_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a.iter().map(id_of).collect::<Result<_>>().map(Some),
        Some(v) => Ok(Some(vec![id_of(v)?])),
    }
}

/// The `eos_token` of a `tokenizer_config.json`: a string, or an added
/// token's object with a string `content`; `None` when absent or null.
pub fn eos_token_name(bytes: &[u8]) -> Result<Option<String>> {
    let v: Value = serde_json::from_slice(bytes).context("not JSON")?;
    let obj = v.as_object().context("not a JSON object")?;
    match obj.get("eos_token") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => bail!("`eos_token` is an object without a string `content`"),
        },
        Some(v) => bail!("`eos_token` is {v}, not a token"),
    }
}

/// The id of token `content` in a `tokenizer.json`: among its
/// `added_tokens` (`{"id": N, "content": "..."}`), else in its model's
/// `vocab` when that is a map of token to id; `None` when neither has it.
pub fn token_id(tokenizer_json: &[u8], content: &str) -> Result<Option<u32>> {
    let v: Value = serde_json::from_slice(tokenizer_json).context("not JSON")?;
    let obj = v.as_object().context("not a JSON object")?;
    if let Some(added) = obj.get("added_tokens").filter(|a| !a.is_null()) {
        let added = added.as_array().context("`added_tokens` is not a list")?;
        for t in added {
            if t.get("content").and_then(Value::as_str) == Some(content) {
                let id = t.get("id").unwrap_or(&Value::Null);
                let id = id
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .with_context(|| {
                        format!("`added_tokens`: `{content}` has id {id}, not a token id")
                    })?;
                return Ok(Some(id));
            }
        }
    }
    let from_vocab = obj
        .get("model")
        .and_then(|m| m.get("vocab"))
        .and_then(Value::as_object)
        .and_then(|v| v.get(content))
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok());
    Ok(from_vocab)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_are_checked_as_huggingface_hub_checks_them() {
        let ok = |s: &str, repo: &str, rev: &str| {
            assert_eq!(
                HubName::parse(s).unwrap(),
                HubName {
                    repo: repo.into(),
                    revision: rev.into()
                },
                "{s}"
            );
        };
        ok(
            "HuggingFaceTB/SmolLM-135M",
            "HuggingFaceTB/SmolLM-135M",
            "main",
        );
        ok("org/name@v1.0", "org/name", "v1.0");
        ok("org/name@refs/pr/1", "org/name", "refs/pr/1");
        ok("a_b/c.d@0123abc", "a_b/c.d", "0123abc");
        for bad in [
            "gpt2",
            "runs/latest/x",
            "/abs/path",
            "./here",
            "../up/x",
            "org/",
            "/name",
            "org/na me",
            "org/-name",
            "org/name.",
            "org/na--me",
            "org/na..me",
            "org/name@",
            "org/name@../../x",
            "org/name@a b",
            "org/name@a@b",
            "C:\\models\\x",
            "~/models",
            "",
        ] {
            assert!(HubName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_path_that_does_not_exist_and_is_no_hub_name_is_refused_saying_so() {
        // A path, as the file system names it: said not to exist.
        for path in ["./no/such/folder", "/no/such/folder", "../no/such"] {
            let e = format!("{:#}", ModelSource::from(path).locate().unwrap_err());
            assert_eq!(e, format!("`{path}` does not exist"));
        }
        let e = ModelSource::from("no/such/folder").locate().unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("neither an existing folder nor a Hub model name")
                && e.contains("no/such/folder"),
            "{e}"
        );
        assert_eq!(
            ModelSource::from("org/name@dev").locate().unwrap(),
            Located::Hub(HubName {
                repo: "org/name".into(),
                revision: "dev".into()
            })
        );
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            ModelSource::from(dir.path()).locate().unwrap(),
            Located::Path(dir.path().to_path_buf())
        );
        // An existing folder that is none of the three.
        let e = format!(
            "{:#}",
            ModelSource::from(dir.path())
                .resolve(&HubConfig::new("http://127.0.0.1:9", dir.path()))
                .unwrap_err()
        );
        assert!(e.contains("neither a run folder"), "{e}");
    }

    #[test]
    fn an_old_path_string_reads_as_a_source_and_writes_back_the_same() {
        let s: ModelSource = serde_json::from_str(r#""/models/llama""#).unwrap();
        assert_eq!(s.as_str(), "/models/llama");
        assert_eq!(serde_json::to_string(&s).unwrap(), r#""/models/llama""#);
        let t: ModelSource = toml::from_str::<toml::Table>(r#"x = "org/name@v1""#).unwrap()["x"]
            .clone()
            .try_into()
            .unwrap();
        assert_eq!(t, ModelSource::from("org/name@v1"));
    }

    #[test]
    fn stop_tokens_come_from_the_generation_config_else_the_config_plus_the_tokenizer_s_eos() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let write = |name: &str, v: Value| std::fs::write(d.join(name), v.to_string()).unwrap();
        assert_eq!(stop_tokens(d).unwrap(), Vec::<u32>::new());
        write("config.json", serde_json::json!({"eos_token_id": 2}));
        assert_eq!(stop_tokens(d).unwrap(), [2]);
        write(
            "generation_config.json",
            serde_json::json!({"eos_token_id": [7, 9, 7]}),
        );
        assert_eq!(stop_tokens(d).unwrap(), [7, 9]);
        write(
            "generation_config.json",
            serde_json::json!({"eos_token_id": null}),
        );
        assert_eq!(stop_tokens(d).unwrap(), [2]);
        write(
            "tokenizer_config.json",
            serde_json::json!({"eos_token": {"content": "<|im_end|>", "special": true}}),
        );
        write(
            "tokenizer.json",
            serde_json::json!({
                "added_tokens": [{"id": 5, "content": "<|im_end|>"}, {"id": 6, "content": "<s>"}],
                "model": {"vocab": {"a": 0, "</s>": 11}}
            }),
        );
        assert_eq!(stop_tokens(d).unwrap(), [2, 5]);
        write(
            "tokenizer_config.json",
            serde_json::json!({"eos_token": "</s>"}),
        );
        assert_eq!(stop_tokens(d).unwrap(), [2, 11]);
        // Malformed files are errors naming the file.
        write(
            "generation_config.json",
            serde_json::json!({"eos_token_id": -1}),
        );
        let e = format!("{:#}", stop_tokens(d).unwrap_err());
        assert!(e.contains("generation_config.json"), "{e}");
        write("generation_config.json", serde_json::json!({}));
        std::fs::write(d.join("tokenizer_config.json"), "{").unwrap();
        let e = format!("{:#}", stop_tokens(d).unwrap_err());
        assert!(e.contains("tokenizer_config.json"), "{e}");
    }

    mod arbitrary_bytes {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn config_bytes_give_an_error_never_a_panic(
                bytes in proptest::collection::vec(any::<u8>(), 0..256),
            ) {
                let _ = eos_token_ids(&bytes);
                let _ = eos_token_name(&bytes);
                let _ = token_id(&bytes, "</s>");
            }

            #[test]
            fn eos_values_give_an_error_or_the_ids_they_hold(
                value in prop_oneof![
                    any::<i64>().prop_map(Value::from),
                    any::<f64>().prop_map(|f| serde_json::json!(f)),
                    any::<bool>().prop_map(Value::from),
                    ".*".prop_map(Value::from),
                    proptest::collection::vec(any::<i64>(), 0..4).prop_map(Value::from),
                    Just(Value::Null),
                ],
            ) {
                let bytes = serde_json::json!({"eos_token_id": value.clone()}).to_string();
                match eos_token_ids(bytes.as_bytes()) {
                    Ok(None) => prop_assert!(value.is_null()),
                    Ok(Some(ids)) => {
                        let want: Vec<Value> = match &value {
                            Value::Array(a) => a.clone(),
                            v => vec![v.clone()],
                        };
                        let got: Vec<Value> = ids.iter().map(|&i| Value::from(i)).collect();
                        prop_assert_eq!(got, want);
                    }
                    Err(_) => {}
                }
            }

            #[test]
            fn added_tokens_give_an_error_or_an_id_that_was_written(
                content in "[a-z<>|/]{0,6}",
                id in any::<i64>(),
                name in prop_oneof![Just("content"), Just("id"), Just("other")],
            ) {
                let mut token = serde_json::Map::new();
                token.insert("id".into(), id.into());
                token.insert("content".into(), "x".into());
                token.insert(name.into(), content.clone().into());
                let mut vocab = serde_json::Map::new();
                vocab.insert(content.clone(), id.into());
                let json = serde_json::json!({
                    "added_tokens": [token],
                    "model": {"vocab": vocab},
                })
                .to_string();
                if let Ok(Some(found)) = token_id(json.as_bytes(), &content) {
                    prop_assert_eq!(found as i64, id);
                }
                let tokens = serde_json::json!({"eos_token": {"content": content.clone()}}).to_string();
                prop_assert_eq!(eos_token_name(tokens.as_bytes()).unwrap(), Some(content));
            }
        }
    }
}
