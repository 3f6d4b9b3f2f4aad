//! The `extern "ptx-kernel"` entry points (nvptx64 only): one per primitive × type (× operator),
//! each a thin shell that computes the thread's grid position and calls [`crate::prim`].
//! The table below is the single list; `crate::entry::ENTRY_POINTS` mirrors it for the host and
//! the build checks that the PTX holds exactly these names.

use crate::element::{Bf16, F16};
use crate::op::{Avg, Max, Min, Prod, Sum};
use crate::prim::{reduce_copy, Grid, MAX_SRCS};
use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _thread_idx_x};

#[inline(always)]
fn grid() -> Grid {
    // SAFETY: reading special registers has no side effects.
    unsafe {
        let block = _block_dim_x() as usize;
        Grid {
            thread: _block_idx_x() as usize * block + _thread_idx_x() as usize,
            threads: _grid_dim_x() as usize * block,
        }
    }
}

macro_rules! entry_points {
    ($($kind:ident $name:ident : $t:ty $(, $op:ty)?;)*) => {$( entry_points!(@one $kind $name $t $(, $op)?); )*};
    (@one copy $name:ident $t:ty) => {
        /// `dst0[i] = src[i]` (and `dst1[i]` when `dst1` is not null) for `i < count`.
        ///
        /// # Safety
        /// Device pointers valid for `count` elements; `dst1` may be null.
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(src: *const $t, dst0: *mut $t, dst1: *mut $t, count: u64) {
            // SAFETY: forwarded from the kernel's contract.
            unsafe { reduce_copy::<$t, Sum, 1>(grid(), [src], 1, dst0, dst1, count as usize, 1) }
        }
    };
    (@one reduce $name:ident $t:ty, $op:ty) => {
        /// `dst[i] = finish(s0[i] ⊕ … ⊕ s{nsrc-1}[i])` for `i < count`, `2 ≤ nsrc ≤ 8`.
        ///
        /// # Safety
        /// The first `nsrc` sources and `dst` valid for `count` elements.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            s0: *const $t, s1: *const $t, s2: *const $t, s3: *const $t,
            s4: *const $t, s5: *const $t, s6: *const $t, s7: *const $t,
            nsrc: u32, dst: *mut $t, count: u64, postdiv: u32,
        ) {
            let srcs: [*const $t; MAX_SRCS] = [s0, s1, s2, s3, s4, s5, s6, s7];
            // SAFETY: forwarded from the kernel's contract.
            unsafe {
                reduce_copy::<$t, $op, MAX_SRCS>(grid(), srcs, nsrc as usize, dst,
                    core::ptr::null_mut(), count as usize, postdiv)
            }
        }
    };
    (@one reduce_copy $name:ident $t:ty, $op:ty) => {
        /// `dst0[i] = finish(a[i] ⊕ b[i])` (and `dst1[i]` when not null) for `i < count`.
        ///
        /// # Safety
        /// Device pointers valid for `count` elements; `dst1` may be null.
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(
            a: *const $t, b: *const $t, dst0: *mut $t, dst1: *mut $t, count: u64, postdiv: u32,
        ) {
            // SAFETY: forwarded from the kernel's contract.
            unsafe { reduce_copy::<$t, $op, 2>(grid(), [a, b], 2, dst0, dst1, count as usize, postdiv) }
        }
    };
    (@one oneshot $name:ident $t:ty, $op:ty) => {
        /// One-shot all-reduce of `count` elements over `nsrc` ranks (one block per rank; see
        /// `crate::oneshot`): `dst[i] = finish(s0[i] ⊕ … ⊕ s{nsrc-1}[i])`, sources in rank order.
        ///
        /// # Safety
        /// See `crate::oneshot::all_reduce`.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            s0: *const $t, s1: *const $t, s2: *const $t, s3: *const $t,
            s4: *const $t, s5: *const $t, s6: *const $t, s7: *const $t,
            nsrc: u32, dst: *mut $t, tmp: *mut $t, count: u64, postdiv: u32,
            my_flags: *mut u64,
            f0: *mut u64, f1: *mut u64, f2: *mut u64, f3: *mut u64,
            f4: *mut u64, f5: *mut u64, f6: *mut u64, f7: *mut u64,
            rank: u32,
        ) {
            let srcs: [*const $t; MAX_SRCS] = [s0, s1, s2, s3, s4, s5, s6, s7];
            let flags: [*mut u64; MAX_SRCS] = [f0, f1, f2, f3, f4, f5, f6, f7];
            // SAFETY: forwarded from the kernel's contract.
            unsafe {
                crate::oneshot::all_reduce::<$t, $op>(srcs, nsrc as usize, dst, tmp,
                    count as usize, postdiv, my_flags, flags, rank as usize)
            }
        }
    };
}

