//! The communicator, of either kind: one process driving one rank per GPU
//! ([`Communicator::new`]), or one rank of a job of processes ([`Communicator::init_rank`]).
//!
//! A [`Communicator`] owns, for each rank it holds, the rank's
//! [resources](crate::resources) (context, a stream of its own, kernels, scratch, events, the
//! one-shot flags), the [transport](crate::transport) between the ranks (which rank reaches
//! which directly), the ring order of the ring collectives (chosen once, at creation, from the
//! driver's link scores by [`crate::plan::topology::best_ring`], or fixed by [`Config::ring`]),
//! its [`Config`], and the cache of prepared schedules; a rank of a job of processes also its
//! [`ProcessRank`] (the bootstrap, the mapped windows of the peers, the network path).
//!
//! Collectives take `&self` (their code is in [`crate::api`]); the per-call state sits behind
//! one mutex, held for the whole of a call's issue (the per-call [`Handle`](crate::exec::Handle)
//! of `handle`), so calls from several threads are issued one after the other and each call
//! sees consistent scratch and events.
//!
//! * here: the type and what it reports about itself;
//! * `create`: the constructors of one process;
//! * `process`: a rank of a job of processes (its state, its constructors);
//! * `handle`: the per-call handles the executors work through;
//! * `wait`: synchronize, abort, and the async error;
//! * `graphs`: CUDA graphs that outlive the communicator;
//! * `drop`: the drop, which waits for the work first.

mod create;
mod drop;
mod graphs;
mod handle;
mod process;
mod register;
/// `Communicator::split` and `Communicator::shrink`.
mod split;
mod wait;

pub use register::{Registered, RegistrationId};
pub use split::PendingCommunicator;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream};

use crate::config::Config;
use crate::plan::PlanCache;
use crate::resources::rank_threads::RankThreads;
use crate::resources::{GraphHold, Health, RankResources, RankState};
use crate::transport::Transport;

pub(crate) use process::ProcessRank;

/// A group of GPUs in this process that run collectives together, one rank per GPU.
///
/// `Communicator` is `Send + Sync`: collectives take `&self` and may be called from several
/// threads (they are issued one after the other).
///
/// ```no_run
/// use ringccl::Communicator;
/// let comm = Communicator::all()?; // every visible GPU, rank i = device i
/// println!("{} ranks; rank 0 is {}", comm.nranks(), comm.device_name(0));
/// # Ok::<(), ringccl::Error>(())
/// ```
pub struct Communicator {
    /// The resources of the ranks this communicator holds (`local`).
    ranks: Vec<RankResources>,
    /// The ranks held here: all of them, or this process's one.
    local: Vec<usize>,
    /// Each rank's own stream (also in `ranks`), as one slice for [`Communicator::streams`].
    streams: Vec<Arc<CudaStream>>,
    transport: Transport,
    /// The ring order of the ring collectives: a permutation of `0..n`, fixed at creation.
    ring: Vec<usize>,
    config: Config,
    state: Mutex<Vec<RankState>>,
    /// Set when a one-shot call failed after some ranks' kernels were launched: their device
    /// epochs may disagree from then on, so this communicator uses the ring for good.
    oneshot_broken: AtomicBool,
    /// What this kind of communicator holds beside what both kinds hold.
    kind: Kind,
    /// The control block, the timeout and the first failure (see [`Health`]).
    health: Arc<Health>,
    /// `CUDA_LAUNCH_BLOCKING=1`: a launch returns only once its kernel has run, so kernels that
    /// meet other ranks' kernels of this process (the one-shot all-reduce) cannot be used.
    launch_blocking: bool,
    /// Shared with every CUDA graph that captured a call of this communicator: the device
    /// resources move here on drop while such a graph exists (see [`GraphHold`]).
    graphs: Arc<GraphHold>,
}

