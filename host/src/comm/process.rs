//! A rank of a job of processes: its part of the communicator ([`ProcessRank`]) and its
//! constructors (`ncclCommInitRank`, a launcher's environment, an already-joined bootstrap).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::create::{launch_blocking_env, validate_ordinals};
use super::{Communicator, Kind};
use crate::bootstrap::{Bootstrap, LaunchEnv, UniqueId};
use crate::config::{Config, DebugLevel, Network};
use crate::debug::report;
use crate::driver;
use crate::driver::ipc::MemOps;
use crate::plan::net::Machines;
use crate::plan::{PlanCache, ProcessPlan};
use crate::resources::{Health, ProcessState, RankResources, RankState};
use crate::transport::ipc::{machine_id, Exchange, Windows};
use crate::transport::net::proxy::NetOptions;
use crate::transport::net::NetRank;
use crate::transport::Transport;
use crate::{Error, Result};

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
    pub(super) state: Mutex<ProcessState>,
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
    /// The watch over the peers' bootstrap connections (a peer's process gone), and the
    /// health that says whether the drop tells the peers goodbye.
    pub(super) watch: Option<(crate::bootstrap::Watcher, Arc<Health>)>,
}

impl Drop for ProcessRank {
    fn drop(&mut self) {
        // The communicator's drop has waited for this rank's work. A rank that ends normally
        // tells its peers, so that they do not take its closing connections for a lost process;
        // a failed one does not, so that they learn of it at once.
        if let Some((watcher, health)) = self.watch.take() {
            drop(watcher);
            if health.ends_normally() {
                self.boot.goodbye();
            }
        }
    }
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

impl Communicator {
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
        Self::from_bootstrap(boot, rank, device, config)
    }

    /// Rank `rank` of the job `bootstrap` joined, on device `device`: the part of
    /// [`Communicator::init_rank_with_config`] after the join (a communicator split joins its
    /// ranks by other means, then builds each one here). Collective over the bootstrap's
    /// ranks: every rank of it calls this with the same configuration.
    ///
    /// Errors: [`Error::InvalidArgument`] if `rank` is not the bootstrap's rank;
    /// [`Error::BadDevice`], [`Error::Config`], [`Error::Kernel`], [`Error::Cuda`] as for
    /// [`Communicator::init_rank`].
    pub(crate) fn from_bootstrap(mut boot: Bootstrap, rank: usize, device: usize, config: Config) -> Result<Self> {
        driver::ensure_driver()?;
        validate_ordinals(&[device], driver::device_count()?)?;
        let nranks = boot.nranks();
        if rank != boot.rank() || rank >= nranks {
            return Err(Error::invalid(
                Some(rank),
                crate::Arg::Ranks,
                format!("rank {rank} is not the bootstrap's rank {} of {nranks}", boot.rank()),
            ));
        }
        config.check(nranks)?;
        let res = RankResources::new(rank, device, &config)?;
        // With the network path, ranks on other machines are reached over it only.
        let machine = machine_id(config.host_id.as_deref());
        let ucx = config.net == Network::Ucx;
        let blocks_per_sm = res.kernels.twoshot_blocks_per_sm(&res.ctx)?;
        let windows = Windows::connect(&res.ctx, rank, nranks, &boot, (machine, ucx), blocks_per_sm)?;
        report!(
            config.debug,
            Info,
            "rank {rank}: two-shot grid of at most {} blocks ({} two-shot blocks per SM, GPUs {:?})",
            windows.two_shot_sms(),
            blocks_per_sm,
            windows.rooms().iter().map(|r| (r.sms, r.blocks_per_sm, r.comms)).collect::<Vec<_>>()
        );
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
        // After the join, a bootstrap exchange belongs to a call (the scratch growth, the
        // call check): it waits no longer than the call's device waits would for a peer.
        if let Some(t) = config.timeout {
            boot.set_timeout(t.min(config.bootstrap_timeout));
        }
        let ctxs = [res.ctx.clone()];
        let transport = Transport::connect(&ctxs, true, config.debug)?;
        let call_state = vec![RankState::new(&res.ctx, rank)?];
        let health = Arc::new(Health::new(&res.ctx, vec![rank], config.timeout)?);
        let grace = config.timeout.map_or(Duration::from_secs(1), |t| t.min(Duration::from_secs(1)));
        // SAFETY: `state.end` lives in the `ProcessRank` whose drop stops the watcher first.
        let watcher =
            unsafe { crate::resources::watch_peers(&boot, &health, &res.ctx, state.order.end().cu_event(), grace)? };
        let comm = Communicator {
            streams: vec![res.stream.clone()],
            local: vec![rank],
            ranks: vec![res],
            transport,
            ring: config.ring.clone().unwrap_or_else(|| (0..nranks).collect()),
            config,
            state: Mutex::new(call_state),
            oneshot_broken: AtomicBool::new(false),
            kind: Kind::Process(Box::new(ProcessRank {
                rank,
                nranks,
                boot,
                memops,
                state: Mutex::new(state),
                plans: PlanCache::default(),
                net,
                net_all,
                machines,
                watch: Some((watcher, Arc::clone(&health))),
            })),
            health,
            launch_blocking: launch_blocking_env(),
            graphs: Arc::default(),
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
}
