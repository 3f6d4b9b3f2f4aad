//! The rank's side of [`Bootstrap::join`](super::Bootstrap::join): the hello to the root, the
//! table, then the mesh of connections between the ranks.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{
    fail, failure_of, io_fail, peer_hello, read_exact_by, read_frame, write_all_by, Deadline,
    Hello, Reader, KIND_FAIL, KIND_TABLE, MAX_CONTROL,
};
use super::UniqueId;
use crate::error::BootstrapFailure;
use crate::Result;

/// Longest single connection attempt.
const CONNECT_TRY: Duration = Duration::from_secs(2);
/// How often the accepting side looks for new connections.
const POLL: Duration = Duration::from_millis(2);

/// Tells the root about a rank outside `0..nranks` (so that the ranks waiting there hear why the
/// world cannot form), without waiting long; errors are ignored.
pub(super) fn report_out_of_range(id: &UniqueId, nranks: usize, rank: usize, deadline: Deadline) {
    let deadline = deadline.capped(Duration::from_secs(1));
    let root = id.address();
    let Some(left) = deadline.left() else { return };
    let Ok(s) = TcpStream::connect_timeout(&root, left) else {
        return;
    };
    let hello = Hello {
        key: id.key(),
        nranks: u32::try_from(nranks).unwrap_or(u32::MAX),
        rank: u32::try_from(rank).unwrap_or(u32::MAX),
        left_ms: deadline.left_ms(),
        listen: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
    };
    if write_all_by(&s, &hello.encode(), deadline).is_ok() {
        // Wait for the root's answer, so that it has read the hello before the socket closes.
        let _ = read_frame(&s, MAX_CONTROL, deadline, Some(rank), "the rendezvous");
    }
}

