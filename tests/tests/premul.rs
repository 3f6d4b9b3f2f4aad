//! GPU tests of PreMulSum ([`ringccl::Op::pre_mul_sum`] and its device-scalar forms) and of
//! the fp8 element types, in one process driving every GPU and in a job of processes.
//!
//! PreMulSum: every float type (f32, f64, f16, bf16, fp8 E4M3 and E5M2) and an integer type
//! (i32), a host scalar and a device scalar per rank (read when the collective runs), all-reduce
//! in and out of place, reduce-scatter in and out of place, reduce, each checked bit for bit
//! against the CPU reference: the sum over ranks of `x_r × s_r`, the product rounded to the
//! element type before the sum (NCCL's `FuncPreMulSum`; the kernels' own CPU math,
//! `gpu_kernels::element::Element::mul` and `add`). The inputs are chosen so that every
//! partial sum is exact (the result does not depend on the order the GPUs add in); with two
//! ranks (one addition, which commutes) inputs and scalars that round are checked too. The
//! callers' inputs of reduce-scatter and reduce, and of an out-of-place all-reduce, are
//! checked unchanged.
//!
//! fp8: all-gather, reduce-scatter (sum) and all-reduce (sum) of E4M3 and E5M2, bit-compared
//! with the same CPU math (every byte pattern with two ranks: saturation and NaN included).
//!
//! In one process, a captured CUDA graph of a PreMulSum reduce-scatter and all-reduce with
//! device scalars is replayed with new scalars written between replays.
//!
//! Run on a GPU machine:
//! * one process, 2+ GPUs (`one_process`, `one_process_captured`): `cargo test -p
//!   ringccl-tests --test premul -- --ignored --test-threads=1 --nocapture one_process`
//! * a job of processes (one per GPU, or `RINGCCL_TEST_PROCESSES=N` processes, rank `r` on GPU
//!   `r % gpus`, under MPS where they share a GPU): `cargo test -p ringccl-tests --test premul
//!   -- --ignored --test-threads=1 --nocapture across_processes`

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use gpu_kernels::element::Element;
use half::{bf16, f16};
use ringccl::{Arg, Communicator, DeviceElement, Error, Io, Op, Scalar, UniqueId, F8E4M3, F8E5M2};

const ENV_ID: &str = "RINGCCL_TEST_PREMUL_ID";
const ENV_RANK: &str = "RINGCCL_TEST_PREMUL_RANK";
const ENV_NRANKS: &str = "RINGCCL_TEST_PREMUL_NRANKS";

/// The element types checked, with a conversion from `f64` (rounded to the type).
trait Elem: DeviceElement {
    /// Whether the type is an integer.
    const INT: bool = false;
    /// The largest magnitude of the exact inputs (every partial sum over 8 ranks exact).
    const SPAN: i64 = 3;
    fn from_f64(x: f64) -> Self;
    fn show(self) -> String {
        format!("{self:?}")
    }
}

impl Elem for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}
impl Elem for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
}
impl Elem for f16 {
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
}
impl Elem for bf16 {
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
}
impl Elem for F8E4M3 {
    const SPAN: i64 = 1;
    fn from_f64(x: f64) -> Self {
        F8E4M3::from_f32(x as f32)
    }
    fn show(self) -> String {
        format!("{:#04x} ({})", self.to_bits(), self.to_f32())
    }
}
impl Elem for F8E5M2 {
    const SPAN: i64 = 1;
    fn from_f64(x: f64) -> Self {
        F8E5M2::from_f32(x as f32)
    }
    fn show(self) -> String {
        format!("{:#04x} ({})", self.to_bits(), self.to_f32())
    }
}
impl Elem for i32 {
    const INT: bool = true;
    fn from_f64(x: f64) -> Self {
        x as i32
    }
}

/// What one check feeds the ranks: inputs and scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Data {
    /// Small integers, exact scalars: every partial sum exact.
    Exact,
    /// Values and scalars that round (two ranks only: one addition).
    Rounding,
}

/// Rank `r`'s input element `i`.
fn input<T: Elem>(data: Data, r: usize, i: usize) -> T {
    match data {
        Data::Exact => {
            let span = T::SPAN;
            T::from_f64((((r * 5 + i * 3) as i64) % (2 * span + 1) - span) as f64)
        }
        Data::Rounding => T::from_f64((((r * 7 + i * 3) % 13) as f64) * 0.37 - 2.0),
    }
}

