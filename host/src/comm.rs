//! The communicator: one rank per GPU, all in this process.
//!
//! A [`Communicator`] owns, for each rank (one per device ordinal it was built with), the
//! rank's [resources](crate::resources) (context, a stream of its own, kernels, scratch,
//! events, the one-shot flags), the [transport](crate::transport) between the ranks (which
//! rank reaches which directly), the ring order of the ring collectives (chosen once, at
//! creation, from the driver's link scores by [`crate::plan::topology::best_ring`], or fixed by
//! [`Config::ring`]), its [`Config`], and the cache of prepared schedules.
//!
//! Collectives take `&self` (their code is in [`crate::api`]); the per-call state sits behind
//! one mutex, held for the whole of a call's issue ([`crate::resources::Call`]), so calls from
//! several threads are issued one after the other and each call sees consistent scratch and
//! events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};

use crate::bootstrap::{Bootstrap, LaunchEnv, UniqueId};
use crate::config::{Config, DebugLevel, Network};
use crate::debug::report;
use crate::driver;
use crate::driver::ipc::MemOps;
use crate::exec::process::ProcessCall;
use crate::exec::Handle;
use crate::resources::rank_threads::RankThreads;
use crate::plan::{topology, PlanCache, ProcessPlan};
use crate::driver::graph::{keep_alive_in_graph, Capture};
use crate::resources::{poll_until, Call, GraphHold, Health, Probe, ProcessState, RankResources, RankState};
use crate::plan::net::Machines;
use crate::transport::ipc::{machine_id, Exchange, Windows};
use crate::transport::net::proxy::NetOptions;
use crate::transport::net::NetRank;
use crate::transport::Transport;
use crate::{Error, Result};

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
    plans: PlanCache,
    /// Set when a one-shot call failed after some ranks' kernels were launched: their device
    /// epochs may disagree from then on, so this communicator uses the ring for good.
    oneshot_broken: AtomicBool,
    /// For a rank of a job of processes: the rest of the job as this rank sees it.
    process: Option<ProcessRank>,
    /// The control block, the timeout and the first failure (see [`Health`]).
    health: Arc<Health>,
    /// `CUDA_LAUNCH_BLOCKING=1`: a launch returns only once its kernel has run, so kernels that
    /// meet other ranks' kernels of this process (the one-shot all-reduce) cannot be used.
    launch_blocking: bool,
    /// Shared with every CUDA graph that captured a call of this communicator: the device
    /// resources move here on drop while such a graph exists (see [`GraphHold`]).
    graphs: Arc<GraphHold>,
    /// One host thread per GPU but the first, for the enqueue of small eager calls
    /// ([`Config::rank_threads`]; none for one GPU or a rank of a job of processes).
    rank_threads: Option<RankThreads>,
}

/// How long the communicator's drop waits for its work after an abort or a failure (the
/// device waits end within microseconds of the abort; only work of the caller's own on the
/// streams can take longer). Past it, the communicator's memory is leaked rather than freed
/// under a running kernel.
const DRAIN_AFTER_ABORT: Duration = Duration::from_secs(10);

