//! The public API: collectives as methods on [`Communicator`].
//!
//! Every call goes the same way:
//! 1. **validate** ([`validate`], [`validate_send_recv`]): a pure function of the buffers'
//!    addresses, lengths and devices ([`RawBuf`]), the streams' devices, the counts and the
//!    root. A rejected call returns [`Error::InvalidArgument`] naming the rank and the problem,
//!    and nothing is enqueued;
//! 2. **layout**: from the pointers, whether the call is in place ([`Layout`]);
//! 3. **schedule**: the ring schedule for the collective ([`crate::schedule`]), with steps of at
//!    most [`chunk_elems`] elements;
//! 4. **enqueue** ([`crate::exec::execute`]) on the given streams, one per rank. The call returns
//!    without waiting for the GPUs: synchronise the streams before using the results.
//!
//! A count of 0 is valid and enqueues nothing (the other arguments are still checked). A
//! communicator of one rank is valid too (a copy, or nothing for an in-place call).
//!
//! Buffer shapes are NCCL's (counts in elements, `n` ranks):
//!
//! | collective | send (per rank) | recv (per rank) | in place |
//! | --- | --- | --- | --- |
//! | all-reduce | `count` | `count` | `send == recv` |
//! | reduce-scatter | `n * recvcount` | `recvcount` | `recv == send + rank * recvcount` |
//! | all-gather | `sendcount` | `n * sendcount` | `send == recv + rank * sendcount` |
//! | broadcast | root: `count` | `count` (optional on the root) | root: `send == recv` |
//! | reduce | `count` | root: `count` | root: `send == recv` |
//! | all-to-all | `n * count` | `n * count` | not allowed |
//! | gather | `sendcount` | root: `n * sendcount` | root: `send == recv + root * sendcount` |
//! | scatter | root: `n * recvcount` | `recvcount` | root: `recv == send + root * recvcount` |
//!
//! ringccl needs either every rank in place or none (NCCL allows a mix): a mix is rejected.
//!
//! # Example
//!
//! ```no_run
//! use ringccl::{Communicator, Io, RedOp};
//!
//! let comm = Communicator::all()?; // one rank per visible GPU
//! let n = comm.nranks();
//! let count = 1 << 20;
//! // One buffer per rank, on that rank's GPU, holding `rank + 1` everywhere.
//! let mut bufs = Vec::new();
//! for r in 0..n {
//!     let host = vec![(r + 1) as f32; count];
//!     bufs.push(comm.stream(r).clone_htod(&host)?);
//! }
//! let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
//! let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
//! comm.all_reduce(&mut io, count, RedOp::Sum, &streams)?;
//! drop(io);
//! for r in 0..n {
//!     comm.stream(r).synchronize()?;
//!     let out = comm.stream(r).clone_dtoh(&bufs[r])?;
//!     assert!(out.iter().all(|&x| x == (n * (n + 1) / 2) as f32));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaStream, SyncOnDrop};

use crate::buffer::{DeviceSlice, DeviceSliceMut, Io, RankArgs, RawBuf};
use crate::comm::{Communicator, ScheduleKey};
use crate::dtype::{DataType, DeviceElement};
use crate::error::{Arg, Error, Result};
use crate::exec::{self, RankPtrs};
use crate::schedule::{self, Layout, P2p, Schedule};
use gpu_kernels::op::RedOp;

// ---------------------------------------------------------------------------------------------
// Tuning
// ---------------------------------------------------------------------------------------------

/// The chunk (maximum elements per schedule step) for a message of `bytes` bytes (the largest
/// buffer of the call) over `nranks` ranks: [`crate::tuning::chunk_bytes`] in elements, never
/// more than one rank's segment (nothing to pipeline then), never 0.
///
/// ```
/// use ringccl::collectives::chunk_elems;
/// use ringccl::DataType;
/// assert_eq!(chunk_elems(1 << 30, 2, DataType::F32), (1 << 29) / 4);
/// assert_eq!(chunk_elems(4096, 4, DataType::F32), 256);
/// assert_eq!(chunk_elems(0, 4, DataType::F64), 1);
/// ```
pub fn chunk_elems(bytes: usize, nranks: usize, dtype: DataType) -> usize {
    let size = dtype.size();
    let max = (crate::tuning::chunk_bytes(bytes, nranks) / size).max(1);
    let segment = bytes.div_ceil(size).div_ceil(nranks.max(1));
    segment.clamp(1, max)
}

// ---------------------------------------------------------------------------------------------
// What a call asks for, as plain data
// ---------------------------------------------------------------------------------------------

/// A collective with its counts and root: what a call asks for, as plain data.
///
/// ```
/// use ringccl::collectives::Collective;
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
/// use ringccl::collectives::{Collective, Need};
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
    fn used(self) -> bool {
        !matches!(self, Need::Unused)
    }
    fn elems(self) -> usize {
        match self {
            Need::Unused => 0,
            Need::Required(n) | Need::Optional(n) => n,
        }
    }
}

impl Collective {
    /// The method's name (`"all_reduce"`, ...), used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce { .. } => "all_reduce",
            Collective::ReduceScatter { .. } => "reduce_scatter",
            Collective::AllGather { .. } => "all_gather",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
            Collective::AllToAll { .. } => "all_to_all",
            Collective::Gather { .. } => "gather",
            Collective::Scatter { .. } => "scatter",
        }
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
    fn in_place_rule(self) -> &'static str {
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

// ---------------------------------------------------------------------------------------------
// Validation (pure)
// ---------------------------------------------------------------------------------------------

/// One rank's resolved pointers, as the executor gets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ptrs {
    /// Address of the send buffer (0: none; for in-place layouts, consistent with `recv`).
    pub send: u64,
    /// Address of the receive buffer (0: none; for in-place layouts, consistent with `send`).
    pub recv: u64,
    /// Whether the call reads the user's send buffer (for cudarc's event tracking).
    pub reads_send: bool,
    /// Whether the call writes the user's receive buffer.
    pub writes_recv: bool,
}

/// A validated call: its layout and each rank's pointers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// In place or not (one layout for all ranks).
    pub layout: Layout,
    /// Per rank.
    pub ptrs: Vec<Ptrs>,
}

/// Byte size of `elems` elements (callers have checked it does not overflow).
fn bytes(elems: usize, size: usize) -> u64 {
    elems.saturating_mul(size) as u64
}

