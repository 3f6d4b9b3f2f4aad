//! The bootstrap across processes: `ringccl-run -n 3` starts this test binary three times (each
//! runs only `rank_entry`, as one rank), and the launcher forwards a failing rank's status.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ringccl::bootstrap::{Bootstrap, LaunchEnv};

/// Set by the tests below for the processes they start: `ok`, or `rank1-exits-3`.
const CHILD: &str = "RINGCCL_BOOTSTRAP_TEST_CHILD";

/// One rank of a launched job; does nothing in an ordinary test run.
#[test]
fn rank_entry() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let env = LaunchEnv::from_env()
        .unwrap()
        .expect("RANK and WORLD_SIZE set by ringccl-run");
    assert_eq!(env.local_rank, env.rank);
    if mode == "rank1-exits-3" && env.rank == 1 {
        std::process::exit(3);
    }
    let boot = Bootstrap::join_env(&env, Duration::from_secs(3)).unwrap();
    let table = boot
        .all_gather(format!("rank {}", env.rank).as_bytes())
        .unwrap();
    let want: Vec<Vec<u8>> = (0..env.world_size)
        .map(|r| format!("rank {r}").into_bytes())
        .collect();
    assert_eq!(table, want);
    boot.barrier().unwrap();
    println!("rank {} of {}: gathered", env.rank, env.world_size);
}

/// The launcher: where cargo built it (cargo builds it for this test), or in `../bin` next to
/// this test binary when the tests were copied elsewhere (`cargo xtask gpu-bundle` names it
/// `bin-ringccl-run`). Its absence fails the test.
fn launcher() -> Option<PathBuf> {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_ringccl-run"));
    let bin = std::env::current_exe()
        .ok()
        .and_then(|me| Some(me.parent()?.parent()?.join("bin")));
    let copied = bin
        .iter()
        .flat_map(|b| [b.join("ringccl-run"), b.join("bin-ringccl-run")])
        .collect::<Vec<_>>();
    let found = std::iter::once(built).chain(copied).find(|p| p.is_file());
    assert!(
        found.is_some(),
        "the ringccl-run binary is neither where cargo built it nor in ../bin"
    );
    found
}

/// Runs `ringccl-run -n 3 <this binary> rank_entry` with `mode`, killed after `limit`.
fn launch(run: &Path, mode: &str, limit: Duration) -> (Output, Duration) {
    let me = std::env::current_exe().unwrap();
    let t0 = Instant::now();
    let mut child = Command::new(run)
        .args(["-n", "3"])
        .arg(me)
        .args(["rank_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("ringccl-run did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out, t0.elapsed())
}

#[test]
fn three_processes_join_and_gather() {
    let Some(run) = launcher() else { return };
    let (out, took) = launch(&run, "ok", Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    for r in 0..3 {
        // The harness prints "test rank_entry ... " before the rank's own line.
        let (prefix, says) = (format!("[rank {r}] "), format!("rank {r} of 3: gathered"));
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&prefix) && l.contains(&says)),
            "{stdout}"
        );
    }
    println!("3 processes in {took:?}");
}

#[test]
fn a_failing_rank_s_status_is_forwarded_and_nothing_hangs() {
    let Some(run) = launcher() else { return };
    let (out, took) = launch(&run, "rank1-exits-3", Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    // The other ranks fail their join (timeout) or are stopped after the grace period.
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(stderr.contains("rank 1 exited with status 3"), "{stderr}");
}
