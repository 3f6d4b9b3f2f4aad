//! New communicators from an existing one: [`Communicator::split`] and
//! [`Communicator::shrink`] (`ncclCommSplit`, `ncclCommShrink`).
//!
//! For a rank of a job of processes the child's ranks find each other over the parent's
//! bootstrap connections (no new [`UniqueId`](crate::UniqueId), no rendezvous: see
//! [`Bootstrap::split`](crate::bootstrap::Bootstrap::split)), then the child is built as any
//! process communicator is: resources of its own on the same device (stream, kernels, the
//! IPC scratch and flags every rank maps), so collectives of the parent and of the child
//! may be issued in any order on their streams. For a communicator of every rank in this
//! process the child is a new such communicator of the selected ranks' devices.
//!
//! The child inherits the parent's [`Config`] (except [`Config::ring`], which names the
//! parent's ranks: the child chooses its own ring). ringccl never shares scratch or flags
//! between communicators (NCCL's `splitShare` is a request, and sharing is only ever an
//! optimisation): separate resources are always safe to interleave.

use crate::bootstrap::PendingSplit;
use crate::config::Config;
use crate::{Arg, Communicator, Error, Result};

/// A child communicator whose ranks have agreed on its membership, waiting to be built with
/// [`PendingCommunicator::finish`]. What [`Communicator::split_begin`] and
/// [`Communicator::shrink_begin`] return: the agreement runs over the parent (so it happens
/// in the parent's call order), the building only over new connections (so it may run in
/// another thread while the parent goes on: a non-blocking `ncclCommSplit`).
///
/// ```no_run
/// # let comm = ringccl::Communicator::from_env()?;
/// let rank = comm.local_ranks()[0];
/// if let Some(pending) = comm.split_begin(Some((rank % 2) as i32), 0)? {
///     let child = std::thread::spawn(move || pending.finish()).join().unwrap()?;
///     assert_eq!(child.nranks(), comm.nranks() / 2);
/// }
/// # Ok::<(), ringccl::Error>(())
/// ```
#[derive(Debug)]
pub struct PendingCommunicator {
    how: Pending,
    config: Config,
}

#[derive(Debug)]
enum Pending {
    /// A rank of a job of processes: its place in the child world, on `device`.
    Process { split: PendingSplit, device: usize },
    /// Every rank in this process: the child's devices and their parent ranks, in child rank
    /// order.
    Local {
        ordinals: Vec<usize>,
        ranks: Vec<usize>,
    },
}

impl PendingCommunicator {
    /// The number of ranks of the child.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// let pending = comm.shrink_begin(&[0])?;
    /// assert_eq!(pending.nranks(), comm.nranks() - 1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn nranks(&self) -> usize {
        match &self.how {
            Pending::Process { split, .. } => split.members().len(),
            Pending::Local { ordinals, .. } => ordinals.len(),
        }
    }

    /// The parent's ranks of the child's ranks, in child rank order.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::from_env()?;
    /// let pending = comm.shrink_begin(&[1])?;
    /// assert!(!pending.parent_ranks().contains(&1));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn parent_ranks(&self) -> Vec<usize> {
        match &self.how {
            Pending::Process { split, .. } => split.members().to_vec(),
            Pending::Local { ranks, .. } => ranks.clone(),
        }
    }

    /// Builds the child (a collective over its ranks). Errors: [`Error::Bootstrap`] when a
    /// member does not come within the bootstrap timeout, else those of
    /// [`Communicator::init_rank`] or [`Communicator::new`].
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::from_env()?;
    /// let child = comm.shrink_begin(&[0])?.finish()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn finish(self) -> Result<Communicator> {
        match self.how {
            Pending::Process { split, device } => {
                let boot = split.connect()?;
                let rank = boot.rank();
                Communicator::from_bootstrap(boot, rank, device, self.config)
            }
            Pending::Local { ordinals, .. } => Communicator::with_config(&ordinals, self.config),
        }
    }
}

impl Communicator {
    /// The child's configuration: the parent's, checked for `n` ranks, without the parent's
    /// ring order.
    fn child_config(&self, n: usize) -> Result<Config> {
        let mut config = self.config().clone();
        config.ring = None;
        config.check(n)?;
        Ok(config)
    }

