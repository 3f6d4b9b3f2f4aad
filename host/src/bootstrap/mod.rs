//! The host-side bootstrap of ranks that live in several processes (one process per GPU, the
//! way `torchrun` or `mpirun` start jobs): a rendezvous over TCP, then a TCP connection between
//! every pair of ranks, over which the ranks exchange small blobs (buffer handles, addresses)
//! when a communicator is created. Pure Rust and `std` sockets; no GPU is touched.
//!
//! * [`UniqueId`]: 128 bytes naming one world's rendezvous service (its address and a random
//!   key), like `ncclUniqueId`. [`UniqueId::new`] starts the service in a background thread.
//! * [`Bootstrap::join`](crate::bootstrap::Bootstrap::join): every rank (thread or process) joins with the same id; the result
//!   offers [`Bootstrap::all_gather`](crate::bootstrap::Bootstrap::all_gather), [`Bootstrap::barrier`](crate::bootstrap::Bootstrap::barrier), [`Bootstrap::send`](crate::bootstrap::Bootstrap::send) and
//!   [`Bootstrap::recv`](crate::bootstrap::Bootstrap::recv).
//! * [`LaunchEnv`](crate::bootstrap::LaunchEnv): the launcher conventions (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `MASTER_ADDR`, `MASTER_PORT`, `RINGCCL_COMM_ID`), from which every process computes the
//!   same id without exchanging it. The `ringccl-run` binary starts such processes.
//!
//! Every failure is an [`Error::Bootstrap`] with a
//! [`BootstrapFailure`]; every socket read, write and connect has a deadline, so nothing
//! waits longer than the timeout given to [`Bootstrap::join`](crate::bootstrap::Bootstrap::join).
//!
//! # Protocol (version 1)
//!
//! Integers are big-endian. Every message on every connection is a frame:
//!
//! | bytes | field |
//! | --- | --- |
//! | 8 | magic `RCCLBOOT` (anything else is rejected as [`BootstrapFailure::Protocol`]) |
//! | 2 | protocol version (another is [`BootstrapFailure::WrongVersion`]) |
//! | 1 | kind: 1 hello, 2 table, 3 failure, 4 peer hello, 5 data |
//! | 4 | body length (at most 64 KiB + 23 B per rank for control frames, [`MAX_DATA`](crate::bootstrap::MAX_DATA) + 1 for data) |
//!
//! An address is 23 bytes: family (4 or 6), port (u16), IP (16 bytes, IPv4 in the first 4),
//! IPv6 scope (u32). The bodies:
//!
//! * **hello** (rank → root): key (u64), nranks (u32), rank (u32), milliseconds the rank
//!   still waits (u32), the address it listens on for its peers.
//! * **table** (root → every rank, once all have joined): nranks (u32), then every rank's
//!   address in rank order.
//! * **failure** (root → rank): a [`BootstrapFailure`] code (u8), then a UTF-8 message.
//! * **peer hello** (rank → lower rank, once per connection): key (u64), nranks (u32), rank
//!   (u32).
//! * **data** (rank → rank): an operation tag (u8: 1 all-gather, 2 barrier, 3 send, 4 the
//!   exchange of a shrink (a split's exchange is an all-gather), 5 goodbye: the rank ends
//!   normally, see `Bootstrap::goodbye`), then the bytes. A tag other than the one expected is [`BootstrapFailure::Protocol`]: the ranks
//!   called different operations.
//!
//! # The rendezvous
//!
//! 1. Each rank listens on an ephemeral port (all interfaces), connects to the root (retrying
//!    while it is not up yet) and sends its hello, naming as its address the local IP of that
//!    connection.
//! 2. The root checks each hello. A wrong magic, version or key is answered with a failure and
//!    dropped (a stray client or another job's rank does not disturb the world). A hello that
//!    makes the world impossible (another rank count, a rank outside `0..nranks`, a rank that
//!    joined twice) fails the world: every waiting rank and the offender get the same failure,
//!    and so do ranks that arrive later, until they would have given up. A waiting rank whose
//!    connection closes fails the world with [`BootstrapFailure::PeerLost`]; when the first
//!    waiting rank's time is nearly up, the world fails with [`BootstrapFailure::Timeout`],
//!    naming the missing ranks.
//! 3. Once all `nranks` hellos are in, the root sends every rank the table and its service
//!    ends.
//! 4. The ranks build a full mesh: each connects to every lower rank (sending a peer hello) and
//!    accepts every higher one. A full mesh is one socket per peer in each rank: simple, and
//!    fine up to a few hundred ranks ([`MAX_RANKS`](crate::bootstrap::MAX_RANKS) at most, and the process's descriptor
//!    limit must allow `nranks` sockets per rank in it). A refused connection means the peer
//!    is gone ([`BootstrapFailure::PeerLost`]); a peer that never connects is a
//!    [`BootstrapFailure::Timeout`] naming it.
//! 5. A barrier over the mesh ends the join: it returns on every rank, or fails.
//!
//! The key only keeps strays out; it is not authentication.