/// Joins the rendezvous: returns one connected stream per peer (`None` for this rank).
pub(super) fn connect_world(
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    deadline: Deadline,
) -> Result<Vec<Option<TcpStream>>> {
    let me = Some(rank);
    let root = id.address();
    if root.port() == 0 || root.ip().is_unspecified() {
        return Err(fail(
            me,
            BootstrapFailure::Network,
            format!("the id's address {root} cannot be connected to"),
        ));
    }
    let any: SocketAddr = if root.is_ipv6() {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let (listener, port) = peer_listener(any, root.port(), me)?;

    let conn = connect_root(root, deadline, rank)?;
    let local = conn
        .local_addr()
        .map_err(|e| io_fail(me, "cannot read the local address", &e))?;
    let hello = Hello {
        key: id.key(),
        nranks: nranks as u32,
        rank: rank as u32,
        left_ms: deadline.left_ms(),
        listen: SocketAddr::new(local.ip(), port),
    };
    write_all_by(&conn, &hello.encode(), deadline)
        .map_err(|e| io_fail(me, &format!("sending the hello to the rendezvous at {root}"), &e))?;
    let from = format!("the rendezvous at {root}");
    let (kind, body) = read_frame(&conn, MAX_CONTROL, deadline, me, &from).map_err(|e| match e {
        crate::Error::Bootstrap {
            failure: BootstrapFailure::Timeout,
            ..
        } => fail(
            me,
            BootstrapFailure::Timeout,
            format!("{from} did not answer in time (not every rank joined)"),
        ),
        crate::Error::Bootstrap {
            failure: BootstrapFailure::PeerLost,
            ..
        } => fail(
            me,
            BootstrapFailure::PeerLost,
            format!("{from} closed the connection before answering (its process exited?)"),
        ),
        other => other,
    })?;
    drop(conn);
    let table = match kind {
        KIND_TABLE => parse_table(&body, nranks, rank, hello.listen).map_err(|detail| {
            fail(me, BootstrapFailure::Protocol, format!("{from} sent {detail}"))
        })?,
        KIND_FAIL => {
            let (code, text) = body.split_first().unwrap_or((&0, &[]));
            return Err(fail(
                me,
                failure_of(*code),
                String::from_utf8_lossy(text).into_owned(),
            ));
        }
        k => {
            return Err(fail(
                me,
                BootstrapFailure::Protocol,
                format!("{from} sent a frame of kind {k}"),
            ))
        }
    };
    mesh(listener, &table, id.key(), rank, deadline)
}

/// The listener for the peers' connections, on a port the system picks, never `avoid` (the
/// rendezvous's port): where the root is not listening yet, a listener of this rank on that
/// port would take the connection meant for the root, and this rank would wait for a table
/// from itself.
fn peer_listener(any: SocketAddr, avoid: u16, me: Option<usize>) -> Result<(TcpListener, u16)> {
    let bind = || {
        let l = TcpListener::bind(any)
            .map_err(|e| io_fail(me, &format!("cannot listen on {any} for the peers"), &e))?;
        let port = l
            .local_addr()
            .map_err(|e| io_fail(me, "cannot read the peers' listener address", &e))?
            .port();
        Ok::<_, crate::Error>((l, port))
    };
    let first = bind()?;
    if first.1 != avoid {
        return Ok(first);
    }
    // The first listener holds `avoid` while the second is bound, so it gets another port.
    let second = bind()?;
    drop(first);
    Ok(second)
}

/// Connects to the root, retrying while it is not listening yet (its process may start after
/// this one) until `deadline`.
fn connect_root(root: SocketAddr, deadline: Deadline, rank: usize) -> Result<TcpStream> {
    let mut pause = Duration::from_millis(10);
    let mut last: Option<std::io::Error> = None;
    while let Some(left) = deadline.left() {
        match TcpStream::connect_timeout(&root, left.min(CONNECT_TRY)) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::TimedOut
                        | ErrorKind::WouldBlock
                        | ErrorKind::Interrupted
                        | ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                ) =>
            {
                last = Some(e);
                let nap = pause.min(deadline.left().unwrap_or_default());
                thread::sleep(nap);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(io_fail(
                    Some(rank),
                    &format!("cannot connect to the rendezvous at {root}"),
                    &e,
                ))
            }
        }
    }
    Err(fail(
        Some(rank),
        BootstrapFailure::Timeout,
        format!(
            "the rendezvous at {root} could not be reached in time (last error: {})",
            last.map_or_else(|| "none".to_string(), |e| e.to_string())
        ),
    ))
}

/// The table's addresses, checked: `nranks` entries, ours at `rank`.
fn parse_table(
    body: &[u8],
    nranks: usize,
    rank: usize,
    mine: SocketAddr,
) -> std::result::Result<Vec<SocketAddr>, String> {
    let mut r = Reader(body);
    let n = r.u32().ok_or("an empty table")? as usize;
    if n != nranks {
        return Err(format!("a table of {n} ranks for a world of {nranks}"));
    }
    let table: Vec<SocketAddr> = (0..n)
        .map(|_| r.addr())
        .collect::<Option<_>>()
        .ok_or("a truncated table")?;
    if !r.rest().is_empty() || table[rank] != mine {
        return Err("a table that does not match this rank".into());
    }
    Ok(table)
}

