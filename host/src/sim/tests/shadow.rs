//! Every collective rewritten for peer access through scratch only
//! ([`crate::schedule::through_scratch`]): the same send and receive buffers as the original
//! schedule, bit for bit, in issue order and in random orders.

use super::*;
use crate::schedule::{peer_private_access, through_scratch};

const ALL: [Coll; 8] = [
    Coll::AllReduce,
    Coll::ReduceScatter,
    Coll::AllGather,
    Coll::Broadcast,
    Coll::Reduce,
    Coll::AllToAll,
    Coll::Gather,
    Coll::Scatter,
];

/// The rewrite of `s`: valid, finished, no step touching a peer's send or receive buffer, and
/// `s` itself when `s` already had none.
fn rewrite(s: &Schedule) -> Schedule {
    let t = through_scratch(s).unwrap_or_else(|e| panic!("rewrite failed: {e}"));
    t.validate().unwrap();
    if t.steps.iter().all(|st| st.srcs.len() <= 2) {
        check_invariants(&t); // (written for the generators' 1- and 2-source steps)
    }
    assert_eq!(
        peer_private_access(&t),
        None,
        "a peer's private buffer survived"
    );
    assert!(t.scratch_len >= s.scratch_len);
    if peer_private_access(s).is_none() {
        assert_eq!(&t, s);
    }
    // Every original step survives (possibly split); the rest are local copies.
    assert!(t.steps.len() >= s.steps.len());
    t
}

fn same_bits<T: Element + fmt::Debug>(got: &[Vec<T>], want: &[Vec<T>], what: &str, ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: {what} rank count");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{ctx}: {what}[{r}] length");
        if let Some(i) = (0..g.len()).find(|&i| g[i].to_raw() != w[i].to_raw()) {
            panic!("{ctx}: {what}[{r}][{i}] = {:?}, expected {:?}", g[i], w[i]);
        }
    }
}

/// Runs `s` in issue order and its rewrite in issue order and under each seed; the rewrite's
/// send and receive buffers must equal the original's bit for bit.
fn compare<T: Element + fmt::Debug>(
    s: &Schedule,
    op: RedOp,
    send: &[Vec<T>],
    recv: &[Vec<T>],
    seeds: &[u64],
    ctx: &str,
) -> SimRanks<T> {
    let t = rewrite(s);
    let mut want = SimRanks::new(s, send.to_vec(), recv.to_vec());
    run(s, op, &mut want, Order::Issue).unwrap_or_else(|e| panic!("{ctx}: original: {e}"));
    let orders = std::iter::once(Order::Issue).chain(seeds.iter().map(|&x| Order::Random(x)));
    for order in orders {
        let mut got = SimRanks::new(&t, send.to_vec(), recv.to_vec());
        run(&t, op, &mut got, order).unwrap_or_else(|e| panic!("{ctx} {order:?}: {e}"));
        same_bits(&got.send, &want.send, "send", &format!("{ctx} {order:?}"));
        same_bits(&got.recv, &want.recv, "recv", &format!("{ctx} {order:?}"));
    }
    want
}

#[allow(clippy::too_many_arguments)]
fn check_rewrite<T: TestElem>(
    coll: Coll,
    ring: &[usize],
    count: usize,
    root: usize,
    in_place: bool,
    chunk: usize,
    op: RedOp,
    seeds: &[u64],
) {
    let layout = layout_for(coll, count, in_place);
    let s = build(coll, ring, count, root, layout, chunk);
    let st = setup::<T>(coll, ring.len(), count, root, in_place, op);
    let ctx = format!(
        "{coll:?} {} ring {ring:?} count {count} root {root} {layout:?} chunk {chunk} {op:?}",
        T::NAME
    );
    let want = compare(&s, op, &st.send, &st.recv, seeds, &ctx);
    assert_same(&want.send, &st.exp_send, "send", &ctx);
    assert_same(&want.recv, &st.exp_recv, "recv", &ctx);
}

