//! The rendezvous service (the root): collects every rank's hello, checks it, and answers every
//! rank with the table of all ranks' addresses, or with the reason the world cannot form. One
//! detached thread per [`UniqueId`](super::UniqueId); every socket is non-blocking and polled,
//! so no client can stall it.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{
    self, fail, fail_frame, parse_header, put_addr, write_all_by, Deadline, Hello, HEADER_LEN,
    KIND_HELLO, KIND_TABLE, MAX_RANKS,
};
use crate::error::BootstrapFailure;
use crate::Result;

/// How often the service looks at its sockets.
const POLL: Duration = Duration::from_millis(2);
/// How long the service waits for a first rank.
const IDLE_LIMIT: Duration = Duration::from_secs(600);
/// How long a connection may take to send its hello.
const HELLO_LIMIT: Duration = Duration::from_secs(2);
/// Most connections whose hello is still incomplete.
const MAX_PENDING: usize = 256;
/// Longest body of a hello.
const MAX_HELLO: usize = 256;
/// Most time one reply (a table or a failure) may take to write.
const REPLY_LIMIT: Duration = Duration::from_secs(1);
/// Rejected connections remembered for the timeout's message.
const MAX_NOTES: usize = 8;

/// Starts the service for `key` on `listener` in a detached thread.
pub(super) fn spawn(listener: TcpListener, key: u64) -> Result<()> {
    let net = |what: &str, e: std::io::Error| {
        fail(None, BootstrapFailure::Network, format!("{what}: {e}"))
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| net("cannot set up the rendezvous listener", e))?;
    let now = Instant::now();
    let service = Service {
        listener,
        key,
        world: None,
        pending: Vec::new(),
        waiting: BTreeMap::new(),
        notes: Vec::new(),
        failed: None,
        latest: now,
        end: now + IDLE_LIMIT,
    };
    thread::Builder::new()
        .name("ringccl-rendezvous".into())
        .spawn(move || service.run())
        .map(drop)
        .map_err(|e| net("cannot start the rendezvous thread", e))
}

/// A connection whose hello is incomplete.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    buf: Vec<u8>,
    since: Instant,
}

/// A rank whose hello was accepted, waiting for the table.
struct Waiting {
    stream: TcpStream,
    from: SocketAddr,
    listen: SocketAddr,
    /// When the service gives up on the world for this rank's sake (a little before `hard`,
    /// so that the rank hears why).
    soft: Instant,
}

struct Service {
    listener: TcpListener,
    key: u64,
    /// The world's rank count and the rank whose hello set it.
    world: Option<(usize, usize)>,
    pending: Vec<Pending>,
    waiting: BTreeMap<usize, Waiting>,
    /// Connections rejected before the world failed (for the timeout's message).
    notes: Vec<String>,
    /// Why the world cannot form; late ranks get the same answer.
    failed: Option<(BootstrapFailure, String)>,
    /// The latest time a rank said it would still wait.
    latest: Instant,
    /// When the service stops (once no rank waits).
    end: Instant,
}

impl Service {
    fn run(mut self) {
        loop {
            self.accept();
            self.read_pending();
            self.check_waiting();
            if self.complete() {
                return;
            }
            let now = Instant::now();
            if let Some(soft) = self.waiting.values().map(|w| w.soft).min() {
                if now >= soft {
                    self.fail_world(BootstrapFailure::Timeout, self.missing(), None);
                }
            }
            if self.waiting.is_empty() && now >= self.end {
                return;
            }
            thread::sleep(POLL);
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    if self.pending.len() >= MAX_PENDING || stream.set_nonblocking(true).is_err()
                    {
                        continue; // dropped: closes the connection
                    }
                    self.pending.push(Pending {
                        stream,
                        from,
                        buf: Vec::new(),
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // WouldBlock: nothing more; anything else (out of descriptors): next round.
                Err(_) => return,
            }
        }
    }

    fn read_pending(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let mut chunk = [0u8; 512];
            let closed = match p.stream.read(&mut chunk) {
                Ok(0) => true,
                Ok(n) => {
                    p.buf.extend_from_slice(&chunk[..n]);
                    false
                }
                Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
            };
            match self.parse(i) {
                Parsed::Incomplete if closed || now.duration_since(self.pending[i].since) > HELLO_LIMIT => {
                    let p = self.pending.swap_remove(i);
                    self.note(format!("{} connected but sent no complete hello", p.from));
                }
                Parsed::Incomplete => i += 1,
                Parsed::Bad(failure, detail) => {
                    let p = self.pending.swap_remove(i);
                    reply(&p.stream, failure, &format!("the rendezvous rejected this hello: {detail}"));
                    self.note(format!("{}: {detail}", p.from));
                }
                Parsed::Hello(hello) => {
                    let p = self.pending.swap_remove(i);
                    self.hello(p.stream, p.from, hello);
                }
            }
        }
    }

