//! The kernel's protocol run on the CPU: every rank's blocks of every group stepped in a
//! random order over simulated memory, reading and writing the counters and slots at the
//! addresses the plan gives them, with a check that no slot is refilled before its chunk was
//! taken out and that every receive buffer ends byte-exact.

use super::*;
use gpu_kernels::p2p::{
    buffer_bytes, channel_cap, channel_chunks, direct_share, ll_channel_offset, HEADER_BYTES, LL_CHUNK_BYTES,
    LL_MAX_BYTES, LL_SLOT_BYTES, POST_ADDR, POST_TAG, RECVD, ROLE_WORDS, SENT, SLOTS, SLOT_BYTES,
};
use std::collections::HashMap;

/// Simulated device memory: allocations by base address.
#[derive(Default)]
struct Mem {
    allocs: Vec<(u64, Vec<u8>)>,
    /// Slot (its address) → the chunk number it holds, until taken out.
    full: HashMap<u64, u64>,
}

impl Mem {
    fn alloc(&mut self, base: u64, bytes: usize) {
        self.allocs.push((base, vec![0; bytes]));
    }

    fn at(&mut self, addr: u64, len: usize) -> &mut [u8] {
        for (base, v) in &mut self.allocs {
            if addr >= *base && addr + len as u64 <= *base + v.len() as u64 {
                let o = (addr - *base) as usize;
                return &mut v[o..o + len];
            }
        }
        panic!("address {addr:#x} (+{len}) is in no allocation");
    }

    fn read(&mut self, addr: u64) -> u64 {
        assert_eq!(addr % 8, 0);
        u64::from_le_bytes(self.at(addr, 8).try_into().unwrap())
    }

    fn write(&mut self, addr: u64, v: u64) {
        self.at(addr, 8).copy_from_slice(&v.to_le_bytes());
    }

    fn copy(&mut self, src: u64, dst: u64, len: usize) {
        let data = self.at(src, len).to_vec();
        self.at(dst, len).copy_from_slice(&data);
    }
}

/// Where a block of a posted transfer is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not posted, or the post not yet made (a receive) or read (a send).
    Start,
    /// A receive that posted its buffer, waiting for the sender's `DATA`.
    Posted,
    /// The chunks go through the slots.
    Slots,
}

/// One block of a launched group.
struct Block {
    op: P2pOpDesc,
    pieces: Vec<P2pPiece>,
    c: usize,
    base: u64,
    j: usize,
    n: usize,
    phase: Phase,
}

struct Rank {
    header: u64,
    groups: Vec<KernelPlan>,
    next: usize,
    blocks: Vec<Block>,
}

fn start(mem: &mut Mem, r: &mut Rank) {
    let Some(p) = r.groups.get(r.next) else { return };
    r.next += 1;
    // The copies before the kernel, in stream order.
    for &(src, dst, len) in &p.copies {
        mem.copy(src, dst, len);
    }
    let args = &p.args;
    for o in &args.ops[..args.nops as usize] {
        for c in 0..o.channels as usize {
            let (base, n) = match o.kind & kind::MASK {
                kind::SEND | kind::RECV => {
                    let role = if o.kind & kind::MASK == kind::SEND { SENT } else { RECVD };
                    let base = mem.read(r.header + 8 * word(role, o.peer as usize, c) as u64);
                    (base, channel_chunks(o.bytes as usize, o.channels as usize, c))
                }
                _ => (0, usize::from(c == 0)),
            };
            r.blocks.push(Block { op: *o, pieces: args.pieces[o.first_piece as usize..][..o.npieces as usize].to_vec(), c, base, j: 0, n, phase: Phase::Start });
        }
    }
}

