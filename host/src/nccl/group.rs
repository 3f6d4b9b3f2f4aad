//! The group of a thread (`ncclGroupStart`/`ncclGroupEnd` are per thread in NCCL too): its
//! depth, and the communicators with calls queued until its end.

use std::cell::RefCell;
use std::sync::Arc;

use super::result::NcclError;
use super::safe::Shared;

#[derive(Default)]
struct Group {
    depth: usize,
    queued: Vec<Arc<Shared>>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

/// Opens a group (or one more level of it).
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// How deep in groups this thread is (0: in none).
pub fn depth() -> usize {
    GROUP.with(|g| g.borrow().depth)
}

/// Notes that `shared` has calls queued until the group ends.
pub(super) fn touch(shared: &Arc<Shared>) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if !g.queued.iter().any(|s| Arc::ptr_eq(s, shared)) {
            g.queued.push(shared.clone());
        }
    });
}

/// Closes a level; the outermost issues what was queued (every communicator's, the first
/// error returned).
pub fn end() -> Result<(), NcclError> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(NcclError::usage(
                "group_end without a group_start before it on this thread".into(),
            ));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            std::mem::take(&mut g.queued)
        } else {
            Vec::new()
        })
    })?;
    let mut result = Ok(());
    for s in queued {
        if let Err(e) = s.flush_group() {
            result = result.and(Err(e));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::result::ncclResult_t;

    #[test]
    fn groups_nest_per_thread_and_an_unmatched_end_is_invalid_usage() {
        // Each test runs on its own thread: a fresh group state.
        assert_eq!(depth(), 0);
        assert_eq!(end().unwrap_err().0, ncclResult_t::ncclInvalidUsage);
        start();
        start();
        assert_eq!(depth(), 2);
        std::thread::spawn(|| assert_eq!(depth(), 0))
            .join()
            .unwrap();
        end().unwrap();
        assert_eq!(depth(), 1);
        end().unwrap();
        assert_eq!(depth(), 0);
        assert!(end().is_err());
    }

    #[test]
    fn the_public_calls_track_the_same_depth() {
        use crate::nccl::{group_end, group_start, NcclStatus};
        assert_eq!(group_start().unwrap(), NcclStatus::Success);
        assert_eq!(depth(), 1);
        assert_eq!(group_end().unwrap(), NcclStatus::Success);
        let e = group_end().unwrap_err();
        assert!(e.to_string().contains("without a group_start"), "{e}");
    }
}
