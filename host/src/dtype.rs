//! The element types ringccl moves, on the host side.

use gpu_kernels::element::{Bf16, Element, F16};

/// The element type of a buffer, as a run-time value (defined next to the kernels' math).
///
/// ```
/// use ringccl::DataType;
/// assert_eq!(DataType::BF16.size(), 2);
/// assert_eq!(DataType::ALL.len(), 10);
/// ```
pub use gpu_kernels::DataType;

/// A Rust type ringccl can reduce: `f32 f64 half::f16 half::bf16 i8 u8 i32 u32 i64 u64`.
///
/// `Math` is the matching `gpu-kernels` type whose arithmetic is bit-identical to the GPU's;
/// the two have the same size and bits.
///
/// ```
/// use ringccl::{DataType, DeviceElement};
/// assert_eq!(<half::bf16 as DeviceElement>::DTYPE, DataType::BF16);
/// let x = half::f16::from_f32(1.5);
/// assert_eq!(x.to_math().to_f32(), 1.5);
/// ```
pub trait DeviceElement:
    cudarc::driver::DeviceRepr + Copy + Default + Send + Sync + std::fmt::Debug + 'static
{
    /// The bit-identical element type of `gpu-kernels`.
    type Math: Element;
    /// The run-time tag (the kernels' type's own).
    const DTYPE: DataType = <Self::Math as Element>::DTYPE;
    /// Same bits, as the kernels' type.
    fn to_math(self) -> Self::Math;
    /// Same bits, back.
    fn from_math(m: Self::Math) -> Self;
}

macro_rules! same_type {
    ($($t:ty;)*) => {$(
        impl DeviceElement for $t {
            type Math = $t;
            #[inline]
            fn to_math(self) -> $t { self }
            #[inline]
            fn from_math(m: $t) -> $t { m }
        }
    )*};
}

same_type! {
    f32; f64; i8; u8; i32; u32; i64; u64;
}

impl DeviceElement for half::f16 {
    type Math = F16;
    #[inline]
    fn to_math(self) -> F16 {
        F16(self.to_bits())
    }
    #[inline]
    fn from_math(m: F16) -> Self {
        half::f16::from_bits(m.0)
    }
}

impl DeviceElement for half::bf16 {
    type Math = Bf16;
    #[inline]
    fn to_math(self) -> Bf16 {
        Bf16(self.to_bits())
    }
    #[inline]
    fn from_math(m: Bf16) -> Self {
        half::bf16::from_bits(m.0)
    }
}
