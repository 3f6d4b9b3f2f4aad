//! Tuning knobs: the few numbers that shape a collective's schedule and launches, with
//! environment-variable overrides for sweeps (`ringccl-perf` sets them between runs).
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `RINGCCL_CHUNK_BYTES` | see [`chunk_bytes`] | most bytes one schedule step moves |
//! | `RINGCCL_PEER_BLOCKS` | [`DEFAULT_PEER_BLOCKS`] | most blocks of a step that reads or writes a peer's memory |
//! | `RINGCCL_PEER_DUPLEX_BLOCKS` | [`DEFAULT_PEER_DUPLEX_BLOCKS`] | most blocks of a step that reads and writes a peer's memory |
//! | `RINGCCL_ALGO` | unset | `ring` or `oneshot`: force the all-reduce algorithm (see [`all_reduce_algo`]) |
//! | `RINGCCL_ONESHOT_MAX_BYTES` | [`DEFAULT_ONESHOT_MAX_BYTES`] | largest all-reduce (bytes per rank) that runs one-shot |
//!
//! Variables are read once per process; an unparsable or zero value is ignored.

use std::sync::OnceLock;

/// Block cap for steps that touch another GPU's memory: NVLink peer reads peaked at 64 blocks of
/// 512 threads on H200 and fell with more (`shared/toolchain.md`, measured 2026-11-29).
pub const DEFAULT_PEER_BLOCKS: u32 = 64;

/// Block cap for steps that both read and write a peer's memory (the 2-rank all-reduce's
/// reduce-copy: peer input in, result out to the peer). Measured on 2 × H200, 2026-11-29,
/// `ringccl-perf -t all_reduce -d float -b 64M -e 1G -f 4 -n 10 -w 3 --lib ringccl` with
/// `RINGCCL_PEER_BLOCKS` = 32 / 64 / 132 (all peer steps then): busbw at 1 GiB 314 / 330 / 340
/// GB/s, at 256 MiB 306 / 323 / 333 GB/s. Rounded to the SM count of that GPU.
pub const DEFAULT_PEER_DUPLEX_BLOCKS: u32 = 132;

/// Smallest step worth a launch of its own for pipelined rings (3+ ranks).
pub const MIN_CHUNK_BYTES: usize = 512 * 1024;

/// Pipeline depth aimed at for rings of 3+ ranks: each segment is cut into this many steps
/// (fewer when that would go under [`MIN_CHUNK_BYTES`]).
pub const PIPELINE_CHUNKS: usize = 8;

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&v| v > 0)
}

/// The block cap for peer traffic ([`DEFAULT_PEER_BLOCKS`] or `RINGCCL_PEER_BLOCKS`).
///
/// ```
/// assert!(ringccl::tuning::peer_blocks() >= 1);
/// ```
pub fn peer_blocks() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        env_usize("RINGCCL_PEER_BLOCKS")
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(DEFAULT_PEER_BLOCKS)
    })
}

/// The block cap for steps that read and write a peer ([`DEFAULT_PEER_DUPLEX_BLOCKS`] or
/// `RINGCCL_PEER_DUPLEX_BLOCKS`).
///
/// ```
/// assert!(ringccl::tuning::peer_duplex_blocks() >= 1);
/// ```
pub fn peer_duplex_blocks() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        env_usize("RINGCCL_PEER_DUPLEX_BLOCKS")
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(DEFAULT_PEER_DUPLEX_BLOCKS)
    })
}

/// The most bytes one schedule step moves, for a message whose largest buffer has `bytes`
/// bytes, over `nranks` ranks (`RINGCCL_CHUNK_BYTES` overrides).
///
/// Two ranks: one step per rank (each rank's steps depend on nothing but the call's start, so
/// cutting them only adds launches). Three or more: each rank's segment (`bytes / nranks`) in
/// [`PIPELINE_CHUNKS`] steps so the ring pipelines, but no step under [`MIN_CHUNK_BYTES`].
///
/// ```
/// use ringccl::tuning::{chunk_bytes, MIN_CHUNK_BYTES};
/// assert_eq!(chunk_bytes(1 << 30, 2), 1 << 29);
/// assert_eq!(chunk_bytes(1 << 30, 4), (1 << 28) / 8);
/// assert_eq!(chunk_bytes(4096, 4), MIN_CHUNK_BYTES);
/// ```
pub fn chunk_bytes(bytes: usize, nranks: usize) -> usize {
    static OVERRIDE: OnceLock<Option<usize>> = OnceLock::new();
    if let Some(v) = *OVERRIDE.get_or_init(|| env_usize("RINGCCL_CHUNK_BYTES")) {
        return v;
    }
    let segment = bytes.div_ceil(nranks.max(1)).max(1);
    if nranks <= 2 {
        segment
    } else {
        (segment / PIPELINE_CHUNKS).max(MIN_CHUNK_BYTES)
    }
}

/// All-reduces of at most this many bytes per rank run one-shot (see [`all_reduce_algo`]).
pub const DEFAULT_ONESHOT_MAX_BYTES: usize = 256 * 1024;

/// Most ranks the one-shot all-reduce supports.
pub const ONESHOT_MAX_RANKS: usize = gpu_kernels::oneshot::MAX_RANKS;

/// How an all-reduce runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// The ring schedule, ordered by events between the ranks' streams.
    Ring,
    /// One kernel per rank that reads every rank's input directly, ordered by a device-side
    /// barrier (for small messages: no events, one launch per rank).
    OneShot,
}

