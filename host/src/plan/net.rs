//! Collectives between processes whose peers are reached over the network
//! (`RINGCCL_NET=ucx`, or a peer on another machine): one rank's part of a collective as a
//! sequence of groups of point-to-point transfers ([`NetGroup`]), each run like a `peer_ops`
//! group ([`super::p2p`]), with the receives of a reducing group combined into their buffer
//! (`dst = received ⊕ dst`) instead of copied.
//!
//! | collective | groups |
//! | --- | --- |
//! | all-reduce | the input copied to the output (out of place), then the ring: n − 1 reducing groups of reduce-scatter, n − 1 of all-gather ([`ring_groups`]) |
//! | reduce-scatter | the rank's own block copied to the output (out of place), then n − 1 reducing groups: at step s, block `me + s` to rank `me + s`, the block of rank `me − s` combined into the output |
//! | reduce | non-roots: one group sending the input to the root; the root: its input copied (out of place), then one reducing group per peer |
//! | all-gather, broadcast, all-to-all, gather, scatter | one group: every transfer at once (a rank's part for itself is a local copy) |
//!
//! Avg divides by n in the last reduction of each element. Every rank computes the same pair
//! traffic for each group index, so the groups of two ranks match as `peer_ops` groups do.
//!
//! ```
//! use ringccl::internals::plan::net::{groups, At};
//! use ringccl::CollectiveKind;
//! // All-gather of 4 elements of 4 bytes on rank 1 of 3, out of place: one group.
//! let g = groups((CollectiveKind::AllGather, 4, 0), (1, 3), 4, false);
//! assert_eq!(g.len(), 1);
//! assert!(!g[0].reduce);
//! // It receives rank 2's block at byte 32 of the output.
//! assert!(g[0].ops.iter().any(|o| o.peer == 2 && o.at == At::Recv(32)));
//! ```

use crate::kind::CollectiveKind as Kind;
use crate::plan::p2p::Dir;

/// Where a transfer's bytes are: a byte offset into the caller's input or output buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// Bytes from the start of the input (send) buffer.
    Send(usize),
    /// Bytes from the start of the output (receive) buffer.
    Recv(usize),
}

/// One transfer of a group: `bytes` to or from `peer` (this rank itself: a local copy), read
/// from or written to `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetOp {
    /// Send or receive.
    pub dir: Dir,
    /// The rank on the other side.
    pub peer: usize,
    /// Bytes.
    pub bytes: usize,
    /// The buffer and offset.
    pub at: At,
}

/// One group of transfers, run like a `peer_ops` group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetGroup {
    /// The transfers.
    pub ops: Vec<NetOp>,
    /// Receives from peers are combined into their buffer with the call's operator.
    pub reduce: bool,
    /// The divisor applied by that combination (n in the last reduction of avg, else 1).
    pub postdiv: u32,
}

impl NetGroup {
    fn copies(ops: Vec<NetOp>) -> Self {
        NetGroup {
            ops,
            reduce: false,
            postdiv: 1,
        }
    }
}

fn send(peer: usize, bytes: usize, at: At) -> NetOp {
    NetOp {
        dir: Dir::Send,
        peer,
        bytes,
        at,
    }
}

fn recv(peer: usize, bytes: usize, at: At) -> NetOp {
    NetOp {
        dir: Dir::Recv,
        peer,
        bytes,
        at,
    }
}

/// A local copy of `bytes` from `from` to `to`.
fn local(me: usize, bytes: usize, from: At, to: At) -> [NetOp; 2] {
    [send(me, bytes, from), recv(me, bytes, to)]
}

/// One step of a ring all-reduce ([`ring_groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGroup {
    /// Combine the received elements with the output's (reduce-scatter) or copy them
    /// (all-gather).
    pub reduce: bool,
    /// The final reduction of the received chunk.
    pub last: bool,
    /// (first element, elements) sent.
    pub send: (usize, usize),
    /// (first element, elements) received.
    pub recv: (usize, usize),
}

