//! A task whose progress is shown in this process's [`Mode`].

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};

use crate::event::{Event, Kind};
use crate::{Mode, Unit, format, mode, style};

/// The least time between two update events of one task (about 5 a second).
pub const EVENT_INTERVAL: Duration = Duration::from_millis(200);

/// Where plain lines and events go.
type Sink = Box<dyn Write + Send>;

/// The bars this process draws on stderr: its own tasks' (in [`Mode::Bar`])
/// and a [`crate::render::Renderer`]'s.
static MULTI: OnceLock<MultiProgress> = OnceLock::new();

/// This process's bars on stderr, set up on first use.
pub(crate) fn multi() -> &'static MultiProgress {
    MULTI.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// Prints `msg` as a line on stderr, above this process's bars when it draws any.
pub fn println(msg: impl AsRef<str>) {
    let msg = msg.as_ref();
    match MULTI.get() {
        Some(m) if !m.is_hidden() => {
            let _ = m.println(msg);
        }
        _ => {
            let _ = writeln!(std::io::stderr().lock(), "{msg}");
        }
    }
}

/// Runs `f` with this process's bars cleared from the terminal (for output
/// written some other way), then draws them again.
pub fn suspend<R>(f: impl FnOnce() -> R) -> R {
    match MULTI.get() {
        Some(m) => m.suspend(f),
        None => f(),
    }
}

/// A writer to stderr that keeps this process's bars intact: give
/// `mlx_progress::stderr` to `tracing_subscriber::fmt().with_writer(..)`.
#[derive(Debug, Default)]
pub struct Stderr;

