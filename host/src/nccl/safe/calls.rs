//! The calls of a [`Comm`]: `send`, `recv` and the collectives, each checked and handed to
//! [`Comm::call`].

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::{to_rank, Buffers, Comm, NcclType, ReduceOp};
use crate::nccl::ops::OpKind;
use crate::nccl::result::{NcclError, NcclStatus};
use crate::Arg;

impl Comm {
    /// Sends `data` (all of it) to rank `peer` (`ncclSend`).
    pub fn send<S: DevicePtr<T>, T: NcclType>(&self, data: &S, peer: i32) -> Result<(), NcclError> {
        let peer = to_rank(peer, self.world_size, Arg::Peer, "peer")?;
        self.call(
            OpKind::Send {
                peer,
                count: data.len(),
            },
            Buffers::SendOnly(data),
        )?;
        Ok(())
    }

    /// Receives `buff.len()` elements from rank `peer` into `buff` (`ncclRecv`).
    pub fn recv<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        buff: &mut R,
        peer: i32,
    ) -> Result<NcclStatus, NcclError> {
        let peer = to_rank(peer, self.world_size, Arg::Peer, "peer")?;
        let count = buff.len();
        self.call(OpKind::Recv { peer, count }, Buffers::RecvOnly(buff))
    }

    /// Broadcast (`ncclBroadcast`): every rank's `recvbuff` gets the root's `sendbuff`
    /// (`recvbuff.len()` elements). `sendbuff` is ignored on the other ranks and must be
    /// `Some` on the root (`ncclInvalidArgument` otherwise).
    pub fn broadcast<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: Option<&S>,
        recvbuff: &mut R,
        root: i32,
    ) -> Result<NcclStatus, NcclError> {
        let root = to_rank(root, self.world_size, Arg::Root, "root")?;
        let count = recvbuff.len();
        let bufs = match (self.rank == root, sendbuff) {
            (true, Some(s)) => Buffers::Out(s, recvbuff),
            (true, None) => {
                return Err(NcclError::invalid(
                    Some(self.rank),
                    Arg::Send,
                    "the root of a broadcast needs a send buffer".into(),
                ))
            }
            (false, _) => Buffers::RecvOnly(recvbuff),
        };
        self.call(OpKind::Broadcast { count, root }, bufs)
    }

    /// In-place [`Comm::broadcast`].
    pub fn broadcast_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        recvbuff: &mut R,
        root: i32,
    ) -> Result<NcclStatus, NcclError> {
        let root = to_rank(root, self.world_size, Arg::Root, "root")?;
        let count = recvbuff.len();
        self.call(
            OpKind::Broadcast { count, root },
            Buffers::InPlace(recvbuff),
        )
    }

    /// All-gather (`ncclAllGather`): `recvbuff` (`world_size * sendbuff.len()` elements) gets
    /// every rank's `sendbuff` in rank order.
    pub fn all_gather<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<NcclStatus, NcclError> {
        let sendcount = sendbuff.len();
        self.call(
            OpKind::AllGather { sendcount },
            Buffers::Out(sendbuff, recvbuff),
        )
    }

    /// All-reduce (`ncclAllReduce`) of `sendbuff.len()` elements into `recvbuff`.
    pub fn all_reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<NcclStatus, NcclError> {
        let kind = OpKind::AllReduce {
            count: sendbuff.len(),
            op: reduce_op.into(),
        };
        self.call(kind, Buffers::Out(sendbuff, recvbuff))
    }

    /// In-place [`Comm::all_reduce`].
    pub fn all_reduce_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        buff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<NcclStatus, NcclError> {
        let kind = OpKind::AllReduce {
            count: buff.len(),
            op: reduce_op.into(),
        };
        self.call(kind, Buffers::InPlace(buff))
    }

    /// Reduce (`ncclReduce`): the root's `recvbuff` gets the reduction of every rank's
    /// `sendbuff`. `recvbuff` is ignored on the other ranks and must be `Some` on the root.
    pub fn reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: Option<&mut R>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<NcclStatus, NcclError> {
        let root = to_rank(root, self.world_size, Arg::Root, "root")?;
        let kind = OpKind::Reduce {
            count: sendbuff.len(),
            op: reduce_op.into(),
            root,
        };
        let bufs = match (self.rank == root, recvbuff) {
            (true, Some(r)) => Buffers::Out(sendbuff, r),
            (true, None) => {
                return Err(NcclError::invalid(
                    Some(self.rank),
                    Arg::Recv,
                    "the root of a reduce needs a receive buffer".into(),
                ))
            }
            (false, _) => Buffers::SendOnly(sendbuff),
        };
        self.call(kind, bufs)
    }

    /// In-place [`Comm::reduce`].
    pub fn reduce_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<NcclStatus, NcclError> {
        let root = to_rank(root, self.world_size, Arg::Root, "root")?;
        let kind = OpKind::Reduce {
            count: recvbuff.len(),
            op: reduce_op.into(),
            root,
        };
        self.call(kind, Buffers::InPlace(recvbuff))
    }

    /// Reduce-scatter (`ncclReduceScatter`): `recvbuff` (`recvbuff.len()` elements) gets this
    /// rank's block of the reduction of every rank's `sendbuff` (`world_size` blocks).
    pub fn reduce_scatter<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<NcclStatus, NcclError> {
        let kind = OpKind::ReduceScatter {
            recvcount: recvbuff.len(),
            op: reduce_op.into(),
        };
        self.call(kind, Buffers::Out(sendbuff, recvbuff))
    }
}
