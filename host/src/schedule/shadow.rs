//! Peer access through scratch only: the rewrite of a schedule for one process per GPU.
//!
//! The generators let a step read and write any rank's buffers. With one process per GPU, a
//! rank reaches a peer's memory only through the communication buffer that peer exported once
//! (its [`BufId::Scratch`]); the caller's [`BufId::Send`] and [`BufId::Recv`] buffers of a rank
//! are reachable by that rank alone. [`through_scratch`] rewrites a finished schedule so that no
//! step touches another rank's memory outside its scratch, with the same effect on every rank's
//! send and receive buffers.
//!
//! # What is shadowed
//!
//! Every element interval of a rank `q`'s send or receive buffer that some step *running on
//! another rank* touches gets a **shadow**: the same number of elements in `q`'s scratch, placed
//! after the schedule's own scratch (so `scratch_len` grows by the largest total any rank
//! needs). Intervals are merged where they overlap or touch. Every access to a shadowed
//! element, by any rank (`q` included), is rewritten to the shadow, so the shadow is the one
//! copy of the truth during the call. Only what peers touch is shadowed: what only `q` itself
//! reads or writes stays where it is. A step whose regions straddle a shadow's boundary is
//! split there (each piece is the same primitive on fewer elements).
//!
//! # Publish and collect
//!
//! Two kinds of local copy steps run on `q` (its own buffers to its own scratch):
//! * **publish** (real → shadow), before the first step that *reads* an element whose
//!   first access in the schedule is a read: the element's initial contents matter (an input,
//!   or an in-place receive buffer that holds input). Elements written before they are read
//!   are not published.
//! * **collect** (shadow → real), after the *last write* of a written element, so the
//!   caller sees the result (a receive buffer; or the send buffer where an in-place layout made
//!   it the canonical output, as in an in-place reduce-scatter). Elements never written are not
//!   collected.
//!
//! Both are chunked like the steps that need them: one publish per first-reading step (for the
//! elements it reads first), one collect per last-writing step. They are placed so that the
//! rewrite adds no wait between the original steps: a publish goes on the owner's stream right
//! after the owner's latest step that every step accessing those elements already waits for
//! (at the start of the call when there is none), and a collect right before the owner's first
//! step that already waits for the last writer (at the end when there is none; right after
//! the write when the owner wrote it). So the original pipeline is kept: in a 2-rank
//! all-reduce each rank first publishes the chunks its peer reads, and both ranks still reduce side
//! by side, each waiting only for the peer's publish of the chunk it reads.
//!
//! # What it costs
//!
//! Extra local copies per rank, for an all-reduce of `N` bytes over `n` ranks (ring schedule):
//!
//! | | shadow (scratch) | published | collected |
//! | --- | --- | --- | --- |
//! | `n = 2`, out of place | `N` (half send, half recv) | `N / 2` | `N / 2` |
//! | `n = 2`, in place | `N / 2` | `N / 2` | `N / 2` |
//! | `n ≥ 3`, out of place | `N + N / n` | `N / n` (the segment the successor reads) | `N` |
//! | `n ≥ 3`, in place | `N` | `N` | `N` |
//!
//! For `n ≥ 3` the whole receive buffer is shadowed because the successor pulls partial sums
//! and results from it; the send buffer only for the one segment the successor reads first.
//! The ring itself moves `2 (n − 1) / n · N` bytes per rank over the links; the rewrite adds
//! `(1 + 1/n) · N` bytes (out of place) or `2 N` (in place) of copies inside each GPU's own
//! memory: cheaper per byte than the links, but not free.
//!
//! The other collectives, per rank, with `c` the per-rank block (`count`, `sendcount`,
//! `recvcount` or `count_per_peer`, in bytes), both layouts, `n ≥ 2`:
//!
//! | collective | published | collected |
//! | --- | --- | --- |
//! | reduce-scatter | `c` (the block its successor reads first) | none |
//! | all-gather | `c` (its own block) | `(n − 2) · c` (the blocks it relays) |
//! | broadcast | root: `c` | the `n − 2` relaying ranks: `c` |
//! | reduce | the rank after the root: `c` | none (partials are in scratch already) |
//! | all-to-all, out of place | `(n − 1) · c` | none |
//! | gather | each non-root: `c` | none |
//! | scatter | root: `(n − 1) · c` | none |
//! | send/recv, out of place | each sender: what it sends | none |
//!
//! All-to-all and send/recv in any other layout already stage through scratch and come back
//! unchanged. A later zero-copy path, where the caller's buffers are registered with the
//! communicator and exported to the peers, does not need this rewrite and skips all of these
//! copies.
//!
//! ```
//! use ringccl::internals::schedule::{all_reduce, peer_private_access, through_scratch, Layout};
//! let s = all_reduce(&[0, 1, 2, 3], 1000, Layout::OutOfPlace, 64);
//! assert!(peer_private_access(&s).is_some());
//! let t = through_scratch(&s).unwrap();
//! assert_eq!(peer_private_access(&t), None);
//! assert_eq!(t.scratch_len, s.scratch_len + 1000 + 250);
//! t.validate().unwrap();
//! ```

