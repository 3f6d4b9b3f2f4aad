//! ringccl's reports, like `NCCL_DEBUG`: on stderr when [`Config::debug`](crate::Config::debug)
//! (`RINGCCL_DEBUG`) asks for them, and always through the [`log`] facade (target `ringccl`), so
//! a program with a logger sees them there too. Messages are formatted only when someone
//! listens.

use std::fmt;

use crate::config::DebugLevel;

/// Reports `args` at `level` when the communicator's `configured` level or the `log` facade
/// wants it.
pub(crate) fn emit(configured: DebugLevel, level: DebugLevel, args: fmt::Arguments<'_>) {
    let log_level = match level {
        DebugLevel::Off => return,
        DebugLevel::Warn => log::Level::Warn,
        DebugLevel::Info => log::Level::Info,
        DebugLevel::Trace => log::Level::Trace,
    };
    if configured >= level {
        let tag = match level {
            DebugLevel::Warn => "WARN",
            DebugLevel::Info => "INFO",
            _ => "TRACE",
        };
        eprintln!("ringccl {tag} {args}");
    }
    log::log!(target: "ringccl", log_level, "{args}");
}

/// Reports a warning that no communicator's configuration governs (how the kernels were
/// loaded): on stderr whatever `RINGCCL_DEBUG` says, and through the `log` facade.
pub(crate) fn warn(args: fmt::Arguments<'_>) {
    emit(DebugLevel::Warn, DebugLevel::Warn, args);
}

/// `report!(config_level, Info, "format", args…)`.
macro_rules! report {
    ($configured:expr, $level:ident, $($arg:tt)*) => {
        $crate::debug::emit($configured, $crate::config::DebugLevel::$level, format_args!($($arg)*))
    };
}
pub(crate) use report;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reporting_at_any_level_does_not_panic() {
        for configured in [DebugLevel::Off, DebugLevel::Warn, DebugLevel::Trace] {
            for level in [
                DebugLevel::Off,
                DebugLevel::Warn,
                DebugLevel::Info,
                DebugLevel::Trace,
            ] {
                emit(configured, level, format_args!("test message {}", 1));
            }
        }
        report!(DebugLevel::Off, Info, "macro form {}", 2);
        warn(format_args!("unconditional warning {}", 3));
    }
}
