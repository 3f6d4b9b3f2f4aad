//! `cargo xtask build-ptx [--check]`: compiles `gpu-kernels` to PTX for sm_90 and sm_80.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use gpu_kernels::ENTRY_POINTS;

use crate::ptxas;

/// One PTX flavour.
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    /// `-C target-cpu` and `ptxas -arch`.
    pub sm: &'static str,
    /// Extra `--cfg` for the kernels.
    pub cfg: Option<&'static str>,
    /// File name under `gpu-kernels/ptx/`.
    pub file: &'static str,
    /// Target directory under `target/`.
    pub target_dir: &'static str,
}

pub const ARCHES: [Arch; 2] = [
    Arch {
        sm: "sm_90",
        cfg: Some("ringccl_sm90"),
        file: "ringccl_sm90.ptx",
        target_dir: "ptx-sm90",
    },
    Arch {
        sm: "sm_80",
        cfg: None,
        file: "ringccl_sm80.ptx",
        target_dir: "ptx-sm80",
    },
];

/// Records which compiler produced the committed PTX (informational; not compared by `--check`).
const COMPILER_FILE: &str = "compiler.txt";

const TARGET: &str = "nvptx64-nvidia-cuda";

const INSTALL_HINT: &str = "\
no Rust compiler able to build `core` for nvptx64-nvidia-cuda was found. Install one of:
  * Debian/Ubuntu: apt-get install -y rustc-web rust-web-src   (gives /usr/bin/rustc + library source)
  * rustup:        rustup toolchain install nightly --component rust-src
or point RINGCCL_PTX_RUSTC at a rustc whose sysroot has lib/rustlib/src/rust/library/core.";

/// The compiler (and cargo) used for the nvptx build.
#[derive(Debug)]
pub struct PtxCompiler {
    pub rustc: PathBuf,
    pub cargo: PathBuf,
    pub origin: &'static str,
    pub version: String,
}

fn has_core_source(sysroot: &Path) -> bool {
    sysroot.join("lib/rustlib/src/rust/library/core").is_dir()
}

fn sysroot_of(mut cmd: Command) -> Option<PathBuf> {
    let out = cmd.args(["--print", "sysroot"]).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !s.trim().is_empty()).then(|| PathBuf::from(s.trim()))
}

fn rustc_version(rustc: &Path) -> String {
    Command::new(rustc)
        .arg("-vV")
        .output()
        .ok()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let first = text.lines().next().unwrap_or("rustc ?").to_string();
            match text.lines().find_map(|l| l.strip_prefix("LLVM version: ")) {
                Some(llvm) => format!("{first}, LLVM {llvm}"),
                None => first,
            }
        })
        .unwrap_or_else(|| "unknown version".to_string())
}

fn host_cargo() -> PathBuf {
    std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from)
}

/// `$RINGCCL_PTX_RUSTC`, else `/usr/bin/rustc` with library source, else a rustup nightly with
/// `rust-src`.
pub fn find_compiler() -> Result<PtxCompiler, String> {
    let mut tried = Vec::new();
    if let Some(rustc) = std::env::var_os("RINGCCL_PTX_RUSTC").filter(|v| !v.is_empty()) {
        let rustc = PathBuf::from(rustc);
        return match sysroot_of(Command::new(&rustc)) {
            Some(s) if has_core_source(&s) => Ok(PtxCompiler {
                version: rustc_version(&rustc),
                rustc,
                cargo: host_cargo(),
                origin: "$RINGCCL_PTX_RUSTC",
            }),
            Some(s) => Err(format!(
                "RINGCCL_PTX_RUSTC={} has no library source at {}/lib/rustlib/src/rust/library/core \
                 (add it, e.g. `rustup component add rust-src`, or unset RINGCCL_PTX_RUSTC)",
                rustc.display(),
                s.display()
            )),
            None => Err(format!("RINGCCL_PTX_RUSTC={}: `rustc --print sysroot` failed", rustc.display())),
        };
    }
    let debian = PathBuf::from("/usr/bin/rustc");
    match sysroot_of(Command::new(&debian)) {
        Some(s) if has_core_source(&s) => {
            return Ok(PtxCompiler {
                version: rustc_version(&debian),
                rustc: debian,
                cargo: host_cargo(),
                origin: "Debian rustc-web",
            })
        }
        Some(s) => tried.push(format!(
            "/usr/bin/rustc: no library source under {} (rust-web-src)",
            s.display()
        )),
        None => tried.push("/usr/bin/rustc: not found".to_string()),
    }
    let mut nightly = Command::new("rustup");
    nightly
        .args(["run", "nightly", "rustc"])
        .env("RUSTUP_AUTO_INSTALL", "0");
    match sysroot_of(nightly) {
        Some(s) if has_core_source(&s) => {
            let rustc = s.join("bin/rustc");
            let cargo = s.join("bin/cargo");
            return Ok(PtxCompiler {
                version: rustc_version(&rustc),
                rustc,
                cargo: if cargo.is_file() { cargo } else { host_cargo() },
                origin: "rustup nightly",
            });
        }
        Some(s) => tried.push(format!(
            "rustup nightly at {}: no rust-src component",
            s.display()
        )),
        None => tried.push("rustup nightly: not installed".to_string()),
    }
    Err(format!("{INSTALL_HINT}\n(tried: {})", tried.join("; ")))
}

