//! One host thread per GPU for the enqueue of small eager calls.
//!
//! In a communicator that drives several GPUs from one process, a call's host work (stream
//! waits, the kernel launch, event records) is mostly per rank, and the driver runs calls on
//! different contexts from different threads largely in parallel: on 2 × H200, two launches on
//! two GPUs take 6.6 µs of host time from one thread and 3.9 µs from one thread per GPU
//! (`docs/perf/`). [`RankThreads`] keeps a thread for each rank but the first; the caller's
//! thread issues rank 0's part and the threads the others' at the same time
//! ([`RankThreads::run`]).
//!
//! A thread spins for [`SPIN`] after its last piece of work, then sleeps. A call that finds a
//! rank's thread asleep issues that rank's part on the caller's thread (what it would cost
//! without these threads) and wakes the thread for the calls that follow: a burst of calls pays
//! no wake-up latency, and an idle communicator burns no CPU.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How long a rank's thread spins for work after its last piece of work before it sleeps.
pub const SPIN: Duration = Duration::from_micros(500);

/// A piece of work for all ranks: `f(rank)` issues one rank's part.
pub type RankWork<'a> = &'a (dyn Fn(usize) -> Result<()> + Sync);

/// The worker spins, waiting for work.
const SPINNING: u32 = 0;
/// The worker sleeps (or is about to): the caller does the rank's part itself.
const ASLEEP: u32 = 1;
/// The caller is writing work into the slot.
const CLAIMED: u32 = 2;
/// Work is in the slot.
const POSTED: u32 = 3;
/// The worker is done; its result is in the slot.
const DONE: u32 = 4;

/// What a caller and one rank's thread share. `work` and `result` are handed over by `state`:
/// the caller writes `work` between `CLAIMED` and `POSTED` and reads `result` after `DONE`; the
/// worker reads `work` after `POSTED` and writes `result` before `DONE`.
struct Slot {
    state: AtomicU32,
    stop: AtomicBool,
    work: UnsafeCell<Option<(RankWork<'static>, usize)>>,
    result: UnsafeCell<Option<Result<()>>>,
}

// SAFETY: the cells are only accessed by the side that `state` hands them to (see `Slot`), with
// acquire/release on `state` ordering each handover; the work is `Sync`.
unsafe impl Sync for Slot {}
// SAFETY: as above.
unsafe impl Send for Slot {}

struct Worker {
    slot: Arc<Slot>,
    thread: Thread,
    handle: Option<JoinHandle<()>>,
}

/// A thread for each rank of a communicator but the first (see the module docs).
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use ringccl::internals::resources::rank_threads::RankThreads;
/// let threads = RankThreads::new(4)?;
/// let done = AtomicUsize::new(0);
/// let results = threads.run(4, &|r| {
///     done.fetch_add(r, Ordering::Relaxed);
///     Ok(())
/// });
/// assert!(results.iter().all(|r| r.is_ok()));
/// assert_eq!(done.load(Ordering::Relaxed), 0 + 1 + 2 + 3);
/// # Ok::<(), ringccl::Error>(())
/// ```
pub struct RankThreads {
    workers: Vec<Worker>,
}

impl std::fmt::Debug for RankThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankThreads")
            .field("threads", &self.workers.len())
            .finish()
    }
}

impl RankThreads {
    /// Threads for ranks `1..nranks` (none for fewer than two ranks). They start asleep.
    pub fn new(nranks: usize) -> Result<RankThreads> {
        let mut workers = Vec::with_capacity(nranks.saturating_sub(1));
        for rank in 1..nranks {
            let slot = Arc::new(Slot {
                state: AtomicU32::new(ASLEEP),
                stop: AtomicBool::new(false),
                work: UnsafeCell::new(None),
                result: UnsafeCell::new(None),
            });
            let s = slot.clone();
            let handle = std::thread::Builder::new()
                .name(format!("ringccl-rank-{rank}"))
                .spawn(move || serve(&s))
                .map_err(|e| Error::Internal {
                    reason: format!("cannot start the host thread of rank {rank}: {e}"),
                })?;
            workers.push(Worker {
                slot,
                thread: handle.thread().clone(),
                handle: Some(handle),
            });
        }
        Ok(RankThreads { workers })
    }

