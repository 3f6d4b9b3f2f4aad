//! The measurements: buffers, data, checks and timing of ringccl and NCCL on the same buffers
//! and streams, interleaved size by size.
//!
//! ringccl is measured as a caller gets it by default: a [`Communicator::new`] over the GPUs,
//! buffers allocated on its streams, the collectives of its public API, no environment
//! variable set, and cudarc's event tracking as cudarc sets it (on: the communicator's
//! streams put each context in multi-stream mode, so every call also waits on and records
//! its buffers' events). `--untracked` turns the tracking off, as a program that orders its
//! streams by hand (like an NCCL program) may; `-G 1` does too, as any caller capturing ringccl
//! calls on cudarc buffers must: a capture cannot wait on an event recorded outside it.
//!
//! Started by a launcher (one process per GPU, [`super::procs`]), each process measures its
//! own rank: [`Communicator::from_env`] for ringccl, `ncclCommInitRank` for NCCL, each call
//! given this rank's buffer and stream; the ranks combine their results after every
//! measurement, and rank 0 prints and writes them.
//!
//! The parts: this file starts a run (one process driving every GPU, or one process per GPU)
//! and runs every sweep; `bench` holds a run's state and measures one size (check, then
//! timing); `calls` enqueues the collectives of both libraries; `verify` reads the outputs back
//! against the expected values; `timing` the events, warm-ups and timed iterations; `capture`
//! the CUDA graphs of `-G 1`; `print` the lines of the table around the rows.

mod bench;
mod calls;
mod capture;
mod print;
mod timing;
mod verify;

use cudarc::driver::CudaContext;
use ringccl::{CollectiveKind, Communicator, DataType, LaunchEnv, RedOp};

use super::args::{self, Libs, Options};
use super::coll;
use super::nccl::{self, Nccl};
use super::procs::{self, World};
use super::progress::Progress;
use super::report::{self, Gpu, Meta};
use super::svg;
use bench::Bench;

/// Graph replays timed per measurement in `-G 1` mode (after one untimed replay).
pub const GRAPH_REPLAYS: usize = 5;

/// Which library a measurement uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lib {
    Ringccl,
    Nccl,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::Ringccl => "ringccl",
            Lib::Nccl => "nccl",
        }
    }
}

/// The note a run with `--register` carries.
const REGISTER_NOTE: &str = "--register: ringccl's send and receive buffers are registered with \
    the communicator (Communicator::register) for each sweep; NCCL's are not";

/// The note a run with cudarc's event tracking off carries (`-G 1` or `--untracked`).
fn untracked_note(opts: &Options) -> String {
    if opts.graph {
        "-G 1: cudarc's event tracking is off for the buffers (a CUDA-graph capture cannot wait \
         on events recorded outside it)"
            .to_string()
    } else {
        "--untracked: cudarc's event tracking is off for the buffers".to_string()
    }
}

/// The whole run: prints the table, writes the files; `Ok(true)` when every element was right
/// and nothing failed. Started by a launcher, one process per GPU ([`super::procs`]); else one
/// process drives every GPU.
pub fn run(opts: Options, command: Vec<String>) -> Result<bool, String> {
    if let Some(&kind) = opts.colls.iter().find(|&&k| !coll::is_measured(k)) {
        return Err(not_measured(kind));
    }
    let launch = procs::launch(opts.procs, opts.ngpus, LaunchEnv::from_env())?;
    // cudarc panics when libcuda is missing: look first.
    // SAFETY: only probes whether the library can be loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        let rank = launch.map_or(String::new(), |e| format!("rank {}: ", e.rank));
        return Err(format!("{rank}{}", ringccl::Error::NoDriver));
    }
    match launch {
        Some(env) => {
            let rank = env.rank;
            run_procs(opts, command, &env).map_err(|e| format!("rank {rank}: {e}"))
        }
        None => run_single(opts, command),
    }
}

