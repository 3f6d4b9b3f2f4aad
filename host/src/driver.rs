//! A thin, checked layer over `cudarc`'s driver API.
//!
//! Everything ringccl asks of the CUDA driver goes through here, and every failure comes back
//! as an [`Error`] (never a panic):
//! * [`ensure_driver`]: is `libcuda.so` there at all? (`cudarc` panics on first use without it,
//!   so every entry point of ringccl calls this first);
//! * [`device_count`], [`can_access_peer`], [`enable_peer_access`]: devices and NVLink/PCIe peer
//!   access (only in `cudarc::driver::sys`); [`p2p_link_scores`]: the link scores the ring order
//!   is chosen from ([`crate::topology`]);
//! * [`ptx`], [`ptx_arch_for`]: the kernels' PTX, embedded (deflated) at compile time;
//! * [`Kernels`]: the module loaded into one context, its 160 functions, and typed launchers
//!   for the three primitives (copy, reduce, reduce-copy) that pick the grid ([`LaunchPlan`]),
//!   and for the one-shot all-reduce (one block per rank).
//!
//! ```no_run
//! use ringccl::driver::{device_count, ensure_driver};
//! ensure_driver()?; // Err(Error::NoDriver) on a machine without the NVIDIA driver
//! println!("{} GPU(s)", device_count()?);
//! # Ok::<(), ringccl::Error>(())
//! ```

use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use gpu_kernels::{EntryKind, ENTRY_POINTS};

use crate::{DataType, Error, RedOp, Result};

/// The kernels compiled for `sm_90` (Hopper and newer), deflated at build time.
static PTX_SM90_DEFLATED: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ringccl_sm90.ptx.deflate"));
/// The kernels compiled for `sm_80` (Ampere), deflated at build time.
static PTX_SM80_DEFLATED: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ringccl_sm80.ptx.deflate"));

/// Which embedded PTX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxArch {
    /// `.target sm_90`: devices of compute capability 9.0 and newer.
    Sm90,
    /// `.target sm_80`: devices of compute capability 8.x.
    Sm80,
}

/// The embedded PTX text for `arch` (inflated once, on first use; about 6 MB each).
///
/// ```
/// use ringccl::driver::{ptx, PtxArch};
/// assert!(ptx(PtxArch::Sm90).unwrap().contains(".target sm_90"));
/// assert!(ptx(PtxArch::Sm80).unwrap().contains(".target sm_80"));
/// ```
pub fn ptx(arch: PtxArch) -> Result<&'static str> {
    static SM90: OnceLock<Result<String, String>> = OnceLock::new();
    static SM80: OnceLock<Result<String, String>> = OnceLock::new();
    let (cell, packed) = match arch {
        PtxArch::Sm90 => (&SM90, PTX_SM90_DEFLATED),
        PtxArch::Sm80 => (&SM80, PTX_SM80_DEFLATED),
    };
    cell.get_or_init(|| {
        let bytes = miniz_oxide::inflate::decompress_to_vec(packed)
            .map_err(|e| format!("embedded PTX is corrupt: {e:?}"))?;
        String::from_utf8(bytes).map_err(|_| "embedded PTX is not UTF-8".to_string())
    })
    .as_deref()
    .map_err(|reason| Error::Kernel {
        reason: reason.clone(),
    })
}

/// The embedded PTX for a device of compute capability `major.minor`: sm_90 code on 9.0 and
/// newer, sm_80 code on 8.x, `None` for older devices (the kernels need sm_80).
///
/// ```
/// use ringccl::driver::{ptx_arch_for, PtxArch};
/// assert_eq!(ptx_arch_for(9, 0), Some(PtxArch::Sm90));
/// assert_eq!(ptx_arch_for(8, 6), Some(PtxArch::Sm80));
/// assert_eq!(ptx_arch_for(7, 5), None);
/// ```
pub fn ptx_arch_for(major: i32, _minor: i32) -> Option<PtxArch> {
    match major {
        m if m >= 9 => Some(PtxArch::Sm90),
        8 => Some(PtxArch::Sm80),
        _ => None,
    }
}

