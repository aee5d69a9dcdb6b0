//! The tokenizer files Hugging Face's `AutoTokenizer.from_pretrained(dir)` and
//! mlx-lm read beside exported weights.

use super::{TextTokenizer, tok_err};
use crate::error::{IoContext, Result};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use tokenizers::Model;
use tokenizers::models::ModelWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;

/// GPT-2's context length, Hugging Face's `model_max_length` for `gpt2`.
const GPT2_MODEL_MAX_LENGTH: usize = 1024;

impl TextTokenizer {
    /// Whether this is a byte-level BPE (a BPE model behind a byte-level
    /// pre-tokenizer), the layout of GPT-2's `vocab.json` + `merges.txt`.
    pub fn is_byte_level_bpe(&self) -> bool {
        matches!(self.inner.get_model(), ModelWrapper::BPE(_))
            && matches!(
                self.inner.get_pre_tokenizer(),
                Some(PreTokenizerWrapper::ByteLevel(_))
            )
    }

    /// Whether this is GPT-2's tokenizer: a byte-level BPE with exactly GPT-2's
    /// vocabulary and merges (compared with [`TextTokenizer::gpt2`]).
    pub fn is_gpt2(&self) -> Result<bool> {
        if !self.is_byte_level_bpe() || self.vocab_size != super::gpt2::VOCAB_SIZE {
            return Ok(false);
        }
        let model_json = |t: &TextTokenizer| {
            serde_json::to_string(t.inner.get_model()).map_err(|e| tok_err(&t.description, e))
        };
        Ok(model_json(self)? == model_json(&TextTokenizer::gpt2()?)?)
    }

    /// Writes what `AutoTokenizer.from_pretrained(dir)` and mlx-lm need beside
    /// exported weights, creating `dir`, and returns the paths written.
    ///
    /// Always `tokenizer.json`, `tokenizer_config.json` and
    /// `special_tokens_map.json`, with bos, eos and unk all the EOS token and no
    /// BOS or EOS added, so Hugging Face's ids are ours. A byte-level BPE is a
    /// `GPT2Tokenizer` and also gets `vocab.json` and `merges.txt` (and
    /// `model_max_length` 1024 when it is GPT-2 itself); any other tokenizer is a
    /// `PreTrainedTokenizerFast` over `tokenizer.json`.
    pub fn write_hf_files(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).at(dir)?;
        let tokenizer_json = dir.join("tokenizer.json");
        self.save(&tokenizer_json)?;
        let mut written = vec![tokenizer_json];
        let eos = self.inner.id_to_token(self.eos).ok_or_else(|| {
            tok_err(
                &self.description,
                format!("no token for EOS id {}", self.eos),
            )
        })?;
        let mut config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": eos,
            "eos_token": eos,
            "unk_token": eos,
            "add_bos_token": false,
            "add_eos_token": false,
            "add_prefix_space": false,
            // Decoding gives back the text exactly, spaces before punctuation included.
            "clean_up_tokenization_spaces": false,
        });
        if self.is_byte_level_bpe() {
            written.extend(
                self.inner
                    .get_model()
                    .save(dir, None)
                    .map_err(|e| tok_err(dir.display(), e))?,
            );
            config["tokenizer_class"] = json!("GPT2Tokenizer");
            config["errors"] = json!("replace");
            if self.is_gpt2()? {
                config["model_max_length"] = json!(GPT2_MODEL_MAX_LENGTH);
            }
        }
        let special = json!({ "bos_token": eos, "eos_token": eos, "unk_token": eos });
        written.push(write_json(&dir.join("tokenizer_config.json"), &config)?);
        written.push(write_json(&dir.join("special_tokens_map.json"), &special)?);
        Ok(written)
    }
}

fn write_json(path: &Path, value: &Value) -> Result<PathBuf> {
    let text = serde_json::to_string_pretty(value).map_err(|e| tok_err(path.display(), e))?;
    std::fs::write(path, text + "\n").at(path)?;
    Ok(path.to_owned())
}
