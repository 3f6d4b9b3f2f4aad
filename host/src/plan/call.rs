//! The plan of one call, as a value: [`choose`] looks at what the call asks for
//! ([`CallShape`]), what the communicator offers ([`CommView`]) and the [`Config`], and returns
//! a [`CallPlan`]: which executor runs the call and everything it needs (the kernel, the
//! schedule, the groups, the scratch). Pure: nothing here touches a GPU. Plans that take work
//! to build (ring schedules) are kept in the communicator's [`PlanCache`] by call shape.
//!
//! [`crate::exec::run`] takes the plan and the communicator's per-call handle and dispatches
//! to the executor the plan names.

use std::sync::Arc;

use super::collective::Collective;
use super::copy_engine::CePlan;
use super::net::{Machines, NetGroup};
use super::{tuning, PlanCache, Prepared, ProcessPlan};
use crate::config::{Algorithm, Config};
use crate::schedule::Layout;
use crate::{DataType, Error, Result};

/// Which kernel `exec::oneshot::execute` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shot {
    /// The one-shot kernel: one block per rank (an all-reduce).
    One,
    /// The two-shot kernel in this many blocks per rank (the same on every rank:
    /// [`crate::plan::tuning::twoshot_blocks`]).
    Two {
        /// Blocks per rank.
        blocks: u32,
        /// The collective it runs.
        of: TwoShotOf,
    },
}

/// The collective a two-shot kernel runs (`gpu_kernels::oneshot::what`): the all-reduce, or
/// another collective on the same barriers. `count` is then what the collective calls it: the
/// length of the full buffers (all-reduce, broadcast, reduce) or each rank's share
/// (reduce-scatter's `recvcount`, all-gather's `sendcount`, all-to-all's count per peer).
///
/// ```
/// use ringccl::internals::exec::oneshot::TwoShotOf;
/// assert_eq!(TwoShotOf::AllReduce.what(), 0);
/// assert_eq!(TwoShotOf::Reduce { root: 1 }.root(), 1);
/// assert_eq!((TwoShotOf::ReduceScatter.postdiv(4), TwoShotOf::AllGather.postdiv(4)), (4, 1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwoShotOf {
    /// Reduce-scatter, then all-gather.
    AllReduce,
    /// The reduce-scatter alone.
    ReduceScatter,
    /// The all-gather alone.
    AllGather,
    /// The all-to-all.
    AllToAll,
    /// The broadcast from `root`: every rank copies the root's input.
    Broadcast {
        /// The rank whose input is copied.
        root: usize,
    },
    /// The reduce to `root`: the root folds every rank's input.
    Reduce {
        /// The rank that receives.
        root: usize,
    },
}

impl TwoShotOf {
    /// The kernel's `what` argument.
    pub fn what(self) -> u32 {
        use gpu_kernels::oneshot::what;
        match self {
            TwoShotOf::AllReduce => what::ALL_REDUCE,
            TwoShotOf::ReduceScatter => what::REDUCE_SCATTER,
            TwoShotOf::AllGather => what::ALL_GATHER,
            TwoShotOf::AllToAll => what::ALL_TO_ALL,
            TwoShotOf::Broadcast { .. } => what::BROADCAST,
            TwoShotOf::Reduce { .. } => what::REDUCE,
        }
    }

    /// The kernel's `root` argument (0 where there is none).
    pub fn root(self) -> u32 {
        match self {
            TwoShotOf::Broadcast { root } | TwoShotOf::Reduce { root } => {
                u32::try_from(root).unwrap_or(u32::MAX)
            }
            _ => 0,
        }
    }

    /// The kernel's `postdiv` for `nranks` ranks: the rank count where something is reduced
    /// (an `avg` divides by it), 1 for the copies.
    pub fn postdiv(self, nranks: usize) -> u32 {
        match self {
            TwoShotOf::AllReduce | TwoShotOf::ReduceScatter | TwoShotOf::Reduce { .. } => {
                u32::try_from(nranks).unwrap_or(u32::MAX)
            }
            _ => 1,
        }
    }
}

/// Where a two-shot all-reduce of `bytes` among processes puts its results in each rank's
/// scratch: after the copy of the input, at the next 256-byte boundary.
///
/// ```
/// use ringccl::internals::exec::process::twoshot_out_offset;
/// assert_eq!(twoshot_out_offset(1000), 1024);
/// assert_eq!(twoshot_out_offset(1 << 20), 1 << 20);
/// ```
pub fn twoshot_out_offset(bytes: usize) -> usize {
    bytes.div_ceil(256).saturating_mul(256)
}

/// Scratch bytes a one-shot or two-shot (`shot`) call of `bytes` per rank (`count` elements,
/// as [`TwoShotOf`] counts them) among `nranks` processes needs: the
/// all-reduce, the copy of the input, and for two-shot the results after it; the calls of one
/// share per rank, every rank's share (the reduce-scatter's copy of the input, the all-gather's
/// and all-to-all's results); the broadcast and the reduce, one copy of the input; `None` on
/// overflow.
///
/// ```
/// use ringccl::internals::exec::oneshot::{Shot, TwoShotOf};
/// use ringccl::internals::exec::process::scratch_for;
/// assert_eq!(scratch_for(Shot::One, 1000, 2), Some(1000));
/// assert_eq!(scratch_for(Shot::Two { blocks: 4, of: TwoShotOf::AllReduce }, 1000, 2), Some(2024));
/// assert_eq!(scratch_for(Shot::Two { blocks: 4, of: TwoShotOf::AllGather }, 1000, 4), Some(4000));
/// assert_eq!(scratch_for(Shot::Two { blocks: 4, of: TwoShotOf::Reduce { root: 1 } }, 1000, 4), Some(1000));
/// ```
pub fn scratch_for(shot: Shot, bytes: usize, nranks: usize) -> Option<usize> {
    match shot {
        Shot::One => Some(bytes),
        Shot::Two { of, .. } => match of {
            TwoShotOf::AllReduce => twoshot_out_offset(bytes).checked_add(bytes),
            TwoShotOf::ReduceScatter | TwoShotOf::AllGather | TwoShotOf::AllToAll => {
                bytes.checked_mul(nranks)
            }
            TwoShotOf::Broadcast { .. } | TwoShotOf::Reduce { .. } => Some(bytes),
        },
    }
}

