//! The LL ("low-latency") push all-reduce for small calls among processes: NCCL's LL protocol,
//! flag and payload in one 16-byte store, so a call costs ONE exchange (a one-way trip) instead
//! of the one-shot kernel's two barriers.
//!
//! ## The LL area
//!
//! Each rank owns an **LL area** of [`LL_AREA_BYTES`] in its flag area (mapped by every peer,
//! zeroed once when the communicator is built, used by nothing else):
//! * a header of [`LL_HEADER_WORDS`] `u64`: word [`LL_COUNTER`] counts this rank's LL calls
//!   (the epoch, kept on the device: no host sequence number, so a CUDA graph's replays stay
//!   right), word [`LL_FAILED`] the last epoch in which a wait of this rank gave up;
//! * then `2` parities × [`crate::ctl::MAX_RANKS`] slots of [`LL_SLOT_BYTES`]: slot
//!   `(parity, src)` ([`slot_offset`]) receives rank `src`'s packets of the calls whose epoch
//!   has that parity.
//!
//! A **packet** ([`PACKET_BYTES`]) is `{data_lo: u32, flag: u32, data_hi: u32, flag: u32}`: 8
//! bytes of payload and the call's flag twice, written with one `st.volatile.v4.u32`, so a
//! reader that sees both flags equal to its call's flag ([`ll_flag`]) sees the payload too.
//!
//! ## One call (epoch `e` = counter + 1, flag `f = ll_flag(e)`, parity `e % 2`)
//! One to [`LL_MAX_BLOCKS`] blocks ([`ll_blocks`]: one per `threads` packets, so that a
//! thread moves one packet per peer up to 32 KiB, and waits one memory latency per
//! peer, not one per packet in a row). Thread `t` of the grid (`block * blockDim + tid`) owns
//! packets `i ≡ t (mod threads)` (`threads` the grid's): it reads payload `i` (bytes
//! `8 i .. 8 i + 8`, one 8-byte load where both buffers are 8-byte aligned, else element by
//! element) of its input (the caller's send buffer, directly: no staging copy) and
//! stores it as a packet into slot `(parity, rank)` of every peer's area; then, for the same
//! packets, polls its own area's slot `(parity, q)` for every peer `q` until the packet carries
//! `f`, folds the ranks' payloads lane by lane in rank order `0..n` (the same order and
//! arithmetic as the one-shot kernel: bit-identical results on every rank), and writes output
//! payload `i`. In place is safe: a thread reads its own packets of the input before it writes
//! the same bytes of the output. Then the call's last block to end stores `e` into the counter
//! ([`LL_DONE`] counts the blocks that have ended, after every one has read the counter; with
//! one block, its thread 0 stores it directly).
//!
//! Why two parities suffice: a rank in call `e` has finished `e - 1`, which needed every peer's
//! packets of `e - 1`, so every peer has finished `e - 2` and no longer reads the slots of
//! parity `e % 2` (this needs each rank's LL kernels of a communicator to run one after the
//! other, in call order: the host orders them on the stream; whichever blocks and threads move
//! them: the argument is about whole calls). Stale packets of `e - 2` carry
//! another flag, and zeroed memory flag 0, which [`ll_flag`] never returns.
//!
//! A wait polls [`crate::ctl::SPIN_POLLS`] times, then also watches the control block's abort
//! word and the clock like every other wait ([`crate::ctl`]); a wait that gives up writes its
//! status, sets the abort word on a timeout, writes `e` into [`LL_FAILED`], and its thread
//! stops (the call's output is then undefined and the host reports the error).
//!
//! ## The LL reduce-scatter
//! The all-reduce's entry points with `scatter = 1`: `count` is the output's elements and the
//! input holds `nranks` blocks of `count`; rank `r` pushes block `q` (not the whole input) to
//! peer `q`, and folds, in rank order, block `r` of its own input with the packets the peers
//! pushed it. Every rank still sends to and receives from every peer in every call, so the
//! two-parity argument holds unchanged. In place (`dst == src + r * count`, NCCL's layout) is
//! safe for the same reason as the all-reduce's: thread `t` alone reads and writes packet `i`
//! of block `r`, reading before writing, and the blocks it pushes do not overlap it.

use crate::element::Element;
use crate::op::ReduceOp;

