//! Every knob of ringccl in one place: [`Config`], built by code or read from the environment
//! with one policy ([`Config::from_env`]: a variable that is set but not understood is an error
//! naming it; nothing is re-read later).
//!
//! | variable | field | default | meaning |
//! | --- | --- | --- | --- |
//! | `RINGCCL_P2P_DISABLE` | [`p2p_disable`](Config::p2p_disable) | `0` | `1`: no direct peer access; data between GPUs goes through staged copies (`cuMemcpyPeerAsync`); in a job of processes with `RINGCCL_NET=ucx`, no CUDA IPC either: every pair goes through the network transport, even on one machine (for testing it) |
//! | `RINGCCL_RING` | [`ring`](Config::ring) | chosen from the topology | the ring order, a comma-separated permutation of the ranks (`0,2,1,3`) |
//! | `RINGCCL_ALGO` | [`algorithm`](Config::algorithm) | chosen per call | `ring`, `oneshot`, `twoshot` or `ce` (copy engines): force the all-reduce algorithm where it can run (`oneshot` is the one-shot kernel: not the LL push kernel that otherwise takes the small all-reduces among processes); `twoshot` also runs reduce-scatters, all-gathers, all-to-alls, broadcasts and reduces on the two-shot kernel's barriers, any other value keeps them off it |
//! | `RINGCCL_CE_MIN_BYTES` | [`ce_min_bytes`](Config::ce_min_bytes) | 134217728 | smallest all-reduce (bytes per rank) that runs on the copy engines when nothing is forced (`0`: every size that is not one-shot) |
//! | `RINGCCL_CHECK_CALLS` | [`check_calls`](Config::check_calls) | `0` | `1`: in a job of processes, every call first checks (over TCP) that every rank makes the same call; a mismatch fails the call on every rank, naming the rank |
//! | `RINGCCL_CE_COPIES_MIN_BYTES` | [`ce_copies_min_bytes`](Config::ce_copies_min_bytes) | 16777216 | smallest all-gather or all-to-all (the larger buffer, bytes) that runs on the copy engines when nothing is forced |
//! | `RINGCCL_CE_BROADCAST_MIN_BYTES` | [`ce_broadcast_min_bytes`](Config::ce_broadcast_min_bytes) | 262144 | the same for a broadcast |
//! | `RINGCCL_ONESHOT_MAX_BYTES` | [`oneshot_max_bytes`](Config::oneshot_max_bytes) | 262144 | largest all-reduce (bytes per rank) that runs one-shot |
//! | `RINGCCL_TWOSHOT_MAX_BYTES` | [`twoshot_max_bytes`](Config::twoshot_max_bytes) | 8388608 | largest all-reduce (bytes per rank) above the one-shot limit that runs two-shot, and, in a job of processes, largest reduce-scatter, all-gather, all-to-all, broadcast or reduce (the larger buffer) that runs on its barriers (`0`: never unless forced) |
//! | `RINGCCL_ONESHOT_MAX_BYTES_GRAPH` | [`oneshot_max_bytes_graph`](Config::oneshot_max_bytes_graph) | 32768 | the same for a call captured into a CUDA graph (the smaller of the two applies) |
//! | `RINGCCL_LL_MAX_BYTES` | [`ll_max_bytes`](Config::ll_max_bytes) | 32768 | in a job of 2 to 8 processes, largest all-reduce, all-gather, reduce-scatter, broadcast and reduce (bytes per rank; the output's for reduce-scatter) that runs on the LL push kernels (one exchange per call) instead of one-shot or two-shot; at most 32768 (its receive area), `0`: never |
//! | `RINGCCL_P2P_KERNEL_MAX_BYTES` | [`p2p_kernel_max_bytes`](Config::p2p_kernel_max_bytes) | 1048576 | in a job of processes of one machine, largest transfer (the bytes of one peer and direction in a point-to-point group) that runs on the point-to-point kernel; larger ones go through the copy engines and the scratch, except under CUDA-graph capture (the same on every rank) |
//! | `RINGCCL_P2P_KERNEL_MAX_BYTES_REGISTERED` | [`p2p_kernel_max_bytes_registered`](Config::p2p_kernel_max_bytes_registered) | 2097152 | the same while the communicator has registered buffers (its transfers then posted: a receive into a registered buffer written by the sender directly) |
//! | `RINGCCL_LL_ALL_GATHER` | [`ll_all_gather`](Config::ll_all_gather) | `1` | in a job of 2 to 8 processes of one machine, all-gathers of at most `RINGCCL_LL_MAX_BYTES` per rank run on the LL all-gather kernel (one exchange per call); `0`: on the two-shot kernel's barriers instead |
//! | `RINGCCL_ZERO_COPY_READS` | [`zero_copy_reads`](Config::zero_copy_reads) | `0` | `1`: in a job of processes, a one-shot all-reduce whose input lies in a registered buffer lets the peers read it in place instead of staging it through the scratch (off by default: see the field) |
//! | `RINGCCL_CHUNK_BYTES` | [`chunk_bytes`](Config::chunk_bytes) | by size and ranks | most bytes one ring step moves |
//! | `RINGCCL_PEER_BLOCKS` | [`peer_blocks`](Config::peer_blocks) | 64 | most blocks of a step that reads or writes a peer's memory in one direction |
//! | `RINGCCL_PEER_DUPLEX_BLOCKS` | [`peer_duplex_blocks`](Config::peer_duplex_blocks) | one per SM | most blocks of a step that reads and writes a peer's memory |
//! | `RINGCCL_BOOTSTRAP_TIMEOUT` | [`bootstrap_timeout`](Config::bootstrap_timeout) | 120 | seconds the ranks of a job of processes wait for each other to join (and for a buffer exchange) |
//! | `RINGCCL_TIMEOUT` | [`timeout`](Config::timeout) | 600 | seconds a device-side wait for a peer (and a host wait: `synchronize`, drop) lasts before it gives up with `Error::Timeout`; `0`: no limit (an abort still ends it) |
//! | `RINGCCL_NET` | [`net`](Config::net) | `off` | `ucx`: in a job of processes, ranks on other machines are reached through the network transport (UCX, loaded at run time); ranks of one machine keep CUDA IPC, and all-reduce, all-gather and broadcast become hierarchical where every machine holds the same number of ranks (with `RINGCCL_P2P_DISABLE=1`, every pair goes through UCX) |
//! | `RINGCCL_HOST_ID` | [`host_id`](Config::host_id) | the machine's boot id | which machine this rank counts as on: ranks with the same id share CUDA IPC, others are reached over the network. Lets the ranks of one machine stand for several machines (testing the network and hierarchical paths), like `NCCL_HOSTID` |
//! | `RINGCCL_NET_LANES` | [`net_lanes`](Config::net_lanes) | 4 | lanes of the network proxy: threads, each with its own UCX worker and connections, that carry a pair's chunks in turn (1 to 16; the same on every rank) |
//! | `RINGCCL_RANK_THREADS` | [`rank_threads`](Config::rank_threads) | `0` | `1`: a communicator of several GPUs in one process keeps a host thread per GPU that issues its rank's part of a small eager all-reduce while the caller's thread issues rank 0's (slower than one thread on 2 × H200: off by default, `docs/PERFORMANCE.md`) |
//! | `RINGCCL_DEBUG` | [`debug`](Config::debug) | `off` | `warn`, `info` or `trace`: what ringccl reports on stderr (see [`DebugLevel`]) |
//!
//! Numbers accept an optional `K`, `M` or `G` suffix (powers of 1024) where they are bytes. The
//! defaults and how they were measured are in `docs/perf/`.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// Default of [`Config::oneshot_max_bytes`].
pub const DEFAULT_ONESHOT_MAX_BYTES: usize = 256 * 1024;
/// Default of [`Config::oneshot_max_bytes_graph`]: on 2 × H200, replays of a captured ring
/// all-reduce beat the one-shot kernel from 64 KiB (f32, out of place / in place: 6.9 / 7.0 µs
/// against 7.7 / 9.3 at 64 KiB, 6.4 / 9.0 against 10.2 / 13.1 at 128 KiB; `docs/PERFORMANCE.md`),
/// while eager calls, where the ring's extra launches cost host time, keep one-shot to 256 KiB.
pub const DEFAULT_ONESHOT_MAX_BYTES_GRAPH: usize = 32 * 1024;
/// Default of [`Config::ll_max_bytes`]: the whole LL receive area
/// (`gpu_kernels::ll::LL_MAX_BYTES`, 32 KiB per rank and call), the range of the small-call
/// target. A packet carries 8 bytes of payload in 16, so LL moves twice the bytes of the
/// one-shot kernel; where that stops paying for its one exchange fewer is not yet measured
/// (`docs/PERFORMANCE.md`).
pub const DEFAULT_LL_MAX_BYTES: usize = gpu_kernels::ll::LL_MAX_BYTES;
/// Default of [`Config::p2p_kernel_max_bytes`]: on one H200 with two processes under MPS,
/// `ringccl-perf --procs 2 -t send_recv` took 16.9 µs at 256 KiB on the point-to-point kernel
/// against 31.3 µs through the copy engines, and 37.1 µs at 2 MiB against 30.4 (16 MiB: 225
/// against 63.5): the copy engines from above 1 MiB (`docs/PERFORMANCE.md`).
pub const DEFAULT_P2P_KERNEL_MAX_BYTES: usize = 1 << 20;
/// Default of [`Config::p2p_kernel_max_bytes_registered`]: on one H200 with two processes under
/// MPS, eager `ringccl-perf --procs 2 -t send_recv --register` into registered receive buffers
/// took 16.3 µs at 2 MiB on the kernel (zero-copy) against 26.4 through the copy engines, and
/// 32.7 against 34.4 at 8 MiB; but a receive into an unregistered buffer on the kernel (through
/// its slots) took 36.0 µs at 2 MiB and 109.0 at 8 MiB, against 26–30 and 34 on the copy
/// engines (`docs/PERFORMANCE.md`): 2 MiB bounds what an unregistered receive loses.
pub const DEFAULT_P2P_KERNEL_MAX_BYTES_REGISTERED: usize = 2 << 20;
/// Default of [`Config::twoshot_max_bytes`].
pub const DEFAULT_TWOSHOT_MAX_BYTES: usize = 8 << 20;
/// Default of [`Config::peer_blocks`]: NVLink peer reads peaked at 64 blocks of 512 threads on
/// an H200 and fell with more (`docs/perf/ceilings.md`).
pub const DEFAULT_PEER_BLOCKS: u32 = 64;

