//! The reducer: flat gradient buffers, communication streams, and the all-reduces.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, ValidAsZeroBits};

use super::bucket::{BucketCaps, BucketPlan, ReadyState};
use crate::{Communicator, DeviceElement, Io, RedOp};

/// How the gradients are combined over ranks.
///
/// ```
/// use ringccl::ddp::Reduction;
/// assert_eq!(Reduction::default(), Reduction::Avg);
/// assert_eq!(Reduction::Sum.prescale(4), 0.25);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The mean over ranks (ringccl's `RedOp::Avg`: a sum, then one division in the kernel
    /// that writes the result).
    #[default]
    Avg,
    /// The sum over ranks. For a mean, the caller pre-scales its gradients by
    /// [`Reduction::prescale`] (folded into the loss's gradient, it costs nothing); this keeps
    /// low-precision gradients from overflowing in the sum.
    Sum,
}

impl Reduction {
    /// The factor a caller applies to its gradients before the reduction for the result to be
    /// the mean: 1 for [`Reduction::Avg`], `1 / nranks` for [`Reduction::Sum`].
    pub fn prescale(self, nranks: usize) -> f64 {
        match self {
            Reduction::Avg => 1.0,
            Reduction::Sum => 1.0 / nranks.max(1) as f64,
        }
    }

    fn op(self) -> RedOp {
        match self {
            Reduction::Avg => RedOp::Avg,
            Reduction::Sum => RedOp::Sum,
        }
    }
}

/// When the buckets' all-reduces are enqueued.
///
/// ```
/// assert_eq!(ringccl::ddp::Launch::default(), ringccl::ddp::Launch::Overlap);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Launch {
    /// As soon as a bucket is complete (overlapping the rest of the backward pass).
    #[default]
    Overlap,
    /// All at [`Reducer::wait`], after the backward pass (for comparison).
    AfterBackward,
}

/// A [`Reducer`]'s settings.
///
/// ```
/// use ringccl::ddp::{Launch, ReducerOptions, Reduction};
/// let o = ReducerOptions { reduction: Reduction::Sum, launch: Launch::AfterBackward, ..Default::default() };
/// assert_eq!(o.caps.first_bytes, 1 << 20);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReducerOptions {
    /// Bucket size caps (DDP's 1 MiB, then 25 MiB, by default).
    pub caps: BucketCaps,
    /// Mean or sum over ranks.
    pub reduction: Reduction,
    /// When the all-reduces start.
    pub launch: Launch,
}

/// What went wrong in a [`Reducer`] call. `Display` says what to do.
///
/// ```
/// use ringccl::ddp::ReducerError;
/// let e = ReducerError::Unused { rank: 1, params: vec![3] };
/// assert!(e.to_string().contains("parameter(s) [3]"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReducerError {
    /// The parameter list or caps cannot be laid out.
    Layout {
        /// Why.
        reason: String,
    },
    /// A local rank index out of range.
    UnknownRank {
        /// The index given.
        local: usize,
        /// How many local ranks there are.
        nlocal: usize,
    },
    /// A parameter index out of range.
    UnknownParam {
        /// The rank.
        rank: usize,
        /// The index given.
        param: usize,
        /// How many parameters were registered.
        nparams: usize,
    },
    /// A parameter marked ready twice in one backward pass.
    AlreadyReady {
        /// The rank.
        rank: usize,
        /// The parameter.
        param: usize,
    },
    /// Parameters never marked ready in a backward pass (found at [`Reducer::wait`]).
    Unused {
        /// The first rank that lacks them.
        rank: usize,
        /// The parameters.
        params: Vec<usize>,
    },
    /// The compute streams do not match the communicator's local ranks.
    Streams {
        /// Why.
        reason: String,
    },
    /// A CUDA call of the reducer's own failed (stream, event, allocation).
    Cuda(String),
    /// The all-reduce itself failed.
    Comm(crate::Error),
}

impl fmt::Display for ReducerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReducerError::Layout { reason } => write!(f, "cannot lay out the gradients: {reason}"),
            ReducerError::UnknownRank { local, nlocal } => write!(
                f,
                "local rank {local} does not exist: this process holds {nlocal} rank(s)"
            ),
            ReducerError::UnknownParam {
                rank,
                param,
                nparams,
            } => write!(
                f,
                "rank {rank}: parameter {param} was never registered ({nparams} parameters); \
                 register every parameter when creating the reducer"
            ),
            ReducerError::AlreadyReady { rank, param } => write!(
                f,
                "rank {rank}: parameter {param} was marked ready twice in one backward pass; \
                 mark each gradient once, then call wait()"
            ),
            ReducerError::Unused { rank, params } => write!(
                f,
                "rank {rank}: parameter(s) {params:?} were never marked ready in this backward \
                 pass, so their buckets never started (every rank must produce every gradient; \
                 write zeros into an unused one and mark it)"
            ),
            ReducerError::Streams { reason } => write!(f, "bad compute streams: {reason}"),
            ReducerError::Cuda(e) => write!(f, "a CUDA call of the reducer failed: {e}"),
            ReducerError::Comm(e) => write!(f, "a bucket's all-reduce failed: {e}"),
        }
    }
}