/// What a two-shot kernel runs for `c`; `None` for the collectives it cannot run (gather and
/// scatter).
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::{twoshot_of, TwoShotOf};
/// assert_eq!(twoshot_of(Collective::Reduce { count: 4, root: 1 }), Some(TwoShotOf::Reduce { root: 1 }));
/// assert_eq!(twoshot_of(Collective::Gather { sendcount: 4, root: 0 }), None);
/// ```
pub fn twoshot_of(c: Collective) -> Option<TwoShotOf> {
    match c {
        Collective::AllReduce { .. } => Some(TwoShotOf::AllReduce),
        Collective::ReduceScatter { .. } => Some(TwoShotOf::ReduceScatter),
        Collective::AllGather { .. } => Some(TwoShotOf::AllGather),
        Collective::AllToAll { .. } => Some(TwoShotOf::AllToAll),
        Collective::Broadcast { root, .. } => Some(TwoShotOf::Broadcast { root }),
        Collective::Reduce { root, .. } => Some(TwoShotOf::Reduce { root }),
        Collective::Gather { .. } | Collective::Scatter { .. } => None,
    }
}

/// Whether `c` can run on the two-shot kernel's barriers besides the all-reduce.
fn twoshot_other(c: Collective) -> bool {
    twoshot_of(c).is_some_and(|of| of != TwoShotOf::AllReduce)
}

/// What a call asks for: the collective with its counts and root, the element type, and the
/// in-place layout validation found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallShape {
    /// The collective.
    pub collective: Collective,
    /// The element type.
    pub dtype: DataType,
    /// In place or not (as validated).
    pub layout: Layout,
}

/// What a communicator offers a call, per kind of communicator.
pub enum CommView<'a> {
    /// One process driving every rank ([`crate::Communicator::new`]).
    Local(LocalView<'a>),
    /// One rank of a job of processes ([`crate::Communicator::init_rank`]).
    Process(ProcessView<'a>),
}

/// What a communicator of one process offers a call.
pub struct LocalView<'a> {
    /// The ring order.
    pub ring: &'a [usize],
    /// Whether the one-shot kernel may be used (peer access everywhere, no earlier one-shot
    /// call failed half-launched, launches not blocking).
    pub oneshot_usable: bool,
    /// Whether the copy engines can run it (direct peer access between every pair).
    pub copy_engine_usable: bool,
    /// Whether the streams are being captured into a CUDA graph.
    pub capturing: bool,
    /// The fewest SMs of the ranks' GPUs (asked only for a two-shot plan).
    pub sms: &'a dyn Fn() -> u32,
    /// The communicator's ring schedules by call shape.
    pub plans: &'a PlanCache,
}

/// What a rank of a job of processes offers a call.
pub struct ProcessView<'a> {
    /// This rank.
    pub rank: usize,
    /// Ranks in the job.
    pub nranks: usize,
    /// The ring order.
    pub ring: &'a [usize],
    /// The network path, where the job has one.
    pub net: Option<NetView<'a>>,
    /// A rank on another machine, if any (asked only without the network path).
    pub remote_peer: &'a dyn Fn() -> Option<usize>,
    /// The SMs a two-shot block may count on (asked only for a two-shot plan).
    pub sms: &'a dyn Fn() -> u32,
    /// The rank's ring schedules for processes by call shape.
    pub plans: &'a PlanCache<ProcessPlan>,
    /// Whether the stream is being captured into a CUDA graph: only the kernels whose counters
    /// live on the device can be (one-shot and two-shot up to [`capture_limit`], over chunks
    /// above it: [`captured_chunks`]; the point-to-point kernel: [`captured_peers`]); anything
    /// else is refused.
    pub capturing: bool,
}

/// The network path of a rank of a job of processes.
#[derive(Clone, Copy, Debug)]
pub struct NetView<'a> {
    /// Every pair goes over the network, even ranks of one machine.
    pub all: bool,
    /// The ranks of each machine.
    pub machines: &'a Machines,
}

/// A collective as groups of point-to-point transfers ([`crate::plan::net`]).
#[derive(Clone, PartialEq, Eq)]
pub struct NetPlan {
    /// This rank's groups, in order.
    pub groups: Vec<NetGroup>,
    /// The call's count in bytes (sizes the network's chunks alike on every rank).
    pub unit: usize,
    /// Whether the groups are the hierarchical ones (inside each machine, then across).
    pub hierarchical: bool,
}

