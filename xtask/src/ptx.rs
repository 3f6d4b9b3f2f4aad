//! `cargo xtask build-ptx [--check]`: compiles `gpu-kernels` to PTX for sm_90 and sm_80,
//! assembles each PTX into a cubin with `ptxas -O3`, and writes (or, with `--check`, compares)
//! the files under `gpu-kernels/ptx/`: the PTX and cubins zstd-compressed (what the
//! `gpu-kernels` package ships and ringccl embeds) and `cubins.txt` (which ptxas and which PTX
//! each cubin came from). The PTX itself, for review, is left in `target/ptx-out/` (about 27 MB
//! per architecture: too large to commit; `zstd -d` of the committed `.zst` gives the same
//! text).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use gpu_kernels::artifacts::{cubin_source, fnv1a64, CUBINS_FILE};
use gpu_kernels::oneshot::WAIT_ENTRY;
use gpu_kernels::ENTRY_POINTS;

use crate::ptxas;

/// One PTX flavour.
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    /// `-C target-cpu` and `ptxas -arch`.
    pub sm: &'static str,
    /// Extra `--cfg` for the kernels.
    pub cfg: Option<&'static str>,
    /// The PTX's file name under `gpu-kernels/ptx/`.
    pub file: &'static str,
    /// The cubin's file name (committed compressed, as `<cubin>.zst`).
    pub cubin: &'static str,
    /// Target directory under `target/`.
    pub target_dir: &'static str,
}

pub const ARCHES: [Arch; 2] = [
    Arch {
        sm: "sm_90",
        cfg: Some("ringccl_sm90"),
        file: "ringccl_sm90.ptx",
        cubin: "ringccl_sm90.cubin",
        target_dir: "ptx-sm90",
    },
    Arch {
        sm: "sm_80",
        cfg: None,
        file: "ringccl_sm80.ptx",
        cubin: "ringccl_sm80.cubin",
        target_dir: "ptx-sm80",
    },
];

/// Records which compiler produced the committed PTX (informational; not compared by `--check`).
const COMPILER_FILE: &str = "compiler.txt";

/// `ptxas` flags besides `-arch` and `-v`. ptxas records its flags in the cubin (section
/// `.note.nv.tkinfo`), so the same flags are part of what makes the output reproducible.
pub const PTXAS_FLAGS: [&str; 1] = ["-O3"];

/// zstd level of the committed `.zst` files (19: about 5 MB for all four; decoding is as fast
/// at any level).
const ZSTD_LEVEL: i32 = 19;

/// The compressed file's name: `<file>.zst`.
pub fn zst_name(file: &str) -> String {
    format!("{file}.zst")
}

/// One zstd frame with the content size and a content checksum (the host checks both).
pub fn compress(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Write;
    let err = |e: std::io::Error| format!("zstd compression failed: {e}");
    let mut enc = zstd::stream::Encoder::new(Vec::new(), ZSTD_LEVEL).map_err(err)?;
    enc.include_checksum(true).map_err(err)?;
    enc.include_contentsize(true).map_err(err)?;
    enc.set_pledged_src_size(Some(bytes.len() as u64))
        .map_err(err)?;
    enc.write_all(bytes).map_err(err)?;
    enc.finish().map_err(err)
}

/// Decompresses a `.zst` file.
pub fn decompress(bytes: &[u8]) -> Result<Vec<u8>, String> {
    zstd::stream::decode_all(bytes).map_err(|e| format!("not a valid zstd file: {e}"))
}

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

