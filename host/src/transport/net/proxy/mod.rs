//! The network proxy: threads of a rank that carry the rank's signals (and the chunks they
//! announce) to its network peers over UCP workers, and publish the peers' signals into the
//! rank's memory. See the parent module for the protocol.
//!
//! A proxy has one or more **lanes** ([`NetOptions::lanes`]): each is a thread with its own UCP
//! worker and its own endpoint to the same lane of every peer. The sender deals a pair's
//! signals to its lanes in turn, those with a chunk and those without separately
//! ([`deal`]), so consecutive chunks move through different workers, threads and connections
//! at once; a signal may arrive on any lane of the receiver, whose lanes publish the peer's
//! counter together, strictly in counter order. Over TCP a worker's thread does the system
//! calls that copy every byte, and one thread per rank that both sends and receives was the
//! limit (`docs/NETWORK.md`).
//!
//! The parts: the wire format (`wire`: tags, headers, the published worker addresses), the
//! dealing of signals to lanes ([`deal`]), the settings ([`NetOptions`], [`UCX_DEFAULTS`]), and
//! a lane's thread (`runtime`); this file starts, feeds, waits on and closes them ([`Proxy`]).

mod lanes;
mod options;
mod runtime;
mod wire;

use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ucp::{Context, Ucp, Worker};
use super::NetMem;
use crate::transport::ipc::Exchange;
use crate::{Error, Result};
pub use lanes::{deal, Chunk, Dealt, Outgoing, Turn};
// Public for ringccl's own tests and tools (`internals`); unused by the library itself.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use options::{ucx_defaults, NetOptions, DEFAULT_LANES, MAX_LANES, UCX_DEFAULTS};
use runtime::{Lane, Run, Shared};
pub(crate) use wire::frame_addresses;
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use wire::HEADER_BYTES;
use wire::parse_addresses;

/// A rank's network proxy: one thread per lane, each with a UCP worker connected to the same
/// lane of every other rank.
///
/// ```no_run
/// use std::sync::Arc;
/// use ringccl::internals::transport::net::{NetMem, proxy::{NetOptions, Proxy}};
/// # fn run(exchange: &dyn ringccl::internals::transport::ipc::Exchange) -> Result<(), ringccl::Error> {
/// // Rank 0 of 2, 1 MiB of scratch; `exchange` is the communicator's bootstrap.
/// let mem = Arc::new(NetMem::new(2, 1 << 20)?);
/// let proxy = Proxy::start(0, 2, mem, exchange, NetOptions::default())?;
/// proxy.close()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Proxy {
    rank: usize,
    mem: Arc<NetMem>,
    /// Per lane: where its part of each program goes (`None` once closed).
    tx: Vec<Option<Sender<Vec<Dealt>>>>,
    /// Per peer: which lanes the next signals go to ([`deal`]).
    turns: Mutex<Vec<Turn>>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

fn net(rank: usize, peer: Option<usize>, reason: String) -> Error {
    Error::Network {
        rank: Some(rank),
        peer,
        reason,
    }
}

/// Adds rank and peer to an error of the UCP binding.
fn located(e: Error, rank: usize, peer: Option<usize>) -> Error {
    match e {
        Error::Network { reason, .. } => net(rank, peer, reason),
        e => e,
    }
}

