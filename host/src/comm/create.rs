//! The constructors of a communicator of one process: one rank per given device.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::{Communicator, Kind};
use crate::config::Config;
use crate::debug::report;
use crate::driver;
use crate::plan::{topology, PlanCache};
use crate::resources::rank_threads::RankThreads;
use crate::resources::{Health, RankResources, RankState};
use crate::transport::Transport;
use crate::{Error, Result};

/// Whether `CUDA_LAUNCH_BLOCKING` asks the driver for blocking launches.
pub(super) fn launch_blocking_env() -> bool {
    std::env::var("CUDA_LAUNCH_BLOCKING").is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
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
            oneshot_broken: AtomicBool::new(false),
            kind: Kind::Local {
                plans: PlanCache::default(),
                rank_threads,
            },
            health: Arc::new(health),
            launch_blocking: launch_blocking_env(),
            graphs: Arc::default(),
        };
        comm.report_setup(how);
        Ok(comm)
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

    pub(super) fn report_setup(&self, ring_from: &str) {
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
        let peer = if let Some(p) = self.process() {
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
}
