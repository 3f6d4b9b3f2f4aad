//! Point-to-point among processes in ONE kernel per rank ([`P2P_ENTRY`]): a group of sends and
//! receives (and a local copy) with every counter on the device, so nothing the host computes
//! per call is baked into the launch and a CUDA graph that captured it replays correctly.
//!
//! ## The point-to-point buffer
//!
//! Each rank owns one buffer of [`buffer_bytes`]`(nranks)` (plain `cuMemAlloc`, zeroed once,
//! mapped by its peers over CUDA IPC, used by no other kernel): a **header** of
//! [`HEADER_WORDS`] `u64` counters, then one **region** of [`REGION_BYTES`] per source rank,
//! each [`CHANNELS`] channels of [`SLOTS`] slots of [`SLOT_BYTES`], then [`LL_CHANNELS`]
//! channels of [`SLOTS`] LL slots of [`LL_SLOT_BYTES`] (the last section).
//!
//! A transfer of `b` bytes from rank `s` to rank `d` (every send from `s` to `d` in the
//! group: one byte stream over their buffers, [`P2pPiece`]) is cut into [`chunks`]`(b)` chunks of
//! [`SLOT_BYTES`] (the last may be shorter; of [`LL_CHUNK_BYTES`] for a small one, below), dealt round-robin to [`channels`]`(b, cap)`
//! channels: chunk `i` goes through channel `i % C`. Both sides compute the same cut from the
//! byte count alone. Channel `c` of the pair is one block on each side, with its own counters,
//! counted over every group the pair ever ran on that channel (nothing is reset):
//! * `DATA[s][c]` in `d`'s header, written by `s`: chunks `s` has put in `d`'s slots;
//! * `CONSUMED[d][c]` in `s`'s header, written by `d`: chunks `d` has copied out of them;
//! * `SENT[d][c]` in `s`'s header and `RECVD[s][c]` in `d`'s, each written only by its owner's
//!   kernel: where the next group's chunks start;
//! * `POST_ADDR[d][c]` and `POST_TAG[d][c]` in `s`'s header, written by `d`: a posted
//!   transfer's receive buffer (below).
//!
//! The `k`-th chunk of the channel (counted over every group) fills slot `k % SLOTS` of
//! channel `c` of the region `d` keeps for `s`. The sender waits until `CONSUMED >= k + 1 -
//! SLOTS` (the slot's previous chunk is out), copies, fences (system scope) and release-stores
//! `k + 1` into `DATA`; the receiver waits until `DATA >= k + 1`, copies the chunk out, fences
//! and release-stores `k + 1` into `CONSUMED`. A group's first chunks wait for nothing but the
//! slots' previous contents, so a small send costs one one-way trip.
//!
//! ## Small transfers: LL chunks
//!
//! A transfer of at most [`LL_MAX_BYTES`] ([`is_ll`]: both sides decide from the byte count)
//! is cut into chunks of [`LL_CHUNK_BYTES`] instead, and a chunk moves as NCCL's LL packets
//! (`crate::ll`: 8 bytes of payload and the chunk's flag twice in one 16-byte store) through
//! the region's **LL slots** ([`ll_channel_offset`]: [`SLOTS`] slots of [`LL_SLOT_BYTES`] per
//! channel, beside the other slots, so a packet slot never holds raw bytes whose words could
//! pass for a flag). The `k`-th chunk of the channel (the same count as the other chunks: the
//! two kinds interleave on a channel) fills LL slot `k % SLOTS` with flag
//! `crate::ll::ll_flag(k + 1)`. The sender waits for `CONSUMED` as above, stores its packets
//! and neither fences nor signals `DATA`; each receiving thread polls its own packets until
//! they carry the flag (so the payload is there: no fence, no flag round trip), writes the
//! payload out, and after a barrier thread 0 stores `k + 1` into `CONSUMED` (relaxed: only
//! the block's loads, already returned, come before it, as in NCCL's receivers). A small
//! send costs one one-way trip of the data itself. A slot's stale packets carry the flag of
//! an earlier chunk of its parity (`k - 2`, …), and zeroed memory flag 0, which `ll_flag` never
//! gives; only a chunk exactly `2^32 - 1` chunks of the channel before (with no LL chunk of
//! that parity since) could carry the same flag.
//!
//! ## Large transfers into a registered buffer: posted, zero-copy
//!
//! A transfer the host marks [`kind::POSTED`] (on both sides alike: the communicator has
//! registered buffers, and the transfer is larger than [`LL_MAX_BYTES`]) starts with a post from the
//! receiver: each receiving channel writes into the sender's header where its bytes may go
//! (`POST_ADDR`: the receive buffer as the sender's process maps it, when it is one buffer
//! inside a registered allocation; else 0), then release-stores `RECVD + 1` into `POST_TAG`.
//! The sending channel waits for that tag (its `SENT` equals the receiver's `RECVD`), reads
//! the address, and, if not 0, copies its share ([`direct_share`]) straight into the receive
//! buffer, fences and release-stores `SENT + chunks` into `DATA` at once; the receiver waits
//! for that, stores the same into `CONSUMED` (no slot was used), and both counters move on
//! as if the chunks had passed through the slots. Where 0 was posted, the chunks go through
//! the slots as above (the post cost one one-way trip). The post also says that the receiver
//! has reached the group, so nothing of its earlier work on the buffer is pending.
//!
//! Sends and receives run in different blocks; the host sizes the grid so that every block of
//! every rank is resident at once ([`channel_cap`]), so a rank that sends to and receives from
//! one peer never waits on itself. Every wait is bounded like the other cross-process kernels'
//! ([`crate::ctl`]): on the abort word or the timeout it writes its status (naming the peer) and
//! the block ends; the communicator is failed by the host then.

