//! Drawing other processes' progress: a launcher feeds the lines of each
//! rank's stderr to a [`Renderer`], which turns event lines (see
//! [`crate::Event`]) into bars, one per rank and task, and hands back the
//! other lines for the launcher to print with [`Renderer::println`], so
//! that text and bars do not garble each other.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};

use crate::event::{Event, Kind};
use crate::{Unit, style, task};

/// A task of a rank: (rank, process, task id).
type Key = (usize, u32, u64);

/// The most bars a [`Renderer`] keeps at once.
pub const MAX_BARS: usize = 256;

/// A bar the renderer draws.
struct Shown {
    bar: ProgressBar,
    name: String,
    unit: Unit,
    has_total: bool,
    first_seen: Instant,
    first_pos: u64,
}

/// What one of the renderer's bars shows (for tests and tools).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BarView {
    /// The rank whose task it is.
    pub rank: usize,
    /// The task's name.
    pub name: String,
    /// How much is done.
    pub pos: u64,
    /// How much there is, when known.
    pub total: Option<u64>,
    /// The task's message.
    pub msg: String,
}

/// Bars for the progress events of many ranks, drawn together.
pub struct Renderer {
    multi: MultiProgress,
    bars: Mutex<HashMap<Key, Shown>>,
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer")
            .field("bars", &self.bars().len())
            .finish()
    }
}

impl Default for Renderer {
    fn default() -> Self {
        Renderer::new()
    }
}

impl Renderer {
    /// A renderer drawing on this process's stderr (nothing is drawn when
    /// stderr is not a terminal), among this process's own bars: lines
    /// printed with [`crate::println`] or written through [`crate::stderr`]
    /// (the launcher's log) go above them too.
    pub fn new() -> Renderer {
        Renderer::with(task::multi().clone())
    }

    /// A renderer that keeps track of the bars without drawing them.
    pub fn hidden() -> Renderer {
        Renderer::with(MultiProgress::with_draw_target(ProgressDrawTarget::hidden()))
    }

    fn with(multi: MultiProgress) -> Renderer {
        Renderer {
            multi,
            bars: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Shown>> {
        self.bars.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one line of `rank`'s stderr: an event line updates that
    /// rank's bars and gives `None`; any other line (a broken event line
    /// included) comes back, for the caller to print with [`Renderer::println`].
    ///
    /// At most [`MAX_BARS`] bars are kept: an event that would start one
    /// more comes back as a line too (the lines come from other processes,
    /// which may print anything).
    pub fn feed<'a>(&self, rank: usize, line: &'a str) -> Option<&'a str> {
        match Event::decode(line) {
            Some(Ok(e)) => (!self.apply(rank, e)).then_some(line),
            _ => Some(line),
        }
    }

    /// Moves the event's bar; false when it would be a bar past [`MAX_BARS`].
    fn apply(&self, rank: usize, e: Event) -> bool {
        let key = (rank, e.pid, e.id);
        let mut bars = self.lock();
        if bars.len() >= MAX_BARS && !bars.contains_key(&key) {
            return false;
        }
        let shown = bars.entry(key).or_insert_with(|| {
            // Styled before it joins the others, which draw it from then on.
            let shown = Shown {
                bar: ProgressBar::hidden(),
                name: e.name.clone(),
                unit: e.unit,
                has_total: e.total.is_some(),
                first_seen: Instant::now(),
                first_pos: e.pos,
            };
            shown.bar.set_prefix(format!("[{rank}] {}", e.name));
            restyle(&shown);
            self.multi.add(shown.bar.clone());
            shown
        });
        if shown.has_total != e.total.is_some() {
            shown.has_total = e.total.is_some();
            restyle(shown);
        }
        match e.total {
            Some(t) => shown.bar.set_length(t),
            None => shown.bar.unset_length(),
        }
        shown.bar.set_position(e.pos);
        shown.bar.set_message(e.msg.clone());
        if matches!(e.kind, Kind::Finish | Kind::Abandon) {
            let shown = bars.remove(&key).expect("inserted above");
            drop(bars);
            self.close(rank, shown, e.kind == Kind::Finish, &e.msg);
        }
        true
    }

    /// Replaces a bar by the line that sums it up.
    fn close(&self, rank: usize, s: Shown, finished: bool, msg: &str) {
        s.bar.finish_and_clear();
        self.multi.remove(&s.bar);
        let took = s.first_seen.elapsed();
        let pos = s.bar.position();
        let secs = took.as_secs_f64();
        let rate = (secs > 1e-3).then(|| pos.saturating_sub(s.first_pos) as f64 / secs);
        let line = task::summary(
            &s.name,
            s.unit,
            pos,
            s.bar.length(),
            took,
            rate,
            msg,
            finished,
        );
        self.println(format!("[{rank}] {line}"));
    }

    /// Ends the bars of `rank` (its stream ended): each becomes a line
    /// saying where it stopped.
    pub fn end_rank(&self, rank: usize) {
        let mut bars = self.lock();
        let keys: Vec<Key> = bars.keys().filter(|k| k.0 == rank).copied().collect();
        let ended: Vec<Shown> = keys.iter().filter_map(|k| bars.remove(k)).collect();
        drop(bars);
        for s in ended {
            let msg = s.bar.message();
            self.close(rank, s, false, &msg);
        }
    }

    /// Prints `text` as a line above the bars (on stderr directly when
    /// nothing is drawn).
    pub fn println(&self, text: impl AsRef<str>) {
        if self.multi.is_hidden() {
            eprintln!("{}", text.as_ref());
        } else {
            let _ = self.multi.println(text);
        }
    }

    /// Runs `f` with the bars cleared (for writing to stdout, say), then
    /// draws them again.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.multi.suspend(f)
    }

