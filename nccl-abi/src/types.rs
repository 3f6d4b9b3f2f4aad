//! `nccl.h`'s types and values (NCCL 2.28), laid out exactly as the header declares them.
//!
//! The names keep the header's spelling so that a reader can hold this file next to `nccl.h`.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint};

use ringccl::{DataType, RedOp};

/// `ncclResult_t`: what every call returns.
pub type ncclResult_t = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: ncclResult_t = 0;
/// `ncclUnhandledCudaError`: a CUDA call failed.
pub const NCCL_UNHANDLED_CUDA_ERROR: ncclResult_t = 1;
/// `ncclSystemError`: a system call (sockets, threads) failed.
pub const NCCL_SYSTEM_ERROR: ncclResult_t = 2;
/// `ncclInternalError`: a bug.
pub const NCCL_INTERNAL_ERROR: ncclResult_t = 3;
/// `ncclInvalidArgument`: a bad argument.
pub const NCCL_INVALID_ARGUMENT: ncclResult_t = 4;
/// `ncclInvalidUsage`: a call that is wrong here (or that ringccl does not support).
pub const NCCL_INVALID_USAGE: ncclResult_t = 5;
/// `ncclRemoteError`: a peer failed.
pub const NCCL_REMOTE_ERROR: ncclResult_t = 6;
/// `ncclInProgress`: a non-blocking operation is not finished yet.
pub const NCCL_IN_PROGRESS: ncclResult_t = 7;
/// `ncclNumResults`.
pub const NCCL_NUM_RESULTS: ncclResult_t = 8;

/// `NCCL_VERSION_CODE` of the header this library implements: 2.28.9.
pub const NCCL_VERSION_CODE: c_int = 22809;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// The bytes (ringccl's [`ringccl::UniqueId`]).
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// `NCCL_CONFIG_UNDEF_INT`.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// The `magic` of `NCCL_CONFIG_INITIALIZER`.
pub const NCCL_CONFIG_MAGIC: c_uint = 0xcafe_beef;

/// `ncclConfig_t` (`struct ncclConfig_v22800`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_t {
    /// `sizeof(ncclConfig_t)` of the caller's header.
    pub size: usize,
    /// `0xcafebeef`.
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// 0: non-blocking communicator; 1 or undefined: blocking.
    pub blocking: c_int,
    /// Ignored by ringccl.
    pub cga_cluster_size: c_int,
    /// Ignored by ringccl.
    pub min_ctas: c_int,
    /// Ignored by ringccl.
    pub max_ctas: c_int,
    /// Ignored by ringccl.
    pub net_name: *const c_char,
    /// Ignored by ringccl.
    pub split_share: c_int,
    /// Ignored by ringccl.
    pub traffic_class: c_int,
    /// Ignored by ringccl.
    pub comm_name: *const c_char,
    /// Ignored by ringccl.
    pub collnet_enable: c_int,
    /// Ignored by ringccl.
    pub cta_policy: c_int,
    /// Ignored by ringccl.
    pub shrink_share: c_int,
    /// Ignored by ringccl.
    pub nvls_ctas: c_int,
    /// Ignored by ringccl.
    pub n_channels_per_net_peer: c_int,
    /// Ignored by ringccl.
    pub nvlink_centric_sched: c_int,
}

/// `ncclSimInfo_t` (`struct ncclSimInfo_v22200`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclSimInfo_t {
    /// `sizeof(ncclSimInfo_t)`.
    pub size: usize,
    /// `0x74685283`.
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// The estimate, in microseconds.
    pub estimated_time: f32,
}

/// `ncclDataType_t` (an `enum`: `int` sized).
pub type ncclDataType_t = c_int;
/// `ncclRedOp_t` (an `enum`: `int` sized).
pub type ncclRedOp_t = c_int;
/// `ncclScalarResidence_t`.
pub type ncclScalarResidence_t = c_int;

/// `ncclFloat8e4m3`: an 8-bit float (4 exponent bits, 3 mantissa bits; `ringccl::F8E4M3`).
pub const NCCL_FLOAT8_E4M3: ncclDataType_t = 10;
/// `ncclFloat8e5m2`: an 8-bit float (5 exponent bits, 2 mantissa bits; `ringccl::F8E5M2`).
pub const NCCL_FLOAT8_E5M2: ncclDataType_t = 11;

