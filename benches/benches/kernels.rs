//! Kernel microbenchmarks on device 0: ringccl's copy, reduce (2 sources) and reduce-copy
//! (2 sources → 1 or 2 destinations) over 1 GiB operands (f32, bf16, f16), next to the driver's
//! device-to-device copy measured in the same run. Times come from CUDA events
//! (`iter_custom`); throughput counts bytes read + written. A launch-shape sweep for
//! reduce-copy f32 picks the shape used by the other kernels. A summary table (GB/s and % of
//! the driver copy's rate) is printed at the end.
//!
//! `cargo bench -p ringccl-benches --bench kernels`; without a GPU it prints a message and exits.

use criterion::{Criterion, Throughput};
use gpu_kernels::element::{Bf16, Element, F16};
use gpu_kernels::entry::{find_entry, EntryKind};
use gpu_kernels::op::RedOp;
use gpu_kernels::DataType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringccl_tests::{driver_present, DeviceBuffer, Gpu, KArg, Result};
use std::cell::RefCell;
use std::time::Duration;

/// Bytes per operand.
const OPERAND: usize = 1 << 30;
/// Launch shapes swept for reduce-copy f32: blocks × threads (threads clamped per kernel).
const SWEEP_BLOCKS: [u32; 4] = [132, 264, 528, 1056];
const SWEEP_THREADS: [u32; 2] = [256, 512];

/// One measured row of the summary.
struct Row {
    name: String,
    shape: String,
    bytes: u64,
    secs: f64,
    iters: u64,
}

impl Row {
    fn gbps(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 * self.iters as f64 / self.secs / 1e9
        } else {
            0.0
        }
    }
}

/// The four 1 GiB operands: sources a, b; destinations d0, d1.
struct Operands {
    a: DeviceBuffer,
    b: DeviceBuffer,
    d0: DeviceBuffer,
    d1: DeviceBuffer,
}

/// Fills `buf` with random non-zero `T` values (a 64 MiB random tile, repeated).
fn fill_random<T: Element>(
    gpu: &Gpu,
    buf: &DeviceBuffer,
    rng: &mut StdRng,
    gen: fn(f32) -> T,
) -> Result<()> {
    const TILE: usize = 64 << 20;
    let mut tile = Vec::with_capacity(TILE);
    while tile.len() < TILE {
        let x = (1.0 + rng.random::<f32>()) * if rng.random::<bool>() { -1.0 } else { 1.0 };
        tile.extend_from_slice(&gen(x).to_raw().to_le_bytes()[..T::SIZE]);
    }
    let mut off = 0;
    while off < buf.len() {
        let n = TILE.min(buf.len() - off);
        gpu.upload(buf, off, &tile[..n])?;
        off += n;
    }
    Ok(())
}

/// What one benchmark launches.
#[derive(Clone, Copy)]
enum Work {
    DriverCopy,
    Kernel {
        kind: EntryKind,
        dtype: DataType,
        two: bool,
    },
}

impl Work {
    /// Bytes read + written per iteration.
    fn bytes(self) -> u64 {
        let g = OPERAND as u64;
        match self {
            Work::DriverCopy => 2 * g,
            Work::Kernel {
                kind: EntryKind::Copy,
                two,
                ..
            } => g * if two { 3 } else { 2 },
            Work::Kernel {
                kind: EntryKind::Scale,
                ..
            } => 2 * g,
            Work::Kernel { two, .. } => g * if two { 4 } else { 3 },
        }
    }

    fn name(self) -> String {
        match self {
            Work::DriverCopy => "cuMemcpyDtoDAsync".into(),
            Work::Kernel { kind, dtype, two } => {
                let k = match kind {
                    EntryKind::Copy => "copy",
                    EntryKind::Reduce => "reduce_sum(2 src)",
                    EntryKind::ReduceCopy if two => "reduce_copy_sum(2 src, 2 dst)",
                    EntryKind::ReduceCopy => "reduce_copy_sum(2 src, 1 dst)",
                    EntryKind::OneShot => "oneshot_sum",
                    EntryKind::TwoShot => "twoshot_sum",
                    EntryKind::TwoShotColl => "twoshot_coll_sum",
                    EntryKind::Ll => "ll_sum",
                    EntryKind::Scale => "scale",
                };
                format!("{k} {}", dtype.name())
            }
        }
    }

