//! ringccl's GPU kernels, written in `#![no_std]` Rust and compiled to PTX.
//!
//! Layers, bottom up:
//! * [`element`]: the twelve element types ([`DataType`] names them at run time) and the
//!   arithmetic of one reduction step, shared with the host so the CPU computes the exact bits
//!   a GPU step produces;
//! * [`op`]: the reduction operators (sum, prod, min, max, avg);
//! * [`prim`]: NCCL's primitives (copy, reduce, reduce-copy) as one generic function;
//! * [`ctl`]: what every cross-process kernel shares: the flag arrays and their barrier, the
//!   control block every wait watches, and the bounded wait kernel;
//! * [`oneshot`]: the one-shot all-reduce for small messages (one block per rank, a device-side
//!   barrier over flags instead of host events);
//! * [`ll`]: the LL push all-reduce for small calls among processes (flag inside the data,
//!   one exchange per call);
//! * [`twoshot`]: the two-shot all-reduce for mid sizes (many blocks per rank, a barrier per
//!   block) and the other collectives on its barriers;
//! * [`entry`]: the one list of `extern "ptx-kernel"` entry points, one per primitive × type
//!   (× operator). On nvptx64 it expands into the kernels (their shapes are in `kernels`), on
//!   the host into [`ENTRY_POINTS`], their names and signatures, with [`entry::entry_index`]
//!   to find one; `cargo xtask build-ptx` compiles the kernels to PTX and assembles each PTX
//!   into a cubin;
//! * [`artifacts`] (host only): that PTX and those cubins, shipped in this package
//!   (compressed) for the host crate to embed.
//!
//! ```
//! use gpu_kernels::{op::Sum, prim::{reduce_copy, Grid}};
//! let a = [1.0f32, 2.0, 3.0];
//! let b = [10.0f32, 20.0, 30.0];
//! let mut out = [0.0f32; 3];
//! // One "thread" doing the whole grid's work, as the CPU tests do.
//! unsafe {
//!     reduce_copy::<f32, Sum, 2>(Grid { thread: 0, threads: 1 }, [a.as_ptr(), b.as_ptr()], 2,
//!                                out.as_mut_ptr(), core::ptr::null_mut(), 3, 1);
//! }
//! assert_eq!(out, [11.0, 22.0, 33.0]);
//! ```
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, f16, asm_experimental_arch)
)]

#[cfg(not(target_arch = "nvptx64"))]
pub mod artifacts;
pub mod ctl;
pub mod element;
pub mod entry;
pub mod ll;
pub mod oneshot;
pub mod op;
pub mod p2p;
pub mod prim;
pub mod twoshot;

#[cfg(target_arch = "nvptx64")]
mod kernels;

pub use element::DataType;
#[cfg(not(target_arch = "nvptx64"))]
pub use entry::{EntryKind, ENTRY_POINTS};

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // No kernel has a panic path (the build checks the PTX for calls); trap if one ever did.
    // SAFETY: `trap` aborts the kernel; it has no other effect.
    unsafe { core::arch::asm!("trap;", options(noreturn)) }
}
