//! The element types ringccl moves, on the host side.

use gpu_kernels::element::{Bf16, Element, F16};

/// The element type of a buffer, as a run-time value.
///
/// ```
/// use ringccl::DataType;
/// assert_eq!(DataType::BF16.size(), 2);
/// assert_eq!(DataType::ALL.len(), 10);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`
    F32,
    /// `f64`
    F64,
    /// `half::f16`
    F16,
    /// `half::bf16`
    BF16,
    /// `i8`
    I8,
    /// `u8`
    U8,
    /// `i32`
    I32,
    /// `u32`
    U32,
    /// `i64`
    I64,
    /// `u64`
    U64,
}

impl DataType {
    /// Every type.
    pub const ALL: [DataType; 10] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F16 | DataType::BF16 => 2,
            DataType::I8 | DataType::U8 => 1,
        }
    }

    /// The name used in kernel entry points (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
        )
    }
}

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
    /// The run-time tag.
    const DTYPE: DataType;
    /// The bit-identical element type of `gpu-kernels`.
    type Math: Element;
    /// Same bits, as the kernels' type.
    fn to_math(self) -> Self::Math;
    /// Same bits, back.
    fn from_math(m: Self::Math) -> Self;
}

macro_rules! same_type {
    ($($t:ty => $d:ident;)*) => {$(
        impl DeviceElement for $t {
            const DTYPE: DataType = DataType::$d;
            type Math = $t;
            #[inline]
            fn to_math(self) -> $t { self }
            #[inline]
            fn from_math(m: $t) -> $t { m }
        }
    )*};
}

same_type! {
    f32 => F32; f64 => F64; i8 => I8; u8 => U8; i32 => I32; u32 => U32; i64 => I64; u64 => U64;
}

impl DeviceElement for half::f16 {
    const DTYPE: DataType = DataType::F16;
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
    const DTYPE: DataType = DataType::BF16;
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
