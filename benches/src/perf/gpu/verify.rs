//! Reading every output back and counting the elements that differ from the expected values
//! (exact, or within [`super::super::data::tolerance`] for NCCL-style averages).

use ringccl::CollectiveKind;

use super::super::coll::Shape;
use super::super::data::{self, PerfElem};
use super::bench::{Bench, Bufs, Expect};
use super::calls::in_place_layout;
use super::drv;

/// Whether rank `r`'s output is checked: every rank's, but a reduce's only at its root.
pub(super) fn is_checked(kind: CollectiveKind, r: usize, root: usize) -> bool {
    kind != CollectiveKind::Reduce || r == root
}

/// Where rank `r`'s output lies in its receive buffer (the one buffer in place): offset and
/// elements.
pub(super) fn read_range(
    kind: CollectiveKind,
    inplace: bool,
    shape: &Shape,
    r: usize,
) -> (usize, usize) {
    match (kind, inplace) {
        (CollectiveKind::ReduceScatter, true) => (r * shape.count, shape.count),
        (_, true) => (0, in_place_layout(kind, shape, r).0),
        (_, false) => (0, shape.recv),
    }
}

/// Element `j` of rank `r`'s output, of `n` ranks with `root` and `count` elements per call
/// (per rank, per peer), when every rank `q`'s input is `expect.pat.value(q, i)`: a reduction
/// of every rank's element (`expect.table`, one period of them), or a rank's element moved.
pub(super) fn expected(
    kind: CollectiveKind,
    expect: &Expect<'_>,
    (r, root, n, count): (usize, usize, usize, usize),
    j: usize,
) -> f64 {
    use CollectiveKind as K;
    let (pat, table) = (expect.pat, expect.table);
    let period = table.len().max(1);
    let count = count.max(1);
    match kind {
        K::AllReduce | K::Reduce => table.get(j % period).copied().unwrap_or(f64::NAN),
        K::ReduceScatter => table
            .get((r * count + j) % period)
            .copied()
            .unwrap_or(f64::NAN),
        K::AllGather => pat.value(j / count, j % count),
        K::Broadcast => pat.value(root, j),
        K::AllToAll => pat.value(j / count, r * count + j % count),
        K::SendRecv => pat.value((r + n - 1) % n.max(1), j),
        // Not measured: `sweep` refuses them before any launch.
        K::Gather | K::Scatter => f64::NAN,
    }
}

impl Bench<'_> {
    /// Waits for the call, reads every output back and counts the wrong elements.
    pub(super) fn verify<T: PerfElem>(
        &self,
        kind: CollectiveKind,
        shape: &Shape,
        inplace: bool,
        bufs: &mut Bufs<T>,
        expect: &Expect<'_>,
    ) -> Result<usize, String> {
        self.sync()?;
        let (root, count, n) = (self.opts.root, shape.count, self.n);
        std::thread::scope(|sc| -> Result<usize, String> {
            let mut handles = Vec::new();
            for (i, &r) in self.local.iter().enumerate() {
                if !is_checked(kind, r, root) {
                    continue;
                }
                let (off, len) = read_range(kind, inplace, shape, r);
                if len == 0 {
                    continue;
                }
                let got = drv(
                    "cuMemcpyDtoH",
                    self.comm
                        .stream(r)
                        .clone_dtoh(&bufs.b[i].slice(off..off + len)),
                )?;
                handles.push(sc.spawn(move || {
                    data::count_wrong(&got, expect.tol, |j| {
                        expected(kind, expect, (r, root, n, count), j)
                    })
                }));
            }
            let mut wrong = 0;
            for h in handles {
                wrong += h
                    .join()
                    .map_err(|_| "the check thread panicked".to_string())?;
            }
            Ok(wrong)
        })
    }
}

#[cfg(test)]
mod tests {
    use ringccl::RedOp;

    use super::super::super::coll;
    use super::super::super::data::Pattern;
    use super::*;

