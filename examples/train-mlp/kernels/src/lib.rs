//! The element-wise and loss kernels of the `train_mlp` example, in `#![no_std]` Rust.
//!
//! Each kernel is a thin `extern "ptx-kernel"` shell (nvptx64 only) around a function of one
//! element index that is plain Rust, so the CPU tests run the same arithmetic. `cargo xtask
//! build-ptx` compiles this crate to `examples/train-mlp/ptx/train_mlp.ptx` (PTX for sm_80,
//! which the driver JIT-compiles for any GPU from compute capability 8.0 up).
//!
//! Kernels (every pointer a device address, every count `u64`, grid-stride loops, so any grid
//! is correct unless a kernel says otherwise):
//! * `fill_uniform(out, n, seed, offset, scale)`: `out[i] = scale * u(seed, offset + i)`, `u`
//!   uniform in [-1, 1) from a counter-based hash ([`uniform`]);
//! * `fill_const(out, n, value)`;
//! * `bias_act(z, b, rows, n, relu)`: `z[i] += b[i % rows]`, then `max(z, 0)` if `relu != 0`
//!   (column-major activations: one sample per column of `rows` features);
//! * `relu_backward(dh, h, n)`: `dh[i] = 0` where `h[i] <= 0`;
//! * `mse_grad(out, y, d, n, scale, partial)`: `d[i] = scale * (out[i] - y[i])`, and thread
//!   `t` of the grid writes `partial[t]`, its share of `sum (out - y)^2` (so `partial` holds
//!   one value per launched thread);
//! * `sum_chunks(src, chunk, n_out, dst, scale)`: `dst[t] = scale * sum(src[t*chunk ..
//!   (t+1)*chunk])` for `t < n_out`, summed in index order (deterministic);
//! * `sgd(w, g, n, lr)`: `w[i] -= lr * g[i]`.
//!
//! ```
//! use train_mlp_kernels::uniform;
//! let a = uniform(7, 0);
//! assert!((-1.0..1.0).contains(&a));
//! assert_eq!(a, uniform(7, 0)); // a pure function of (seed, index)
//! ```
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]

/// SplitMix64's finaliser: a bijective mix of 64 bits.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform value in [-1, 1) for element `index` of stream `seed`: the top 24 bits of a hash,
/// so every value is an exact f32.
///
/// ```
/// let v = train_mlp_kernels::uniform(1, 42);
/// assert!(v >= -1.0 && v < 1.0);
/// ```
#[inline(always)]
pub fn uniform(seed: u64, index: u64) -> f32 {
    let h = mix64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix64(index));
    let bits = (h >> 40) as u32; // 24 bits
    (bits as f32) * (1.0 / 8_388_608.0) - 1.0
}

/// `z + b`, then `max(., 0)` when `relu`.
///
/// ```
/// assert_eq!(train_mlp_kernels::bias_act(-2.0, 1.0, true), 0.0);
/// assert_eq!(train_mlp_kernels::bias_act(-2.0, 1.0, false), -1.0);
/// ```
#[inline(always)]
pub fn bias_act(z: f32, b: f32, relu: bool) -> f32 {
    let v = z + b;
    if relu && v <= 0.0 {
        0.0
    } else {
        v
    }
}

/// The gradient through a ReLU whose output was `h`.
///
/// ```
/// assert_eq!(train_mlp_kernels::relu_backward(3.0, 0.0), 0.0);
/// assert_eq!(train_mlp_kernels::relu_backward(3.0, 0.5), 3.0);
/// ```
#[inline(always)]
pub fn relu_backward(dh: f32, h: f32) -> f32 {
    if h > 0.0 {
        dh
    } else {
        0.0
    }
}

