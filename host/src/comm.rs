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

use cudarc::driver::{CudaContext, CudaStream};

use crate::config::Config;
use crate::debug::report;
use crate::driver;
use crate::plan::{topology, PlanCache};
use crate::resources::{Call, RankResources, RankState};
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
    ranks: Vec<RankResources>,
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
        let comm = Communicator {
            streams: ranks.iter().map(|r| r.stream.clone()).collect(),
            ranks,
            transport,
            ring,
            config,
            state: Mutex::new(state),
            plans: PlanCache::default(),
            oneshot_broken: AtomicBool::new(false),
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

    fn report_setup(&self, ring_from: &str) {
        let debug = self.config.debug;
        let devices: Vec<String> = self
            .ranks
            .iter()
            .enumerate()
            .map(|(r, x)| format!("rank {r} = device {} ({})", x.ordinal, x.name))
            .collect();
        report!(debug, Info, "communicator of {} ranks: {}", self.nranks(), devices.join(", "));
        let peer = if self.transport.all_direct() {
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
        self.ranks.len()
    }

    /// The device ordinal of `rank`.
    ///
    /// # Panics
    /// If `rank >= self.nranks()`, like slice indexing.
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::new(&[1, 0])?;
    /// assert_eq!(comm.ordinal(0), 1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn ordinal(&self, rank: usize) -> usize {
        self.ranks[rank].ordinal
    }

    /// The context of `rank`'s device (its primary context): allocate buffers for `rank` with
    /// a stream of this context.
    ///
    /// # Panics
    /// If `rank >= self.nranks()`.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// let buf = comm.stream(0).alloc_zeros::<f32>(1024).unwrap();
    /// assert_eq!(buf.context().ordinal(), comm.context(0).ordinal());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn context(&self, rank: usize) -> &Arc<CudaContext> {
        &self.ranks[rank].ctx
    }

    /// A non-blocking stream of `rank` that the communicator created, for callers that do not
    /// bring their own.
    ///
    /// # Panics
    /// If `rank >= self.nranks()`.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// let s = comm.stream(0);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn stream(&self, rank: usize) -> &Arc<CudaStream> {
        &self.streams[rank]
    }

    /// The device name of `rank` (e.g. `"NVIDIA H200"`).
    ///
    /// # Panics
    /// If `rank >= self.nranks()`.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// println!("{}", comm.device_name(0));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn device_name(&self, rank: usize) -> &str {
        &self.ranks[rank].name
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
        self.transport.direct(rank, peer)
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
    /// caller's streams as well as on the communicator's own streams.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// comm.synchronize()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        let state = self.lock_state();
        for (r, (rank, st)) in self.ranks.iter().zip(state.iter()).enumerate() {
            st.end
                .synchronize()
                .map_err(|e| Error::cuda("cuEventSynchronize", Some(r), e))?;
            rank.stream
                .synchronize()
                .map_err(|e| Error::cuda("cuStreamSynchronize", Some(r), e))?;
        }
        Ok(())
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
        self.transport.all_direct() && !self.oneshot_broken.load(Ordering::Acquire)
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

    /// Locks the communicator for one call's issue: the handle an executor works through.
    pub(crate) fn begin_call(&self) -> Call<'_> {
        Call::new(&self.ranks, &self.transport, self.lock_state(), &self.oneshot_broken)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Work of the last call may still run on the caller's streams and use the scratch and
        // the kernels' module: wait for it before they are freed. Errors cannot be reported
        // from `drop`; cudarc records them in the context.
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (rank, st) in self.ranks.iter().zip(state.iter()) {
            rank.ctx.record_err(st.end.synchronize());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