/// The name of the point-to-point kernel (not in the entry table: it has no element type):
/// `ringccl_p2p(args: P2pArgs)`, one parameter passed by value, `args.blocks()` blocks.
pub const P2P_ENTRY: &str = "ringccl_p2p";

/// Most ranks of a communicator whose point-to-point groups run on the kernel.
pub const MAX_RANKS: usize = 8;

/// Most channels (blocks per transfer, on each side) of one pair and direction.
pub const CHANNELS: usize = 16;

/// Slots per channel.
pub const SLOTS: usize = 2;

/// Bytes of a slot (and of a chunk).
pub const SLOT_BYTES: usize = 32 << 10;

/// Most operations of one kernel: a send and a receive per peer and one local copy.
pub const MAX_OPS: usize = 2 * MAX_RANKS;

/// Most buffers of one kernel's sends and receives together ([`P2pPiece`]): the operations
/// of a group between two ranks in one direction are one byte stream (in the order given), cut
/// into chunks across their buffers.
pub const MAX_PIECES: usize = 64;

/// Words of one role of a header: one per peer and channel.
pub const ROLE_WORDS: usize = MAX_RANKS * CHANNELS;

/// Counters in a header: six roles × [`MAX_RANKS`] peers × [`CHANNELS`] channels.
pub const HEADER_WORDS: usize = 6 * ROLE_WORDS;

/// Bytes of a header (a multiple of 256, so the regions stay aligned).
pub const HEADER_BYTES: usize = HEADER_WORDS * 8;

/// Most bytes of a transfer (one peer and direction of a group) that moves as LL chunks.
pub const LL_MAX_BYTES: usize = 64 << 10;

/// Payload bytes of an LL chunk.
pub const LL_CHUNK_BYTES: usize = 8 << 10;

/// Bytes of an LL slot: the packets of one LL chunk.
pub const LL_SLOT_BYTES: usize =
    LL_CHUNK_BYTES / crate::ll::PACKET_PAYLOAD * crate::ll::PACKET_BYTES;

/// Channels with LL slots: enough for the chunks of the largest LL transfer.
pub const LL_CHANNELS: usize = LL_MAX_BYTES / LL_CHUNK_BYTES;

const _: () = assert!(LL_CHANNELS <= CHANNELS && LL_CHANNELS * LL_CHUNK_BYTES == LL_MAX_BYTES);

/// Bytes of the slots of a region's channels (the LL slots follow them).
const PLAIN_BYTES: usize = CHANNELS * SLOTS * SLOT_BYTES;

/// Bytes of one source rank's region: its channels' slots, then their LL slots.
pub const REGION_BYTES: usize = PLAIN_BYTES + LL_CHANNELS * SLOTS * LL_SLOT_BYTES;

/// Role of a header word: chunks a peer has put into this rank's slots.
pub const DATA: usize = 0;
/// Role of a header word: chunks a peer has taken out of its slots that this rank filled.
pub const CONSUMED: usize = 1;
/// Role of a header word: chunks this rank has sent to a peer (its own).
pub const SENT: usize = 2;
/// Role of a header word: chunks this rank has received from a peer (its own).
pub const RECVD: usize = 3;
/// Role of a header word of a posted transfer ([`kind::POSTED`]): where a peer wants this
/// rank's bytes written (its receive buffer as mapped in this process; 0: through the slots),
/// written by the peer before [`POST_TAG`].
pub const POST_ADDR: usize = 4;
/// Role of a header word of a posted transfer: `RECVD + 1` of the peer's channel when it
/// posted [`POST_ADDR`] (release-stored after it).
pub const POST_TAG: usize = 5;

/// An operation's kind ([`P2pOpDesc::kind`]).
pub mod kind {
    /// No operation (an unused row).
    pub const NONE: u32 = 0;
    /// A send to `peer`.
    pub const SEND: u32 = 1;
    /// A receive from `peer`.
    pub const RECV: u32 = 2;
    /// A local copy from `user` to `slots`.
    pub const COPY: u32 = 3;
    /// Or'ed into a [`SEND`] or [`RECV`] of more than [`LL_MAX_BYTES`](super::LL_MAX_BYTES)
    /// (both sides alike): a *posted* transfer. Each receiving channel first posts where the
    /// sender may write its bytes (`user` of the receive: the receive buffer as mapped in the
    /// sender's process, or 0) into the sender's header ([`POST_ADDR`](super::POST_ADDR),
    /// [`POST_TAG`](super::POST_TAG)); each sending channel waits for that post, then copies
    /// its share of the bytes straight into the receive buffer and signals `DATA` once
    /// (zero-copy), or, where 0 was posted, moves its chunks through the slots as any transfer.
    pub const POSTED: u32 = 1 << 8;
    /// The bits of the kind itself, without [`POSTED`].
    pub const MASK: u32 = 0xff;
}

/// The bytes `[lo, hi)` that channel `c` of `channels` copies of a zero-copy transfer of
/// `bytes` ([`kind::POSTED`]): one contiguous share each, a multiple of 256 bytes but the last.
///
/// ```
/// use gpu_kernels::p2p::direct_share;
/// assert_eq!(direct_share(1000, 2, 0), (0, 512));
/// assert_eq!(direct_share(1000, 2, 1), (512, 1000));
/// assert_eq!(direct_share(100, 4, 3), (100, 100)); // nothing left for the last channel
/// ```
#[inline(always)]
pub const fn direct_share(bytes: usize, channels: usize, c: usize) -> (usize, usize) {
    let ch = if channels == 0 { 1 } else { channels };
    let per = bytes.div_ceil(ch).div_ceil(256) * 256;
    let lo = if c * per < bytes { c * per } else { bytes };
    let hi = if lo + per < bytes { lo + per } else { bytes };
    (lo, hi)
}

