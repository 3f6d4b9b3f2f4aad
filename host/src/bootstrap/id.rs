//! [`UniqueId`]: the 128 bytes that name one world's rendezvous.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use super::root;
use super::wire::{self, fail, fnv1a, put_addr, ADDR_LEN, MAGIC, VERSION};
use crate::error::BootstrapFailure;
use crate::{Error, Result};

/// Bytes of a [`UniqueId`], like `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// Where the fields lie in the 128 bytes.
const VERSION_AT: usize = 8;
const ADDR_AT: usize = 10;
const KEY_AT: usize = ADDR_AT + ADDR_LEN;
const RESERVED_AT: usize = KEY_AT + 8;
const CHECKSUM_AT: usize = UNIQUE_ID_BYTES - 8;

/// The name of one world of ranks spread over processes, like `ncclUniqueId`: the address of
/// the rendezvous service (the root) and a random 64-bit key that every rank's hello must
/// carry. One process makes it ([`UniqueId::new`], which also starts the service), hands it to
/// every other process by any means (its 128 bytes, or its text: 256 hex digits), and every
/// rank then joins with it. One id serves one world: make a new id for each.
///
/// The key keeps a stray process (another job's rank, a port scanner) out of the world; it is
/// not authentication: anyone who can reach the port and knows the id can join.
///
/// Layout (integers big-endian): magic `RCCLBOOT` (8 bytes), protocol version (u16), the root's
/// address (family u8: 4 or 6, port u16, IP in 16 bytes, IPv6 scope u32), key (u64), zeros up
/// to byte 120, then an FNV-1a-64 checksum of bytes 0..120. `#[repr(transparent)]` over
/// `[u8; 128]`, so it can cross an FFI or MPI boundary as plain bytes.
///
/// ```
/// use ringccl::UniqueId;
/// let id = UniqueId::with_address("127.0.0.1:29500".parse()?, 42);
/// let text = id.to_string();
/// assert_eq!(text.len(), 256);
/// assert_eq!(text.parse::<UniqueId>()?, id);
/// assert_eq!(UniqueId::from_bytes(id.as_bytes())?, id);
/// assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

impl UniqueId {
    /// Like `ncclGetUniqueId`: starts this world's rendezvous service in the background and
    /// returns its id. The service listens on every IPv4 interface (`0.0.0.0`, a port the
    /// system picks); the id advertises the address of the interface that carries the default
    /// route, or `127.0.0.1` when there is none (then only processes of this host can join).
    /// To fix the address (e.g. from `RINGCCL_COMM_ID`), use [`UniqueId::new_at`].
    ///
    /// The service is a detached thread: it ends once every rank has received the table of
    /// addresses, or once the world failed (after answering late ranks until their timeout),
    /// or after 10 minutes without any rank; it never keeps the process alive.
    ///
    /// ```no_run
    /// let id = ringccl::UniqueId::new()?;
    /// println!("{id}"); // hand this text to every rank's process
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn new() -> Result<UniqueId> {
        Self::new_at(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
    }

    /// [`UniqueId::new`] with the service listening on `bind` (port 0: one the system picks).
    /// The id advertises `bind`'s IP, or for an unspecified IP (`0.0.0.0`, `::`) what
    /// [`UniqueId::new`] advertises.
    ///
    /// ```
    /// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
    /// assert!(id.address().ip().is_loopback());
    /// assert_ne!(id.address().port(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_at(bind: SocketAddr) -> Result<UniqueId> {
        let listener = listen(bind)?;
        let port = listener
            .local_addr()
            .map_err(|e| fail(None, BootstrapFailure::Network, format!("{bind}: {e}")))?
            .port();
        let ip = if bind.ip().is_unspecified() {
            advertised_ip(bind.is_ipv6())
        } else {
            bind.ip()
        };
        let key = random_key();
        root::spawn(listener, key)?;
        Ok(Self::with_address(SocketAddr::new(ip, port), key))
    }

