//! The network path's per-pair slot state, kept from one group to the next: pure data that the
//! point-to-point planner (`plan::p2p::plan_net`) reads and advances and that a rank's
//! [`super::NetRank`] holds.

use std::collections::VecDeque;

/// Slots per region of a network peer's scratch: eight (1 MiB for two ranks), with sends three
/// chunks ahead of the receives (`plan::p2p::MAX_AHEAD`), so that a credit is needed five rounds
/// after it is issued instead of one. Measured against four slots over loopback TCP (two
/// processes, 4–256 MiB, 20 iterations, two runs each): median 1.17 × faster; all-gather,
/// reduce-scatter, all-to-all and send/recv 1.12–1.57 ×, all-reduce 0.95–1.29 ×
/// (docs/PERFORMANCE.md).
pub const NET_SLOTS: usize = 8;

/// What a rank's network pairs carry from one group to the next (`plan::p2p::plan_net`): per
/// peer, the chunks sent and received so far (the next chunk's slot) and, for the last `slots`
/// chunks sent, the number of the peer's signal (over every group) that consumed each.
///
/// ```
/// use ringccl::internals::transport::net::Carry;
/// let c = Carry::new(4, 8);
/// assert_eq!(c.chunks_to(1), 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Carry {
    /// Slots per region: the layout the carry belongs to.
    pub(crate) slots: usize,
    /// Per peer.
    pub(crate) peers: Vec<PeerCarry>,
}

/// One peer's part of a [`Carry`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerCarry {
    /// Chunks sent to the peer so far.
    pub(crate) out: u64,
    /// Chunks received from the peer so far.
    pub(crate) inn: u64,
    /// For the last (at most `slots`) chunks sent, oldest first: the number of the peer's
    /// signal that consumed it, counted over every group.
    pub(crate) freed: VecDeque<u64>,
}

impl Carry {
    /// Nothing sent or received yet among `nranks` ranks, for regions of `slots` slots.
    pub fn new(nranks: usize, slots: usize) -> Carry {
        Carry {
            slots,
            peers: vec![PeerCarry::default(); nranks],
        }
    }

    /// Chunks sent to `peer` so far (0 for a rank out of range).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn chunks_to(&self, peer: usize) -> u64 {
        self.peers.get(peer).map_or(0, |p| p.out)
    }
}
