//! One rank's call as plain data ([`Op`]), how the calls of the ranks are matched, and how they
//! are issued through [`Communicator`]'s public API.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::{bf16, f16};

use super::result::NcclError;
use crate::{
    Arg, Communicator, DataType, DeviceElement, DeviceSlice, DeviceSliceMut, Io, PeerOp, RawBuf,
    RedOp,
};

/// What a call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// `ncclAllReduce`
    AllReduce { count: usize, op: RedOp },
    /// `ncclAllGather`
    AllGather { sendcount: usize },
    /// `ncclReduceScatter`
    ReduceScatter { recvcount: usize, op: RedOp },
    /// `ncclBroadcast`
    Broadcast { count: usize, root: usize },
    /// `ncclReduce`
    Reduce {
        count: usize,
        op: RedOp,
        root: usize,
    },
    /// `ncclSend`
    Send { peer: usize, count: usize },
    /// `ncclRecv`
    Recv { peer: usize, count: usize },
}

impl OpKind {
    /// Whether it is one side of a point-to-point transfer.
    pub fn is_p2p(self) -> bool {
        matches!(self, OpKind::Send { .. } | OpKind::Recv { .. })
    }
}

/// The buffers of one rank's call, as [`Io`] names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bufs {
    /// One buffer, input and output.
    InPlace(RawBuf),
    /// Input, output.
    OutOfPlace(RawBuf, RawBuf),
    /// Input only.
    SendOnly(RawBuf),
    /// Output only.
    RecvOnly(RawBuf),
}

/// One rank's call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// The rank that made it.
    pub rank: usize,
    pub kind: OpKind,
    pub dtype: DataType,
    pub bufs: Bufs,
}

/// Checks that the ranks' calls (one each, in rank order) are the same collective: every rank
/// of a collective must make the same call (kind, type, count, op, root), as in NCCL. A
/// mismatch is an `ncclInvalidUsage` naming both calls.
pub fn same_collective(calls: &[&Op]) -> Result<(), NcclError> {
    let Some(first) = calls.first() else {
        return Ok(());
    };
    for c in &calls[1..] {
        if (c.kind, c.dtype) != (first.kind, first.dtype) {
            return Err(NcclError::usage(format!(
                "the ranks of one communicator made different collective calls: rank {} \
                 {:?} of {}, rank {} {:?} of {} (every rank must make the same calls in the \
                 same order)",
                first.rank,
                first.kind,
                first.dtype.name(),
                c.rank,
                c.kind,
                c.dtype.name()
            )));
        }
    }
    Ok(())
}

/// Finds, among point-to-point calls (in call order), the pairs to issue: the `k`-th send from
/// `a` to `b` with the `k`-th receive on `b` from `a`. Returns the pairs as indices into
/// `ops` (send, receive), in the order the later of the two was called. A pair whose counts or
/// types differ is an `ncclInvalidArgument`.
pub fn match_p2p(ops: &[Op]) -> Result<Vec<(usize, usize)>, NcclError> {
    let mut used = vec![false; ops.len()];
    let mut pairs = Vec::new();
    for j in 0..ops.len() {
        if used[j] {
            continue;
        }
        let partner = |i: usize| -> bool {
            let (a, b) = (&ops[i], &ops[j]);
            match (a.kind, b.kind) {
                (OpKind::Send { peer, .. }, OpKind::Recv { peer: from, .. }) => {
                    peer == b.rank && from == a.rank
                }
                (OpKind::Recv { peer: from, .. }, OpKind::Send { peer, .. }) => {
                    peer == a.rank && from == b.rank
                }
                _ => false,
            }
        };
        if let Some(i) = (0..j).find(|&i| !used[i] && partner(i)) {
            let (s, r) = if matches!(ops[i].kind, OpKind::Send { .. }) {
                (i, j)
            } else {
                (j, i)
            };
            let (OpKind::Send { count: sc, .. }, OpKind::Recv { count: rc, .. }) =
                (ops[s].kind, ops[r].kind)
            else {
                continue;
            };
            if sc != rc || ops[s].dtype != ops[r].dtype {
                return Err(NcclError::invalid(
                    Some(ops[r].rank),
                    Arg::Count,
                    format!(
                        "rank {} sends {sc} {} to rank {}, which receives {rc} {} from it",
                        ops[s].rank,
                        ops[s].dtype.name(),
                        ops[r].rank,
                        ops[r].dtype.name()
                    ),
                ));
            }
            used[i] = true;
            used[j] = true;
            pairs.push((s, r));
        }
    }
    Ok(pairs)
}

