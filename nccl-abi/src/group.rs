//! `ncclGroupStart`/`ncclGroupEnd`: per thread, as in NCCL.
//!
//! Inside a group, calls are only queued; `ncclGroupEnd` issues every complete set of each
//! world the group touched (and the matched sends and receives), and waits for communicators
//! whose blocking initialisation the group started.

use std::cell::RefCell;
use std::sync::Arc;

use crate::comm::{Handle, World};
use crate::error::{Fail, Result};

#[derive(Default)]
struct Group {
    depth: usize,
    worlds: Vec<Arc<World>>,
    inits: Vec<&'static Handle>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// The group nesting depth of this thread (0: not in a group).
pub fn depth() -> usize {
    GROUP.with(|g| g.borrow().depth)
}

/// Notes that the current group (if any) queued calls on `world`.
pub fn touched(world: &Arc<World>) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && !g.worlds.iter().any(|w| Arc::ptr_eq(w, world)) {
            g.worlds.push(world.clone());
        }
    })
}

/// Notes a blocking initialisation started inside the current group.
pub fn init_started(h: &'static Handle) {
    GROUP.with(|g| g.borrow_mut().inits.push(h))
}

/// `ncclGroupStart`.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1)
}

/// `ncclGroupEnd`: at the outermost level, waits for the group's initialisations and issues
/// its calls; the first failure is returned.
pub fn end() -> Result<()> {
    let (worlds, inits) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Fail::usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        Ok((std::mem::take(&mut g.worlds), std::mem::take(&mut g.inits)))
    })?;
    let mut first = Ok(());
    for h in inits {
        let r = h.wait_init();
        if first.is_ok() {
            first = r;
        }
    }
    for w in worlds {
        let r = crate::coll::flush(&w);
        if first.is_ok() {
            first = r;
        }
    }
    first
}