/// The entry points outside the typed table: the bounded wait, the point-to-point kernel (with
/// its two parameter sizes) and the LL all-gather.
pub const NAMED_ENTRIES: [&str; 4] = [
    WAIT_ENTRY,
    gpu_kernels::p2p::P2P_ENTRY,
    gpu_kernels::p2p::P2P_SMALL_ENTRY,
    gpu_kernels::ll::LL_GATHER_ENTRY,
];

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
    let mut names: Vec<&str> = ENTRY_POINTS.iter().map(|e| e.name).collect();
    names.extend(NAMED_ENTRIES);
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

    // Everything is checked in a scratch folder first; only checked output reaches
    // gpu-kernels/ptx.
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
    let assembled = run_ptxas(&paths, &scratch, &texts, &mut errors)?;

    let committed_dir = root.join("gpu-kernels").join("ptx");
    if !errors.is_empty() {
        return Err(format!(
            "PTX rejected ({} problem(s)); the rejected files are in {}:\n{}",
            errors.len(),
            scratch.display(),
            errors.join("\n")
        ));
    }
    let expected = expected_files(&texts, assembled.as_ref());
    let read = |name: &str| fs::read(committed_dir.join(name)).ok();
    let no_ptxas = "cubins NOT rebuilt: ptxas was not found, so the committed cubins were \
                    neither rebuilt nor compared byte for byte";
    if check {
        let mut stale: Vec<String> = stale_files(&expected, read)
            .into_iter()
            .map(|(file, problem)| format!("{file}: {problem}"))
            .collect();
        if assembled.is_none() {
            stale.extend(cubin_provenance(read(CUBINS_FILE).as_deref(), &texts));
        }
        if !stale.is_empty() {
            let mut msg = format!(
                "stale kernels: run `cargo xtask build-ptx` and commit gpu-kernels/ptx\n  {}\n  \
                 (fresh build in {})",
                stale.join("\n  "),
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
            if assembled.is_none() {
                msg += "\n  note: rebuilding the cubins needs ptxas: `python3 -m pip install \
                        --no-deps --target DIR nvidia-cuda-nvcc==13.0.88`, then \
                        PTXAS=DIR/nvidia/cu13/bin/ptxas";
            }
            if let (Some(fresh), Some(recorded)) = (&assembled, read(CUBINS_FILE)) {
                let recorded = String::from_utf8_lossy(&recorded);
                if !recorded.contains(&format!("({})", fresh.ptxas_version)) {
                    msg += &format!(
                        "\n  note: the committed cubins were not built by this ptxas ({}); \
                         another ptxas gives other cubins",
                        fresh.ptxas_version
                    );
                }
            }
            return Err(msg);
        }
        let names: Vec<&str> = expected.iter().map(|e| e.file.as_str()).collect();
        println!("up to date: {}", names.join(", "));
        if assembled.is_none() {
            eprintln!(
                "warning: {no_ptxas}; checked only that {CUBINS_FILE} records them as built \
                 from this PTX"
            );
        }
    } else {
        fs::create_dir_all(&committed_dir)
            .map_err(|e| format!("cannot create {}: {e}", committed_dir.display()))?;
        let stale = stale_files(&expected, read);
        let writes: Vec<&Expected> = expected
            .iter()
            .filter(|e| stale.iter().any(|(file, _)| *file == e.file))
            .collect();
        // zstd -19 takes seconds per file: compress the changed files side by side.
        let packed: Vec<Result<Vec<u8>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = writes
                .iter()
                .map(|e| {
                    s.spawn(move || {
                        if e.zst {
                            compress(&e.content)
                        } else {
                            Ok(e.content.clone())
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("compression thread panicked".to_string()))
                })
                .collect()
        });
        for (e, bytes) in writes.iter().zip(packed) {
            let dst = committed_dir.join(&e.file);
            let bytes = bytes?;
            fs::write(&dst, &bytes)
                .map_err(|err| format!("cannot write {}: {err}", dst.display()))?;
            println!("wrote {} (updated, {} bytes)", dst.display(), bytes.len());
        }
        for e in expected
            .iter()
            .filter(|e| !writes.iter().any(|w| w.file == e.file))
        {
            println!("{}: unchanged", committed_dir.join(&e.file).display());
        }
        let dst = committed_dir.join(COMPILER_FILE);
        fs::write(&dst, format!("{}\n", compiler.version))
            .map_err(|e| format!("cannot write {}: {e}", dst.display()))?;
        if assembled.is_none() {
            let behind = cubin_provenance(read(CUBINS_FILE).as_deref(), &texts);
            if behind.is_empty() {
                eprintln!(
                    "warning: {no_ptxas}; {CUBINS_FILE} records them as built from this PTX, \
                     so they still match it"
                );
            } else {
                eprintln!(
                    "warning: {no_ptxas}, and they are now behind the PTX:\n  {}\n\
                     rebuild where ptxas is found before committing (ringccl's tests and \
                     `build-ptx --check` fail until then)",
                    behind.join("\n  ")
                );
            }
        }
    }
    Ok(())
}

