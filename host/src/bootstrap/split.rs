//! Child worlds of a joined world, made without a new id or rendezvous (what `ncclCommSplit`
//! and `ncclCommShrink` do with NCCL's `bootstrapSplit`).
//!
//! * **Split**: every rank of the parent calls [`Bootstrap::split`] with a color (or none) and
//!   a key. One all-gather over the parent carries each rank's color, key, a random nonce and,
//!   for a rank with a color, the address of a listener it opened for the child world. The
//!   ranks of one color, ordered by key then parent rank, are the child world; they connect as
//!   a full mesh (the join's mesh: peer hellos with the child's key), then meet at a barrier.
//! * **Shrink**: only the ranks that stay call [`Bootstrap::shrink`] with the same list of
//!   excluded ranks (as in NCCL, an excluded rank does not call it, and may be dead): they
//!   exchange their addresses with each other over the parent's connections, never touching
//!   an excluded rank's, then build the child mesh the same way. The child's ranks are the
//!   parent's in order.
//!
//! The child's key is a hash of the parent's key, the color (or the member list) and every
//! member's nonce: each split has a key of its own, so a connection meant for another split
//! or another world is refused by the mesh. Every step has a deadline
//! ([`Bootstrap::timeout`] of the parent); a member that leaves is a bounded
//! [`BootstrapFailure::PeerLost`] or [`BootstrapFailure::Timeout`] naming it.
//!
//! A split is two steps, [`Bootstrap::split_exchange`] (over the parent, so every rank makes
//! it in the parent's call order) and [`PendingSplit::connect`] (new connections only, so it
//! may run in another thread while the parent goes on).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::Duration;

use super::id::random_key;
use super::join;
use super::wire::{fail, fnv1a, io_fail, put_addr, write_all_by, Deadline, Reader, ADDR_LEN};
use super::{data_frame, peer_stream, Bootstrap, OP_SPLIT};
use crate::error::BootstrapFailure;
use crate::{Arg, Error, Result};

/// A split whose exchange over the parent is done: this rank's place in the child world, and
/// the listener the other members connect to. [`PendingSplit::connect`] builds the world.
///
/// ```
/// use std::time::Duration;
/// use ringccl::bootstrap::Bootstrap;
///
/// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
/// let parent = Bootstrap::join(&id, 1, 0, Duration::from_secs(5))?;
/// let pending = parent.split_exchange(Some(7), 0)?.expect("a color was given");
/// assert_eq!((pending.rank(), pending.members()), (0, &[0][..]));
/// let child = pending.connect()?;
/// assert_eq!(child.nranks(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PendingSplit {
    /// This rank in the parent.
    parent_rank: usize,
    /// This rank in the child.
    rank: usize,
    /// The parent ranks of the child's ranks, in child rank order.
    members: Vec<usize>,
    /// The members' listeners, in child rank order.
    table: Vec<SocketAddr>,
    listener: TcpListener,
    key: u64,
    timeout: Duration,
}

impl PendingSplit {
    /// This rank in the child world.
    ///
    /// ```no_run
    /// # fn f(p: &ringccl::bootstrap::PendingSplit) {
    /// assert!(p.rank() < p.members().len());
    /// # }
    /// ```
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The parent ranks of the child's ranks, in child rank order (ordered by key, then by
    /// parent rank).
    ///
    /// ```no_run
    /// # fn f(p: &ringccl::bootstrap::PendingSplit) {
    /// let parent_rank_of_child_rank_0 = p.members()[0];
    /// # }
    /// ```
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// Connects this rank to the other members (a full mesh, then a barrier). Every member
    /// calls it; it waits at most the parent's timeout, and fails with an
    /// [`Error::Bootstrap`] naming the member that did not come.
    ///
    /// ```no_run
    /// # fn f(parent: &ringccl::bootstrap::Bootstrap) -> ringccl::Result<()> {
    /// if let Some(pending) = parent.split_exchange(Some((parent.rank() % 2) as i32), 0)? {
    ///     let child = pending.connect()?;
    ///     child.barrier()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn connect(self) -> Result<Bootstrap> {
        let deadline = Deadline::after(self.timeout);
        let n = self.members.len();
        let members = self.members.clone();
        let parent_rank = self.parent_rank;
        let name = |e: Error| match e {
            Error::Bootstrap {
                failure, detail, ..
            } => Error::Bootstrap {
                rank: Some(parent_rank),
                failure,
                detail: format!(
                    "{detail} (in the world split from the parent: its ranks 0..{n} are the \
                     parent's ranks {members:?}; this is parent rank {parent_rank})"
                ),
            },
            other => other,
        };
        let peers = join::mesh(self.listener, &self.table, self.key, self.rank, deadline)
            .map_err(&name)?;
        Bootstrap::connected(self.rank, n, self.timeout, self.key, peers, deadline).map_err(name)
    }
}

