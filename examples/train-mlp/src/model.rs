//! One replica of the multilayer perceptron on one GPU: parameters in one flat buffer laid
//! out like the reducer's gradients, activations, cuBLAS for the matrix products and the Rust
//! PTX kernels for the rest.
//!
//! Shapes (column-major, as cuBLAS): a batch is `width × batch` (one sample per column);
//! layer `l` has a `width × width` weight `W_l` (parameter `2l`) and a bias `b_l` (`2l + 1`);
//! `h_{l+1} = act(W_l h_l + b_l)`, ReLU on every layer but the last; the loss is the mean
//! squared error against the targets.

use std::ops::Range;
use std::sync::Arc;

use ringccl::cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use ringccl::cudarc::cublas::{CudaBlas, Gemm, GemmConfig, Gemv, GemvConfig};
use ringccl::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};
use ringccl::cudarc::nvrtc::Ptx;

use crate::Fail;

/// The kernels' PTX (built by `cargo xtask build-ptx` from `examples/train-mlp/kernels`).
const PTX: &str = include_str!("../ptx/train_mlp.ptx");

/// Threads of the loss's first pass (each writes one partial sum): 256 blocks × 256.
const LOSS_BLOCKS: u32 = 256;
const LOSS_THREADS: u32 = 256;

/// The element-wise kernels, loaded on one GPU.
pub struct Kernels {
    fill_uniform: CudaFunction,
    fill_const: CudaFunction,
    bias_act: CudaFunction,
    relu_backward: CudaFunction,
    mse_grad: CudaFunction,
    sum_chunks: CudaFunction,
    sgd: CudaFunction,
}

impl Kernels {
    fn load(stream: &Arc<CudaStream>) -> Result<Self, Fail> {
        let module = stream
            .context()
            .load_module(Ptx::from_src(PTX))
            .map_err(|e| Fail::cuda("loading the kernels' PTX", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| Fail::cuda(&format!("finding kernel {name}"), e))
        };
        Ok(Kernels {
            fill_uniform: f("fill_uniform")?,
            fill_const: f("fill_const")?,
            bias_act: f("bias_act")?,
            relu_backward: f("relu_backward")?,
            mse_grad: f("mse_grad")?,
            sum_chunks: f("sum_chunks")?,
            sgd: f("sgd")?,
        })
    }
}

/// A grid for `n` elements of a grid-stride kernel: up to 4 blocks per SM-ish, 256 threads.
fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1056) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Where the backward pass writes gradients and whom it tells.
pub trait GradSink {
    /// The view of parameter `param`'s gradient.
    fn grad(&mut self, param: usize) -> Result<CudaViewMut<'_, f32>, Fail>;
    /// Parameter `param`'s gradient is enqueued.
    fn ready(&mut self, param: usize) -> Result<(), Fail>;
}

/// Gradients in a flat buffer of the replica's own (no communication).
pub struct LocalGrads<'a> {
    pub grads: &'a mut CudaSlice<f32>,
    pub ranges: &'a [Range<usize>],
}

impl GradSink for LocalGrads<'_> {
    fn grad(&mut self, param: usize) -> Result<CudaViewMut<'_, f32>, Fail> {
        Ok(self.grads.slice_mut(self.ranges[param].clone()))
    }
    fn ready(&mut self, _param: usize) -> Result<(), Fail> {
        Ok(())
    }
}

/// The model's size and the run's settings that shape the buffers.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub layers: usize,
    pub width: usize,
    /// Samples per step on this replica.
    pub batch: usize,
    /// Distinct batches the data cycles through.
    pub batches: usize,
    /// Steps (slots of the loss history).
    pub steps: usize,
}

/// One replica.
pub struct Replica {
    pub stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
    pub shape: Shape,
    /// Elements of each parameter in `params` (the reducer's layout).
    pub ranges: Vec<Range<usize>>,
    pub params: CudaSlice<f32>,
    /// Inputs and targets, `batches` batches of `width × batch`.
    x: CudaSlice<f32>,
    y: CudaSlice<f32>,
    /// `h_1 .. h_L`.
    acts: Vec<CudaSlice<f32>>,
    dz: CudaSlice<f32>,
    dh: CudaSlice<f32>,
    ones: CudaSlice<f32>,
    partial: CudaSlice<f32>,
    partial2: CudaSlice<f32>,
    /// The loss of every step (this replica's batch).
    pub losses: CudaSlice<f32>,
}

/// Seeds of the random streams.
const SEED_PARAMS: u64 = 1;
const SEED_DATA: u64 = 2;
const SEED_TEACHER: u64 = 3;