// Until the communicator joins worlds of processes, only `UniqueId` is used outside the
// module (the rest is public with the `internals` feature, for tests and tools).
#![cfg_attr(not(feature = "internals"), allow(dead_code, unused_imports))]

mod id;
mod join;
mod launch;
mod root;
mod watch;
mod split;
mod wire;

use std::fmt;
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

pub use crate::error::BootstrapFailure;
pub use id::{UniqueId, UNIQUE_ID_BYTES};
pub use launch::{LaunchEnv, RENDEZVOUS_PORT_OFFSET};
pub use watch::{PeerSockets, Watcher};
pub use split::PendingSplit;
pub use wire::{MAX_DATA, MAX_RANKS};

use wire::{fail, frame, io_fail, read_frame, write_all_by, Deadline, KIND_DATA};
use crate::{Arg, Error, Result};

/// Data tag of [`Bootstrap::all_gather`].
const OP_ALL_GATHER: u8 = 1;
/// Data tag of [`Bootstrap::barrier`].
const OP_BARRIER: u8 = 2;
/// Data tag of [`Bootstrap::send`].
const OP_SEND: u8 = 3;
/// Data tag of the exchanges of [`Bootstrap::split`] and [`Bootstrap::shrink`].
const OP_SPLIT: u8 = 4;
/// Data tag of [`Bootstrap::goodbye`].
const OP_GOODBYE: u8 = 5;

fn op_name(op: u8) -> &'static str {
    match op {
        OP_ALL_GATHER => "all_gather",
        OP_BARRIER => "barrier",
        OP_SEND => "send/recv",
        OP_GOODBYE => "goodbye",
        OP_SPLIT => "split/shrink",
        _ => "an unknown operation",
    }
}

/// One rank's membership in a world of ranks joined over TCP: its connections to every other
/// rank, and the few collectives a communicator needs at creation (small blobs, rarely).
///
/// Methods take `&self`; one internal lock serialises them, so a `Bootstrap` can be shared
/// between threads (it is `Send` and `Sync`), but a collective must be called by every rank,
/// in the same order. Each call waits at most [`Bootstrap::timeout`]. After a failed call the
/// connections may hold half a message: every later call returns the same error.
///
/// ```
/// use std::time::Duration;
/// use ringccl::bootstrap::Bootstrap;
/// use ringccl::UniqueId;
///
/// let id = UniqueId::new_at("127.0.0.1:0".parse()?)?;
/// let n = 3;
/// let tables = std::thread::scope(|s| {
///     let joins: Vec<_> = (0..n)
///         .map(|rank| {
///             s.spawn(move || -> ringccl::Result<Vec<Vec<u8>>> {
///                 let b = Bootstrap::join(&id, n, rank, Duration::from_secs(5))?;
///                 b.all_gather(&[rank as u8])
///             })
///         })
///         .collect();
///     joins.into_iter().map(|j| j.join().unwrap()).collect::<Result<Vec<_>, _>>()
/// })?;
/// assert!(tables.iter().all(|t| *t == vec![vec![0], vec![1], vec![2]]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    timeout: Duration,
    /// The world's key (the id's, or for a split world one derived from its parent's): every
    /// peer hello carries it.
    key: u64,
    state: Mutex<State>,
}

