//! What ringccl-perf adds to [`CollectiveKind`]: the collectives it measures, their buffer
//! shapes for a given size (as nccl-tests defines them) and their bus-bandwidth factors
//! (nccl-tests' PERFORMANCE.md). Names, parsing and the op/root/in-place properties are the
//! library's ([`CollectiveKind`]).

use ringccl::CollectiveKind;

/// The collectives ringccl-perf measures, in the order `-t all` runs them.
pub const MEASURED: [CollectiveKind; 7] = [
    CollectiveKind::AllReduce,
    CollectiveKind::AllGather,
    CollectiveKind::ReduceScatter,
    CollectiveKind::Broadcast,
    CollectiveKind::Reduce,
    CollectiveKind::AllToAll,
    CollectiveKind::SendRecv,
];

/// Whether ringccl-perf measures `kind`.
pub fn is_measured(kind: CollectiveKind) -> bool {
    MEASURED.contains(&kind)
}

/// Parses a collective name (any spelling [`CollectiveKind`] accepts: `all_reduce`,
/// `allreduce`, `all-reduce`, `bcast`, ...) that ringccl-perf measures.
pub fn parse(s: &str) -> Result<CollectiveKind, String> {
    let kind: CollectiveKind = s.trim().parse().map_err(|e| format!("{e}"))?;
    if is_measured(kind) {
        Ok(kind)
    } else {
        let names: Vec<&str> = MEASURED.iter().map(|k| k.name()).collect();
        Err(format!(
            "ringccl-perf does not measure {kind} (it measures {})",
            names.join(", ")
        ))
    }
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

/// busbw = algbw × this factor, for `n` ranks (nccl-tests' PERFORMANCE.md; gather, scatter
/// and send/recv as nccl-tests' own tests of them: send/recv is a ring shift, every rank
/// sending its buffer to the next rank and receiving the previous rank's).
pub fn busbw_factor(kind: CollectiveKind, n: usize) -> f64 {
    use CollectiveKind as K;
    let n = n.max(1) as f64;
    match kind {
        K::AllReduce => 2.0 * (n - 1.0) / n,
        K::AllGather | K::ReduceScatter | K::AllToAll | K::Gather | K::Scatter => (n - 1.0) / n,
        K::Broadcast | K::Reduce | K::SendRecv => 1.0,
    }
}

/// The shape of a measurement of `bytes` bytes (the size column) with elements of `elt`
/// bytes over `n` ranks. As in nccl-tests, the per-rank block of all-gather, reduce-scatter
/// and all-to-all is rounded down to a multiple of 16 bytes (so the size can shrink, to 0
/// for tiny sizes).
pub fn shape(kind: CollectiveKind, bytes: usize, elt: usize, n: usize) -> Shape {
    use CollectiveKind as K;
    let elt = elt.max(1);
    let n = n.max(1);
    let total = bytes / elt;
    let align = (16 / elt).max(1);
    let block = (total / n) / align * align;
    let (count, send, recv) = match kind {
        K::AllReduce | K::Broadcast | K::Reduce | K::SendRecv => (total, total, total),
        K::AllGather | K::Gather => (block, block, block * n),
        K::ReduceScatter | K::Scatter => (block, block * n, block),
        K::AllToAll => (block, block * n, block * n),
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

#[cfg(test)]
mod tests {
    use super::*;
    use CollectiveKind as K;

    #[test]
    fn measured_subset_and_names() {
        // `-t all` order.
        let names: Vec<&str> = MEASURED.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "all_reduce",
                "all_gather",
                "reduce_scatter",
                "broadcast",
                "reduce",
                "all_to_all",
                "send_recv"
            ]
        );
        for k in MEASURED {
            assert_eq!(parse(k.name()), Ok(k));
        }
        assert_eq!(parse("AllReduce"), Ok(K::AllReduce));
        assert_eq!(parse("all-to-all"), Ok(K::AllToAll));
        assert_eq!(parse("bcast"), Ok(K::Broadcast));
        assert!(parse("gatherall")
            .unwrap_err()
            .contains("unknown collective"));
        for k in [K::Gather, K::Scatter] {
            let e = parse(k.name()).unwrap_err();
            assert!(
                e.contains("does not measure") && e.contains("send_recv"),
                "{e}"
            );
        }
    }

    #[test]
    fn busbw_factors_match_nccl_tests() {
        let n = 8;
        assert_eq!(busbw_factor(K::AllReduce, n), 2.0 * 7.0 / 8.0);
        assert_eq!(busbw_factor(K::ReduceScatter, n), 7.0 / 8.0);
        assert_eq!(busbw_factor(K::AllGather, n), 7.0 / 8.0);
        assert_eq!(busbw_factor(K::AllToAll, n), 7.0 / 8.0);
        assert_eq!(busbw_factor(K::Broadcast, n), 1.0);
        assert_eq!(busbw_factor(K::Reduce, n), 1.0);
        assert_eq!(busbw_factor(K::AllReduce, 2), 1.0);
        assert_eq!(busbw_factor(K::AllReduce, 1), 0.0);
    }

    #[test]
    fn shapes_follow_nccl_tests() {
        // all-reduce: the whole size per rank.
        let s = shape(K::AllReduce, 1 << 20, 4, 8);
        assert_eq!(
            (s.count, s.send, s.recv, s.bytes),
            (1 << 18, 1 << 18, 1 << 18, 1 << 20)
        );
        // all-gather: the size is the total receive buffer.
        let s = shape(K::AllGather, 1 << 20, 4, 8);
        assert_eq!(
            (s.count, s.send, s.recv, s.bytes),
            (1 << 15, 1 << 15, 1 << 18, 1 << 20)
        );
        // reduce-scatter: the size is the send buffer.
        let s = shape(K::ReduceScatter, 1 << 20, 2, 4);
        assert_eq!(
            (s.count, s.send, s.recv, s.bytes),
            (1 << 17, 1 << 19, 1 << 17, 1 << 20)
        );
        let s = shape(K::AllToAll, 4096, 8, 2);
        assert_eq!((s.count, s.send, s.recv, s.bytes), (256, 512, 512, 4096));
        // Per-rank blocks round down to 16 bytes.
        let s = shape(K::AllGather, 100, 4, 2);
        assert_eq!((s.count, s.bytes, s.elems), (12, 96, 24));
        let s = shape(K::AllGather, 8, 4, 8);
        assert_eq!((s.count, s.bytes), (0, 0));
        // Odd sizes: whole elements only.
        let s = shape(K::Broadcast, 10, 4, 3);
        assert_eq!((s.count, s.bytes), (2, 8));
    }
}
