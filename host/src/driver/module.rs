//! ringccl's kernels as the driver sees them: the embedded PTX and cubins (from
//! [`gpu_kernels::artifacts`]), the module loaded into one context, and its functions looked up
//! by (primitive, type, operator) in O(1).
//!
//! A device gets machine code when there is a cubin for it ([`code_for`]): the sm_90 cubin on
//! compute capability 9.0, the sm_80 cubin on 8.x (sm_80 machine code runs on 8.6, 8.7 and
//! 8.9). Any other device from 8.0 up gets PTX, which the driver JIT-compiles (about a minute
//! without a JIT cache); that fallback is reported once per process, and so is a cubin the
//! driver refuses (ringccl then JIT-compiles the PTX of the same architecture).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use gpu_kernels::artifacts::{self, Build};
use gpu_kernels::entry::entry_index;
use gpu_kernels::{EntryKind, ENTRY_POINTS};

use crate::{DataType, Error, RedOp, Result};

/// Which embedded build: its PTX and the cubin `ptxas` made of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxArch {
    /// `.target sm_90` PTX (devices of compute capability 9.0 and newer) and its sm_90 cubin
    /// (9.0 only).
    Sm90,
    /// `.target sm_80` PTX (8.0 and newer) and its sm_80 cubin (8.x).
    Sm80,
}

impl PtxArch {
    /// The architecture's name, `"sm_90"` or `"sm_80"`.
    ///
    /// ```
    /// use ringccl::internals::driver::module::PtxArch;
    /// assert_eq!(PtxArch::Sm80.sm(), "sm_80");
    /// ```
    pub fn sm(self) -> &'static str {
        self.build().sm
    }

    fn build(self) -> &'static Build {
        match self {
            PtxArch::Sm90 => &artifacts::SM90,
            PtxArch::Sm80 => &artifacts::SM80,
        }
    }
}

/// What [`Kernels::load`] gives the driver for a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelCode {
    /// Machine code for the device: loads in milliseconds.
    Cubin(PtxArch),
    /// PTX, JIT-compiled by the driver (about a minute without a JIT cache).
    Ptx(PtxArch),
}

/// Decompresses one embedded artifact (a zstd frame with a content checksum).
fn unpack(packed: &[u8], what: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let corrupt = |e: &dyn std::fmt::Display| format!("the embedded {what} is corrupt: {e}");
    let mut input = packed;
    let mut decoder =
        ruzstd::decoding::StreamingDecoder::new(&mut input).map_err(|e| corrupt(&e))?;
    let mut out = Vec::new();
    decoder.read_to_end(&mut out).map_err(|e| corrupt(&e))?;
    let frame = decoder.into_frame_decoder();
    match (frame.get_checksum_from_data(), frame.get_calculated_checksum()) {
        (Some(want), Some(got)) if want == got => Ok(out),
        (want, got) => Err(corrupt(&format_args!(
            "content checksum {want:x?}, computed {got:x?}"
        ))),
    }
}

/// The embedded PTX text for `arch` (decompressed once, on first use; about 10 MB each).
///
/// ```
/// use ringccl::internals::driver::module::{ptx, PtxArch};
/// assert!(ptx(PtxArch::Sm90).unwrap().contains(".target sm_90"));
/// assert!(ptx(PtxArch::Sm80).unwrap().contains(".target sm_80"));
/// ```
pub fn ptx(arch: PtxArch) -> Result<&'static str> {
    static SM90: OnceLock<Result<String, String>> = OnceLock::new();
    static SM80: OnceLock<Result<String, String>> = OnceLock::new();
    let cell = match arch {
        PtxArch::Sm90 => &SM90,
        PtxArch::Sm80 => &SM80,
    };
    cell.get_or_init(|| {
        let build = arch.build();
        let bytes = unpack(build.ptx_zst, build.ptx_file)?;
        String::from_utf8(bytes).map_err(|_| format!("the embedded {} is not UTF-8", build.ptx_file))
    })
    .as_deref()
    .map_err(|reason| Error::Kernel {
        reason: reason.clone(),
    })
}

