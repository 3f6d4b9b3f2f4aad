//! Watching the mesh for a peer whose process is gone: a rank that ends normally sends every
//! peer a **goodbye** (a data frame with tag 4, [`Bootstrap::goodbye`](super::Bootstrap::goodbye))
//! before its connections close; a connection that closes (end of stream, reset) without one
//! means the peer's process exited or crashed. The kernel closes a killed process's sockets at
//! once, so this is seen within one poll, long before a timeout.
//!
//! The watcher peeks at the sockets (`recv` with `MSG_PEEK | MSG_DONTWAIT`: nothing is
//! consumed and the sockets' blocking mode, which the bootstrap's own reads use, is left
//! alone), so it can run in a thread of its own beside the bootstrap's calls.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::wire::{HEADER_LEN, KIND_DATA, MAGIC};
use super::OP_GOODBYE;

/// What a peek at one connection shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Open; nothing, or data of a bootstrap call, is waiting.
    Alive,
    /// The next frame is the peer's goodbye: it ended normally.
    Goodbye,
    /// Closed (end of stream or an error) with no goodbye before.
    Lost,
}

/// What a peek's result means: `Ok(bytes)` of the front of the stream (empty: end of stream),
/// or the kind of the `recv` error.
pub(crate) fn classify(peeked: Result<&[u8], std::io::ErrorKind>) -> Seen {
    match peeked {
        Ok([]) => Seen::Lost,
        Ok(b) => {
            let goodbye = b.len() > HEADER_LEN
                && b[..8] == MAGIC
                && b[10] == KIND_DATA
                && b[HEADER_LEN] == OP_GOODBYE;
            if goodbye {
                Seen::Goodbye
            } else {
                Seen::Alive
            }
        }
        Err(e) => match e {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Seen::Alive,
            _ => Seen::Lost,
        },
    }
}

/// Copies of a rank's connections to its peers, to watch ([`PeerSockets::poll`]).
#[derive(Debug)]
pub struct PeerSockets {
    socks: Vec<(usize, TcpStream)>,
}

impl PeerSockets {
    pub(super) fn new(socks: Vec<(usize, TcpStream)>) -> Self {
        PeerSockets { socks }
    }

    /// Peeks at every connection still watched, without waiting: the first peer whose
    /// connection closed without a goodbye, if any (it is watched no more). Peers that said
    /// goodbye are watched no more either.
    pub fn poll(&mut self) -> Option<usize> {
        let mut lost = None;
        self.socks.retain(|(peer, s)| {
            if lost.is_some() {
                return true;
            }
            match classify(peek(s).as_deref().map_err(std::io::Error::kind)) {
                Seen::Alive => true,
                Seen::Goodbye => false,
                Seen::Lost => {
                    lost = Some(*peer);
                    false
                }
            }
        });
        lost
    }

    /// How many peers are still watched.
    pub fn watched(&self) -> usize {
        self.socks.len()
    }
}

/// A thread that polls [`PeerSockets`] every few milliseconds and calls `on_lost` with the
/// first peer found gone; stopped (and joined) on drop.
///
/// ```
/// use std::time::Duration;
/// use ringccl::bootstrap::{Bootstrap, Watcher};
/// let id = ringccl::UniqueId::new_at("127.0.0.1:0".parse()?)?;
/// let b = Bootstrap::join(&id, 1, 0, Duration::from_secs(5))?;
/// let w = Watcher::spawn(b.peer_sockets()?, Duration::from_millis(10), |peer| {
///     eprintln!("rank {peer} is gone");
/// })?;
/// drop(w);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts the thread (`every`: the pause between polls).
    pub fn spawn(
        mut socks: PeerSockets,
        every: Duration,
        mut on_lost: impl FnMut(usize) + Send + 'static,
    ) -> crate::Result<Watcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ringccl-peer-watch".into())
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) && socks.watched() > 0 {
                    if let Some(peer) = socks.poll() {
                        on_lost(peer);
                        return;
                    }
                    std::thread::sleep(every);
                }
            })
            .map_err(|e| super::io_fail(None, "cannot start the peer watcher", &e))?;
        Ok(Watcher {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The first bytes waiting on `s` (empty: end of stream), without consuming them or waiting.
fn peek(s: &TcpStream) -> std::io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; HEADER_LEN + 1];
    // SAFETY: `buf` is a writable buffer of `buf.len()` bytes; the descriptor is `s`'s, open
    // while `s` is borrowed.
    let got = unsafe {
        libc::recv(
            s.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match usize::try_from(got) {
        Ok(n) => Ok(buf[..n.min(buf.len())].to_vec()),
        Err(_) => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::wire::frame;
    use crate::bootstrap::Bootstrap;
    use crate::UniqueId;
    use std::time::{Duration, Instant};

    #[test]
    fn peeks_are_classified() {
        let mut goodbye = frame(KIND_DATA, &[OP_GOODBYE]);
        assert_eq!(classify(Ok(&goodbye)), Seen::Goodbye);
        assert_eq!(classify(Ok(&[])), Seen::Lost);
        // Data of a call (all-gather) waiting: alive; half a header: alive.
        goodbye[HEADER_LEN] = 1;
        assert_eq!(classify(Ok(&goodbye)), Seen::Alive);
        assert_eq!(classify(Ok(&goodbye[..5])), Seen::Alive);
        assert_eq!(classify(Err(std::io::ErrorKind::WouldBlock)), Seen::Alive);
        assert_eq!(classify(Err(std::io::ErrorKind::ConnectionReset)), Seen::Lost);
    }

    /// A world of two ranks (threads); `end` decides how rank 1 leaves; returns what rank 0's
    /// watcher reports within 2 s, and the number of peers it still watches.
    fn watch_rank_1(end: impl FnOnce(Bootstrap) + Send) -> (Option<usize>, usize) {
        let id = UniqueId::new_at("127.0.0.1:0".parse().expect("an address")).expect("an id");
        std::thread::scope(|s| {
            let one = s.spawn(|| Bootstrap::join(&id, 2, 1, Duration::from_secs(5)).expect("join"));
            let b0 = Bootstrap::join(&id, 2, 0, Duration::from_secs(5)).expect("join");
            let b1 = one.join().expect("rank 1");
            let mut w = b0.peer_sockets().expect("the sockets");
            assert_eq!((w.poll(), w.watched()), (None, 1), "alive");
            // Data of a call waiting to be read is no loss.
            b1.send(0, b"x").expect("send");
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!((w.poll(), w.watched()), (None, 1), "pending data");
            assert_eq!(b0.recv(1).expect("recv"), b"x");
            end(b1);
            let t0 = Instant::now();
            loop {
                let got = w.poll();
                if got.is_some() || w.watched() == 0 || t0.elapsed() > Duration::from_secs(2) {
                    return (got, w.watched());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    }

    #[test]
    fn a_closed_connection_without_goodbye_is_a_lost_peer() {
        assert_eq!(watch_rank_1(drop), (Some(1), 0));
    }

    #[test]
    fn a_goodbye_is_no_loss() {
        assert_eq!(
            watch_rank_1(|b| {
                b.goodbye();
                drop(b);
            }),
            (None, 0)
        );
    }
}
