//! A tensor-parallel MLP on candle tensors, over ringccl.
//!
//! `y = gelu(x·W1 + b1)·W2 + b2`, split over the N ranks of a job the Megatron way:
//! - W1 (hidden × ffn) by output columns: rank r holds W1[:, r·ffn/N .. (r+1)·ffn/N] and that
//!   part of b1, and computes its part of the hidden activation, h_r = gelu(x·W1_r + b1_r),
//!   with no communication (GELU acts elementwise);
//! - W2 (ffn × hidden) by input rows: rank r holds W2[r·ffn/N .., :] and computes the partial
//!   output p_r = h_r·W2_r; the output is Σ_r p_r + b2.
//!
//! The sum Σ_r p_r is one all-reduce of candle tensors through `ringccl::nccl::Comm` (the API of
//! `cudarc::nccl::safe`), on the candle device's own CUDA stream: a candle `CudaSlice<f32>` is
//! the `CudaSlice` ringccl takes (both crates use cudarc 0.19.10).
//!
//! Every rank builds the same weights from a seed; rank 0 also runs the whole MLP on its GPU and
//! compares. One process per rank, started by `ringccl-run -n N` or `torchrun --nproc-per-node
//! N --no-python` (both set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); with none of those it
//! runs as a job of one rank.

use std::process::ExitCode;
use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp1, Device, Layout, Shape, Tensor};
use ringccl::nccl::{Comm, Id, ReduceOp};

const USAGE: &str =
    "usage: candle-tp [--batch B] [--hidden H] [--ffn F] [--seed S] [--same-device] [--check-only]

A tensor-parallel MLP (column-parallel Linear, GELU, row-parallel Linear, an all-reduce of the
partial sums through ringccl) on candle tensors, one process per GPU rank, checked on rank 0
against the same MLP on one GPU.

Start it with a launcher, one process per rank:
    ringccl-run -n 2 candle-tp
    torchrun --nproc-per-node 2 --no-python candle-tp
(both set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; without them: one rank).

Options:
    --batch B       rows of the input x (default 8)
    --hidden H      the model width: x is B x H, W1 is H x F, W2 is F x H (default 1024)
    --ffn F         the inner width, a multiple of WORLD_SIZE (default 4096)
    --seed S        the seed of the weights and input, the same on every rank (default 28)
    --same-device   every rank on GPU 0 (ranks sharing one GPU, e.g. under MPS); also
                    CANDLE_TP_SAME_DEVICE=1. Otherwise rank r is on GPU LOCAL_RANK.
    --check-only    check the options and the launcher's environment, print the split and
                    whether cuBLAS and cuRAND are found, and exit without touching a GPU
    -h, --help      this text";

/// What the command line and the launcher's environment ask for.
#[derive(Debug, Clone)]
struct Options {
    batch: usize,
    hidden: usize,
    ffn: usize,
    seed: u64,
    same_device: bool,
    check_only: bool,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        batch: 8,
        hidden: 1024,
        ffn: 4096,
        seed: 28,
        same_device: matches!(
            std::env::var("CANDLE_TP_SAME_DEVICE").as_deref(),
            Ok("1") | Ok("true") | Ok("yes")
        ),
        check_only: false,
    };
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut number = |what: &str| -> Result<u64, String> {
            let v = match inline.clone() {
                Some(v) => v,
                None => args.next().ok_or_else(|| format!("{what} needs a value"))?,
            };
            v.parse::<u64>()
                .map_err(|_| format!("{what} {v}: expected a non-negative number"))
        };
        match name.as_str() {
            "-h" | "--help" => return Ok(None),
            "--batch" => o.batch = size(number("--batch")?, "--batch")?,
            "--hidden" => o.hidden = size(number("--hidden")?, "--hidden")?,
            "--ffn" => o.ffn = size(number("--ffn")?, "--ffn")?,
            "--seed" => o.seed = number("--seed")?,
            "--same-device" => o.same_device = true,
            "--check-only" => o.check_only = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Some(o))
}

