//! # ringccl
//!
//! Collective communications between NVIDIA GPUs, in Rust: all-reduce, reduce-scatter,
//! all-gather, broadcast, reduce, send/recv, all-to-all, gather and scatter, with sum, prod,
//! min, max and avg over f32, f64, f16, bf16 and integers. The kernels are Rust compiled to PTX
//! (crate `gpu-kernels`), embedded here and loaded at run time through the CUDA driver.
//!
//! What a program uses: a [`Communicator`] (one rank per GPU, built from device ordinals and a
//! [`Config`]), one [`Io`] per rank naming its buffers (cudarc's `CudaSlice`/`CudaView`, or
//! anything implementing [`DeviceSlice`]), a [`RedOp`], and the streams the work goes on.
//! Calls only enqueue; every problem is an [`Error`] whose message says what to do.
//! `RINGCCL_DEBUG=info` reports what ringccl chose (ring, algorithm, chunk).
//!
//! # Example: all-reduce over every GPU
//!
//! One rank per GPU; each rank's buffer lives on its GPU and its work goes on its stream. The
//! call only enqueues: synchronise the streams before reading the results.
//!
//! ```no_run
//! use ringccl::{Communicator, Io, RedOp};
//!
//! let comm = Communicator::all()?;
//! let n = comm.nranks();
//! let count = 1024;
//! let mut bufs = Vec::new();
//! for r in 0..n {
//!     // `comm.stream(r)` is a stream on rank r's GPU.
//!     bufs.push(comm.stream(r).clone_htod(&vec![(r + 1) as f32; count])?);
//! }
//! {
//!     let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
//!     comm.all_reduce(&mut io, count, RedOp::Sum, comm.streams())?;
//! }
//! for (r, buf) in bufs.iter().enumerate() {
//!     comm.stream(r).synchronize()?;
//!     let out = comm.stream(r).clone_dtoh(buf)?;
//!     assert!(out.iter().all(|&x| x == (n * (n + 1) / 2) as f32));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `host/examples/all_reduce.rs` is the same as a program. `docs/ARCHITECTURE.md` maps the
//! modules and follows one call from this API to the kernel launch.

/// Declares the internal modules: private, or public with the `internals` feature (for
/// ringccl's own GPU tests and tools; not a stable API).
macro_rules! internal_modules {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[cfg(feature = "internals")]
        pub mod $name;
        $(#[$doc])*
        #[cfg(not(feature = "internals"))]
        mod $name;
    )*};
}

internal_modules! {
    /// The public calls: validate, plan, enqueue.
    api;
    /// The host-side bootstrap of ranks in several processes (rendezvous over TCP).
    bootstrap;
    /// The communicator: ranks, resources, transport, ring, config.
    comm;
    /// Executors: ring (events) and one-shot (device barrier).
    exec;
    /// The checked CUDA driver layer.
    driver;
    /// The per-rank lists of a call, inline for the GPUs of a machine.
    per_rank;
    /// Planning: algorithm, chunk, ring order, prepared schedules.
    plan;
    /// Per-rank resources and the per-call handle.
    resources;
    /// Pure ring schedules.
    schedule;
    /// How ranks reach each other's memory.
    transport;
}

/// A CPU simulator of schedules (tests and tools only).
#[cfg(feature = "internals")]
pub mod sim;
#[cfg(all(test, not(feature = "internals")))]
mod sim;

mod config;
pub mod ddp;
mod debug;
mod dtype;
mod error;
mod kind;
/// `cudarc::nccl`'s safe API (`Comm`, `Id`, `ReduceOp`, groups) over ringccl.
pub mod nccl;

/// ringccl's internals, for its own GPU tests and tools (feature `internals`; not a stable API).
#[cfg(feature = "internals")]
pub mod internals {
    pub use crate::plan::topology;
    pub use crate::{api, comm, driver, exec, per_rank, plan, resources, schedule, sim, transport};
}

pub use api::{DeviceSlice, DeviceSliceMut, Io, Op, PeerOp, RawBuf, Scalar, SendRecv};
pub use bootstrap::{BootstrapFailure, LaunchEnv, UniqueId};
pub use comm::{Communicator, PendingCommunicator, Registered, RegistrationId};
pub use config::{Algorithm, Config, DebugLevel, Network};
pub use driver::device_count;
pub use dtype::{DataType, DeviceElement, F8E4M3, F8E5M2};
pub use error::{Arg, Error, Result};
pub use gpu_kernels::op::RedOp;
pub use kind::{CollectiveKind, UnknownCollective};

/// The CUDA driver API crate ringccl is built on (its contexts, streams and slices are the ones
/// ringccl's calls take).
pub use cudarc;
/// The `f16`/`bf16` types ringccl reduces.
pub use half;
