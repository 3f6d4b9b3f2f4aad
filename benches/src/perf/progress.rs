//! The progress bar (indicatif) on stderr, drawn only when stderr is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar's layout: `[###############               ]  50% (5/10) all_reduce f32 sum 1024 B`.
const TEMPLATE: &str = "[{bar:30}] {percent:>3}% ({pos}/{len}) {msg}";

/// Progress over the measurements of a run.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// `total` steps; drawn only if `wanted` and stderr is a terminal.
    pub fn new(total: usize, wanted: bool) -> Progress {
        let target = if wanted && std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let style = ProgressStyle::with_template(TEMPLATE)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("# ");
        Progress {
            bar: ProgressBar::with_draw_target(Some(total as u64), target).with_style(style),
        }
    }

    /// Shows that `label` is being worked on.
    pub fn show(&self, label: &str) {
        self.bar.set_message(label.to_string());
    }

    /// One step done.
    pub fn step(&self) {
        self.bar.inc(1);
    }

    /// Runs `f` (which prints to stdout) with the bar taken off the terminal meanwhile.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Removes the bar (at the end).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_steps_without_drawing() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
        // Not wanted: hidden, but still counting.
        let p = Progress::new(10, false);
        assert!(p.bar.is_hidden());
        p.show("all_reduce f32 sum 1024 B");
        p.step();
        p.step();
        assert_eq!(p.bar.position(), 2);
        assert_eq!(p.suspend(|| 7), 7);
        p.finish();
        // Under the test harness stderr is captured, not a terminal.
        if !std::io::stderr().is_terminal() {
            assert!(Progress::new(3, true).bar.is_hidden());
        }
    }
}
