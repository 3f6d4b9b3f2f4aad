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

/// One point-to-point transfer of a [`send_recv`] group: `count` elements from rank `from` to
/// rank `to`.
///
/// ```
/// use ringccl::internals::schedule::P2p;
/// let p = P2p { from: 0, to: 1, count: 16 };
/// assert_eq!(p.count, 16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct P2p {
    /// Sending rank.
    pub from: usize,
    /// Receiving rank.
    pub to: usize,
    /// Elements.
    pub count: usize,
}

/// Whether `ring` is a permutation of `0..ring.len()` (and not empty).
///
/// ```
/// use ringccl::internals::schedule::is_ring;
/// assert!(is_ring(&[2, 0, 1]));
/// assert!(!is_ring(&[0, 0, 1]) && !is_ring(&[0, 3]) && !is_ring(&[]));
/// ```
pub fn is_ring(ring: &[usize]) -> bool {
    let n = ring.len();
    let mut seen = vec![false; n];
    n > 0
        && ring
            .iter()
            .all(|&r| r < n && !std::mem::replace(&mut seen[r], true))
}

/// `count` split into `n` contiguous, nearly equal segments `(offset, len)` (the first
/// `count % n` are one longer).
fn segments(count: usize, n: usize) -> Vec<(usize, usize)> {
    let (base, rem) = (count / n, count % n);
    let mut off = 0;
    (0..n)
        .map(|s| {
            let len = base + usize::from(s < rem);
            let seg = (off, len);
            off += len;
            seg
        })
        .collect()
}

/// Chunk `c` of a segment of `len` elements: `(offset within the segment, len)`, if it exists.
fn chunk_of(len: usize, chunk: usize, c: usize) -> Option<(usize, usize)> {
    let off = c.checked_mul(chunk)?;
    (off < len).then(|| (off, chunk.min(len - off)))
}

/// Chunks in a segment of `len` elements.
fn nchunks(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk)
}

/// Whether `a * b` fits (all offsets a generator computes stay below it).
fn fits(a: usize, b: usize) -> bool {
    a.checked_mul(b).is_some_and(|x| x.checked_mul(2).is_some())
}

fn reg(rank: usize, buf: BufId, offset: usize, len: usize) -> Region {
    Region::new(rank, buf, offset, len)
}

use BufId::{Recv, Scratch, Send};

/// Ring all-reduce of `count` elements (send = recv = `count` on every rank).
///
/// `count` is split into `n` segments. For each segment (and chunk), a ring reduce-scatter of
/// `n − 1` reduce-copy steps (`recv[seg] = send[seg] ⊕ predecessor's partial`, the last with
/// `finish`) leaves the result on one rank, then `n − 1` copy steps pass it around the ring.
/// With 2 ranks each rank reduces its half once and writes it to both receive buffers.
/// Layouts: [`Layout::OutOfPlace`] and `SendInRecv { stride: 0 }`; any other layout, or a
/// `ring` that is not a permutation, gives an empty schedule (callers validate first).
///
/// ```
/// use ringccl::internals::schedule::{all_reduce, Layout};
/// let s = all_reduce(&[0, 1], 10, Layout::SendInRecv { stride: 0 }, 3);
/// // 2 ranks × 2 chunks of each 5-element half, each step writes both ranks' recv.
/// assert_eq!(s.steps.len(), 4);
/// assert!(s.steps.iter().all(|st| st.dsts.len() == 2 && st.finish));
/// ```
pub fn all_reduce(ring: &[usize], count: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = matches!(
        layout,
        Layout::OutOfPlace | Layout::SendInRecv { stride: 0 }
    );
    if !is_ring(ring) || !ok || !fits(count, 1) {
        return s;
    }
    let chunk = chunk.max(1);
    let segs = segments(count, n);
    let maxc = segs
        .iter()
        .map(|&(_, l)| nchunks(l, chunk))
        .max()
        .unwrap_or(0);
    for c in 0..maxc {
        if n == 1 {
            if let Some((o, l)) = chunk_of(count, chunk, c) {
                s.push(Step::copy(0, reg(0, Send, o, l), reg(0, Recv, o, l)));
            }
        } else if n == 2 {
            for (p, &(so, sl)) in segs.iter().enumerate() {
                if let Some((o, l)) = chunk_of(sl, chunk, c) {
                    let (me, peer) = (ring[p], ring[1 - p]);
                    let o = so + o;
                    s.push(Step::reduce(
                        me,
                        vec![reg(me, Send, o, l), reg(peer, Send, o, l)],
                        vec![reg(me, Recv, o, l), reg(peer, Recv, o, l)],
                        true,
                    ));
                }
            }
        } else {
            for k in 1..=2 * n - 2 {
                for (si, &(so, sl)) in segs.iter().enumerate() {
                    let Some((o, l)) = chunk_of(sl, chunk, c) else {
                        continue;
                    };
                    let o = so + o;
                    if k < n {
                        // Reduce-scatter: the chain of segment `si` starts after position si.
                        let pos = (si + 1 + k) % n;
                        let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
                        let partial = reg(pred, if k == 1 { Send } else { Recv }, o, l);
                        s.push(Step::reduce(
                            me,
                            vec![reg(me, Send, o, l), partial],
                            vec![reg(me, Recv, o, l)],
                            k == n - 1,
                        ));
                    } else {
                        // All-gather from position si, which holds the result.
                        let pos = (si + k - (n - 1)) % n;
                        let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
                        s.push(Step::copy(me, reg(pred, Recv, o, l), reg(me, Recv, o, l)));
                    }
                }
            }
        }
    }
    s.finish(layout)
}