    /// The id of a rendezvous at `addr` with `key`, computed without starting anything: every
    /// process that computes the same address and key gets the same id (the launcher
    /// conventions do this, see `LaunchEnv`). One process must then host the service with
    /// [`UniqueId::serve`].
    ///
    /// ```
    /// let a = ringccl::UniqueId::with_address("10.0.0.1:29501".parse()?, 7);
    /// assert_eq!(a.address().to_string(), "10.0.0.1:29501");
    /// assert_eq!(a.key(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_address(addr: SocketAddr, key: u64) -> UniqueId {
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        let mut head = Vec::with_capacity(RESERVED_AT);
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&VERSION.to_be_bytes());
        put_addr(&mut head, &addr);
        head.extend_from_slice(&key.to_be_bytes());
        bytes[..RESERVED_AT].copy_from_slice(&head);
        let sum = fnv1a(&[&bytes[..CHECKSUM_AT]]);
        bytes[CHECKSUM_AT..].copy_from_slice(&sum.to_be_bytes());
        UniqueId { bytes }
    }

    /// Starts the rendezvous service of this id in this process: it listens on the id's port,
    /// on the id's IP when that is a loopback address, else on every interface of the id's
    /// family. For ids from [`UniqueId::with_address`]; call it once per id, in one process.
    ///
    /// ```
    /// use std::net::TcpListener;
    /// // A free port, for the example.
    /// let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    /// let id = ringccl::UniqueId::with_address(([127, 0, 0, 1], port).into(), 7);
    /// id.serve()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn serve(&self) -> Result<()> {
        let addr = self.address();
        let bind = if addr.ip().is_loopback() {
            addr
        } else if addr.is_ipv6() {
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, addr.port()))
        } else {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()))
        };
        root::spawn(listen(bind)?, self.key())
    }

    /// The address of the rendezvous service.
    ///
    /// ```
    /// let id = ringccl::UniqueId::with_address("[::1]:1234".parse()?, 1);
    /// assert_eq!(id.address(), "[::1]:1234".parse()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn address(&self) -> SocketAddr {
        let mut a = [0u8; ADDR_LEN];
        a.copy_from_slice(&self.bytes[ADDR_AT..KEY_AT]);
        // Checked when the id was made or parsed.
        wire::get_addr(&a).unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    /// The world's key (every rank's hello must carry it).
    ///
    /// ```
    /// assert_eq!(ringccl::UniqueId::with_address("127.0.0.1:9".parse()?, 99).key(), 99);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> u64 {
        let mut k = [0u8; 8];
        k.copy_from_slice(&self.bytes[KEY_AT..RESERVED_AT]);
        u64::from_be_bytes(k)
    }

    /// The 128 bytes (what [`UniqueId::from_bytes`] reads back).
    ///
    /// ```
    /// let id = ringccl::UniqueId::with_address("127.0.0.1:9".parse()?, 1);
    /// assert_eq!(&id.as_bytes()[..8], b"RCCLBOOT");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    /// Reads an id from its 128 bytes. Anything else is an [`Error::Bootstrap`]:
    /// [`BootstrapFailure::WrongVersion`] for an id of another protocol version,
    /// [`BootstrapFailure::InvalidId`] for a wrong length, magic or checksum (corrupt bytes).
    ///
    /// ```
    /// use ringccl::{BootstrapFailure, Error, UniqueId};
    /// let id = UniqueId::with_address("127.0.0.1:9".parse()?, 1);
    /// let mut bytes = *id.as_bytes();
    /// bytes[50] ^= 1;
    /// let e = UniqueId::from_bytes(&bytes).unwrap_err();
    /// assert!(matches!(e, Error::Bootstrap { failure: BootstrapFailure::InvalidId, .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        let invalid = |why: String| fail(None, BootstrapFailure::InvalidId, why);
        let bytes: [u8; UNIQUE_ID_BYTES] = b.try_into().map_err(|_| {
            invalid(format!(
                "{} bytes given, a UniqueId has {UNIQUE_ID_BYTES}",
                b.len()
            ))
        })?;
        if bytes[..8] != MAGIC {
            return Err(invalid("the bytes do not start with a UniqueId's magic".into()));
        }
        let version = u16::from_be_bytes([bytes[VERSION_AT], bytes[VERSION_AT + 1]]);
        if version != VERSION {
            return Err(fail(
                None,
                BootstrapFailure::WrongVersion,
                format!("the id has protocol version {version}, this ringccl speaks {VERSION}"),
            ));
        }
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&bytes[CHECKSUM_AT..]);
        if u64::from_be_bytes(sum) != fnv1a(&[&bytes[..CHECKSUM_AT]]) {
            return Err(invalid("the checksum does not match (corrupt id)".into()));
        }
        let mut a = [0u8; ADDR_LEN];
        a.copy_from_slice(&bytes[ADDR_AT..KEY_AT]);
        wire::get_addr(&a).ok_or_else(|| invalid("no valid address".into()))?;
        if bytes[RESERVED_AT..CHECKSUM_AT].iter().any(|&x| x != 0) {
            return Err(invalid("reserved bytes are set".into()));
        }
        Ok(UniqueId { bytes })
    }
}