/// Checks that the CUDA driver library can be loaded and initialises it (`cuInit`).
///
/// Call this before anything else that touches CUDA: `cudarc` panics on first use when
/// `libcuda.so` is missing. The answer is computed once per process.
///
/// ```no_run
/// match ringccl::driver::ensure_driver() {
///     Ok(()) => println!("driver present"),
///     Err(ringccl::Error::NoDriver) => println!("no NVIDIA driver on this machine"),
///     Err(e) => println!("{e}"),
/// }
/// ```
pub fn ensure_driver() -> Result<()> {
    static STATE: OnceLock<Result<()>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to open the library (and closes it again);
            // it calls no function in it.
            if !unsafe { sys::is_culib_present() } {
                return Err(Error::NoDriver);
            }
            result::init().map_err(|e| Error::cuda("cuInit", None, e))
        })
        .clone()
}

/// The number of CUDA devices visible to this process (`CUDA_VISIBLE_DEVICES` applies).
///
/// ```no_run
/// let n = ringccl::driver::device_count()?;
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn device_count() -> Result<usize> {
    ensure_driver()?;
    let n = result::device::get_count().map_err(|e| Error::cuda("cuDeviceGetCount", None, e))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

fn cu_device(ordinal: usize) -> Result<sys::CUdevice> {
    let as_int = i32::try_from(ordinal).map_err(|_| Error::BadDevice {
        ordinal,
        reason: "ordinal out of range".into(),
    })?;
    result::device::get(as_int).map_err(|e| Error::cuda("cuDeviceGet", None, e))
}

/// Whether device `dev_a` can read and write the memory of device `dev_b` directly
/// (`cuDeviceCanAccessPeer`). A device and itself: `true`.
///
/// ```no_run
/// if ringccl::driver::can_access_peer(0, 1)? {
///     println!("GPU 0 can access GPU 1 directly");
/// }
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn can_access_peer(dev_a: usize, dev_b: usize) -> Result<bool> {
    ensure_driver()?;
    if dev_a == dev_b {
        return Ok(true);
    }
    let (a, b) = (cu_device(dev_a)?, cu_device(dev_b)?);
    let mut can: std::ffi::c_int = 0;
    // SAFETY: `can` is a valid out-pointer; `a` and `b` are device handles from `cuDeviceGet`.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) }
        .result()
        .map_err(|e| Error::cuda("cuDeviceCanAccessPeer", None, e))?;
    Ok(can != 0)
}

/// Lets kernels and copies running in `ctx` access memory allocated on `peer`'s device, one
/// direction: `cuCtxEnablePeerAccess` (for `cuMemAlloc` memory; enabling twice is not an
/// error) and `cuMemPoolSetAccess` on the peer device's current memory pool (stream-ordered
/// allocations, which `cudarc`'s `CudaStream::alloc` makes, are not covered by context peer
/// access). The pool setting is process-wide and applies to the pool that is current now.
///
/// ```no_run
/// use cudarc::driver::CudaContext;
/// ringccl::driver::ensure_driver()?;
/// let (a, b) = (CudaContext::new(0).unwrap(), CudaContext::new(1).unwrap());
/// ringccl::driver::enable_peer_access(&a, &b)?;
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn enable_peer_access(ctx: &CudaContext, peer: &CudaContext) -> Result<()> {
    ctx.bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", None, e))?;
    // SAFETY: `ctx` is current on this thread and `peer.cu_ctx()` is a live context (the
    // `CudaContext` owns it for the duration of the call); flags must be 0.
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
    match r {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
        other => {
            return Err(Error::cuda(
                "cuCtxEnablePeerAccess",
                None,
                result::DriverError(other),
            ));
        }
    }
    if !peer.has_async_alloc() {
        return Ok(());
    }
    // SAFETY: `cu_device` comes from `cuDeviceGet` (inside `CudaContext::new`).
    let pool = unsafe { result::device::get_mem_pool(peer.cu_device()) }
        .map_err(|e| Error::cuda("cuDeviceGetMemPool", None, e))?;
    let accessor = i32::try_from(ctx.ordinal()).map_err(|_| Error::BadDevice {
        ordinal: ctx.ordinal(),
        reason: "ordinal out of range".into(),
    })?;
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: accessor,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `pool` is the device's live current pool; `desc` is one valid descriptor.
    unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }
        .result()
        .map_err(|e| Error::cuda("cuMemPoolSetAccess", None, e))
}

/// Performance ranks (`CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`, 0 = best) that
/// [`link_score`] tells apart; worse ranks all score like this one.
pub const WORST_SCORED_PERF_RANK: i32 = 15;

