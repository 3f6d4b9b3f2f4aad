//! Which gradient goes into which bucket, where it lies in the flat buffer, and which buckets
//! are ready: pure data, tested on the CPU.

use std::ops::Range;

use super::ReducerError;

/// Bytes every parameter's gradient (and so every bucket) starts at a multiple of, inside the
/// flat buffer: keeps views aligned for vector loads and cuBLAS.
pub const ALIGN_BYTES: usize = 256;

/// The bucket size caps, in bytes (PyTorch DDP's defaults: the first bucket 1 MiB, the others
/// 25 MiB).
///
/// A bucket is closed as soon as it holds at least its cap, so a bucket can pass its cap by its
/// last gradient, and a gradient larger than the cap gets a bucket of its own (as in DDP).
///
/// ```
/// let caps = ringccl::ddp::BucketCaps::default();
/// assert_eq!(caps.first_bytes, 1 << 20);
/// assert_eq!(caps.bytes, 25 << 20);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketCaps {
    /// Cap of the first bucket (the gradients ready first, so their all-reduce starts early).
    pub first_bytes: usize,
    /// Cap of every other bucket.
    pub bytes: usize,
}

impl Default for BucketCaps {
    fn default() -> Self {
        BucketCaps {
            first_bytes: 1 << 20,
            bytes: 25 << 20,
        }
    }
}

/// One bucket: a contiguous range of the flat gradient buffer holding whole gradients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// The parameters whose gradients it holds, in the order they lie in the buffer (reverse
    /// registration order).
    pub params: Vec<usize>,
    /// Its elements in the flat buffer (gradients and the alignment padding between them).
    pub range: Range<usize>,
}

/// The layout of the flat gradient buffer: buckets in reverse registration order of the
/// parameters (the order a backward pass produces gradients), each parameter's gradient at an
/// aligned offset.
///
/// ```
/// use ringccl::ddp::{BucketCaps, BucketPlan};
/// // Three parameters of 4-byte elements; caps of 1 KiB then 4 KiB.
/// let caps = BucketCaps { first_bytes: 1024, bytes: 4096 };
/// let plan = BucketPlan::new(&[1000, 10, 300], 4, caps)?;
/// // Reverse order: param 2 (1200 B) fills the first bucket alone; 1 and 0 share the second.
/// assert_eq!(plan.buckets()[0].params, vec![2]);
/// assert_eq!(plan.buckets()[1].params, vec![1, 0]);
/// assert_eq!(plan.bucket_of(0), 1);
/// # Ok::<(), ringccl::ddp::ReducerError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    buckets: Vec<Bucket>,
    /// Per parameter: its elements in the flat buffer.
    ranges: Vec<Range<usize>>,
    /// Per parameter: its bucket.
    bucket_of: Vec<usize>,
    /// Elements of the flat buffer.
    len: usize,
}

impl BucketPlan {
    /// Plans buckets for parameters of `lens` elements of `elem_size` bytes (registration
    /// order). Errors: no parameters, an empty parameter, a zero cap or element size, a
    /// buffer too large to address.
    pub fn new(lens: &[usize], elem_size: usize, caps: BucketCaps) -> Result<Self, ReducerError> {
        let bad = |reason: String| Err(ReducerError::Layout { reason });
        if lens.is_empty() {
            return bad("no parameters to reduce".into());
        }
        if elem_size == 0 || !ALIGN_BYTES.is_multiple_of(elem_size) {
            return bad(format!(
                "element size {elem_size} does not divide {ALIGN_BYTES}"
            ));
        }
        if caps.first_bytes == 0 || caps.bytes == 0 {
            return bad(format!("bucket caps must be positive, got {caps:?}"));
        }
        if let Some(p) = lens.iter().position(|&l| l == 0) {
            return bad(format!("parameter {p} has no elements"));
        }
        let align = ALIGN_BYTES / elem_size;
        let mut ranges = vec![0..0; lens.len()];
        let mut bucket_of = vec![0; lens.len()];
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut current = Bucket {
            params: Vec::new(),
            range: 0..0,
        };
        let mut cursor = 0usize;
        let overflow = || ReducerError::Layout {
            reason: "the gradients do not fit in an addressable buffer".into(),
        };
        for p in (0..lens.len()).rev() {
            let start = cursor
                .checked_next_multiple_of(align)
                .ok_or_else(overflow)?;
            let end = start.checked_add(lens[p]).ok_or_else(overflow)?;
            end.checked_mul(elem_size).ok_or_else(overflow)?;
            if current.params.is_empty() {
                current.range = start..start;
            }
            current.params.push(p);
            current.range.end = end;
            ranges[p] = start..end;
            bucket_of[p] = buckets.len();
            cursor = end;
            let cap = if buckets.is_empty() {
                caps.first_bytes
            } else {
                caps.bytes
            };
            if current.range.len() * elem_size >= cap {
                buckets.push(std::mem::replace(
                    &mut current,
                    Bucket {
                        params: Vec::new(),
                        range: 0..0,
                    },
                ));
            }
        }
        if !current.params.is_empty() {
            buckets.push(current);
        }
        Ok(BucketPlan {
            buckets,
            ranges,
            bucket_of,
            len: cursor,
        })
    }

