//! Property tests of validation: whatever the buffers, a call that validation accepts touches
//! only the memory the caller gave it (reads inside a given buffer of the rank, writes inside
//! its output or its in-place buffer), through the schedules of one process and through the
//! network transport's groups alike, and validation never panics.

use proptest::prelude::*;

use super::super::buffer::{RankArgs, RawBuf};
use super::super::collective::Collective;
use super::super::test_util::buf;
use super::validate;
use crate::plan::net::At;
use crate::plan::p2p::Dir;
use crate::schedule::{BufId, Region};

/// The collective `kind` (0..8) with `count` elements and root `root`.
fn collective(kind: usize, count: usize, root: usize) -> Collective {
    match kind {
        0 => Collective::AllReduce { count },
        1 => Collective::ReduceScatter { recvcount: count },
        2 => Collective::AllGather { sendcount: count },
        3 => Collective::Broadcast { count, root },
        4 => Collective::Reduce { count, root },
        5 => Collective::AllToAll {
            count_per_peer: count,
        },
        6 => Collective::Gather {
            sendcount: count,
            root,
        },
        _ => Collective::Scatter {
            recvcount: count,
            root,
        },
    }
}

/// One rank's arguments, as drawn.
#[derive(Clone, Copy, Debug)]
struct Draw {
    /// 0: out of place; 1: in place; 2: input only; 3: output only; 4: input placed inside the
    /// output at an element offset.
    mode: usize,
    /// How the lengths are chosen: the call's count, count × n, count × n + 1, or `any`.
    send_len: usize,
    recv_len: usize,
    any_len: usize,
    /// Element offset of the input inside the output (mode 4): rank × count, or `any_off`.
    at_rank_slot: bool,
    any_off: usize,
}

fn draw() -> impl Strategy<Value = Draw> {
    (0usize..5, 0usize..4, 0usize..4, 0usize..300, any::<bool>(), 0usize..300).prop_map(
        |(mode, send_len, recv_len, any_len, at_rank_slot, any_off)| Draw {
            mode,
            send_len,
            recv_len,
            any_len,
            at_rank_slot,
            any_off,
        },
    )
}

fn len_of(choice: usize, count: usize, n: usize, any_len: usize) -> usize {
    match choice {
        0 => count,
        1 => count * n,
        2 => count * n + 1,
        _ => any_len,
    }
}

fn args_of(d: &Draw, r: usize, count: usize, n: usize) -> RankArgs {
    let send = buf(r, 0, len_of(d.send_len, count, n, d.any_len));
    let recv = buf(r, 1, len_of(d.recv_len, count, n, d.any_len));
    match d.mode {
        0 => RankArgs::out_of_place(send, recv),
        1 => RankArgs::in_place(recv),
        2 => RankArgs {
            send: Some(send),
            recv: None,
            in_place: false,
        },
        3 => RankArgs {
            send: None,
            recv: Some(recv),
            in_place: false,
        },
        _ => {
            let off = if d.at_rank_slot { r * count } else { d.any_off };
            let inner = RawBuf::new(recv.ptr + (off * 4) as u64, send.len, r);
            RankArgs::out_of_place(inner, recv)
        }
    }
}

/// Whether `[lo, lo + bytes)` lies inside `b` (elements of `size` bytes).
fn inside(b: Option<RawBuf>, lo: u64, bytes: u64, size: usize) -> bool {
    b.is_some_and(|b| lo >= b.ptr && lo + bytes <= b.ptr + (b.len * size) as u64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn accepted_calls_touch_only_the_callers_buffers(
        kind in 0usize..8,
        n in 1usize..6,
        count in 0usize..40,
        root in 0usize..6,
        chunk in 1usize..20,
        draws in prop::collection::vec(draw(), 6),
    ) {
        let size = 4;
        let c = collective(kind, count, root);
        let args: Vec<RankArgs> = (0..n).map(|r| args_of(&draws[r], r, count, n)).collect();
        let devices: Vec<usize> = (0..n).collect();
        let Ok(v) = validate(c, &args, &devices, &devices, size) else {
            // Refused: with a typed error (checked by the type), before anything else.
            return Ok(());
        };
        let ring: Vec<usize> = (0..n).collect();
        let s = c.schedule(&ring, v.layout, chunk);
        let addr = |g: &Region| -> Option<(u64, u64)> {
            let p = &v.ptrs[g.rank];
            let base = match g.buf {
                BufId::Send => p.send,
                BufId::Recv => p.recv,
                BufId::Scratch => return None,
            };
            Some((base + (g.offset * size) as u64, (g.len * size) as u64))
        };
        // The same for the network transport's groups of point-to-point transfers.
        let in_place = v.layout != crate::schedule::Layout::OutOfPlace;
        for (r, a) in args.iter().enumerate() {
            let p = &v.ptrs[r];
            for g in crate::plan::net::groups((c.kind(), c.count(), c.root().unwrap_or(0)), (r, n), size, in_place) {
                for o in g.ops.iter().filter(|o| o.bytes > 0) {
                    let lo = match o.at {
                        At::Send(off) => p.send + off as u64,
                        At::Recv(off) => p.recv + off as u64,
                    };
                    let bytes = o.bytes as u64;
                    let ok = match o.dir {
                        Dir::Send => inside(a.send, lo, bytes, size) || inside(a.recv, lo, bytes, size),
                        Dir::Recv => {
                            let writable = if a.in_place { a.send.or(a.recv) } else { a.recv };
                            inside(writable, lo, bytes, size)
                        }
                    };
                    prop_assert!(ok, "{c:?}: rank {r}'s network transfer {o:?} is outside its buffers {a:?}");
                }
            }
        }
        for (j, step) in s.steps.iter().enumerate() {
            for g in step.srcs.iter().filter(|g| g.len > 0) {
                let Some((lo, bytes)) = addr(g) else { continue };
                let a = &args[g.rank];
                prop_assert!(
                    inside(a.send, lo, bytes, size) || inside(a.recv, lo, bytes, size),
                    "{c:?} {:?}: step {j} reads {g:?} outside rank {}'s buffers {a:?}",
                    v.layout, g.rank
                );
            }
            for g in step.dsts.iter().filter(|g| g.len > 0) {
                let Some((lo, bytes)) = addr(g) else { continue };
                let a = &args[g.rank];
                let writable = if a.in_place { a.send.or(a.recv) } else { a.recv };
                prop_assert!(
                    inside(writable, lo, bytes, size),
                    "{c:?} {:?}: step {j} writes {g:?} outside rank {}'s output {a:?}",
                    v.layout, g.rank
                );
            }
        }
    }
}
