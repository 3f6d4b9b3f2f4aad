//! Ring schedules as pure data: which rank reads, reduces and writes which elements at which step.
//!
//! A [`Schedule`] is a list of [`Step`]s in an order that is safe to issue from the host (every
//! step comes after the steps it depends on). Each step is one primitive (copy, reduce or
//! reduce-copy, chosen from the number of sources and destinations) executed by the GPU of rank
//! `exec`, on that rank's stream. Sources and destinations are [`Region`]s of any rank's
//! buffers: a region on another rank is read or written directly over NVLink (peer access).
//!
//! Dependencies are derived, not written by hand: [`Schedule::finish`] compares the regions of
//! every pair of steps (read-after-write, write-after-read, write-after-write) and keeps, for each
//! step, the latest conflicting step of each *other* rank; steps of the same rank are ordered by
//! their stream. The executor turns those into event waits; the CPU simulator
//! ([`crate::sim`]) runs the same list on host arrays.
//!
//! Buffers are named per rank ([`BufId`]); in-place calls are described by [`Layout`], which
//! maps the send buffer onto the receive buffer, so aliasing is visible to the dependency pass.
//!
//! The generators ([`all_reduce`], [`reduce_scatter`], [`all_gather`], [`broadcast`],
//! [`reduce`], [`all_to_all`], [`gather`], [`scatter`], [`send_recv`]) follow the pull model: a
//! step runs on the rank that owns its destination and reads its peers' buffers directly. Each
//! splits its data into chunks of at most `chunk` elements and issues them chunk-major, so
//! consecutive ranks work on consecutive chunks at the same time (a pipeline).
//!
//! ```
//! use ringccl::internals::schedule::{all_reduce, Layout};
//! let s = all_reduce(&[0, 1, 2, 3], 1000, Layout::OutOfPlace, 1 << 20);
//! // Ring all-reduce: per segment, 3 reduce-copy steps then 3 copy steps.
//! assert_eq!(s.steps.len(), 4 * (3 + 3));
//! assert!(s.steps.iter().enumerate().all(|(j, st)| st.deps.iter().all(|&d| d < j)));
//! ```

mod ring;
mod shadow;

pub use ring::*;
pub use shadow::{peer_private_access, through_scratch};

use std::collections::{BTreeMap, HashMap};

/// A rank's buffers a step can touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufId {
    /// The caller's input.
    Send,
    /// The caller's output.
    Recv,
    /// The communicator's scratch space on that rank (for partial results).
    Scratch,
}

/// `len` elements at element `offset` of buffer `buf` on rank `rank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// Owner of the memory.
    pub rank: usize,
    /// Which of its buffers.
    pub buf: BufId,
    /// First element.
    pub offset: usize,
    /// Number of elements (equal across one step's regions).
    pub len: usize,
}

/// One primitive on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The rank whose GPU and stream run it.
    pub exec: usize,
    /// 1 source: copy; 2 sources: reduce-copy; 3 to `gpu_kernels::prim::MAX_SRCS` sources: reduce
    /// (one destination).
    pub srcs: Vec<Region>,
    /// 1 or 2 destinations.
    pub dsts: Vec<Region>,
    /// Apply the operator's final step (avg's division by the rank count) to what is written.
    pub finish: bool,
    /// Indices of earlier steps on other ranks that must complete first (filled by
    /// [`Schedule::finish`]: at most one per other rank, the latest).
    pub deps: Vec<usize>,
}

/// How the send buffers relate to the receive buffers (NCCL's in-place conventions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Send and receive are distinct, non-overlapping buffers.
    OutOfPlace,
    /// The send buffer of every rank is the receive buffer starting at element
    /// `send_offset(rank)` = `rank * stride` (all-reduce, broadcast, reduce: stride 0;
    /// all-gather: stride = send count; reduce-scatter: the receive buffer lies in the send
    /// buffer, see [`Layout::RecvInSend`]).
    SendInRecv {
        /// Elements between consecutive ranks' send offsets.
        stride: usize,
    },
    /// The receive buffer of every rank is the send buffer starting at `rank * stride`
    /// (in-place reduce-scatter: recvbuff = sendbuff + rank * recvcount).
    RecvInSend {
        /// Elements between consecutive ranks' receive offsets.
        stride: usize,
    },
}