fn run_captured(cmd: &mut Command) -> Result<Output, String> {
    cmd.output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))
}

fn cargo_cmd(root: &Path, compiler: &PtxCompiler, target_dir: &Path) -> Command {
    let mut cmd = Command::new(&compiler.cargo);
    cmd.current_dir(root)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTC", &compiler.rustc)
        .env("CARGO_TARGET_DIR", target_dir)
        // The PTX must depend on the sources and the compiler only.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_BUILD_TARGET");
    cmd
}

/// Compiles gpu-kernels for one arch and returns the PTX text.
fn build_arch(root: &Path, compiler: &PtxCompiler, arch: Arch) -> Result<String, String> {
    let target_dir = root.join("target").join(arch.target_dir);
    let deps = target_dir.join(TARGET).join("release").join("deps");
    // Force rustc to run again (cargo does not track the `.s` output), keeping `core` cached,
    // and drop old `.s` files so the one read below is this build's.
    let clean = run_captured(cargo_cmd(root, compiler, &target_dir).args([
        "clean",
        "-p",
        "gpu-kernels",
        "--release",
        "--target",
        TARGET,
    ]))?;
    if !clean.status.success() {
        return Err(format!(
            "{}: `cargo clean -p gpu-kernels` failed:\n{}",
            arch.sm,
            String::from_utf8_lossy(&clean.stderr)
        ));
    }
    for s in asm_files(&deps) {
        fs::remove_file(&s).map_err(|e| format!("cannot remove {}: {e}", s.display()))?;
    }
    let mut cmd = cargo_cmd(root, compiler, &target_dir);
    cmd.args([
        "rustc",
        "-p",
        "gpu-kernels",
        "--release",
        "--target",
        TARGET,
        "-Zbuild-std=core",
        "--",
    ])
    .args(["--emit=asm", "-C"])
    .arg(format!("target-cpu={}", arch.sm));
    if let Some(cfg) = arch.cfg {
        cmd.args(["--cfg", cfg]);
    }
    let out = run_captured(&mut cmd)?;
    if !out.status.success() {
        return Err(format!(
            "{}: nvptx build failed ({}):\n{}",
            arch.sm,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let newest = asm_files(&deps)
        .into_iter()
        .filter_map(|p| Some((fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .ok_or_else(|| {
            format!(
                "{}: the build emitted no gpu_kernels-*.s in {}",
                arch.sm,
                deps.display()
            )
        })?;
    fs::read_to_string(&newest).map_err(|e| format!("cannot read {}: {e}", newest.display()))
}

fn asm_files(deps: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(deps) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("gpu_kernels-") && n.ends_with(".s"))
        })
        .collect()
}

/// `.extern .func` declarations: calls the PTX cannot resolve on its own.
pub fn extern_funcs(ptx: &str) -> Vec<String> {
    ptx.lines()
        .map(str::trim)
        .filter(|l| l.starts_with(".extern") && l.split_whitespace().nth(1) == Some(".func"))
        .map(str::to_string)
        .collect()
}

/// Names of the `.visible .entry` kernels.
pub fn entry_names(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|rest| {
            let end = rest
                .find(|c: char| c == '(' || c.is_whitespace())
                .unwrap_or(rest.len());
            rest[..end].to_string()
        })
        .collect()
}

/// Compares the PTX's entry names with the expected table; `Err` lists both differences.
pub fn compare_entries(found: &BTreeSet<String>, expected: &[&str]) -> Result<(), String> {
    let expected: BTreeSet<&str> = expected.iter().copied().collect();
    let extra: Vec<&str> = found
        .iter()
        .map(String::as_str)
        .filter(|n| !expected.contains(n))
        .collect();
    let missing: Vec<&str> = expected
        .iter()
        .copied()
        .filter(|n| !found.contains(*n))
        .collect();
    if extra.is_empty() && missing.is_empty() {
        return Ok(());
    }
    let mut msg = format!(
        "the PTX's entry points differ from gpu_kernels::ENTRY_POINTS ({} in PTX, {} in the table)",
        found.len(),
        expected.len()
    );
    if !missing.is_empty() {
        msg += &format!(
            "\n  in ENTRY_POINTS but not in the PTX ({}): {}",
            missing.len(),
            missing.join(", ")
        );
    }
    if !extra.is_empty() {
        msg += &format!(
            "\n  in the PTX but not in ENTRY_POINTS ({}): {}",
            extra.len(),
            extra.join(", ")
        );
    }
    Err(msg)
}

/// The checks that need no tool: no unresolved calls, exactly the expected entry points.
pub fn static_checks(arch: &str, ptx: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let externs = extern_funcs(ptx);
    if !externs.is_empty() {
        errors.push(format!(
            "{arch}: the PTX declares {} unresolved function(s) (something from core was not inlined):\n  {}",
            externs.len(),
            externs.join("\n  ")
        ));
    }
    let names: Vec<&str> = ENTRY_POINTS.iter().map(|e| e.name).collect();
    if let Err(e) = compare_entries(&entry_names(ptx), &names) {
        errors.push(format!("{arch}: {e}"));
    }
    errors
}

pub fn workspace_root() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest
        .parent()
        .map_or(manifest.clone(), Path::to_path_buf)
}

fn secs(t: Instant) -> String {
    format!("{:.1}s", t.elapsed().as_secs_f64())
}

/// `cargo xtask build-ptx [--check]`.
pub fn build_ptx(check: bool) -> Result<(), String> {
    let root = workspace_root();
    let compiler = find_compiler()?;
    println!(
        "PTX compiler: {} ({}: {})",
        compiler.version,
        compiler.origin,
        compiler.rustc.display()
    );
    let start = Instant::now();
    println!(
        "building gpu-kernels for {} (a cold target dir first builds core: about a minute)...",
        ARCHES.map(|a| a.sm).join(" and ")
    );
    // The two builds are mostly single-threaded (codegen-units = 1): run them side by side.
    let built: Vec<Result<String, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = ARCHES
            .iter()
            .map(|&arch| {
                let (root, compiler) = (&root, &compiler);
                s.spawn(move || build_arch(root, compiler, arch))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("build thread panicked".to_string()))
            })
            .collect()
    });
    let mut texts = Vec::new();
    for r in built {
        // No post-processing: this LLVM output was checked to be byte-identical across repeated
        // builds, checkout paths and target directories.
        texts.push(r?);
    }
    println!("built in {}", secs(start));

    // Everything is checked in a scratch folder first; only checked PTX reaches gpu-kernels/ptx.
    let scratch = root.join("target").join("ptx-out");
    fs::create_dir_all(&scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let mut errors = Vec::new();
    let mut paths = Vec::new();
    for (arch, text) in ARCHES.iter().zip(&texts) {
        errors.extend(static_checks(arch.sm, text));
        let p = scratch.join(arch.file);
        fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        paths.push(p);
        println!(
            "{}: {} entry points, {} bytes",
            arch.sm,
            entry_names(text).len(),
            text.len()
        );
    }
    errors.extend(run_ptxas(&paths, &scratch)?);

    let committed_dir = root.join("gpu-kernels").join("ptx");
    if !errors.is_empty() {
        return Err(format!(
            "PTX rejected ({} problem(s)); the rejected files are in {}:\n{}",
            errors.len(),
            scratch.display(),
            errors.join("\n")
        ));
    }
    if check {
        let stale: Vec<&str> = ARCHES
            .iter()
            .zip(&texts)
            .filter(|(a, t)| {
                fs::read_to_string(committed_dir.join(a.file))
                    .ok()
                    .as_deref()
                    != Some(t.as_str())
            })
            .map(|(a, _)| a.file)
            .collect();
        if !stale.is_empty() {
            let mut msg = format!(
                "stale PTX: run `cargo xtask build-ptx` and commit\n  differs: {} (fresh build in {})",
                stale.join(", "),
                scratch.display()
            );
            if let Ok(recorded) = fs::read_to_string(committed_dir.join(COMPILER_FILE)) {
                if recorded.trim() != compiler.version {
                    msg += &format!(
                        "\n  note: the committed PTX was built with `{}`, this build used `{}`; \
                         the compiler alone changes the PTX",
                        recorded.trim(),
                        compiler.version
                    );
                }
            }
            return Err(msg);
        }
        println!("PTX up to date: {}", ARCHES.map(|a| a.file).join(", "));
    } else {
        fs::create_dir_all(&committed_dir)
            .map_err(|e| format!("cannot create {}: {e}", committed_dir.display()))?;
        for (arch, text) in ARCHES.iter().zip(&texts) {
            let dst = committed_dir.join(arch.file);
            let same = fs::read_to_string(&dst).ok().as_deref() == Some(text.as_str());
            fs::write(&dst, text).map_err(|e| format!("cannot write {}: {e}", dst.display()))?;
            println!(
                "wrote {} ({})",
                dst.display(),
                if same { "unchanged" } else { "updated" }
            );
        }
        let dst = committed_dir.join(COMPILER_FILE);
        fs::write(&dst, format!("{}\n", compiler.version))
            .map_err(|e| format!("cannot write {}: {e}", dst.display()))?;
    }
    Ok(())
}

