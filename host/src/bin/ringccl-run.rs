//! `ringccl-run`: starts one process per rank on this host, the way `torchrun` does.
//!
//! ```text
//! ringccl-run -n N [--master-addr A] [--master-port P] PROGRAM [ARGS...]
//! ```
//!
//! Each of the N children gets `RANK`, `LOCAL_RANK` (both its rank), `WORLD_SIZE` and
//! `LOCAL_WORLD_SIZE` (N), `MASTER_ADDR` (A, default `127.0.0.1`) and `MASTER_PORT`.
//! ringccl's rendezvous listens on `MASTER_PORT` + 1 (the `torchrun` convention, see
//! `ringccl::LaunchEnv`). Without `--master-port`, the launcher asks the system for
//! a free port F (binding port 0, then closing it) and sets `MASTER_PORT` = F − 1, so that the
//! rendezvous lands on F. `RINGCCL_COMM_ID` is removed from the children's environment (it
//! would win over these variables).
//!
//! Each line a child writes is prefixed with `[rank i] ` (stdout to stdout, stderr to stderr).
//! The launcher exits with the first non-zero exit status of a child (128 + the signal number
//! for a child killed by a signal), or 0. Once a child has failed, the others get 5 seconds to
//! exit, then are killed.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long the other ranks may run once one has failed.
const GRACE: Duration = Duration::from_secs(5);
/// How often the children are polled.
const POLL: Duration = Duration::from_millis(20);

const USAGE: &str =
    "usage: ringccl-run -n N [--master-addr ADDR] [--master-port PORT] PROGRAM [ARGS...]

Starts N processes of PROGRAM with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR (default 127.0.0.1) and MASTER_PORT set; ringccl's rendezvous uses
MASTER_PORT + 1 (default: a free port). Exits with the first non-zero exit status.";

struct Options {
    n: usize,
    addr: String,
    port: Option<u16>,
    program: OsString,
    args: Vec<OsString>,
}

fn parse(mut args: impl Iterator<Item = OsString>) -> Result<Option<Options>, String> {
    let mut n = None;
    let mut addr = "127.0.0.1".to_string();
    let mut port = None;
    let program = loop {
        let Some(arg) = args.next() else {
            return Err("no PROGRAM given".into());
        };
        let text = arg.to_string_lossy().into_owned();
        let (name, inline) = match text.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (text.clone(), None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args
                    .next()
                    .map(|v| v.to_string_lossy().into_owned())
                    .ok_or_else(|| format!("{what} needs a value")),
            }
        };
        match name.as_str() {
            "-h" | "--help" => return Ok(None),
            "-n" | "--nproc" | "--nproc-per-node" => {
                let v = value(&name)?;
                let k: usize = v
                    .parse()
                    .map_err(|_| format!("{name} {v}: expected a number"))?;
                if k == 0 {
                    return Err(format!("{name} {v}: at least one process"));
                }
                n = Some(k);
            }
            "--master-addr" => addr = value(&name)?,
            "--master-port" => {
                let v = value(&name)?;
                let p: u16 = v
                    .parse()
                    .ok()
                    .filter(|&p| p != 0 && p < u16::MAX)
                    .ok_or_else(|| format!("{name} {v}: expected a port in 1..=65534"))?;
                port = Some(p);
            }
            "--" => break args.next().ok_or("no PROGRAM given after --")?,
            s if s.starts_with('-') && s.len() > 1 => return Err(format!("unknown option {s}")),
            _ => break arg,
        }
    };
    let n = n.ok_or("-n N is required")?;
    Ok(Some(Options {
        n,
        addr,
        port,
        program,
        args: args.collect(),
    }))
}

/// `MASTER_PORT` for the children: the given one, or one below a free port.
fn master_port(o: &Options) -> io::Result<u16> {
    if let Some(p) = o.port {
        return Ok(p);
    }
    // Probe the way rank 0 will listen: on the address itself when it is loopback, else on
    // every interface.
    let ip = match o.addr.parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() => ip,
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    for _ in 0..16 {
        let free = TcpListener::bind(SocketAddr::new(ip, 0))?
            .local_addr()?
            .port();
        if free > 1 {
            return Ok(free - 1);
        }
    }
    Err(io::Error::other("no free port found"))
}

/// Copies `from` line by line to stdout or stderr, each line prefixed.
fn relay(from: impl Read + Send + 'static, rank: usize, to_stderr: bool) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            let mut out = format!("[rank {rank}] ").into_bytes();
            out.extend_from_slice(&line);
            // A closed stdout/stderr only loses the copy.
            let _ = if to_stderr {
                io::stderr().lock().write_all(&out)
            } else {
                io::stdout().lock().write_all(&out)
            };
        }
    })
}

/// The exit code a status stands for.
fn code(status: ExitStatus) -> i32 {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return 128 + sig;
        }
    }
    status.code().unwrap_or(1)
}

fn run(o: Options) -> Result<i32, String> {
    let port = master_port(&o).map_err(|e| format!("cannot pick a port: {e}"))?;
    let mut children: Vec<Option<Child>> = Vec::with_capacity(o.n);
    let mut relays = Vec::new();
    for rank in 0..o.n {
        let spawned = Command::new(&o.program)
            .args(&o.args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", o.n.to_string())
            .env("LOCAL_WORLD_SIZE", o.n.to_string())
            .env("MASTER_ADDR", &o.addr)
            .env("MASTER_PORT", port.to_string())
            .env_remove("RINGCCL_COMM_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(mut child) => {
                if let Some(out) = child.stdout.take() {
                    relays.push(relay(out, rank, false));
                }
                if let Some(err) = child.stderr.take() {
                    relays.push(relay(err, rank, true));
                }
                children.push(Some(child));
            }
            Err(e) => {
                for child in children.iter_mut().flatten() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(format!("cannot start {:?} for rank {rank}: {e}", o.program));
            }
        }
    }
    let mut failed: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            let status = match child.try_wait() {
                Ok(Some(status)) => code(status),
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("ringccl-run: cannot wait for rank {rank}: {e}");
                    let _ = child.kill();
                    1
                }
            };
            *slot = None;
            if status != 0 && failed.is_none() {
                failed = Some(status);
                kill_at = Some(Instant::now() + GRACE);
                eprintln!(
                    "ringccl-run: rank {rank} exited with status {status}; the other ranks are stopped in {} s unless they exit",
                    GRACE.as_secs()
                );
            }
        }
        if children.iter().all(Option::is_none) {
            break;
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for (rank, child) in children.iter_mut().enumerate() {
                if let Some(child) = child {
                    eprintln!("ringccl-run: stopping rank {rank}");
                    let _ = child.kill();
                }
            }
            kill_at = None;
        }
        thread::sleep(POLL);
    }
    for r in relays {
        let _ = r.join();
    }
    Ok(failed.unwrap_or(0))
}

fn main() -> ExitCode {
    let options = match parse(std::env::args_os().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ringccl-run: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(options) {
        // Exit statuses are 8 bits; a non-zero status must stay non-zero.
        Ok(status) => {
            let byte = (status & 0xff) as u8;
            ExitCode::from(if status != 0 && byte == 0 { 1 } else { byte })
        }
        Err(e) => {
            eprintln!("ringccl-run: {e}");
            ExitCode::from(127)
        }
    }
}