/// A complete collective as a list of steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Number of ranks.
    pub nranks: usize,
    /// The steps, in a safe issue order.
    pub steps: Vec<Step>,
    /// Scratch elements each rank needs (0 if none).
    pub scratch_len: usize,
    /// For each rank `r`, the ranks (other than `r`) that must have reached this call on their
    /// streams before any step touches their memory from `r`: filled by [`Schedule::finish`].
    pub start_waits: Vec<Vec<usize>>,
    /// For each rank `r`, the last step of each other rank that touched `r`'s memory; `r`'s
    /// stream waits for them at the end, so the call is complete on `r`'s stream when it is
    /// complete everywhere `r`'s buffers are concerned. Filled by [`Schedule::finish`].
    pub end_waits: Vec<Vec<usize>>,
}

/// Why a schedule cannot be executed (what [`Schedule::validate`] finds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduleError {
    /// The start or end wait lists do not have one entry per rank.
    RankCount {
        /// The schedule's rank count.
        expected: usize,
        /// What was found.
        found: usize,
    },
    /// A step is not a primitive the kernels implement, or its regions are inconsistent
    /// (`step` is `usize::MAX` for a bad start wait).
    BadStep {
        /// Step index.
        step: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A dependency that is not an earlier step of another rank, or an end wait that is not a
    /// step (`step` is `usize::MAX` for an end wait).
    BadDep {
        /// Step index.
        step: usize,
        /// The dependency.
        dep: usize,
    },
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleError::RankCount { expected, found } => {
                write!(f, "expected {expected} ranks' wait lists, found {found}")
            }
            ScheduleError::BadStep { step, reason } => write!(f, "step {step}: {reason}"),
            ScheduleError::BadDep { step, dep } => write!(
                f,
                "step {step}: dependency {dep} is not an earlier step of another rank"
            ),
        }
    }
}

impl std::error::Error for ScheduleError {}

impl Schedule {
    /// Checks that every step is a primitive the kernels implement (1 to `MAX_SRCS` sources, 1
    /// or 2 destinations, one destination for 3 or more sources, no final step on a copy),
    /// over regions of existing ranks with equal lengths, destinations that overlap no source
    /// (except exactly) and no other destination, dependencies on earlier steps of other ranks,
    /// and wait lists over existing ranks and steps. The one check of a schedule: the executor
    /// and the simulator both run it, so executing a valid schedule cannot index out of range.
    /// (Whether regions fit their buffers depends on the buffers: the caller checks that.)
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let n = self.nranks;
        for found in [self.start_waits.len(), self.end_waits.len()] {
            if found != n {
                return Err(ScheduleError::RankCount { expected: n, found });
            }
        }
        for (j, st) in self.steps.iter().enumerate() {
            let bad = |reason| Err(ScheduleError::BadStep { step: j, reason });
            if st.exec >= n {
                return bad("executing rank out of range");
            }
            if st.srcs.is_empty() || st.srcs.len() > gpu_kernels::prim::MAX_SRCS {
                return bad("a step reads 1 to MAX_SRCS sources");
            }
            if st.dsts.is_empty() || st.dsts.len() > 2 || (st.srcs.len() > 2 && st.dsts.len() > 1)
            {
                return bad("a step writes 1 or 2 destinations (1 for a reduce of 3+ sources)");
            }
            if st.srcs.len() == 1 && st.finish && n > 1 {
                return bad("a copy cannot apply the operator's final step");
            }
            let len = st.dsts[0].len;
            for r in st.srcs.iter().chain(&st.dsts) {
                if r.rank >= n {
                    return bad("region on a rank out of range");
                }
                if r.len != len {
                    return bad("regions of one step differ in length");
                }
                if r.offset.checked_add(r.len).is_none() {
                    return bad("region past the end of the address space");
                }
            }
            for (i, d) in st.dsts.iter().enumerate() {
                if st.srcs.iter().any(|src| src != d && src.overlaps(d)) {
                    return bad("a destination partially overlaps a source");
                }
                if st.dsts[..i].iter().any(|e| e.overlaps(d)) {
                    return bad("the destinations overlap");
                }
            }
            for &d in &st.deps {
                if d >= j || self.steps[d].exec == st.exec {
                    return Err(ScheduleError::BadDep { step: j, dep: d });
                }
            }
        }
        for (r, w) in self.start_waits.iter().enumerate() {
            if w.iter().any(|&q| q >= n || q == r) {
                return Err(ScheduleError::BadStep {
                    step: usize::MAX,
                    reason: "start wait on an invalid rank",
                });
            }
        }
        for w in &self.end_waits {
            if let Some(&d) = w.iter().find(|&&d| d >= self.steps.len()) {
                return Err(ScheduleError::BadDep {
                    step: usize::MAX,
                    dep: d,
                });
            }
        }
        Ok(())
    }
}