impl AllReduceAlgo {
    /// Parses `ring` / `oneshot` (case-insensitive, surrounding blanks ignored).
    ///
    /// ```
    /// use ringccl::tuning::AllReduceAlgo;
    /// assert_eq!(AllReduceAlgo::parse(" OneShot\n"), Some(AllReduceAlgo::OneShot));
    /// assert_eq!(AllReduceAlgo::parse("ring"), Some(AllReduceAlgo::Ring));
    /// assert_eq!(AllReduceAlgo::parse("tree"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ring" => Some(AllReduceAlgo::Ring),
            "oneshot" | "one-shot" | "one_shot" => Some(AllReduceAlgo::OneShot),
            _ => None,
        }
    }
}

/// The algorithm for an all-reduce of `bytes` bytes per rank over `nranks` ranks (pure).
///
/// One-shot needs 2 to [`ONESHOT_MAX_RANKS`] ranks and direct peer access between every pair
/// (`all_peer_access`); without those it is never chosen, not even when `forced`. Otherwise
/// `forced` (from `RINGCCL_ALGO`) wins, and unforced calls run one-shot up to `max_bytes`.
///
/// ```
/// use ringccl::tuning::{choose_all_reduce_algo, AllReduceAlgo::*};
/// assert_eq!(choose_all_reduce_algo(4096, 2, true, None, 256 << 10), OneShot);
/// assert_eq!(choose_all_reduce_algo(1 << 20, 2, true, None, 256 << 10), Ring);
/// assert_eq!(choose_all_reduce_algo(4096, 2, false, Some(OneShot), 256 << 10), Ring);
/// ```
pub fn choose_all_reduce_algo(
    bytes: usize,
    nranks: usize,
    all_peer_access: bool,
    forced: Option<AllReduceAlgo>,
    max_bytes: usize,
) -> AllReduceAlgo {
    let possible = (2..=ONESHOT_MAX_RANKS).contains(&nranks) && all_peer_access;
    if !possible {
        return AllReduceAlgo::Ring;
    }
    match forced {
        Some(a) => a,
        None if bytes <= max_bytes => AllReduceAlgo::OneShot,
        None => AllReduceAlgo::Ring,
    }
}

/// The algorithm forced by `RINGCCL_ALGO` (`None` when unset or not understood).
pub fn forced_algo() -> Option<AllReduceAlgo> {
    static V: OnceLock<Option<AllReduceAlgo>> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("RINGCCL_ALGO")
            .ok()
            .and_then(|v| AllReduceAlgo::parse(&v))
    })
}

/// The one-shot threshold in bytes per rank ([`DEFAULT_ONESHOT_MAX_BYTES`] or
/// `RINGCCL_ONESHOT_MAX_BYTES`).
///
/// ```
/// assert!(ringccl::tuning::oneshot_max_bytes() > 0);
/// ```
pub fn oneshot_max_bytes() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| env_usize("RINGCCL_ONESHOT_MAX_BYTES").unwrap_or(DEFAULT_ONESHOT_MAX_BYTES))
}

/// [`choose_all_reduce_algo`] with the environment's override and threshold.
///
/// ```
/// use ringccl::tuning::{all_reduce_algo, AllReduceAlgo};
/// // One rank never runs one-shot.
/// assert_eq!(all_reduce_algo(64, 1, true), AllReduceAlgo::Ring);
/// ```
pub fn all_reduce_algo(bytes: usize, nranks: usize, all_peer_access: bool) -> AllReduceAlgo {
    choose_all_reduce_algo(
        bytes,
        nranks,
        all_peer_access,
        forced_algo(),
        oneshot_max_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::AllReduceAlgo::*;
    use super::*;

    const MAX: usize = DEFAULT_ONESHOT_MAX_BYTES;

    #[test]
    fn small_messages_run_one_shot_up_to_the_threshold() {
        for n in 2..=8 {
            for bytes in [1, 8, 4096, 64 << 10, MAX - 1, MAX] {
                assert_eq!(
                    choose_all_reduce_algo(bytes, n, true, None, MAX),
                    OneShot,
                    "{bytes} B, {n} ranks"
                );
            }
            for bytes in [MAX + 1, 1 << 20, usize::MAX] {
                assert_eq!(choose_all_reduce_algo(bytes, n, true, None, MAX), Ring);
            }
        }
        // The threshold is a parameter.
        assert_eq!(choose_all_reduce_algo(4096, 2, true, None, 4095), Ring);
        assert_eq!(choose_all_reduce_algo(4096, 2, true, None, 4096), OneShot);
    }

    #[test]
    fn one_shot_needs_two_to_eight_ranks_and_full_peer_access() {
        for forced in [None, Some(OneShot), Some(Ring)] {
            for n in [0, 1, 9, 16] {
                assert_eq!(choose_all_reduce_algo(64, n, true, forced, MAX), Ring);
            }
            assert_eq!(choose_all_reduce_algo(64, 2, false, forced, MAX), Ring);
            assert_eq!(choose_all_reduce_algo(64, 8, false, forced, MAX), Ring);
        }
    }

    #[test]
    fn the_override_wins_where_one_shot_is_possible() {
        assert_eq!(choose_all_reduce_algo(64, 2, true, Some(Ring), MAX), Ring);
        assert_eq!(
            choose_all_reduce_algo(1 << 30, 4, true, Some(OneShot), MAX),
            OneShot
        );
    }

    #[test]
    fn algo_names_parse() {
        assert_eq!(AllReduceAlgo::parse("ring"), Some(Ring));
        assert_eq!(AllReduceAlgo::parse("RING"), Some(Ring));
        assert_eq!(AllReduceAlgo::parse("oneshot"), Some(OneShot));
        assert_eq!(AllReduceAlgo::parse("one-shot"), Some(OneShot));
        assert_eq!(AllReduceAlgo::parse(""), None);
        assert_eq!(AllReduceAlgo::parse("auto"), None);
    }
}
