//! The policy: the few numbers that shape a call's schedule and launches, as pure functions of
//! the call, the communicator's shape and its [`Config`]. Nothing here reads the environment
//! (that is [`Config::from_env`]) or touches a GPU.

use crate::config::{Algorithm, Config};
use crate::DataType;

/// Smallest step worth a launch of its own for pipelined rings (3+ ranks).
pub const MIN_CHUNK_BYTES: usize = 512 * 1024;

/// Pipeline depth aimed at for rings of 3+ ranks: each segment is cut into this many steps
/// (fewer when that would go under [`MIN_CHUNK_BYTES`]).
pub const PIPELINE_CHUNKS: usize = 8;

/// Blocks per SM of a step that touches only its own GPU's memory (HBM saturates there).
pub const LOCAL_BLOCKS_PER_SM: u32 = 2;

/// Where a step's memory traffic goes, which decides how many blocks are worth launching.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Traffic {
    /// All pointers are on the launching GPU.
    Local,
    /// Some pointer is on another GPU, read or written in one direction.
    Peer,
    /// The step both reads and writes another GPU's memory (both directions of the link).
    PeerDuplex,
}

/// The most blocks of a launch, per [`Traffic`], on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCaps {
    /// [`Traffic::Local`]: [`LOCAL_BLOCKS_PER_SM`] × SMs.
    pub local: u32,
    /// [`Traffic::Peer`]: [`Config::peer_blocks`], at most `local`.
    pub peer: u32,
    /// [`Traffic::PeerDuplex`]: [`Config::peer_duplex_blocks`] (default one per SM), at most
    /// `local`.
    pub peer_duplex: u32,
}

impl BlockCaps {
    /// The caps for a GPU with `sm_count` SMs.
    pub fn new(sm_count: u32, config: &Config) -> Self {
        let local = sm_count.saturating_mul(LOCAL_BLOCKS_PER_SM).max(1);
        let duplex = config.peer_duplex_blocks.unwrap_or(sm_count);
        BlockCaps {
            local,
            peer: config.peer_blocks.clamp(1, local),
            peer_duplex: duplex.clamp(1, local),
        }
    }

    /// The cap for a step with `traffic`.
    pub fn for_traffic(&self, traffic: Traffic) -> u32 {
        match traffic {
            Traffic::Local => self.local,
            Traffic::Peer => self.peer,
            Traffic::PeerDuplex => self.peer_duplex,
        }
    }
}

/// The most bytes one schedule step moves, for a message whose largest buffer has `bytes`
/// bytes, over `nranks` ranks ([`Config::chunk_bytes`] overrides).
///
/// Two ranks: one step per rank (each rank's steps depend on nothing but the call's start, so
/// cutting them only adds launches). Three or more: each rank's segment (`bytes / nranks`) in
/// [`PIPELINE_CHUNKS`] steps so the ring pipelines, but no step under [`MIN_CHUNK_BYTES`].
pub fn chunk_bytes(bytes: usize, nranks: usize, config: &Config) -> usize {
    if let Some(v) = config.chunk_bytes {
        return v.max(1);
    }
    let segment = bytes.div_ceil(nranks.max(1)).max(1);
    if nranks <= 2 {
        segment
    } else {
        (segment / PIPELINE_CHUNKS).max(MIN_CHUNK_BYTES)
    }
}

/// The chunk in elements (maximum elements per schedule step): [`chunk_bytes`] in elements,
/// never more than one rank's segment (nothing to pipeline then), never 0.
pub fn chunk_elems(bytes: usize, nranks: usize, dtype: DataType, config: &Config) -> usize {
    let size = dtype.size();
    let max = (chunk_bytes(bytes, nranks, config) / size).max(1);
    let segment = bytes.div_ceil(size).div_ceil(nranks.max(1));
    segment.clamp(1, max)
}