impl Region {
    /// `len` elements at `offset` of `rank`'s buffer `buf`.
    ///
    /// ```
    /// use ringccl::internals::schedule::{BufId, Region};
    /// let r = Region::new(1, BufId::Recv, 8, 4);
    /// assert_eq!(r.end(), 12);
    /// ```
    pub const fn new(rank: usize, buf: BufId, offset: usize, len: usize) -> Self {
        Region {
            rank,
            buf,
            offset,
            len,
        }
    }

    /// One past the last element (saturating, so absurd regions never overflow).
    pub const fn end(&self) -> usize {
        self.offset.saturating_add(self.len)
    }

    /// Whether the two regions share at least one element of the same buffer of the same rank.
    ///
    /// ```
    /// use ringccl::internals::schedule::{BufId, Region};
    /// let a = Region::new(0, BufId::Send, 0, 4);
    /// assert!(a.overlaps(&Region::new(0, BufId::Send, 3, 4)));
    /// assert!(!a.overlaps(&Region::new(0, BufId::Send, 4, 4)));
    /// assert!(!a.overlaps(&Region::new(1, BufId::Send, 0, 4)));
    /// ```
    pub fn overlaps(&self, other: &Region) -> bool {
        self.rank == other.rank
            && self.buf == other.buf
            && self.len > 0
            && other.len > 0
            && self.offset < other.end()
            && other.offset < self.end()
    }

    /// This region as seen through `layout`: an aliased send (or receive) buffer becomes the
    /// canonical one. With `only = Some(r)`, only rank `r`'s buffers are aliased (rooted
    /// collectives, where the in-place convention concerns the root alone).
    fn canonical(self, layout: Layout, only: Option<usize>) -> Region {
        if only.is_some_and(|o| o != self.rank) {
            return self;
        }
        let shift = |stride: usize| self.rank.saturating_mul(stride).saturating_add(self.offset);
        match layout {
            Layout::SendInRecv { stride } if self.buf == BufId::Send => Region {
                buf: BufId::Recv,
                offset: shift(stride),
                ..self
            },
            Layout::RecvInSend { stride } if self.buf == BufId::Recv => Region {
                buf: BufId::Send,
                offset: shift(stride),
                ..self
            },
            _ => self,
        }
    }
}

impl Step {
    /// A copy: `dsts[..] = src`.
    ///
    /// ```
    /// use ringccl::internals::schedule::{BufId, Region, Step};
    /// let s = Step::copy(1, Region::new(0, BufId::Send, 0, 8), Region::new(1, BufId::Recv, 0, 8));
    /// assert_eq!((s.srcs.len(), s.dsts.len(), s.finish), (1, 1, false));
    /// ```
    pub fn copy(exec: usize, src: Region, dst: Region) -> Self {
        Step {
            exec,
            srcs: vec![src],
            dsts: vec![dst],
            finish: false,
            deps: Vec::new(),
        }
    }

