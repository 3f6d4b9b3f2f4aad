//! `ncclComm_t`: the handle a C caller holds, and what stands behind it.
//!
//! A handle is one rank of a [`World`]: a ringccl [`Communicator`] with the ranks this process
//! holds (every rank for `ncclCommInitAll`, one for `ncclCommInitRank`) and the collectives
//! issued on its ranks that are waiting for the others ([`crate::coll`]). Handles are never
//! freed: `ncclCommDestroy` drops the rank's share of the world and marks the handle
//! destroyed, so a communicator used after destroy is an `ncclInvalidUsage`, never a read of
//! freed memory. Every handle ever made is in a registry, so a pointer that is not one is an
//! `ncclInvalidArgument` (about 100 bytes are kept per communicator ever created).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use ringccl::Communicator;

use crate::error::{Fail, Result};
use crate::ncclComm;
use crate::ops::OpTable;
use crate::queue::Queues;
use crate::regs::Registrations;
use crate::types::*;

/// Ranks of one ringccl communicator held by this process.
pub struct World {
    /// The ringccl communicator.
    pub comm: Communicator,
    /// Calls issued on the ranks held here, waiting to be matched across them.
    pub queues: Mutex<Queues>,
}

impl World {
    /// A world over `comm`'s local ranks.
    pub fn new(comm: Communicator) -> Arc<World> {
        let n = comm.local_ranks().len();
        Arc::new(World {
            comm,
            queues: Mutex::new(Queues::new(n)),
        })
    }

