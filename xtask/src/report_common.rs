//! What the benchmarks' reports share: the table of an issue's goals and the
//! font their charts are drawn with.

use std::fmt::Write as _;

/// An issue's goal as a report states it: the goal in words, and what was
/// measured with whether it meets the goal (`None`: not measured).
pub(crate) type Goal = (String, Option<(String, bool)>);

/// Writes `goals` as a markdown table (goal, measured, met) and a blank
/// line; `no` is what the table says of a goal not met.
pub(crate) fn goals_table(s: &mut String, goals: Vec<Goal>, no: &str) {
    let _ = writeln!(s, "| goal | measured | met |");
    let _ = writeln!(s, "|---|---|---|");
    for (goal, got) in goals {
        match got {
            Some((v, ok)) => {
                let _ = writeln!(s, "| {goal} | {v} | {} |", if ok { "yes" } else { no });
            }
            None => {
                let _ = writeln!(s, "| {goal} | not measured | - |");
            }
        }
    }
    let _ = writeln!(s);
}

/// Registers the embedded font (Hack) as "sans-serif", the family the
/// charts draw their text with: ab_glyph finds no system fonts.
pub(crate) fn register_chart_font() {
    use plotters::style::{FontStyle, register_font};
    let _ = register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_table_says_met_missed_and_unmeasured() {
        let mut s = String::new();
        let goals = vec![
            ("a".to_string(), Some(("1".to_string(), true))),
            ("b".to_string(), Some(("2".to_string(), false))),
            ("c".to_string(), None),
        ];
        goals_table(&mut s, goals, "**no**");
        assert_eq!(
            s,
            "| goal | measured | met |\n|---|---|---|\n| a | 1 | yes |\n| b | 2 | **no** |\n\
             | c | not measured | - |\n\n"
        );
    }
}
