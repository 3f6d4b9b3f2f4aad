//! `ENTRY_POINTS`, the host's expansion of the entry point list: names, layout and the
//! constant-time lookup (`entry_index`, `find_entry`).

use gpu_kernels::entry::{entry_index, find_entry, EntryPoint};
use gpu_kernels::op::RedOp;
use gpu_kernels::{DataType, EntryKind, ENTRY_POINTS};
use std::collections::HashSet;

const REDUCTIONS: [EntryKind; 6] = [
    EntryKind::Reduce,
    EntryKind::ReduceCopy,
    EntryKind::OneShot,
    EntryKind::TwoShot,
    EntryKind::TwoShotColl,
    EntryKind::Ll,
];

#[test]
fn names_are_unique_and_systematic() {
    // 12 copies + 12 types x 5 ops x 6 kinds + 12 scales.
    assert_eq!(ENTRY_POINTS.len(), 12 + 12 * 5 * 6 + 12);
    let names: HashSet<&str> = ENTRY_POINTS.iter().map(|e| e.name).collect();
    assert_eq!(names.len(), ENTRY_POINTS.len(), "duplicate names");
    for e in ENTRY_POINTS {
        let want = match (e.kind, e.op) {
            (EntryKind::Copy, None) => format!("ringccl_copy_{}", e.dtype.name()),
            (EntryKind::Scale, None) => format!("ringccl_scale_{}", e.dtype.name()),
            (EntryKind::Reduce, Some(op)) => {
                format!("ringccl_reduce_{}_{}", op.name(), e.dtype.name())
            }
            (EntryKind::ReduceCopy, Some(op)) => {
                format!("ringccl_reduce_copy_{}_{}", op.name(), e.dtype.name())
            }
            (EntryKind::OneShot, Some(op)) => {
                format!("ringccl_oneshot_{}_{}", op.name(), e.dtype.name())
            }
            (EntryKind::TwoShot, Some(op)) => {
                format!("ringccl_twoshot_{}_{}", op.name(), e.dtype.name())
            }
            (EntryKind::TwoShotColl, Some(op)) => {
                format!("ringccl_twoshot_coll_{}_{}", op.name(), e.dtype.name())
            }
            (EntryKind::Ll, Some(op)) => format!("ringccl_ll_{}_{}", op.name(), e.dtype.name()),
            _ => panic!("{e:?}: copies have no operator, reductions have one"),
        };
        assert_eq!(e.name, want);
    }
    let kinds: Vec<&str> = EntryKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(
        kinds,
        [
            "copy",
            "reduce",
            "reduce_copy",
            "oneshot",
            "twoshot",
            "twoshot_coll",
            "ll",
            "scale"
        ]
    );
}

#[test]
fn layout_copies_then_kind_type_op() {
    let mut want = Vec::new();
    for dtype in DataType::ALL {
        want.push((EntryKind::Copy, dtype, None));
    }
    for kind in REDUCTIONS {
        for dtype in DataType::ALL {
            for op in RedOp::ALL {
                want.push((kind, dtype, Some(op)));
            }
        }
    }
    for dtype in DataType::ALL {
        want.push((EntryKind::Scale, dtype, None));
    }
    let got: Vec<_> = ENTRY_POINTS
        .iter()
        .map(|e| (e.kind, e.dtype, e.op))
        .collect();
    assert_eq!(got, want);
    assert_eq!(EntryKind::ALL[1..7], REDUCTIONS);
    assert_eq!(EntryKind::ALL[7], EntryKind::Scale);
    // Before the 12 scales: the one-shot, two-shot, other collectives' two-shot and LL
    // entries, 60 each (appended after the ring primitives, in that order).
    let last =
        |from: usize, to: usize| &ENTRY_POINTS[ENTRY_POINTS.len() - from..ENTRY_POINTS.len() - to];
    assert!(last(252, 192).iter().all(|e| e.kind == EntryKind::OneShot));
    assert!(last(192, 132).iter().all(|e| e.kind == EntryKind::TwoShot));
    assert!(last(132, 72)
        .iter()
        .all(|e| e.kind == EntryKind::TwoShotColl));
    assert!(last(72, 12).iter().all(|e| e.kind == EntryKind::Ll));
    assert!(last(12, 0).iter().all(|e| e.kind == EntryKind::Scale));
}

#[test]
fn entry_index_is_the_position() {
    for (i, e) in ENTRY_POINTS.iter().enumerate() {
        assert_eq!(entry_index(e.kind, e.dtype, e.op), Some(i), "{e:?}");
        let found: &EntryPoint = find_entry(e.kind, e.dtype, e.op).expect("an entry");
        assert_eq!(found, e);
    }
}

#[test]
fn entry_index_rejects_invalid_combinations() {
    for dtype in DataType::ALL {
        for op in RedOp::ALL {
            assert_eq!(entry_index(EntryKind::Copy, dtype, Some(op)), None);
            assert!(find_entry(EntryKind::Copy, dtype, Some(op)).is_none());
            assert_eq!(entry_index(EntryKind::Scale, dtype, Some(op)), None);
            assert!(find_entry(EntryKind::Scale, dtype, Some(op)).is_none());
        }
        for kind in REDUCTIONS {
            assert_eq!(entry_index(kind, dtype, None), None, "{kind:?} {dtype:?}");
            assert!(find_entry(kind, dtype, None).is_none());
        }
    }
}

#[test]
fn every_valid_combination_has_one_entry() {
    let mut seen = HashSet::new();
    for kind in EntryKind::ALL {
        for dtype in DataType::ALL {
            let ops: Vec<Option<RedOp>> = if matches!(kind, EntryKind::Copy | EntryKind::Scale) {
                vec![None]
            } else {
                RedOp::ALL.into_iter().map(Some).collect()
            };
            for op in ops {
                let i = entry_index(kind, dtype, op).expect("a valid combination");
                assert!(seen.insert(i), "{kind:?} {dtype:?} {op:?}: index {i} twice");
                let e = &ENTRY_POINTS[i];
                assert_eq!((e.kind, e.dtype, e.op), (kind, dtype, op));
            }
        }
    }
    assert_eq!(seen.len(), ENTRY_POINTS.len());
}
