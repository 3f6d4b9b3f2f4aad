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

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ucp::{Context, EpId, ReqId, Started, Ucp, Worker};
use super::NetMem;
use crate::transport::ipc::Exchange;
use crate::{Error, Result};

/// The tag of every header (one worker per communicator, so one tag suffices).
const TAG_HEADER: u64 = 0x1 << 60;
/// The tag of a chunk: this kind, the source rank (20 bits) and the low 40 bits of its signal
/// counter, so that each chunk matches the receive posted for it whatever the order in which
/// its header was handled.
const TAG_CHUNK: u64 = 0x2 << 60;
/// Bytes of a message's header.
pub const HEADER_BYTES: usize = 48;

fn chunk_tag(src: usize, k: u64) -> u64 {
    TAG_CHUNK | ((src as u64 & 0xf_ffff) << 40) | (k & 0xff_ffff_ffff)
}
const MAGIC: u32 = 0x5443_4e52;
const KIND_SIGNAL: u32 = 1;
const KIND_BYE: u32 = 2;
/// What a failed proxy adds to every flag word, so that every wait of a stream is satisfied at
/// once (the wait kernel compares `flag >= value`; counters start at 0, so adding 2^62 cannot
/// wrap, and it is far more than any call's signals).
const RELEASE: u64 = 1 << 62;
/// Receives kept posted.
const POSTED_RECVS: usize = 8;
/// Framing of a rank's published worker addresses: magic, rank, nranks, lanes (u32 each,
/// little-endian), then per lane its length (u32) and its bytes.
const ADDRESS_MAGIC: &[u8; 8] = b"RCCLUCX2";
/// Default of [`NetOptions::lanes`].
pub const DEFAULT_LANES: usize = crate::config::DEFAULT_NET_LANES;
/// Most lanes a proxy may have.
pub const MAX_LANES: usize = crate::config::MAX_NET_LANES;

/// The bytes a rank publishes for its lanes' worker `addresses` (see [`ADDRESS_MAGIC`]).
pub(crate) fn frame_addresses(rank: usize, nranks: usize, addresses: &[Vec<u8>]) -> Vec<u8> {
    let mut blob = ADDRESS_MAGIC.to_vec();
    for v in [rank, nranks, addresses.len()] {
        blob.extend_from_slice(&(v as u32).to_le_bytes());
    }
    for a in addresses {
        blob.extend_from_slice(&(a.len() as u32).to_le_bytes());
        blob.extend_from_slice(a);
    }
    blob
}

/// The lanes' worker addresses that rank `q` of `nranks` published, if the blob is framed as
/// [`frame_addresses`] does, for `lanes` lanes, and no address is empty.
fn parse_addresses(b: &[u8], q: usize, nranks: usize, lanes: usize) -> Option<Vec<&[u8]>> {
    let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize);
    let m = ADDRESS_MAGIC.len();
    if b.get(..m)? != ADDRESS_MAGIC || u32_at(m)? != q || u32_at(m + 4)? != nranks {
        return None;
    }
    if u32_at(m + 8)? != lanes {
        return None;
    }
    let mut at = m + 12;
    let mut out = Vec::with_capacity(lanes);
    for _ in 0..lanes {
        let len = u32_at(at)?;
        let a = b.get(at + 4..at.checked_add(4)?.checked_add(len)?)?;
        if a.is_empty() {
            return None;
        }
        out.push(a);
        at += 4 + len;
    }
    (at == b.len()).then_some(out)
}

/// Whose turn it is, per peer, among the lanes: for the next signal that carries a chunk and
/// for the next that does not; and the counter of the last credit dealt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    /// The lane of the next signal with a chunk.
    pub data: usize,
    /// The lane of the next signal without one.
    pub control: usize,
    /// The counter of the last credit (signal without a chunk) dealt to this peer, 0 for none.
    pub last_credit: u64,
}

/// A signal as a lane sends it: with the counter of the previous credit to the same peer, if
/// it is a credit (the receiver raises its credit word through the chain: `NetMem::credit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dealt {
    /// The signal.
    pub o: Outgoing,
    /// For a credit, the counter of the previous credit to the same peer (0 for none); 0
    /// otherwise.
    pub prev_credit: u64,
}

/// Whether a signal is a credit: it carries no bytes.
fn is_credit(o: &Outgoing) -> bool {
    o.data.is_none_or(|c| c.bytes == 0)
}

