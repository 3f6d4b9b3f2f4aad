//! `train_mlp`: data-parallel training of a multilayer perceptron with ringccl's gradient
//! reducer (`ringccl::ddp::Reducer`), on every GPU of one process or one process per GPU.
//!
//! ```text
//! train_mlp [--layers 4] [--width 4096] [--batch 2048] [--steps 200] [--warmup 10]
//!           [--lr 0.05] [--comm overlap|after|none] [--reduction avg|sum]
//!           [--first-bucket-mib 1] [--bucket-mib 25] [--data-batches 8]
//!           [--check] [--tol 1e-4] [--plot FILE.svg] [--csv FILE.csv] [--print-every 1]
//! train_mlp --replot FILE.csv --plot FILE.svg   # redraw a run's plot from its CSV (no GPU)
//! ringccl-run -n 2 train_mlp ...      # one process per GPU (or torchrun --no-python)
//! ```
//!
//! Every rank trains on its own synthetic batch (`--batch` samples: uniform inputs, targets
//! from a fixed random linear teacher); the reducer averages the gradients over ranks while the
//! backward pass runs (`--comm overlap`), after it (`after`), or not at all (`none`: each rank
//! trains alone, the reference for the cost of communication). `--check` then verifies that
//! the parameters are bit-identical on every rank and equal, within `--tol` (the largest
//! difference relative to the largest parameter), those of one GPU trained on the combined
//! batch of every rank.

mod model;
mod plot;

use std::fmt;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use model::{GradSink, LocalGrads, Replica, Shape};
use ringccl::cudarc::driver::{CudaSlice, CudaStream, CudaViewMut};
use ringccl::ddp::{
    BucketCaps, BucketPlan, Launch, Reducer, ReducerError, ReducerOptions, Reduction,
};
use ringccl::{Communicator, Io, LaunchEnv, RedOp};

/// Why the program stopped.
#[derive(Debug)]
pub enum Fail {
    Usage(String),
    Cuda { what: String, detail: String },
    Comm(ringccl::Error),
    Reducer(ReducerError),
    Check(String),
}

impl Fail {
    pub fn cuda(what: &str, e: ringccl::cudarc::driver::DriverError) -> Self {
        Fail::Cuda {
            what: what.to_string(),
            detail: format!("{e:?}"),
        }
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fail::Usage(m) => write!(f, "{m}\n{USAGE}"),
            Fail::Cuda { what, detail } => write!(f, "{what} failed: {detail}"),
            Fail::Comm(e) => write!(f, "{e}"),
            Fail::Reducer(e) => write!(f, "{e}"),
            Fail::Check(m) => write!(f, "check failed: {m}"),
        }
    }
}

impl From<ringccl::Error> for Fail {
    fn from(e: ringccl::Error) -> Self {
        Fail::Comm(e)
    }
}

impl From<ReducerError> for Fail {
    fn from(e: ReducerError) -> Self {
        Fail::Reducer(e)
    }
}

const USAGE: &str = "usage: train_mlp [--layers N] [--width N] [--batch N (per rank)] [--steps N] \
[--warmup N] [--lr X] [--comm overlap|after|none] [--reduction avg|sum] [--first-bucket-mib X] \
[--bucket-mib X] [--data-batches N] [--check] [--tol X] [--plot FILE.svg] [--csv FILE.csv] \
[--print-every N]\n       train_mlp --replot FILE.csv --plot FILE.svg";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CommMode {
    Overlap,
    After,
    None,
}

#[derive(Clone, Debug)]
struct Args {
    layers: usize,
    width: usize,
    batch: usize,
    steps: usize,
    warmup: usize,
    lr: f32,
    comm: CommMode,
    reduction: Reduction,
    caps: BucketCaps,
    data_batches: usize,
    check: bool,
    tol: f64,
    plot: Option<String>,
    csv: Option<String>,
    replot: Option<String>,
    print_every: usize,
}