    /// What the bytes of pending connection `i` hold so far.
    fn parse(&self, i: usize) -> Parsed {
        let buf = &self.pending[i].buf;
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
            return Parsed::Incomplete;
        };
        let header = match parse_header(head, MAX_HELLO) {
            Ok(h) => h,
            Err((failure, detail)) => return Parsed::Bad(failure, detail),
        };
        if header.kind != KIND_HELLO {
            return Parsed::Bad(
                BootstrapFailure::Protocol,
                format!("a frame of kind {} where a hello was expected", header.kind),
            );
        }
        let Some(body) = buf.get(HEADER_LEN..HEADER_LEN + header.len) else {
            return Parsed::Incomplete;
        };
        match Hello::decode(body) {
            Some(h) => Parsed::Hello(h),
            None => Parsed::Bad(BootstrapFailure::Protocol, "a malformed hello".into()),
        }
    }

    fn hello(&mut self, stream: TcpStream, from: SocketAddr, h: Hello) {
        let (n, r) = (h.nranks as usize, h.rank as usize);
        if h.key != self.key {
            let detail = format!(
                "the hello from {from} (rank {r} of {n}) carries another key: it belongs to another world or job"
            );
            reply(&stream, BootstrapFailure::WrongKey, &detail);
            self.note(detail);
            return;
        }
        let now = Instant::now();
        let left = Duration::from_millis(u64::from(h.left_ms));
        self.latest = self.latest.max(now + left);
        if let Some((failure, detail)) = &self.failed {
            reply(&stream, *failure, detail);
            self.end = self.end.max(self.latest);
            return;
        }
        if n == 0 || n > MAX_RANKS {
            let detail = format!("the hello from {from} claims {n} ranks (1..={MAX_RANKS})");
            reply(&stream, BootstrapFailure::Protocol, &detail);
            self.note(detail);
            return;
        }
        if let Some((world, setter)) = self.world {
            if world != n {
                let detail = format!(
                    "rank {r} (from {from}) joined a world of {n} ranks, rank {setter} one of {world}"
                );
                return self.fail_world(BootstrapFailure::NranksMismatch, detail, Some(stream));
            }
        }
        if r >= n {
            let detail = format!("rank {r} (from {from}) is outside 0..{n}");
            return self.fail_world(BootstrapFailure::RankOutOfRange, detail, Some(stream));
        }
        if let Some(w) = self.waiting.get(&r) {
            let detail = format!("rank {r} joined twice: from {} and from {from}", w.from);
            return self.fail_world(BootstrapFailure::DuplicateRank, detail, Some(stream));
        }
        self.world.get_or_insert((n, r));
        let margin = (left / 5).min(Duration::from_millis(200));
        self.waiting.insert(
            r,
            Waiting {
                stream,
                from,
                listen: h.listen,
                soft: now + (left - margin),
            },
        );
    }

    /// Fails the world when a waiting rank's connection closed.
    fn check_waiting(&mut self) {
        let lost = self.waiting.iter().find_map(|(&r, w)| {
            let mut byte = [0u8; 1];
            match w.stream.peek(&mut byte) {
                Ok(0) => Some((r, w.from)),
                Ok(_) => None,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    None
                }
                Err(_) => Some((r, w.from)),
            }
        });
        if let Some((r, from)) = lost {
            self.waiting.remove(&r);
            let detail = format!(
                "rank {r} (from {from}) closed its connection to the rendezvous before every rank joined: its process exited or failed"
            );
            self.fail_world(BootstrapFailure::PeerLost, detail, None);
        }
    }

    /// Sends the table to every rank once all have joined; true when done.
    fn complete(&mut self) -> bool {
        let Some((n, _)) = self.world else {
            return false;
        };
        if self.failed.is_some() || self.waiting.len() != n {
            return false;
        }
        let mut body = Vec::with_capacity(4 + n * wire::ADDR_LEN);
        body.extend_from_slice(&(n as u32).to_be_bytes());
        for w in self.waiting.values() {
            put_addr(&mut body, &w.listen);
        }
        let table = wire::frame(KIND_TABLE, &body);
        for w in self.waiting.values() {
            // A rank that cannot be told fails on its own; the others then lose it as a peer.
            let _ = w.stream.set_nonblocking(false);
            let _ = write_all_by(&w.stream, &table, Deadline::after(REPLY_LIMIT));
        }
        true
    }

    /// Tells every waiting rank (and `extra`) why the world cannot form; answers later ranks
    /// the same until the last one has given up.
    fn fail_world(&mut self, failure: BootstrapFailure, detail: String, extra: Option<TcpStream>) {
        let detail = if failure == BootstrapFailure::Timeout && !self.notes.is_empty() {
            format!("{detail} (rejected meanwhile: {})", self.notes.join("; "))
        } else {
            detail
        };
        for w in self.waiting.values() {
            reply(&w.stream, failure, &detail);
        }
        if let Some(s) = extra {
            reply(&s, failure, &detail);
        }
        self.waiting.clear();
        self.end = self.latest.max(Instant::now());
        self.failed = Some((failure, detail));
    }

    /// Which ranks are missing, for a timeout.
    fn missing(&self) -> String {
        let Some((n, _)) = self.world else {
            return "no rank joined".into();
        };
        let missing: Vec<String> = (0..n)
            .filter(|r| !self.waiting.contains_key(r))
            .take(16)
            .map(|r| r.to_string())
            .collect();
        let more = if n - self.waiting.len() > missing.len() { ", …" } else { "" };
        format!(
            "{} of {n} ranks joined the rendezvous in time; missing rank(s) {}{more}",
            self.waiting.len(),
            missing.join(", ")
        )
    }

    fn note(&mut self, s: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(s);
        }
    }
}

enum Parsed {
    Incomplete,
    Bad(BootstrapFailure, String),
    Hello(Hello),
}

/// Best-effort failure report to one connection.
fn reply(stream: &TcpStream, failure: BootstrapFailure, detail: &str) {
    let _ = stream.set_nonblocking(false);
    let _ = write_all_by(stream, &fail_frame(failure, detail), Deadline::after(REPLY_LIMIT));
}