    /// The buckets, in the order their all-reduces run.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Elements of parameter `param`'s gradient in the flat buffer (panics if `param` is out
    /// of range; [`Reducer`](super::Reducer) checks first).
    pub fn range(&self, param: usize) -> Range<usize> {
        self.ranges[param].clone()
    }

    /// The bucket that holds parameter `param` (panics if out of range).
    pub fn bucket_of(&self, param: usize) -> usize {
        self.bucket_of[param]
    }

    /// Number of parameters.
    pub fn nparams(&self) -> usize {
        self.ranges.len()
    }

    /// Elements of the flat buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a plan has at least one parameter.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Which gradients are ready in the current backward pass, on each local rank, and which
/// buckets may start.
///
/// Buckets start in index order (every rank must issue the same collectives in the same
/// order), each once it is complete on every local rank.
///
/// ```
/// use ringccl::ddp::{BucketCaps, BucketPlan, ReadyState};
/// let plan = BucketPlan::new(&[64, 64], 4, BucketCaps { first_bytes: 256, bytes: 256 })?;
/// let mut ready = ReadyState::new(&plan, 1);
/// assert_eq!(ready.mark(&plan, 0, 0)?, Vec::<usize>::new()); // bucket 1 is not next
/// assert_eq!(ready.mark(&plan, 0, 1)?, vec![0, 1]);          // bucket 0, then 1
/// ready.finish(&plan)?;
/// # Ok::<(), ringccl::ddp::ReducerError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ReadyState {
    /// `[local][param]`: marked in this pass.
    ready: Vec<Vec<bool>>,
    /// `[bucket]`: gradients still missing, over every local rank.
    missing: Vec<usize>,
    /// The next bucket to start.
    next: usize,
    /// The local ranks' global rank numbers (for error messages).
    ranks: Vec<usize>,
    /// Whether [`ReadyState::mark`] hands out buckets (else only [`ReadyState::take_all`]).
    eager: bool,
}

impl ReadyState {
    /// Nothing ready, for `nlocal` local ranks numbered `0..nlocal`.
    pub fn new(plan: &BucketPlan, nlocal: usize) -> Self {
        Self::with_ranks(plan, (0..nlocal).collect())
    }

    /// Nothing ready, for local ranks whose global numbers are `ranks`.
    pub fn with_ranks(plan: &BucketPlan, ranks: Vec<usize>) -> Self {
        let n = ranks.len();
        ReadyState {
            ready: vec![vec![false; plan.nparams()]; n],
            missing: plan.buckets().iter().map(|b| b.params.len() * n).collect(),
            next: 0,
            ranks,
            eager: true,
        }
    }

    /// The same state, but [`ReadyState::mark`] never hands out a bucket: every bucket comes
    /// from [`ReadyState::take_all`] after the pass (all-reduce after backward, no overlap).
    pub fn deferred(mut self) -> Self {
        self.eager = false;
        self
    }