/// How an all-reduce runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The ring schedule: one kernel per step, ordered by events between the ranks' streams.
    Ring,
    /// One kernel per rank that reads every rank's input directly, ordered by a device-side
    /// barrier (small messages: no events, one launch per rank; 2 to 8 ranks with peer access
    /// between every pair).
    OneShot,
    /// One kernel per rank of many blocks: each rank folds its shard of every rank's input and
    /// writes it into every rank's output, with a device-side barrier per block (mid sizes; one
    /// process, 2 to 8 ranks with peer access between every pair).
    TwoShot,
    /// A ring whose peer traffic goes through the copy engines (`cuMemcpyAsync` on a second
    /// stream per rank) while the SMs reduce, chunk by chunk (large messages; one process,
    /// peer access between every pair, not under CUDA-graph capture).
    CopyEngine,
}

impl Algorithm {
    /// The name used by `RINGCCL_ALGO` and in logs.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::OneShot => "oneshot",
            Algorithm::TwoShot => "twoshot",
            Algorithm::CopyEngine => "ce",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = String;

    /// `ring`, `oneshot` (also `one-shot`, `one_shot`), `twoshot` (also `two-shot`,
    /// `two_shot`) or `ce` (also `copy-engine`, `copy_engine`), any case, blanks around ignored.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ring" => Ok(Algorithm::Ring),
            "oneshot" | "one-shot" | "one_shot" => Ok(Algorithm::OneShot),
            "twoshot" | "two-shot" | "two_shot" => Ok(Algorithm::TwoShot),
            "ce" | "copy-engine" | "copy_engine" | "copyengine" => Ok(Algorithm::CopyEngine),
            _ => Err("expected `ring`, `oneshot`, `twoshot` or `ce`".into()),
        }
    }
}

