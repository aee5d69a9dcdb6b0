//! How a setting holds its value (set in code, else read from the
//! environment once) and how a tuning variable's `key=value` list is read
//! and written.

use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// A setting: the value set in code, else its variable's, read from the
/// environment and parsed once. An unreadable variable is an error naming
/// it, returned by [`Setting::checked`] every time it is asked.
pub(super) struct Setting<T: 'static> {
    name: &'static str,
    parse: fn(Option<&str>) -> std::result::Result<T, String>,
    set: Mutex<Option<T>>,
    env: OnceLock<std::result::Result<T, String>>,
}

impl<T: Clone> Setting<T> {
    /// The setting of variable `name`, whose text (`None` when unset)
    /// `parse` reads.
    pub(super) const fn new(
        name: &'static str,
        parse: fn(Option<&str>) -> std::result::Result<T, String>,
    ) -> Setting<T> {
        Setting {
            name,
            parse,
            set: Mutex::new(None),
            env: OnceLock::new(),
        }
    }

    /// The value set in code, else the environment's.
    pub(super) fn checked(&self) -> Result<T> {
        if let Some(v) = self.set.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(v);
        }
        self.env
            .get_or_init(|| (self.parse)(std::env::var(self.name).ok().as_deref()))
            .clone()
            .map_err(|message| Error::invalid(self.name, message))
    }

    /// Sets the value (wins over the environment); `None`: back to the
    /// environment's.
    pub(super) fn set(&self, value: Option<T>) {
        *self.set.lock().unwrap_or_else(|p| p.into_inner()) = value;
    }
}

/// A switch's text: `1`/`on`/`true`/`yes` or `0`/`off`/`false`/`no`.
pub(super) fn on_off(text: &str) -> std::result::Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        v => Err(format!("`{v}` is not understood: use on or off (1 or 0)")),
    }
}

/// The parser of a switch whose default is `default`: unset or empty is
/// the default.
pub(super) fn switch(value: Option<&str>, default: bool) -> std::result::Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(default),
        Some(v) => on_off(v),
    }
}

/// How a switch is written in a tuning list.
pub(super) fn show_switch(on: bool) -> String {
    if on { "on" } else { "off" }.to_string()
}

/// One key of a tuning variable's comma-separated `key=value` list: its
/// name, the values it takes, what it changes, and how it reads and
/// writes its field of `T`. A key's default is `T::default()`'s field.
pub struct Key<T> {
    /// The key, as the list spells it.
    pub name: &'static str,
    /// The values it takes, as the documentation lists them.
    pub values: &'static str,
    /// What it changes.
    pub doc: &'static str,
    /// Reads a value into its field (an error says what was wrong).
    pub(super) read: fn(&mut T, &str) -> std::result::Result<(), String>,
    /// Writes its field as the list spells it.
    pub(super) show: fn(&T) -> String,
}

impl<T> Key<T> {
    /// The key's value in `tuning`, as the list spells it.
    pub fn show(&self, tuning: &T) -> String {
        (self.show)(tuning)
    }
}

/// Reads a `key=value,key=value` list (`None` or empty: every key at its
/// default); a key may appear once.
pub(super) fn read_list<T: Default>(
    keys: &[Key<T>],
    text: Option<&str>,
) -> std::result::Result<T, String> {
    let mut tuning = T::default();
    let mut seen: Vec<&str> = Vec::new();
    let names = || keys.iter().map(|k| k.name).collect::<Vec<_>>().join(", ");
    for item in text.unwrap_or("").split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        let Some((name, value)) = item.split_once('=') else {
            return Err(format!("`{item}` is not key=value (the keys: {})", names()));
        };
        let name = name.trim();
        let Some(key) = keys.iter().find(|k| k.name == name) else {
            return Err(format!("`{name}` is not a key (the keys: {})", names()));
        };
        if seen.contains(&key.name) {
            return Err(format!("`{name}` is given twice"));
        }
        seen.push(key.name);
        (key.read)(&mut tuning, value.trim())
            .map_err(|e| format!("{name}: {e} ({})", key.values))?;
    }
    Ok(tuning)
}

/// Writes every key of `tuning` as a `key=value,...` list that
/// [`read_list`] reads back.
pub(super) fn show_list<T>(keys: &[Key<T>], tuning: &T) -> String {
    keys.iter()
        .map(|k| format!("{}={}", k.name, k.show(tuning)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A value of `choices` named `text`.
pub(super) fn one_of<V: Copy>(
    choices: &[(V, &'static str)],
    text: &str,
) -> std::result::Result<V, String> {
    let text = text.trim().to_ascii_lowercase();
    choices
        .iter()
        .find(|(_, name)| *name == text)
        .map(|(v, _)| *v)
        .ok_or_else(|| format!("`{text}` is not understood"))
}

/// The name `choices` gives `value`.
pub(super) fn name_of<V: PartialEq>(choices: &[(V, &'static str)], value: &V) -> String {
    choices
        .iter()
        .find(|(v, _)| v == value)
        .map(|(_, name)| name.to_string())
        .unwrap_or_else(|| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default, Debug, PartialEq)]
    struct Two {
        a: bool,
        n: usize,
    }

    const KEYS: [Key<Two>; 2] = [
        Key {
            name: "a",
            values: "`on`, `off`",
            doc: "",
            read: |t, v| on_off(v).map(|x| t.a = x),
            show: |t| show_switch(t.a),
        },
        Key {
            name: "n",
            values: "a count",
            doc: "",
            read: |t, v| {
                v.parse()
                    .map(|n| t.n = n)
                    .map_err(|_| format!("`{v}` is not a count"))
            },
            show: |t| t.n.to_string(),
        },
    ];

    #[test]
    fn switches_take_the_usual_spellings_and_refuse_the_rest() {
        for (v, want) in [
            ("1", true),
            ("on", true),
            ("TRUE", true),
            ("0", false),
            ("off", false),
        ] {
            assert_eq!(on_off(v).unwrap(), want, "{v}");
        }
        assert!(switch(None, true).unwrap());
        assert!(!switch(Some(" "), false).unwrap());
        assert!(on_off("maybe").unwrap_err().contains("maybe"));
    }

    #[test]
    fn a_list_reads_its_keys_and_writes_them_back() {
        assert_eq!(read_list(&KEYS, None).unwrap(), Two::default());
        let t = read_list(&KEYS, Some(" n = 7 , a=on,")).unwrap();
        assert_eq!(t, Two { a: true, n: 7 });
        assert_eq!(show_list(&KEYS, &t), "a=on,n=7");
        assert_eq!(read_list(&KEYS, Some(&show_list(&KEYS, &t))).unwrap(), t);
    }

    #[test]
    fn a_list_names_what_it_did_not_understand() {
        for (text, says) in [
            ("b=1", "`b` is not a key (the keys: a, n)"),
            ("a", "`a` is not key=value"),
            ("a=1,a=0", "`a` is given twice"),
            ("n=many", "n: `many` is not a count (a count)"),
            ("a=maybe", "a: `maybe` is not understood"),
        ] {
            let e = read_list(&KEYS, Some(text)).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn a_value_set_in_code_wins_until_unset() {
        let s: Setting<bool> = Setting::new("MLX_TEST_SETTINGS_FLAG_UNSET", |v| switch(v, true));
        assert!(s.checked().unwrap());
        s.set(Some(false));
        assert!(!s.checked().unwrap());
        s.set(None);
        assert!(s.checked().unwrap());
    }
}