/// Fresh cubins and the `cubins.txt` that describes them.
#[derive(Debug)]
pub struct Assembled {
    /// One cubin per entry of [`ARCHES`].
    pub cubins: Vec<Vec<u8>>,
    /// `ptxas --version`'s release line.
    pub ptxas_version: String,
}

/// `cubins.txt` for cubins assembled by `ptxas_version` from `texts` (one per [`ARCHES`]).
pub fn cubins_manifest(ptxas_version: &str, texts: &[String]) -> String {
    let mut s = String::from(
        "# Written by `cargo xtask build-ptx`: the ptxas that assembled each cubin and the PTX it \
         came from (FNV-1a, 64 bits).\n",
    );
    for (arch, text) in ARCHES.iter().zip(texts) {
        s += &format!(
            "{} = ptxas -arch={} {} ({ptxas_version}) of {} fnv1a64:{:016x}\n",
            arch.cubin,
            arch.sm,
            PTXAS_FLAGS.join(" "),
            arch.file,
            fnv1a64(text.as_bytes())
        );
    }
    s
}

/// One file of `gpu-kernels/ptx/` as this build makes it.
#[derive(Debug)]
pub struct Expected {
    /// File name under `gpu-kernels/ptx/`.
    pub file: String,
    /// Its content (decompressed, for a `.zst` file).
    pub content: Vec<u8>,
    /// Stored zstd-compressed.
    pub zst: bool,
}

/// The files this build commits: each PTX compressed and, when ptxas ran, each cubin
/// compressed and `cubins.txt`.
pub fn expected_files(texts: &[String], assembled: Option<&Assembled>) -> Vec<Expected> {
    let mut out = Vec::new();
    for (arch, text) in ARCHES.iter().zip(texts) {
        out.push(Expected {
            file: zst_name(arch.file),
            content: text.as_bytes().to_vec(),
            zst: true,
        });
    }
    if let Some(a) = assembled {
        for (arch, cubin) in ARCHES.iter().zip(&a.cubins) {
            out.push(Expected {
                file: zst_name(arch.cubin),
                content: cubin.clone(),
                zst: true,
            });
        }
        out.push(Expected {
            file: CUBINS_FILE.to_string(),
            content: cubins_manifest(&a.ptxas_version, texts).into_bytes(),
            zst: false,
        });
    }
    out
}

/// The expected files whose committed form (`read`) differs: (file name, what is wrong). A
/// `.zst` file is compared decompressed, so recompressing an unchanged file (another
/// zstd version) is not a change.
pub fn stale_files(
    expected: &[Expected],
    read: impl Fn(&str) -> Option<Vec<u8>>,
) -> Vec<(String, String)> {
    let mut stale = Vec::new();
    for e in expected {
        let problem = match read(&e.file) {
            None => Some("missing".to_string()),
            Some(bytes) if e.zst => match decompress(&bytes) {
                Ok(content) if content == e.content => None,
                Ok(_) => Some("differs from the fresh build".to_string()),
                Err(err) => Some(err),
            },
            Some(bytes) if bytes == e.content => None,
            Some(_) => Some("differs from the fresh build".to_string()),
        };
        if let Some(p) = problem {
            stale.push((e.file.clone(), p));
        }
    }
    stale
}

/// Without fresh cubins: whether `manifest` (the committed `cubins.txt`) records each cubin as
/// assembled from the PTX in `texts`; one line per cubin that is not.
pub fn cubin_provenance(manifest: Option<&[u8]>, texts: &[String]) -> Vec<String> {
    let manifest = manifest.map(String::from_utf8_lossy).unwrap_or_default();
    ARCHES
        .iter()
        .zip(texts)
        .filter_map(|(arch, text)| match cubin_source(&manifest, arch.cubin) {
            Some((ptx, hash)) if ptx == arch.file && hash == fnv1a64(text.as_bytes()) => None,
            Some((ptx, _)) if ptx == arch.file => Some(format!(
                "{}: assembled from another {} than this build's",
                zst_name(arch.cubin),
                arch.file
            )),
            _ => Some(format!(
                "{}: {CUBINS_FILE} does not say which PTX it came from",
                zst_name(arch.cubin)
            )),
        })
        .collect()
}

