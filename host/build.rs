//! Compresses the committed PTX (`gpu-kernels/ptx/*.ptx`, written by `cargo xtask build-ptx`)
//! into `OUT_DIR`, so every binary linking ringccl embeds about 1 MB instead of 11 MB; the
//! driver layer inflates it once, on first use.

use std::{env, fs, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    for arch in ["sm90", "sm80"] {
        let src = manifest.join(format!("../gpu-kernels/ptx/ringccl_{arch}.ptx"));
        println!("cargo:rerun-if-changed={}", src.display());
        let text = fs::read(&src).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e} (run `cargo xtask build-ptx`)",
                src.display()
            )
        });
        let packed = miniz_oxide::deflate::compress_to_vec(&text, 6);
        let dst = out.join(format!("ringccl_{arch}.ptx.deflate"));
        fs::write(&dst, packed).unwrap_or_else(|e| panic!("cannot write {}: {e}", dst.display()));
    }
}
