//! The training example's kernels (`examples/train-mlp/kernels`): compiled to one PTX for
//! sm_80 (the driver JIT-compiles it for any GPU from 8.0 up), checked (no unresolved calls,
//! exactly `train_mlp_kernels::ENTRY_POINTS`; with ptxas: no stack frame, no spills), and
//! written to (or, with `--check`, compared with) `examples/train-mlp/ptx/train_mlp.ptx`.

use std::fs;
use std::path::Path;
use std::time::Instant;

use crate::ptx::{compare_entries, entry_names, extern_funcs, find_compiler, workspace_root};
use crate::ptxas;

const CRATE: &str = "train-mlp-kernels";
const ARCH: &str = "sm_80";
const TARGET: &str = "nvptx64-nvidia-cuda";
const TARGET_DIR: &str = "ptx-train";
const OUT: &str = "examples/train-mlp/ptx/train_mlp.ptx";

/// Builds the PTX text.
fn build(root: &Path) -> Result<String, String> {
    let compiler = find_compiler()?;
    let target_dir = root.join("target").join(TARGET_DIR);
    let deps = target_dir.join(TARGET).join("release").join("deps");
    let cargo = |args: &[&str]| {
        let mut cmd = std::process::Command::new(&compiler.cargo);
        cmd.current_dir(root)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("RUSTC", &compiler.rustc)
            .env("CARGO_TARGET_DIR", &target_dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_RUSTFLAGS")
            .env_remove("RUSTC_WRAPPER")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("CARGO_BUILD_TARGET")
            .args(args);
        cmd.output()
            .map_err(|e| format!("cannot run {}: {e}", compiler.cargo.display()))
    };
    let clean = cargo(&["clean", "-p", CRATE, "--release", "--target", TARGET])?;
    if !clean.status.success() {
        return Err(format!(
            "`cargo clean -p {CRATE}` failed:\n{}",
            String::from_utf8_lossy(&clean.stderr)
        ));
    }
    let prefix = format!("{}-", CRATE.replace('-', "_"));
    let asm = |deps: &Path| -> Vec<std::path::PathBuf> {
        fs::read_dir(deps)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".s"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    for s in asm(&deps) {
        fs::remove_file(&s).map_err(|e| format!("cannot remove {}: {e}", s.display()))?;
    }
    let target_cpu = format!("target-cpu={ARCH}");
    let out = cargo(&[
        "rustc",
        "-p",
        CRATE,
        "--release",
        "--target",
        TARGET,
        "-Zbuild-std=core",
        "--",
        "--emit=asm",
        "-C",
        &target_cpu,
    ])?;
    if !out.status.success() {
        return Err(format!(
            "{CRATE}: nvptx build failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let files = asm(&deps);
    let [file] = files.as_slice() else {
        return Err(format!(
            "{CRATE}: expected one {prefix}*.s in {}, found {}",
            deps.display(),
            files.len()
        ));
    };
    fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

/// The checks of the PTX text: no unresolved calls, the expected entry points.
pub fn static_checks(ptx: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let externs = extern_funcs(ptx);
    if !externs.is_empty() {
        errors.push(format!(
            "{OUT}: unresolved function(s) (something from core was not inlined):\n  {}",
            externs.join("\n  ")
        ));
    }
    if let Err(e) = compare_entries(&entry_names(ptx), &train_mlp_kernels::ENTRY_POINTS) {
        errors.push(format!("{OUT}: {e}"));
    }
    errors
}

/// `cargo xtask build-ptx [--check]`'s part for the training example.
pub fn build_train_ptx(check: bool) -> Result<(), String> {
    let root = workspace_root();
    let start = Instant::now();
    let text = build(&root)?;
    let mut errors = static_checks(&text);
    let scratch = root.join("target").join("ptx-out");
    fs::create_dir_all(&scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let fresh = scratch.join("train_mlp.ptx");
    fs::write(&fresh, &text).map_err(|e| format!("cannot write {}: {e}", fresh.display()))?;
    match ptxas::find() {
        Some(ptxas) => {
            let (report, _) =
                ptxas::run(&ptxas, ARCH, &[], &fresh, &scratch.join("train_mlp.cubin"))?;
            for name in train_mlp_kernels::ENTRY_POINTS {
                match report.get(name) {
                    None => errors.push(format!("{OUT}: ptxas reported nothing for `{name}`")),
                    Some(r) if r.stack_frame != 0 || r.spill_stores != 0 || r.spill_loads != 0 => {
                        errors.push(format!(
                            "{OUT}: `{name}` uses a stack frame or spills: {r:?}"
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        None => eprintln!("warning: ptxas not found: {OUT} not assembled (set PTXAS)"),
    }
    if !errors.is_empty() {
        return Err(format!(
            "training-example PTX rejected (fresh build in {}):\n{}",
            fresh.display(),
            errors.join("\n")
        ));
    }
    let committed = root.join(OUT);
    let same = fs::read_to_string(&committed).is_ok_and(|c| c == text);
    if check {
        if !same {
            return Err(format!(
                "stale kernels: {OUT} differs from a fresh build ({}); run `cargo xtask \
                 build-ptx` and commit it",
                fresh.display()
            ));
        }
        println!("up to date: {OUT} ({:.1} s)", start.elapsed().as_secs_f64());
    } else if same {
        println!("{OUT}: unchanged");
    } else {
        fs::write(&committed, &text)
            .map_err(|e| format!("cannot write {}: {e}", committed.display()))?;
        println!("wrote {OUT} ({} bytes)", text.len());
    }
    Ok(())
}
