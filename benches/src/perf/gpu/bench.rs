//! A run's state ([`Bench`]) and one sweep: every size of one collective, type and operator,
//! each measured (checked, then timed) for each library, in place and out of place.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use ringccl::{CollectiveKind, Communicator, DeviceSlice, RedOp};

use super::super::args::{nccl_dtype_name, Options};
use super::super::coll::{self, Shape};
use super::super::data::{self, Pattern, PerfElem};
use super::super::nccl::Nccl;
use super::super::procs::{Outcome, World};
use super::super::progress::Progress;
use super::super::report::{self, Record, Stats};
use super::calls::in_place_layout;
use super::{drv, not_measured, print, Lib};

/// The state of a run.
pub(super) struct Bench<'a> {
    pub(super) comm: &'a Communicator,
    pub(super) nccl: Option<&'a Nccl>,
    /// The ranks of the world.
    pub(super) n: usize,
    /// The ranks this process drives (every rank, or one process's): per-rank vectors (events,
    /// buffers, inputs, streams) follow this order.
    pub(super) local: Vec<usize>,
    pub(super) opts: &'a Options,
    pub(super) ringccl: bool,
    /// Timing events per local rank (grown on demand).
    pub(super) events: Vec<Vec<CudaEvent>>,
    pub(super) records: Vec<Record>,
    pub(super) notes: Vec<String>,
    pub(super) progress: Progress,
    /// Sweeps that could not run at all (allocation failures...).
    pub(super) failures: usize,
    /// ringccl-perf's world, one process per GPU.
    pub(super) world: Option<&'a World>,
    /// Not rank 0 of a world of processes: prints nothing.
    pub(super) quiet: bool,
    /// Why the ranks can no longer exchange results (the run stops).
    pub(super) fatal: Option<String>,
}

/// The local ranks' two buffers each: `a` (send) and `b` (receive, and the one buffer in
/// place).
pub(super) struct Bufs<T> {
    pub(super) a: Vec<CudaSlice<T>>,
    pub(super) b: Vec<CudaSlice<T>>,
    pub(super) a_ptr: Vec<u64>,
    pub(super) b_ptr: Vec<u64>,
    /// Whether the buffers are plain `cuMemAlloc` memory ([`alloc_plain`]), freed by
    /// [`free_plain`] on drop instead of by cudarc.
    pub(super) plain: bool,
}

impl<T> Drop for Bufs<T> {
    fn drop(&mut self) {
        if self.plain {
            for s in self.a.drain(..).chain(self.b.drain(..)) {
                free_plain(s);
            }
        }
    }
}

/// `len` zeroed elements of plain `cuMemAlloc` memory on `s`'s device, as cudarc's slice:
/// what `--register` allocates, because cudarc's own `alloc_zeros` takes memory from the
/// stream-ordered pool (`cuMemAllocAsync`), which CUDA IPC cannot export, so ringccl keeps a
/// registration of it but stages its calls (the peers cannot map it).
fn alloc_plain<T: PerfElem>(s: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<T>, String> {
    use cudarc::driver::result;
    drv("cuCtxSetCurrent", s.context().bind_to_thread())?;
    let bytes = len.saturating_mul(std::mem::size_of::<T>()).max(1);
    // SAFETY: `s`'s context is current on this thread (bound above).
    let ptr = drv("cuMemAlloc", unsafe { result::malloc_sync(bytes) })?;
    // SAFETY: `ptr` is a live allocation of `bytes` bytes, used by nothing yet.
    if let Err(e) = unsafe { result::memset_d8_sync(ptr, 0, bytes) } {
        // SAFETY: `ptr` came from `cuMemAlloc` above and is freed once, here.
        let _ = unsafe { result::free_sync(ptr) };
        return Err(format!("cuMemsetD8 failed with {:?}", e.0));
    }
    // SAFETY: `ptr` holds `len` elements of `T`, zeroed (zero bytes are a valid value of every
    // `PerfElem`: plain numbers); the slice is freed by `free_plain`, never by cudarc.
    Ok(unsafe { s.upgrade_device_ptr::<T>(ptr, len) })
}

/// Frees a slice of [`alloc_plain`]: after its stream's work, with `cuMemFree` (cudarc's drop
/// would free it as pool memory).
fn free_plain<T>(s: CudaSlice<T>) {
    let stream = s.stream().clone();
    if stream.synchronize().is_err() {
        // The context is broken; leaking the memory is all that is safe.
        let _ = s.leak();
        return;
    }
    let ptr = s.leak();
    // SAFETY: `ptr` came from `cuMemAlloc` (`alloc_plain`), nothing uses it after the stream's
    // work (synchronized above), and it is freed once, here.
    let _ = unsafe { cudarc::driver::result::free_sync(ptr) };
}

/// What a measurement checks against.
pub(super) struct Expect<'t> {
    pub(super) pat: Pattern,
    /// One period of the reduced values (reductions only).
    pub(super) table: &'t [f64],
    pub(super) tol: f64,
}