/// A listener for a child world, of the family this rank reaches its peers with, and the
/// address to advertise.
fn child_listener(me: usize, local: Option<IpAddr>) -> Result<(TcpListener, SocketAddr)> {
    let ip = local.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let any: SocketAddr = match ip {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let listener = TcpListener::bind(any).map_err(|e| {
        io_fail(Some(me), &format!("cannot listen on {any} for a split world"), &e)
    })?;
    let port = listener
        .local_addr()
        .map_err(|e| io_fail(Some(me), "cannot read the split listener's address", &e))?
        .port();
    Ok((listener, SocketAddr::new(ip, port)))
}

/// One rank's entry of a split's all-gather.
struct Entry {
    color: Option<i32>,
    key: i32,
    nonce: u64,
    addr: Option<SocketAddr>,
}

impl Entry {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(17 + ADDR_LEN);
        b.push(u8::from(self.color.is_some()));
        b.extend_from_slice(&self.color.unwrap_or(0).to_be_bytes());
        b.extend_from_slice(&self.key.to_be_bytes());
        b.extend_from_slice(&self.nonce.to_be_bytes());
        if let Some(a) = &self.addr {
            put_addr(&mut b, a);
        }
        b
    }

    fn decode(body: &[u8]) -> Option<Entry> {
        let mut r = Reader(body);
        let [flag] = r.bytes::<1>()?;
        let color = i32::from_be_bytes(r.bytes()?);
        let key = i32::from_be_bytes(r.bytes()?);
        let nonce = r.u64()?;
        let (color, addr) = match flag {
            0 => (None, None),
            1 => (Some(color), Some(r.addr()?)),
            _ => return None,
        };
        r.rest().is_empty().then_some(Entry {
            color,
            key,
            nonce,
            addr,
        })
    }
}

/// The child's key: the parent's, what names the child, and every member's nonce.
fn child_key(parent: u64, what: &[u8], nonces: &[u64]) -> u64 {
    let nonces: Vec<u8> = nonces.iter().flat_map(|n| n.to_be_bytes()).collect();
    fnv1a(&[b"ringccl-split", &parent.to_be_bytes(), what, &nonces])
}

impl Bootstrap {
    /// The local IP of this rank's connections to its peers (`None` alone in the world).
    fn local_ip(&self) -> Result<Option<IpAddr>> {
        let st = self.state()?;
        Ok(st
            .peers
            .iter()
            .flatten()
            .find_map(|s| s.local_addr().ok())
            .map(|a| a.ip()))
    }

