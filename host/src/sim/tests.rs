use super::*;
use crate::api::collective::Collective;
use crate::schedule::tests::check_invariants;
use crate::schedule::{self as sch, Layout, P2p, Step};
use crate::CollectiveKind as Coll;

/// Element types the tests use, with data that every operator reduces exactly in any order.
trait TestElem: Element + fmt::Debug {
    fn val(h: u64, op: RedOp) -> Self;
}
impl TestElem for u32 {
    fn val(h: u64, _: RedOp) -> Self {
        (h >> 32) as u32 // full range: sums and products wrap
    }
}
impl TestElem for i64 {
    fn val(h: u64, _: RedOp) -> Self {
        h as i64
    }
}
impl TestElem for u8 {
    fn val(h: u64, _: RedOp) -> Self {
        (h >> 56) as u8
    }
}
impl TestElem for f32 {
    fn val(h: u64, op: RedOp) -> Self {
        let k = (h >> 40) % 7;
        match op {
            // ±2^-1, ±2^0, ±2^1: every product of 16 is exact.
            RedOp::Prod => {
                let m = [0.5, 1.0, 2.0][(k % 3) as usize];
                if k >= 4 {
                    -m
                } else {
                    m
                }
            }
            // Small integers: every sum of 16 is exact.
            _ => k as f32 - 3.0,
        }
    }
}