    /// The queues, locked.
    pub fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One rank of a world: what a ready handle holds.
#[derive(Clone)]
pub struct Member {
    /// The world.
    pub world: Arc<World>,
    /// The rank in the communicator.
    pub rank: usize,
    /// Its position in the world's local ranks (and queues).
    pub index: usize,
}

/// Where a handle is in its life.
enum State {
    /// A non-blocking (or grouped) initialisation running in its thread.
    Initializing(JoinHandle<Result<Member>>),
    /// Usable.
    Ready(Member),
    /// `ncclCommFinalize` was called: queries and destroy only.
    Finalized(Member),
    /// Initialisation failed.
    Failed(Fail),
    /// `ncclCommDestroy`/`ncclCommAbort` was called.
    Destroyed,
}

/// What `ncclComm_t` points to.
pub struct Handle {
    state: Mutex<State>,
    /// Whether calls wait for initialisation (`config.blocking != 0`).
    pub blocking: bool,
    /// The PreMulSum operators created on this rank's communicator.
    ops: Mutex<OpTable>,
    /// The buffers and windows registered with it.
    regs: Mutex<Registrations>,
}

/// The addresses of every handle ever created.
fn registry() -> MutexGuard<'static, HashSet<usize>> {
    static REGISTRY: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    // A poisoned lock only means a panic elsewhere; the set itself stays consistent.
    REGISTRY
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

impl Handle {
    /// A new handle (registered; never freed), as the opaque pointer C gets.
    fn leak(state: State, blocking: bool) -> *mut ncclComm {
        let h: &'static mut Handle = Box::leak(Box::new(Handle {
            state: Mutex::new(state),
            blocking,
            ops: Mutex::new(OpTable::default()),
            regs: Mutex::new(Registrations::default()),
        }));
        let ptr: *mut Handle = h;
        registry().insert(ptr as usize);
        ptr.cast()
    }

    /// A ready handle for `member`.
    pub fn ready(member: Member) -> *mut ncclComm {
        Self::leak(State::Ready(member), true)
    }

    /// A handle whose initialisation runs in a thread of its own.
    pub fn initializing(init: JoinHandle<Result<Member>>, blocking: bool) -> *mut ncclComm {
        Self::leak(State::Initializing(init), blocking)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The communicator's operator table (`ncclRedOpCreatePreMulSum`), locked.
    pub fn ops(&self) -> MutexGuard<'_, OpTable> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The communicator's registrations, locked.
    pub fn regs(&self) -> MutexGuard<'_, Registrations> {
        self.regs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle behind a C pointer: `ncclInvalidArgument` for NULL or a pointer that is not
    /// a communicator of this library.
    // Safe to call with any pointer: only a registered address is dereferenced.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn from_ptr(comm: *const ncclComm) -> Result<&'static Handle> {
        if comm.is_null() {
            return Err(Fail::arg("comm is NULL"));
        }
        if !registry().contains(&(comm as usize)) {
            return Err(Fail::arg(format!(
                "comm {comm:p} is not a communicator created by this library"
            )));
        }
        // SAFETY: every registered address is a leaked `Box<Handle>` (handed to C as an opaque
        // `ncclComm`): valid for the rest of the process, and only ever shared (`&`).
        Ok(unsafe { &*comm.cast::<Handle>() })
    }

    /// Moves a finished initialisation to `Ready`/`Failed`; with `wait`, waits for it.
    /// Returns whether the handle is still initialising.
    fn settle(state: &mut State, wait: bool) -> bool {
        if let State::Initializing(h) = state {
            if !wait && !h.is_finished() {
                return true;
            }
            let State::Initializing(h) = std::mem::replace(state, State::Destroyed) else {
                return false;
            };
            *state = match h.join() {
                Ok(Ok(m)) => State::Ready(m),
                Ok(Err(f)) => State::Failed(f),
                Err(_) => State::Failed(Fail::new(
                    NCCL_INTERNAL_ERROR,
                    "initialisation panicked (a bug in ringccl; please report it)",
                )),
            };
        }
        false
    }

    /// The rank, for calls that issue work: ready only.
    pub fn member(&self) -> Result<Member> {
        let mut st = self.lock();
        Self::settle(&mut st, self.blocking);
        match &*st {
            State::Ready(m) => Ok(m.clone()),
            // NCCL's `ncclCommEnsureReady`: a non-blocking communicator used before its
            // initialisation returned ncclSuccess is an invalid argument.
            State::Initializing(_) => Err(Fail::arg(
                "the communicator is still initialising (attempt to use it before the previous \
                 operation returned ncclSuccess): poll ncclCommGetAsyncError until it returns \
                 ncclSuccess",
            )),
            State::Finalized(_) => Err(Fail::usage("the communicator was finalized")),
            State::Failed(f) => Err(Fail::new(
                f.code,
                format!("the communicator failed to initialise: {}", f.message),
            )),
            State::Destroyed => Err(Fail::usage("the communicator was destroyed")),
        }
    }

    /// The rank, for queries (also after `ncclCommFinalize`).
    pub fn query(&self) -> Result<Member> {
        let mut st = self.lock();
        Self::settle(&mut st, self.blocking);
        match &*st {
            State::Finalized(m) => Ok(m.clone()),
            _ => {
                drop(st);
                self.member()
            }
        }
    }

    /// `ncclCommGetAsyncError`: `ncclInProgress` while initialising, the failure's code if it
    /// failed, else `ncclSuccess`.
    pub fn async_error(&self) -> Result<ncclResult_t> {
        let mut st = self.lock();
        if Self::settle(&mut st, false) {
            return Ok(NCCL_IN_PROGRESS);
        }
        match &*st {
            State::Ready(m) | State::Finalized(m) => match m.world.comm.async_error() {
                // A failure of the communicator's work (a timeout, a device fault, an abort).
                Some(e) => {
                    crate::error::set_last(&e.to_string());
                    Ok(crate::error::code_of(&e))
                }
                None => Ok(NCCL_SUCCESS),
            },
            State::Failed(f) => {
                crate::error::set_last(&f.message);
                Ok(f.code)
            }
            State::Initializing(_) => Ok(NCCL_IN_PROGRESS),
            State::Destroyed => Err(Fail::usage("the communicator was destroyed")),
        }
    }

    /// Waits for initialisation (a grouped blocking init at `ncclGroupEnd`); its failure.
    pub fn wait_init(&self) -> Result<()> {
        let mut st = self.lock();
        Self::settle(&mut st, true);
        match &*st {
            State::Failed(f) => Err(f.clone()),
            _ => Ok(()),
        }
    }

    /// `ncclCommFinalize`: waits for the communicator's work, then allows only queries and
    /// destroy.
    pub fn finalize(&self) -> Result<()> {
        if matches!(*self.lock(), State::Finalized(_)) {
            // NCCL: "prevent double finalize" → ncclInvalidArgument.
            return Err(Fail::arg("the communicator was finalized already"));
        }
        let m = self.member()?;
        m.world.comm.synchronize().map_err(Fail::from)?;
        *self.lock() = State::Finalized(m);
        Ok(())
    }

    /// `ncclCommAbort`: cancels the communicator's pending and future work on every rank it
    /// holds (`ringccl::Communicator::abort`: device waits released, bounded), then destroys
    /// this rank's share. Aborting a handle destroyed or aborted already succeeds and does
    /// nothing (NCCL would read freed memory there; a watchdog that aborts twice must not fail).
    /// A non-blocking initialisation still running is not waited for: the handle is destroyed
    /// at once and the initialisation's thread left to end on its own (its communicator, if it
    /// ever forms, is freed when the thread ends).
    pub fn abort(&self) -> Result<()> {
        let world = {
            let mut st = self.lock();
            Self::settle(&mut st, self.blocking);
            if matches!(*st, State::Initializing(_)) {
                // Dropping the JoinHandle detaches the thread; its `Member` is dropped with it.
                *st = State::Destroyed;
                return Ok(());
            }
            match &*st {
                State::Ready(m) | State::Finalized(m) => Some(m.world.clone()),
                State::Destroyed => return Ok(()),
                _ => None,
            }
        };
        if let Some(w) = world {
            // Best effort: whatever it reports, the share is destroyed next.
            let _ = w.comm.abort();
        }
        match self.destroy() {
            // Another thread destroyed it meanwhile: aborted either way.
            Err(f) if f.code == NCCL_INVALID_ARGUMENT => Ok(()),
            r => r,
        }
    }

    /// `ncclCommDestroy`/`ncclCommAbort`: drops this rank's share of the world (the last
    /// share frees the communicator, after its last work ends).
    pub fn destroy(&self) -> Result<()> {
        let mut st = self.lock();
        Self::settle(&mut st, true);
        if matches!(*st, State::Destroyed) {
            // NCCL: "comm %p has already been destroyed" → ncclInvalidArgument.
            return Err(Fail::arg("the communicator was already destroyed"));
        }
        let old = std::mem::replace(&mut *st, State::Destroyed);
        drop(st);
        drop(old);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err<T>(r: Result<T>) -> Fail {
        match r {
            Err(f) => f,
            Ok(_) => panic!("expected a failure"),
        }
    }

    /// A handle whose initialisation failed: the states that need no GPU.
    fn failed() -> *mut ncclComm {
        Handle::leak(State::Failed(Fail::new(NCCL_SYSTEM_ERROR, "no peer")), true)
    }

    #[test]
    fn destroy_twice_is_an_invalid_argument_and_abort_after_it_succeeds() {
        let h = Handle::from_ptr(failed()).unwrap();
        assert_eq!(err(h.member()).code, NCCL_SYSTEM_ERROR);
        h.destroy().unwrap();
        assert_eq!(h.destroy().unwrap_err().code, NCCL_INVALID_ARGUMENT);
        assert!(h.abort().is_ok());
        assert!(h.abort().is_ok());
        assert_eq!(err(h.member()).code, NCCL_INVALID_USAGE);
        assert_eq!(h.async_error().unwrap_err().code, NCCL_INVALID_USAGE);
    }

    #[test]
    fn abort_destroys() {
        let h = Handle::from_ptr(failed()).unwrap();
        h.abort().unwrap();
        assert_eq!(h.destroy().unwrap_err().code, NCCL_INVALID_ARGUMENT);
    }

    #[test]
    fn a_failed_initialisation_is_the_async_error() {
        let h = Handle::from_ptr(failed()).unwrap();
        assert_eq!(h.async_error(), Ok(NCCL_SYSTEM_ERROR));
        assert_eq!(h.finalize().unwrap_err().code, NCCL_SYSTEM_ERROR);
    }

    #[test]
    fn a_non_blocking_handle_used_while_initialising_is_an_invalid_argument() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let init = std::thread::spawn(move || -> Result<Member> {
            let _ = rx.recv();
            Err(Fail::usage("stopped"))
        });
        let h = Handle::from_ptr(Handle::initializing(init, false)).unwrap();
        assert_eq!(h.async_error(), Ok(NCCL_IN_PROGRESS));
        let e = err(h.member());
        assert_eq!(e.code, NCCL_INVALID_ARGUMENT);
        assert!(e.message.contains("still initialising"), "{}", e.message);
        tx.send(()).unwrap();
        h.wait_init().unwrap_err();
        assert_eq!(h.async_error(), Ok(NCCL_INVALID_USAGE));
        h.destroy().unwrap();
    }

    #[test]
    fn aborting_a_non_blocking_initialisation_does_not_wait_for_it() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let init = std::thread::spawn(move || -> Result<Member> {
            let _ = rx.recv();
            Err(Fail::usage("stopped"))
        });
        let h = Handle::from_ptr(Handle::initializing(init, false)).unwrap();
        h.abort().unwrap();
        assert_eq!(err(h.member()).code, NCCL_INVALID_USAGE);
        drop(tx);
    }
}
