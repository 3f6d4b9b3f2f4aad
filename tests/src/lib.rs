//! Helpers for ringccl's GPU tests and kernel benches, written directly over `cudarc` (they do not
//! use the `ringccl` communicator): the embedded kernel PTX, a [`Gpu`] that loads it on one device
//! (with ringccl's own loader) and launches entry points with raw arguments, device buffers addressed by offset, and
//! CUDA-event timing.
//!
//! ```no_run
//! use ringccl_tests::{Gpu, KArg};
//! let gpu = Gpu::open(0)?;
//! let k = gpu.kernel("ringccl_copy_f32")?;
//! let buf = gpu.alloc(2 * 4096)?;
//! let args = KArg::copy(buf.ptr(), buf.ptr() + 4096, 0, 1024);
//! // SAFETY: both ranges lie inside `buf`.
//! unsafe { gpu.launch(k, 4, 256, &args)? };
//! gpu.sync()?;
//! # Ok::<(), ringccl_tests::Error>(())
//! ```

pub mod cupti;
pub mod jobs;
pub mod plain;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};
use gpu_kernels::entry::{EntryKind, EntryPoint, ENTRY_POINTS};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

/// A failure of the harness: a CUDA call or a precondition, with a message.
///
/// ```
/// let e = ringccl_tests::Error::msg("no GPU");
/// assert_eq!(e.to_string(), "no GPU");
/// ```
#[derive(Debug)]
pub struct Error(String);

impl Error {
    /// An error with this message.
    pub fn msg(m: impl Into<String>) -> Self {
        Error(m.into())
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// The harness's result type.
pub type Result<T> = std::result::Result<T, Error>;

trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T>;
}

impl<T> Ctx<T> for std::result::Result<T, result::DriverError> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| Error(format!("{what}: {e:?}")))
    }
}

/// Whether the CUDA driver library can be loaded (cudarc panics on first use without it).
///
/// ```
/// // True on a GPU machine, false on a build machine: either way it does not panic.
/// let _ = ringccl_tests::driver_present();
/// ```
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library; no CUDA call is made.
    unsafe { sys::is_culib_present() }
}

/// The embedded PTX for a compute capability: sm_90 code on 9.0 and newer, else sm_80.
///
/// ```
/// use ringccl_tests::ptx_for;
/// assert!(ptx_for((9, 0)).contains(".target sm_90"));
/// assert!(ptx_for((10, 0)).contains(".target sm_90"));
/// assert!(ptx_for((8, 6)).contains(".target sm_80"));
/// ```
pub fn ptx_for(cc: (i32, i32)) -> &'static str {
    use ringccl::internals::driver::module::{ptx, ptx_arch_for, PtxArch};
    // The PTX is embedded by the host crate (deflated); inflating it fails only if the build
    // embedded corrupt data, which its own tests would have caught.
    let arch = ptx_arch_for(cc.0, cc.1).unwrap_or(PtxArch::Sm80);
    ptx(arch).expect("ringccl's embedded PTX inflates")
}

/// One loaded entry point.
#[derive(Debug)]
pub struct Kernel {
    /// Its row in [`ENTRY_POINTS`].
    pub entry: &'static EntryPoint,
    raw: sys::CUfunction,
    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK` (lower than 1024 when it needs many registers).
    pub max_threads: u32,
    /// Registers per thread.
    pub regs: u32,
}

/// A kernel argument, passed by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KArg {
    /// A 64-bit value (device address or count).
    U64(u64),
    /// A 32-bit value (`nsrc`, `postdiv`).
    U32(u32),
}

impl KArg {
    /// Arguments of `ringccl_copy_*`: `src, dst0, dst1 (0 = none), count`.
    ///
    /// ```
    /// assert_eq!(ringccl_tests::KArg::copy(1, 2, 0, 9).len(), 4);
    /// ```
    pub fn copy(src: u64, dst0: u64, dst1: u64, count: u64) -> Vec<KArg> {
        vec![
            KArg::U64(src),
            KArg::U64(dst0),
            KArg::U64(dst1),
            KArg::U64(count),
        ]
    }