/// Whether `CUDA_LAUNCH_BLOCKING` asks the driver for blocking launches.
fn launch_blocking_env() -> bool {
    std::env::var("CUDA_LAUNCH_BLOCKING").is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

/// A rank of a job of processes: its bootstrap connections, the other ranks' communication
/// buffers as this process reaches them, the signal counters, and the plans for processes.
pub(crate) struct ProcessRank {
    /// This rank.
    pub rank: usize,
    /// Ranks in the job.
    pub nranks: usize,
    /// The bootstrap connections (buffer exchanges).
    pub boot: Bootstrap,
    /// The stream memory operations.
    pub memops: MemOps,
    state: Mutex<ProcessState>,
    /// Plans by call shape.
    pub plans: PlanCache<ProcessPlan>,
    /// The network path (`RINGCCL_NET=ucx`, started when some rank is on another machine or
    /// every pair is forced onto it): what goes to ranks on other machines goes through it.
    pub net: Option<Mutex<NetRank>>,
    /// Every pair goes through the network, even ranks of this machine
    /// (`RINGCCL_NET=ucx` with `RINGCCL_P2P_DISABLE=1`).
    pub net_all: bool,
    /// The ranks of each machine (the hierarchical all-reduce's layout).
    pub machines: Machines,
}

impl ProcessRank {
    /// The per-call state, locked for one call's issue.
    pub fn lock(&self) -> MutexGuard<'_, ProcessState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Exchange for Bootstrap {
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Bootstrap::all_gather(self, mine)
    }
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

/// Checks a list of device ordinals against the number of visible devices.
pub(crate) fn validate_ordinals(ordinals: &[usize], device_count: usize) -> Result<()> {
    if ordinals.is_empty() {
        return Err(Error::TooFewDevices {
            needed: 1,
            found: device_count,
        });
    }
    for (i, &o) in ordinals.iter().enumerate() {
        if o >= device_count {
            return Err(Error::BadDevice {
                ordinal: o,
                reason: format!(
                    "only {device_count} device(s) are visible (ordinals 0..{device_count})"
                ),
            });
        }
        if ordinals[..i].contains(&o) {
            return Err(Error::BadDevice {
                ordinal: o,
                reason: "it appears more than once".into(),
            });
        }
    }
    Ok(())
}

impl Communicator {
    /// A communicator over the given device ordinals (rank `i` is device `ordinals[i]`), with
    /// the configuration of the environment ([`Config::from_env`]).
    ///
    /// Enables peer access between every pair of devices that supports it (unless
    /// `RINGCCL_P2P_DISABLE=1`), loads the kernels on each device, and chooses the ring order
    /// ([`Communicator::ring`]).
    ///
    /// Errors: [`Error::NoDriver`] without the CUDA driver, [`Error::Config`] for a `RINGCCL_*`
    /// variable that is not understood (checked before any device is touched),
    /// [`Error::TooFewDevices`] for an empty list, [`Error::BadDevice`] for an ordinal that is
    /// not visible or repeated, [`Error::Kernel`] if the device cannot run ringccl's kernels,
    /// [`Error::Cuda`] otherwise.
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::new(&[0, 1])?;
    /// assert_eq!(comm.nranks(), 2);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn new(ordinals: &[usize]) -> Result<Self> {
        Self::with_config(ordinals, Config::from_env()?)
    }

    /// [`Communicator::new`] with an explicit configuration (the environment is not read).
    ///
    /// ```no_run
    /// use ringccl::{Algorithm, Communicator, Config};
    /// let mut config = Config::default();
    /// config.algorithm = Some(Algorithm::Ring);
    /// let comm = Communicator::with_config(&[0, 1], config)?;
    /// assert_eq!(comm.config().algorithm, Some(Algorithm::Ring));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn with_config(ordinals: &[usize], config: Config) -> Result<Self> {
        driver::ensure_driver()?;
        validate_ordinals(ordinals, driver::device_count()?)?;
        let n = ordinals.len();
        config.check(n)?;
        let mut ranks = Vec::with_capacity(n);
        let mut state = Vec::with_capacity(n);
        for (rank, &ordinal) in ordinals.iter().enumerate() {
            let res = RankResources::new(rank, ordinal, &config)?;
            state.push(RankState::new(&res.ctx, rank)?);
            ranks.push(res);
        }
        let ctxs: Vec<Arc<CudaContext>> = ranks.iter().map(|r| r.ctx.clone()).collect();
        let transport = Transport::connect(&ctxs, config.p2p_disable, config.debug)?;
        let (ring, how) = match &config.ring {
            Some(ring) => (ring.clone(), "RINGCCL_RING"),
            // Up to 3 ranks every ring is the same; without peer access every link scores 0.
            None if n <= 3 || config.p2p_disable => ((0..n).collect(), "device order"),
            // The topology only ranks rings: if the driver cannot describe it (an attribute
            // unsupported in some setup), device order is still a correct ring.
            None => match driver::p2p_link_scores(ordinals) {
                Ok(links) => (
                    topology::best_ring(&topology::reachable_scores(&links, |a, b| {
                        transport.direct(a, b)
                    })),
                    "link scores",
                ),
                Err(_) => ((0..n).collect(), "device order (no link scores)"),
            },
        };
        let health = match ranks.first() {
            Some(first) => Health::new(&first.ctx, (0..n).collect(), config.timeout)?,
            None => return Err(Error::TooFewDevices { needed: 1, found: 0 }),
        };
        let rank_threads = if config.rank_threads && n > 1 {
            Some(RankThreads::new(n)?)
        } else {
            None
        };
        let comm = Communicator {
            streams: ranks.iter().map(|r| r.stream.clone()).collect(),
            local: (0..n).collect(),
            ranks,
            transport,
            ring,
            config,
            state: Mutex::new(state),
            plans: PlanCache::default(),
            oneshot_broken: AtomicBool::new(false),
            process: None,
            health: Arc::new(health),
            launch_blocking: launch_blocking_env(),
            graphs: Arc::default(),
            rank_threads,
        };
        comm.report_setup(how);
        Ok(comm)
    }

    /// Rank `rank` of a job of `nranks` processes (or threads), on device `device`: like
    /// `ncclCommInitRank`. Every rank calls it with the same `id` (made once by
    /// [`UniqueId::new`] and handed to the others by any means) and returns once every rank
    /// has joined. Configured from the environment ([`Config::from_env`]).
    ///
    /// Errors: [`Error::Bootstrap`] when the ranks cannot join (a rank missing after
    /// `RINGCCL_BOOTSTRAP_TIMEOUT`, a duplicate or out-of-range rank, another job's id, …),
    /// [`Error::BadDevice`], [`Error::Kernel`], [`Error::Cuda`] as for [`Communicator::new`].
    ///
    /// ```no_run
    /// use ringccl::{Communicator, UniqueId};
    /// // In rank 0's process; the id's text goes to the others (a file, an environment variable…).
    /// let id = UniqueId::new()?;
    /// let comm = Communicator::init_rank(2, &id, 0, 0)?;
    /// assert_eq!((comm.nranks(), comm.local_ranks()), (2, &[0][..]));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize, device: usize) -> Result<Self> {
        Self::init_rank_with_config(nranks, id, rank, device, Config::from_env()?)
    }

    /// [`Communicator::init_rank`] with an explicit configuration.
    pub fn init_rank_with_config(
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        device: usize,
        config: Config,
    ) -> Result<Self> {
        driver::ensure_driver()?;
        validate_ordinals(&[device], driver::device_count()?)?;
        if rank >= nranks {
            return Err(Error::invalid(
                Some(rank),
                crate::Arg::Ranks,
                format!("rank {rank} is out of range for {nranks} ranks"),
            ));
        }
        config.check(nranks)?;
        let boot = Bootstrap::join(id, nranks, rank, config.bootstrap_timeout)?;
        let res = RankResources::new(rank, device, &config)?;
        // With the network path, ranks on other machines are reached over it only.
        let machine = machine_id(config.host_id.as_deref());
        let ucx = config.net == Network::Ucx;
        let windows = Windows::connect(&res.ctx, rank, nranks, &boot, (machine, ucx))?;
        let machines = Machines::new(windows.machines());
        // The network carries the pairs on different machines; with peer-to-peer disabled,
        // every pair. Every rank decides alike (a job on one machine has no remote rank
        // anywhere), as it must: starting the proxies is collective.
        let net_all = ucx && config.p2p_disable;
        let need_net = net_all || (ucx && windows.remote_peer().is_some());
        if need_net {
            report!(
                config.debug,
                Info,
                "rank {rank}: {} machine(s), ranks {:?}; the network carries {}",
                machines.ranks().len(),
                machines.ranks(),
                if net_all { "every pair" } else { "the pairs on different machines" }
            );
        }
        let state = ProcessState::new(&res.ctx, rank, nranks, windows)?;
        let memops = MemOps::load()?;
        let net = match need_net {
            false => None,
            true => Some(Mutex::new(NetRank::connect(
                &res.ctx,
                rank,
                nranks,
                &boot,
                NetOptions {
                    timeout: config.bootstrap_timeout,
                    lanes: config.net_lanes,
                    trace: config.debug >= DebugLevel::Trace,
                    ..NetOptions::default()
                },
            )?)),
        };
        let ctxs = [res.ctx.clone()];
        let transport = Transport::connect(&ctxs, true, config.debug)?;
        let call_state = vec![RankState::new(&res.ctx, rank)?];
        let health = Health::new(&res.ctx, vec![rank], config.timeout)?;
        let comm = Communicator {
            streams: vec![res.stream.clone()],
            local: vec![rank],
            ranks: vec![res],
            transport,
            ring: config.ring.clone().unwrap_or_else(|| (0..nranks).collect()),
            config,
            state: Mutex::new(call_state),
            plans: PlanCache::default(),
            oneshot_broken: AtomicBool::new(false),
            process: Some(ProcessRank {
                rank,
                nranks,
                boot,
                memops,
                state: Mutex::new(state),
                plans: PlanCache::default(),
                net,
                net_all,
                machines,
            }),
            health: Arc::new(health),
            launch_blocking: launch_blocking_env(),
            graphs: Arc::default(),
            rank_threads: None,
        };
        comm.report_setup("device order");
        Ok(comm)
    }

    /// This process's rank of a job started by a launcher (`ringccl-run`, torchrun, or anything
    /// that sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`; see
    /// [`LaunchEnv`]): rank `RANK` of `WORLD_SIZE` on device `LOCAL_RANK`.
    ///
    /// ```no_run
    /// // Started with `ringccl-run -n 2 my-program`:
    /// let comm = ringccl::Communicator::from_env()?;
    /// println!("rank {:?} of {}", comm.local_ranks(), comm.nranks());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn from_env() -> Result<Self> {
        let env = LaunchEnv::from_env()?.ok_or_else(|| Error::Config {
            variable: "RANK".into(),
            value: String::new(),
            reason: "RANK and WORLD_SIZE are not set: start the program with a launcher \
                     (ringccl-run -n N, torchrun), or use Communicator::all() for one process"
                .into(),
        })?;
        let id = env.unique_id()?;
        Self::init_rank(env.world_size, &id, env.rank, env.local_rank)
    }

    /// A communicator over every visible device (rank `i` = device `i`), configured from the
    /// environment.
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::all()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn all() -> Result<Self> {
        let n = driver::device_count()?;
        if n == 0 {
            return Err(Error::TooFewDevices {
                needed: 1,
                found: 0,
            });
        }
        Self::new(&(0..n).collect::<Vec<_>>())
    }

    fn report_setup(&self, ring_from: &str) {
        let debug = self.config.debug;
        let devices: Vec<String> = self
            .ranks
            .iter()
            .zip(&self.local)
            .map(|(x, r)| {
                format!(
                    "rank {r} = device {} ({}, kernels: {:?})",
                    x.ordinal,
                    x.name,
                    x.kernels.code()
                )
            })
            .collect();
        report!(debug, Info, "communicator of {} ranks: {}", self.nranks(), devices.join(", "));
        let peer = if let Some(p) = &self.process {
            match (&p.net, p.net_all) {
                (None, _) => "other ranks in other processes (CUDA IPC, signals in device memory)",
                (Some(_), true) => "other ranks in other processes, every pair over the network (UCX)",
                (Some(_), false) => {
                    "other ranks in other processes: CUDA IPC on this machine, the network (UCX) to others"
                }
            }
            .to_string()
        } else if self.transport.all_direct() {
            "peer access between every pair".to_string()
        } else {
            format!("{:?}", self.transport)
        };
        report!(debug, Info, "{peer}; ring {:?} (from {ring_from}); {:?}", self.ring, self.config);
    }

    /// The number of ranks.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// assert!(comm.nranks() >= 1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn nranks(&self) -> usize {
        self.process.as_ref().map_or(self.ranks.len(), |p| p.nranks)
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
        match &self.process {
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
        match &self.process {
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

    /// Blocks until every call issued so far through this communicator is complete, on the
    /// caller's streams as well as on the communicator's own streams; at most
    /// [`Config::timeout`] (then [`Error::Timeout`]; the communicator stays usable). Polls with
    /// growing sleeps rather than spinning. A device-side wait that gave up (a peer that never
    /// came), a fault on a rank's GPU, or an earlier failure is returned as an error (and the
    /// communicator is failed: see [`Communicator::async_error`]).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// comm.synchronize()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.wait_idle(self.config.timeout)
    }

    /// [`Communicator::synchronize`] with its own limit: waits at most `limit` for every call
    /// issued so far, then returns [`Error::Timeout`] naming the first rank whose work has not
    /// finished (nothing is aborted: call [`Communicator::abort`] to give up on the work).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// match comm.synchronize_timeout(std::time::Duration::from_secs(5)) {
    ///     Ok(()) => {}
    ///     Err(ringccl::Error::Timeout { rank, .. }) => {
    ///         eprintln!("rank {rank:?} is not done after 5 s; giving up");
    ///         comm.abort()?;
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn synchronize_timeout(&self, limit: Duration) -> Result<()> {
        self.wait_idle(Some(limit))
    }

    /// The first error of this communicator's work that the host has not been told about
    /// through a call's return, without waiting (like `ncclCommGetAsyncError`): a device-side
    /// wait that timed out (a peer that never came: [`Error::Timeout`]), a fault on a rank's GPU
    /// ([`Error::Cuda`]), an earlier failure or an abort ([`Error::Aborted`], or the failure
    /// itself). `None` while everything is fine (work may still be running). Any error marks
    /// the communicator failed: its enqueued device waits end and later calls are refused.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// if let Some(e) = comm.async_error() {
    ///     eprintln!("the communicator failed: {e}");
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn async_error(&self) -> Option<Error> {
        if let Some(e) = self.health.failure() {
            return Some(e);
        }
        if let Some(e) = self.health.device_status() {
            self.health.fail(e.clone());
            return Some(e);
        }
        if let Err(e) = self.pending_rank() {
            self.health.fail(e.clone());
            return Some(e);
        }
        None
    }

    /// Aborts the communicator (like `ncclCommAbort`, without freeing it): every rank's device
    /// waits, enqueued or running, end at once (their kernels skip the rest of their work), and
    /// every later call returns [`Error::Aborted`]. Then waits, at most [`Config::timeout`] (10 s
    /// if none), for the enqueued work to drain, so the communicator can be dropped without
    /// waiting; `Err(Error::Timeout)` if some rank's stream is still busy (with work of the
    /// caller's own: ringccl's work ends within microseconds of the abort). May be called from
    /// any thread, also while another thread is in a call or in `synchronize`. The results of
    /// aborted calls are undefined; the buffers stay valid.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// comm.abort()?;
    /// assert!(matches!(comm.synchronize(), Err(ringccl::Error::Aborted { .. })));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn abort(&self) -> Result<()> {
        self.health.fail(Error::Aborted {
            reason: "aborted by the caller".into(),
        });
        let limit = self.config.timeout.unwrap_or(DRAIN_AFTER_ABORT);
        // A rank whose context died runs nothing any more: count it as drained.
        let drained = || {
            Ok(match self.pending_rank() {
                Ok(Some(_)) => None,
                _ => Some(()),
            })
        };
        match poll_until(Some(limit), drained) {
            Ok(Some(())) => Ok(()),
            _ => Err(Error::Timeout {
                rank: self.pending_rank().ok().flatten(),
                peer: None,
                what: "draining the work of an aborted communicator".into(),
            }),
        }
    }

    /// Waits until no rank has pending work (see [`Communicator::synchronize`]).
    fn wait_idle(&self, limit: Option<Duration>) -> Result<()> {
        let done = poll_until(limit, || {
            // The first failure (it names its cause), then what the kernels reported.
            if let Some(e) = self.health.failure() {
                return Err(e);
            }
            if let Some(e) = self.health.device_status() {
                return Err(e);
            }
            Ok(self.pending_rank()?.is_none().then_some(()))
        });
        match done {
            Ok(Some(())) => Ok(()),
            Ok(None) => Err(Error::Timeout {
                rank: self.pending_rank().ok().flatten(),
                peer: None,
                what: format!(
                    "synchronize: the rank's work did not finish within {:?}",
                    limit.unwrap_or_default()
                ),
            }),
            Err(e) => {
                self.health.fail(e.clone());
                Err(e)
            }
        }
    }

    /// The first rank whose work has not finished (the end of its last call, the
    /// communicator's own stream), `None` if all are done; a CUDA error of any rank's context
    /// first (every rank is queried: a dead GPU is named even while another rank still waits).
    fn pending_rank(&self) -> Result<Option<usize>> {
        let mut pending = None;
        {
            let state = self.lock_state();
            for ((rank, st), &r) in self.ranks.iter().zip(state.iter()).zip(&self.local) {
                let probe = Probe {
                    rank: r,
                    event: st.end.cu_event(),
                    stream: Some(rank.stream.cu_stream()),
                };
                if !probe.check()? {
                    pending.get_or_insert(r);
                }
            }
        }
        if let Some(p) = &self.process {
            let done = p
                .lock()
                .end
                .try_is_complete()
                .map_err(|e| Error::cuda("cuEventQuery", Some(p.rank), e))?;
            if !done && pending.is_none() {
                pending = Some(p.rank);
            }
        }
        Ok(pending)
    }

    /// Test hook (fault injection): the next kernel launch on `rank` by a one-shot all-reduce
    /// fails as if `cuLaunchKernel` had, after the ranks before it were launched.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// comm.inject_launch_failure(1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    #[cfg(feature = "internals")]
    pub fn inject_launch_failure(&self, rank: usize) {
        self.health.inject_launch_failure(rank);
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

    /// Whether the one-shot all-reduce may be used: peer access everywhere and no earlier
    /// one-shot call failed half-launched.
    pub(crate) fn oneshot_usable(&self) -> bool {
        self.process.is_none()
            && !self.launch_blocking
            && self.transport.all_direct()
            && !self.oneshot_broken.load(Ordering::Acquire)
    }

    /// Whether the copy-engine all-reduce can run: one process, direct peer access between
    /// every pair.
    pub(crate) fn copy_engine_usable(&self) -> bool {
        self.process.is_none() && self.transport.all_direct()
    }

    /// The resources of `rank` (held here).
    pub(crate) fn resources(&self, rank: usize) -> &RankResources {
        &self.ranks[self.held(rank)]
    }

    /// The part of a rank of a job of processes (`None` for a communicator of one process).
    pub(crate) fn process(&self) -> Option<&ProcessRank> {
        self.process.as_ref()
    }

    /// The communicator's health (control block, timeout, first failure).
    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// The cache of prepared schedules.
    pub(crate) fn plans(&self) -> &PlanCache {
        &self.plans
    }

    fn lock_state(&self) -> MutexGuard<'_, Vec<RankState>> {
        // A panic while the lock was held cannot leave the state inconsistent in a way that
        // matters (events and scratch are only ever replaced whole), so recover from poisoning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many references CUDA graphs hold to communicators' device resources in this
    /// process: one per captured call, dropped when the last graph or executable graph that
    /// contains the call is destroyed and its launches have finished. A dropped communicator's
    /// resources are freed when the last reference to them goes. A diagnostic: 0 when no graph
    /// that captured a ringccl call exists.
    ///
    /// ```
    /// // Nothing has been captured in this process.
    /// assert_eq!(ringccl::Communicator::held_by_graphs(), 0);
    /// ```
    pub fn held_by_graphs() -> usize {
        crate::driver::graph::held_by_graphs()
    }

    /// Gives the graph being captured (`capture`) a reference to this communicator's device
    /// resources, so that they outlive the graph's replays even if the communicator is dropped
    /// first. Called once per captured call, before anything of it is enqueued.
    pub(crate) fn keep_alive_in(&self, capture: &Capture) -> Result<()> {
        // SAFETY: `capture` was read from the call's streams just before (`exec::capture`),
        // in the caller's thread, which is inside the call: the capture is still in progress.
        unsafe { keep_alive_in_graph(capture.graph, Arc::clone(&self.graphs)) }
    }

    /// On drop, once no work of this communicator's own is left: if CUDA graphs that captured
    /// its calls still exist, moves the device resources they use (kernels, flags, scratch,
    /// events, control block, streams) to the hold they share, to be freed with the last one.
    fn hand_over_to_graphs(&mut self) {
        if Arc::strong_count(&self.graphs) == 1 {
            return;
        }
        let state = std::mem::take(&mut *self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
        let remains = (
            std::mem::take(&mut self.ranks),
            std::mem::take(&mut self.streams),
            state,
            Arc::clone(&self.health),
        );
        self.graphs.hold(Box::new(remains));
    }

    /// The host threads of the ranks, if this communicator has them.
    pub(crate) fn rank_threads(&self) -> Option<&RankThreads> {
        self.rank_threads.as_ref()
    }

    /// Locks the communicator for one call's issue: the handle an executor works through.
    pub(crate) fn begin_call(&self) -> Call<'_> {
        Call::new(
            &self.ranks,
            &self.transport,
            self.lock_state(),
            &self.oneshot_broken,
            &self.health,
        )
    }

    /// The per-call handle of this communicator's kind, locked for one call's issue
    /// (`capturing`: the streams are being captured into a CUDA graph).
    pub(crate) fn handle(&self, capturing: bool) -> Handle<'_> {
        match &self.process {
            None => Handle::Local {
                call: self.begin_call(),
                threads: self.rank_threads(),
                capturing,
            },
            Some(p) => Handle::Process {
                call: self.process_call(p),
                net: p.net.as_ref(),
            },
        }
    }

    /// The per-call handle of this rank of a job of processes, locked for one call's issue.
    pub(crate) fn process_call<'a>(&'a self, p: &'a ProcessRank) -> ProcessCall<'a> {
        ProcessCall {
            me: self.resources(p.rank),
            state: p.lock(),
            memops: &p.memops,
            health: &self.health,
            exchange: &p.boot,
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Work of the last call may still run on the caller's streams and use the scratch, the
        // flags, the control block and the kernels' module: wait for it before they are freed,
        // at most the timeout. If it does not end, abort (every device wait ends) and wait a
        // little more; if it still does not end (work of the caller's own that never ends),
        // leak the memory rather than free it under a running kernel. Errors cannot be reported
        // from `drop`; cudarc records them in the context.
        //
        // A rank of a job of processes: its last call's end also means every peer is done with
        // this rank's scratch and flags (the call's end waits for the peers' last touches), so
        // the windows can be unmapped and freed after it.
        //
        // CUDA graphs that captured calls of this communicator and still exist keep its device
        // resources: they are handed over to them (`hand_over_to_graphs`) instead of freed.
        let idle = |c: &Self, limit| {
            poll_until(Some(limit), || match c.pending_rank() {
                Ok(None) => Ok(Some(true)),
                Ok(Some(_)) => Ok(None),
                // A dead context runs nothing any more.
                Err(_) => Ok(Some(true)),
            })
            .ok()
            .flatten()
            .is_some()
        };
        let failed = self.health.failure().is_some();
        let first = if failed {
            DRAIN_AFTER_ABORT
        } else {
            self.config.timeout.unwrap_or(Duration::MAX)
        };
        if idle(self, first) {
            self.hand_over_to_graphs();
            return;
        }
        if !failed {
            self.health.fail(Error::Aborted {
                reason: "dropped with work that did not finish".into(),
            });
            if idle(self, DRAIN_AFTER_ABORT) {
                self.hand_over_to_graphs();
                return;
            }
        }
        report!(
            self.config.debug,
            Warn,
            "the communicator's work did not finish after an abort: its device memory is leaked"
        );
        std::mem::forget(std::mem::take(&mut self.ranks));
        std::mem::forget(std::mem::take(&mut *self.state.get_mut().unwrap_or_else(|p| p.into_inner())));
        std::mem::forget(self.process.take());
        std::mem::forget(self.health.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn ordinals_are_checked() {
        assert_eq!(
            validate_ordinals(&[], 2),
            Err(Error::TooFewDevices {
                needed: 1,
                found: 2
            })
        );
        assert_eq!(validate_ordinals(&[0, 1], 2), Ok(()));
        assert_eq!(validate_ordinals(&[1, 0], 2), Ok(()));
        assert!(matches!(
            validate_ordinals(&[0, 2], 2),
            Err(Error::BadDevice { ordinal: 2, .. })
        ));
        assert!(matches!(
            validate_ordinals(&[0], 0),
            Err(Error::BadDevice { ordinal: 0, .. })
        ));
        let e = validate_ordinals(&[1, 0, 1], 2).unwrap_err();
        assert!(
            matches!(&e, Error::BadDevice { ordinal: 1, reason } if reason.contains("more than once"))
        );
    }

    #[test]
    fn polling_ends_at_the_limit_and_sleeps() {
        let t0 = Instant::now();
        let mut polls = 0u32;
        let r = poll_until::<()>(Some(Duration::from_millis(50)), || {
            polls += 1;
            Ok(None)
        });
        let took = t0.elapsed();
        assert_eq!(r, Ok(None));
        assert!(took >= Duration::from_millis(50) && took < Duration::from_secs(2), "{took:?}");
        // Yields, then sleeps of 10 us growing to 1 ms: far fewer polls than a busy spin.
        assert!(polls < 2_000, "{polls} polls in {took:?}");
        let mut left = 3;
        let r = poll_until(None, || {
            left -= 1;
            Ok((left == 0).then_some(7))
        });
        assert_eq!(r, Ok(Some(7)));
        let e = poll_until::<()>(None, || Err(Error::NoDriver));
        assert_eq!(e, Err(Error::NoDriver));
    }

    #[test]
    fn reliability_errors_say_what_happened() {
        let t = Error::Timeout {
            rank: Some(0),
            peer: Some(1),
            what: "a device-side wait of 1s".into(),
        };
        assert!(t.to_string().contains("rank 0 timed out waiting for rank 1"), "{t}");
        assert_eq!(t.rank(), Some(0));
        let p = Error::PartlyEnqueued {
            enqueued: vec![0],
            cause: Box::new(Error::Cuda {
                call: "cuLaunchKernel",
                code: "CUDA_ERROR_LAUNCH_FAILED".into(),
                rank: Some(1),
            }),
        };
        assert_eq!(p.rank(), Some(1));
        assert!(p.to_string().contains("[0]") && p.to_string().contains("rank 1"), "{p}");
        let a = Error::Aborted {
            reason: "aborted by the caller".into(),
        };
        assert!(a.to_string().contains("make a new one"), "{a}");
    }

    #[test]
    fn communicator_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Communicator>();
    }

    #[test]
    fn without_a_driver_construction_fails_cleanly() {
        // SAFETY: only probes for the library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return; // covered by the GPU tests
        }
        assert_eq!(Communicator::new(&[0]).unwrap_err(), Error::NoDriver);
        assert_eq!(Communicator::new(&[]).unwrap_err(), Error::NoDriver);
        assert_eq!(Communicator::all().unwrap_err(), Error::NoDriver);
    }
}