impl Proxy {
    /// Creates rank `rank`'s worker, exchanges worker addresses with every rank through
    /// `exchange` (collective), connects to every other rank and starts the proxy thread.
    pub fn start(
        rank: usize,
        nranks: usize,
        mem: Arc<NetMem>,
        exchange: &dyn Exchange,
        opts: NetOptions,
    ) -> Result<Proxy> {
        if rank >= nranks || mem.nranks() != nranks {
            return Err(Error::Internal {
                reason: format!(
                    "a network proxy for rank {rank} of {nranks} over memory for {} ranks",
                    mem.nranks()
                ),
            });
        }
        let lanes = opts.lanes;
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(Error::Config {
                variable: "RINGCCL_NET_LANES".into(),
                value: lanes.to_string(),
                reason: format!("give 1 to {MAX_LANES} lanes"),
            });
        }
        // Every rank takes part in the exchange, even one whose UCX failed (it sends no
        // address), so that the others learn of the failure instead of waiting.
        let local = Ucp::load().and_then(|ucp| {
            let overrides: Vec<(&str, &str)> =
                opts.ucx.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            let ctx = Context::new(ucp, &overrides)?;
            let mut workers = Vec::with_capacity(lanes);
            let mut addresses = Vec::with_capacity(lanes);
            for _ in 0..lanes {
                let worker = Worker::new(&ctx)?;
                addresses.push(worker.address()?);
                workers.push(worker);
            }
            Ok((workers, addresses))
        });
        let blob = match &local {
            Ok((_, addresses)) => frame_addresses(rank, nranks, addresses),
            Err(_) => frame_addresses(rank, nranks, &[]),
        };
        let all = exchange.all_gather(&blob)?;
        let (workers, _) = local.map_err(|e| located(e, rank, None))?;
        if all.len() != nranks {
            return Err(net(rank, None, format!("{} addresses for {nranks} ranks", all.len())));
        }
        let mut peers = Vec::with_capacity(nranks);
        for (q, b) in all.iter().enumerate() {
            let Some(addresses) = parse_addresses(b, q, nranks, lanes) else {
                return Err(net(
                    rank,
                    Some(q),
                    format!(
                        "rank {q} published no usable UCX worker addresses for {lanes} lane(s) \
                         ({} bytes): its UCX failed to start, it uses another number of lanes \
                         (RINGCCL_NET_LANES must be the same on every rank), or it is not a \
                         ringccl rank of this world",
                        b.len()
                    ),
                ));
            };
            peers.push(addresses);
        }
        let shared = Arc::new(Shared::new(nranks, opts.trace));
        let mut txs = Vec::with_capacity(lanes);
        let mut threads = Vec::with_capacity(lanes);
        for (lane, mut worker) in workers.into_iter().enumerate() {
            let mut eps = Vec::with_capacity(nranks);
            for (q, addresses) in peers.iter().enumerate() {
                if q == rank {
                    eps.push(None);
                    continue;
                }
                // SAFETY: the bytes are what rank `q`'s `Worker::address` returned for this lane
                // (checked framing from the communicator's own bootstrap).
                let ep = unsafe { worker.connect(addresses[lane]) }
                    .map_err(|e| located(e, rank, Some(q)))?;
                eps.push(Some(ep));
            }
            let (tx, rx) = channel();
            let at = Lane { lane, lanes };
            let mut run = Run::new(rank, at, mem.clone(), worker, eps, rx, shared.clone(), opts.timeout);
            let thread = std::thread::Builder::new()
                .name(format!("ringccl-net-{rank}.{lane}"))
                .spawn(move || {
                    let shared = run.shared.clone();
                    if let Err(e) = run.main() {
                        shared.fail(e);
                        // Release every stream waiting on a peer (a GPU stream cannot be
                        // interrupted otherwise); the failure is reported to the host instead.
                        shared.release(&run.mem);
                    }
                    // The worker (and its endpoints) are released here, in this thread.
                    drop(run);
                });
            match thread {
                Ok(t) => {
                    txs.push(Some(tx));
                    threads.push(t);
                }
                Err(e) => {
                    // The lanes already started stop (their peers see the error).
                    shared.fail(net(rank, None, format!("cannot start a proxy thread: {e}")));
                    shared.stop.store(true, Ordering::Release);
                    drop(txs);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(net(rank, None, format!("cannot start a proxy thread: {e}")));
                }
            }
        }
        Ok(Proxy {
            rank,
            mem,
            tx: txs,
            turns: Mutex::new(vec![Turn::default(); nranks]),
            shared,
            threads,
        })
    }

    /// The memory this proxy serves.
    pub fn mem(&self) -> &Arc<NetMem> {
        &self.mem
    }

    /// Hands the proxy the signals the stream will post next, in the order it posts them per
    /// peer (counters consecutive per peer). Call before the stream can post them.
    pub fn post(&self, program: Vec<Outgoing>) -> Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        let parts = {
            let mut turns = self.turns.lock().map_err(|_| Error::Internal {
                reason: "the network proxy's lane turns are poisoned".into(),
            })?;
            deal(program, self.tx.len(), &mut turns)
        };
        for (tx, part) in self.tx.iter().zip(parts) {
            if part.is_empty() {
                continue;
            }
            let tx = tx.as_ref().ok_or_else(|| net(self.rank, None, "the proxy is closed".into()))?;
            tx.send(part).map_err(|_| match self.error() {
                Some(e) => e,
                None => net(self.rank, None, "a proxy thread has ended".into()),
            })?;
        }
        Ok(())
    }

    /// The proxy's failure, if it failed (it stops at its first failure). Once a failure is
    /// reported, every flag and credit word is released (the failing lane records the failure
    /// before it releases them, so a caller could otherwise see the one before the other).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn error(&self) -> Option<Error> {
        let e = self.shared.error()?;
        self.shared.release(&self.mem);
        Some(e)
    }

    /// Waits until `peer`'s counter in this rank's memory reaches `k`, for at most `timeout`:
    /// the host-side wait of a rank whose "stream" is host code. Errors at once if the proxy
    /// failed.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn wait(&self, peer: usize, k: u64, credit: bool, timeout: Duration) -> Result<()> {
        let word = if credit { self.mem.credit(peer) } else { self.mem.flag(peer) };
        let word = word
            .ok_or_else(|| net(self.rank, Some(peer), "no such peer".into()))?;
        let start = Instant::now();
        let mut spins = 0u32;
        while word.load(Ordering::Acquire) < k {
            if let Some(e) = self.error() {
                return Err(e);
            }
            if start.elapsed() > timeout {
                return Err(net(
                    self.rank,
                    Some(peer),
                    format!(
                        "waited {timeout:?} for signal {k} from rank {peer} (at {})",
                        word.load(Ordering::Acquire)
                    ),
                ));
            }
            spins += 1;
            if spins > 1000 {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
        // A failed proxy releases the waits (flags raised by `RELEASE`): that is its error.
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stops the proxy after it has sent every signal posted so far and every rank has said
    /// goodbye (collective: every rank closes), within the timeout; returns the proxy's failure,
    /// if any.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn close(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        self.shared.stop.store(true, Ordering::Release);
        self.tx.iter_mut().for_each(|tx| *tx = None);
        let mut panicked = false;
        for t in self.threads.drain(..) {
            panicked |= t.join().is_err();
        }
        if panicked {
            return Err(Error::Internal {
                reason: "a network proxy thread panicked".into(),
            });
        }
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Errors here are the proxy's own failure, already reported to callers of `wait`/`post`.
        let _ = self.finish();
    }
}