/// Deals `program` (in posting order) to `lanes` lanes: per peer, the signals that carry a
/// chunk go to the lanes in turn, and so do those that carry none, each from where the
/// previous program left off (`turns`, per peer). Dealing the two kinds separately matters: a
/// pair's signals alternate between a chunk and a credit in the steady state of a transfer
/// both ways, so dealing by counter would put every chunk on the same lanes.
///
/// ```
/// use ringccl::internals::transport::net::proxy::{deal, Chunk, Outgoing, Turn};
/// let c = Some(Chunk { from: 0, to: 0, bytes: 8 });
/// // Rank 1's signals: a chunk, a credit, a chunk, a credit.
/// let program: Vec<Outgoing> = (1..=4)
///     .map(|k| Outgoing { peer: 1, k, data: if k % 2 == 1 { c } else { None } })
///     .collect();
/// let mut turns = vec![Turn::default(); 2];
/// let lanes = deal(program, 2, &mut turns);
/// let ks: Vec<Vec<(u64, u64)>> =
///     lanes.iter().map(|l| l.iter().map(|d| (d.o.k, d.prev_credit)).collect()).collect();
/// // Credits 2 and 4 name the credit before them.
/// assert_eq!(ks, vec![vec![(1, 0), (2, 0)], vec![(3, 0), (4, 2)]]);
/// assert_eq!(turns[1], Turn { data: 0, control: 0, last_credit: 4 });
/// ```
pub fn deal(program: Vec<Outgoing>, lanes: usize, turns: &mut [Turn]) -> Vec<Vec<Dealt>> {
    let lanes = lanes.max(1);
    let mut parts: Vec<Vec<Dealt>> = vec![Vec::new(); lanes];
    for o in program {
        let credit = is_credit(&o);
        let (lane, prev_credit) = match turns.get_mut(o.peer) {
            Some(t) => {
                let next = if credit { &mut t.control } else { &mut t.data };
                let lane = *next % lanes;
                *next = (lane + 1) % lanes;
                let prev = if credit {
                    std::mem::replace(&mut t.last_credit, o.k)
                } else {
                    0
                };
                (lane, prev)
            }
            // An unknown peer: the lane refuses it (`Run::take_programs`).
            None => (0, 0),
        };
        parts[lane].push(Dealt { o, prev_credit });
    }
    parts
}

/// A chunk that a signal carries: `bytes` from this rank's outbox at `from` into the peer's
/// scratch at `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset in this rank's outbox.
    pub from: usize,
    /// Offset in the peer's scratch.
    pub to: usize,
    /// Bytes.
    pub bytes: usize,
}

/// One signal this rank's stream will post to a network peer (its counter reaching `k`), and
/// the chunk it announces, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The receiving rank.
    pub peer: usize,
    /// The pair's counter value once the stream has posted this signal.
    pub k: u64,
    /// The chunk that travels with it.
    pub data: Option<Chunk>,
}

/// Settings of a proxy.
#[derive(Clone, Debug)]
pub struct NetOptions {
    /// Longest a send may stay in flight, and longest the closing handshake may take.
    pub timeout: Duration,
    /// UCX settings applied over the environment (names without `UCX_`), e.g. `TLS=tcp`.
    pub ucx: Vec<(String, String)>,
    /// Lanes: threads, each with its own UCP worker and endpoints, that carry a pair's signals
    /// in turn (1 to [`MAX_LANES`]; every rank must use the same number).
    pub lanes: usize,
    /// Print a line on stderr for each signal the proxy posts, sends, receives and publishes,
    /// with the microseconds since the proxy started (`RINGCCL_DEBUG=trace`).
    pub trace: bool,
}

