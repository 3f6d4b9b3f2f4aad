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

use std::fmt::Write as _;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, CudaView, CudaViewMut,
};
use ringccl::{CollectiveKind, Communicator, DataType, DeviceSlice, Io, LaunchEnv, PeerOp, RedOp};

use super::args::{self, nccl_dtype_name, Libs, Options};
use super::coll::{self, Shape};
use super::data::{self, Pattern, PerfElem};
use super::nccl::{self, Nccl};
use super::procs::{self, Outcome, World};
use super::progress::Progress;
use super::report::{self, Gpu, Meta, Record, Stats};
use super::svg;

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

/// The whole run: prints the table, writes the files; `Ok(true)` when every element was right
/// and nothing failed. Started by a launcher, one process per GPU ([`super::procs`]); else one
/// process drives every GPU.
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
        print_preamble(&opts, &meta, &sizes);
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
    print_summary(&records, &meta, wrong, errors);

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

fn print_preamble(opts: &Options, meta: &Meta, sizes: &[usize]) {
    println!(
        "# ringccl-perf {}  minBytes {} maxBytes {} step: {}(factor) sizes: {} warmup iters: {} iters: {} check iters: {} graph: {}",
        meta.ringccl_version,
        opts.min_bytes,
        opts.max_bytes,
        opts.factor,
        sizes.len(),
        opts.warmup,
        opts.iters,
        opts.check_iters,
        u8::from(opts.graph)
    );
    println!("#");
    println!("# Using devices");
    for (r, g) in meta.gpus.iter().enumerate() {
        println!("#  Rank {r:2} device {:2} [{}]", g.ordinal, g.name);
    }
    if meta.procs > 1 {
        println!("# One process per GPU: {} processes", meta.procs);
    }
    println!(
        "# CUDA driver {}  NCCL {}",
        meta.driver_version
            .map_or("unknown".to_string(), |v| format!(
                "{}.{} ({v})",
                v / 1000,
                (v % 1000) / 10
            )),
        meta.nccl_version.as_deref().unwrap_or("not loaded")
    );
    for note in &meta.notes {
        println!("# note: {note}");
    }
}

fn print_summary(records: &[Record], meta: &Meta, wrong: usize, errors: usize) {
    println!("#");
    for note in &meta.notes {
        println!("# note: {note}");
    }
    println!(
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    );
    if errors > 0 {
        println!("# Errors               : {errors} measurement(s) failed");
    }
    for lib in ["ringccl", "nccl"] {
        let bw: Vec<f64> = records
            .iter()
            .filter(|r| r.lib == lib && r.error.is_none() && r.busbw.is_finite() && r.bytes > 0)
            .map(|r| r.busbw)
            .collect();
        if !bw.is_empty() {
            println!(
                "# Avg bus bandwidth ({lib:7}) : {:.3} GB/s",
                bw.iter().sum::<f64>() / bw.len() as f64
            );
        }
    }
    println!("#");
}

/// The state of a run.
struct Bench<'a> {
    comm: &'a Communicator,
    nccl: Option<&'a Nccl>,
    /// The ranks of the world.
    n: usize,
    /// The ranks this process drives (every rank, or one process's): per-rank vectors (events,
    /// buffers, inputs, streams) follow this order.
    local: Vec<usize>,
    opts: &'a Options,
    ringccl: bool,
    /// Timing events per local rank (grown on demand).
    events: Vec<Vec<CudaEvent>>,
    records: Vec<Record>,
    notes: Vec<String>,
    progress: Progress,
    /// Sweeps that could not run at all (allocation failures...).
    failures: usize,
    /// ringccl-perf's world, one process per GPU.
    world: Option<&'a World>,
    /// Not rank 0 of a world of processes: prints nothing.
    quiet: bool,
    /// Why the ranks can no longer exchange results (the run stops).
    fatal: Option<String>,
}

/// The local ranks' two buffers each: `a` (send) and `b` (receive, and the one buffer in
/// place).
struct Bufs<T> {
    a: Vec<CudaSlice<T>>,
    b: Vec<CudaSlice<T>>,
    a_ptr: Vec<u64>,
    b_ptr: Vec<u64>,
}

/// What a measurement checks against.
struct Expect<'t> {
    pat: Pattern,
    /// One period of the reduced values (reductions only).
    table: &'t [f64],
    tol: f64,
}