/// How one call runs: the executor and everything it needs.
#[derive(Clone, PartialEq, Eq)]
pub enum CallPlan {
    /// One process: one kernel per rank (the one-shot or two-shot kernel), met at a
    /// device-side barrier (`exec::oneshot`).
    Shot {
        /// Which kernel.
        shot: Shot,
        /// The kernel's count ([`TwoShotOf`] says what it counts).
        count: usize,
        /// In place on every rank (the one-shot result is staged in scratch).
        in_place: bool,
    },
    /// One process: the copy engines (`exec::copy_engine`).
    CopyEngine(CePlan),
    /// One process: the ring schedule, a kernel per step ordered by events (`exec::ring`).
    Ring {
        /// Elements per step.
        chunk: usize,
        /// The schedule.
        prepared: Arc<Prepared>,
    },
    /// Processes: this rank's one-shot or two-shot kernel through the mapped scratch
    /// (`exec::process`).
    ProcessShot {
        /// Which kernel.
        shot: Shot,
        /// The kernel's count.
        count: usize,
        /// Scratch bytes every rank needs ([`scratch_for`]).
        scratch: usize,
    },
    /// Processes, under CUDA-graph capture: an all-reduce, broadcast or reduce above the
    /// capture limit as consecutive two-shot kernels of at most `chunk` elements each (the
    /// three are elementwise: each chunk is the collective of its elements), every one within
    /// the scratch the communicator starts with ([`captured_chunks`]).
    ProcessShotChunks {
        /// The kernel of every chunk.
        shot: Shot,
        /// Elements of the whole call.
        count: usize,
        /// Elements per chunk (the last may be shorter).
        chunk: usize,
        /// Scratch bytes every rank needs (one chunk's, [`scratch_for`]).
        scratch: usize,
    },
    /// Processes, under CUDA-graph capture: a gather, scatter, all-to-all, all-gather or
    /// reduce-scatter (then a local reduction) the two-shot kernel cannot take, as one group of
    /// the point-to-point kernel
    /// (`plan::p2p_kernel::collective_ops`, `exec::p2p::collective`), whose counters live on
    /// the device ([`captured_peers`]).
    ProcessPeers {
        /// The collective.
        collective: Collective,
    },
    /// Processes: this rank's LL push all-reduce (`gpu_kernels::ll`, `exec::ll`): one kernel
    /// that pushes the input, the flag inside each packet, into every peer's LL area and folds
    /// the peers' packets; one exchange per call, no staging copy.
    ProcessLl {
        /// Elements.
        count: usize,
    },
    /// Processes: this rank's LL all-gather (`gpu_kernels::ll::LL_GATHER_ENTRY`, `exec::ll`):
    /// one kernel that pushes the input into every peer's LL area and copies every rank's
    /// packets into its block of the output ([`ll_gather_fits`]).
    ProcessLlGather {
        /// Elements per rank.
        sendcount: usize,
    },
    /// Processes: this rank's LL reduce-scatter (the LL all-reduce's kernel with `scatter`,
    /// `exec::ll`): one kernel that pushes block `q` of the input into peer `q`'s LL area and
    /// folds its own block with the peers' packets ([`ll_reduce_scatter_fits`]).
    ProcessLlReduceScatter {
        /// Elements per rank (of the output).
        recvcount: usize,
    },
    /// Processes: a broadcast on the LL all-reduce kernel (`exec::ll`): the root's input,
    /// as bytes (`u8`), summed with every other rank's zeros (`Windows::ll_zeros`), which is
    /// the root's bytes exactly; one exchange per call ([`ll_rooted_fits`]).
    ProcessLlBroadcast {
        /// Bytes.
        bytes: usize,
        /// The root.
        root: usize,
    },
    /// Processes: a reduce on the LL all-reduce kernel (`exec::ll`): every rank computes the
    /// reduction, a non-root into its sink (`Windows::ll_sink`); one exchange per call
    /// ([`ll_rooted_fits`]).
    ProcessLlReduce {
        /// Elements.
        count: usize,
        /// The root.
        root: usize,
    },
    /// Processes: the ring schedule through scratch, ordered by signals (`exec::process`).
    ProcessRing {
        /// Elements per step.
        chunk: usize,
        /// The schedule and its signals.
        plan: Arc<ProcessPlan>,
    },
    /// Processes: every pair over the network (`exec::net`).
    Network(NetPlan),
    /// Processes on several machines: CUDA IPC inside a machine, the network across
    /// (`exec::hybrid`).
    Hybrid(NetPlan),
}