/// Advances block `b` of rank `r` by one chunk if its wait is satisfied; whether it moved.
fn step(mem: &mut Mem, header: u64, b: &mut Block) -> bool {
    let o = b.op;
    if b.j == b.n {
        return false;
    }
    if o.kind == kind::COPY {
        mem.copy(o.user, o.slots, o.bytes as usize);
        b.j = 1;
        return true;
    }
    let send = o.kind & kind::MASK == kind::SEND;
    let (peer, c) = (o.peer as usize, b.c);
    let k = b.base + b.j as u64;
    let ll = is_ll(o.bytes as usize);
    if o.kind & kind::POSTED != 0 && !ll && b.phase != Phase::Slots {
        return posted_step(mem, header, b);
    }
    let (chunk, slot_bytes, first_slot) = if ll {
        (LL_CHUNK_BYTES, LL_SLOT_BYTES, ll_channel_offset(0, c))
    } else {
        (SLOT_BYTES, SLOT_BYTES, channel_offset(0, c))
    };
    let slot = o.slots + (first_slot - HEADER_BYTES) as u64 + (k % SLOTS as u64) * slot_bytes as u64;
    if ll && !send {
        // An LL receive polls the packets: they carry chunk `k`'s flag once the send stored them.
        if mem.full.get(&slot) != Some(&k) {
            return false;
        }
    } else {
        let need = if send { (k + 1).saturating_sub(SLOTS as u64) } else { k + 1 };
        let role = if send { CONSUMED } else { DATA };
        if mem.read(header + 8 * word(role, peer, c) as u64) < need {
            return false;
        }
    }
    let i = c + b.j * o.channels as usize;
    let at = i * chunk;
    let len = (o.bytes as usize - at).min(chunk);
    if send {
        assert!(!mem.full.contains_key(&slot), "slot {slot:#x} refilled before chunk was taken out");
        mem.full.insert(slot, k);
    } else {
        assert_eq!(mem.full.remove(&slot), Some(k), "slot {slot:#x} does not hold chunk {k}");
    }
    // The chunk's bytes across the pieces (as the kernel's `chunk`).
    let (at, end) = (at as u64, (at + len) as u64);
    let mut off = 0u64;
    for pc in &b.pieces {
        let (lo, hi) = (at.max(off), end.min(off + pc.bytes));
        if lo < hi {
            let (user, s) = (pc.user + (lo - off), slot + (lo - at));
            if send {
                mem.copy(user, s, (hi - lo) as usize);
            } else {
                mem.copy(s, user, (hi - lo) as usize);
            }
        }
        off += pc.bytes;
    }
    // An LL send signals nothing (its packets carry the flag); the rest store `k + 1`.
    if !(ll && send) {
        mem.write(o.remote + 8 * c as u64, k + 1);
    }
    b.j += 1;
    if b.j == b.n {
        let own = if send { SENT } else { RECVD };
        mem.write(header + 8 * word(own, peer, c) as u64, b.base + b.n as u64);
    }
    true
}