/// Ring reduce-scatter: rank `q` receives block `q` (`recvcount` elements at
/// `q * recvcount` of every send buffer) reduced over all ranks.
///
/// Each block travels the ring once: `n − 1` reduce-copy steps, partial results in scratch (two
/// slots of `recvcount`, reused every other step), the last step writing the owner's recv with
/// `finish`. Layouts: [`Layout::OutOfPlace`] and `RecvInSend { stride: recvcount }`.
///
/// ```
/// use ringccl::internals::schedule::{reduce_scatter, Layout};
/// let s = reduce_scatter(&[0, 1, 2, 3], 8, Layout::OutOfPlace, 8);
/// assert_eq!(s.steps.len(), 4 * 3);
/// assert_eq!(s.scratch_len, 2 * 8);
/// ```
pub fn reduce_scatter(ring: &[usize], recvcount: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = match layout {
        Layout::OutOfPlace => true,
        Layout::RecvInSend { stride } => stride == recvcount,
        Layout::SendInRecv { .. } => false,
    };
    if !is_ring(ring) || !ok || !fits(recvcount, n) {
        return s;
    }
    let chunk = chunk.max(1);
    let slots = n.saturating_sub(2).min(2);
    s.scratch_len = slots * recvcount;
    let slot = |k: usize| ((k - 1) % 2) * recvcount;
    for c in 0..nchunks(recvcount, chunk) {
        let Some((o, l)) = chunk_of(recvcount, chunk, c) else {
            continue;
        };
        if n == 1 {
            s.push(Step::copy(0, reg(0, Send, o, l), reg(0, Recv, o, l)));
            continue;
        }
        for k in 1..n {
            for si in 0..n {
                let q = ring[si];
                let bo = q * recvcount + o;
                let pos = (si + 1 + k) % n;
                let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
                let partial = if k == 1 {
                    reg(pred, Send, bo, l)
                } else {
                    reg(pred, Scratch, slot(k - 1) + o, l)
                };
                let dst = if k == n - 1 {
                    reg(me, Recv, o, l)
                } else {
                    reg(me, Scratch, slot(k) + o, l)
                };
                s.push(Step::reduce(
                    me,
                    vec![reg(me, Send, bo, l), partial],
                    vec![dst],
                    k == n - 1,
                ));
            }
        }
    }
    s.finish(layout)
}

