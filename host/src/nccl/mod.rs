//! `cudarc::nccl`'s safe API over ringccl: code written for `cudarc::nccl` runs on ringccl by
//! changing its `use` line (`cudarc::nccl::safe::{Comm, Id, ReduceOp}` →
//! `ringccl::nccl::{Comm, Id, ReduceOp}`) and dropping the NCCL library.
//!
//! The same names, signatures and meaning as cudarc 0.19's `cudarc::nccl::safe`: [`Id`]
//! (`new`, `uninit`, `internal`), [`Comm`] (`from_rank`, `from_devices`, `stream`, `context`,
//! `ordinal`, `rank`, `world_size`, `send`, `recv`, `broadcast`, `broadcast_in_place`,
//! `all_gather`, `all_reduce`, `all_reduce_in_place`, `reduce`, `reduce_in_place`,
//! `reduce_scatter`, `group`), [`Group`], [`ReduceOp`], [`NcclType`], [`group_start`] /
//! [`group_end`]; errors are [`result::NcclError`] (`.0` the NCCL code, as in cudarc), which
//! converts into [`crate::Error`] and back. Calls return `Result<NcclStatus, NcclError>` as
//! cudarc's do. Buffers are cudarc's `CudaSlice`, `CudaView`, `CudaViewMut` (anything
//! `DevicePtr`/`DevicePtrMut`), on the `Comm`'s device.
//!
//! # How calls are issued
//!
//! A [`Comm`] of [`Comm::from_rank`] holds one rank of a ringccl communicator of processes:
//! its collectives are issued at once on its stream, like NCCL's; its sends and receives too,
//! except inside a group, where they are queued and issued together as one
//! [`Communicator::peer_ops`](crate::Communicator::peer_ops) at the group's end (so that a
//! ring of sends and receives cannot wait on itself). A collective called in a group after
//! some of its sends and receives issues those first, in call order; every rank should then
//! split its group the same way, since each part pairs only with the peers' same part.
//!
//! The `Comm`s of [`Comm::from_devices`] share one ringccl communicator of this process, whose
//! calls take every rank's buffers at once. Each rank's calls are queued in call order; a
//! collective is issued once it heads every rank's queue, and the sends and receives heading
//! the queues once they pair up (the `k`-th send from `a` to `b` with the `k`-th receive on
//! `b` from `a`). So a loop over the `Comm`s on one thread works, inside a group or not, and
//! so do threads, one per `Comm`. Every rank must make the same calls in the same order (as
//! NCCL requires); a collective that differs from the other ranks' fails
//! (`ncclInvalidUsage`, naming both) and so does every later call of the communicator, since
//! the ranks that had already returned cannot be told.
//!
//! A queued call returns `Ok` before its work is enqueued. Its buffers are held by a gate
//! ([`gate`]): every later cudarc-tracked use of them — a copy, another stream's kernel, the
//! free of a dropped `CudaSlice` — waits until the call has run, so dropping or reusing them
//! early never lets the call touch memory in use by something else. But the driver refuses a
//! copy from or to memory whose stream-ordered free was already requested: on one H200
//! (2026-12-01) a group's send whose buffer was dropped before `group_end` failed there with
//! `ncclUnhandledCudaError` (`cuMemcpyDtoDAsync`: `CUDA_ERROR_INVALID_VALUE`). Keep a queued
//! call's buffers alive until the group has ended (as NCCL requires). (This needs cudarc's event tracking, on by default; a queued call of buffers
//! allocated with it disabled fails with `ncclInvalidUsage`.) Once issued, the call runs on a
//! stream of ringccl's that first waits for the caller's stream as it was at the call, and the
//! caller's stream then waits for it. Two consequences, as with NCCL's kernels that wait for
//! their peers: work the caller enqueues on its stream between a queued call and its issue, on
//! memory cudarc does not track for it, is not ordered after the call; and waiting for the
//! whole device (`cuCtxSynchronize`, `synchronize` of a queued buffer, a free that
//! synchronises) before the call is issued does not return until it is. Calls still queued
//! when the communicator is dropped never run (logged as an error).
//!
//! Not mirrored: cudarc's `group!` macro (it names `result::group_start` in the caller's
//! scope), `char` as an element type (see [`NcclType`]), and the raw `result`/`sys` layers.
//!
//! # Example: one process per GPU
//!
//! The shape of cudarc's own test of `Comm::from_rank` (one thread per GPU here; processes
//! work the same, with the id's bytes sent to them):
//!
//! ```no_run
//! use ringccl::cudarc::driver::CudaContext;
//! use ringccl::nccl::{Comm, Id, ReduceOp};
//!
//! let n = 2;
//! let n_devices = CudaContext::device_count().unwrap() as usize;
//! let id = Id::new().unwrap();
//! let threads: Vec<_> = (0..n_devices)
//!     .map(|i| {
//!         println!("III {i}");
//!         std::thread::spawn(move || {
//!             println!("Within thread {i}");
//!             let ctx = CudaContext::new(i).unwrap();
//!             let stream = ctx.default_stream();
//!             let comm = Comm::from_rank(stream.clone(), i, n_devices, id).unwrap();
//!             let slice = stream.clone_htod(&vec![(i + 1) as f32 * 1.0; n]).unwrap();
//!             let mut slice_receive = stream.alloc_zeros::<f32>(n).unwrap();
//!             comm.all_reduce(&slice, &mut slice_receive, &ReduceOp::Sum)
//!                 .unwrap();
//!
//!             let out = stream.clone_dtoh(&slice_receive).unwrap();
//!
//!             assert_eq!(out, vec![(n_devices * (n_devices + 1)) as f32 / 2.0; n]);
//!         })
//!     })
//!     .collect();
//! for t in threads {
//!     t.join().unwrap()
//! }
//! ```
//!
//! cudarc's test of views, unchanged but for the `use` lines:
//!
//! ```no_run
//! use ringccl::cudarc::driver::CudaContext;
//! use ringccl::nccl::{Comm, Id, ReduceOp};
//!
//! let n = 2;
//! let n_devices = CudaContext::device_count().unwrap() as usize;
//! let id = Id::new().unwrap();
//! let threads: Vec<_> = (0..n_devices)
//!     .map(|i| {
//!         println!("III {i}");
//!         std::thread::spawn(move || {
//!             println!("Within thread {i}");
//!             let ctx = CudaContext::new(i).unwrap();
//!             let stream = ctx.default_stream();
//!             let comm = Comm::from_rank(stream.clone(), i, n_devices, id).unwrap();
//!             let slice = stream.clone_htod(&vec![(i + 1) as f32 * 1.0; n]).unwrap();
//!             let mut slice_receive = stream.alloc_zeros::<f32>(n).unwrap();
//!             let slice_view = slice.slice(..);
//!             let mut slice_receive_view = slice_receive.slice_mut(..);
//!
//!             comm.all_reduce(&slice_view, &mut slice_receive_view, &ReduceOp::Sum)
//!                 .unwrap();
//!
//!             let out = stream.clone_dtoh(&slice_receive).unwrap();
//!
//!             assert_eq!(out, vec![(n_devices * (n_devices + 1)) as f32 / 2.0; n]);
//!         })
//!     })
//!     .collect();
//! for t in threads {
//!     t.join().unwrap()
//! }
//! ```
//!
//! # Example: a ring of sends and receives in a group
//!
//! ```no_run
//! use ringccl::cudarc::driver::CudaContext;
//! use ringccl::nccl::{group_end, group_start, Comm, Id};
//!
//! # fn rank_and_id() -> (usize, usize, Id) { (0, 1, Id::new().unwrap()) }
//! let (rank, world, id) = rank_and_id(); // from the launcher
//! let stream = CudaContext::new(rank)?.default_stream();
//! let comm = Comm::from_rank(stream.clone(), rank, world, id).unwrap();
//! let send = stream.clone_htod(&vec![rank as f32; 1024])?;
//! let mut recv = stream.alloc_zeros::<f32>(1024)?;
//! group_start().unwrap();
//! comm.send(&send, ((rank + 1) % world) as i32).unwrap();
//! comm.recv(&mut recv, ((rank + world - 1) % world) as i32).unwrap();
//! group_end().unwrap(); // both transfers issued here, together
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod gate;
mod group;
mod ops;
pub mod result;
pub mod safe;

pub use result::{NcclError, NcclStatus};
pub use safe::*;