    /// Arguments of `ringccl_reduce_*`: up to 8 sources (the rest 0), `nsrc`, `dst`, `count`,
    /// `postdiv`. `None` when there are fewer than 1 or more than 8 sources.
    ///
    /// ```
    /// use ringccl_tests::KArg;
    /// assert_eq!(KArg::reduce(&[1, 2, 3], 4, 9, 1).unwrap().len(), 12);
    /// assert!(KArg::reduce(&[0; 9], 4, 9, 1).is_none());
    /// ```
    pub fn reduce(srcs: &[u64], dst: u64, count: u64, postdiv: u32) -> Option<Vec<KArg>> {
        if srcs.is_empty() || srcs.len() > 8 {
            return None;
        }
        let mut v: Vec<KArg> = (0..8)
            .map(|i| KArg::U64(srcs.get(i).copied().unwrap_or(0)))
            .collect();
        v.extend([
            KArg::U32(srcs.len() as u32),
            KArg::U64(dst),
            KArg::U64(count),
            KArg::U32(postdiv),
        ]);
        Some(v)
    }

    /// Arguments of `ringccl_reduce_copy_*`: `a, b, dst0, dst1 (0 = none), count, postdiv`.
    ///
    /// ```
    /// assert_eq!(ringccl_tests::KArg::reduce_copy(1, 2, 3, 0, 9, 1).len(), 6);
    /// ```
    pub fn reduce_copy(
        a: u64,
        b: u64,
        dst0: u64,
        dst1: u64,
        count: u64,
        postdiv: u32,
    ) -> Vec<KArg> {
        vec![
            KArg::U64(a),
            KArg::U64(b),
            KArg::U64(dst0),
            KArg::U64(dst1),
            KArg::U64(count),
            KArg::U32(postdiv),
        ]
    }

    fn is_u64(self) -> bool {
        matches!(self, KArg::U64(_))
    }
}

/// Whether `args` has the shape of `kind`'s parameter list.
fn args_match(kind: EntryKind, args: &[KArg]) -> bool {
    let u64s = |r: &[KArg]| r.iter().all(|a| a.is_u64());
    match kind {
        EntryKind::Copy => args.len() == 4 && u64s(args),
        EntryKind::Reduce => {
            args.len() == 12
                && u64s(&args[..8])
                && !args[8].is_u64()
                && u64s(&args[9..11])
                && !args[11].is_u64()
        }
        EntryKind::ReduceCopy => args.len() == 6 && u64s(&args[..5]) && !args[5].is_u64(),
        EntryKind::Scale => args.len() == 5 && u64s(args),
        EntryKind::OneShot => {
            args.len() == 26
                && u64s(&args[..8])
                && !args[8].is_u64()
                && u64s(&args[9..12])
                && !args[12].is_u64()
                && u64s(&args[13..22])
                && !args[22].is_u64()
                && u64s(&args[23..])
        }
        EntryKind::Ll => {
            args.len() == 16
                && u64s(&args[..3])
                && !args[3].is_u64()
                && u64s(&args[4..12])
                && !args[12].is_u64()
                && !args[13].is_u64()
                && u64s(&args[14..])
        }
        EntryKind::TwoShot | EntryKind::TwoShotColl => {
            args.len() == 35
                && u64s(&args[..8])
                && !args[8].is_u64()
                && u64s(&args[9..18])
                && !args[18].is_u64()
                && u64s(&args[19..28])
                && !args[28].is_u64()
                && u64s(&args[29..33])
                && !args[33].is_u64()
                && !args[34].is_u64()
        }
    }
}

/// Device memory addressed by byte offset (freed on drop).
#[derive(Debug)]
pub struct DeviceBuffer {
    _mem: CudaSlice<u8>,
    ptr: u64,
    len: usize,
}