fn size(v: u64, what: &str) -> Result<usize, String> {
    match usize::try_from(v) {
        Ok(n) if (1..=1 << 16).contains(&n) => Ok(n),
        _ => Err(format!("{what} {v}: expected 1 ..= 65536")),
    }
}

/// This process's place in the job: (rank, world size, local rank, the job's launcher env).
struct Place {
    rank: usize,
    world: usize,
    local_rank: usize,
    launch: Option<ringccl::LaunchEnv>,
}

fn place() -> Result<Place, String> {
    let launch =
        ringccl::LaunchEnv::from_env().map_err(|e| format!("the launcher's environment: {e}"))?;
    Ok(match &launch {
        Some(env) => Place {
            rank: env.rank,
            world: env.world_size,
            local_rank: env.local_rank,
            launch,
        },
        None => Place {
            rank: 0,
            world: 1,
            local_rank: 0,
            launch: None,
        },
    })
}

/// The all-reduce (sum) of a candle tensor through ringccl, as a candle custom op: the output is
/// a new tensor, the input is left as it is.
struct AllReduceSum {
    comm: Arc<Comm>,
}

impl CustomOp1 for AllReduceSum {
    fn name(&self) -> &'static str {
        "ringccl-all-reduce-sum"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("the ringccl all-reduce needs a tensor on a CUDA device")
    }

    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let n = layout.shape().elem_count();
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("the ringccl all-reduce needs a contiguous tensor")
        };
        let src = storage.as_cuda_slice::<f32>()?.slice(start..end);
        let device = storage.device().clone();
        // On the device's stream, like the kernels that made `src` and those that will read
        // `dst`: the communicator was made on that stream (see `run`).
        let mut dst = device.alloc_zeros::<f32>(n)?;
        self.comm
            .all_reduce(&src, &mut dst, &ReduceOp::Sum)
            .map_err(|e| candle_core::Error::msg(format!("ringccl all-reduce: {e}")))?;
        Ok((
            CudaStorage::wrap_cuda_slice(dst, device),
            layout.shape().clone(),
        ))
    }
}

/// The same pseudo-random numbers on every rank: xorshift64*, uniform in [-scale, scale).
fn uniform(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
            // The top 24 bits: exact in f32.
            let u = (r >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * u - 1.0) * scale
        })
        .collect()
}

/// The model's tensors, on the CPU (the whole model, built identically on every rank).
struct Model {
    x: Tensor,
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

fn model(o: &Options) -> candle_core::Result<Model> {
    let (b, h, f) = (o.batch, o.hidden, o.ffn);
    // Scaled by 1/sqrt(fan-in), as a Linear layer's initialisation is: activations stay O(1).
    let s1 = 1.0 / (h as f32).sqrt();
    let s2 = 1.0 / (f as f32).sqrt();
    let cpu = Device::Cpu;
    Ok(Model {
        x: Tensor::from_vec(uniform(o.seed, b * h, 1.0), (b, h), &cpu)?,
        w1: Tensor::from_vec(uniform(o.seed + 1, h * f, s1), (h, f), &cpu)?,
        b1: Tensor::from_vec(uniform(o.seed + 2, f, s1), f, &cpu)?,
        w2: Tensor::from_vec(uniform(o.seed + 3, f * h, s2), (f, h), &cpu)?,
        b2: Tensor::from_vec(uniform(o.seed + 4, h, s2), h, &cpu)?,
    })
}

/// The unit roundoff of f32, 2^-24.
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// γ_n = n·u / (1 − n·u): a sum of n f32 terms, in any order, is within γ_(n−1) · Σ|terms| of
/// the exact sum (Higham, Accuracy and Stability of Numerical Algorithms, §3.1).
fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

/// The CUDA libraries that candle's device opens when it is made (cudarc loads them at run
/// time; a missing one would be a panic inside candle): the names of those not found.
fn missing_libraries() -> Vec<&'static str> {
    use candle_core::cuda_backend::cudarc;
    // SAFETY: each call tries to open the library under its usual names (running its
    // initialisers, as candle's device would) and calls nothing in it.
    let found = unsafe {
        [
            ("libcublas.so.13", cudarc::cublas::sys::is_culib_present()),
            (
                "libcublasLt.so.13",
                cudarc::cublaslt::sys::is_culib_present(),
            ),
            ("libcurand.so.10", cudarc::curand::sys::is_culib_present()),
        ]
    };
    found
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| *name)
        .collect()
}

