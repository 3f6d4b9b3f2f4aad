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
//! * **publish** (real → shadow), just before the first step that *reads* an element whose
//!   first access in the schedule is a read: the element's initial contents matter (an input,
//!   or an in-place receive buffer that holds input). Elements written before they are read
//!   are not published.
//! * **collect** (shadow → real), just after the *last write* of a written element, so the
//!   caller sees the result (a receive buffer; or the send buffer where an in-place layout made
//!   it the canonical output, as in an in-place reduce-scatter). Elements never written are not
//!   collected.
//!
//! Both are chunked like the steps that need them: one publish per first-reading step (for the
//! elements it reads first), one collect per last-writing step, so the pipeline of the original
//! schedule is kept (the first chunk's publish does not wait for the whole buffer).
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
//! These copies are device-local (a fraction of the ring's traffic over the links, but not
//! free). A later zero-copy path, where the caller's buffers are registered with the
//! communicator and exported to the peers, does not need this rewrite and skips them.
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
    let pieces: Vec<Step> = s.steps.iter().flat_map(|st| shadows.split(st)).collect();

    // Publishes: before a piece, the shadowed elements it reads that nothing accessed earlier.
    let mut before: Vec<Vec<Step>> = vec![Vec::new(); pieces.len()];
    let mut seen: HashMap<(usize, BufId), Intervals> = HashMap::new();
    for (i, st) in pieces.iter().enumerate() {
        for (r, read) in st
            .srcs
            .iter()
            .map(|r| (r, true))
            .chain(st.dsts.iter().map(|r| (r, false)))
        {
            let Some(sh) = shadows.map(r) else { continue };
            let done = seen.entry((r.rank, r.buf)).or_default();
            if read {
                for (a, b) in done.gaps(r.offset, r.end()) {
                    let (real, shadow) = (sub(r, a, b), sub_at(&sh, r, a, b));
                    before[i].push(Step::copy(r.rank, real, shadow));
                }
            }
            done.insert(r.offset, r.end());
        }
    }
    // Collects: after a piece, the shadowed elements it writes that nothing writes later.
    let mut after: Vec<Vec<Step>> = vec![Vec::new(); pieces.len()];
    let mut later: HashMap<(usize, BufId), Intervals> = HashMap::new();
    for (i, st) in pieces.iter().enumerate().rev() {
        for r in &st.dsts {
            let Some(sh) = shadows.map(r) else { continue };
            let done = later.entry((r.rank, r.buf)).or_default();
            for (a, b) in done.gaps(r.offset, r.end()) {
                let (real, shadow) = (sub(r, a, b), sub_at(&sh, r, a, b));
                after[i].push(Step::copy(r.rank, shadow, real));
            }
            done.insert(r.offset, r.end());
        }
    }

    let mut out = Schedule::new(s.nranks);
    out.scratch_len = shadows.scratch_len;
    for ((mut st, pre), post) in pieces.into_iter().zip(before).zip(after) {
        out.steps.extend(pre);
        for r in st.srcs.iter_mut().chain(st.dsts.iter_mut()) {
            if let Some(sh) = shadows.map(r) {
                *r = sh;
            }
        }
        out.steps.push(st);
        out.steps.extend(post);
    }
    // The regions are canonical already: finishing out of place only derives the waits.
    let out = out.finish(Layout::OutOfPlace);
    out.validate()?;
    Ok(out)
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

#[cfg(test)]
mod tests;