/// The index of the header word of `role` for `peer` and `channel`.
///
/// ```
/// use gpu_kernels::p2p::{word, CONSUMED, HEADER_WORDS};
/// assert_eq!(word(0, 0, 0), 0);
/// assert!(word(3, 7, 15) < HEADER_WORDS);
/// assert_ne!(word(CONSUMED, 1, 0), word(0, 1, 0));
/// ```
#[inline(always)]
pub const fn word(role: usize, peer: usize, channel: usize) -> usize {
    (role * MAX_RANKS + peer) * CHANNELS + channel
}

/// Bytes of a rank's point-to-point buffer for `nranks` ranks.
///
/// ```
/// use gpu_kernels::p2p::{buffer_bytes, HEADER_BYTES, REGION_BYTES};
/// assert_eq!(buffer_bytes(2), HEADER_BYTES + 2 * REGION_BYTES);
/// ```
pub const fn buffer_bytes(nranks: usize) -> usize {
    HEADER_BYTES + nranks * REGION_BYTES
}

/// Offset in a rank's buffer of channel `channel` of the region it keeps for source `src`.
#[inline(always)]
pub const fn channel_offset(src: usize, channel: usize) -> usize {
    HEADER_BYTES + src * REGION_BYTES + channel * SLOTS * SLOT_BYTES
}

/// Offset in a rank's buffer of channel `channel`'s LL slots in the region it keeps for
/// source `src` (`channel < LL_CHANNELS`).
///
/// ```
/// use gpu_kernels::p2p::{channel_offset, ll_channel_offset, CHANNELS, SLOTS, SLOT_BYTES};
/// assert_eq!(ll_channel_offset(1, 0), channel_offset(1, CHANNELS - 1) + SLOTS * SLOT_BYTES);
/// ```
#[inline(always)]
pub const fn ll_channel_offset(src: usize, channel: usize) -> usize {
    HEADER_BYTES + src * REGION_BYTES + PLAIN_BYTES + channel * SLOTS * LL_SLOT_BYTES
}

/// Whether a transfer of `bytes` moves as LL chunks (see the module docs).
///
/// ```
/// use gpu_kernels::p2p::{is_ll, LL_MAX_BYTES};
/// assert!(is_ll(1) && is_ll(LL_MAX_BYTES) && !is_ll(LL_MAX_BYTES + 1));
/// ```
#[inline(always)]
pub const fn is_ll(bytes: usize) -> bool {
    bytes <= LL_MAX_BYTES
}

/// Payload bytes of one chunk of a transfer of `bytes`: [`LL_CHUNK_BYTES`] if it is LL,
/// else [`SLOT_BYTES`].
#[inline(always)]
pub const fn chunk_bytes(bytes: usize) -> usize {
    if is_ll(bytes) {
        LL_CHUNK_BYTES
    } else {
        SLOT_BYTES
    }
}

/// Chunks of a transfer of `bytes`.
///
/// ```
/// use gpu_kernels::p2p::{chunks, LL_MAX_BYTES, SLOT_BYTES};
/// assert_eq!(chunks(LL_MAX_BYTES), 8); // LL chunks of 8 KiB
/// assert_eq!(chunks(LL_MAX_BYTES + 1), 3); // chunks of SLOT_BYTES
/// assert_eq!(chunks(0), 0);
/// ```
#[inline(always)]
pub const fn chunks(bytes: usize) -> usize {
    bytes.div_ceil(chunk_bytes(bytes))
}

/// Channels of a transfer of `bytes` when at most `cap` are allowed: one per chunk, at most
/// `cap` (and [`CHANNELS`]), at least 1. Both sides compute it from the byte count.
///
/// ```
/// use gpu_kernels::p2p::{channels, SLOT_BYTES};
/// assert_eq!(channels(8, 16), 1);
/// assert_eq!(channels(SLOT_BYTES + 1, 16), 5); // LL chunks of 8 KiB
/// assert_eq!(channels(3 * SLOT_BYTES, 16), 3);
/// assert_eq!(channels(2 << 20, 16), 16);
/// assert_eq!(channels(2 << 20, 4), 4);
/// assert_eq!(channels(0, 0), 1);
/// ```
#[inline(always)]
pub const fn channels(bytes: usize, cap: usize) -> usize {
    let cap = if cap > CHANNELS { CHANNELS } else { cap };
    let n = chunks(bytes);
    let c = if n < cap { n } else { cap };
    if c == 0 {
        1
    } else {
        c
    }
}

/// Chunks of a transfer of `bytes` over `channels` channels that go through channel `c`
/// (chunks `c`, `c + channels`, …).
///
/// ```
/// use gpu_kernels::p2p::{channel_chunks, SLOT_BYTES};
/// // 5 chunks over 2 channels: 0, 2, 4 and 1, 3.
/// assert_eq!(channel_chunks(5 * SLOT_BYTES, 2, 0), 3);
/// assert_eq!(channel_chunks(5 * SLOT_BYTES, 2, 1), 2);
/// // 40 KiB: 5 LL chunks of 8 KiB.
/// assert_eq!(channel_chunks(40 << 10, 2, 0), 3);
/// assert_eq!(channel_chunks(0, 1, 0), 0);
/// ```
#[inline(always)]
pub const fn channel_chunks(bytes: usize, channels: usize, c: usize) -> usize {
    let n = chunks(bytes);
    if c >= n || channels == 0 {
        0
    } else {
        (n - c).div_ceil(channels)
    }
}

/// Most channels per transfer for a grid of at most `blocks` blocks per rank and `nranks`
/// ranks (every rank's operations are at most `2 * nranks - 1` transfers, a send and a
/// receive per peer and one local copy, each on at most this many blocks): the same on every
/// rank when `blocks` is (the host passes the fewest SMs of any rank's GPU divided by the most
/// ranks sharing one GPU, as for the two-shot kernel).
///
/// ```
/// use gpu_kernels::p2p::channel_cap;
/// assert_eq!(channel_cap(66, 2), 16); // 22, at most CHANNELS
/// assert_eq!(channel_cap(33, 2), 11); // 132 SMs, two processes, room for two communicators
/// assert_eq!(channel_cap(33, 4), 4);
/// assert_eq!(channel_cap(1, 8), 1);
/// ```
pub const fn channel_cap(blocks: usize, nranks: usize) -> usize {
    let per = blocks / (2 * if nranks == 0 { 1 } else { nranks } - 1);
    if per == 0 {
        1
    } else if per > CHANNELS {
        CHANNELS
    } else {
        per
    }
}

