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
    ("nccl", &["api", "bootstrap", "comm", "dtype", "error"]),
    (
        "api",
        &[
            "comm", "config", "debug", "dtype", "error", "exec", "kind", "per_rank", "plan",
            "schedule",
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
            "per_rank",
            "plan",
            "resources",
            "schedule",
            "transport",
        ],
    ),
    (
        "resources",
        &[
            "bootstrap",
            "config",
            "driver",
            "error",
            "plan",
            "transport",
        ],
    ),
    (
        "transport",
        &["config", "debug", "driver", "error", "schedule"],
    ),
    ("driver", &["debug", "dtype", "error"]),
    // `plan` uses of `transport` only the network path's pure slot state
    // (`transport::net::{Carry, NET_SLOTS}`), which the transport holds per rank.
    (
        "plan",
        &[
            "config",
            "dtype",
            "error",
            "kind",
            "per_rank",
            "schedule",
            "transport",
        ],
    ),
    ("bootstrap", &["error"]),
    ("sim", &["schedule"]),
    ("schedule", &[]),
    ("debug", &["config"]),
    ("config", &["error"]),
    ("kind", &[]),
    ("per_rank", &[]),
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
        "Communicator" | "PendingCommunicator" => "comm",
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

/// The first path segment of each tree in a use group's body (`a, b::c, d::{e, f}`): split at
/// the commas outside nested braces.
fn group_heads(body: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut item = String::new();
    for c in body.chars() {
        match c {
            '{' => {
                depth += 1;
                item.push(c);
            }
            '}' => {
                depth = depth.saturating_sub(1);
                item.push(c);
            }
            ',' if depth == 0 => heads.push(std::mem::take(&mut item)),
            _ => item.push(c),
        }
    }
    heads.push(item);
    heads
        .iter()
        .map(|item| {
            item.trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|head| !head.is_empty() && head != "self")
        .collect()
}

/// The body of the brace group that `text` starts inside (just after its `{`), up to the
/// matching `}`.
fn group_body(text: &str) -> &str {
    let mut depth = 1usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[..i];
                }
            }
            _ => {}
        }
    }
    text
}

/// The modules named by `crate::` paths in `code`: `use crate::a::b`, `crate::a::f()` anywhere
/// in an expression or type, and grouped or nested `use crate::{a, b::{c, d}}`.
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // `$crate::` (macros) and `ringccl_crate::`-like identifiers are not this crate's paths.
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest_trim = rest.trim_start();
        if let Some(group) = rest_trim.strip_prefix('{') {
            for head in group_heads(group_body(group)) {
                out.insert(root_item(&head).to_string());
            }
        } else {
            let head: String = rest_trim
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !head.is_empty() {
                out.insert(root_item(&head).to_string());
            }
        }
    }
    out
}

/// `line` without a trailing `//` comment (one outside a string literal).
fn strip_line_comment(line: &str) -> &str {
    let mut in_str = false;
    let mut prev = ' ';
    let bytes: Vec<char> = line.chars().collect();
    for (k, (i, c)) in line.char_indices().enumerate() {
        if c == '"' && prev != '\\' {
            in_str = !in_str;
        }
        if !in_str && c == '/' && bytes.get(k + 1) == Some(&'/') {
            return &line[..i];
        }
        prev = c;
    }
    line
}