    /// Marks `param` ready on local rank `local`; returns the buckets that may start now, in
    /// order. Errors (and changes nothing) for an unknown rank or parameter, or one already
    /// marked in this pass.
    pub fn mark(
        &mut self,
        plan: &BucketPlan,
        local: usize,
        param: usize,
    ) -> Result<Vec<usize>, ReducerError> {
        let Some(flags) = self.ready.get_mut(local) else {
            return Err(ReducerError::UnknownRank {
                local,
                nlocal: self.ranks.len(),
            });
        };
        let rank = self.ranks[local];
        let Some(flag) = flags.get_mut(param) else {
            return Err(ReducerError::UnknownParam {
                rank,
                param,
                nparams: plan.nparams(),
            });
        };
        if *flag {
            return Err(ReducerError::AlreadyReady { rank, param });
        }
        *flag = true;
        self.missing[plan.bucket_of(param)] -= 1;
        Ok(self.take_startable())
    }

    /// Every bucket that has not started yet, in order, as if it were complete (for a reducer
    /// that starts its all-reduces only after the backward pass), once every gradient is
    /// marked; else the [`ReducerError::Unused`] error of [`ReadyState::finish`].
    pub fn take_all(&mut self, plan: &BucketPlan) -> Result<Vec<usize>, ReducerError> {
        self.check_complete(plan)?;
        let rest = (self.next..self.missing.len()).collect();
        self.next = self.missing.len();
        Ok(rest)
    }

    /// Ends the pass: every gradient must have been marked on every local rank, else
    /// [`ReducerError::Unused`] names the first rank's missing parameters. Either way the state
    /// is reset for the next pass.
    pub fn finish(&mut self, plan: &BucketPlan) -> Result<(), ReducerError> {
        let result = self.check_complete(plan);
        let eager = self.eager;
        *self = ReadyState::with_ranks(plan, std::mem::take(&mut self.ranks));
        self.eager = eager;
        result
    }

    /// Whether every bucket has started.
    pub fn all_started(&self) -> bool {
        self.next == self.missing.len()
    }

    fn check_complete(&self, _plan: &BucketPlan) -> Result<(), ReducerError> {
        for (local, flags) in self.ready.iter().enumerate() {
            let params: Vec<usize> = (0..flags.len()).filter(|&p| !flags[p]).collect();
            if !params.is_empty() {
                return Err(ReducerError::Unused {
                    rank: self.ranks[local],
                    params,
                });
            }
        }
        Ok(())
    }

