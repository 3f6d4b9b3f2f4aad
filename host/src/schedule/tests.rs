use super::ring::segments;
use super::*;
use BufId::{Recv, Scratch, Send};

/// Structural invariants every finished schedule satisfies (used by the simulator tests too).
pub(crate) fn check_invariants(s: &Schedule) {
    let n = s.nranks;
    assert_eq!(s.start_waits.len(), n);
    assert_eq!(s.end_waits.len(), n);
    let mut touched = vec![Vec::new(); n];
    let mut last = vec![vec![None; n]; n];
    for (j, st) in s.steps.iter().enumerate() {
        assert!(st.exec < n, "step {j}: exec {}", st.exec);
        assert!(
            (1..=2).contains(&st.srcs.len()),
            "step {j}: generators use 1 or 2 sources"
        );
        assert!(
            (1..=2).contains(&st.dsts.len()),
            "step {j}: 1 or 2 destinations"
        );
        assert!(
            !(st.srcs.len() == 1 && st.finish && n > 1),
            "step {j}: copy with finish"
        );
        let len = st.dsts[0].len;
        assert!(len > 0, "step {j}: empty step");
        for r in st.srcs.iter().chain(&st.dsts) {
            assert_eq!(r.len, len, "step {j}: lengths differ");
            assert!(r.rank < n);
            if r.rank != st.exec {
                touched[st.exec].push(r.rank);
                last[r.rank][st.exec] = Some(j);
            }
        }
        for (i, d) in st.dsts.iter().enumerate() {
            assert!(
                st.srcs.iter().all(|x| x == d || !x.overlaps(d)),
                "step {j}: partial overlap"
            );
            assert!(
                st.dsts[..i].iter().all(|e| !e.overlaps(d)),
                "step {j}: dsts overlap"
            );
            if st.srcs.len() == 1 {
                assert_ne!(st.srcs[0], *d, "step {j}: copy onto itself survived");
            }
        }
        let mut ranks_seen = Vec::new();
        for &d in &st.deps {
            assert!(d < j, "step {j}: dep {d} not backwards");
            assert_ne!(
                s.steps[d].exec, st.exec,
                "step {j}: dep {d} on its own rank"
            );
            ranks_seen.push(s.steps[d].exec);
        }
        assert!(
            st.deps.windows(2).all(|w| w[0] < w[1]),
            "step {j}: deps unsorted"
        );
        ranks_seen.sort_unstable();
        let before = ranks_seen.len();
        ranks_seen.dedup();
        assert_eq!(before, ranks_seen.len(), "step {j}: two deps on one rank");
    }
    for r in 0..n {
        touched[r].sort_unstable();
        touched[r].dedup();
        assert_eq!(s.start_waits[r], touched[r], "start_waits[{r}]");
        let mut e: Vec<usize> = last[r].iter().flatten().copied().collect();
        e.sort_unstable();
        assert_eq!(s.end_waits[r], e, "end_waits[{r}]");
    }
}

fn r(rank: usize, buf: BufId, offset: usize, len: usize) -> Region {
    Region::new(rank, buf, offset, len)
}

#[test]
fn send_in_recv_maps_send_to_recv_at_rank_stride() {
    let mut s = Schedule::new(3);
    s.push(Step::copy(1, r(2, Send, 3, 4), r(1, Recv, 0, 4)));
    let s = s.finish(Layout::SendInRecv { stride: 10 });
    assert_eq!(s.steps[0].srcs[0], r(2, Recv, 23, 4));
    assert_eq!(s.steps[0].dsts[0], r(1, Recv, 0, 4));
}

#[test]
fn recv_in_send_maps_recv_to_send_at_rank_stride() {
    let mut s = Schedule::new(3);
    s.push(Step::reduce(
        1,
        vec![r(1, Send, 5, 2), r(2, Scratch, 0, 2)],
        vec![r(1, Recv, 1, 2)],
        true,
    ));
    let s = s.finish(Layout::RecvInSend { stride: 5 });
    assert_eq!(s.steps[0].dsts[0], r(1, Send, 6, 2));
    assert_eq!(s.steps[0].srcs, vec![r(1, Send, 5, 2), r(2, Scratch, 0, 2)]);
}

