//! A lane's thread: its UCP worker's sends and receives, the publication of the peers'
//! signals into the rank's memory, and what the lanes and the proxy's owner share (the stop
//! and failure words, the per-peer counters, the release of every wait when a lane fails).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::super::ucp::{EpId, ReqId, Started, Worker};
use super::super::NetMem;
use super::wire::{chunk_tag, header, Header, HEADER_BYTES, KIND_BYE, KIND_SIGNAL, TAG_HEADER};
use super::{located, net, Dealt};
use crate::{Error, Result};

/// What a failed proxy adds to every flag word, so that every wait of a stream is satisfied at
/// once (the wait kernel compares `flag >= value`; counters start at 0, so adding 2^62 cannot
/// wrap, and it is far more than any call's signals).
const RELEASE: u64 = 1 << 62;
/// Receives kept posted.
const POSTED_RECVS: usize = 8;

/// What the proxy's lanes and its owner share.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) stop: AtomicBool,
    pub(super) failed: AtomicBool,
    /// Initialised by whoever releases the flag words (they are released once); a second caller
    /// waits until the first has raised every word, so that no caller returns an error while a
    /// stream may still wait.
    released: OnceLock<()>,
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
    pub(super) fn new(nranks: usize, trace: bool) -> Shared {
        Shared {
            publish: (0..nranks).map(|_| Mutex::default()).collect(),
            credits: (0..nranks).map(|_| Mutex::default()).collect(),
            trace: trace.then(Instant::now),
            ..Shared::default()
        }
    }

    /// Raises every flag and credit word of `mem` by [`RELEASE`], once, so that every wait of
    /// the stream ends. Returns once the words are raised, whichever thread raised them.
    pub(super) fn release(&self, mem: &NetMem) {
        self.released.get_or_init(|| {
            for q in 0..mem.nranks() {
                for w in [mem.flag(q), mem.credit(q)].into_iter().flatten() {
                    w.fetch_add(RELEASE, Ordering::AcqRel);
                }
            }
        });
    }

    pub(super) fn fail(&self, e: Error) {
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert(e);
        }
        self.failed.store(true, Ordering::Release);
    }

    pub(super) fn error(&self) -> Option<Error> {
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
pub(super) struct Lane {
    pub(super) lane: usize,
    pub(super) lanes: usize,
}

/// A lane's thread state. `worker` comes first: it is dropped (cancelling and releasing its
/// requests) before the buffers they use.
pub(super) struct Run {
    worker: Worker,
    rank: usize,
    at: Lane,
    pub(super) mem: Arc<NetMem>,
    eps: Vec<Option<EpId>>,
    rx: Receiver<Vec<Dealt>>,
    pub(super) shared: Arc<Shared>,
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
    pub(super) fn new(
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

    pub(super) fn main(&mut self) -> Result<()> {
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


#[cfg(test)]
mod tests {
    use super::*;

    /// Two threads fail the proxy at once: whichever returns second from `release` finds every
    /// word raised, not only the first thread's claim to raise them.
    #[test]
    fn a_second_release_returns_after_every_word_is_raised() {
        let nranks = 1 << 14;
        for round in 0..20 {
            let mem = NetMem::new(nranks, 8).expect("memory");
            let shared = Shared::new(nranks, false);
            let start = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        start.wait();
                        shared.release(&mem);
                        for q in 0..nranks {
                            for w in [mem.flag(q), mem.credit(q)] {
                                let v = w.expect("a word").load(Ordering::Acquire);
                                assert_eq!(v, RELEASE, "round {round}: rank {q}'s word at {v}");
                            }
                        }
                    });
                }
            });
        }
    }
}