/// Whether ranks in other processes are reached over the network ([`Config::net`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Network {
    /// Never: peers are reached with CUDA IPC (processes of one machine).
    #[default]
    Off,
    /// UCX carries the traffic between ranks on different machines ([`Config::host_id`]);
    /// ranks of one machine keep CUDA IPC unless [`Config::p2p_disable`] (then every pair goes
    /// through UCX). UCX's own variables, e.g. `UCX_TLS`, `UCX_NET_DEVICES`, pick the wire.
    Ucx,
}

impl FromStr for Network {
    type Err = String;

    /// `off` (or `0`, `none`) or `ucx`; any case.
    ///
    /// ```
    /// use ringccl::Network;
    /// assert_eq!("UCX".parse::<Network>(), Ok(Network::Ucx));
    /// assert!("ib".parse::<Network>().is_err());
    /// ```
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "off" | "0" | "none" => Ok(Network::Off),
            "ucx" => Ok(Network::Ucx),
            _ => Err("expected `off` or `ucx`".into()),
        }
    }
}

/// What ringccl reports on stderr (each line starts with `ringccl`), like `NCCL_DEBUG`. Every
/// message also goes to the [`log`] facade (target `ringccl`), whatever this level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DebugLevel {
    /// Nothing.
    #[default]
    Off,
    /// Problems ringccl works around (a peer pair that refuses peer access, an algorithm forced
    /// where it cannot run).
    Warn,
    /// Also the communicator's setup (devices, peer access, ring order) and, for each new call
    /// shape, the algorithm, chunk and step count chosen.
    Info,
    /// Also every call.
    Trace,
}

impl FromStr for DebugLevel {
    type Err = String;

    /// `off` (or `0`, `none`), `warn`, `info` (or `1`), `trace`; any case.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "off" | "0" | "none" => Ok(DebugLevel::Off),
            "warn" | "warning" => Ok(DebugLevel::Warn),
            "info" | "1" => Ok(DebugLevel::Info),
            "trace" => Ok(DebugLevel::Trace),
            _ => Err("expected `off`, `warn`, `info` or `trace`".into()),
        }
    }
}