    /// The parent's failure, if any: a failed or aborted communicator makes no children.
    fn check_healthy(&self) -> Result<()> {
        match self.async_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A new communicator of the ranks that pass the same `color`, like `ncclCommSplit`:
    /// their ranks ordered by `key`, then by rank in this communicator. `color: None`
    /// (`NCCL_SPLIT_NOCOLOR`) takes part and gets `Ok(None)`. For a rank of a job of
    /// processes this is a collective over every rank of the job; for a communicator of every
    /// rank in this process, all its ranks pass `color` and `key` (use
    /// [`Communicator::split_local`] for one color per rank). This communicator stays usable,
    /// its calls and the child's may interleave in any order on their streams.
    ///
    /// Errors: the parent's failure ([`Communicator::async_error`]), [`Error::Bootstrap`]
    /// when a rank does not take part within the bootstrap timeout (naming it), else those
    /// of [`Communicator::init_rank`].
    ///
    /// ```no_run
    /// use ringccl::Communicator;
    /// // 4 processes (ringccl-run -n 4): ranks {0, 1} and {2, 3}.
    /// let world = Communicator::from_env()?;
    /// let rank = world.local_ranks()[0];
    /// let half = world.split(Some((rank / 2) as i32), rank as i32)?.expect("a color was given");
    /// assert_eq!((half.nranks(), half.local_ranks()), (2, &[rank % 2][..]));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn split(&self, color: Option<i32>, key: i32) -> Result<Option<Communicator>> {
        self.split_begin(color, key)?
            .map(PendingCommunicator::finish)
            .transpose()
    }