impl std::error::Error for ReducerError {}

impl From<crate::Error> for ReducerError {
    fn from(e: crate::Error) -> Self {
        ReducerError::Comm(e)
    }
}

fn cuda(call: &str, rank: usize, e: cudarc::driver::DriverError) -> ReducerError {
    ReducerError::Cuda(format!("{call} on rank {rank}: {e:?}"))
}

/// A bucketed gradient reducer over a [`Communicator`]'s local ranks (see the
/// [module docs](super) for the whole picture).
///
/// Per backward pass: write each gradient into [`Reducer::grad_mut`]'s view on the compute
/// stream, call [`Reducer::mark_ready`] (any order; buckets start in order as they complete),
/// then [`Reducer::wait`]. Local ranks are indices into
/// [`Communicator::local_ranks`](crate::Communicator::local_ranks).
///
/// ```no_run
/// use ringccl::ddp::{Reducer, ReducerOptions};
/// let comm = ringccl::Communicator::from_env()?; // one process per GPU
/// let compute = vec![comm.stream(comm.local_ranks()[0]).clone()];
/// let mut reducer = Reducer::<f32>::new(&comm, &[4096 * 4096, 4096], &compute, ReducerOptions::default())?;
/// assert_eq!(reducer.plan().nparams(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Reducer<'c, T> {
    comm: &'c Communicator,
    plan: BucketPlan,
    options: ReducerOptions,
    /// The local ranks' global numbers.
    ranks: Vec<usize>,
    /// Per local rank: the flat gradient buffer.
    grads: Vec<CudaSlice<T>>,
    /// Per local rank: the caller's compute stream.
    compute: Vec<Arc<CudaStream>>,
    /// Per local rank: the reducer's communication stream.
    comm_streams: Vec<Arc<CudaStream>>,
    state: ReadyState,
    /// Per local rank: recorded on the communication stream after the last bucket started.
    last: Vec<Option<CudaEvent>>,
}

impl<'c, T: DeviceElement + ValidAsZeroBits> Reducer<'c, T> {
    /// A reducer for parameters of `lens` elements (registration order) on every local rank
    /// of `comm`, whose backward passes run on `compute` (one stream per local rank, on its
    /// GPU). Allocates the flat gradient buffers (zeroed) and one communication stream per
    /// local rank.
    pub fn new(
        comm: &'c Communicator,
        lens: &[usize],
        compute: &[Arc<CudaStream>],
        options: ReducerOptions,
    ) -> Result<Self, ReducerError> {
        let plan = BucketPlan::new(lens, std::mem::size_of::<T>(), options.caps)?;
        let ranks = comm.local_ranks().to_vec();
        if compute.len() != ranks.len() {
            return Err(ReducerError::Streams {
                reason: format!(
                    "{} stream(s) for {} local rank(s): give one per local rank",
                    compute.len(),
                    ranks.len()
                ),
            });
        }
        let mut grads = Vec::with_capacity(ranks.len());
        let mut comm_streams = Vec::with_capacity(ranks.len());
        for (local, (&rank, stream)) in ranks.iter().zip(compute).enumerate() {
            let ordinal = comm.ordinal(rank);
            if stream.context().ordinal() != ordinal {
                return Err(ReducerError::Streams {
                    reason: format!(
                        "the stream of local rank {local} is on GPU {}, its rank {rank} on GPU \
                         {ordinal}",
                        stream.context().ordinal()
                    ),
                });
            }
            if stream.context().is_event_tracking() && options.launch == Launch::Overlap {
                log::warn!(
                    target: "ringccl",
                    "ddp: GPU {ordinal} has cudarc event tracking on: the buckets' all-reduces \
                     will not overlap the backward pass (see ringccl::ddp)"
                );
            }
            grads.push(
                stream
                    .alloc_zeros::<T>(plan.len())
                    .map_err(|e| cuda("cuMemAlloc", rank, e))?,
            );
            comm_streams.push(
                stream
                    .context()
                    .new_stream()
                    .map_err(|e| cuda("cuStreamCreate", rank, e))?,
            );
        }
        let mut state = ReadyState::with_ranks(&plan, ranks.clone());
        if options.launch == Launch::AfterBackward {
            state = state.deferred();
        }
        Ok(Reducer {
            comm,
            last: (0..ranks.len()).map(|_| None).collect(),
            plan,
            options,
            ranks,
            grads,
            compute: compute.to_vec(),
            comm_streams,
            state,
        })
    }

    /// The bucket layout.
    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// The settings.
    pub fn options(&self) -> &ReducerOptions {
        &self.options
    }

    /// Elements of parameter `param`'s gradient in the flat buffer (a parameter buffer laid
    /// out the same way lets one kernel update every parameter).
    pub fn range(&self, param: usize) -> Result<Range<usize>, ReducerError> {
        self.check_param(0, param)?;
        Ok(self.plan.range(param))
    }