#[test]
fn out_of_place_changes_nothing() {
    let mut s = Schedule::new(2);
    let st = Step::copy(0, r(1, Send, 0, 4), r(0, Recv, 0, 4));
    s.push(st.clone());
    let s = s.finish(Layout::OutOfPlace);
    assert_eq!(s.steps, vec![st]);
}

#[test]
fn self_copies_are_dropped_and_second_destination_kept() {
    let mut s = Schedule::new(2);
    s.push(Step::copy(0, r(0, Send, 0, 4), r(0, Recv, 0, 4)));
    s.push(Step {
        dsts: vec![r(0, Recv, 4, 4), r(1, Recv, 4, 4)],
        ..Step::copy(0, r(0, Send, 4, 4), r(0, Recv, 4, 4))
    });
    s.push(Step::copy(1, r(0, Send, 0, 0), r(1, Recv, 0, 0)));
    let s = s.finish(Layout::SendInRecv { stride: 0 });
    assert_eq!(s.steps.len(), 1);
    assert_eq!(s.steps[0].dsts, vec![r(1, Recv, 4, 4)]);
}

#[test]
fn read_after_write_on_another_rank_is_a_dep() {
    let mut s = Schedule::new(2);
    s.push(Step::copy(0, r(0, Send, 0, 8), r(0, Recv, 0, 8)));
    s.push(Step::copy(1, r(0, Recv, 7, 1), r(1, Recv, 0, 1)));
    s.push(Step::copy(1, r(0, Recv, 8, 1), r(1, Recv, 1, 1)));
    let s = s.finish(Layout::OutOfPlace);
    assert_eq!(s.steps[1].deps, vec![0]);
    assert!(s.steps[2].deps.is_empty(), "element 8 was never written");
}

#[test]
fn write_after_read_and_write_after_write_are_deps() {
    let mut s = Schedule::new(3);
    s.push(Step::copy(1, r(0, Send, 0, 4), r(1, Recv, 0, 4))); // 1 reads 0's send
    s.push(Step::copy(0, r(0, Recv, 0, 4), r(0, Send, 2, 4))); // 0 overwrites it: WAR
    s.push(Step::copy(2, r(2, Send, 0, 4), r(1, Recv, 0, 4))); // WAW on 1's recv
    let s = s.finish(Layout::OutOfPlace);
    assert_eq!(s.steps[1].deps, vec![0]);
    assert_eq!(s.steps[2].deps, vec![0]);
}

#[test]
fn reads_after_reads_are_not_deps() {
    let mut s = Schedule::new(3);
    s.push(Step::copy(1, r(0, Send, 0, 4), r(1, Recv, 0, 4)));
    s.push(Step::copy(2, r(0, Send, 0, 4), r(2, Recv, 0, 4)));
    let s = s.finish(Layout::OutOfPlace);
    assert!(s.steps.iter().all(|st| st.deps.is_empty()));
}

#[test]
fn same_rank_steps_never_depend_on_each_other() {
    let mut s = Schedule::new(2);
    s.push(Step::copy(0, r(0, Send, 0, 4), r(0, Recv, 0, 4)));
    s.push(Step::copy(0, r(0, Recv, 0, 4), r(1, Recv, 0, 4)));
    let s = s.finish(Layout::OutOfPlace);
    assert!(s.steps[1].deps.is_empty());
}

#[test]
fn only_the_latest_conflict_per_rank_is_kept() {
    let mut s = Schedule::new(2);
    for i in 0..3 {
        s.push(Step::copy(0, r(0, Send, i, 1), r(0, Recv, i, 1)));
    }
    s.push(Step::copy(1, r(0, Recv, 0, 3), r(1, Recv, 0, 3)));
    let s = s.finish(Layout::OutOfPlace);
    assert_eq!(s.steps[3].deps, vec![2]);
}

