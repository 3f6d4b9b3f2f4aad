//! Point-to-point transfers: a group of [`SendRecv`]s enqueued together (like
//! `ncclSend`/`ncclRecv` between `ncclGroupStart` and `ncclGroupEnd`), validated and split
//! into rounds in which every rank sends at most once and receives at most once. Once checked,
//! a group is the [`Communicator::peer_ops`] group of its sends and receives: one path for both.

use cudarc::driver::CudaStream;

use super::buffer::{DeviceSlice, DeviceSliceMut, RawBuf};
use super::collective::Need;
use super::p2p::PeerOp;
use super::validate::{bytes, check_buf, check_common, Held};
use super::stream_devices;
use crate::comm::Communicator;
use crate::dtype::DeviceElement;
use crate::exec::{self, Capture, RankPtrs};
use crate::plan::{tuning, Prepared};
use crate::schedule::{self, Layout, P2p};
use crate::{Arg, Error, RedOp, Result};

/// One point-to-point transfer as plain data (see [`SendRecv`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pArgs {
    /// The sending rank.
    pub from: usize,
    /// The receiving rank.
    pub to: usize,
    /// Elements.
    pub count: usize,
    /// The sender's buffer.
    pub send: RawBuf,
    /// The receiver's buffer.
    pub recv: RawBuf,
}

/// Validates a group of transfers and splits the non-empty ones into rounds in which every
/// rank sends at most once and receives at most once (one schedule each). Pure.
///
/// Besides the per-buffer checks, a receive buffer must not overlap any other buffer of the
/// group (the transfers of a group run concurrently, as in NCCL).
///
/// ```
/// use ringccl::internals::api::send_recv::{validate_send_recv, P2pArgs};
/// use ringccl::RawBuf;
/// let b = |rank: usize| RawBuf::new(0x1000_0000 * (rank as u64 + 1), 16, rank);
/// let ring: Vec<P2pArgs> = (0..3)
///     .map(|r| P2pArgs { from: r, to: (r + 1) % 3, count: 8, send: b(r), recv: b((r + 1) % 3).offset(8, 4).unwrap() })
///     .collect();
/// let rounds = validate_send_recv(&ring, &[0, 1, 2], &[0, 1, 2], 4)?;
/// assert_eq!(rounds, vec![vec![0, 1, 2]]);
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn validate_send_recv(
    pairs: &[P2pArgs],
    devices: &[usize],
    streams: &[usize],
    elem_size: usize,
) -> Result<Vec<Vec<usize>>> {
    let name = "send_recv";
    let n = devices.len();
    let max = pairs.iter().map(|p| p.count).max();
    let ranks: Vec<usize> = (0..n).collect();
    let held = Held {
        nranks: n,
        ranks: &ranks,
        devices,
    };
    check_common(name, n, &held, streams, Some(max.unwrap_or(0)), elem_size)?;
    for (i, p) in pairs.iter().enumerate() {
        for (rank, what) in [(p.from, "sender"), (p.to, "receiver")] {
            if rank >= n {
                return Err(Error::invalid(
                    None,
                    Arg::Peer,
                    format!(
                        "{name}: transfer {i}: {what} rank {rank} is out of range for {n} ranks"
                    ),
                ));
            }
        }
        let need = Need::Required(p.count);
        check_buf(
            name,
            p.from,
            Arg::Send,
            Some(p.send),
            need,
            devices[p.from],
            elem_size,
        )?;
        check_buf(
            name,
            p.to,
            Arg::Recv,
            Some(p.recv),
            need,
            devices[p.to],
            elem_size,
        )?;
    }
    // Overlaps: a receive region against every other region of the group.
    let extent = |b: RawBuf, count: usize| (b.ptr, b.ptr.saturating_add(bytes(count, elem_size)));
    let overlaps = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
    for (i, p) in pairs.iter().enumerate() {
        let ri = extent(p.recv, p.count);
        for (j, q) in pairs.iter().enumerate() {
            let clash = if overlaps(ri, extent(q.send, q.count)) {
                Some("send")
            } else if i != j && overlaps(ri, extent(q.recv, q.count)) {
                Some("receive")
            } else {
                None
            };
            if let Some(what) = clash {
                return Err(Error::invalid(
                    Some(p.to),
                    Arg::Recv,
                    format!("{name}: the receive buffer of transfer {i} overlaps the {what} buffer of transfer {j}"),
                ));
            }
        }
    }
    // Rounds (greedy, in the given order).
    let mut rounds: Vec<(Vec<usize>, Vec<bool>, Vec<bool>)> = Vec::new();
    for (i, p) in pairs.iter().enumerate().filter(|(_, p)| p.count > 0) {
        let slot = rounds
            .iter()
            .position(|(_, sends, recvs)| !sends[p.from] && !recvs[p.to]);
        let k = match slot {
            Some(k) => k,
            None => {
                rounds.push((Vec::new(), vec![false; n], vec![false; n]));
                rounds.len() - 1
            }
        };
        let (idx, sends, recvs) = &mut rounds[k];
        idx.push(i);
        sends[p.from] = true;
        recvs[p.to] = true;
    }
    Ok(rounds.into_iter().map(|(idx, _, _)| idx).collect())
}


