//! Validation of a call, as a pure function of the buffers' addresses, lengths and devices
//! ([`RawBuf`]), the streams' devices, the counts and the root. A rejected call returns
//! [`Error::InvalidArgument`] naming the rank and the problem, before anything is enqueued.
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
//! After these pure checks, [`context`] asks the driver whether each stream and buffer belongs
//! to the context ringccl uses on the rank's device, and whether pool memory is accessible
//! from the peers that touch it.

use super::buffer::{RankArgs, RawBuf};
use super::collective::{Collective, Need};
use crate::per_rank::PerRank;
use crate::schedule::Layout;
use crate::{Arg, Error, Result};


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
pub struct Validated {
    /// In place or not (one layout for all ranks).
    pub layout: Layout,
    /// Per rank.
    pub ptrs: PerRank<Ptrs>,
}

/// Byte size of `elems` elements (callers have checked it does not overflow).
pub(crate) fn bytes(elems: usize, size: usize) -> u64 {
    elems.saturating_mul(size) as u64
}

/// Checks the argument count, the stream devices and that the biggest buffer's byte size fits.
pub(crate) fn check_common(
    name: &str,
    nargs: usize,
    held: &Held<'_>,
    streams: &[usize],
    max_elems: Option<usize>,
    elem_size: usize,
) -> Result<()> {
    let (n, k) = (held.nranks, held.ranks.len());
    if n == 0 || k == 0 {
        return Err(Error::invalid(
            None,
            Arg::Ranks,
            format!("{name}: the communicator has no ranks"),
        ));
    }
    // Formatted only for an error: a call that passes allocates nothing here.
    let whose = || {
        if k == n {
            format!("a communicator of {n} ranks")
        } else {
            format!("the {k} rank(s) this communicator holds (of {n})")
        }
    };
    if nargs != k {
        return Err(Error::invalid(
            None,
            Arg::Ranks,
            format!("{name}: {nargs} per-rank arguments given for {}", whose()),
        ));
    }
    if streams.len() != k {
        return Err(Error::invalid(
            None,
            Arg::Stream,
            format!("{name}: {} streams given for {}", streams.len(), whose()),
        ));
    }
    if max_elems.and_then(|e| e.checked_mul(elem_size)).is_none() {
        return Err(Error::invalid(
            None,
            Arg::Count,
            format!("{name}: the count times {n} ranks times {elem_size} bytes overflows"),
        ));
    }
    for ((&s, &d), &r) in streams.iter().zip(held.devices).zip(held.ranks) {
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

/// The ranks a call's arguments are for: `ranks[i]` (of `nranks`) on device `devices[i]`. A
/// communicator of one process holds every rank; one rank of a job of processes holds itself.
#[derive(Clone, Copy, Debug)]
pub struct Held<'a> {
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The ranks held here, in argument order.
    pub ranks: &'a [usize],
    /// Their devices.
    pub devices: &'a [usize],
}

/// Checks one buffer against what the collective needs of it.
pub(crate) fn check_buf(
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
/// use ringccl::internals::api::{buffer::RankArgs, collective::Collective, validate::validate};
/// use ringccl::internals::schedule::Layout;
/// use ringccl::RawBuf;
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
) -> Result<Validated> {
    let ranks: PerRank<usize> = (0..devices.len()).collect();
    let held = Held {
        nranks: devices.len(),
        ranks: &ranks,
        devices,
    };
    validate_held(c, args, &held, streams, elem_size)
}

/// [`validate`] for the ranks `held` holds (argument `i` is rank `held.ranks[i]`'s): every check
/// that needs only those ranks' arguments. Whether the other ranks agree (same count, type,
/// root, layout) is not seen from here.
pub fn validate_held(
    c: Collective,
    args: &[RankArgs],
    held: &Held<'_>,
    streams: &[usize],
    elem_size: usize,
) -> Result<Validated> {
    let name = c.name();
    let n = held.nranks;
    check_common(name, args.len(), held, streams, c.max_elems(n), elem_size)?;
    if let Some(root) = c.root() {
        if root >= n {
            return Err(Error::invalid(
                None,
                Arg::Root,
                format!("{name}: root {root} is out of range for {n} ranks"),
            ));
        }
    }

    let mut resolved = PerRank::with_capacity(args.len());
    for ((a, &r), &device) in args.iter().zip(held.ranks).zip(held.devices) {
        resolved.push(resolve_rank(c, r, n, a, device, elem_size)?);
    }

    // One layout for every rank.
    let mut first: Option<(usize, bool)> = None;
    for (res, &r) in resolved.iter().zip(held.ranks) {
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
    let mut ptrs = PerRank::with_capacity(resolved.len());
    for (res, &r) in resolved.iter().zip(held.ranks) {
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
    Ok(Validated { layout, ptrs })
}

pub(crate) mod context;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