    /// Runs `work(r)` for every rank `r < nranks`: rank 0 on the caller's thread, each other
    /// rank on its thread if that thread is awake, else on the caller's thread too (in rank
    /// order, after rank 0). Returns each rank's result once all are done. A panic in `work`
    /// on a rank's thread is that rank's [`Error::Internal`].
    pub fn run(&self, nranks: usize, work: RankWork<'_>) -> Vec<Result<()>> {
        let mut handed = vec![false; nranks];
        for (r, w) in self.workers.iter().enumerate().take(nranks.saturating_sub(1)) {
            handed[r + 1] = w.offer(work, r + 1);
        }
        // Waits for the handed-over ranks even if `work` panics on this thread: they borrow
        // `work`, which lives in the caller's frame.
        let collect = Collect {
            threads: self,
            handed: &handed,
        };
        let mut results: Vec<Result<()>> = Vec::with_capacity(nranks);
        for (r, &h) in handed.iter().enumerate() {
            results.push(if h { Ok(()) } else { work(r) });
        }
        for (r, got) in collect.finish() {
            results[r] = got;
        }
        results
    }
}

/// Waits, on drop or in [`Collect::finish`], for the ranks whose work was handed to a thread.
struct Collect<'a> {
    threads: &'a RankThreads,
    handed: &'a [bool],
}

impl Collect<'_> {
    fn finish(self) -> Vec<(usize, Result<()>)> {
        let out = self.wait_all();
        std::mem::forget(self);
        out
    }

    fn wait_all(&self) -> Vec<(usize, Result<()>)> {
        let mut out = Vec::new();
        for (r, &h) in self.handed.iter().enumerate() {
            if h {
                out.push((r, self.threads.workers[r - 1].collect()));
            }
        }
        out
    }
}

impl Drop for Collect<'_> {
    fn drop(&mut self) {
        // Only reached while unwinding from a panic in the caller's part: the threads' parts
        // must end before the work they borrow goes away.
        let _ = self.wait_all();
    }
}

impl Worker {
    /// Hands `work` for `rank` to this thread if it is spinning; wakes it otherwise.
    fn offer(&self, work: RankWork<'_>, rank: usize) -> bool {
        let s = &self.slot;
        if s
            .state
            .compare_exchange(SPINNING, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Asleep: the caller does this rank's part; the thread spins for the next call.
            if s
                .state
                .compare_exchange(ASLEEP, SPINNING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.thread.unpark();
            }
            return false;
        }
        // SAFETY: the lifetime is erased for the handover only. `RankThreads::run` waits for
        // `DONE` before it returns, or unwinds (`Collect`), so the worker's use of `work` ends
        // while `work` is alive.
        let work: RankWork<'static> = unsafe { std::mem::transmute::<RankWork<'_>, RankWork<'static>>(work) };
        // SAFETY: `CLAIMED` gives the caller the slot (see `Slot`).
        unsafe { *s.work.get() = Some((work, rank)) };
        s.state.store(POSTED, Ordering::Release);
        true
    }

    /// Waits for the work handed over to end and returns its result.
    fn collect(&self) -> Result<()> {
        let s = &self.slot;
        while s.state.load(Ordering::Acquire) != DONE {
            std::hint::spin_loop();
        }
        // SAFETY: `DONE` gives the caller the slot (see `Slot`).
        let result = unsafe { (*s.result.get()).take() };
        s.state.store(SPINNING, Ordering::Release);
        result.unwrap_or_else(|| {
            Err(Error::Internal {
                reason: "a rank's host thread ended its work without a result".into(),
            })
        })
    }
}

/// The loop of a rank's thread.
fn serve(s: &Slot) {
    let mut since = Instant::now();
    loop {
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        match s.state.load(Ordering::Acquire) {
            POSTED => {
                // SAFETY: `POSTED` gives the worker the slot (see `Slot`).
                let work = unsafe { (*s.work.get()).take() };
                let result = match work {
                    Some((work, rank)) => catch_unwind(AssertUnwindSafe(|| work(rank))).unwrap_or_else(|_| {
                        Err(Error::Internal {
                            reason: format!("rank {rank}'s enqueue panicked on its host thread"),
                        })
                    }),
                    None => Err(Error::Internal {
                        reason: "a rank's host thread was handed no work".into(),
                    }),
                };
                // SAFETY: still the worker's until `DONE` below.
                unsafe { *s.result.get() = Some(result) };
                s.state.store(DONE, Ordering::Release);
                since = Instant::now();
            }
            SPINNING if since.elapsed() > SPIN => {
                if s
                    .state
                    .compare_exchange(SPINNING, ASLEEP, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    // Until a caller sets `SPINNING` again (and unparks), or the drop.
                    while s.state.load(Ordering::Acquire) == ASLEEP && !s.stop.load(Ordering::Acquire) {
                        std::thread::park_timeout(Duration::from_millis(100));
                    }
                    since = Instant::now();
                }
            }
            _ => std::hint::spin_loop(),
        }
    }
}