/// One transfer of a [`Communicator::send_recv`] group: `count` elements from `send` on rank
/// `from` to `recv` on rank `to` (`from == to` is a local copy).
///
/// Each transfer names both ends, so a send never lacks its receive (in NCCL terms, an
/// `ncclSend`/`ncclRecv` pair inside one group).
///
/// ```no_run
/// use ringccl::{Communicator, SendRecv};
/// let comm = Communicator::new(&[0, 1])?;
/// let a = comm.stream(0).clone_htod(&[1.0f32; 256])?;
/// let mut b = comm.stream(1).alloc_zeros::<f32>(256)?;
/// let streams = [comm.stream(0), comm.stream(1)];
/// comm.send_recv(&mut [SendRecv::new(0, &a, 1, &mut b, 256)], &streams)?;
/// comm.stream(1).synchronize()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SendRecv<'a, T> {
    args: P2pArgs,
    send_buf: &'a dyn DeviceSlice<T>,
    recv_buf: &'a mut dyn DeviceSliceMut<T>,
}

impl<'a, T> SendRecv<'a, T> {
    /// `count` elements from `send` (on rank `from`) to `recv` (on rank `to`).
    pub fn new<S: DeviceSlice<T> + 'a, R: DeviceSliceMut<T> + 'a>(
        from: usize,
        send: &'a S,
        to: usize,
        recv: &'a mut R,
        count: usize,
    ) -> Self {
        let args = P2pArgs {
            from,
            to,
            count,
            send: send.raw(),
            recv: recv.raw(),
        };
        SendRecv {
            args,
            send_buf: send,
            recv_buf: recv,
        }
    }

    /// The plain description validation works on.
    pub(crate) fn args(&self) -> P2pArgs {
        self.args
    }
}

impl<T> std::fmt::Debug for SendRecv<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SendRecv").field(&self.args).finish()
    }
}