impl std::fmt::Debug for CallPlan {
    /// A summary (the schedule's and groups' sizes, not their contents).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallPlan::Shot { shot, count, in_place } => f
                .debug_struct("Shot")
                .field("shot", shot)
                .field("count", count)
                .field("in_place", in_place)
                .finish(),
            CallPlan::CopyEngine(p) => f
                .debug_struct("CopyEngine")
                .field("nranks", &p.nranks)
                .field("ops", &p.ops.len())
                .finish(),
            CallPlan::Ring { chunk, prepared } => f
                .debug_struct("Ring")
                .field("chunk", chunk)
                .field("steps", &prepared.schedule.steps.len())
                .finish(),
            CallPlan::ProcessShot { shot, count, scratch } => f
                .debug_struct("ProcessShot")
                .field("shot", shot)
                .field("count", count)
                .field("scratch", scratch)
                .finish(),
            CallPlan::ProcessShotChunks { shot, count, chunk, scratch } => f
                .debug_struct("ProcessShotChunks")
                .field("shot", shot)
                .field("count", count)
                .field("chunk", chunk)
                .field("scratch", scratch)
                .finish(),
            CallPlan::ProcessPeers { collective } => {
                f.debug_struct("ProcessPeers").field("collective", collective).finish()
            }
            CallPlan::ProcessLl { count } => f.debug_struct("ProcessLl").field("count", count).finish(),
            CallPlan::ProcessLlGather { sendcount } => {
                f.debug_struct("ProcessLlGather").field("sendcount", sendcount).finish()
            }
            CallPlan::ProcessLlReduceScatter { recvcount } => {
                f.debug_struct("ProcessLlReduceScatter").field("recvcount", recvcount).finish()
            }
            CallPlan::ProcessLlBroadcast { bytes, root } => f
                .debug_struct("ProcessLlBroadcast")
                .field("bytes", bytes)
                .field("root", root)
                .finish(),
            CallPlan::ProcessLlReduce { count, root } => f
                .debug_struct("ProcessLlReduce")
                .field("count", count)
                .field("root", root)
                .finish(),
            CallPlan::ProcessRing { chunk, plan } => f
                .debug_struct("ProcessRing")
                .field("chunk", chunk)
                .field("steps", &plan.prepared.schedule.steps.len())
                .field("signals", &plan.signals.count.iter().sum::<u64>())
                .finish(),
            CallPlan::Network(p) | CallPlan::Hybrid(p) => f
                .debug_struct(if matches!(self, CallPlan::Network(_)) { "Network" } else { "Hybrid" })
                .field("hierarchical", &p.hierarchical)
                .field("groups", &p.groups.len())
                .field("unit", &p.unit)
                .finish(),
        }
    }
}

impl CallPlan {
    /// The algorithm the plan runs ([`Algorithm`]; the network plans count as the ring).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn algorithm(&self) -> Algorithm {
        match self {
            CallPlan::Shot { shot: Shot::One, .. }
            | CallPlan::ProcessShot { shot: Shot::One, .. }
            | CallPlan::ProcessLl { .. }
            | CallPlan::ProcessLlGather { .. }
            | CallPlan::ProcessLlReduceScatter { .. }
            | CallPlan::ProcessLlBroadcast { .. }
            | CallPlan::ProcessLlReduce { .. } => Algorithm::OneShot,
            CallPlan::Shot { .. } | CallPlan::ProcessShot { .. } | CallPlan::ProcessShotChunks { .. } => {
                Algorithm::TwoShot
            }
            CallPlan::CopyEngine(_) => Algorithm::CopyEngine,
            CallPlan::Ring { .. }
            | CallPlan::ProcessRing { .. }
            | CallPlan::ProcessPeers { .. }
            | CallPlan::Network(_)
            | CallPlan::Hybrid(_) => Algorithm::Ring,
        }
    }
}

/// The plan of `call` on the communicator `view` shows, with `config`; the flag says whether
/// it was built now (a call shape whose schedule was not in the cache: `RINGCCL_DEBUG=info`
/// reports it). A count of 0 is the caller's (it enqueues nothing and asks for no plan).
///
/// Errors: [`Error::Network`] for a rank of a job of processes with a peer on another machine
/// and no network path; [`Error::InvalidArgument`] (on [`crate::Arg::Stream`]) for a call of a
/// rank of a job of processes being captured into a CUDA graph that only the ring, the network
/// path or signals could run ([`capture_limit`]); [`Error::Internal`] where a plan cannot be built (a malformed
/// schedule, sizes that overflow).
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::{choose, CallPlan, CallShape, CommView, LocalView, Shot};
/// use ringccl::internals::plan::PlanCache;
/// use ringccl::internals::schedule::Layout;
/// use ringccl::{Config, DataType};
/// let plans = PlanCache::default();
/// let view = CommView::Local(LocalView {
///     ring: &[0, 1],
///     oneshot_usable: true,
///     copy_engine_usable: true,
///     capturing: false,
///     sms: &|| 132,
///     plans: &plans,
/// });
/// let call = CallShape {
///     collective: Collective::AllReduce { count: 1024 },
///     dtype: DataType::F32,
///     layout: Layout::SendInRecv { stride: 0 },
/// };
/// let (plan, _) = choose(&call, &view, &Config::default())?;
/// assert_eq!(plan, CallPlan::Shot { shot: Shot::One, count: 1024, in_place: true });
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn choose(call: &CallShape, view: &CommView<'_>, config: &Config) -> Result<(CallPlan, bool)> {
    match view {
        CommView::Local(v) => choose_local(call, v, config),
        CommView::Process(v) => choose_process(call, v, config),
    }
}

fn two_shot_chosen_for(c: Collective) -> Error {
    Error::Internal {
        reason: format!("two-shot chosen for a {}", c.name()),
    }
}