/// UCX settings ringccl applies unless the environment sets them: TCP segments of 256 KiB
/// instead of UCX's 8 KiB (send) and 64 KiB (receive). Each entry is the environment variable
/// that takes precedence, then the name given to `ucp_config_modify` and the value. The names
/// have no `TCP_` prefix: `ucp_config_modify` hands names it does not know to every transport's
/// own table, where the TCP transport's fields are `TX_SEG_SIZE` and `RX_SEG_SIZE` (no other
/// transport of UCX has fields of these names); with the prefix they are silently ignored
/// (checked with UCX 1.13's debug log: its TCP buffers grow to 256 KiB either way, through the
/// variables or through these names). Measured on one machine over loopback TCP with 2 MiB
/// chunks (`docs/NETWORK.md`): `send_recv` from 1 MiB at 0.73–0.96 GB/s with UCX's defaults,
/// 2.3–3.1 GB/s with these segments.
pub const UCX_DEFAULTS: &[(&str, &str, &str)] = &[
    ("UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "256k"),
    ("UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "256k"),
];

/// [`UCX_DEFAULTS`] whose environment variable is not set, as `(name, value)` for
/// [`NetOptions::ucx`].
///
/// ```
/// use ringccl::internals::transport::net::proxy::{ucx_defaults, UCX_DEFAULTS};
/// let d = ucx_defaults();
/// for (var, name, value) in UCX_DEFAULTS {
///     let applied = d.iter().any(|(n, v)| n == name && v == value);
///     assert_eq!(applied, std::env::var_os(var).is_none());
/// }
/// ```
pub fn ucx_defaults() -> Vec<(String, String)> {
    UCX_DEFAULTS
        .iter()
        .filter(|(var, _, _)| std::env::var_os(var).is_none())
        .map(|&(_, name, value)| (name.to_string(), value.to_string()))
        .collect()
}

impl Default for NetOptions {
    /// A 60 s timeout, [`ucx_defaults`] and [`DEFAULT_LANES`] lanes.
    fn default() -> Self {
        NetOptions {
            timeout: Duration::from_secs(60),
            ucx: ucx_defaults(),
            lanes: DEFAULT_LANES,
            trace: false,
        }
    }
}

/// What the proxy's lanes and its owner share.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    failed: AtomicBool,
    /// Set by the lane that released the flag words (they are released once).
    released: AtomicBool,
    error: Mutex<Option<Error>>,
    /// Per peer: what the lanes have published of its counter, and the signals complete above
    /// it.
    publish: Vec<Mutex<Publish>>,
    /// Per peer: the credits the lanes have received, as a chain (see [`Run::credit`]).
    credits: Vec<Mutex<Credits>>,
    /// When the proxy started, if it traces ([`NetOptions::trace`]).
    trace: Option<Instant>,
}

/// A peer's credits as the lanes receive them: the last one published to the credit word, and
/// those received after it whose previous credit has not yet arrived (previous → counter).
#[derive(Debug, Default)]
struct Credits {
    at: u64,
    pending: std::collections::BTreeMap<u64, u64>,
}

/// A peer's signals as the lanes complete them (see [`Run::complete`]).
#[derive(Debug, Default)]
struct Publish {
    at: u64,
    arrived: BTreeSet<u64>,
}

impl Shared {
    fn new(nranks: usize, trace: bool) -> Shared {
        Shared {
            publish: (0..nranks).map(|_| Mutex::default()).collect(),
            credits: (0..nranks).map(|_| Mutex::default()).collect(),
            trace: trace.then(Instant::now),
            ..Shared::default()
        }
    }

    /// Raises every flag and credit word of `mem` by [`RELEASE`], once, so that every wait of
    /// the stream ends.
    fn release(&self, mem: &NetMem) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        for q in 0..mem.nranks() {
            for w in [mem.flag(q), mem.credit(q)].into_iter().flatten() {
                w.fetch_add(RELEASE, Ordering::AcqRel);
            }
        }
    }

    fn fail(&self, e: Error) {
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert(e);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn error(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        match self.error.lock() {
            Ok(slot) => slot.clone(),
            Err(_) => Some(Error::Internal {
                reason: "the network proxy's error slot is poisoned".into(),
            }),
        }
    }
}

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

/// A message in flight, with the buffer UCX reads from (empty for a chunk sent from the
/// outbox).
struct InFlight {
    req: ReqId,
    peer: usize,
    /// The signal it belongs to, and the chunk's bytes (0 for a header).
    k: u64,
    bytes: usize,
    since: Instant,
    _buf: Vec<u8>,
}

/// A chunk being received into the scratch: from `src`, for signal `k`.
struct Incoming {
    req: ReqId,
    src: usize,
    k: u64,
    bytes: usize,
}

/// Which lane of how many a [`Run`] is.
#[derive(Clone, Copy, Debug)]
struct Lane {
    lane: usize,
    lanes: usize,
}

/// A lane's thread state. `worker` comes first: it is dropped (cancelling and releasing its
/// requests) before the buffers they use.
struct Run {
    worker: Worker,
    rank: usize,
    at: Lane,
    mem: Arc<NetMem>,
    eps: Vec<Option<EpId>>,
    rx: Receiver<Vec<Dealt>>,
    shared: Arc<Shared>,
    timeout: Duration,
    queues: Vec<VecDeque<Dealt>>,
    /// Last counter value this lane sent to each peer.
    sent: Vec<u64>,
    /// Signals from each peer whose header has arrived on this lane and that are not yet
    /// published.
    seen: Vec<BTreeSet<u64>>,
    bye: Vec<bool>,
    sends: Vec<InFlight>,
    /// Header receive buffers and the request each is posted with.
    recvs: Vec<(Vec<u8>, Option<ReqId>)>,
    /// Chunks being received.
    incoming: Vec<Incoming>,
    /// No more programs will come.
    closed: bool,
    bye_sent: bool,
}

impl Run {
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank: usize,
        at: Lane,
        mem: Arc<NetMem>,
        worker: Worker,
        eps: Vec<Option<EpId>>,
        rx: Receiver<Vec<Dealt>>,
        shared: Arc<Shared>,
        timeout: Duration,
    ) -> Run {
        let n = eps.len();
        Run {
            worker,
            rank,
            at,
            mem,
            eps,
            rx,
            shared,
            timeout,
            queues: vec![VecDeque::new(); n],
            sent: vec![0; n],
            seen: vec![BTreeSet::new(); n],
            bye: vec![false; n],
            sends: Vec::new(),
            recvs: (0..POSTED_RECVS).map(|_| (vec![0u8; HEADER_BYTES], None)).collect(),
            incoming: Vec::new(),
            closed: false,
            bye_sent: false,
        }
    }

    fn err(&self, peer: Option<usize>, reason: String) -> Error {
        net(self.rank, peer, reason)
    }

    fn main(&mut self) -> Result<()> {
        for i in 0..self.recvs.len() {
            self.post_recv(i)?;
        }
        let mut idle = 0u32;
        let mut closing: Option<Instant> = None;
        loop {
            let mut busy = self.take_programs()?;
            busy |= self.send_ready()?;
            busy |= self.worker.progress();
            busy |= self.poll_sends()?;
            busy |= self.poll_recvs()?;
            busy |= self.poll_incoming()?;
            self.check_endpoints()?;
            if self.shared.failed.load(Ordering::Acquire) {
                // Another lane failed (and reported it): this one stops too.
                return Ok(());
            }
            if self.closed || self.shared.stop.load(Ordering::Acquire) {
                self.closed = true;
                let start = *closing.get_or_insert_with(Instant::now);
                let drained = self.queues.iter().all(VecDeque::is_empty) && self.sends.is_empty();
                if drained && !self.sent_bye() {
                    self.send_bye()?;
                }
                let everyone = (0..self.eps.len()).all(|q| q == self.rank || self.bye[q]);
                if drained && self.sends.is_empty() && self.incoming.is_empty() && everyone {
                    return Ok(());
                }
                if start.elapsed() > self.timeout {
                    let unsent: usize = self.queues.iter().map(VecDeque::len).sum();
                    let missing: Vec<usize> = (0..self.eps.len())
                        .filter(|&q| q != self.rank && !self.bye[q])
                        .collect();
                    return Err(self.err(
                        None,
                        format!(
                            "closing took over {:?}: {unsent} signal(s) never posted by this \
                             rank's stream, {} send(s) in flight, no goodbye from rank(s) \
                             {missing:?}",
                            self.timeout,
                            self.sends.len()
                        ),
                    ));
                }
            }
            if busy {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle > 2000 {
                    std::thread::sleep(Duration::from_micros(20));
                } else if idle > 100 {
                    std::thread::yield_now();
                }
            }
        }
    }

    fn sent_bye(&self) -> bool {
        self.bye_sent
    }

    fn send_bye(&mut self) -> Result<()> {
        for q in 0..self.eps.len() {
            if q == self.rank {
                continue;
            }
            match self.send(q, header(KIND_BYE, self.rank, (0, 0), 0, 0)) {
                // A peer that said goodbye may be gone already.
                Err(_) if self.bye[q] => {}
                r => r?,
            }
        }
        self.bye_sent = true;
        Ok(())
    }

    fn take_programs(&mut self) -> Result<bool> {
        let mut any = false;
        loop {
            match self.rx.try_recv() {
                Ok(program) => {
                    any = true;
                    for d in program {
                        let q = self.queues.get_mut(d.o.peer).filter(|_| d.o.peer != self.rank);
                        let Some(q) = q else {
                            return Err(Error::Internal {
                                reason: format!("a network signal to rank {}", d.o.peer),
                            });
                        };
                        q.push_back(d);
                    }
                }
                Err(TryRecvError::Empty) => return Ok(any),
                Err(TryRecvError::Disconnected) => {
                    self.closed = true;
                    return Ok(any);
                }
            }
        }
    }

    /// Sends every queued signal whose counter the stream has reached.
    fn send_ready(&mut self) -> Result<bool> {
        let mut any = false;
        let mem = self.mem.clone();
        for q in 0..self.queues.len() {
            let Some(posted) = mem.posted(q) else {
                continue;
            };
            while let Some(&Dealt { o, prev_credit }) = self.queues[q].front() {
                if posted.load(Ordering::Acquire) < o.k {
                    break;
                }
                if o.k <= self.sent[q] {
                    return Err(Error::Internal {
                        reason: format!(
                            "network signal {} to rank {q} after {} on lane {} of {}: out of \
                             order",
                            o.k, self.sent[q], self.at.lane, self.at.lanes
                        ),
                    });
                }
                self.queues[q].pop_front();
                let (to, bytes) = o.data.map_or((0, 0), |c| (c.to, c.bytes));
                self.trace("post", q, o.k, bytes);
                self.send(q, header(KIND_SIGNAL, self.rank, (o.k, prev_credit), to, bytes))?;
                if let Some(c) = o.data.filter(|c| c.bytes > 0) {
                    let src = mem.outbox_range(c.from, c.bytes).ok_or_else(|| Error::Internal {
                        reason: format!("outbox range {}+{} of a network chunk", c.from, c.bytes),
                    })?;
                    // SAFETY: in bounds (checked), inside `mem`, which outlives the worker (an
                    // `Arc` held by this `Run` and by the `Proxy`, which joins this thread
                    // first). The stream wrote these bytes before posting the counter read above
                    // (acquire) and rewrites them only after the peer has consumed the chunk,
                    // that is, after this send has delivered them.
                    let started = unsafe { self.worker.send(self.ep(q)?, src, c.bytes, chunk_tag(self.rank, o.k)) }
                        .map_err(|e| located(e, self.rank, Some(q)))?;
                    self.track(q, (o.k, c.bytes), started, Vec::new());
                }
                self.sent[q] = o.k;
                any = true;
            }
        }
        Ok(any)
    }

    fn ep(&self, q: usize) -> Result<EpId> {
        self.eps
            .get(q)
            .copied()
            .flatten()
            .ok_or_else(|| self.err(Some(q), "no endpoint".into()))
    }

    /// Sends a header.
    fn send(&mut self, q: usize, buf: Vec<u8>) -> Result<()> {
        let ep = self.ep(q)?;
        // SAFETY: `buf` (a heap block that does not move with the `Vec`) lives in `self.sends`
        // until the request completes; `Run` drops `worker` (which cancels and releases its
        // requests) before `sends` (field order).
        let started = unsafe { self.worker.send(ep, buf.as_ptr(), buf.len(), TAG_HEADER) }
            .map_err(|e| located(e, self.rank, Some(q)))?;
        self.track(q, (0, 0), started, buf);
        Ok(())
    }

    /// Keeps a send that is still in flight: to `q`, for signal `k` with a chunk of `bytes`.
    fn track(&mut self, q: usize, (k, bytes): (u64, usize), started: Started, buf: Vec<u8>) {
        match started {
            Started::Pending(req) => self.sends.push(InFlight {
                req,
                peer: q,
                k,
                bytes,
                since: Instant::now(),
                _buf: buf,
            }),
            Started::Done if bytes > 0 => self.trace("sent", q, k, bytes),
            Started::Done => {}
        }
    }

    /// A line of the trace ([`NetOptions::trace`]), if tracing.
    fn trace(&self, what: &str, peer: usize, k: u64, bytes: usize) {
        if let Some(t0) = self.shared.trace {
            eprintln!(
                "ringccl net-trace {:>10.1} us rank {} lane {} {what} peer {peer} k {k} bytes {bytes}",
                t0.elapsed().as_secs_f64() * 1e6,
                self.rank,
                self.at.lane
            );
        }
    }

    fn poll_sends(&mut self) -> Result<bool> {
        let mut any = false;
        let mut i = 0;
        while i < self.sends.len() {
            let (req, peer, since) = (self.sends[i].req, self.sends[i].peer, self.sends[i].since);
            match self.worker.poll(req) {
                Ok(Some(_)) => {
                    let done = self.sends.swap_remove(i);
                    if done.bytes > 0 {
                        self.trace("sent", peer, done.k, done.bytes);
                    }
                    any = true;
                }
                Ok(None) => {
                    if since.elapsed() > self.timeout {
                        return Err(self.err(
                            Some(peer),
                            format!("a send to rank {peer} did not complete in {:?}", self.timeout),
                        ));
                    }
                    i += 1;
                }
                // A peer that said goodbye needs nothing more from this rank and may be gone.
                Err(Error::Network { .. }) if self.bye[peer] => {
                    self.sends.swap_remove(i);
                }
                Err(Error::Network { reason, .. }) => {
                    return Err(self.err(Some(peer), format!("sending to rank {peer}: {reason}")));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(any)
    }

    fn post_recv(&mut self, i: usize) -> Result<()> {
        loop {
            let (ptr, len) = (self.recvs[i].0.as_mut_ptr(), self.recvs[i].0.len());
            // SAFETY: the buffer is owned by `self.recvs[i]`, never resized, and not touched
            // until the request completes; on drop the worker cancels it first.
            let started = unsafe { self.worker.recv(ptr, len, TAG_HEADER, u64::MAX) }
                .map_err(|e| located(e, self.rank, None))?;
            match started {
                Started::Pending(req) => {
                    self.recvs[i].1 = Some(req);
                    return Ok(());
                }
                Started::Done => self.deliver(i)?,
            }
        }
    }

    fn poll_recvs(&mut self) -> Result<bool> {
        let mut any = false;
        for i in 0..self.recvs.len() {
            let Some(req) = self.recvs[i].1 else {
                continue;
            };
            match self.worker.poll(req) {
                Ok(None) => {}
                Ok(Some(_)) => {
                    self.recvs[i].1 = None;
                    self.deliver(i)?;
                    self.post_recv(i)?;
                    any = true;
                }
                Err(e) => {
                    self.recvs[i].1 = None;
                    return Err(located(e, self.rank, None));
                }
            }
        }
        Ok(any)
    }

    /// Handles the message in receive buffer `i`.
    fn deliver(&mut self, i: usize) -> Result<()> {
        let h = Header::parse(&self.recvs[i].0).ok_or_else(|| self.err(None, "a malformed message".into()))?;
        let n = self.eps.len();
        if h.src >= n || h.src == self.rank {
            return Err(self.err(None, format!("a message from rank {} of {n}", h.src)));
        }
        let q = h.src;
        match h.kind {
            KIND_BYE => {
                self.bye[q] = true;
                return Ok(());
            }
            KIND_SIGNAL => {}
            k => return Err(self.err(Some(q), format!("a message of kind {k}"))),
        }
        let published = self.shared.publish[q].lock().map(|p| p.at).unwrap_or(u64::MAX);
        if h.k <= published || !self.seen[q].insert(h.k) {
            return Err(self.err(Some(q), format!("signal {} from rank {q} twice", h.k)));
        }
        self.trace("header", q, h.k, h.bytes);
        if h.bytes == 0 {
            self.credit(q, h.prev_credit, h.k)?;
            return self.complete(q, h.k);
        }
        let dst = self.mem.scratch_range(h.to, h.bytes).ok_or_else(|| {
            self.err(Some(q), format!("a chunk for scratch {}+{}", h.to, h.bytes))
        })?;
        // SAFETY: in bounds (checked), inside `mem`, which outlives the worker (see
        // `send_ready`); this rank's stream reads the slot only after the counter says the chunk
        // is there, and the peer sends a chunk into a slot only after this rank consumed the
        // slot's previous chunk.
        let started = unsafe { self.worker.recv(dst, h.bytes, chunk_tag(q, h.k), u64::MAX) }
            .map_err(|e| located(e, self.rank, Some(q)))?;
        match started {
            Started::Done => self.complete(q, h.k),
            Started::Pending(req) => {
                self.incoming.push(Incoming {
                    req,
                    src: q,
                    k: h.k,
                    bytes: h.bytes,
                });
                Ok(())
            }
        }
    }

    fn poll_incoming(&mut self) -> Result<bool> {
        let mut any = false;
        let mut i = 0;
        while i < self.incoming.len() {
            let Incoming { req, src, k, bytes } = self.incoming[i];
            match self.worker.poll(req) {
                Ok(None) => i += 1,
                Ok(Some(got)) => {
                    self.incoming.swap_remove(i);
                    if got != bytes {
                        return Err(self.err(
                            Some(src),
                            format!("chunk {k} from rank {src}: {got} bytes, not {bytes}"),
                        ));
                    }
                    self.trace("got", src, k, bytes);
                    self.complete(src, k)?;
                    any = true;
                }
                Err(Error::Network { reason, .. }) => {
                    return Err(self.err(Some(src), format!("receiving from rank {src}: {reason}")));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(any)
    }

    /// Signal `k` from `q` is complete: publishes `q`'s counter as far as it is contiguous over
    /// every lane (a later signal, on this lane or another, can complete first).
    fn complete(&mut self, q: usize, k: u64) -> Result<()> {
        let flag = self.mem.flag(q).ok_or_else(|| self.err(Some(q), "no flag word".into()))?;
        let mut p = self.shared.publish[q].lock().map_err(|_| Error::Internal {
            reason: "the network proxy's publication state is poisoned".into(),
        })?;
        let p = &mut *p;
        p.arrived.insert(k);
        let before = p.at;
        while p.arrived.remove(&(p.at + 1)) {
            p.at += 1;
        }
        if p.at > before {
            // `fetch_max`: a failed lane may have raised the word by `RELEASE` meanwhile.
            flag.fetch_max(p.at, Ordering::Release);
        }
        let at = p.at;
        if at > before {
            self.trace("published", q, at, 0);
        }
        self.seen[q] = self.seen[q].split_off(&(at + 1));
        Ok(())
    }

    /// Credit `k` from `q`, whose previous credit was `prev`, has arrived: raises `q`'s credit
    /// word along the chain of credits as far as it is unbroken (credits travel on several
    /// lanes and can arrive out of order). The credit word does not wait for the peer's earlier
    /// chunks, as the flag word does.
    fn credit(&mut self, q: usize, prev: u64, k: u64) -> Result<()> {
        if prev >= k {
            return Err(self.err(Some(q), format!("credit {k} from rank {q} after credit {prev}")));
        }
        let word = self.mem.credit(q).ok_or_else(|| self.err(Some(q), "no credit word".into()))?;
        let mut c = self.shared.credits[q].lock().map_err(|_| Error::Internal {
            reason: "the network proxy's credit state is poisoned".into(),
        })?;
        let c = &mut *c;
        if prev < c.at || c.pending.insert(prev, k).is_some() {
            return Err(self.err(Some(q), format!("credit {k} from rank {q} names credit {prev} twice")));
        }
        let before = c.at;
        while let Some(next) = c.pending.remove(&c.at) {
            c.at = next;
        }
        if c.at > before {
            // `fetch_max`: a failed lane may have raised the word by `RELEASE` meanwhile.
            word.fetch_max(c.at, Ordering::Release);
        }
        Ok(())
    }

    fn check_endpoints(&self) -> Result<()> {
        for (q, ep) in self.eps.iter().enumerate() {
            let Some(ep) = ep else { continue };
            if self.bye[q] {
                continue;
            }
            if let Some(text) = self.worker.ep_error(*ep) {
                return Err(self.err(
                    Some(q),
                    format!("lost the connection to rank {q} ({text}): the peer died or is unreachable"),
                ));
            }
        }
        Ok(())
    }
}

/// A parsed message header.
struct Header {
    kind: u32,
    src: usize,
    k: u64,
    to: usize,
    bytes: usize,
    /// For a credit, the counter of the previous credit from the same rank (0 for none).
    prev_credit: u64,
}

impl Header {
    fn parse(b: &[u8]) -> Option<Header> {
        let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        if u32_at(0)? != MAGIC {
            return None;
        }
        Some(Header {
            kind: u32_at(4)?,
            src: u32_at(8)? as usize,
            k: u64_at(16)?,
            to: usize::try_from(u64_at(24)?).ok()?,
            bytes: usize::try_from(u64_at(32)?).ok()?,
            prev_credit: u64_at(40)?,
        })
    }
}

fn header(kind: u32, src: usize, (k, prev_credit): (u64, u64), to: usize, bytes: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_BYTES + bytes);
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&(src as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&k.to_le_bytes());
    v.extend_from_slice(&(to as u64).to_le_bytes());
    v.extend_from_slice(&(bytes as u64).to_le_bytes());
    v.extend_from_slice(&prev_credit.to_le_bytes());
    v
}

#[cfg(test)]
mod lane_tests {
    use super::*;

    fn signal(peer: usize, k: u64, data: bool) -> Outgoing {
        let chunk = Chunk { from: 0, to: 0, bytes: 256 };
        Outgoing { peer, k, data: data.then_some(chunk) }
    }

    #[test]
    fn chunks_and_credits_are_dealt_to_the_lanes_in_turn_across_programs() {
        // The steady state of a transfer both ways: data, credit, data, credit... to rank 1,
        // and only chunks to rank 2.
        let mut turns = vec![Turn::default(); 3];
        let mut seen = vec![Vec::new(); 3];
        let mut credits: Vec<Dealt> = Vec::new();
        let mut k = [0u64; 3];
        for program in 0..5 {
            let mut p = Vec::new();
            for i in 0..6 {
                k[1] += 1;
                p.push(signal(1, k[1], i % 2 == 0));
                k[2] += 1;
                p.push(signal(2, k[2], true));
            }
            let parts = deal(p, 3, &mut turns);
            for (lane, part) in parts.iter().enumerate() {
                // Each lane's part keeps the posting order per peer.
                for q in [1, 2] {
                    let ks: Vec<u64> = part.iter().filter(|d| d.o.peer == q).map(|d| d.o.k).collect();
                    assert!(ks.windows(2).all(|w| w[0] < w[1]), "program {program} lane {lane}");
                }
                seen[lane].extend(part.iter().map(|d| d.o));
                credits.extend(part.iter().filter(|d| d.o.data.is_none()));
            }
        }
        // Chunks to each peer are spread evenly over the lanes (30 to rank 2, 15 to rank 1),
        // and so are rank 1's credits.
        for (lane, got) in seen.iter().enumerate() {
            let count = |q: usize, data: bool| {
                got.iter().filter(|o| o.peer == q && o.data.is_some() == data).count()
            };
            assert_eq!((count(2, true), count(1, true), count(1, false)), (10, 5, 5), "lane {lane}");
        }
        // Each credit names the one before it (across lanes and programs), the first none.
        credits.sort_by_key(|d| d.o.k);
        let mut prev = 0;
        for d in &credits {
            assert_eq!(d.prev_credit, prev, "credit {}", d.o.k);
            prev = d.o.k;
        }
        assert_eq!(turns[1].last_credit, prev);
        // One lane: everything in order on it.
        let mut one = vec![Turn::default(); 3];
        let parts = deal(vec![signal(1, 1, true), signal(1, 2, false)], 1, &mut one);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].len(), 2);
    }

    #[test]
    fn addresses_round_trip_and_bad_framing_is_refused() {
        let addresses = vec![vec![1u8, 2, 3], vec![4u8; 70]];
        let b = frame_addresses(1, 3, &addresses);
        let got = parse_addresses(&b, 1, 3, 2).expect("framed");
        assert_eq!(got, vec![&addresses[0][..], &addresses[1][..]]);
        assert!(parse_addresses(&b, 0, 3, 2).is_none(), "another rank's");
        assert!(parse_addresses(&b, 1, 4, 2).is_none(), "another world's");
        assert!(parse_addresses(&b, 1, 3, 1).is_none(), "another lane count");
        assert!(parse_addresses(&b[..b.len() - 1], 1, 3, 2).is_none(), "truncated");
        let mut long = b.clone();
        long.push(0);
        assert!(parse_addresses(&long, 1, 3, 2).is_none(), "trailing bytes");
        assert!(parse_addresses(&frame_addresses(1, 3, &[vec![], vec![1]]), 1, 3, 2).is_none());
    }
}

