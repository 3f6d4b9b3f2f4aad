//! Point-to-point transfers named from one side, as in NCCL: each rank lists its own sends and
//! receives ([`PeerOp`]), and a group of them is enqueued together (like `ncclSend`/`ncclRecv`
//! between `ncclGroupStart` and `ncclGroupEnd`). The one API for both kinds of communicator:
//! * one process holding every rank: the sends are matched with the receives (the `k`-th send
//!   from rank `a` to rank `b` with the `k`-th receive on `b` from `a`, equal counts), then run as
//!   transfers in rounds (as [`Communicator::send_recv`] describes; `send_recv` itself checks
//!   its transfers and then makes this call with their sends and receives);
//! * one rank of a job of processes: this rank's operations, matched by its peers' own calls,
//!   run as ONE kernel per rank with device-side counters in communicators of up to 8 ranks
//!   on one machine ([`crate::plan::p2p_kernel`]; then it can be captured into a CUDA graph), else move
//!   through the peers' mapped scratch ([`crate::plan::p2p`], [`crate::exec::p2p`]).

use cudarc::driver::{CudaStream, SyncOnDrop};

use super::buffer::{DeviceSlice, DeviceSliceMut, RawBuf};
use super::collective::Need;
use super::send_recv::{validate_send_recv, P2pArgs};
use super::stream_devices;
use super::validate::{bytes, check_buf, check_common, Held};
use crate::comm::Communicator;
use crate::dtype::DeviceElement;
use crate::per_rank::PerOp;
use crate::plan::p2p::{self, Dir, P2pOp};
use crate::plan::p2p_kernel;
use crate::{exec, Arg, Error, Result};

/// The buffer of one side of a transfer.
enum Side<'a, T> {
    Send(&'a dyn DeviceSlice<T>),
    Recv(&'a mut dyn DeviceSliceMut<T>),
}

/// One rank's send or receive of a [`Communicator::peer_ops`] group: `count` elements from
/// `rank`'s buffer to `peer`, or from `peer` into `rank`'s buffer (`peer == rank`: a local copy,
/// matched with a receive from itself).
///
/// ```no_run
/// use ringccl::{Communicator, PeerOp};
/// // One rank of a job of processes (started by `ringccl-run -n 2` or torchrun).
/// let comm = Communicator::from_env()?;
/// let (me, n) = (comm.local_ranks()[0], comm.nranks());
/// let s = comm.stream(me);
/// let send = s.clone_htod(&vec![me as f32; 1024])?;
/// let mut recv = s.alloc_zeros::<f32>(1024)?;
/// // A ring shift: send to the next rank, receive from the previous one.
/// let mut ops = [
///     PeerOp::send(me, (me + 1) % n, &send, 1024),
///     PeerOp::recv(me, (me + n - 1) % n, &mut recv, 1024),
/// ];
/// comm.peer_ops(&mut ops, &[s])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PeerOp<'a, T> {
    rank: usize,
    peer: usize,
    count: usize,
    buf: RawBuf,
    side: Side<'a, T>,
}

impl<'a, T> PeerOp<'a, T> {
    /// Rank `rank` sends `count` elements of `buf` to rank `peer`.
    pub fn send<S: DeviceSlice<T> + 'a>(rank: usize, peer: usize, buf: &'a S, count: usize) -> Self {
        PeerOp {
            rank,
            peer,
            count,
            buf: buf.raw(),
            side: Side::Send(buf),
        }
    }

    /// Rank `rank` receives `count` elements from rank `peer` into `buf`.
    pub fn recv<R: DeviceSliceMut<T> + 'a>(
        rank: usize,
        peer: usize,
        buf: &'a mut R,
        count: usize,
    ) -> Self {
        PeerOp {
            rank,
            peer,
            count,
            buf: buf.raw(),
            side: Side::Recv(buf),
        }
    }

    /// The send and the receive of one validated [`super::SendRecv`] transfer `t`.
    pub(super) fn transfer(
        t: P2pArgs,
        send: &'a dyn DeviceSlice<T>,
        recv: &'a mut dyn DeviceSliceMut<T>,
    ) -> [Self; 2] {
        [
            PeerOp {
                rank: t.from,
                peer: t.to,
                count: t.count,
                buf: t.send,
                side: Side::Send(send),
            },
            PeerOp {
                rank: t.to,
                peer: t.from,
                count: t.count,
                buf: t.recv,
                side: Side::Recv(recv),
            },
        ]
    }

    /// The plain description validation works on.
    fn args(&self) -> OpArgs {
        OpArgs {
            dir: match self.side {
                Side::Send(_) => Dir::Send,
                Side::Recv(_) => Dir::Recv,
            },
            rank: self.rank,
            peer: self.peer,
            count: self.count,
            buf: self.buf,
        }
    }

    /// cudarc's event tracking of the buffer on `stream` (see [`super::buffer`]).
    fn track<'s>(&'s mut self, stream: &'s CudaStream) -> SyncOnDrop<'s> {
        match &mut self.side {
            Side::Send(b) => b.track_read(stream),
            Side::Recv(b) => b.track_write(stream),
        }
    }
}