fn choose_local(call: &CallShape, v: &LocalView<'_>, config: &Config) -> Result<(CallPlan, bool)> {
    let (c, dtype, layout) = (call.collective, call.dtype, call.layout);
    let n = v.ring.len();
    let max_bytes = c.max_elems(n).unwrap_or(0).saturating_mul(dtype.size());
    let ce_possible = v.copy_engine_usable && !v.capturing;
    let algorithm = match c {
        Collective::AllReduce { .. } => {
            tuning::all_reduce_algorithm(max_bytes, n, v.oneshot_usable, ce_possible, v.capturing, config)
        }
        c if twoshot_other(c)
            && tuning::twoshot_algorithm(max_bytes, n, v.oneshot_usable && ce_possible, false, config)
                == Algorithm::TwoShot =>
        {
            Algorithm::TwoShot
        }
        Collective::AllGather { .. } | Collective::Broadcast { .. } | Collective::AllToAll { .. }
            if tuning::copies_on_copy_engines(
                max_bytes,
                matches!(c, Collective::Broadcast { .. }),
                ce_possible,
                config,
            ) =>
        {
            Algorithm::CopyEngine
        }
        _ => Algorithm::Ring,
    };
    let in_place = layout != Layout::OutOfPlace;
    let plan = match algorithm {
        Algorithm::OneShot => CallPlan::Shot {
            shot: Shot::One,
            count: c.count(),
            in_place,
        },
        Algorithm::TwoShot => CallPlan::Shot {
            shot: Shot::Two {
                blocks: tuning::twoshot_blocks(max_bytes, n, (v.sms)()),
                of: twoshot_of(c).ok_or_else(|| two_shot_chosen_for(c))?,
            },
            count: c.count(),
            in_place,
        },
        Algorithm::CopyEngine => CallPlan::CopyEngine(match c {
            Collective::AllReduce { count } => {
                let chunk = tuning::ce_chunk_elems(max_bytes, n, dtype, config);
                super::copy_engine::plan(v.ring, count, chunk, tuning::CE_SLOTS)?
            }
            Collective::AllGather { sendcount } => super::copy_engine::all_gather(n, sendcount, in_place),
            Collective::Broadcast { count, root } => super::copy_engine::broadcast(n, count, root, in_place),
            Collective::AllToAll { count_per_peer } => super::copy_engine::all_to_all(n, count_per_peer),
            c => {
                return Err(Error::Internal {
                    reason: format!("the copy engines chosen for a {}", c.name()),
                })
            }
        }),
        Algorithm::Ring => {
            let chunk = tuning::chunk_elems(max_bytes, n, dtype, config);
            let key = c.schedule_key(layout, chunk);
            let (prepared, new) = v
                .plans
                .get_or_build(key, || Prepared::new(c.schedule(v.ring, layout, chunk)))?;
            return Ok((CallPlan::Ring { chunk, prepared }, new));
        }
    };
    Ok((plan, false))
}

fn choose_process(call: &CallShape, v: &ProcessView<'_>, config: &Config) -> Result<(CallPlan, bool)> {
    let (c, dtype, layout) = (call.collective, call.dtype, call.layout);
    let (n, size) = (v.nranks, dtype.size());
    let max_bytes = c.max_elems(n).unwrap_or(0).saturating_mul(size);
    if v.capturing && v.net.is_some() {
        return Err(not_capturable(call, v, config, "over the network path"));
    }
    if let Some(net) = &v.net {
        // Some ranks are on other machines (or every pair is forced onto the network): the
        // collective as groups of point-to-point transfers, receives combined by a reduce
        // kernel where it reduces (`plan::net`). Each group's transfers with ranks of this
        // machine go over CUDA IPC, the others over the network (`exec::hybrid`); all-reduce,
        // all-gather and broadcast are hierarchical where every machine has as many ranks, two
        // or more (`plan::net::hierarchical`).
        let in_place = layout != Layout::OutOfPlace;
        let what = (c.kind(), c.count(), c.root().unwrap_or(0));
        let hierarchical = match net.all {
            false => super::net::hierarchical(what, v.rank, net.machines, size, in_place),
            true => None,
        };
        let plan = NetPlan {
            hierarchical: hierarchical.is_some(),
            groups: hierarchical.unwrap_or_else(|| super::net::groups(what, (v.rank, n), size, in_place)),
            unit: c.count().saturating_mul(size),
        };
        return Ok((if net.all { CallPlan::Network(plan) } else { CallPlan::Hybrid(plan) }, false));
    }
    if let Some(q) = (v.remote_peer)() {
        return Err(Error::Network {
            rank: Some(v.rank),
            peer: Some(q),
            reason: format!(
                "rank {q} runs on another machine: it is reached only over the network \
                 transport (RINGCCL_NET=ucx)"
            ),
        });
    }
    let algorithm = if v.capturing && n == 1 {
        // One rank: the ring, a copy on its own buffers with no signal, is captured.
        None
    } else if v.capturing {
        match capture_algorithm(c, max_bytes, n, config) {
            Some(a) => Some(a),
            None => {
                return match captured_chunks(c, size, n, config, || (v.sms)()).or_else(|| captured_peers(c, n)) {
                    Some(plan) => Ok((plan, false)),
                    None => Err(not_capturable(call, v, config, "")),
                }
            }
        }
    } else {
        match c {
            Collective::AllReduce { .. } => Some(tuning::process_all_reduce_algorithm(max_bytes, n, config)),
            c if twoshot_other(c) => Some(tuning::twoshot_algorithm(max_bytes, n, true, true, config)),
            _ => None,
        }
    };
    if let Collective::AllGather { sendcount } = c {
        if algorithm == Some(Algorithm::TwoShot) && ll_gather_fits(c, sendcount.saturating_mul(size), n, config) {
            return Ok((CallPlan::ProcessLlGather { sendcount }, false));
        }
    }
    if let Collective::ReduceScatter { recvcount } = c {
        if algorithm == Some(Algorithm::TwoShot) && ll_reduce_scatter_fits(c, recvcount.saturating_mul(size), n, config)
        {
            return Ok((CallPlan::ProcessLlReduceScatter { recvcount }, false));
        }
    }
    let bytes = c.count().saturating_mul(size);
    if algorithm == Some(Algorithm::TwoShot) && ll_rooted_fits(c, bytes, n, config) {
        match c {
            Collective::Broadcast { root, .. } => return Ok((CallPlan::ProcessLlBroadcast { bytes, root }, false)),
            Collective::Reduce { count, root } => return Ok((CallPlan::ProcessLlReduce { count, root }, false)),
            _ => {}
        }
    }
    let shot = match algorithm {
        Some(Algorithm::OneShot) => Some(Shot::One),
        Some(Algorithm::TwoShot) => Some(Shot::Two {
            blocks: tuning::twoshot_blocks(max_bytes, n, (v.sms)()),
            of: twoshot_of(c).ok_or_else(|| two_shot_chosen_for(c))?,
        }),
        _ => None,
    };
    if let Some(shot) = shot {
        let count = c.count();
        if shot == Shot::One && ll_fits(c, bytes, n, config) {
            return Ok((CallPlan::ProcessLl { count }, false));
        }
        let scratch = scratch_for(shot, bytes, n).ok_or_else(|| Error::Internal {
            reason: format!("a call of {bytes} bytes per rank overflows the scratch size"),
        })?;
        return Ok((CallPlan::ProcessShot { shot, count, scratch }, false));
    }
    let chunk = tuning::chunk_elems(max_bytes, n, dtype, config);
    let key = c.schedule_key(layout, chunk);
    let (plan, new) = v
        .plans
        .get_or_build(key, || ProcessPlan::new(&c.schedule(v.ring, layout, chunk)))?;
    Ok((CallPlan::ProcessRing { chunk, plan }, new))
}