/// One process driving every GPU.
fn run_single(opts: Options, command: Vec<String>) -> Result<bool, String> {
    let visible = CudaContext::device_count()
        .map_err(|e| format!("cuDeviceGetCount failed with {:?}", e.0))?
        .max(0) as usize;
    let n = opts.ngpus.unwrap_or(visible);
    if visible == 0 || n > visible {
        return Err(ringccl::Error::TooFewDevices {
            needed: n.max(1),
            found: visible,
        }
        .to_string());
    }
    if opts.colls.iter().any(|c| c.has_root()) && opts.root >= n {
        return Err(format!("--root {} is not a rank of {n} GPU(s)", opts.root));
    }
    let ordinals: Vec<usize> = (0..n).collect();
    let comm = Communicator::new(&ordinals).map_err(|e| e.to_string())?;
    let mut notes = Vec::new();
    if opts.graph || opts.untracked {
        for r in 0..n {
            // SAFETY: every buffer ringccl-perf allocates (all of them after this) is used on
            // its rank's one stream only, and the streams are synchronised between phases and
            // before buffers are dropped, so cudarc's per-slice events are not needed (NCCL
            // gets none either).
            unsafe { comm.context(r).disable_event_tracking() };
        }
        notes.push(untracked_note(&opts));
    }
    if opts.register {
        notes.push(REGISTER_NOTE.to_string());
    }
    let mut libs = opts.libs;
    let nccl = if libs.nccl {
        match Nccl::new(&ordinals) {
            Ok(c) => Some(c),
            Err(e) if libs.ringccl => {
                notes.push(format!("NCCL unavailable ({e}): measuring ringccl only"));
                libs.nccl = false;
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };

    let mut driver_version = 0i32;
    // SAFETY: writes one int.
    let driver_version = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .ok()
        .map(|_| driver_version);
    let meta = Meta {
        date: report::utc_now(),
        command,
        gpus: (0..n)
            .map(|r| {
                let name = comm.context(r).name().unwrap_or_else(|_| "unknown".into());
                Gpu {
                    ordinal: comm.ordinal(r),
                    name,
                }
            })
            .collect(),
        driver_version,
        nccl_version: nccl::version().map(|v| v.0),
        ringccl_version: env!("CARGO_PKG_VERSION").to_string(),
        iters: opts.iters,
        warmup: opts.warmup,
        check_iters: opts.check_iters,
        graph_requested: opts.graph,
        notes,
        procs: 1,
    };
    execute(
        &opts,
        Run {
            comm: &comm,
            nccl,
            n,
            local: ordinals,
            libs,
            meta,
            world: None,
        },
    )
}

/// One process per GPU: this process is rank `RANK` of `WORLD_SIZE` on GPU `LOCAL_RANK`.
fn run_procs(opts: Options, command: Vec<String>, env: &LaunchEnv) -> Result<bool, String> {
    let (n, rank) = (env.world_size, env.rank);
    if opts.colls.iter().any(|c| c.has_root()) && opts.root >= n {
        return Err(format!(
            "--root {} is not a rank of {n} process(es)",
            opts.root
        ));
    }
    // ringccl-perf's own world first (one port above the communicator's rendezvous), then
    // NCCL's id through it, then the communicator.
    let world = World::join(env)?;
    let mut notes = Vec::new();
    let mut libs = opts.libs;
    let nccl_id = if libs.nccl {
        let mine = if rank == 0 {
            procs::encode_id(nccl::unique_id())
        } else {
            Vec::new()
        };
        let all = world.gather(&mine)?;
        Some(procs::decode_id(all.first().map_or(&[][..], Vec::as_slice)))
    } else {
        None
    };
    let comm = Communicator::from_env().map_err(|e| e.to_string())?;
    if opts.graph || opts.untracked {
        // SAFETY: as in `run_single`: every buffer is used on this rank's one stream only.
        unsafe { comm.context(rank).disable_event_tracking() };
        notes.push(untracked_note(&opts));
    }
    if opts.register {
        notes.push(REGISTER_NOTE.to_string());
    }
    let nccl = match nccl_id {
        None => None,
        Some(id) => {
            // Every rank can load NCCL and holds the id before any waits in ncclCommInitRank.
            let ready = id.and_then(|id| nccl::check_loaded().map(|()| id));
            let ready = match world.agree(ready.as_ref().map(drop).map_err(Clone::clone))? {
                Ok(()) => ready,
                Err(e) => Err(e),
            };
            let made = ready.and_then(|id| Nccl::init_rank(&id, n, rank, comm.context(rank)));
            let agreed = world.agree(made.as_ref().map(drop).map_err(Clone::clone))?;
            match (made, agreed) {
                (Ok(c), Ok(())) => Some(c),
                (_, Err(e)) | (Err(e), _) if libs.ringccl => {
                    notes.push(format!("NCCL unavailable ({e}): measuring ringccl only"));
                    libs.nccl = false;
                    None
                }
                (_, Err(e)) | (Err(e), _) => return Err(e),
            }
        }
    };
    let mut driver_version = 0i32;
    // SAFETY: writes one int.
    let driver_version = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .ok()
        .map(|_| driver_version);
    let name = comm
        .context(rank)
        .name()
        .unwrap_or_else(|_| "unknown".into());
    let gpus = world
        .gather(format!("{}\t{name}", comm.ordinal(rank)).as_bytes())?
        .iter()
        .map(|b| {
            let text = String::from_utf8_lossy(b);
            let (ordinal, name) = text.split_once('\t').unwrap_or(("", "unknown"));
            Gpu {
                ordinal: ordinal.parse().unwrap_or(usize::MAX),
                name: name.to_string(),
            }
        })
        .collect();
    let meta = Meta {
        date: report::utc_now(),
        command,
        gpus,
        driver_version,
        nccl_version: nccl::version().map(|v| v.0),
        ringccl_version: env!("CARGO_PKG_VERSION").to_string(),
        iters: opts.iters,
        warmup: opts.warmup,
        check_iters: opts.check_iters,
        graph_requested: opts.graph,
        notes,
        procs: n,
    };
    let ok = execute(
        &opts,
        Run {
            comm: &comm,
            nccl,
            n,
            local: vec![rank],
            libs,
            meta,
            world: Some(&world),
        },
    )?;
    // Every rank is done with the communicators before any leaves.
    world.agree(Ok(()))?.map(|()| ok)
}

/// What [`execute`] measures with.
struct Run<'a> {
    comm: &'a Communicator,
    nccl: Option<Nccl>,
    /// The ranks of the world.
    n: usize,
    /// The ranks this process drives.
    local: Vec<usize>,
    libs: Libs,
    meta: Meta,
    /// ringccl-perf's world, one process per GPU.
    world: Option<&'a World>,
}

/// Every sweep; the table (on rank 0) and the files (written by rank 0).
fn execute(opts: &Options, run: Run<'_>) -> Result<bool, String> {
    let Run {
        comm,
        nccl,
        n,
        local,
        libs,
        meta,
        world,
    } = run;
    let quiet = world.is_some_and(|w| w.rank() != 0);
    let opts = opts.clone();
    let sizes = args::sizes(&opts);
    let steps: usize = opts
        .colls
        .iter()
        .map(|c| opts.dtypes.len() * if c.has_op() { opts.ops.len() } else { 1 } * sizes.len())
        .sum();
    let mut bench = Bench {
        comm,
        nccl: nccl.as_ref(),
        n,
        events: local.iter().map(|_| Vec::new()).collect(),
        local,
        opts: &opts,
        ringccl: libs.ringccl,
        records: Vec::new(),
        notes: meta.notes.clone(),
        progress: Progress::new(steps, opts.progress && !quiet),
        failures: 0,
        world,
        quiet,
        fatal: None,
    };
    if !quiet {
        print!("{}", print::preamble(&opts, &meta, &sizes));
    }
    for &kind in &opts.colls {
        for &dtype in &opts.dtypes {
            let ops: Vec<Option<RedOp>> = if kind.has_op() {
                opts.ops.iter().copied().map(Some).collect()
            } else {
                vec![None]
            };
            let res = match dtype {
                DataType::F32 => bench.sweep::<f32>(kind, &ops, &sizes),
                DataType::F64 => bench.sweep::<f64>(kind, &ops, &sizes),
                DataType::F16 => bench.sweep::<half::f16>(kind, &ops, &sizes),
                DataType::BF16 => bench.sweep::<half::bf16>(kind, &ops, &sizes),
                DataType::I8 => bench.sweep::<i8>(kind, &ops, &sizes),
                DataType::U8 => bench.sweep::<u8>(kind, &ops, &sizes),
                DataType::I32 => bench.sweep::<i32>(kind, &ops, &sizes),
                DataType::U32 => bench.sweep::<u32>(kind, &ops, &sizes),
                DataType::I64 => bench.sweep::<i64>(kind, &ops, &sizes),
                DataType::U64 => bench.sweep::<u64>(kind, &ops, &sizes),
                // `parse_dtype` offers no fp8 type: its data patterns are not written.
                DataType::F8E4M3 | DataType::F8E5M2 => {
                    Err(format!("{} is not measured by this tool", dtype.name()))
                }
            };
            if let Some(e) = bench.fatal.take() {
                bench.progress.finish();
                let _ = comm.synchronize();
                return Err(e);
            }
            if let Err(e) = res {
                bench.say(|| println!("# {} {}: {e}", kind.name(), dtype.name()));
                bench.failures += 1;
            }
        }
    }
    bench.progress.finish();
    // Everything finishes before the communicators and buffers go.
    let _ = comm.synchronize();

    let records = std::mem::take(&mut bench.records);
    let mut meta = meta;
    meta.notes = std::mem::take(&mut bench.notes);
    let failures = bench.failures;
    drop(bench);
    drop(nccl);
    let wrong: usize = records.iter().filter_map(|r| r.wrong).sum();
    let errors = records.iter().filter(|r| r.error.is_some()).count() + failures;
    if quiet {
        return Ok(wrong == 0 && errors == 0);
    }
    print!("{}", print::summary(&records, &meta, wrong, errors));

    if let Some(p) = &opts.json {
        std::fs::write(p, report::to_json(&meta, &records)?)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    if let Some(p) = &opts.csv {
        std::fs::write(p, report::to_csv(&records)?)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    if let Some(p) = &opts.svg {
        std::fs::write(p, svg::plot(&records, n)?)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(wrong == 0 && errors == 0)
}

fn drv<T>(what: &str, r: Result<T, cudarc::driver::DriverError>) -> Result<T, String> {
    r.map_err(|e| format!("{what} failed with {:?}", e.0))
}

/// The error for a collective that ringccl-perf does not measure.
fn not_measured(kind: CollectiveKind) -> String {
    format!("ringccl-perf does not measure {kind}")
}
