//! A one-line progress indicator on stderr (`\r`-rewritten), only when stderr is a terminal.

use std::io::{IsTerminal, Write};

pub struct Progress {
    enabled: bool,
    total: usize,
    done: usize,
    shown: bool,
}

impl Progress {
    /// `total` steps; shown only if `wanted` and stderr is a terminal.
    pub fn new(total: usize, wanted: bool) -> Progress {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
            total: total.max(1),
            done: 0,
            shown: false,
        }
    }

    /// The text of the line for `done` of `total` steps.
    pub fn line(done: usize, total: usize, label: &str) -> String {
        let pct = done * 100 / total.max(1);
        let width = 30;
        let filled = (done * width / total.max(1)).min(width);
        format!(
            "[{}{}] {pct:3}% ({done}/{total}) {label}",
            "#".repeat(filled),
            " ".repeat(width - filled)
        )
    }

    /// Shows that `label` is being worked on.
    pub fn show(&mut self, label: &str) {
        if !self.enabled {
            return;
        }
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[K{}", Self::line(self.done, self.total, label));
        let _ = e.flush();
        self.shown = true;
    }

    /// One step done.
    pub fn step(&mut self) {
        self.done = (self.done + 1).min(self.total);
    }

    /// Erases the line (before printing to stdout, and at the end).
    pub fn clear(&mut self) {
        if self.enabled && self.shown {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_format() {
        let l = Progress::line(5, 10, "all_reduce f32 sum 1024 B");
        assert!(l.contains(" 50% (5/10) all_reduce"));
        assert_eq!(l.matches('#').count(), 15);
        assert!(Progress::line(10, 10, "").contains("100%"));
        assert!(Progress::line(0, 0, "").contains("  0%"));
    }
}