/// The LL all-gather's entry point (not in the typed table: a copy has no element type). Its
/// parameters: `src, dst, bytes: u64, a0..a7 (every rank's LL area, unused = 0), nranks: u32,
/// rank: u32, ctl, timeout_ns: u64`; launch [`ll_blocks`]`(bytes, threads)` blocks per rank.
///
/// ## The LL all-gather
/// The same area, counter, flags and parities as the all-reduce (the two interleave on one
/// communicator: each call is one epoch): rank `r` pushes its `bytes` (at most
/// [`LL_MAX_BYTES`]) as packets into slot `(parity, r)` of every peer, then copies every rank
/// `q`'s payload (its own from `src`, the others' from its area once they carry the call's
/// flag) to `dst + q * bytes`. Every rank receives from every peer, so the two-parity argument
/// of the all-reduce holds. In place (`src == dst + r * bytes`) is safe: the own block is
/// written with the bytes just read from it, the others do not overlap it.
pub const LL_GATHER_ENTRY: &str = "ringccl_ll_gather";

/// Most payload bytes per rank of an LL call: a slot holds twice as many (the flags).
pub const LL_MAX_BYTES: usize = 32 << 10;

/// Bytes of one packet: 8 bytes of payload, two 4-byte flags.
pub const PACKET_BYTES: usize = 16;

/// Payload bytes of one packet.
pub const PACKET_PAYLOAD: usize = 8;

/// Bytes of one slot: the packets of [`LL_MAX_BYTES`] of payload.
pub const LL_SLOT_BYTES: usize = LL_MAX_BYTES / PACKET_PAYLOAD * PACKET_BYTES;

/// `u64` words of an LL area's header (256 bytes, keeping the slots 16-byte aligned).
pub const LL_HEADER_WORDS: usize = 32;

/// Index in the header of the word that counts this rank's LL calls.
pub const LL_COUNTER: usize = 0;

/// Index in the header of the word a thread whose wait failed writes the epoch into.
pub const LL_FAILED: usize = 1;

/// Index in the header of the word that counts the blocks of the current call that have ended
/// (the last one stores the epoch into [`LL_COUNTER`] and sets it back to 0); unused by a call
/// of one block.
pub const LL_DONE: usize = 2;

/// Most blocks of one LL call.
pub const LL_MAX_BLOCKS: usize = 8;

/// The blocks of an LL call moving `bytes` of payload per peer (the all-reduce's input, the
/// all-gather's block, the reduce-scatter's block per peer) with `threads` per block: one per
/// `threads` packets, so that each thread moves one packet per peer, 1 to [`LL_MAX_BLOCKS`]
/// (8 blocks of 512 threads: [`LL_MAX_BYTES`]). Any grid is correct (the ranks of a call need
/// not even agree); this one keeps a call of at most 4 KiB on one block of 512.
///
/// ```
/// use gpu_kernels::ll::{ll_blocks, LL_MAX_BLOCKS, LL_MAX_BYTES};
/// assert_eq!(ll_blocks(8, 512), 1);
/// assert_eq!(ll_blocks(4 << 10, 512), 1);
/// assert_eq!(ll_blocks((4 << 10) + 8, 512), 2);
/// assert_eq!(ll_blocks(LL_MAX_BYTES, 512), LL_MAX_BLOCKS);
/// assert_eq!(ll_blocks(usize::MAX, 0), LL_MAX_BLOCKS);
/// ```
#[inline(always)]
pub const fn ll_blocks(bytes: usize, threads: usize) -> usize {
    let packets = bytes.div_ceil(PACKET_PAYLOAD);
    let threads = if threads == 0 { 1 } else { threads };
    let b = packets.div_ceil(threads);
    if b == 0 {
        1
    } else if b > LL_MAX_BLOCKS {
        LL_MAX_BLOCKS
    } else {
        b
    }
}

/// Bytes of one rank's LL area: the header, then 2 parities × `MAX_RANKS` slots.
pub const LL_AREA_BYTES: usize = LL_HEADER_WORDS * 8 + 2 * crate::ctl::MAX_RANKS * LL_SLOT_BYTES;

