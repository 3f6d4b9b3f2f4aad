//! What a call asks for, as plain data: [`Collective`] (a collective with its counts and
//! root), what it needs of each rank's buffers ([`Need`]), its in-place layout, and its ring
//! schedule.

use crate::kind::CollectiveKind;
use crate::plan::ScheduleKey;
use crate::schedule::{self, Layout, Schedule};


/// A collective with its counts and root: what a call asks for, as plain data.
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// let c = Collective::AllGather { sendcount: 10 };
/// assert_eq!((c.name(), c.count(), c.root()), ("all_gather", 10, None));
/// assert_eq!(c.max_elems(4), Some(40));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank gets the reduction of all ranks' `count` elements.
    AllReduce {
        /// Elements per rank.
        count: usize,
    },
    /// Rank `r` gets block `r` (of `recvcount` elements) of the reduction.
    ReduceScatter {
        /// Elements each rank receives.
        recvcount: usize,
    },
    /// Every rank gets all ranks' `sendcount` elements, in rank order.
    AllGather {
        /// Elements each rank sends.
        sendcount: usize,
    },
    /// Every rank gets the root's `count` elements.
    Broadcast {
        /// Elements.
        count: usize,
        /// The rank whose data is sent.
        root: usize,
    },
    /// The root gets the reduction of all ranks' `count` elements.
    Reduce {
        /// Elements.
        count: usize,
        /// The rank that receives.
        root: usize,
    },
    /// Block `j` of rank `i`'s send goes to block `i` of rank `j`'s recv.
    AllToAll {
        /// Elements per block (per pair of ranks).
        count_per_peer: usize,
    },
    /// The root gets all ranks' `sendcount` elements, in rank order.
    Gather {
        /// Elements each rank sends.
        sendcount: usize,
        /// The rank that receives.
        root: usize,
    },
    /// Rank `r` gets block `r` of the root's send buffer.
    Scatter {
        /// Elements each rank receives.
        recvcount: usize,
        /// The rank that sends.
        root: usize,
    },
}

/// How a collective uses one of a rank's buffers.
///
/// ```
/// use ringccl::internals::api::collective::{Collective, Need};
/// let b = Collective::Broadcast { count: 8, root: 1 };
/// assert_eq!(b.needs(1, 4), (Need::Required(8), Need::Optional(8)));
/// assert_eq!(b.needs(0, 4), (Need::Unused, Need::Required(8)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Not touched (ignored if given).
    Unused,
    /// Must be given, with at least this many elements.
    Required(usize),
    /// Used if given (at least this many elements); the broadcast root's output.
    Optional(usize),
}

impl Need {
    pub(crate) fn used(self) -> bool {
        !matches!(self, Need::Unused)
    }
    pub(crate) fn elems(self) -> usize {
        match self {
            Need::Unused => 0,
            Need::Required(n) | Need::Optional(n) => n,
        }
    }
}

impl Collective {
    /// Which collective.
    pub fn kind(self) -> CollectiveKind {
        match self {
            Collective::AllReduce { .. } => CollectiveKind::AllReduce,
            Collective::ReduceScatter { .. } => CollectiveKind::ReduceScatter,
            Collective::AllGather { .. } => CollectiveKind::AllGather,
            Collective::Broadcast { .. } => CollectiveKind::Broadcast,
            Collective::Reduce { .. } => CollectiveKind::Reduce,
            Collective::AllToAll { .. } => CollectiveKind::AllToAll,
            Collective::Gather { .. } => CollectiveKind::Gather,
            Collective::Scatter { .. } => CollectiveKind::Scatter,
        }
    }

