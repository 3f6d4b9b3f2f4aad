//! Every rank's groups run together on the CPU: buffered channels between ranks, a group's
//! receives taken once the peers' matching sends are posted, and a group done only once its
//! own sends were taken (a rendezvous per pair, as the point-to-point plans make it). The
//! results are compared with each collective's definition.

use std::collections::{HashMap, VecDeque};

use gpu_kernels::op::RedOp;

use super::{groups, hierarchical, hierarchical_all_reduce, ring_groups, split, At, Machines, NetGroup, RingGroup};
use crate::api::collective::Collective;
use crate::plan::p2p::Dir;
use crate::schedule::Layout;

const SIZE: usize = 4;

/// A rank's memory and where its buffers are in it (elements).
struct Mem {
    data: Vec<u32>,
    send: usize,
    recv: usize,
    send_len: usize,
    recv_len: usize,
}

impl Mem {
    fn at(&self, at: At) -> usize {
        match at {
            At::Send(b) => self.send + b / SIZE,
            At::Recv(b) => self.recv + b / SIZE,
        }
    }
}

fn layout_mem(c: Collective, r: usize, n: usize, in_place: bool, salt: u32) -> Mem {
    let (ns, nr) = c.needs(r, n);
    let (send_len, recv_len) = (ns.elems(), nr.elems());
    let (send, recv) = match (in_place, c.in_place_layout()) {
        (true, Some(Layout::SendInRecv { stride })) => (r * stride, 0),
        (true, Some(Layout::RecvInSend { stride })) => (0, r * stride),
        _ => (0, send_len),
    };
    let len = (send + send_len).max(recv + recv_len);
    let data = (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ salt.wrapping_mul(40_503).wrapping_add(r as u32)) % 1000 + 1)
        .collect();
    Mem {
        data,
        send,
        recv,
        send_len,
        recv_len,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Start,
    Posted,
    Received,
}

/// Runs every rank's groups; panics on a deadlock.
fn run(all: &[Vec<NetGroup>], mems: &mut [Mem], op: RedOp) {
    let n = all.len();
    let mut chan: HashMap<(usize, usize), VecDeque<u32>> = HashMap::new();
    let mut pushed = vec![vec![0usize; n]; n];
    let mut popped = vec![vec![0usize; n]; n];
    let mut next = vec![0usize; n];
    let mut state = vec![State::Start; n];
    let mut target = vec![vec![0usize; n]; n];
    loop {
        let mut progress = false;
        for r in 0..n {
            let Some(g) = all[r].get(next[r]) else { continue };
            match state[r] {
                State::Start => {
                    for o in g.ops.iter().filter(|o| o.dir == Dir::Send) {
                        let at = mems[r].at(o.at);
                        let q = chan.entry((r, o.peer)).or_default();
                        q.extend(&mems[r].data[at..at + o.bytes / SIZE]);
                        pushed[r][o.peer] += o.bytes / SIZE;
                    }
                    target[r] = pushed[r].clone();
                    state[r] = State::Posted;
                    progress = true;
                }
                State::Posted => {
                    let mut need = vec![0usize; n];
                    for o in g.ops.iter().filter(|o| o.dir == Dir::Recv) {
                        need[o.peer] += o.bytes / SIZE;
                    }
                    let ready = (0..n).all(|q| chan.get(&(q, r)).map_or(0, VecDeque::len) >= need[q]);
                    if !ready {
                        continue;
                    }
                    // A transfer of 0 bytes is no transfer (as in the point-to-point plans).
                    for o in g.ops.iter().filter(|o| o.dir == Dir::Recv && o.bytes > 0) {
                        let at = mems[r].at(o.at);
                        let q = chan.get_mut(&(o.peer, r)).expect("checked above");
                        for i in 0..o.bytes / SIZE {
                            let v = q.pop_front().expect("checked above");
                            let d = &mut mems[r].data[at + i];
                            *d = if g.reduce && o.peer != r {
                                op.finish(op.combine(v, *d), g.postdiv)
                            } else {
                                v
                            };
                        }
                        popped[o.peer][r] += o.bytes / SIZE;
                    }
                    state[r] = State::Received;
                    progress = true;
                }
                State::Received => {
                    if (0..n).all(|q| popped[r][q] >= target[r][q]) {
                        next[r] += 1;
                        state[r] = State::Start;
                        progress = true;
                    }
                }
            }
        }
        if next.iter().zip(all).all(|(&i, g)| i == g.len()) {
            return;
        }
        assert!(progress, "deadlock: ranks at groups {next:?} in states {state:?}");
    }
}