/// Byte offset, from the start of an LL area, of slot `(parity, src)`.
///
/// ```
/// use gpu_kernels::ll::{slot_offset, LL_AREA_BYTES, LL_HEADER_WORDS, LL_SLOT_BYTES};
/// assert_eq!(slot_offset(0, 0), LL_HEADER_WORDS * 8);
/// assert_eq!(slot_offset(1, 7) + LL_SLOT_BYTES, LL_AREA_BYTES);
/// ```
#[inline(always)]
pub const fn slot_offset(parity: usize, src: usize) -> usize {
    LL_HEADER_WORDS * 8 + (parity * crate::ctl::MAX_RANKS + src) * LL_SLOT_BYTES
}

/// The flag of the call of epoch `epoch` (≥ 1): never 0 (the zeroed area), and different for
/// two epochs of the same parity unless they are `2^32 - 1` calls apart... which they cannot
/// be both in a slot, as a slot only ever holds the last two calls of its parity.
///
/// ```
/// use gpu_kernels::ll::ll_flag;
/// assert_eq!(ll_flag(1), 1);
/// assert_eq!(ll_flag(0xFFFF_FFFF), 0xFFFF_FFFF);
/// assert_eq!(ll_flag(0x1_0000_0000), 1);
/// assert_ne!(ll_flag(0x1_0000_0000), ll_flag(0xFFFF_FFFF));
/// ```
#[inline(always)]
pub const fn ll_flag(epoch: u64) -> u32 {
    (epoch.wrapping_sub(1) % 0xFFFF_FFFF) as u32 + 1
}

/// A packet as the kernel stores it: payload `raw` (8 bytes, little-endian) with `flag`.
///
/// ```
/// use gpu_kernels::ll::pack;
/// assert_eq!(pack(0x1122_3344_5566_7788, 9), [0x5566_7788, 9, 0x1122_3344, 9]);
/// ```
#[inline(always)]
pub const fn pack(raw: u64, flag: u32) -> [u32; 4] {
    [raw as u32, flag, (raw >> 32) as u32, flag]
}

/// The payload of a packet if it carries `flag` (both flag words), else `None`.
///
/// ```
/// use gpu_kernels::ll::{pack, unpack};
/// assert_eq!(unpack(pack(42, 3), 3), Some(42));
/// assert_eq!(unpack(pack(42, 3), 4), None);
/// assert_eq!(unpack([1, 3, 2, 0], 3), None);
/// ```
#[inline(always)]
pub const fn unpack(p: [u32; 4], flag: u32) -> Option<u64> {
    if p[1] == flag && p[3] == flag {
        Some(p[0] as u64 | (p[2] as u64) << 32)
    } else {
        None
    }
}

/// `acc ⊕ v` lane by lane: the payloads as `8 / size` elements of `T` (little-endian), each
/// combined with [`ReduceOp::combine`], the one-shot kernel's arithmetic.
///
/// ```
/// use gpu_kernels::ll::fold_lanes;
/// use gpu_kernels::op::Sum;
/// let a = u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 250]);
/// let b = u64::from_le_bytes([1, 1, 1, 1, 1, 1, 1, 10]);
/// assert_eq!(fold_lanes::<u8, Sum>(a, b).to_le_bytes(), [2, 3, 4, 5, 6, 7, 8, 4]);
/// ```
#[inline(always)]
pub fn fold_lanes<T: Element, O: ReduceOp>(acc: u64, v: u64) -> u64 {
    map_lanes::<T>(acc, v, O::combine)
}

/// `f` lane by lane over two payloads taken as `8 / size` elements of `T` (little-endian).
#[inline(always)]
fn map_lanes<T: Element>(a: u64, b: u64, f: impl Fn(T, T) -> T) -> u64 {
    let lanes = PACKET_PAYLOAD / T::SIZE;
    let bits = 8 * T::SIZE;
    let mask = u64::MAX >> (64 - bits);
    let mut out = 0u64;
    let mut l = 0;
    while l < lanes {
        let x = T::from_raw(a >> (bits * l));
        let y = T::from_raw(b >> (bits * l));
        out |= (f(x, y).to_raw() & mask) << (bits * l);
        l += 1;
    }
    out
}

/// [`ReduceOp::finish`] on every lane of a payload (see [`fold_lanes`]).
///
/// ```
/// use gpu_kernels::ll::finish_lanes;
/// use gpu_kernels::op::Avg;
/// let a = u64::from_le_bytes([2, 4, 6, 8, 10, 12, 14, 16]);
/// assert_eq!(finish_lanes::<u8, Avg>(a, 2).to_le_bytes(), [1, 2, 3, 4, 5, 6, 7, 8]);
/// ```
#[inline(always)]
pub fn finish_lanes<T: Element, O: ReduceOp>(acc: u64, postdiv: u32) -> u64 {
    map_lanes::<T>(acc, 0, |a, _| O::finish(a, postdiv))
}