/// Checks the argument count, the stream devices and that the biggest buffer's byte size fits.
fn check_common(
    name: &str,
    nargs: usize,
    devices: &[usize],
    streams: &[usize],
    max_elems: Option<usize>,
    elem_size: usize,
) -> Result<()> {
    let n = devices.len();
    if n == 0 {
        return Err(Error::invalid(
            None,
            Arg::Ranks,
            format!("{name}: the communicator has no ranks"),
        ));
    }
    if nargs != n {
        return Err(Error::invalid(
            None,
            Arg::Ranks,
            format!("{name}: {nargs} per-rank arguments given for a communicator of {n} ranks"),
        ));
    }
    if streams.len() != n {
        return Err(Error::invalid(
            None,
            Arg::Stream,
            format!(
                "{name}: {} streams given for a communicator of {n} ranks",
                streams.len()
            ),
        ));
    }
    if max_elems.and_then(|e| e.checked_mul(elem_size)).is_none() {
        return Err(Error::invalid(
            None,
            Arg::Count,
            format!("{name}: the count times {n} ranks times {elem_size} bytes overflows"),
        ));
    }
    for (r, (&s, &d)) in streams.iter().zip(devices).enumerate() {
        if s != d {
            return Err(Error::invalid(
                Some(r),
                Arg::Stream,
                format!("{name}: the stream is on device {s} but rank {r} is on device {d}"),
            ));
        }
    }
    Ok(())
}

/// Checks one buffer against what the collective needs of it.
fn check_buf(
    name: &str,
    rank: usize,
    arg: Arg,
    buf: Option<RawBuf>,
    need: Need,
    device: usize,
    elem_size: usize,
) -> Result<()> {
    let what = if arg == Arg::Send { "send" } else { "receive" };
    let Some(b) = buf else {
        return match need {
            Need::Required(_) => Err(Error::invalid(
                Some(rank),
                arg,
                format!("{name} needs a {what} buffer on rank {rank}, none was given"),
            )),
            _ => Ok(()),
        };
    };
    if !need.used() {
        return Ok(());
    }
    if b.ordinal != device {
        return Err(Error::invalid(
            Some(rank),
            arg,
            format!(
                "{name}: the {what} buffer is on device {} but rank {rank} is on device {device}",
                b.ordinal
            ),
        ));
    }
    if b.len < need.elems() {
        return Err(Error::invalid(
            Some(rank),
            arg,
            format!(
                "{name} needs {} elements in the {what} buffer, {} given",
                need.elems(),
                b.len
            ),
        ));
    }
    if b.byte_end(elem_size).is_none() {
        return Err(Error::invalid(
            Some(rank),
            arg,
            format!("{name}: the {what} buffer runs past the end of the address space"),
        ));
    }
    Ok(())
}

/// One rank's buffers after applying the in-place flag, and whether the rank is in place
/// (`None`: the rank does not use both buffers, so it does not decide the layout).
struct Resolved {
    send: Option<RawBuf>,
    recv: Option<RawBuf>,
    in_place: Option<bool>,
}

fn resolve_rank(
    c: Collective,
    rank: usize,
    nranks: usize,
    a: &RankArgs,
    device: usize,
    elem_size: usize,
) -> Result<Resolved> {
    let name = c.name();
    let (ns, nr) = c.needs(rank, nranks);
    let both = ns.used() && nr.used();
    let overflow = |arg| {
        Error::invalid(
            Some(rank),
            arg,
            format!("{name}: the buffer's address overflows"),
        )
    };

    // 1. Which buffers, after the in-place flag.
    let (send, recv) = if a.in_place {
        let Some(buf) = a.recv.or(a.send) else {
            return Err(Error::invalid(
                Some(rank),
                Arg::Recv,
                format!("{name}: an in-place argument without a buffer on rank {rank}"),
            ));
        };
        if both {
            match c.in_place_layout() {
                Some(Layout::SendInRecv { stride }) => {
                    check_buf(name, rank, Arg::Recv, Some(buf), nr, device, elem_size)?;
                    let send = buf.offset(rank * stride, elem_size).ok_or_else(|| overflow(Arg::Send))?;
                    (Some(send), Some(buf))
                }
                Some(Layout::RecvInSend { stride }) => {
                    check_buf(name, rank, Arg::Send, Some(buf), ns, device, elem_size)?;
                    let recv = buf.offset(rank * stride, elem_size).ok_or_else(|| overflow(Arg::Recv))?;
                    (Some(buf), Some(recv))
                }
                _ => {
                    return Err(Error::invalid(
                        Some(rank),
                        Arg::Recv,
                        format!(
                            "{name} cannot run in place (as in NCCL): give separate send and receive buffers"
                        ),
                    ))
                }
            }
        } else if ns.used() {
            (Some(buf), None)
        } else {
            (None, Some(buf))
        }
    } else {
        (a.send.filter(|_| ns.used()), a.recv.filter(|_| nr.used()))
    };

    // 2. Presence, device, length.
    check_buf(name, rank, Arg::Send, send, ns, device, elem_size)?;
    check_buf(name, rank, Arg::Recv, recv, nr, device, elem_size)?;

    // 3. Aliasing: the exact in-place layout, or disjoint.
    let in_place = match (send, recv) {
        (Some(s), Some(q)) if both => {
            let exact = match c.in_place_layout() {
                Some(Layout::SendInRecv { stride }) => {
                    q.ptr.checked_add(bytes(rank * stride, elem_size)) == Some(s.ptr)
                }
                Some(Layout::RecvInSend { stride }) => {
                    s.ptr.checked_add(bytes(rank * stride, elem_size)) == Some(q.ptr)
                }
                _ => false,
            };
            if exact {
                Some(true)
            } else {
                let s_end = s.ptr.saturating_add(bytes(ns.elems(), elem_size));
                let q_end = q.ptr.saturating_add(bytes(nr.elems(), elem_size));
                if s.ptr < q_end && q.ptr < s_end {
                    return Err(Error::invalid(
                        Some(rank),
                        Arg::Recv,
                        format!(
                            "{name}: the receive buffer [{:#x}, {q_end:#x}) overlaps the send buffer \
                             [{:#x}, {s_end:#x}) but is not the in-place layout ({})",
                            q.ptr,
                            s.ptr,
                            c.in_place_rule()
                        ),
                    ));
                }
                Some(false)
            }
        }
        // The broadcast root without an output buffer: its input stands for it (in place).
        (Some(_), None) if both && c.in_place_layout().is_some() => Some(true),
        _ => None,
    };
    Ok(Resolved {
        send,
        recv,
        in_place,
    })
}