/// Runs ptxas (when found) on each file; returns the problems found.
fn run_ptxas(paths: &[PathBuf], scratch: &Path) -> Result<Vec<String>, String> {
    let Some(ptxas_path) = ptxas::find() else {
        let msg = "ptxas not found (set $PTXAS or put it on PATH; `pip install nvidia-cuda-nvcc` has one): \
                   register/stack/spill checks skipped";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            return Err(format!("{msg}; CI=true requires them"));
        }
        eprintln!("warning: {msg}");
        return Ok(Vec::new());
    };
    let start = Instant::now();
    println!(
        "ptxas: {} ({})",
        ptxas_path.display(),
        ptxas::version(&ptxas_path)
    );
    let reports: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ARCHES
            .iter()
            .zip(paths)
            .map(|(arch, p)| {
                let ptxas_path = &ptxas_path;
                let cubin = scratch.join(format!("{}.cubin", arch.sm));
                s.spawn(move || ptxas::run(ptxas_path, arch.sm, p, &cubin))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("ptxas thread panicked".to_string()))
            })
            .collect()
    });
    let mut errors = Vec::new();
    for (arch, report) in ARCHES.iter().zip(reports) {
        match report {
            Ok(report) => {
                print!("{}", ptxas::register_table(arch.sm, ENTRY_POINTS, &report));
                errors.extend(ptxas::check(arch.sm, ENTRY_POINTS, &report));
            }
            Err(e) => errors.push(e),
        }
    }
    println!("ptxas checks in {}", secs(start));
    Ok(errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "\
//
// Generated by LLVM NVPTX Back-End
//
.version 7.8
.target sm_90
.address_size 64
.extern .func  (.param .b32 func_retval0) memcpy(
	.param .b64 memcpy_param_0
);
.visible .func _RNvCs_7___rustc17rust_begin_unwind(
	.param .b64 p
)
	// .globl	ringccl_copy_f32
.visible .entry ringccl_copy_f32(
	.param .u64 .ptr .align 1 ringccl_copy_f32_param_0
)
{
	ret;
}
.visible .entry ringccl_reduce_sum_u8(
	.param .u64 ringccl_reduce_sum_u8_param_0
)
.entry not_visible(
)
";

    #[test]
    fn finds_entries_and_externs() {
        let names: Vec<String> = entry_names(PTX).into_iter().collect();
        assert_eq!(names, ["ringccl_copy_f32", "ringccl_reduce_sum_u8"]);
        let externs = extern_funcs(PTX);
        assert_eq!(externs.len(), 1);
        assert!(externs[0].contains("memcpy"));
        assert!(extern_funcs(".visible .func f(\n)\n").is_empty());
    }

    #[test]
    fn entry_comparison_lists_both_differences() {
        let found = entry_names(PTX);
        assert!(compare_entries(&found, &["ringccl_reduce_sum_u8", "ringccl_copy_f32"]).is_ok());
        let err = compare_entries(
            &found,
            &["ringccl_copy_f32", "ringccl_copy_f64", "ringccl_copy_u8"],
        )
        .expect_err("sets differ");
        assert!(err.contains("2 in PTX, 3 in the table"), "{err}");
        assert!(
            err.contains(
                "in ENTRY_POINTS but not in the PTX (2): ringccl_copy_f64, ringccl_copy_u8"
            ),
            "{err}"
        );
        assert!(
            err.contains("in the PTX but not in ENTRY_POINTS (1): ringccl_reduce_sum_u8"),
            "{err}"
        );
        let only_missing =
            compare_entries(&found, &["ringccl_copy_f32", "ringccl_reduce_sum_u8", "x"])
                .unwrap_err();
        assert!(
            !only_missing.contains("in the PTX but not"),
            "{only_missing}"
        );
    }

    #[test]
    fn static_checks_report_externs_and_the_real_table() {
        let errors = static_checks("sm_90", PTX);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("unresolved") && errors[0].contains("memcpy"));
        // Everything but the two entries in PTX is missing from the real table's point of view.
        let missing = ENTRY_POINTS.len() - 2;
        assert!(
            errors[1].contains(&format!("not in the PTX ({missing})")),
            "{}",
            errors[1]
        );
    }
}