#[cfg(target_arch = "nvptx64")]
mod dev {
    use super::{finish_lanes, fold_lanes};
    use super::{
        ll_flag, slot_offset, LL_COUNTER, LL_DONE, LL_FAILED, PACKET_BYTES, PACKET_PAYLOAD,
    };
    use crate::ctl::{pick, wait_step, MAX_RANKS};
    use crate::element::Element;
    use crate::op::ReduceOp;
    use core::arch::asm;
    use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _syncthreads, _thread_idx_x};

    /// This thread's index in the grid, the grid's threads, and whether it is its block's
    /// thread 0.
    #[inline(always)]
    fn grid_thread() -> (usize, usize, bool) {
        // SAFETY: reading special registers has no side effects.
        unsafe {
            let (t, dim) = (_thread_idx_x() as usize, _block_dim_x() as usize);
            let (b, blocks) = (_block_idx_x() as usize, _grid_dim_x() as usize);
            (b * dim + t, blocks * dim, t == 0)
        }
    }

    /// The end of a call, by thread 0 of each block after the block's last barrier: with one
    /// block, stores `epoch` into the counter; with more, counts the block in [`LL_DONE`] (after
    /// a fence: its threads' reads of the counter are done), and the last block to count stores
    /// `epoch` and sets [`LL_DONE`] back to 0 for the next call.
    #[inline(always)]
    unsafe fn end_call(header: *mut u64, epoch: u64) {
        // SAFETY: reading a special register has no side effects; `header` is this rank's LL
        // area's header (the caller's contract), written here by no one else during the call.
        unsafe {
            let blocks = _grid_dim_x() as u64;
            if blocks == 1 {
                core::ptr::write_volatile(header.add(LL_COUNTER), epoch);
                return;
            }
            let done = header.add(LL_DONE);
            let before: u64;
            asm!("fence.acq_rel.gpu;", "atom.acq_rel.gpu.add.u64 {0}, [{1}], 1;",
                 out(reg64) before, in(reg64) done, options(nostack, preserves_flags));
            if before + 1 == blocks {
                core::ptr::write_volatile(done, 0);
                core::ptr::write_volatile(header.add(LL_COUNTER), epoch);
            }
        }
    }

    /// Stores packet `v` at `p` in one 16-byte store.
    #[inline(always)]
    pub(crate) unsafe fn store_packet(p: *mut u8, v: [u32; 4]) {
        // SAFETY: the caller guarantees `p` is a valid, 16-byte aligned packet.
        unsafe {
            asm!("st.volatile.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}};", in(reg64) p,
                 in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
                 options(nostack, preserves_flags))
        }
    }

    /// The packet at `p`, read in one 16-byte load.
    #[inline(always)]
    pub(crate) unsafe fn load_packet(p: *const u8) -> [u32; 4] {
        let (a, b, c, d): (u32, u32, u32, u32);
        // SAFETY: the caller guarantees `p` is a valid, 16-byte aligned packet.
        unsafe {
            asm!("ld.volatile.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];", out(reg32) a,
                 out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) p,
                 options(nostack, preserves_flags))
        }
        [a, b, c, d]
    }

    /// Payload `i` of `src` (`count` elements; one 8-byte load when `aligned`, else element
    /// by element): zero past the end.
    #[inline(always)]
    unsafe fn load_payload<T: Element>(
        src: *const T,
        i: usize,
        count: usize,
        aligned: bool,
    ) -> u64 {
        let lanes = PACKET_PAYLOAD / T::SIZE;
        // SAFETY: in bounds of `count` elements, per the caller.
        unsafe {
            if aligned && (i + 1) * lanes <= count {
                return (src as *const u64).add(i).read();
            }
            let mut raw = 0u64;
            let mut l = 0;
            while l < lanes {
                let e = i * lanes + l;
                if e < count {
                    raw |= src.add(e).read().to_raw() << (8 * T::SIZE * l);
                }
                l += 1;
            }
            raw
        }
    }

    /// Writes payload `i` into `dst` (`count` elements; like [`load_payload`]), nothing past
    /// the end.
    #[inline(always)]
    unsafe fn store_payload<T: Element>(
        dst: *mut T,
        i: usize,
        count: usize,
        raw: u64,
        aligned: bool,
    ) {
        let lanes = PACKET_PAYLOAD / T::SIZE;
        // SAFETY: in bounds of `count` elements, per the caller.
        unsafe {
            if aligned && (i + 1) * lanes <= count {
                (dst as *mut u64).add(i).write(raw);
                return;
            }
            let mut l = 0;
            while l < lanes {
                let e = i * lanes + l;
                if e < count {
                    dst.add(e).write(T::from_raw(raw >> (8 * T::SIZE * l)));
                }
                l += 1;
            }
        }
    }

    /// Step 1 of a call, by thread `tid` of `threads`: its payloads `tid, tid + threads, …` of
    /// the block of `src` meant for each peer `q` (`count` elements, `packets` payloads, at
    /// `src + q * stride`; `stride` 0: the same block for every peer) as packets with `flag`
    /// into slot `out_slot` of every peer's area.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn push<T: Element>(
        src: *const T,
        stride: usize,
        (count, packets, aligned): (usize, usize, bool),
        areas: [*mut u8; MAX_RANKS],
        (n, rank): (usize, usize),
        out_slot: usize,
        flag: u32,
        (tid, threads): (usize, usize),
    ) {
        let mut i = tid;
        // SAFETY: per the caller's contract (the kernels' own).
        unsafe {
            while i < packets {
                let same = if stride == 0 {
                    super::pack(load_payload(src, i, count, aligned), flag)
                } else {
                    [0; 4]
                };
                let mut q = 0;
                while q < MAX_RANKS {
                    if q < n && q != rank {
                        let v = if stride == 0 {
                            same
                        } else {
                            super::pack(load_payload(src.add(q * stride), i, count, aligned), flag)
                        };
                        let area = pick(areas, q);
                        store_packet(area.add(out_slot + i * PACKET_BYTES), v);
                    }
                    q += 1;
                }
                i += threads;
            }
        }
    }

    /// Packet `i` of slot `(parity, q)` of this rank's area `mine`, once it carries `flag`;
    /// `None` if the wait gave up (its status written, like every wait's).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn take(
        mine: *mut u8,
        (parity, q, i): (usize, usize, usize),
        flag: u32,
        ctl: *mut u64,
        timeout_ns: u64,
        rank: usize,
    ) -> Option<u64> {
        let mut polls = 0u32;
        let mut clock = (0u64, 32u32);
        // SAFETY: packet `i` of slot `(parity, q)` lies in this rank's area (the caller's
        // contract).
        unsafe {
            let p = mine.add(slot_offset(parity, q) + i * PACKET_BYTES);
            loop {
                if let Some(v) = super::unpack(load_packet(p), flag) {
                    return Some(v);
                }
                if !wait_step(&mut polls, &mut clock, ctl, timeout_ns, rank, q) {
                    return None;
                }
            }
        }
    }

    /// The kernel body of `ringccl_ll_{op}_{ty}` (see the module docs): the all-reduce
    /// (`scatter` false) or the reduce-scatter (`scatter` true, the module docs' last
    /// section).
    ///
    /// # Safety
    /// Any grid of 1 to [`super::LL_MAX_BLOCKS`] blocks; every rank launched with the same `nranks`, `count`, `scatter` and type;
    /// `dst` `count` elements and `src` `count` elements, or with `scatter` `nranks * count`
    /// (element-aligned; `dst == src` allowed, with `scatter` `dst == src + rank * count`);
    /// `count * size ≤ LL_MAX_BYTES`; `areas[0..nranks]` every rank's LL area (`areas[rank]` this rank's),
    /// accessible from this GPU and used by no one but this communicator's LL kernels, which
    /// run on each rank in call order; `rank < nranks ≤ MAX_RANKS`; `ctl` the control block.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce<T: Element, O: ReduceOp>(
        src: *const T,
        dst: *mut T,
        count: usize,
        scatter: bool,
        postdiv: u32,
        areas: [*mut u8; MAX_RANKS],
        nranks: usize,
        rank: usize,
        ctl: *mut u64,
        timeout_ns: u64,
    ) {
        let (tid, threads, first) = grid_thread();
        let n = if nranks > MAX_RANKS {
            MAX_RANKS
        } else {
            nranks
        };
        let lanes = PACKET_PAYLOAD / T::SIZE;
        let packets = count.div_ceil(lanes);
        // Reduce-scatter: peer `q` gets block `q` of the input, this rank folds block `rank`.
        let stride = if scatter { count } else { 0 };
        // Payloads move as one 8-byte access where both buffers (and every block) allow it.
        let aligned = (src as usize | dst as usize | stride * T::SIZE) % PACKET_PAYLOAD == 0;
        let own_src = src.wrapping_add(rank * stride);
        let mine = pick(areas, rank);
        let header = mine as *mut u64;
        // SAFETY (whole body): pointers per this function's contract; the counter is written
        // only by thread 0 after the block's last barrier, when every thread has read it.
        unsafe {
            let epoch = core::ptr::read_volatile(header.add(LL_COUNTER)).wrapping_add(1);
            let flag = ll_flag(epoch);
            let parity = (epoch & 1) as usize;
            let out_slot = slot_offset(parity, rank);

            // 1. Push: my payloads into slot (parity, rank) of every peer.
            push(
                src,
                stride,
                (count, packets, aligned),
                areas,
                (n, rank),
                out_slot,
                flag,
                (tid, threads),
            );

            // 2. Receive and fold in rank order.
            let mut i = tid;
            let mut failed = false;
            while i < packets && !failed {
                let own = load_payload(own_src, i, count, aligned);
                let mut acc = 0u64;
                let mut q = 0;
                while q < MAX_RANKS && q < n {
                    let v = if q == rank {
                        own
                    } else {
                        match take(mine, (parity, q, i), flag, ctl, timeout_ns, rank) {
                            Some(v) => v,
                            None => {
                                failed = true;
                                break;
                            }
                        }
                    };
                    acc = if q == 0 {
                        v
                    } else {
                        fold_lanes::<T, O>(acc, v)
                    };
                    q += 1;
                }
                if failed {
                    core::ptr::write_volatile(header.add(LL_FAILED), epoch);
                    break;
                }
                store_payload(dst, i, count, finish_lanes::<T, O>(acc, postdiv), aligned);
                i += threads;
            }
            _syncthreads();
            if first {
                end_call(header, epoch);
            }
        }
    }

    /// The kernel body of `ringccl_ll_gather` (see [`super::LL_GATHER_ENTRY`]).
    ///
    /// # Safety
    /// Any grid of 1 to [`super::LL_MAX_BLOCKS`] blocks; every rank launched with the same `nranks` and `bytes`; `src` `bytes` long,
    /// `dst` `nranks * bytes` (`src == dst + rank * bytes` allowed, no other overlap); `bytes
    /// ≤ LL_MAX_BYTES`; `areas`, `rank`, `nranks`, `ctl` as for [`all_reduce`], whose kernels
    /// and these run on each rank in call order.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_gather(
        src: *const u8,
        dst: *mut u8,
        bytes: usize,
        areas: [*mut u8; MAX_RANKS],
        nranks: usize,
        rank: usize,
        ctl: *mut u64,
        timeout_ns: u64,
    ) {
        let (tid, threads, first) = grid_thread();
        let n = if nranks > MAX_RANKS {
            MAX_RANKS
        } else {
            nranks
        };
        let packets = bytes.div_ceil(PACKET_PAYLOAD);
        // Every block of the output is 8-byte aligned when the buffers and the size are.
        let aligned = (src as usize | dst as usize | bytes) % PACKET_PAYLOAD == 0;
        let mine = pick(areas, rank);
        let header = mine as *mut u64;
        // SAFETY (whole body): pointers per this function's contract; the counter is written
        // only by thread 0 after the block's last barrier, when every thread has read it.
        unsafe {
            let epoch = core::ptr::read_volatile(header.add(LL_COUNTER)).wrapping_add(1);
            let flag = ll_flag(epoch);
            let parity = (epoch & 1) as usize;
            let out_slot = slot_offset(parity, rank);

            // 1. Push: my payloads into slot (parity, rank) of every peer.
            push(
                src,
                0,
                (bytes, packets, aligned),
                areas,
                (n, rank),
                out_slot,
                flag,
                (tid, threads),
            );

            // 2. Every rank's payloads into its block of the output.
            let mut i = tid;
            let mut failed = false;
            while i < packets && !failed {
                let mut q = 0;
                while q < MAX_RANKS && q < n {
                    let v = if q == rank {
                        load_payload(src, i, bytes, aligned)
                    } else {
                        match take(mine, (parity, q, i), flag, ctl, timeout_ns, rank) {
                            Some(v) => v,
                            None => {
                                failed = true;
                                break;
                            }
                        }
                    };
                    store_payload(dst.add(q * bytes), i, bytes, v, aligned);
                    q += 1;
                }
                if failed {
                    core::ptr::write_volatile(header.add(LL_FAILED), epoch);
                    break;
                }
                i += threads;
            }
            _syncthreads();
            if first {
                end_call(header, epoch);
            }
        }
    }
}

