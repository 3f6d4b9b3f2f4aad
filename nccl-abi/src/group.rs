//! `ncclGroupStart`/`ncclGroupEnd`'s state: per thread, as in NCCL.
//!
//! Inside a group, calls are only queued, tagged with the group's number; this module keeps
//! what the group touched (worlds, blocking initialisations) and its first failure. Issuing at
//! the outermost `ncclGroupEnd` is [`crate::coll::group_end`]'s: this module depends on
//! `comm` only, never on `coll`.
//!
//! As in NCCL (`ncclGroupErrCheck`, `src/group.cc`), a call that fails inside a group returns
//! its error at once and also marks the group failed: the outermost `ncclGroupEnd` then issues
//! nothing of the group and returns that first error.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::comm::{Handle, World};
use crate::error::{Fail, Result};
use crate::types::{NCCL_IN_PROGRESS, NCCL_SUCCESS};

#[derive(Default)]
struct Group {
    depth: usize,
    /// The number of the open outermost group (0 when none is open).
    tag: u64,
    worlds: Vec<Arc<World>>,
    inits: Vec<&'static Handle>,
    error: Option<Fail>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// What the outermost `ncclGroupEnd` has to finish.
pub struct Done {
    /// The group's number: the tag of the calls it queued.
    pub tag: u64,
    /// The worlds the group queued calls on.
    pub worlds: Vec<Arc<World>>,
    /// The blocking initialisations started in the group.
    pub inits: Vec<&'static Handle>,
    /// The first failure of a call inside the group.
    pub error: Option<Fail>,
}

/// The group nesting depth of this thread (0: not in a group).
pub fn depth() -> usize {
    GROUP.with(|g| g.borrow().depth)
}

/// Notes that the current group (if any) queues a call on `world`; returns the tag the call
/// is queued with (0 outside a group).
pub fn touched(world: &Arc<World>) -> u64 {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return 0;
        }
        if !g.worlds.iter().any(|w| Arc::ptr_eq(w, world)) {
            g.worlds.push(world.clone());
        }
        g.tag
    })
}

/// Notes a blocking initialisation started inside the current group.
pub fn init_started(h: &'static Handle) {
    GROUP.with(|g| g.borrow_mut().inits.push(h))
}

/// Marks the current group (if any) failed with `f`, unless it failed already or `f` is
/// `ncclInProgress` (a state, not a failure). Returns `f`, to be returned by the call too.
pub fn note_error(f: Fail) -> Fail {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() && f.code != NCCL_SUCCESS && f.code != NCCL_IN_PROGRESS
        {
            g.error = Some(f.clone());
        }
    });
    f
}

/// `ncclGroupStart`.
pub fn start() {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            g.tag = NEXT.fetch_add(1, Ordering::Relaxed);
        }
        g.depth += 1;
    })
}

/// `ncclGroupEnd`'s bookkeeping: `None` for an inner end, the group's state for the outermost
/// (the thread is then out of any group); an end without a start is `ncclInvalidUsage`.
pub fn end() -> Result<Option<Done>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Fail::usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        let tag = std::mem::take(&mut g.tag);
        Ok(Some(Done {
            tag,
            worlds: std::mem::take(&mut g.worlds),
            inits: std::mem::take(&mut g.inits),
            error: g.error.take(),
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_inside_a_group_is_kept_until_its_end() {
        start();
        start();
        let _ = note_error(Fail::new(NCCL_IN_PROGRESS, "init"));
        let _ = note_error(Fail::arg("first"));
        let _ = note_error(Fail::usage("second"));
        assert!(end().unwrap().is_none());
        let done = end().unwrap().unwrap();
        assert_eq!(done.error.unwrap().message, "first");
        assert!(done.tag > 0);
        assert_eq!(depth(), 0);
        // Outside a group nothing is kept.
        let _ = note_error(Fail::arg("outside"));
        start();
        assert!(end().unwrap().unwrap().error.is_none());
        assert!(end().is_err());
    }
}