    /// Queues one iteration; returns the block size used.
    fn launch(self, gpu: &Gpu, ops: &Operands, shape: (u32, u32)) -> Result<u32> {
        let Work::Kernel { kind, dtype, two } = self else {
            gpu.copy_d2d(&ops.a, &ops.d0, OPERAND)?;
            return Ok(0);
        };
        let op = if matches!(kind, EntryKind::Copy | EntryKind::Scale) {
            None
        } else {
            Some(RedOp::Sum)
        };
        let entry = find_entry(kind, dtype, op).ok_or_else(|| {
            ringccl_tests::Error::msg(format!("no {kind:?} kernel for {}", dtype.name()))
        })?;
        let k = gpu.kernel(entry.name)?;
        let size = dtype.size();
        let n = (OPERAND / size) as u64;
        let d1 = if two { ops.d1.ptr() } else { 0 };
        let args = match kind {
            EntryKind::Copy => KArg::copy(ops.a.ptr(), ops.d0.ptr(), d1, n),
            EntryKind::Reduce => KArg::reduce(&[ops.a.ptr(), ops.b.ptr()], ops.d0.ptr(), n, 1)
                .ok_or_else(|| ringccl_tests::Error::msg("bad source count"))?,
            EntryKind::ReduceCopy => {
                KArg::reduce_copy(ops.a.ptr(), ops.b.ptr(), ops.d0.ptr(), d1, n, 1)
            }
            EntryKind::Scale => vec![
                KArg::U64(ops.a.ptr()),
                KArg::U64(ops.d0.ptr()),
                KArg::U64(n),
                KArg::U64(1),
                KArg::U64(0),
            ],
            EntryKind::OneShot | EntryKind::TwoShot | EntryKind::TwoShotColl | EntryKind::Ll => {
                return Err(ringccl_tests::Error::msg(
                    "the one-shot and two-shot kernels need every rank: not a single-GPU bench",
                ))
            }
        };
        // SAFETY: every operand is a distinct 1 GiB buffer holding `n` elements.
        unsafe { gpu.launch(k, shape.0, shape.1, &args) }
    }
}

/// Fills a buffer with random non-zero values of one element type.
type Fill = fn(&Gpu, &DeviceBuffer, &mut StdRng) -> Result<()>;

/// Benchmarks `work` with criterion (event-timed) and appends its row to `rows`.
fn bench(
    c: &mut Criterion,
    (group, id): (&str, &str),
    (gpu, ops): (&Gpu, &Operands),
    work: Work,
    shape: (u32, u32),
    rows: &RefCell<Vec<Row>>,
) -> Result<()> {
    // One untimed launch: lazy module loading and first-touch costs stay out of the numbers.
    let threads = work.launch(gpu, ops, shape)?;
    gpu.sync()?;
    let shape_s = if threads == 0 {
        "-".to_string()
    } else {
        format!("{}x{}", shape.0, threads)
    };
    let mut row = Row {
        name: work.name(),
        shape: shape_s,
        bytes: work.bytes(),
        secs: 0.0,
        iters: 0,
    };
    let mut err = None;
    {
        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Bytes(work.bytes()));
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let t = gpu.time(|| {
                    for _ in 0..iters {
                        work.launch(gpu, ops, shape)?;
                    }
                    Ok(())
                });
                match t {
                    Ok(d) => {
                        row.secs += d.as_secs_f64();
                        row.iters += iters;
                        d
                    }
                    Err(e) => {
                        err.get_or_insert(e);
                        Duration::from_nanos(1)
                    }
                }
            })
        });
        g.finish();
    }
    if let Some(e) = err {
        return Err(e);
    }
    rows.borrow_mut().push(row);
    Ok(())
}