    /// A reduction of `srcs` (folded in order) written to `dsts`, with the operator's final step
    /// applied when `finish`.
    ///
    /// ```
    /// use ringccl::internals::schedule::{BufId, Region, Step};
    /// let a = Region::new(0, BufId::Send, 0, 8);
    /// let b = Region::new(1, BufId::Send, 0, 8);
    /// let s = Step::reduce(0, vec![a, b], vec![Region::new(0, BufId::Recv, 0, 8)], true);
    /// assert!(s.finish && s.deps.is_empty());
    /// ```
    pub fn reduce(exec: usize, srcs: Vec<Region>, dsts: Vec<Region>, finish: bool) -> Self {
        Step {
            exec,
            srcs,
            dsts,
            finish,
            deps: Vec::new(),
        }
    }

    /// Elements each region of the step covers.
    ///
    /// ```
    /// use ringccl::internals::schedule::{BufId, Region, Step};
    /// let s = Step::copy(0, Region::new(1, BufId::Send, 0, 6), Region::new(0, BufId::Recv, 6, 6));
    /// assert_eq!(s.len(), 6);
    /// assert!(!s.is_empty());
    /// ```
    pub fn len(&self) -> usize {
        self.dsts.first().or(self.srcs.first()).map_or(0, |r| r.len)
    }

    /// Whether the step moves no element.
    pub fn is_empty(&self) -> bool {
        self.srcs.iter().chain(&self.dsts).all(|r| r.len == 0)
    }
}

impl Schedule {
    /// An empty schedule for `nranks` ranks.
    ///
    /// ```
    /// use ringccl::internals::schedule::{Layout, Schedule};
    /// let s = Schedule::new(4).finish(Layout::OutOfPlace);
    /// assert!(s.steps.is_empty() && s.start_waits.len() == 4);
    /// ```
    pub fn new(nranks: usize) -> Self {
        Schedule {
            nranks,
            steps: Vec::new(),
            scratch_len: 0,
            start_waits: vec![Vec::new(); nranks],
            end_waits: vec![Vec::new(); nranks],
        }
    }

    /// Appends a step (its `deps` are recomputed by [`Schedule::finish`]).
    ///
    /// ```
    /// use ringccl::internals::schedule::{BufId, Layout, Region, Schedule, Step};
    /// let mut s = Schedule::new(2);
    /// s.push(Step::copy(1, Region::new(0, BufId::Send, 0, 4), Region::new(1, BufId::Recv, 0, 4)));
    /// let s = s.finish(Layout::OutOfPlace);
    /// assert_eq!(s.start_waits, vec![vec![], vec![0]]);
    /// assert_eq!(s.end_waits, vec![vec![0], vec![]]);
    /// ```
    pub fn push(&mut self, step: Step) {
        self.steps.push(step);
    }