/// The settings of a communicator. `Config::default()` is what a user gets without any
/// environment variable; [`Config::from_env`] applies the `RINGCCL_*` variables (module docs).
///
/// ```
/// use ringccl::{Algorithm, Config};
/// let mut config = Config::default();
/// config.algorithm = Some(Algorithm::Ring);
/// config.peer_blocks = 32;
/// assert_eq!(config.oneshot_max_bytes, 256 * 1024);
/// // Communicator::with_config(&[0, 1], config) would use it.
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// No direct peer access between GPUs: every cross-GPU transfer is a staged copy. In a job
    /// of processes with [`Network::Ucx`], no CUDA IPC either: every pair goes through the
    /// network transport, even between processes of one machine.
    pub p2p_disable: bool,
    /// Which machine this rank counts as on, or `None` for the machine's own boot id. Ranks
    /// with the same id reach each other with CUDA IPC; ranks with different ids only over the
    /// network ([`Network::Ucx`]). Set it to make the processes of one machine stand for
    /// several machines (like `NCCL_HOSTID`).
    pub host_id: Option<String>,
    /// The ring order (a permutation of the ranks), or `None` to choose it from the topology.
    pub ring: Option<Vec<usize>>,
    /// Force the all-reduce algorithm where it can run, or `None` to choose per call.
    /// [`Algorithm::TwoShot`] also puts reduce-scatters, all-gathers, all-to-alls, broadcasts
    /// and reduces on the two-shot kernel's barriers where it can run, and any other forced
    /// algorithm keeps them off it (`plan::tuning::twoshot_algorithm`).
    pub algorithm: Option<Algorithm>,
    /// All-reduces of at most this many bytes per rank run one-shot (when they can).
    pub oneshot_max_bytes: usize,
    /// The same limit for calls captured into a CUDA graph; the smaller of the two applies.
    pub oneshot_max_bytes_graph: usize,
    /// In a job of 2 to 8 processes, all-reduces that would run one-shot and have at most this
    /// many bytes per rank run on the LL push kernel instead (`gpu_kernels::ll`: one exchange
    /// per call, no staging copy), and so do all-gathers ([`Config::ll_all_gather`]),
    /// reduce-scatters (bytes of the output), broadcasts and reduces (these two on the
    /// all-reduce's kernel) that would run two-shot; above
    /// `gpu_kernels::ll::LL_MAX_BYTES` it is that; 0: never.
    pub ll_max_bytes: usize,
    /// In a job of processes, whether a one-shot all-reduce whose input lies in a buffer
    /// registered with the communicator (`Communicator::register`, `ncclCommRegister`) lets
    /// the peers read it in place (zero-copy) instead of staging it through the scratch.
    /// Registrations map the allocation into every peer either way. Off by default: on one
    /// H200 shared by 2 processes under MPS the reads in place made an out-of-place one-shot
    /// all-reduce of 64–256 KiB 2.3–3.0 µs faster but an in-place one of 256 KiB 3.6–3.9 µs
    /// slower (`docs/PERFORMANCE.md`; the registered-buffer test, `tests/tests/registered.rs`,
    /// passes both ways with 2 and 4 processes); between two GPUs they are not measured yet.
    /// Every rank may choose differently: each publishes where its own input is.
    pub zero_copy_reads: bool,
    /// In a job of 2 to 8 processes of one machine, whether all-gathers of at most
    /// [`Config::ll_max_bytes`] per rank (and the LL area's 32 KiB) run on the LL all-gather
    /// kernel (`gpu_kernels::ll::LL_GATHER_ENTRY`: one exchange per call, no staging copy)
    /// instead of the two-shot kernel's barriers. On by default: on one H200 shared by 2 and
    /// 4 processes under MPS the LL all-gather test passed, and a small all-gather took
    /// 8.7–10.0 µs against 12.1–15.4 on the two-shot kernel (2 processes) and 19.2–22.0
    /// against 32.7–35.3 (4 processes), `docs/PERFORMANCE.md`. The same on every rank.
    pub ll_all_gather: bool,
    /// In a job of processes of one machine (2 to 8 ranks over CUDA IPC), the most bytes one
    /// peer and direction of a point-to-point group may add up to and still run on the
    /// point-to-point kernel (`gpu_kernels::p2p`); a larger transfer goes through the copy
    /// engines and the scratch, as in larger communicators. Under CUDA-graph capture every
    /// transfer runs on the kernel (the copy-engine path cannot be captured), so both sides of
    /// a transfer above the limit must be captured or both eager (PyTorch captures on every
    /// rank); a mismatch waits until the timeout. On the kernel, while the communicator has
    /// registered buffers (`Communicator::register`, `ncclCommWindowRegister`), a receive into
    /// a registered buffer is written by the sender directly (`gpu_kernels::p2p::kind::POSTED`),
    /// and [`Config::p2p_kernel_max_bytes_registered`] is the limit instead.
    /// Must be the same on every rank: the two sides of a transfer choose its path alike.
    pub p2p_kernel_max_bytes: usize,
    /// [`Config::p2p_kernel_max_bytes`] while the communicator has registered buffers: its
    /// transfers on the kernel are then posted (the receiver tells the sender where to write),
    /// and a receive into a registered buffer is written by the sender directly, faster than
    /// the copy engines' staged path at every size measured; a receive into an unregistered
    /// buffer goes through the kernel's slots, slower than the copy engines from about 2 MiB
    /// ([`DEFAULT_P2P_KERNEL_MAX_BYTES_REGISTERED`]). The same on every rank.
    pub p2p_kernel_max_bytes_registered: usize,
    /// All-reduces above the one-shot limit and of at most this many bytes per rank run
    /// two-shot ([`Algorithm::TwoShot`], when they can: one process with peer access between
    /// every pair, or processes of one machine); in a job of processes, so do reduce-scatters,
    /// all-gathers, all-to-alls, broadcasts and reduces whose larger buffer has at most this
    /// many bytes (on the two-shot kernel's barriers); 0: never unless forced.
    pub twoshot_max_bytes: usize,
    /// All-reduces of at least this many bytes per rank run on the copy engines
    /// ([`Algorithm::CopyEngine`], when they can), or `None` for never unless forced. The
    /// default, 128 MiB, is where they overtook the SM ring on 2 × H200 (`docs/PERFORMANCE.md`).
    pub ce_min_bytes: Option<usize>,
    /// All-gathers and all-to-alls of at least this many bytes (the larger of a rank's
    /// buffers) run on the copy engines (when they can), or `None` for never unless forced.
    /// The default, 16 MiB, is where both beat the SM ring on 2 × H200 (all-gather +13 %,
    /// all-to-all +8 % at 16 MiB; the ring ahead at 8 MiB: `docs/PERFORMANCE.md`).
    pub ce_copies_min_bytes: Option<usize>,
    /// The same for broadcasts. The default, 256 KiB, is the smallest size measured: on 2 ×
    /// H200 the copy engines beat the SM ring at every size from 256 KiB to 64 MiB (1.05 – 1.8 ×,
    /// `docs/PERFORMANCE.md`).
    pub ce_broadcast_min_bytes: Option<usize>,
    /// In a job of processes, check before each call that every rank makes the same call
    /// (same collective, type, op, count and root; point-to-point sends and receives that pair
    /// up): one all-gather over the bootstrap connections per call (see
    /// `ringccl::internals::api::check`).
    pub check_calls: bool,
    /// Most bytes one ring step moves, or `None` for the size-dependent default.
    pub chunk_bytes: Option<usize>,
    /// Most blocks of a step that reads or writes a peer's memory in one direction.
    pub peer_blocks: u32,
    /// Most blocks of a step that reads and writes a peer's memory, or `None` for one per SM
    /// of the GPU: the 2-rank all-reduce's reduce-copy (peer input in, result out to the peer)
    /// reached 314 / 330 / 340 GB/s at 1 GiB on 2 × H200 (132 SMs) with 32 / 64 / 132 blocks
    /// (`docs/PERFORMANCE.md`).
    pub peer_duplex_blocks: Option<u32>,
    /// How long the ranks of a job of processes wait for each other to join (and for each
    /// exchange of communication buffers) before giving up with an error.
    pub bootstrap_timeout: std::time::Duration,
    /// How long a device-side wait for a peer's signal lasts before it gives up (the kernel
    /// ends cleanly and the host reports [`Error::Timeout`]), and how long
    /// [`Communicator::synchronize`](crate::Communicator::synchronize) and the communicator's
    /// drop wait; `None`: no limit (an abort still ends every wait).
    pub timeout: Option<std::time::Duration>,
    /// Whether ranks in other processes are reached over the network.
    pub net: Network,
    /// Lanes of the network proxy (1 to 16, the same on every rank): threads, each with its
    /// own UCX worker and connections, that carry a pair's chunks in turn
    /// (`ringccl::internals::transport::net::proxy`). Over loopback TCP on one machine, one
    /// thread that both sends and receives was the limit (`docs/NETWORK.md`).
    pub net_lanes: usize,
    /// Whether a communicator of several GPUs in one process keeps a host thread per GPU
    /// (but the first) that issues its rank's part of a small eager call while the caller's
    /// thread issues rank 0's (`ringccl::internals::resources::rank_threads`). A thread spins for
    /// half a millisecond after each call, then sleeps. Off by default: built and tested on the
    /// CPU, not yet measured on GPUs.
    pub rank_threads: bool,
    /// What is reported on stderr.
    pub debug: DebugLevel,
}

