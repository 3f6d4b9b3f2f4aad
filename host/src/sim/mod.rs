//! A CPU simulator that executes a finished [`Schedule`] on host arrays, with the kernels' math.
//!
//! Each step folds its sources in order with [`RedOp::combine`], applies [`RedOp::finish`] with
//! the schedule's rank count when the step says so, and writes every destination: exactly what
//! one kernel launch computes. [`Order::Issue`] runs the steps in list order;
//! [`Order::Random`] runs them in a random order that respects only what the executor enforces
//! (each rank's stream order, each step's `deps`, the start waits, the end waits), so a
//! schedule whose dependencies are insufficient shows a wrong result (or a
//! [`SimError::TouchBeforeStart`] / [`SimError::TouchAfterEnd`]) for some seed.
//!
//! ```
//! use ringccl::internals::schedule::{all_reduce, Layout};
//! use ringccl::internals::sim::{run, Order, SimRanks};
//! use ringccl::RedOp;
//! let s = all_reduce(&[0, 1, 2], 5, Layout::OutOfPlace, 2);
//! let send: Vec<Vec<u32>> = (0..3).map(|r| vec![r as u32 + 1; 5]).collect();
//! let mut ranks = SimRanks::new(&s, send, vec![vec![0; 5]; 3]);
//! run(&s, RedOp::Sum, &mut ranks, Order::Random(7)).unwrap();
//! assert!(ranks.recv.iter().all(|r| r == &vec![6; 5]));
//! ```

use crate::schedule::{BufId, Region, Schedule, ScheduleError};
use gpu_kernels::element::Element;
use gpu_kernels::op::RedOp;
use std::fmt;

/// Every rank's host buffers (indexed by rank), built with [`SimRanks::new`].
///
/// ```
/// use ringccl::internals::schedule::{all_gather, Layout};
/// use ringccl::internals::sim::{run, Order, SimRanks};
/// use ringccl::RedOp;
/// let s = all_gather(&[1, 0], 2, Layout::OutOfPlace, 1);
/// let mut ranks = SimRanks::new(&s, vec![vec![1u64, 2], vec![3, 4]], vec![vec![0; 4]; 2]);
/// run(&s, RedOp::Sum, &mut ranks, Order::Random(9)).unwrap();
/// assert_eq!(ranks.recv, vec![vec![1, 2, 3, 4]; 2]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct SimRanks<T> {
    /// Send buffers, one per rank (may be empty where the schedule never reads them).
    pub send: Vec<Vec<T>>,
    /// Receive buffers, one per rank.
    pub recv: Vec<Vec<T>>,
    /// Scratch buffers, one per rank.
    pub scratch: Vec<Vec<T>>,
}

/// Bits scratch starts with: not a plausible result, so reading scratch that no step wrote
/// shows up as a wrong answer.
const SCRATCH_POISON: u64 = 0x5A5A_5A5A_5A5A_5A5A;

impl<T: Element> SimRanks<T> {
    /// Ranks with the given buffers and scratch of `s.scratch_len` elements each, filled with
    /// garbage.
    ///
    /// ```
    /// use ringccl::internals::schedule::{reduce_scatter, Layout};
    /// use ringccl::internals::sim::SimRanks;
    /// let s = reduce_scatter(&[0, 1, 2, 3], 4, Layout::OutOfPlace, 64);
    /// let ranks = SimRanks::<f32>::new(&s, vec![vec![1.0; 16]; 4], vec![vec![0.0; 4]; 4]);
    /// assert_eq!(ranks.scratch[3].len(), s.scratch_len);
    /// ```
    pub fn new(s: &Schedule, send: Vec<Vec<T>>, recv: Vec<Vec<T>>) -> Self {
        let scratch = vec![vec![T::from_raw(SCRATCH_POISON); s.scratch_len]; s.nranks];
        SimRanks {
            send,
            recv,
            scratch,
        }
    }

    fn buf(&self, r: &Region) -> &[T] {
        let v = match r.buf {
            BufId::Send => &self.send[r.rank],
            BufId::Recv => &self.recv[r.rank],
            BufId::Scratch => &self.scratch[r.rank],
        };
        &v[r.offset..r.end()]
    }

    fn buf_mut(&mut self, r: &Region) -> &mut [T] {
        let v = match r.buf {
            BufId::Send => &mut self.send[r.rank],
            BufId::Recv => &mut self.recv[r.rank],
            BufId::Scratch => &mut self.scratch[r.rank],
        };
        &mut v[r.offset..r.end()]
    }

    fn len_of(&self, r: &Region) -> usize {
        let set = match r.buf {
            BufId::Send => &self.send,
            BufId::Recv => &self.recv,
            BufId::Scratch => &self.scratch,
        };
        set.get(r.rank).map_or(0, Vec::len)
    }
}