/// Validates a collective call and works out its layout and pointers. Pure: no GPU needed.
///
/// `args[r]` are rank `r`'s buffers, `devices[r]` the device ordinal of rank `r` (the
/// communicator's size is `devices.len()`), `streams[r]` the device of the stream given for
/// rank `r`, `elem_size` the element size in bytes. Errors are
/// [`Error::InvalidArgument`] naming the rank (where there is one) and the argument.
///
/// ```
/// use ringccl::buffer::{RankArgs, RawBuf};
/// use ringccl::collectives::{validate, Collective};
/// use ringccl::schedule::Layout;
/// use ringccl::{Arg, Error};
///
/// let devices = [0, 1];
/// let args = [
///     RankArgs::in_place(RawBuf::new(0x1000_0000, 64, 0)),
///     RankArgs::in_place(RawBuf::new(0x2000_0000, 64, 1)),
/// ];
/// let plan = validate(Collective::AllReduce { count: 64 }, &args, &devices, &devices, 4)?;
/// assert_eq!(plan.layout, Layout::SendInRecv { stride: 0 });
///
/// let e = validate(Collective::AllReduce { count: 65 }, &args, &devices, &devices, 4);
/// assert!(matches!(e, Err(Error::InvalidArgument { rank: Some(0), arg: Arg::Recv, .. })));
/// # Ok::<(), Error>(())
/// ```
pub fn validate(
    c: Collective,
    args: &[RankArgs],
    devices: &[usize],
    streams: &[usize],
    elem_size: usize,
) -> Result<Plan> {
    let name = c.name();
    let n = devices.len();
    check_common(
        name,
        args.len(),
        devices,
        streams,
        c.max_elems(n),
        elem_size,
    )?;
    if let Some(root) = c.root() {
        if root >= n {
            return Err(Error::invalid(
                None,
                Arg::Root,
                format!("{name}: root {root} is out of range for {n} ranks"),
            ));
        }
    }

    let mut resolved = Vec::with_capacity(n);
    for (r, a) in args.iter().enumerate() {
        resolved.push(resolve_rank(c, r, n, a, devices[r], elem_size)?);
    }

    // One layout for every rank.
    let mut first: Option<(usize, bool)> = None;
    for (r, res) in resolved.iter().enumerate() {
        let Some(ip) = res.in_place else { continue };
        match first {
            None => first = Some((r, ip)),
            Some((q, qip)) if qip != ip => {
                let (a, b) = if ip {
                    ("in place", "out of place")
                } else {
                    ("out of place", "in place")
                };
                return Err(Error::invalid(
                    Some(r),
                    Arg::Recv,
                    format!(
                        "{name}: rank {r} is {a} but rank {q} is {b}; ringccl needs every rank in \
                         place or none"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    let layout = match (first, c.in_place_layout()) {
        (Some((_, true)), Some(l)) => l,
        _ => Layout::OutOfPlace,
    };

    // Pointers. In an in-place layout the schedule addresses one buffer per rank through the
    // other (send = recv + rank*stride, or the reverse); a rank that has only one of the two
    // (a non-root of reduce, gather or scatter) gets the other one computed so that the
    // schedule's rewritten regions land in the buffer it has.
    let mut ptrs = Vec::with_capacity(n);
    for (r, res) in resolved.iter().enumerate() {
        let (ns, nr) = c.needs(r, n);
        let mut p = Ptrs {
            send: res.send.map_or(0, |b| b.ptr),
            recv: res.recv.map_or(0, |b| b.ptr),
            reads_send: ns.used() && res.send.is_some(),
            writes_recv: nr.used() && res.recv.is_some(),
        };
        let low = |arg| {
            Error::invalid(
                Some(r),
                arg,
                format!("{name}: the buffer's address is too low for the in-place layout"),
            )
        };
        match layout {
            Layout::SendInRecv { stride } if res.recv.is_none() => {
                p.recv = p
                    .send
                    .checked_sub(bytes(r * stride, elem_size))
                    .ok_or_else(|| low(Arg::Send))?;
            }
            Layout::SendInRecv { stride } if res.send.is_none() => {
                p.send = p.recv.saturating_add(bytes(r * stride, elem_size));
            }
            Layout::RecvInSend { stride } if res.send.is_none() => {
                p.send = p
                    .recv
                    .checked_sub(bytes(r * stride, elem_size))
                    .ok_or_else(|| low(Arg::Recv))?;
            }
            Layout::RecvInSend { stride } if res.recv.is_none() => {
                p.recv = p.send.saturating_add(bytes(r * stride, elem_size));
            }
            _ => {}
        }
        ptrs.push(p);
    }
    Ok(Plan { layout, ptrs })
}

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
/// use ringccl::buffer::RawBuf;
/// use ringccl::collectives::{validate_send_recv, P2pArgs};
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
    check_common(name, n, devices, streams, Some(max.unwrap_or(0)), elem_size)?;
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

// ---------------------------------------------------------------------------------------------
// Point-to-point arguments
// ---------------------------------------------------------------------------------------------

/// One transfer of a [`Communicator::send_recv`] group: `count` elements from `send` on rank
/// `from` to `recv` on rank `to` (`from == to` is a local copy).
///
/// Each transfer names both ends, so a send never lacks its receive (in NCCL terms, an
/// `ncclSend`/`ncclRecv` pair inside one group).
///
/// ```no_run
/// use ringccl::{collectives::SendRecv, Communicator};
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
    pub fn args(&self) -> P2pArgs {
        self.args
    }
}

impl<T> std::fmt::Debug for SendRecv<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SendRecv").field(&self.args).finish()
    }
}

// ---------------------------------------------------------------------------------------------
// The API
// ---------------------------------------------------------------------------------------------

/// Device ordinals of the given streams.
fn stream_devices(streams: &[&Arc<CudaStream>]) -> Vec<usize> {
    streams.iter().map(|s| s.context().ordinal()).collect()
}

impl Communicator {
    fn devices(&self) -> Vec<usize> {
        (0..self.nranks()).map(|r| self.ordinal(r)).collect()
    }

    /// Validate, schedule and enqueue one collective.
    fn collective<T: DeviceElement>(
        &self,
        c: Collective,
        io: &mut [Io<'_, T>],
        op: RedOp,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        let size = T::DTYPE.size();
        let devices = self.devices();
        let args: Vec<RankArgs> = io.iter().map(Io::args).collect();
        let plan = validate(c, &args, &devices, &stream_devices(streams), size)?;
        if c.count() == 0 {
            return Ok(());
        }
        let n = devices.len();
        let max_bytes = c.max_elems(n).unwrap_or(0).saturating_mul(size);
        if let Collective::AllReduce { count } = c {
            let algo = crate::tuning::all_reduce_algo(max_bytes, n, self.oneshot_usable());
            if algo == crate::tuning::AllReduceAlgo::OneShot {
                return self.all_reduce_oneshot(io, count, op, streams, &plan);
            }
        }
        let ring = self.ring();
        let chunk = chunk_elems(max_bytes, n, T::DTYPE);
        let key = ScheduleKey {
            collective: c.name(),
            counts: vec![c.count()],
            layout: plan.layout,
            root: c.root(),
            chunk,
        };
        let prepared = self.prepared(key, || c.schedule(ring, plan.layout, chunk))?;
        let plain: Vec<&CudaStream> = streams.iter().map(|s| s.as_ref()).collect();
        let ptrs: Vec<RankPtrs> = plan
            .ptrs
            .iter()
            .map(|p| RankPtrs {
                send: p.send,
                recv: p.recv,
            })
            .collect();
        // cudarc's event tracking (see `crate::buffer`): wait for earlier tracked accesses now,
        // record this call's accesses when the guards drop, after everything is enqueued.
        let guards: Vec<[SyncOnDrop<'_>; 2]> = io
            .iter_mut()
            .zip(&plain)
            .zip(&plan.ptrs)
            .map(|((io, s), p)| io.track(s, p.reads_send, p.writes_recv))
            .collect();
        let result = exec::execute_prepared(self, &prepared, T::DTYPE, op, &ptrs, &plain);
        drop(guards);
        result
    }

    /// The one-shot all-reduce of a validated call (`count > 0`).
    fn all_reduce_oneshot<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        streams: &[&Arc<CudaStream>],
        plan: &Plan,
    ) -> Result<()> {
        let plain: Vec<&CudaStream> = streams.iter().map(|s| s.as_ref()).collect();
        let ptrs: Vec<RankPtrs> = plan
            .ptrs
            .iter()
            .map(|p| RankPtrs {
                send: p.send,
                recv: p.recv,
            })
            .collect();
        let in_place = plan.layout != Layout::OutOfPlace;
        // cudarc's event tracking, as in `collective`: each rank's kernel ends only after every
        // peer is done reading its input, so the record on its own stream covers the call.
        let guards: Vec<[SyncOnDrop<'_>; 2]> = io
            .iter_mut()
            .zip(&plain)
            .zip(&plan.ptrs)
            .map(|((io, s), p)| io.track(s, p.reads_send, p.writes_recv))
            .collect();
        let result = exec::execute_oneshot(self, T::DTYPE, op, &ptrs, in_place, count, &plain);
        drop(guards);
        result
    }

    /// All-reduce: every rank's output gets the reduction (`op`) over ranks of their `count`
    /// inputs. `io[r]` and `streams[r]` belong to rank `r`; each rank needs `count` elements
    /// of input and output, or one buffer in place.
    ///
    /// Returns once the work is enqueued: synchronise the streams before using the results.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io, RedOp};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let send = (0..n).map(|r| comm.stream(r).clone_htod(&[1.0f32; 64])).collect::<Result<Vec<_>, _>>()?;
    /// let mut recv = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(64)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = send.iter().zip(recv.iter_mut()).map(|(s, r)| Io::out_of_place(s, r)).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.all_reduce(&mut io, 64, RedOp::Avg, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        self.collective(Collective::AllReduce { count }, io, op, streams)
    }

    /// Reduce-scatter: rank `r`'s output (`recvcount` elements) gets block `r` of the reduction
    /// over ranks of their inputs (`nranks * recvcount` elements each). In place: the buffer is
    /// the input and rank `r`'s output is its block `r`.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io, RedOp};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(n * 32)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.reduce_scatter(&mut io, 32, RedOp::Sum, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_scatter<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        recvcount: usize,
        op: RedOp,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        self.collective(Collective::ReduceScatter { recvcount }, io, op, streams)
    }

    /// All-gather: every rank's output (`nranks * sendcount` elements) gets every rank's input
    /// (`sendcount` elements), in rank order. In place: the buffer is the output, holding
    /// rank `r`'s input at element `r * sendcount`.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).alloc_zeros::<u8>(n * 100)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.all_gather(&mut io, 100, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_gather<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        sendcount: usize,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        self.collective(Collective::AllGather { sendcount }, io, RedOp::Sum, streams)
    }

    /// Broadcast: every rank's output gets the root's `count` input elements. The root gives
    /// an input ([`Io::send_only`], or an output too, or one buffer in place); the others give
    /// an output ([`Io::recv_only`]).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).alloc_zeros::<f64>(10)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.broadcast(&mut io, 10, 0, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        count: usize,
        root: usize,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        self.collective(
            Collective::Broadcast { count, root },
            io,
            RedOp::Sum,
            streams,
        )
    }

    /// Reduce: the root's output gets the reduction over ranks of their `count` inputs. Every
    /// rank gives an input; the root also an output (or one buffer in place).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io, RedOp};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).alloc_zeros::<i32>(10)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.reduce(&mut io, 10, RedOp::Max, 0, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        root: usize,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        self.collective(Collective::Reduce { count, root }, io, op, streams)
    }

    /// All-to-all: block `j` (`count_per_peer` elements) of rank `i`'s input goes to block `i`
    /// of rank `j`'s output; both buffers hold `nranks * count_per_peer` elements. Out of place
    /// only (as in NCCL).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let send = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(n * 8)).collect::<Result<Vec<_>, _>>()?;
    /// let mut recv = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(n * 8)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = send.iter().zip(recv.iter_mut()).map(|(s, r)| Io::out_of_place(s, r)).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.all_to_all(&mut io, 8, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_to_all<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        count_per_peer: usize,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        self.collective(
            Collective::AllToAll { count_per_peer },
            io,
            RedOp::Sum,
            streams,
        )
    }

    /// Gather: the root's output (`nranks * sendcount` elements) gets every rank's input
    /// (`sendcount` elements), in rank order. In place on the root: the output buffer, holding
    /// the root's input at element `root * sendcount`.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let send = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(4)).collect::<Result<Vec<_>, _>>()?;
    /// let mut out = comm.stream(0).alloc_zeros::<f32>(n * 4)?;
    /// let mut io = vec![Io::out_of_place(&send[0], &mut out)];
    /// io.extend(send[1..].iter().map(Io::send_only));
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.gather(&mut io, 4, 0, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gather<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        sendcount: usize,
        root: usize,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        self.collective(
            Collective::Gather { sendcount, root },
            io,
            RedOp::Sum,
            streams,
        )
    }

    /// Scatter: rank `r`'s output (`recvcount` elements) gets block `r` of the root's input
    /// (`nranks * recvcount` elements). In place on the root: the input buffer, whose block
    /// `root` is the root's output.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n)
    ///     .map(|r| comm.stream(r).alloc_zeros::<f32>(if r == 0 { n * 4 } else { 4 }))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.scatter(&mut io, 4, 0, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scatter<T: DeviceElement>(
        &self,
        io: &mut [Io<'_, T>],
        recvcount: usize,
        root: usize,
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        self.collective(
            Collective::Scatter { recvcount, root },
            io,
            RedOp::Sum,
            streams,
        )
    }

    /// A group of point-to-point transfers, enqueued together (like `ncclSend`/`ncclRecv`
    /// between `ncclGroupStart` and `ncclGroupEnd`). `streams[r]` is rank `r`'s stream (one per
    /// rank of the communicator). Transfers with a count of 0 are skipped; the receive buffers
    /// must not overlap any other buffer of the group.
    ///
    /// The group runs as rounds in which every rank sends at most once and receives at most
    /// once; a rank's transfers in later rounds follow on its stream.
    ///
    /// ```no_run
    /// use ringccl::{collectives::SendRecv, Communicator};
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
    pub fn send_recv<T: DeviceElement>(
        &self,
        pairs: &mut [SendRecv<'_, T>],
        streams: &[&Arc<CudaStream>],
    ) -> Result<()> {
        let size = T::DTYPE.size();
        let devices = self.devices();
        let args: Vec<P2pArgs> = pairs.iter().map(SendRecv::args).collect();
        let rounds = validate_send_recv(&args, &devices, &stream_devices(streams), size)?;
        if rounds.is_empty() {
            return Ok(());
        }
        let n = devices.len();
        let ring = self.ring();
        let plain: Vec<&CudaStream> = streams.iter().map(|s| s.as_ref()).collect();
        let mut used = vec![false; pairs.len()];
        for &i in rounds.iter().flatten() {
            used[i] = true;
        }
        let guards: Vec<[SyncOnDrop<'_>; 2]> = pairs
            .iter_mut()
            .zip(&used)
            .filter(|(_, &u)| u)
            .map(|(p, _)| {
                let (from, to) = (p.args.from, p.args.to);
                [
                    p.send_buf.track_read(plain[from]),
                    p.recv_buf.track_write(plain[to]),
                ]
            })
            .collect();
        let mut result = Ok(());
        for round in &rounds {
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
            let chunk = chunk_elems(max.saturating_mul(size), 1, T::DTYPE);
            let sched = schedule::send_recv(ring, &p2p, Layout::OutOfPlace, chunk);
            result = exec::execute(self, &sched, T::DTYPE, RedOp::Sum, &ptrs, &plain);
            if result.is_err() {
                break;
            }
        }
        drop(guards);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: usize = 4;

    /// A fake buffer `i` of `len` elements on device `dev`: distinct, far-apart addresses.
    fn buf(dev: usize, i: u64, len: usize) -> RawBuf {
        RawBuf::new(
            0x10_0000_0000 * (dev as u64 + 1) + i * 0x1000_0000,
            len,
            dev,
        )
    }

    fn devs(n: usize) -> Vec<usize> {
        (0..n).collect()
    }

    fn oop(n: usize, send_len: usize, recv_len: usize) -> Vec<RankArgs> {
        (0..n)
            .map(|r| RankArgs::out_of_place(buf(r, 0, send_len), buf(r, 1, recv_len)))
            .collect()
    }

    fn inp(n: usize, len: usize) -> Vec<RankArgs> {
        (0..n).map(|r| RankArgs::in_place(buf(r, 0, len))).collect()
    }

    fn run(c: Collective, args: &[RankArgs]) -> Result<Plan> {
        let d = devs(args.len());
        validate(c, args, &d, &d, F32)
    }

    /// Asserts an `InvalidArgument` with this rank and argument; returns the reason.
    #[track_caller]
    fn err(r: Result<Plan>, rank: Option<usize>, arg: Arg) -> String {
        match r {
            Err(Error::InvalidArgument {
                rank: got_rank,
                arg: got_arg,
                reason,
            }) => {
                assert_eq!((got_rank, got_arg), (rank, arg), "{reason}");
                reason
            }
            other => panic!("expected InvalidArgument({rank:?}, {arg:?}), got {other:?}"),
        }
    }

    const AR: Collective = Collective::AllReduce { count: 100 };

    // ---- all-reduce ----

    #[test]
    fn all_reduce_out_of_place_ok() {
        let args = oop(4, 100, 100);
        let plan = run(AR, &args).unwrap();
        assert_eq!(plan.layout, Layout::OutOfPlace);
        for (r, p) in plan.ptrs.iter().enumerate() {
            assert_eq!(
                (p.send, p.recv),
                (args[r].send.unwrap().ptr, args[r].recv.unwrap().ptr)
            );
            assert!(p.reads_send && p.writes_recv);
        }
    }

    #[test]
    fn all_reduce_in_place_flag() {
        let plan = run(AR, &inp(4, 100)).unwrap();
        assert_eq!(plan.layout, Layout::SendInRecv { stride: 0 });
        assert!(plan.ptrs.iter().all(|p| p.send == p.recv && p.send != 0));
    }

    #[test]
    fn all_reduce_in_place_by_equal_pointers() {
        let args: Vec<_> = (0..3)
            .map(|r| RankArgs::out_of_place(buf(r, 2, 100), buf(r, 2, 100)))
            .collect();
        assert_eq!(
            run(AR, &args).unwrap().layout,
            Layout::SendInRecv { stride: 0 }
        );
    }

    #[test]
    fn wrong_number_of_rank_arguments() {
        let d = devs(4);
        let reason = err(
            validate(AR, &oop(3, 100, 100), &d, &d, F32),
            None,
            Arg::Ranks,
        );
        assert!(reason.contains('3') && reason.contains('4'), "{reason}");
    }

    #[test]
    fn wrong_number_of_streams() {
        let d = devs(4);
        let reason = err(
            validate(AR, &oop(4, 100, 100), &d, &d[..2], F32),
            None,
            Arg::Stream,
        );
        assert!(reason.contains("2 streams"), "{reason}");
    }

    #[test]
    fn empty_communicator_is_rejected() {
        err(validate(AR, &[], &[], &[], F32), None, Arg::Ranks);
    }

    #[test]
    fn missing_send_names_rank() {
        let mut args = oop(4, 100, 100);
        args[2] = RankArgs::recv_only(buf(2, 1, 100));
        let reason = err(run(AR, &args), Some(2), Arg::Send);
        assert!(reason.contains("send buffer"), "{reason}");
    }

    #[test]
    fn missing_recv_names_rank() {
        let mut args = oop(4, 100, 100);
        args[1] = RankArgs::send_only(buf(1, 0, 100));
        err(run(AR, &args), Some(1), Arg::Recv);
    }

    #[test]
    fn send_too_short_says_needed_and_given() {
        let mut args = oop(4, 100, 100);
        args[3].send = Some(buf(3, 0, 99));
        let reason = err(run(AR, &args), Some(3), Arg::Send);
        assert!(reason.contains("100") && reason.contains("99"), "{reason}");
    }

    #[test]
    fn recv_too_short() {
        let mut args = oop(2, 100, 100);
        args[0].recv = Some(buf(0, 1, 10));
        let reason = err(run(AR, &args), Some(0), Arg::Recv);
        assert!(
            reason.contains("needs 100") && reason.contains("10 given"),
            "{reason}"
        );
    }

    #[test]
    fn longer_buffers_are_fine() {
        assert!(run(AR, &oop(2, 1000, 5000)).is_ok());
    }

    #[test]
    fn send_on_wrong_device() {
        let mut args = oop(4, 100, 100);
        args[1].send = Some(buf(2, 5, 100));
        let reason = err(run(AR, &args), Some(1), Arg::Send);
        assert!(
            reason.contains("device 2") && reason.contains("device 1"),
            "{reason}"
        );
    }

    #[test]
    fn recv_on_wrong_device() {
        let mut args = oop(4, 100, 100);
        args[3].recv = Some(buf(0, 5, 100));
        err(run(AR, &args), Some(3), Arg::Recv);
    }

    #[test]
    fn stream_on_wrong_device() {
        let d = devs(4);
        let streams = [0, 1, 3, 3];
        let reason = err(
            validate(AR, &oop(4, 100, 100), &d, &streams, F32),
            Some(2),
            Arg::Stream,
        );
        assert!(reason.contains("device 3"), "{reason}");
    }

    #[test]
    fn ranks_on_non_identity_devices() {
        // Rank r on device 3 - r: buffers and streams must follow the rank's device.
        let d = vec![3, 2, 1, 0];
        let args: Vec<_> = d
            .iter()
            .map(|&dev| RankArgs::out_of_place(buf(dev, 0, 8), buf(dev, 1, 8)))
            .collect();
        assert!(validate(Collective::AllReduce { count: 8 }, &args, &d, &d, F32).is_ok());
        err(
            validate(Collective::AllReduce { count: 8 }, &args, &d, &devs(4), F32),
            Some(0),
            Arg::Stream,
        );
    }

    #[test]
    fn partial_overlap_is_rejected() {
        let mut args = oop(2, 100, 100);
        let s = buf(1, 0, 200);
        args[1] = RankArgs::out_of_place(s, s.offset(10, F32).unwrap());
        let reason = err(run(AR, &args), Some(1), Arg::Recv);
        assert!(
            reason.contains("overlaps") && reason.contains("send == recv"),
            "{reason}"
        );
    }

    #[test]
    fn adjacent_buffers_do_not_overlap() {
        let mut args = oop(2, 100, 100);
        let s = buf(1, 0, 200);
        args[1] = RankArgs::out_of_place(s, s.offset(100, F32).unwrap());
        assert_eq!(run(AR, &args).unwrap().layout, Layout::OutOfPlace);
    }

    #[test]
    fn overlap_only_counts_the_elements_used() {
        // The buffers overlap beyond `count` elements, which the call never touches.
        let s = buf(0, 0, 300);
        let args = [RankArgs::out_of_place(s, s.offset(100, F32).unwrap())];
        assert!(run(AR, &args).is_ok());
    }

    #[test]
    fn mixed_in_place_is_rejected() {
        let mut args = inp(3, 100);
        args[2] = RankArgs::out_of_place(buf(2, 0, 100), buf(2, 1, 100));
        let reason = err(run(AR, &args), Some(2), Arg::Recv);
        assert!(reason.contains("rank 0 is in place"), "{reason}");
    }

    #[test]
    fn count_zero_is_valid_with_empty_buffers() {
        let plan = run(Collective::AllReduce { count: 0 }, &oop(4, 0, 0)).unwrap();
        assert_eq!(plan.ptrs.len(), 4);
    }

    #[test]
    fn count_zero_still_checks_devices_and_presence() {
        let mut args = oop(2, 0, 0);
        args[1].send = Some(buf(0, 0, 0));
        err(
            run(Collective::AllReduce { count: 0 }, &args),
            Some(1),
            Arg::Send,
        );
        args[1] = RankArgs::send_only(buf(1, 0, 0));
        err(
            run(Collective::AllReduce { count: 0 }, &args),
            Some(1),
            Arg::Recv,
        );
    }

    #[test]
    fn one_rank_is_valid() {
        assert_eq!(
            run(AR, &oop(1, 100, 100)).unwrap().layout,
            Layout::OutOfPlace
        );
        assert_eq!(
            run(AR, &inp(1, 100)).unwrap().layout,
            Layout::SendInRecv { stride: 0 }
        );
    }

    #[test]
    fn count_overflow_is_rejected() {
        let c = Collective::AllReduce {
            count: usize::MAX / 2,
        };
        err(run(c, &oop(2, 0, 0)), None, Arg::Count);
        let g = Collective::AllGather {
            sendcount: usize::MAX / 3,
        };
        err(run(g, &oop(4, 0, 0)), None, Arg::Count);
    }

    #[test]
    fn buffer_past_the_address_space_is_rejected() {
        let mut args = oop(2, 100, 100);
        args[0].recv = Some(RawBuf::new(u64::MAX - 100, 100, 0));
        let reason = err(run(AR, &args), Some(0), Arg::Recv);
        assert!(reason.contains("address space"), "{reason}");
    }

    #[test]
    fn in_place_flag_without_buffer_is_rejected() {
        let mut args = inp(2, 100);
        args[1] = RankArgs {
            send: None,
            recv: None,
            in_place: true,
        };
        err(run(AR, &args), Some(1), Arg::Recv);
    }

    // ---- reduce-scatter ----

    const RS: Collective = Collective::ReduceScatter { recvcount: 10 };

    #[test]
    fn reduce_scatter_shapes() {
        assert!(run(RS, &oop(4, 40, 10)).is_ok());
        let reason = err(run(RS, &oop(4, 39, 10)), Some(0), Arg::Send);
        assert!(reason.contains("40") && reason.contains("39"), "{reason}");
        err(run(RS, &oop(4, 40, 9)), Some(0), Arg::Recv);
    }

    #[test]
    fn reduce_scatter_in_place_flag_offsets_recv() {
        let args = inp(4, 40);
        let plan = run(RS, &args).unwrap();
        assert_eq!(plan.layout, Layout::RecvInSend { stride: 10 });
        for (r, p) in plan.ptrs.iter().enumerate() {
            assert_eq!(p.send, args[r].send.unwrap().ptr);
            assert_eq!(p.recv, p.send + (r * 10 * F32) as u64);
        }
    }

    #[test]
    fn reduce_scatter_in_place_flag_checks_whole_buffer() {
        let reason = err(run(RS, &inp(4, 30)), Some(0), Arg::Send);
        assert!(reason.contains("40"), "{reason}");
    }

    #[test]
    fn reduce_scatter_exact_pointer_in_place() {
        let args: Vec<_> = (0..4)
            .map(|r| {
                let s = buf(r, 0, 40);
                RankArgs::out_of_place(s, s.offset(r * 10, F32).unwrap())
            })
            .collect();
        assert_eq!(
            run(RS, &args).unwrap().layout,
            Layout::RecvInSend { stride: 10 }
        );
    }

    #[test]
    fn reduce_scatter_same_pointer_is_not_in_place_except_rank0() {
        // recv == send is NCCL's in-place layout only for rank 0.
        let args: Vec<_> = (0..3)
            .map(|r| RankArgs::out_of_place(buf(r, 0, 30), buf(r, 0, 30)))
            .collect();
        let reason = err(run(RS, &args), Some(1), Arg::Recv);
        assert!(
            reason.contains("recv == send + rank * recvcount"),
            "{reason}"
        );
    }

    // ---- all-gather ----

    const AG: Collective = Collective::AllGather { sendcount: 10 };

    #[test]
    fn all_gather_shapes() {
        assert!(run(AG, &oop(3, 10, 30)).is_ok());
        err(run(AG, &oop(3, 9, 30)), Some(0), Arg::Send);
        let reason = err(run(AG, &oop(3, 10, 29)), Some(0), Arg::Recv);
        assert!(reason.contains("30") && reason.contains("29"), "{reason}");
    }

    #[test]
    fn all_gather_in_place_flag_offsets_send() {
        let args = inp(3, 30);
        let plan = run(AG, &args).unwrap();
        assert_eq!(plan.layout, Layout::SendInRecv { stride: 10 });
        for (r, p) in plan.ptrs.iter().enumerate() {
            assert_eq!(p.recv, args[r].recv.unwrap().ptr);
            assert_eq!(p.send, p.recv + (r * 10 * F32) as u64);
        }
    }

    #[test]
    fn all_gather_in_place_buffer_too_short() {
        let reason = err(run(AG, &inp(3, 25)), Some(0), Arg::Recv);
        assert!(reason.contains("30") && reason.contains("25"), "{reason}");
    }

    #[test]
    fn all_gather_exact_pointer_in_place() {
        let args: Vec<_> = (0..3)
            .map(|r| {
                let q = buf(r, 0, 30);
                RankArgs::out_of_place(q.offset(r * 10, F32).unwrap(), q)
            })
            .collect();
        assert_eq!(
            run(AG, &args).unwrap().layout,
            Layout::SendInRecv { stride: 10 }
        );
    }

    #[test]
    fn all_gather_send_at_wrong_slot_is_rejected() {
        let mut args: Vec<_> = (0..3)
            .map(|r| {
                let q = buf(r, 0, 30);
                RankArgs::out_of_place(q.offset(r * 10, F32).unwrap(), q)
            })
            .collect();
        let q = buf(1, 0, 30);
        args[1] = RankArgs::out_of_place(q.offset(20, F32).unwrap(), q); // rank 2's slot
        let reason = err(run(AG, &args), Some(1), Arg::Recv);
        assert!(
            reason.contains("send == recv + rank * sendcount"),
            "{reason}"
        );
    }

    // ---- broadcast ----

    fn bcast_args(n: usize, root: usize, count: usize) -> Vec<RankArgs> {
        (0..n)
            .map(|r| {
                if r == root {
                    RankArgs::send_only(buf(r, 0, count))
                } else {
                    RankArgs::recv_only(buf(r, 1, count))
                }
            })
            .collect()
    }

    #[test]
    fn broadcast_send_only_root_stands_in_for_its_recv() {
        let c = Collective::Broadcast { count: 50, root: 2 };
        let args = bcast_args(4, 2, 50);
        let plan = run(c, &args).unwrap();
        assert_eq!(plan.layout, Layout::SendInRecv { stride: 0 });
        let root = plan.ptrs[2];
        assert_eq!(
            (root.send, root.recv),
            (args[2].send.unwrap().ptr, args[2].send.unwrap().ptr)
        );
        assert!(root.reads_send && !root.writes_recv);
        for r in [0, 1, 3] {
            assert_eq!(plan.ptrs[r].recv, args[r].recv.unwrap().ptr);
            assert!(!plan.ptrs[r].reads_send && plan.ptrs[r].writes_recv);
        }
    }

    #[test]
    fn broadcast_root_out_of_place() {
        let c = Collective::Broadcast { count: 50, root: 0 };
        let mut args = bcast_args(3, 0, 50);
        args[0] = RankArgs::out_of_place(buf(0, 0, 50), buf(0, 1, 50));
        let plan = run(c, &args).unwrap();
        assert_eq!(plan.layout, Layout::OutOfPlace);
        assert_eq!(plan.ptrs[1].send, 0);
    }

    #[test]
    fn broadcast_root_in_place() {
        let c = Collective::Broadcast { count: 50, root: 1 };
        assert_eq!(
            run(c, &inp(3, 50)).unwrap().layout,
            Layout::SendInRecv { stride: 0 }
        );
    }

    #[test]
    fn broadcast_root_needs_send() {
        let c = Collective::Broadcast { count: 50, root: 1 };
        let mut args = bcast_args(3, 1, 50);
        args[1] = RankArgs::recv_only(buf(1, 1, 50));
        err(run(c, &args), Some(1), Arg::Send);
    }

    #[test]
    fn broadcast_non_root_needs_recv() {
        let c = Collective::Broadcast { count: 50, root: 0 };
        let mut args = bcast_args(3, 0, 50);
        args[2] = RankArgs::send_only(buf(2, 0, 50));
        err(run(c, &args), Some(2), Arg::Recv);
    }

    #[test]
    fn broadcast_root_out_of_range() {
        let c = Collective::Broadcast { count: 50, root: 3 };
        let reason = err(run(c, &bcast_args(3, 0, 50)), None, Arg::Root);
        assert!(
            reason.contains("root 3") && reason.contains("3 ranks"),
            "{reason}"
        );
    }

    #[test]
    fn broadcast_ignores_non_root_send() {
        let c = Collective::Broadcast { count: 50, root: 0 };
        let mut args = bcast_args(2, 0, 50);
        // A send buffer on the wrong device and too short: unused, so ignored (as NCCL does).
        args[1] = RankArgs::out_of_place(buf(0, 7, 1), buf(1, 1, 50));
        let plan = run(c, &args).unwrap();
        assert!(!plan.ptrs[1].reads_send);
    }

    #[test]
    fn broadcast_root_recv_too_short_when_given() {
        let c = Collective::Broadcast { count: 50, root: 0 };
        let mut args = bcast_args(2, 0, 50);
        args[0] = RankArgs::out_of_place(buf(0, 0, 50), buf(0, 1, 49));
        err(run(c, &args), Some(0), Arg::Recv);
    }

    // ---- reduce ----

    #[test]
    fn reduce_out_of_place() {
        let c = Collective::Reduce { count: 20, root: 1 };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 20))).collect();
        args[1] = RankArgs::out_of_place(buf(1, 0, 20), buf(1, 1, 20));
        let plan = run(c, &args).unwrap();
        assert_eq!(plan.layout, Layout::OutOfPlace);
        assert_eq!(plan.ptrs[0].recv, 0);
        assert!(plan.ptrs[1].writes_recv && !plan.ptrs[0].writes_recv);
    }

    #[test]
    fn reduce_root_in_place_aliases_non_roots() {
        let c = Collective::Reduce { count: 20, root: 0 };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 20))).collect();
        args[0] = RankArgs::in_place(buf(0, 0, 20));
        let plan = run(c, &args).unwrap();
        assert_eq!(plan.layout, Layout::SendInRecv { stride: 0 });
        // Every rank's send is reachable through its recv at offset 0.
        assert!(plan.ptrs.iter().all(|p| p.send == p.recv));
    }

    #[test]
    fn reduce_ignores_non_root_recv() {
        let c = Collective::Reduce { count: 20, root: 0 };
        let mut args = oop(2, 20, 20);
        args[1].recv = Some(buf(0, 9, 0)); // wrong device, too short: unused
        assert!(run(c, &args).is_ok());
    }

    #[test]
    fn reduce_needs_send_everywhere() {
        let c = Collective::Reduce { count: 20, root: 0 };
        let mut args = oop(3, 20, 20);
        args[2] = RankArgs::recv_only(buf(2, 1, 20));
        err(run(c, &args), Some(2), Arg::Send);
    }

    #[test]
    fn reduce_root_needs_recv() {
        let c = Collective::Reduce { count: 20, root: 2 };
        let args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 20))).collect();
        err(run(c, &args), Some(2), Arg::Recv);
    }

    #[test]
    fn reduce_root_out_of_range() {
        err(
            run(Collective::Reduce { count: 20, root: 9 }, &oop(3, 20, 20)),
            None,
            Arg::Root,
        );
    }

    // ---- all-to-all ----

    const A2A: Collective = Collective::AllToAll { count_per_peer: 5 };

    #[test]
    fn all_to_all_shapes() {
        assert!(run(A2A, &oop(4, 20, 20)).is_ok());
        err(run(A2A, &oop(4, 19, 20)), Some(0), Arg::Send);
        err(run(A2A, &oop(4, 20, 19)), Some(0), Arg::Recv);
    }

    #[test]
    fn all_to_all_in_place_is_rejected() {
        let reason = err(run(A2A, &inp(2, 10)), Some(0), Arg::Recv);
        assert!(reason.contains("in place"), "{reason}");
    }

    #[test]
    fn all_to_all_same_pointer_is_rejected() {
        let args: Vec<_> = (0..2)
            .map(|r| RankArgs::out_of_place(buf(r, 0, 10), buf(r, 0, 10)))
            .collect();
        err(run(A2A, &args), Some(0), Arg::Recv);
    }

    // ---- gather ----

    #[test]
    fn gather_out_of_place() {
        let c = Collective::Gather {
            sendcount: 8,
            root: 1,
        };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 8))).collect();
        args[1] = RankArgs::out_of_place(buf(1, 0, 8), buf(1, 1, 24));
        assert_eq!(run(c, &args).unwrap().layout, Layout::OutOfPlace);
        args[1] = RankArgs::out_of_place(buf(1, 0, 8), buf(1, 1, 23));
        err(run(c, &args), Some(1), Arg::Recv);
    }

    #[test]
    fn gather_root_in_place_gives_non_roots_a_consistent_base() {
        let c = Collective::Gather {
            sendcount: 8,
            root: 1,
        };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 8))).collect();
        args[1] = RankArgs::in_place(buf(1, 0, 24));
        let plan = run(c, &args).unwrap();
        assert_eq!(plan.layout, Layout::SendInRecv { stride: 8 });
        for (r, p) in plan.ptrs.iter().enumerate() {
            assert_eq!(p.recv + (r * 8 * F32) as u64, p.send, "rank {r}");
        }
        assert_eq!(plan.ptrs[2].send, args[2].send.unwrap().ptr);
        assert_eq!(plan.ptrs[1].recv, args[1].recv.unwrap().ptr);
    }

    #[test]
    fn gather_non_root_needs_send() {
        let c = Collective::Gather {
            sendcount: 8,
            root: 0,
        };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 8))).collect();
        args[0] = RankArgs::out_of_place(buf(0, 0, 8), buf(0, 1, 24));
        args[2] = RankArgs::recv_only(buf(2, 1, 8));
        err(run(c, &args), Some(2), Arg::Send);
    }

    // ---- scatter ----

    #[test]
    fn scatter_out_of_place() {
        let c = Collective::Scatter {
            recvcount: 8,
            root: 0,
        };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::recv_only(buf(r, 1, 8))).collect();
        args[0] = RankArgs::out_of_place(buf(0, 0, 24), buf(0, 1, 8));
        let plan = run(c, &args).unwrap();
        assert_eq!(plan.layout, Layout::OutOfPlace);
        assert_eq!(plan.ptrs[2].send, 0);
    }

    #[test]
    fn scatter_root_in_place_gives_non_roots_a_consistent_base() {
        let c = Collective::Scatter {
            recvcount: 8,
            root: 2,
        };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::recv_only(buf(r, 1, 8))).collect();
        args[2] = RankArgs::in_place(buf(2, 0, 24));
        let plan = run(c, &args).unwrap();
        assert_eq!(plan.layout, Layout::RecvInSend { stride: 8 });
        for (r, p) in plan.ptrs.iter().enumerate() {
            assert_eq!(p.send + (r * 8 * F32) as u64, p.recv, "rank {r}");
        }
    }

    #[test]
    fn scatter_root_needs_whole_send() {
        let c = Collective::Scatter {
            recvcount: 8,
            root: 0,
        };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::recv_only(buf(r, 1, 8))).collect();
        args[0] = RankArgs::recv_only(buf(0, 1, 8));
        err(run(c, &args), Some(0), Arg::Send);
        args[0] = RankArgs::out_of_place(buf(0, 0, 16), buf(0, 1, 8));
        let reason = err(run(c, &args), Some(0), Arg::Send);
        assert!(reason.contains("24") && reason.contains("16"), "{reason}");
    }

    #[test]
    fn scatter_non_root_needs_recv() {
        let c = Collective::Scatter {
            recvcount: 8,
            root: 0,
        };
        let mut args: Vec<_> = (0..3).map(|r| RankArgs::recv_only(buf(r, 1, 8))).collect();
        args[0] = RankArgs::out_of_place(buf(0, 0, 24), buf(0, 1, 8));
        args[1] = RankArgs::send_only(buf(1, 0, 8));
        err(run(c, &args), Some(1), Arg::Recv);
    }

    // ---- send/recv ----

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
        err(
            r.map(|_| Plan {
                layout: Layout::OutOfPlace,
                ptrs: Vec::new(),
            }),
            rank,
            arg,
        )
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

    // ---- plumbing ----

    #[test]
    fn chunk_is_bounded_and_positive() {
        for dt in DataType::ALL {
            let big = 1usize << 40;
            assert_eq!(chunk_elems(big, 2, dt), (big / 2) / dt.size());
            assert_eq!(
                chunk_elems(big, 4, dt),
                (big / 4 / crate::tuning::PIPELINE_CHUNKS) / dt.size()
            );
            assert_eq!(chunk_elems(0, 8, dt), 1);
            assert_eq!(chunk_elems(dt.size(), 0, dt), 1);
        }
        assert_eq!(chunk_elems(1000, 3, DataType::U8), 334);
    }

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
    }

    #[test]
    fn errors_display_rank_and_say_nothing_ran() {
        let mut args = oop(2, 100, 100);
        args[1].recv = Some(buf(1, 1, 1));
        let msg = run(AR, &args).unwrap_err().to_string();
        assert!(
            msg.contains("rank 1") && msg.contains("nothing was launched"),
            "{msg}"
        );
    }
}
