//! A group of calls started from a [`Comm`] ([`Comm::group`]), as cudarc's `Group`.

use cudarc::driver::{CudaView, CudaViewMut};

use super::{group_end, lock, Comm, NcclType, ReduceOp};
use crate::nccl::group;
use crate::nccl::result::{NcclError, NcclStatus};

impl Comm {
    /// Starts a group on this thread ([`group_start`](super::group_start)); it ends when the
    /// [`Group`] is dropped (or [`Group::end`]).
    pub fn group(&self) -> Group<'_> {
        group::start();
        Group {
            comm: self,
            ended: false,
        }
    }
}

/// A group started by [`Comm::group`], as cudarc's: its calls take views that outlive it;
/// the group ends ([`group_end`]) when it is dropped. An error there cannot be returned from
/// `drop`: it is logged and fails every later call of the communicator; [`Group::end`]
/// returns it instead.
///
/// ```no_run
/// use ringccl::cudarc::driver::CudaContext;
/// use ringccl::nccl::{Comm, Id};
/// let stream = CudaContext::new(0)?.default_stream();
/// let comm = Comm::from_rank(stream.clone(), 0, 1, Id::new().unwrap()).unwrap();
/// let a = stream.clone_htod(&[1u8; 16])?;
/// let mut b = stream.alloc_zeros::<u8>(16)?;
/// let (av, bv) = (a.slice(..), b.slice_mut(..));
/// let mut group = comm.group();
/// group.send(av, 0).unwrap();
/// group.recv(bv, 0).unwrap();
/// group.end().unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Group<'a> {
    comm: &'a Comm,
    ended: bool,
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if !self.ended {
            if let Err(e) = group::end() {
                log::error!(target: "ringccl", "ringccl::nccl: the end of a group failed: {e}");
                lock(&self.comm.shared.state).broken.get_or_insert(e);
            }
        }
    }
}

impl<'g> Group<'g> {
    /// The [`Comm`] the group was started from.
    pub fn comm(&self) -> &'g Comm {
        self.comm
    }

    /// Ends the group now ([`group_end`]), returning its error.
    pub fn end(mut self) -> Result<NcclStatus, NcclError> {
        self.ended = true;
        group_end()
    }

    /// [`Comm::send`] in the group.
    pub fn send<'s: 'g, T: NcclType>(
        &mut self,
        data: CudaView<'s, T>,
        peer: i32,
    ) -> Result<(), NcclError> {
        self.comm.send(&data, peer)
    }

    /// [`Comm::recv`] in the group.
    pub fn recv<'r: 'g, T: NcclType>(
        &mut self,
        mut buff: CudaViewMut<'r, T>,
        peer: i32,
    ) -> Result<NcclStatus, NcclError> {
        self.comm.recv(&mut buff, peer)
    }

    /// [`Comm::broadcast`] in the group.
    pub fn broadcast<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: Option<CudaView<'s, T>>,
        mut recvbuff: CudaViewMut<'r, T>,
        root: i32,
    ) -> Result<NcclStatus, NcclError> {
        self.comm.broadcast(sendbuff.as_ref(), &mut recvbuff, root)
    }

    /// [`Comm::broadcast_in_place`] in the group.
    pub fn broadcast_in_place<'r: 'g, T: NcclType>(
        &mut self,
        mut recvbuff: CudaViewMut<'r, T>,
        root: i32,
    ) -> Result<NcclStatus, NcclError> {
        self.comm.broadcast_in_place(&mut recvbuff, root)
    }

    /// [`Comm::all_gather`] in the group.
    pub fn all_gather<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        mut recvbuff: CudaViewMut<'r, T>,
    ) -> Result<NcclStatus, NcclError> {
        self.comm.all_gather(&sendbuff, &mut recvbuff)
    }

    /// [`Comm::all_reduce`] in the group.
    pub fn all_reduce<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        mut recvbuff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<NcclStatus, NcclError> {
        self.comm.all_reduce(&sendbuff, &mut recvbuff, reduce_op)
    }

    /// [`Comm::all_reduce_in_place`] in the group.
    pub fn all_reduce_in_place<'r: 'g, T: NcclType>(
        &mut self,
        mut buff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<NcclStatus, NcclError> {
        self.comm.all_reduce_in_place(&mut buff, reduce_op)
    }

    /// [`Comm::reduce`] in the group.
    pub fn reduce<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        recvbuff: Option<CudaViewMut<'r, T>>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<NcclStatus, NcclError> {
        let mut recvbuff = recvbuff;
        self.comm
            .reduce(&sendbuff, recvbuff.as_mut(), reduce_op, root)
    }

    /// [`Comm::reduce_in_place`] in the group.
    pub fn reduce_in_place<'s: 'g, T: NcclType>(
        &mut self,
        mut recvbuff: CudaViewMut<'s, T>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<NcclStatus, NcclError> {
        self.comm.reduce_in_place(&mut recvbuff, reduce_op, root)
    }

    /// [`Comm::reduce_scatter`] in the group.
    pub fn reduce_scatter<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        mut recvbuff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<NcclStatus, NcclError> {
        self.comm
            .reduce_scatter(&sendbuff, &mut recvbuff, reduce_op)
    }
}