#[test]
fn deps_implied_through_another_rank_are_pruned() {
    let mut s = Schedule::new(3);
    s.push(Step::copy(0, r(0, Send, 0, 4), r(0, Recv, 0, 4))); // 0
    s.push(Step::copy(1, r(0, Recv, 0, 4), r(1, Recv, 0, 4))); // 1: deps [0]
                                                               // Reads what 0 and 1 wrote: waiting for 1 implies 0.
    s.push(Step::reduce(
        2,
        vec![r(0, Recv, 0, 4), r(1, Recv, 0, 4)],
        vec![r(2, Recv, 0, 4)],
        false,
    ));
    let s = s.finish(Layout::OutOfPlace);
    assert_eq!(s.steps[1].deps, vec![0]);
    assert_eq!(s.steps[2].deps, vec![1]);
}

#[test]
fn deps_implied_by_own_stream_are_pruned() {
    let mut s = Schedule::new(2);
    s.push(Step::copy(0, r(0, Send, 0, 4), r(0, Recv, 0, 4))); // 0
    s.push(Step::copy(1, r(0, Recv, 0, 2), r(1, Recv, 0, 2))); // 1: deps [0]
    s.push(Step::copy(1, r(0, Recv, 2, 2), r(1, Recv, 2, 2))); // 2: implied by 1
    let s = s.finish(Layout::OutOfPlace);
    assert_eq!(s.steps[1].deps, vec![0]);
    assert!(s.steps[2].deps.is_empty());
}

#[test]
fn start_and_end_waits_name_touched_ranks_and_last_steps() {
    let mut s = Schedule::new(3);
    s.push(Step::copy(1, r(0, Send, 0, 4), r(1, Recv, 0, 4))); // 0
    s.push(Step::copy(1, r(2, Send, 0, 4), r(1, Recv, 4, 4))); // 1
    s.push(Step::copy(1, r(0, Send, 4, 4), r(1, Recv, 8, 4))); // 2
    s.push(Step {
        dsts: vec![r(2, Recv, 0, 4), r(0, Recv, 0, 4)],
        ..Step::copy(2, r(2, Send, 0, 4), r(2, Recv, 0, 4))
    }); // 3
    let s = s.finish(Layout::OutOfPlace);
    assert_eq!(s.start_waits, vec![vec![], vec![0, 2], vec![0]]);
    assert_eq!(s.end_waits, vec![vec![2, 3], vec![], vec![1]]);
    check_invariants(&s);
}

#[test]
fn interval_map_tracks_latest_per_element() {
    let mut m = IntervalMap::default();
    m.record(0, 10, 1, true);
    m.record(5, 15, 2, false);
    m.record(3, 4, 3, true);
    assert_eq!(m.latest(0, 3, false), Some(1));
    assert_eq!(m.latest(3, 4, false), Some(3));
    assert_eq!(m.latest(10, 15, false), None);
    assert_eq!(m.latest(10, 15, true), Some(2));
    assert_eq!(m.latest(6, 7, true), Some(2));
    assert_eq!(m.latest(6, 7, false), Some(1));
    assert_eq!(m.latest(15, 20, true), None);
    m.record(0, 20, 4, true);
    assert_eq!(m.latest(19, 20, false), Some(4));
    assert_eq!(m.m.values().map(|v| v.0).max(), Some(20));
}