/// One operation of a [`P2pArgs`]: what one run of blocks `first_block .. first_block +
/// channels` does (an example at [`P2pArgs`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pOpDesc {
    /// [`kind`].
    pub kind: u32,
    /// The rank on the other side (sends and receives).
    pub peer: u32,
    /// Blocks of this operation: its channels (a copy: any number).
    pub channels: u32,
    /// The first of its blocks.
    pub first_block: u32,
    /// Bytes.
    pub bytes: u64,
    /// A copy's source (a send's or receive's buffers are its pieces).
    pub user: u64,
    /// A send: the region the peer keeps for this rank (in the peer's buffer, as mapped here);
    /// a receive: the region this rank keeps for the peer (channel `c`'s slots, or LL slots,
    /// at their offset in it); a copy: its destination.
    pub slots: u64,
    /// A send: the peer's `DATA[rank][0]` word; a receive: the peer's `CONSUMED[rank][0]`
    /// word (channel `c` is `c` words further).
    pub remote: u64,
    /// A send's or receive's first buffer in [`P2pArgs::pieces`].
    pub first_piece: u32,
    /// Its buffers, in stream order (their bytes add up to `bytes`).
    pub npieces: u32,
}

/// One buffer of a send's or receive's byte stream.
///
/// ```
/// let p = gpu_kernels::p2p::P2pPiece { user: 0x1000, bytes: 256 };
/// assert_eq!(core::mem::size_of_val(&p), 16);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pPiece {
    /// The caller's buffer.
    pub user: u64,
    /// Its bytes.
    pub bytes: u64,
}

/// The kernel's one parameter (passed by value: nothing is copied to the device per call),
/// with room for `OPS` operations and `PIECES` buffers: [`P2pArgs`] for `ringccl_p2p`,
/// [`P2pArgsSmall`] for `ringccl_p2p_small` ([`P2P_SMALL_ENTRY`]), the same kernel with a
/// parameter of a sixth of the size for the usual small group (a launch copies every byte of
/// its parameter).
///
/// ```
/// use gpu_kernels::p2p::{kind, P2pArgs, P2pArgsSmall, P2pOpDesc};
/// let mut a = P2pArgs::default();
/// a.ops[0] = P2pOpDesc { kind: kind::SEND, peer: 1, channels: 4, bytes: 1 << 20, ..Default::default() };
/// a.nops = 1;
/// assert_eq!(a.blocks(), 4);
/// assert!(core::mem::size_of::<P2pArgs>() <= 4096); // the kernel parameter limit
/// assert!(core::mem::size_of::<P2pArgsSmall>() <= 320);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pArgsOf<const OPS: usize, const PIECES: usize> {
    /// The operations; the first `nops` are used.
    pub ops: [P2pOpDesc; OPS],
    /// The buffers of the sends and receives.
    pub pieces: [P2pPiece; PIECES],
    /// This rank's header.
    pub header: u64,
    /// The control block.
    pub ctl: u64,
    /// How long a wait may last, in nanoseconds (0: until aborted).
    pub timeout_ns: u64,
    /// Operations used.
    pub nops: u32,
    /// The status slot of this rank's waits in the control block.
    pub slot: u32,
}

/// The parameter of `ringccl_p2p`: every group the kernel takes.
pub type P2pArgs = P2pArgsOf<MAX_OPS, MAX_PIECES>;

/// Operations of a [`P2pArgsSmall`].
pub const SMALL_OPS: usize = 4;

/// Buffers of a [`P2pArgsSmall`].
pub const SMALL_PIECES: usize = 4;

/// The parameter of `ringccl_p2p_small` ([`P2P_SMALL_ENTRY`]): a group of at most
/// [`SMALL_OPS`] operations over at most [`SMALL_PIECES`] buffers ([`P2pArgs::small`]).
pub type P2pArgsSmall = P2pArgsOf<SMALL_OPS, SMALL_PIECES>;

/// The name of the point-to-point kernel with the small parameter, [`P2pArgsSmall`].
pub const P2P_SMALL_ENTRY: &str = "ringccl_p2p_small";

impl<const OPS: usize, const PIECES: usize> Default for P2pArgsOf<OPS, PIECES> {
    fn default() -> Self {
        P2pArgsOf {
            ops: [P2pOpDesc::default(); OPS],
            pieces: [P2pPiece::default(); PIECES],
            header: 0,
            ctl: 0,
            timeout_ns: 0,
            nops: 0,
            slot: 0,
        }
    }
}

impl<const OPS: usize, const PIECES: usize> P2pArgsOf<OPS, PIECES> {
    /// Blocks the launch needs: the end of the last operation's run.
    pub fn blocks(&self) -> u32 {
        let n = (self.nops as usize).min(OPS);
        self.ops[..n]
            .iter()
            .map(|o| o.first_block.saturating_add(o.channels))
            .max()
            .unwrap_or(0)
    }
}