    /// The method's name (`"all_reduce"`, ...), used in error messages.
    pub fn name(self) -> &'static str {
        self.kind().name()
    }

    /// The count argument of the call.
    pub fn count(self) -> usize {
        match self {
            Collective::AllReduce { count }
            | Collective::Broadcast { count, .. }
            | Collective::Reduce { count, .. } => count,
            Collective::ReduceScatter { recvcount } | Collective::Scatter { recvcount, .. } => {
                recvcount
            }
            Collective::AllGather { sendcount } | Collective::Gather { sendcount, .. } => sendcount,
            Collective::AllToAll { count_per_peer } => count_per_peer,
        }
    }

    /// The root, for rooted collectives.
    pub fn root(self) -> Option<usize> {
        match self {
            Collective::Broadcast { root, .. }
            | Collective::Reduce { root, .. }
            | Collective::Gather { root, .. }
            | Collective::Scatter { root, .. } => Some(root),
            _ => None,
        }
    }

    /// Elements of the largest buffer any rank needs over `nranks` ranks (`None` on overflow).
    pub fn max_elems(self, nranks: usize) -> Option<usize> {
        match self {
            Collective::AllReduce { count }
            | Collective::Broadcast { count, .. }
            | Collective::Reduce { count, .. } => Some(count),
            _ => self.count().checked_mul(nranks),
        }
    }

    /// What rank `rank` of `nranks` needs: `(send, recv)`. Counts saturate on overflow (which
    /// [`validate`] rejects first).
    pub fn needs(self, rank: usize, nranks: usize) -> (Need, Need) {
        use Need::{Optional, Required, Unused};
        let c = self.count();
        let all = c.saturating_mul(nranks);
        let is_root = self.root() == Some(rank);
        match self {
            Collective::AllReduce { .. } => (Required(c), Required(c)),
            Collective::ReduceScatter { .. } => (Required(all), Required(c)),
            Collective::AllGather { .. } => (Required(c), Required(all)),
            Collective::Broadcast { .. } if is_root => (Required(c), Optional(c)),
            Collective::Broadcast { .. } => (Unused, Required(c)),
            Collective::Reduce { .. } => (Required(c), if is_root { Required(c) } else { Unused }),
            Collective::AllToAll { .. } => (Required(all), Required(all)),
            Collective::Gather { .. } => {
                (Required(c), if is_root { Required(all) } else { Unused })
            }
            Collective::Scatter { .. } => {
                (if is_root { Required(all) } else { Unused }, Required(c))
            }
        }
    }

    /// The layout of an in-place call (`None`: in place is not allowed).
    pub fn in_place_layout(self) -> Option<Layout> {
        match self {
            Collective::AllReduce { .. }
            | Collective::Broadcast { .. }
            | Collective::Reduce { .. } => Some(Layout::SendInRecv { stride: 0 }),
            Collective::AllGather { sendcount } | Collective::Gather { sendcount, .. } => {
                Some(Layout::SendInRecv { stride: sendcount })
            }
            Collective::ReduceScatter { recvcount } | Collective::Scatter { recvcount, .. } => {
                Some(Layout::RecvInSend { stride: recvcount })
            }
            Collective::AllToAll { .. } => None,
        }
    }

    /// The in-place rule in words, for error messages.
    pub(crate) fn in_place_rule(self) -> &'static str {
        match self {
            Collective::AllReduce { .. }
            | Collective::Broadcast { .. }
            | Collective::Reduce { .. } => "send == recv",
            Collective::AllGather { .. } => "send == recv + rank * sendcount",
            Collective::Gather { .. } => "send == recv + root * sendcount on the root",
            Collective::ReduceScatter { .. } => "recv == send + rank * recvcount",
            Collective::Scatter { .. } => "recv == send + root * recvcount on the root",
            Collective::AllToAll { .. } => "none: all_to_all cannot run in place",
        }
    }

    /// The key its prepared schedule is cached under, for this layout and chunk.
    pub fn schedule_key(self, layout: Layout, chunk: usize) -> ScheduleKey {
        ScheduleKey {
            kind: self.kind(),
            count: self.count(),
            layout,
            root: self.root(),
            chunk,
        }
    }

    /// The ring schedule for this call.
    pub fn schedule(self, ring: &[usize], layout: Layout, chunk: usize) -> Schedule {
        match self {
            Collective::AllReduce { count } => schedule::all_reduce(ring, count, layout, chunk),
            Collective::ReduceScatter { recvcount } => {
                schedule::reduce_scatter(ring, recvcount, layout, chunk)
            }
            Collective::AllGather { sendcount } => {
                schedule::all_gather(ring, sendcount, layout, chunk)
            }
            Collective::Broadcast { count, root } => {
                schedule::broadcast(ring, count, root, layout, chunk)
            }
            Collective::Reduce { count, root } => {
                schedule::reduce(ring, count, root, layout, chunk)
            }
            Collective::AllToAll { count_per_peer } => {
                schedule::all_to_all(ring, count_per_peer, layout, chunk)
            }
            Collective::Gather { sendcount, root } => {
                schedule::gather(ring, sendcount, root, layout, chunk)
            }
            Collective::Scatter { recvcount, root } => {
                schedule::scatter(ring, recvcount, root, layout, chunk)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_accessors() {
        let all = [
            Collective::AllReduce { count: 3 },
            Collective::ReduceScatter { recvcount: 3 },
            Collective::AllGather { sendcount: 3 },
            Collective::Broadcast { count: 3, root: 1 },
            Collective::Reduce { count: 3, root: 1 },
            Collective::AllToAll { count_per_peer: 3 },
            Collective::Gather {
                sendcount: 3,
                root: 1,
            },
            Collective::Scatter {
                recvcount: 3,
                root: 1,
            },
        ];
        let mut names: Vec<_> = all.iter().map(|c| c.name()).collect();
        names.dedup();
        assert_eq!(names.len(), 8);
        for c in all {
            assert_eq!(c.count(), 3);
            let (s, r) = c.needs(1, 4);
            // Every collective uses a buffer on every rank, and the largest need is max_elems.
            assert!(s.used() || r.used(), "{c:?}");
            let biggest = (0..4).flat_map(|k| {
                let (s, r) = c.needs(k, 4);
                [s.elems(), r.elems()]
            });
            assert_eq!(biggest.max(), c.max_elems(4), "{c:?}");
            assert_eq!(
                c.root().is_some(),
                matches!(
                    c,
                    Collective::Broadcast { .. }
                        | Collective::Reduce { .. }
                        | Collective::Gather { .. }
                        | Collective::Scatter { .. }
                )
            );
        }
        assert_eq!(
            Collective::AllToAll {
                count_per_peer: usize::MAX
            }
            .max_elems(2),
            None
        );
        // One kind per collective, in CollectiveKind's order.
        let kinds: Vec<_> = all.iter().map(|c| c.kind()).collect();
        assert_eq!(kinds, CollectiveKind::ALL[..8].to_vec());
    }
}