/// The ringccl type of an `ncclDataType_t`, or why there is none.
///
/// ```
/// use ringccl_nccl::types::data_type;
/// assert_eq!(data_type(7), Ok(ringccl::DataType::F32)); // ncclFloat32
/// assert_eq!(data_type(9), Ok(ringccl::DataType::BF16)); // ncclBfloat16
/// assert_eq!(data_type(10), Ok(ringccl::DataType::F8E4M3)); // ncclFloat8e4m3
/// assert_eq!(data_type(11), Ok(ringccl::DataType::F8E5M2)); // ncclFloat8e5m2
/// assert!(data_type(12).is_err());
/// ```
pub fn data_type(t: ncclDataType_t) -> Result<DataType, String> {
    Ok(match t {
        0 => DataType::I8,
        1 => DataType::U8,
        2 => DataType::I32,
        3 => DataType::U32,
        4 => DataType::I64,
        5 => DataType::U64,
        6 => DataType::F16,
        7 => DataType::F32,
        8 => DataType::F64,
        9 => DataType::BF16,
        NCCL_FLOAT8_E4M3 => DataType::F8E4M3,
        NCCL_FLOAT8_E5M2 => DataType::F8E5M2,
        _ => return Err(format!("datatype {t} is not an ncclDataType_t (0..=11)")),
    })
}

/// The ringccl operator of a built-in `ncclRedOp_t`, or why it is not one (created
/// operators: [`crate::ops::OpTable::resolve`]).
///
/// ```
/// use ringccl_nccl::types::red_op;
/// assert_eq!(red_op(0), Ok(ringccl::RedOp::Sum));
/// assert_eq!(red_op(2), Ok(ringccl::RedOp::Max)); // ncclMax is 2, ncclMin 3
/// assert!(red_op(5).is_err());
/// ```
pub fn red_op(op: ncclRedOp_t) -> Result<RedOp, String> {
    Ok(match op {
        0 => RedOp::Sum,
        1 => RedOp::Prod,
        2 => RedOp::Max,
        3 => RedOp::Min,
        4 => RedOp::Avg,
        _ => {
            return Err(format!(
                "reduction operator {op} is not a built-in (ncclSum, ncclProd, ncclMax, ncclMin \
                 or ncclAvg); created operators are looked up on their communicator"
            ))
        }
    })
}

/// The size in bytes of an `ncclDataType_t`'s element (0 for a value that is not one).
///
/// ```
/// assert_eq!(ringccl_nccl::types::type_size(9), 2);
/// assert_eq!(ringccl_nccl::types::type_size(10), 1);
/// ```
pub fn type_size(t: ncclDataType_t) -> usize {
    match t {
        0 | 1 | 10 | 11 => 1,
        6 | 9 => 2,
        2 | 3 => 4,
        4 | 5 | 8 => 8,
        7 => 4,
        _ => 0,
    }
}

/// `NCCL_WIN_DEFAULT` (nccl.h): a window with no particular layout.
pub const NCCL_WIN_DEFAULT: c_int = 0x00;
/// `NCCL_WIN_COLL_SYMMETRIC` (nccl.h): every rank's window has the same size (NCCL's
/// symmetric kernels). Accepted; ringccl's kernels need no symmetric layout.
pub const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x01;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_header_on_lp64() {
        // Offsets of `struct ncclConfig_v22800` as a C compiler lays it out on x86-64/aarch64.
        assert_eq!(size_of::<ncclConfig_t>(), 80);
        assert_eq!(offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(offset_of!(ncclConfig_t, net_name), 32);
        assert_eq!(offset_of!(ncclConfig_t, comm_name), 48);
        assert_eq!(offset_of!(ncclConfig_t, nvlink_centric_sched), 76);
        assert_eq!(size_of::<ncclSimInfo_t>(), 24);
        assert_eq!(size_of::<ncclUniqueId>(), 128);
    }

    #[test]
    fn every_type_maps_to_the_same_size() {
        for t in 0..12 {
            assert_eq!(data_type(t).unwrap().size(), type_size(t), "type {t}");
        }
        assert_eq!(data_type(NCCL_FLOAT8_E4M3), Ok(DataType::F8E4M3));
        assert_eq!(data_type(NCCL_FLOAT8_E5M2), Ok(DataType::F8E5M2));
        assert_eq!(type_size(12), 0);
        assert!(data_type(-1).is_err());
    }

    #[test]
    fn every_operator_maps() {
        let ops: Vec<RedOp> = (0..5).map(|o| red_op(o).unwrap()).collect();
        assert_eq!(
            ops,
            [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg]
        );
        assert!(red_op(-1).unwrap_err().contains("built-in"));
    }
}