/// The score of a directed link for [`crate::topology::best_ring`]: 0 without peer access,
/// otherwise `1 + (WORST_SCORED_PERF_RANK - rank)` for the driver's performance rank (0 is the
/// best; ranks are clamped to `0..=WORST_SCORED_PERF_RANK`), so a better link scores higher and
/// every link with access scores at least 1.
///
/// ```
/// use ringccl::driver::{link_score, WORST_SCORED_PERF_RANK};
/// assert_eq!(link_score(false, 0), 0);
/// assert!(link_score(true, 0) > link_score(true, 1));
/// assert_eq!(link_score(true, WORST_SCORED_PERF_RANK), 1);
/// assert_eq!(link_score(true, 1000), 1);
/// ```
pub fn link_score(access: bool, performance_rank: i32) -> u32 {
    if !access {
        return 0;
    }
    let rank = performance_rank.clamp(0, WORST_SCORED_PERF_RANK);
    // `rank` is within 0..=WORST_SCORED_PERF_RANK, so the difference is small and non-negative.
    1 + (WORST_SCORED_PERF_RANK - rank).unsigned_abs()
}

/// One `cuDeviceGetP2PAttribute` value for the directed pair `src -> dst` (distinct devices).
fn p2p_attribute(
    attrib: sys::CUdevice_P2PAttribute,
    src: sys::CUdevice,
    dst: sys::CUdevice,
) -> Result<i32> {
    let mut value: std::ffi::c_int = 0;
    // SAFETY: `value` is a valid out-pointer; `src` and `dst` are distinct device handles from
    // `cuDeviceGet`; `attrib` is a valid enumerator.
    unsafe { sys::cuDeviceGetP2PAttribute(&mut value, attrib, src, dst) }
        .result()
        .map_err(|e| Error::cuda("cuDeviceGetP2PAttribute", None, e))?;
    Ok(value)
}

/// The link scores between the given devices, for [`crate::topology::best_ring`]:
/// `scores[a][b]` is [`link_score`] of `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED` and
/// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` from device `ordinals[a]` to device `ordinals[b]`;
/// the diagonal is 0. This reads what the hardware supports; whether peer access is enabled
/// is the communicator's business.
///
/// Errors: [`Error::NoDriver`], [`Error::BadDevice`] for an ordinal the driver rejects,
/// [`Error::Cuda`] if the driver cannot answer.
///
/// ```no_run
/// let scores = ringccl::driver::p2p_link_scores(&[0, 1, 2, 3])?;
/// println!("ring: {:?}", ringccl::topology::best_ring(&scores));
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn p2p_link_scores(ordinals: &[usize]) -> Result<Vec<Vec<u32>>> {
    ensure_driver()?;
    let devs = ordinals
        .iter()
        .map(|&o| cu_device(o))
        .collect::<Result<Vec<_>>>()?;
    let n = devs.len();
    let mut scores = vec![vec![0u32; n]; n];
    for (a, row) in scores.iter_mut().enumerate() {
        for (b, cell) in row.iter_mut().enumerate() {
            if a == b || ordinals[a] == ordinals[b] {
                continue;
            }
            use sys::CUdevice_P2PAttribute as A;
            let access = p2p_attribute(
                A::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                devs[a],
                devs[b],
            )?;
            if access == 0 {
                continue;
            }
            let rank = p2p_attribute(
                A::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
                devs[a],
                devs[b],
            )?;
            *cell = link_score(true, rank);
        }
    }
    Ok(scores)
}

/// Threads per block the launchers use when the function allows it.
pub const DEFAULT_THREADS: u32 = 512;
/// Bytes one thread moves per loop iteration: a 16-byte vector, unrolled 4 times.
pub const BYTES_PER_THREAD_ITERATION: u64 = 16 * 4;

/// Where a step's memory traffic goes, which decides how many blocks are worth launching.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Traffic {
    /// All pointers are on the launching GPU: up to 2 blocks per SM (HBM saturates there).
    Local,
    /// Some pointer is on another GPU (read or written over NVLink/PCIe), in one direction:
    /// at most [`crate::tuning::peer_blocks`] blocks.
    Peer,
    /// The step both reads and writes another GPU's memory (both directions of the link): at
    /// most [`crate::tuning::peer_duplex_blocks`] blocks.
    PeerDuplex,
}

/// A 1-D launch shape: `blocks` × `threads`.
///
/// ```
/// use ringccl::driver::{LaunchPlan, Traffic};
/// // 1 GiB on a 132-SM GPU, local: 2 blocks per SM of 512 threads.
/// let p = LaunchPlan::new(1 << 30, 1024, 132, Traffic::Local);
/// assert_eq!((p.blocks, p.threads), (264, 512));
/// // A function limited to 384 threads per block gets 384.
/// assert_eq!(LaunchPlan::new(1 << 30, 384, 132, Traffic::Peer).threads, 384);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchPlan {
    /// Blocks in the grid (≥ 1).
    pub blocks: u32,
    /// Threads per block (≥ 1, a multiple of 32 when the limit allows).
    pub threads: u32,
}