/// One step of a posted transfer's block (as the kernel's `posted_send` and `posted_recv`).
fn posted_step(mem: &mut Mem, header: u64, b: &mut Block) -> bool {
    let o = b.op;
    let (peer, c) = (o.peer as usize, b.c);
    let done = b.base + b.n as u64;
    let send = o.kind & kind::MASK == kind::SEND;
    match (send, b.phase) {
        (true, _) => {
            let tag = mem.read(header + 8 * word(POST_TAG, peer, c) as u64);
            if tag < b.base + 1 {
                return false;
            }
            assert_eq!(tag, b.base + 1, "the post of this group, not of another");
            let dst = mem.read(header + 8 * word(POST_ADDR, peer, c) as u64);
            if dst == 0 {
                b.phase = Phase::Slots;
                return true;
            }
            let (lo, hi) = direct_share(o.bytes as usize, o.channels as usize, c);
            let (lo, hi) = (lo as u64, hi as u64);
            let mut off = 0u64;
            for pc in &b.pieces {
                let (a, z) = (lo.max(off), hi.min(off + pc.bytes));
                if a < z {
                    mem.copy(pc.user + (a - off), dst + a, (z - a) as usize);
                }
                off += pc.bytes;
            }
            mem.write(o.remote + 8 * c as u64, done);
            mem.write(header + 8 * word(SENT, peer, c) as u64, done);
            b.j = b.n;
            true
        }
        (false, Phase::Start) => {
            let post = o.remote + 8 * c as u64;
            mem.write(post + (8 * (POST_ADDR - CONSUMED) * ROLE_WORDS) as u64, o.user);
            mem.write(post + (8 * (POST_TAG - CONSUMED) * ROLE_WORDS) as u64, b.base + 1);
            b.phase = if o.user != 0 { Phase::Posted } else { Phase::Slots };
            true
        }
        (false, _) => {
            if mem.read(header + 8 * word(DATA, peer, c) as u64) < done {
                return false;
            }
            mem.write(o.remote + 8 * c as u64, done);
            mem.write(header + 8 * word(RECVD, peer, c) as u64, done);
            b.j = b.n;
            true
        }
    }
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Runs `groups[g][s][d]` bytes from `s` to `d` (`s == d`: a local copy) on `n` ranks, every
/// group's buffers fresh, and checks every received byte.
fn sim_byte(g: usize, src: usize, dst: usize, i: usize) -> u8 {
    let x = (i as u64) ^ ((g as u64) << 40) ^ ((src as u64) << 52) ^ ((dst as u64) << 58);
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// As [`run_split`], every stream in one buffer per side.
fn run(n: usize, groups: &[Vec<Vec<usize>>], seed: u64, cap: usize) {
    run_split(n, groups, seed, cap, 1)
}

/// Runs the groups with every stream cut into up to `split` buffers on each side.
fn run_split(n: usize, groups: &[Vec<Vec<usize>>], seed: u64, cap: usize, split: usize) {
    run_with(n, groups, seed, cap, split, false)
}

/// As [`run_split`]; with `posted`, the transfers above `LL_MAX_BYTES` are posted, and about
/// half the receive buffers are offered to the sender (zero-copy), the rest staged.
#[allow(clippy::needless_range_loop)]
fn run_with(n: usize, groups: &[Vec<Vec<usize>>], seed: u64, cap: usize, split: usize, posted: bool) {
    let mut mem = Mem::default();
    let mut rng = Lcg(seed);
    let bufs: Vec<u64> = (0..n).map(|q| (q as u64 + 1) << 40).collect();
    for &b in &bufs {
        mem.alloc(b, buffer_bytes(n));
    }
    let mut next_user = 1u64 << 50;
    let mut checks = Vec::new();
    let mut ranks: Vec<Rank> = (0..n)
        .map(|q| Rank { header: bufs[q], groups: Vec::new(), next: 0, blocks: Vec::new() })
        .collect();
    for (g, m) in groups.iter().enumerate() {
        for (me, rank) in ranks.iter_mut().enumerate() {
            let mut ops = Vec::new();
            let mut addrs = Vec::new();
            for q in 0..n {
                for (dir, bytes) in [(Dir::Send, m[me][q]), (Dir::Recv, m[q][me])] {
                    let (src, dst) = if dir == Dir::Send { (me, q) } else { (q, me) };
                    // The stream in up to `split` buffers, cut independently on each side.
                    let mut cuts = vec![0, bytes];
                    for _ in 1..split {
                        cuts.push(rng.next() as usize % (bytes + 1));
                    }
                    cuts.sort_unstable();
                    for w in cuts.windows(2) {
                        let (from, len) = (w[0], w[1] - w[0]);
                        let addr = next_user + (rng.next() % 16);
                        next_user += (len as u64 + 4096).next_multiple_of(4096);
                        mem.alloc(addr, len);
                        let data: Vec<u8> = (from..from + len).map(|i| sim_byte(g, src, dst, i)).collect();
                        if dir == Dir::Send {
                            mem.at(addr, len).copy_from_slice(&data);
                        } else {
                            checks.push((addr, data));
                        }
                        ops.push(P2pOp { dir, peer: q, bytes: len });
                        addrs.push(addr);
                    }
                }
            }
            // Any order of the operations, keeping each stream's own order.
            let mut order: Vec<usize> = (0..ops.len()).collect();
            for i in (1..order.len()).rev() {
                let j = rng.next() as usize % (i + 1);
                order.swap(i, j);
            }
            let mut keyed: Vec<(usize, usize)> = Vec::new();
            for (slot, &i) in order.iter().enumerate() {
                keyed.push((slot, i));
            }
            // Stable within a stream: sort each stream's operations back into stream order
            // over the slots the shuffle gave the stream.
            let stream_of = |o: &P2pOp| (o.dir == Dir::Send, o.peer);
            let mut by_stream: HashMap<(bool, usize), Vec<usize>> = HashMap::new();
            for &(slot, i) in &keyed {
                by_stream.entry(stream_of(&ops[i])).or_default().push(slot);
            }
            let mut placed = vec![0usize; ops.len()];
            let mut per_stream: HashMap<(bool, usize), Vec<usize>> = HashMap::new();
            for (i, o) in ops.iter().enumerate() {
                per_stream.entry(stream_of(o)).or_default().push(i);
            }
            for (key, mut slots) in by_stream {
                slots.sort_unstable();
                for (slot, &i) in slots.iter().zip(&per_stream[&key]) {
                    placed[*slot] = i;
                }
            }
            let ops: Vec<P2pOp> = placed.iter().map(|&i| ops[i]).collect();
            let addrs: Vec<u64> = placed.iter().map(|&i| addrs[i]).collect();
            // The simulated memory is one address space: a receive buffer "as the sender maps
            // it" is its own address.
            let direct: Vec<u64> = ops
                .iter()
                .zip(&addrs)
                .map(|(o, &a)| if posted && o.dir == Dir::Recv && rng.next().is_multiple_of(2) { a } else { 0 })
                .collect();
            let env = KernelEnv { rank: me, bufs: &bufs, cap, ctl: 8, timeout_ns: 0, slot: 0, posted, direct: &direct };
            let p = plan(&ops, &addrs, &env).unwrap().expect("fits the kernel");
            assert!(p.args.blocks() as usize <= (2 * n - 1) * cap.max(1));
            rank.groups.push(p);
        }
    }
    for r in &mut ranks {
        start(&mut mem, r);
    }
    loop {
        let mut runnable = Vec::new();
        for (q, r) in ranks.iter().enumerate() {
            for (i, b) in r.blocks.iter().enumerate() {
                if b.j < b.n {
                    runnable.push((q, i));
                }
            }
        }
        if runnable.is_empty() {
            if ranks.iter().all(|r| r.next == r.groups.len()) {
                break;
            }
            unreachable!("every started group ends");
        }
        // Try the runnable blocks from a random one on; one must move.
        let from = rng.next() as usize % runnable.len();
        let moved = (0..runnable.len()).any(|k| {
            let (q, i) = runnable[(from + k) % runnable.len()];
            let header = ranks[q].header;
            step(&mut mem, header, &mut ranks[q].blocks[i])
        });
        assert!(moved, "deadlock: no block can move");
        for r in &mut ranks {
            if r.blocks.iter().all(|b| b.j == b.n) {
                r.blocks.clear();
                start(&mut mem, r);
            }
        }
    }
    assert!(mem.full.is_empty(), "chunks left in slots");
    for (addr, want) in checks {
        assert_eq!(mem.at(addr, want.len()), &want[..], "received bytes at {addr:#x}");
    }
}

#[test]
fn two_ranks_every_size_both_directions() {
    let sizes = [
        0, 1, 7, 16, 100, LL_CHUNK_BYTES + 1, SLOT_BYTES - 1, SLOT_BYTES, SLOT_BYTES + 1, LL_MAX_BYTES, LL_MAX_BYTES + 1,
        3 * SLOT_BYTES + 5, 40 * SLOT_BYTES + 3,
    ];
    let groups: Vec<Vec<Vec<usize>>> = sizes
        .iter()
        .zip(sizes.iter().rev())
        .map(|(&a, &b)| vec![vec![a % 1000, a], vec![b, b % 777]])
        .collect();
    for (seed, cap) in [(1, 16), (2, 1), (3, 3)] {
        run(2, &groups, seed, cap);
    }
}

#[test]
fn four_ranks_all_to_all_many_groups() {
    let mut rng = Lcg(99);
    let groups: Vec<Vec<Vec<usize>>> = (0..12)
        .map(|_| {
            (0..4)
                .map(|_| {
                    (0..4)
                        .map(|_| match rng.next() % 4 {
                            0 => 0,
                            1 => (rng.next() % 64) as usize,
                            2 => (rng.next() % (5 * SLOT_BYTES as u64)) as usize,
                            _ => SLOT_BYTES * (1 + (rng.next() % 9) as usize),
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    for seed in 0..4 {
        run(4, &groups, seed, channel_cap(33, 4));
    }
}

#[test]
fn streams_over_several_buffers_on_either_side() {
    let mut rng = Lcg(7);
    let groups: Vec<Vec<Vec<usize>>> = (0..8)
        .map(|_| {
            (0..3)
                .map(|_| (0..3).map(|_| (rng.next() % (4 * SLOT_BYTES as u64)) as usize).collect())
                .collect()
        })
        .collect();
    for seed in 0..3 {
        run_split(3, &groups, seed, 2, 3);
    }
}

#[test]
fn posted_transfers_zero_copy_or_through_the_slots_deliver_every_byte() {
    // Every size around the LL limit and the channels' shares, both directions, staged and
    // posted groups of one pair following each other on the same channels.
    let sizes = [
        1, LL_MAX_BYTES, LL_MAX_BYTES + 1, 3 * SLOT_BYTES + 5, 16 * SLOT_BYTES, 40 * SLOT_BYTES + 3, 2 << 20,
    ];
    let groups: Vec<Vec<Vec<usize>>> = sizes
        .iter()
        .zip(sizes.iter().rev())
        .map(|(&a, &b)| vec![vec![0, a], vec![b, 0]])
        .collect();
    for (seed, cap) in [(1, 16), (2, 1), (3, 3), (4, 5)] {
        run_with(2, &groups, seed, cap, 1, true);
    }
    // Four ranks, any sizes, some streams over several buffers (those are staged).
    let mut rng = Lcg(5);
    let groups: Vec<Vec<Vec<usize>>> = (0..10)
        .map(|_| {
            (0..4)
                .map(|_| {
                    (0..4)
                        .map(|_| match rng.next() % 3 {
                            0 => (rng.next() % 64) as usize,
                            1 => LL_MAX_BYTES + (rng.next() % (5 * SLOT_BYTES as u64)) as usize,
                            _ => SLOT_BYTES * (1 + (rng.next() % 9) as usize),
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    for seed in 0..4 {
        run_with(4, &groups, seed, channel_cap(33, 4), 1 + seed as usize % 2, true);
    }
}

#[test]
fn a_posted_receive_offers_its_buffer_only_where_it_is_one_buffer() {
    let bufs = [1u64 << 40, 2 << 40];
    let big = LL_MAX_BYTES + 1;
    let r = |bytes| P2pOp { dir: Dir::Recv, peer: 1, bytes };
    let s = |bytes| P2pOp { dir: Dir::Send, peer: 1, bytes };
    let direct = [0x5000, 0x7000, 0x9000];
    let env = KernelEnv { rank: 0, bufs: &bufs, cap: 16, ctl: 8, timeout_ns: 0, slot: 0, posted: true, direct: &direct };
    let a = plan(&[s(big), r(big)], &[0x1000, 0x2000], &env).unwrap().unwrap().args;
    assert_eq!(a.ops[0].kind, kind::SEND | kind::POSTED);
    assert_eq!((a.ops[1].kind, a.ops[1].user), (kind::RECV | kind::POSTED, 0x7000));
    // Two receive buffers from one peer: through the slots (0 posted).
    let a = plan(&[r(big), s(8), r(8)], &[0x1000, 0x2000, 0x3000], &env).unwrap().unwrap().args;
    let recv = a.ops[..a.nops as usize].iter().find(|o| o.kind & kind::MASK == kind::RECV).unwrap();
    assert_eq!((recv.kind, recv.user), (kind::RECV | kind::POSTED, 0));
    // LL-sized transfers are never posted; neither is anything when the communicator says so.
    let a = plan(&[s(LL_MAX_BYTES), r(LL_MAX_BYTES)], &[0x1000, 0x2000], &env).unwrap().unwrap().args;
    assert_eq!((a.ops[0].kind, a.ops[1].kind, a.ops[1].user), (kind::SEND, kind::RECV, 0));
    let off = KernelEnv { posted: false, ..env };
    let a = plan(&[s(big), r(big)], &[0x1000, 0x2000], &off).unwrap().unwrap().args;
    assert_eq!((a.ops[0].kind, a.ops[1].kind, a.ops[1].user), (kind::SEND, kind::RECV, 0));
}

#[test]
fn the_choice_depends_on_the_communicator_alone() {
    let bufs = [1u64 << 40, 2 << 40, 3 << 40];
    let env = KernelEnv { rank: 0, bufs: &bufs, cap: 16, ctl: 8, timeout_ns: 0, slot: 0, posted: false, direct: &[] };
    let s = |peer, bytes| P2pOp { dir: Dir::Send, peer, bytes };
    let r = |peer, bytes| P2pOp { dir: Dir::Recv, peer, bytes };
    // Several buffers per stream, and to itself: on the kernel (the self-copies before it).
    let p = plan(&[s(1, 8), s(1, 8), s(0, 16), r(0, 8), r(0, 8)], &[1, 2, 3, 4, 5], &env).unwrap().unwrap();
    assert_eq!(p.args.nops, 1);
    assert_eq!(&p.copies[..], &[(3, 4, 8), (11, 5, 8)]);
    // One buffer each way to itself: a copy in the kernel.
    let p = plan(&[s(0, 16), r(0, 16)], &[3, 4], &env).unwrap().unwrap();
    assert_eq!((p.args.nops, p.args.ops[0].kind, p.copies.len()), (1, kind::COPY, 0));
    // Zero-byte operations are left out.
    assert_eq!(plan(&[s(1, 8), s(1, 0)], &[1, 2], &env).unwrap().unwrap().args.ops[0].npieces, 1);
    // A peer on another machine (no mapped buffer), or more ranks than the kernel serves: the
    // scratch path, whatever the operations.
    let remote = KernelEnv { bufs: &[1 << 40, 0, 3 << 40], ..env };
    assert!(plan(&[s(2, 8)], &[1], &remote).unwrap().is_none());
    assert!(plan(&[], &[], &remote).unwrap().is_none());
    let many: Vec<u64> = (1..=9).map(|q| q << 40).collect();
    assert!(plan(&[s(1, 8)], &[1], &KernelEnv { bufs: &many, ..env }).unwrap().is_none());
    // Bad input is an error, not a fallback.
    let e = plan(&[s(0, 8), r(0, 4)], &[1, 2], &env).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(plan(&[s(3, 8)], &[1], &env).is_err());
    assert!(plan(&[s(1, 8)], &[], &env).is_err());
    let lots: Vec<P2pOp> = (0..65).map(|_| s(1, 1)).collect();
    let e = plan(&lots, &[1; 65], &env).unwrap_err();
    assert!(e.to_string().contains("at most 64"), "{e}");
}

#[test]
fn the_plan_points_at_the_peers_buffers() {
    let bufs = [1u64 << 40, 2 << 40];
    let env = KernelEnv { rank: 1, bufs: &bufs, cap: 16, ctl: 8, timeout_ns: 5, slot: 0, posted: false, direct: &[] };
    let ops = [P2pOp { dir: Dir::Send, peer: 0, bytes: 3 * SLOT_BYTES }, P2pOp { dir: Dir::Recv, peer: 0, bytes: 10 }];
    let a = plan(&ops, &[0x10, 0x20], &env).unwrap().unwrap().args;
    assert_eq!(a.header, bufs[1]);
    let (s, r) = (a.ops[0], a.ops[1]);
    assert_eq!((s.kind, s.channels, s.first_block), (kind::SEND, 3, 0));
    assert_eq!(s.slots, bufs[0] + channel_offset(1, 0) as u64);
    assert_eq!(s.remote, bufs[0] + 8 * word(DATA, 1, 0) as u64);
    assert_eq!((r.kind, r.channels, r.first_block), (kind::RECV, 1, 3));
    assert_eq!(r.slots, bufs[1] + channel_offset(0, 0) as u64);
    assert_eq!(r.remote, bufs[0] + 8 * word(CONSUMED, 1, 0) as u64);
    assert_eq!(a.blocks(), 4);
    assert_eq!((s.first_piece, s.npieces, r.first_piece, r.npieces), (0, 1, 1, 1));
    assert_eq!(a.pieces[0], P2pPiece { user: 0x10, bytes: 3 * SLOT_BYTES as u64 });
}

proptest::proptest! {
    /// Any group of transfers among `n` ranks, each cut into buffers differently on its two
    /// sides: sender and receiver put every transfer on the same path, and every operation
    /// lands on exactly one side of the split.
    #[test]
    fn both_sides_of_a_transfer_take_the_same_path(
        n in 2usize..6,
        transfers in proptest::collection::vec((0usize..6, 0usize..6, 0usize..(3 << 20), 1usize..4, 1usize..4), 0..12),
        limit in 0usize..(2 << 20),
    ) {
        use super::super::p2p::{Dir, P2pOp};
        // Rank r's operations (with a tag per transfer as the buffer address), in group order.
        let mut ops: Vec<Vec<(P2pOp, u64)>> = vec![Vec::new(); n];
        for (t, &(src, dst, bytes, send_cuts, recv_cuts)) in transfers.iter().enumerate() {
            let (src, dst) = (src % n, dst % n);
            for (rank, dir, peer, cuts) in [(src, Dir::Send, dst, send_cuts), (dst, Dir::Recv, src, recv_cuts)] {
                // `cuts` buffers (the last ones possibly empty), adding up to `bytes`.
                let piece = bytes.div_ceil(cuts);
                let mut left = bytes;
                for _ in 0..cuts {
                    let b = left.min(piece);
                    ops[rank].push((P2pOp { dir, peer, bytes: b }, t as u64));
                    left -= b;
                }
            }
        }
        let mut path: HashMap<(usize, u64, bool), bool> = HashMap::new();
        for (r, mine) in ops.iter().enumerate() {
            let (o, a): (Vec<P2pOp>, Vec<u64>) = mine.iter().copied().unzip();
            let s = split_large(&o, &a, r, limit);
            proptest::prop_assert_eq!(s.kernel.len() + s.copies.len(), o.len());
            proptest::prop_assert!(s.copies.iter().all(|c| c.peer != r));
            let sides = s.copies.iter().zip(&s.copies_bufs).map(|(o, t)| (o, t, true));
            for (o, &t, copies) in sides.chain(s.kernel.iter().zip(&s.kernel_bufs).map(|(o, t)| (o, t, false))) {
                // Every buffer of one transfer on one rank takes one path.
                let before = path.insert((r, t, o.dir == Dir::Send), copies);
                proptest::prop_assert!(before.is_none_or(|b| b == copies), "rank {} transfer {}", r, t);
            }
        }
        for (t, &(src, dst, _, _, _)) in transfers.iter().enumerate() {
            let (src, dst) = (src % n, dst % n);
            if src == dst {
                continue;
            }
            let send = path.get(&(src, t as u64, true)).copied();
            let recv = path.get(&(dst, t as u64, false)).copied();
            proptest::prop_assert_eq!(send, recv, "transfer {} from {} to {}", t, src, dst);
        }
    }
}

/// Every rank's `collective_ops` of a collective, the transfers carried out on the CPU (each
/// pair's sends concatenated in order and poured into the receiver's buffers in order), and
/// every rank's receive buffer compared with the collective's result.
fn run_collective(c: crate::plan::collective::Collective, n: usize, in_place: bool) {
    use crate::plan::collective::Collective as C;
    use super::super::p2p::Dir;
    let size = 4usize;
    // Rank r's buffers: send at (r + 1) << 32, recv at (r + 1) << 32 | 1 << 28 (in place: the
    // layouts ringccl's validation gives).
    let (sc, rc) = match c {
        C::Gather { sendcount, .. } | C::AllGather { sendcount } => (sendcount, n * sendcount),
        C::Scatter { recvcount, .. } => (n * recvcount, recvcount),
        C::AllToAll { count_per_peer } => (n * count_per_peer, n * count_per_peer),
        _ => unreachable!(),
    };
    let base = |r: usize| ((r + 1) as u64) << 32;
    let recv_at = |r: usize| base(r) | 1 << 28;
    let mut mem: HashMap<u64, Vec<u8>> = HashMap::new();
    let fill = |r: usize, i: usize| (r * 131 + i * 7 + 3) as u8;
    let mut ptrs = Vec::new();
    for r in 0..n {
        let send: Vec<u8> = (0..sc * size).map(|i| fill(r, i)).collect();
        let (s, rv) = match (c, in_place) {
            (C::Gather { sendcount, root }, true) if r == root => (recv_at(r) + (r * sendcount * size) as u64, recv_at(r)),
            (C::AllGather { sendcount }, true) => (recv_at(r) + (r * sendcount * size) as u64, recv_at(r)),
            (C::Scatter { recvcount, root }, true) if r == root => (base(r), base(r) + (r * recvcount * size) as u64),
            _ => (base(r), recv_at(r)),
        };
        let mut recv = vec![0u8; rc * size];
        if s != base(r) {
            // In place: the input sits inside the receive buffer.
            let off = (s - recv_at(r)) as usize;
            recv[off..off + sc * size].copy_from_slice(&send);
        } else {
            mem.insert(base(r), send);
        }
        if rv == recv_at(r) {
            mem.insert(recv_at(r), recv);
        }
        ptrs.push((s, rv));
    }
    let find = |mem: &HashMap<u64, Vec<u8>>, addr: u64, len: usize| -> (u64, usize) {
        for (&b, v) in mem {
            if addr >= b && addr + len as u64 <= b + v.len() as u64 {
                return (b, (addr - b) as usize);
            }
        }
        panic!("{addr:#x}+{len} is in no buffer");
    };
    let ops: Vec<(Vec<P2pOp>, Vec<u64>)> = (0..n)
        .map(|r| collective_ops(c, r, n, size, ptrs[r]).expect("the operations"))
        .collect();
    for p in 0..n {
        for q in 0..n {
            let mut stream = Vec::new();
            for (o, &a) in ops[p].0.iter().zip(&ops[p].1) {
                if o.dir == Dir::Send && o.peer == q {
                    let (b, off) = find(&mem, a, o.bytes);
                    stream.extend_from_slice(&mem[&b][off..off + o.bytes]);
                }
            }
            let mut at = 0;
            for (o, &a) in ops[q].0.iter().zip(&ops[q].1) {
                if o.dir == Dir::Recv && o.peer == p {
                    let (b, off) = find(&mem, a, o.bytes);
                    mem.get_mut(&b).unwrap()[off..off + o.bytes].copy_from_slice(&stream[at..at + o.bytes]);
                    at += o.bytes;
                }
            }
            assert_eq!(at, stream.len(), "{c:?}: {p} sends {} bytes to {q}, which takes {at}", stream.len());
        }
    }
    for (r, &(_, recv)) in ptrs.iter().enumerate() {
        let (b, off) = find(&mem, recv, rc * size);
        let got = &mem[&b][off..off + rc * size].to_vec();
        let want: Option<Vec<u8>> = match c {
            C::Gather { root, .. } if r != root => None,
            C::Gather { sendcount, .. } | C::AllGather { sendcount } => {
                Some((0..n).flat_map(|q| (0..sendcount * size).map(move |i| fill(q, i))).collect())
            }
            C::Scatter { recvcount, root } => Some((0..recvcount * size).map(|i| fill(root, r * recvcount * size + i)).collect()),
            C::AllToAll { count_per_peer } => {
                let b = count_per_peer * size;
                Some((0..n).flat_map(|q| (0..b).map(move |i| fill(q, r * b + i))).collect())
            }
            _ => unreachable!(),
        };
        if let Some(want) = want {
            assert_eq!(got, &want, "{c:?} in place {in_place}: rank {r}'s result");
        }
    }
}

#[test]
fn collectives_as_point_to_point_groups_deliver_their_results() {
    use crate::plan::collective::Collective as C;
    for n in 2..=8 {
        for count in [1, 5, 1000] {
            for root in [0, n - 1] {
                for in_place in [false, true] {
                    run_collective(C::Gather { sendcount: count, root }, n, in_place);
                    run_collective(C::Scatter { recvcount: count, root }, n, in_place);
                }
            }
            run_collective(C::AllGather { sendcount: count }, n, false);
            run_collective(C::AllGather { sendcount: count }, n, true);
            run_collective(C::AllToAll { count_per_peer: count }, n, false);
        }
    }
    // An in-place all-to-all is refused.
    let e = collective_ops(C::AllToAll { count_per_peer: 4 }, 0, 2, 4, (0x1000, 0x1000)).unwrap_err();
    assert!(e.to_string().contains("in-place all-to-all"), "{e}");
}

#[test]
fn a_reduce_scatter_as_a_group_and_a_reduction_sums_every_block() {
    use super::super::p2p::Dir;
    for n in 2..=8usize {
        let count = 37usize;
        let bytes = count * 4;
        let send_at = |r: usize| ((r + 1) as u64) << 32;
        let temp_at = |r: usize| send_at(r) | 1 << 28;
        let value = |r: usize, i: usize| (r * 1000 + i) as u32;
        // Memory: every rank's send buffer (n blocks of u32) and temporary (n - 1 blocks).
        let mut mem: HashMap<u64, Vec<u32>> = HashMap::new();
        for r in 0..n {
            mem.insert(send_at(r), (0..n * count).map(|i| value(r, i)).collect());
            mem.insert(temp_at(r), vec![0; (n - 1) * count]);
        }
        let parts: Vec<_> = (0..n).map(|r| reduce_scatter_parts(r, n, bytes, send_at(r), temp_at(r))).collect();
        let locate = |addr: u64| -> (u64, usize) {
            let base = addr & !((1u64 << 28) - 1);
            (base, ((addr - base) / 4) as usize)
        };
        for p in 0..n {
            for q in 0..n {
                let mut stream = Vec::new();
                for (o, &a) in parts[p].0.iter().zip(&parts[p].1) {
                    if o.dir == Dir::Send && o.peer == q {
                        let (b, off) = locate(a);
                        stream.extend_from_slice(&mem[&b][off..off + o.bytes / 4]);
                    }
                }
                let mut at = 0;
                for (o, &a) in parts[q].0.iter().zip(&parts[q].1) {
                    if o.dir == Dir::Recv && o.peer == p {
                        let (b, off) = locate(a);
                        let len = o.bytes / 4;
                        mem.get_mut(&b).unwrap()[off..off + len].copy_from_slice(&stream[at..at + len]);
                        at += len;
                    }
                }
                assert_eq!(at, stream.len(), "{n} ranks: {p} to {q}");
            }
        }
        for (r, (_, _, srcs)) in parts.iter().enumerate() {
            assert_eq!(srcs.len(), n);
            for i in 0..count {
                let got: u32 = srcs
                    .iter()
                    .map(|&s| {
                        let (b, off) = locate(s);
                        mem[&b][off + i]
                    })
                    .sum();
                let want: u32 = (0..n).map(|q| value(q, r * count + i)).sum();
                assert_eq!(got, want, "{n} ranks: rank {r} element {i}");
            }
        }
    }
}