/// The embedded cubin (an ELF file of machine code) for `arch`, decompressed once, on
/// first use (about 6 MB each).
///
/// ```
/// use ringccl::internals::driver::module::{cubin, PtxArch};
/// assert!(cubin(PtxArch::Sm90).unwrap().starts_with(b"\x7fELF"));
/// ```
pub fn cubin(arch: PtxArch) -> Result<&'static [u8]> {
    static SM90: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    static SM80: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    let cell = match arch {
        PtxArch::Sm90 => &SM90,
        PtxArch::Sm80 => &SM80,
    };
    cell.get_or_init(|| {
        let build = arch.build();
        let bytes = unpack(build.cubin_zst, build.cubin_file)?;
        if bytes.starts_with(b"\x7fELF") {
            Ok(bytes)
        } else {
            Err(format!("the embedded {} is not an ELF file", build.cubin_file))
        }
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
/// use ringccl::internals::driver::module::{ptx_arch_for, PtxArch};
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

/// The embedded cubin that runs on a device of compute capability `major.minor`: sm_90 machine
/// code on 9.0 only, sm_80 machine code on every 8.x; `None` otherwise (newer devices run the
/// PTX, older ones nothing).
///
/// ```
/// use ringccl::internals::driver::module::{cubin_arch_for, PtxArch};
/// assert_eq!(cubin_arch_for(9, 0), Some(PtxArch::Sm90));
/// assert_eq!(cubin_arch_for(8, 9), Some(PtxArch::Sm80));
/// assert_eq!(cubin_arch_for(10, 0), None);
/// ```
pub fn cubin_arch_for(major: i32, minor: i32) -> Option<PtxArch> {
    match (major, minor) {
        (9, 0) => Some(PtxArch::Sm90),
        (8, _) => Some(PtxArch::Sm80),
        _ => None,
    }
}

/// What [`Kernels::load`] loads on a device of compute capability `major.minor`: its cubin if
/// there is one, else the PTX the driver can JIT-compile for it, `None` below 8.0.
///
/// ```
/// use ringccl::internals::driver::module::{code_for, KernelCode, PtxArch};
/// assert_eq!(code_for(9, 0), Some(KernelCode::Cubin(PtxArch::Sm90)));
/// assert_eq!(code_for(8, 6), Some(KernelCode::Cubin(PtxArch::Sm80)));
/// assert_eq!(code_for(12, 0), Some(KernelCode::Ptx(PtxArch::Sm90)));
/// assert_eq!(code_for(7, 5), None);
/// ```
pub fn code_for(major: i32, minor: i32) -> Option<KernelCode> {
    cubin_arch_for(major, minor)
        .map(KernelCode::Cubin)
        .or_else(|| ptx_arch_for(major, minor).map(KernelCode::Ptx))
}

/// Reports a fallback to PTX at most once per process for each `flag`.
fn warn_once(flag: &AtomicBool, args: std::fmt::Arguments<'_>) {
    if !flag.swap(true, Ordering::Relaxed) {
        crate::debug::warn(args);
    }
}

/// Loads `code` into `ctx` (`cuModuleLoadData`); `Err` is the reason, for [`Error::Kernel`].
fn load_code(ctx: &Arc<CudaContext>, code: KernelCode) -> Result<Arc<CudaModule>, String> {
    let reason = |e: Error| match e {
        Error::Kernel { reason } => reason,
        other => other.to_string(),
    };
    let (image, what) = match code {
        KernelCode::Cubin(arch) => (
            Ptx::from_binary(cubin(arch).map_err(reason)?.to_vec()),
            arch.build().cubin_file,
        ),
        KernelCode::Ptx(arch) => (
            Ptx::from_src(ptx(arch).map_err(reason)?),
            arch.build().ptx_file,
        ),
    };
    ctx.load_module(image)
        .map_err(|e| format!("the driver could not load {what} (cuModuleLoadData: {:?})", e.0))
}

/// ringccl's kernels loaded into one context: the module's functions (indexed like
/// [`ENTRY_POINTS`]) with their thread limits, and the device's SM count. The launchers are in
/// [`super::launch`].
#[derive(Debug)]
pub struct Kernels {
    /// The rank these kernels serve (labels errors).
    pub(crate) rank: Option<usize>,
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    code: KernelCode,
    functions: Vec<CudaFunction>,
    max_threads: Vec<u32>,
    sm_count: u32,
    /// The bounded wait (`gpu_kernels::oneshot::WAIT_ENTRY`).
    pub(crate) wait: CudaFunction,
    /// The point-to-point kernel (`gpu_kernels::p2p::P2P_ENTRY`) and its thread limit; `None`
    /// if the loaded code lacks it (point-to-point groups then take the scratch path).
    pub(crate) p2p: Option<(CudaFunction, u32)>,
    /// The same kernel with the small parameter (`gpu_kernels::p2p::P2P_SMALL_ENTRY`), used
    /// for the groups that fit it; `None` if the loaded code lacks it.
    pub(crate) p2p_small: Option<(CudaFunction, u32)>,
    /// The LL all-gather (`gpu_kernels::ll::LL_GATHER_ENTRY`) and its thread limit; `None` if
    /// the loaded code lacks it (all-gathers then take the two-shot kernel).
    pub(crate) ll_gather: Option<(CudaFunction, u32)>,
}

impl Kernels {
    /// Loads the embedded kernels matching the device of `ctx` ([`code_for`]: its cubin, else
    /// PTX the driver JIT-compiles, reported once per process) and looks up every entry point.
    /// `rank` only labels errors.
    ///
    /// ```no_run
    /// use cudarc::driver::CudaContext;
    /// ringccl::internals::driver::ensure_driver()?;
    /// let ctx = CudaContext::new(0).unwrap();
    /// let k = ringccl::internals::driver::Kernels::load(&ctx, Some(0))?;
    /// assert!(k.sm_count() > 0);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn load(ctx: &Arc<CudaContext>, rank: Option<usize>) -> Result<Self> {
        let cc = ctx
            .compute_capability()
            .map_err(|e| Error::cuda("cuDeviceGetAttribute", rank, e))?;
        let code = code_for(cc.0, cc.1).ok_or_else(|| Error::Kernel {
            reason: format!(
                "the device has compute capability {}.{}; ringccl's kernels need 8.0 or newer",
                cc.0, cc.1
            ),
        })?;
        let sm = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::cuda("cuDeviceGetAttribute", rank, e))?;
        let (module, loaded) = match code {
            KernelCode::Cubin(arch) => match load_code(ctx, code) {
                Ok(module) => Ok((module, code)),
                Err(reason) => {
                    static WARNED: AtomicBool = AtomicBool::new(false);
                    warn_once(
                        &WARNED,
                        format_args!(
                            "{reason} on a device of compute capability {}.{}; JIT-compiling \
                             the {} PTX instead (slow the first time)",
                            cc.0,
                            cc.1,
                            arch.sm()
                        ),
                    );
                    let fallback = KernelCode::Ptx(arch);
                    load_code(ctx, fallback).map(|m| (m, fallback))
                }
            },
            KernelCode::Ptx(arch) => {
                static WARNED: AtomicBool = AtomicBool::new(false);
                warn_once(
                    &WARNED,
                    format_args!(
                        "no machine code for compute capability {}.{} (ringccl ships sm_90 and \
                         sm_80 cubins): the driver JIT-compiles the {} PTX, which takes about a \
                         minute unless its JIT cache has it",
                        cc.0,
                        cc.1,
                        arch.sm()
                    ),
                );
                load_code(ctx, code).map(|m| (m, code))
            }
        }
        .map_err(|reason| Error::Kernel {
            reason: format!(
                "{reason} on a device of compute capability {}.{}",
                cc.0, cc.1
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
        let wait_name = gpu_kernels::oneshot::WAIT_ENTRY;
        let wait = module
            .load_function(wait_name)
            .map_err(|e| Error::Kernel {
                reason: format!("entry point {wait_name} not found ({:?})", e.0),
            })?;
        let optional = |name: &str| -> Result<Option<(CudaFunction, u32)>> {
            match module.load_function(name) {
                Ok(f) => {
                    let limit = f
                        .max_threads_per_block()
                        .map_err(|e| Error::cuda("cuFuncGetAttribute", rank, e))?;
                    Ok(Some((f, u32::try_from(limit).unwrap_or(1).max(1))))
                }
                Err(_) => Ok(None),
            }
        };
        let p2p = optional(gpu_kernels::p2p::P2P_ENTRY)?;
        let p2p_small = optional(gpu_kernels::p2p::P2P_SMALL_ENTRY)?;
        let ll_gather = optional(gpu_kernels::ll::LL_GATHER_ENTRY)?;
        Ok(Kernels {
            rank,
            p2p,
            p2p_small,
            ll_gather,
            code: loaded,
            functions,
            max_threads,
            sm_count: u32::try_from(sm).unwrap_or(1).max(1),
            wait,
        })
    }

    /// Every function, indexed like [`ENTRY_POINTS`] (for ringccl's kernel tests).
    #[cfg(feature = "internals")]
    pub fn functions(&self) -> &[CudaFunction] {
        &self.functions
    }

    /// What was loaded: the device's cubin, or PTX the driver JIT-compiled.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn code(&self) -> KernelCode {
        self.code
    }

    /// The device's number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Blocks of the two-shot kernels that one SM holds at once: the fewest of any two-shot
    /// entry point at its launch width (`cuOccupancyMaxActiveBlocksPerMultiprocessor`), at
    /// least 1. Sizes the two-shot grid ([`crate::transport::room::twoshot_grid_cap`]).
    ///
    /// Errors: [`Error::Cuda`] if `ctx` (the context these kernels were loaded into) cannot be
    /// made current or the driver cannot answer.
    pub fn twoshot_blocks_per_sm(&self, ctx: &CudaContext) -> Result<u32> {
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", self.rank, e))?;
        let mut fewest = u32::MAX;
        for ((entry, f), &limit) in ENTRY_POINTS.iter().zip(&self.functions).zip(&self.max_threads) {
            if !matches!(entry.kind, EntryKind::TwoShot | EntryKind::TwoShotColl) {
                continue;
            }
            let threads = super::launch::LaunchPlan::one_block(limit).threads;
            let n = f
                .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
                .map_err(|e| Error::cuda("cuOccupancyMaxActiveBlocksPerMultiprocessor", self.rank, e))?;
            fewest = fewest.min(n);
        }
        Ok(if fewest == u32::MAX { 1 } else { fewest.max(1) })
    }

    /// The function for (`kind`, `dtype`, `op`), its index in [`ENTRY_POINTS`] and its
    /// threads-per-block limit: an O(1) lookup.
    pub(crate) fn function(
        &self,
        kind: EntryKind,
        dtype: DataType,
        op: Option<RedOp>,
    ) -> Result<(&CudaFunction, u32)> {
        entry_index(kind, dtype, op)
            .and_then(|i| Some((self.functions.get(i)?, *self.max_threads.get(i)?)))
            .ok_or_else(|| Error::Kernel {
                reason: format!("no {kind:?} kernel for {} {op:?}", dtype.name()),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_primitive_type_and_op_has_its_entry_point() {
        let mut seen = vec![false; ENTRY_POINTS.len()];
        for dt in DataType::ALL {
            let i = entry_index(EntryKind::Copy, dt, None).unwrap();
            assert_eq!(ENTRY_POINTS[i].name, format!("ringccl_copy_{}", dt.name()));
            seen[i] = true;
            for op in RedOp::ALL {
                for (kind, prefix) in [
                    (EntryKind::Reduce, "reduce"),
                    (EntryKind::ReduceCopy, "reduce_copy"),
                    (EntryKind::OneShot, "oneshot"),
                    (EntryKind::TwoShot, "twoshot"),
                    (EntryKind::TwoShotColl, "twoshot_coll"),
                    (EntryKind::Ll, "ll"),
                ] {
                    let i = entry_index(kind, dt, Some(op)).unwrap();
                    assert_eq!(
                        ENTRY_POINTS[i].name,
                        format!("ringccl_{prefix}_{}_{}", op.name(), dt.name())
                    );
                    seen[i] = true;
                }
            }
            assert_eq!(entry_index(EntryKind::Copy, dt, Some(RedOp::Sum)), None);
            let i = entry_index(EntryKind::Scale, dt, None).unwrap();
            assert_eq!(ENTRY_POINTS[i].name, format!("ringccl_scale_{}", dt.name()));
            seen[i] = true;
        }
        assert!(seen.iter().all(|&s| s), "every entry point is reachable");
    }

    #[test]
    fn embedded_ptx_defines_every_entry_point() {
        for (arch, target) in [
            (PtxArch::Sm90, ".target sm_90"),
            (PtxArch::Sm80, ".target sm_80"),
        ] {
            let ptx = ptx(arch).expect("embedded PTX decompresses");
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

    /// The fields of an ELF64 little-endian file this test looks at.
    struct Elf<'a> {
        bytes: &'a [u8],
    }

    impl<'a> Elf<'a> {
        fn u16(&self, at: usize) -> usize {
            u16::from_le_bytes(self.bytes[at..at + 2].try_into().unwrap()) as usize
        }
        fn u32(&self, at: usize) -> u32 {
            u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap())
        }
        fn u64(&self, at: usize) -> usize {
            u64::from_le_bytes(self.bytes[at..at + 8].try_into().unwrap()) as usize
        }
        /// (type, link, offset, size, entry size) of section `i`.
        fn section(&self, i: usize) -> (u32, usize, usize, usize, usize) {
            let at = self.u64(0x28) + i * self.u16(0x3a);
            (
                self.u32(at + 4),
                self.u32(at + 0x28) as usize,
                self.u64(at + 0x18),
                self.u64(at + 0x20),
                self.u64(at + 0x38),
            )
        }
        /// The names of the symbols of type STT_FUNC in `.symtab`.
        fn function_symbols(&self) -> Vec<&'a str> {
            const SHT_SYMTAB: u32 = 2;
            const STT_FUNC: u8 = 2;
            let mut names = Vec::new();
            for i in 0..self.u16(0x3c) {
                let (kind, link, off, size, entsize) = self.section(i);
                if kind != SHT_SYMTAB {
                    continue;
                }
                let (_, _, str_off, str_size, _) = self.section(link);
                let strtab = &self.bytes[str_off..str_off + str_size];
                for sym in self.bytes[off..off + size].chunks_exact(entsize) {
                    if sym[4] & 0xf != STT_FUNC {
                        continue;
                    }
                    let name = u32::from_le_bytes(sym[0..4].try_into().unwrap()) as usize;
                    let end = strtab[name..].iter().position(|&b| b == 0).unwrap();
                    names.push(std::str::from_utf8(&strtab[name..name + end]).unwrap());
                }
            }
            names
        }
    }

    #[test]
    fn embedded_cubins_are_cuda_elf_files_for_their_arch_with_every_entry_point() {
        for (arch, sm) in [(PtxArch::Sm90, 90), (PtxArch::Sm80, 80)] {
            let bytes = cubin(arch).expect("embedded cubin decompresses");
            let elf = Elf { bytes };
            assert_eq!(&bytes[..4], b"\x7fELF");
            assert_eq!(bytes[4], 2, "ELFCLASS64");
            assert_eq!(bytes[5], 1, "little endian");
            assert_eq!(elf.u16(0x12), 190, "e_machine = EM_CUDA");
            assert_eq!(elf.u16(0x10), 2, "e_type = ET_EXEC");
            // ELF ABI version 8 (CUDA 12.8 and later) keeps the SM version in e_flags' byte 1.
            assert_eq!(bytes[8], 8, "CUDA ELF ABI version");
            assert_eq!((elf.u32(0x30) >> 8) & 0xff, sm, "e_flags: sm_{sm}");
            let functions = elf.function_symbols();
            for e in ENTRY_POINTS {
                assert!(
                    functions.contains(&e.name),
                    "{} is not a function of the sm_{sm} cubin",
                    e.name
                );
            }
        }
    }

    #[test]
    fn each_cubin_was_assembled_from_the_embedded_ptx() {
        for arch in [PtxArch::Sm90, PtxArch::Sm80] {
            let b = arch.build();
            let (source, hash) = artifacts::cubin_source(artifacts::CUBINS, b.cubin_file)
                .expect("cubins.txt names every cubin");
            assert_eq!(source, b.ptx_file);
            assert_eq!(
                hash,
                artifacts::fnv1a64(ptx(arch).unwrap().as_bytes()),
                "{} was not built from the committed {}: run `cargo xtask build-ptx` where \
                 ptxas is found, and commit",
                b.cubin_file,
                b.ptx_file
            );
        }
    }

    #[test]
    fn corrupt_artifacts_are_errors_not_panics() {
        assert!(unpack(b"not zstd at all", "x").is_err());
        let good = artifacts::SM80.cubin_zst;
        assert!(unpack(&good[..good.len() / 2], "x").is_err(), "truncated");
        for at in [good.len() / 3, good.len() / 2, good.len() - 6] {
            let mut bad = good.to_vec();
            bad[at] ^= 0x5a;
            let err = unpack(&bad, "ringccl_sm80.cubin").expect_err("corrupt");
            assert!(err.contains("the embedded ringccl_sm80.cubin is corrupt"), "{err}");
        }
    }

    #[test]
    fn the_code_for_each_compute_capability() {
        use KernelCode::{Cubin, Ptx};
        use PtxArch::{Sm80, Sm90};
        let cases = [
            ((9, 0), Some(Cubin(Sm90))),
            ((8, 0), Some(Cubin(Sm80))),
            ((8, 6), Some(Cubin(Sm80))),
            ((8, 9), Some(Cubin(Sm80))),
            ((9, 1), Some(Ptx(Sm90))),
            ((10, 0), Some(Ptx(Sm90))),
            ((12, 0), Some(Ptx(Sm90))),
            ((7, 5), None),
            ((0, 0), None),
            ((-1, 0), None),
        ];
        for ((major, minor), want) in cases {
            assert_eq!(code_for(major, minor), want, "{major}.{minor}");
        }
        assert_eq!(cubin_arch_for(10, 0), None);
        assert_eq!(ptx_arch_for(10, 0), Some(Sm90));
    }
}