impl LaunchPlan {
    /// The shape for `count_bytes` bytes (the size of one destination) on a function that
    /// allows `max_threads` threads per block, on a GPU with `sm_count` SMs: [`DEFAULT_THREADS`]
    /// threads clamped to the limit (rounded down to whole warps), and enough blocks for each
    /// thread to do 4 16-byte vectors, capped by [`LaunchPlan::block_cap`]. The kernels are
    /// grid-stride loops, so any shape is correct; this one is fast.
    pub fn new(count_bytes: u64, max_threads: u32, sm_count: u32, traffic: Traffic) -> Self {
        let mut threads = DEFAULT_THREADS.min(max_threads.max(1));
        if threads >= 32 {
            threads -= threads % 32;
        }
        let per_block = BYTES_PER_THREAD_ITERATION * u64::from(threads);
        let wanted = count_bytes.div_ceil(per_block).max(1);
        let cap = u64::from(Self::block_cap(sm_count, traffic));
        let blocks = u32::try_from(wanted.min(cap)).unwrap_or(u32::MAX);
        LaunchPlan { blocks, threads }
    }

    /// The most blocks worth launching: 2 × `sm_count` for local traffic, [`crate::tuning::peer_blocks`]
    /// for peer traffic (never more than 2 × `sm_count`, never less than 1).
    ///
    /// ```
    /// use ringccl::driver::{LaunchPlan, Traffic};
    /// assert_eq!(LaunchPlan::block_cap(132, Traffic::Local), 264);
    /// assert_eq!(LaunchPlan::block_cap(132, Traffic::Peer), 64);
    /// ```
    pub fn block_cap(sm_count: u32, traffic: Traffic) -> u32 {
        let local = sm_count.saturating_mul(2).max(1);
        match traffic {
            Traffic::Local => local,
            Traffic::Peer => crate::tuning::peer_blocks().min(local),
            Traffic::PeerDuplex => crate::tuning::peer_duplex_blocks().min(local),
        }
    }

    fn config(self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.blocks, 1, 1),
            block_dim: (self.threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// The index in [`ENTRY_POINTS`] of a primitive for a type and operator (`None` for copies).
///
/// ```
/// use gpu_kernels::{EntryKind, ENTRY_POINTS};
/// use ringccl::{driver::entry_index, DataType, RedOp};
/// let i = entry_index(EntryKind::Reduce, DataType::F16, Some(RedOp::Max)).unwrap();
/// assert_eq!(ENTRY_POINTS[i].name, "ringccl_reduce_max_f16");
/// ```
pub fn entry_index(kind: EntryKind, dtype: DataType, op: Option<RedOp>) -> Option<usize> {
    ENTRY_POINTS
        .iter()
        .position(|e| e.kind == kind && e.dtype == dtype.name() && e.op == op)
}

/// ringccl's kernels loaded into one context: the module, its functions (indexed like
/// [`ENTRY_POINTS`]) with their thread limits, and launchers for the three primitives.
///
/// The launchers take raw device addresses (`u64`) and enqueue one kernel on a stream of this
/// context; a count of 0 launches nothing.
///
/// ```no_run
/// use cudarc::driver::CudaContext;
/// use ringccl::{driver::{ensure_driver, Kernels, Traffic}, DataType};
/// ensure_driver()?;
/// let ctx = CudaContext::new(0).unwrap();
/// let stream = ctx.new_stream().unwrap();
/// let k = Kernels::load(&ctx, Some(0))?;
/// let (src, dst) = (stream.alloc_zeros::<f32>(1024).unwrap(), stream.alloc_zeros::<f32>(1024).unwrap());
/// use cudarc::driver::DevicePtr;
/// let (s, _r) = src.device_ptr(&stream);
/// let (d, _w) = dst.device_ptr(&stream);
/// // SAFETY: both buffers hold 1024 f32 on this device and outlive the kernel.
/// unsafe { k.copy(&stream, DataType::F32, s, d, None, 1024, Traffic::Local)? };
/// # Ok::<(), ringccl::Error>(())
/// ```
#[derive(Debug)]
pub struct Kernels {
    rank: Option<usize>,
    functions: Vec<CudaFunction>,
    max_threads: Vec<u32>,
    sm_count: u32,
    compute_capability: (i32, i32),
}

impl Kernels {
    /// Loads the embedded PTX matching the device of `ctx` (JIT-compiled by the driver) and
    /// looks up every entry point. `rank` only labels errors.
    pub fn load(ctx: &Arc<CudaContext>, rank: Option<usize>) -> Result<Self> {
        let cc = ctx
            .compute_capability()
            .map_err(|e| Error::cuda("cuDeviceGetAttribute", rank, e))?;
        let arch = ptx_arch_for(cc.0, cc.1).ok_or_else(|| Error::Kernel {
            reason: format!("device has compute capability {}.{}", cc.0, cc.1),
        })?;
        let ptx = ptx(arch)?;
        let sm = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::cuda("cuDeviceGetAttribute", rank, e))?;
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| Error::Kernel {
                reason: format!(
                    "cuModuleLoadData failed with {:?} on compute capability {}.{}",
                    e.0, cc.0, cc.1
                ),
            })?;
        let mut functions = Vec::with_capacity(ENTRY_POINTS.len());
        let mut max_threads = Vec::with_capacity(ENTRY_POINTS.len());
        for entry in ENTRY_POINTS {
            let f = module
                .load_function(entry.name)
                .map_err(|e| Error::Kernel {
                    reason: format!("entry point {} not found ({:?})", entry.name, e.0),
                })?;
            let limit = f
                .max_threads_per_block()
                .map_err(|e| Error::cuda("cuFuncGetAttribute", rank, e))?;
            max_threads.push(u32::try_from(limit).unwrap_or(1).max(1));
            functions.push(f);
        }
        Ok(Kernels {
            rank,
            functions,
            max_threads,
            sm_count: u32::try_from(sm).unwrap_or(1).max(1),
            compute_capability: cc,
        })
    }