impl Replica {
    /// A replica with parameters initialised as He et al. for ReLU layers (weights uniform in
    /// ±√(6/fan_in), biases in ±1/√fan_in; the same on every replica), laid out by `ranges` in a buffer of
    /// `flat_len`, and the data of `samples`: for each `(rank, n)` in `parts`, the `n`-sample
    /// batches of that rank, side by side (the reference replica holds every rank's batch).
    pub fn new(
        stream: Arc<CudaStream>,
        shape: Shape,
        ranges: Vec<Range<usize>>,
        flat_len: usize,
        parts: &[usize],
        world: usize,
    ) -> Result<Self, Fail> {
        let alloc = |n: usize| {
            stream
                .alloc_zeros::<f32>(n)
                .map_err(|e| Fail::cuda("allocating GPU memory", e))
        };
        let blas = CudaBlas::new(stream.clone()).map_err(|e| Fail::Cuda {
            what: "creating a cuBLAS handle".into(),
            detail: format!("{e:?}"),
        })?;
        let k = Kernels::load(&stream)?;
        let (w, b) = (shape.width, shape.batch);
        let mut r = Replica {
            params: alloc(flat_len)?,
            x: alloc(shape.batches * w * b)?,
            y: alloc(shape.batches * w * b)?,
            acts: (0..shape.layers)
                .map(|_| alloc(w * b))
                .collect::<Result<_, _>>()?,
            dz: alloc(w * b)?,
            dh: alloc(w * b)?,
            ones: alloc(b)?,
            partial: alloc((LOSS_BLOCKS * LOSS_THREADS) as usize)?,
            partial2: alloc(LOSS_THREADS as usize)?,
            losses: alloc(shape.steps.max(1))?,
            blas,
            k,
            shape,
            ranges,
            stream: stream.clone(),
        };
        // Parameters.
        for l in 0..shape.layers {
            for (p, scale) in [
                (2 * l, (6.0 / w as f32).sqrt()),
                (2 * l + 1, 1.0 / (w as f32).sqrt()),
            ] {
                let range = r.ranges[p].clone();
                let mut view = r.params.slice_mut(range);
                fill_uniform(
                    &r.stream,
                    &r.k,
                    &mut view,
                    SEED_PARAMS,
                    (p as u64) << 40,
                    scale,
                )?;
            }
        }
        {
            let mut ones = r.ones.slice_mut(..);
            let n = ones.len();
            // SAFETY: `ones` holds n f32.
            unsafe {
                r.stream
                    .launch_builder(&r.k.fill_const)
                    .arg(&mut ones)
                    .arg(&(n as u64))
                    .arg(&1.0f32)
                    .launch(grid(n))
            }
            .map_err(|e| Fail::cuda("fill_const", e))?;
        }
        // Data: the batch of (cycle c, rank) is uniform inputs and a fixed random linear
        // teacher's outputs; each part is generated with the same calls on every GPU, so the
        // reference replica holds the ranks' batches bit for bit.
        let mut teacher = alloc(w * w)?;
        {
            let mut t = teacher.slice_mut(..);
            fill_uniform(
                &r.stream,
                &r.k,
                &mut t,
                SEED_TEACHER,
                0,
                (3.0 / w as f32).sqrt(),
            )?;
        }
        let part = b / parts.len().max(1);
        for c in 0..shape.batches {
            for (i, &rank) in parts.iter().enumerate() {
                let start = (c * b + i * part) * w;
                let offset = ((c * world + rank) * part * w) as u64;
                let mut xv = r.x.slice_mut(start..start + part * w);
                fill_uniform(&r.stream, &r.k, &mut xv, SEED_DATA, offset, 1.0)?;
                let xv = r.x.slice(start..start + part * w);
                let mut yv = r.y.slice_mut(start..start + part * w);
                gemm(
                    &r.stream,
                    &r.blas,
                    false,
                    false,
                    w,
                    part,
                    w,
                    &teacher.slice(..),
                    w,
                    &xv,
                    w,
                    &mut yv,
                    w,
                )?;
            }
        }
        drop(teacher);
        Ok(r)
    }

    /// The input of step `step`.
    fn batch_range(&self, step: usize) -> Range<usize> {
        let n = self.shape.width * self.shape.batch;
        let c = step % self.shape.batches;
        c * n..(c + 1) * n
    }