/// Elements of the send (`a`) and receive (`b`) buffers that every shape of a sweep fits in (at
/// least one each, so that every rank has a buffer to hand over).
pub(super) fn buffer_lens(shapes: &[Shape]) -> (usize, usize) {
    let a_len = shapes.iter().map(|s| s.send).max().unwrap_or(0).max(1);
    let b_len = shapes
        .iter()
        .map(|s| s.send.max(s.recv))
        .max()
        .unwrap_or(0)
        .max(1);
    (a_len, b_len)
}

/// Fills `rec`'s times (median, minimum, mean of `times`, µs per call), its bandwidths (the
/// median's, with the collective's bus-bandwidth `factor`) and its sample count.
pub(super) fn timed(rec: &mut Record, times: &[f64], factor: f64) {
    let st = Stats::of(times);
    let (algbw, busbw) = report::bandwidths(rec.bytes, st.median, factor);
    rec.time_us = st.median;
    rec.time_us_min = st.min;
    rec.time_us_mean = st.mean;
    rec.algbw = algbw;
    rec.busbw = busbw;
    rec.samples = times.len();
}

impl Bench<'_> {
    pub(super) fn streams(&self) -> Vec<&Arc<CudaStream>> {
        self.local.iter().map(|&r| self.comm.stream(r)).collect()
    }

    /// Prints, unless another rank does.
    pub(super) fn say(&self, f: impl FnOnce()) {
        if !self.quiet {
            self.progress.suspend(f);
        }
    }

    /// `mine`, or the first failure of any rank when the ranks are processes (every rank
    /// gets the same answer). A failed exchange is also recorded as [`Bench::fatal`].
    pub(super) fn agree<X>(&mut self, mine: Result<X, String>) -> Result<X, String> {
        let Some(world) = self.world else {
            return mine;
        };
        match world.agree(mine.as_ref().map(drop).map_err(Clone::clone)) {
            Ok(Ok(())) => mine,
            Ok(Err(e)) => Err(e),
            Err(e) => {
                self.fatal.get_or_insert_with(|| e.clone());
                Err(e)
            }
        }
    }

    /// `mine`, combined with every other rank's when the ranks are processes.
    pub(super) fn combine(&mut self, mine: Outcome) -> Outcome {
        let Some(world) = self.world else {
            return mine;
        };
        match world.combine(&mine) {
            Ok(o) => o,
            Err(e) => {
                self.fatal.get_or_insert_with(|| e.clone());
                Outcome::failed(e)
            }
        }
    }

    pub(super) fn sync(&self) -> Result<(), String> {
        self.comm.synchronize().map_err(|e| e.to_string())
    }

    pub(super) fn libs(&self) -> Vec<Lib> {
        let mut v = Vec::new();
        if self.ringccl {
            v.push(Lib::Ringccl);
        }
        if self.nccl.is_some() {
            v.push(Lib::Nccl);
        }
        v
    }

    pub(super) fn note(&mut self, s: String) {
        if !self.notes.contains(&s) {
            self.say(|| println!("# note: {s}"));
            self.notes.push(s);
        }
    }

    /// Every size of one collective and type, for each operator.
    pub(super) fn sweep<T: PerfElem>(
        &mut self,
        kind: CollectiveKind,
        ops: &[Option<RedOp>],
        sizes: &[usize],
    ) -> Result<(), String> {
        if !coll::is_measured(kind) {
            return Err(not_measured(kind));
        }
        let n = self.n;
        let elt = T::DTYPE.size();
        let shapes: Vec<Shape> = sizes
            .iter()
            .map(|&b| coll::shape(kind, b, elt, n))
            .collect();
        let (a_len, b_len) = buffer_lens(&shapes);
        let alloc = (|| -> Result<Bufs<T>, String> {
            let plain = self.opts.register && self.ringccl;
            let mut bufs = Bufs::<T> {
                a: Vec::new(),
                b: Vec::new(),
                a_ptr: Vec::new(),
                b_ptr: Vec::new(),
                plain,
            };
            for &r in &self.local {
                let s = self.comm.stream(r);
                // Each slice is in `bufs` as soon as it exists, so that an error after it
                // frees it the way it was allocated (`Bufs`'s drop).
                for (len, what, slices, ptrs) in [
                    (a_len, "send", &mut bufs.a, &mut bufs.a_ptr),
                    (b_len, "receive", &mut bufs.b, &mut bufs.b_ptr),
                ] {
                    let slice = if plain {
                        alloc_plain::<T>(s, len)?
                    } else {
                        drv(
                            &format!("cuMemAlloc ({what} buffer)"),
                            s.alloc_zeros::<T>(len),
                        )?
                    };
                    ptrs.push(DeviceSlice::<T>::raw(&slice).ptr);
                    slices.push(slice);
                }
            }
            self.sync()?;
            Ok(bufs)
        })();
        let mut bufs = self.agree(alloc)?;
        // `--register`: every rank registers its send and receive buffers, in the same order
        // (collective), for the whole sweep; dropped (deregistered) in the same order before
        // the buffers are freed.
        let comm = self.comm;
        let registered = if self.opts.register && self.ringccl {
            let regs = (|| -> Result<Vec<ringccl::Registered<'_>>, String> {
                let mut regs = Vec::new();
                for (a, b) in bufs.a.iter().zip(&bufs.b) {
                    regs.push(comm.register(a).map_err(|e| format!("register: {e}"))?);
                    regs.push(comm.register(b).map_err(|e| format!("register: {e}"))?);
                }
                Ok(regs)
            })();
            self.agree(regs)?
        } else {
            Vec::new()
        };
        let tname = nccl_dtype_name(T::DTYPE);
        let both = self.libs().len() == 2;
        for &op in ops {
            let root = kind.has_root().then_some(self.opts.root);
            let op_name = op.map_or("none", RedOp::name);
            let header =
                print::sweep_header(kind, (tname, T::DTYPE.name()), op_name, root, n, both);
            self.say(|| print!("{header}"));
            let pat = match op {
                Some(op) => Pattern::reduction(op, n, T::LIMIT),
                None => Pattern::copy(T::LIMIT),
            };
            let table = match op {
                Some(op) => pat.reduced_table(op, n),
                None => Vec::new(),
            };
            let tol = op.map_or(0.0, |op| data::tolerance(op, n, T::SIG_BITS));
            let expect = Expect {
                pat,
                table: &table,
                tol,
            };
            for (&bytes, shape) in sizes.iter().zip(&shapes) {
                let label = format!(
                    "{} {} {} {} B",
                    kind.name(),
                    T::DTYPE.name(),
                    op.map_or("none", RedOp::name),
                    bytes
                );
                self.progress.show(&label);
                let inputs = self.inputs::<T>(kind, shape, pat);
                let mut rows: Vec<(Lib, Option<Record>, Option<Record>)> = Vec::new();
                for lib in self.libs() {
                    let oop =
                        self.measure(lib, kind, shape, op, false, &mut bufs, &inputs, &expect);
                    let ip = if kind.has_in_place() {
                        Some(self.measure(lib, kind, shape, op, true, &mut bufs, &inputs, &expect))
                    } else {
                        None
                    };
                    rows.push((lib, Some(oop), ip));
                }
                let out = print::size_rows(
                    &rows,
                    (shape.bytes, shape.elems),
                    (tname, op_name),
                    root,
                    both,
                );
                self.say(|| print!("{out}"));
                for (_, oop, ip) in rows {
                    self.records.extend(oop);
                    self.records.extend(ip);
                }
                self.progress.step();
                if let Some(e) = &self.fatal {
                    return Err(e.clone());
                }
            }
        }
        // Nothing may still use the buffers when they are freed.
        self.sync()?;
        drop(registered);
        Ok(())
    }

    /// Every local rank's send data for `shape` (only the root's for broadcast).
    fn inputs<T: PerfElem>(
        &self,
        kind: CollectiveKind,
        shape: &Shape,
        pat: Pattern,
    ) -> Vec<Vec<T>> {
        let root = self.opts.root;
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .local
                .iter()
                .map(|&r| {
                    let len = if kind == CollectiveKind::Broadcast && r != root {
                        0
                    } else {
                        shape.send
                    };
                    s.spawn(move || data::fill::<T>(pat, r, 0, len))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        })
    }

    /// One measurement (check, then timing); failures become the record's error.
    #[allow(clippy::too_many_arguments)]
    fn measure<T: PerfElem>(
        &mut self,
        lib: Lib,
        kind: CollectiveKind,
        shape: &Shape,
        op: Option<RedOp>,
        inplace: bool,
        bufs: &mut Bufs<T>,
        inputs: &[Vec<T>],
        expect: &Expect<'_>,
    ) -> Record {
        let n = self.n;
        let mut rec = Record {
            collective: kind.name(),
            dtype: T::DTYPE.name(),
            op: op.map_or("none", RedOp::name),
            root: kind.has_root().then_some(self.opts.root),
            bytes: shape.bytes,
            count: shape.elems,
            lib: lib.name(),
            inplace,
            time_us: f64::NAN,
            time_us_min: f64::NAN,
            time_us_mean: f64::NAN,
            host_us: f64::NAN,
            algbw: f64::NAN,
            busbw: f64::NAN,
            wrong: None,
            ngpus: n,
            graph: false,
            samples: 0,
            error: None,
            procs: self.world.map_or(1, World::nranks),
        };
        let mut checked = None;
        let result = (|| -> Result<(Vec<f64>, bool, f64), String> {
            if self.opts.check_iters > 0 {
                let mut wrong = 0;
                for _ in 0..self.opts.check_iters {
                    self.prepare(kind, shape, inplace, bufs, inputs)?;
                    self.launch(lib, kind, shape, op, inplace, bufs)?;
                    wrong += self.verify(kind, shape, inplace, bufs, expect)?;
                }
                checked = Some(wrong);
            }
            self.time(lib, kind, shape, op, inplace, bufs)
        })();
        let mine = match result {
            Ok((times, graph, host_us)) => Outcome {
                wrong: checked,
                times,
                graph,
                host_us,
                error: None,
            },
            Err(e) => {
                // Leave the streams idle for the next measurement (errors here are reported
                // by the next one).
                let _ = self.comm.synchronize();
                Outcome {
                    wrong: checked,
                    error: Some(e),
                    ..Outcome::default()
                }
            }
        };
        // One process per GPU: the slowest rank's times, every rank's wrong elements.
        let all = self.combine(mine);
        rec.wrong = all.wrong;
        match all.error {
            Some(e) => rec.error = Some(e),
            None => {
                timed(&mut rec, &all.times, coll::busbw_factor(kind, n));
                rec.graph = all.graph;
                rec.host_us = all.host_us;
            }
        }
        rec
    }

    /// Writes the inputs and poisons the outputs (all-ones bytes: NaN, -1 or MAX).
    pub(super) fn prepare<T: PerfElem>(
        &self,
        kind: CollectiveKind,
        shape: &Shape,
        inplace: bool,
        bufs: &mut Bufs<T>,
        inputs: &[Vec<T>],
    ) -> Result<(), String> {
        let elt = T::DTYPE.size();
        for (i, (input, &r)) in inputs.iter().zip(&self.local).enumerate() {
            let s = self.comm.stream(r);
            let (poison_len, in_off) = if inplace {
                in_place_layout(kind, shape, r)
            } else {
                (shape.recv, 0)
            };
            if poison_len > 0 {
                drv("cuCtxSetCurrent", s.context().bind_to_thread())?;
                // SAFETY: `b_ptr[i]` is rank r's receive buffer, at least `poison_len`
                // elements long (sized for the largest shape); the stream is rank r's.
                drv("cuMemsetD8Async", unsafe {
                    cudarc::driver::result::memset_d8_async(
                        bufs.b_ptr[i],
                        0xff,
                        poison_len * elt,
                        s.cu_stream(),
                    )
                })?;
            }
            if input.is_empty() {
                continue;
            }
            if inplace {
                let mut dst = bufs.b[i].slice_mut(in_off..in_off + input.len());
                drv("cuMemcpyHtoDAsync", s.memcpy_htod(input, &mut dst))?;
            } else {
                let mut dst = bufs.a[i].slice_mut(0..input.len());
                drv("cuMemcpyHtoDAsync", s.memcpy_htod(input, &mut dst))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffers_fit_every_shape_of_a_sweep() {
        use CollectiveKind as K;
        let sizes = [0usize, 8, 1 << 10, 64 << 20];
        for kind in [
            K::AllReduce,
            K::AllGather,
            K::ReduceScatter,
            K::Broadcast,
            K::Reduce,
            K::AllToAll,
            K::SendRecv,
        ] {
            for n in [1, 2, 3, 8] {
                let shapes: Vec<Shape> =
                    sizes.iter().map(|&b| coll::shape(kind, b, 4, n)).collect();
                let (a, b) = buffer_lens(&shapes);
                assert!(a >= 1 && b >= 1);
                for s in &shapes {
                    assert!(s.send <= a, "{kind} n={n}: send {} > {a}", s.send);
                    assert!(s.recv <= b && s.send <= b, "{kind} n={n}: {s:?} > {b}");
                    for r in 0..n {
                        // In place, rank r's input and the whole buffer fit in `b`.
                        let (len, off) = in_place_layout(kind, s, r);
                        assert!(
                            len <= b && off + s.count <= len.max(s.count),
                            "{kind} n={n} r={r}"
                        );
                    }
                }
                // The largest shape sets the lengths exactly.
                let last = shapes
                    .last()
                    .map(|s| (s.send.max(1), s.send.max(s.recv).max(1)));
                assert_eq!(Some((a, b)), last, "{kind} n={n}");
            }
        }
        assert_eq!(buffer_lens(&[]), (1, 1));
    }

    #[test]
    fn a_record_gets_the_medians_bandwidths() {
        let mut rec = Record {
            collective: "all_reduce",
            dtype: "f32",
            op: "sum",
            root: None,
            bytes: 1 << 20,
            count: 1 << 18,
            lib: "ringccl",
            inplace: false,
            time_us: f64::NAN,
            time_us_min: f64::NAN,
            time_us_mean: f64::NAN,
            host_us: f64::NAN,
            algbw: f64::NAN,
            busbw: f64::NAN,
            wrong: None,
            ngpus: 4,
            graph: false,
            samples: 0,
            error: None,
            procs: 1,
        };
        // All-reduce over 4 ranks: busbw = algbw * 2 * 3 / 4 (nccl-tests).
        let factor = coll::busbw_factor(CollectiveKind::AllReduce, 4);
        timed(&mut rec, &[20.0, 10.0, 30.0, 10.0, 10.0], factor);
        assert_eq!(
            (rec.time_us, rec.time_us_min, rec.time_us_mean),
            (10.0, 10.0, 16.0)
        );
        assert_eq!(rec.samples, 5);
        // 1 MiB in 10 µs: 104.8576 GB/s (bytes / ns).
        assert!((rec.algbw - 104.8576).abs() < 1e-9, "{}", rec.algbw);
        assert!((rec.busbw - rec.algbw * 1.5).abs() < 1e-9, "{}", rec.busbw);
    }
}