fn libraries_message(missing: &[&str]) -> String {
    format!(
        "{} not found: candle's CUDA device needs cuBLAS and cuRAND of CUDA 13 (a toolkit's \
         lib64, or the nvidia-cublas and nvidia-curand wheels' nvidia/cu13/lib) on \
         LD_LIBRARY_PATH or beside this program",
        missing.join(", ")
    )
}

fn run(o: &Options, p: &Place) -> Result<bool, String> {
    let missing = missing_libraries();
    if !missing.is_empty() {
        return Err(libraries_message(&missing));
    }
    let ce = |what: &'static str| move |e: candle_core::Error| format!("{what}: {e}");
    let ordinal = if o.same_device { 0 } else { p.local_rank };
    // A stream of its own (not the per-thread default stream): the communicator is made on it
    // and candle launches every kernel of this device on it, so the all-reduce is ordered after
    // the kernels that compute its input and before those that read its output.
    let device = Device::new_cuda_with_stream(ordinal).map_err(ce("the CUDA device"))?;
    let stream = device
        .as_cuda_device()
        .map_err(ce("the CUDA device"))?
        .cuda_stream();
    // f32 GEMMs in f32 (no TF32): the tolerance below is for f32 arithmetic.
    candle_core::cuda_backend::set_gemm_reduced_precision_f32(false);

    let id = match &p.launch {
        Some(env) => Id::from(env.unique_id().map_err(|e| format!("the job's id: {e}"))?),
        None => Id::new().map_err(|e| format!("the job's id: {e}"))?,
    };
    let comm = Comm::from_rank(stream, p.rank, p.world, id)
        .map_err(|e| format!("ringccl communicator (rank {} of {}): {e}", p.rank, p.world))?;
    let comm = Arc::new(comm);

    let m = model(o).map_err(ce("the model"))?;
    let part = o.ffn / p.world;
    let first = p.rank * part;
    let on_gpu = |t: &Tensor| t.contiguous().and_then(|t| t.to_device(&device));
    let gpu = |t: Tensor| on_gpu(&t);
    let x = on_gpu(&m.x).map_err(ce("x"))?;
    let w1 = gpu(m.w1.narrow(1, first, part).map_err(ce("W1"))?).map_err(ce("W1"))?;
    let b1 = gpu(m.b1.narrow(0, first, part).map_err(ce("b1"))?).map_err(ce("b1"))?;
    let w2 = gpu(m.w2.narrow(0, first, part).map_err(ce("W2"))?).map_err(ce("W2"))?;
    let b2 = on_gpu(&m.b2).map_err(ce("b2"))?;

    // This rank's part: h_r = gelu(x·W1_r + b1_r), p_r = h_r·W2_r; then y = Σ_r p_r + b2.
    let y = (|| {
        let h = x.matmul(&w1)?.broadcast_add(&b1)?.gelu()?;
        let partial = h.matmul(&w2)?;
        let sum = partial.apply_op1_no_bwd(&AllReduceSum { comm: comm.clone() })?;
        sum.broadcast_add(&b2)
    })()
    .map_err(ce("the tensor-parallel MLP"))?;
    let y = y.to_device(&Device::Cpu).map_err(ce("y"))?;
    println!(
        "rank {} of {}: GPU {ordinal}, W1[:, {first}..{}] and W2[{first}..{}, :], y is {:?}",
        p.rank,
        p.world,
        first + part,
        first + part,
        y.dims()
    );
    if p.rank != 0 {
        return Ok(true);
    }

    // Rank 0: the whole MLP on its GPU.
    let reference = (|| {
        let (w1, b1, w2) = (on_gpu(&m.w1)?, on_gpu(&m.b1)?, on_gpu(&m.w2)?);
        let pre = x.matmul(&w1)?.broadcast_add(&b1)?;
        let h = pre.gelu()?;
        let y = h.matmul(&w2)?.broadcast_add(&b2)?;
        // The tolerance's sizes (see below): S2 = max_j Σ_i |h_i|·|W2_ij| and
        // S1 = max_j Σ_i (Σ_k |x_k|·|W1_ki| + |b1_i|)·|W2_ij|, each over the rows of x.
        let s2 = h.abs()?.matmul(&w2.abs()?)?.max_all()?;
        let a1 = x.abs()?.matmul(&w1.abs()?)?.broadcast_add(&b1.abs()?)?;
        let s1 = a1.matmul(&w2.abs()?)?.max_all()?;
        let cpu = |t: Tensor| t.to_device(&Device::Cpu);
        Ok::<_, candle_core::Error>((
            cpu(y)?,
            cpu(s1)?.to_scalar::<f32>()?,
            cpu(s2)?.to_scalar::<f32>()?,
        ))
    })()
    .map_err(ce("the one-GPU MLP"))?;
    let (y1, s1, s2) = reference;
    let delta = (|| {
        let d = (&y - &y1)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let top = y1.abs()?.max_all()?.to_scalar::<f32>()?;
        Ok::<_, candle_core::Error>((d, top))
    })()
    .map_err(ce("the difference"))?;
    let (delta, top) = delta;

    // The tolerance: a bound on how far two f32 evaluations of the same MLP can be apart when
    // they sum in different orders (the split changes the order of the F-term sums of the
    // second GEMM, adds the N partial sums in the all-reduce, and cuBLAS may block the first
    // GEMM differently for a narrower W1), not a guess.
    // - Second layer: either result of y_j = Σ_i h_i·W2_ij (F products, each rounded, then N
    //   partials added) is within γ_(F+N+1)·Σ_i |h_i|·|W2_ij| of the exact sum of its own h;
    //   the two are within twice that: 2·γ_(F+N+1)·S2.
    // - First layer: each h_i's pre-activation (H products and b1) is within γ_(H+2) times
    //   Σ_k |x_k|·|W1_ki| + |b1_i| of exact in either run; GELU's slope is below 1.2 (1.13 for
    //   candle's tanh form), so the two h_i differ by at most 2·1.2·γ_(H+2)·(that), which W2
    //   carries into y_j: the S1 term. GELU rounds too, a few ulps of h_i in either run (a
    //   different value only where the inputs differ): 16·u·S2 covers 8 ulps each.
    // Both are worst cases; rounding errors, which mostly cancel, make the real difference
    // orders of magnitude smaller, and an error of the method (a wrong slice, a missing or
    // doubled partial sum) shows as a difference of the size of y itself, far above it.
    let tol = 2.0 * gamma(o.ffn + p.world + 1) * f64::from(s2)
        + 2.0 * 1.2 * gamma(o.hidden + 2) * f64::from(s1)
        + 16.0 * U * f64::from(s2);
    let pass = f64::from(delta) <= tol && delta.is_finite();
    println!(
        "tensor-parallel over {} ranks vs one GPU: y is {} x {}, max |y| = {top:.4}",
        p.world, o.batch, o.hidden
    );
    println!("max |Δ| = {delta:.3e} (tolerance {tol:.3e})");
    println!("{}", if pass { "PASS" } else { "FAIL" });
    Ok(pass)
}