fn drv<T>(what: &str, r: Result<T, cudarc::driver::DriverError>) -> Result<T, String> {
    r.map_err(|e| format!("{what} failed with {:?}", e.0))
}

/// The error for a collective that ringccl-perf does not measure.
fn not_measured(kind: CollectiveKind) -> String {
    format!("ringccl-perf does not measure {kind}")
}

/// Elements of the one in-place buffer, and the offset (elements) of rank `r`'s input in it.
fn in_place_layout(kind: CollectiveKind, s: &Shape, r: usize) -> (usize, usize) {
    use CollectiveKind as K;
    match kind {
        K::AllReduce | K::Broadcast | K::Reduce | K::SendRecv => (s.count, 0),
        K::ReduceScatter | K::Scatter => (s.send, 0),
        K::AllGather | K::Gather => (s.recv, r * s.count),
        K::AllToAll => (s.recv, 0),
    }
}

impl Bench<'_> {
    fn streams(&self) -> Vec<&Arc<CudaStream>> {
        self.local.iter().map(|&r| self.comm.stream(r)).collect()
    }

    /// Prints, unless another rank does.
    fn say(&self, f: impl FnOnce()) {
        if !self.quiet {
            self.progress.suspend(f);
        }
    }

    /// `mine`, or the first failure of any rank when the ranks are processes (every rank
    /// gets the same answer). A failed exchange is also recorded as [`Bench::fatal`].
    fn agree<X>(&mut self, mine: Result<X, String>) -> Result<X, String> {
        let Some(world) = self.world else {
            return mine;
        };
        match world.agree(mine.as_ref().map(drop).map_err(Clone::clone)) {
            Ok(Ok(())) => mine,
            Ok(Err(e)) => Err(e),
            Err(e) => {
                self.fatal.get_or_insert_with(|| e.clone());
                Err(e)
            }
        }
    }

    /// `mine`, combined with every other rank's when the ranks are processes.
    fn combine(&mut self, mine: Outcome) -> Outcome {
        let Some(world) = self.world else {
            return mine;
        };
        match world.combine(&mine) {
            Ok(o) => o,
            Err(e) => {
                self.fatal.get_or_insert_with(|| e.clone());
                Outcome::failed(e)
            }
        }
    }

    fn sync(&self) -> Result<(), String> {
        self.comm.synchronize().map_err(|e| e.to_string())
    }

    fn libs(&self) -> Vec<Lib> {
        let mut v = Vec::new();
        if self.ringccl {
            v.push(Lib::Ringccl);
        }
        if self.nccl.is_some() {
            v.push(Lib::Nccl);
        }
        v
    }

    fn note(&mut self, s: String) {
        if !self.notes.contains(&s) {
            self.say(|| println!("# note: {s}"));
            self.notes.push(s);
        }
    }

    /// Every size of one collective and type, for each operator.
    fn sweep<T: PerfElem>(
        &mut self,
        kind: CollectiveKind,
        ops: &[Option<RedOp>],
        sizes: &[usize],
    ) -> Result<(), String> {
        if !coll::is_measured(kind) {
            return Err(not_measured(kind));
        }
        let n = self.n;
        let elt = T::DTYPE.size();
        let shapes: Vec<Shape> = sizes
            .iter()
            .map(|&b| coll::shape(kind, b, elt, n))
            .collect();
        let a_len = shapes.iter().map(|s| s.send).max().unwrap_or(0).max(1);
        let b_len = shapes
            .iter()
            .map(|s| s.send.max(s.recv))
            .max()
            .unwrap_or(0)
            .max(1);
        let alloc = (|| -> Result<Bufs<T>, String> {
            let mut bufs = Bufs::<T> {
                a: Vec::new(),
                b: Vec::new(),
                a_ptr: Vec::new(),
                b_ptr: Vec::new(),
            };
            for &r in &self.local {
                let s = self.comm.stream(r);
                let a = drv("cuMemAlloc (send buffer)", s.alloc_zeros::<T>(a_len))?;
                let b = drv("cuMemAlloc (receive buffer)", s.alloc_zeros::<T>(b_len))?;
                bufs.a_ptr.push(DeviceSlice::<T>::raw(&a).ptr);
                bufs.b_ptr.push(DeviceSlice::<T>::raw(&b).ptr);
                bufs.a.push(a);
                bufs.b.push(b);
            }
            self.sync()?;
            Ok(bufs)
        })();
        let mut bufs = self.agree(alloc)?;
        let tname = nccl_dtype_name(T::DTYPE);
        let both = self.libs().len() == 2;
        for &op in ops {
            self.say(|| {
                println!("#");
                println!(
                    "# Collective: {}   type: {} ({})   op: {}   root: {}   ranks: {}",
                    kind.name(),
                    tname,
                    T::DTYPE.name(),
                    op.map_or("none", RedOp::name),
                    if kind.has_root() {
                        self.opts.root.to_string()
                    } else {
                        "-".into()
                    },
                    n
                );
                println!("{}", report::table_header(both));
            });
            let pat = match op {
                Some(op) => Pattern::reduction(op, n, T::LIMIT),
                None => Pattern::copy(T::LIMIT),
            };
            let table = match op {
                Some(op) => pat.reduced_table(op, n),
                None => Vec::new(),
            };
            let tol = op.map_or(0.0, |op| data::tolerance(op, n, T::SIG_BITS));
            let expect = Expect {
                pat,
                table: &table,
                tol,
            };
            for (&bytes, shape) in sizes.iter().zip(&shapes) {
                let label = format!(
                    "{} {} {} {} B",
                    kind.name(),
                    T::DTYPE.name(),
                    op.map_or("none", RedOp::name),
                    bytes
                );
                self.progress.show(&label);
                let inputs = self.inputs::<T>(kind, shape, pat);
                let mut rows: Vec<(Lib, Option<Record>, Option<Record>)> = Vec::new();
                for lib in self.libs() {
                    let oop =
                        self.measure(lib, kind, shape, op, false, &mut bufs, &inputs, &expect);
                    let ip = if kind.has_in_place() {
                        Some(self.measure(lib, kind, shape, op, true, &mut bufs, &inputs, &expect))
                    } else {
                        None
                    };
                    rows.push((lib, Some(oop), ip));
                }
                let find = |l: Lib, ip: bool| {
                    rows.iter().find(|(x, _, _)| *x == l).and_then(|(_, o, i)| {
                        if ip {
                            i.as_ref()
                        } else {
                            o.as_ref()
                        }
                    })
                };
                let mut out = String::new();
                for (lib, oop, ip) in &rows {
                    let ratios = both.then(|| {
                        if *lib == Lib::Ringccl {
                            (
                                report::ratio(find(Lib::Ringccl, false), find(Lib::Nccl, false)),
                                report::ratio(find(Lib::Ringccl, true), find(Lib::Nccl, true)),
                            )
                        } else {
                            (String::new(), String::new())
                        }
                    });
                    let _ = writeln!(
                        out,
                        "{}",
                        report::table_row(
                            shape.bytes,
                            shape.elems,
                            tname,
                            op.map_or("none", RedOp::name),
                            kind.has_root().then_some(self.opts.root),
                            lib.name(),
                            oop.as_ref(),
                            ip.as_ref(),
                            ratios,
                        )
                    );
                }
                for (_, oop, ip) in &rows {
                    for r in [oop, ip].into_iter().flatten() {
                        if let Some(e) = &r.error {
                            let _ = writeln!(
                                out,
                                "#   {} {} {}: {e}",
                                r.lib,
                                if r.inplace {
                                    "in-place"
                                } else {
                                    "out-of-place"
                                },
                                r.bytes
                            );
                        }
                    }
                }
                self.say(|| print!("{out}"));
                for (_, oop, ip) in rows {
                    self.records.extend(oop);
                    self.records.extend(ip);
                }
                self.progress.step();
                if let Some(e) = &self.fatal {
                    return Err(e.clone());
                }
            }
        }
        // Nothing may still use the buffers when they are freed.
        self.sync()?;
        Ok(())
    }

    /// Every local rank's send data for `shape` (only the root's for broadcast).
    fn inputs<T: PerfElem>(
        &self,
        kind: CollectiveKind,
        shape: &Shape,
        pat: Pattern,
    ) -> Vec<Vec<T>> {
        let root = self.opts.root;
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .local
                .iter()
                .map(|&r| {
                    let len = if kind == CollectiveKind::Broadcast && r != root {
                        0
                    } else {
                        shape.send
                    };
                    s.spawn(move || data::fill::<T>(pat, r, 0, len))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        })
    }

    /// One measurement (check, then timing); failures become the record's error.
    #[allow(clippy::too_many_arguments)]
    fn measure<T: PerfElem>(
        &mut self,
        lib: Lib,
        kind: CollectiveKind,
        shape: &Shape,
        op: Option<RedOp>,
        inplace: bool,
        bufs: &mut Bufs<T>,
        inputs: &[Vec<T>],
        expect: &Expect<'_>,
    ) -> Record {
        let n = self.n;
        let mut rec = Record {
            collective: kind.name(),
            dtype: T::DTYPE.name(),
            op: op.map_or("none", RedOp::name),
            root: kind.has_root().then_some(self.opts.root),
            bytes: shape.bytes,
            count: shape.elems,
            lib: lib.name(),
            inplace,
            time_us: f64::NAN,
            time_us_min: f64::NAN,
            time_us_mean: f64::NAN,
            algbw: f64::NAN,
            busbw: f64::NAN,
            wrong: None,
            ngpus: n,
            graph: false,
            samples: 0,
            error: None,
            procs: self.world.map_or(1, World::nranks),
        };
        let mut checked = None;
        let result = (|| -> Result<(Vec<f64>, bool), String> {
            if self.opts.check_iters > 0 {
                let mut wrong = 0;
                for _ in 0..self.opts.check_iters {
                    self.prepare(kind, shape, inplace, bufs, inputs)?;
                    self.launch(lib, kind, shape, op, inplace, bufs)?;
                    wrong += self.verify(kind, shape, inplace, bufs, expect)?;
                }
                checked = Some(wrong);
            }
            self.time(lib, kind, shape, op, inplace, bufs)
        })();
        let mine = match result {
            Ok((times, graph)) => Outcome {
                wrong: checked,
                times,
                graph,
                error: None,
            },
            Err(e) => {
                // Leave the streams idle for the next measurement (errors here are reported
                // by the next one).
                let _ = self.comm.synchronize();
                Outcome {
                    wrong: checked,
                    error: Some(e),
                    ..Outcome::default()
                }
            }
        };
        // One process per GPU: the slowest rank's times, every rank's wrong elements.
        let all = self.combine(mine);
        rec.wrong = all.wrong;
        match all.error {
            Some(e) => rec.error = Some(e),
            None => {
                let st = Stats::of(&all.times);
                let (algbw, busbw) =
                    report::bandwidths(shape.bytes, st.median, coll::busbw_factor(kind, n));
                rec.time_us = st.median;
                rec.time_us_min = st.min;
                rec.time_us_mean = st.mean;
                rec.algbw = algbw;
                rec.busbw = busbw;
                rec.graph = all.graph;
                rec.samples = all.times.len();
            }
        }
        rec
    }

    /// Writes the inputs and poisons the outputs (all-ones bytes: NaN, -1 or MAX).
    fn prepare<T: PerfElem>(
        &self,
        kind: CollectiveKind,
        shape: &Shape,
        inplace: bool,
        bufs: &mut Bufs<T>,
        inputs: &[Vec<T>],
    ) -> Result<(), String> {
        let elt = T::DTYPE.size();
        for (i, (input, &r)) in inputs.iter().zip(&self.local).enumerate() {
            let s = self.comm.stream(r);
            let (poison_len, in_off) = if inplace {
                in_place_layout(kind, shape, r)
            } else {
                (shape.recv, 0)
            };
            if poison_len > 0 {
                drv("cuCtxSetCurrent", s.context().bind_to_thread())?;
                // SAFETY: `b_ptr[i]` is rank r's receive buffer, at least `poison_len`
                // elements long (sized for the largest shape); the stream is rank r's.
                drv("cuMemsetD8Async", unsafe {
                    cudarc::driver::result::memset_d8_async(
                        bufs.b_ptr[i],
                        0xff,
                        poison_len * elt,
                        s.cu_stream(),
                    )
                })?;
            }
            if input.is_empty() {
                continue;
            }
            if inplace {
                let mut dst = bufs.b[i].slice_mut(in_off..in_off + input.len());
                drv("cuMemcpyHtoDAsync", s.memcpy_htod(input, &mut dst))?;
            } else {
                let mut dst = bufs.a[i].slice_mut(0..input.len());
                drv("cuMemcpyHtoDAsync", s.memcpy_htod(input, &mut dst))?;
            }
        }
        Ok(())
    }

    /// Enqueues one call of the collective on every rank.
    fn launch<T: PerfElem>(
        &self,
        lib: Lib,
        kind: CollectiveKind,
        shape: &Shape,
        op: Option<RedOp>,
        inplace: bool,
        bufs: &mut Bufs<T>,
    ) -> Result<(), String> {
        let op = op.unwrap_or(RedOp::Sum);
        let root = self.opts.root;
        match lib {
            Lib::Ringccl => {
                let streams = self.streams();
                if kind == CollectiveKind::SendRecv {
                    return self.ringccl_ring_shift(shape, bufs, &streams);
                }
                if inplace {
                    let len = in_place_layout(kind, shape, 0).0;
                    let mut views: Vec<CudaViewMut<'_, T>> =
                        bufs.b.iter_mut().map(|b| b.slice_mut(0..len)).collect();
                    let mut io: Vec<Io<'_, T>> = views.iter_mut().map(Io::in_place).collect();
                    self.ringccl_call(kind, &mut io, shape.count, op, &streams)
                } else {
                    let send: Vec<CudaView<'_, T>> =
                        bufs.a.iter().map(|a| a.slice(0..shape.send)).collect();
                    let mut recv: Vec<CudaViewMut<'_, T>> = bufs
                        .b
                        .iter_mut()
                        .map(|b| b.slice_mut(0..shape.recv))
                        .collect();
                    let mut io: Vec<Io<'_, T>> = send
                        .iter()
                        .zip(recv.iter_mut())
                        .zip(&self.local)
                        .map(|((s, d), &r)| match kind {
                            CollectiveKind::Broadcast if r != root => Io::recv_only(d),
                            CollectiveKind::Reduce if r != root => Io::send_only(s),
                            _ => Io::out_of_place(s, d),
                        })
                        .collect();
                    self.ringccl_call(kind, &mut io, shape.count, op, &streams)
                }
            }
            Lib::Nccl => {
                let Some(nccl) = self.nccl else {
                    return Err("NCCL is not loaded".into());
                };
                let elt = T::DTYPE.size() as u64;
                let (send, recv): (Vec<u64>, Vec<u64>) = self
                    .local
                    .iter()
                    .enumerate()
                    .map(|(i, &r)| {
                        let (a, b) = (bufs.a_ptr[i], bufs.b_ptr[i]);
                        let block = (r * shape.count) as u64 * elt;
                        if !inplace {
                            (a, b)
                        } else {
                            match kind {
                                CollectiveKind::ReduceScatter => (b, b + block),
                                CollectiveKind::AllGather => (b + block, b),
                                _ => (b, b),
                            }
                        }
                    })
                    .unzip();
                let streams: Vec<&CudaStream> =
                    self.streams().into_iter().map(|s| s.as_ref()).collect();
                nccl.enqueue(
                    kind,
                    shape,
                    T::NCCL,
                    T::DTYPE.size(),
                    op,
                    root,
                    &send,
                    &recv,
                    &streams,
                )
                .map_err(|e| format!("NCCL: {e}"))
            }
        }
    }

    /// send/recv as nccl-tests' `sendrecv_perf`: every rank sends its buffer to the next rank
    /// and receives the previous rank's, in one group ([`ringccl::PeerOp`]s).
    fn ringccl_ring_shift<T: PerfElem>(
        &self,
        shape: &Shape,
        bufs: &mut Bufs<T>,
        streams: &[&Arc<CudaStream>],
    ) -> Result<(), String> {
        let (n, c) = (self.n, shape.count);
        let mut ops = Vec::with_capacity(2 * self.local.len());
        for ((a, b), &r) in bufs.a.iter().zip(bufs.b.iter_mut()).zip(&self.local) {
            ops.push(PeerOp::send(r, (r + 1) % n, a, c));
            ops.push(PeerOp::recv(r, (r + n - 1) % n, b, c));
        }
        self.comm
            .peer_ops(&mut ops, streams)
            .map_err(|e| e.to_string())
    }

    fn ringccl_call<T: PerfElem>(
        &self,
        kind: CollectiveKind,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        streams: &[&Arc<CudaStream>],
    ) -> Result<(), String> {
        let c = self.comm;
        let root = self.opts.root;
        use CollectiveKind as K;
        match kind {
            K::AllReduce => c.all_reduce(io, count, op, streams),
            K::ReduceScatter => c.reduce_scatter(io, count, op, streams),
            K::AllGather => c.all_gather(io, count, streams),
            K::Broadcast => c.broadcast(io, count, root, streams),
            K::Reduce => c.reduce(io, count, op, root, streams),
            K::AllToAll => c.all_to_all(io, count, streams),
            // send/recv goes through `ringccl_ring_shift`.
            K::Gather | K::Scatter | K::SendRecv => return Err(not_measured(kind)),
        }
        .map_err(|e| e.to_string())
    }

    /// Waits for the call, reads every output back and counts the wrong elements.
    fn verify<T: PerfElem>(
        &self,
        kind: CollectiveKind,
        shape: &Shape,
        inplace: bool,
        bufs: &mut Bufs<T>,
        expect: &Expect<'_>,
    ) -> Result<usize, String> {
        use CollectiveKind as K;
        self.sync()?;
        let (root, count, n) = (self.opts.root, shape.count, self.n);
        let Expect { pat, table, tol } = *expect;
        let period = table.len().max(1);
        std::thread::scope(|sc| -> Result<usize, String> {
            let mut handles = Vec::new();
            for (i, &r) in self.local.iter().enumerate() {
                if kind == CollectiveKind::Reduce && r != root {
                    continue;
                }
                let (off, len) = match (kind, inplace) {
                    (CollectiveKind::ReduceScatter, true) => (r * count, count),
                    (_, true) => (0, in_place_layout(kind, shape, r).0),
                    (_, false) => (0, shape.recv),
                };
                if len == 0 {
                    continue;
                }
                let got = drv(
                    "cuMemcpyDtoH",
                    self.comm
                        .stream(r)
                        .clone_dtoh(&bufs.b[i].slice(off..off + len)),
                )?;
                handles.push(sc.spawn(move || {
                    data::count_wrong(&got, tol, |j| match kind {
                        K::AllReduce | K::Reduce => table[j % period],
                        K::ReduceScatter => table[(r * count + j) % period],
                        K::AllGather => pat.value(j / count, j % count),
                        K::Broadcast => pat.value(root, j),
                        K::AllToAll => pat.value(j / count, r * count + j % count),
                        K::SendRecv => pat.value((r + n - 1) % n, j),
                        // Not measured: `sweep` refuses them before any launch.
                        K::Gather | K::Scatter => f64::NAN,
                    })
                }));
            }
            let mut wrong = 0;
            for h in handles {
                wrong += h
                    .join()
                    .map_err(|_| "the check thread panicked".to_string())?;
            }
            Ok(wrong)
        })
    }

    /// Makes sure every rank has `k` timing events.
    fn ensure_events(&mut self, k: usize) -> Result<(), String> {
        for (i, &r) in self.local.iter().enumerate() {
            while self.events[i].len() < k {
                let e = drv(
                    "cuEventCreate",
                    self.comm
                        .context(r)
                        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
                )?;
                self.events[i].push(e);
            }
        }
        Ok(())
    }

    fn record_all(&self, k: usize) -> Result<(), String> {
        for (i, &r) in self.local.iter().enumerate() {
            drv(
                "cuEventRecord",
                self.events[i][k].record(self.comm.stream(r)),
            )?;
        }
        Ok(())
    }

    /// Per-sample times (µs, slowest local rank) between boundary events `0..=samples`,
    /// divided by `per`.
    fn read_times(&self, samples: usize, per: usize) -> Result<Vec<f64>, String> {
        self.sync()?;
        let mut times = vec![0.0f64; samples];
        for events in &self.events {
            for (k, t) in times.iter_mut().enumerate() {
                let ms = drv("cuEventElapsedTime", events[k].elapsed_ms(&events[k + 1]))?;
                *t = t.max(ms as f64 * 1000.0 / per.max(1) as f64);
            }
        }
        Ok(times)
    }

    /// Warm-ups, then the timed iterations (or graph replays); returns the per-iteration
    /// times and whether they come from a graph.
    fn time<T: PerfElem>(
        &mut self,
        lib: Lib,
        kind: CollectiveKind,
        shape: &Shape,
        op: Option<RedOp>,
        inplace: bool,
        bufs: &mut Bufs<T>,
    ) -> Result<(Vec<f64>, bool), String> {
        let iters = self.opts.iters;
        for _ in 0..self.opts.warmup {
            self.launch(lib, kind, shape, op, inplace, bufs)?;
        }
        if self.opts.graph {
            let captured = self.capture(lib, kind, shape, op, inplace, bufs);
            // One process per GPU: every rank replays graphs, or none does.
            let captured = self.agree(captured);
            if let Some(e) = &self.fatal {
                return Err(e.clone());
            }
            match captured {
                Ok(graphs) => {
                    self.ensure_events(GRAPH_REPLAYS + 1)?;
                    for g in &graphs {
                        drv("cuGraphLaunch", g.launch())?;
                    }
                    for k in 0..GRAPH_REPLAYS {
                        self.record_all(k)?;
                        for g in &graphs {
                            drv("cuGraphLaunch", g.launch())?;
                        }
                    }
                    self.record_all(GRAPH_REPLAYS)?;
                    let times = self.read_times(GRAPH_REPLAYS, iters)?;
                    drop(graphs);
                    return Ok((times, true));
                }
                Err(e) => {
                    self.note(format!(
                        "CUDA-graph capture failed for {} {} ({e}); timing eager launches instead",
                        lib.name(),
                        kind.name()
                    ));
                    self.sync()?;
                }
            }
        }
        self.ensure_events(iters + 1)?;
        self.record_all(0)?;
        for k in 0..iters {
            self.launch(lib, kind, shape, op, inplace, bufs)?;
            self.record_all(k + 1)?;
        }
        Ok((self.read_times(iters, 1)?, false))
    }

    /// Captures `-n` calls into CUDA graphs: for NCCL one graph per rank's stream (as
    /// nccl-tests does); for ringccl, whose ranks wait on each other's events, one graph
    /// forked from rank 0's stream to every rank's stream and joined back.
    fn capture<T: PerfElem>(
        &mut self,
        lib: Lib,
        kind: CollectiveKind,
        shape: &Shape,
        op: Option<RedOp>,
        inplace: bool,
        bufs: &mut Bufs<T>,
    ) -> Result<Vec<CudaGraph>, String> {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let flags = CUgraphInstantiate_flags(0);
        let iters = self.opts.iters;
        let streams: Vec<Arc<CudaStream>> = self.streams().into_iter().cloned().collect();
        match lib {
            Lib::Nccl => {
                let mut begun = 0;
                let body = (|| -> Result<(), String> {
                    for s in &streams {
                        drv("cuStreamBeginCapture", s.begin_capture(mode))?;
                        begun += 1;
                    }
                    for _ in 0..iters {
                        self.launch(lib, kind, shape, op, inplace, bufs)?;
                    }
                    Ok(())
                })();
                let mut graphs = Vec::new();
                let mut first_err = body.err();
                for s in &streams[..begun] {
                    match s.end_capture(flags) {
                        Ok(Some(g)) => graphs.push(g),
                        Ok(None) => {
                            first_err.get_or_insert_with(|| "the capture was empty".into());
                        }
                        Err(e) => {
                            first_err.get_or_insert_with(|| {
                                format!("cuStreamEndCapture failed with {:?}", e.0)
                            });
                        }
                    }
                }
                match first_err {
                    Some(e) => Err(e),
                    None => Ok(graphs),
                }
            }
            Lib::Ringccl => {
                let s0 = &streams[0];
                drv("cuStreamBeginCapture", s0.begin_capture(mode))?;
                let mut joins = Vec::new();
                let body = (|| -> Result<(), String> {
                    let ctx0 = self.comm.context(self.local[0]);
                    let fork = drv("cuEventCreate", ctx0.new_event(None))?;
                    drv("cuEventRecord", fork.record(s0))?;
                    for s in &streams[1..] {
                        drv("cuStreamWaitEvent", s.wait(&fork))?;
                    }
                    for _ in 0..iters {
                        self.launch(lib, kind, shape, op, inplace, bufs)?;
                    }
                    for (&r, s) in self.local.iter().zip(&streams).skip(1) {
                        let e = drv("cuEventCreate", self.comm.context(r).new_event(None))?;
                        drv("cuEventRecord", e.record(s))?;
                        drv("cuStreamWaitEvent", s0.wait(&e))?;
                        joins.push(e);
                    }
                    Ok(())
                })();
                let end = s0.end_capture(flags);
                drop(joins);
                body?;
                match end {
                    Ok(Some(g)) => Ok(vec![g]),
                    Ok(None) => Err("the capture was empty".into()),
                    Err(e) => Err(format!("cuStreamEndCapture failed with {:?}", e.0)),
                }
            }
        }
    }
}