/// In which order [`run`] executes the steps.
///
/// ```
/// use ringccl::internals::sim::Order;
/// let orders = [Order::Issue, Order::Random(1), Order::Random(2)];
/// assert_ne!(orders[1], orders[2]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// List order (the order the host issues them).
    Issue,
    /// A random order, from this seed, allowed by per-rank order, `deps`, start and end waits.
    Random(u64),
}

/// Why a schedule could not be simulated. Nothing is written when the schedule itself is
/// malformed (checked before the first step); [`SimError::TouchBeforeStart`],
/// [`SimError::TouchAfterEnd`] and [`SimError::Stuck`] are found while running (`Stuck` is
/// defensive: with backward deps, which validation checks, some step can always run).
///
/// ```
/// use ringccl::internals::schedule::{BufId, Layout, Region, Schedule, Step};
/// use ringccl::internals::sim::{run, Order, SimError, SimRanks};
/// use ringccl::RedOp;
/// let mut s = Schedule::new(2);
/// s.push(Step::copy(1, Region::new(0, BufId::Send, 0, 8), Region::new(1, BufId::Recv, 0, 8)));
/// let s = s.finish(Layout::OutOfPlace);
/// let mut ranks = SimRanks::new(&s, vec![vec![1u8; 4], vec![]], vec![vec![], vec![0; 8]]);
/// let e = run(&s, RedOp::Sum, &mut ranks, Order::Issue).unwrap_err();
/// assert!(matches!(e, SimError::OutOfRange { step: 0, buf_len: 4, .. }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimError {
    /// `SimRanks` or the schedule's wait lists do not have one entry per rank.
    RankCount {
        /// The schedule's rank count.
        expected: usize,
        /// What was found.
        found: usize,
    },
    /// A step is not a primitive the kernels implement, or its regions are inconsistent.
    BadStep {
        /// Step index.
        step: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A region lies outside its buffer.
    OutOfRange {
        /// Step index.
        step: usize,
        /// The region.
        region: Region,
        /// Length of the buffer it names.
        buf_len: usize,
    },
    /// A dependency that is not an earlier step of another rank (or an end wait that is not a
    /// step).
    BadDep {
        /// Step index (`usize::MAX` for an end wait).
        step: usize,
        /// The dependency.
        dep: usize,
    },
    /// A step touched a rank's memory before that rank reached the call (missing start wait).
    TouchBeforeStart {
        /// Step index.
        step: usize,
        /// The rank whose memory it touched.
        rank: usize,
    },
    /// A step touched a rank's memory after that rank's call completed (missing end wait).
    TouchAfterEnd {
        /// Step index.
        step: usize,
        /// The rank whose memory it touched.
        rank: usize,
    },
    /// No step can run but some remain (cyclic waits).
    Stuck {
        /// Steps executed.
        done: usize,
        /// Steps in the schedule.
        total: usize,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::RankCount { expected, found } => {
                write!(
                    f,
                    "expected {expected} ranks' buffers or wait lists, found {found}"
                )
            }
            SimError::BadStep { step, reason } => write!(f, "step {step}: {reason}"),
            SimError::OutOfRange {
                step,
                region,
                buf_len,
            } => {
                write!(
                    f,
                    "step {step}: region {region:?} outside its buffer of {buf_len} elements"
                )
            }
            SimError::BadDep { step, dep } => {
                write!(
                    f,
                    "step {step}: dependency {dep} is not an earlier step of another rank"
                )
            }
            SimError::TouchBeforeStart { step, rank } => {
                write!(
                    f,
                    "step {step} touched rank {rank}'s memory before rank {rank} started"
                )
            }
            SimError::TouchAfterEnd { step, rank } => {
                write!(
                    f,
                    "step {step} touched rank {rank}'s memory after rank {rank} finished"
                )
            }
            SimError::Stuck { done, total } => {
                write!(
                    f,
                    "no step can run after {done} of {total}: the waits form a cycle"
                )
            }
        }
    }
}

impl std::error::Error for SimError {}

/// Checks that the schedule is executable ([`Schedule::validate`]) and every region lies in its
/// buffer.
fn validate<T: Element>(s: &Schedule, ranks: &SimRanks<T>) -> Result<(), SimError> {
    let n = s.nranks;
    for found in [ranks.send.len(), ranks.recv.len(), ranks.scratch.len()] {
        if found != n {
            return Err(SimError::RankCount { expected: n, found });
        }
    }
    s.validate()?;
    for (j, st) in s.steps.iter().enumerate() {
        for r in st.srcs.iter().chain(&st.dsts) {
            let buf_len = ranks.len_of(r);
            if r.end() > buf_len {
                return Err(SimError::OutOfRange {
                    step: j,
                    region: *r,
                    buf_len,
                });
            }
        }
    }
    Ok(())
}