    /// The bars drawn now, by rank and then in order of appearance.
    pub fn bars(&self) -> Vec<BarView> {
        let bars = self.lock();
        let mut v: Vec<(&Key, &Shown)> = bars.iter().collect();
        v.sort_by_key(|(k, _)| **k);
        v.into_iter()
            .map(|(k, s)| BarView {
                rank: k.0,
                name: s.name.clone(),
                pos: s.bar.position(),
                total: s.bar.length(),
                msg: s.bar.message(),
            })
            .collect()
    }
}

fn restyle(s: &Shown) {
    s.bar.set_style(style::style(s.unit, s.has_total));
    if s.has_total {
        s.bar.disable_steady_tick();
    } else {
        s.bar.enable_steady_tick(style::SPIN_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: u64, kind: Kind, pos: u64, total: Option<u64>, msg: &str) -> String {
        Event {
            pid: 9,
            id,
            kind,
            name: format!("task {id}"),
            unit: Unit::Tokens,
            pos,
            total,
            msg: msg.into(),
        }
        .encode()
    }

    #[test]
    fn bars_past_the_limit_come_back_as_lines() {
        let r = Renderer::hidden();
        for id in 0..MAX_BARS as u64 {
            assert_eq!(r.feed(0, &ev(id, Kind::Start, 0, None, "")), None);
        }
        let one_more = ev(MAX_BARS as u64, Kind::Start, 0, None, "");
        assert_eq!(r.feed(0, &one_more), Some(one_more.as_str()));
        assert_eq!(r.bars().len(), MAX_BARS);
        // Bars already shown still move, and a finished one makes room.
        assert_eq!(r.feed(0, &ev(3, Kind::Update, 7, None, "")), None);
        assert_eq!(r.feed(0, &ev(3, Kind::Finish, 9, None, "")), None);
        assert_eq!(r.feed(0, &one_more), None);
        assert_eq!(r.bars().len(), MAX_BARS);
    }

    #[test]
    fn event_lines_become_bars_and_other_lines_come_back() {
        let r = Renderer::hidden();
        assert_eq!(
            r.feed(0, "loading the tokenizer"),
            Some("loading the tokenizer")
        );
        assert_eq!(r.feed(1, &ev(1, Kind::Start, 0, Some(100), "")), None);
        assert_eq!(r.feed(0, &ev(1, Kind::Start, 5, None, "")), None);
        assert_eq!(
            r.feed(1, &ev(1, Kind::Update, 40, Some(100), "3k tokens")),
            None
        );
        let broken = format!("{}{{not json", crate::MARKER);
        assert_eq!(r.feed(1, &broken), Some(broken.as_str()));
        assert_eq!(
            r.bars(),
            [
                BarView {
                    rank: 0,
                    name: "task 1".into(),
                    pos: 5,
                    total: None,
                    msg: String::new()
                },
                BarView {
                    rank: 1,
                    name: "task 1".into(),
                    pos: 40,
                    total: Some(100),
                    msg: "3k tokens".into()
                },
            ]
        );
        // A finished task's bar goes; a rank whose stream ended loses its bars.
        assert_eq!(r.feed(1, &ev(1, Kind::Finish, 100, Some(100), "")), None);
        assert_eq!(r.bars().len(), 1);
        r.end_rank(0);
        assert!(r.bars().is_empty());
    }

    #[test]
    fn a_bar_that_learns_its_total_keeps_its_place() {
        let r = Renderer::hidden();
        r.feed(2, &ev(4, Kind::Update, 10, None, ""));
        r.feed(2, &ev(4, Kind::Update, 20, Some(50), ""));
        assert_eq!(r.bars()[0].total, Some(50));
        assert_eq!(r.bars()[0].pos, 20);
    }
}
