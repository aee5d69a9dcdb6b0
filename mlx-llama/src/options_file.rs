//! `--config run.toml`: a command's options from a TOML file, overridden by
//! the flags given on the command line; and the resolved options written
//! back as TOML, so a run folder records exactly what ran.
//!
//! Keys are the options' long names, with `_` or `-` (`global_batch = 8` is
//! `--global-batch 8`); `true` turns a switch on. The file's options go
//! before the command line's, and the command must let a later value of an
//! option override an earlier one (clap's `args_override_self`).
//!
//! ```
//! use clap::{Arg, ArgAction, Command};
//! let cmd = Command::new("train").args_override_self(true)
//!     .arg(Arg::new("steps").long("steps").default_value("100"))
//!     .arg(Arg::new("config").long("config"));
//! let dir = tempfile::tempdir().unwrap();
//! let file = dir.path().join("run.toml");
//! std::fs::write(&file, "steps = 20\n").unwrap();
//! let argv = ["train", "--config", file.to_str().unwrap()];
//! let merged = mlx_llama::options_file::with_config_file(&cmd, argv.map(Into::into).to_vec(), "config").unwrap();
//! let m = cmd.clone().get_matches_from(merged);
//! assert_eq!(m.get_one::<String>("steps").unwrap(), "20");
//! ```

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::{ArgAction, ArgMatches, Command};

/// The option's value as command-line text, or `None` for a switch that is off.
fn value_text(key: &str, value: &toml::Value, switch: bool, file: &Path) -> Result<Option<String>> {
    Ok(match (value, switch) {
        (toml::Value::Boolean(on), true) => on.then(String::new),
        (_, true) => bail!(
            "{}: `{key}` is a switch: write `{key} = true` or `false`",
            file.display()
        ),
        (toml::Value::String(s), false) => Some(s.clone()),
        (toml::Value::Integer(i), false) => Some(i.to_string()),
        (toml::Value::Float(f), false) => Some(f.to_string()),
        (toml::Value::Boolean(b), false) => Some(b.to_string()),
        (other, false) => bail!(
            "{}: `{key}` must be a string, a number or a boolean, not {}",
            file.display(),
            other.type_str()
        ),
    })
}

/// The arguments `file` stands for, as `--long value` pairs, checked against
/// `cmd`'s options.
pub fn file_args(cmd: &Command, file: &Path) -> Result<Vec<OsString>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not valid TOML", file.display()))?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
            .with_context(|| {
                let known: Vec<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
                format!(
                    "{}: unknown option `{key}`; the options are: {}",
                    file.display(),
                    known.join(", ")
                )
            })?;
        let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        if let Some(v) = value_text(key, value, switch, file)? {
            out.push(OsString::from(format!("--{long}")));
            if !switch {
                out.push(v.into());
            }
        }
    }
    Ok(out)
}

/// `argv` (the subcommand's name first) with the options of the file named
/// by `--<config_long> FILE`, if any, put before the command line's own.
pub fn with_config_file(
    cmd: &Command,
    argv: Vec<OsString>,
    config_long: &str,
) -> Result<Vec<OsString>> {
    let flag = format!("--{config_long}");
    let prefix = format!("{flag}=");
    let mut file = None;
    for (i, a) in argv.iter().enumerate() {
        let s = a.to_string_lossy();
        if s == "--" {
            break;
        }
        if s == flag {
            file = argv.get(i + 1).cloned();
        } else if let Some(f) = s.strip_prefix(&prefix) {
            file = Some(f.into());
        }
    }
    let Some(file) = file else {
        return Ok(argv);
    };
    let mut merged = argv[..1].to_vec();
    merged.extend(file_args(cmd, Path::new(&file))?);
    merged.extend(argv[1..].iter().cloned());
    Ok(merged)
}

/// A value as TOML: an integer or a number where the text is one, else a string.
fn typed(text: &str) -> toml::Value {
    if let Ok(i) = text.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(f) = text.parse::<f64>()
        && f.is_finite()
    {
        toml::Value::Float(f)
    } else {
        toml::Value::String(text.to_string())
    }
}