/// The groups of rank `r` of `n` in a ring all-reduce of `count` elements, in order: n − 1 of
/// reduce-scatter, then n − 1 of all-gather. Chunk `c` is elements `c·count/n .. (c+1)·count/n`;
/// at reduce-scatter step `s` rank `r` sends chunk `r − s` and receives chunk `r − s − 1`; at
/// all-gather step `s` it sends chunk `r + 1 − s` and receives chunk `r − s` (mod n).
///
/// ```
/// use ringccl::internals::plan::net::ring_groups;
/// let g = ring_groups(0, 2, 10);
/// assert_eq!(g.len(), 2);
/// assert_eq!((g[0].send, g[0].recv, g[0].reduce, g[0].last), ((0, 5), (5, 5), true, true));
/// assert_eq!((g[1].send, g[1].recv, g[1].reduce), ((5, 5), (0, 5), false));
/// ```
pub fn ring_groups(r: usize, n: usize, count: usize) -> Vec<RingGroup> {
    let chunk = |c: usize| (c * count / n, (c + 1) * count / n - c * count / n);
    let mut out = Vec::new();
    if n < 2 || r >= n {
        return out;
    }
    for phase in 0..2 {
        for s in 0..n - 1 {
            let (send_c, recv_c) = if phase == 0 {
                ((r + n - s) % n, (r + 2 * n - s - 1) % n)
            } else {
                ((r + 1 + n - s) % n, (r + n - s) % n)
            };
            out.push(RingGroup {
                reduce: phase == 0,
                last: phase == 0 && s + 2 == n,
                send: chunk(send_c),
                recv: chunk(recv_c),
            });
        }
    }
    out
}