fn hash(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ c;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Per-rank data of `len` elements.
fn data<T: TestElem>(op: RedOp, n: usize, len: usize, salt: u64) -> Vec<Vec<T>> {
    (0..n)
        .map(|r| {
            (0..len)
                .map(|i| T::val(hash(r as u64, i as u64, salt), op))
                .collect()
        })
        .collect()
}

/// The reference: fold over ranks in rank order, then finish with n.
fn red<T: TestElem>(op: RedOp, vals: impl Iterator<Item = T>, n: usize) -> T {
    let folded = vals
        .reduce(|a, b| op.combine(a, b))
        .expect("at least one rank");
    op.finish(folded, n as u32)
}

/// The call of `coll` with this count and root (send/recv groups are tested apart, by
/// `check_p2p`).
fn call(coll: Coll, count: usize, root: usize) -> Collective {
    match coll {
        Coll::AllReduce => Collective::AllReduce { count },
        Coll::ReduceScatter => Collective::ReduceScatter { recvcount: count },
        Coll::AllGather => Collective::AllGather { sendcount: count },
        Coll::Broadcast => Collective::Broadcast { count, root },
        Coll::Reduce => Collective::Reduce { count, root },
        Coll::AllToAll => Collective::AllToAll {
            count_per_peer: count,
        },
        Coll::Gather => Collective::Gather {
            sendcount: count,
            root,
        },
        Coll::Scatter => Collective::Scatter {
            recvcount: count,
            root,
        },
        Coll::SendRecv => unreachable!("send/recv groups are simulated by check_p2p"),
    }
}

/// The layout of the call; an in-place all-to-all (which the API rejects) is simulated
/// with the whole buffer as both input and output.
fn layout_for(coll: Coll, count: usize, in_place: bool) -> Layout {
    if !in_place {
        return Layout::OutOfPlace;
    }
    call(coll, count, 0)
        .in_place_layout()
        .unwrap_or(Layout::SendInRecv { stride: 0 })
}

fn build(
    coll: Coll,
    ring: &[usize],
    count: usize,
    root: usize,
    layout: Layout,
    chunk: usize,
) -> Schedule {
    call(coll, count, root).schedule(ring, layout, chunk)
}

/// Initial buffers and the buffers expected afterwards.
struct Setup<T> {
    send: Vec<Vec<T>>,
    recv: Vec<Vec<T>>,
    exp_send: Vec<Vec<T>>,
    exp_recv: Vec<Vec<T>>,
}

fn setup<T: TestElem>(
    coll: Coll,
    n: usize,
    c: usize,
    root: usize,
    in_place: bool,
    op: RedOp,
) -> Setup<T> {
    let empty = || vec![Vec::<T>::new(); n];
    let garb = |len: usize| data::<T>(op, n, len, 0xBAD);
    match coll {
        Coll::AllReduce => {
            let inp = data::<T>(op, n, c, 1);
            let res: Vec<T> = (0..c)
                .map(|i| red(op, inp.iter().map(|v| v[i]), n))
                .collect();
            let exp_recv = vec![res; n];
            if in_place {
                Setup {
                    send: empty(),
                    recv: inp,
                    exp_send: empty(),
                    exp_recv,
                }
            } else {
                Setup {
                    send: inp.clone(),
                    recv: garb(c),
                    exp_send: inp,
                    exp_recv,
                }
            }
        }
        Coll::ReduceScatter => {
            let inp = data::<T>(op, n, n * c, 2);
            let res: Vec<Vec<T>> = (0..n)
                .map(|r| {
                    (0..c)
                        .map(|i| red(op, inp.iter().map(|v| v[r * c + i]), n))
                        .collect()
                })
                .collect();
            if in_place {
                let mut exp_send = inp.clone();
                for r in 0..n {
                    exp_send[r][r * c..(r + 1) * c].copy_from_slice(&res[r]);
                }
                Setup {
                    send: inp,
                    recv: empty(),
                    exp_send,
                    exp_recv: empty(),
                }
            } else {
                Setup {
                    send: inp.clone(),
                    recv: garb(c),
                    exp_send: inp,
                    exp_recv: res,
                }
            }
        }
        Coll::AllGather => {
            let inp = data::<T>(op, n, c, 3);
            let full: Vec<T> = inp.concat();
            if in_place {
                let mut recv = garb(n * c);
                for r in 0..n {
                    recv[r][r * c..(r + 1) * c].copy_from_slice(&inp[r]);
                }
                Setup {
                    send: empty(),
                    recv,
                    exp_send: empty(),
                    exp_recv: vec![full; n],
                }
            } else {
                Setup {
                    send: inp.clone(),
                    recv: garb(n * c),
                    exp_send: inp,
                    exp_recv: vec![full; n],
                }
            }
        }
        Coll::Broadcast => {
            let inp = data::<T>(op, n, c, 4);
            let mut send = empty();
            let mut recv = garb(c);
            if in_place {
                recv[root] = inp[root].clone();
            } else {
                send[root] = inp[root].clone();
            }
            Setup {
                exp_send: send.clone(),
                send,
                recv,
                exp_recv: vec![inp[root].clone(); n],
            }
        }
        Coll::Reduce => {
            let mut send = data::<T>(op, n, c, 5);
            let res: Vec<T> = (0..c)
                .map(|i| red(op, send.iter().map(|v| v[i]), n))
                .collect();
            let mut recv = garb(c);
            let mut exp_recv = recv.clone();
            exp_recv[root] = res;
            if in_place {
                recv[root] = std::mem::take(&mut send[root]);
            }
            Setup {
                exp_send: send.clone(),
                send,
                recv,
                exp_recv,
            }
        }
        Coll::AllToAll => {
            let inp = data::<T>(op, n, n * c, 6);
            let res: Vec<Vec<T>> = (0..n)
                .map(|r| {
                    (0..n)
                        .flat_map(|q| inp[q][r * c..(r + 1) * c].to_vec())
                        .collect()
                })
                .collect();
            if in_place {
                Setup {
                    send: empty(),
                    recv: inp,
                    exp_send: empty(),
                    exp_recv: res,
                }
            } else {
                Setup {
                    send: inp.clone(),
                    recv: garb(n * c),
                    exp_send: inp,
                    exp_recv: res,
                }
            }
        }
        Coll::Gather => {
            let mut send = data::<T>(op, n, c, 7);
            let mut recv = garb(n * c);
            let mut exp_recv = recv.clone();
            exp_recv[root] = send.concat();
            if in_place {
                recv[root][root * c..(root + 1) * c].copy_from_slice(&send[root]);
                send[root].clear();
            }
            Setup {
                exp_send: send.clone(),
                send,
                recv,
                exp_recv,
            }
        }
        Coll::Scatter => {
            let inp = data::<T>(op, n, n * c, 8);
            let mut send = empty();
            send[root] = inp[root].clone();
            let mut recv = garb(c);
            let mut exp_recv: Vec<Vec<T>> = (0..n)
                .map(|q| inp[root][q * c..(q + 1) * c].to_vec())
                .collect();
            if in_place {
                recv[root].clear();
                exp_recv[root].clear();
            }
            Setup {
                exp_send: send.clone(),
                send,
                recv,
                exp_recv,
            }
        }
        Coll::SendRecv => unreachable!("send/recv groups are simulated by check_p2p"),
    }
}

fn assert_same<T: TestElem>(got: &[Vec<T>], want: &[Vec<T>], what: &str, ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: {what} rank count");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{ctx}: {what}[{r}] length");
        if let Some(i) = (0..g.len()).find(|&i| !g[i].same_result(w[i])) {
            panic!("{ctx}: {what}[{r}][{i}] = {:?}, expected {:?}", g[i], w[i]);
        }
    }
}