/// The algorithm of an all-reduce of `bytes` bytes per rank over `nranks` ranks.
///
/// One-shot needs 2 to `gpu_kernels::oneshot::MAX_RANKS` ranks and `oneshot_possible` (direct
/// peer access between every pair, no earlier failed one-shot call); the copy-engine ring needs
/// 2 or more ranks and `ce_possible` (one process, direct peer access between every pair, not
/// under CUDA-graph capture); two-shot needs both (its kernel writes every rank's output, which
/// only one process reaches; under capture the ring, measured faster there from 64 KiB, stays).
/// An algorithm that is not possible is never chosen, not even when [`Config::algorithm`]
/// forces it (the ring runs instead). Otherwise the forced algorithm wins, and unforced calls
/// run one-shot up to [`Config::oneshot_max_bytes`] (while `capturing` into a CUDA graph, up to
/// the smaller of that and [`Config::oneshot_max_bytes_graph`]), two-shot above that up to
/// [`Config::twoshot_max_bytes`], on the copy engines from [`Config::ce_min_bytes`] (when set),
/// the ring in between.
///
/// ```
/// use ringccl::internals::plan::tuning::all_reduce_algorithm;
/// use ringccl::{Algorithm, Config};
/// let c = Config::default();
/// assert_eq!(all_reduce_algorithm(4096, 2, true, true, false, &c), Algorithm::OneShot);
/// assert_eq!(all_reduce_algorithm(128 << 10, 2, true, true, false, &c), Algorithm::OneShot);
/// assert_eq!(all_reduce_algorithm(128 << 10, 2, true, false, true, &c), Algorithm::Ring);
/// assert_eq!(all_reduce_algorithm(1 << 20, 2, true, true, false, &c), Algorithm::TwoShot);
/// assert_eq!(all_reduce_algorithm(1 << 20, 2, true, false, false, &c), Algorithm::Ring);
/// assert_eq!(all_reduce_algorithm(16 << 20, 2, true, true, false, &c), Algorithm::Ring);
/// assert_eq!(all_reduce_algorithm(1 << 30, 2, true, true, false, &c), Algorithm::CopyEngine);
/// assert_eq!(all_reduce_algorithm(1 << 30, 2, true, false, false, &c), Algorithm::Ring);
/// ```
pub fn all_reduce_algorithm(
    bytes: usize,
    nranks: usize,
    oneshot_possible: bool,
    ce_possible: bool,
    capturing: bool,
    config: &Config,
) -> Algorithm {
    let oneshot = (2..=gpu_kernels::oneshot::MAX_RANKS).contains(&nranks) && oneshot_possible;
    let oneshot_max = if capturing {
        config.oneshot_max_bytes.min(config.oneshot_max_bytes_graph)
    } else {
        config.oneshot_max_bytes
    };
    let ce = nranks >= 2 && ce_possible;
    let twoshot = oneshot && ce_possible;
    match config.algorithm {
        Some(Algorithm::OneShot) if oneshot => Algorithm::OneShot,
        Some(Algorithm::TwoShot) if twoshot => Algorithm::TwoShot,
        Some(Algorithm::CopyEngine) if ce => Algorithm::CopyEngine,
        Some(_) => Algorithm::Ring,
        None if oneshot && bytes <= oneshot_max => Algorithm::OneShot,
        None if twoshot && bytes <= config.twoshot_max_bytes => Algorithm::TwoShot,
        None if ce && config.ce_min_bytes.is_some_and(|m| bytes >= m) => Algorithm::CopyEngine,
        None => Algorithm::Ring,
    }
}

/// The algorithm of an all-reduce of `bytes` bytes per rank over `nranks` ranks in a job of
/// processes of one machine (every peer's scratch mapped): one-shot up to
/// [`Config::oneshot_max_bytes`], two-shot up to [`Config::twoshot_max_bytes`] (both through
/// the scratch, 2 to `gpu_kernels::oneshot::MAX_RANKS` ranks), the ring above; a forced
/// algorithm wins where it can run (the copy engines cannot: the ring).
///
/// ```
/// use ringccl::internals::plan::tuning::process_all_reduce_algorithm;
/// use ringccl::{Algorithm, Config};
/// let c = Config::default();
/// assert_eq!(process_all_reduce_algorithm(4096, 2, &c), Algorithm::OneShot);
/// assert_eq!(process_all_reduce_algorithm(1 << 20, 2, &c), Algorithm::TwoShot);
/// assert_eq!(process_all_reduce_algorithm(64 << 20, 2, &c), Algorithm::Ring);
/// assert_eq!(process_all_reduce_algorithm(4096, 16, &c), Algorithm::Ring);
/// ```
pub fn process_all_reduce_algorithm(bytes: usize, nranks: usize, config: &Config) -> Algorithm {
    let direct = (2..=gpu_kernels::oneshot::MAX_RANKS).contains(&nranks);
    match config.algorithm {
        Some(a @ (Algorithm::OneShot | Algorithm::TwoShot)) if direct => a,
        Some(_) => Algorithm::Ring,
        None if direct && bytes <= config.oneshot_max_bytes => Algorithm::OneShot,
        None if direct && bytes <= config.twoshot_max_bytes => Algorithm::TwoShot,
        None => Algorithm::Ring,
    }
}