impl P2pArgs {
    /// The same group as a [`P2pArgsSmall`], if it fits one: at most [`SMALL_OPS`]
    /// operations, whose buffers are among the first [`SMALL_PIECES`].
    ///
    /// ```
    /// use gpu_kernels::p2p::{kind, P2pArgs, P2pOpDesc};
    /// let mut a = P2pArgs::default();
    /// a.ops[0] = P2pOpDesc { kind: kind::SEND, channels: 1, bytes: 8, npieces: 1, ..Default::default() };
    /// a.ops[1] = P2pOpDesc { kind: kind::RECV, first_block: 1, channels: 1, bytes: 8, first_piece: 1, npieces: 1, ..Default::default() };
    /// a.nops = 2;
    /// let s = a.small().expect("two operations, two buffers");
    /// assert_eq!((s.blocks(), s.ops[1], s.nops), (2, a.ops[1], 2));
    /// a.ops[1].npieces = 4; // buffers 1 ..= 4
    /// assert!(a.small().is_none());
    /// ```
    pub fn small(&self) -> Option<P2pArgsSmall> {
        let n = self.nops as usize;
        if n > SMALL_OPS {
            return None;
        }
        let used = self.ops[..n]
            .iter()
            .map(|o| o.first_piece as usize + o.npieces as usize)
            .max()
            .unwrap_or(0);
        if used > SMALL_PIECES {
            return None;
        }
        let mut s = P2pArgsSmall {
            header: self.header,
            ctl: self.ctl,
            timeout_ns: self.timeout_ns,
            nops: self.nops,
            slot: self.slot,
            ..P2pArgsSmall::default()
        };
        s.ops.copy_from_slice(&self.ops[..SMALL_OPS]);
        s.pieces.copy_from_slice(&self.pieces[..SMALL_PIECES]);
        Some(s)
    }
}

#[cfg(target_arch = "nvptx64")]
mod dev {
    use super::{
        kind, word, P2pArgsOf, P2pOpDesc, P2pPiece, CONSUMED, DATA, HEADER_BYTES, LL_CHUNK_BYTES,
        LL_SLOT_BYTES, MAX_OPS, POST_ADDR, POST_TAG, RECVD, ROLE_WORDS, SENT, SLOTS, SLOT_BYTES,
    };
    use crate::ctl::{
        fence_sys, load_relaxed, store_relaxed, store_release, wait_at_least, wait_step,
    };
    use crate::ll::{load_packet, store_packet, PACKET_BYTES, PACKET_PAYLOAD};
    use crate::prim::Grid;
    use core::arch::asm;
    use core::arch::nvptx::{_block_dim_x, _block_idx_x, _syncthreads, _thread_idx_x};

    /// A block-wide barrier that tells every thread whether `p` held in any thread.
    #[inline(always)]
    fn sync_any(p: bool) -> bool {
        let out: u32;
        // SAFETY: a barrier with a reduction; every thread of the block reaches it.
        unsafe {
            asm!(
                "{{ .reg .pred pin, pout; setp.ne.u32 pin, {i}, 0; bar.red.or.pred pout, 0, pin; selp.u32 {o}, 1, 0, pout; }}",
                i = in(reg32) p as u32,
                o = out(reg32) out,
                options(nostack)
            );
        }
        out != 0
    }

    /// `len` bytes from `src` to `dst` by the threads of this block; with `deep`, more loads
    /// in flight per thread ([`crate::prim::copy_deep`]: a zero-copy share, one range per block).
    #[inline(always)]
    unsafe fn copy(tid: usize, threads: usize, src: u64, dst: u64, len: usize, deep: bool) {
        if deep {
            let grid = Grid {
                thread: tid,
                threads,
            };
            // SAFETY: per the caller, both ranges are valid and do not overlap.
            unsafe { crate::prim::copy_deep(grid, src as *const u8, dst as *mut u8, len) };
            return;
        }
        // SAFETY: per the caller, both ranges are valid and do not overlap.
        unsafe {
            crate::prim::reduce_copy::<u8, crate::op::Sum, 1>(
                Grid {
                    thread: tid,
                    threads,
                },
                [src as *const u8],
                1,
                dst as *mut u8,
                core::ptr::null_mut(),
                len,
                1,
            )
        }
    }

    /// The operation block `b` belongs to (`kind::NONE` if none), every row read with a
    /// constant index.
    #[inline(always)]
    fn op_of<const O: usize, const P: usize>(args: &P2pArgsOf<O, P>, b: u32) -> P2pOpDesc {
        let mut sel = P2pOpDesc::default();
        macro_rules! each {
            ($($i:literal)*) => {$(
                if $i < O && $i < MAX_OPS && ($i as u32) < args.nops {
                    let o = args.ops[$i];
                    if b >= o.first_block && b - o.first_block < o.channels {
                        sel = o;
                    }
                }
            )*};
        }
        each!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        sel
    }