use super::{BufId, Layout, Region, Schedule, ScheduleError, Step};
use std::collections::{BTreeMap, HashMap};

/// The first step (index) that touches a region of another rank outside its scratch, if any:
/// `None` means the schedule runs with peers reaching each other through scratch alone.
///
/// Empty regions touch nothing and are ignored.
///
/// ```
/// use ringccl::internals::schedule::{all_gather, peer_private_access, Layout};
/// // Rank 1 copies rank 0's send buffer first thing.
/// let s = all_gather(&[0, 1], 4, Layout::OutOfPlace, 4);
/// let j = peer_private_access(&s).unwrap();
/// assert_ne!(s.steps[j].exec, 0);
/// assert_eq!(peer_private_access(&all_gather(&[0], 4, Layout::OutOfPlace, 4)), None);
/// ```
pub fn peer_private_access(s: &Schedule) -> Option<usize> {
    s.steps.iter().position(|st| {
        st.srcs
            .iter()
            .chain(&st.dsts)
            .any(|r| r.rank != st.exec && r.buf != BufId::Scratch && r.len > 0)
    })
}

/// Rewrites the finished schedule `s` so that no step touches another rank's memory outside
/// its scratch: each interval of a send or receive buffer that a peer touches is shadowed in
/// its owner's scratch, published there before its first read and collected after its last
/// write (see the [module docs](self)). The result is finished (dependencies and waits
/// re-derived), passes [`Schedule::validate`], and has the same effect on every rank's send
/// and receive buffers; its `scratch_len` includes the shadows.
///
/// A schedule in which no step touches a peer's send or receive buffer (one rank, no steps,
/// or peers already meeting in scratch) comes back unchanged. `s` must be finished (regions
/// canonical, as [`Schedule::finish`] leaves them); its order of steps is the program.
///
/// # Errors
///
/// What [`Schedule::validate`] finds in `s`; or [`ScheduleError::BadStep`] (step `usize::MAX`)
/// when the shadows would not fit in the address space.
///
/// ```
/// use ringccl::internals::schedule::{all_reduce, through_scratch, BufId, Layout};
/// let s = all_reduce(&[0, 1], 8, Layout::OutOfPlace, 8);
/// let t = through_scratch(&s).unwrap();
/// // Each rank shadows the half of its send its peer reads (4) and the half of its recv its
/// // peer writes (4); it publishes the one and collects the other.
/// assert_eq!(t.scratch_len, s.scratch_len + 8);
/// assert_eq!(t.steps.len(), s.steps.len() + 2 + 2);
/// assert!(t.steps.iter().all(|st| {
///     st.srcs.iter().chain(&st.dsts).all(|r| r.rank == st.exec || r.buf == BufId::Scratch)
/// }));
/// ```
pub fn through_scratch(s: &Schedule) -> Result<Schedule, ScheduleError> {
    s.validate()?;
    let Some(shadows) = Shadows::of(s)? else {
        return Ok(s.clone());
    };
    // The steps cut at shadow edges, with the original step each piece comes from.
    let mut pieces: Vec<(usize, Step)> = Vec::with_capacity(s.steps.len());
    for (j, st) in s.steps.iter().enumerate() {
        pieces.extend(shadows.split(st).into_iter().map(|p| (j, p)));
    }
    let mut last_piece = vec![0; s.steps.len()];
    let mut first_piece = vec![usize::MAX; s.steps.len()];
    for (i, &(j, _)) in pieces.iter().enumerate() {
        last_piece[j] = i;
        first_piece[j] = first_piece[j].min(i);
    }
    let order = Order::of(s);
    // Where the copies go: at the start, before or after a piece, at the end.
    let mut head = Vec::new();
    let mut before: Vec<Vec<Step>> = vec![Vec::new(); pieces.len()];
    let mut after: Vec<Vec<Step>> = vec![Vec::new(); pieces.len()];
    let mut tail = Vec::new();

    // Publishes: the shadowed elements a piece reads that nothing accessed earlier, on the
    // owner's stream right after the owner's latest step that every step accessing them
    // already waits for (so no access waits for more of the owner than before).
    let mut waited: HashMap<(usize, BufId), MinMap> = HashMap::new();
    for (j, st) in &pieces {
        for r in st.srcs.iter().chain(&st.dsts) {
            if shadows.map(r).is_some() {
                let m = waited.entry((r.rank, r.buf)).or_default();
                m.record(r.offset, r.end(), order.clock[*j][r.rank]);
            }
        }
    }
    let mut seen: HashMap<(usize, BufId), Intervals> = HashMap::new();
    for (_, st) in &pieces {
        let reads = st.srcs.iter().map(|r| (r, true));
        for (r, read) in reads.chain(st.dsts.iter().map(|r| (r, false))) {
            let Some(sh) = shadows.map(r) else { continue };
            let done = seen.entry((r.rank, r.buf)).or_default();
            if read {
                for (a, b) in done.gaps(r.offset, r.end()) {
                    // 1 + the owner's latest step that every access already waits for.
                    let owner = waited.get(&(r.rank, r.buf)).and_then(|m| m.min(a, b));
                    let slot = match owner.and_then(|h| h.checked_sub(1)) {
                        Some(h) => &mut after[last_piece[h]],
                        None => &mut head,
                    };
                    slot.push(Step::copy(r.rank, sub(r, a, b), sub_at(&sh, r, a, b)));
                }
            }
            done.insert(r.offset, r.end());
        }
    }
    // Collects: the shadowed elements a piece writes that nothing writes later, on the owner's
    // stream right before the owner's first step that waits for the writer anyway.
    let mut later: HashMap<(usize, BufId), Intervals> = HashMap::new();
    for (i, (j, st)) in pieces.iter().enumerate().rev() {
        for r in &st.dsts {
            let Some(sh) = shadows.map(r) else { continue };
            let done = later.entry((r.rank, r.buf)).or_default();
            let slot = if st.exec == r.rank {
                &mut after[i]
            } else {
                match order.first_after(*j, st.exec, r.rank) {
                    Some(k) => &mut before[first_piece[k]],
                    None => &mut tail,
                }
            };
            for (a, b) in done.gaps(r.offset, r.end()) {
                slot.push(Step::copy(r.rank, sub_at(&sh, r, a, b), sub(r, a, b)));
            }
            done.insert(r.offset, r.end());
        }
    }

    let mut out = Schedule::new(s.nranks);
    out.scratch_len = shadows.scratch_len;
    out.steps.extend(head);
    for (((_, mut st), pre), post) in pieces.into_iter().zip(before).zip(after) {
        out.steps.extend(pre);
        for r in st.srcs.iter_mut().chain(st.dsts.iter_mut()) {
            if let Some(sh) = shadows.map(r) {
                *r = sh;
            }
        }
        out.steps.push(st);
        out.steps.extend(post);
    }
    out.steps.extend(tail);
    // The regions are canonical already: finishing out of place only derives the waits.
    let out = out.finish(Layout::OutOfPlace);
    out.validate()?;
    Ok(out)
}