    /// The device's compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The device's number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK` of entry point `index` (0 if no such index).
    pub fn max_threads(&self, index: usize) -> u32 {
        self.max_threads.get(index).copied().unwrap_or(0)
    }

    /// The launch shape for entry point `index` moving `count_bytes` bytes.
    pub fn plan(&self, index: usize, count_bytes: u64, traffic: Traffic) -> LaunchPlan {
        LaunchPlan::new(count_bytes, self.max_threads(index), self.sm_count, traffic)
    }

    fn function(
        &self,
        kind: EntryKind,
        dtype: DataType,
        op: Option<RedOp>,
    ) -> Result<(usize, &CudaFunction)> {
        entry_index(kind, dtype, op)
            .and_then(|i| self.functions.get(i).map(|f| (i, f)))
            .ok_or_else(|| Error::Kernel {
                reason: format!("no {kind:?} kernel for {} {op:?}", dtype.name()),
            })
    }

    fn bytes(dtype: DataType, count: usize) -> u64 {
        (count as u64).saturating_mul(dtype.size() as u64)
    }

    /// Copies `count` elements from `src` to `dst0` (and `dst1` if given).
    ///
    /// # Safety
    /// `src`, `dst0` and `dst1` must be device addresses, accessible from this context, of at
    /// least `count` elements of `dtype` each, alive until the kernel has run; destinations
    /// must not overlap the source or each other except exactly (same address).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn copy(
        &self,
        stream: &CudaStream,
        dtype: DataType,
        src: u64,
        dst0: u64,
        dst1: Option<u64>,
        count: usize,
        traffic: Traffic,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let (i, f) = self.function(EntryKind::Copy, dtype, None)?;
        let plan = self.plan(i, Self::bytes(dtype, count), traffic);
        let (dst1, n) = (dst1.unwrap_or(0), count as u64);
        let mut b = stream.launch_builder(f);
        b.arg(&src).arg(&dst0).arg(&dst1).arg(&n);
        // SAFETY: the argument list matches `ringccl_copy_*(u64, u64, u64, u64)`; the caller
        // guarantees the pointers (see `# Safety`).
        unsafe { b.launch(plan.config()) }
            .map_err(|e| Error::cuda("cuLaunchKernel", self.rank, e))?;
        Ok(())
    }

    /// Folds the `srcs` (2 to 8 buffers) with `op` into `dst`; `postdiv` is the rank count in
    /// the step that writes an `avg` result, else 1.
    ///
    /// # Safety
    /// As for [`Kernels::copy`], for every source and `dst`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        stream: &CudaStream,
        dtype: DataType,
        op: RedOp,
        srcs: &[u64],
        dst: u64,
        count: usize,
        postdiv: u32,
        traffic: Traffic,
    ) -> Result<()> {
        if !(2..=8).contains(&srcs.len()) {
            return Err(Error::Kernel {
                reason: format!("reduce takes 2 to 8 sources, not {}", srcs.len()),
            });
        }
        if count == 0 {
            return Ok(());
        }
        let (i, f) = self.function(EntryKind::Reduce, dtype, Some(op))?;
        let plan = self.plan(i, Self::bytes(dtype, count), traffic);
        let mut s = [0u64; 8];
        s[..srcs.len()].copy_from_slice(srcs);
        let nsrc = srcs.len() as u32;
        let n = count as u64;
        let mut b = stream.launch_builder(f);
        for p in &s {
            b.arg(p);
        }
        b.arg(&nsrc).arg(&dst).arg(&n).arg(&postdiv);
        // SAFETY: the argument list matches `ringccl_reduce_*(u64 × 8, u32, u64, u64, u32)`;
        // the caller guarantees the pointers.
        unsafe { b.launch(plan.config()) }
            .map_err(|e| Error::cuda("cuLaunchKernel", self.rank, e))?;
        Ok(())
    }

    /// Writes `op(a, b)` to `dst0` (and `dst1` if given); `postdiv` as for [`Kernels::reduce`].
    ///
    /// # Safety
    /// As for [`Kernels::copy`], for `a`, `b`, `dst0` and `dst1`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_copy(
        &self,
        stream: &CudaStream,
        dtype: DataType,
        op: RedOp,
        a: u64,
        b: u64,
        dst0: u64,
        dst1: Option<u64>,
        count: usize,
        postdiv: u32,
        traffic: Traffic,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let (i, f) = self.function(EntryKind::ReduceCopy, dtype, Some(op))?;
        let plan = self.plan(i, Self::bytes(dtype, count), traffic);
        let (dst1, n) = (dst1.unwrap_or(0), count as u64);
        let mut lb = stream.launch_builder(f);
        lb.arg(&a)
            .arg(&b)
            .arg(&dst0)
            .arg(&dst1)
            .arg(&n)
            .arg(&postdiv);
        // SAFETY: the argument list matches `ringccl_reduce_copy_*(u64 × 5, u32)`; the caller
        // guarantees the pointers.
        unsafe { lb.launch(plan.config()) }
            .map_err(|e| Error::cuda("cuLaunchKernel", self.rank, e))?;
        Ok(())
    }
}

