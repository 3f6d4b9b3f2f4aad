//! Helpers of the validation tests.

use super::buffer::{RankArgs, RawBuf};
use super::collective::Collective;
use super::validate::{validate, Validated};
use crate::{Arg, Error, Result};

pub(crate) const F32: usize = 4;

/// A fake buffer `i` of `len` elements on device `dev`: distinct, far-apart addresses.
pub(crate) fn buf(dev: usize, i: u64, len: usize) -> RawBuf {
    RawBuf::new(
        0x10_0000_0000 * (dev as u64 + 1) + i * 0x1000_0000,
        len,
        dev,
    )
}

pub(crate) fn devs(n: usize) -> Vec<usize> {
    (0..n).collect()
}

pub(crate) fn oop(n: usize, send_len: usize, recv_len: usize) -> Vec<RankArgs> {
    (0..n)
        .map(|r| RankArgs::out_of_place(buf(r, 0, send_len), buf(r, 1, recv_len)))
        .collect()
}

pub(crate) fn inp(n: usize, len: usize) -> Vec<RankArgs> {
    (0..n).map(|r| RankArgs::in_place(buf(r, 0, len))).collect()
}

pub(crate) fn run(c: Collective, args: &[RankArgs]) -> Result<Validated> {
    let d = devs(args.len());
    validate(c, args, &d, &d, F32)
}

/// Asserts an `InvalidArgument` with this rank and argument; returns the reason.
#[track_caller]
pub(crate) fn err<T: std::fmt::Debug>(r: Result<T>, rank: Option<usize>, arg: Arg) -> String {
    match r {
        Err(Error::InvalidArgument {
            rank: got_rank,
            arg: got_arg,
            reason,
        }) => {
            assert_eq!((got_rank, got_arg), (rank, arg), "{reason}");
            reason
        }
        other => panic!("expected InvalidArgument({rank:?}, {arg:?}), got {other:?}"),
    }
}