/// The full mesh: this rank connects to every lower rank and accepts every higher one (in a
/// second thread, so that no listen backlog fills up).
pub(super) fn mesh(
    listener: TcpListener,
    table: &[SocketAddr],
    key: u64,
    rank: usize,
    deadline: Deadline,
) -> Result<Vec<Option<TcpStream>>> {
    let n = table.len();
    let me = Some(rank);
    listener
        .set_nonblocking(true)
        .map_err(|e| io_fail(me, "cannot set up the peers' listener", &e))?;
    thread::scope(|scope| {
        let acceptor = thread::Builder::new()
            .name("ringccl-bootstrap-accept".into())
            .spawn_scoped(scope, || accept_higher(&listener, key, n, rank, deadline))
            .map_err(|e| io_fail(me, "cannot start the accepting thread", &e))?;
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let mut first_err = None;
        for (j, addr) in table.iter().enumerate().take(rank) {
            match connect_peer(*addr, j, key, n, rank, deadline) {
                Ok(s) => peers[j] = Some(s),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        let accepted = acceptor.join().unwrap_or_else(|_| {
            Err(fail(
                me,
                BootstrapFailure::Network,
                "the accepting thread stopped",
            ))
        });
        if let Some(e) = first_err {
            return Err(e);
        }
        for (j, s) in accepted? {
            peers[j] = Some(s);
        }
        Ok(peers)
    })
}

/// Connects to rank `j` and introduces this rank.
fn connect_peer(
    addr: SocketAddr,
    j: usize,
    key: u64,
    n: usize,
    rank: usize,
    deadline: Deadline,
) -> Result<TcpStream> {
    let me = Some(rank);
    let what = format!("connecting to rank {j} at {addr}");
    loop {
        let left = deadline.left().ok_or_else(|| {
            fail(
                me,
                BootstrapFailure::Timeout,
                format!("{what}: no connection in time"),
            )
        })?;
        match TcpStream::connect_timeout(&addr, left.min(CONNECT_TRY)) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                write_all_by(&s, &peer_hello(key, n, rank), deadline)
                    .map_err(|e| io_fail(me, &what, &e))?;
                return Ok(s);
            }
            Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            // The peer listens until its own join ends: a refusal means it is gone.
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                return Err(fail(
                    me,
                    BootstrapFailure::PeerLost,
                    format!("{what}: refused (rank {j} left the bootstrap: its process exited or its join failed)"),
                ))
            }
            Err(e) => return Err(io_fail(me, &what, &e)),
        }
    }
}

/// Accepts ranks `rank+1..n`; connections that are not one of them (another job, a repeated
/// rank) are dropped.
fn accept_higher(
    listener: &TcpListener,
    key: u64,
    n: usize,
    rank: usize,
    deadline: Deadline,
) -> Result<Vec<(usize, TcpStream)>> {
    let me = Some(rank);
    let mut got: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut left = n - rank - 1;
    let mut notes = Vec::new();
    let expected = peer_hello(key, n, 0);
    while left > 0 {
        if Instant::now() >= deadline.0 {
            let missing: Vec<String> = (rank + 1..n)
                .filter(|&j| got[j].is_none())
                .take(16)
                .map(|j| j.to_string())
                .collect();
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" (rejected: {})", notes.join("; "))
            };
            return Err(fail(
                me,
                BootstrapFailure::Timeout,
                format!(
                    "rank(s) {} did not connect to this rank in time{notes}",
                    missing.join(", ")
                ),
            ));
        }
        let (s, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                thread::sleep(POLL);
                continue;
            }
            Err(e) => return Err(io_fail(me, "accepting a peer", &e)),
        };
        let hello_by = deadline.capped(Duration::from_secs(2));
        let mut buf = vec![0u8; expected.len()];
        let ok = s.set_nonblocking(false).is_ok() && read_exact_by(&s, &mut buf, hello_by).is_ok();
        // Everything but the rank (the last 4 bytes) must match this world's hello.
        let cut = expected.len() - 4;
        let j = u32::from_be_bytes([buf[cut], buf[cut + 1], buf[cut + 2], buf[cut + 3]]) as usize;
        if ok && buf[..cut] == expected[..cut] && j > rank && j < n && got[j].is_none() {
            let _ = s.set_nodelay(true);
            got[j] = Some(s);
            left -= 1;
        } else if notes.len() < 8 {
            notes.push(format!("a connection from {from}"));
        }
    }
    Ok(got
        .into_iter()
        .enumerate()
        .filter_map(|(j, s)| s.map(|s| (j, s)))
        .collect())
}