fn run(c: &mut Criterion, gpu: &Gpu) -> Result<Vec<Row>> {
    let mut rng = StdRng::seed_from_u64(7);
    let ops = Operands {
        a: gpu.alloc(OPERAND)?,
        b: gpu.alloc(OPERAND)?,
        d0: gpu.alloc(OPERAND)?,
        d1: gpu.alloc(OPERAND)?,
    };
    let rows = RefCell::new(Vec::new());

    // f32 data, the driver's copy, and the launch-shape sweep for reduce-copy f32.
    fill_random::<f32>(gpu, &ops.a, &mut rng, |x| x)?;
    fill_random::<f32>(gpu, &ops.b, &mut rng, |x| x)?;
    bench(
        c,
        ("d2d", "cuMemcpyDtoDAsync"),
        (gpu, &ops),
        Work::DriverCopy,
        (0, 0),
        &rows,
    )?;
    let rc = Work::Kernel {
        kind: EntryKind::ReduceCopy,
        dtype: DataType::F32,
        two: false,
    };
    let mut best = ((264, 512), 0.0f64);
    let mut sweep = Vec::new();
    for blocks in SWEEP_BLOCKS {
        for threads in SWEEP_THREADS {
            bench(
                c,
                ("sweep_reduce_copy_f32", &format!("{blocks}x{threads}")),
                (gpu, &ops),
                rc,
                (blocks, threads),
                &rows,
            )?;
            let row = rows
                .borrow_mut()
                .pop()
                .ok_or_else(|| ringccl_tests::Error::msg("no row"))?;
            if row.gbps() > best.1 {
                best = ((blocks, threads), row.gbps());
            }
            sweep.push(row);
        }
    }
    let shape = best.0;
    println!("launch shape sweep, reduce_copy_sum f32 (2 src, 1 dst):");
    for r in &sweep {
        println!("  {:>9}  {:>8.1} GB/s", r.shape, r.gbps());
    }
    println!(
        "best: {}x{} ({:.1} GB/s); used for every kernel below",
        shape.0, shape.1, best.1
    );

    let dtypes: [(DataType, Fill); 3] = [
        (DataType::F32, |g, b, r| fill_random::<f32>(g, b, r, |x| x)),
        (DataType::BF16, |g, b, r| {
            fill_random::<Bf16>(g, b, r, Bf16::from_f32)
        }),
        (DataType::F16, |g, b, r| {
            fill_random::<F16>(g, b, r, F16::from_f32)
        }),
    ];
    for (dtype, fill) in dtypes {
        if dtype != DataType::F32 {
            fill(gpu, &ops.a, &mut rng)?;
            fill(gpu, &ops.b, &mut rng)?;
        }
        let works = [
            Work::Kernel {
                kind: EntryKind::Copy,
                dtype,
                two: false,
            },
            Work::Kernel {
                kind: EntryKind::Reduce,
                dtype,
                two: false,
            },
            Work::Kernel {
                kind: EntryKind::ReduceCopy,
                dtype,
                two: false,
            },
            Work::Kernel {
                kind: EntryKind::ReduceCopy,
                dtype,
                two: true,
            },
        ];
        for w in works {
            let id = w.name().replace([' ', '(', ')', ','], "_");
            bench(c, ("kernels", &id), (gpu, &ops), w, shape, &rows)?;
        }
    }
    Ok(rows.into_inner())
}

fn main() {
    if !driver_present() {
        println!("kernels bench: no CUDA driver (libcuda) found; nothing to measure");
        return;
    }
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            println!("kernels bench: no usable GPU: {e}");
            return;
        }
    };
    println!(
        "kernels bench: {} (sm_{}{}, {} SMs); {}",
        gpu.name,
        gpu.cc.0,
        gpu.cc.1,
        gpu.sms,
        gpu.kernels_summary()
    );
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .nresamples(10_000)
        .without_plots()
        .configure_from_args();
    let rows = match run(&mut c, &gpu) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kernels bench failed: {e}");
            std::process::exit(1);
        }
    };
    c.final_summary();
    let base = rows
        .iter()
        .find(|r| r.shape == "-")
        .map(Row::gbps)
        .unwrap_or(0.0);
    println!(
        "\n{:<36} {:>9} {:>10} {:>9}",
        "kernel (1 GiB operands)", "shape", "GB/s r+w", "% of D2D"
    );
    for r in &rows {
        let pct = if base > 0.0 {
            100.0 * r.gbps() / base
        } else {
            0.0
        };
        println!(
            "{:<36} {:>9} {:>10.1} {:>8.1}%",
            r.name,
            r.shape,
            r.gbps(),
            pct
        );
    }
}