const ORDERS: [Order; 3] = [Order::Issue, Order::Random(0x5EED), Order::Random(42)];

#[allow(clippy::too_many_arguments)]
fn check<T: TestElem>(
    coll: Coll,
    ring: &[usize],
    count: usize,
    root: usize,
    in_place: bool,
    chunk: usize,
    op: RedOp,
    orders: &[Order],
) {
    let n = ring.len();
    let layout = layout_for(coll, count, in_place);
    let s = build(coll, ring, count, root, layout, chunk);
    check_invariants(&s);
    if count == 0 {
        assert!(s.steps.is_empty());
    }
    let st = setup::<T>(coll, n, count, root, in_place, op);
    for &order in orders {
        let ctx = format!(
            "{coll:?} {} ring {ring:?} count {count} root {root} {layout:?} chunk {chunk} {op:?} {order:?}",
            T::NAME
        );
        let mut ranks = SimRanks::new(&s, st.send.clone(), st.recv.clone());
        if let Err(e) = run(&s, op, &mut ranks, order) {
            panic!("{ctx}: {e}");
        }
        assert_same(&ranks.send, &st.exp_send, "send", &ctx);
        assert_same(&ranks.recv, &st.exp_recv, "recv", &ctx);
    }
}

fn rooted(coll: Coll) -> bool {
    matches!(
        coll,
        Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
    )
}

/// n in 1..=16, awkward counts, pipelining chunk sizes, both layouts; u32, the operator
/// (and root) varying from case to case.
fn sweep_counts(coll: Coll) {
    let mut case = 0usize;
    for n in 1..=16 {
        let ring: Vec<usize> = (0..n).collect();
        let mut counts = vec![0, 1, n - 1, n, n + 1, 7];
        counts.sort_unstable();
        counts.dedup();
        for &count in &counts {
            for chunk in [1, 3, 64] {
                if chunk == 1 && n > 8 && count > 7 {
                    continue; // thousands of one-element steps: covered by n <= 8
                }
                for in_place in [false, true] {
                    case += 1;
                    let op = RedOp::ALL[case % 5];
                    let root = if rooted(coll) { case % n } else { 0 };
                    let orders = [Order::Issue, Order::Random(case as u64)];
                    check::<u32>(coll, &ring, count, root, in_place, chunk, op, &orders);
                }
            }
        }
    }
}

/// Every root, n in 1..=16, identity and reversed rings.
fn sweep_roots(coll: Coll) {
    for n in 1..=16 {
        for ring in [(0..n).collect::<Vec<_>>(), (0..n).rev().collect()] {
            for root in 0..n {
                for in_place in [false, true] {
                    let op = RedOp::ALL[(n + root) % 5];
                    check::<i64>(coll, &ring, n + 2, root, in_place, 2, op, &ORDERS[..2]);
                }
            }
        }
    }
}