/// Whether an all-reduce of `bytes` per rank among `nranks` processes, which would run
/// one-shot, runs on the LL push kernel instead: 2 to `MAX_RANKS` ranks, at most
/// [`Config::ll_max_bytes`] and the LL area's `gpu_kernels::ll::LL_MAX_BYTES`, and one-shot
/// not forced ([`Config::algorithm`]: `RINGCCL_ALGO=oneshot` means the one-shot kernel). The LL kernel
/// also needs 8-byte aligned buffers; a call on others runs one-shot (`exec::ll`).
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::ll_fits;
/// use ringccl::Config;
/// let c = Config::default();
/// let ar = Collective::AllReduce { count: 1024 };
/// assert!(ll_fits(ar, 4096, 2, &c));
/// assert!(!ll_fits(ar, 64 << 10, 2, &c));
/// assert!(!ll_fits(ar, 4096, 9, &c));
/// assert!(!ll_fits(Collective::AllGather { sendcount: 1024 }, 4096, 2, &c));
/// let mut forced = Config::default();
/// forced.algorithm = Some(ringccl::Algorithm::OneShot);
/// assert!(!ll_fits(ar, 4096, 2, &forced));
/// ```
pub fn ll_fits(c: Collective, bytes: usize, nranks: usize, config: &Config) -> bool {
    matches!(c, Collective::AllReduce { .. })
        && config.algorithm != Some(Algorithm::OneShot)
        && (2..=gpu_kernels::ctl::MAX_RANKS).contains(&nranks)
        && bytes <= config.ll_max_bytes.min(gpu_kernels::ll::LL_MAX_BYTES)
}

/// Whether an all-gather of `bytes` per rank among `nranks` processes of one machine, which
/// would run on the two-shot kernel's barriers, runs on the LL all-gather kernel instead:
/// [`Config::ll_all_gather`] on, no algorithm forced, 2 to `MAX_RANKS` ranks, at most
/// [`Config::ll_max_bytes`] and the LL area's `gpu_kernels::ll::LL_MAX_BYTES` per rank.
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::ll_gather_fits;
/// use ringccl::Config;
/// let ag = Collective::AllGather { sendcount: 1024 };
/// let on = Config::default();
/// assert!(ll_gather_fits(ag, 4096, 2, &on), "on by default");
/// assert!(!ll_gather_fits(ag, 64 << 10, 2, &on));
/// assert!(!ll_gather_fits(Collective::AllReduce { count: 1024 }, 4096, 2, &on));
/// let mut off = Config::default();
/// off.ll_all_gather = false;
/// assert!(!ll_gather_fits(ag, 4096, 2, &off));
/// ```
pub fn ll_gather_fits(c: Collective, bytes: usize, nranks: usize, config: &Config) -> bool {
    matches!(c, Collective::AllGather { .. }) && config.ll_all_gather && ll_sized(bytes, nranks, config)
}

/// Whether a reduce-scatter of `bytes` per rank (of the output) among `nranks` processes of
/// one machine, which would run on the two-shot kernel's barriers, runs on the LL kernel
/// instead (`scatter`: each peer gets its block of the input as packets): no algorithm
/// forced, 2 to `MAX_RANKS` ranks, at most [`Config::ll_max_bytes`] and the LL area's
/// `gpu_kernels::ll::LL_MAX_BYTES` per rank (`RINGCCL_LL_MAX_BYTES=0` turns it off with the
/// LL all-reduce).
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::ll_reduce_scatter_fits;
/// use ringccl::Config;
/// let rs = Collective::ReduceScatter { recvcount: 1024 };
/// let c = Config::default();
/// assert!(ll_reduce_scatter_fits(rs, 4096, 2, &c));
/// assert!(!ll_reduce_scatter_fits(rs, 64 << 10, 2, &c));
/// assert!(!ll_reduce_scatter_fits(rs, 4096, 9, &c));
/// assert!(!ll_reduce_scatter_fits(Collective::AllGather { sendcount: 1024 }, 4096, 2, &c));
/// let mut off = Config::default();
/// off.ll_max_bytes = 0;
/// assert!(!ll_reduce_scatter_fits(rs, 4096, 2, &off));
/// ```
pub fn ll_reduce_scatter_fits(c: Collective, bytes: usize, nranks: usize, config: &Config) -> bool {
    matches!(c, Collective::ReduceScatter { .. }) && ll_sized(bytes, nranks, config)
}