/// What the original schedule orders: for each step, the latest step of every rank that
/// completes before it starts (its stream predecessors and, transitively, its `deps`).
struct Order {
    /// `clock[j][q]` = 1 + the latest step of rank `q` complete when step `j` starts (0: none).
    clock: Vec<Vec<usize>>,
    /// Each rank's steps, in stream order.
    stream: Vec<Vec<usize>>,
}

impl Order {
    /// The order of the validated schedule `s`.
    fn of(s: &Schedule) -> Order {
        let n = s.nranks;
        let mut clock: Vec<Vec<usize>> = Vec::with_capacity(s.steps.len());
        let mut stream: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (j, st) in s.steps.iter().enumerate() {
            let mut c = match stream[st.exec].last() {
                Some(&prev) => {
                    let mut c = clock[prev].clone();
                    c[st.exec] = prev + 1;
                    c
                }
                None => vec![0; n],
            };
            for &d in &st.deps {
                for (x, &y) in c.iter_mut().zip(&clock[d]) {
                    *x = (*x).max(y);
                }
                let e = s.steps[d].exec;
                c[e] = c[e].max(d + 1);
            }
            clock.push(c);
            stream[st.exec].push(j);
        }
        Order { clock, stream }
    }

    /// The first step of rank `q` that starts after step `j`, run by rank `p`, completes.
    fn first_after(&self, j: usize, p: usize, q: usize) -> Option<usize> {
        let steps = &self.stream[q];
        // Along a stream, indices and clocks only grow: the predicate is false, then true.
        let at = steps.partition_point(|&k| k <= j || self.clock[k][p] <= j);
        steps.get(at).copied()
    }
}

