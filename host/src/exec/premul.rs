//! The PreMulSum pre-step's execution (see `api::premul`, which chooses it): where each
//! held rank's scaled input goes, the scale launch (`ringccl_scale_{ty}`), and the
//! stream-ordered temporaries of reduce-scatter and reduce.

use cudarc::driver::{result, sys, CudaStream};

use crate::driver::Kernels;
use crate::exec::RankPtrs;
use crate::per_rank::PerRank;
use crate::schedule::Layout;
use crate::{DataType, Error, Result};

pub use crate::driver::scale::ScaleBy;

/// The pre-step of a PreMulSum call: scale each held rank's input, then sum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prescale {
    /// Each held rank's scalar, in argument order.
    pub scalars: Vec<ScaleBy>,
    /// Elements of input per rank.
    pub elems: usize,
    /// Where the scaled input goes.
    pub into: Target,
}

/// Where a [`Prescale`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The input buffer itself (in-place all-reduce).
    InPlace,
    /// The receive buffer, then the collective runs in place on it (out-of-place all-reduce).
    Recv,
    /// A temporary of the stream-ordered allocator, freed after the call (reduce-scatter,
    /// reduce).
    Temp,
}

impl Prescale {
    /// The layout the collective runs with after the pre-step, given the validated one.
    ///
    /// ```
    /// use ringccl::internals::exec::premul::{Prescale, Target};
    /// use ringccl::internals::schedule::Layout;
    /// let pre = Prescale { scalars: vec![], elems: 4, into: Target::Recv };
    /// assert_eq!(pre.layout(Layout::OutOfPlace), Layout::SendInRecv { stride: 0 });
    /// ```
    pub fn layout(&self, layout: Layout) -> Layout {
        match self.into {
            Target::InPlace => layout,
            Target::Recv => Layout::SendInRecv { stride: 0 },
            Target::Temp => Layout::OutOfPlace,
        }
    }

    /// The pointers the collective runs with after the pre-step (in [`Prescale::layout`]),
    /// given the validated ones and the temporaries (`temps[i]`: held rank `i`'s, none unless
    /// [`Target::Temp`]).
    ///
    /// ```
    /// use ringccl::internals::exec::premul::{Prescale, Target};
    /// use ringccl::internals::exec::RankPtrs;
    /// let pre = Prescale { scalars: vec![], elems: 4, into: Target::Recv };
    /// let p = pre.rewrite(&[RankPtrs { send: 0x100, recv: 0x200 }], &[]);
    /// assert_eq!((p[0].send, p[0].recv), (0x200, 0x200));
    /// ```
    pub fn rewrite(&self, ptrs: &[RankPtrs], temps: &[u64]) -> PerRank<RankPtrs> {
        match self.into {
            Target::InPlace => ptrs.iter().copied().collect(),
            Target::Recv => ptrs
                .iter()
                .map(|p| RankPtrs {
                    send: p.recv,
                    recv: p.recv,
                })
                .collect(),
            Target::Temp => ptrs
                .iter()
                .zip(temps)
                .map(|(p, &t)| RankPtrs {
                    send: t,
                    recv: p.recv,
                })
                .collect(),
        }
    }

    /// Where the scale of held rank `i` reads and writes (`temp`: its temporary, if any).
    pub fn src_dst(&self, p: &RankPtrs, temp: u64) -> (u64, u64) {
        match self.into {
            Target::InPlace => (p.send, p.send),
            Target::Recv => (p.send, p.recv),
            Target::Temp => (p.send, temp),
        }
    }
}

/// Temporaries of the stream-ordered allocator, one per held rank (0: none), freed on their
/// rank's stream by [`Temps::free`] (or, if that is never called, on drop).
pub struct Temps<'a> {
    ptrs: Vec<u64>,
    streams: Vec<&'a CudaStream>,
}

impl<'a> Temps<'a> {
    /// No temporaries.
    pub fn none() -> Self {
        Temps {
            ptrs: Vec::new(),
            streams: Vec::new(),
        }
    }