impl Kernels {
    /// The launch shape of a one-shot all-reduce: one block of [`DEFAULT_THREADS`] threads,
    /// clamped to the function's limit in whole warps (its device barrier needs exactly one
    /// block per rank).
    pub fn oneshot_plan(&self, index: usize) -> LaunchPlan {
        let mut threads = DEFAULT_THREADS.min(self.max_threads(index).max(1));
        if threads >= 32 {
            threads -= threads % 32;
        }
        LaunchPlan { blocks: 1, threads }
    }

    /// Checks, without launching, that the one-shot kernel for `dtype` and `op` exists and can
    /// run `nranks` ranks (so a caller can check every rank before launching any).
    pub fn oneshot_ready(&self, dtype: DataType, op: RedOp, nranks: usize) -> Result<()> {
        let (i, _) = self.function(EntryKind::OneShot, dtype, Some(op))?;
        self.oneshot_launch_plan(i, nranks).map(|_| ())
    }

    fn oneshot_launch_plan(&self, index: usize, nranks: usize) -> Result<LaunchPlan> {
        let plan = self.oneshot_plan(index);
        if (plan.threads as usize) < nranks {
            return Err(Error::Kernel {
                reason: format!(
                    "one-shot kernel allows only {} threads per block",
                    plan.threads
                ),
            });
        }
        Ok(plan)
    }

