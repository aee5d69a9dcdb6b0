//! Chat templates as transformers renders them: the Jinja template of a
//! tokenizer (`tokenizer_config.json`'s `chat_template`, or a
//! `chat_template.jinja` beside it) rendered with minijinja, given what
//! `apply_chat_template` gives (`messages`, `bos_token`, `eos_token`,
//! `add_generation_prompt`, `raise_exception`, `strftime_now`, `tools` =
//! none), with jinja2's `trim_blocks` and `lstrip_blocks` and Python's string
//! methods. [`ChatRenderer::assistant_spans`] finds the byte ranges of the
//! assistant turns by rendering prefixes of the conversation, for prompt
//! masking.

use crate::error::{DataError, IoContext, Result};
use serde_json::Value;
use std::ops::Range;
use std::path::Path;

/// A chat template and the special tokens it is rendered with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatTemplate {
    /// The Jinja source.
    pub source: String,
    /// `bos_token` as the template sees it.
    pub bos_token: String,
    /// `eos_token` as the template sees it.
    pub eos_token: String,
    /// Where it came from, for errors.
    pub origin: String,
}

/// `tokenizer_config.json` may give a token as a string or as an
/// `{"content": ...}` object (an `AddedToken`).
fn token_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

fn template_err(origin: &str, message: impl std::fmt::Display) -> DataError {
    DataError::Template {
        origin: origin.to_owned(),
        message: message.to_string(),
    }
}

impl ChatTemplate {
    /// The template of the tokenizer in `dir`: `chat_template.jinja` if
    /// present (transformers >= 4.43 saves it there), else
    /// `tokenizer_config.json`'s `chat_template` (a string, or a list of
    /// `{name, template}` of which `default` is taken). `None` when there is
    /// neither. The special tokens come from `tokenizer_config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = match std::fs::read(&config_path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| DataError::Source {
                path: config_path.clone(),
                offset: 0,
                message: format!("expected a JSON object: {e}"),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Value::Null,
            Err(e) => return Err(DataError::io(&config_path, e)),
        };
        let bos_token = token_string(config.get("bos_token"));
        let eos_token = token_string(config.get("eos_token"));
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).at(&jinja)?;
            return Ok(Some(ChatTemplate {
                source,
                bos_token,
                eos_token,
                origin: jinja.display().to_string(),
            }));
        }
        let origin = config_path.display().to_string();
        let source = match config.get("chat_template") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .ok_or_else(|| {
                    template_err(&origin, "a list of templates without one named `default`")
                })?
                .to_owned(),
            Some(other) => {
                return Err(template_err(
                    &origin,
                    format!("expected chat_template as a string or a list, found {other}"),
                ));
            }
        };
        Ok(Some(ChatTemplate {
            source,
            bos_token,
            eos_token,
            origin,
        }))
    }

    /// This template's tokens with the Jinja source of `path` (`--chat-template`).
    pub fn with_file(&self, path: &Path) -> Result<ChatTemplate> {
        Ok(ChatTemplate {
            source: std::fs::read_to_string(path).at(path)?,
            origin: path.display().to_string(),
            ..self.clone()
        })
    }

    /// A short hash of the source and tokens, for store keys.
    pub fn hash(&self) -> String {
        let all = format!("{}\0{}\0{}", self.source, self.bos_token, self.eos_token);
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(all.as_bytes()))
    }

    /// The compiled template.
    pub fn renderer(&self) -> Result<ChatRenderer> {
        let mut env = minijinja::Environment::new();
        // transformers' ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_err(&self.origin, e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned("chat", self.source.clone())
            .map_err(|e| template_err(&self.origin, e))?;
        Ok(ChatRenderer {
            env,
            template: self.clone(),
        })
    }
}

/// A compiled [`ChatTemplate`].
#[derive(Debug)]
pub struct ChatRenderer {
    env: minijinja::Environment<'static>,
    template: ChatTemplate,
}

impl ChatRenderer {
    /// The template rendered for `messages` (each an object with a `role`),
    /// as `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`.
    pub fn render(&self, messages: &[Value], add_generation_prompt: bool) -> Result<String> {
        let t = &self.template;
        use serde::Deserialize;
        let messages = minijinja::Value::deserialize(Value::Array(messages.to_vec()))
            .map_err(|e| template_err(&t.origin, e))?;
        let ctx = minijinja::context! {
            messages => messages,
            bos_token => &t.bos_token,
            eos_token => &t.eos_token,
            add_generation_prompt => add_generation_prompt,
            tools => minijinja::Value::from(()),
        };
        self.env
            .get_template("chat")
            .and_then(|tpl| tpl.render(ctx))
            .map_err(|e| {
                let mut message = e.to_string();
                if let Some(d) = e.detail() {
                    message = format!("{message} ({d})");
                }
                template_err(&t.origin, message)
            })
    }

    /// The whole conversation rendered, and the byte ranges of its assistant
    /// turns: turn `i` starts where `messages[..i]` with the generation
    /// prompt ends and ends where `messages[..=i]` ends. Each prefix must be
    /// a prefix of the whole rendering, else the turns cannot be told apart
    /// (an error saying which turn).
    pub fn assistant_spans(&self, messages: &[Value]) -> Result<(String, Vec<Range<usize>>)> {
        let full = self.render(messages, false)?;
        let mut spans = vec![];
        for (i, m) in messages.iter().enumerate() {
            if m.get("role").and_then(Value::as_str) != Some("assistant") {
                continue;
            }
            let before = self.render(&messages[..i], true)?;
            let upto = self.render(&messages[..=i], false)?;
            for (what, prefix) in [("with the generation prompt", &before), ("", &upto)] {
                if !full.starts_with(prefix.as_str()) {
                    return Err(template_err(
                        &self.template.origin,
                        format!(
                            "the rendering of messages before assistant message {i} {what} is not a prefix of the whole conversation's, so its tokens cannot be found"
                        ),
                    ));
                }
            }
            if upto.len() > before.len() {
                spans.push(before.len()..upto.len());
            }
        }
        Ok((full, spans))
    }
}

/// The local time now formatted as Python's `strftime` does for the common
/// fields (`%d %b %B %m %y %Y %H %M %S %j %a %A %%`), in UTC.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(fmt, secs)
}

/// `fmt` for the UTC time `secs` after the Unix epoch.
pub fn strftime(fmt: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let before: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let month = MONTHS[(m - 1) as usize];
    let day = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out += &format!("{d:02}"),
            Some('b') => out += &month[..3],
            Some('B') => out += month,
            Some('m') => out += &format!("{m:02}"),
            Some('y') => out += &format!("{:02}", y % 100),
            Some('Y') => out += &y.to_string(),
            Some('H') => out += &format!("{:02}", rem / 3600),
            Some('M') => out += &format!("{:02}", rem / 60 % 60),
            Some('S') => out += &format!("{:02}", rem % 60),
            Some('j') => out += &format!("{yday:03}"),
            Some('a') => out += &day[..3],
            Some('A') => out += day,
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 13:05:09 UTC was a Friday, day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %j %H:%M:%S %y %%", t),
            "Friday July 208 13:05:09 24 %"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
    }
}