/// Rank `r`'s scalar: the same on every rank for a host scalar, one per rank for a device one.
fn scalar<T: Elem>(data: Data, r: usize, device: bool) -> T {
    match (data, T::INT) {
        (_, true) => T::from_f64(if device { -((r % 3) as f64) - 1.0 } else { 3.0 }),
        (Data::Exact, false) => T::from_f64(if device && T::SPAN > 1 {
            0.5 * (1 + r % 2) as f64
        } else {
            0.5
        }),
        (Data::Rounding, false) => T::from_f64(if device { 0.3 + 0.01 * r as f64 } else { 0.1 }),
    }
}

/// The CPU reference at element `i` of the full input: the sum over ranks, in rank order, of
/// the products rounded to the type (with exact partial sums or two ranks, any order's).
fn premul_ref<T: Elem>(data: Data, n: usize, device: bool, i: usize) -> T {
    let mut acc: Option<T::Math> = None;
    for r in 0..n {
        let p = input::<T>(data, r, i)
            .to_math()
            .mul(scalar::<T>(data, r, device).to_math());
        acc = Some(acc.map_or(p, |a| a.add(p)));
    }
    T::from_math(acc.expect("at least one rank"))
}

fn same<T: Elem>(a: T, b: T) -> bool {
    a.to_math().same_result(b.to_math())
}

/// The ranks held here and their streams.
struct Ranks<'a> {
    comm: &'a Communicator,
    held: Vec<usize>,
    streams: Vec<Arc<CudaStream>>,
}

impl<'a> Ranks<'a> {
    fn new(comm: &'a Communicator) -> Self {
        let held = comm.local_ranks().to_vec();
        let streams = held.iter().map(|&r| comm.stream(r).clone()).collect();
        Ranks {
            comm,
            held,
            streams,
        }
    }
    fn n(&self) -> usize {
        self.comm.nranks()
    }
    fn up<T: Elem>(&self, i: usize, v: &[T]) -> CudaSlice<T> {
        self.streams[i].clone_htod(v).expect("upload")
    }
    fn down<T: Elem>(&self, i: usize, b: &CudaSlice<T>) -> Vec<T> {
        self.streams[i].synchronize().expect("synchronize");
        self.streams[i].clone_dtoh(b).expect("download")
    }
    /// Each held rank's input of `len` elements (element `i` of the full input at `off + i`).
    fn inputs<T: Elem>(&self, data: Data, len: usize) -> Vec<CudaSlice<T>> {
        self.held
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let v: Vec<T> = (0..len).map(|k| input(data, r, k)).collect();
                self.up(i, &v)
            })
            .collect()
    }
    fn garbage<T: Elem>(&self, len: usize) -> Vec<CudaSlice<T>> {
        (0..self.held.len())
            .map(|i| self.up(i, &vec![T::from_f64(7.0); len.max(1)]))
            .collect()
    }
}

/// Counts the elements of `got` (at `range`) that differ from `want(k)`, `k` from 0; prints
/// the first few.
fn check<T: Elem>(
    what: &str,
    got: &[T],
    range: std::ops::Range<usize>,
    want: impl Fn(usize) -> T,
) -> usize {
    let mut bad = 0;
    for (k, i) in range.enumerate() {
        let w = want(k);
        if !same(got[i], w) {
            if bad < 5 {
                eprintln!(
                    "FAIL {what} {}: element {i}: got {}, want {}",
                    T::DTYPE.name(),
                    got[i].show(),
                    w.show()
                );
            }
            bad += 1;
        }
    }
    bad
}

/// The PreMulSum operator of one check, and the device scalars it reads (kept alive, and
/// synchronised before they are dropped, by the caller).
fn operator<T: Elem>(rk: &Ranks<'_>, data: Data, device: bool) -> (Op, Vec<CudaSlice<T>>) {
    if !device {
        return (Op::pre_mul_sum(scalar::<T>(data, 0, false)), Vec::new());
    }
    let slices: Vec<CudaSlice<T>> = rk
        .held
        .iter()
        .enumerate()
        .map(|(i, &r)| rk.up(i, &[scalar::<T>(data, r, true)]))
        .collect();
    let scalars: Vec<Scalar<T>> = slices
        .iter()
        .zip(&rk.streams)
        .map(|(s, st)| Scalar::Device(s.device_ptr(st).0))
        .collect();
    // SAFETY: each address is one element of `T` on its rank's device, in `slices`, which the
    // caller keeps until the streams are synchronised.
    (unsafe { Op::pre_mul_sum_scalars(&scalars) }, slices)
}