/// Whether a broadcast or reduce of `bytes` among `nranks` processes of one machine, which
/// would run on the two-shot kernel's barriers, runs on the LL all-reduce kernel instead (a
/// broadcast as a sum of the root's bytes and the others' zeros, a reduce with the non-roots'
/// results left in their sinks): no algorithm forced, 2 to `MAX_RANKS` ranks, at most
/// [`Config::ll_max_bytes`] and the LL area's `gpu_kernels::ll::LL_MAX_BYTES`
/// (`RINGCCL_LL_MAX_BYTES=0` turns it off with the other LL kernels).
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::ll_rooted_fits;
/// use ringccl::Config;
/// let c = Config::default();
/// let bc = Collective::Broadcast { count: 1024, root: 1 };
/// assert!(ll_rooted_fits(bc, 4096, 2, &c));
/// assert!(ll_rooted_fits(Collective::Reduce { count: 1024, root: 0 }, 4096, 4, &c));
/// assert!(!ll_rooted_fits(bc, 64 << 10, 2, &c));
/// assert!(!ll_rooted_fits(Collective::AllGather { sendcount: 1024 }, 4096, 2, &c));
/// let mut off = Config::default();
/// off.ll_max_bytes = 0;
/// assert!(!ll_rooted_fits(bc, 4096, 2, &off));
/// ```
pub fn ll_rooted_fits(c: Collective, bytes: usize, nranks: usize, config: &Config) -> bool {
    matches!(c, Collective::Broadcast { .. } | Collective::Reduce { .. }) && ll_sized(bytes, nranks, config)
}

/// What the LL all-gather, reduce-scatter, broadcast and reduce need: no algorithm forced, 2 to `MAX_RANKS`
/// ranks, at most [`Config::ll_max_bytes`] and the LL area's payload per rank.
fn ll_sized(bytes: usize, nranks: usize, config: &Config) -> bool {
    config.algorithm.is_none()
        && (2..=gpu_kernels::ctl::MAX_RANKS).contains(&nranks)
        && bytes <= config.ll_max_bytes.min(gpu_kernels::ll::LL_MAX_BYTES)
}

/// The largest call (bytes per rank; the larger buffer of the collectives but the all-reduce)
/// of `c` that a rank of a job of `nranks` processes can capture into a CUDA graph with
/// `config` as one one-shot or two-shot kernel, `None` where none can: their barrier epochs
/// live on the device and they stage through the exported scratch at fixed addresses, so a
/// replay is right however many calls, eager or replayed, ran before. (Above it, some
/// collectives are captured as several such kernels, [`captured_chunks`], or as a
/// point-to-point kernel group, [`captured_peers`].) The ring through the scratch and the
/// network path number their signals on the host, and those numbers would be frozen into the
/// graph. A job of one process
/// captures every collective at any size: its ring is a copy on its own buffers, with no signal.
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::capture_limit;
/// use ringccl::Config;
/// let c = Config::default();
/// assert_eq!(capture_limit(Collective::AllReduce { count: 1 }, 2, &c), Some(c.twoshot_max_bytes));
/// assert_eq!(capture_limit(Collective::AllGather { sendcount: 1 }, 4, &c), Some(c.twoshot_max_bytes));
/// assert_eq!(capture_limit(Collective::Gather { sendcount: 1, root: 0 }, 2, &c), None);
/// assert_eq!(capture_limit(Collective::AllReduce { count: 1 }, 16, &c), None);
/// assert_eq!(capture_limit(Collective::Gather { sendcount: 1, root: 0 }, 1, &c), Some(usize::MAX));
/// ```
pub fn capture_limit(c: Collective, nranks: usize, config: &Config) -> Option<usize> {
    if nranks == 1 {
        return Some(usize::MAX);
    }
    if !(2..=gpu_kernels::oneshot::MAX_RANKS).contains(&nranks) {
        return None;
    }
    let of = twoshot_of(c)?;
    match (config.algorithm, of) {
        (Some(Algorithm::OneShot), TwoShotOf::AllReduce) | (Some(Algorithm::TwoShot), _) => Some(usize::MAX),
        (_, TwoShotOf::AllReduce) => Some(config.oneshot_max_bytes.max(config.twoshot_max_bytes)),
        _ => Some(config.twoshot_max_bytes),
    }
}