/// Ring all-gather: block `q` of every recv buffer (`sendcount` elements at `q * sendcount`)
/// receives rank `q`'s send buffer.
///
/// Each block travels the ring: the next rank copies it from the owner's send buffer, the
/// others from their predecessor's recv. Layouts: [`Layout::OutOfPlace`] (the owner also copies
/// its own block) and `SendInRecv { stride: sendcount }`.
///
/// ```
/// use ringccl::internals::schedule::{all_gather, Layout};
/// let s = all_gather(&[0, 1, 2], 5, Layout::SendInRecv { stride: 5 }, 64);
/// assert_eq!(s.steps.len(), 3 * 2);
/// ```
pub fn all_gather(ring: &[usize], sendcount: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = match layout {
        Layout::OutOfPlace => true,
        Layout::SendInRecv { stride } => stride == sendcount,
        Layout::RecvInSend { .. } => false,
    };
    if !is_ring(ring) || !ok || !fits(sendcount, n) {
        return s;
    }
    let chunk = chunk.max(1);
    for c in 0..nchunks(sendcount, chunk) {
        let Some((o, l)) = chunk_of(sendcount, chunk, c) else {
            continue;
        };
        for k in 0..n {
            for si in 0..n {
                let q = ring[si];
                let bo = q * sendcount + o;
                let pos = (si + k) % n;
                let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
                let src = if k <= 1 {
                    reg(q, Send, o, l)
                } else {
                    reg(pred, Recv, bo, l)
                };
                s.push(Step::copy(me, src, reg(me, Recv, bo, l)));
            }
        }
    }
    s.finish(layout)
}

/// Position of `root` in `ring`.
fn position(ring: &[usize], root: usize) -> Option<usize> {
    ring.iter().position(|&r| r == root)
}

/// Ring broadcast of `count` elements from `root`'s send buffer to every recv buffer.
///
/// The rank after the root copies from the root's send buffer, each following rank from its
/// predecessor's recv, chunk by chunk; the root copies send → recv when out of place. Layouts:
/// [`Layout::OutOfPlace`] and `SendInRecv { stride: 0 }` (the root's buffers alias).
///
/// ```
/// use ringccl::internals::schedule::{broadcast, Layout};
/// let s = broadcast(&[0, 1, 2, 3], 100, 2, Layout::SendInRecv { stride: 0 }, 50);
/// assert_eq!(s.steps.len(), 2 * 3);
/// assert!(s.steps.iter().all(|st| st.exec != 2));
/// ```
pub fn broadcast(
    ring: &[usize],
    count: usize,
    root: usize,
    layout: Layout,
    chunk: usize,
) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = matches!(
        layout,
        Layout::OutOfPlace | Layout::SendInRecv { stride: 0 }
    );
    let Some(pr) = position(ring, root) else {
        return s;
    };
    if !is_ring(ring) || !ok || !fits(count, 1) {
        return s;
    }
    let chunk = chunk.max(1);
    for c in 0..nchunks(count, chunk) {
        let Some((o, l)) = chunk_of(count, chunk, c) else {
            continue;
        };
        for k in 0..n {
            let pos = (pr + k) % n;
            let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
            let src = if k <= 1 {
                reg(root, Send, o, l)
            } else {
                reg(pred, Recv, o, l)
            };
            s.push(Step::copy(me, src, reg(me, Recv, o, l)));
        }
    }
    s.finish_for(layout, Some(root))
}

/// Ring reduce of `count` elements to `root`'s recv buffer.
///
/// The chain starts after the root and ends at it: each rank folds its send buffer into its
/// predecessor's partial (kept in scratch, `count` elements per rank for 3+ ranks); the root
/// writes the result with `finish`. Layouts: [`Layout::OutOfPlace`] and
/// `SendInRecv { stride: 0 }` (the root's buffers alias).
///
/// ```
/// use ringccl::internals::schedule::{reduce, Layout};
/// let s = reduce(&[0, 1, 2], 10, 0, Layout::OutOfPlace, 10);
/// assert_eq!(s.steps.len(), 2);
/// assert!(s.steps[1].finish && s.steps[1].exec == 0);
/// ```
pub fn reduce(ring: &[usize], count: usize, root: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = matches!(
        layout,
        Layout::OutOfPlace | Layout::SendInRecv { stride: 0 }
    );
    let Some(pr) = position(ring, root) else {
        return s;
    };
    if !is_ring(ring) || !ok || !fits(count, 1) {
        return s;
    }
    let chunk = chunk.max(1);
    if n >= 3 {
        s.scratch_len = count;
    }
    for c in 0..nchunks(count, chunk) {
        let Some((o, l)) = chunk_of(count, chunk, c) else {
            continue;
        };
        if n == 1 {
            s.push(Step::copy(
                root,
                reg(root, Send, o, l),
                reg(root, Recv, o, l),
            ));
            continue;
        }
        for k in 1..n {
            let pos = (pr + 1 + k) % n;
            let (me, pred) = (ring[pos], ring[(pos + n - 1) % n]);
            let partial = reg(pred, if k == 1 { Send } else { Scratch }, o, l);
            let last = k == n - 1;
            let dst = reg(me, if last { Recv } else { Scratch }, o, l);
            s.push(Step::reduce(
                me,
                vec![reg(me, Send, o, l), partial],
                vec![dst],
                last,
            ));
        }
    }
    s.finish_for(layout, Some(root))
}