/// The algorithm of a reduce-scatter, all-gather, all-to-all, broadcast or reduce whose larger
/// buffer has `bytes` bytes, over `nranks` ranks: [`Algorithm::TwoShot`] (the collective on the
/// two-shot kernel's barriers, `plan::call::TwoShotOf`) or [`Algorithm::Ring`]; the caller
/// decides the copy engines after it.
///
/// * One process (`processes` false): two-shot only when [`Config::algorithm`] forces it and
///   it can run (`twoshot_possible`: direct peer access between every pair, not under
///   capture). Not chosen by default: it has not yet been measured against the ring and the
///   copy engines between two GPUs.
/// * Processes of one machine (`twoshot_possible` as for the all-reduce there): forced, or by
///   default up to [`Config::twoshot_max_bytes`]; another forced algorithm runs the ring.
///
/// Either way 2 to `gpu_kernels::oneshot::MAX_RANKS` ranks.
///
/// ```
/// use ringccl::internals::plan::tuning::twoshot_algorithm;
/// use ringccl::{Algorithm, Config};
/// let c = Config::default();
/// assert_eq!(twoshot_algorithm(1 << 20, 2, true, false, &c), Algorithm::Ring);
/// assert_eq!(twoshot_algorithm(1 << 20, 2, true, true, &c), Algorithm::TwoShot);
/// assert_eq!(twoshot_algorithm(64 << 20, 2, true, true, &c), Algorithm::Ring);
/// assert_eq!(twoshot_algorithm(1 << 20, 16, true, true, &c), Algorithm::Ring);
/// let mut forced = Config::default();
/// forced.algorithm = Some(Algorithm::TwoShot);
/// assert_eq!(twoshot_algorithm(64 << 20, 2, true, false, &forced), Algorithm::TwoShot);
/// assert_eq!(twoshot_algorithm(1 << 20, 2, false, false, &forced), Algorithm::Ring);
/// ```
pub fn twoshot_algorithm(
    bytes: usize,
    nranks: usize,
    twoshot_possible: bool,
    processes: bool,
    config: &Config,
) -> Algorithm {
    let twoshot = (2..=gpu_kernels::oneshot::MAX_RANKS).contains(&nranks) && twoshot_possible;
    match config.algorithm {
        Some(Algorithm::TwoShot) if twoshot => Algorithm::TwoShot,
        Some(_) => Algorithm::Ring,
        None if twoshot && processes && bytes <= config.twoshot_max_bytes => Algorithm::TwoShot,
        None => Algorithm::Ring,
    }
}

/// Bytes of a rank's shard that one block of the two-shot kernel takes at least: 8 KiB, one
/// 16-byte vector per thread of a 512-thread block.
pub const TWOSHOT_BYTES_PER_BLOCK: usize = 8 << 10;

/// Blocks of a two-shot all-reduce of `bytes` per rank over `nranks` ranks with at most
/// `sm_count` blocks (one process: the fewest SMs of its GPUs; a job of processes:
/// [`twoshot_grid_cap`], which leaves room on each GPU for every rank sharing it and for the
/// other communicators of their processes): one per [`TWOSHOT_BYTES_PER_BLOCK`] of a rank's
/// shard, at most `sm_count` (so every block of every rank is resident at once and each meets
/// its peers' at the barriers) and `gpu_kernels::oneshot::MAX_TWO_SHOT_BLOCKS`, at least 1.
/// Every rank computes the same number from the same arguments.
///
/// ```
/// use ringccl::internals::plan::tuning::twoshot_blocks;
/// assert_eq!(twoshot_blocks(1 << 20, 2, 132), 64);
/// assert_eq!(twoshot_blocks(8 << 20, 2, 132), 132);
/// assert_eq!(twoshot_blocks(300 << 10, 8, 132), 5);
/// ```
pub fn twoshot_blocks(bytes: usize, nranks: usize, sm_count: u32) -> u32 {
    let shard = bytes / nranks.max(1);
    let cap = (sm_count as usize).clamp(1, gpu_kernels::oneshot::MAX_TWO_SHOT_BLOCKS);
    u32::try_from(shard.div_ceil(TWOSHOT_BYTES_PER_BLOCK).clamp(1, cap)).unwrap_or(1)
}

