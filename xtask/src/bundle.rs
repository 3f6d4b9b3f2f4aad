//! `cargo xtask gpu-bundle [--out DIR]`: release test, bench and example binaries plus the
//! compressed PTX and cubins in one folder, with a `run-all.sh`, to copy to a GPU machine that needs no Rust toolchain.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cargo_metadata::{Message, TargetKind};

use crate::ptx::{workspace_root, zst_name, ARCHES};

/// A guard on the bundle's size: every binary that links ringccl embeds the compressed PTX and
/// cubins (about 5 MB; the bundle of about 30 binaries was 141 MB when the two-shot kernels for
/// the other collectives came), so an unexpected binary or kernels that are no longer
/// compressed show up here (the error lists each binary's size).
pub const MAX_BUNDLE_BYTES: u64 = 200_000_000;

/// One executable cargo built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    pub path: PathBuf,
    /// `lib`, `bin`, `test`, `bench`, ... (the first of cargo's `target.kind`).
    pub kind: String,
    pub target: String,
    /// Built with the test harness (`profile.test`).
    pub harness: bool,
}

/// Reads cargo's `--message-format=json` stdout: every `compiler-artifact` with an executable,
/// each path once. Lines that are not cargo messages are skipped; a `compiler-artifact` message
/// that cannot be read is an error (so that a binary is never left out silently).
pub fn executables(cargo_stdout: &[u8]) -> Result<Vec<Artifact>, String> {
    let mut out: Vec<Artifact> = Vec::new();
    for (n, msg) in Message::parse_stream(cargo_stdout).enumerate() {
        let msg = msg.map_err(|e| format!("cannot read line {} of cargo's output: {e}", n + 1))?;
        let art = match msg {
            Message::CompilerArtifact(art) => art,
            Message::TextLine(line) => {
                check_not_an_artifact(&line).map_err(|e| format!("line {}: {e}", n + 1))?;
                continue;
            }
            _ => continue,
        };
        let Some(exe) = art.executable else {
            continue;
        };
        let a = Artifact {
            path: exe.into_std_path_buf(),
            kind: match art.target.kind.first() {
                Some(
                    TargetKind::Lib
                    | TargetKind::RLib
                    | TargetKind::DyLib
                    | TargetKind::CDyLib
                    | TargetKind::StaticLib
                    | TargetKind::ProcMacro,
                ) => "lib".to_string(),
                Some(k) => k.to_string(),
                None => "?".to_string(),
            },
            target: art.target.name,
            harness: art.profile.test,
        };
        if !out.iter().any(|b| b.path == a.path) {
            out.push(a);
        }
    }
    Ok(out)
}

/// `parse_stream` turns a message it cannot read into a text line: fails, with serde's reason,
/// when that line is a `compiler-artifact` message.
fn check_not_an_artifact(line: &str) -> Result<(), String> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
        return Ok(()); // not JSON: plain text
    };
    if value.get("reason").and_then(serde_json::Value::as_str) != Some("compiler-artifact") {
        return Ok(()); // a message kind cargo_metadata does not know
    }
    match serde_json::from_value::<cargo_metadata::Artifact>(value) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "cannot read cargo's compiler-artifact message: {e}"
        )),
    }
}