impl<T> std::fmt::Debug for PeerOp<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PeerOp").field(&self.args()).finish()
    }
}

/// One operation as plain data (see [`PeerOp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpArgs {
    /// Send or receive.
    pub dir: Dir,
    /// The rank whose buffer it is.
    pub rank: usize,
    /// The rank on the other side.
    pub peer: usize,
    /// Elements.
    pub count: usize,
    /// The buffer.
    pub buf: RawBuf,
}

/// Checks a group of operations of the ranks `held` (with their `streams`' devices): ranks held
/// here, peers in range, buffers on the rank's device and long enough, and no receive buffer
/// overlapping another buffer of the group. Operations of 0 elements are checked for their
/// ranks only. Pure.
///
/// ```
/// use ringccl::internals::api::p2p::{validate_peer_ops, OpArgs};
/// use ringccl::internals::api::validate::Held;
/// use ringccl::internals::plan::p2p::Dir;
/// use ringccl::RawBuf;
/// let held = Held { nranks: 2, ranks: &[1], devices: &[1] };
/// let op = OpArgs { dir: Dir::Recv, rank: 1, peer: 0, count: 8, buf: RawBuf::new(0x1000, 8, 1) };
/// assert!(validate_peer_ops(&[op], &held, &[1], 4).is_ok());
/// let bad = OpArgs { peer: 2, ..op };
/// assert!(validate_peer_ops(&[bad], &held, &[1], 4).is_err());
/// ```
pub fn validate_peer_ops(
    ops: &[OpArgs],
    held: &Held<'_>,
    streams: &[usize],
    elem_size: usize,
) -> Result<()> {
    let name = "peer_ops";
    let max = ops.iter().map(|o| o.count).max().unwrap_or(0);
    check_common(name, held.ranks.len(), held, streams, Some(max), elem_size)?;
    for (i, o) in ops.iter().enumerate() {
        let Some(at) = held.ranks.iter().position(|&r| r == o.rank) else {
            return Err(Error::invalid(
                Some(o.rank),
                Arg::Ranks,
                format!(
                    "{name}: operation {i} is rank {}'s, which this communicator does not hold \
                     (it holds {:?})",
                    o.rank, held.ranks
                ),
            ));
        };
        if o.peer >= held.nranks {
            return Err(Error::invalid(
                Some(o.rank),
                Arg::Peer,
                format!(
                    "{name}: operation {i}: peer {} is out of range for {} ranks",
                    o.peer, held.nranks
                ),
            ));
        }
        if o.count == 0 {
            continue;
        }
        let arg = match o.dir {
            Dir::Send => Arg::Send,
            Dir::Recv => Arg::Recv,
        };
        check_buf(
            name,
            o.rank,
            arg,
            Some(o.buf),
            Need::Required(o.count),
            held.devices[at],
            elem_size,
        )?;
    }
    let extent = |o: &OpArgs| (o.buf.ptr, o.buf.ptr.saturating_add(bytes(o.count, elem_size)));
    let overlaps = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
    for (i, o) in ops.iter().enumerate() {
        if o.dir != Dir::Recv || o.count == 0 {
            continue;
        }
        for (j, q) in ops.iter().enumerate() {
            if i != j && q.count > 0 && overlaps(extent(o), extent(q)) {
                let what = if q.dir == Dir::Send { "send" } else { "receive" };
                return Err(Error::invalid(
                    Some(o.rank),
                    Arg::Recv,
                    format!(
                        "{name}: the receive buffer of operation {i} overlaps the {what} buffer \
                         of operation {j}"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Transfers and, per transfer, the indices of its send and its receive operation.
pub type Matched = (Vec<P2pArgs>, Vec<(usize, usize)>);

/// Pairs the sends of a group with its receives (the `k`-th send from `a` to `b` with the
/// `k`-th receive on `b` from `a`) into transfers; every operation must have its match with
/// the same count. Returns the transfers and, per transfer, the indices of its two operations.
/// Operations of 0 elements are left out on both sides.
///
/// ```
/// use ringccl::internals::api::p2p::{match_peer_ops, OpArgs};
/// use ringccl::internals::plan::p2p::Dir;
/// use ringccl::RawBuf;
/// let op = |dir, rank, peer| OpArgs { dir, rank, peer, count: 4, buf: RawBuf::new(0x1000, 4, rank) };
/// let (pairs, idx) = match_peer_ops(&[op(Dir::Recv, 1, 0), op(Dir::Send, 0, 1)])?;
/// assert_eq!((pairs[0].from, pairs[0].to, idx[0]), (0, 1, (1, 0)));
/// assert!(match_peer_ops(&[op(Dir::Send, 0, 1)]).is_err()); // no receive on rank 1
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn match_peer_ops(ops: &[OpArgs]) -> Result<Matched> {
    let name = "peer_ops";
    let live = |dir: Dir| {
        ops.iter()
            .enumerate()
            .filter(move |(_, o)| o.dir == dir && o.count > 0)
    };
    let mut taken = vec![false; ops.len()];
    let (mut pairs, mut idx) = (Vec::new(), Vec::new());
    for (i, s) in live(Dir::Send) {
        let m = live(Dir::Recv)
            .find(|(j, r)| !taken[*j] && r.rank == s.peer && r.peer == s.rank)
            .map(|(j, _)| j);
        let Some(j) = m else {
            return Err(Error::invalid(
                Some(s.rank),
                Arg::Peer,
                format!(
                    "{name}: operation {i}, a send from rank {} to rank {}, has no matching \
                     receive on rank {}",
                    s.rank, s.peer, s.peer
                ),
            ));
        };
        let r = ops[j];
        if r.count != s.count {
            return Err(Error::invalid(
                Some(r.rank),
                Arg::Count,
                format!(
                    "{name}: rank {} sends {} elements to rank {} (operation {i}) but the \
                     matching receive (operation {j}) is of {}",
                    s.rank, s.count, r.rank, r.count
                ),
            ));
        }
        taken[j] = true;
        pairs.push(P2pArgs {
            from: s.rank,
            to: r.rank,
            count: s.count,
            send: s.buf,
            recv: r.buf,
        });
        idx.push((i, j));
    }
    if let Some((j, r)) = live(Dir::Recv).find(|(j, _)| !taken[*j]) {
        return Err(Error::invalid(
            Some(r.rank),
            Arg::Peer,
            format!(
                "{name}: operation {j}, a receive on rank {} from rank {}, has no matching send",
                r.rank, r.peer
            ),
        ));
    }
    Ok((pairs, idx))
}

impl Communicator {
    /// A group of sends and receives, each named by the rank that does it (like `ncclSend` and
    /// `ncclRecv` between `ncclGroupStart` and `ncclGroupEnd`), enqueued together on the streams
    /// of the ranks held here (`streams[i]` for `local_ranks()[i]`). Operations of 0 elements
    /// are skipped; a receive buffer must not overlap any other buffer of the group.
    ///
    /// * A communicator of one process lists every rank's operations: each send must have its
    ///   receive (the `k`-th send from `a` to `b` matches the `k`-th receive on `b` from `a`)
    ///   with the same count, or the call fails before enqueuing anything.
    /// * A rank of a job of processes lists its own; its peers list theirs in their own calls.
    ///   The bytes sent from `a` to `b` in a group must add up to the bytes `b` receives from
    ///   `a` in its group (as in NCCL; a mismatch cannot be seen by one rank alone, and leaves
    ///   the ranks waiting for each other). The data moves in chunks through the receiver's
    ///   point-to-point buffer in one kernel per rank (communicators of up to 8 ranks on one
    ///   machine; such groups can also be captured into a CUDA graph, and use at most 64
    ///   buffers for their transfers with peers), or else through its scratch buffer, mapped
    ///   by the sender (eager only).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, PeerOp};
    /// let comm = Communicator::new(&[0, 1])?; // one process, two ranks
    /// let a = comm.stream(0).clone_htod(&[1.0f32; 256])?;
    /// let mut b = comm.stream(1).alloc_zeros::<f32>(256)?;
    /// let mut ops = [PeerOp::send(0, 1, &a, 256), PeerOp::recv(1, 0, &mut b, 256)];
    /// comm.peer_ops(&mut ops, comm.streams())?;
    /// comm.stream(1).synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer_ops<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        ops: &mut [PeerOp<'_, T>],
        streams: &[S],
    ) -> Result<()> {
        let size = T::DTYPE.size();
        let devices = self.devices();
        let args: PerOp<OpArgs> = ops.iter().map(PeerOp::args).collect();
        let held = Held {
            nranks: self.nranks(),
            ranks: self.local_ranks(),
            devices: &devices,
        };
        validate_peer_ops(&args, &held, &stream_devices(streams), size)?;
        self.health().check()?;
        let local = self.local_ranks();
        let bufs: PerOp<(usize, u64, Arg)> = args
            .iter()
            .filter(|o| o.count > 0)
            .filter_map(|o| {
                let i = local.iter().position(|&r| r == o.rank)?;
                let arg = if o.dir == Dir::Send { Arg::Send } else { Arg::Recv };
                Some((i, o.buf.ptr, arg))
            })
            .collect();
        super::validate::context::check_buffers(
            &super::validate::context::rank_contexts(self),
            &bufs,
            streams,
        )?;
        let Some(p) = self.process() else {
            // One process holds every rank: `local_ranks()` is `0..n`.
            let (pairs, idx) = match_peer_ops(&args)?;
            let rounds = validate_send_recv(&pairs, &devices, &stream_devices(streams), size)?;
            if rounds.is_empty() {
                return Ok(());
            }
            let mut used = vec![false; ops.len()];
            for &(i, j) in &idx {
                used[i] = true;
                used[j] = true;
            }
            return self.run_transfers::<T, S, _>(&pairs, &rounds, streams, |capturing| {
                ops.iter_mut()
                    .zip(&used)
                    .filter(|(_, &u)| u && !capturing)
                    .map(|(o, _)| {
                        let r = o.rank;
                        o.track(streams[r].as_ref())
                    })
                    .collect::<Vec<SyncOnDrop<'_>>>()
            });
        };
        // One rank of a job of processes.
        if self.config().check_calls {
            // Every rank of the job takes part (a rank outside the group sends nothing).
            let (mut sends, mut recvs) = (vec![0u64; p.nranks], vec![0u64; p.nranks]);
            for o in &args {
                let b = bytes(o.count, size);
                match o.dir {
                    Dir::Send => sends[o.peer] = sends[o.peer].saturating_add(b),
                    Dir::Recv => recvs[o.peer] = recvs[o.peer].saturating_add(b),
                }
            }
            let sig = super::check::CallSig::PeerOps {
                dtype: T::DTYPE.name().into(),
                sends,
                recvs,
            };
            super::check::compare(p.rank, &p.boot.all_gather(&sig.encode())?)?;
        }
        if args.iter().all(|o| o.count == 0) {
            return Ok(());
        }
        let capture = exec::capture(streams)?;
        let Some(stream) = streams.first() else {
            return Err(Error::Internal {
                reason: "no stream for this process's rank".into(),
            });
        };
        let pops: PerOp<P2pOp> = args
            .iter()
            .map(|o| P2pOp {
                dir: o.dir,
                peer: o.peer,
                bytes: o.count.saturating_mul(size), // checked by validate_peer_ops
            })
            .collect();
        let bufs: PerOp<u64> = args.iter().map(|o| o.buf.ptr).collect();
        let mut call = self.process_call(p);
        let me = self.resources(p.rank);
        // The one-kernel path (device-side counters): at most 8 ranks, every one over CUDA
        // IPC, the kernel loaded (`plan::p2p_kernel`). The choice depends on the communicator
        // alone, so that every rank makes the same one. On it, transfers above
        // `Config::p2p_kernel_max_bytes` (`p2p_kernel_max_bytes_registered` while posted) go
        // through the copy engines instead, eager only (both
        // sides of a transfer add up the same bytes: `split_large`). While the communicator
        // has a registered buffer (the same on every rank), the kernel's transfers above the
        // LL size are posted: a receive into a registered buffer is written by the sender
        // directly (zero-copy).
        let on_kernel = p.net.is_none() && me.kernels.has_p2p() && call.state.windows.p2p().len() == p.nranks;
        let posted = on_kernel && call.state.windows.registry_ref().has_live();
        let limit = if capture.is_some() {
            usize::MAX
        } else if posted {
            self.config().p2p_kernel_max_bytes_registered
        } else {
            self.config().p2p_kernel_max_bytes
        };
        let split = p2p_kernel::split_large(&pops, &bufs, p.rank, limit);
        let kernel = if on_kernel {
            let direct = if posted {
                exec::p2p::receive_targets(&mut call, &split.kernel, &split.kernel_bufs)
            } else {
                PerOp::new()
            };
            let env = p2p_kernel::KernelEnv {
                direct: &direct,
                ..exec::p2p::kernel_env(&call)
            };
            p2p_kernel::plan(&split.kernel, &split.kernel_bufs, &env)?
        } else {
            None
        };
        if let Some(capture) = &capture {
            if kernel.is_none() {
                return Err(Error::invalid(
                    Some(p.rank),
                    Arg::Stream,
                    "this point-to-point group cannot be captured into a CUDA graph in a job of \
                     processes: only communicators of at most 8 ranks, all on one machine over \
                     CUDA IPC, run their groups on the capturable kernel (the others number \
                     their signals on the host); call it eagerly",
                ));
            }
            // The graph keeps the communicator's device resources (the point-to-point buffers
            // among them) alive.
            self.keep_alive_in(capture)?;
            call.capturing = true;
        }
        if let Some(kargs) = &kernel {
            // cudarc's event tracking of the buffers, not while capturing (as the collectives).
            let guards: PerOp<SyncOnDrop<'_>> = ops
                .iter_mut()
                .filter(|o| o.count > 0 && capture.is_none())
                .map(|o| o.track(stream.as_ref()))
                .collect();
            // The large transfers first, through the copy engines (none under capture), then
            // the rest on the kernel, after them on the same stream.
            let staged_first = if split.copies.is_empty() {
                Ok(())
            } else {
                staged(&mut call, p.nranks, &split.copies, &split.copies_bufs, stream.as_ref())
            };
            // SAFETY: `kargs` was planned for this rank's windows just above: its user
            // addresses are the operations' buffers, validated above (on this rank's device,
            // `pops[i].bytes` long, receives overlapping nothing else of the group) and tracked
            // until the group's work on `stream` has ended (`guards`, eager) or, captured,
            // the caller's to keep alive as with NCCL; its other addresses are the
            // communicator's point-to-point buffers, mapped for its life (and a graph's).
            let result = staged_first
                .and_then(|()| unsafe { exec::p2p::execute_kernel(&mut call, kargs, stream.as_ref()) });
            drop(guards);
            return result;
        }
        let guards: PerOp<SyncOnDrop<'_>> = ops
            .iter_mut()
            .filter(|o| o.count > 0)
            .map(|o| o.track(stream.as_ref()))
            .collect();
        let bound = exec::net::Bound {
            kernels: &me.kernels,
            health: self.health(),
        };
        // Ranks on other machines over the network, the others over the mapped scratch (or
        // every rank over the network: `RINGCCL_NET=ucx` with `RINGCCL_P2P_DISABLE=1`).
        let mut net = p.net.as_ref().map(|n| n.lock().unwrap_or_else(|e| e.into_inner()));
        let result = match &mut net {
            Some(net) if !p.net_all => {
                exec::hybrid::peer_ops(net, &mut call, bound, &pops, &bufs, stream.as_ref())
            }
            Some(net) => {
                // SAFETY: `bufs[i]` is operation `i`'s buffer, validated above (on this rank's
                // device, `pops[i].bytes` long, receives overlapping nothing else of the group)
                // and tracked by cudarc's events until the group's work on `stream` has ended
                // (`guards`); `end` and `net` are this communicator's.
                unsafe { exec::net::execute(net, &p.memops, bound, &pops, &bufs, stream.as_ref(), &mut call.state.order) }
            }
            None => staged(&mut call, p.nranks, &pops, &bufs, stream.as_ref()),
        };
        drop(guards);
        result
    }
}

/// This rank's part `pops` (buffer `bufs[i]` for `pops[i]`, validated and tracked by the
/// caller) of a group among `nranks` processes of one machine through the copy engines and the
/// peers' mapped scratch (`plan::p2p`, `exec::p2p::execute`), eager only.
fn staged(
    call: &mut exec::process::ProcessCall<'_>,
    nranks: usize,
    pops: &[P2pOp],
    bufs: &[u64],
    stream: &CudaStream,
) -> Result<()> {
    let scratch = call.state.windows.scratch_bytes();
    let slot = p2p::slot_bytes(scratch, nranks, p2p::IPC_SLOTS).ok_or_else(|| Error::Internal {
        reason: format!("a scratch of {scratch} bytes is too small for {nranks} ranks"),
    })?;
    let plan = p2p::plan(call.state.rank, nranks, pops, slot, p2p::IPC_SLOTS)?;
    exec::p2p::execute(call, &plan, bufs, stream)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    fn op(dir: Dir, rank: usize, peer: usize, count: usize, tag: u64) -> OpArgs {
        OpArgs {
            dir,
            rank,
            peer,
            count,
            buf: buf(rank, tag, count),
        }
    }

    fn held<'a>(n: usize, ranks: &'a [usize]) -> Held<'a> {
        Held {
            nranks: n,
            ranks,
            devices: ranks,
        }
    }

    #[test]
    fn one_rank_of_processes_checks_its_own_operations() {
        let h = held(4, &[2]);
        let ok = [op(Dir::Send, 2, 3, 8, 1), op(Dir::Recv, 2, 1, 8, 2), op(Dir::Send, 2, 2, 0, 3)];
        validate_peer_ops(&ok, &h, &[2], F32).unwrap();
        let reason = err(validate_peer_ops(&[op(Dir::Send, 1, 3, 8, 1)], &h, &[2], F32), Some(1), Arg::Ranks);
        assert!(reason.contains("does not hold"), "{reason}");
        err(validate_peer_ops(&[op(Dir::Recv, 2, 4, 8, 1)], &h, &[2], F32), Some(2), Arg::Peer);
        err(validate_peer_ops(&ok, &h, &[1], F32), Some(2), Arg::Stream);
        err(validate_peer_ops(&ok, &h, &[2, 2], F32), None, Arg::Stream);
        let mut short = op(Dir::Recv, 2, 1, 8, 2);
        short.buf.len = 7;
        err(validate_peer_ops(&[short], &h, &[2], F32), Some(2), Arg::Recv);
    }

    #[test]
    fn receive_buffers_must_not_overlap() {
        let h = held(2, &[0]);
        let a = op(Dir::Recv, 0, 1, 8, 1);
        let mut b = op(Dir::Send, 0, 1, 8, 2);
        b.buf = a.buf;
        let reason = err(validate_peer_ops(&[a, b], &h, &[0], F32), Some(0), Arg::Recv);
        assert!(reason.contains("send buffer of operation 1"), "{reason}");
        // Two sends from one buffer are fine.
        let s = op(Dir::Send, 0, 1, 8, 2);
        validate_peer_ops(&[s, s], &h, &[0], F32).unwrap();
    }

    #[test]
    fn matching_in_order_with_equal_counts() {
        let ops = [
            op(Dir::Send, 0, 1, 4, 1),
            op(Dir::Send, 0, 1, 6, 2),
            op(Dir::Recv, 1, 0, 4, 3),
            op(Dir::Recv, 1, 0, 6, 4),
            op(Dir::Send, 1, 1, 2, 5),
            op(Dir::Recv, 1, 1, 2, 6),
            op(Dir::Recv, 0, 1, 0, 7), // empty: ignored
        ];
        let (pairs, idx) = match_peer_ops(&ops).unwrap();
        assert_eq!(idx, vec![(0, 2), (1, 3), (4, 5)]);
        assert_eq!(pairs[2].from, pairs[2].to);
        let mut bad = ops;
        bad[3].count = 5;
        let reason = err(match_peer_ops(&bad), Some(1), Arg::Count);
        assert!(reason.contains("sends 6"), "{reason}");
        let reason = err(match_peer_ops(&ops[..3]), Some(0), Arg::Peer);
        assert!(reason.contains("operation 1"), "{reason}");
        let reason = err(match_peer_ops(&ops[2..4]), Some(1), Arg::Peer);
        assert!(reason.contains("no matching send"), "{reason}");
    }
}