fn parse_args(argv: &[String]) -> Result<Args, Fail> {
    let mut a = Args {
        layers: 4,
        width: 4096,
        batch: 2048,
        steps: 200,
        warmup: 10,
        lr: 0.05,
        comm: CommMode::Overlap,
        reduction: Reduction::Avg,
        caps: BucketCaps::default(),
        data_batches: 8,
        check: false,
        tol: 1e-4,
        plot: None,
        csv: None,
        replot: None,
        print_every: 1,
    };
    let mut it = argv.iter();
    fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, Fail> {
        v.and_then(|s| s.parse().ok())
            .ok_or_else(|| Fail::Usage(format!("{flag} needs a number")))
    }
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--layers" => a.layers = num(flag, it.next())?,
            "--width" => a.width = num(flag, it.next())?,
            "--batch" => a.batch = num(flag, it.next())?,
            "--steps" => a.steps = num(flag, it.next())?,
            "--warmup" => a.warmup = num(flag, it.next())?,
            "--lr" => a.lr = num(flag, it.next())?,
            "--tol" => a.tol = num(flag, it.next())?,
            "--data-batches" => a.data_batches = num(flag, it.next())?,
            "--print-every" => a.print_every = num(flag, it.next())?,
            "--first-bucket-mib" => {
                a.caps.first_bytes = (num::<f64>(flag, it.next())? * 1048576.0) as usize
            }
            "--bucket-mib" => a.caps.bytes = (num::<f64>(flag, it.next())? * 1048576.0) as usize,
            "--check" => a.check = true,
            "--plot" => a.plot = it.next().cloned(),
            "--csv" => a.csv = it.next().cloned(),
            "--replot" => a.replot = it.next().cloned(),
            "--comm" => {
                a.comm = match it.next().map(String::as_str) {
                    Some("overlap") => CommMode::Overlap,
                    Some("after") => CommMode::After,
                    Some("none") => CommMode::None,
                    _ => return Err(Fail::Usage("--comm takes overlap, after or none".into())),
                }
            }
            "--reduction" => {
                a.reduction = match it.next().map(String::as_str) {
                    Some("avg") => Reduction::Avg,
                    Some("sum") => Reduction::Sum,
                    _ => return Err(Fail::Usage("--reduction takes avg or sum".into())),
                }
            }
            "-h" | "--help" => {
                return Err(Fail::Usage("train_mlp: data-parallel MLP training".into()))
            }
            other => return Err(Fail::Usage(format!("unknown argument {other:?}"))),
        }
    }
    if a.layers == 0 || a.width == 0 || a.batch == 0 || a.steps == 0 || a.data_batches == 0 {
        return Err(Fail::Usage(
            "--layers, --width, --batch, --steps and --data-batches must be positive".into(),
        ));
    }
    if a.warmup >= a.steps {
        return Err(Fail::Usage("--warmup must be below --steps".into()));
    }
    if a.width * a.batch > i32::MAX as usize || a.width * a.width > i32::MAX as usize {
        return Err(Fail::Usage(
            "--width × --batch must fit cuBLAS's 32-bit sizes".into(),
        ));
    }
    if a.check && a.comm == CommMode::None {
        return Err(Fail::Usage("--check needs --comm overlap or after".into()));
    }
    Ok(a)
}

/// Gradients in the reducer's flat buffer of one local rank.
struct ReducerGrads<'r, 'c> {
    reducer: &'r mut Reducer<'c, f32>,
    local: usize,
}