/// Every operator and four element types, a few rank counts.
fn sweep_ops_types(coll: Coll) {
    for n in [1, 2, 3, 4, 7] {
        let ring: Vec<usize> = (0..n).collect();
        let root = n / 2;
        for op in RedOp::ALL {
            for in_place in [false, true] {
                check::<u32>(coll, &ring, 13, root, in_place, 4, op, &ORDERS);
                check::<i64>(coll, &ring, 13, root, in_place, 4, op, &ORDERS);
                check::<u8>(coll, &ring, 13, root, in_place, 4, op, &ORDERS);
                check::<f32>(coll, &ring, 13, root, in_place, 4, op, &ORDERS);
            }
        }
    }
}

/// Shuffled rings and a count of 4097 (pipelined in chunks of 64 and 1000).
fn sweep_rings_large(coll: Coll) {
    let mut seed = Rng(coll as u64 + 1);
    for n in [2, 3, 5, 8, 16] {
        let mut ring: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            ring.swap(i, seed.below(i + 1));
        }
        let count = if coll == Coll::AllToAll && n > 8 {
            257
        } else {
            4097
        };
        for (k, chunk) in [64, 1000].into_iter().enumerate() {
            let in_place = k == 1;
            let root = seed.below(n);
            let op = RedOp::ALL[seed.below(5)];
            check::<u32>(
                coll,
                &ring,
                count,
                root,
                in_place,
                chunk,
                op,
                &[Order::Issue, Order::Random(n as u64)],
            );
        }
        check::<f32>(coll, &ring, 100, n - 1, false, 7, RedOp::Avg, &ORDERS);
    }
}

mod props {
    //! Random shapes beyond the sweeps: any ring order, count, chunk, root, layout, operator and
    //! interleaving of the ranks' steps give the reference result.
    use proptest::prelude::*;

    use super::*;

    /// The collectives simulated by `check` (send/recv groups have `check_p2p`).
    fn collectives() -> Vec<Coll> {
        Coll::ALL
            .into_iter()
            .filter(|c| *c != Coll::SendRecv)
            .collect()
    }