    /// What a correct collective leaves in rank `r`'s output (`len` elements), computed on the
    /// CPU from every rank's inputs.
    fn reference(
        kind: CollectiveKind,
        pat: Pattern,
        op: RedOp,
        (r, root, n, count): (usize, usize, usize, usize),
        len: usize,
    ) -> Vec<f64> {
        use CollectiveKind as K;
        let fold = |i: usize| pat.reduced(op, n, i);
        (0..len)
            .map(|j| match kind {
                K::AllReduce | K::Reduce => fold(j),
                K::ReduceScatter => fold(r * count + j),
                K::AllGather => pat.value(j / count, j % count),
                K::Broadcast => pat.value(root, j),
                K::AllToAll => pat.value(j / count, r * count + j % count),
                K::SendRecv => pat.value((r + n - 1) % n, j),
                K::Gather | K::Scatter => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn a_correct_output_passes_and_each_wrong_element_counts() {
        use CollectiveKind as K;
        let n = 3;
        let root = 1;
        for (kind, op) in [
            (K::AllReduce, Some(RedOp::Sum)),
            (K::AllReduce, Some(RedOp::Max)),
            (K::AllReduce, Some(RedOp::Prod)),
            (K::ReduceScatter, Some(RedOp::Sum)),
            (K::ReduceScatter, Some(RedOp::Min)),
            (K::Reduce, Some(RedOp::Sum)),
            (K::AllGather, None),
            (K::Broadcast, None),
            (K::AllToAll, None),
            (K::SendRecv, None),
        ] {
            // 12 KiB of f32: many periods of every pattern, and counts that are not multiples
            // of them.
            let shape = coll::shape(kind, 12 << 10, 4, n);
            let pat = match op {
                Some(op) => Pattern::reduction(op, n, f32::LIMIT),
                None => Pattern::copy(f32::LIMIT),
            };
            let table = op.map_or(Vec::new(), |op| pat.reduced_table(op, n));
            let expect = Expect {
                pat,
                table: &table,
                tol: 0.0,
            };
            for inplace in [false, true] {
                for r in 0..n {
                    if !is_checked(kind, r, root) {
                        assert_eq!((kind, r == root), (K::Reduce, false));
                        continue;
                    }
                    let (_, len) = read_range(kind, inplace, &shape, r);
                    assert!(len > 0, "{kind} rank {r}");
                    let at = (r, root, n, shape.count);
                    let want = reference(kind, pat, op.unwrap_or(RedOp::Sum), at, len);
                    let mut got: Vec<f32> = want.iter().map(|&v| v as f32).collect();
                    assert_eq!(
                        data::count_wrong(&got, 0.0, |j| expected(kind, &expect, at, j)),
                        0,
                        "{kind} {op:?} rank {r}"
                    );
                    got[len / 2] += 1.0;
                    got[len - 1] = f32::NAN;
                    assert_eq!(
                        data::count_wrong(&got, 0.0, |j| expected(kind, &expect, at, j)),
                        2,
                        "{kind} {op:?} rank {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn outputs_are_read_where_each_collective_leaves_them() {
        use CollectiveKind as K;
        let n = 4;
        let rs = coll::shape(K::ReduceScatter, 4096, 4, n);
        assert_eq!(read_range(K::ReduceScatter, false, &rs, 2), (0, rs.count));
        assert_eq!(
            read_range(K::ReduceScatter, true, &rs, 2),
            (2 * rs.count, rs.count)
        );
        let ag = coll::shape(K::AllGather, 4096, 4, n);
        assert_eq!(read_range(K::AllGather, true, &ag, 3), (0, n * ag.count));
        assert_eq!(read_range(K::AllGather, false, &ag, 3), (0, n * ag.count));
        let ar = coll::shape(K::AllReduce, 4096, 4, n);
        assert_eq!(read_range(K::AllReduce, true, &ar, 1), (0, 1024));
        assert!(is_checked(K::Reduce, 2, 2) && !is_checked(K::Reduce, 1, 2));
        assert!(is_checked(K::Broadcast, 1, 2));
    }
}