/// PreMulSum checks of one type and kind of data: (cases, wrong elements).
fn check_premul<T: Elem>(rk: &Ranks<'_>, data: Data) -> (usize, usize) {
    let n = rk.n();
    let c = 1531; // not a multiple of any vector width
    let mut cases = 0;
    let mut bad = 0;
    for device in [false, true] {
        let (op, scalars) = operator::<T>(rk, data, device);
        let tag = |w: &str| {
            format!(
                "{w} ({} scalar, {data:?})",
                if device { "device" } else { "host" }
            )
        };
        // All-reduce, in place and out of place.
        for in_place in [true, false] {
            let mut send = rk.inputs::<T>(data, c);
            let mut recv = rk.garbage::<T>(c);
            let mut io: Vec<Io<'_, T>> = if in_place {
                send.iter_mut().map(Io::in_place).collect()
            } else {
                send.iter()
                    .zip(recv.iter_mut())
                    .map(|(s, r)| Io::out_of_place(s, r))
                    .collect()
            };
            rk.comm
                .all_reduce(&mut io, c, &op, &rk.streams)
                .expect("all_reduce");
            drop(io);
            let what = tag(if in_place {
                "all_reduce in place"
            } else {
                "all_reduce"
            });
            for (i, &r) in rk.held.iter().enumerate() {
                let out = rk.down(i, if in_place { &send[i] } else { &recv[i] });
                bad += check(&what, &out, 0..c, |k| premul_ref::<T>(data, n, device, k));
                if !in_place {
                    let s = rk.down(i, &send[i]);
                    bad += check(&format!("{what}: input"), &s, 0..c, |k| {
                        input::<T>(data, r, k)
                    });
                }
            }
            cases += 1;
        }
        // Reduce-scatter, out of place and in place (the output is block r of the input).
        for in_place in [false, true] {
            let mut send = rk.inputs::<T>(data, n * c);
            let mut recv = rk.garbage::<T>(c);
            let mut io: Vec<Io<'_, T>> = if in_place {
                send.iter_mut().map(Io::in_place).collect()
            } else {
                send.iter()
                    .zip(recv.iter_mut())
                    .map(|(s, r)| Io::out_of_place(s, r))
                    .collect()
            };
            rk.comm
                .reduce_scatter(&mut io, c, &op, &rk.streams)
                .expect("reduce_scatter");
            drop(io);
            let what = tag(if in_place {
                "reduce_scatter in place"
            } else {
                "reduce_scatter"
            });
            for (i, &r) in rk.held.iter().enumerate() {
                let s = rk.down(i, &send[i]);
                let want_out = |k| premul_ref::<T>(data, n, device, r * c + k);
                if in_place {
                    bad += check(&what, &s, r * c..(r + 1) * c, want_out);
                    // The rest of the buffer: the caller's input, not scaled.
                    bad += check(&format!("{what}: before"), &s, 0..r * c, |k| {
                        input::<T>(data, r, k)
                    });
                    bad += check(&format!("{what}: after"), &s, (r + 1) * c..n * c, |k| {
                        input::<T>(data, r, (r + 1) * c + k)
                    });
                } else {
                    bad += check(&what, &rk.down(i, &recv[i]), 0..c, want_out);
                    bad += check(&format!("{what}: input"), &s, 0..n * c, |k| {
                        input::<T>(data, r, k)
                    });
                }
            }
            cases += 1;
        }
        // Reduce to the last rank.
        {
            let root = n - 1;
            let send = rk.inputs::<T>(data, c);
            let mut recv = rk.garbage::<T>(c);
            let mut io: Vec<Io<'_, T>> = rk
                .held
                .iter()
                .zip(send.iter().zip(recv.iter_mut()))
                .map(|(&r, (s, o))| {
                    if r == root {
                        Io::out_of_place(s, o)
                    } else {
                        Io::send_only(s)
                    }
                })
                .collect();
            rk.comm
                .reduce(&mut io, c, &op, root, &rk.streams)
                .expect("reduce");
            drop(io);
            let what = tag("reduce");
            for (i, &r) in rk.held.iter().enumerate() {
                if r == root {
                    bad += check(&what, &rk.down(i, &recv[i]), 0..c, |k| {
                        premul_ref::<T>(data, n, device, k)
                    });
                }
                bad += check(
                    &format!("{what}: input"),
                    &rk.down(i, &send[i]),
                    0..c,
                    |k| input::<T>(data, r, k),
                );
            }
            cases += 1;
        }
        for s in &rk.streams {
            s.synchronize().expect("synchronize");
        }
        drop(scalars);
    }
    (cases, bad)
}

