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
//! * [`collectives`]: the public API (validate, schedule, enqueue).

pub mod buffer;
pub mod collectives;
pub mod comm;
pub mod driver;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod schedule;
pub mod sim;

pub use buffer::Io;
pub use comm::Communicator;
pub use dtype::{DataType, DeviceElement};
pub use error::{Arg, Error, Result};
pub use gpu_kernels::op::RedOp;