fn main() -> ExitCode {
    let o = match parse(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("candle-tp: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let p = match place() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("candle-tp: {e}");
            return ExitCode::from(2);
        }
    };
    if o.ffn % p.world != 0 {
        eprintln!(
            "candle-tp: --ffn {} is not a multiple of WORLD_SIZE {}: W1's columns and W2's rows \
             are split evenly",
            o.ffn, p.world
        );
        return ExitCode::from(2);
    }
    if o.check_only {
        let part = o.ffn / p.world;
        println!(
            "rank {} of {} on GPU {}{}: x {}x{}, W1[:, {}..{}], W2[{}..{}, :], launcher: {}",
            p.rank,
            p.world,
            if o.same_device { 0 } else { p.local_rank },
            if o.same_device {
                " (--same-device)"
            } else {
                ""
            },
            o.batch,
            o.hidden,
            p.rank * part,
            (p.rank + 1) * part,
            p.rank * part,
            (p.rank + 1) * part,
            p.launch.as_ref().map_or("none (one rank)", |e| e.source)
        );
        let missing = missing_libraries();
        if missing.is_empty() {
            println!("rank {}: cuBLAS and cuRAND found", p.rank);
        } else {
            println!("rank {}: warning: {}", p.rank, libraries_message(&missing));
        }
        return ExitCode::SUCCESS;
    }
    match run(&o, &p) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("candle-tp (rank {}): {e}", p.rank);
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    fn args(a: &[&str]) -> impl Iterator<Item = String> {
        a.iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn options() {
        let o = parse(args(&["--ffn=64", "--hidden", "32", "--same-device"]))
            .unwrap()
            .unwrap();
        assert_eq!((o.ffn, o.hidden, o.batch, o.same_device), (64, 32, 8, true));
        assert!(parse(args(&["--help"])).unwrap().is_none());
        assert!(parse(args(&["--ffn", "0"])).is_err());
        assert!(parse(args(&["--ffn"])).is_err());
        assert!(parse(args(&["--bogus"])).is_err());
    }

    #[test]
    fn weights_are_the_same_everywhere_and_in_range() {
        let a = uniform(7, 1000, 0.5);
        assert_eq!(a, uniform(7, 1000, 0.5));
        assert_ne!(a, uniform(8, 1000, 0.5));
        assert!(a.iter().all(|v| (-0.5..0.5).contains(v)));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.05, "mean {mean}");
    }

    #[test]
    fn the_split_reproduces_the_whole_on_the_cpu() {
        // The algebra of the split, on the CPU (no all-reduce): Σ_r gelu(x·W1_r + b1_r)·W2_r
        // is gelu(x·W1 + b1)·W2.
        let o = parse(args(&["--batch", "3", "--hidden", "16", "--ffn", "32"]))
            .unwrap()
            .unwrap();
        let m = model(&o).unwrap();
        let whole = m.x.matmul(&m.w1).unwrap().broadcast_add(&m.b1).unwrap();
        let whole = whole.gelu().unwrap().matmul(&m.w2).unwrap();
        let mut sum = whole.zeros_like().unwrap();
        for r in 0..4 {
            let (first, part) = (r * 8, 8);
            let w1 = m.w1.narrow(1, first, part).unwrap().contiguous().unwrap();
            let b1 = m.b1.narrow(0, first, part).unwrap();
            let w2 = m.w2.narrow(0, first, part).unwrap().contiguous().unwrap();
            let h = m.x.matmul(&w1).unwrap().broadcast_add(&b1).unwrap();
            sum = (sum + h.gelu().unwrap().matmul(&w2).unwrap()).unwrap();
        }
        let d = (sum - whole).unwrap().abs().unwrap().max_all().unwrap();
        assert!(d.to_scalar::<f32>().unwrap() < 1e-5);
        assert_eq!(DType::F32, m.x.dtype());
    }
}