/// Default of [`Config::timeout`], in seconds (as long as PyTorch's default for its process
/// groups).
pub const DEFAULT_TIMEOUT_S: u64 = 600;

/// Default of [`Config::ce_min_bytes`].
pub const DEFAULT_CE_MIN_BYTES: usize = 128 << 20;

/// Default of [`Config::ce_copies_min_bytes`].
pub const DEFAULT_CE_COPIES_MIN_BYTES: usize = 16 << 20;

/// Default of [`Config::ce_broadcast_min_bytes`].
pub const DEFAULT_CE_BROADCAST_MIN_BYTES: usize = 256 << 10;

/// Default of [`Config::net_lanes`].
pub const DEFAULT_NET_LANES: usize = 4;

/// Most lanes [`Config::net_lanes`] may ask for.
pub const MAX_NET_LANES: usize = 16;

/// Default of [`Config::bootstrap_timeout`], in seconds.
pub const DEFAULT_BOOTSTRAP_TIMEOUT_S: u64 = 120;

impl Default for Config {
    fn default() -> Self {
        Config {
            p2p_disable: false,
            host_id: None,
            ring: None,
            algorithm: None,
            oneshot_max_bytes: DEFAULT_ONESHOT_MAX_BYTES,
            oneshot_max_bytes_graph: DEFAULT_ONESHOT_MAX_BYTES_GRAPH,
            ll_max_bytes: DEFAULT_LL_MAX_BYTES,
            zero_copy_reads: false,
            ll_all_gather: true,
            p2p_kernel_max_bytes: DEFAULT_P2P_KERNEL_MAX_BYTES,
            p2p_kernel_max_bytes_registered: DEFAULT_P2P_KERNEL_MAX_BYTES_REGISTERED,
            twoshot_max_bytes: DEFAULT_TWOSHOT_MAX_BYTES,
            ce_min_bytes: Some(DEFAULT_CE_MIN_BYTES),
            ce_copies_min_bytes: Some(DEFAULT_CE_COPIES_MIN_BYTES),
            ce_broadcast_min_bytes: Some(DEFAULT_CE_BROADCAST_MIN_BYTES),
            check_calls: false,
            chunk_bytes: None,
            peer_blocks: DEFAULT_PEER_BLOCKS,
            peer_duplex_blocks: None,
            bootstrap_timeout: std::time::Duration::from_secs(DEFAULT_BOOTSTRAP_TIMEOUT_S),
            timeout: Some(std::time::Duration::from_secs(DEFAULT_TIMEOUT_S)),
            net: Network::Off,
            net_lanes: DEFAULT_NET_LANES,
            rank_threads: false,
            debug: DebugLevel::Off,
        }
    }
}

/// Every variable [`Config::from_env`] reads.
pub const ENV_VARS: [&str; 25] = [
    "RINGCCL_P2P_DISABLE",
    "RINGCCL_RING",
    "RINGCCL_ALGO",
    "RINGCCL_ONESHOT_MAX_BYTES",
    "RINGCCL_CHUNK_BYTES",
    "RINGCCL_PEER_BLOCKS",
    "RINGCCL_PEER_DUPLEX_BLOCKS",
    "RINGCCL_DEBUG",
    "RINGCCL_BOOTSTRAP_TIMEOUT",
    "RINGCCL_CE_MIN_BYTES",
    "RINGCCL_TIMEOUT",
    "RINGCCL_NET",
    "RINGCCL_CE_COPIES_MIN_BYTES",
    "RINGCCL_CHECK_CALLS",
    "RINGCCL_ONESHOT_MAX_BYTES_GRAPH",
    "RINGCCL_CE_BROADCAST_MIN_BYTES",
    "RINGCCL_NET_LANES",
    "RINGCCL_RANK_THREADS",
    "RINGCCL_HOST_ID",
    "RINGCCL_TWOSHOT_MAX_BYTES",
    "RINGCCL_LL_MAX_BYTES",
    "RINGCCL_ZERO_COPY_READS",
    "RINGCCL_P2P_KERNEL_MAX_BYTES",
    "RINGCCL_LL_ALL_GATHER",
    "RINGCCL_P2P_KERNEL_MAX_BYTES_REGISTERED",
];