entry_points! {
    copy ringccl_copy_f32: f32;
    copy ringccl_copy_f64: f64;
    copy ringccl_copy_f16: F16;
    copy ringccl_copy_bf16: Bf16;
    copy ringccl_copy_i8: i8;
    copy ringccl_copy_u8: u8;
    copy ringccl_copy_i32: i32;
    copy ringccl_copy_u32: u32;
    copy ringccl_copy_i64: i64;
    copy ringccl_copy_u64: u64;
    reduce ringccl_reduce_sum_f32: f32, Sum;
    reduce ringccl_reduce_prod_f32: f32, Prod;
    reduce ringccl_reduce_min_f32: f32, Min;
    reduce ringccl_reduce_max_f32: f32, Max;
    reduce ringccl_reduce_avg_f32: f32, Avg;
    reduce ringccl_reduce_sum_f64: f64, Sum;
    reduce ringccl_reduce_prod_f64: f64, Prod;
    reduce ringccl_reduce_min_f64: f64, Min;
    reduce ringccl_reduce_max_f64: f64, Max;
    reduce ringccl_reduce_avg_f64: f64, Avg;
    reduce ringccl_reduce_sum_f16: F16, Sum;
    reduce ringccl_reduce_prod_f16: F16, Prod;
    reduce ringccl_reduce_min_f16: F16, Min;
    reduce ringccl_reduce_max_f16: F16, Max;
    reduce ringccl_reduce_avg_f16: F16, Avg;
    reduce ringccl_reduce_sum_bf16: Bf16, Sum;
    reduce ringccl_reduce_prod_bf16: Bf16, Prod;
    reduce ringccl_reduce_min_bf16: Bf16, Min;
    reduce ringccl_reduce_max_bf16: Bf16, Max;
    reduce ringccl_reduce_avg_bf16: Bf16, Avg;
    reduce ringccl_reduce_sum_i8: i8, Sum;
    reduce ringccl_reduce_prod_i8: i8, Prod;
    reduce ringccl_reduce_min_i8: i8, Min;
    reduce ringccl_reduce_max_i8: i8, Max;
    reduce ringccl_reduce_avg_i8: i8, Avg;
    reduce ringccl_reduce_sum_u8: u8, Sum;
    reduce ringccl_reduce_prod_u8: u8, Prod;
    reduce ringccl_reduce_min_u8: u8, Min;
    reduce ringccl_reduce_max_u8: u8, Max;
    reduce ringccl_reduce_avg_u8: u8, Avg;
    reduce ringccl_reduce_sum_i32: i32, Sum;
    reduce ringccl_reduce_prod_i32: i32, Prod;
    reduce ringccl_reduce_min_i32: i32, Min;
    reduce ringccl_reduce_max_i32: i32, Max;
    reduce ringccl_reduce_avg_i32: i32, Avg;
    reduce ringccl_reduce_sum_u32: u32, Sum;
    reduce ringccl_reduce_prod_u32: u32, Prod;
    reduce ringccl_reduce_min_u32: u32, Min;
    reduce ringccl_reduce_max_u32: u32, Max;
    reduce ringccl_reduce_avg_u32: u32, Avg;
    reduce ringccl_reduce_sum_i64: i64, Sum;
    reduce ringccl_reduce_prod_i64: i64, Prod;
    reduce ringccl_reduce_min_i64: i64, Min;
    reduce ringccl_reduce_max_i64: i64, Max;
    reduce ringccl_reduce_avg_i64: i64, Avg;
    reduce ringccl_reduce_sum_u64: u64, Sum;
    reduce ringccl_reduce_prod_u64: u64, Prod;
    reduce ringccl_reduce_min_u64: u64, Min;
    reduce ringccl_reduce_max_u64: u64, Max;
    reduce ringccl_reduce_avg_u64: u64, Avg;
    reduce_copy ringccl_reduce_copy_sum_f32: f32, Sum;
    reduce_copy ringccl_reduce_copy_prod_f32: f32, Prod;
    reduce_copy ringccl_reduce_copy_min_f32: f32, Min;
    reduce_copy ringccl_reduce_copy_max_f32: f32, Max;
    reduce_copy ringccl_reduce_copy_avg_f32: f32, Avg;
    reduce_copy ringccl_reduce_copy_sum_f64: f64, Sum;
    reduce_copy ringccl_reduce_copy_prod_f64: f64, Prod;
    reduce_copy ringccl_reduce_copy_min_f64: f64, Min;
    reduce_copy ringccl_reduce_copy_max_f64: f64, Max;
    reduce_copy ringccl_reduce_copy_avg_f64: f64, Avg;
    reduce_copy ringccl_reduce_copy_sum_f16: F16, Sum;
    reduce_copy ringccl_reduce_copy_prod_f16: F16, Prod;
    reduce_copy ringccl_reduce_copy_min_f16: F16, Min;
    reduce_copy ringccl_reduce_copy_max_f16: F16, Max;
    reduce_copy ringccl_reduce_copy_avg_f16: F16, Avg;
    reduce_copy ringccl_reduce_copy_sum_bf16: Bf16, Sum;
    reduce_copy ringccl_reduce_copy_prod_bf16: Bf16, Prod;
    reduce_copy ringccl_reduce_copy_min_bf16: Bf16, Min;
    reduce_copy ringccl_reduce_copy_max_bf16: Bf16, Max;
    reduce_copy ringccl_reduce_copy_avg_bf16: Bf16, Avg;
    reduce_copy ringccl_reduce_copy_sum_i8: i8, Sum;
    reduce_copy ringccl_reduce_copy_prod_i8: i8, Prod;
    reduce_copy ringccl_reduce_copy_min_i8: i8, Min;
    reduce_copy ringccl_reduce_copy_max_i8: i8, Max;
    reduce_copy ringccl_reduce_copy_avg_i8: i8, Avg;
    reduce_copy ringccl_reduce_copy_sum_u8: u8, Sum;
    reduce_copy ringccl_reduce_copy_prod_u8: u8, Prod;
    reduce_copy ringccl_reduce_copy_min_u8: u8, Min;
    reduce_copy ringccl_reduce_copy_max_u8: u8, Max;
    reduce_copy ringccl_reduce_copy_avg_u8: u8, Avg;
    reduce_copy ringccl_reduce_copy_sum_i32: i32, Sum;
    reduce_copy ringccl_reduce_copy_prod_i32: i32, Prod;
    reduce_copy ringccl_reduce_copy_min_i32: i32, Min;
    reduce_copy ringccl_reduce_copy_max_i32: i32, Max;
    reduce_copy ringccl_reduce_copy_avg_i32: i32, Avg;
    reduce_copy ringccl_reduce_copy_sum_u32: u32, Sum;
    reduce_copy ringccl_reduce_copy_prod_u32: u32, Prod;
    reduce_copy ringccl_reduce_copy_min_u32: u32, Min;
    reduce_copy ringccl_reduce_copy_max_u32: u32, Max;
    reduce_copy ringccl_reduce_copy_avg_u32: u32, Avg;
    reduce_copy ringccl_reduce_copy_sum_i64: i64, Sum;
    reduce_copy ringccl_reduce_copy_prod_i64: i64, Prod;
    reduce_copy ringccl_reduce_copy_min_i64: i64, Min;
    reduce_copy ringccl_reduce_copy_max_i64: i64, Max;
    reduce_copy ringccl_reduce_copy_avg_i64: i64, Avg;
    reduce_copy ringccl_reduce_copy_sum_u64: u64, Sum;
    reduce_copy ringccl_reduce_copy_prod_u64: u64, Prod;
    reduce_copy ringccl_reduce_copy_min_u64: u64, Min;
    reduce_copy ringccl_reduce_copy_max_u64: u64, Max;
    reduce_copy ringccl_reduce_copy_avg_u64: u64, Avg;
    oneshot ringccl_oneshot_sum_f32: f32, Sum;
    oneshot ringccl_oneshot_prod_f32: f32, Prod;
    oneshot ringccl_oneshot_min_f32: f32, Min;
    oneshot ringccl_oneshot_max_f32: f32, Max;
    oneshot ringccl_oneshot_avg_f32: f32, Avg;
    oneshot ringccl_oneshot_sum_f64: f64, Sum;
    oneshot ringccl_oneshot_prod_f64: f64, Prod;
    oneshot ringccl_oneshot_min_f64: f64, Min;
    oneshot ringccl_oneshot_max_f64: f64, Max;
    oneshot ringccl_oneshot_avg_f64: f64, Avg;
    oneshot ringccl_oneshot_sum_f16: F16, Sum;
    oneshot ringccl_oneshot_prod_f16: F16, Prod;
    oneshot ringccl_oneshot_min_f16: F16, Min;
    oneshot ringccl_oneshot_max_f16: F16, Max;
    oneshot ringccl_oneshot_avg_f16: F16, Avg;
    oneshot ringccl_oneshot_sum_bf16: Bf16, Sum;
    oneshot ringccl_oneshot_prod_bf16: Bf16, Prod;
    oneshot ringccl_oneshot_min_bf16: Bf16, Min;
    oneshot ringccl_oneshot_max_bf16: Bf16, Max;
    oneshot ringccl_oneshot_avg_bf16: Bf16, Avg;
    oneshot ringccl_oneshot_sum_i8: i8, Sum;
    oneshot ringccl_oneshot_prod_i8: i8, Prod;
    oneshot ringccl_oneshot_min_i8: i8, Min;
    oneshot ringccl_oneshot_max_i8: i8, Max;
    oneshot ringccl_oneshot_avg_i8: i8, Avg;
    oneshot ringccl_oneshot_sum_u8: u8, Sum;
    oneshot ringccl_oneshot_prod_u8: u8, Prod;
    oneshot ringccl_oneshot_min_u8: u8, Min;
    oneshot ringccl_oneshot_max_u8: u8, Max;
    oneshot ringccl_oneshot_avg_u8: u8, Avg;
    oneshot ringccl_oneshot_sum_i32: i32, Sum;
    oneshot ringccl_oneshot_prod_i32: i32, Prod;
    oneshot ringccl_oneshot_min_i32: i32, Min;
    oneshot ringccl_oneshot_max_i32: i32, Max;
    oneshot ringccl_oneshot_avg_i32: i32, Avg;
    oneshot ringccl_oneshot_sum_u32: u32, Sum;
    oneshot ringccl_oneshot_prod_u32: u32, Prod;
    oneshot ringccl_oneshot_min_u32: u32, Min;
    oneshot ringccl_oneshot_max_u32: u32, Max;
    oneshot ringccl_oneshot_avg_u32: u32, Avg;
    oneshot ringccl_oneshot_sum_i64: i64, Sum;
    oneshot ringccl_oneshot_prod_i64: i64, Prod;
    oneshot ringccl_oneshot_min_i64: i64, Min;
    oneshot ringccl_oneshot_max_i64: i64, Max;
    oneshot ringccl_oneshot_avg_i64: i64, Avg;
    oneshot ringccl_oneshot_sum_u64: u64, Sum;
    oneshot ringccl_oneshot_prod_u64: u64, Prod;
    oneshot ringccl_oneshot_min_u64: u64, Min;
    oneshot ringccl_oneshot_max_u64: u64, Max;
    oneshot ringccl_oneshot_avg_u64: u64, Avg;
}
