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
    assert_eq!(t.steps[1].srcs[0], r(0, Recv, 0, 2));
    assert_eq!(t.steps[1].dsts[0], r(0, Scratch, 10, 2));
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
