//! One call of a collective on every local rank: ringccl's public API (and its point-to-point
//! groups for send/recv), or NCCL's on the same buffers and streams.

use std::sync::Arc;

use cudarc::driver::{CudaStream, CudaView, CudaViewMut};
use ringccl::{CollectiveKind, Io, PeerOp, RedOp};

use super::super::coll::Shape;
use super::super::data::PerfElem;
use super::bench::{Bench, Bufs};
use super::{not_measured, Lib};

/// Elements of the one in-place buffer, and the offset (elements) of rank `r`'s input in it.
pub(super) fn in_place_layout(kind: CollectiveKind, s: &Shape, r: usize) -> (usize, usize) {
    use CollectiveKind as K;
    match kind {
        K::AllReduce | K::Broadcast | K::Reduce | K::SendRecv => (s.count, 0),
        K::ReduceScatter | K::Scatter => (s.send, 0),
        K::AllGather | K::Gather => (s.recv, r * s.count),
        K::AllToAll => (s.recv, 0),
    }
}

/// The send and receive addresses NCCL gets for a rank with send buffer `a` and receive buffer
/// `b` (device addresses): the two buffers out of place; in place the one buffer `b`, with the
/// rank's input (reduce-scatter's output, all-gather's input) at `block` bytes into it, as
/// nccl-tests places them.
pub(super) fn nccl_ptrs(
    kind: CollectiveKind,
    inplace: bool,
    (a, b): (u64, u64),
    block: u64,
) -> (u64, u64) {
    if !inplace {
        return (a, b);
    }
    match kind {
        CollectiveKind::ReduceScatter => (b, b + block),
        CollectiveKind::AllGather => (b + block, b),
        _ => (b, b),
    }
}