    /// The steps rank `rank` executes, with their indices, in stream order.
    ///
    /// ```
    /// use ringccl::internals::schedule::{broadcast, Layout};
    /// let s = broadcast(&[0, 1, 2], 8, 0, Layout::OutOfPlace, 4);
    /// assert_eq!(s.steps_of(0).count(), 2); // the root's send → recv copies
    /// assert!(s.steps_of(2).all(|(_, st)| st.srcs[0].rank == 1));
    /// ```
    #[cfg(any(test, feature = "internals"))]
    pub fn steps_of(&self, rank: usize) -> impl Iterator<Item = (usize, &Step)> + '_ {
        self.steps
            .iter()
            .enumerate()
            .filter(move |(_, s)| s.exec == rank)
    }

    /// Canonicalises aliased regions per `layout`, drops steps left with nothing to do (a copy
    /// onto itself), and derives `deps`, `start_waits` and `end_waits`.
    ///
    /// The step list is the program: its order defines the result. Two steps *conflict* when
    /// one writes elements the other reads or writes. For each step, the latest conflicting
    /// earlier step of every other rank becomes a dependency, minus those already implied by
    /// the step's other dependencies or by its own rank's earlier steps (stream order). So any
    /// execution that respects `deps` and per-rank order computes what the list order computes.
    ///
    /// ```
    /// use ringccl::internals::schedule::{BufId, Layout, Region, Schedule, Step};
    /// let mut s = Schedule::new(2);
    /// // rank 0 writes its recv; rank 1 then reads it.
    /// s.push(Step::copy(0, Region::new(0, BufId::Send, 0, 4), Region::new(0, BufId::Recv, 0, 4)));
    /// s.push(Step::copy(1, Region::new(0, BufId::Recv, 2, 2), Region::new(1, BufId::Recv, 0, 2)));
    /// let s = s.finish(Layout::OutOfPlace);
    /// assert_eq!(s.steps[1].deps, vec![0]);
    /// // In place, rank 0's copy is onto itself and disappears.
    /// let mut t = Schedule::new(1);
    /// t.push(Step::copy(0, Region::new(0, BufId::Send, 0, 4), Region::new(0, BufId::Recv, 0, 4)));
    /// assert!(t.finish(Layout::SendInRecv { stride: 0 }).steps.is_empty());
    /// ```
    pub fn finish(self, layout: Layout) -> Schedule {
        self.finish_for(layout, None)
    }

    /// [`Schedule::finish`], aliasing only rank `only`'s buffers when it is `Some`.
    fn finish_for(mut self, layout: Layout, only: Option<usize>) -> Schedule {
        let n = self.nranks;
        let steps = std::mem::take(&mut self.steps);
        for mut st in steps {
            for r in st.srcs.iter_mut().chain(st.dsts.iter_mut()) {
                *r = r.canonical(layout, only);
            }
            if st.srcs.len() == 1 && (!st.finish || n == 1) {
                let src = st.srcs[0];
                st.dsts.retain(|d| *d != src);
            }
            if st.dsts.is_empty() || st.is_empty() {
                continue;
            }
            st.deps.clear();
            self.steps.push(st);
        }
        self.derive();
        self
    }

    /// Derives `deps`, `start_waits` and `end_waits` from the (canonical) regions.
    fn derive(&mut self) {
        let n = self.nranks;
        // Per (memory rank, buffer): for each exec rank, the latest reads and writes of every
        // element range.
        let mut maps: HashMap<(usize, BufId), Vec<IntervalMap>> = HashMap::new();
        // Vector clocks: clock[j][q] = 1 + the latest step of rank q known complete when step
        // j starts (0: none).
        let mut clock: Vec<Vec<usize>> = Vec::with_capacity(self.steps.len());
        let mut last_on: Vec<Option<usize>> = vec![None; n];
        let mut start: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut last_touch: Vec<Vec<Option<usize>>> = vec![vec![None; n]; n];

        for j in 0..self.steps.len() {
            let p = self.steps[j].exec;
            if p >= n {
                // Malformed (only possible through `push`): no deps; the simulator and the
                // executor reject it.
                clock.push(vec![0; n]);
                continue;
            }
            // Latest conflicting step per other rank.
            let mut cand: Vec<Option<usize>> = vec![None; n];
            let st = &self.steps[j];
            let accesses = st
                .srcs
                .iter()
                .map(|r| (r, false))
                .chain(st.dsts.iter().map(|r| (r, true)));
            for (r, write) in accesses.clone() {
                if let Some(per_q) = maps.get(&(r.rank, r.buf)) {
                    for (q, m) in per_q.iter().enumerate() {
                        if q != p {
                            cand[q] = cand[q].max(m.latest(r.offset, r.end(), write));
                        }
                    }
                }
            }
            // What this rank's stream already guarantees.
            let mut base = match last_on[p] {
                Some(prev) => {
                    let mut b = clock[prev].clone();
                    b[p] = prev + 1;
                    b
                }
                None => vec![0; n],
            };
            let with_self = |i: usize, q: usize| {
                let mut c = clock[i].clone();
                c[q] = c[q].max(i + 1);
                c
            };
            let cands: Vec<(usize, usize)> = cand
                .iter()
                .enumerate()
                .filter_map(|(q, d)| d.map(|d| (q, d)))
                .collect();
            let cand_clocks: Vec<Vec<usize>> =
                cands.iter().map(|&(q, d)| with_self(d, q)).collect();
            let mut deps = Vec::new();
            for (k, &(q, d)) in cands.iter().enumerate() {
                let implied = base[q] > d
                    || cand_clocks
                        .iter()
                        .enumerate()
                        .any(|(e, c)| e != k && c[q] > d);
                if !implied {
                    deps.push(d);
                }
            }
            for c in &cand_clocks {
                for (b, &x) in base.iter_mut().zip(c) {
                    *b = (*b).max(x);
                }
            }
            deps.sort_unstable();
            clock.push(base);
            last_on[p] = Some(j);

            for (r, write) in accesses {
                if r.rank < n {
                    let per_q = maps
                        .entry((r.rank, r.buf))
                        .or_insert_with(|| (0..n).map(|_| IntervalMap::default()).collect());
                    per_q[p].record(r.offset, r.end(), j, write);
                    if r.rank != p && r.len > 0 {
                        start[p].push(r.rank);
                        last_touch[r.rank][p] = Some(j);
                    }
                }
            }
            self.steps[j].deps = deps;
        }
        for s in &mut start {
            s.sort_unstable();
            s.dedup();
        }
        self.start_waits = start;
        self.end_waits = last_touch
            .into_iter()
            .map(|row| {
                let mut v: Vec<usize> = row.into_iter().flatten().collect();
                v.sort_unstable();
                v
            })
            .collect();
    }
}

