//! What the library prints: NCCL's `NCCL_DEBUG` levels, or ringccl's `RINGCCL_DEBUG`.

use std::sync::OnceLock;

/// The level from `NCCL_DEBUG` (`VERSION`, `WARN`, `INFO`, `TRACE`) or `RINGCCL_DEBUG`
/// (`warn`, `info`, `trace`; ringccl itself reads it too): 0 nothing, 1 version banner,
/// 2 warnings, 3 info.
fn level() -> u8 {
    static LEVEL: OnceLock<u8> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let parse = |v: String| match v.to_ascii_lowercase().as_str() {
            "version" => 1,
            "warn" => 2,
            "info" | "trace" => 3,
            _ => 0,
        };
        let a = std::env::var("NCCL_DEBUG").map(parse).unwrap_or(0);
        let b = std::env::var("RINGCCL_DEBUG").map(parse).unwrap_or(0);
        a.max(b)
    })
}

/// Whether failures are printed on stderr.
pub(crate) fn warn_enabled() -> bool {
    level() >= 2
}

/// Prints the banner once per process (at the first communicator), if asked for.
pub(crate) fn banner() {
    static ONCE: OnceLock<()> = OnceLock::new();
    if level() >= 1 {
        ONCE.get_or_init(|| eprintln!("NCCL INFO {}", crate::VERSION_TEXT.to_string_lossy()));
    }
}

/// Prints an info line (built only then), if asked for.
pub(crate) fn info(text: impl FnOnce() -> String) {
    if level() >= 3 {
        eprintln!("NCCL INFO ringccl: {}", text());
    }
}
