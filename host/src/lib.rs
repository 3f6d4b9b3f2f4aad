//! # ringccl
//!
//! Collective communications between NVIDIA GPUs, in Rust: all-reduce, reduce-scatter,
//! all-gather, broadcast, reduce, send/recv, all-to-all, gather and scatter, with sum, prod,
//! min, max and avg over f32, f64, f16, bf16 and integers. The kernels are Rust compiled to PTX
//! (crate `gpu-kernels`), embedded here and loaded at run time through the CUDA driver.
//!
//! Layers, bottom up (each module's docs say more):
//! * [`error`]: the one error type;
//! * [`dtype`]: element types;
//! * [`driver`]: a thin checked layer over `cudarc` (driver presence, devices, peer access,
//!   the embedded PTX, kernel launches);
//! * [`schedule`]: pure ring schedules (which rank moves which elements at which step);
//! * [`sim`]: a CPU simulator that executes schedules on host arrays;
//! * [`comm`]: the communicator (one rank per GPU, one process);
//! * [`exec`]: turns a schedule into kernel launches, event records and waits;
//! * [`collectives`]: the public API (validate, schedule, enqueue);
//! * [`tuning`]: chunk sizes and launch caps, with environment overrides;
//! * [`topology`]: the ring order, chosen from the peer-to-peer link scores.
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
//!     // `comm.context(r)` is rank r's CUDA context, `comm.stream(r)` a stream on it.
//!     assert_eq!(comm.context(r).ordinal(), comm.ordinal(r));
//!     bufs.push(comm.stream(r).clone_htod(&vec![(r + 1) as f32; count])?);
//! }
//! let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
//! {
//!     let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
//!     comm.all_reduce(&mut io, count, RedOp::Sum, &streams)?;
//! }
//! for (r, buf) in bufs.iter().enumerate() {
//!     comm.stream(r).synchronize()?;
//!     let out = comm.stream(r).clone_dtoh(buf)?;
//!     assert!(out.iter().all(|&x| x == (n * (n + 1) / 2) as f32));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `host/examples/all_reduce.rs` is the same as a program.

pub mod buffer;
pub mod collectives;
pub mod comm;
pub mod driver;
pub mod dtype;
pub mod error;
pub mod exec;
mod kind;
pub mod schedule;
pub mod sim;
pub mod topology;
pub mod tuning;

pub use buffer::Io;
pub use collectives::SendRecv;
pub use comm::Communicator;
pub use dtype::{DataType, DeviceElement};
pub use error::{Arg, Error, Result};
pub use gpu_kernels::op::RedOp;
pub use kind::{CollectiveKind, UnknownCollective};
