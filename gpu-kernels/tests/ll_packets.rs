//! The LL protocol's host-visible parts: the area's layout, the flags, the packets, and the
//! lane-wise fold the kernel applies to 8-byte payloads, checked against the one-shot kernel's
//! primitive (`reduce_copy`) on the same elements.

use gpu_kernels::ctl::MAX_RANKS;
use gpu_kernels::element::{Bf16, Element, F16, F8E4M3, F8E5M2};
use gpu_kernels::ll::*;
use gpu_kernels::op::{Avg, Max, Min, Prod, ReduceOp, Sum};
use gpu_kernels::prim::{reduce_copy, Grid};

#[test]
fn slots_tile_the_area_aligned_and_disjoint() {
    assert_eq!(LL_SLOT_BYTES, 2 * LL_MAX_BYTES);
    assert_eq!(LL_AREA_BYTES, 256 + 2 * MAX_RANKS * 2 * LL_MAX_BYTES);
    let mut next = LL_HEADER_WORDS * 8;
    for parity in 0..2 {
        for src in 0..MAX_RANKS {
            let at = slot_offset(parity, src);
            assert_eq!(at, next, "slot ({parity}, {src}) follows the previous one");
            assert_eq!(at % PACKET_BYTES, 0, "16-byte packets stay aligned");
            next = at + LL_SLOT_BYTES;
        }
    }
    assert_eq!(next, LL_AREA_BYTES);
    let words = [LL_COUNTER, LL_FAILED, LL_DONE];
    for (i, w) in words.iter().enumerate() {
        assert!(*w < LL_HEADER_WORDS, "header word {w} inside the header");
        assert!(!words[..i].contains(w), "header word {w} used once");
    }
}

#[test]
fn blocks_cover_the_packets_one_per_thread_within_the_limit() {
    for threads in [32, 256, 512, 1024] {
        for bytes in (0..=LL_MAX_BYTES)
            .step_by(8)
            .chain([1, 7, 9, LL_MAX_BYTES - 1])
        {
            let b = ll_blocks(bytes, threads);
            assert!((1..=LL_MAX_BLOCKS).contains(&b), "{bytes} B: {b} blocks");
            let packets = bytes.div_ceil(PACKET_PAYLOAD);
            // Every packet has a thread of its own where the limit allows, on as few blocks
            // as that takes.
            assert!(
                b * threads >= packets || b == LL_MAX_BLOCKS,
                "{bytes} B: {b} too few"
            );
            assert!(
                b == 1 || (b - 1) * threads < packets,
                "{bytes} B: {b} blocks too many"
            );
        }
    }
    assert_eq!(
        ll_blocks(LL_MAX_BYTES, 512) * 512 * PACKET_PAYLOAD,
        LL_MAX_BYTES
    );
}

#[test]
fn flags_are_never_zero_and_differ_within_a_parity() {
    for e in (1..5000u64).chain([
        0xFFFF_FFFE,
        0xFFFF_FFFF,
        0x1_0000_0000,
        0x1_0000_0001,
        u64::MAX - 3,
    ]) {
        assert_ne!(ll_flag(e), 0, "epoch {e}");
        assert_ne!(
            ll_flag(e),
            ll_flag(e.wrapping_add(2)),
            "epochs {e} and {e} + 2 share a slot"
        );
        assert_ne!(ll_flag(e), ll_flag(e + 1 - (e == u64::MAX) as u64 * 2));
    }
}

#[test]
fn a_packet_carries_its_payload_only_with_both_flags() {
    let raw = 0xDEAD_BEEF_0123_4567u64;
    let p = pack(raw, 77);
    assert_eq!(unpack(p, 77), Some(raw));
    assert_eq!(unpack([p[0], 77, p[2], 76], 77), None, "half of a packet");
    assert_eq!(unpack([p[0], 76, p[2], 77], 77), None, "half of a packet");
    assert_eq!(unpack([0; 4], 1), None, "the zeroed area");
}

fn rand_u64(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Folds `n` random payloads lane-wise as the kernel does and element-wise with
/// `reduce_copy` over `n` sources (the one-shot kernel's primitive): the same bits.
fn same_as_reduce_copy<T: Element, O: ReduceOp>(seed: u64) {
    let lanes = 8 / T::SIZE;
    let mut s = seed | 1;
    for n in 2..=MAX_RANKS {
        for _ in 0..50 {
            let raws: Vec<u64> = (0..n).map(|_| rand_u64(&mut s)).collect();
            let mut acc = raws[0];
            for &v in &raws[1..] {
                acc = fold_lanes::<T, O>(acc, v);
            }
            let got = finish_lanes::<T, O>(acc, n as u32);
            let elems: Vec<Vec<T>> = raws
                .iter()
                .map(|&r| {
                    (0..lanes)
                        .map(|l| T::from_raw(r >> (8 * T::SIZE * l)))
                        .collect()
                })
                .collect();
            let mut srcs = [core::ptr::null::<T>(); MAX_RANKS];
            for (p, e) in srcs.iter_mut().zip(&elems) {
                *p = e.as_ptr();
            }
            let mut out = vec![T::from_raw(0); lanes];
            // SAFETY: `n` sources of `lanes` elements, one destination of as many.
            unsafe {
                reduce_copy::<T, O, MAX_RANKS>(
                    Grid {
                        thread: 0,
                        threads: 1,
                    },
                    srcs,
                    n,
                    out.as_mut_ptr(),
                    core::ptr::null_mut(),
                    lanes,
                    n as u32,
                )
            };
            for (l, want) in out.iter().enumerate() {
                let lane = T::from_raw(got >> (8 * T::SIZE * l));
                assert!(
                    lane.same_result(*want),
                    "{} {} lane {l} of {n} ranks",
                    T::NAME,
                    O::NAME
                );
            }
        }
    }
}

fn every_op<T: Element>(seed: u64) {
    same_as_reduce_copy::<T, Sum>(seed);
    same_as_reduce_copy::<T, Prod>(seed + 1);
    same_as_reduce_copy::<T, Min>(seed + 2);
    same_as_reduce_copy::<T, Max>(seed + 3);
    same_as_reduce_copy::<T, Avg>(seed + 4);
}

#[test]
fn the_lane_fold_is_the_one_shot_arithmetic_for_every_type_and_op() {
    every_op::<f32>(11);
    every_op::<f64>(12);
    every_op::<F16>(13);
    every_op::<Bf16>(14);
    every_op::<i8>(15);
    every_op::<u8>(16);
    every_op::<i32>(17);
    every_op::<u32>(18);
    every_op::<i64>(19);
    every_op::<u64>(20);
    every_op::<F8E4M3>(21);
    every_op::<F8E5M2>(22);
}