    fn shape() -> impl Strategy<Value = (Coll, Vec<usize>, usize, usize, bool, usize)> {
        (1usize..10).prop_flat_map(|n| {
            (
                prop::sample::select(collectives()),
                Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
                0usize..300,
                0..n,
                any::<bool>(),
                1usize..80,
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

        #[test]
        fn random_shapes_match_the_reference(
            (coll, ring, count, root, in_place, chunk) in shape(),
            op in prop::sample::select(RedOp::ALL.to_vec()),
            seed in any::<u64>(),
            wide in any::<bool>(),
        ) {
            let orders = [Order::Random(seed)];
            if wide {
                check::<i64>(coll, &ring, count, root, in_place, chunk, op, &orders);
            } else {
                check::<u32>(coll, &ring, count, root, in_place, chunk, op, &orders);
            }
        }
    }
}

macro_rules! sweeps {
    ($($name:ident: $coll:expr;)*) => {$(
        mod $name {
            use super::*;
            #[test]
            fn every_n_count_chunk_and_layout() {
                sweep_counts($coll);
            }
            #[test]
            fn every_op_and_element_type() {
                sweep_ops_types($coll);
            }
            #[test]
            fn shuffled_rings_and_large_counts() {
                sweep_rings_large($coll);
            }
            #[test]
            fn every_root_and_ring_direction() {
                if rooted($coll) {
                    sweep_roots($coll);
                } else {
                    // Unrooted: reversed rings with every n instead.
                    for n in 1..=16 {
                        let ring: Vec<usize> = (0..n).rev().collect();
                        for in_place in [false, true] {
                            check::<i64>($coll, &ring, n + 2, 0, in_place, 2, RedOp::ALL[n % 5], &ORDERS[..2]);
                        }
                    }
                }
            }
        }
    )*};
}

sweeps! {
    all_reduce: Coll::AllReduce;
    reduce_scatter: Coll::ReduceScatter;
    all_gather: Coll::AllGather;
    broadcast: Coll::Broadcast;
    reduce: Coll::Reduce;
    all_to_all: Coll::AllToAll;
    gather: Coll::Gather;
    scatter: Coll::Scatter;
}

/// Runs a send/recv group and checks it against a direct reference.
fn check_p2p(n: usize, pairs: &[P2p], layout: Layout, chunk: usize) {
    let ring: Vec<usize> = (0..n).collect();
    let s = sch::send_recv(&ring, pairs, layout, chunk);
    check_invariants(&s);
    let (mut sent, mut got) = (vec![0; n], vec![0; n]);
    let mut placed = Vec::new();
    for p in pairs {
        placed.push((*p, sent[p.from], got[p.to]));
        sent[p.from] += p.count;
        got[p.to] += p.count;
    }
    let in_place = layout == Layout::SendInRecv { stride: 0 };
    let len = |r: usize| {
        if in_place {
            sent[r].max(got[r])
        } else {
            sent[r]
        }
    };
    let inp: Vec<Vec<u64>> = (0..n)
        .map(|r| (0..len(r)).map(|i| hash(r as u64, i as u64, 9)).collect())
        .collect();
    let garb: Vec<Vec<u64>> = (0..n)
        .map(|r| (0..got[r]).map(|i| hash(r as u64, i as u64, 10)).collect())
        .collect();
    let (send, recv) = if in_place {
        (vec![Vec::new(); n], inp.clone())
    } else {
        (inp.clone(), garb)
    };
    let mut exp_recv = recv.clone();
    for &(p, so, ro) in &placed {
        exp_recv[p.to][ro..ro + p.count].copy_from_slice(&inp[p.from][so..so + p.count]);
    }
    for order in ORDERS {
        let mut ranks = SimRanks::new(&s, send.clone(), recv.clone());
        run(&s, RedOp::Sum, &mut ranks, order).unwrap();
        assert_eq!(ranks.send, send, "{pairs:?} {order:?}");
        assert_eq!(ranks.recv, exp_recv, "{pairs:?} {layout:?} {order:?}");
    }
}

#[test]
fn send_recv_ring_exchange_every_n() {
    for n in 1..=16 {
        let pairs: Vec<P2p> = (0..n)
            .map(|r| P2p {
                from: r,
                to: (r + 1) % n,
                count: 7 + r,
            })
            .collect();
        for chunk in [1, 3, 64] {
            check_p2p(n, &pairs, Layout::OutOfPlace, chunk);
            check_p2p(n, &pairs, Layout::SendInRecv { stride: 0 }, chunk);
        }
    }
}

#[test]
fn send_recv_groups_with_fan_in_fan_out_and_self() {
    for n in [1, 2, 3, 5, 8] {
        let mut pairs = Vec::new();
        for a in 0..n {
            for b in 0..n {
                pairs.push(P2p {
                    from: a,
                    to: b,
                    count: (a * 3 + b) % 5,
                });
            }
        }
        for layout in [Layout::OutOfPlace, Layout::SendInRecv { stride: 0 }] {
            check_p2p(n, &pairs, layout, 2);
            check_p2p(n, &pairs, layout, 4097);
        }
    }
    check_p2p(
        4,
        &[
            P2p {
                from: 2,
                to: 0,
                count: 4097,
            },
            P2p {
                from: 0,
                to: 2,
                count: 1,
            },
        ],
        Layout::OutOfPlace,
        64,
    );
    check_p2p(3, &[], Layout::OutOfPlace, 64);
}

#[test]
fn all_to_all_with_recv_in_send() {
    for n in [1, 2, 3, 6] {
        let ring: Vec<usize> = (0..n).collect();
        let c = 5;
        let s = sch::all_to_all(&ring, c, Layout::RecvInSend { stride: 0 }, 2);
        check_invariants(&s);
        let inp = data::<u32>(RedOp::Sum, n, n * c, 11);
        let res: Vec<Vec<u32>> = (0..n)
            .map(|r| {
                (0..n)
                    .flat_map(|q| inp[q][r * c..(r + 1) * c].to_vec())
                    .collect()
            })
            .collect();
        for order in ORDERS {
            let mut ranks = SimRanks::new(&s, inp.clone(), vec![Vec::new(); n]);
            run(&s, RedOp::Sum, &mut ranks, order).unwrap();
            assert_eq!(ranks.send, res);
        }
    }
}

#[test]
fn single_rank_all_reduce_avg_divides_by_one() {
    let s = sch::all_reduce(&[0], 5, Layout::OutOfPlace, 2);
    let mut ranks = SimRanks::new(&s, vec![vec![3i32, -7, 9, 1, 0]], vec![vec![0; 5]]);
    run(&s, RedOp::Avg, &mut ranks, Order::Issue).unwrap();
    assert_eq!(ranks.recv[0], ranks.send[0]);
    assert!(
        sch::all_reduce(&[0], 5, Layout::SendInRecv { stride: 0 }, 2)
            .steps
            .is_empty()
    );
}

#[test]
fn avg_of_floats_is_rounded_once_at_the_end() {
    // 1 + 1 + 2 = 4 over 3 ranks: 4/3 correctly rounded, not (1/3 + 1/3 + 2/3).
    let s = sch::all_reduce(&[2, 0, 1], 3, Layout::OutOfPlace, 1);
    let send = vec![vec![1.0f32; 3], vec![1.0; 3], vec![2.0; 3]];
    let mut ranks = SimRanks::new(&s, send, vec![vec![0.0; 3]; 3]);
    run(&s, RedOp::Avg, &mut ranks, Order::Random(3)).unwrap();
    assert!(ranks.recv.iter().flatten().all(|&x| x == 4.0f32 / 3.0));
}

/// Random orders expose a schedule whose synchronisation was removed: the simulator is
/// strong enough to prove the derived deps matter.
#[test]
fn stripping_deps_is_caught_by_random_orders() {
    let ring = [0, 1, 2, 3];
    let mut s = sch::all_reduce(&ring, 64, Layout::OutOfPlace, 8);
    for st in &mut s.steps {
        st.deps.clear();
    }
    let st = setup::<u32>(Coll::AllReduce, 4, 64, 0, false, RedOp::Sum);
    let wrong = (0..20).any(|seed| {
        let mut ranks = SimRanks::new(&s, st.send.clone(), st.recv.clone());
        run(&s, RedOp::Sum, &mut ranks, Order::Random(seed)).is_err() || ranks.recv != st.exp_recv
    });
    assert!(wrong);
    // Issue order needs no deps at all.
    let mut ranks = SimRanks::new(&s, st.send.clone(), st.recv.clone());
    run(&s, RedOp::Sum, &mut ranks, Order::Issue).unwrap();
    assert_eq!(ranks.recv, st.exp_recv);
}

#[test]
fn missing_start_waits_are_caught() {
    let mut s = sch::all_gather(&[0, 1, 2], 8, Layout::OutOfPlace, 4);
    s.start_waits = vec![Vec::new(); 3];
    let st = setup::<u32>(Coll::AllGather, 3, 8, 0, false, RedOp::Sum);
    let caught = (0..20).any(|seed| {
        let mut ranks = SimRanks::new(&s, st.send.clone(), st.recv.clone());
        matches!(
            run(&s, RedOp::Sum, &mut ranks, Order::Random(seed)),
            Err(SimError::TouchBeforeStart { .. })
        )
    });
    assert!(caught);
}

#[test]
fn missing_end_waits_are_caught() {
    let mut s = sch::all_reduce(&[0, 1], 8, Layout::OutOfPlace, 4);
    s.end_waits = vec![Vec::new(); 2];
    let st = setup::<u32>(Coll::AllReduce, 2, 8, 0, false, RedOp::Sum);
    let caught = (0..20).any(|seed| {
        let mut ranks = SimRanks::new(&s, st.send.clone(), st.recv.clone());
        matches!(
            run(&s, RedOp::Sum, &mut ranks, Order::Random(seed)),
            Err(SimError::TouchAfterEnd { .. })
        )
    });
    assert!(caught);
}

#[test]
fn malformed_schedules_are_errors_not_panics() {
    let reg = |rank, buf, offset, len| Region::new(rank, buf, offset, len);
    let mk = |st: Step| {
        let mut s = Schedule::new(2);
        s.push(st);
        s.finish(Layout::OutOfPlace)
    };
    let fresh = || SimRanks::<u32> {
        send: vec![vec![1; 4]; 2],
        recv: vec![vec![0; 4]; 2],
        scratch: vec![Vec::new(); 2],
    };
    let oob = mk(Step::copy(
        1,
        reg(0, BufId::Send, 2, 4),
        reg(1, BufId::Recv, 0, 4),
    ));
    assert!(matches!(
        run(&oob, RedOp::Sum, &mut fresh(), Order::Issue),
        Err(SimError::OutOfRange { step: 0, .. })
    ));
    let scratch = mk(Step::copy(
        1,
        reg(0, BufId::Scratch, 0, 1),
        reg(1, BufId::Recv, 0, 1),
    ));
    assert!(matches!(
        run(&scratch, RedOp::Sum, &mut fresh(), Order::Issue),
        Err(SimError::OutOfRange { .. })
    ));
    let bad_rank = mk(Step::copy(
        1,
        reg(5, BufId::Send, 0, 1),
        reg(1, BufId::Recv, 0, 1),
    ));
    assert!(matches!(
        run(&bad_rank, RedOp::Sum, &mut fresh(), Order::Issue),
        Err(SimError::BadStep { .. })
    ));
    let bad_exec = mk(Step::copy(
        9,
        reg(0, BufId::Send, 0, 1),
        reg(1, BufId::Recv, 0, 1),
    ));
    assert!(matches!(
        run(&bad_exec, RedOp::Sum, &mut fresh(), Order::Random(1)),
        Err(SimError::BadStep { .. })
    ));
    let lens = mk(Step::copy(
        1,
        reg(0, BufId::Send, 0, 2),
        reg(1, BufId::Recv, 0, 1),
    ));
    assert!(matches!(
        run(&lens, RedOp::Sum, &mut fresh(), Order::Issue),
        Err(SimError::BadStep { .. })
    ));
    let partial = mk(Step::copy(
        1,
        reg(1, BufId::Recv, 0, 2),
        reg(1, BufId::Recv, 1, 2),
    ));
    assert!(matches!(
        run(&partial, RedOp::Sum, &mut fresh(), Order::Issue),
        Err(SimError::BadStep { .. })
    ));
    let finish_copy = mk(Step {
        finish: true,
        ..Step::copy(1, reg(0, BufId::Send, 0, 1), reg(1, BufId::Recv, 0, 1))
    });
    assert!(matches!(
        run(&finish_copy, RedOp::Avg, &mut fresh(), Order::Issue),
        Err(SimError::BadStep { .. })
    ));
    let mut self_dep = mk(Step::copy(
        1,
        reg(0, BufId::Send, 0, 1),
        reg(1, BufId::Recv, 0, 1),
    ));
    self_dep.steps[0].deps = vec![0];
    assert!(matches!(
        run(&self_dep, RedOp::Sum, &mut fresh(), Order::Issue),
        Err(SimError::BadDep { step: 0, dep: 0 })
    ));
    let ok = mk(Step::copy(
        1,
        reg(0, BufId::Send, 0, 4),
        reg(1, BufId::Recv, 0, 4),
    ));
    let mut three = fresh();
    three.recv.push(Vec::new());
    assert!(matches!(
        run(&ok, RedOp::Sum, &mut three, Order::Issue),
        Err(SimError::RankCount {
            expected: 2,
            found: 3
        })
    ));
    // Nothing was written by the failed runs.
    let mut r = fresh();
    let _ = run(&oob, RedOp::Sum, &mut r, Order::Issue);
    assert_eq!(r, fresh());
    assert!(SimError::Stuck { done: 1, total: 2 }
        .to_string()
        .contains("cycle"));
}

mod shadow;
