//! What every rank publishes about its GPU when a communicator of processes exchanges its
//! flags, and the two-shot grid that every rank derives from it (the same on every rank).
//! Pure: `plan::tuning` re-exports it with the other sizing policy.

/// Communicators of processes whose two-shot kernels the grid leaves room for at once on one
/// GPU, at least: a communicator created while its processes hold more live communicators of
/// processes counts those instead ([`GpuRoom::comms`]).
pub const TWOSHOT_CONCURRENT_COMMS: u32 = 2;

/// One rank's GPU as the two-shot grid sizing ([`twoshot_grid_cap`]) sees it: what every rank
/// publishes when its communicator's flags are exchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuRoom {
    /// The GPU: the rank's machine identifier and the device's UUID (ranks with equal keys
    /// share one GPU, whatever ordinal their `CUDA_VISIBLE_DEVICES` gives it).
    pub gpu: (u64, [u8; 16]),
    /// The device's streaming multiprocessors.
    pub sms: u32,
    /// Blocks of the two-shot kernels that fit on one SM at once (the fewest of any two-shot
    /// entry point at its launch width, `cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub blocks_per_sm: u32,
    /// Live communicators of processes in the rank's process when this one was created, this
    /// one included.
    pub comms: u32,
}

/// The most blocks of one rank's two-shot kernel on a communicator whose ranks are `ranks`:
/// every rank computes the same number from the same records. Each block waits at the
/// kernel's barriers for the peers' same-numbered blocks, so every block of every kernel that
/// can be in flight at once on a GPU must be resident together, or they spin forever on SMs
/// the others need. With `S` the fewest SMs of any rank's GPU, `B` the fewest two-shot blocks
/// per SM, `R` the most ranks of this communicator on one GPU (processes sharing it under MPS)
/// and `C` the larger of [`TWOSHOT_CONCURRENT_COMMS`] and the most live communicators any of
/// its processes held at its creation ([`GpuRoom::comms`]):
///
/// `cap = max(1, min(S / R, S × B / (R × C)))`
///
/// `S / R` (one block per SM for every rank of the GPU) is the cap of a lone communicator; the
/// second term gives `C` communicators of `R` ranks on a GPU room at once. So the grid is as
/// before whenever `B ≥ C` (two-shot blocks are 512 threads; an SM holds up to 2048 threads),
/// and smaller only where the kernel's registers keep fewer than `C` blocks on an SM, or where
/// a process already held more than `B` communicators: then a large call's kernel has fewer
/// blocks, each looping over more of the shard. The guarantee: the two-shot kernels in flight
/// at once on a GPU all fit when the communicators they belong to number at most the smallest
/// `C` among them.
///
/// ```
/// use ringccl::internals::transport::room::{twoshot_grid_cap, GpuRoom};
/// let room = |uuid: u8, comms| GpuRoom { gpu: (7, [uuid; 16]), sms: 132, blocks_per_sm: 4, comms };
/// // One process per GPU, one communicator: one block per SM.
/// assert_eq!(twoshot_grid_cap(&[room(0, 1), room(1, 1)]), 132);
/// // Two processes on one GPU: half each.
/// assert_eq!(twoshot_grid_cap(&[room(0, 1), room(0, 1)]), 66);
/// // A sixth communicator of those processes: room for six.
/// assert_eq!(twoshot_grid_cap(&[room(0, 6), room(0, 2)]), 44);
/// ```
pub fn twoshot_grid_cap(ranks: &[GpuRoom]) -> u32 {
    let sms = ranks.iter().map(|r| r.sms).min().unwrap_or(1).max(1);
    let per_sm = ranks.iter().map(|r| r.blocks_per_sm).min().unwrap_or(1).max(1);
    let comms = ranks.iter().map(|r| r.comms).max().unwrap_or(1).max(TWOSHOT_CONCURRENT_COMMS);
    let share = ranks
        .iter()
        .map(|r| ranks.iter().filter(|p| p.gpu == r.gpu).count())
        .max()
        .unwrap_or(1)
        .max(1);
    let share = u64::try_from(share).unwrap_or(u64::MAX);
    let lone = u64::from(sms) / share;
    let shared = u64::from(sms) * u64::from(per_sm) / share.saturating_mul(u64::from(comms));
    u32::try_from(lone.min(shared).max(1)).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(gpu: u8, sms: u32, blocks_per_sm: u32, comms: u32) -> GpuRoom {
        GpuRoom {
            gpu: (1, [gpu; 16]),
            sms,
            blocks_per_sm,
            comms,
        }
    }

    #[test]
    fn a_lone_communicator_keeps_one_block_per_sm() {
        // One process per GPU, 2 to 8 ranks, two-shot blocks fitting 2 to 4 per SM.
        for n in 2..=8u8 {
            for per_sm in 2..=4 {
                let ranks: Vec<_> = (0..n).map(|g| room(g, 132, per_sm, 1)).collect();
                assert_eq!(twoshot_grid_cap(&ranks), 132, "{n} ranks, {per_sm} blocks per SM");
            }
        }
        // The smallest GPU decides.
        assert_eq!(twoshot_grid_cap(&[room(0, 132, 4, 1), room(1, 108, 4, 1)]), 108);
    }

    #[test]
    fn ranks_on_one_gpu_are_found_by_uuid() {
        // Two ranks on one GPU, two on another: half the SMs each.
        let two_by_two = [room(0, 132, 4, 1), room(0, 132, 4, 1), room(1, 132, 4, 1), room(1, 132, 4, 1)];
        assert_eq!(twoshot_grid_cap(&two_by_two), 66);
        let four_on_one = [room(5, 132, 4, 1); 4];
        assert_eq!(twoshot_grid_cap(&four_on_one), 33);
        // Another machine with a GPU of the same UUID bytes is another GPU.
        let mut other = room(0, 132, 4, 1);
        other.gpu.0 = 2;
        assert_eq!(twoshot_grid_cap(&[room(0, 132, 4, 1), other]), 132);
    }

    #[test]
    fn fewer_blocks_per_sm_or_more_communicators_shrink_the_grid() {
        // One two-shot block per SM: room for two communicators means half the SMs.
        assert_eq!(twoshot_grid_cap(&[room(0, 132, 1, 1), room(1, 132, 1, 1)]), 66);
        // A process already holding 7 live communicators: an eighth of S × B.
        assert_eq!(twoshot_grid_cap(&[room(0, 132, 4, 8), room(1, 132, 4, 1)]), 66);
        // Degenerate records never give 0.
        assert_eq!(twoshot_grid_cap(&[room(0, 1, 1, 100), room(0, 1, 1, 100)]), 1);
        assert_eq!(twoshot_grid_cap(&[]), 1);
        assert_eq!(twoshot_grid_cap(&[room(0, 0, 0, 0)]), 1);
    }

    #[test]
    fn the_kernels_of_concurrent_communicators_fit_on_the_gpu_together() {
        // Every job layout of up to 8 ranks on up to 4 GPUs, with k communicators of the same
        // ranks in flight at once (k at most their C): the blocks of every rank of every one of
        // them on the busiest GPU fit within S × B.
        for sms in [16u32, 108, 132] {
            for per_sm in 1..=4 {
                for gpus in 1..=4u8 {
                    for n in 2..=8u8 {
                        let ranks_of = |comms| (0..n).map(|r| room(r % gpus, sms, per_sm, comms)).collect::<Vec<_>>();
                        let busiest = usize::from(n.div_ceil(gpus));
                        for k in 1..=6u32 {
                            // The k-th communicator was created while k were live; the earlier
                            // ones count TWOSHOT_CONCURRENT_COMMS or their own creation order.
                            let caps: Vec<u32> = (1..=k).map(|i| twoshot_grid_cap(&ranks_of(i))).collect();
                            let c_min = (1..=k).map(|i| i.max(TWOSHOT_CONCURRENT_COMMS)).min().unwrap();
                            if k > c_min {
                                continue;
                            }
                            let blocks: u32 = caps.iter().map(|c| c * busiest as u32).sum();
                            let fits = sms * per_sm;
                            // A cap of 1 block can exceed the budget only on GPUs too small for it.
                            if caps.iter().all(|&c| c > 1) {
                                assert!(
                                    blocks <= fits,
                                    "{sms} SMs x {per_sm}, {n} ranks on {gpus} GPUs, {k} communicators: {blocks} > {fits}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