/// A buffer the [`super::Comm`] keeps valid and ordered itself: for a call issued at once, by
/// the caller's borrow and cudarc's event records around it; for a queued call, by the gate
/// (see [`super::gate`]) that holds back every later tracked use of the buffer until the
/// call's work has run.
struct Raw<T> {
    buf: RawBuf,
    _t: PhantomData<fn() -> T>,
}

impl<T> Raw<T> {
    fn new(buf: RawBuf) -> Self {
        Raw {
            buf,
            _t: PhantomData,
        }
    }
}

// SAFETY: see the type's docs: the `Comm` holds the memory valid and its other tracked uses
// ordered after the call (no tracking here: the `Comm` did it on the call's streams).
unsafe impl<T> DeviceSlice<T> for Raw<T> {
    fn raw(&self) -> RawBuf {
        self.buf
    }
}

// SAFETY: as above.
unsafe impl<T> DeviceSliceMut<T> for Raw<T> {}

/// Calls `$f::<T>($args)` for the element type of `$dtype`.
macro_rules! with_type {
    ($dtype:expr, $f:ident($($args:expr),*)) => {
        match $dtype {
            DataType::F32 => $f::<f32>($($args),*),
            DataType::F64 => $f::<f64>($($args),*),
            DataType::F16 => $f::<f16>($($args),*),
            DataType::BF16 => $f::<bf16>($($args),*),
            DataType::I8 => $f::<i8>($($args),*),
            DataType::U8 => $f::<u8>($($args),*),
            DataType::I32 => $f::<i32>($($args),*),
            DataType::U32 => $f::<u32>($($args),*),
            DataType::I64 => $f::<i64>($($args),*),
            DataType::U64 => $f::<u64>($($args),*),
            DataType::F8E4M3 => $f::<crate::dtype::F8E4M3>($($args),*),
            DataType::F8E5M2 => $f::<crate::dtype::F8E5M2>($($args),*),
        }
    };
}

/// Issues one collective: `calls[i]` is the call of `comm.local_ranks()[i]`, `streams[i]` its
/// stream.
pub fn issue_collective(
    comm: &Communicator,
    calls: &[&Op],
    streams: &[Arc<CudaStream>],
) -> crate::Result<()> {
    let Some(first) = calls.first() else {
        return Ok(());
    };
    with_type!(first.dtype, collective_t(comm, calls, streams))
}

fn collective_t<T: DeviceElement>(
    comm: &Communicator,
    calls: &[&Op],
    streams: &[Arc<CudaStream>],
) -> crate::Result<()> {
    let mut store: Vec<[Raw<T>; 2]> = calls
        .iter()
        .map(|c| match c.bufs {
            Bufs::InPlace(b) | Bufs::SendOnly(b) | Bufs::RecvOnly(b) => [Raw::new(b), Raw::new(b)],
            Bufs::OutOfPlace(s, r) => [Raw::new(s), Raw::new(r)],
        })
        .collect();
    let mut io: Vec<Io<'_, T>> = store
        .iter_mut()
        .zip(calls)
        .map(|(pair, c)| {
            let (a, b) = pair.split_at_mut(1);
            match c.bufs {
                Bufs::InPlace(_) => Io::in_place(&mut a[0]),
                Bufs::OutOfPlace(..) => Io::out_of_place(&a[0], &mut b[0]),
                Bufs::SendOnly(_) => Io::send_only(&a[0]),
                Bufs::RecvOnly(_) => Io::recv_only(&mut a[0]),
            }
        })
        .collect();
    match calls[0].kind {
        OpKind::AllReduce { count, op } => comm.all_reduce(&mut io, count, op, streams),
        OpKind::AllGather { sendcount } => comm.all_gather(&mut io, sendcount, streams),
        OpKind::ReduceScatter { recvcount, op } => {
            comm.reduce_scatter(&mut io, recvcount, op, streams)
        }
        OpKind::Broadcast { count, root } => comm.broadcast(&mut io, count, root, streams),
        OpKind::Reduce { count, op, root } => comm.reduce(&mut io, count, op, root, streams),
        OpKind::Send { .. } | OpKind::Recv { .. } => Err(crate::Error::Internal {
            reason: "a point-to-point call was issued as a collective".into(),
        }),
    }
}

/// Issues point-to-point calls (all of one element type) as one [`Communicator::peer_ops`]
/// group; `streams` as for [`Communicator::peer_ops`].
pub fn issue_p2p(
    comm: &Communicator,
    ops: &[&Op],
    streams: &[Arc<CudaStream>],
) -> crate::Result<()> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    if let Some(o) = ops.iter().find(|o| o.dtype != first.dtype) {
        return Err(crate::Error::InvalidArgument {
            rank: Some(o.rank),
            arg: Arg::Send,
            reason: format!(
                "a group mixes point-to-point calls of {} and {}: ringccl issues a group's \
                 transfers of one element type only",
                first.dtype.name(),
                o.dtype.name()
            ),
        });
    }
    with_type!(first.dtype, p2p_t(comm, ops, streams))
}

