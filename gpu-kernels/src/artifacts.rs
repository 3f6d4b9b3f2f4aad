//! The compiled kernels shipped in this package, so that nobody who uses ringccl needs a GPU
//! compiler: for each architecture the PTX (what `rustc` made of this crate) and the cubin
//! (the machine code `ptxas -O3` made of that PTX), written to `ptx/` by `cargo xtask
//! build-ptx` and stored compressed with zstd (RFC 8878, level 19, with a content checksum):
//! about 2 MB for all four instead of 31 MB.
//!
//! | build | PTX | cubin (SASS) runs on |
//! | --- | --- | --- |
//! | [`SM90`] | `.target sm_90` (JIT-compiled for 9.0 and newer) | compute capability 9.0 |
//! | [`SM80`] | `.target sm_80` (JIT-compiled for 8.0 and newer) | 8.0, 8.6, 8.7, 8.9 |
//!
//! [`CUBINS`] (`ptx/cubins.txt`) records, for each cubin, the `ptxas` that built it and a
//! hash ([`fnv1a64`]) of the PTX it was built from, so a cubin left behind by a PTX rebuild
//! without `ptxas` is caught by a test.
//!
//! The byte statics need the `artifacts` feature (ringccl enables it); the rest is always
//! there, for the build tool that writes the files.
//!
//! ```
//! use gpu_kernels::artifacts::{cubin_source, fnv1a64};
//! let manifest = "ringccl_sm90.cubin = ptxas -arch=sm_90 -O3 of ringccl_sm90.ptx fnv1a64:00000000000000ff\n";
//! assert_eq!(cubin_source(manifest, "ringccl_sm90.cubin"), Some(("ringccl_sm90.ptx", 0xff)));
//! assert_eq!(cubin_source(manifest, "ringccl_sm80.cubin"), None);
//! assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
//! ```

/// One architecture's compiled kernels.
#[derive(Clone, Copy, Debug)]
pub struct Build {
    /// `ptxas -arch` and `-C target-cpu`: `"sm_90"`.
    pub sm: &'static str,
    /// The PTX's file name under `ptx/` (`ringccl_sm90.ptx`); the package holds `<name>.zst`.
    pub ptx_file: &'static str,
    /// The cubin's file name (`ringccl_sm90.cubin`); the package holds `<name>.zst`.
    pub cubin_file: &'static str,
    /// The PTX text, zstd-compressed.
    #[cfg(feature = "artifacts")]
    pub ptx_zst: &'static [u8],
    /// The cubin (an ELF file), zstd-compressed.
    #[cfg(feature = "artifacts")]
    pub cubin_zst: &'static [u8],
}

/// Hopper: PTX for sm_90 (built with `--cfg ringccl_sm90`), cubin for compute capability 9.0.
pub static SM90: Build = Build {
    sm: "sm_90",
    ptx_file: "ringccl_sm90.ptx",
    cubin_file: "ringccl_sm90.cubin",
    #[cfg(feature = "artifacts")]
    ptx_zst: include_bytes!("../ptx/ringccl_sm90.ptx.zst"),
    #[cfg(feature = "artifacts")]
    cubin_zst: include_bytes!("../ptx/ringccl_sm90.cubin.zst"),
};

/// Ampere: PTX for sm_80, cubin for compute capability 8.0 (runs on every 8.x).
pub static SM80: Build = Build {
    sm: "sm_80",
    ptx_file: "ringccl_sm80.ptx",
    cubin_file: "ringccl_sm80.cubin",
    #[cfg(feature = "artifacts")]
    ptx_zst: include_bytes!("../ptx/ringccl_sm80.ptx.zst"),
    #[cfg(feature = "artifacts")]
    cubin_zst: include_bytes!("../ptx/ringccl_sm80.cubin.zst"),
};

/// Every build, newest architecture first.
pub static BUILDS: [&Build; 2] = [&SM90, &SM80];

/// The file under `ptx/` that records where each cubin came from.
pub const CUBINS_FILE: &str = "cubins.txt";

/// `ptx/cubins.txt`: one line per cubin,
/// `<cubin> = ptxas <flags> (<ptxas version>) of <ptx> fnv1a64:<16 hex digits>`.
#[cfg(feature = "artifacts")]
pub static CUBINS: &str = include_str!("../ptx/cubins.txt");

/// FNV-1a, 64 bits: a small, dependency-free fingerprint of a file (not a cryptographic hash).
pub const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// The PTX file name and its hash that `manifest` (the text of `ptx/cubins.txt`) records for
/// `cubin_file`; `None` if there is no such line or it is malformed.
pub fn cubin_source<'a>(manifest: &'a str, cubin_file: &str) -> Option<(&'a str, u64)> {
    let line = manifest.lines().find(|l| {
        l.split_once(" = ")
            .is_some_and(|(name, _)| name.trim() == cubin_file)
    })?;
    let (_, rest) = line.rsplit_once(" of ")?;
    let (ptx, hash) = rest.trim().split_once(' ')?;
    let hex = hash.trim().strip_prefix("fnv1a64:")?;
    if hex.len() != 16 {
        return None;
    }
    Some((ptx, u64::from_str_radix(hex, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn cubin_source_reads_its_line_only() {
        let m = "\
# comment
ringccl_sm90.cubin = ptxas -arch=sm_90 -O3 (Cuda compilation tools, release 13.0, V13.0.88) of ringccl_sm90.ptx fnv1a64:0123456789abcdef
ringccl_sm80.cubin = ptxas -arch=sm_80 -O3 (x) of ringccl_sm80.ptx fnv1a64:123
";
        assert_eq!(
            cubin_source(m, "ringccl_sm90.cubin"),
            Some(("ringccl_sm90.ptx", 0x0123_4567_89ab_cdef))
        );
        assert_eq!(cubin_source(m, "ringccl_sm80.cubin"), None, "short hash");
        assert_eq!(cubin_source(m, "ringccl_sm.cubin"), None);
        assert_eq!(cubin_source("", "ringccl_sm90.cubin"), None);
    }

    #[cfg(feature = "artifacts")]
    #[test]
    fn the_manifest_names_every_cubin() {
        for b in BUILDS {
            let (ptx, _) = cubin_source(CUBINS, b.cubin_file).expect("a line per cubin");
            assert_eq!(ptx, b.ptx_file);
            assert!(b.ptx_zst.len() > 1000 && b.cubin_zst.len() > 1000);
        }
    }
}
