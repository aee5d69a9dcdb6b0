//! Shows the three kinds of task a data pipeline and a trainer report: a
//! download (bytes with a total), a tokenization (bytes, tokens in the
//! message) and a wait (a spinner), then a few training steps.
//!
//! Try it on a terminal, into a file, and as a launcher's rank would:
//!
//! ```text
//! cargo run -p mlx-progress --example progress
//! cargo run -p mlx-progress --example progress 2>progress.log
//! MLX_PROGRESS=events cargo run -p mlx-progress --example progress
//! ```
//!
//! `--fast` runs it in a fraction of a second (for tests).

use std::thread::sleep;
use std::time::Duration;

use mlx_progress::{Task, Unit};

fn main() {
    let fast = std::env::args().any(|a| a == "--fast");
    let tick = Duration::from_millis(if fast { 1 } else { 40 });

    let size: u64 = 48 << 20;
    let download = Task::new("downloading train.parquet", Some(size), Unit::Bytes);
    for _ in 0..96 {
        sleep(tick);
        download.inc(size / 96);
    }
    download.finish();

    let wait = Task::spinner("waiting for another process building the store");
    wait.set_message("store.lock");
    sleep(tick * 25);
    wait.finish();

    let text: u64 = 30 << 20;
    let tokenize = Task::new("tokenizing train", Some(text), Unit::Bytes);
    let mut tokens = 0u64;
    for _ in 0..60 {
        sleep(tick);
        tokenize.inc(text / 60);
        tokens += text / 60 / 4;
        tokenize.set_message(format!(
            "{} tokens",
            mlx_progress::format::amount(Unit::Tokens, tokens)
        ));
    }
    tokenize.finish();

    let steps = 20;
    let train = Task::new("training", Some(steps), Unit::Steps);
    for step in 1..=steps {
        sleep(tick * 3);
        train.set_position(step);
        train.set_message(format!("loss {:.3}", 10.0 / (step as f64 + 1.0)));
    }
    train.println("eval_loss 0.5000");
    train.finish();
}