    /// Splits the world, like `ncclCommSplit`: a collective over every rank of this world.
    /// The ranks that pass the same `color` form a new world, their ranks ordered by `key`,
    /// then by rank in this one; a rank that passes `None` (NCCL's `NCCL_SPLIT_NOCOLOR`) takes
    /// part in the exchange and gets `Ok(None)`. No id or rendezvous is needed: the exchange
    /// runs over this world's connections. This world stays usable. The child's timeout is
    /// this world's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringccl::bootstrap::Bootstrap;
    ///
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// let sizes = std::thread::scope(|s| {
    ///     let joins: Vec<_> = (0..4)
    ///         .map(|rank| {
    ///             s.spawn(move || -> ringccl::Result<Option<(usize, usize)>> {
    ///                 let b = Bootstrap::join(&id, 4, rank, Duration::from_secs(5))?;
    ///                 // Even and odd ranks; rank 3 takes no part in a child.
    ///                 let color = (rank != 3).then_some((rank % 2) as i32);
    ///                 let child = b.split(color, 0)?;
    ///                 Ok(child.map(|c| (c.rank(), c.nranks())))
    ///             })
    ///         })
    ///         .collect();
    ///     joins.into_iter().map(|j| j.join().unwrap()).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(sizes, [Some((0, 2)), Some((0, 1)), Some((1, 2)), None]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn split(&self, color: Option<i32>, key: i32) -> Result<Option<Bootstrap>> {
        self.split_exchange(color, key)?
            .map(PendingSplit::connect)
            .transpose()
    }

    /// The first step of [`Bootstrap::split`]: the exchange over this world (a collective
    /// over every rank). `None` for a rank without a color.
    ///
    /// ```no_run
    /// # fn f(b: &ringccl::bootstrap::Bootstrap) -> ringccl::Result<()> {
    /// let pending = b.split_exchange(Some(0), b.rank() as i32)?;
    /// // …other work on `b`…
    /// let child = pending.map(|p| p.connect()).transpose()?;
    /// # Ok(()) }
    /// ```
    pub fn split_exchange(&self, color: Option<i32>, key: i32) -> Result<Option<PendingSplit>> {
        let me = self.rank;
        let local = self.local_ip()?;
        let listening = match color {
            Some(_) => Some(child_listener(me, local)?),
            None => None,
        };
        let mine = Entry {
            color,
            key,
            nonce: random_key(),
            addr: listening.as_ref().map(|(_, a)| *a),
        };
        let all = self.all_gather(&mine.encode())?;
        let mut entries = Vec::with_capacity(all.len());
        for (p, body) in all.iter().enumerate() {
            let e = Entry::decode(body).ok_or_else(|| {
                fail(
                    Some(me),
                    BootstrapFailure::Protocol,
                    format!(
                        "rank {p} answered the split's exchange with {} bytes that are not a \
                         split entry: every rank must call split at the same point",
                        body.len()
                    ),
                )
            })?;
            entries.push(e);
        }
        let (Some(color), Some((listener, _))) = (color, listening) else {
            return Ok(None);
        };
        let mut members: Vec<usize> = (0..entries.len())
            .filter(|&p| entries[p].color == Some(color))
            .collect();
        // Stable: equal keys keep the parent's order, as NCCL's insertion does.
        members.sort_by_key(|&p| entries[p].key);
        let rank = members.iter().position(|&p| p == me).ok_or_else(|| Error::Internal {
            reason: "a split rank is missing from its own color".into(),
        })?;
        let table = members
            .iter()
            .map(|&p| entries[p].addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))))
            .collect();
        let nonces: Vec<u64> = members.iter().map(|&p| entries[p].nonce).collect();
        Ok(Some(PendingSplit {
            parent_rank: me,
            rank,
            key: child_key(self.key, &color.to_be_bytes(), &nonces),
            members,
            table,
            listener,
            timeout: self.timeout,
        }))
    }

    /// Shrinks the world, like `ncclCommShrink`: the ranks not in `exclude` form a new world,
    /// in this world's rank order. Only those ranks call it, each with the same list (its
    /// order and repeats do not matter); an excluded rank is never contacted, so it may be
    /// gone. Errors: [`Error::InvalidArgument`] for an empty list, a rank out of range, this
    /// rank in the list, or nothing left; [`Error::Bootstrap`] when a staying rank does not
    /// come or passed another list.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringccl::bootstrap::Bootstrap;
    ///
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// let ranks = std::thread::scope(|s| {
    ///     let joins: Vec<_> = (0..3)
    ///         .map(|rank| {
    ///             s.spawn(move || -> ringccl::Result<Option<usize>> {
    ///                 let b = Bootstrap::join(&id, 3, rank, Duration::from_secs(5))?;
    ///                 if rank == 1 {
    ///                     return Ok(None); // excluded: does not call shrink
    ///                 }
    ///                 Ok(Some(b.shrink(&[1])?.rank()))
    ///             })
    ///         })
    ///         .collect();
    ///     joins.into_iter().map(|j| j.join().unwrap()).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(ranks, [Some(0), None, Some(1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shrink(&self, exclude: &[usize]) -> Result<Bootstrap> {
        self.shrink_exchange(exclude)?.connect()
    }

    /// The first step of [`Bootstrap::shrink`]: the exchange among the staying ranks over
    /// this world's connections.
    ///
    /// ```no_run
    /// # fn f(b: &ringccl::bootstrap::Bootstrap) -> ringccl::Result<()> {
    /// let child = b.shrink_exchange(&[3])?.connect()?;
    /// # Ok(()) }
    /// ```
    pub fn shrink_exchange(&self, exclude: &[usize]) -> Result<PendingSplit> {
        let me = self.rank;
        let members = shrink_members(me, self.nranks, exclude)?;
        let rank = members.iter().position(|&p| p == me).ok_or_else(|| Error::Internal {
            reason: "a shrinking rank is missing from the members".into(),
        })?;
        let list: Vec<u8> = members.iter().flat_map(|&p| (p as u32).to_be_bytes()).collect();
        let list_hash = fnv1a(&[&list]);
        let (listener, addr) = child_listener(me, self.local_ip()?)?;
        let nonce = random_key();
        let mut body = Vec::with_capacity(16 + ADDR_LEN);
        body.extend_from_slice(&list_hash.to_be_bytes());
        body.extend_from_slice(&nonce.to_be_bytes());
        put_addr(&mut body, &addr);
        let got = self.exchange_among(&members, &body)?;
        let mut table = Vec::with_capacity(members.len());
        let mut nonces = Vec::with_capacity(members.len());
        for (&p, theirs) in members.iter().zip(&got) {
            let mut r = Reader(theirs);
            let parsed = (|| Some((r.u64()?, r.u64()?, r.addr()?)))().filter(|_| r.rest().is_empty());
            let Some((hash, nonce, addr)) = parsed else {
                return Err(fail(
                    Some(me),
                    BootstrapFailure::Protocol,
                    format!("rank {p} sent {} bytes that are not a shrink entry", theirs.len()),
                ));
            };
            if hash != list_hash {
                return Err(fail(
                    Some(me),
                    BootstrapFailure::Protocol,
                    format!(
                        "rank {p} shrinks with another list of excluded ranks than this rank \
                         ({exclude:?}): every staying rank must pass the same list"
                    ),
                ));
            }
            table.push(addr);
            nonces.push(nonce);
        }
        Ok(PendingSplit {
            parent_rank: me,
            rank,
            key: child_key(self.key, &list, &nonces),
            members,
            table,
            listener,
            timeout: self.timeout,
        })
    }

    /// Sends `mine` to every other rank of `members` and receives theirs (in `members` order,
    /// this rank's own at its place), over this world's connections to those ranks only. The
    /// messages are small (well below a socket's buffer), so writing all before reading
    /// cannot block.
    fn exchange_among(&self, members: &[usize], mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let st = self.state()?;
        let deadline = Deadline::after(self.timeout);
        let me = self.rank;
        let msg = data_frame(OP_SPLIT, mine);
        let r = (|| {
            for &p in members.iter().filter(|&&p| p != me) {
                write_all_by(peer_stream(&st.peers, p)?, &msg, deadline)
                    .map_err(|e| io_fail(Some(me), &format!("shrink: sending to rank {p}"), &e))?;
            }
            members
                .iter()
                .map(|&p| match p == me {
                    true => Ok(mine.to_vec()),
                    false => peer_stream(&st.peers, p)
                        .and_then(|s| self.read_data(s, p, OP_SPLIT, deadline)),
                })
                .collect::<Result<Vec<_>>>()
        })();
        self.settle(st, r)
    }
}

/// The ranks that stay when `exclude` leaves a world of `n`, checked for `me`.
fn shrink_members(me: usize, n: usize, exclude: &[usize]) -> Result<Vec<usize>> {
    let bad = |reason: String| Error::InvalidArgument {
        rank: Some(me),
        arg: Arg::Ranks,
        reason,
    };
    if exclude.is_empty() {
        return Err(bad("shrink needs at least one rank to exclude".into()));
    }
    if let Some(&r) = exclude.iter().find(|&&r| r >= n) {
        return Err(bad(format!("excluded rank {r} is outside 0..{n}")));
    }
    if exclude.contains(&me) {
        return Err(bad(format!(
            "rank {me} is in the list of excluded ranks: an excluded rank does not call shrink"
        )));
    }
    Ok((0..n).filter(|r| !exclude.contains(r)).collect())
}