/// A [`Stderr`] writer.
pub fn stderr() -> Stderr {
    Stderr
}

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        suspend(|| std::io::stderr().lock().write_all(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// How one task is shown.
enum Output {
    /// A bar in this process's [`multi`].
    Bar(ProgressBar),
    /// Plain lines or events, at most one update every `every`.
    Lines {
        mode: Mode,
        every: Duration,
        sink: Sink,
    },
    /// Not at all.
    Off(Sink),
}

/// What a task knows of itself.
pub(crate) struct State {
    pos: u64,
    total: Option<u64>,
    msg: String,
    started: Instant,
    start_pos: u64,
    last_line: Instant,
    ended: bool,
    out: Output,
}

struct Inner {
    id: u64,
    name: String,
    unit: Unit,
    state: Mutex<State>,
}

/// Something that takes a while: a download, a tokenization, a training
/// run. It shows its progress as the process's [`Mode`] says; clones share
/// one task. Dropping the last clone unfinished reports it stopped.
#[derive(Clone)]
pub struct Task {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("id", &self.inner.id)
            .field("name", &self.inner.name)
            .field("unit", &self.inner.unit)
            .finish()
    }
}

/// The settings of a task before it starts (see [`Task::builder`]).
pub struct TaskBuilder {
    name: String,
    unit: Unit,
    total: Option<u64>,
    position: u64,
    message: String,
    mode: Option<Mode>,
    every: Option<Duration>,
    sink: Option<Sink>,
}

impl std::fmt::Debug for TaskBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskBuilder")
            .field("name", &self.name)
            .field("unit", &self.unit)
            .field("total", &self.total)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl TaskBuilder {
    /// How much there is to do (`None`: unknown, shown as a spinner).
    pub fn total(mut self, total: Option<u64>) -> Self {
        self.total = total;
        self
    }

    /// Where the task starts (a resumed run); the rate counts from here.
    pub fn position(mut self, position: u64) -> Self {
        self.position = position;
        self
    }

    /// The first message.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    /// Shows this task in `mode` instead of the process's [`mode()`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// The least time between two updates in plain lines or events
    /// (defaults: `MLX_PROGRESS_INTERVAL` and [`EVENT_INTERVAL`]).
    pub fn interval(mut self, every: Duration) -> Self {
        self.every = Some(every);
        self
    }

    /// Writes plain lines and events to `w` instead of stderr (bars always
    /// draw on stderr).
    pub fn writer(mut self, w: impl Write + Send + 'static) -> Self {
        self.sink = Some(Box::new(w));
        self
    }

    /// Starts the task.
    pub fn start(self) -> Task {
        self.start_at(Instant::now())
    }

    pub(crate) fn start_at(self, now: Instant) -> Task {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let mode = self.mode.unwrap_or_else(mode);
        let sink = self
            .sink
            .unwrap_or_else(|| Box::new(std::io::stderr()) as Sink);
        let out = match mode {
            Mode::Bar => {
                // Styled before it joins the others, which draw it from then on.
                let bar = ProgressBar::hidden();
                bar.set_style(style::style(self.unit, self.total.is_some()));
                bar.set_prefix(self.name.clone());
                bar.set_message(self.message.clone());
                match self.total {
                    Some(t) => bar.set_length(t),
                    None => bar.unset_length(),
                }
                bar.set_position(self.position);
                bar.reset_eta();
                let bar = multi().add(bar);
                if self.total.is_none() {
                    bar.enable_steady_tick(style::SPIN_EVERY);
                }
                Output::Bar(bar)
            }
            Mode::Plain | Mode::Events => Output::Lines {
                mode,
                every: self.every.unwrap_or_else(|| match mode {
                    Mode::Plain => crate::plain_interval(),
                    _ => EVENT_INTERVAL,
                }),
                sink,
            },
            Mode::Off => Output::Off(sink),
        };
        let task = Task {
            inner: Arc::new(Inner {
                id: IDS.fetch_add(1, Ordering::Relaxed),
                name: self.name,
                unit: self.unit,
                state: Mutex::new(State {
                    pos: self.position,
                    total: self.total,
                    msg: self.message,
                    started: now,
                    start_pos: self.position,
                    last_line: now,
                    ended: false,
                    out,
                }),
            }),
        };
        task.inner.emit(&mut task.inner.lock(), Kind::Start, now);
        task
    }
}

impl Task {
    /// Starts a task named `name` counting `unit`, with `total` to do when
    /// known, shown in the process's [`mode()`].
    pub fn new(name: impl Into<String>, total: Option<u64>, unit: Unit) -> Task {
        Task::builder(name, unit).total(total).start()
    }

    /// Starts a task with no measure of its own (a wait): a spinner and its message.
    pub fn spinner(name: impl Into<String>) -> Task {
        Task::new(name, None, Unit::Items)
    }

    /// Settings for a task named `name` counting `unit`; [`TaskBuilder::start`] starts it.
    pub fn builder(name: impl Into<String>, unit: Unit) -> TaskBuilder {
        TaskBuilder {
            name: name.into(),
            unit,
            total: None,
            position: 0,
            message: String::new(),
            mode: None,
            every: None,
            sink: None,
        }
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// How much is done.
    pub fn position(&self) -> u64 {
        self.inner.lock().pos
    }

    /// Adds `n` to the position.
    pub fn inc(&self, n: u64) {
        self.update_at(Instant::now(), |s| s.pos = s.pos.saturating_add(n));
    }

    /// Sets the position.
    pub fn set_position(&self, n: u64) {
        self.update_at(Instant::now(), |s| s.pos = n);
    }

    /// Sets the total (`None`: unknown).
    pub fn set_total(&self, total: Option<u64>) {
        self.update_at(Instant::now(), |s| s.total = total);
    }

    /// Sets the message shown beside the progress (tokens produced, a loss).
    pub fn set_message(&self, msg: impl Into<String>) {
        let msg = msg.into();
        self.update_at(Instant::now(), |s| s.msg = msg);
    }

    /// Sets the position and the message as one change, so that no line,
    /// event or bar shows the new position beside the old message (a step
    /// count beside the previous step's loss): each setter alone shows its
    /// change when due, and the other's may then wait for the next one.
    pub fn set_position_and_message(&self, n: u64, msg: impl Into<String>) {
        self.set_position_and_message_at(Instant::now(), n, msg.into());
    }

    pub(crate) fn set_position_and_message_at(&self, now: Instant, n: u64, msg: String) {
        self.update_at(now, |s| {
            s.pos = n;
            s.msg = msg;
        });
    }

    /// Prints a line on stderr (above the bars when drawing them); a line,
    /// not progress, so it shows in every mode.
    pub fn println(&self, msg: impl AsRef<str>) {
        let mut s = self.inner.lock();
        match &mut s.out {
            Output::Bar(_) => {
                drop(s);
                println(msg);
            }
            Output::Lines { sink, .. } | Output::Off(sink) => {
                let _ = sink.write_all(format!("{}\n", msg.as_ref()).as_bytes());
                let _ = sink.flush();
            }
        }
    }

    /// Completes the task: a last line or event, and the bar becomes a line.
    pub fn finish(&self) {
        self.finish_at(Instant::now());
    }

    /// Applies `f` to the state at `now` and shows the change when due.
    pub(crate) fn update_at(&self, now: Instant, f: impl FnOnce(&mut State)) {
        let mut s = self.inner.lock();
        if s.ended {
            return;
        }
        f(&mut s);
        self.inner.emit(&mut s, Kind::Update, now);
    }

    pub(crate) fn finish_at(&self, now: Instant) {
        self.inner.end(Kind::Finish, now);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the task as `kind` (finished or abandoned), once.
    fn end(&self, kind: Kind, now: Instant) {
        let mut s = self.lock();
        if s.ended {
            return;
        }
        s.ended = true;
        self.emit(&mut s, kind, now);
    }

    /// Shows `kind` of the state `s` at `now`: always for a start or an
    /// end, for an update only when the interval has passed.
    fn emit(&self, s: &mut State, kind: Kind, now: Instant) {
        let line = match &s.out {
            Output::Off(_) => return,
            Output::Bar(bar) => {
                match kind {
                    Kind::Start => {}
                    Kind::Update => {
                        if bar.length() != s.total {
                            match s.total {
                                Some(t) => bar.set_length(t),
                                None => bar.unset_length(),
                            }
                        }
                        bar.set_position(s.pos);
                        bar.set_message(s.msg.clone());
                    }
                    Kind::Finish | Kind::Abandon => {
                        bar.finish_and_clear();
                        multi().remove(bar);
                        println(self.summary(s, now, kind));
                    }
                }
                return;
            }
            Output::Lines { mode, every, .. } => {
                if kind == Kind::Update && now.saturating_duration_since(s.last_line) < *every {
                    return;
                }
                match mode {
                    Mode::Events => self.event(s, kind).encode(),
                    _ => self.plain_line(s, kind, now),
                }
            }
        };
        s.last_line = now;
        if let Output::Lines { sink, .. } = &mut s.out {
            // One write per line, so that lines of other threads do not cut it.
            let _ = sink.write_all(format!("{line}\n").as_bytes());
            let _ = sink.flush();
        }
    }

    fn event(&self, s: &State, kind: Kind) -> Event {
        Event {
            pid: std::process::id(),
            id: self.id,
            kind,
            name: self.name.clone(),
            unit: self.unit,
            pos: s.pos,
            total: s.total,
            msg: s.msg.clone(),
        }
    }

    /// Units per second since the start, when any time has passed.
    fn rate(&self, s: &State, now: Instant) -> Option<f64> {
        let secs = now.saturating_duration_since(s.started).as_secs_f64();
        (secs > 1e-3).then(|| s.pos.saturating_sub(s.start_pos) as f64 / secs)
    }

    /// The logfmt line of `kind` (see the crate documentation).
    fn plain_line(&self, s: &State, kind: Kind, now: Instant) -> String {
        let u = self.unit;
        let mut l = format!(
            "progress task={} unit={}",
            format::quote(&self.name),
            u.name()
        );
        let state = match kind {
            Kind::Start => Some("started"),
            Kind::Update => None,
            Kind::Finish => Some("finished"),
            Kind::Abandon => Some("stopped"),
        };
        if let Some(st) = state {
            l += &format!(" state={st}");
        }
        // A wait (no total, nothing counted) has only its state and time.
        let counts = s.total.is_some() || s.pos > 0;
        if kind != Kind::Start && counts {
            l += &format!(" done={}", format::amount(u, s.pos));
        }
        if let Some(t) = s.total {
            l += &format!(" total={}", format::amount(u, t));
            if kind != Kind::Start && t > 0 {
                l += &format!(" pct={}", (s.pos.min(t) * 100) / t);
            }
        }
        if kind != Kind::Start
            && counts
            && let Some(r) = self.rate(s, now)
        {
            l += &format!(" rate={}", format::rate(u, r));
            if kind == Kind::Update
                && let Some(t) = s.total
                && r > 0.0
            {
                let left = t.saturating_sub(s.pos) as f64 / r;
                l += &format!(" eta={}", format::duration(Duration::from_secs_f64(left)));
            }
        }
        if kind != Kind::Start && kind != Kind::Update {
            let took = now.saturating_duration_since(s.started);
            l += &format!(" elapsed={}", format::duration(took));
        }
        if !s.msg.is_empty() {
            l += &format!(" msg={}", format::quote(&s.msg));
        }
        l
    }

    /// The line a finished bar leaves behind.
    fn summary(&self, s: &State, now: Instant, kind: Kind) -> String {
        summary(
            &self.name,
            self.unit,
            s.pos,
            s.total,
            now.saturating_duration_since(s.started),
            self.rate(s, now),
            &s.msg,
            kind == Kind::Finish,
        )
    }
}

/// The line that replaces a finished (or stopped) bar:
/// `name: 45.6MiB in 12s (3.8MiB/s) message`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn summary(
    name: &str,
    unit: Unit,
    pos: u64,
    total: Option<u64>,
    took: Duration,
    rate: Option<f64>,
    msg: &str,
    finished: bool,
) -> String {
    let mut l = format!("{name}: ");
    if total.is_none() && pos == 0 {
        // A wait: nothing counted, only how long it took.
        l += if finished { "done" } else { "stopped" };
        l += &format!(" after {}", format::duration(took));
        if !msg.is_empty() {
            l += &format!(", {msg}");
        }
        return l;
    }
    if !finished {
        l += "stopped at ";
    }
    match total {
        Some(t) if !finished || t != pos => {
            l += &format!("{}/{}", format::amount(unit, pos), format::amount(unit, t))
        }
        _ => l += &format::amount(unit, pos),
    }
    if unit != Unit::Bytes {
        l += &format!(" {}", unit.name());
    }
    l += &format!(" in {}", format::duration(took));
    if let Some(r) = rate.filter(|_| pos > 0) {
        l += &format!(" ({})", format::rate(unit, r));
    }
    if !msg.is_empty() {
        l += &format!(", {msg}");
    }
    l
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.end(Kind::Abandon, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose lines the test reads back.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn take(&self) -> Vec<String> {
            let bytes = std::mem::take(&mut *self.0.lock().unwrap());
            String::from_utf8(bytes)
                .unwrap()
                .lines()
                .map(String::from)
                .collect()
        }
    }

    fn task(mode: Mode, unit: Unit, total: Option<u64>, t0: Instant) -> (Task, Lines) {
        let out = Lines::default();
        let t = Task::builder("tokenizing train", unit)
            .total(total)
            .mode(mode)
            .interval(Duration::from_secs(5))
            .writer(out.clone())
            .start_at(t0);
        (t, out)
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn plain_lines_are_logfmt_without_escape_bytes_and_say_rate_and_eta() {
        let t0 = Instant::now();
        let (t, out) = task(Mode::Plain, Unit::Bytes, Some(40 * MIB), t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        t.update_at(at(5), |s| {
            s.pos = 10 * MIB;
            s.msg = "1.2M \x1b[31mtokens".into();
        });
        t.finish_at(at(20));
        let lines = out.take();
        assert_eq!(
            lines,
            [
                "progress task=\"tokenizing train\" unit=bytes state=started total=40.0MiB",
                // 10 MiB in 5 s: 2 MiB/s, and 30 MiB left take 15 s.
                "progress task=\"tokenizing train\" unit=bytes done=10.0MiB total=40.0MiB pct=25 rate=2.0MiB/s eta=15s msg=\"1.2M \\u{1b}[31mtokens\"",
                "progress task=\"tokenizing train\" unit=bytes state=finished done=10.0MiB total=40.0MiB pct=25 rate=512.0KiB/s elapsed=20s msg=\"1.2M \\u{1b}[31mtokens\"",
            ]
        );
        assert!(lines.iter().all(|l| !l.contains('\x1b')));
    }

    #[test]
    fn plain_lines_come_at_most_once_an_interval_plus_the_end() {
        let t0 = Instant::now();
        let (t, out) = task(Mode::Plain, Unit::Tokens, None, t0);
        // 100 updates over 12 s: lines at 5 s and 10 s only.
        for i in 1..=100u64 {
            t.update_at(t0 + Duration::from_millis(120 * i), |s| s.pos += 1000);
        }
        drop(t);
        let lines = out.take();
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(
            lines[1].contains(" done=42.0k ") || lines[1].contains(" done=41.0k "),
            "{}",
            lines[1]
        );
        assert!(
            lines[3].contains("state=stopped done=100.0k"),
            "{}",
            lines[3]
        );
    }

    #[test]
    fn events_are_throttled_to_about_five_a_second_with_start_and_finish() {
        let t0 = Instant::now();
        let out = Lines::default();
        let t = Task::builder("training", Unit::Steps)
            .total(Some(1000))
            .position(10)
            .mode(Mode::Events)
            .writer(out.clone())
            .start_at(t0);
        // 1000 updates over 2 s.
        for i in 1..=1000u64 {
            t.update_at(t0 + Duration::from_millis(2 * i), |s| s.pos = 10 + i / 2);
        }
        t.finish_at(t0 + Duration::from_millis(2001));
        let events: Vec<Event> = out
            .take()
            .iter()
            .map(|l| Event::decode(l).expect("only event lines").unwrap())
            .collect();
        let kinds: Vec<Kind> = events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds.first(), Some(&Kind::Start));
        assert_eq!(kinds.last(), Some(&Kind::Finish));
        let updates = kinds.iter().filter(|k| **k == Kind::Update).count();
        assert_eq!(updates, 10, "2 s at one update per 200 ms: {kinds:?}");
        assert_eq!(events[0].pos, 10);
        assert_eq!(events.last().unwrap().pos, 510);
        assert!(
            events
                .iter()
                .all(|e| e.name == "training" && e.total == Some(1000))
        );
    }

    #[test]
    fn a_position_set_with_its_message_is_never_shown_beside_another_message() {
        let t0 = Instant::now();
        let out = Lines::default();
        let t = Task::builder("training", Unit::Steps)
            .total(Some(1000))
            .mode(Mode::Events)
            .writer(out.clone())
            .start_at(t0);
        // A step every 110 ms; events come at most every 200 ms.
        for i in 1..=40u64 {
            t.set_position_and_message_at(
                t0 + Duration::from_millis(110 * i),
                i,
                format!("loss of step {i}"),
            );
        }
        let events: Vec<Event> = out
            .take()
            .iter()
            .map(|l| Event::decode(l).expect("only event lines").unwrap())
            .collect();
        let updates: Vec<&Event> = events.iter().filter(|e| e.kind == Kind::Update).collect();
        assert!(updates.len() >= 15, "{events:?}");
        for e in updates {
            assert_eq!(e.msg, format!("loss of step {}", e.pos), "{e:?}");
        }
    }

    #[test]
    fn println_prints_in_every_mode_and_off_shows_no_progress() {
        let (t, out) = task(Mode::Off, Unit::Items, Some(3), Instant::now());
        t.inc(3);
        t.println("a note");
        t.finish();
        assert_eq!(out.take(), ["a note"]);
    }

    #[test]
    fn summaries_read_as_sentences() {
        let s = summary(
            "downloading train.parquet",
            Unit::Bytes,
            3 * MIB,
            Some(3 * MIB),
            Duration::from_secs(2),
            Some(1.5 * MIB as f64),
            "",
            true,
        );
        assert_eq!(s, "downloading train.parquet: 3.0MiB in 2s (1.5MiB/s)");
        let s = summary(
            "training",
            Unit::Steps,
            3,
            Some(5),
            Duration::from_secs(9),
            Some(1.0 / 3.0),
            "loss 3.2",
            false,
        );
        assert_eq!(s, "training: stopped at 3/5 steps in 9s (0.33/s), loss 3.2");
        let s = summary(
            "waiting",
            Unit::Items,
            0,
            None,
            Duration::from_secs(3),
            Some(0.0),
            "a.lock",
            true,
        );
        assert_eq!(s, "waiting: done after 3s, a.lock");
    }
}