    /// Forward pass and loss of step `step` (into `losses[step]`), and the loss's gradient
    /// `grad_scale * (out - y)` into `dz`. Everything is enqueued on the replica's stream.
    pub fn forward(&mut self, step: usize, grad_scale: f32) -> Result<(), Fail> {
        let (w, b) = (self.shape.width, self.shape.batch);
        let n = w * b;
        let layers = self.shape.layers;
        let input = self.batch_range(step);
        for l in 0..layers {
            let (done, rest) = self.acts.split_at_mut(l);
            let out = &mut rest[0];
            let wl = self.params.slice(self.ranges[2 * l].clone());
            let bl = self.params.slice(self.ranges[2 * l + 1].clone());
            let h = match l {
                0 => self.x.slice(input.clone()),
                _ => done[l - 1].slice(..),
            };
            let mut z = out.slice_mut(..);
            gemm(
                &self.stream,
                &self.blas,
                false,
                false,
                w,
                b,
                w,
                &wl,
                w,
                &h,
                w,
                &mut z,
                w,
            )?;
            let relu = u32::from(l + 1 < layers);
            // SAFETY: z holds n = rows * b f32, the bias `rows`.
            unsafe {
                self.stream
                    .launch_builder(&self.k.bias_act)
                    .arg(&mut z)
                    .arg(&bl)
                    .arg(&(w as u64))
                    .arg(&(n as u64))
                    .arg(&relu)
                    .launch(grid(n))
            }
            .map_err(|e| Fail::cuda("bias_act", e))?;
        }
        let out = self.acts[layers - 1].slice(..);
        let y = self.y.slice(input);
        // SAFETY: out, y, dz hold n f32; partial one f32 per launched thread.
        unsafe {
            self.stream
                .launch_builder(&self.k.mse_grad)
                .arg(&out)
                .arg(&y)
                .arg(&mut self.dz)
                .arg(&(n as u64))
                .arg(&grad_scale)
                .arg(&mut self.partial)
                .launch(LaunchConfig {
                    grid_dim: (LOSS_BLOCKS, 1, 1),
                    block_dim: (LOSS_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
        }
        .map_err(|e| Fail::cuda("mse_grad", e))?;
        let chunk = LOSS_BLOCKS as u64;
        // SAFETY: partial holds LOSS_THREADS × chunk f32, partial2 LOSS_THREADS.
        unsafe {
            self.stream
                .launch_builder(&self.k.sum_chunks)
                .arg(&self.partial)
                .arg(&chunk)
                .arg(&(LOSS_THREADS as u64))
                .arg(&mut self.partial2)
                .arg(&1.0f32)
                .launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (LOSS_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
        }
        .map_err(|e| Fail::cuda("sum_chunks", e))?;
        let slot = step.min(self.losses.len() - 1);
        let mut loss = self.losses.slice_mut(slot..slot + 1);
        // SAFETY: partial2 holds LOSS_THREADS f32, the loss slot one.
        unsafe {
            self.stream
                .launch_builder(&self.k.sum_chunks)
                .arg(&self.partial2)
                .arg(&(LOSS_THREADS as u64))
                .arg(&1u64)
                .arg(&mut loss)
                .arg(&(1.0 / n as f32))
                .launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (1, 1, 1),
                    shared_mem_bytes: 0,
                })
        }
        .map_err(|e| Fail::cuda("sum_chunks", e))?;
        Ok(())
    }

    /// Backward through layer `l` (call for `l = L-1` down to 0 after [`Replica::forward`]):
    /// the gradients of `W_l` and `b_l` into `sink` (then marked ready), and, for `l > 0`,
    /// the gradient of the layer below's output.
    pub fn backward_layer(
        &mut self,
        step: usize,
        l: usize,
        sink: &mut dyn GradSink,
    ) -> Result<(), Fail> {
        let (w, b) = (self.shape.width, self.shape.batch);
        let input = self.batch_range(step);
        {
            let h = match l {
                0 => self.x.slice(input),
                _ => self.acts[l - 1].slice(..),
            };
            let dz = self.dz.slice(..);
            // dW = dz · hᵀ
            gemm(
                &self.stream,
                &self.blas,
                false,
                true,
                w,
                w,
                b,
                &dz,
                w,
                &h,
                w,
                &mut sink.grad(2 * l)?,
                w,
            )?;
            // db = dz · 1
            let ones = self.ones.slice(..);
            gemv(
                &self.stream,
                &self.blas,
                w,
                b,
                &dz,
                w,
                &ones,
                &mut sink.grad(2 * l + 1)?,
            )?;
        }
        sink.ready(2 * l)?;
        sink.ready(2 * l + 1)?;
        if l > 0 {
            self.input_gradient(l)?;
            std::mem::swap(&mut self.dz, &mut self.dh);
        }
        Ok(())
    }

    /// `dh = W_lᵀ · dz`, then through the ReLU of `h_l`.
    fn input_gradient(&mut self, l: usize) -> Result<(), Fail> {
        let (w, b) = (self.shape.width, self.shape.batch);
        {
            let wl = self.params.slice(self.ranges[2 * l].clone());
            let dz = self.dz.slice(..);
            let mut dh = self.dh.slice_mut(..);
            // dh = Wᵀ · dz, then through the ReLU of h_l.
            gemm(
                &self.stream,
                &self.blas,
                true,
                false,
                w,
                b,
                w,
                &wl,
                w,
                &dz,
                w,
                &mut dh,
                w,
            )?;
            let h = self.acts[l - 1].slice(..);
            let n = w * b;
            // SAFETY: dh and h hold n f32.
            unsafe {
                self.stream
                    .launch_builder(&self.k.relu_backward)
                    .arg(&mut dh)
                    .arg(&h)
                    .arg(&(n as u64))
                    .launch(grid(n))
            }
            .map_err(|e| Fail::cuda("relu_backward", e))?;
        }
        Ok(())
    }

    /// `params -= lr * grads` over the whole flat buffer.
    pub fn sgd(&mut self, grads: &CudaSlice<f32>, lr: f32) -> Result<(), Fail> {
        let n = self.params.len();
        // SAFETY: params and grads hold n f32 (the same layout).
        unsafe {
            self.stream
                .launch_builder(&self.k.sgd)
                .arg(&mut self.params)
                .arg(grads)
                .arg(&(n as u64))
                .arg(&lr)
                .launch(grid(n))
        }
        .map_err(|e| Fail::cuda("sgd", e))?;
        Ok(())
    }
}

/// `out[i] = scale * uniform(seed, offset + i)`.
fn fill_uniform(
    stream: &CudaStream,
    k: &Kernels,
    out: &mut CudaViewMut<'_, f32>,
    seed: u64,
    offset: u64,
    scale: f32,
) -> Result<(), Fail> {
    let n = out.len();
    // SAFETY: `out` holds n f32; the kernel writes out[0..n].
    unsafe {
        stream
            .launch_builder(&k.fill_uniform)
            .arg(out)
            .arg(&(n as u64))
            .arg(&seed)
            .arg(&offset)
            .arg(&scale)
            .launch(grid(n))
    }
    .map_err(|e| Fail::cuda("fill_uniform", e))?;
    Ok(())
}

/// `c = op(a) · op(b)` (column-major, `m × n`, inner `k`).
#[allow(clippy::too_many_arguments)]
fn gemm(
    stream: &CudaStream,
    blas: &CudaBlas,
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    a: &CudaView<'_, f32>,
    lda: usize,
    b: &CudaView<'_, f32>,
    ldb: usize,
    c: &mut CudaViewMut<'_, f32>,
    ldc: usize,
) -> Result<(), Fail> {
    let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
    let cfg = GemmConfig {
        transa: op(ta),
        transb: op(tb),
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: 1.0f32,
        lda: lda as i32,
        ldb: ldb as i32,
        beta: 0.0f32,
        ldc: ldc as i32,
    };
    let (a_need, b_need) = (
        if ta { m } else { k } * lda.max(1),
        if tb { k } else { n } * ldb.max(1),
    );
    if a.len() < a_need || b.len() < b_need || c.len() < n * ldc {
        return Err(Fail::Usage(format!(
            "gemm operands too small ({} < {a_need}, {} < {b_need} or {} < {})",
            a.len(),
            b.len(),
            c.len(),
            n * ldc
        )));
    }
    // cuBLAS works on the current context's device: make the handle's current (a collective
    // enqueued in between may have switched to another GPU's).
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Fail::cuda("cuCtxSetCurrent", e))?;
    // SAFETY: the operands were checked to hold the matrices the configuration describes.
    unsafe { blas.gemm(cfg, a, b, c) }.map_err(|e| Fail::Cuda {
        what: "cuBLAS sgemm".into(),
        detail: format!("{e:?}"),
    })
}

/// `y = a · x` (`a` column-major `m × n`).
#[allow(clippy::too_many_arguments)]
fn gemv(
    stream: &CudaStream,
    blas: &CudaBlas,
    m: usize,
    n: usize,
    a: &CudaView<'_, f32>,
    lda: usize,
    x: &CudaView<'_, f32>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<(), Fail> {
    if a.len() < n * lda || x.len() < n || y.len() < m {
        return Err(Fail::Usage("gemv operands too small".into()));
    }
    let cfg = GemvConfig {
        trans: CUBLAS_OP_N,
        m: m as i32,
        n: n as i32,
        alpha: 1.0f32,
        lda: lda as i32,
        incx: 1,
        beta: 0.0f32,
        incy: 1,
    };
    // cuBLAS works on the current context's device: make the handle's current (a collective
    // enqueued in between may have switched to another GPU's).
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Fail::cuda("cuCtxSetCurrent", e))?;
    // SAFETY: the operands were checked above.
    unsafe { blas.gemv(cfg, a, x, y) }.map_err(|e| Fail::Cuda {
        what: "cuBLAS sgemv".into(),
        detail: format!("{e:?}"),
    })
}