impl fmt::Display for UniqueId {
    /// 256 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.bytes {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("address", &self.address())
            .field("key", &format_args!("{:#018x}", self.key()))
            .finish()
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    /// 256 hex digits (either case; blanks around ignored), as [`Display`](fmt::Display) writes.
    fn from_str(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        let digits = s.as_bytes();
        if digits.len() != 2 * UNIQUE_ID_BYTES {
            return Err(fail(
                None,
                BootstrapFailure::InvalidId,
                format!(
                    "{} characters given, a UniqueId's text has {}",
                    digits.len(),
                    2 * UNIQUE_ID_BYTES
                ),
            ));
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (i, pair) in digits.chunks_exact(2).enumerate() {
            let hex = |c: u8| (c as char).to_digit(16);
            match (hex(pair[0]), hex(pair[1])) {
                (Some(h), Some(l)) => bytes[i] = (h * 16 + l) as u8,
                _ => {
                    return Err(fail(
                        None,
                        BootstrapFailure::InvalidId,
                        format!("not a hex digit at character {}", 2 * i),
                    ))
                }
            }
        }
        UniqueId::from_bytes(&bytes)
    }
}

/// A listener on `bind`, with the failure told as [`BootstrapFailure::Network`].
fn listen(bind: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(bind).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            " (the port is taken: choose another one)"
        } else {
            ""
        };
        fail(
            None,
            BootstrapFailure::Network,
            format!("cannot listen on {bind}: {e}{hint}"),
        )
    })
}

/// The IP other hosts can reach this one on: the source address of the default route (a
/// connected UDP socket sends nothing), else loopback.
fn advertised_ip(v6: bool) -> IpAddr {
    let (any, probe, fallback): (SocketAddr, SocketAddr, IpAddr) = if v6 {
        (
            (Ipv6Addr::UNSPECIFIED, 0).into(),
            // 2001:db8::/32 is for documentation: only the route is looked up.
            ("2001:db8::1".parse().unwrap_or(Ipv6Addr::LOCALHOST), 9).into(),
            Ipv6Addr::LOCALHOST.into(),
        )
    } else {
        (
            (Ipv4Addr::UNSPECIFIED, 0).into(),
            // 198.51.100.0/24 is for documentation: only the route is looked up.
            (Ipv4Addr::new(198, 51, 100, 1), 9).into(),
            Ipv4Addr::LOCALHOST.into(),
        )
    };
    UdpSocket::bind(any)
        .and_then(|s| {
            s.connect(probe)?;
            s.local_addr()
        })
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified() && !ip.is_loopback())
        .unwrap_or(fallback)
}

/// 64 random bits from the operating system; if that fails, a hash of the time and the
/// process id seeded by `std`'s per-process random state.
pub(super) fn random_key() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.finish()
    })
}