/// The plan of a call of `c` (elements of `size` bytes) among `nranks` processes captured
/// into a CUDA graph above [`capture_limit`]: for an all-reduce, broadcast or reduce, the
/// two-shot kernel over consecutive chunks of at most the limit (rounded down to 256 bytes),
/// each of which fits the scratch every communicator among processes starts with
/// (`transport::ipc::MIN_SCRATCH_BYTES`), so no eager call has to grow it first; `None` for
/// the other collectives (their blocks are strided by the whole count), where the limit is 0
/// or the kernel cannot run (more than `MAX_RANKS` ranks). `sms`: the two-shot grid cap, asked
/// only for a plan.
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::{captured_chunks, CallPlan};
/// use ringccl::Config;
/// let c = Config::default();
/// let big = Collective::AllReduce { count: 10 << 20 }; // 40 MiB of f32
/// let Some(CallPlan::ProcessShotChunks { count, chunk, .. }) = captured_chunks(big, 4, 2, &c, || 66) else {
///     panic!("chunked")
/// };
/// assert_eq!((count, chunk), (10 << 20, (8 << 20) / 4));
/// assert!(captured_chunks(Collective::AllGather { sendcount: 10 << 20 }, 4, 2, &c, || 66).is_none());
/// assert!(captured_chunks(big, 4, 9, &c, || 66).is_none());
/// ```
pub fn captured_chunks(
    c: Collective,
    size: usize,
    nranks: usize,
    config: &Config,
    sms: impl FnOnce() -> u32,
) -> Option<CallPlan> {
    if !matches!(
        c,
        Collective::AllReduce { .. } | Collective::Broadcast { .. } | Collective::Reduce { .. }
    ) {
        return None;
    }
    let limit = capture_limit(c, nranks, config)?;
    let chunk = (limit.min(crate::transport::ipc::MIN_SCRATCH_BYTES / 2) / 256 * 256) / size.max(1);
    if chunk == 0 {
        return None;
    }
    let bytes = chunk * size;
    let shot = Shot::Two {
        blocks: tuning::twoshot_blocks(bytes, nranks, sms()),
        of: twoshot_of(c)?,
    };
    let scratch = scratch_for(shot, bytes, nranks)?;
    if scratch > crate::transport::ipc::MIN_SCRATCH_BYTES {
        return None;
    }
    Some(CallPlan::ProcessShotChunks {
        shot,
        count: c.count(),
        chunk,
        scratch,
    })
}

/// The plan of a gather, scatter, all-to-all, all-gather or reduce-scatter among `nranks`
/// processes of one machine captured into a CUDA graph where the two-shot kernel cannot take
/// it (its size, or a gather or scatter): one group of the point-to-point kernel (a
/// reduce-scatter's followed by a local reduction), for 2 to its `MAX_RANKS` ranks; `None`
/// otherwise.
///
/// ```
/// use ringccl::internals::api::collective::Collective;
/// use ringccl::internals::plan::call::{captured_peers, CallPlan};
/// let g = Collective::Gather { sendcount: 4, root: 0 };
/// assert!(matches!(captured_peers(g, 4), Some(CallPlan::ProcessPeers { .. })));
/// assert!(captured_peers(g, 9).is_none());
/// assert!(captured_peers(Collective::Broadcast { count: 4, root: 0 }, 4).is_none());
/// ```
pub fn captured_peers(c: Collective, nranks: usize) -> Option<CallPlan> {
    let kind = matches!(
        c,
        Collective::Gather { .. }
            | Collective::Scatter { .. }
            | Collective::AllToAll { .. }
            | Collective::AllGather { .. }
            | Collective::ReduceScatter { .. }
    );
    (kind && (2..=gpu_kernels::p2p::MAX_RANKS).contains(&nranks)).then_some(CallPlan::ProcessPeers { collective: c })
}

/// The kernel a captured call of `c` (`bytes` per rank, as [`capture_limit`] counts them) runs
/// among `nranks` processes: the one-shot or two-shot kernel, forced or by size, whatever
/// [`Config::algorithm`] forces otherwise (the ring cannot be captured there); `None` where
/// the call cannot be captured.
fn capture_algorithm(c: Collective, bytes: usize, nranks: usize, config: &Config) -> Option<Algorithm> {
    if bytes > capture_limit(c, nranks, config)? {
        return None;
    }
    let all_reduce = matches!(c, Collective::AllReduce { .. });
    Some(match config.algorithm {
        Some(Algorithm::OneShot) if all_reduce => Algorithm::OneShot,
        Some(Algorithm::TwoShot) => Algorithm::TwoShot,
        _ if all_reduce && bytes <= config.oneshot_max_bytes => Algorithm::OneShot,
        _ => Algorithm::TwoShot,
    })
}

/// The error of a call of a rank of a job of processes that cannot be captured into a CUDA
/// graph (`how`: what makes it impossible beyond its size and kind, or empty).
fn not_capturable(call: &CallShape, v: &ProcessView<'_>, config: &Config, how: &str) -> Error {
    let c = call.collective;
    let bytes = c.max_elems(v.nranks).unwrap_or(0).saturating_mul(call.dtype.size());
    let what = format!("this {} of {bytes} bytes", c.name());
    let reason = if !how.is_empty() {
        format!(
            "{what} cannot be captured into a CUDA graph in a job of processes {how} yet (its \
             signals are numbered on the host): call it eagerly"
        )
    } else {
        let ranks = 2..=gpu_kernels::oneshot::MAX_RANKS.min(gpu_kernels::p2p::MAX_RANKS);
        match capture_limit(c, v.nranks, config) {
            _ if !ranks.contains(&v.nranks) => format!(
                "{what} cannot be captured into a CUDA graph in a job of processes yet (jobs of 2 \
                 to {} processes can; this one has {}): call it eagerly",
                ranks.end(),
                v.nranks
            ),
            Some(max) => format!(
                "{what} cannot be captured into a CUDA graph in a job of processes yet (sizes up \
                 to {max} bytes can, RINGCCL_TWOSHOT_MAX_BYTES; above that all-reduces, \
                 broadcasts and reduces in chunks of that size, the other collectives as \
                 point-to-point groups): call it eagerly, or split it"
            ),
            None => format!(
                "{what} cannot be captured into a CUDA graph in a job of processes yet: call it \
                 eagerly"
            ),
        }
    };
    Error::invalid(Some(v.rank), crate::Arg::Stream, reason)
}

#[cfg(test)]
mod tests;