    /// [`Communicator::split`] in two steps: the agreement over this communicator now, the
    /// building with [`PendingCommunicator::finish`] (in any thread).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::from_env()?;
    /// let pending = comm.split_begin(Some(0), 0)?;
    /// let child = pending.map(|p| p.finish()).transpose()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn split_begin(&self, color: Option<i32>, key: i32) -> Result<Option<PendingCommunicator>> {
        self.check_healthy()?;
        match self.process() {
            Some(p) => {
                let Some(split) = p.boot.split_exchange(color, key)? else {
                    return Ok(None);
                };
                let config = self.child_config(split.members().len())?;
                let device = self.ordinal(p.rank);
                Ok(Some(PendingCommunicator {
                    how: Pending::Process { split, device },
                    config,
                }))
            }
            None => {
                let n = self.nranks();
                let mut local = self.local_pending(&vec![color; n], &vec![key; n])?;
                Ok(local.pop().map(|(_, p)| p))
            }
        }
    }

    /// Splits a communicator of every rank in this process by a color per rank: one new
    /// communicator per color, in increasing color order, each of the devices of the ranks
    /// with that color, ordered by `keys`, then by rank. A rank with `None` is in none.
    /// `colors` and `keys` hold one entry per rank.
    ///
    /// Errors: [`Error::InvalidArgument`] for a rank of a job of processes (use
    /// [`Communicator::split`]) or lists of another length, else those of
    /// [`Communicator::new`].
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::new(&[0, 1, 2, 3])?;
    /// let halves = comm.split_local(&[Some(0), Some(0), Some(1), Some(1)], &[0, 0, 0, 0])?;
    /// assert_eq!(halves.len(), 2);
    /// assert_eq!((halves[1].0, halves[1].1.ordinal(0)), (1, 2));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn split_local(
        &self,
        colors: &[Option<i32>],
        keys: &[i32],
    ) -> Result<Vec<(i32, Communicator)>> {
        self.check_healthy()?;
        if self.process().is_some() {
            return Err(Error::invalid(
                None,
                Arg::Ranks,
                "split_local splits a communicator of every rank in this process; a rank of \
                 a job of processes splits with split(color, key)",
            ));
        }
        self.local_pending(colors, keys)?
            .into_iter()
            .map(|(c, p)| p.finish().map(|comm| (c, comm)))
            .collect()
    }

    /// The children of a communicator of every rank in this process, by color.
    fn local_pending(
        &self,
        colors: &[Option<i32>],
        keys: &[i32],
    ) -> Result<Vec<(i32, PendingCommunicator)>> {
        let n = self.nranks();
        if colors.len() != n || keys.len() != n {
            return Err(Error::invalid(
                None,
                Arg::Ranks,
                format!(
                    "{} colors and {} keys for {n} ranks: give one of each per rank",
                    colors.len(),
                    keys.len()
                ),
            ));
        }
        let mut distinct: Vec<i32> = colors.iter().flatten().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        distinct
            .into_iter()
            .map(|c| {
                let mut ranks: Vec<usize> = (0..n).filter(|&r| colors[r] == Some(c)).collect();
                ranks.sort_by_key(|&r| keys[r]);
                let ordinals = ranks.iter().map(|&r| self.ordinal(r)).collect();
                let config = self.child_config(ranks.len())?;
                Ok((
                    c,
                    PendingCommunicator {
                        how: Pending::Local { ordinals, ranks },
                        config,
                    },
                ))
            })
            .collect()
    }

    /// A new communicator of every rank but those in `exclude`, in this communicator's rank
    /// order, like `ncclCommShrink` (default mode). For a rank of a job of processes only the
    /// staying ranks call it, each with the same list (order and repeats do not matter); the
    /// excluded ranks are never contacted, so they may be gone. This communicator stays
    /// usable.
    ///
    /// Errors: [`Error::InvalidArgument`] for an empty list, a rank out of range, this rank
    /// in the list, or no rank left; the parent's failure; [`Error::Bootstrap`] when a staying
    /// rank does not take part within the bootstrap timeout, or passed another list.
    ///
    /// ```no_run
    /// // 4 processes; rank 3 left the job: the others go on with 3 ranks.
    /// let world = ringccl::Communicator::from_env()?;
    /// if world.local_ranks() != [3] {
    ///     let rest = world.shrink(&[3])?;
    ///     assert_eq!(rest.nranks(), 3);
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        self.shrink_begin(exclude)?.finish()
    }

    /// [`Communicator::shrink`] after aborting this communicator's work (NCCL's
    /// `NCCL_SHRINK_ABORT`): for a job where an excluded rank died with collectives in flight.
    /// The abort ends every pending device wait of this communicator (see
    /// [`Communicator::abort`]); this communicator then refuses every call with
    /// [`Error::Aborted`]: only drop it. The shrink itself never contacts the excluded ranks.
    ///
    /// ```no_run
    /// # let world = ringccl::Communicator::from_env()?;
    /// // Rank 2 died during a collective: the survivors abort it and go on without rank 2.
    /// let rest = world.shrink_aborting(&[2])?;
    /// drop(world);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn shrink_aborting(&self, exclude: &[usize]) -> Result<Communicator> {
        self.shrink_aborting_begin(exclude)?.finish()
    }

    /// [`Communicator::shrink_aborting`] in two steps, as [`Communicator::split_begin`].
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::from_env()?;
    /// let child = comm.shrink_aborting_begin(&[0])?.finish()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn shrink_aborting_begin(&self, exclude: &[usize]) -> Result<PendingCommunicator> {
        // Validate first: an invalid call aborts nothing.
        let pending = self.shrink_plan(exclude)?;
        // A drain that times out leaves work of the caller's own on the parent's streams; the
        // child does not depend on it.
        let _ = self.abort();
        pending()
    }

    /// [`Communicator::shrink`] in two steps, as [`Communicator::split_begin`].
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::from_env()?;
    /// let child = comm.shrink_begin(&[0])?.finish()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn shrink_begin(&self, exclude: &[usize]) -> Result<PendingCommunicator> {
        let pending = self.shrink_plan(exclude)?;
        self.check_healthy()?;
        pending()
    }

    /// Checks `exclude` now; the returned step makes the agreement.
    fn shrink_plan<'a>(
        &'a self,
        exclude: &'a [usize],
    ) -> Result<impl FnOnce() -> Result<PendingCommunicator> + 'a> {
        let n = self.nranks();
        let bad = |reason: String| Error::invalid(None, Arg::Ranks, reason);
        if exclude.is_empty() {
            return Err(bad("shrink needs at least one rank to exclude".into()));
        }
        if let Some(&r) = exclude.iter().find(|&&r| r >= n) {
            return Err(bad(format!("excluded rank {r} is outside 0..{n}")));
        }
        let stay: Vec<usize> = (0..n).filter(|r| !exclude.contains(r)).collect();
        if stay.is_empty() {
            return Err(bad("shrink would exclude every rank".into()));
        }
        if let Some(p) = self.process() {
            if exclude.contains(&p.rank) {
                return Err(Error::invalid(
                    Some(p.rank),
                    Arg::Ranks,
                    format!(
                        "rank {} is in the list of excluded ranks: an excluded rank does not \
                         call shrink",
                        p.rank
                    ),
                ));
            }
        }
        Ok(move || match self.process() {
            Some(p) => {
                let split = p.boot.shrink_exchange(exclude)?;
                let config = self.child_config(split.members().len())?;
                Ok(PendingCommunicator {
                    how: Pending::Process {
                        split,
                        device: self.ordinal(p.rank),
                    },
                    config,
                })
            }
            None => Ok(PendingCommunicator {
                config: self.child_config(stay.len())?,
                how: Pending::Local {
                    ordinals: stay.iter().map(|&r| self.ordinal(r)).collect(),
                    ranks: stay,
                },
            }),
        })
    }
}