#[cfg(target_arch = "nvptx64")]
pub(crate) use dev::{all_gather, all_reduce, load_packet, store_packet};

/// The LL protocol on the CPU: ranks step through a sequence of calls (all-reduces and
/// all-gathers alike: each pushes its packets to every peer, then takes every peer's) in random
/// interleavings, over areas of two parities of slots per source, with the kernels' epochs and
/// flags. Checks the module docs' argument: a packet is never overwritten before its reader has
/// taken it, and a reader only ever takes the packet of its own call.
#[cfg(test)]
mod protocol {
    extern crate std;
    use super::{ll_flag, pack, unpack};
    use rand::{Rng, SeedableRng};
    use std::vec;
    use std::vec::Vec;

    /// Where a rank is in its current call.
    #[derive(Clone, Copy, Debug)]
    enum At {
        /// Pushing to the peer of this index (into `peers`).
        Push(usize),
        /// Taking the packet of the peer of this index.
        Take(usize),
    }

    struct Rank {
        /// Calls done (the area's counter).
        done: u64,
        at: At,
        /// Slots `[parity][src]` of this rank's area: the packet last stored there.
        area: [[[u32; 4]; 8]; 2],
        /// The payloads taken in the current call, by source.
        got: Vec<Option<u64>>,
        /// `[parity][src]`: the call whose packet sits in the slot, not yet taken.
        untaken: [[Option<u64>; 8]; 2],
    }