/// Runs ptxas (when found) on each file, adding the problems found to `errors`; returns the
/// cubins, or `None` without ptxas.
fn run_ptxas(
    paths: &[PathBuf],
    scratch: &Path,
    texts: &[String],
    errors: &mut Vec<String>,
) -> Result<Option<Assembled>, String> {
    let Some(ptxas_path) = ptxas::find() else {
        let msg = "ptxas not found (set $PTXAS or put it on PATH; `pip install nvidia-cuda-nvcc` has one): \
                   no cubins built, register/stack/spill checks skipped";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            return Err(format!("{msg}; CI=true requires them"));
        }
        eprintln!("warning: {msg}");
        return Ok(None);
    };
    let start = Instant::now();
    let ptxas_version = ptxas::version(&ptxas_path);
    println!("ptxas: {} ({ptxas_version})", ptxas_path.display());
    let reports: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ARCHES
            .iter()
            .zip(paths)
            .map(|(arch, p)| {
                let ptxas_path = &ptxas_path;
                let cubin = scratch.join(arch.cubin);
                s.spawn(move || ptxas::run(ptxas_path, arch.sm, &PTXAS_FLAGS, p, &cubin))
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
    let mut cubins = Vec::new();
    for (arch, report) in ARCHES.iter().zip(reports) {
        match report {
            Ok((report, cubin)) => {
                print!("{}", ptxas::register_table(arch.sm, ENTRY_POINTS, &report));
                errors.extend(ptxas::check(arch.sm, ENTRY_POINTS, &report));
                for name in NAMED_ENTRIES {
                    errors.extend(ptxas::check_named(arch.sm, name, &report));
                }
                println!("{}: {} bytes", arch.cubin, cubin.len());
                cubins.push(cubin);
            }
            Err(e) => errors.push(e),
        }
    }
    println!("ptxas in {}", secs(start));
    if cubins.len() != ARCHES.len() || cubins.len() != texts.len() {
        return Ok(None); // the errors say why
    }
    Ok(Some(Assembled {
        cubins,
        ptxas_version,
    }))
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
        // Everything but the two entries in PTX is missing from the real table's point of view
        // (the table's entry points and the named ones).
        let missing = ENTRY_POINTS.len() + NAMED_ENTRIES.len() - 2;
        assert!(
            errors[1].contains(&format!("not in the PTX ({missing})")),
            "{}",
            errors[1]
        );
    }

    fn texts() -> Vec<String> {
        vec![
            ".target sm_90\n// ptx 90\n".to_string(),
            ".target sm_80\n// ptx 80\n".to_string(),
        ]
    }

    fn assembled(cubins: [&[u8]; 2]) -> Assembled {
        Assembled {
            cubins: cubins.iter().map(|c| c.to_vec()).collect(),
            ptxas_version: "Cuda compilation tools, release 13.0, V13.0.88".to_string(),
        }
    }

    /// The files as `build-ptx` would commit them.
    fn committed(expected: &[Expected]) -> std::collections::BTreeMap<String, Vec<u8>> {
        expected
            .iter()
            .map(|e| {
                let bytes = if e.zst {
                    compress(&e.content).unwrap()
                } else {
                    e.content.clone()
                };
                (e.file.clone(), bytes)
            })
            .collect()
    }

    #[test]
    fn expected_files_are_the_compressed_ptx_then_the_cubins() {
        let names = |a: Option<&Assembled>| -> Vec<String> {
            expected_files(&texts(), a)
                .into_iter()
                .map(|e| format!("{}{}", e.file, if e.zst { " (zst)" } else { "" }))
                .collect()
        };
        assert_eq!(
            names(None),
            ["ringccl_sm90.ptx.zst (zst)", "ringccl_sm80.ptx.zst (zst)"]
        );
        let a = assembled([b"\x7fELF 90", b"\x7fELF 80"]);
        let with = names(Some(&a));
        assert_eq!(
            with[2..],
            [
                "ringccl_sm90.cubin.zst (zst)",
                "ringccl_sm80.cubin.zst (zst)",
                "cubins.txt"
            ]
        );
    }

    #[test]
    fn check_detects_a_stale_or_missing_cubin_and_nothing_else() {
        let a = assembled([b"\x7fELF 90", b"\x7fELF 80"]);
        let expected = expected_files(&texts(), Some(&a));
        let mut files = committed(&expected);
        assert!(stale_files(&expected, |n| files.get(n).cloned()).is_empty());

        // A cubin from another PTX or ptxas: found, and only that file.
        files.insert(
            "ringccl_sm80.cubin.zst".into(),
            compress(b"\x7fELF old 80").unwrap(),
        );
        let stale = stale_files(&expected, |n| files.get(n).cloned());
        assert_eq!(
            stale,
            [(
                "ringccl_sm80.cubin.zst".to_string(),
                "differs from the fresh build".to_string()
            )]
        );

        // Not a zstd file, and a missing one.
        files.insert("ringccl_sm80.cubin.zst".into(), b"\x7fELF raw".to_vec());
        files.remove("ringccl_sm90.cubin.zst");
        let stale = stale_files(&expected, |n| files.get(n).cloned());
        assert_eq!(stale.len(), 2, "{stale:?}");
        assert_eq!(
            stale[0],
            ("ringccl_sm90.cubin.zst".into(), "missing".into())
        );
        assert_eq!(stale[1].0, "ringccl_sm80.cubin.zst");
        assert!(stale[1].1.contains("not a valid zstd file"), "{stale:?}");
    }

    #[test]
    fn check_compares_compressed_files_by_content() {
        let expected = expected_files(&texts(), None);
        let mut files = committed(&expected);
        // The same PTX compressed at another level (another zstd) is not stale.
        let other = zstd::stream::encode_all(texts()[0].as_bytes(), 1).unwrap();
        assert_ne!(other, files["ringccl_sm90.ptx.zst"]);
        files.insert("ringccl_sm90.ptx.zst".into(), other);
        assert!(stale_files(&expected, |n| files.get(n).cloned()).is_empty());
        // Another PTX behind the compression is stale.
        files.insert(
            "ringccl_sm80.ptx.zst".into(),
            compress(b".target sm_80\r\n").unwrap(),
        );
        let stale = stale_files(&expected, |n| files.get(n).cloned());
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].0, "ringccl_sm80.ptx.zst");
    }

    #[test]
    fn the_manifest_records_ptxas_and_the_ptx_of_each_cubin() {
        let t = texts();
        let m = cubins_manifest("Cuda compilation tools, release 13.0, V13.0.88", &t);
        assert!(m.contains(
            "ringccl_sm90.cubin = ptxas -arch=sm_90 -O3 (Cuda compilation tools, release 13.0, \
             V13.0.88) of ringccl_sm90.ptx fnv1a64:"
        ));
        for (arch, text) in ARCHES.iter().zip(&t) {
            assert_eq!(
                cubin_source(&m, arch.cubin),
                Some((arch.file, fnv1a64(text.as_bytes())))
            );
        }
    }

    #[test]
    fn without_ptxas_check_catches_cubins_left_behind_by_a_ptx_change() {
        let t = texts();
        let m = cubins_manifest("ptxas x", &t);
        assert!(cubin_provenance(Some(m.as_bytes()), &t).is_empty());
        let mut changed = t.clone();
        changed[1].push_str("// a kernel changed\n");
        let behind = cubin_provenance(Some(m.as_bytes()), &changed);
        assert_eq!(
            behind,
            ["ringccl_sm80.cubin.zst: assembled from another ringccl_sm80.ptx than this build's"]
        );
        let none = cubin_provenance(None, &t);
        assert_eq!(none.len(), 2);
        assert!(none[0].contains("does not say which PTX"), "{none:?}");
    }

    #[test]
    fn the_file_names_are_gpu_kernels_artifacts() {
        for (arch, build) in ARCHES.iter().zip(gpu_kernels::artifacts::BUILDS) {
            assert_eq!(arch.sm, build.sm);
            assert_eq!(arch.file, build.ptx_file);
            assert_eq!(arch.cubin, build.cubin_file);
        }
    }

    #[test]
    fn compressed_files_carry_their_size_and_a_checksum() {
        let data = b"some kernels".repeat(100);
        let packed = compress(&data).unwrap();
        // Frame header descriptor: bit 2 = content checksum, bits 6-7 = size field present.
        let descriptor = packed[4];
        assert_ne!(descriptor & 0b100, 0, "checksum flag");
        assert_ne!(descriptor & 0b1100_0000, 0, "content size");
        assert_eq!(decompress(&packed).unwrap(), data);
    }
}
