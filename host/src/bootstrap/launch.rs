//! The launcher conventions: what `torchrun`, `mpirun` wrappers and `ringccl-run` put in each
//! process's environment, and the [`UniqueId`] every process derives from it.

use std::net::{Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::wire::{fnv1a, MAX_RANKS};
use super::{Bootstrap, UniqueId};
use crate::{Error, Result};

/// ringccl's rendezvous listens on `MASTER_PORT` + this: `torchrun`'s own store already
/// listens on `MASTER_PORT`.
pub const RENDEZVOUS_PORT_OFFSET: u16 = 1;

/// Where the address came from.
const FROM_COMM_ID: &str = "RINGCCL_COMM_ID";
const FROM_MASTER: &str = "MASTER_ADDR/MASTER_PORT";

/// One process's place in a job started by a launcher, read from the environment:
///
/// | variable | meaning |
/// | --- | --- |
/// | `RANK` | this process's rank, `0..WORLD_SIZE` |
/// | `WORLD_SIZE` | the number of ranks (1 to [`MAX_RANKS`](super::MAX_RANKS)) |
/// | `LOCAL_RANK` | its rank on this host (the GPU to use); default `RANK` |
/// | `MASTER_ADDR`, `MASTER_PORT` | the job's rendezvous host; ringccl's rendezvous listens on `MASTER_PORT` + 1 ([`RENDEZVOUS_PORT_OFFSET`]), since `torchrun`'s store holds `MASTER_PORT` itself |
/// | `RINGCCL_COMM_ID` | `host:port` (`[v6]:port` for IPv6) of ringccl's rendezvous; wins over `MASTER_*` |
///
/// Every process computes the same [`UniqueId`] from these ([`LaunchEnv::unique_id`]): the
/// address, and a key derived from the address text and `WORLD_SIZE` instead of a random one.
/// So the check against stray peers is weaker than with [`UniqueId::new`]: a process of
/// another job with the same rendezvous address and world size would be taken for one of this
/// job (two jobs cannot share a port anyway while both run). Rank 0 hosts the rendezvous.
///
/// Blank variables count as unset; values are trimmed.
///
/// ```
/// use ringccl::LaunchEnv;
/// let vars = |name: &str| match name {
///     "RANK" => Some("1".to_string()),
///     "WORLD_SIZE" => Some("4".to_string()),
///     "MASTER_ADDR" => Some("10.0.0.1".to_string()),
///     "MASTER_PORT" => Some("29500".to_string()),
///     _ => None,
/// };
/// let env = LaunchEnv::from_lookup(vars)?.expect("a launched process");
/// assert_eq!((env.rank, env.world_size, env.local_rank), (1, 4, 1));
/// assert_eq!((env.host.as_str(), env.port), ("10.0.0.1", 29501));
/// # Ok::<(), ringccl::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchEnv {
    /// `RANK`.
    pub rank: usize,
    /// `WORLD_SIZE`.
    pub world_size: usize,
    /// `LOCAL_RANK` (default `RANK`).
    pub local_rank: usize,
    /// The rendezvous host: a name or an IP (IPv6 without brackets).
    pub host: String,
    /// The rendezvous port: `MASTER_PORT` + 1, or `RINGCCL_COMM_ID`'s.
    pub port: u16,
    /// Where the address came from: `"RINGCCL_COMM_ID"` or `"MASTER_ADDR/MASTER_PORT"`.
    pub source: &'static str,
}

impl LaunchEnv {
    /// [`LaunchEnv::from_lookup`] over this process's environment (a variable that is not
    /// Unicode is an [`Error::Config`]).
    ///
    /// ```
    /// match ringccl::LaunchEnv::from_env()? {
    ///     Some(env) => println!("rank {} of {}", env.rank, env.world_size),
    ///     None => println!("not started by a launcher"),
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn from_env() -> Result<Option<LaunchEnv>> {
        let mut bad = None;
        let env = Self::from_lookup(|name| match std::env::var_os(name)?.into_string() {
            Ok(v) => Some(v),
            Err(v) => {
                bad.get_or_insert_with(|| config(name, &v.to_string_lossy(), "not valid Unicode"));
                None
            }
        });
        match bad {
            Some(e) => Err(e),
            None => env,
        }
    }

