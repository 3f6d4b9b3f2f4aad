//! [`PerRank`]: the per-rank lists a call builds on its way from the API to the launch (each
//! rank's arguments, devices, pointers, captures), kept inline for up to [`INLINE_RANKS`]
//! ranks, so that a call on a communicator holding that many ranks or fewer (one rank of a job
//! of processes; every GPU of a machine in one process) allocates nothing on the heap. More
//! ranks than that spill to the heap, with the same results.

/// Ranks held inline by a [`PerRank`] list: the GPUs of one machine.
pub const INLINE_RANKS: usize = 8;

/// A list with one entry per rank held by the communicator, inline up to [`INLINE_RANKS`].
///
/// ```
/// use ringccl::internals::per_rank::PerRank;
/// let devices: PerRank<usize> = (0..4).collect();
/// assert!(!devices.spilled()); // no heap allocation for 4 ranks
/// assert_eq!(&devices[..], &[0, 1, 2, 3]);
/// ```
pub type PerRank<T> = smallvec::SmallVec<[T; INLINE_RANKS]>;