impl Drop for RankThreads {
    fn drop(&mut self) {
        for w in &self.workers {
            w.slot.stop.store(true, Ordering::Release);
            w.thread.unpark();
        }
        for w in &mut self.workers {
            if let Some(h) = w.handle.take() {
                // A panic cannot come out of `serve` (the work is run under `catch_unwind`).
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    #[test]
    fn every_rank_runs_once_on_some_thread_and_results_keep_their_rank() {
        let threads = RankThreads::new(4).expect("threads");
        for round in 0..2000 {
            let seen = Mutex::new(Vec::new());
            let results = threads.run(4, &|r| {
                seen.lock().expect("lock").push((r, std::thread::current().id()));
                if (round + r) % 7 == 0 {
                    Err(Error::Internal { reason: format!("rank {r}") })
                } else {
                    Ok(())
                }
            });
            let mut ranks: Vec<usize> = seen.lock().expect("lock").iter().map(|p| p.0).collect();
            ranks.sort_unstable();
            assert_eq!(ranks, vec![0, 1, 2, 3], "round {round}");
            for (r, res) in results.iter().enumerate() {
                match res {
                    Err(Error::Internal { reason }) => {
                        assert_eq!((round + r) % 7, 0);
                        assert_eq!(reason, &format!("rank {r}"));
                    }
                    Ok(()) => assert_ne!((round + r) % 7, 0),
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }

    #[test]
    fn awake_threads_take_their_ranks_and_asleep_ones_are_woken() {
        let threads = RankThreads::new(2).expect("threads");
        let me = std::thread::current().id();
        // The first call finds the thread asleep: rank 1 runs here and the thread is woken.
        let first = Mutex::new(None);
        threads.run(2, &|r| {
            if r == 1 {
                *first.lock().expect("lock") = Some(std::thread::current().id());
            }
            Ok(())
        });
        assert_eq!(*first.lock().expect("lock"), Some(me));
        // Calls in quick succession reach the awake thread (allow for a slow start).
        let elsewhere = AtomicUsize::new(0);
        for _ in 0..200 {
            threads.run(2, &|r| {
                if r == 1 && std::thread::current().id() != me {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            });
        }
        assert!(elsewhere.load(Ordering::Relaxed) > 0, "rank 1 never ran on its thread");
        // After the spin time the thread sleeps again, and the next call runs rank 1 here.
        std::thread::sleep(SPIN * 20);
        let again = Mutex::new(None);
        threads.run(2, &|r| {
            if r == 1 {
                *again.lock().expect("lock") = Some(std::thread::current().id());
            }
            Ok(())
        });
        assert_eq!(*again.lock().expect("lock"), Some(me));
    }

    #[test]
    fn a_panic_on_a_rank_thread_is_that_ranks_error() {
        let threads = RankThreads::new(2).expect("threads");
        let mut saw_error = false;
        for _ in 0..500 {
            let results = threads.run(2, &|r| {
                if r == 1 && std::thread::current().name() == Some("ringccl-rank-1") {
                    panic!("injected");
                }
                Ok(())
            });
            assert!(results[0].is_ok());
            if let Err(e) = &results[1] {
                assert!(e.to_string().contains("panicked"), "{e}");
                saw_error = true;
            }
        }
        assert!(saw_error, "rank 1 never ran on its thread");
        // The thread survives and keeps serving.
        let results = threads.run(2, &|_| Ok(()));
        assert!(results.iter().all(Result::is_ok));
    }

    #[test]
    fn fewer_ranks_than_threads_and_a_single_rank() {
        let threads = RankThreads::new(3).expect("threads");
        let count = AtomicUsize::new(0);
        let results = threads.run(2, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
            Ok(())
        });
        assert_eq!((results.len(), count.load(Ordering::Relaxed)), (2, 2));
        let none = RankThreads::new(1).expect("no threads");
        assert_eq!(none.run(1, &|_| Ok(())).len(), 1);
    }
}