/// Rank `me`'s groups among `n` ranks for the collective `kind` with `count` elements (the
/// count of the collective's API: per rank for all-gather, reduce-scatter, all-to-all, gather
/// and scatter) and `root` (rooted collectives), elements of `size` bytes; `in_place` as
/// validation found it (then the input and output addresses the executor gets are consistent
/// with NCCL's in-place layout, and a copy of a block onto itself is left out). A rank with
/// nothing to do gets no group; `me >= n`, `root >= n` and point-to-point groups get none.
pub fn groups(
    (kind, count, root): (Kind, usize, usize),
    (me, n): (usize, usize),
    size: usize,
    in_place: bool,
) -> Vec<NetGroup> {
    if me >= n || root >= n {
        return Vec::new();
    }
    let k = count;
    let b = |elems: usize| elems.saturating_mul(size);
    let mut out = Vec::new();
    let copy_first = |out: &mut Vec<NetGroup>, bytes: usize, from: At, to: At| {
        if !in_place && bytes > 0 {
            out.push(NetGroup::copies(local(me, bytes, from, to).to_vec()));
        }
    };
    let postdiv_last = |last: bool| if last { n as u32 } else { 1 };
    match kind {
        Kind::AllReduce => {
            copy_first(&mut out, b(count), At::Send(0), At::Recv(0));
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            for g in ring_groups(me, n, count) {
                let ((so, sl), (ro, rl)) = (g.send, g.recv);
                out.push(NetGroup {
                    ops: vec![
                        send(next, b(sl), At::Recv(b(so))),
                        recv(prev, b(rl), At::Recv(b(ro))),
                    ],
                    reduce: g.reduce,
                    postdiv: if g.reduce { postdiv_last(g.last) } else { 1 },
                });
            }
        }
        Kind::ReduceScatter => {
            copy_first(&mut out, b(k), At::Send(b(me * k)), At::Recv(0));
            for s in 1..n {
                let (to, from) = ((me + s) % n, (me + n - s) % n);
                out.push(NetGroup {
                    ops: vec![send(to, b(k), At::Send(b(to * k))), recv(from, b(k), At::Recv(0))],
                    reduce: true,
                    postdiv: postdiv_last(s + 1 == n),
                });
            }
        }
        Kind::Reduce => {
            if me == root {
                copy_first(&mut out, b(count), At::Send(0), At::Recv(0));
                let peers: Vec<usize> = (1..n).map(|s| (root + s) % n).collect();
                for (i, &q) in peers.iter().enumerate() {
                    out.push(NetGroup {
                        ops: vec![recv(q, b(count), At::Recv(0))],
                        reduce: true,
                        postdiv: postdiv_last(i + 1 == peers.len()),
                    });
                }
            } else {
                // One group on this side; the root meets it in the group of its own that
                // receives from this rank (each pair talks in one group on each side).
                out.push(NetGroup::copies(vec![send(root, b(count), At::Send(0))]));
            }
        }
        Kind::AllGather => {
            let mut ops = Vec::new();
            for q in 0..n {
                if q == me {
                    if !in_place {
                        ops.extend(local(me, b(k), At::Send(0), At::Recv(b(me * k))));
                    }
                } else {
                    ops.push(send(q, b(k), At::Send(0)));
                    ops.push(recv(q, b(k), At::Recv(b(q * k))));
                }
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::Broadcast => {
            let mut ops = Vec::new();
            if me == root {
                if !in_place {
                    ops.extend(local(me, b(count), At::Send(0), At::Recv(0)));
                }
                ops.extend((0..n).filter(|&q| q != root).map(|q| send(q, b(count), At::Send(0))));
            } else {
                ops.push(recv(root, b(count), At::Recv(0)));
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::AllToAll => {
            let mut ops = Vec::new();
            for q in 0..n {
                ops.push(send(q, b(k), At::Send(b(q * k))));
                ops.push(recv(q, b(k), At::Recv(b(q * k))));
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::Gather => {
            let mut ops = Vec::new();
            if me == root {
                for q in 0..n {
                    if q != me {
                        ops.push(recv(q, b(k), At::Recv(b(q * k))));
                    } else if !in_place {
                        ops.extend(local(me, b(k), At::Send(0), At::Recv(b(me * k))));
                    }
                }
            } else {
                ops.push(send(root, b(k), At::Send(0)));
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::Scatter => {
            let mut ops = Vec::new();
            if me == root {
                for q in 0..n {
                    if q != me {
                        ops.push(send(q, b(k), At::Send(b(q * k))));
                    } else if !in_place {
                        ops.extend(local(me, b(k), At::Send(b(me * k)), At::Recv(0)));
                    }
                }
            } else {
                ops.push(recv(root, b(k), At::Recv(0)));
            }
            out.push(NetGroup::copies(ops));
        }
        Kind::SendRecv => {}
    }
    out.retain(|g| g.ops.iter().any(|o| o.bytes > 0));
    out
}

/// The ranks of each machine of a job (by the machine identifiers the ranks published,
/// [`crate::transport::ipc::machine_id`]), machines in the order of their lowest rank.
///
/// ```
/// use ringccl::internals::plan::net::Machines;
/// let m = Machines::new(&[7, 7, 9, 9]);
/// assert_eq!(m.ranks(), &[vec![0, 1], vec![2, 3]]);
/// assert_eq!(m.per_machine(), Some(2));
/// assert_eq!(Machines::new(&[7, 7, 9]).per_machine(), None); // uneven
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machines {
    ranks: Vec<Vec<usize>>,
}

impl Machines {
    /// Groups ranks `0..ids.len()` by `ids[rank]`.
    pub fn new(ids: &[u64]) -> Self {
        let mut seen: Vec<u64> = Vec::new();
        let mut ranks: Vec<Vec<usize>> = Vec::new();
        for (r, id) in ids.iter().enumerate() {
            match seen.iter().position(|s| s == id) {
                Some(m) => ranks[m].push(r),
                None => {
                    seen.push(*id);
                    ranks.push(vec![r]);
                }
            }
        }
        Machines { ranks }
    }

    /// The ranks of each machine, in rank order.
    pub fn ranks(&self) -> &[Vec<usize>] {
        &self.ranks
    }

    /// The ranks per machine when the hierarchical all-reduce applies: at least two machines,
    /// each with the same number of ranks, at least two.
    pub fn per_machine(&self) -> Option<usize> {
        let k = self.ranks.first()?.len();
        (self.ranks.len() >= 2 && k >= 2 && self.ranks.iter().all(|m| m.len() == k)).then_some(k)
    }

    /// Rank `r`'s machine and its index among that machine's ranks.
    fn place(&self, r: usize) -> Option<(usize, usize)> {
        self.ranks
            .iter()
            .enumerate()
            .find_map(|(m, rs)| rs.iter().position(|&q| q == r).map(|i| (m, i)))
    }
}

/// Rank `me`'s groups of a hierarchical all-reduce of `count` elements of `size` bytes across
/// `machines`, or `None` where it does not apply ([`Machines::per_machine`]). With `k` ranks
/// per machine and `M` machines, the output is cut into `k` shards (shard `j` is elements
/// `j·count/k .. (j+1)·count/k`), and the rank with index `i` on its machine:
/// 1. (out of place) copies its input to its output;
/// 2. reduce-scatters inside its machine: at step `s` = 1 … k − 1 it sends shard `i + s` to the
///    machine's rank of index `i + s` and combines the machine's rank of index `i − s`'s copy
///    of shard `i` into its own: shard `i` then holds the machine's sum;
/// 3. all-reduces shard `i` across machines with the ranks of index `i` on the other machines,
///    as a ring ([`ring_groups`]; avg divides by the job's rank count in its last reduction):
///    the only traffic between machines, `2 (M − 1) / M` of a shard per rank;
/// 4. all-gathers the shards inside its machine (one group).
///
/// Every group's peers are either all on `me`'s machine or all on others, so a group runs over
/// one transport (CUDA IPC inside a machine, the network between machines).
///
/// ```
/// use ringccl::internals::plan::net::{hierarchical_all_reduce, Machines};
/// let m = Machines::new(&[1, 1, 2, 2]);
/// let g = hierarchical_all_reduce(0, &m, 1000, 4, true).expect("two machines of two ranks");
/// // One reduce-scatter step, two ring steps across machines, one all-gather.
/// assert_eq!(g.len(), 4);
/// assert!(g[1].ops.iter().all(|o| o.peer == 2)); // across: the rank of index 0 on machine 1
/// ```
pub fn hierarchical_all_reduce(
    me: usize,
    machines: &Machines,
    count: usize,
    size: usize,
    in_place: bool,
) -> Option<Vec<NetGroup>> {
    let k = machines.per_machine()?;
    let (m, i) = machines.place(me)?;
    let nmach = machines.ranks.len();
    let n = nmach * k;
    let local = &machines.ranks[m];
    let b = |elems: usize| elems.saturating_mul(size);
    let shard = |j: usize| (j * count / k, (j + 1) * count / k - j * count / k);
    let mut out = Vec::new();
    if !in_place && count > 0 {
        out.push(NetGroup::copies(local_copy(me, b(count))));
    }
    let (mine_at, mine_len) = shard(i);
    for s in 1..k {
        let (to, from) = ((i + s) % k, (i + k - s) % k);
        let (to_at, to_len) = shard(to);
        out.push(NetGroup {
            ops: vec![
                send(local[to], b(to_len), At::Recv(b(to_at))),
                recv(local[from], b(mine_len), At::Recv(b(mine_at))),
            ],
            reduce: true,
            postdiv: 1,
        });
    }
    let across: Vec<usize> = machines.ranks.iter().map(|rs| rs[i]).collect();
    let (next, prev) = (across[(m + 1) % nmach], across[(m + nmach - 1) % nmach]);
    for g in ring_groups(m, nmach, mine_len) {
        let ((so, sl), (ro, rl)) = (g.send, g.recv);
        out.push(NetGroup {
            ops: vec![
                send(next, b(sl), At::Recv(b(mine_at + so))),
                recv(prev, b(rl), At::Recv(b(mine_at + ro))),
            ],
            reduce: g.reduce,
            postdiv: if g.reduce && g.last { n as u32 } else { 1 },
        });
    }
    let mut gather = Vec::new();
    for (j, &q) in local.iter().enumerate() {
        if j != i {
            let (at, len) = shard(j);
            gather.push(send(q, b(mine_len), At::Recv(b(mine_at))));
            gather.push(recv(q, b(len), At::Recv(b(at))));
        }
    }
    out.push(NetGroup::copies(gather));
    out.retain(|g| g.ops.iter().any(|o| o.bytes > 0));
    Some(out)
}

/// Rank `me`'s groups of the collective `kind` across `machines` where a hierarchical form
/// exists and applies ([`Machines::per_machine`]), else `None` (the caller uses the flat
/// [`groups`]). Arguments as for [`groups`]:
///
/// | collective | hierarchical form | traffic between machines, per rank |
/// | --- | --- | --- |
/// | all-reduce | [`hierarchical_all_reduce`] | `2 (M − 1) / M · count / k` against `2 (n − 1) / n · count` |
/// | all-gather | the ranks of index `i` of every machine exchange their blocks (one group), then each rank hands the `M` blocks it holds to its machine's other ranks (one group) | `(M − 1)` blocks against `(n − k)` |
/// | broadcast | the root sends to its machine's ranks and to the rank of its own index on every other machine, which then forwards to its machine's ranks | the root's `M − 1` copies against `n − k` |
///
/// The others (reduce-scatter and reduce would need a buffer for partial sums that their
/// non-root ranks do not pass; all-to-all moves the same bytes either way) are flat.
///
/// ```
/// use ringccl::internals::plan::net::{hierarchical, Machines};
/// use ringccl::CollectiveKind;
/// let m = Machines::new(&[1, 1, 2, 2]);
/// // Broadcast from rank 0: rank 3 (index 1 on machine 1) hears from rank 2, its machine's
/// // rank of the root's index, not from the root.
/// let g = hierarchical((CollectiveKind::Broadcast, 100, 0), 3, &m, 4, false).expect("applies");
/// assert_eq!(g.len(), 1);
/// assert_eq!(g[0].ops[0].peer, 2);
/// ```
pub fn hierarchical(
    (kind, count, root): (Kind, usize, usize),
    me: usize,
    machines: &Machines,
    size: usize,
    in_place: bool,
) -> Option<Vec<NetGroup>> {
    machines.per_machine()?;
    let (m, i) = machines.place(me)?;
    let b = |elems: usize| elems.saturating_mul(size);
    let here = &machines.ranks[m];
    let mut out = Vec::new();
    match kind {
        Kind::AllReduce => return hierarchical_all_reduce(me, machines, count, size, in_place),
        Kind::AllGather => {
            let c = count;
            let across: Vec<usize> = machines.ranks.iter().map(|rs| rs[i]).collect();
            let mut first = Vec::new();
            if !in_place {
                first.extend(local(me, b(c), At::Send(0), At::Recv(b(me * c))));
            }
            for &q in across.iter().filter(|&&q| q != me) {
                first.push(send(q, b(c), At::Send(0)));
                first.push(recv(q, b(c), At::Recv(b(q * c))));
            }
            out.push(NetGroup::copies(first));
            let mut inside = Vec::new();
            for (j, &q) in here.iter().enumerate() {
                if j == i {
                    continue;
                }
                for rs in &machines.ranks {
                    let (mine, theirs) = (rs[i], rs[j]);
                    inside.push(send(q, b(c), At::Recv(b(mine * c))));
                    inside.push(recv(q, b(c), At::Recv(b(theirs * c))));
                }
            }
            out.push(NetGroup::copies(inside));
        }
        Kind::Broadcast => {
            let (rm, ri) = machines.place(root)?;
            let leader = here[ri];
            let mut ops = Vec::new();
            if me == root {
                if !in_place {
                    ops.extend(local(me, b(count), At::Send(0), At::Recv(0)));
                }
                ops.extend(here.iter().filter(|&&q| q != me).map(|&q| send(q, b(count), At::Send(0))));
                ops.extend(
                    (0..machines.ranks.len())
                        .filter(|&o| o != rm)
                        .map(|o| send(machines.ranks[o][ri], b(count), At::Send(0))),
                );
                out.push(NetGroup::copies(ops));
            } else if me == leader {
                // A machine's rank of the root's index: hears from the root, then forwards.
                out.push(NetGroup::copies(vec![recv(root, b(count), At::Recv(0))]));
                out.push(NetGroup::copies(
                    here.iter().filter(|&&q| q != me).map(|&q| send(q, b(count), At::Recv(0))).collect(),
                ));
            } else {
                out.push(NetGroup::copies(vec![recv(leader, b(count), At::Recv(0))]));
            }
        }
        _ => return None,
    }
    out.retain(|g| g.ops.iter().any(|o| o.bytes > 0));
    Some(out)
}

/// The input copied to the output, whole.
fn local_copy(me: usize, bytes: usize) -> Vec<NetOp> {
    local(me, bytes, At::Send(0), At::Recv(0)).to_vec()
}

/// Splits `g` into the part of its transfers with ranks of this machine (and local copies) and
/// the part with ranks that `remote(peer)` says are on other machines: the executor runs the
/// first over CUDA IPC, then the second over the network. Each part keeps the group's
/// combination. Every rank splits its groups the same way, so each pair still meets in the
/// same part of the same group, and the parts of a group run in the same order everywhere.
///
/// ```
/// use ringccl::internals::plan::net::{groups, split};
/// use ringccl::CollectiveKind;
/// // All-gather on rank 0 of 4, where ranks 2 and 3 are on another machine.
/// let g = &groups((CollectiveKind::AllGather, 8, 0), (0, 4), 4, false)[0];
/// let [near, far] = split(g, |q| q >= 2);
/// assert!(near.ops.iter().all(|o| o.peer < 2));
/// assert!(far.ops.iter().all(|o| o.peer >= 2));
/// assert_eq!(near.ops.len() + far.ops.len(), g.ops.len());
/// ```
pub fn split(g: &NetGroup, remote: impl Fn(usize) -> bool) -> [NetGroup; 2] {
    let part = |far: bool| NetGroup {
        ops: g.ops.iter().copied().filter(|o| remote(o.peer) == far).collect(),
        reduce: g.reduce,
        postdiv: g.postdiv,
    };
    [part(false), part(true)]
}

#[cfg(test)]
mod tests;