impl DeviceBuffer {
    /// The device address of byte 0 (256-byte aligned).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    fn check(&self, offset: usize, len: usize) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.ptr + offset as u64),
            _ => Err(Error(format!(
                "range {offset}+{len} outside a buffer of {} bytes",
                self.len
            ))),
        }
    }
}

/// Device 0..n with the kernels loaded: a context, a stream, the module and every entry point.
#[derive(Debug)]
pub struct Gpu {
    /// The device's (primary) context.
    pub ctx: Arc<CudaContext>,
    /// The stream every operation of this `Gpu` runs on.
    pub stream: Arc<CudaStream>,
    /// Compute capability.
    pub cc: (i32, i32),
    /// Number of streaming multiprocessors.
    pub sms: u32,
    /// Device name.
    pub name: String,
    /// ringccl's own module loader (the functions below are its).
    _module: ringccl::internals::driver::Kernels,
    kernels: HashMap<&'static str, Kernel>,
}

// SAFETY: the module and function handles are plain driver handles, usable from any thread once
// the context is bound (every method binds it).
unsafe impl Send for Gpu {}
// SAFETY: as above; no method mutates shared state.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Opens device `ordinal`: checks the driver is present, loads the PTX for the device's
    /// compute capability and looks up every entry point.
    pub fn open(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(Error::msg(
                "the CUDA driver library (libcuda) is not present: these tests need a CUDA GPU",
            ));
        }
        let n = CudaContext::device_count().ctx("cuDeviceGetCount")?;
        if ordinal >= n.max(0) as usize {
            return Err(Error(format!("device {ordinal} requested, {n} visible")));
        }
        let ctx = CudaContext::new(ordinal).ctx("cuDevicePrimaryCtxRetain")?;
        let stream = ctx.new_stream().ctx("cuStreamCreate")?;
        let cc = ctx.compute_capability().ctx("compute capability")?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ctx("multiprocessor count")? as u32;
        let name = ctx.name().ctx("cuDeviceGetName")?;
        let module = ringccl::internals::driver::Kernels::load(&ctx, None)
            .map_err(|e| Error(format!("loading ringccl's kernels: {e}")))?;
        let mut kernels = HashMap::new();
        for (entry, f) in ENTRY_POINTS.iter().zip(module.functions()) {
            // The module stays loaded while `gpu` (which holds it) lives.
            let raw = f.cu_function();
            use sys::CUfunction_attribute::*;
            // SAFETY: `raw` is a function of the loaded module.
            let attr = |a| unsafe { result::function::get_function_attribute(raw, a) };
            let max_threads =
                attr(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK).ctx("max threads per block")? as u32;
            let regs = attr(CU_FUNC_ATTRIBUTE_NUM_REGS).ctx("registers")? as u32;
            kernels.insert(
                entry.name,
                Kernel {
                    entry,
                    raw,
                    max_threads,
                    regs,
                },
            );
        }
        Ok(Gpu {
            ctx,
            stream,
            cc,
            sms,
            name,
            _module: module,
            kernels,
        })
    }

    /// ringccl's own loaded kernels (for tests of its launchers).
    pub fn ringccl_kernels(&self) -> &ringccl::internals::driver::Kernels {
        &self._module
    }

    /// The loaded entry point called `name`.
    pub fn kernel(&self, name: &str) -> Result<&Kernel> {
        self.kernels
            .get(name)
            .ok_or_else(|| Error(format!("no entry point {name}")))
    }

    /// A one-line summary of the loaded kernels: register and block-size ranges.
    pub fn kernels_summary(&self) -> String {
        let regs = self.kernels.values().map(|k| k.regs);
        let threads = self.kernels.values().map(|k| k.max_threads);
        format!(
            "{} kernels, {}..{} registers, max threads per block {}..{}",
            self.kernels.len(),
            regs.clone().min().unwrap_or(0),
            regs.max().unwrap_or(0),
            threads.clone().min().unwrap_or(0),
            threads.max().unwrap_or(0)
        )
    }

    /// Launches `k` on this `Gpu`'s stream with `blocks` × `threads` (clamped to the kernel's
    /// maximum block size), after checking that `args` has the entry point's shape. Returns the
    /// block size used.
    ///
    /// # Safety
    /// The addresses in `args` must be valid device memory of this context for the counts given,
    /// as the entry point's contract (`gpu_kernels::entry`) requires.
    pub unsafe fn launch(
        &self,
        k: &Kernel,
        blocks: u32,
        threads: u32,
        args: &[KArg],
    ) -> Result<u32> {
        if !args_match(k.entry.kind, args) {
            return Err(Error(format!(
                "arguments {args:?} do not fit {}",
                k.entry.name
            )));
        }
        let threads = threads.clamp(1, k.max_threads.max(1));
        let mut params: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                KArg::U64(v) => v as *const u64 as *mut c_void,
                KArg::U32(v) => v as *const u32 as *mut c_void,
            })
            .collect();
        self.ctx.bind_to_thread().ctx("bind context")?;
        // SAFETY: `params` points at `args`, alive for the call (the driver copies the values);
        // its shape matches the kernel's parameters (checked above); pointer validity is the
        // caller's contract.
        unsafe {
            result::launch_kernel(
                k.raw,
                (blocks.max(1), 1, 1),
                (threads, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .ctx(&format!("cuLaunchKernel({})", k.entry.name))?;
        Ok(threads)
    }

    /// Allocates `bytes` of device memory (contents unspecified).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        // SAFETY: u8 has no invalid bit patterns; the contents are written before they are read.
        let mem = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }.ctx("allocation")?;
        let ptr = {
            let (p, _sync) = mem.device_ptr(&self.stream);
            p
        };
        Ok(DeviceBuffer {
            _mem: mem,
            ptr,
            len: bytes,
        })
    }

    /// Copies `data` to `buf` at byte `offset` and waits for it.
    pub fn upload(&self, buf: &DeviceBuffer, offset: usize, data: &[u8]) -> Result<()> {
        let dst = buf.check(offset, data.len())?;
        self.ctx.bind_to_thread().ctx("bind context")?;
        // SAFETY: the range is inside `buf` (checked); `data` outlives the copy (synchronised).
        unsafe { result::memcpy_htod_async(dst, data, self.stream.cu_stream()) }
            .ctx("cuMemcpyHtoD")?;
        self.sync()
    }

    /// Copies `out.len()` bytes of `buf` from byte `offset` into `out`, after all queued work.
    pub fn download(&self, buf: &DeviceBuffer, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = buf.check(offset, out.len())?;
        self.ctx.bind_to_thread().ctx("bind context")?;
        // SAFETY: the range is inside `buf` (checked); `out` outlives the copy (synchronised).
        unsafe { result::memcpy_dtoh_async(out, src, self.stream.cu_stream()) }
            .ctx("cuMemcpyDtoH")?;
        self.sync()
    }

    /// Queues filling `len` bytes of `buf` from `offset` with `byte`.
    pub fn fill(&self, buf: &DeviceBuffer, offset: usize, len: usize, byte: u8) -> Result<()> {
        let dst = buf.check(offset, len)?;
        self.ctx.bind_to_thread().ctx("bind context")?;
        // SAFETY: the range is inside `buf` (checked).
        unsafe { result::memset_d8_async(dst, byte, len, self.stream.cu_stream()) }
            .ctx("cuMemsetD8")
    }

    /// Queues the driver's device-to-device copy of `len` bytes (`cuMemcpyDtoDAsync`).
    pub fn copy_d2d(&self, src: &DeviceBuffer, dst: &DeviceBuffer, len: usize) -> Result<()> {
        let s = src.check(0, len)?;
        let d = dst.check(0, len)?;
        self.ctx.bind_to_thread().ctx("bind context")?;
        // SAFETY: both ranges are inside their buffers (checked).
        unsafe { result::memcpy_dtod_async(d, s, len, self.stream.cu_stream()) }.ctx("cuMemcpyDtoD")
    }

    /// Waits for everything queued on the stream; reports a kernel fault as an error.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().ctx("cuStreamSynchronize")
    }

    /// Runs `work` between two timing events on the stream and returns the GPU time between them.
    pub fn time(&self, work: impl FnOnce() -> Result<()>) -> Result<Duration> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start: CudaEvent = self.ctx.new_event(flags).ctx("cuEventCreate")?;
        let end: CudaEvent = self.ctx.new_event(flags).ctx("cuEventCreate")?;
        start.record(&self.stream).ctx("cuEventRecord")?;
        work()?;
        end.record(&self.stream).ctx("cuEventRecord")?;
        let ms = start.elapsed_ms(&end).ctx("cuEventElapsedTime")?;
        Ok(Duration::from_secs_f64(f64::from(ms) / 1e3))
    }
}