/// Whether an all-gather, broadcast or all-to-all of `bytes` bytes (the larger of a rank's
/// buffers) runs on the copy engines: where possible (`ce_possible`: one process, direct peer
/// access between every pair, not under CUDA-graph capture), when [`Config::algorithm`] forces
/// [`Algorithm::CopyEngine`] or from [`Config::ce_broadcast_min_bytes`] (a `broadcast`) or
/// [`Config::ce_copies_min_bytes`] (the others).
///
/// ```
/// use ringccl::internals::plan::tuning::copies_on_copy_engines;
/// use ringccl::Config;
/// let c = Config::default();
/// assert!(copies_on_copy_engines(1 << 30, false, true, &c));
/// assert!(copies_on_copy_engines(16 << 20, false, true, &c));
/// assert!(!copies_on_copy_engines(8 << 20, false, true, &c));
/// assert!(copies_on_copy_engines(1 << 20, true, true, &c)); // a broadcast
/// assert!(!copies_on_copy_engines(1 << 30, true, false, &c));
/// ```
pub fn copies_on_copy_engines(bytes: usize, broadcast: bool, ce_possible: bool, config: &Config) -> bool {
    let min = if broadcast {
        config.ce_broadcast_min_bytes
    } else {
        config.ce_copies_min_bytes
    };
    ce_possible
        && match config.algorithm {
            Some(a) => a == Algorithm::CopyEngine,
            None => min.is_some_and(|m| bytes >= m),
        }
}

/// Chunk of the copy-engine all-reduce, in elements: a quarter of a rank's segment, between
/// [`CE_MIN_CHUNK_BYTES`] and [`CE_MAX_CHUNK_BYTES`] (or [`Config::chunk_bytes`] if set), never
/// more than the segment, never 0. Each chunk costs a few microseconds of host time per rank
/// (a copy, a launch, events), so chunks stay large enough for the copies to outlast their
/// issue. (With 2 ranks the copy stream runs every slot copy, then every all-gather copy, so
/// the pipeline costs one chunk's reduction at the end, whatever the chunk count.)
pub fn ce_chunk_elems(bytes: usize, nranks: usize, dtype: DataType, config: &Config) -> usize {
    let size = dtype.size();
    let segment = bytes.div_ceil(nranks.max(1));
    let want = config
        .chunk_bytes
        .unwrap_or_else(|| (segment / 4).clamp(CE_MIN_CHUNK_BYTES, CE_MAX_CHUNK_BYTES));
    (want.min(segment) / size).max(1)
}

/// Smallest default chunk of the copy-engine all-reduce.
pub const CE_MIN_CHUNK_BYTES: usize = 4 << 20;

/// Largest default chunk of the copy-engine all-reduce.
pub const CE_MAX_CHUNK_BYTES: usize = 32 << 20;