impl Config {
    /// The default configuration with the `RINGCCL_*` environment variables applied (table in
    /// the module docs). A variable that is set but not understood (or not Unicode) is an
    /// [`Error::Config`] naming it.
    ///
    /// ```
    /// let config = ringccl::Config::from_env()?;
    /// println!("{config:?}");
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| match std::env::var_os(name) {
            None => Ok(None),
            Some(v) => v.into_string().map(Some).map_err(|v| Error::Config {
                variable: name.to_string(),
                value: v.to_string_lossy().into_owned(),
                reason: "not valid Unicode".into(),
            }),
        })
    }

    /// [`Config::from_env`] over any source of variables (`lookup(name)`: the value if set).
    ///
    /// ```
    /// use ringccl::{Config, DebugLevel, Error};
    /// let vars = |name: &str| Ok(match name {
    ///     "RINGCCL_PEER_BLOCKS" => Some("32".to_string()),
    ///     "RINGCCL_DEBUG" => Some("info".to_string()),
    ///     _ => None,
    /// });
    /// let c = Config::from_lookup(vars)?;
    /// assert_eq!((c.peer_blocks, c.debug), (32, DebugLevel::Info));
    ///
    /// let bad = Config::from_lookup(|n: &str| Ok((n == "RINGCCL_ALGO").then(|| "tree".to_string())));
    /// assert!(matches!(bad, Err(Error::Config { variable, .. }) if variable == "RINGCCL_ALGO"));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn from_lookup(mut lookup: impl FnMut(&str) -> Result<Option<String>>) -> Result<Self> {
        let mut c = Config::default();
        let mut get = |name: &str| -> Result<Option<String>> {
            Ok(lookup(name)?.filter(|v| !v.trim().is_empty()))
        };
        fn parse<T>(
            name: &str,
            value: Option<String>,
            f: impl FnOnce(&str) -> std::result::Result<T, String>,
        ) -> Result<Option<T>> {
            value
                .map(|v| {
                    f(v.trim()).map_err(|reason| Error::Config {
                        variable: name.to_string(),
                        value: v.clone(),
                        reason,
                    })
                })
                .transpose()
        }
        let [p2p, ring, algo, oneshot, chunk, peer, duplex, debug, boot, ce, timeout, net, ce_copies, check, oneshot_graph, ce_bcast, lanes, rank_threads, host_id, twoshot, ll, zero_copy, p2p_kernel, ll_gather, p2p_kernel_reg] =
            ENV_VARS;
        if let Some(v) = parse(check, get(check)?, parse_bool)? {
            c.check_calls = v;
        }
        if let Some(v) = parse(p2p, get(p2p)?, parse_bool)? {
            c.p2p_disable = v;
        }
        c.ring = parse(ring, get(ring)?, parse_list)?;
        c.algorithm = parse(algo, get(algo)?, str::parse)?;
        if let Some(v) = parse(oneshot, get(oneshot)?, |s| parse_bytes(s, true))? {
            c.oneshot_max_bytes = v;
        }
        if let Some(v) = parse(oneshot_graph, get(oneshot_graph)?, |s| parse_bytes(s, true))? {
            c.oneshot_max_bytes_graph = v;
        }
        if let Some(v) = parse(twoshot, get(twoshot)?, |s| parse_bytes(s, true))? {
            c.twoshot_max_bytes = v;
        }
        if let Some(v) = parse(ll, get(ll)?, |s| parse_bytes(s, true))? {
            c.ll_max_bytes = v;
        }
        if let Some(v) = parse(zero_copy, get(zero_copy)?, parse_bool)? {
            c.zero_copy_reads = v;
        }
        if let Some(v) = parse(p2p_kernel, get(p2p_kernel)?, |s| parse_bytes(s, true))? {
            c.p2p_kernel_max_bytes = v;
        }
        if let Some(v) = parse(ll_gather, get(ll_gather)?, parse_bool)? {
            c.ll_all_gather = v;
        }
        if let Some(v) = parse(p2p_kernel_reg, get(p2p_kernel_reg)?, |s| {
            parse_bytes(s, true)
        })? {
            c.p2p_kernel_max_bytes_registered = v;
        }
        c.chunk_bytes = parse(chunk, get(chunk)?, |s| parse_bytes(s, false))?;
        if let Some(v) = parse(ce, get(ce)?, |s| parse_bytes(s, true))? {
            c.ce_min_bytes = Some(v);
        }
        if let Some(v) = parse(ce_copies, get(ce_copies)?, |s| parse_bytes(s, true))? {
            c.ce_copies_min_bytes = Some(v);
        }
        if let Some(v) = parse(ce_bcast, get(ce_bcast)?, |s| parse_bytes(s, true))? {
            c.ce_broadcast_min_bytes = Some(v);
        }
        if let Some(v) = parse(peer, get(peer)?, parse_blocks)? {
            c.peer_blocks = v;
        }
        c.peer_duplex_blocks = parse(duplex, get(duplex)?, parse_blocks)?;
        if let Some(v) = parse(debug, get(debug)?, str::parse)? {
            c.debug = v;
        }
        if let Some(v) = parse(boot, get(boot)?, parse_seconds)? {
            c.bootstrap_timeout = v;
        }
        if let Some(v) = parse(timeout, get(timeout)?, parse_timeout)? {
            c.timeout = v;
        }
        if let Some(v) = parse(net, get(net)?, str::parse)? {
            c.net = v;
        }
        if let Some(v) = parse(lanes, get(lanes)?, parse_lanes)? {
            c.net_lanes = v;
        }
        if let Some(v) = parse(rank_threads, get(rank_threads)?, parse_bool)? {
            c.rank_threads = v;
        }
        c.host_id = get(host_id)?.map(|v| v.trim().to_string());
        Ok(c)
    }

    /// Checks the fields that cannot be checked field by field, for a communicator of `nranks`
    /// ranks: the ring is a permutation of `0..nranks`, counts are positive.
    pub(crate) fn check(&self, nranks: usize) -> Result<()> {
        let bad = |variable: &str, value: String, reason: String| Error::Config {
            variable: variable.to_string(),
            value,
            reason,
        };
        if let Some(ring) = &self.ring {
            let mut seen = vec![false; nranks];
            let mut problem = (ring.len() != nranks)
                .then(|| format!("it lists {} of the {nranks} ranks", ring.len()));
            for &r in ring {
                if problem.is_some() {
                    break;
                }
                if r >= nranks {
                    problem = Some(format!(
                        "rank {r} is out of range (there are {nranks} ranks)"
                    ));
                } else if std::mem::replace(&mut seen[r], true) {
                    problem = Some(format!("rank {r} appears more than once"));
                }
            }
            if let Some(why) = problem {
                let list: Vec<String> = ring.iter().map(|r| r.to_string()).collect();
                return Err(bad(
                    "RINGCCL_RING",
                    list.join(","),
                    format!("{why}; give a comma-separated permutation of 0..{nranks}"),
                ));
            }
        }
        if self.chunk_bytes == Some(0) {
            return Err(bad(
                "RINGCCL_CHUNK_BYTES",
                "0".into(),
                "must be at least 1".into(),
            ));
        }
        for (name, v) in [
            ("RINGCCL_PEER_BLOCKS", Some(self.peer_blocks)),
            ("RINGCCL_PEER_DUPLEX_BLOCKS", self.peer_duplex_blocks),
        ] {
            let Some(v) = v else { continue };
            if v == 0 {
                return Err(bad(name, "0".into(), "must be at least 1".into()));
            }
        }
        Ok(())
    }
}