/// `[a, b)` of region `r` (same rank and buffer).
fn sub(r: &Region, a: usize, b: usize) -> Region {
    Region::new(r.rank, r.buf, a, b - a)
}

/// The part of shadow `sh` (of region `r`) that holds `[a, b)` of `r`.
fn sub_at(sh: &Region, r: &Region, a: usize, b: usize) -> Region {
    Region::new(sh.rank, sh.buf, sh.offset + (a - r.offset), b - a)
}

/// Where each shadowed interval lives: per (rank, buffer), start → (end, scratch offset).
struct Shadows {
    at: HashMap<(usize, BufId), BTreeMap<usize, (usize, usize)>>,
    /// The schedule's scratch plus the largest total of shadows on one rank.
    scratch_len: usize,
}

impl Shadows {
    /// The shadows `s` needs (`None`: no peer touches a send or receive buffer).
    fn of(s: &Schedule) -> Result<Option<Shadows>, ScheduleError> {
        let overflow = ScheduleError::BadStep {
            step: usize::MAX,
            reason: "the shadows do not fit in the address space",
        };
        let mut cross: HashMap<(usize, BufId), Intervals> = HashMap::new();
        // Shadows go after every scratch element the schedule uses, even past `scratch_len`.
        let mut base = s.scratch_len;
        for st in &s.steps {
            for r in st.srcs.iter().chain(&st.dsts) {
                if r.buf == BufId::Scratch {
                    base = base.max(r.end());
                } else if r.rank != st.exec && r.len > 0 {
                    cross
                        .entry((r.rank, r.buf))
                        .or_default()
                        .insert(r.offset, r.end());
                }
            }
        }
        if cross.is_empty() {
            return Ok(None);
        }
        let mut at = HashMap::new();
        let mut scratch_len = base;
        for q in 0..s.nranks {
            let mut next = base;
            for buf in [BufId::Send, BufId::Recv] {
                let Some(iv) = cross.get(&(q, buf)) else {
                    continue;
                };
                let mut m = BTreeMap::new();
                for (&a, &b) in &iv.m {
                    m.insert(a, (b, next));
                    next = next.checked_add(b - a).ok_or(overflow.clone())?;
                }
                at.insert((q, buf), m);
            }
            scratch_len = scratch_len.max(next);
        }
        Ok(Some(Shadows { at, scratch_len }))
    }