/// A PreMulSum whose scalar is of another type than the buffers is refused before anything
/// runs; the buffer is left alone.
fn check_refusals(rk: &Ranks<'_>) -> (usize, usize) {
    let c = 64;
    let mut bufs = rk.inputs::<f32>(Data::Exact, c);
    let mut io: Vec<Io<'_, f32>> = bufs.iter_mut().map(Io::in_place).collect();
    let e = rk
        .comm
        .all_reduce(&mut io, c, Op::pre_mul_sum(0.5f64), &rk.streams);
    let mut bad = 0;
    if !matches!(e, Err(Error::InvalidArgument { arg: Arg::Op, .. })) {
        eprintln!("FAIL a mismatched scalar type: {e:?}");
        bad += 1;
    }
    drop(io);
    for (i, &r) in rk.held.iter().enumerate() {
        bad += check("refused call: buffer", &rk.down(i, &bufs[i]), 0..c, |k| {
            input::<f32>(Data::Exact, r, k)
        });
    }
    (1, bad)
}

/// fp8 element `i` of rank `r`: small integers (exact sums), or, with two ranks, every byte.
fn fp8_input<T: Elem>(exact: bool, r: usize, i: usize) -> T {
    if exact {
        input::<T>(Data::Exact, r, i)
    } else {
        T::from_math(<T::Math as Element>::from_raw(
            ((r * 37 + i * 11) % 256) as u64,
        ))
    }
}

fn fp8_sum<T: Elem>(exact: bool, n: usize, i: usize) -> T {
    let mut acc = fp8_input::<T>(exact, 0, i).to_math();
    for r in 1..n {
        acc = acc.add(fp8_input::<T>(exact, r, i).to_math());
    }
    T::from_math(acc)
}

/// fp8 all-gather, reduce-scatter and all-reduce (sum): (cases, wrong elements).
fn check_fp8<T: Elem>(rk: &Ranks<'_>) -> (usize, usize) {
    let n = rk.n();
    let c = 4099;
    let mut cases = 0;
    let mut bad = 0;
    let modes: &[bool] = if n == 2 { &[true, false] } else { &[true] };
    for &exact in modes {
        let ins = |len: usize| -> Vec<CudaSlice<T>> {
            rk.held
                .iter()
                .enumerate()
                .map(|(i, &r)| {
                    let v: Vec<T> = (0..len).map(|k| fp8_input::<T>(exact, r, k)).collect();
                    rk.up(i, &v)
                })
                .collect()
        };
        let tag = |w: &str| format!("fp8 {w} ({})", if exact { "exact" } else { "every byte" });
        // All-gather.
        let send = ins(c);
        let mut recv = rk.garbage::<T>(n * c);
        let mut io: Vec<Io<'_, T>> = send
            .iter()
            .zip(recv.iter_mut())
            .map(|(s, r)| Io::out_of_place(s, r))
            .collect();
        rk.comm
            .all_gather(&mut io, c, &rk.streams)
            .expect("all_gather");
        drop(io);
        for (i, r) in recv.iter().enumerate() {
            let out = rk.down(i, r);
            bad += check(&tag("all_gather"), &out, 0..n * c, |k| {
                fp8_input::<T>(exact, k / c, k % c)
            });
        }
        // Reduce-scatter.
        let send = ins(n * c);
        let mut recv = rk.garbage::<T>(c);
        let mut io: Vec<Io<'_, T>> = send
            .iter()
            .zip(recv.iter_mut())
            .map(|(s, r)| Io::out_of_place(s, r))
            .collect();
        rk.comm
            .reduce_scatter(&mut io, c, ringccl::RedOp::Sum, &rk.streams)
            .expect("reduce_scatter");
        drop(io);
        for (i, &r) in rk.held.iter().enumerate() {
            let out = rk.down(i, &recv[i]);
            bad += check(&tag("reduce_scatter"), &out, 0..c, |k| {
                fp8_sum::<T>(exact, n, r * c + k)
            });
        }
        // All-reduce, in place.
        let mut bufs = ins(c);
        let mut io: Vec<Io<'_, T>> = bufs.iter_mut().map(Io::in_place).collect();
        rk.comm
            .all_reduce(&mut io, c, ringccl::RedOp::Sum, &rk.streams)
            .expect("all_reduce");
        drop(io);
        for (i, b) in bufs.iter().enumerate() {
            let out = rk.down(i, b);
            bad += check(&tag("all_reduce"), &out, 0..c, |k| {
                fp8_sum::<T>(exact, n, k)
            });
        }
        cases += 3;
    }
    (cases, bad)
}

