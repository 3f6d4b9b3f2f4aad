//! The module map of `host/src`, checked: every module may use only the modules listed for it
//! below (read from the `crate::` paths in its non-test code), and the listed dependencies form
//! no cycle. `docs/ARCHITECTURE.md` draws the same map.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Each module and the modules it may use. Read top to bottom: the public calls, then planning
/// and the communicator, the executors, per-rank resources and the transport, the driver; the
/// pure data modules at the bottom.
const ALLOWED: &[(&str, &[&str])] = &[
    ("ddp", &["api", "comm", "dtype", "error"]),
    (
        "api",
        &[
            "comm", "config", "debug", "dtype", "error", "exec", "kind", "plan", "schedule",
        ],
    ),
    (
        "comm",
        &[
            "bootstrap",
            "config",
            "debug",
            "driver",
            "error",
            "exec",
            "plan",
            "resources",
            "transport",
        ],
    ),
    (
        "exec",
        &[
            "driver",
            "dtype",
            "error",
            "plan",
            "resources",
            "schedule",
            "transport",
        ],
    ),
    (
        "resources",
        &["config", "driver", "error", "plan", "transport"],
    ),
    (
        "transport",
        &["config", "debug", "driver", "error", "schedule"],
    ),
    ("driver", &["debug", "dtype", "error"]),
    ("plan", &["config", "dtype", "error", "kind", "schedule"]),
    ("bootstrap", &["error"]),
    ("sim", &["schedule"]),
    ("schedule", &[]),
    ("debug", &["config"]),
    ("config", &["error"]),
    ("kind", &[]),
    ("dtype", &[]),
    ("error", &[]),
];

/// What a `crate::Name` re-exported at the crate root stands for.
fn root_item(name: &str) -> &str {
    match name {
        "Error" | "Result" | "Arg" | "BootstrapFailure" => "error",
        "UniqueId" => "bootstrap",
        "DataType" | "DeviceElement" => "dtype",
        "CollectiveKind" | "UnknownCollective" => "kind",
        "Communicator" => "comm",
        "Config" | "Algorithm" | "DebugLevel" | "Network" => "config",
        "Io" | "DeviceSlice" | "DeviceSliceMut" | "RawBuf" | "SendRecv" | "PeerOp" => "api",
        "device_count" => "driver",
        "RedOp" => "gpu_kernels",
        other => other,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("file under src");
    let first = rel.components().next().expect("non-empty path");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// The modules named by `crate::` paths in `code`.
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let head = item.trim().split("::").next().unwrap_or("").trim();
                if !head.is_empty() {
                    out.insert(root_item(head).to_string());
                }
            }
        } else {
            let head: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.insert(root_item(&head).to_string());
        }
    }
    out
}

/// The code of a file without its tests and comments.
fn non_test_code(file: &Path) -> String {
    let text = fs::read_to_string(file).expect("readable source file");
    let mut code = String::new();
    for line in text.lines() {
        if line.starts_with("#[cfg(test)]") {
            break; // test modules come last
        }
        let t = line.trim_start();
        if !t.starts_with("//") {
            code.push_str(line);
            code.push('\n');
        }
    }
    code
}

#[test]
fn modules_use_only_the_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, deps)| (*m, deps.iter().copied().collect()))
        .collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found {} source files", files.len());
    let mut problems = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        // The crate root declares and re-exports the modules; tests may use anything;
        // binaries (`src/bin`) are crates of their own that see only the public API.
        if file == &src.join("lib.rs")
            || name == "tests.rs"
            || name == "test_util.rs"
            || file.starts_with(src.join("bin"))
        {
            continue;
        }
        let module = module_of(&src, file);
        let Some(ok) = allowed.get(module.as_str()) else {
            problems.push(format!(
                "{}: module {module} is not in the map",
                file.display()
            ));
            continue;
        };
        for used in uses(&non_test_code(file)) {
            if used != module && used != "gpu_kernels" && !ok.contains(used.as_str()) {
                problems.push(format!("{}: {module} uses {used}", file.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_map_has_no_cycle() {
    // Repeatedly remove modules whose dependencies are all removed.
    let mut left: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, deps)| (*m, deps.iter().copied().collect()))
        .collect();
    while !left.is_empty() {
        let done: Vec<&str> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(m, _)| *m)
            .collect();
        assert!(!done.is_empty(), "cycle among {:?}", left.keys());
        for m in done {
            left.remove(m);
        }
    }
}

#[test]
fn the_scanner_reads_paths_and_groups() {
    let u = uses("use crate::plan::{tuning, Prepared};\nuse crate::{Error, RedOp, Result};\nlet x = crate::driver::f();");
    let want: BTreeSet<String> = ["plan", "error", "gpu_kernels", "driver"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(u, want);
}