    /// The shadow of `r`, if `r` lies in a shadowed interval (after [`Shadows::split`], a
    /// non-empty region lies in one or in none).
    fn map(&self, r: &Region) -> Option<Region> {
        if r.len == 0 {
            return None;
        }
        let m = self.at.get(&(r.rank, r.buf))?;
        let (&a, &(b, at)) = m.range(..=r.offset).next_back()?;
        (r.offset < b && r.end() <= b).then(|| Region::new(r.rank, BufId::Scratch, at + (r.offset - a), r.len))
    }

    /// `st` cut where any of its regions crosses a shadow's boundary, so each piece's regions
    /// lie inside one shadow or outside all.
    fn split(&self, st: &Step) -> Vec<Step> {
        let len = st.len();
        let mut cuts = vec![0, len];
        for r in st.srcs.iter().chain(&st.dsts) {
            let Some(m) = self.at.get(&(r.rank, r.buf)) else {
                continue;
            };
            for (&a, &(b, _)) in m.range(..r.end()).rev() {
                if b <= r.offset {
                    break;
                }
                for x in [a, b] {
                    if x > r.offset && x < r.end() {
                        cuts.push(x - r.offset);
                    }
                }
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        if cuts.len() <= 2 {
            return vec![st.clone()];
        }
        cuts.windows(2)
            .map(|w| {
                let piece = |r: &Region| Region::new(r.rank, r.buf, r.offset + w[0], w[1] - w[0]);
                Step {
                    srcs: st.srcs.iter().map(piece).collect(),
                    dsts: st.dsts.iter().map(piece).collect(),
                    deps: Vec::new(),
                    ..st.clone()
                }
            })
            .collect()
    }
}

/// A set of elements as disjoint, non-adjacent intervals: start → end.
#[derive(Default, Debug)]
struct Intervals {
    m: BTreeMap<usize, usize>,
}

impl Intervals {
    /// Adds `[a, b)`, merging what it overlaps or touches.
    fn insert(&mut self, mut a: usize, mut b: usize) {
        if a >= b {
            return;
        }
        let touching: Vec<(usize, usize)> = self
            .m
            .range(..=b)
            .rev()
            .take_while(|&(_, &e)| e >= a)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.m.remove(&s);
            a = a.min(s);
            b = b.max(e);
        }
        self.m.insert(a, b);
    }

    /// The parts of `[a, b)` not in the set, in order.
    fn gaps(&self, a: usize, b: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut cursor = a;
        let first = self
            .m
            .range(..=a)
            .next_back()
            .map_or(a, |(&s, _)| s);
        for (&s, &e) in self.m.range(first..b) {
            if s > cursor {
                out.push((cursor, s));
            }
            cursor = cursor.max(e);
            if cursor >= b {
                break;
            }
        }
        if cursor < b {
            out.push((cursor, b));
        }
        out
    }
}

/// For each element range, the smallest value recorded over it: start → (end, value).
#[derive(Default, Debug)]
struct MinMap {
    m: BTreeMap<usize, (usize, usize)>,
}

impl MinMap {
    fn split(&mut self, at: usize) {
        if let Some((_, v)) = self.m.range_mut(..at).next_back() {
            if v.0 > at {
                let tail = *v;
                v.0 = at;
                self.m.insert(at, tail);
            }
        }
    }

    /// Records `x` over `[a, b)`.
    fn record(&mut self, a: usize, b: usize, x: usize) {
        if a >= b {
            return;
        }
        self.split(a);
        self.split(b);
        let inside: Vec<(usize, usize)> = self.m.range(a..b).map(|(&k, &(e, _))| (k, e)).collect();
        let mut cursor = a;
        for (k, e) in inside {
            if k > cursor {
                self.m.insert(cursor, (k, x));
            }
            if let Some(v) = self.m.get_mut(&k) {
                v.1 = v.1.min(x);
            }
            cursor = e;
        }
        if cursor < b {
            self.m.insert(cursor, (b, x));
        }
    }

    /// The smallest value recorded over any element of `[a, b)`.
    fn min(&self, a: usize, b: usize) -> Option<usize> {
        let from = self.m.range(..=a).next_back().map_or(a, |(&k, _)| k);
        self.m
            .range(from..b)
            .filter(|(_, &(e, _))| e > a)
            .map(|(_, &(_, x))| x)
            .min()
    }
}

#[cfg(test)]
mod tests;