/// Every check on the ranks held by `comm`: (cases, wrong elements).
fn check_all(comm: &Communicator) -> (usize, usize) {
    let rk = Ranks::new(comm);
    let two = comm.nranks() == 2;
    let mut results = vec![
        check_premul::<f32>(&rk, Data::Exact),
        check_premul::<f64>(&rk, Data::Exact),
        check_premul::<f16>(&rk, Data::Exact),
        check_premul::<bf16>(&rk, Data::Exact),
        check_premul::<F8E4M3>(&rk, Data::Exact),
        check_premul::<F8E5M2>(&rk, Data::Exact),
        check_premul::<i32>(&rk, Data::Exact),
        check_refusals(&rk),
        check_fp8::<F8E4M3>(&rk),
        check_fp8::<F8E5M2>(&rk),
    ];
    if two {
        results.extend([
            check_premul::<f32>(&rk, Data::Rounding),
            check_premul::<f64>(&rk, Data::Rounding),
            check_premul::<f16>(&rk, Data::Rounding),
            check_premul::<bf16>(&rk, Data::Rounding),
            check_premul::<F8E4M3>(&rk, Data::Rounding),
            check_premul::<F8E5M2>(&rk, Data::Rounding),
        ]);
    }
    comm.synchronize().expect("synchronize");
    results
        .into_iter()
        .fold((0, 0), |(c, b), (c2, b2)| (c + c2, b + b2))
}