fn p2p_t<T: DeviceElement>(
    comm: &Communicator,
    ops: &[&Op],
    streams: &[Arc<CudaStream>],
) -> crate::Result<()> {
    let mut store: Vec<Raw<T>> = ops
        .iter()
        .map(|o| match o.bufs {
            Bufs::InPlace(b) | Bufs::SendOnly(b) | Bufs::RecvOnly(b) | Bufs::OutOfPlace(b, _) => {
                Raw::new(b)
            }
        })
        .collect();
    let mut peer_ops: Vec<PeerOp<'_, T>> = store
        .iter_mut()
        .zip(ops)
        .map(|(b, o)| match o.kind {
            OpKind::Send { peer, count } => PeerOp::send(o.rank, peer, &*b, count),
            OpKind::Recv { peer, count } => PeerOp::recv(o.rank, peer, b, count),
            // Never built: only sends and receives reach here (a zero-byte receive from
            // itself stands in, and fails validation if it ever did).
            _ => PeerOp::recv(o.rank, o.rank, b, 0),
        })
        .collect();
    comm.peer_ops(&mut peer_ops, streams)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(rank: usize, kind: OpKind) -> Op {
        let b = RawBuf::new(0x1000 * (rank as u64 + 1), 16, rank);
        Op {
            rank,
            kind,
            dtype: DataType::F32,
            bufs: Bufs::InPlace(b),
        }
    }

    #[test]
    fn collectives_match_only_when_every_field_agrees() {
        let a = op(
            0,
            OpKind::AllReduce {
                count: 16,
                op: RedOp::Sum,
            },
        );
        let b = op(
            1,
            OpKind::AllReduce {
                count: 16,
                op: RedOp::Sum,
            },
        );
        assert!(same_collective(&[&a, &b]).is_ok());
        assert!(same_collective(&[]).is_ok());
        for other in [
            OpKind::AllReduce {
                count: 8,
                op: RedOp::Sum,
            },
            OpKind::AllReduce {
                count: 16,
                op: RedOp::Max,
            },
            OpKind::Broadcast { count: 16, root: 0 },
        ] {
            let e = same_collective(&[&a, &op(1, other)]).unwrap_err();
            assert_eq!(e.0, super::super::result::ncclResult_t::ncclInvalidUsage);
            assert!(e.to_string().contains("rank 1"), "{e}");
        }
        let mut c = b;
        c.dtype = DataType::BF16;
        assert!(same_collective(&[&a, &c])
            .unwrap_err()
            .to_string()
            .contains("bf16"));
    }

    #[test]
    fn sends_pair_with_receives_in_order() {
        let ops = [
            op(0, OpKind::Send { peer: 1, count: 4 }),
            op(0, OpKind::Recv { peer: 1, count: 8 }),
            op(1, OpKind::Send { peer: 0, count: 8 }),
            op(1, OpKind::Recv { peer: 0, count: 4 }),
            op(2, OpKind::Send { peer: 0, count: 1 }),
        ];
        // Rank 2's send has no receive yet: left for later.
        assert_eq!(match_p2p(&ops).unwrap(), vec![(2, 1), (0, 3)]);
        // A send to oneself pairs with the receive from oneself.
        let me = [
            op(1, OpKind::Recv { peer: 1, count: 2 }),
            op(1, OpKind::Send { peer: 1, count: 2 }),
        ];
        assert_eq!(match_p2p(&me).unwrap(), vec![(1, 0)]);
    }

    #[test]
    fn a_pair_of_different_sizes_is_rejected() {
        let ops = [
            op(0, OpKind::Send { peer: 1, count: 4 }),
            op(1, OpKind::Recv { peer: 0, count: 5 }),
        ];
        let e = match_p2p(&ops).unwrap_err();
        assert_eq!(e.0, super::super::result::ncclResult_t::ncclInvalidArgument);
        assert!(e.to_string().contains("sends 4"), "{e}");
    }

    #[test]
    fn only_transfers_are_p2p() {
        assert!(OpKind::Send { peer: 0, count: 1 }.is_p2p());
        assert!(OpKind::Recv { peer: 0, count: 1 }.is_p2p());
        assert!(!OpKind::AllGather { sendcount: 1 }.is_p2p());
    }
}