/// Scratch slots per rank of the copy-engine all-reduce (chunks in flight to one rank).
pub const CE_SLOTS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use Algorithm::*;

    const MAX: usize = crate::config::DEFAULT_ONESHOT_MAX_BYTES;

    fn forced(a: Option<Algorithm>) -> Config {
        Config {
            algorithm: a,
            ..Config::default()
        }
    }

    #[test]
    fn small_messages_run_one_shot_up_to_the_threshold() {
        let c = Config::default();
        for n in 2..=8 {
            for bytes in [1, 8, 4096, 64 << 10, MAX - 1, MAX] {
                assert_eq!(all_reduce_algorithm(bytes, n, true, false, false, &c), OneShot, "{bytes} B, {n} ranks");
            }
            for bytes in [MAX + 1, 1 << 20, usize::MAX] {
                assert_eq!(all_reduce_algorithm(bytes, n, true, false, false, &c), Ring);
            }
        }
        // The threshold is configurable.
        let mut c = Config {
            oneshot_max_bytes: 4095,
            ..Config::default()
        };
        assert_eq!(all_reduce_algorithm(4096, 2, true, false, false, &c), Ring);
        c.oneshot_max_bytes = 4096;
        assert_eq!(all_reduce_algorithm(4096, 2, true, false, false, &c), OneShot);
    }

    #[test]
    fn captured_calls_run_one_shot_up_to_the_smaller_threshold() {
        let mut c = Config::default();
        let graph = crate::config::DEFAULT_ONESHOT_MAX_BYTES_GRAPH;
        assert_eq!(all_reduce_algorithm(graph, 2, true, false, true, &c), OneShot);
        assert_eq!(all_reduce_algorithm(graph + 1, 2, true, false, true, &c), Ring);
        assert_eq!(all_reduce_algorithm(graph + 1, 2, true, false, false, &c), OneShot);
        // One-shot turned off (0 bytes) stays off under capture.
        c.oneshot_max_bytes = 0;
        assert_eq!(all_reduce_algorithm(8, 2, true, false, true, &c), Ring);
        // A larger graph limit does not raise the eager one.
        c.oneshot_max_bytes = 4096;
        c.oneshot_max_bytes_graph = 1 << 20;
        assert_eq!(all_reduce_algorithm(8192, 2, true, false, true, &c), Ring);
    }

    #[test]
    fn one_shot_needs_two_to_eight_ranks_and_full_peer_access() {
        for a in [None, Some(OneShot), Some(Ring)] {
            let c = forced(a);
            for n in [0, 1, 9, 16] {
                assert_eq!(all_reduce_algorithm(64, n, true, false, false, &c), Ring);
            }
            assert_eq!(all_reduce_algorithm(64, 2, false, false, false, &c), Ring);
            assert_eq!(all_reduce_algorithm(64, 8, false, false, false, &c), Ring);
        }
    }

    #[test]
    fn the_override_wins_where_one_shot_is_possible() {
        assert_eq!(all_reduce_algorithm(64, 2, true, false, false, &forced(Some(Ring))), Ring);
        assert_eq!(all_reduce_algorithm(1 << 30, 4, true, false, false, &forced(Some(OneShot))), OneShot);
    }

    #[test]
    fn copy_engines_when_possible_and_forced_or_large() {
        let ce = forced(Some(CopyEngine));
        assert_eq!(all_reduce_algorithm(64, 2, true, true, false, &ce), CopyEngine);
        assert_eq!(all_reduce_algorithm(64, 16, false, true, false, &ce), CopyEngine);
        assert_eq!(all_reduce_algorithm(1 << 30, 2, true, false, false, &ce), Ring);
        assert_eq!(all_reduce_algorithm(1 << 30, 1, true, true, false, &ce), Ring);
        let mut c = Config::default();
        assert_eq!(all_reduce_algorithm(64 << 20, 2, true, true, false, &c), Ring);
        assert_eq!(all_reduce_algorithm(128 << 20, 2, true, true, false, &c), CopyEngine);
        c.ce_min_bytes = None;
        assert_eq!(all_reduce_algorithm(1 << 30, 2, true, true, false, &c), Ring);
        c.ce_min_bytes = Some(1 << 20);
        // Two-shot comes first where both apply.
        assert_eq!(all_reduce_algorithm((1 << 20) - 1, 2, true, true, false, &c), TwoShot);
        c.twoshot_max_bytes = 0;
        assert_eq!(all_reduce_algorithm((1 << 20) - 1, 2, true, true, false, &c), Ring);
        assert_eq!(all_reduce_algorithm(1 << 20, 2, true, true, false, &c), CopyEngine);
        assert_eq!(all_reduce_algorithm(4096, 2, true, true, false, &c), OneShot);
        assert_eq!(all_reduce_algorithm(4096, 16, false, true, false, &c), Ring);
        c.ce_min_bytes = Some(0);
        assert_eq!(all_reduce_algorithm(4096, 16, false, true, false, &c), CopyEngine);
    }

    #[test]
    fn two_shot_between_the_one_shot_limit_and_its_own_in_one_process() {
        let mut c = Config::default();
        let two = crate::config::DEFAULT_TWOSHOT_MAX_BYTES;
        for n in 2..=8 {
            assert_eq!(all_reduce_algorithm(MAX, n, true, true, false, &c), OneShot);
            assert_eq!(all_reduce_algorithm(MAX + 1, n, true, true, false, &c), TwoShot);
            assert_eq!(all_reduce_algorithm(two, n, true, true, false, &c), TwoShot);
            assert_eq!(all_reduce_algorithm(two + 1, n, true, true, false, &c), Ring);
            // Not across processes, not under capture (ce_possible false), not without peer
            // access, not beyond eight ranks.
            assert_eq!(all_reduce_algorithm(1 << 20, n, true, false, false, &c), Ring);
            assert_eq!(all_reduce_algorithm(1 << 20, n, false, true, false, &c), Ring);
        }
        assert_eq!(all_reduce_algorithm(1 << 20, 9, true, true, false, &c), Ring);
        // Forced: at any size where possible, else the ring.
        let forced_two = forced(Some(TwoShot));
        assert_eq!(all_reduce_algorithm(8, 2, true, true, false, &forced_two), TwoShot);
        assert_eq!(all_reduce_algorithm(1 << 30, 4, true, true, false, &forced_two), TwoShot);
        assert_eq!(all_reduce_algorithm(1 << 20, 2, true, false, true, &forced_two), Ring);
        // 0 turns it off.
        c.twoshot_max_bytes = 0;
        assert_eq!(all_reduce_algorithm(1 << 20, 2, true, true, false, &c), Ring);
    }

    #[test]
    fn copy_engine_chunks() {
        let c = Config::default();
        let f32 = DataType::F32;
        assert_eq!(ce_chunk_elems(1 << 30, 2, f32, &c), (32 << 20) / 4);
        assert_eq!(ce_chunk_elems(128 << 20, 2, f32, &c), (16 << 20) / 4);
        assert_eq!(ce_chunk_elems(8 << 20, 2, f32, &c), (4 << 20) / 4);
        assert_eq!(ce_chunk_elems(1 << 20, 2, f32, &c), (512 << 10) / 4);
        assert_eq!(ce_chunk_elems(2, 2, f32, &c), 1);
        let fixed = Config { chunk_bytes: Some(1 << 20), ..Config::default() };
        assert_eq!(ce_chunk_elems(1 << 30, 2, f32, &fixed), (1 << 20) / 4);
    }

    #[test]
    fn chunk_is_bounded_and_positive() {
        let c = Config::default();
        assert_eq!(chunk_bytes(1 << 30, 2, &c), 1 << 29);
        assert_eq!(chunk_bytes(1 << 30, 4, &c), (1 << 28) / 8);
        assert_eq!(chunk_bytes(4096, 4, &c), MIN_CHUNK_BYTES);
        assert_eq!(chunk_elems(1 << 30, 2, DataType::F32, &c), (1 << 29) / 4);
        assert_eq!(chunk_elems(4096, 4, DataType::F32, &c), 256);
        assert_eq!(chunk_elems(0, 4, DataType::F64, &c), 1);
        for dt in DataType::ALL {
            for n in 1..=9 {
                for bytes in [0, 1, 7, 4096, 1 << 20, 1 << 30] {
                    let k = chunk_elems(bytes, n, dt, &c);
                    assert!(k >= 1);
                    assert!(k <= bytes.div_ceil(dt.size()).div_ceil(n).max(1));
                }
            }
        }
        let c = Config {
            chunk_bytes: Some(1000),
            ..Config::default()
        };
        assert_eq!(chunk_bytes(1 << 30, 4, &c), 1000);
        assert_eq!(chunk_elems(1 << 30, 4, DataType::F64, &c), 125);
    }

    #[test]
    fn block_caps_follow_the_sm_count_and_config() {
        let c = Config::default();
        let caps = BlockCaps::new(132, &c);
        assert_eq!((caps.local, caps.peer, caps.peer_duplex), (264, 64, 132));
        assert_eq!(caps.for_traffic(Traffic::Local), 264);
        assert_eq!(caps.for_traffic(Traffic::Peer), 64);
        assert_eq!(caps.for_traffic(Traffic::PeerDuplex), 132);
        // A small GPU caps peer steps at its local cap; no cap is ever 0.
        let tiny = BlockCaps::new(4, &c);
        assert_eq!((tiny.local, tiny.peer, tiny.peer_duplex), (8, 8, 4));
        let none = BlockCaps::new(0, &c);
        assert_eq!((none.local, none.peer, none.peer_duplex), (1, 1, 1));
        let c = Config {
            peer_blocks: 32,
            peer_duplex_blocks: Some(100),
            ..Config::default()
        };
        let caps = BlockCaps::new(132, &c);
        assert_eq!((caps.peer, caps.peer_duplex), (32, 100));
    }
}