    /// Local rank `local`'s whole flat gradient buffer.
    pub fn grads(&self, local: usize) -> Result<&CudaSlice<T>, ReducerError> {
        self.check_local(local)?;
        Ok(&self.grads[local])
    }

    /// The view of parameter `param`'s gradient on local rank `local`, for reading.
    pub fn grad(&self, local: usize, param: usize) -> Result<CudaView<'_, T>, ReducerError> {
        self.check_param(local, param)?;
        Ok(self.grads[local].slice(self.plan.range(param)))
    }

    /// The view of parameter `param`'s gradient on local rank `local`, for the backward pass
    /// to write (on the compute stream) before [`Reducer::mark_ready`].
    pub fn grad_mut(
        &mut self,
        local: usize,
        param: usize,
    ) -> Result<CudaViewMut<'_, T>, ReducerError> {
        self.check_param(local, param)?;
        let range = self.plan.range(param);
        Ok(self.grads[local].slice_mut(range))
    }

    /// Parameter `param`'s gradient on local rank `local` is written (its work enqueued on the
    /// compute stream). Starts every bucket that is now complete on every local rank and next
    /// in order (with [`Launch::Overlap`]).
    pub fn mark_ready(&mut self, local: usize, param: usize) -> Result<(), ReducerError> {
        let start = self.state.mark(&self.plan, local, param)?;
        for b in start {
            self.start_bucket(b)?;
        }
        Ok(())
    }

    /// Ends the backward pass: starts the buckets not started yet (with
    /// [`Launch::AfterBackward`], all of them), and makes every compute stream wait for every
    /// bucket's all-reduce. Returns at once (nothing waits on the host). A parameter not
    /// marked on some local rank is [`ReducerError::Unused`], and nothing is started; either
    /// way the next pass starts afresh.
    pub fn wait(&mut self) -> Result<(), ReducerError> {
        let rest = match self.state.take_all(&self.plan) {
            Ok(rest) => rest,
            Err(e) => {
                // Resets the pass; the error is the one take_all found.
                let _ = self.state.finish(&self.plan);
                return Err(e);
            }
        };
        for b in rest {
            self.start_bucket(b)?;
        }
        self.state.finish(&self.plan)?;
        for (local, event) in self.last.iter_mut().enumerate() {
            if let Some(event) = event.take() {
                self.compute[local]
                    .wait(&event)
                    .map_err(|e| cuda("cuStreamWaitEvent", self.ranks[local], e))?;
            }
        }
        Ok(())
    }

    /// Enqueues bucket `b`'s all-reduce on every local rank's communication stream, after the
    /// work enqueued so far on its compute stream.
    fn start_bucket(&mut self, b: usize) -> Result<(), ReducerError> {
        let range = self.plan.buckets()[b].range.clone();
        for (local, stream) in self.comm_streams.iter().enumerate() {
            let rank = self.ranks[local];
            let ready = self.compute[local]
                .record_event(None)
                .map_err(|e| cuda("cuEventRecord", rank, e))?;
            stream
                .wait(&ready)
                .map_err(|e| cuda("cuStreamWaitEvent", rank, e))?;
        }
        let count = range.len();
        {
            let mut views: Vec<CudaViewMut<'_, T>> = self
                .grads
                .iter_mut()
                .map(|g| g.slice_mut(range.clone()))
                .collect();
            let mut io: Vec<Io<'_, T>> = views.iter_mut().map(Io::in_place).collect();
            self.comm.all_reduce(
                &mut io,
                count,
                self.options.reduction.op(),
                &self.comm_streams,
            )?;
        }
        for (local, stream) in self.comm_streams.iter().enumerate() {
            let done = stream
                .record_event(None)
                .map_err(|e| cuda("cuEventRecord", self.ranks[local], e))?;
            self.last[local] = Some(done);
        }
        Ok(())
    }

    fn check_local(&self, local: usize) -> Result<(), ReducerError> {
        if local >= self.ranks.len() {
            return Err(ReducerError::UnknownRank {
                local,
                nlocal: self.ranks.len(),
            });
        }
        Ok(())
    }

    fn check_param(&self, local: usize, param: usize) -> Result<(), ReducerError> {
        self.check_local(local)?;
        if param >= self.plan.nparams() {
            return Err(ReducerError::UnknownParam {
                rank: self.ranks[local],
                param,
                nparams: self.plan.nparams(),
            });
        }
        Ok(())
    }
}

impl<T> Drop for Reducer<'_, T> {
    fn drop(&mut self) {
        // The flat buffers are freed on the compute streams (where they were allocated): order
        // that after any all-reduce still running on the communication streams. Errors cannot
        // be reported from a drop; cudarc records them on the context.
        for (compute, comm) in self.compute.iter().zip(&self.comm_streams) {
            let _ = compute.join(comm);
        }
    }
}
