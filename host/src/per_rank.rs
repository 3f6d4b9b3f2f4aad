//! [`PerRank`]: the per-rank lists a call builds on its way from the API to the launch (each
//! rank's arguments, devices, pointers, captures), kept inline for up to [`INLINE_RANKS`]
//! ranks, so that a call on a communicator holding that many ranks or fewer (one rank of a job
//! of processes; every GPU of a machine in one process) allocates nothing on the heap. More
//! ranks than that spill to the heap, with the same results. [`PerOp`] does the same for the
//! operations of a point-to-point group.

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

/// Operations of a point-to-point group held inline by a [`PerOp`] list: a send and a receive
/// with each of [`INLINE_RANKS`] ranks.
pub const INLINE_OPS: usize = 2 * INLINE_RANKS;

/// A list with one entry per operation of a point-to-point group (its operations, their
/// buffers, the plan's copies), inline up to [`INLINE_OPS`]: a group of that many operations
/// or fewer allocates nothing on the heap on its way to the launch.
///
/// ```
/// use ringccl::internals::per_rank::PerOp;
/// let bufs: PerOp<u64> = (0..16).map(|i| 0x1000 * i).collect();
/// assert!(!bufs.spilled());
/// ```
pub type PerOp<T> = smallvec::SmallVec<[T; INLINE_OPS]>;