/// The two kinds of communicator: what each holds beside what both hold.
pub(crate) enum Kind {
    /// One process driving every rank.
    Local {
        /// The ring schedules by call shape.
        plans: PlanCache,
        /// One host thread per GPU but the first, for the enqueue of small eager calls
        /// ([`Config::rank_threads`]; none for one GPU).
        rank_threads: Option<RankThreads>,
    },
    /// One rank of a job of processes: the rest of the job as this rank sees it.
    Process(Box<ProcessRank>),
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field(
                "ordinals",
                &self.ranks.iter().map(|r| r.ordinal).collect::<Vec<_>>(),
            )
            .field("transport", &self.transport)
            .field("ring", &self.ring)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// The number of ranks.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// assert!(comm.nranks() >= 1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn nranks(&self) -> usize {
        self.process().map_or(self.ranks.len(), |p| p.nranks)
    }

    /// The ranks this communicator holds, in the order its calls take their arguments: every
    /// rank for a communicator of one process ([`Communicator::new`], [`Communicator::all`]),
    /// its own rank for one of a job of processes ([`Communicator::init_rank`]).
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::all()?;
    /// assert_eq!(comm.local_ranks().len(), comm.nranks());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn local_ranks(&self) -> &[usize] {
        &self.local
    }

    /// The index among this communicator's own ranks of `rank`.
    ///
    /// # Panics
    /// If this communicator does not hold `rank` (like slice indexing).
    fn held(&self, rank: usize) -> usize {
        match self.process() {
            None => rank,
            Some(p) if p.rank == rank => 0,
            Some(p) => panic!(
                "rank {rank} is not held by this communicator (it holds rank {} of {})",
                p.rank, p.nranks
            ),
        }
    }

    /// The device ordinal of `rank`.
    ///
    /// # Panics
    /// If this communicator does not hold `rank` ([`Communicator::local_ranks`]), like slice
    /// indexing.
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::new(&[1, 0])?;
    /// assert_eq!(comm.ordinal(0), 1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn ordinal(&self, rank: usize) -> usize {
        self.ranks[self.held(rank)].ordinal
    }

    /// The context of `rank`'s device (its primary context): allocate buffers for `rank` with
    /// a stream of this context.
    ///
    /// # Panics
    /// If this communicator does not hold `rank` ([`Communicator::local_ranks`]).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// let buf = comm.stream(0).alloc_zeros::<f32>(1024).unwrap();
    /// assert_eq!(buf.context().ordinal(), comm.context(0).ordinal());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn context(&self, rank: usize) -> &Arc<CudaContext> {
        &self.ranks[self.held(rank)].ctx
    }

    /// A non-blocking stream of `rank` that the communicator created, for callers that do not
    /// bring their own.
    ///
    /// # Panics
    /// If this communicator does not hold `rank` ([`Communicator::local_ranks`]).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// let s = comm.stream(0);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn stream(&self, rank: usize) -> &Arc<CudaStream> {
        &self.streams[self.held(rank)]
    }

    /// The device name of `rank` (e.g. `"NVIDIA H200"`).
    ///
    /// # Panics
    /// If this communicator does not hold `rank` ([`Communicator::local_ranks`]).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// println!("{}", comm.device_name(0));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn device_name(&self, rank: usize) -> &str {
        &self.ranks[self.held(rank)].name
    }

    /// Whether `rank`'s kernels read and write `peer`'s memory directly (always true for
    /// `rank == peer`; false everywhere else with `RINGCCL_P2P_DISABLE=1`, or out of range).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// if comm.nranks() > 1 && !comm.peer_access(0, 1) {
    ///     println!("ranks 0 and 1 exchange data through staged copies");
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn peer_access(&self, rank: usize, peer: usize) -> bool {
        match self.process() {
            // Ranks of other processes reach each other's communication buffers (CUDA IPC).
            Some(p) => rank < p.nranks && peer < p.nranks,
            None => self.transport.direct(rank, peer),
        }
    }

    /// The ring order of the ring collectives (all but send/recv and the one-shot all-reduce):
    /// a permutation of the ranks `0..nranks()`; each step of a ring collective moves data
    /// between neighbours of this order (`ring[i]` and `ring[i + 1]`, wrapping round, so
    /// `ring[n - 1]` and `ring[0]` too). Fixed at creation: from
    /// `RINGCCL_RING` if set, otherwise the ring whose weakest link (then whose sum of links)
    /// is best by the driver's peer-to-peer performance ranks; the identity `0, 1, …` for 3
    /// ranks or fewer, with `RINGCCL_P2P_DISABLE=1`, or when all links are alike.
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::all()?;
    /// let ring = comm.ring();
    /// assert_eq!(ring.len(), comm.nranks());
    /// println!("ring order: {ring:?}");
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn ring(&self) -> &[usize] {
        &self.ring
    }

    /// The communicator's configuration.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// println!("{:?}", comm.config());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Every rank's own stream, in rank order: pass it to a collective when the communicator's
    /// streams are the ones to use.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io, RedOp};
    /// let comm = Communicator::all()?;
    /// let mut bufs = (0..comm.nranks())
    ///     .map(|r| comm.stream(r).alloc_zeros::<f32>(256))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
    /// comm.all_reduce(&mut io, 256, RedOp::Sum, comm.streams())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn streams(&self) -> &[Arc<CudaStream>] {
        &self.streams
    }

    /// The resources of `rank` (held here).
    pub(crate) fn resources(&self, rank: usize) -> &RankResources {
        &self.ranks[self.held(rank)]
    }

    /// The part of a rank of a job of processes (`None` for a communicator of one process).
    pub(crate) fn process(&self) -> Option<&ProcessRank> {
        match &self.kind {
            Kind::Process(p) => Some(p.as_ref()),
            Kind::Local { .. } => None,
        }
    }

    /// The communicator's health (control block, timeout, first failure).
    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// This communicator's kind and what it holds for it.
    pub(crate) fn kind(&self) -> &Kind {
        &self.kind
    }
}

#[cfg(test)]
mod tests;
