//! The bytes on the wire: frame headers, addresses, deadlines, and reads and writes that never
//! wait past a deadline. The layout is described in the module docs of `bootstrap`.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpStream};
use std::time::{Duration, Instant};

use crate::error::BootstrapFailure;
use crate::Error;

/// The first 8 bytes of every frame and of every [`UniqueId`](super::UniqueId).
pub(super) const MAGIC: [u8; 8] = *b"RCCLBOOT";
/// The protocol version (frames and ids).
pub(super) const VERSION: u16 = 1;
/// Bytes of a frame header: magic, version (u16), kind (u8), body length (u32).
pub(super) const HEADER_LEN: usize = 15;
/// Bytes of an encoded socket address: family (u8), port (u16), IP (16), IPv6 scope (u32).
pub(super) const ADDR_LEN: usize = 23;
/// Most ranks in one world (each rank holds one TCP connection per peer).
pub const MAX_RANKS: usize = 1024;
/// Largest body a rank accepts in a data frame (`all_gather`, `send`): 1 GiB.
pub const MAX_DATA: usize = 1 << 30;
/// Largest body of a frame other than data (hellos, errors, the table).
pub(super) const MAX_CONTROL: usize = 64 + MAX_RANKS * ADDR_LEN;

/// A rank's hello to the root.
pub(super) const KIND_HELLO: u8 = 1;
/// The root's table of every rank's address.
pub(super) const KIND_TABLE: u8 = 2;
/// A failure report (root to rank).
pub(super) const KIND_FAIL: u8 = 3;
/// A rank's hello to a peer rank (the mesh).
pub(super) const KIND_PEER: u8 = 4;
/// Data of a collective or a send.
pub(super) const KIND_DATA: u8 = 5;

/// A point in time after which no socket call waits.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline(pub(super) Instant);

impl Deadline {
    pub(super) fn after(d: Duration) -> Self {
        let now = Instant::now();
        Deadline(
            now.checked_add(d)
                .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365)))
                .unwrap_or(now),
        )
    }

    /// Time left, at least 1 ms (socket timeouts refuse zero); `None` once passed.
    pub(super) fn left(&self) -> Option<Duration> {
        let left = self.0.checked_duration_since(Instant::now())?;
        (!left.is_zero()).then_some(left.max(Duration::from_millis(1)))
    }

    /// The earlier of this deadline and `d` from now.
    pub(super) fn capped(&self, d: Duration) -> Deadline {
        Deadline(self.0.min(Instant::now() + d))
    }

    /// Milliseconds left (0 once passed), saturated to `u32`.
    pub(super) fn left_ms(&self) -> u32 {
        self.left()
            .map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX))
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "deadline passed")
}