fn red(op: RedOp, vals: impl Iterator<Item = u32>, n: usize) -> u32 {
    let mut it = vals;
    let first = it.next().expect("at least one rank");
    op.finish(it.fold(first, |a, b| op.combine(a, b)), n as u32)
}

/// What rank `r`'s output must hold, from every rank's input.
fn expected(c: Collective, r: usize, n: usize, input: &[Vec<u32>]) -> Option<Vec<u32>> {
    let k = c.count();
    let root = c.root().unwrap_or(0);
    Some(match c {
        Collective::AllReduce { .. } => (0..k).map(|i| red(OP.with(|o| o.get()), input.iter().map(|v| v[i]), n)).collect(),
        Collective::ReduceScatter { .. } => {
            (0..k).map(|i| red(OP.with(|o| o.get()), input.iter().map(|v| v[r * k + i]), n)).collect()
        }
        Collective::Reduce { .. } if r == root => {
            (0..k).map(|i| red(OP.with(|o| o.get()), input.iter().map(|v| v[i]), n)).collect()
        }
        Collective::AllGather { .. } => input.concat(),
        Collective::Broadcast { .. } => input[root].clone(),
        Collective::AllToAll { .. } => (0..n).flat_map(|q| input[q][r * k..(r + 1) * k].to_vec()).collect(),
        Collective::Gather { .. } if r == root => input.concat(),
        Collective::Scatter { .. } => input[root][r * k..(r + 1) * k].to_vec(),
        _ => return None,
    })
}

thread_local! {
    static OP: std::cell::Cell<RedOp> = const { std::cell::Cell::new(RedOp::Sum) };
}

fn all_collectives(count: usize, root: usize) -> [Collective; 8] {
    [
        Collective::AllReduce { count },
        Collective::ReduceScatter { recvcount: count },
        Collective::AllGather { sendcount: count },
        Collective::Broadcast { count, root },
        Collective::Reduce { count, root },
        Collective::AllToAll { count_per_peer: count },
        Collective::Gather { sendcount: count, root },
        Collective::Scatter { recvcount: count, root },
    ]
}

