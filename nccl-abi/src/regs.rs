//! Buffer registrations (`ncclCommRegister`) and windows (`ncclCommWindowRegister`) of one
//! communicator handle.
//!
//! A buffer registration (`ncclCommRegister`, local in NCCL: PyTorch's allocator hook calls it
//! on one rank at a time) is tracked only: it changes nothing in how data moves. A window
//! (`ncclCommWindowRegister`, collective) is a ringccl registration
//! (`ringccl::Communicator::register_raw`): among processes, a one-shot all-reduce whose input
//! lies in it is read in place by the peers. Both are tracked so that the calls behave as
//! NCCL's: the handle
//! is an opaque non-NULL token (never dereferenced), registering the same range again returns
//! the same handle with one more reference (as NCCL's registration cache does; a window,
//! collective, is a new one each time), and a
//! deregistration of a handle this communicator did not hand out, or of one already released,
//! is `ncclInvalidUsage` (NCCL's "Deregister: Could not find handle").

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Fail, Result};

/// Registrations or windows: which table a handle belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `ncclCommRegister`.
    Buffer,
    /// `ncclCommWindowRegister`.
    Window,
}

#[derive(Clone, Copy, Debug)]
struct Reg {
    kind: Kind,
    addr: u64,
    size: usize,
    refs: usize,
    /// The ringccl registration of a window (`None`: none, or a communicator of one process).
    ring: Option<ringccl::RegistrationId>,
}

/// The live registrations of one communicator.
#[derive(Debug, Default)]
pub struct Registrations {
    regs: HashMap<usize, Reg>,
}

/// Handles are distinct process-wide (a handle of one communicator is unknown to another).
static NEXT: AtomicUsize = AtomicUsize::new(1);

impl Registrations {
    /// Registers `[addr, addr + size)`; returns its handle.
    pub fn register(&mut self, kind: Kind, addr: u64, size: usize) -> usize {
        if let Some((&h, r)) = self
            .regs
            .iter_mut()
            .find(|(_, r)| r.kind == kind && r.addr == addr && r.size == size)
        {
            r.refs += 1;
            return h;
        }
        self.insert(kind, addr, size, None)
    }

    /// Records a window over `[addr, addr + size)` with its ringccl registration `ring`: a new
    /// handle each time (window registration is collective: every call is one exchange).
    pub fn register_window(
        &mut self,
        addr: u64,
        size: usize,
        ring: Option<ringccl::RegistrationId>,
    ) -> usize {
        self.insert(Kind::Window, addr, size, ring)
    }

    fn insert(
        &mut self,
        kind: Kind,
        addr: u64,
        size: usize,
        ring: Option<ringccl::RegistrationId>,
    ) -> usize {
        // Tokens look like aligned addresses in a range no allocator hands out to user space.
        let h = 0x5243_0000_0000_0000usize.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) << 4);
        self.regs.insert(
            h,
            Reg {
                kind,
                addr,
                size,
                refs: 1,
                ring,
            },
        );
        h
    }

    /// Releases one reference of `handle`; the ringccl registration to undo when that was the
    /// last.
    pub fn deregister(
        &mut self,
        kind: Kind,
        handle: usize,
    ) -> Result<Option<ringccl::RegistrationId>> {
        let what = match kind {
            Kind::Buffer => "registration handle",
            Kind::Window => "window",
        };
        let Some(r) = self.regs.get_mut(&handle).filter(|r| r.kind == kind) else {
            return Err(Fail::usage(format!(
                "{what} {handle:#x} was not handed out by this communicator, or was \
                 deregistered already"
            )));
        };
        r.refs -= 1;
        if r.refs == 0 {
            return Ok(self.regs.remove(&handle).and_then(|r| r.ring));
        }
        Ok(None)
    }

    /// How many distinct registrations are live.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.regs.len()
    }

    /// Whether none is live.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.regs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_tracked_and_counted() {
        let mut r = Registrations::default();
        let a = r.register(Kind::Buffer, 0x1000, 4096);
        assert_ne!(a, 0);
        let b = r.register(Kind::Buffer, 0x9000, 4096);
        assert_ne!(a, b);
        // The same range again: the same handle, one more reference.
        assert_eq!(r.register(Kind::Buffer, 0x1000, 4096), a);
        assert_eq!(r.len(), 2);
        r.deregister(Kind::Buffer, a).unwrap();
        r.deregister(Kind::Buffer, a).unwrap();
        // Double deregistration.
        let e = r.deregister(Kind::Buffer, a).unwrap_err();
        assert_eq!(e.code, crate::types::NCCL_INVALID_USAGE);
        // A handle of the other kind, or of another table.
        let w = r.register(Kind::Window, 0x9000, 4096);
        assert!(r.deregister(Kind::Buffer, w).is_err());
        // Windows are collective: a new handle each time, each with its ringccl registration.
        let ring = Some(ringccl::RegistrationId(7));
        let w1 = r.register_window(0x9000, 4096, ring);
        let w2 = r.register_window(0x9000, 4096, None);
        assert_ne!(w1, w2);
        assert_eq!(r.deregister(Kind::Window, w1).unwrap(), ring);
        assert_eq!(r.deregister(Kind::Window, w2).unwrap(), None);
        assert!(r.deregister(Kind::Window, w1).is_err());
        assert!(r.deregister(Kind::Window, b).is_err());
        let mut other = Registrations::default();
        assert!(other.deregister(Kind::Buffer, b).is_err());
        r.deregister(Kind::Window, w).unwrap();
        r.deregister(Kind::Buffer, b).unwrap();
        assert!(r.is_empty());
    }
}