/// Whether a read or write that failed with `e` is tried again (until the deadline): an
/// interruption, or the socket's timeout, which is only a slice of the deadline.
fn again(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// `read_exact` that gives up at `deadline` (`TimedOut`); a closed stream is `UnexpectedEof`.
pub(super) fn read_exact_by(
    mut s: &TcpStream,
    mut buf: &mut [u8],
    deadline: Deadline,
) -> io::Result<()> {
    while !buf.is_empty() {
        let left = deadline.left().ok_or_else(timed_out)?;
        s.set_read_timeout(Some(left))?;
        match s.read(buf) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ))
            }
            Ok(n) => buf = &mut buf[n..],
            Err(e) if again(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `write_all` that gives up at `deadline` (`TimedOut`).
pub(super) fn write_all_by(mut s: &TcpStream, mut buf: &[u8], deadline: Deadline) -> io::Result<()> {
    while !buf.is_empty() {
        let left = deadline.left().ok_or_else(timed_out)?;
        s.set_write_timeout(Some(left))?;
        match s.write(buf) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "connection closed")),
            Ok(n) => buf = &buf[n..],
            Err(e) if again(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The failure an I/O error stands for: a deadline is [`BootstrapFailure::Timeout`], a closed
/// or reset connection [`BootstrapFailure::PeerLost`], anything else
/// [`BootstrapFailure::Network`].
pub(super) fn classify(e: &io::Error) -> BootstrapFailure {
    use io::ErrorKind as K;
    match e.kind() {
        K::TimedOut | K::WouldBlock => BootstrapFailure::Timeout,
        K::UnexpectedEof
        | K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::NotConnected
        | K::WriteZero => BootstrapFailure::PeerLost,
        _ => BootstrapFailure::Network,
    }
}

/// An [`Error::Bootstrap`].
pub(super) fn fail(rank: Option<usize>, failure: BootstrapFailure, detail: impl Into<String>) -> Error {
    Error::Bootstrap {
        rank,
        failure,
        detail: detail.into(),
    }
}

/// An [`Error::Bootstrap`] from an I/O error, classified.
pub(super) fn io_fail(rank: Option<usize>, what: &str, e: &io::Error) -> Error {
    fail(rank, classify(e), format!("{what}: {e}"))
}

/// A frame: header then body.
pub(super) fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(HEADER_LEN + body.len());
    f.extend_from_slice(&MAGIC);
    f.extend_from_slice(&VERSION.to_be_bytes());
    f.push(kind);
    // Bodies are capped far below 4 GiB by every caller.
    f.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    f.extend_from_slice(body);
    f
}

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) kind: u8,
    pub(super) len: usize,
}

/// Checks a frame header: magic ([`BootstrapFailure::Protocol`]), version
/// ([`BootstrapFailure::WrongVersion`]), body length at most `max`. The error is
/// `(failure, detail)`.
pub(super) fn parse_header(
    h: &[u8; HEADER_LEN],
    max: usize,
) -> Result<Header, (BootstrapFailure, String)> {
    if h[..8] != MAGIC {
        return Err((
            BootstrapFailure::Protocol,
            format!("not a ringccl bootstrap frame (starts with {:02x?})", &h[..8]),
        ));
    }
    let version = u16::from_be_bytes([h[8], h[9]]);
    if version != VERSION {
        return Err((
            BootstrapFailure::WrongVersion,
            format!("protocol version {version}, this side speaks version {VERSION}"),
        ));
    }
    let len = u32::from_be_bytes([h[11], h[12], h[13], h[14]]) as usize;
    if len > max {
        return Err((
            BootstrapFailure::Protocol,
            format!("a frame of kind {} claims {len} bytes, more than {max}", h[10]),
        ));
    }
    Ok(Header { kind: h[10], len })
}

/// Reads one frame (header checked, body up to `max` bytes) by `deadline`.
pub(super) fn read_frame(
    s: &TcpStream,
    max: usize,
    deadline: Deadline,
    rank: Option<usize>,
    from: &str,
) -> crate::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    read_exact_by(s, &mut h, deadline).map_err(|e| io_fail(rank, &format!("reading from {from}"), &e))?;
    let header = parse_header(&h, max)
        .map_err(|(failure, detail)| fail(rank, failure, format!("{from} sent {detail}")))?;
    let mut body = vec![0u8; header.len];
    read_exact_by(s, &mut body, deadline)
        .map_err(|e| io_fail(rank, &format!("reading from {from}"), &e))?;
    Ok((header.kind, body))
}

/// Appends `a` in [`ADDR_LEN`] bytes.
pub(super) fn put_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    let (family, ip, scope) = match a {
        SocketAddr::V4(v4) => {
            let mut ip = [0u8; 16];
            ip[..4].copy_from_slice(&v4.ip().octets());
            (4u8, ip, 0u32)
        }
        SocketAddr::V6(v6) => (6u8, v6.ip().octets(), v6.scope_id()),
    };
    out.push(family);
    out.extend_from_slice(&a.port().to_be_bytes());
    out.extend_from_slice(&ip);
    out.extend_from_slice(&scope.to_be_bytes());
}

