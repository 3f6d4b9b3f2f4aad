//! Tuning knobs: the few numbers that shape a collective's schedule and launches, with
//! environment-variable overrides for sweeps (`ringccl-perf` sets them between runs).
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `RINGCCL_CHUNK_BYTES` | see [`chunk_bytes`] | most bytes one schedule step moves |
//! | `RINGCCL_PEER_BLOCKS` | [`DEFAULT_PEER_BLOCKS`] | most blocks of a step that touches a peer's memory |
//!
//! Variables are read once per process; an unparsable or zero value is ignored.

use std::sync::OnceLock;

/// Block cap for steps that touch another GPU's memory: NVLink peer reads peaked at 64 blocks of
/// 512 threads on H200 and fell with more (`shared/toolchain.md`, measured 2026-11-29).
pub const DEFAULT_PEER_BLOCKS: u32 = 64;

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
