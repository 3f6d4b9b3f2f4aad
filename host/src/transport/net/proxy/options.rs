//! A proxy's settings ([`NetOptions`]) and the UCX settings ringccl applies unless the
//! environment sets them.

use std::time::Duration;

/// Default of [`NetOptions::lanes`].
pub const DEFAULT_LANES: usize = crate::config::DEFAULT_NET_LANES;
/// Most lanes a proxy may have.
pub const MAX_LANES: usize = crate::config::MAX_NET_LANES;

/// Settings of a proxy.
#[derive(Clone, Debug)]
pub struct NetOptions {
    /// Longest a send may stay in flight, and longest the closing handshake may take.
    pub timeout: Duration,
    /// UCX settings applied over the environment (names without `UCX_`), e.g. `TLS=tcp`.
    pub ucx: Vec<(String, String)>,
    /// Lanes: threads, each with its own UCP worker and endpoints, that carry a pair's signals
    /// in turn (1 to [`MAX_LANES`]; every rank must use the same number).
    pub lanes: usize,
    /// Print a line on stderr for each signal the proxy posts, sends, receives and publishes,
    /// with the microseconds since the proxy started (`RINGCCL_DEBUG=trace`).
    pub trace: bool,
}

/// UCX settings ringccl applies unless the environment sets them: TCP segments of 256 KiB
/// instead of UCX's 8 KiB (send) and 64 KiB (receive). Each entry is the environment variable
/// that takes precedence, then the name given to `ucp_config_modify` and the value. The names
/// have no `TCP_` prefix: `ucp_config_modify` hands names it does not know to every transport's
/// own table, where the TCP transport's fields are `TX_SEG_SIZE` and `RX_SEG_SIZE` (no other
/// transport of UCX has fields of these names); with the prefix they are silently ignored
/// (checked with UCX 1.13's debug log: its TCP buffers grow to 256 KiB either way, through the
/// variables or through these names). Measured on one machine over loopback TCP with 2 MiB
/// chunks (`docs/NETWORK.md`): `send_recv` from 1 MiB at 0.73–0.96 GB/s with UCX's defaults,
/// 2.3–3.1 GB/s with these segments.
pub const UCX_DEFAULTS: &[(&str, &str, &str)] = &[
    ("UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "256k"),
    ("UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "256k"),
];

/// [`UCX_DEFAULTS`] whose environment variable is not set, as `(name, value)` for
/// [`NetOptions::ucx`].
///
/// ```
/// use ringccl::internals::transport::net::proxy::{ucx_defaults, UCX_DEFAULTS};
/// let d = ucx_defaults();
/// for (var, name, value) in UCX_DEFAULTS {
///     let applied = d.iter().any(|(n, v)| n == name && v == value);
///     assert_eq!(applied, std::env::var_os(var).is_none());
/// }
/// ```
pub fn ucx_defaults() -> Vec<(String, String)> {
    UCX_DEFAULTS
        .iter()
        .filter(|(var, _, _)| std::env::var_os(var).is_none())
        .map(|&(_, name, value)| (name.to_string(), value.to_string()))
        .collect()
}

impl Default for NetOptions {
    /// A 60 s timeout, [`ucx_defaults`] and [`DEFAULT_LANES`] lanes.
    fn default() -> Self {
        NetOptions {
            timeout: Duration::from_secs(60),
            ucx: ucx_defaults(),
            lanes: DEFAULT_LANES,
            trace: false,
        }
    }
}