    /// Enqueues rank `rank`'s kernel of a one-shot all-reduce (see `gpu_kernels::oneshot`):
    /// `dst = op(srcs[0], …, srcs[n-1])` with `n = srcs.len()` ranks, folded in rank order,
    /// synchronised with the other ranks' kernels through the flag arrays `flags` (every rank's,
    /// in rank order; `flags[rank]` is this rank's). `tmp` is `Some` for an in-place call
    /// (`dst == srcs[rank]`): the result is staged there until every peer is done reading.
    /// `postdiv` as for [`Kernels::reduce`].
    ///
    /// Every rank's kernel of the call must be enqueued, with the same `srcs`, `count`, `op`
    /// and `dtype`, or the others spin until they trap (after
    /// `gpu_kernels::oneshot::TIMEOUT_NS`).
    ///
    /// # Safety
    /// As for [`Kernels::reduce`], for every source, `dst` and `tmp` (`count` elements each);
    /// every flag array is `gpu_kernels::oneshot::FLAG_WORDS` `u64` of a live allocation
    /// accessible from this context, used by no one but this communicator's one-shot kernels.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn oneshot(
        &self,
        stream: &CudaStream,
        dtype: DataType,
        op: RedOp,
        srcs: &[u64],
        dst: u64,
        tmp: Option<u64>,
        count: usize,
        postdiv: u32,
        flags: &[u64],
        rank: usize,
    ) -> Result<()> {
        let n = srcs.len();
        if !(2..=8).contains(&n) || flags.len() != n || rank >= n {
            return Err(Error::Kernel {
                reason: format!(
                    "one-shot all-reduce takes 2 to 8 ranks ({n} sources, {} flag arrays, rank {rank})",
                    flags.len()
                ),
            });
        }
        if count == 0 {
            return Ok(());
        }
        let (i, f) = self.function(EntryKind::OneShot, dtype, Some(op))?;
        let plan = self.oneshot_launch_plan(i, n)?;
        let mut s = [0u64; 8];
        s[..n].copy_from_slice(srcs);
        let mut fl = [0u64; 8];
        fl[..n].copy_from_slice(flags);
        let (nsrc, tmp, cnt, my_flags, rank32) = (
            n as u32,
            tmp.unwrap_or(0),
            count as u64,
            flags[rank],
            rank as u32,
        );
        let mut b = stream.launch_builder(f);
        for p in &s {
            b.arg(p);
        }
        b.arg(&nsrc)
            .arg(&dst)
            .arg(&tmp)
            .arg(&cnt)
            .arg(&postdiv)
            .arg(&my_flags);
        for p in &fl {
            b.arg(p);
        }
        b.arg(&rank32);
        // SAFETY: the argument list matches `ringccl_oneshot_*(u64 × 8, u32, u64 × 3, u32,
        // u64 × 9, u32)`; the caller guarantees the pointers.
        unsafe { b.launch(plan.config()) }
            .map_err(|e| Error::cuda("cuLaunchKernel", self.rank, e))?;
        Ok(())
    }
}