/// A graph capturing every rank's stream in one capture: begins on `streams[0]` (relaxed
/// mode), forks the others from it with an event, runs `body`, joins them back and ends the
/// capture, whatever `body` returned (so that no stream is left capturing).
///
/// ```no_run
/// use cudarc::driver::CudaContext;
/// let ctxs = vec![CudaContext::new(0).unwrap(), CudaContext::new(1).unwrap()];
/// let streams: Vec<_> = ctxs.iter().map(|c| c.new_stream().unwrap()).collect();
/// let graph = ringccl_tests::capture_one_graph(&ctxs, &streams, || Ok(()))?;
/// graph.launch().map_err(|e| format!("{e:?}"))?;
/// # Ok::<(), String>(())
/// ```
pub fn capture_one_graph(
    ctxs: &[Arc<CudaContext>],
    streams: &[Arc<CudaStream>],
    body: impl FnOnce() -> std::result::Result<(), String>,
) -> std::result::Result<cudarc::driver::CudaGraph, String> {
    let e = |what: &str, x: cudarc::driver::DriverError| format!("{what}: {x:?}");
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    let s0 = &streams[0];
    s0.begin_capture(mode).map_err(|x| e("begin capture", x))?;
    let fork = ctxs[0].new_event(None).map_err(|x| e("event", x))?;
    let mut joins = Vec::new();
    let body = (|| -> std::result::Result<(), String> {
        fork.record(s0).map_err(|x| e("record", x))?;
        for s in &streams[1..] {
            s.wait(&fork).map_err(|x| e("join the capture", x))?;
        }
        body()?;
        for (c, s) in ctxs.iter().zip(streams).skip(1) {
            let ev = c.new_event(None).map_err(|x| e("event", x))?;
            ev.record(s).map_err(|x| e("record", x))?;
            s0.wait(&ev).map_err(|x| e("join back", x))?;
            joins.push(ev);
        }
        Ok(())
    })();
    // End the capture whatever happened inside it.
    let graph = s0.end_capture(sys::CUgraphInstantiate_flags(0));
    body?;
    graph
        .map_err(|x| e("end capture", x))?
        .ok_or_else(|| "the capture made no graph".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_shapes_match_the_abi() {
        assert!(args_match(EntryKind::Copy, &KArg::copy(1, 2, 0, 3)));
        assert!(args_match(
            EntryKind::Reduce,
            &KArg::reduce(&[1, 2], 3, 4, 1).unwrap()
        ));
        assert!(args_match(
            EntryKind::ReduceCopy,
            &KArg::reduce_copy(1, 2, 3, 0, 4, 1)
        ));
        assert!(!args_match(
            EntryKind::Copy,
            &KArg::reduce_copy(1, 2, 3, 0, 4, 1)
        ));
        assert!(!args_match(EntryKind::ReduceCopy, &KArg::copy(1, 2, 0, 3)));
        let mut r = KArg::reduce(&[1, 2, 3], 9, 4, 2).unwrap();
        assert_eq!(r[2], KArg::U64(3));
        assert_eq!(r[3], KArg::U64(0));
        assert_eq!(r[8], KArg::U32(3));
        r[8] = KArg::U64(3);
        assert!(!args_match(EntryKind::Reduce, &r));
    }
}