/// Reads an address written by [`put_addr`] (`None`: unknown family).
pub(super) fn get_addr(b: &[u8; ADDR_LEN]) -> Option<SocketAddr> {
    let port = u16::from_be_bytes([b[1], b[2]]);
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&b[3..19]);
    let scope = u32::from_be_bytes([b[19], b[20], b[21], b[22]]);
    match b[0] {
        4 if ip[4..].iter().all(|&x| x == 0) && scope == 0 => Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
            port,
        )),
        6 => Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(ip),
            port,
            0,
            scope,
        ))),
        _ => None,
    }
}

/// A cursor over a body that reports a short body as `None`.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl Reader<'_> {
    pub(super) fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        self.bytes().map(u32::from_be_bytes)
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        self.bytes().map(u64::from_be_bytes)
    }
    pub(super) fn addr(&mut self) -> Option<SocketAddr> {
        get_addr(&self.bytes()?)
    }
    pub(super) fn rest(&self) -> &[u8] {
        self.0
    }
}

/// A rank's hello to the root (body of [`KIND_HELLO`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) key: u64,
    pub(super) nranks: u32,
    pub(super) rank: u32,
    /// Milliseconds the rank still waits (the root fails the world a little earlier).
    pub(super) left_ms: u32,
    /// Where the rank listens for its peers.
    pub(super) listen: SocketAddr,
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(20 + ADDR_LEN);
        b.extend_from_slice(&self.key.to_be_bytes());
        b.extend_from_slice(&self.nranks.to_be_bytes());
        b.extend_from_slice(&self.rank.to_be_bytes());
        b.extend_from_slice(&self.left_ms.to_be_bytes());
        put_addr(&mut b, &self.listen);
        frame(KIND_HELLO, &b)
    }

    pub(super) fn decode(body: &[u8]) -> Option<Hello> {
        let mut r = Reader(body);
        Some(Hello {
            key: r.u64()?,
            nranks: r.u32()?,
            rank: r.u32()?,
            left_ms: r.u32()?,
            listen: r.addr()?,
        })
    }
}

/// A rank's hello to a peer (body of [`KIND_PEER`]): key, nranks, rank.
pub(super) fn peer_hello(key: u64, nranks: usize, rank: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&key.to_be_bytes());
    b.extend_from_slice(&(nranks as u32).to_be_bytes());
    b.extend_from_slice(&(rank as u32).to_be_bytes());
    frame(KIND_PEER, &b)
}

/// The wire code of a failure (body of [`KIND_FAIL`]: code, then the detail in UTF-8).
pub(super) fn failure_code(f: BootstrapFailure) -> u8 {
    use BootstrapFailure as F;
    match f {
        F::Timeout => 1,
        F::WrongKey => 2,
        F::WrongVersion => 3,
        F::NranksMismatch => 4,
        F::DuplicateRank => 5,
        F::RankOutOfRange => 6,
        F::PeerLost => 7,
        F::Network => 8,
        F::InvalidId => 9,
        F::Protocol => 10,
    }
}

/// The failure of a wire code (unknown codes are [`BootstrapFailure::Protocol`]).
pub(super) fn failure_of(code: u8) -> BootstrapFailure {
    use BootstrapFailure as F;
    match code {
        1 => F::Timeout,
        2 => F::WrongKey,
        3 => F::WrongVersion,
        4 => F::NranksMismatch,
        5 => F::DuplicateRank,
        6 => F::RankOutOfRange,
        7 => F::PeerLost,
        8 => F::Network,
        9 => F::InvalidId,
        _ => F::Protocol,
    }
}

/// A [`KIND_FAIL`] frame (the detail is cut to 4 KiB).
pub(super) fn fail_frame(f: BootstrapFailure, detail: &str) -> Vec<u8> {
    let mut end = detail.len().min(4096);
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    let mut b = Vec::with_capacity(1 + end);
    b.push(failure_code(f));
    b.extend_from_slice(&detail.as_bytes()[..end]);
    frame(KIND_FAIL, &b)
}

/// FNV-1a, 64 bits: the id's checksum and the launcher's key (stable across builds and
/// platforms, unlike `std`'s hashers).
pub(super) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}
