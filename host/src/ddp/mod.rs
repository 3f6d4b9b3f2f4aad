//! Data-parallel training: a gradient reducer in the manner of PyTorch's
//! `DistributedDataParallel`.
//!
//! Every rank computes gradients on its own batch; the [`Reducer`] averages them over ranks
//! while the backward pass is still running. Gradients live in **one flat buffer per local
//! rank**, cut into **buckets** (views into that buffer, no copies) in reverse registration
//! order of the parameters, which is the order a backward pass produces them: the first bucket
//! is capped at 1 MiB so that communication starts early, the others at 25 MiB
//! ([`BucketCaps`], DDP's defaults). The backward pass writes each gradient into its view
//! ([`Reducer::grad_mut`]) and calls [`Reducer::mark_ready`]; the moment a bucket is complete
//! on every local rank, its all-reduce is enqueued on a communication stream of the reducer's
//! own, ordered after the work already enqueued on the compute stream by an event. Buckets
//! start in index order (every rank must issue the same collectives in the same order), so
//! a bucket completed early waits for the ones before it. [`Reducer::wait`] makes the compute
//! streams wait for every bucket: the optimizer step enqueued after it reads averaged gradients.
//!
//! The reducer uses only ringccl's public collective API, so it works with one process driving
//! every GPU ([`Communicator::all`](crate::Communicator::all)) and with one process per GPU
//! ([`Communicator::from_env`](crate::Communicator::from_env)): its local ranks are the
//! communicator's [`local_ranks`](crate::Communicator::local_ranks).
//!
//! Mistakes are errors, not hangs: a parameter marked twice in one pass, an unknown parameter,
//! or (at [`Reducer::wait`]) a parameter never marked ([`ReducerError`]).
//!
//! # Ordering and cudarc's event tracking
//!
//! The reducer orders its work with its own events. cudarc's automatic tracking, when a
//! context has it on, tracks a whole `CudaSlice`: a bucket's all-reduce then looks like a write
//! of the whole flat buffer, and the next gradient written into it waits for that all-reduce,
//! which is correct but removes the overlap. For overlap, turn tracking off on each context
//! before creating the reducer (`unsafe { ctx.disable_event_tracking() }`, whose contract the
//! reducer keeps for its own buffers) — the training example does.
//!
//! # Example
//!
//! ```no_run
//! use ringccl::ddp::{Reducer, ReducerOptions};
//! use ringccl::Communicator;
//!
//! let comm = Communicator::all()?;
//! let compute: Vec<_> = comm.streams().to_vec();
//! // Two parameters: a 1024 × 1024 weight and its bias (registration order).
//! let mut reducer = Reducer::<f32>::new(&comm, &[1024 * 1024, 1024], &compute, ReducerOptions::default())?;
//! for local in 0..comm.local_ranks().len() {
//!     // The backward pass writes each gradient into its view (here: zeros), then marks it.
//!     compute[local].memset_zeros(&mut reducer.grad_mut(local, 1)?)?;
//!     reducer.mark_ready(local, 1)?; // the bias: its bucket is not complete yet
//!     compute[local].memset_zeros(&mut reducer.grad_mut(local, 0)?)?;
//!     reducer.mark_ready(local, 0)?; // on the last local rank, this starts the all-reduce
//! }
//! reducer.wait()?; // the compute streams now wait for the averaged gradients
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bucket;
mod reducer;

pub use bucket::{Bucket, BucketCaps, BucketPlan, ReadyState, ALIGN_BYTES};
pub use reducer::{Launch, Reducer, ReducerError, ReducerOptions, Reduction};