#[test]
fn segments_cover_count_nearly_evenly() {
    for n in 1..=16 {
        for count in [0, 1, n - 1, n, n + 1, 7, 4097] {
            let segs = segments(count, n);
            assert_eq!(segs.len(), n);
            assert_eq!(segs.iter().map(|s| s.1).sum::<usize>(), count);
            let (lo, hi) = (
                segs.iter().map(|s| s.1).min(),
                segs.iter().map(|s| s.1).max(),
            );
            assert!(hi.unwrap() - lo.unwrap() <= 1);
            assert!(segs.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
        }
    }
}

#[test]
fn invalid_inputs_give_empty_schedules() {
    let oop = Layout::OutOfPlace;
    assert!(all_reduce(&[0, 0, 1], 10, oop, 4).steps.is_empty());
    assert!(all_reduce(&[], 10, oop, 4).steps.is_empty());
    assert!(
        all_reduce(&[0, 1, 2], 10, Layout::SendInRecv { stride: 3 }, 4)
            .steps
            .is_empty()
    );
    assert!(
        reduce_scatter(&[0, 1], 10, Layout::RecvInSend { stride: 9 }, 4)
            .steps
            .is_empty()
    );
    assert!(
        all_gather(&[0, 1], 10, Layout::RecvInSend { stride: 10 }, 4)
            .steps
            .is_empty()
    );
    assert!(broadcast(&[0, 1], 10, 2, oop, 4).steps.is_empty());
    assert!(reduce(&[0, 1], 10, 5, oop, 4).steps.is_empty());
    assert!(gather(&[0, 1], 10, 2, oop, 4).steps.is_empty());
    assert!(scatter(&[0, 1], 10, 0, Layout::SendInRecv { stride: 0 }, 4)
        .steps
        .is_empty());
    assert!(send_recv(
        &[0, 1],
        &[P2p {
            from: 0,
            to: 2,
            count: 1
        }],
        oop,
        4
    )
    .steps
    .is_empty());
    assert!(all_to_all(&[0, 1], usize::MAX / 2, oop, 4).steps.is_empty());
    assert!(!is_ring(&[1, 2]));
}

#[test]
fn zero_chunk_is_treated_as_one_and_zero_count_is_empty() {
    let s = all_gather(&[0, 1, 2], 4, Layout::OutOfPlace, 0);
    assert_eq!(s.steps.len(), 4 * 3 * 3);
    assert!(s.steps.iter().all(|st| st.len() == 1));
    for s in [
        all_reduce(&[0, 1, 2], 0, Layout::OutOfPlace, 4),
        reduce_scatter(&[0, 1, 2], 0, Layout::OutOfPlace, 4),
        broadcast(&[0, 1, 2], 0, 1, Layout::OutOfPlace, 4),
        send_recv(
            &[0, 1],
            &[P2p {
                from: 0,
                to: 1,
                count: 0,
            }],
            Layout::OutOfPlace,
            4,
        ),
    ] {
        assert!(s.steps.is_empty());
        assert!(s.start_waits.iter().chain(&s.end_waits).all(Vec::is_empty));
    }
}

#[test]
fn all_reduce_step_counts_and_kinds() {
    for n in 3..=8 {
        let ring: Vec<usize> = (0..n).collect();
        let count = n * 10;
        for chunk in [3, 10] {
            let s = all_reduce(&ring, count, Layout::OutOfPlace, chunk);
            let chunks = 10usize.div_ceil(chunk);
            assert_eq!(s.steps.len(), chunks * n * (2 * n - 2));
            let reduces = s.steps.iter().filter(|st| st.srcs.len() == 2).count();
            assert_eq!(reduces, chunks * n * (n - 1));
            assert_eq!(s.steps.iter().filter(|st| st.finish).count(), chunks * n);
            assert_eq!(s.scratch_len, 0);
        }
    }
    let s = all_reduce(&[1, 0], 100, Layout::OutOfPlace, 7);
    assert_eq!(s.steps.len(), 2 * 50usize.div_ceil(7));
    assert!(s
        .steps
        .iter()
        .all(|st| st.dsts.len() == 2 && st.dsts[0].rank == st.exec));
}

#[test]
fn ring_collectives_only_wait_on_ring_neighbours() {
    let ring = [3, 0, 5, 1, 4, 2];
    let n = ring.len();
    let pos = |r: usize| ring.iter().position(|&x| x == r).unwrap();
    for s in [
        all_reduce(&ring, 1000, Layout::OutOfPlace, 16),
        all_reduce(&ring, 1000, Layout::SendInRecv { stride: 0 }, 16),
        reduce_scatter(&ring, 100, Layout::RecvInSend { stride: 100 }, 16),
        all_gather(&ring, 100, Layout::OutOfPlace, 16),
        broadcast(&ring, 100, 4, Layout::OutOfPlace, 16),
        reduce(&ring, 100, 4, Layout::OutOfPlace, 16),
    ] {
        check_invariants(&s);
        for st in &s.steps {
            for &d in &st.deps {
                let (a, b) = (pos(st.exec), pos(s.steps[d].exec));
                assert!(
                    (a + 1) % n == b || (b + 1) % n == a,
                    "dep between non-neighbours"
                );
            }
            for reg in st.srcs.iter().chain(&st.dsts) {
                let (a, b) = (pos(st.exec), pos(reg.rank));
                assert!(a == b || (b + 1) % n == a, "reads only its predecessor");
            }
        }
    }
}

#[test]
fn pipelining_lets_a_rank_start_the_next_chunk_early() {
    // Chunks touch disjoint elements, so a rank's first step of chunk c+1 waits for no other
    // rank: it runs as soon as its own stream finished chunk c, while its successor is still
    // working on chunk c.
    for n in [3, 4, 7] {
        let ring: Vec<usize> = (0..n).collect();
        for layout in [Layout::OutOfPlace, Layout::SendInRecv { stride: 0 }] {
            let s = all_reduce(&ring, n * 64, layout, 16);
            let per_chunk = n * (2 * n - 2);
            assert_eq!(s.steps.len(), 4 * per_chunk);
            for c in 1..4 {
                let first = &s.steps[c * per_chunk..c * per_chunk + n];
                assert!(first.iter().all(|st| st.deps.is_empty()));
            }
        }
    }
}

#[test]
fn scratch_sizes() {
    let oop = Layout::OutOfPlace;
    assert_eq!(reduce_scatter(&[0, 1], 10, oop, 4).scratch_len, 0);
    assert_eq!(reduce_scatter(&[0, 1, 2], 10, oop, 4).scratch_len, 10);
    assert_eq!(reduce_scatter(&[0, 1, 2, 3, 4], 10, oop, 4).scratch_len, 20);
    assert_eq!(reduce(&[0, 1], 10, 0, oop, 4).scratch_len, 0);
    assert_eq!(reduce(&[0, 1, 2], 10, 0, oop, 4).scratch_len, 10);
    assert_eq!(all_to_all(&[0, 1, 2], 10, oop, 4).scratch_len, 0);
    assert_eq!(
        all_to_all(&[0, 1, 2], 10, Layout::SendInRecv { stride: 0 }, 4).scratch_len,
        30
    );
    let pairs = [
        P2p {
            from: 0,
            to: 1,
            count: 3,
        },
        P2p {
            from: 0,
            to: 2,
            count: 4,
        },
    ];
    assert_eq!(
        send_recv(&[0, 1, 2], &pairs, Layout::SendInRecv { stride: 0 }, 4).scratch_len,
        7
    );
}

#[test]
fn copies_carry_no_finish_and_reduces_have_two_sources() {
    for n in 1..=6 {
        let ring: Vec<usize> = (0..n).rev().collect();
        for s in [
            all_reduce(&ring, 50, Layout::OutOfPlace, 8),
            reduce_scatter(&ring, 50, Layout::OutOfPlace, 8),
            reduce(&ring, 50, 0, Layout::OutOfPlace, 8),
        ] {
            check_invariants(&s);
            for st in &s.steps {
                if st.srcs.len() == 1 {
                    assert!(!st.finish || n == 1);
                }
            }
        }
    }
}
