//! The collectives ringccl-perf measures, their buffer shapes for a given size (as nccl-tests
//! defines them) and their bus-bandwidth factors (nccl-tests' PERFORMANCE.md).

/// A collective as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
}

/// Buffer shape of one measurement: element counts per rank, and the size reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The count argument of the call (elements; per peer for all-to-all, per rank for
    /// all-gather and reduce-scatter).
    pub count: usize,
    /// Elements of each rank's send buffer (root's only for broadcast).
    pub send: usize,
    /// Elements of each rank's receive buffer (root's only for reduce).
    pub recv: usize,
    /// The size column: the larger of the two buffers, in bytes.
    pub bytes: usize,
    /// The count column: `bytes / element size`.
    pub elems: usize,
}

impl Coll {
    /// Every collective, in the order `-t all` runs them.
    pub const ALL: [Coll; 6] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
    ];

    /// The name used on the command line and in the outputs.
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "all_to_all",
        }
    }

    /// Parses a collective name (`all_reduce`, `allreduce`, `all-reduce`, ...).
    pub fn parse(s: &str) -> Option<Coll> {
        let k: String = s
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect::<String>()
            .to_ascii_lowercase();
        Some(match k.as_str() {
            "allreduce" => Coll::AllReduce,
            "allgather" => Coll::AllGather,
            "reducescatter" => Coll::ReduceScatter,
            "broadcast" | "bcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "alltoall" => Coll::AllToAll,
            _ => return None,
        })
    }

    /// Whether the collective reduces (takes a reduction operator).
    pub fn has_op(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether the collective has a root.
    pub fn has_root(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// Whether an in-place variant exists (ringccl, like a correct NCCL call, has no in-place
    /// all-to-all).
    pub fn has_in_place(self) -> bool {
        !matches!(self, Coll::AllToAll)
    }

    /// busbw = algbw × this factor, for `n` ranks (nccl-tests' PERFORMANCE.md).
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce => 1.0,
        }
    }

    /// The shape of a measurement of `bytes` bytes (the size column) with elements of `elt`
    /// bytes over `n` ranks. As in nccl-tests, the per-rank block of all-gather, reduce-scatter
    /// and all-to-all is rounded down to a multiple of 16 bytes (so the size can shrink, to 0
    /// for tiny sizes).
    pub fn shape(self, bytes: usize, elt: usize, n: usize) -> Shape {
        let elt = elt.max(1);
        let n = n.max(1);
        let total = bytes / elt;
        let align = (16 / elt).max(1);
        let block = (total / n) / align * align;
        let (count, send, recv) = match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce => (total, total, total),
            Coll::AllGather => (block, block, block * n),
            Coll::ReduceScatter => (block, block * n, block),
            Coll::AllToAll => (block, block * n, block * n),
        };
        let elems = send.max(recv);
        Shape {
            count,
            send,
            recv,
            bytes: elems * elt,
            elems,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases() {
        for c in Coll::ALL {
            assert_eq!(Coll::parse(c.name()), Some(c));
        }
        assert_eq!(Coll::parse("AllReduce"), Some(Coll::AllReduce));
        assert_eq!(Coll::parse("all-to-all"), Some(Coll::AllToAll));
        assert_eq!(Coll::parse("bcast"), Some(Coll::Broadcast));
        assert_eq!(Coll::parse("gatherall"), None);
    }

    #[test]
    fn busbw_factors_match_nccl_tests() {
        let n = 8;
        assert_eq!(Coll::AllReduce.busbw_factor(n), 2.0 * 7.0 / 8.0);
        assert_eq!(Coll::ReduceScatter.busbw_factor(n), 7.0 / 8.0);
        assert_eq!(Coll::AllGather.busbw_factor(n), 7.0 / 8.0);
        assert_eq!(Coll::AllToAll.busbw_factor(n), 7.0 / 8.0);
        assert_eq!(Coll::Broadcast.busbw_factor(n), 1.0);
        assert_eq!(Coll::Reduce.busbw_factor(n), 1.0);
        assert_eq!(Coll::AllReduce.busbw_factor(2), 1.0);
        assert_eq!(Coll::AllReduce.busbw_factor(1), 0.0);
    }

    #[test]
    fn shapes_follow_nccl_tests() {
        // all-reduce: the whole size per rank.
        let s = Coll::AllReduce.shape(1 << 20, 4, 8);
        assert_eq!(
            (s.count, s.send, s.recv, s.bytes),
            (1 << 18, 1 << 18, 1 << 18, 1 << 20)
        );
        // all-gather: the size is the total receive buffer.
        let s = Coll::AllGather.shape(1 << 20, 4, 8);
        assert_eq!(
            (s.count, s.send, s.recv, s.bytes),
            (1 << 15, 1 << 15, 1 << 18, 1 << 20)
        );
        // reduce-scatter: the size is the send buffer.
        let s = Coll::ReduceScatter.shape(1 << 20, 2, 4);
        assert_eq!(
            (s.count, s.send, s.recv, s.bytes),
            (1 << 17, 1 << 19, 1 << 17, 1 << 20)
        );
        let s = Coll::AllToAll.shape(4096, 8, 2);
        assert_eq!((s.count, s.send, s.recv, s.bytes), (256, 512, 512, 4096));
        // Per-rank blocks round down to 16 bytes.
        let s = Coll::AllGather.shape(100, 4, 2);
        assert_eq!((s.count, s.bytes, s.elems), (12, 96, 24));
        let s = Coll::AllGather.shape(8, 4, 8);
        assert_eq!((s.count, s.bytes), (0, 0));
        // Odd sizes: whole elements only.
        let s = Coll::Broadcast.shape(10, 4, 3);
        assert_eq!((s.count, s.bytes), (2, 8));
    }
}