impl From<ScheduleError> for SimError {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::RankCount { expected, found } => SimError::RankCount { expected, found },
            ScheduleError::BadStep { step, reason } => SimError::BadStep { step, reason },
            ScheduleError::BadDep { step, dep } => SimError::BadDep { step, dep },
        }
    }
}

/// Executes step `j` (validated).
fn exec_step<T: Element>(s: &Schedule, j: usize, op: RedOp, ranks: &mut SimRanks<T>) {
    let st = &s.steps[j];
    let mut acc: Vec<T> = ranks.buf(&st.srcs[0]).to_vec();
    for src in &st.srcs[1..] {
        for (a, &b) in acc.iter_mut().zip(ranks.buf(src)) {
            *a = op.combine(*a, b);
        }
    }
    if st.finish {
        let postdiv = u32::try_from(s.nranks).unwrap_or(u32::MAX);
        for a in &mut acc {
            *a = op.finish(*a, postdiv);
        }
    }
    for d in &st.dsts {
        ranks.buf_mut(d).copy_from_slice(&acc);
    }
}

/// SplitMix64: a small deterministic generator for the random order.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z % n as u64) as usize
    }
}

#[derive(Clone, Copy)]
enum Event {
    Start(usize),
    Step(usize),
    End(usize),
}

/// Runs the finished schedule `s` with operator `op` on `ranks`, in `order`.
///
/// ```
/// use ringccl::internals::schedule::{broadcast, Layout};
/// use ringccl::internals::sim::{run, Order, SimRanks};
/// use ringccl::RedOp;
/// let s = broadcast(&[0, 1, 2, 3], 3, 1, Layout::OutOfPlace, 1);
/// let send = vec![vec![], vec![7i64, 8, 9], vec![], vec![]];
/// let mut ranks = SimRanks::new(&s, send, vec![vec![0; 3]; 4]);
/// run(&s, RedOp::Sum, &mut ranks, Order::Issue).unwrap();
/// assert!(ranks.recv.iter().all(|r| r == &vec![7, 8, 9]));
/// ```
pub fn run<T: Element>(
    s: &Schedule,
    op: RedOp,
    ranks: &mut SimRanks<T>,
    order: Order,
) -> Result<(), SimError> {
    validate(s, ranks)?;
    let seed = match order {
        Order::Issue => {
            for j in 0..s.steps.len() {
                exec_step(s, j, op, ranks);
            }
            return Ok(());
        }
        Order::Random(seed) => seed,
    };
    let n = s.nranks;
    let mut rng = Rng(seed);
    let per_rank: Vec<Vec<usize>> = (0..n)
        .map(|r| s.steps_of(r).map(|(j, _)| j).collect())
        .collect();
    let mut next = vec![0usize; n];
    let mut started = vec![false; n];
    let mut ended = vec![false; n];
    let mut done = vec![false; s.steps.len()];
    let mut ndone = 0;
    let mut start_ok = vec![false; n];
    let mut ready = Vec::with_capacity(n);
    loop {
        ready.clear();
        for r in 0..n {
            if !started[r] {
                ready.push(Event::Start(r));
            } else if let Some(&j) = per_rank[r].get(next[r]) {
                start_ok[r] = start_ok[r] || s.start_waits[r].iter().all(|&q| started[q]);
                if start_ok[r] && s.steps[j].deps.iter().all(|&d| done[d]) {
                    ready.push(Event::Step(j));
                }
            } else if !ended[r] && s.end_waits[r].iter().all(|&d| done[d]) {
                ready.push(Event::End(r));
            }
        }
        if ready.is_empty() {
            if ended.iter().all(|&e| e) {
                return Ok(());
            }
            return Err(SimError::Stuck {
                done: ndone,
                total: s.steps.len(),
            });
        }
        match ready[rng.below(ready.len())] {
            Event::Start(r) => started[r] = true,
            Event::End(r) => ended[r] = true,
            Event::Step(j) => {
                let st = &s.steps[j];
                for reg in st.srcs.iter().chain(&st.dsts) {
                    if !started[reg.rank] {
                        return Err(SimError::TouchBeforeStart {
                            step: j,
                            rank: reg.rank,
                        });
                    }
                    if ended[reg.rank] {
                        return Err(SimError::TouchAfterEnd {
                            step: j,
                            rank: reg.rank,
                        });
                    }
                }
                exec_step(s, j, op, ranks);
                done[j] = true;
                ndone += 1;
                next[st.exec] += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