/// Copies `bytes` bytes from `src` (memory of `src_ctx`'s device) to `dst` (memory of
/// `dst_ctx`'s device) on `stream`, without peer access (`cuMemcpyPeerAsync`).
///
/// # Safety
/// Both ranges must be valid device memory of their contexts, alive until the copy has run.
pub(crate) unsafe fn memcpy_peer_async(
    stream: &CudaStream,
    dst_ctx: &CudaContext,
    dst: u64,
    src_ctx: &CudaContext,
    src: u64,
    bytes: usize,
    rank: Option<usize>,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", rank, e))?;
    // SAFETY: contexts and stream are live (borrowed); the caller guarantees the ranges.
    unsafe {
        result::memcpy_peer_async(
            dst_ctx.cu_ctx(),
            dst,
            src_ctx.cu_ctx(),
            src,
            bytes,
            stream.cu_stream(),
        )
    }
    .map_err(|e| Error::cuda("cuMemcpyPeerAsync", rank, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_on_this_machine_is_an_error_not_a_panic() {
        // SAFETY: only probes for the library.
        let present = unsafe { sys::is_culib_present() };
        if present {
            // A machine with a driver: ensure_driver must succeed or report a CUDA error.
            assert!(!matches!(ensure_driver(), Err(Error::NoDriver)));
        } else {
            assert_eq!(ensure_driver(), Err(Error::NoDriver));
            assert_eq!(device_count(), Err(Error::NoDriver));
            assert_eq!(can_access_peer(0, 1), Err(Error::NoDriver));
            assert_eq!(p2p_link_scores(&[0, 1]), Err(Error::NoDriver));
        }
    }

    #[test]
    fn link_scores_order_by_performance_rank() {
        for rank in [-3, 0, 1, 7, WORST_SCORED_PERF_RANK, 16, i32::MAX] {
            assert_eq!(link_score(false, rank), 0);
            assert!(link_score(true, rank) >= 1);
        }
        for rank in 0..WORST_SCORED_PERF_RANK {
            assert_eq!(link_score(true, rank), link_score(true, rank + 1) + 1);
        }
        assert_eq!(link_score(true, -3), link_score(true, 0));
        assert_eq!(link_score(true, i32::MIN), link_score(true, 0));
        assert_eq!(link_score(true, i32::MAX), 1);
    }

    #[test]
    fn threads_clamp_to_the_function_limit_in_whole_warps() {
        for (limit, want) in [
            (1024, 512),
            (512, 512),
            (384, 384),
            (400, 384),
            (255, 224),
            (32, 32),
            (20, 20),
            (0, 1),
        ] {
            assert_eq!(
                LaunchPlan::new(1 << 20, limit, 132, Traffic::Local).threads,
                want,
                "limit {limit}"
            );
        }
    }

    #[test]
    fn blocks_follow_size_then_cap() {
        // One block handles 64 B × threads per iteration.
        let per_block = BYTES_PER_THREAD_ITERATION * 512;
        assert_eq!(LaunchPlan::new(1, 1024, 132, Traffic::Local).blocks, 1);
        assert_eq!(LaunchPlan::new(0, 1024, 132, Traffic::Local).blocks, 1);
        assert_eq!(
            LaunchPlan::new(per_block, 1024, 132, Traffic::Local).blocks,
            1
        );
        assert_eq!(
            LaunchPlan::new(per_block + 1, 1024, 132, Traffic::Local).blocks,
            2
        );
        assert_eq!(
            LaunchPlan::new(per_block * 100, 1024, 132, Traffic::Local).blocks,
            100
        );
        assert_eq!(
            LaunchPlan::new(per_block * 100, 1024, 132, Traffic::Peer).blocks,
            64
        );
        assert_eq!(
            LaunchPlan::new(u64::MAX, 1024, 132, Traffic::Local).blocks,
            264
        );
        assert_eq!(
            LaunchPlan::new(u64::MAX, 1024, 108, Traffic::Local).blocks,
            216
        );
        // Fewer threads per block → more blocks for the same bytes.
        assert_eq!(
            LaunchPlan::new(per_block * 10, 256, 132, Traffic::Local).blocks,
            20
        );
        // A tiny GPU caps peer steps at its local cap.
        assert_eq!(LaunchPlan::new(u64::MAX, 1024, 4, Traffic::Peer).blocks, 8);
        assert_eq!(LaunchPlan::new(u64::MAX, 1024, 0, Traffic::Peer).blocks, 1);
    }

    #[test]
    fn every_primitive_type_and_op_has_its_entry_point() {
        let mut seen = vec![false; ENTRY_POINTS.len()];
        for dt in DataType::ALL {
            let i = entry_index(EntryKind::Copy, dt, None).unwrap();
            assert_eq!(ENTRY_POINTS[i].name, format!("ringccl_copy_{}", dt.name()));
            seen[i] = true;
            for op in RedOp::ALL {
                let i = entry_index(EntryKind::Reduce, dt, Some(op)).unwrap();
                assert_eq!(
                    ENTRY_POINTS[i].name,
                    format!("ringccl_reduce_{}_{}", op.name(), dt.name())
                );
                seen[i] = true;
                let i = entry_index(EntryKind::ReduceCopy, dt, Some(op)).unwrap();
                assert_eq!(
                    ENTRY_POINTS[i].name,
                    format!("ringccl_reduce_copy_{}_{}", op.name(), dt.name())
                );
                seen[i] = true;
                let i = entry_index(EntryKind::OneShot, dt, Some(op)).unwrap();
                assert_eq!(
                    ENTRY_POINTS[i].name,
                    format!("ringccl_oneshot_{}_{}", op.name(), dt.name())
                );
                seen[i] = true;
            }
            assert_eq!(entry_index(EntryKind::Copy, dt, Some(RedOp::Sum)), None);
        }
        assert!(seen.iter().all(|&s| s), "every entry point is reachable");
    }

    #[test]
    fn embedded_ptx_defines_every_entry_point() {
        for (arch, target) in [
            (PtxArch::Sm90, ".target sm_90"),
            (PtxArch::Sm80, ".target sm_80"),
        ] {
            let ptx = ptx(arch).expect("embedded PTX inflates");
            assert!(ptx.contains(target), "{target}");
            for e in ENTRY_POINTS {
                assert!(
                    ptx.contains(&format!(".entry {}(", e.name)),
                    "{} missing for {target}",
                    e.name
                );
            }
        }
    }
}