/// One process driving every visible GPU (2 or more).
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn one_process() {
    let comm = Communicator::all().expect("a communicator of every GPU");
    assert!(comm.nranks() >= 2, "this test needs 2+ CUDA GPUs");
    let t0 = Instant::now();
    let (cases, bad) = check_all(&comm);
    println!(
        "premul, one process of {} ranks: {cases} cases, {bad} wrong elements ({:.1} s)",
        comm.nranks(),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(bad, 0, "wrong elements");
}

/// One process, CUDA-graph capture: a reduce-scatter (its temporaries become the graph's
/// memory nodes) and an in-place all-reduce with device scalars, captured once and replayed
/// three times with new scalars written between replays (read when the graph runs).
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn one_process_captured() {
    let comm = Communicator::all().expect("a communicator of every GPU");
    let n = comm.nranks();
    assert!(n >= 2, "this test needs 2+ CUDA GPUs");
    let rk = Ranks::new(&comm);
    let c = 4096;
    let mut scal: Vec<CudaSlice<f32>> = (0..n).map(|i| rk.up(i, &[1.0f32])).collect();
    let scalars: Vec<Scalar<f32>> = scal
        .iter()
        .zip(&rk.streams)
        .map(|(s, st)| Scalar::Device(s.device_ptr(st).0))
        .collect();
    // SAFETY: one f32 per rank on its device, alive (in `scal`) until the end of the test,
    // after the last replay is synchronised.
    let op = unsafe { Op::pre_mul_sum_scalars(&scalars) };
    let send = rk.inputs::<f32>(Data::Exact, n * c);
    let mut recv = rk.garbage::<f32>(c);
    let mut ar = rk.inputs::<f32>(Data::Exact, c);
    for s in &rk.streams {
        s.synchronize().expect("synchronize");
    }
    let ctxs: Vec<_> = rk.held.iter().map(|&r| comm.context(r).clone()).collect();
    let graph = ringccl_tests::capture_one_graph(&ctxs, &rk.streams, || {
        let mut io: Vec<Io<'_, f32>> = send
            .iter()
            .zip(recv.iter_mut())
            .map(|(s, r)| Io::out_of_place(s, r))
            .collect();
        comm.reduce_scatter(&mut io, c, &op, &rk.streams)
            .map_err(|e| e.to_string())?;
        drop(io);
        let mut io: Vec<Io<'_, f32>> = ar.iter_mut().map(Io::in_place).collect();
        comm.all_reduce(&mut io, c, &op, &rk.streams)
            .map_err(|e| e.to_string())
    })
    .expect("capture");
    let mut bad = 0;
    for replay in 0..3 {
        let factor = |r: usize| 0.5 * (replay + 1) as f64 * (1 + r % 2) as f64;
        for (i, &r) in rk.held.iter().enumerate() {
            let st = &rk.streams[i];
            st.memcpy_htod(&[factor(r) as f32], &mut scal[i])
                .expect("scalar");
            let v: Vec<f32> = (0..c).map(|k| input(Data::Exact, r, k)).collect();
            st.memcpy_htod(&v, &mut ar[i]).expect("input");
        }
        for s in &rk.streams {
            s.synchronize().expect("synchronize");
        }
        graph.launch().expect("graph launch");
        for s in &rk.streams {
            s.synchronize().expect("replay");
        }
        let want = |i: usize| -> f32 {
            (0..n)
                .map(|q| f64::from(input::<f32>(Data::Exact, q, i)) * factor(q))
                .sum::<f64>() as f32
        };
        for (i, &r) in rk.held.iter().enumerate() {
            let what = format!("captured, replay {replay}");
            bad += check(
                &format!("{what}: reduce_scatter"),
                &rk.down(i, &recv[i]),
                0..c,
                |k| want(r * c + k),
            );
            bad += check(
                &format!("{what}: all_reduce"),
                &rk.down(i, &ar[i]),
                0..c,
                want,
            );
            bad += check(
                &format!("{what}: input"),
                &rk.down(i, &send[i]),
                0..n * c,
                |k| input::<f32>(Data::Exact, r, k),
            );
        }
    }
    drop(graph);
    println!("premul, one process of {n} ranks, captured: 3 replays, {bad} wrong elements");
    assert_eq!(bad, 0, "wrong elements");
}

/// One rank of a job (started by `across_processes`; alone, a job of one rank on GPU 0).
#[test]
#[ignore = "needs a CUDA GPU; started by across_processes as each rank"]
fn premul_rank_of_a_job() {
    let (comm, rank, n) = match std::env::var(ENV_ID) {
        Ok(text) => {
            let id: UniqueId = text.parse().expect("a unique id in the environment");
            let rank: usize = std::env::var(ENV_RANK)
                .expect("rank")
                .parse()
                .expect("rank");
            let n: usize = std::env::var(ENV_NRANKS)
                .expect("nranks")
                .parse()
                .expect("nranks");
            // More ranks than GPUs share them (under MPS).
            let gpus =
                cudarc::driver::CudaContext::device_count().expect("the CUDA driver") as usize;
            let comm =
                Communicator::init_rank(n, &id, rank, rank % gpus.max(1)).expect("init_rank");
            (comm, rank, n)
        }
        Err(_) => {
            let id = UniqueId::new().expect("a unique id");
            (
                Communicator::init_rank(1, &id, 0, 0).expect("init_rank"),
                0,
                1,
            )
        }
    };
    let t0 = Instant::now();
    let (cases, bad) = check_all(&comm);
    println!(
        "premul, rank {rank} of {n}: {cases} cases, {bad} wrong elements ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(bad, 0, "rank {rank}: wrong elements");
}

/// A job of one process per visible GPU (at most 8), or `RINGCCL_TEST_PROCESSES=N` processes
/// (rank r on GPU `r % gpus`; more processes than GPUs need the MPS daemon), each running
/// `premul_rank_of_a_job`; fails unless every rank passes within the limit.
#[test]
#[ignore = "needs 2+ CUDA GPUs (or RINGCCL_TEST_PROCESSES and MPS)"]
fn across_processes() {
    let gpus = cudarc::driver::CudaContext::device_count().expect("the CUDA driver");
    let n = ringccl_tests::jobs::job_size((gpus as usize).min(8));
    assert!(n >= 2, "this test needs 2+ CUDA GPUs; {n} visible");
    let id = UniqueId::new().expect("a unique id").to_string();
    ringccl_tests::jobs::run_ranks("premul_rank_of_a_job", n, Duration::from_secs(300), |r| {
        vec![
            (ENV_ID.to_string(), id.clone()),
            (ENV_RANK.to_string(), r.to_string()),
            (ENV_NRANKS.to_string(), n.to_string()),
        ]
    });
    println!("premul, {n} processes: every rank passed");
}