/// n in 1..=8 and 16, awkward and larger counts, pipelining chunks, both layouts.
fn sweep(coll: Coll) {
    let mut case = 0u64;
    for n in (1..=8).chain([16]) {
        let ring: Vec<usize> = (0..n).collect();
        let mut counts = vec![0, 1, n - 1, n + 1, 7, 130];
        counts.sort_unstable();
        counts.dedup();
        for &count in &counts {
            for chunk in [1, 3, 64] {
                if chunk == 1 && (n > 8 || count > 7) {
                    continue; // thousands of one-element steps
                }
                for in_place in [false, true] {
                    case += 1;
                    let op = RedOp::ALL[case as usize % 5];
                    let root = if rooted(coll) { case as usize % n } else { 0 };
                    let seeds = [case, case + 1000];
                    check_rewrite::<u32>(coll, &ring, count, root, in_place, chunk, op, &seeds);
                }
            }
        }
    }
}

/// Shuffled rings, every root on the way, larger counts, every operator on two types.
fn sweep_rings_ops(coll: Coll) {
    let mut rng = Rng(coll as u64 + 17);
    for n in [2, 3, 5, 8] {
        let mut ring: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            ring.swap(i, rng.below(i + 1));
        }
        let count = if coll == Coll::AllToAll { 257 } else { 2049 };
        for (k, chunk) in [64, 1000].into_iter().enumerate() {
            let root = rng.below(n);
            let op = RedOp::ALL[rng.below(5)];
            let seeds = [n as u64, 99];
            check_rewrite::<u32>(coll, &ring, count, root, k == 1, chunk, op, &seeds);
        }
        for op in RedOp::ALL {
            for in_place in [false, true] {
                let root = rng.below(n);
                check_rewrite::<f32>(coll, &ring, 13, root, in_place, 4, op, &[1, 2]);
                check_rewrite::<i64>(coll, &ring, 13, root, in_place, 4, op, &[3]);
            }
        }
    }
}

#[test]
fn rewrite_of_every_collective_every_n_count_chunk_and_layout() {
    for coll in ALL {
        sweep(coll);
    }
}

#[test]
fn rewrite_of_every_collective_shuffled_rings_every_op() {
    for coll in ALL {
        sweep_rings_ops(coll);
    }
}

#[test]
fn rewrite_of_every_root() {
    for coll in ALL.into_iter().filter(|&c| rooted(c)) {
        for n in [2, 3, 4, 7] {
            let ring: Vec<usize> = (0..n).rev().collect();
            for root in 0..n {
                for in_place in [false, true] {
                    let op = RedOp::ALL[(n + root) % 5];
                    check_rewrite::<i64>(coll, &ring, n + 2, root, in_place, 2, op, &[7]);
                }
            }
        }
    }
}

/// A send/recv group rewritten, against the original.
fn check_p2p_rewrite(n: usize, pairs: &[P2p], layout: Layout, chunk: usize) {
    let ring: Vec<usize> = (0..n).collect();
    let s = sch::send_recv(&ring, pairs, layout, chunk);
    let (mut sent, mut got) = (vec![0; n], vec![0; n]);
    for p in pairs {
        sent[p.from] += p.count;
        got[p.to] += p.count;
    }
    let in_place = layout == Layout::SendInRecv { stride: 0 };
    let buf = |r: usize, len: usize, salt: u64| -> Vec<u64> {
        (0..len).map(|i| hash(r as u64, i as u64, salt)).collect()
    };
    let (send, recv): (Vec<Vec<u64>>, Vec<Vec<u64>>) = if in_place {
        let both = (0..n).map(|r| buf(r, sent[r].max(got[r]), 9)).collect();
        (vec![Vec::new(); n], both)
    } else {
        (
            (0..n).map(|r| buf(r, sent[r], 9)).collect(),
            (0..n).map(|r| buf(r, got[r], 10)).collect(),
        )
    };
    let ctx = format!("send_recv {pairs:?} {layout:?} chunk {chunk}");
    compare(&s, RedOp::Sum, &send, &recv, &[1, 2], &ctx);
}