fn parse_bool(s: &str) -> std::result::Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected 1 or 0".into()),
    }
}

fn parse_list(s: &str) -> std::result::Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| "expected a comma-separated list of ranks, e.g. 0,2,1,3".into())
}

/// A byte count with an optional `K`/`M`/`G` suffix (powers of 1024).
fn parse_bytes(s: &str, zero_ok: bool) -> std::result::Result<usize, String> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 10),
        Some('M') => (&s[..s.len() - 1], 20),
        Some('G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let v = digits
        .trim()
        .parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(1usize << shift))
        .ok_or_else(|| "expected a byte count such as 262144 or 256K".to_string())?;
    if v == 0 && !zero_ok {
        return Err("must be at least 1".into());
    }
    Ok(v)
}

/// Seconds (a positive number, fractions allowed).
fn parse_seconds(s: &str) -> std::result::Result<std::time::Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() && v < 1e9 => Ok(std::time::Duration::from_secs_f64(v)),
        _ => Err("expected a positive number of seconds".into()),
    }
}

/// Seconds, or `0` for no limit.
fn parse_timeout(s: &str) -> std::result::Result<Option<std::time::Duration>, String> {
    match s.parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(_) => parse_seconds(s).map(Some),
        Err(_) => Err("expected a number of seconds (0: no limit)".into()),
    }
}

fn parse_lanes(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=MAX_NET_LANES).contains(&v) => Ok(v),
        _ => Err(format!("expected 1 to {MAX_NET_LANES} lanes")),
    }
}