impl Bench<'_> {
    /// Enqueues one call of the collective on every rank.
    pub(super) fn launch<T: PerfElem>(
        &self,
        lib: Lib,
        kind: CollectiveKind,
        shape: &Shape,
        op: Option<RedOp>,
        inplace: bool,
        bufs: &mut Bufs<T>,
    ) -> Result<(), String> {
        let op = op.unwrap_or(RedOp::Sum);
        let root = self.opts.root;
        match lib {
            Lib::Ringccl => {
                let streams = self.streams();
                if kind == CollectiveKind::SendRecv {
                    return self.ringccl_ring_shift(shape, bufs, &streams);
                }
                if inplace {
                    let len = in_place_layout(kind, shape, 0).0;
                    let mut views: Vec<CudaViewMut<'_, T>> =
                        bufs.b.iter_mut().map(|b| b.slice_mut(0..len)).collect();
                    let mut io: Vec<Io<'_, T>> = views.iter_mut().map(Io::in_place).collect();
                    self.ringccl_call(kind, &mut io, shape.count, op, &streams)
                } else {
                    let send: Vec<CudaView<'_, T>> =
                        bufs.a.iter().map(|a| a.slice(0..shape.send)).collect();
                    let mut recv: Vec<CudaViewMut<'_, T>> = bufs
                        .b
                        .iter_mut()
                        .map(|b| b.slice_mut(0..shape.recv))
                        .collect();
                    let mut io: Vec<Io<'_, T>> = send
                        .iter()
                        .zip(recv.iter_mut())
                        .zip(&self.local)
                        .map(|((s, d), &r)| match kind {
                            CollectiveKind::Broadcast if r != root => Io::recv_only(d),
                            CollectiveKind::Reduce if r != root => Io::send_only(s),
                            _ => Io::out_of_place(s, d),
                        })
                        .collect();
                    self.ringccl_call(kind, &mut io, shape.count, op, &streams)
                }
            }
            Lib::Nccl => {
                let Some(nccl) = self.nccl else {
                    return Err("NCCL is not loaded".into());
                };
                let elt = T::DTYPE.size() as u64;
                let (send, recv): (Vec<u64>, Vec<u64>) = self
                    .local
                    .iter()
                    .enumerate()
                    .map(|(i, &r)| {
                        let block = (r * shape.count) as u64 * elt;
                        nccl_ptrs(kind, inplace, (bufs.a_ptr[i], bufs.b_ptr[i]), block)
                    })
                    .unzip();
                let streams: Vec<&CudaStream> =
                    self.streams().into_iter().map(|s| s.as_ref()).collect();
                nccl.enqueue(
                    kind,
                    shape,
                    T::NCCL,
                    T::DTYPE.size(),
                    op,
                    root,
                    &send,
                    &recv,
                    &streams,
                )
                .map_err(|e| format!("NCCL: {e}"))
            }
        }
    }

    /// send/recv as nccl-tests' `sendrecv_perf`: every rank sends its buffer to the next rank
    /// and receives the previous rank's, in one group ([`ringccl::PeerOp`]s).
    fn ringccl_ring_shift<T: PerfElem>(
        &self,
        shape: &Shape,
        bufs: &mut Bufs<T>,
        streams: &[&Arc<CudaStream>],
    ) -> Result<(), String> {
        let (n, c) = (self.n, shape.count);
        let mut ops = Vec::with_capacity(2 * self.local.len());
        for ((a, b), &r) in bufs.a.iter().zip(bufs.b.iter_mut()).zip(&self.local) {
            ops.push(PeerOp::send(r, (r + 1) % n, a, c));
            ops.push(PeerOp::recv(r, (r + n - 1) % n, b, c));
        }
        self.comm
            .peer_ops(&mut ops, streams)
            .map_err(|e| e.to_string())
    }

    fn ringccl_call<T: PerfElem>(
        &self,
        kind: CollectiveKind,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        streams: &[&Arc<CudaStream>],
    ) -> Result<(), String> {
        let c = self.comm;
        let root = self.opts.root;
        use CollectiveKind as K;
        match kind {
            K::AllReduce => c.all_reduce(io, count, op, streams),
            K::ReduceScatter => c.reduce_scatter(io, count, op, streams),
            K::AllGather => c.all_gather(io, count, streams),
            K::Broadcast => c.broadcast(io, count, root, streams),
            K::Reduce => c.reduce(io, count, op, root, streams),
            K::AllToAll => c.all_to_all(io, count, streams),
            // send/recv goes through `ringccl_ring_shift`.
            K::Gather | K::Scatter | K::SendRecv => return Err(not_measured(kind)),
        }
        .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::coll;
    use super::*;

    #[test]
    fn in_place_buffers_hold_the_larger_side_and_each_ranks_block() {
        use CollectiveKind as K;
        let n = 4;
        let s = |k| coll::shape(k, 4096, 4, n);
        for r in 0..n {
            assert_eq!(
                in_place_layout(K::AllReduce, &s(K::AllReduce), r),
                (1024, 0)
            );
            assert_eq!(
                in_place_layout(K::Broadcast, &s(K::Broadcast), r),
                (1024, 0)
            );
            let rs = s(K::ReduceScatter);
            assert_eq!(in_place_layout(K::ReduceScatter, &rs, r), (rs.send, 0));
            assert_eq!(rs.send, n * rs.count);
            let ag = s(K::AllGather);
            assert_eq!(
                in_place_layout(K::AllGather, &ag, r),
                (ag.recv, r * ag.count)
            );
            let a2a = s(K::AllToAll);
            assert_eq!(in_place_layout(K::AllToAll, &a2a, r), (a2a.recv, 0));
        }
    }

    #[test]
    fn nccl_gets_nccl_tests_in_place_addresses() {
        use CollectiveKind as K;
        let (a, b) = (0x1000, 0x8000);
        for k in [
            K::AllReduce,
            K::ReduceScatter,
            K::AllGather,
            K::Broadcast,
            K::AllToAll,
        ] {
            assert_eq!(nccl_ptrs(k, false, (a, b), 64), (a, b), "{k}");
        }
        assert_eq!(nccl_ptrs(K::AllReduce, true, (a, b), 64), (b, b));
        assert_eq!(nccl_ptrs(K::Broadcast, true, (a, b), 64), (b, b));
        assert_eq!(nccl_ptrs(K::ReduceScatter, true, (a, b), 64), (b, b + 64));
        assert_eq!(nccl_ptrs(K::AllGather, true, (a, b), 64), (b + 64, b));
    }
}