/// Runs cargo with JSON messages (its progress still goes to the terminal); returns stdout.
fn cargo_json(root: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    println!("$ cargo {}", args.join(" "));
    let out = Command::new(&cargo)
        .current_dir(root)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo {}` failed ({})",
            args.join(" "),
            out.status
        ));
    }
    Ok(out.stdout)
}

/// [`cargo_json`] then [`executables`], with the command in any error.
fn cargo_executables(root: &Path, args: &[&str]) -> Result<Vec<Artifact>, String> {
    executables(&cargo_json(root, args)?).map_err(|e| format!("`cargo {}`: {e}", args.join(" ")))
}

/// How many tests (ignored ones included) a libtest binary holds; `None` if it cannot say.
fn test_count(exe: &Path) -> Option<usize> {
    let out = Command::new(exe)
        .args(["--list", "--include-ignored"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(count_listed_tests(&String::from_utf8_lossy(&out.stdout)))
}

/// Counts the `name: test` lines of libtest's `--list` output.
pub fn count_listed_tests(list: &str) -> usize {
    list.lines().filter(|l| l.ends_with(": test")).count()
}

fn on_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// A readable unique name for a copied binary: `<kind>-<target>`.
fn bundle_name(a: &Artifact, taken: &[String]) -> String {
    let base = format!("{}-{}", a.kind, a.target);
    let mut name = base.clone();
    let mut n = 2;
    while taken.contains(&name) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

/// The generated runner; `tests` and `benches` are paths relative to the bundle.
pub fn run_all_script(tests: &[String], benches: &[String]) -> String {
    let list = |v: &[String]| v.iter().map(|s| format!("  {s}\n")).collect::<String>();
    format!(
        r#"#!/usr/bin/env bash
# Generated by `cargo xtask gpu-bundle`. Runs every test binary of this bundle (ignored GPU tests
# included, one test at a time), then every bench binary (`--bench`), and exits non-zero if any
# of them failed; a failure does not stop the rest.
#   ./run-all.sh [ARGS...]   ARGS go to every binary (e.g. a test-name filter)
#   OUT=DIR      also write everything under DIR: run-all.log, logs/<binary>.log, criterion/
#   SKIP_TESTS=1 / SKIP_BENCHES=1   skip one half
set -uo pipefail
if [ -n "${{OUT:-}}" ]; then
  mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
fi
cd "$(dirname "$0")" || exit 2
export NCCL_NVLS_ENABLE=0
export RUST_BACKTRACE="${{RUST_BACKTRACE:-1}}"

TESTS=(
{tests})
BENCHES=(
{benches})

run_one() {{ # label binary args...
  local label=$1 bin=$2 start=$SECONDS rc
  shift 2
  echo
  echo "=== $label $bin $*"
  if [ -n "${{OUT:-}}" ]; then
    "./$bin" "$@" 2>&1 | tee "$OUT/logs/$(basename "$bin").log"
    rc=${{PIPESTATUS[0]}}
  else
    "./$bin" "$@"
    rc=$?
  fi
  echo "=== $label $bin: exit $rc, $((SECONDS - start)) s"
  if [ "$rc" -ne 0 ]; then FAILED+=("$bin (exit $rc)"); fi
}}

main() {{
  FAILED=()
  echo "=== nvidia-smi"
  nvidia-smi || echo "(nvidia-smi failed)"
  echo "=== nvidia-smi topo -m"
  nvidia-smi topo -m || echo "(nvidia-smi topo -m failed)"
  if [ "${{SKIP_TESTS:-0}}" != 1 ]; then
    for t in ${{TESTS[@]+"${{TESTS[@]}}"}}; do
      run_one test "$t" --include-ignored --test-threads=1 "$@"
    done
  fi
  if [ "${{SKIP_BENCHES:-0}}" != 1 ]; then
    for b in ${{BENCHES[@]+"${{BENCHES[@]}}"}}; do
      run_one bench "$b" --bench "$@"
    done
  fi
  echo
  if [ "${{#FAILED[@]}}" -ne 0 ]; then
    echo "=== FAILED: ${{#FAILED[@]}} binary(ies):"
    printf '  %s\n' "${{FAILED[@]}}"
    return 1
  fi
  echo "=== all passed"
}}

if [ -n "${{OUT:-}}" ]; then
  mkdir -p "$OUT/logs"
  export CRITERION_HOME="${{CRITERION_HOME:-$OUT/criterion}}"
  main "$@" 2>&1 | tee "$OUT/run-all.log"
  exit "${{PIPESTATUS[0]}}"
fi
main "$@"
"#,
        tests = list(tests),
        benches = list(benches),
    )
}

fn dir_size(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// `cargo xtask gpu-bundle [--out DIR]`.
pub fn gpu_bundle(out: Option<PathBuf>) -> Result<(), String> {
    let root = workspace_root();
    let out = out.unwrap_or_else(|| root.join("gpu-bundle"));
    let ptx_dir = root.join("gpu-kernels").join("ptx");
    for a in ARCHES {
        for file in [zst_name(a.file), zst_name(a.cubin)] {
            if !ptx_dir.join(&file).is_file() {
                return Err(format!(
                    "{} is missing: run `cargo xtask build-ptx` first",
                    ptx_dir.join(&file).display()
                ));
            }
        }
    }

    let tests = cargo_executables(
        &root,
        &[
            "test",
            "--workspace",
            "--exclude",
            "xtask",
            "--release",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ],
    )?;
    // Every binary that links the host library embeds the compressed kernels (about 2 MB): leave out
    // the test binaries that hold no test at all.
    let (tests, empty): (Vec<Artifact>, Vec<Artifact>) = tests
        .into_iter()
        .filter(|a| a.harness)
        .partition(|a| test_count(&a.path) != Some(0));
    if !empty.is_empty() {
        let names: Vec<String> = empty
            .iter()
            .map(|a| format!("{}-{}", a.kind, a.target))
            .collect();
        println!("left out (no tests): {}", names.join(" "));
    }
    let benches = cargo_executables(
        &root,
        &[
            "bench",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ],
    )?;
    // `cargo bench` also builds every library's unit tests in bench mode: keep the bench targets.
    let benches: Vec<Artifact> = benches.into_iter().filter(|a| a.kind == "bench").collect();
    let bins = cargo_executables(
        &root,
        &[
            "build",
            "--release",
            "--workspace",
            "--exclude",
            "xtask",
            "--bins",
            "--message-format=json-render-diagnostics",
        ],
    )?;
    let bins: Vec<Artifact> = bins.into_iter().filter(|a| a.kind == "bin").collect();
    let examples = cargo_executables(
        &root,
        &[
            "build",
            "--release",
            "-p",
            "ringccl",
            "--examples",
            "--message-format=json-render-diagnostics",
        ],
    )?;
    let examples: Vec<Artifact> = examples
        .into_iter()
        .filter(|a| a.kind == "example")
        .collect();

    if out.exists() {
        // Only ever delete a previous bundle.
        let is_bundle = out.join("run-all.sh").is_file()
            || fs::read_dir(&out)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
        if !is_bundle {
            return Err(format!(
                "{} exists and is not a gpu bundle (no run-all.sh): refusing to replace it",
                out.display()
            ));
        }
        fs::remove_dir_all(&out).map_err(|e| format!("cannot remove {}: {e}", out.display()))?;
    }
    let strip = on_path("strip");
    let copy_group = |group: &str, artifacts: &[Artifact]| -> Result<Vec<String>, String> {
        let mut taken = Vec::new();
        let dir = out.join(group);
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut rel = Vec::new();
        for a in artifacts {
            let name = bundle_name(a, &taken);
            let dst = dir.join(&name);
            fs::copy(&a.path, &dst)
                .map_err(|e| format!("cannot copy {}: {e}", a.path.display()))?;
            if let Some(strip) = &strip {
                // Debug info only: symbol names stay for panic backtraces.
                let ok = Command::new(strip)
                    .arg("--strip-debug")
                    .arg(&dst)
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    eprintln!(
                        "warning: `strip --strip-debug {}` failed; kept unstripped",
                        dst.display()
                    );
                }
            }
            taken.push(name.clone());
            rel.push(format!("{group}/{name}"));
        }
        Ok(rel)
    };
    let test_paths = copy_group("tests", &tests)?;
    let bench_paths = copy_group("benches", &benches)?;
    let bin_paths = copy_group("bin", &bins)?;
    let example_paths = copy_group("examples", &examples)?;

    let ptx_out = out.join("ptx");
    fs::create_dir_all(&ptx_out)
        .map_err(|e| format!("cannot create {}: {e}", ptx_out.display()))?;
    // The binaries embed the kernels; this copy (zstd-compressed, as committed: `zstd -d`
    // unpacks them) is for inspection (cuobjdump, nvdisasm, ptxas) on the GPU machine.
    for a in ARCHES {
        for file in [zst_name(a.file), zst_name(a.cubin)] {
            fs::copy(ptx_dir.join(&file), ptx_out.join(&file))
                .map_err(|e| format!("cannot copy {file}: {e}"))?;
        }
    }
    let script = out.join("run-all.sh");
    fs::write(&script, run_all_script(&test_paths, &bench_paths))
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    set_executable(&script)?;

    let size = dir_size(&out);
    println!("gpu bundle: {}", out.display());
    println!("  tests   ({}): {}", test_paths.len(), test_paths.join(" "));
    println!(
        "  benches ({}): {}",
        bench_paths.len(),
        bench_paths.join(" ")
    );
    println!("  bin     ({}): {}", bin_paths.len(), bin_paths.join(" "));
    println!(
        "  examples ({}): {}",
        example_paths.len(),
        example_paths.join(" ")
    );
    println!(
        "  ptx/, run-all.sh; size {}{}",
        mb(size),
        if strip.is_some() {
            " (debug info stripped)"
        } else {
            " (strip not found: unstripped)"
        }
    );
    if size > MAX_BUNDLE_BYTES {
        for rel in test_paths
            .iter()
            .chain(&bench_paths)
            .chain(&bin_paths)
            .chain(&example_paths)
        {
            let len = fs::metadata(out.join(rel)).map_or(0, |m| m.len());
            println!("  {:>9}  {rel}", mb(len));
        }
        return Err(format!(
            "the bundle is {} (over the {} limit)",
            mb(size),
            mb(MAX_BUNDLE_BYTES)
        ));
    }
    Ok(())
}

#[cfg(unix)]
fn set_executable(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot chmod {}: {e}", p.display()))
}

#[cfg(not(unix))]
fn set_executable(_: &Path) -> Result<(), String> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `compiler-artifact` line as cargo 1.95 prints it.
    fn artifact(kind: &str, name: &str, test: bool, exe: Option<&str>) -> String {
        let crate_type = if kind == "lib" { "lib" } else { "bin" };
        serde_json::json!({
            "reason": "compiler-artifact",
            "package_id": "path+file:///t/host#ringccl@0.1.0",
            "manifest_path": "/t/host/Cargo.toml",
            "target": {
                "kind": [kind], "crate_types": [crate_type], "name": name,
                "src_path": "/t/host/src/lib.rs", "edition": "2021",
                "doc": true, "doctest": false, "test": true
            },
            "profile": {
                "opt_level": "3", "debuginfo": 0, "debug_assertions": false,
                "overflow_checks": false, "test": test
            },
            "features": [],
            "filenames": [exe.unwrap_or("/t/libx.rlib")],
            "executable": exe,
            "fresh": false
        })
        .to_string()
    }

    fn cargo_out() -> String {
        [
            artifact("lib", "ringccl", false, None),
            artifact("rlib", "ringccl", true, Some("/t/deps/ringccl-aa")),
            r#"{"reason":"compiler-message","package_id":"path+file:///t/host#ringccl@0.1.0","manifest_path":"/t/host/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"ringccl","src_path":"/t/host/src/lib.rs","edition":"2021","doc":true,"doctest":true,"test":true},"message":{"rendered":"warning: unused","$message_type":"diagnostic","children":[],"code":null,"level":"warning","message":"unused","spans":[]}}"#.to_string(),
            r#"{"reason":"build-script-executed","package_id":"registry+https://github.com/rust-lang/crates.io-index#serde@1.0.229","linked_libs":[],"linked_paths":[],"cfgs":[],"env":[],"out_dir":"/t/build/serde-1/out"}"#.to_string(),
            r#"{"reason":"some-future-message","x":1}"#.to_string(),
            "   Compiling ringccl v0.1.0 (not JSON)".to_string(),
            artifact("bin", "ringccl-perf", false, Some("/t/ringccl-perf")),
            artifact("test", "all_reduce", true, Some("/t/deps/all_reduce-bb")),
            artifact("bench", "kernels", true, Some("/t/deps/kernels-cc")),
            artifact("example", "two_gpus", false, Some("/t/examples/two_gpus")),
            // The same binary again (fresh): listed once.
            artifact("test", "all_reduce", true, Some("/t/deps/all_reduce-bb")),
            r#"{"reason":"build-finished","success":true}"#.to_string(),
        ]
        .join("\n")
            + "\n"
    }

    #[test]
    fn collects_executables_with_kind_and_harness() {
        let a = executables(cargo_out().as_bytes()).expect("valid cargo output");
        let got: Vec<(&str, &str, &str, bool)> = a
            .iter()
            .map(|a| {
                (
                    a.path.to_str().unwrap_or(""),
                    a.kind.as_str(),
                    a.target.as_str(),
                    a.harness,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("/t/deps/ringccl-aa", "lib", "ringccl", true),
                ("/t/ringccl-perf", "bin", "ringccl-perf", false),
                ("/t/deps/all_reduce-bb", "test", "all_reduce", true),
                ("/t/deps/kernels-cc", "bench", "kernels", true),
                ("/t/examples/two_gpus", "example", "two_gpus", false),
            ]
        );
    }

    #[test]
    fn reads_a_verbatim_cargo_line() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/xtask#0.1.0","manifest_path":"/w/xtask/Cargo.toml","target":{"kind":["bin"],"crate_types":["bin"],"name":"xtask","src_path":"/w/xtask/src/main.rs","edition":"2021","doc":true,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/w/target/debug/deps/xtask-69b5f7ef0cb3f77f"],"executable":"/w/target/debug/deps/r\u00e9lease/xtask-69b5f7ef0cb3f77f","fresh":false}"#;
        let a = executables(line.as_bytes()).expect("valid cargo output");
        assert_eq!(
            a,
            [Artifact {
                path: "/w/target/debug/deps/rélease/xtask-69b5f7ef0cb3f77f".into(),
                kind: "bin".into(),
                target: "xtask".into(),
                harness: true,
            }]
        );
    }

    #[test]
    fn an_unreadable_artifact_message_is_an_error() {
        let bad = r#"{"reason":"compiler-artifact","target":{"kind":["test"],"name":"all_reduce"},"executable":"/t/x"}"#;
        let out = format!("{}\n{bad}\n", artifact("bin", "b", false, Some("/t/b")));
        let err = executables(out.as_bytes()).expect_err("an artifact without its fields");
        assert!(
            err.starts_with("line 2: cannot read cargo's compiler-artifact message"),
            "{err}"
        );
        assert!(err.contains("missing field"), "{err}");
        assert_eq!(executables(b"").map(|a| a.len()), Ok(0));
        assert!(executables(b"\xff\xfe not UTF-8\n").is_err());
    }

    #[test]
    fn counts_listed_tests() {
        let list = "sched::tests::ring: test\nexec::tests::two_gpus: test\nb: benchmark\n\n2 tests, 1 benchmark\n";
        assert_eq!(count_listed_tests(list), 2);
        assert_eq!(count_listed_tests("0 tests, 0 benchmarks\n"), 0);
    }

    #[test]
    fn names_are_unique() {
        let a = Artifact {
            path: "/x".into(),
            kind: "test".into(),
            target: "t".into(),
            harness: true,
        };
        let mut taken = vec![];
        let n1 = bundle_name(&a, &taken);
        taken.push(n1.clone());
        let n2 = bundle_name(&a, &taken);
        assert_eq!((n1.as_str(), n2.as_str()), ("test-t", "test-t-2"));
    }

    #[test]
    fn script_lists_relative_binaries_and_sets_nvls_off() {
        let s = run_all_script(
            &["tests/lib-ringccl".into()],
            &["benches/bench-kernels".into()],
        );
        assert!(s.starts_with("#!/usr/bin/env bash\n"));
        assert!(s.contains("export NCCL_NVLS_ENABLE=0"));
        assert!(s.contains("TESTS=(\n  tests/lib-ringccl\n)"));
        assert!(s.contains("BENCHES=(\n  benches/bench-kernels\n)"));
        assert!(s.contains("--include-ignored --test-threads=1"));
        assert!(s.contains("--bench \"$@\""));
        assert!(!s.contains("/t/"), "no absolute paths");
    }
}