/// One SGD update.
///
/// ```
/// assert_eq!(train_mlp_kernels::sgd(1.0, 2.0, 0.25), 0.5);
/// ```
#[inline(always)]
pub fn sgd(w: f32, g: f32, lr: f32) -> f32 {
    w - lr * g
}

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _thread_idx_x};

    /// (this thread's index, threads in the grid)
    #[inline(always)]
    fn grid() -> (u64, u64) {
        // SAFETY: reading special registers has no side effects.
        unsafe {
            let block = _block_dim_x() as u64;
            (
                _block_idx_x() as u64 * block + _thread_idx_x() as u64,
                _grid_dim_x() as u64 * block,
            )
        }
    }

    /// # Safety
    /// `out` valid for `n` elements.
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn fill_uniform(
        out: *mut f32,
        n: u64,
        seed: u64,
        offset: u64,
        scale: f32,
    ) {
        let (mut i, step) = grid();
        while i < n {
            // SAFETY: i < n.
            unsafe { *out.add(i as usize) = scale * crate::uniform(seed, offset + i) };
            i += step;
        }
    }

    /// # Safety
    /// `out` valid for `n` elements.
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn fill_const(out: *mut f32, n: u64, value: f32) {
        let (mut i, step) = grid();
        while i < n {
            // SAFETY: i < n.
            unsafe { *out.add(i as usize) = value };
            i += step;
        }
    }

    /// # Safety
    /// `z` valid for `n` elements, `b` for `rows` (nothing happens if `rows` is 0).
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn bias_act(
        z: *mut f32,
        b: *const f32,
        rows: u64,
        n: u64,
        relu: u32,
    ) {
        if rows == 0 {
            return;
        }
        let (mut i, step) = grid();
        while i < n {
            // SAFETY: i < n and i % rows < rows.
            unsafe {
                let p = z.add(i as usize);
                *p = crate::bias_act(*p, *b.add((i % rows) as usize), relu != 0);
            }
            i += step;
        }
    }

    /// # Safety
    /// `dh` and `h` valid for `n` elements.
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn relu_backward(dh: *mut f32, h: *const f32, n: u64) {
        let (mut i, step) = grid();
        while i < n {
            // SAFETY: i < n.
            unsafe {
                let p = dh.add(i as usize);
                *p = crate::relu_backward(*p, *h.add(i as usize));
            }
            i += step;
        }
    }

    /// # Safety
    /// `out`, `y`, `d` valid for `n` elements, `partial` for one value per launched thread.
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn mse_grad(
        out: *const f32,
        y: *const f32,
        d: *mut f32,
        n: u64,
        scale: f32,
        partial: *mut f32,
    ) {
        let (t, step) = grid();
        let mut i = t;
        let mut acc = 0.0f32;
        while i < n {
            // SAFETY: i < n.
            unsafe {
                let e = *out.add(i as usize) - *y.add(i as usize);
                acc += e * e;
                *d.add(i as usize) = scale * e;
            }
            i += step;
        }
        // SAFETY: one slot per launched thread.
        unsafe { *partial.add(t as usize) = acc };
    }

    /// # Safety
    /// `src` valid for `chunk * n_out` elements, `dst` for `n_out`.
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn sum_chunks(
        src: *const f32,
        chunk: u64,
        n_out: u64,
        dst: *mut f32,
        scale: f32,
    ) {
        let (mut t, step) = grid();
        while t < n_out {
            let mut acc = 0.0f32;
            let mut k = 0;
            while k < chunk {
                // SAFETY: t * chunk + k < n_out * chunk.
                acc += unsafe { *src.add((t * chunk + k) as usize) };
                k += 1;
            }
            // SAFETY: t < n_out.
            unsafe { *dst.add(t as usize) = scale * acc };
            t += step;
        }
    }

    /// # Safety
    /// `w` and `g` valid for `n` elements.
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn sgd(w: *mut f32, g: *const f32, n: u64, lr: f32) {
        let (mut i, step) = grid();
        while i < n {
            // SAFETY: i < n.
            unsafe {
                let p = w.add(i as usize);
                *p = crate::sgd(*p, *g.add(i as usize), lr);
            }
            i += step;
        }
    }

    #[panic_handler]
    fn panic(_: &core::panic::PanicInfo) -> ! {
        // No kernel has a panic path (the build checks the PTX for calls); trap if one ever did.
        // SAFETY: `trap` aborts the kernel; it has no other effect.
        unsafe { core::arch::asm!("trap;", options(noreturn)) }
    }
}

/// The kernels' names, in the order of the PTX (`cargo xtask build-ptx` checks the PTX has
/// exactly these entry points).
///
/// ```
/// assert!(train_mlp_kernels::ENTRY_POINTS.contains(&"sgd"));
/// ```
pub const ENTRY_POINTS: [&str; 7] = [
    "bias_act",
    "fill_const",
    "fill_uniform",
    "mse_grad",
    "relu_backward",
    "sgd",
    "sum_chunks",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_covers_the_range_evenly() {
        let n = 100_000u64;
        let mut sum = 0.0f64;
        let mut lo = 0u32;
        for i in 0..n {
            let v = uniform(3, i);
            assert!((-1.0..1.0).contains(&v), "{v}");
            sum += v as f64;
            if v < 0.0 {
                lo += 1;
            }
        }
        let mean = sum / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        let frac = lo as f64 / n as f64;
        assert!((frac - 0.5).abs() < 0.01, "fraction below 0: {frac}");
    }

    #[test]
    fn streams_differ() {
        let same = (0..1000u64)
            .filter(|&i| uniform(1, i) == uniform(2, i))
            .count();
        assert!(same < 5, "{same} equal values in two seeds");
    }

    #[test]
    fn elementwise_math() {
        assert_eq!(bias_act(1.0, 2.0, true), 3.0);
        assert!(bias_act(f32::NAN, 0.0, true).is_nan());
        assert_eq!(relu_backward(-4.0, 1e-30), -4.0);
        assert_eq!(sgd(0.0, 1.0, 0.5), -0.5);
    }
}