/// Every option of `cmd` as `matches` resolved it (defaults included;
/// options without a value left out; `skip` ids never), as TOML that
/// [`file_args`] reads back to the same values.
pub fn resolved_toml(cmd: &Command, matches: &ArgMatches, skip: &[&str]) -> String {
    let mut table = toml::Table::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else {
            continue;
        };
        if skip.contains(&id) {
            continue;
        }
        // The key is the option's name, which may differ from its id
        // (`--lr` sets `learning_rate`).
        let key = long.replace('-', "_");
        match arg.get_action() {
            // `true`: the switch was given (a SetFalse switch reads false then).
            ArgAction::SetTrue => {
                table.insert(key, toml::Value::Boolean(matches.get_flag(id)));
            }
            ArgAction::SetFalse => {
                table.insert(key, toml::Value::Boolean(!matches.get_flag(id)));
            }
            ArgAction::Set => {
                if let Some(mut raw) = matches.get_raw(id)
                    && let Some(v) = raw.next()
                {
                    table.insert(key, typed(&v.to_string_lossy()));
                }
            }
            _ => {}
        }
    }
    toml::to_string(&table).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Arg;

    fn cmd() -> Command {
        Command::new("train")
            .args_override_self(true)
            .arg(Arg::new("steps").long("steps").default_value("100"))
            .arg(
                Arg::new("global_batch")
                    .long("global-batch")
                    .default_value("4"),
            )
            .arg(Arg::new("lr").long("lr").default_value("0.0003"))
            .arg(Arg::new("data").long("data").default_value("auto"))
            .arg(Arg::new("summary").long("summary"))
            .arg(Arg::new("resume").long("resume").action(ArgAction::SetTrue))
            .arg(Arg::new("config").long("config"))
    }

    fn file(text: &str) -> (tempfile::TempDir, String) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("run.toml");
        std::fs::write(&p, text).unwrap();
        (d, p.display().to_string())
    }

    fn parse(argv: &[&str]) -> Result<ArgMatches> {
        let argv = argv.iter().map(OsString::from).collect();
        Ok(cmd().try_get_matches_from(with_config_file(&cmd(), argv, "config")?)?)
    }

    fn get(m: &ArgMatches, id: &str) -> String {
        m.get_one::<String>(id).cloned().unwrap_or_default()
    }

    #[test]
    fn the_file_sets_options_and_the_command_line_overrides_it() {
        let (_d, p) =
            file("steps = 20\nglobal-batch = 8\nlr = 1e-3\ndata = \"offline\"\nresume = true\n");
        let m = parse(&["train", "--config", &p, "--steps", "7"]).unwrap();
        assert_eq!(get(&m, "steps"), "7");
        assert_eq!(get(&m, "global_batch"), "8");
        assert_eq!(get(&m, "lr"), "0.001");
        assert_eq!(get(&m, "data"), "offline");
        assert!(m.get_flag("resume"));
        let m = parse(&["train", &format!("--config={p}")]).unwrap();
        assert_eq!(get(&m, "steps"), "20");
    }

    #[test]
    fn without_a_file_nothing_changes() {
        let m = parse(&["train", "--steps", "3"]).unwrap();
        assert_eq!(get(&m, "steps"), "3");
        assert_eq!(get(&m, "global_batch"), "4");
        assert!(!m.get_flag("resume"));
    }

    #[test]
    fn bad_files_are_named_with_what_is_wrong() {
        let (_d, p) = file("stepz = 3\n");
        let e = format!("{:#}", parse(&["train", "--config", &p]).unwrap_err());
        assert!(
            e.contains("unknown option `stepz`")
                && e.contains("the options are: steps, global-batch, lr"),
            "{e}"
        );
        let (_d, p) = file("steps = [1, 2]\n");
        let e = format!("{:#}", parse(&["train", "--config", &p]).unwrap_err());
        assert!(
            e.contains("`steps` must be a string, a number or a boolean, not array"),
            "{e}"
        );
        let (_d, p) = file("resume = \"yes\"\n");
        let e = format!("{:#}", parse(&["train", "--config", &p]).unwrap_err());
        assert!(e.contains("`resume` is a switch"), "{e}");
        let (_d, p) = file("steps = \n");
        let e = format!("{:#}", parse(&["train", "--config", &p]).unwrap_err());
        assert!(e.contains("is not valid TOML"), "{e}");
        let e = format!(
            "{:#}",
            parse(&["train", "--config", "/nonexistent/run.toml"]).unwrap_err()
        );
        assert!(e.contains("reading /nonexistent/run.toml"), "{e}");
    }

    #[test]
    fn the_resolved_options_read_back_to_the_same_values() {
        let m = parse(&["train", "--steps", "12", "--lr", "2e-4", "--resume"]).unwrap();
        let text = resolved_toml(&cmd(), &m, &["config"]);
        assert!(text.contains("steps = 12"), "{text}");
        assert!(text.contains("global_batch = 4"), "{text}");
        assert!(text.contains("data = \"auto\""), "{text}");
        assert!(!text.contains("config"), "{text}");
        assert!(
            !text.contains("summary"),
            "an unset option is left out: {text}"
        );
        let (_d, p) = file(&text);
        let again = parse(&["train", "--config", &p]).unwrap();
        for id in ["steps", "global_batch", "data"] {
            assert_eq!(get(&again, id), get(&m, id), "{id}");
        }
        assert_eq!(get(&again, "lr").parse::<f64>().unwrap(), 2e-4);
        assert!(again.get_flag("resume"));
    }
}