    /// Piece `i` of `args`, read with constant indices only (selects, no local memory).
    #[inline(always)]
    fn piece<const O: usize, const P: usize>(args: &P2pArgsOf<O, P>, i: u32) -> P2pPiece {
        let mut sel = P2pPiece::default();
        // Literal indices: a loop the compiler does not unroll would copy the parameter into
        // local memory (a stack frame) to index it.
        macro_rules! each {
            ($($k:literal)*) => {$(
                if $k < P && $k < super::MAX_PIECES && i == $k {
                    sel = args.pieces[$k];
                }
            )*};
        }
        each!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
              32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63);
        sel
    }

    /// Bytes `[at, at + len)` of the byte stream of `o`'s pieces to (`to_slot`) or from the
    /// slot `slot`, by the threads of this block.
    #[inline(always)]
    unsafe fn chunk<const O: usize, const P: usize>(
        args: &P2pArgsOf<O, P>,
        o: &P2pOpDesc,
        tid: usize,
        threads: usize,
        (at, len): (u64, u64),
        slot: u64,
        (to_slot, deep): (bool, bool),
    ) {
        let end = at + len;
        let mut off = 0u64;
        let mut idx = 0;
        while idx < o.npieces && off < end {
            let pc = piece(args, o.first_piece + idx);
            let lo = if at > off { at } else { off };
            let hi = if end < off + pc.bytes {
                end
            } else {
                off + pc.bytes
            };
            if lo < hi {
                let (user, s) = (pc.user + (lo - off), slot + (lo - at));
                // SAFETY: per the caller, the piece and the slot hold these bytes.
                unsafe {
                    if to_slot {
                        copy(tid, threads, user, s, (hi - lo) as usize, deep);
                    } else {
                        copy(tid, threads, s, user, (hi - lo) as usize, deep);
                    }
                }
            }
            off += pc.bytes;
            idx += 1;
        }
    }

    /// The byte stream of an operation's pieces, as the LL chunks read and write it.
    struct Stream<'a, const O: usize, const P: usize> {
        args: &'a P2pArgsOf<O, P>,
        o: &'a P2pOpDesc,
        /// The one piece of a one-buffer stream (`npieces == 1`), else unused.
        single: P2pPiece,
    }

    impl<const O: usize, const P: usize> Stream<'_, O, P> {
        /// Payload bytes `[off, off + len)` (`len <= 8`) of the stream, little-endian (to the
        /// stream, if `write`, from `*raw`; else into it): one 8-byte access where the stream
        /// is one buffer and the bytes are 8-byte aligned in it, two 4-byte ones where they are
        /// 4-byte aligned, else byte by byte across the pieces.
        ///
        /// # Safety
        /// The pieces are valid for their bytes; `off + len` is within the stream.
        #[inline(always)]
        unsafe fn access(&self, off: u64, len: u64, raw: &mut u64, write: bool) {
            // SAFETY (every access): inside a piece, per the caller.
            unsafe {
                if self.o.npieces == 1 && len == 8 {
                    let a = self.single.user + off;
                    if a % 8 == 0 {
                        let p = a as *mut u64;
                        if write {
                            p.write(*raw);
                        } else {
                            *raw = p.read();
                        }
                        return;
                    }
                    if a % 4 == 0 {
                        let p = a as *mut u32;
                        if write {
                            p.write(*raw as u32);
                            p.add(1).write((*raw >> 32) as u32);
                        } else {
                            *raw = p.read() as u64 | (p.add(1).read() as u64) << 32;
                        }
                        return;
                    }
                }
                let (mut start, mut idx, mut b) = (0u64, 0u32, 0u64);
                while idx < self.o.npieces && b < len {
                    let pc = if self.o.npieces == 1 {
                        self.single
                    } else {
                        piece(self.args, self.o.first_piece + idx)
                    };
                    let end = start + pc.bytes;
                    // `off + b >= start`: the pieces are walked in order.
                    while b < len && off + b < end {
                        let p = (pc.user + (off + b - start)) as *mut u8;
                        if write {
                            p.write((*raw >> (8 * b)) as u8);
                        } else {
                            *raw |= (p.read() as u64) << (8 * b);
                        }
                        b += 1;
                    }
                    start = end;
                    idx += 1;
                }
            }
        }
    }

    /// Bytes `[at, at + len)` of the stream as LL packets with `flag` into the LL slot `slot`,
    /// packet `p` by thread `p % threads`.
    ///
    /// # Safety
    /// As [`Stream::access`]; `slot` holds the chunk's packets.
    #[inline(always)]
    unsafe fn ll_send<const O: usize, const P: usize>(
        s: &Stream<'_, O, P>,
        (tid, threads): (usize, usize),
        (at, len): (u64, u64),
        slot: u64,
        flag: u32,
    ) {
        let packets = len.div_ceil(PACKET_PAYLOAD as u64) as usize;
        let mut p = tid;
        while p < packets {
            let off = (p * PACKET_PAYLOAD) as u64;
            let take = if len - off < 8 { len - off } else { 8 };
            let mut raw = 0u64;
            // SAFETY: per the caller.
            unsafe {
                s.access(at + off, take, &mut raw, false);
                store_packet(
                    (slot + (p * PACKET_BYTES) as u64) as *mut u8,
                    crate::ll::pack(raw, flag),
                );
            }
            p += threads;
        }
    }

    /// The packets of LL slot `slot` once they carry `flag`, their payload written to bytes
    /// `[at, at + len)` of the stream; `false` if a wait gave up (its status written, as
    /// every wait's: `wait` is the control block, the timeout, the status slot and the peer).
    ///
    /// # Safety
    /// As [`ll_send`].
    #[inline(always)]
    unsafe fn ll_recv<const O: usize, const P: usize>(
        s: &Stream<'_, O, P>,
        (tid, threads): (usize, usize),
        (at, len): (u64, u64),
        slot: u64,
        flag: u32,
        (ctl, timeout_ns, status, peer): (*mut u64, u64, usize, usize),
    ) -> bool {
        let packets = len.div_ceil(PACKET_PAYLOAD as u64) as usize;
        let mut p = tid;
        while p < packets {
            let off = (p * PACKET_PAYLOAD) as u64;
            let take = if len - off < 8 { len - off } else { 8 };
            let at_packet = (slot + (p * PACKET_BYTES) as u64) as *const u8;
            let (mut polls, mut clock) = (0u32, (0u64, 32u32));
            // SAFETY: per the caller.
            unsafe {
                let mut raw = loop {
                    if let Some(v) = crate::ll::unpack(load_packet(at_packet), flag) {
                        break v;
                    }
                    if !wait_step(&mut polls, &mut clock, ctl, timeout_ns, status, peer) {
                        return false;
                    }
                };
                s.access(at + off, take, &mut raw, true);
            }
            p += threads;
        }
        true
    }

    /// How a posted transfer's channel went ([`posted_send`], [`posted_recv`]).
    enum Posted {
        /// The receiver posted this address (in this process): copy there, then signal.
        Direct(u64),
        /// Moved zero-copy, counters advanced: the block is done.
        Done,
        /// A wait gave up (status written): the block ends.
        GaveUp,
        /// 0 was posted: the chunks go through the slots.
        Slots,
    }

    /// A posted send's channel `c` (see the module docs): waits for the receiver's post in
    /// this rank's header (`base + 1` in `POST_TAG[peer][c]`) and answers where to write
    /// ([`Posted::Direct`]) or that the chunks go through the slots (0 posted).
    ///
    /// # Safety
    /// As the kernel's: `header` this rank's.
    #[inline(always)]
    unsafe fn posted_send(
        tid: usize,
        c: usize,
        header: *mut u64,
        base: u64,
        (ctl, timeout_ns, status, peer): (*mut u64, u64, usize, usize),
    ) -> Posted {
        // SAFETY (below): per the caller; the words are inside this rank's header.
        unsafe {
            let tag = header.add(word(POST_TAG, peer, c));
            let mut ok = true;
            if tid == 0 {
                ok = wait_at_least(tag, base + 1, ctl, timeout_ns, status, peer);
            }
            if sync_any(!ok) {
                return Posted::GaveUp;
            }
            // Thread 0's acquire of the tag, then the barrier: every thread sees the address
            // written before the tag's release.
            match load_relaxed(header.add(word(POST_ADDR, peer, c))) {
                0 => Posted::Slots,
                dst => Posted::Direct(dst),
            }
        }
    }

    /// A posted receive's channel (see the module docs): posts `o.user` (the receive buffer as
    /// the sender maps it, or 0) and the tag `base + 1` into the sender's header (`remote` is
    /// the sender's `CONSUMED[rank][c]`, the post words are further on in its header); where
    /// it posted an address, waits until `DATA` (`data`, this rank's) reaches `done` and
    /// advances `CONSUMED` and `RECVD` (`own`) to it.
    ///
    /// # Safety
    /// As the kernel's, with the words as named.
    #[inline(always)]
    unsafe fn posted_recv(
        o: &P2pOpDesc,
        tid: usize,
        (data, remote, own): (*mut u64, *mut u64, *mut u64),
        (base, done): (u64, u64),
        (ctl, timeout_ns, status, peer): (*mut u64, u64, usize, usize),
    ) -> Posted {
        // SAFETY (below): per the caller; the post words are in the sender's header, at the
        // same peer and channel as `remote`, whole roles further on.
        unsafe {
            let mut ok = true;
            if tid == 0 {
                store_relaxed(remote.add((POST_ADDR - CONSUMED) * ROLE_WORDS), o.user);
                store_release(remote.add((POST_TAG - CONSUMED) * ROLE_WORDS), base + 1);
                if o.user != 0 {
                    ok = wait_at_least(data, done, ctl, timeout_ns, status, peer);
                }
            }
            if sync_any(!ok) {
                return Posted::GaveUp;
            }
            if o.user == 0 {
                return Posted::Slots;
            }
            if tid == 0 {
                store_relaxed(remote, done);
                core::ptr::write_volatile(own, done);
            }
        }
        Posted::Done
    }

    /// The body of `ringccl_p2p` (see the module docs).
    ///
    /// # Safety
    /// Every address of `args` is valid as its field says, mapped in this process; the header
    /// and slots are used by no other kernel; the grid is `args.blocks()` blocks, all resident.
    #[inline(always)]
    pub unsafe fn p2p<const O: usize, const P: usize>(args: &P2pArgsOf<O, P>) {
        // SAFETY: reading special registers has no side effects.
        let (b, tid, threads) = unsafe {
            (
                _block_idx_x(),
                _thread_idx_x() as usize,
                _block_dim_x() as usize,
            )
        };
        let o = op_of(args, b);
        let c = (b - o.first_block) as usize;
        let bytes = o.bytes as usize;
        let header = args.header as *mut u64;
        let ctl = args.ctl as *mut u64;
        let peer = o.peer as usize;
        // SAFETY (below): every address per the caller's contract; indices stay inside the
        // header (peer < MAX_RANKS, channel < CHANNELS: checked by the host) and the slots.
        unsafe {
            match o.kind & kind::MASK {
                kind::COPY => {
                    let threads_all = o.channels as usize * threads;
                    crate::prim::reduce_copy::<u8, crate::op::Sum, 1>(
                        Grid {
                            thread: c * threads + tid,
                            threads: threads_all,
                        },
                        [o.user as *const u8],
                        1,
                        o.slots as *mut u8,
                        core::ptr::null_mut(),
                        bytes,
                        1,
                    );
                }
                kind::SEND | kind::RECV => {
                    let send = o.kind & kind::MASK == kind::SEND;
                    let (wait_role, own_role) = if send {
                        (CONSUMED, SENT)
                    } else {
                        (DATA, RECVD)
                    };
                    let wait_word = header.add(word(wait_role, peer, c));
                    let own = header.add(word(own_role, peer, c));
                    let remote = (o.remote as *mut u64).add(c);
                    let ll = super::is_ll(bytes);
                    let (chunk_bytes, slot_bytes, slots) = if ll {
                        (
                            LL_CHUNK_BYTES,
                            LL_SLOT_BYTES,
                            o.slots + (super::ll_channel_offset(0, c) - HEADER_BYTES) as u64,
                        )
                    } else {
                        (
                            SLOT_BYTES,
                            SLOT_BYTES,
                            o.slots + (super::channel_offset(0, c) - HEADER_BYTES) as u64,
                        )
                    };
                    // A stream of one buffer (the usual case): its piece read once.
                    let single = if o.npieces == 1 {
                        piece(args, o.first_piece)
                    } else {
                        P2pPiece::default()
                    };
                    let base = core::ptr::read_volatile(own);
                    let n = super::channel_chunks(bytes, o.channels as usize, c);
                    if o.kind & kind::POSTED != 0 && !ll {
                        let wait = (ctl, args.timeout_ns, args.slot as usize, peer);
                        let done = base + n as u64;
                        let went = if send {
                            posted_send(tid, c, header, base, wait)
                        } else {
                            posted_recv(&o, tid, (wait_word, remote, own), (base, done), wait)
                        };
                        match went {
                            Posted::Done | Posted::GaveUp => return,
                            Posted::Slots => {}
                            Posted::Direct(dst) => {
                                // This channel's share straight into the receive buffer.
                                let (lo, hi) = super::direct_share(bytes, o.channels as usize, c);
                                if lo < hi {
                                    let share = (lo as u64, (hi - lo) as u64);
                                    chunk(
                                        args,
                                        &o,
                                        tid,
                                        threads,
                                        share,
                                        dst + lo as u64,
                                        (true, true),
                                    );
                                }
                                // Every thread's stores come before the signal.
                                fence_sys();
                                _syncthreads();
                                if tid == 0 {
                                    store_release(remote, done);
                                    core::ptr::write_volatile(own, done);
                                }
                                return;
                            }
                        }
                    }
                    let mut j = 0;
                    while j < n {
                        let k = base + j as u64;
                        let i = c + j * o.channels as usize;
                        let mut ok = true;
                        // A send needs the slot's previous chunk out; a plain receive, this
                        // chunk in (an LL receive polls the packets themselves).
                        if tid == 0 && (send || !ll) {
                            let need = if send {
                                (k + 1).saturating_sub(SLOTS as u64)
                            } else {
                                k + 1
                            };
                            if need > 0 {
                                ok = wait_at_least(
                                    wait_word,
                                    need,
                                    ctl,
                                    args.timeout_ns,
                                    args.slot as usize,
                                    peer,
                                );
                            }
                        }
                        if sync_any(!ok) {
                            // Gave up (status written): the host fails the communicator.
                            return;
                        }
                        let at = i * chunk_bytes;
                        let len = if bytes - at < chunk_bytes {
                            bytes - at
                        } else {
                            chunk_bytes
                        };
                        let slot = slots + (k % SLOTS as u64) * slot_bytes as u64;
                        if ll {
                            let flag = crate::ll::ll_flag(k + 1);
                            let stream = Stream {
                                args,
                                o: &o,
                                single,
                            };
                            if send {
                                ll_send(
                                    &stream,
                                    (tid, threads),
                                    (at as u64, len as u64),
                                    slot,
                                    flag,
                                );
                            } else {
                                let got = ll_recv(
                                    &stream,
                                    (tid, threads),
                                    (at as u64, len as u64),
                                    slot,
                                    flag,
                                    (ctl, args.timeout_ns, args.slot as usize, peer),
                                );
                                if sync_any(!got) {
                                    return;
                                }
                                // Every thread's packets are read (their values used): the
                                // slot may be refilled. A relaxed store, as NCCL's receivers
                                // post: no write of this block needs ordering before it (a
                                // release at system scope costs a fence on this path).
                                if tid == 0 {
                                    store_relaxed(remote, k + 1);
                                }
                            }
                        } else {
                            chunk(
                                args,
                                &o,
                                tid,
                                threads,
                                (at as u64, len as u64),
                                slot,
                                (send, false),
                            );
                            // Every thread's stores (a send) or loads (a receive) of the chunk
                            // come before the signal, at system scope.
                            fence_sys();
                            _syncthreads();
                            if tid == 0 {
                                store_release(remote, k + 1);
                            }
                        }
                        j += 1;
                    }
                    if tid == 0 {
                        core::ptr::write_volatile(own, base + n as u64);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(target_arch = "nvptx64")]
pub(crate) use dev::p2p;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_fits_and_the_channels_partition_the_chunks() {
        assert_eq!(HEADER_BYTES % 256, 0);
        assert!(word(POST_TAG, MAX_RANKS - 1, CHANNELS - 1) < HEADER_WORDS);
        assert_eq!(
            word(POST_ADDR, 3, 5) - word(CONSUMED, 3, 5),
            (POST_ADDR - CONSUMED) * ROLE_WORDS
        );
        assert_eq!(channel_offset(1, 0), HEADER_BYTES + REGION_BYTES);
        assert_eq!(
            ll_channel_offset(MAX_RANKS - 1, LL_CHANNELS - 1) + SLOTS * LL_SLOT_BYTES,
            buffer_bytes(MAX_RANKS)
        );
        assert_eq!(ll_channel_offset(0, 0) % 256, 0);
        assert_eq!(chunks(LL_MAX_BYTES), LL_CHANNELS);
        for bytes in [
            0,
            1,
            SLOT_BYTES - 1,
            SLOT_BYTES,
            SLOT_BYTES + 1,
            17 * SLOT_BYTES + 5,
            LL_MAX_BYTES,
            LL_MAX_BYTES + 1,
            2 << 20,
        ] {
            for cap in [1, 3, 16, 40] {
                let c = channels(bytes, cap);
                assert!((1..=CHANNELS.min(cap.max(1))).contains(&c));
                let total: usize = (0..c).map(|k| channel_chunks(bytes, c, k)).sum();
                assert_eq!(total, chunks(bytes), "{bytes} bytes, cap {cap}");
            }
        }
        assert_eq!(core::mem::size_of::<P2pOpDesc>(), 56);
        assert_eq!(core::mem::size_of::<P2pPiece>(), 16);
        assert!(core::mem::size_of::<P2pArgs>() <= 4096);
    }

    #[test]
    fn blocks_end_with_the_last_run() {
        let mut a = P2pArgs::default();
        assert_eq!(a.blocks(), 0);
        a.nops = 2;
        a.ops[0] = P2pOpDesc {
            kind: kind::SEND,
            channels: 3,
            ..Default::default()
        };
        a.ops[1] = P2pOpDesc {
            kind: kind::RECV,
            channels: 2,
            first_block: 3,
            ..Default::default()
        };
        assert_eq!(a.blocks(), 5);
    }
}