#[test]
fn every_collective_over_point_to_point_groups() {
    let mut cases = 0;
    for n in 1..=5 {
        for count in [1usize, 2, 3, 7, 10] {
            for root in 0..n {
                for (ci, c) in all_collectives(count, root).into_iter().enumerate() {
                    if c.root().is_none() && root > 0 {
                        continue;
                    }
                    for in_place in [false, true] {
                        if in_place && c.in_place_layout().is_none() {
                            continue;
                        }
                        let op = RedOp::ALL[(n + count + root + ci) % 5];
                        OP.with(|o| o.set(op));
                        let mut mems: Vec<Mem> = (0..n).map(|r| layout_mem(c, r, n, in_place, (count * 31 + ci) as u32)).collect();
                        let input: Vec<Vec<u32>> = mems.iter().map(|m| m.data[m.send..m.send + m.send_len].to_vec()).collect();
                        let all: Vec<Vec<NetGroup>> =
                            (0..n).map(|r| groups((c.kind(), c.count(), root), (r, n), SIZE, in_place)).collect();
                        run(&all, &mut mems, op);
                        for (r, m) in mems.iter().enumerate() {
                            let ctx = format!("{c:?} n {n} rank {r} in place {in_place} {op:?}");
                            if let Some(want) = expected(c, r, n, &input) {
                                assert_eq!(&m.data[m.recv..m.recv + m.recv_len], &want[..], "{ctx}");
                            }
                            if !in_place {
                                assert_eq!(&m.data[m.send..m.send + m.send_len], &input[r][..], "{ctx}: input changed");
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases > 500, "{cases} cases");
}

#[test]
fn groups_are_empty_for_nothing_to_do() {
    use crate::kind::CollectiveKind as K;
    assert!(groups((K::AllReduce, 0, 0), (0, 2), 4, false).is_empty());
    assert!(groups((K::AllReduce, 8, 0), (2, 2), 4, false).is_empty());
    assert!(groups((K::Broadcast, 8, 2), (0, 2), 4, false).is_empty());
    assert!(groups((K::SendRecv, 8, 0), (0, 2), 4, false).is_empty());
    // One rank, in place: nothing moves.
    assert!(groups((K::AllGather, 8, 0), (0, 1), 4, true).is_empty());
}

/// Runs the groups of every rank in lockstep on sets of contributing ranks per element:
/// every element of every rank ends with all ranks, and `last` marks exactly the reductions
/// that complete a chunk.
#[test]
#[allow(clippy::needless_range_loop)] // ranks and steps index several tables
fn ring_groups_reduce_everything_once() {
    for n in 1..=6 {
        for count in [0, 1, 5, 6, 7, 64, 1001] {
            let groups: Vec<Vec<RingGroup>> = (0..n).map(|r| ring_groups(r, n, count)).collect();
            let steps = if n > 1 { 2 * (n - 1) } else { 0 };
            assert!(groups.iter().all(|g| g.len() == steps));
            let mut have: Vec<Vec<u64>> = (0..n).map(|r| vec![1u64 << r; count]).collect();
            for i in 0..steps {
                let sent: Vec<Vec<u64>> = (0..n)
                    .map(|r| {
                        let (o, l) = groups[r][i].send;
                        have[r][o..o + l].to_vec()
                    })
                    .collect();
                for r in 0..n {
                    let g = groups[r][i];
                    let prev = (r + n - 1) % n;
                    assert_eq!(g.recv.1, sent[prev].len(), "n {n} count {count}");
                    for (j, &v) in sent[prev].iter().enumerate() {
                        let x = &mut have[r][g.recv.0 + j];
                        if g.reduce {
                            assert_eq!(*x & v, 0, "a rank's value counted twice");
                            *x |= v;
                            assert_eq!(*x == (1u64 << n) - 1, g.last, "n {n} step {i}");
                        } else {
                            *x = v;
                        }
                    }
                }
            }
            if n > 1 {
                assert!(have.iter().flatten().all(|&x| x == (1u64 << n) - 1), "n {n} count {count}");
            }
        }
    }
}

/// Machine identifiers of `nmach` machines of `k` ranks each, the ranks dealt to the machines
/// in turn when `interleaved` (rank r on machine r % nmach), else in blocks.
fn machine_ids(nmach: usize, k: usize, interleaved: bool) -> Vec<u64> {
    (0..nmach * k)
        .map(|r| if interleaved { r % nmach } else { r / k } as u64 + 100)
        .collect()
}

/// Each group split into its part inside the machine and its part across machines, as the
/// executor runs them (the first, then the second).
fn split_all(all: &[Vec<NetGroup>], ids: &[u64]) -> Vec<Vec<NetGroup>> {
    all.iter()
        .enumerate()
        .map(|(r, gs)| gs.iter().flat_map(|g| split(g, |q| ids[q] != ids[r])).collect())
        .collect()
}

#[test]
fn hierarchical_all_reduce_is_an_all_reduce_and_each_group_stays_on_one_side() {
    let mut cases = 0;
    for (nmach, k) in [(2, 2), (2, 3), (3, 2), (4, 2), (2, 4)] {
        for interleaved in [false, true] {
            let ids = machine_ids(nmach, k, interleaved);
            let machines = Machines::new(&ids);
            assert_eq!(machines.per_machine(), Some(k));
            let n = nmach * k;
            for count in [0usize, 1, 3, 7, 64, 1001] {
                for in_place in [false, true] {
                    for op in RedOp::ALL {
                        OP.with(|o| o.set(op));
                        let c = Collective::AllReduce { count };
                        let mut mems: Vec<Mem> =
                            (0..n).map(|r| layout_mem(c, r, n, in_place, (count * 7 + n) as u32)).collect();
                        let input: Vec<Vec<u32>> =
                            mems.iter().map(|m| m.data[m.send..m.send + m.send_len].to_vec()).collect();
                        let all: Vec<Vec<NetGroup>> = (0..n)
                            .map(|r| hierarchical_all_reduce(r, &machines, count, SIZE, in_place).expect("applies"))
                            .collect();
                        for (r, gs) in all.iter().enumerate() {
                            for g in gs {
                                let sides: Vec<bool> =
                                    g.ops.iter().filter(|o| o.peer != r).map(|o| ids[o.peer] != ids[r]).collect();
                                assert!(sides.windows(2).all(|w| w[0] == w[1]), "rank {r}: a mixed group {g:?}");
                            }
                        }
                        run(&split_all(&all, &ids), &mut mems, op);
                        let want = expected(c, 0, n, &input).expect("all-reduce");
                        for (r, m) in mems.iter().enumerate() {
                            let ctx = format!("{nmach}x{k} interleaved {interleaved} count {count} rank {r} {op:?}");
                            assert_eq!(&m.data[m.recv..m.recv + m.recv_len], &want[..], "{ctx}");
                            if !in_place {
                                assert_eq!(&m.data[m.send..m.send + m.send_len], &input[r][..], "{ctx}: input changed");
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 500, "{cases} cases");
}

#[test]
fn hierarchical_all_reduce_moves_a_kth_of_the_flat_ring_across_machines() {
    let (nmach, k, count) = (2, 4, 1 << 20);
    let ids = machine_ids(nmach, k, false);
    let machines = Machines::new(&ids);
    let n = nmach * k;
    let across = |gs: &[NetGroup], r: usize| -> usize {
        gs.iter()
            .flat_map(|g| &g.ops)
            .filter(|o| o.dir == Dir::Send && ids[o.peer] != ids[r])
            .map(|o| o.bytes)
            .sum()
    };
    let hier = across(&hierarchical_all_reduce(0, &machines, count, SIZE, false).expect("applies"), 0);
    // Rank 3 is the one rank of machine 0 whose ring neighbour (rank 4) is on machine 1.
    let flat = across(&groups((crate::kind::CollectiveKind::AllReduce, count, 0), (3, n), SIZE, false), 3);
    // The shard's ring across 2 machines: 2 (M − 1) / M of count / k elements.
    assert_eq!(hier, count / k * SIZE);
    assert_eq!(flat, 2 * (n - 1) * count / n * SIZE);
}

#[test]
fn uneven_or_single_machines_have_no_hierarchical_all_reduce() {
    for ids in [vec![1, 1, 2], vec![1, 1, 1, 1], vec![1, 2, 3], vec![]] {
        assert!(hierarchical_all_reduce(0, &Machines::new(&ids), 10, 4, false).is_none(), "{ids:?}");
    }
    // A rank outside the job.
    assert!(hierarchical_all_reduce(9, &Machines::new(&[1, 1, 2, 2]), 10, 4, false).is_none());
}

#[test]
fn every_collective_split_by_machine_still_completes() {
    // The flat groups of every collective, each split into its part inside the machine and its
    // part across, as the executor runs them when some ranks are on other machines.
    for (nmach, k) in [(2, 2), (3, 2), (2, 3)] {
        let ids = machine_ids(nmach, k, true);
        let n = nmach * k;
        for count in [1usize, 5] {
            for root in [0, n - 1] {
                for (ci, c) in all_collectives(count, root).into_iter().enumerate() {
                    let op = RedOp::ALL[(ci + count) % 5];
                    OP.with(|o| o.set(op));
                    let mut mems: Vec<Mem> = (0..n).map(|r| layout_mem(c, r, n, false, ci as u32)).collect();
                    let input: Vec<Vec<u32>> = mems.iter().map(|m| m.data[m.send..m.send + m.send_len].to_vec()).collect();
                    let all: Vec<Vec<NetGroup>> =
                        (0..n).map(|r| groups((c.kind(), c.count(), root), (r, n), SIZE, false)).collect();
                    run(&split_all(&all, &ids), &mut mems, op);
                    for (r, m) in mems.iter().enumerate() {
                        if let Some(want) = expected(c, r, n, &input) {
                            assert_eq!(&m.data[m.recv..m.recv + m.recv_len], &want[..], "{c:?} {nmach}x{k} rank {r}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn hierarchical_all_gather_and_broadcast_are_correct_and_cross_less() {
    use crate::kind::CollectiveKind as K;
    let mut cases = 0;
    for (nmach, k) in [(2, 2), (2, 3), (3, 2), (4, 2)] {
        for interleaved in [false, true] {
            let ids = machine_ids(nmach, k, interleaved);
            let machines = Machines::new(&ids);
            let n = nmach * k;
            for count in [1usize, 3, 64] {
                for root in 0..n {
                    for c in [Collective::AllGather { sendcount: count }, Collective::Broadcast { count, root }] {
                        if matches!(c, Collective::AllGather { .. }) && root > 0 {
                            continue;
                        }
                        for in_place in [false, true] {
                            let mut mems: Vec<Mem> =
                                (0..n).map(|r| layout_mem(c, r, n, in_place, (count + root) as u32)).collect();
                            let input: Vec<Vec<u32>> =
                                mems.iter().map(|m| m.data[m.send..m.send + m.send_len].to_vec()).collect();
                            let what = (c.kind(), c.count(), root);
                            let all: Vec<Vec<NetGroup>> = (0..n)
                                .map(|r| hierarchical(what, r, &machines, SIZE, in_place).expect("applies"))
                                .collect();
                            run(&split_all(&all, &ids), &mut mems, RedOp::Sum);
                            for (r, m) in mems.iter().enumerate() {
                                let want = expected(c, r, n, &input).expect("defined on every rank");
                                let ctx = format!("{c:?} {nmach}x{k} interleaved {interleaved} rank {r} in place {in_place}");
                                assert_eq!(&m.data[m.recv..m.recv + m.recv_len], &want[..], "{ctx}");
                            }
                            // Bytes that cross machines: each rank's all-gather block once per
                            // other machine; a broadcast's data once per other machine.
                            let crossing: usize = all
                                .iter()
                                .enumerate()
                                .flat_map(|(r, gs)| gs.iter().flat_map(move |g| g.ops.iter().map(move |o| (r, *o))))
                                .filter(|(r, o)| o.dir == Dir::Send && ids[o.peer] != ids[*r])
                                .map(|(_, o)| o.bytes)
                                .sum();
                            let per = count * SIZE * (nmach - 1);
                            let want = if c.kind() == K::AllGather { n * per } else { per };
                            assert_eq!(crossing, want, "{c:?} {nmach}x{k}");
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 300, "{cases} cases");
    // Where no hierarchical form exists, the flat groups are used.
    let m = Machines::new(&[1, 1, 2, 2]);
    for kind in [K::ReduceScatter, K::Reduce, K::AllToAll, K::Gather, K::Scatter, K::SendRecv] {
        assert!(hierarchical((kind, 4, 0), 0, &m, SIZE, false).is_none(), "{kind:?}");
    }
}