#[test]
fn rewrite_of_send_recv_groups() {
    for n in (1..=8).chain([16]) {
        let ring_pairs: Vec<P2p> = (0..n)
            .map(|r| P2p {
                from: r,
                to: (r + 1) % n,
                count: 7 + r,
            })
            .collect();
        let mut all_pairs = Vec::new();
        for a in 0..n.min(5) {
            for b in 0..n.min(5) {
                all_pairs.push(P2p {
                    from: a,
                    to: b,
                    count: (a * 3 + b) % 5,
                });
            }
        }
        for layout in [Layout::OutOfPlace, Layout::SendInRecv { stride: 0 }] {
            for chunk in [1, 3, 64] {
                check_p2p_rewrite(n, &ring_pairs, layout, chunk);
                check_p2p_rewrite(n, &all_pairs, layout, chunk);
            }
        }
    }
    check_p2p_rewrite(3, &[], Layout::OutOfPlace, 64);
}

#[test]
fn rewrite_of_all_to_all_with_recv_in_send() {
    for n in [1, 2, 3, 6] {
        let ring: Vec<usize> = (0..n).collect();
        let s = sch::all_to_all(&ring, 5, Layout::RecvInSend { stride: 0 }, 2);
        let inp = data::<u32>(RedOp::Sum, n, n * 5, 11);
        compare(
            &s,
            RedOp::Sum,
            &inp,
            &vec![Vec::new(); n],
            &[4, 5],
            "all_to_all",
        );
    }
}

/// Random valid schedules (overlapping reads, reads and writes of every buffer of every rank,
/// regions straddling each other), rewritten: the same send and receive buffers.
#[test]
fn rewrite_of_random_schedules() {
    const LEN: usize = 24;
    let mut rng = Rng(0xC0FFEE);
    for case in 0..400u64 {
        let n = 2 + rng.below(4);
        let mut s = Schedule::new(n);
        for _ in 0..1 + rng.below(12) {
            let len = 1 + rng.below(8);
            let region = |rng: &mut Rng| {
                let buf = [BufId::Send, BufId::Recv, BufId::Scratch][rng.below(3)];
                Region::new(rng.below(n), buf, rng.below(LEN - len + 1), len)
            };
            let srcs: Vec<Region> = (0..1 + rng.below(3)).map(|_| region(&mut rng)).collect();
            let mut dsts: Vec<Region> = Vec::new();
            for _ in 0..1 + usize::from(srcs.len() <= 2 && rng.below(2) == 0) {
                let d = if rng.below(4) == 0 {
                    srcs[rng.below(srcs.len())]
                } else {
                    region(&mut rng)
                };
                let fits = srcs.iter().all(|x| *x == d || !x.overlaps(&d))
                    && dsts.iter().all(|e| !e.overlaps(&d));
                if fits {
                    dsts.push(d);
                }
            }
            if dsts.is_empty() {
                continue;
            }
            let finish = srcs.len() > 1 && rng.below(2) == 0;
            s.push(Step::reduce(rng.below(n), srcs, dsts, finish));
        }
        let layout = if case % 3 == 0 {
            Layout::SendInRecv { stride: 0 }
        } else {
            Layout::OutOfPlace
        };
        let mut s = s.finish(layout);
        s.scratch_len = LEN;
        if s.validate().is_err() {
            // Aliasing made a destination overlap a source: refused, not a panic.
            assert!(through_scratch(&s).is_err());
            continue;
        }
        let send = data::<i64>(RedOp::Sum, n, LEN, case);
        let recv = data::<i64>(RedOp::Sum, n, LEN, case + 1);
        let op = RedOp::ALL[case as usize % 5];
        compare(
            &s,
            op,
            &send,
            &recv,
            &[case, case + 1, case + 2],
            &format!("{s:?}"),
        );
    }
}
