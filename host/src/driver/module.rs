//! ringccl's kernels as the driver sees them: the embedded PTX, the module loaded into one
//! context, and its functions looked up by (primitive, type, operator) in O(1).

use std::sync::{Arc, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;
use gpu_kernels::entry::entry_index;
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

/// The embedded PTX text for `arch` (inflated once, on first use; about 10 MB each).
///
/// ```
/// use ringccl::internals::driver::module::{ptx, PtxArch};
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
            .map_err(|e| format!("the embedded PTX is corrupt: {e:?}"))?;
        String::from_utf8(bytes).map_err(|_| "the embedded PTX is not UTF-8".to_string())
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

/// ringccl's kernels loaded into one context: the module's functions (indexed like
/// [`ENTRY_POINTS`]) with their thread limits, and the device's SM count. The launchers are in
/// [`super::launch`].
#[derive(Debug)]
pub struct Kernels {
    /// The rank these kernels serve (labels errors).
    pub(crate) rank: Option<usize>,
    functions: Vec<CudaFunction>,
    max_threads: Vec<u32>,
    sm_count: u32,
}

impl Kernels {
    /// Loads the embedded PTX matching the device of `ctx` (JIT-compiled by the driver) and
    /// looks up every entry point. `rank` only labels errors.
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
        let arch = ptx_arch_for(cc.0, cc.1).ok_or_else(|| Error::Kernel {
            reason: format!(
                "the device has compute capability {}.{}; ringccl's kernels need 8.0 or newer",
                cc.0, cc.1
            ),
        })?;
        let ptx = ptx(arch)?;
        let sm = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::cuda("cuDeviceGetAttribute", rank, e))?;
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| Error::Kernel {
                reason: format!(
                    "the driver could not load the embedded PTX (cuModuleLoadData: {:?}) on a \
                     device of compute capability {}.{}",
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
        })
    }

    /// Every function, indexed like [`ENTRY_POINTS`] (for ringccl's kernel tests).
    #[cfg(feature = "internals")]
    pub fn functions(&self) -> &[CudaFunction] {
        &self.functions
    }

    /// The device's number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
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
