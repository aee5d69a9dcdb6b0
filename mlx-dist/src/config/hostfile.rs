//! The host list: MLX's JSON host file, and a rank's several addresses
//! (`addr|addr`).

/// Parses an MLX-style host file: a JSON list with, per rank, either a list of
/// `"ip:port"` strings (one per network interface) or one such string. Each
/// rank's entry is returned as its addresses joined by `|`, the form
/// `MLX_DIST_HOSTS` takes.
pub fn parse_hostfile(text: &str) -> std::result::Result<Vec<String>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let arr = v
        .as_array()
        .ok_or("expected a JSON list with one entry per rank")?;
    arr.iter()
        .enumerate()
        .map(|(i, e)| match e {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Array(a) => {
                let all: Option<Vec<&str>> = a.iter().map(|s| s.as_str()).collect();
                match all {
                    Some(all) if !all.is_empty() => Ok(all.join("|")),
                    _ => Err(format!("entry {i} is not a list of \"ip:port\" strings")),
                }
            }
            _ => Err(format!(
                "entry {i} is neither a string nor a list of strings"
            )),
        })
        .collect()
}

/// Splits each rank's entry (`ip:port`, or several joined by `|`) into its
/// first address and the others.
pub(super) fn split_addresses(entries: Vec<String>) -> (Vec<String>, Vec<Vec<String>>) {
    entries
        .iter()
        .map(|e| {
            let mut all = e.split('|').map(|a| a.trim().to_string());
            let first = all.next().unwrap_or_default();
            (first, all.filter(|a| !a.is_empty()).collect())
        })
        .unzip()
}