    fn payload(src: usize, epoch: u64) -> u64 {
        (src as u64) << 40 | epoch
    }

    fn run(n: usize, calls: u64, seed: u64) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut ranks: Vec<Rank> = (0..n)
            .map(|_| Rank {
                done: 0,
                at: At::Push(0),
                area: [[[0; 4]; 8]; 2],
                got: vec![None; n],
                untaken: [[None; 8]; 2],
            })
            .collect();
        let peers = |r: usize| (0..n).filter(move |&q| q != r).collect::<Vec<_>>();
        while ranks.iter().any(|k| k.done < calls) {
            let r = rng.random_range(0..n);
            if ranks[r].done == calls {
                continue;
            }
            let e = ranks[r].done + 1;
            let (flag, parity) = (ll_flag(e), (e % 2) as usize);
            let ps = peers(r);
            match ranks[r].at {
                At::Push(i) => {
                    let q = ps[i];
                    // The slot must hold nothing its reader has yet to take.
                    if let Some(old) = ranks[q].untaken[parity][r] {
                        panic!("rank {r}'s call {e} overwrote its call {old} in rank {q} before it was taken");
                    }
                    ranks[q].area[parity][r] = pack(payload(r, e), flag);
                    ranks[q].untaken[parity][r] = Some(e);
                    ranks[r].at = if i + 1 < ps.len() {
                        At::Push(i + 1)
                    } else {
                        At::Take(0)
                    };
                }
                At::Take(i) => {
                    let q = ps[i];
                    // Spins until the packet carries this call's flag.
                    if let Some(v) = unpack(ranks[r].area[parity][q], flag) {
                        assert_eq!(
                            v,
                            payload(q, e),
                            "rank {r} took another call's packet from {q}"
                        );
                        ranks[r].got[q] = Some(v);
                        ranks[r].untaken[parity][q] = None;
                        if i + 1 < ps.len() {
                            ranks[r].at = At::Take(i + 1);
                        } else {
                            assert!(ps.iter().all(|&q| ranks[r].got[q].is_some()));
                            ranks[r].got.iter_mut().for_each(|g| *g = None);
                            ranks[r].done = e;
                            ranks[r].at = At::Push(0);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn two_parities_suffice_in_any_interleaving() {
        for n in 2..=8 {
            for seed in 0..40 {
                run(n, 30, seed * 31 + n as u64);
            }
        }
    }
}