fn parse_blocks(s: &str) -> std::result::Result<u32, String> {
    match s.parse::<u32>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err("expected a block count of at least 1".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Config> {
        Config::from_lookup(|name| {
            Ok(vars
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string()))
        })
    }

    fn err_var(r: Result<Config>) -> String {
        match r {
            Err(Error::Config { variable, .. }) => variable,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn copy_engine_threshold_and_algorithm() {
        assert_eq!(from(&[]).unwrap().ce_min_bytes, Some(128 << 20));
        assert_eq!(from(&[]).unwrap().ce_copies_min_bytes, Some(16 << 20));
        assert_eq!(from(&[]).unwrap().ce_broadcast_min_bytes, Some(256 << 10));
        let c = from(&[("RINGCCL_CE_BROADCAST_MIN_BYTES", "1M")]).unwrap();
        assert_eq!(c.ce_broadcast_min_bytes, Some(1 << 20));
        assert!(from(&[("RINGCCL_CE_BROADCAST_MIN_BYTES", "big")]).is_err());
        assert!(!from(&[]).unwrap().check_calls);
        assert!(from(&[("RINGCCL_CHECK_CALLS", "1")]).unwrap().check_calls);
        assert!(from(&[("RINGCCL_CHECK_CALLS", "maybe")]).is_err());
        let c = from(&[("RINGCCL_CE_COPIES_MIN_BYTES", "64M")]).unwrap();
        assert_eq!(c.ce_copies_min_bytes, Some(64 << 20));
        let c = from(&[("RINGCCL_CE_MIN_BYTES", "1G"), ("RINGCCL_ALGO", "CE")]).unwrap();
        assert_eq!(
            (c.ce_min_bytes, c.algorithm),
            (Some(1 << 30), Some(Algorithm::CopyEngine))
        );
        assert_eq!(
            from(&[("RINGCCL_CE_MIN_BYTES", "0")]).unwrap().ce_min_bytes,
            Some(0)
        );
        let e = from(&[("RINGCCL_CE_MIN_BYTES", "lots")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("RINGCCL_CE_MIN_BYTES"), "{e}");
        assert_eq!(
            "copy-engine".parse::<Algorithm>(),
            Ok(Algorithm::CopyEngine)
        );
        assert_eq!(Algorithm::CopyEngine.to_string(), "ce");
    }

    #[test]
    fn nothing_set_is_the_default() {
        assert_eq!(from(&[]).unwrap(), Config::default());
        // Set but empty counts as unset.
        assert_eq!(from(&[("RINGCCL_ALGO", " ")]).unwrap(), Config::default());
    }

    #[test]
    fn every_variable_is_read() {
        let c = from(&[
            ("RINGCCL_P2P_DISABLE", "1"),
            ("RINGCCL_RING", "0, 2,1,3"),
            ("RINGCCL_ALGO", "OneShot"),
            ("RINGCCL_ONESHOT_MAX_BYTES", "64K"),
            ("RINGCCL_ONESHOT_MAX_BYTES_GRAPH", "16K"),
            ("RINGCCL_LL_MAX_BYTES", "4K"),
            ("RINGCCL_ZERO_COPY_READS", "1"),
            ("RINGCCL_P2P_KERNEL_MAX_BYTES", "256K"),
            ("RINGCCL_P2P_KERNEL_MAX_BYTES_REGISTERED", "8M"),
            ("RINGCCL_LL_ALL_GATHER", "0"),
            ("RINGCCL_CHUNK_BYTES", "2M"),
            ("RINGCCL_PEER_BLOCKS", "32"),
            ("RINGCCL_PEER_DUPLEX_BLOCKS", "100"),
            ("RINGCCL_DEBUG", "trace"),
            ("RINGCCL_BOOTSTRAP_TIMEOUT", "2.5"),
            ("RINGCCL_TIMEOUT", "1.5"),
            ("RINGCCL_NET", "ucx"),
            ("RINGCCL_NET_LANES", "4"),
            ("RINGCCL_RANK_THREADS", "1"),
            ("RINGCCL_HOST_ID", " node-b "),
        ])
        .unwrap();
        assert!(c.rank_threads);
        assert_eq!(c.host_id.as_deref(), Some("node-b"));
        assert_eq!(c.net, Network::Ucx);
        assert_eq!(c.net_lanes, 4);
        for bad in ["0", "17", "two"] {
            let e = from(&[("RINGCCL_NET_LANES", bad)]).unwrap_err();
            assert!(
                matches!(e, Error::Config { ref variable, .. } if variable == "RINGCCL_NET_LANES"),
                "{e}"
            );
        }
        assert_eq!(c.timeout, Some(std::time::Duration::from_millis(1500)));
        assert_eq!(from(&[("RINGCCL_TIMEOUT", "0")]).unwrap().timeout, None);
        assert!(c.p2p_disable);
        assert_eq!(c.ring, Some(vec![0, 2, 1, 3]));
        assert_eq!(c.algorithm, Some(Algorithm::OneShot));
        assert_eq!(c.oneshot_max_bytes, 64 << 10);
        assert_eq!(c.oneshot_max_bytes_graph, 16 << 10);
        assert_eq!(c.ll_max_bytes, 4 << 10);
        assert!(c.zero_copy_reads);
        assert_eq!(c.p2p_kernel_max_bytes, 256 << 10);
        assert_eq!(c.p2p_kernel_max_bytes_registered, 8 << 20);
        assert_eq!(Config::default().p2p_kernel_max_bytes_registered, 2 << 20);
        assert!(!c.ll_all_gather && Config::default().ll_all_gather);
        assert!(!Config::default().zero_copy_reads);
        assert_eq!(c.chunk_bytes, Some(2 << 20));
        assert_eq!((c.peer_blocks, c.peer_duplex_blocks), (32, Some(100)));
        assert_eq!(c.debug, DebugLevel::Trace);
        assert_eq!(c.bootstrap_timeout, std::time::Duration::from_millis(2500));
        assert_eq!(
            from(&[("RINGCCL_ONESHOT_MAX_BYTES", "0")])
                .unwrap()
                .oneshot_max_bytes,
            0
        );
        assert!(!from(&[("RINGCCL_P2P_DISABLE", "0")]).unwrap().p2p_disable);
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (name, value) in [
            ("RINGCCL_P2P_DISABLE", "maybe"),
            ("RINGCCL_RING", "0,x"),
            ("RINGCCL_ALGO", "tree"),
            ("RINGCCL_ONESHOT_MAX_BYTES", "-1"),
            ("RINGCCL_CHUNK_BYTES", "0"),
            ("RINGCCL_CHUNK_BYTES", "99999999999999999999G"),
            ("RINGCCL_PEER_BLOCKS", "0"),
            ("RINGCCL_PEER_DUPLEX_BLOCKS", "lots"),
            ("RINGCCL_DEBUG", "verbose"),
            ("RINGCCL_BOOTSTRAP_TIMEOUT", "0"),
            ("RINGCCL_BOOTSTRAP_TIMEOUT", "soon"),
            ("RINGCCL_TIMEOUT", "-1"),
            ("RINGCCL_TIMEOUT", "never"),
            ("RINGCCL_NET", "ib"),
        ] {
            assert_eq!(err_var(from(&[(name, value)])), name, "{name}={value}");
        }
        let e = from(&[("RINGCCL_ALGO", "tree")]).unwrap_err().to_string();
        assert!(e.contains("RINGCCL_ALGO") && e.contains("tree"), "{e}");
        // A lookup failure (a value that is not Unicode) is passed through.
        let e = Config::from_lookup(|_| {
            Err(Error::Config {
                variable: "RINGCCL_RING".into(),
                value: "?".into(),
                reason: "not valid Unicode".into(),
            })
        });
        assert_eq!(err_var(e), "RINGCCL_RING");
    }

    #[test]
    fn ring_is_checked_against_the_rank_count() {
        let mut c = Config::default();
        assert!(c.check(4).is_ok());
        c.ring = Some(vec![0, 2, 1, 3]);
        assert!(c.check(4).is_ok());
        for (bad, why) in [
            (vec![0, 1, 2], "lists 3 of the 4"),
            (vec![0, 1, 2, 2], "more than once"),
            (vec![0, 1, 2, 4], "out of range"),
        ] {
            c.ring = Some(bad.clone());
            let e = c.check(4).unwrap_err();
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
            assert_eq!(err_var(Err(e)), "RINGCCL_RING", "{bad:?}");
        }
        let c = Config {
            peer_blocks: 0,
            ..Config::default()
        };
        assert_eq!(
            err_var(c.check(2).map(|_| Config::default())),
            "RINGCCL_PEER_BLOCKS"
        );
    }

    #[test]
    fn names_parse() {
        assert_eq!(" one-shot\n".parse(), Ok(Algorithm::OneShot));
        assert_eq!("RING".parse(), Ok(Algorithm::Ring));
        for a in [
            Algorithm::Ring,
            Algorithm::OneShot,
            Algorithm::TwoShot,
            Algorithm::CopyEngine,
        ] {
            assert_eq!(a.name().parse(), Ok(a));
        }
        assert_eq!("1".parse(), Ok(DebugLevel::Info));
        assert!(DebugLevel::Trace > DebugLevel::Info && DebugLevel::Info > DebugLevel::Warn);
    }
}