/// The code of a file without comments and without its `#[cfg(test)]` items, and the names of
/// the test modules it declares in other files (`#[cfg(test)] mod tests;`).
fn non_test_code(text: &str) -> (String, Vec<String>) {
    let mut code = String::new();
    let mut test_mods = Vec::new();
    let mut lines = text.lines().peekable();
    let mut in_block_comment = false;
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if in_block_comment {
            if let Some(end) = t.find("*/") {
                in_block_comment = false;
                code.push_str(&t[end + 2..]);
                code.push('\n');
            }
            continue;
        }
        if t.starts_with("/*") {
            in_block_comment = !t.contains("*/");
            continue;
        }
        if t.starts_with("#[cfg(test)]") {
            // The item that follows (after any further attributes) is test code: one line
            // ending in `;` (a test module in its own file) or a block up to its closing brace.
            let mut depth = 0i64;
            let mut opened = false;
            for item in lines.by_ref() {
                let it = strip_line_comment(item.trim_start());
                if !opened && it.starts_with("#[") {
                    continue;
                }
                if !opened {
                    if let Some(name) = it
                        .strip_prefix("pub(crate) mod ")
                        .or_else(|| it.strip_prefix("pub mod "))
                        .or_else(|| it.strip_prefix("mod "))
                        .and_then(|r| r.strip_suffix(';'))
                    {
                        test_mods.push(name.trim().to_string());
                        break;
                    }
                }
                for c in it.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if (opened && depth <= 0) || (!opened && it.ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        if t.starts_with("//") {
            continue;
        }
        code.push_str(strip_line_comment(line));
        code.push('\n');
    }
    (code, test_mods)
}

/// What `code`, a file of module `module`, uses that the map does not allow it.
fn problems_in(module: &str, code: &str) -> Vec<String> {
    let Some((_, ok)) = ALLOWED.iter().find(|(m, _)| *m == module) else {
        return vec![format!("module {module} is not in the map")];
    };
    let (code, _) = non_test_code(code);
    uses(&code)
        .into_iter()
        .filter(|used| used != module && used != "gpu_kernels" && !ok.contains(&used.as_str()))
        .map(|used| format!("{module} uses {used}"))
        .collect()
}

/// The files (or folders) that hold test modules declared `#[cfg(test)] mod name;` in `file`.
fn test_module_paths(file: &Path, names: &[String]) -> Vec<PathBuf> {
    let dir = file.parent().expect("file in a folder");
    let stem = file.file_stem().unwrap_or_default().to_string_lossy();
    let base = if stem == "mod" || stem == "lib" {
        dir.to_path_buf()
    } else {
        dir.join(&*stem)
    };
    names
        .iter()
        .flat_map(|n| [base.join(format!("{n}.rs")), base.join(n)])
        .collect()
}

#[test]
fn modules_use_only_the_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found {} source files", files.len());
    let mut test_paths = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("readable source file");
        let (_, mods) = non_test_code(&text);
        test_paths.extend(test_module_paths(file, &mods));
    }
    let mut problems = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        // The crate root declares and re-exports the modules; tests may use anything;
        // binaries (`src/bin`) are crates of their own that see only the public API.
        if file == &src.join("lib.rs")
            || name == "tests.rs"
            || name == "test_util.rs"
            || test_paths.iter().any(|t| file.starts_with(t))
            || file.starts_with(src.join("bin"))
        {
            continue;
        }
        let module = module_of(&src, file);
        let text = fs::read_to_string(file).expect("readable source file");
        for p in problems_in(&module, &text) {
            problems.push(format!("{}: {p}", file.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
}

/// The module names in one cell of the table in `docs/ARCHITECTURE.md` that are modules of the
/// map: `` `a`, `b` `` or `a, b (why)`.
fn cell_modules(cell: &str) -> BTreeSet<String> {
    let mut plain = String::new();
    let mut depth = 0usize;
    for c in cell.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    plain
        .split(',')
        .map(|w| w.trim().trim_matches('`').trim().to_string())
        .filter(|w| ALLOWED.iter().any(|(m, _)| m == w))
        .collect()
}

#[test]
fn the_map_is_the_one_in_the_architecture_doc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = root.join("docs/ARCHITECTURE.md");
    if !root.join("Cargo.lock").exists() {
        eprintln!("not in the repository (a packaged crate): no docs/ARCHITECTURE.md to compare");
        return;
    }
    let text = fs::read_to_string(&doc).expect("docs/ARCHITECTURE.md in the repository");
    let mut rows = 0;
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("| module | may use | never |") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        if cells.len() < 3 || cells[0].trim().starts_with("---") {
            continue;
        }
        let (modules, may, never) = (cells[0], cell_modules(cells[1]), cell_modules(cells[2]));
        for m in modules.split(',').map(|m| m.trim().trim_matches('`')) {
            let Some((_, deps)) = ALLOWED.iter().find(|(a, _)| *a == m) else {
                panic!("docs/ARCHITECTURE.md names {m}, which the map here does not have");
            };
            rows += 1;
            for d in *deps {
                // A row of only words ("(pure)") lists no modules: it allows what the map does.
                assert!(
                    may.is_empty() || may.contains(*d),
                    "the map lets {m} use {d}; docs/ARCHITECTURE.md does not"
                );
                assert!(
                    !never.contains(*d),
                    "the map lets {m} use {d}; docs/ARCHITECTURE.md says never"
                );
            }
        }
    }
    assert!(
        rows >= 8,
        "found {rows} rows of the module table in docs/ARCHITECTURE.md"
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
    let nested = uses("use crate::{\n    driver::{self, Kernels},\n    schedule::{ring::{a, b}, Step},\n    exec,\n};\nuse $crate::comm::X;");
    let want: BTreeSet<String> = ["driver", "schedule", "exec"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(nested, want);
}

#[test]
fn a_planted_upward_import_is_caught() {
    // The import that once went unseen: after a `#[cfg(test)] mod tests;` line.
    let planted = "pub mod proxy;\n#[cfg(test)]\nmod tests;\n\nuse crate::plan::p2p::{Carry, NET_SLOTS};\nuse crate::{Error, Result};\n";
    assert_eq!(problems_in("transport", planted), ["transport uses plan"]);
    // Grouped and nested forms, and a path inside an expression.
    let grouped = "use crate::{driver::Kernels, exec::{ring, oneshot}};\n";
    assert_eq!(problems_in("transport", grouped), ["transport uses exec"]);
    let in_expr = "fn f() { let c = crate::comm::Communicator::x(); }\n";
    assert_eq!(problems_in("transport", in_expr), ["transport uses comm"]);
    let below = "use crate::{config::Config, debug, driver, error::Error, schedule::Step};\n";
    assert!(problems_in("transport", below).is_empty());
    // Every forbidden edge of the map is caught, for every module.
    for (module, deps) in ALLOWED {
        for (other, _) in ALLOWED {
            let code = format!("use crate::{{{other}::{{x, y}}}};\n");
            let found = problems_in(module, &code);
            let forbidden = other != module && !deps.contains(other);
            assert_eq!(
                !found.is_empty(),
                forbidden,
                "{module} using {other}: {found:?}"
            );
        }
    }
    // Test code, comments and `$crate` paths are not the module's code.
    let tests_only = "use crate::error::Error;\n// see crate::exec::ring\n/* crate::comm */\n#[cfg(test)]\nmod tests {\n    use crate::exec::ring;\n    fn f() { crate::comm::x(); }\n}\n";
    assert!(problems_in("transport", tests_only).is_empty());
}