    fn take_startable(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        while self.eager && self.next < self.missing.len() && self.missing[self.next] == 0 {
            out.push(self.next);
            self.next += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// The MLP of the training example: 4 layers of 4096 × 4096 weights and 4096 biases, f32.
    fn mlp_lens() -> Vec<usize> {
        (0..4).flat_map(|_| [4096 * 4096, 4096]).collect()
    }

    #[test]
    fn default_caps_on_the_mlp() {
        let plan = BucketPlan::new(&mlp_lens(), 4, BucketCaps::default()).unwrap();
        // Reverse order: the last bias and weight share the first bucket, and so on.
        let params: Vec<Vec<usize>> = plan.buckets().iter().map(|b| b.params.clone()).collect();
        assert_eq!(params, vec![vec![7, 6], vec![5, 4], vec![3, 2], vec![1, 0]]);
        for b in plan.buckets() {
            assert_eq!(b.range.len(), 4096 + 4096 * 4096);
        }
        assert_eq!(plan.len(), 4 * (4096 + 4096 * 4096));
    }

    #[test]
    fn first_bucket_uses_the_first_cap() {
        // 64 KiB gradients (f32): 16 fill the 1 MiB first bucket, 400 fill a 25 MiB one.
        let lens = vec![16 * 1024; 1000];
        let plan = BucketPlan::new(&lens, 4, BucketCaps::default()).unwrap();
        let sizes: Vec<usize> = plan.buckets().iter().map(|b| b.params.len()).collect();
        assert_eq!(sizes[0], 16);
        assert!(
            sizes[1..sizes.len() - 1].iter().all(|&s| s == 400),
            "{sizes:?}"
        );
        assert_eq!(sizes.iter().sum::<usize>(), 1000);
        assert_eq!(plan.buckets()[0].range.len() * 4, MIB);
        assert_eq!(plan.buckets()[0].params[0], 999);
    }

    #[test]
    fn layout_is_aligned_disjoint_and_covers_each_bucket() {
        let lens = [3, 1000, 7, 1, 65, 250_000, 2];
        for caps in [
            BucketCaps::default(),
            BucketCaps {
                first_bytes: 100,
                bytes: 3000,
            },
            BucketCaps {
                first_bytes: 1,
                bytes: 1,
            },
        ] {
            for elem in [1, 2, 4, 8] {
                let plan = BucketPlan::new(&lens, elem, caps).unwrap();
                let align = ALIGN_BYTES / elem;
                let mut seen = vec![false; lens.len()];
                let mut prev_end = 0;
                for (i, b) in plan.buckets().iter().enumerate() {
                    assert!(b.range.start >= prev_end);
                    prev_end = b.range.end;
                    assert_eq!(b.range.start, plan.range(b.params[0]).start);
                    assert_eq!(b.range.end, plan.range(*b.params.last().unwrap()).end);
                    for w in b.params.windows(2) {
                        assert!(w[0] > w[1], "reverse registration order");
                        assert!(plan.range(w[0]).end <= plan.range(w[1]).start);
                    }
                    for &p in &b.params {
                        assert!(!seen[p]);
                        seen[p] = true;
                        assert_eq!(plan.bucket_of(p), i);
                        assert_eq!(plan.range(p).len(), lens[p]);
                        assert_eq!(plan.range(p).start % align, 0);
                    }
                    // Closed at its cap: without its last gradient it was below the cap.
                    let cap = if i == 0 { caps.first_bytes } else { caps.bytes };
                    if i + 1 < plan.buckets().len() {
                        assert!(b.range.len() * elem >= cap);
                        if let [.., prev, _] = b.params[..] {
                            assert!((plan.range(prev).end - b.range.start) * elem < cap);
                        }
                    }
                }
                assert!(seen.iter().all(|&s| s));
                assert_eq!(plan.len(), prev_end);
            }
        }
    }

    #[test]
    fn bad_layouts_are_errors() {
        let caps = BucketCaps::default();
        assert!(matches!(
            BucketPlan::new(&[], 4, caps),
            Err(ReducerError::Layout { .. })
        ));
        assert!(matches!(
            BucketPlan::new(&[4, 0], 4, caps),
            Err(ReducerError::Layout { .. })
        ));
        assert!(BucketPlan::new(&[4], 3, caps).is_err());
        assert!(BucketPlan::new(
            &[4],
            4,
            BucketCaps {
                first_bytes: 0,
                bytes: 1
            }
        )
        .is_err());
        assert!(BucketPlan::new(&[usize::MAX / 2, 8], 4, caps).is_err());
    }

    fn small_plan() -> BucketPlan {
        // 5 params of 64 f32 (256 B); caps 256 B then 512 B: buckets {4}, {3, 2}, {1, 0}.
        let plan = BucketPlan::new(
            &[64; 5],
            4,
            BucketCaps {
                first_bytes: 256,
                bytes: 512,
            },
        )
        .unwrap();
        let params: Vec<Vec<usize>> = plan.buckets().iter().map(|b| b.params.clone()).collect();
        assert_eq!(params, vec![vec![4], vec![3, 2], vec![1, 0]]);
        plan
    }

    #[test]
    fn buckets_start_in_order_once_complete_on_every_rank() {
        let plan = small_plan();
        let mut st = ReadyState::new(&plan, 2);
        // Bucket 2 complete on both ranks first: nothing may start before bucket 0.
        for local in 0..2 {
            assert!(st.mark(&plan, local, 0).unwrap().is_empty());
            assert!(st.mark(&plan, local, 1).unwrap().is_empty());
        }
        assert!(st.mark(&plan, 0, 4).unwrap().is_empty()); // rank 1 still lacks param 4
        assert_eq!(st.mark(&plan, 1, 4).unwrap(), vec![0]);
        assert!(st.mark(&plan, 1, 3).unwrap().is_empty());
        assert!(st.mark(&plan, 0, 2).unwrap().is_empty());
        assert!(st.mark(&plan, 1, 2).unwrap().is_empty());
        assert_eq!(st.mark(&plan, 0, 3).unwrap(), vec![1, 2]);
        assert!(st.all_started());
        st.finish(&plan).unwrap();
        // The next pass starts from scratch.
        assert!(!st.all_started());
        assert!(st.mark(&plan, 0, 4).unwrap().is_empty());
    }

    #[test]
    fn every_order_starts_every_bucket_exactly_once() {
        let plan = small_plan();
        // All 120 orders of the 5 parameters, one rank.
        let mut order = [0usize, 1, 2, 3, 4];
        let mut count = 0;
        permute(&mut order, 0, &mut |o| {
            let mut st = ReadyState::new(&plan, 1);
            let mut started = Vec::new();
            for &p in o {
                started.extend(st.mark(&plan, 0, p).unwrap());
            }
            assert_eq!(started, vec![0, 1, 2], "order {o:?}");
            st.finish(&plan).unwrap();
            count += 1;
        });
        assert_eq!(count, 120);
    }

    fn permute(a: &mut [usize; 5], k: usize, f: &mut impl FnMut(&[usize])) {
        if k == a.len() {
            f(a);
            return;
        }
        for i in k..a.len() {
            a.swap(k, i);
            permute(a, k + 1, f);
            a.swap(k, i);
        }
    }

    #[test]
    fn repeated_unknown_and_unused_are_errors() {
        let plan = small_plan();
        let mut st = ReadyState::with_ranks(&plan, vec![3]);
        st.mark(&plan, 0, 4).unwrap();
        assert_eq!(
            st.mark(&plan, 0, 4),
            Err(ReducerError::AlreadyReady { rank: 3, param: 4 })
        );
        assert_eq!(
            st.mark(&plan, 0, 5),
            Err(ReducerError::UnknownParam {
                rank: 3,
                param: 5,
                nparams: 5
            })
        );
        assert_eq!(
            st.mark(&plan, 1, 0),
            Err(ReducerError::UnknownRank {
                local: 1,
                nlocal: 1
            })
        );
        st.mark(&plan, 0, 1).unwrap();
        assert_eq!(
            st.take_all(&plan),
            Err(ReducerError::Unused {
                rank: 3,
                params: vec![0, 2, 3]
            })
        );
        assert_eq!(
            st.finish(&plan),
            Err(ReducerError::Unused {
                rank: 3,
                params: vec![0, 2, 3]
            })
        );
        // Reset after the error: a full pass works.
        let mut started = Vec::new();
        for p in 0..5 {
            started.extend(st.mark(&plan, 0, p).unwrap());
        }
        assert_eq!(started, vec![0, 1, 2]);
        st.finish(&plan).unwrap();
    }

    #[test]
    fn take_all_starts_the_rest_in_order() {
        let plan = small_plan();
        let mut st = ReadyState::new(&plan, 1);
        let mut started = st.mark(&plan, 0, 4).unwrap();
        for p in 0..4 {
            started.extend(st.mark(&plan, 0, p).unwrap());
        }
        assert_eq!(started, vec![0, 1, 2]);
        assert!(st.take_all(&plan).unwrap().is_empty());
        // Deferred: marking hands out nothing, take_all every bucket once all are marked.
        let mut lazy = ReadyState::new(&plan, 2).deferred();
        for _pass in 0..2 {
            for p in [2, 0, 4, 1, 3] {
                for local in 0..2 {
                    assert!(lazy.mark(&plan, local, p).unwrap().is_empty());
                }
            }
            assert!(!lazy.all_started());
            assert_eq!(lazy.take_all(&plan).unwrap(), vec![0, 1, 2]);
            assert!(lazy.all_started());
            lazy.finish(&plan).unwrap();
        }
    }
}