    /// `bytes` on each of `streams`, from `pools[i]` (`cuMemAllocFromPoolAsync`: the pool the
    /// communicator granted its peers access to) or, where that is 0, from the device's
    /// current pool (`cuMemAllocAsync`); `ranks[i]` names the rank of `streams[i]` in errors.
    /// On an error those allocated so far are freed.
    pub fn alloc(
        streams: Vec<&'a CudaStream>,
        pools: &[usize],
        ranks: &[usize],
        bytes: usize,
    ) -> Result<Self> {
        let mut t = Temps {
            ptrs: Vec::with_capacity(streams.len()),
            streams: Vec::new(),
        };
        for (i, s) in streams.iter().enumerate() {
            let r = ranks.get(i).copied();
            s.context()
                .bind_to_thread()
                .map_err(|e| Error::cuda("cuCtxSetCurrent", r, e))?;
            t.streams.push(*s);
            let pool = pools.get(i).copied().unwrap_or(0);
            // SAFETY: a live stream of the bound context and, if not 0, the live memory pool
            // of its device (`RankResources::granted_pool`); the memory is written by the
            // scale kernel before anything reads it.
            let ptr = unsafe {
                if pool == 0 {
                    result::malloc_async(s.cu_stream(), bytes.max(1))
                } else {
                    result::mem_pool::alloc_async(pool as sys::CUmemoryPool, bytes.max(1), s.cu_stream())
                }
            };
            match ptr {
                Ok(p) => t.ptrs.push(p),
                Err(e) => {
                    t.streams.pop();
                    return Err(Error::cuda("cuMemAllocAsync", r, e));
                }
            }
        }
        Ok(t)
    }

    /// The temporaries' addresses (empty for [`Temps::none`]).
    pub fn ptrs(&self) -> &[u64] {
        &self.ptrs
    }

    /// Frees every temporary on its stream, after the work enqueued there so far
    /// (`cuMemFreeAsync`); the first error is returned, the rest still freed.
    pub fn free(mut self) -> Result<()> {
        self.free_all()
    }

    fn free_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        for (p, s) in self.ptrs.drain(..).zip(self.streams.drain(..)) {
            let r = s
                .context()
                .bind_to_thread()
                // SAFETY: `p` came from `cuMemAllocAsync` and is freed once, in stream order.
                .and_then(|_| unsafe { result::free_async(p, s.cu_stream()) });
            if let (Err(e), Ok(())) = (r, &first) {
                first = Err(Error::cuda("cuMemFreeAsync", None, e));
            }
        }
        first
    }
}

impl Drop for Temps<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.free_all() {
            log::warn!("ringccl: freeing a PreMulSum temporary failed: {e}");
        }
    }
}

/// Enqueues `dst[i] = src[i] * scalar` for `count` elements on `stream` (the scale kernel,
/// NCCL's `FuncPreMulSum` product), at most `max_blocks` blocks.
///
/// # Safety
/// As `driver::scale::launch_scale`: `src` and `dst` device memory of `kernels`' context of at
/// least `count` elements, equal or disjoint, alive until the kernel has run; a device scalar
/// one readable element of `dtype`, alive until then.
#[allow(clippy::too_many_arguments)]
pub unsafe fn scale(
    kernels: &Kernels,
    stream: &CudaStream,
    dtype: DataType,
    src: u64,
    dst: u64,
    count: usize,
    scalar: ScaleBy,
    max_blocks: u32,
) -> Result<()> {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        crate::driver::scale::launch_scale(kernels, stream, dtype, src, dst, count, scalar, max_blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IN_PLACE: Layout = Layout::SendInRecv { stride: 0 };

    #[test]
    fn rewrite_points_the_sum_at_the_scaled_data() {
        let ptrs = [
            RankPtrs { send: 0x100, recv: 0x200 },
            RankPtrs { send: 0x300, recv: 0 },
        ];
        let temps = [0x1000, 0x2000];
        let mk = |into| Prescale { scalars: vec![ScaleBy::Immediate(1); 2], elems: 4, into };
        // Reduce-scatter and reduce: the temporaries are the inputs, out of place.
        let t = mk(Target::Temp);
        assert_eq!(t.layout(IN_PLACE), Layout::OutOfPlace);
        assert_eq!(t.layout(Layout::RecvInSend { stride: 4 }), Layout::OutOfPlace);
        assert_eq!(
            &t.rewrite(&ptrs, &temps)[..],
            &[RankPtrs { send: 0x1000, recv: 0x200 }, RankPtrs { send: 0x2000, recv: 0 }]
        );
        assert_eq!(t.src_dst(&ptrs[0], 0x1000), (0x100, 0x1000));
        // Out-of-place all-reduce: scaled into the output, then summed in place there.
        let r = mk(Target::Recv);
        assert_eq!(r.layout(Layout::OutOfPlace), IN_PLACE);
        let p = r.rewrite(&ptrs[..1], &[]);
        assert_eq!((p[0].send, p[0].recv), (0x200, 0x200));
        assert_eq!(r.src_dst(&ptrs[0], 0), (0x100, 0x200));
        // In-place all-reduce: scaled where it is.
        let inp = [RankPtrs { send: 0x500, recv: 0x500 }];
        let i = mk(Target::InPlace);
        assert_eq!(i.layout(IN_PLACE), IN_PLACE);
        assert_eq!(&i.rewrite(&inp, &[])[..], &inp[..]);
        assert_eq!(i.src_dst(&inp[0], 0), (0x500, 0x500));
    }
}
