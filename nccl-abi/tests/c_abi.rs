//! The C ABI check: `tests/c/abi_check.c`, compiled with the system C compiler against NCCL's
//! official `nccl.h` (2.28) and linked against this library as `libnccl.so.2`, then run.
//!
//! nccl.h is NVIDIA's and is not copied here: set `NCCL_INCLUDE_DIR` to a directory holding it
//! (the PyPI wheel `nvidia-nccl-cu13==2.28.9` has it in `nvidia/nccl/include`; `.ci/run`
//! downloads it) and run `cargo test -p nccl-abi --test c_abi -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory of the library cargo built for this test (`target/<profile>`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/c_abi-<hash> → target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

#[test]
#[ignore = "needs NCCL's nccl.h (NCCL_INCLUDE_DIR); .ci/run downloads it and runs this"]
fn c_program_built_against_the_official_header() {
    let include = std::env::var("NCCL_INCLUDE_DIR")
        .expect("set NCCL_INCLUDE_DIR to the directory holding NCCL 2.28's nccl.h");
    assert!(
        Path::new(&include).join("nccl.h").is_file(),
        "no nccl.h in {include}"
    );
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let lib = lib_dir().join("libringccl_nccl.so");
    assert!(
        lib.is_file(),
        "{} was not built: run `cargo build -p nccl-abi` first",
        lib.display()
    );
    // The library as a program finds it: a file named after its SONAME.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nccl-abi");
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let so2 = dir.join("libnccl.so.2");
    let _ = std::fs::remove_file(&so2);
    std::fs::copy(&lib, &so2).expect("copy the library");
    let exe = dir.join("abi_check");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(here.join("cuda-stub"))
        .arg("-I")
        .arg(&include)
        .arg(here.join("abi_check.c"))
        .arg("-L")
        .arg(&dir)
        .args(["-l:libnccl.so.2", "-ldl"])
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "the C ABI check does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the ABI check");
    let stdout = String::from_utf8_lossy(&run.stdout);
    print!("{stdout}");
    assert!(
        run.status.success(),
        "the C ABI check failed:\n{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("42 functions taken"), "{stdout}");
    assert!(stdout.contains("checks passed"), "{stdout}");
}
