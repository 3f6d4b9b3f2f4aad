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

use super::buffer::{RankArgs, RawBuf};
use super::collective::{Collective, Need};
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
    pub ptrs: Vec<Ptrs>,
}

/// Byte size of `elems` elements (callers have checked it does not overflow).
pub(crate) fn bytes(elems: usize, size: usize) -> u64 {
    elems.saturating_mul(size) as u64
}

/// Checks the argument count, the stream devices and that the biggest buffer's byte size fits.
pub(crate) fn check_common(
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
    Ok(Validated { layout, ptrs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::test_util::*;

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
    #[test]
    fn errors_display_rank_and_say_nothing_ran() {
        let mut args = oop(2, 100, 100);
        args[1].recv = Some(buf(1, 1, 1));
        let msg = run(AR, &args).unwrap_err().to_string();
        assert!(
            msg.contains("rank 1") && msg.contains("enqueued nothing"),
            "{msg}"
        );
    }
}