/// All-to-all: block `q` of rank `r`'s recv (`count` elements at `q * count`) receives block
/// `r` of rank `q`'s send. Each rank pulls its blocks from every peer, peers in a rotated order
/// so no rank is read by everyone at once.
///
/// `ring` gives the rank count (its order does not matter). Any layout is accepted: other than
/// [`Layout::OutOfPlace`], every rank first stages its send blocks in scratch
/// (`n * count` elements) and peers read them there; with `SendInRecv { stride: 0 }` a rank's
/// own block stays where it is.
///
/// ```
/// use ringccl::internals::schedule::{all_to_all, Layout};
/// let s = all_to_all(&[0, 1, 2], 4, Layout::OutOfPlace, 64);
/// assert_eq!(s.steps.len(), 9);
/// ```
pub fn all_to_all(ring: &[usize], count: usize, layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    if !is_ring(ring) || !fits(count, n) {
        return s;
    }
    let chunk = chunk.max(1);
    let staged = layout != Layout::OutOfPlace;
    let skip_self = layout == Layout::SendInRecv { stride: 0 };
    let first = usize::from(skip_self);
    if staged {
        s.scratch_len = n * count;
        for c in 0..nchunks(count, chunk) {
            let Some((o, l)) = chunk_of(count, chunk, c) else {
                continue;
            };
            for r in 0..n {
                for d in first..n {
                    let q = (r + d) % n;
                    let bo = q * count + o;
                    s.push(Step::copy(r, reg(r, Send, bo, l), reg(r, Scratch, bo, l)));
                }
            }
        }
    }
    for c in 0..nchunks(count, chunk) {
        let Some((o, l)) = chunk_of(count, chunk, c) else {
            continue;
        };
        for d in first..n {
            for r in 0..n {
                let q = (r + d) % n;
                let src = reg(q, if staged { Scratch } else { Send }, r * count + o, l);
                s.push(Step::copy(r, src, reg(r, Recv, q * count + o, l)));
            }
        }
    }
    s.finish(layout)
}

/// Gather: block `q` of `root`'s recv (`sendcount` elements at `q * sendcount`) receives rank
/// `q`'s send buffer; the root pulls every block.
///
/// Layouts: [`Layout::OutOfPlace`] and `SendInRecv { stride: sendcount }` (the root's send is
/// its own block of its recv).
///
/// ```
/// use ringccl::internals::schedule::{gather, Layout};
/// let s = gather(&[0, 1, 2, 3], 6, 1, Layout::SendInRecv { stride: 6 }, 64);
/// assert_eq!(s.steps.len(), 3);
/// assert!(s.steps.iter().all(|st| st.exec == 1));
/// ```
pub fn gather(
    ring: &[usize],
    sendcount: usize,
    root: usize,
    layout: Layout,
    chunk: usize,
) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = match layout {
        Layout::OutOfPlace => true,
        Layout::SendInRecv { stride } => stride == sendcount,
        Layout::RecvInSend { .. } => false,
    };
    let Some(pr) = position(ring, root) else {
        return s;
    };
    if !is_ring(ring) || !ok || !fits(sendcount, n) {
        return s;
    }
    let chunk = chunk.max(1);
    for c in 0..nchunks(sendcount, chunk) {
        let Some((o, l)) = chunk_of(sendcount, chunk, c) else {
            continue;
        };
        for d in 0..n {
            let q = ring[(pr + d) % n];
            s.push(Step::copy(
                root,
                reg(q, Send, o, l),
                reg(root, Recv, q * sendcount + o, l),
            ));
        }
    }
    s.finish_for(layout, Some(root))
}