impl GradSink for ReducerGrads<'_, '_> {
    fn grad(&mut self, param: usize) -> Result<CudaViewMut<'_, f32>, Fail> {
        Ok(self.reducer.grad_mut(self.local, param)?)
    }
    fn ready(&mut self, param: usize) -> Result<(), Fail> {
        Ok(self.reducer.mark_ready(self.local, param)?)
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = parse_args(&argv).and_then(|a| match &a.replot {
        Some(csv) => replot(&a, csv),
        None => run(&a),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Fail> {
    let comm = match LaunchEnv::from_env()? {
        Some(_) => Communicator::from_env()?,
        None => Communicator::all()?,
    };
    // SAFETY: only reads whether the library can be loaded.
    if !unsafe { ringccl::cudarc::cublas::sys::is_culib_present() } {
        return Err(Fail::Cuda {
            what: "loading cuBLAS".into(),
            detail: "libcublas.so (CUDA 13) was not found: install the CUDA toolkit's cuBLAS \
                     or add its folder to LD_LIBRARY_PATH"
                .into(),
        });
    }
    let world = comm.nranks();
    let locals = comm.local_ranks().to_vec();
    let leader = locals.contains(&0);
    let mut compute: Vec<Arc<CudaStream>> = Vec::new();
    for &rank in &locals {
        let ctx = comm.context(rank);
        // SAFETY: every buffer of this program is used on its replica's compute stream, and
        // the reducer orders its communication streams with events; nothing is freed before
        // the streams are synchronised at the end.
        unsafe { ctx.disable_event_tracking() };
        compute.push(
            ctx.new_stream()
                .map_err(|e| Fail::cuda("creating a stream", e))?,
        );
    }
    let lens: Vec<usize> = (0..args.layers)
        .flat_map(|_| [args.width * args.width, args.width])
        .collect();
    let plan = BucketPlan::new(&lens, 4, args.caps)?;
    let ranges: Vec<_> = (0..lens.len()).map(|p| plan.range(p)).collect();
    let shape = Shape {
        layers: args.layers,
        width: args.width,
        batch: args.batch,
        batches: args.data_batches,
        steps: args.steps,
    };
    if leader {
        let mode = if locals.len() == world {
            "one process, every GPU"
        } else {
            "one process per GPU"
        };
        println!(
            "train_mlp: {world} rank(s) ({mode}), {} layers of {w}×{w} f32 ({:.1} M parameters), \
             batch {} per rank, {} steps, lr {}, comm {:?}, {:?}, {} bucket(s): {}",
            args.layers,
            lens.iter().sum::<usize>() as f64 / 1e6,
            args.batch,
            args.steps,
            args.lr,
            args.comm,
            args.reduction,
            plan.buckets().len(),
            plan.buckets()
                .iter()
                .map(|b| format!("{:.2} MiB", (b.range.len() * 4) as f64 / 1048576.0))
                .collect::<Vec<_>>()
                .join(", "),
            w = args.width,
        );
    }
    let mut replicas = Vec::new();
    for (i, &rank) in locals.iter().enumerate() {
        replicas.push(Replica::new(
            compute[i].clone(),
            shape,
            ranges.clone(),
            plan.len(),
            &[rank],
            world,
        )?);
    }
    let mut reducer = match args.comm {
        CommMode::None => None,
        CommMode::Overlap | CommMode::After => Some(Reducer::<f32>::new(
            &comm,
            &lens,
            &compute,
            ReducerOptions {
                caps: args.caps,
                reduction: args.reduction,
                launch: if args.comm == CommMode::Overlap {
                    Launch::Overlap
                } else {
                    Launch::AfterBackward
                },
            },
        )?),
    };
    let mut own_grads: Vec<CudaSlice<f32>> = Vec::new();
    if reducer.is_none() {
        for s in &compute {
            own_grads.push(
                s.alloc_zeros(plan.len())
                    .map_err(|e| Fail::cuda("allocating", e))?,
            );
        }
    }
    let per_sample = (args.batch * args.width) as f32;
    let grad_scale = 2.0 / per_sample * args.reduction.prescale(world) as f32;
    sync_all(&compute)?;

    let bar = if leader {
        ProgressBar::new(args.steps as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} steps {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut t0 = Instant::now();
    for step in 0..args.steps {
        if step == args.warmup {
            sync_all(&compute)?;
            t0 = Instant::now();
        }
        for r in replicas.iter_mut() {
            r.forward(step, grad_scale)?;
        }
        for l in (0..args.layers).rev() {
            for (i, r) in replicas.iter_mut().enumerate() {
                match reducer.as_mut() {
                    Some(reducer) => {
                        r.backward_layer(step, l, &mut ReducerGrads { reducer, local: i })?
                    }
                    None => r.backward_layer(
                        step,
                        l,
                        &mut LocalGrads {
                            grads: &mut own_grads[i],
                            ranges: &ranges,
                        },
                    )?,
                }
            }
        }
        match reducer.as_mut() {
            Some(red) => {
                red.wait()?;
                for (i, r) in replicas.iter_mut().enumerate() {
                    r.sgd(red.grads(i)?, args.lr)?;
                }
            }
            None => {
                for (r, g) in replicas.iter_mut().zip(&own_grads) {
                    r.sgd(g, args.lr)?;
                }
            }
        }
        bar.inc(1);
    }
    sync_all(&compute)?;
    let timed = args.steps - args.warmup;
    let step_ms = t0.elapsed().as_secs_f64() * 1e3 / timed as f64;
    bar.finish_and_clear();

    // The loss of every step, averaged over ranks.
    {
        let mut io: Vec<Io<f32>> = replicas
            .iter_mut()
            .map(|r| Io::in_place(&mut r.losses))
            .collect();
        comm.all_reduce(&mut io, args.steps, RedOp::Avg, &compute)?;
    }
    sync_all(&compute)?;
    let losses = compute[0]
        .clone_dtoh(&replicas[0].losses)
        .map_err(|e| Fail::cuda("copying the losses", e))?;
    for r in &locals {
        println!(
            "rank {r}: step time {step_ms:.3} ms (mean of steps {}..{}, comm {:?})",
            args.warmup, args.steps, args.comm
        );
    }
    if leader {
        let every = args.print_every.max(1);
        for (s, l) in losses.iter().enumerate() {
            if s % every == 0 || s + 1 == losses.len() {
                println!("step {:>5}/{} loss {l:.6}", s + 1, args.steps);
            }
        }
        if !losses.iter().all(|l| l.is_finite()) {
            return Err(Fail::Check("the loss is not finite: lower --lr".into()));
        }
    }

    let mut reference_losses = None;
    if args.check {
        check_identical(&comm, &mut replicas, &compute, plan.len())?;
        let (worst, ref_losses) = check_reference(args, &replicas, &ranges, plan.len(), world)?;
        for (r, (diff, scale)) in locals.iter().zip(&worst) {
            let rel = diff / scale;
            println!(
                "rank {r}: max |param − single-GPU param on the combined batch| = {diff:.3e}, \
                 max |param| = {scale:.3e}, ratio {rel:.3e} (tolerance {:.1e}): {}",
                args.tol,
                if rel <= args.tol { "ok" } else { "FAILED" }
            );
            if rel > args.tol || !rel.is_finite() {
                return Err(Fail::Check(format!(
                    "rank {r}: parameters differ from single-GPU training on the combined batch \
                     by {rel:.3e} of the largest parameter (tolerance {:.1e})",
                    args.tol
                )));
            }
        }
        reference_losses = Some(ref_losses);
    }
    if leader {
        if let Some(path) = &args.csv {
            let mut text = String::from("step,loss,single_gpu_combined_batch_loss\n");
            for (s, l) in losses.iter().enumerate() {
                let r = reference_losses
                    .as_ref()
                    .and_then(|v: &Vec<f32>| v.get(s))
                    .map(|x| x.to_string())
                    .unwrap_or_default();
                text += &format!("{},{l},{r}\n", s + 1);
            }
            std::fs::write(path, text)
                .map_err(|e| Fail::Usage(format!("cannot write {path}: {e}")))?;
            println!("wrote {path}");
        }
        if let Some(path) = &args.plot {
            let title = format!(
                "train_mlp: {} × {w}×{w}, batch {} × {world} ranks, lr {}",
                args.layers,
                args.batch,
                args.lr,
                w = args.width
            );
            plot::loss_curve(path, &title, &losses, reference_losses.as_deref())
                .map_err(|e| Fail::Usage(format!("cannot write the plot {path}: {e}")))?;
            println!("wrote {path}");
        }
    }
    Ok(())
}

/// Redraws the plot of a run from the CSV it wrote (`--csv`).
fn replot(args: &Args, csv: &str) -> Result<(), Fail> {
    let Some(path) = &args.plot else {
        return Err(Fail::Usage("--replot needs --plot FILE.svg".into()));
    };
    let text =
        std::fs::read_to_string(csv).map_err(|e| Fail::Usage(format!("cannot read {csv}: {e}")))?;
    let mut losses = Vec::new();
    let mut reference = Vec::new();
    for line in text.lines().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        let bad = || Fail::Usage(format!("{csv}: not a train_mlp CSV line: {line:?}"));
        losses.push(
            cols.get(1)
                .and_then(|v| v.parse::<f32>().ok())
                .ok_or_else(bad)?,
        );
        if let Some(r) = cols.get(2).and_then(|v| v.parse::<f32>().ok()) {
            reference.push(r);
        }
    }
    let reference = (reference.len() == losses.len()).then_some(reference);
    let title = format!(
        "train_mlp: {} × {w}×{w}, batch {} per rank, lr {}",
        args.layers,
        args.batch,
        args.lr,
        w = args.width
    );
    plot::loss_curve(path, &title, &losses, reference.as_deref())
        .map_err(|e| Fail::Usage(format!("cannot write the plot {path}: {e}")))?;
    println!("wrote {path}");
    Ok(())
}

fn sync_all(streams: &[Arc<CudaStream>]) -> Result<(), Fail> {
    for s in streams {
        s.synchronize()
            .map_err(|e| Fail::cuda("synchronising a stream", e))?;
    }
    Ok(())
}

/// Every rank's parameters equal rank 0's bit for bit (rank 0's are broadcast to every rank
/// and compared there).
fn check_identical(
    comm: &Communicator,
    replicas: &mut [Replica],
    compute: &[Arc<CudaStream>],
    len: usize,
) -> Result<(), Fail> {
    let mut copies = Vec::new();
    for s in compute {
        copies.push(
            s.alloc_zeros::<f32>(len)
                .map_err(|e| Fail::cuda("allocating", e))?,
        );
    }
    {
        let mut io: Vec<Io<f32>> = replicas
            .iter()
            .zip(copies.iter_mut())
            .map(|(r, c)| Io::out_of_place(&r.params, c))
            .collect();
        comm.broadcast(&mut io, len, 0, compute)?;
    }
    sync_all(compute)?;
    for ((r, c), &rank) in replicas.iter().zip(&copies).zip(comm.local_ranks()) {
        let mine = r
            .stream
            .clone_dtoh(&r.params)
            .map_err(|e| Fail::cuda("copying", e))?;
        let zero = r
            .stream
            .clone_dtoh(c)
            .map_err(|e| Fail::cuda("copying", e))?;
        let differ = mine
            .iter()
            .zip(&zero)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        println!(
            "rank {rank}: parameters bit-identical to rank 0's: {} ({differ} of {len} differ)",
            if differ == 0 { "yes" } else { "NO" }
        );
        if differ != 0 {
            return Err(Fail::Check(format!(
                "rank {rank}: {differ} parameters differ from rank 0's"
            )));
        }
    }
    Ok(())
}

/// Per local rank (max |difference|, max |parameter|), and the reference's losses.
type Reference = (Vec<(f64, f64)>, Vec<f32>);

/// Trains one replica on the combined batch of every rank (on each local rank's GPU), with
/// the same initialisation, data and steps, and returns per local rank (max |difference|,
/// max |parameter|), and the reference's losses.
fn check_reference(
    args: &Args,
    replicas: &[Replica],
    ranges: &[std::ops::Range<usize>],
    len: usize,
    world: usize,
) -> Result<Reference, Fail> {
    let mut out = Vec::new();
    let mut ref_losses = Vec::new();
    for r in replicas {
        let stream = r.stream.clone();
        let shape = Shape {
            batch: args.batch * world,
            ..r.shape
        };
        let parts: Vec<usize> = (0..world).collect();
        let mut single = Replica::new(stream.clone(), shape, ranges.to_vec(), len, &parts, world)?;
        let mut grads = stream
            .alloc_zeros::<f32>(len)
            .map_err(|e| Fail::cuda("allocating", e))?;
        let grad_scale = 2.0 / (shape.batch * shape.width) as f32;
        for step in 0..args.steps {
            single.forward(step, grad_scale)?;
            for l in (0..args.layers).rev() {
                single.backward_layer(
                    step,
                    l,
                    &mut LocalGrads {
                        grads: &mut grads,
                        ranges,
                    },
                )?;
            }
            single.sgd(&grads, args.lr)?;
        }
        stream
            .synchronize()
            .map_err(|e| Fail::cuda("synchronising", e))?;
        let a = stream
            .clone_dtoh(&r.params)
            .map_err(|e| Fail::cuda("copying", e))?;
        let b = stream
            .clone_dtoh(&single.params)
            .map_err(|e| Fail::cuda("copying", e))?;
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*x as f64 - *y as f64).abs())
            .fold(0.0f64, f64::max);
        let scale = b.iter().map(|y| (*y as f64).abs()).fold(0.0f64, f64::max);
        out.push((diff, scale));
        ref_losses = stream
            .clone_dtoh(&single.losses)
            .map_err(|e| Fail::cuda("copying", e))?;
    }
    Ok((out, ref_losses))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, Fail> {
        parse_args(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_are_the_documented_model() {
        let a = parse(&[]).unwrap();
        assert_eq!(
            (a.layers, a.width, a.batch, a.steps, a.warmup),
            (4, 4096, 2048, 200, 10)
        );
        assert_eq!(a.comm, CommMode::Overlap);
        assert_eq!(a.reduction, Reduction::Avg);
        assert_eq!(a.caps, BucketCaps::default());
    }

    #[test]
    fn options_are_read() {
        let a = parse(&[
            "--comm",
            "after",
            "--reduction",
            "sum",
            "--bucket-mib",
            "2",
            "--first-bucket-mib",
            "0.5",
            "--check",
            "--batch",
            "64",
        ])
        .unwrap();
        assert_eq!(a.comm, CommMode::After);
        assert_eq!(a.reduction, Reduction::Sum);
        assert_eq!(
            a.caps,
            BucketCaps {
                first_bytes: 512 << 10,
                bytes: 2 << 20
            }
        );
        assert!(a.check);
        assert_eq!(a.batch, 64);
    }

    #[test]
    fn bad_options_are_usage_errors() {
        for bad in [
            &["--comm", "sometimes"][..],
            &["--steps", "5", "--warmup", "5"],
            &["--width", "0"],
            &["--check", "--comm", "none"],
            &["--lr"],
            &["--frobnicate"],
            &["--width", "65536", "--batch", "65536"],
        ] {
            assert!(
                matches!(parse(bad), Err(Fail::Usage(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn replot_reads_a_run_csv() {
        let dir = std::env::temp_dir().join(format!("train-mlp-replot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("loss.csv");
        let svg = dir.join("loss.svg");
        std::fs::write(
            &csv,
            "step,loss,single_gpu_combined_batch_loss\n1,1.0,1.0\n2,0.5,0.5\n3,0.25,0.25\n",
        )
        .unwrap();
        let a = parse(&["--plot", svg.to_str().unwrap()]).unwrap();
        replot(&a, csv.to_str().unwrap()).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.contains("one GPU, combined batch"),
            "the reference curve is drawn"
        );
        std::fs::write(&csv, "step,loss\n1,not-a-number\n").unwrap();
        assert!(matches!(
            replot(&a, csv.to_str().unwrap()),
            Err(Fail::Usage(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