/// Latest read and write of each element range by one rank (a partition of the touched
/// elements into maximal-enough intervals).
#[derive(Default, Debug)]
struct IntervalMap {
    /// start → (end, latest write, latest read)
    m: BTreeMap<usize, (usize, Option<usize>, Option<usize>)>,
}

impl IntervalMap {
    /// Latest write overlapping `[a, b)` (and latest read too when `writes`).
    fn latest(&self, a: usize, b: usize, writes: bool) -> Option<usize> {
        let mut best = None;
        if a >= b {
            return best;
        }
        for (_, &(end, w, r)) in self.m.range(..b).rev() {
            if end <= a {
                break;
            }
            best = best.max(w);
            if writes {
                best = best.max(r);
            }
        }
        best
    }

    fn split(&mut self, at: usize) {
        if let Some((_, v)) = self.m.range_mut(..at).next_back() {
            if v.0 > at {
                let tail = (v.0, v.1, v.2);
                v.0 = at;
                self.m.insert(at, tail);
            }
        }
    }

    /// Records that step `step` reads (or writes) `[a, b)`.
    fn record(&mut self, a: usize, b: usize, step: usize, write: bool) {
        if a >= b {
            return;
        }
        self.split(a);
        self.split(b);
        let keys: Vec<usize> = self.m.range(a..b).map(|(&k, _)| k).collect();
        let mut cursor = a;
        let set = |v: &mut (usize, Option<usize>, Option<usize>)| {
            if write {
                v.1 = Some(step);
            } else {
                v.2 = Some(step);
            }
        };
        for k in keys {
            if k > cursor {
                let mut v = (k, None, None);
                set(&mut v);
                self.m.insert(cursor, v);
            }
            if let Some(v) = self.m.get_mut(&k) {
                set(v);
                cursor = v.0;
            }
        }
        if cursor < b {
            let mut v = (b, None, None);
            set(&mut v);
            self.m.insert(cursor, v);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