/// Scatter: rank `q`'s recv receives block `q` of `root`'s send (`recvcount` elements at
/// `q * recvcount`); every rank pulls its block.
///
/// Layouts: [`Layout::OutOfPlace`] and `RecvInSend { stride: recvcount }` (the root's recv is
/// its own block of its send).
///
/// ```
/// use ringccl::internals::schedule::{scatter, Layout};
/// let s = scatter(&[0, 1, 2], 6, 0, Layout::OutOfPlace, 4);
/// assert_eq!(s.steps.len(), 2 * 3);
/// ```
pub fn scatter(
    ring: &[usize],
    recvcount: usize,
    root: usize,
    layout: Layout,
    chunk: usize,
) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    let ok = match layout {
        Layout::OutOfPlace => true,
        Layout::RecvInSend { stride } => stride == recvcount,
        Layout::SendInRecv { .. } => false,
    };
    let Some(pr) = position(ring, root) else {
        return s;
    };
    if !is_ring(ring) || !ok || !fits(recvcount, n) {
        return s;
    }
    let chunk = chunk.max(1);
    for c in 0..nchunks(recvcount, chunk) {
        let Some((o, l)) = chunk_of(recvcount, chunk, c) else {
            continue;
        };
        for d in 0..n {
            let q = ring[(pr + d) % n];
            s.push(Step::copy(
                q,
                reg(root, Send, q * recvcount + o, l),
                reg(q, Recv, o, l),
            ));
        }
    }
    s.finish_for(layout, Some(root))
}

/// A group of point-to-point transfers. Each rank's messages lie back to back in its buffers,
/// in list order: the `k`-th pair sent by rank `r` reads `r`'s send buffer after the counts of
/// `r`'s earlier sends, and the `k`-th pair received by rank `t` lands in `t`'s recv after the
/// counts of its earlier receives. The receiver copies from the sender's buffer.
///
/// `ring` gives the rank count. Pairs naming a rank out of range give an empty schedule. Any
/// layout is accepted: other than [`Layout::OutOfPlace`], senders first stage their messages in
/// scratch (`scratch_len` = the most any rank sends) and receivers read them there.
///
/// ```
/// use ringccl::internals::schedule::{send_recv, Layout, P2p};
/// let ring = [0, 1, 2];
/// let pairs: Vec<P2p> = (0..3).map(|r| P2p { from: r, to: (r + 1) % 3, count: 5 }).collect();
/// let s = send_recv(&ring, &pairs, Layout::OutOfPlace, 64);
/// assert_eq!(s.steps.len(), 3);
/// assert!(s.steps.iter().all(|st| st.deps.is_empty()));
/// ```
pub fn send_recv(ring: &[usize], pairs: &[P2p], layout: Layout, chunk: usize) -> Schedule {
    let n = ring.len();
    let mut s = Schedule::new(n);
    if !is_ring(ring) || pairs.iter().any(|p| p.from >= n || p.to >= n) {
        return s;
    }
    let chunk = chunk.max(1);
    // Offsets of each pair in its sender's send and its receiver's recv.
    let mut sent = vec![0usize; n];
    let mut received = vec![0usize; n];
    let mut placed = Vec::with_capacity(pairs.len());
    for p in pairs {
        let (Some(so), Some(ro)) = (
            sent[p.from].checked_add(p.count),
            received[p.to].checked_add(p.count),
        ) else {
            return s;
        };
        placed.push((p, sent[p.from], received[p.to]));
        sent[p.from] = so;
        received[p.to] = ro;
    }
    let staged = layout != Layout::OutOfPlace;
    let maxc = pairs
        .iter()
        .map(|p| nchunks(p.count, chunk))
        .max()
        .unwrap_or(0);
    if staged {
        s.scratch_len = sent.iter().copied().max().unwrap_or(0);
        for c in 0..maxc {
            for &(p, so, _) in &placed {
                if let Some((o, l)) = chunk_of(p.count, chunk, c) {
                    let src = reg(p.from, Send, so + o, l);
                    s.push(Step::copy(p.from, src, reg(p.from, Scratch, so + o, l)));
                }
            }
        }
    }
    for c in 0..maxc {
        for &(p, so, ro) in &placed {
            if let Some((o, l)) = chunk_of(p.count, chunk, c) {
                let src = reg(p.from, if staged { Scratch } else { Send }, so + o, l);
                s.push(Step::copy(p.to, src, reg(p.to, Recv, ro + o, l)));
            }
        }
    }
    s.finish(layout)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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
}