    /// Reads the variables through `lookup(name)` (the value if set). `Ok(None)` when neither
    /// `RANK` nor `WORLD_SIZE` is set (not a launched process); an [`Error::Config`] naming
    /// the variable when one is set but not understood, or when a needed one is missing.
    ///
    /// ```
    /// use ringccl::{Error, LaunchEnv};
    /// assert_eq!(LaunchEnv::from_lookup(|_| None)?, None);
    ///
    /// let env = LaunchEnv::from_lookup(|name| match name {
    ///     "RANK" => Some("0".into()),
    ///     "WORLD_SIZE" => Some("2".into()),
    ///     "MASTER_ADDR" => Some("10.0.0.1".into()),
    ///     "MASTER_PORT" => Some("29500".into()),
    ///     "RINGCCL_COMM_ID" => Some("[::1]:7000".into()),
    ///     _ => None,
    /// })?.unwrap();
    /// assert_eq!((env.host.as_str(), env.port, env.source), ("::1", 7000, "RINGCCL_COMM_ID"));
    ///
    /// let bad = LaunchEnv::from_lookup(|name| match name {
    ///     "RANK" => Some("2".into()),
    ///     "WORLD_SIZE" => Some("2".into()),
    ///     _ => None,
    /// });
    /// assert!(matches!(bad, Err(Error::Config { variable, .. }) if variable == "RANK"));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn from_lookup(mut lookup: impl FnMut(&str) -> Option<String>) -> Result<Option<LaunchEnv>> {
        let mut get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let (rank, world) = match (get("RANK"), get("WORLD_SIZE")) {
            (None, None) => return Ok(None),
            (Some(r), None) => return Err(config("WORLD_SIZE", "", &format!("unset while RANK={r} is set"))),
            (None, Some(w)) => return Err(config("RANK", "", &format!("unset while WORLD_SIZE={w} is set"))),
            (Some(r), Some(w)) => (r, w),
        };
        let world_size = number("WORLD_SIZE", &world)?;
        if world_size == 0 || world_size > MAX_RANKS {
            return Err(config("WORLD_SIZE", &world, &format!("expected 1 to {MAX_RANKS}")));
        }
        let rank_n = number("RANK", &rank)?;
        if rank_n >= world_size {
            return Err(config("RANK", &rank, &format!("expected a rank in 0..{world_size} (WORLD_SIZE)")));
        }
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => number("LOCAL_RANK", &v)?,
            None => rank_n,
        };
        let (host, port, source) = if let Some(id) = get(FROM_COMM_ID) {
            let (host, port) =
                host_port(id.trim()).map_err(|reason| config(FROM_COMM_ID, &id, &reason))?;
            (host, port, FROM_COMM_ID)
        } else {
            let addr = get("MASTER_ADDR").ok_or_else(|| {
                config("MASTER_ADDR", "", "unset: set MASTER_ADDR and MASTER_PORT, or RINGCCL_COMM_ID=host:port")
            })?;
            let port_text = get("MASTER_PORT").ok_or_else(|| {
                config("MASTER_PORT", "", "unset: set MASTER_ADDR and MASTER_PORT, or RINGCCL_COMM_ID=host:port")
            })?;
            let host = host_only(addr.trim()).map_err(|reason| config("MASTER_ADDR", &addr, &reason))?;
            let port = port_text
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .and_then(|p| p.checked_add(RENDEZVOUS_PORT_OFFSET))
                .ok_or_else(|| {
                    config("MASTER_PORT", &port_text, "expected a port in 1..=65534 (ringccl listens on MASTER_PORT + 1)")
                })?;
            (host, port, FROM_MASTER)
        };
        Ok(Some(LaunchEnv {
            rank: rank_n,
            world_size,
            local_rank,
            host,
            port,
            source,
        }))
    }

    /// The world's [`UniqueId`], the same in every process of the job: the rendezvous address
    /// (the host resolved, IPv4 preferred) and a key derived from the address text and
    /// `WORLD_SIZE`. On rank 0 this also starts the rendezvous service ([`UniqueId::serve`]),
    /// so call it once per process. A host that does not resolve is an [`Error::Config`].
    ///
    /// ```no_run
    /// let env = ringccl::LaunchEnv::from_env()?.expect("started by a launcher");
    /// let id = env.unique_id()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn unique_id(&self) -> Result<UniqueId> {
        let variable = if self.source == FROM_COMM_ID {
            FROM_COMM_ID
        } else {
            "MASTER_ADDR"
        };
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| config(variable, &self.host, &format!("does not resolve: {e}")))?
            .collect();
        let addr = addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| config(variable, &self.host, "resolves to no address"))?;
        let key = fnv1a(&[
            b"ringccl-launch",
            self.host.to_ascii_lowercase().as_bytes(),
            &self.port.to_be_bytes(),
            &(self.world_size as u64).to_be_bytes(),
        ]);
        let id = UniqueId::with_address(addr, key);
        if self.rank == 0 {
            id.serve()?;
        }
        Ok(id)
    }
}

impl Bootstrap {
    /// [`LaunchEnv::unique_id`], then [`Bootstrap::join`] as `env`'s `RANK` of `WORLD_SIZE`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use ringccl::bootstrap::Bootstrap;
    /// let env = ringccl::LaunchEnv::from_env()?.expect("started by a launcher");
    /// let boot = Bootstrap::join_env(&env, Duration::from_secs(60))?;
    /// let ranks = boot.all_gather(&[env.rank as u8])?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn join_env(env: &LaunchEnv, timeout: Duration) -> Result<Bootstrap> {
        Bootstrap::join(&env.unique_id()?, env.world_size, env.rank, timeout)
    }
}

fn config(variable: &str, value: &str, reason: &str) -> Error {
    Error::Config {
        variable: variable.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

fn number(variable: &str, value: &str) -> Result<usize> {
    value
        .trim()
        .parse()
        .map_err(|_| config(variable, value, "expected a non-negative integer"))
}

/// A host: a name, an IPv4 address, or an IPv6 address (with or without brackets).
fn host_only(s: &str) -> std::result::Result<String, String> {
    let inner = s.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(s);
    if inner.is_empty() {
        return Err("expected a host name or address".into());
    }
    if inner.contains(':') && inner.parse::<Ipv6Addr>().is_err() {
        return Err("expected a host name or address without a port".into());
    }
    if inner.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err("expected a host name or address".into());
    }
    Ok(inner.to_string())
}

/// `host:port` or `[v6]:port`, the port not 0.
fn host_port(s: &str) -> std::result::Result<(String, u16), String> {
    let usage = "expected host:port (or [IPv6]:port)";
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or(usage)?;
        (format!("[{h}]"), p)
    } else {
        let (h, p) = s.rsplit_once(':').ok_or(usage)?;
        if h.contains(':') {
            return Err(format!("{usage}: write an IPv6 address in brackets"));
        }
        (h.to_string(), p)
    };
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| format!("{usage}, the port in 1..=65535"))?;
    Ok((host_only(&host).map_err(|e| format!("{usage}: {e}"))?, port))
}