impl Communicator {
    /// A group of point-to-point transfers, enqueued together (like `ncclSend`/`ncclRecv`
    /// between `ncclGroupStart` and `ncclGroupEnd`). `streams[r]` is rank `r`'s stream (one per
    /// rank of the communicator). Transfers with a count of 0 are skipped; the receive buffers
    /// must not overlap any other buffer of the group.
    ///
    /// The group runs as rounds in which every rank sends at most once and receives at most
    /// once; a rank's transfers in later rounds follow on its stream. The group is atomic:
    /// every round is planned before any is enqueued, and all are enqueued under one lock, so
    /// no call from another thread lands between them; a failure after the first round went out
    /// is [`Error::PartlyEnqueued`](crate::Error::PartlyEnqueued) (and fails the communicator).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, SendRecv};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// // Every rank sends its buffer to the next rank (a ring shift).
    /// let send = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(16)).collect::<Result<Vec<_>, _>>()?;
    /// let mut recv = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(16)).collect::<Result<Vec<_>, _>>()?;
    /// let mut pairs: Vec<_> = recv
    ///     .iter_mut()
    ///     .enumerate()
    ///     .map(|(to, b)| SendRecv::new((to + n - 1) % n, &send[(to + n - 1) % n], to, b, 16))
    ///     .collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.send_recv(&mut pairs, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn send_recv<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        pairs: &mut [SendRecv<'_, T>],
        streams: &[S],
    ) -> Result<()> {
        self.health().check()?;
        let size = T::DTYPE.size();
        let devices = self.devices();
        let args: Vec<P2pArgs> = pairs.iter().map(SendRecv::args).collect();
        let rounds = validate_send_recv(&args, &devices, &stream_devices(streams), size)?;
        if rounds.is_empty() {
            return Ok(());
        }
        // Validated as transfers: from here on, the same call as `peer_ops` (each transfer
        // its send and its receive, matched with each other again there).
        let mut ops: Vec<PeerOp<'_, T>> = pairs
            .iter_mut()
            .flat_map(|p| PeerOp::transfer(p.args, p.send_buf, &mut *p.recv_buf))
            .collect();
        self.peer_ops(&mut ops, streams)
    }

    /// What a communicator of one process's [`Communicator::peer_ops`] (and so
    /// [`Communicator::send_recv`]) does once the transfers `args` are validated as `rounds`:
    /// the buffers' tracking (`track`, told whether the streams are being captured into a CUDA
    /// graph: then nothing is tracked, see `Tracked` in `api`), then the rounds enqueued.
    pub(crate) fn run_transfers<T: DeviceElement, S: AsRef<CudaStream>, G>(
        &self,
        args: &[P2pArgs],
        rounds: &[Vec<usize>],
        streams: &[S],
        track: impl FnOnce(bool) -> G,
    ) -> Result<()> {
        let capture = exec::capture(streams)?;
        let guards = track(capture.is_some());
        let result = self.enqueue_rounds::<T, S>(args, rounds, streams, capture);
        drop(guards);
        result
    }

    /// Enqueues validated transfers `args` as `rounds` (from [`validate_send_recv`]) on the
    /// ranks' `streams` (a communicator of one process: every rank's stream), which are in
    /// `capture` ([`exec::capture`], read by the caller). Atomic: every round is planned
    /// before any is enqueued, and all are enqueued under one lock.
    pub(crate) fn enqueue_rounds<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        args: &[P2pArgs],
        rounds: &[Vec<usize>],
        streams: &[S],
        capture: Option<Capture>,
    ) -> Result<()> {
        self.health().check()?;
        let size = T::DTYPE.size();
        let capturing = capture.is_some();
        let n = streams.len();
        let ring = self.ring();
        // Plan every round first: nothing is enqueued if one cannot be planned.
        let mut planned = Vec::with_capacity(rounds.len());
        for round in rounds {
            let mut ptrs = vec![RankPtrs { send: 0, recv: 0 }; n];
            let mut p2p = Vec::with_capacity(round.len());
            for &i in round {
                let a = args[i];
                ptrs[a.from].send = a.send.ptr;
                ptrs[a.to].recv = a.recv.ptr;
                p2p.push(P2p {
                    from: a.from,
                    to: a.to,
                    count: a.count,
                });
            }
            let max = p2p.iter().map(|p| p.count).max().unwrap_or(0);
            let chunk = tuning::chunk_elems(max.saturating_mul(size), 1, T::DTYPE, self.config());
            let prepared = Prepared::new(schedule::send_recv(ring, &p2p, Layout::OutOfPlace, chunk))?;
            planned.push((prepared, ptrs));
        }
        if let Some(capture) = &capture {
            self.keep_alive_in(capture)?;
        }
        // One lock for the whole group.
        let mut call = self.begin_call();
        let mut result = Ok(());
        for (i, (prepared, ptrs)) in planned.iter().enumerate() {
            result = exec::ring::execute(
                &mut call,
                prepared,
                T::DTYPE,
                RedOp::Sum,
                ptrs,
                streams,
                capturing,
            );
            if let Err(cause) = result {
                result = Err(if i == 0 || matches!(cause, crate::Error::PartlyEnqueued { .. }) {
                    cause
                } else {
                    let e = crate::Error::PartlyEnqueued {
                        enqueued: (0..n).collect(),
                        cause: Box::new(cause),
                    };
                    self.health().fail(e.clone());
                    e
                });
                break;
            }
        }
        drop(call);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::test_util::*;


    fn p2p(from: usize, to: usize, count: usize) -> P2pArgs {
        P2pArgs {
            from,
            to,
            count,
            send: buf(from, 10 + to as u64, count),
            recv: buf(to, 20 + from as u64, count),
        }
    }

    fn run_p2p(pairs: &[P2pArgs], n: usize) -> Result<Vec<Vec<usize>>> {
        let d = devs(n);
        validate_send_recv(pairs, &d, &d, F32)
    }

    #[track_caller]
    fn err_p2p(r: Result<Vec<Vec<usize>>>, rank: Option<usize>, arg: Arg) -> String {
        err(r, rank, arg)
    }

    #[test]
    fn send_recv_ring_shift_is_one_round() {
        let pairs: Vec<_> = (0..4).map(|r| p2p(r, (r + 1) % 4, 16)).collect();
        assert_eq!(run_p2p(&pairs, 4).unwrap(), vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn send_recv_fan_out_needs_rounds() {
        let pairs = [p2p(0, 1, 4), p2p(0, 2, 4), p2p(1, 0, 4), p2p(0, 3, 4)];
        let rounds = run_p2p(&pairs, 4).unwrap();
        assert_eq!(rounds, vec![vec![0, 2], vec![1], vec![3]]);
        for round in &rounds {
            let mut froms: Vec<_> = round.iter().map(|&i| pairs[i].from).collect();
            froms.dedup();
            assert_eq!(froms.len(), round.len());
        }
    }

    #[test]
    fn send_recv_self_copy_is_valid() {
        assert_eq!(run_p2p(&[p2p(1, 1, 8)], 2).unwrap(), vec![vec![0]]);
    }

    #[test]
    fn send_recv_zero_counts_and_empty_groups_do_nothing() {
        assert!(run_p2p(&[], 2).unwrap().is_empty());
        assert!(run_p2p(&[p2p(0, 1, 0)], 2).unwrap().is_empty());
    }

    #[test]
    fn send_recv_peer_out_of_range() {
        let reason = err_p2p(run_p2p(&[p2p(0, 1, 4), p2p(0, 1, 4)], 1), None, Arg::Peer);
        assert!(reason.contains("receiver rank 1"), "{reason}");
        let mut p = p2p(0, 1, 4);
        p.from = 5;
        let reason = err_p2p(run_p2p(&[p], 2), None, Arg::Peer);
        assert!(reason.contains("sender rank 5"), "{reason}");
    }

    #[test]
    fn send_recv_buffers_on_the_ranks_devices() {
        let mut p = p2p(0, 1, 4);
        p.send = buf(1, 0, 4);
        err_p2p(run_p2p(&[p], 2), Some(0), Arg::Send);
        let mut p = p2p(0, 1, 4);
        p.recv = buf(0, 0, 4);
        err_p2p(run_p2p(&[p], 2), Some(1), Arg::Recv);
    }

    #[test]
    fn send_recv_lengths() {
        let mut p = p2p(0, 1, 4);
        p.recv.len = 3;
        let reason = err_p2p(run_p2p(&[p], 2), Some(1), Arg::Recv);
        assert!(reason.contains("needs 4"), "{reason}");
        let mut p = p2p(1, 0, 4);
        p.send.len = 0;
        err_p2p(run_p2p(&[p], 2), Some(1), Arg::Send);
    }

    #[test]
    fn send_recv_overlapping_receives_are_rejected() {
        let a = p2p(0, 1, 8);
        let mut b = p2p(2, 1, 8);
        b.recv = RawBuf {
            len: 8,
            ..a.recv.offset(4, F32).unwrap()
        };
        let reason = err_p2p(run_p2p(&[a, b], 3), Some(1), Arg::Recv);
        assert!(
            reason.contains("transfer 0") && reason.contains("transfer 1"),
            "{reason}"
        );
    }

    #[test]
    fn send_recv_receive_over_a_send_is_rejected() {
        let a = p2p(0, 1, 8);
        let mut b = p2p(1, 0, 8);
        b.recv = a.send; // rank 0 receives into the buffer it sends from
        let reason = err_p2p(run_p2p(&[a, b], 2), Some(0), Arg::Recv);
        assert!(reason.contains("send buffer of transfer 0"), "{reason}");
    }

    #[test]
    fn send_recv_shared_send_buffer_is_fine() {
        let a = p2p(0, 1, 8);
        let mut b = p2p(0, 2, 8);
        b.send = a.send;
        assert_eq!(run_p2p(&[a, b], 3).unwrap().len(), 2);
    }

    #[test]
    fn send_recv_streams_checked() {
        let d = devs(2);
        let e = validate_send_recv(&[p2p(0, 1, 4)], &d, &[0], F32);
        err_p2p(e, None, Arg::Stream);
        let e = validate_send_recv(&[p2p(0, 1, 4)], &d, &[1, 1], F32);
        err_p2p(e, Some(0), Arg::Stream);
    }

    #[test]
    fn send_recv_count_overflow() {
        let mut p = p2p(0, 1, 4);
        p.count = usize::MAX / 2;
        err_p2p(run_p2p(&[p], 2), None, Arg::Count);
    }
}