struct State {
    /// One connection per peer, `None` at this rank's own index.
    peers: Vec<Option<TcpStream>>,
    /// The error that left the connections unusable.
    broken: Option<Error>,
}

impl Bootstrap {
    /// Joins the world named by `id` as `rank` of `nranks`: a collective over all ranks, which
    /// may be threads of one process or separate processes (on one host or several). Returns
    /// once every rank is connected to every other, or fails within `timeout` with an
    /// [`Error::Bootstrap`] saying why (on every rank the failure concerns). `nranks` must be
    /// 1 to [`MAX_RANKS`] (else [`Error::InvalidArgument`]).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ringccl::bootstrap::Bootstrap;
    ///
    /// // Rank 0 made the id with `UniqueId::new()` and sent its text to every process.
    /// let id: ringccl::UniqueId = std::env::var("MY_JOB_ID")?.parse()?;
    /// let b = Bootstrap::join(&id, 4, 2, Duration::from_secs(60))?;
    /// assert_eq!((b.rank(), b.nranks()), (2, 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join(id: &UniqueId, nranks: usize, rank: usize, timeout: Duration) -> Result<Bootstrap> {
        let deadline = Deadline::after(timeout);
        if nranks == 0 || nranks > MAX_RANKS {
            return Err(Error::InvalidArgument {
                rank: Some(rank),
                arg: Arg::Ranks,
                reason: format!("{nranks} ranks: a world has 1 to {MAX_RANKS}"),
            });
        }
        if rank >= nranks {
            join::report_out_of_range(id, nranks, rank, deadline);
            return Err(fail(
                Some(rank),
                BootstrapFailure::RankOutOfRange,
                format!("rank {rank} is outside 0..{nranks}"),
            ));
        }
        let peers = join::connect_world(id, nranks, rank, deadline)?;
        Bootstrap::connected(rank, nranks, timeout, id.key(), peers, deadline)
    }

    /// A world whose mesh is built: ends with a barrier over it, as every join does.
    fn connected(
        rank: usize,
        nranks: usize,
        timeout: Duration,
        key: u64,
        peers: Vec<Option<TcpStream>>,
        deadline: Deadline,
    ) -> Result<Bootstrap> {
        let b = Bootstrap {
            rank,
            nranks,
            timeout,
            key,
            state: Mutex::new(State {
                peers,
                broken: None,
            }),
        };
        b.exchange(OP_BARRIER, &[], deadline)?;
        Ok(b)
    }

    /// This rank.
    ///
    /// ```
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// let b = ringccl::bootstrap::Bootstrap::join(&id, 1, 0, std::time::Duration::from_secs(5))?;
    /// assert_eq!((b.rank(), b.nranks()), (0, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    ///
    /// ```
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// let b = ringccl::bootstrap::Bootstrap::join(&id, 1, 0, std::time::Duration::from_secs(5))?;
    /// assert_eq!(b.nranks(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The longest one call waits (the join's timeout, unless changed).
    ///
    /// ```
    /// use std::time::Duration;
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// let mut b = ringccl::bootstrap::Bootstrap::join(&id, 1, 0, Duration::from_secs(5))?;
    /// b.set_timeout(Duration::from_secs(30));
    /// assert_eq!(b.timeout(), Duration::from_secs(30));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets [`Bootstrap::timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// let mut b = ringccl::bootstrap::Bootstrap::join(&id, 1, 0, Duration::from_secs(5))?;
    /// b.set_timeout(Duration::from_millis(500));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Every rank's `mine`, in rank order (lengths may differ; at most [`MAX_DATA`] bytes
    /// each). A collective: every rank calls it.
    ///
    /// ```no_run
    /// # fn f(b: &ringccl::bootstrap::Bootstrap) -> ringccl::Result<()> {
    /// let all = b.all_gather(&(b.rank() as u32).to_le_bytes())?;
    /// assert_eq!(all.len(), b.nranks());
    /// # Ok(()) }
    /// ```
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.check_len(mine, Arg::Send)?;
        self.exchange(OP_ALL_GATHER, mine, Deadline::after(self.timeout))
    }

    /// Returns once every rank has called it. A collective: every rank calls it.
    ///
    /// ```no_run
    /// # fn f(b: &ringccl::bootstrap::Bootstrap) -> ringccl::Result<()> {
    /// b.barrier()?;
    /// # Ok(()) }
    /// ```
    pub fn barrier(&self) -> Result<()> {
        self.exchange(OP_BARRIER, &[], Deadline::after(self.timeout))
            .map(drop)
    }

    /// Sends `data` (at most [`MAX_DATA`] bytes) to rank `peer`, which receives it with
    /// [`Bootstrap::recv`]. Returns once the bytes are in the connection's buffers: two ranks
    /// that send each other more than those hold (hundreds of KiB) before receiving stall
    /// until the timeout; use [`Bootstrap::all_gather`] for exchanges.
    ///
    /// ```no_run
    /// # fn f(b: &ringccl::bootstrap::Bootstrap) -> ringccl::Result<()> {
    /// if b.rank() == 0 {
    ///     b.send(1, b"hello")?;
    /// } else if b.rank() == 1 {
    ///     assert_eq!(b.recv(0)?, b"hello");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn send(&self, peer: usize, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.check_len(data, Arg::Send)?;
        let st = self.state()?;
        let deadline = Deadline::after(self.timeout);
        let r = peer_stream(&st.peers, peer).and_then(|s| {
            write_all_by(s, &data_frame(OP_SEND, data), deadline)
                .map_err(|e| io_fail(Some(self.rank), &format!("sending to rank {peer}"), &e))
        });
        self.settle(st, r)
    }

    /// Receives what rank `peer` sent with [`Bootstrap::send`].
    ///
    /// ```no_run
    /// # fn f(b: &ringccl::bootstrap::Bootstrap) -> ringccl::Result<()> {
    /// let bytes = b.recv(0)?;
    /// # Ok(()) }
    /// ```
    pub fn recv(&self, peer: usize) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        let st = self.state()?;
        let deadline = Deadline::after(self.timeout);
        let r = peer_stream(&st.peers, peer)
            .and_then(|s| self.read_data(s, peer, OP_SEND, deadline));
        self.settle(st, r)
    }

    /// Tells every peer that this rank ends normally (a goodbye frame, best effort, at most
    /// 100 ms per peer), before its connections close: a peer's [`PeerSockets`] then does not
    /// take the closing for a lost process. Nothing may be exchanged afterwards.
    ///
    /// ```
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// let b = ringccl::bootstrap::Bootstrap::join(&id, 1, 0, std::time::Duration::from_secs(5))?;
    /// b.goodbye();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn goodbye(&self) {
        let Ok(st) = self.state.lock() else { return };
        let msg = data_frame(OP_GOODBYE, &[]);
        for s in st.peers.iter().flatten() {
            let _ = write_all_by(s, &msg, Deadline::after(Duration::from_millis(100)));
        }
    }

    /// Copies of this rank's connections to its peers, for a watcher (see [`PeerSockets`]):
    /// a connection that closes without a goodbye ([`Bootstrap::goodbye`]) is a peer whose
    /// process is gone.
    ///
    /// ```
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// let b = ringccl::bootstrap::Bootstrap::join(&id, 1, 0, std::time::Duration::from_secs(5))?;
    /// let mut w = b.peer_sockets()?;
    /// assert_eq!((w.poll(), w.watched()), (None, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer_sockets(&self) -> Result<PeerSockets> {
        let st = self.state()?;
        let mut socks = Vec::new();
        for (p, s) in st.peers.iter().enumerate() {
            if let Some(s) = s {
                let c = s
                    .try_clone()
                    .map_err(|e| io_fail(Some(self.rank), "cannot watch the connections", &e))?;
                socks.push((p, c));
            }
        }
        Ok(PeerSockets::new(socks))
    }

    /// The lock, or the error that broke the connections.
    fn state(&self) -> Result<MutexGuard<'_, State>> {
        let st = self.state.lock().map_err(|_| Error::Internal {
            reason: "a bootstrap call panicked while holding its connections".into(),
        })?;
        match &st.broken {
            Some(e) => Err(e.clone()),
            None => Ok(st),
        }
    }

    /// Records a failure as the one that broke the connections.
    fn settle<T>(&self, mut st: MutexGuard<'_, State>, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            st.broken = Some(e.clone());
        }
        r
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks || peer == self.rank {
            return Err(Error::InvalidArgument {
                rank: Some(self.rank),
                arg: Arg::Peer,
                reason: format!(
                    "peer {peer}: another rank in 0..{} is needed (this is rank {})",
                    self.nranks, self.rank
                ),
            });
        }
        Ok(())
    }

    fn check_len(&self, data: &[u8], arg: Arg) -> Result<()> {
        if data.len() > MAX_DATA {
            return Err(Error::InvalidArgument {
                rank: Some(self.rank),
                arg,
                reason: format!("{} bytes: the bootstrap carries at most {MAX_DATA}", data.len()),
            });
        }
        Ok(())
    }

    /// Sends `mine` to every peer and receives every peer's bytes: the writes go in a second
    /// thread, to rank + 1, + 2, … in turn, while this thread reads from rank − 1, − 2, …, so
    /// that at each step the k-th write of rank r meets the k-th read of rank r + k and no
    /// socket buffer can block the exchange.
    fn exchange(&self, op: u8, mine: &[u8], deadline: Deadline) -> Result<Vec<Vec<u8>>> {
        let st = self.state()?;
        let (n, r) = (self.nranks, self.rank);
        if n == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        let msg = data_frame(op, mine);
        let peers = &st.peers;
        let result = thread::scope(|scope| {
            let writer = thread::Builder::new()
                .name("ringccl-bootstrap-send".into())
                .spawn_scoped(scope, || -> Result<()> {
                    for k in 1..n {
                        let p = (r + k) % n;
                        write_all_by(peer_stream(peers, p)?, &msg, deadline).map_err(|e| {
                            io_fail(Some(r), &format!("{}: sending to rank {p}", op_name(op)), &e)
                        })?;
                    }
                    Ok(())
                })
                .map_err(|e| io_fail(Some(r), "cannot start the sending thread", &e))?;
            let mut out = vec![Vec::new(); n];
            let mut read = Ok(());
            for k in 1..n {
                let p = (r + n - k) % n;
                match peer_stream(peers, p).and_then(|s| self.read_data(s, p, op, deadline)) {
                    Ok(v) => out[p] = v,
                    Err(e) => {
                        read = Err(e);
                        break;
                    }
                }
            }
            let wrote = writer.join().unwrap_or_else(|_| {
                Err(Error::Internal {
                    reason: "the bootstrap's sending thread panicked".into(),
                })
            });
            read.and(wrote)?;
            out[r] = mine.to_vec();
            Ok(out)
        });
        self.settle(st, result)
    }

    /// Reads one data frame of operation `op` from rank `p`.
    fn read_data(&self, s: &TcpStream, p: usize, op: u8, deadline: Deadline) -> Result<Vec<u8>> {
        let me = Some(self.rank);
        let from = format!("rank {p} ({})", op_name(op));
        let (kind, mut body) = read_frame(s, MAX_DATA + 1, deadline, me, &from)?;
        let tag = body.first().copied();
        if kind != KIND_DATA || tag != Some(op) {
            let theirs = match (kind, tag) {
                (KIND_DATA, Some(t)) => op_name(t),
                _ => "a frame that is not data",
            };
            return Err(fail(
                me,
                BootstrapFailure::Protocol,
                format!(
                    "rank {p} sent {theirs} while this rank is in {}: every rank must make the same bootstrap calls in the same order",
                    op_name(op)
                ),
            ));
        }
        body.drain(..1);
        Ok(body)
    }
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A data frame: the operation's tag, then the bytes.
fn data_frame(op: u8, data: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 + data.len());
    body.push(op);
    body.extend_from_slice(data);
    frame(KIND_DATA, &body)
}

/// The connection to rank `p`.
fn peer_stream(peers: &[Option<TcpStream>], p: usize) -> Result<&TcpStream> {
    peers.get(p).and_then(Option::as_ref).ok_or_else(|| Error::Internal {
        reason: format!("the bootstrap holds no connection to rank {p}"),
    })
}

#[cfg(test)]
mod tests;
