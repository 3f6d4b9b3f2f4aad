use super::*;
use crate::schedule::{all_reduce, all_to_all};
use BufId::{Recv, Scratch, Send};

fn r(rank: usize, buf: BufId, offset: usize, len: usize) -> Region {
    Region::new(rank, buf, offset, len)
}

/// Elements copied by the publishes and collects the rewrite `t` of `s` added, per rank:
/// (published, collected).
fn copies(s: &Schedule, t: &Schedule) -> Vec<(usize, usize)> {
    let mut v = vec![(0, 0); t.nranks];
    let Some(shadows) = Shadows::of(s).unwrap() else {
        return v;
    };
    for st in &t.steps {
        let (a, b) = (st.srcs[0], st.dsts[0]);
        if st.srcs.len() != 1 || a.rank != st.exec || b.rank != st.exec {
            continue;
        }
        if shadows.map(&a) == Some(b) {
            v[st.exec].0 += a.len;
        } else if shadows.map(&b) == Some(a) {
            v[st.exec].1 += a.len;
        }
    }
    v
}

#[test]
fn intervals_merge_what_overlaps_or_touches() {
    let mut iv = Intervals::default();
    iv.insert(10, 20);
    iv.insert(30, 40);
    iv.insert(5, 5);
    assert_eq!(iv.m.len(), 2);
    assert_eq!(iv.gaps(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
    assert_eq!(iv.gaps(12, 18), vec![]);
    assert_eq!(iv.gaps(15, 35), vec![(20, 30)]);
    iv.insert(20, 30);
    assert_eq!(iv.m.into_iter().collect::<Vec<_>>(), vec![(10, 40)]);
}

#[test]
fn two_rank_all_reduce_shadows_half_of_each_buffer() {
    for count in [2, 8, 9, 1001] {
        for chunk in [1, 3, 1 << 20] {
            let s = all_reduce(&[1, 0], count, Layout::OutOfPlace, chunk);
            let t = through_scratch(&s).unwrap();
            t.validate().unwrap();
            assert_eq!(peer_private_access(&t), None);
            // ring[0] = 1 reduces the first (longer) half; rank 0 the second.
            let (first, second) = (count.div_ceil(2), count / 2);
            // Rank 1 shadows the second half of its send and recv; rank 0 the first half.
            assert_eq!(t.scratch_len, s.scratch_len + 2 * first);
            assert_eq!(copies(&s, &t), vec![(first, first), (second, second)]);
            // Every step kept, plus one publish and one collect per step.
            assert_eq!(t.steps.len(), 3 * s.steps.len());
        }
    }
    let s = all_reduce(&[0, 1], 10, Layout::SendInRecv { stride: 0 }, 5);
    let t = through_scratch(&s).unwrap();
    assert_eq!(t.scratch_len, 5);
    assert_eq!(copies(&s, &t), vec![(5, 5), (5, 5)]);
}

#[test]
fn ring_all_reduce_shadows_one_send_segment_and_the_recv_buffer() {
    for n in [3, 4, 8] {
        let ring: Vec<usize> = (0..n).collect();
        let count = 6720; // divisible by 3, 4 and 8
        let s = all_reduce(&ring, count, Layout::OutOfPlace, 64);
        let t = through_scratch(&s).unwrap();
        assert_eq!(t.scratch_len, count + count / n);
        assert_eq!(copies(&s, &t), vec![(count / n, count); n]);
        let s = all_reduce(&ring, count, Layout::SendInRecv { stride: 0 }, 64);
        let t = through_scratch(&s).unwrap();
        assert_eq!(t.scratch_len, count);
        assert_eq!(copies(&s, &t), vec![(count, count); n]);
    }
}

#[test]
fn schedules_without_peer_private_access_come_back_unchanged() {
    let one = all_reduce(&[0], 100, Layout::OutOfPlace, 7);
    assert_eq!(through_scratch(&one).unwrap(), one);
    let empty = Schedule::new(4).finish(Layout::OutOfPlace);
    assert_eq!(through_scratch(&empty).unwrap(), empty);
    let none = all_reduce(&[0, 1, 2], 0, Layout::OutOfPlace, 7);
    assert_eq!(through_scratch(&none).unwrap(), none);
    // Staged all-to-all: peers read each other's scratch only.
    let staged = all_to_all(&[0, 1, 2], 5, Layout::SendInRecv { stride: 0 }, 2);
    assert_eq!(peer_private_access(&staged), None);
    assert_eq!(through_scratch(&staged).unwrap(), staged);
}

#[test]
fn a_step_straddling_a_shadow_is_split_at_its_edge() {
    let mut s = Schedule::new(2);
    s.push(Step::copy(1, r(0, Send, 4, 4), r(1, Recv, 0, 4)));
    s.push(Step::copy(0, r(0, Send, 0, 8), r(0, Recv, 0, 8)));
    let s = s.finish(Layout::OutOfPlace);
    let t = through_scratch(&s).unwrap();
    assert_eq!(t.scratch_len, 4);
    assert_eq!(
        t.steps
            .iter()
            .map(|st| (st.exec, st.srcs[0], st.dsts[0]))
            .collect::<Vec<_>>(),
        vec![
            (0, r(0, Send, 4, 4), r(0, Scratch, 0, 4)), // publish
            (1, r(0, Scratch, 0, 4), r(1, Recv, 0, 4)),
            (0, r(0, Send, 0, 4), r(0, Recv, 0, 4)), // unshadowed piece
            (0, r(0, Scratch, 0, 4), r(0, Recv, 4, 4)),
        ]
    );
    assert_eq!(t.steps[1].deps, vec![0]);
    assert_eq!(t.end_waits, vec![vec![1], vec![]]);
}

#[test]
fn shadows_go_after_scratch_the_steps_use() {
    let mut s = Schedule::new(2);
    s.push(Step::copy(0, r(0, Send, 0, 4), r(0, Scratch, 6, 4)));
    s.push(Step::copy(1, r(0, Recv, 0, 2), r(1, Recv, 0, 2)));
    let mut s = s.finish(Layout::OutOfPlace);
    s.scratch_len = 3; // less than the steps use: shadows must not overlap element 6..10
    let t = through_scratch(&s).unwrap();
    assert_eq!(t.scratch_len, 12);
    let publish = t.steps.iter().find(|st| st.srcs[0] == r(0, Recv, 0, 2)).unwrap();
    assert_eq!(publish.dsts[0], r(0, Scratch, 10, 2));
}

#[test]
fn a_send_buffer_written_in_place_by_a_peer_is_collected() {
    // Rank 1 writes rank 0's receive buffer, which an in-place layout puts in its send buffer.
    let mut s = Schedule::new(2);
    s.push(Step::copy(1, r(1, Send, 0, 4), r(0, Recv, 0, 4)));
    let s = s.finish(Layout::RecvInSend { stride: 4 });
    assert_eq!(s.steps[0].dsts[0], r(0, Send, 0, 4));
    let t = through_scratch(&s).unwrap();
    let collect = t.steps.last().unwrap();
    assert_eq!((collect.exec, collect.srcs[0]), (0, r(0, Scratch, 0, 4)));
    assert_eq!(collect.dsts[0], r(0, Send, 0, 4));
    assert_eq!(t.steps.len(), 2); // written before any read: nothing to publish
}

#[test]
fn malformed_schedules_are_errors() {
    let mut s = Schedule::new(2);
    s.push(Step::copy(1, r(0, Send, 0, 4), r(1, Recv, 0, 4)));
    let good = s.finish(Layout::OutOfPlace);
    let mut bad_exec = good.clone();
    bad_exec.steps[0].exec = 7;
    assert!(matches!(
        through_scratch(&bad_exec),
        Err(ScheduleError::BadStep { step: 0, .. })
    ));
    let mut bad_dep = good.clone();
    bad_dep.steps[0].deps = vec![3];
    assert!(matches!(
        through_scratch(&bad_dep),
        Err(ScheduleError::BadDep { step: 0, dep: 3 })
    ));
    let mut bad_waits = good.clone();
    bad_waits.end_waits.pop();
    assert!(matches!(
        through_scratch(&bad_waits),
        Err(ScheduleError::RankCount { .. })
    ));
    let mut bad_len = good.clone();
    bad_len.steps[0].srcs[0].len = 3;
    assert!(through_scratch(&bad_len).is_err());
    // Shadows past the end of the address space.
    let mut huge = Schedule::new(2);
    huge.push(Step::copy(1, r(0, Send, 0, 4), r(1, Recv, 0, 4)));
    huge.push(Step::copy(0, r(1, Send, 0, 4), r(0, Scratch, usize::MAX - 4, 4)));
    let huge = huge.finish(Layout::OutOfPlace);
    huge.validate().unwrap();
    assert!(matches!(
        through_scratch(&huge),
        Err(ScheduleError::BadStep {
            step: usize::MAX,
            ..
        })
    ));
}

#[test]
fn min_map_keeps_the_smallest_value_per_element() {
    let mut m = MinMap::default();
    m.record(0, 10, 5);
    m.record(5, 15, 3);
    m.record(20, 30, 1);
    m.record(2, 4, 9);
    assert_eq!(m.min(0, 5), Some(5));
    assert_eq!(m.min(4, 6), Some(3));
    assert_eq!(m.min(12, 25), Some(1));
    assert_eq!(m.min(15, 20), None);
    assert_eq!(m.min(2, 3), Some(5));
}

/// The rewrite of `s` makes no original step wait (transitively) for a step of another rank it
/// did not wait for before: only the publishes and collects themselves are added.
fn assert_adds_no_waits(s: &Schedule) {
    let t = through_scratch(s).unwrap();
    let Some(shadows) = Shadows::of(s).unwrap() else {
        assert_eq!(&t, s);
        return;
    };
    let pieces: Vec<usize> = s
        .steps
        .iter()
        .enumerate()
        .flat_map(|(j, st)| shadows.split(st).into_iter().map(move |_| j))
        .collect();
    let mut next = 0;
    let orig: Vec<Option<usize>> = t
        .steps
        .iter()
        .map(|st| {
            let (a, b) = (st.srcs[0], st.dsts[0]);
            let local = st.srcs.len() == 1 && a.rank == st.exec && b.rank == st.exec;
            if local && (shadows.map(&a) == Some(b) || shadows.map(&b) == Some(a)) {
                return None;
            }
            next += 1;
            Some(pieces[next - 1])
        })
        .collect();
    assert_eq!(next, pieces.len(), "every piece kept, in order");
    let (ct, cs) = (Order::of(&t).clock, Order::of(s).clock);
    for (y, b) in orig.iter().enumerate() {
        let Some(b) = *b else { continue };
        for (x, a) in orig[..y].iter().enumerate() {
            let Some(a) = *a else { continue };
            if a != b && ct[y][t.steps[x].exec] > x {
                assert!(
                    cs[b][s.steps[a].exec] > a,
                    "step {b} now waits for step {a}"
                );
            }
        }
    }
}

#[test]
fn the_rewrite_adds_no_waits_between_original_steps() {
    use crate::schedule::{
        all_gather, broadcast, gather, reduce, reduce_scatter, scatter, send_recv, P2p,
    };
    let oop = Layout::OutOfPlace;
    let in0 = Layout::SendInRecv { stride: 0 };
    for n in [2, 3, 4] {
        let ring: Vec<usize> = (0..n).rev().collect();
        for chunk in [2, 5] {
            let c = 11;
            for s in [
                all_reduce(&ring, c, oop, chunk),
                all_reduce(&ring, c, in0, chunk),
                reduce_scatter(&ring, c, oop, chunk),
                reduce_scatter(&ring, c, Layout::RecvInSend { stride: c }, chunk),
                all_gather(&ring, c, oop, chunk),
                all_gather(&ring, c, Layout::SendInRecv { stride: c }, chunk),
                broadcast(&ring, c, 1, oop, chunk),
                broadcast(&ring, c, 1, in0, chunk),
                reduce(&ring, c, 0, oop, chunk),
                all_to_all(&ring, c, oop, chunk),
                gather(&ring, c, 1, oop, chunk),
                scatter(&ring, c, 0, oop, chunk),
            ] {
                assert_adds_no_waits(&s);
            }
            let pairs: Vec<P2p> = (0..n)
                .map(|r| P2p {
                    from: r,
                    to: (r + 1) % n,
                    count: c + r,
                })
                .collect();
            assert_adds_no_waits(&send_recv(&ring, &pairs, oop, chunk));
        }
    }
}

#[test]
fn two_rank_all_reduce_ranks_still_reduce_side_by_side() {
    // Originally the two ranks' reduce steps wait for nothing; after the rewrite they wait
    // for their peer's publishes only, which come first on the peer's stream.
    let s = all_reduce(&[0, 1], 64, Layout::OutOfPlace, 8);
    let t = through_scratch(&s).unwrap();
    for st in t.steps.iter().filter(|st| st.srcs.len() == 2) {
        for &d in &st.deps {
            let pubs_before = t.steps[..d]
                .iter()
                .all(|p| p.exec != t.steps[d].exec || p.srcs.len() == 1);
            assert!(pubs_before, "a reduce waits behind its peer's reduces");
        }
    }
}
