//! Ranks across the network: the point-to-point protocol of [`crate::plan::p2p`] carried over
//! UCX by a proxy thread per rank.
//!
//! A network peer's memory cannot be mapped, so the slots-and-counters contract of the CUDA IPC
//! path is kept, with the peer's scratch replaced by two pieces of this rank's own host memory
//! ([`NetMem`]; pinned and mapped into the device on a GPU, plain memory in the CPU tests):
//! * an **outbox**: where the plan's copy of chunk `k` into peer `q`'s scratch lands instead
//!   (the same slot, indexed by destination: [`outbox_offset`]), and a **posted** word per peer:
//!   the latest signal counter this rank's stream has issued to `q`;
//! * the rank's **scratch** (inbox) and a **flag** word per peer, exactly as with IPC: chunks
//!   from `q` land in `q`'s slots, and the flag holds the latest signal counter from `q`, which
//!   the stream waits on.
//!
//! The stream (a GPU stream, or host code in the tests) copies a chunk into the outbox, then
//! writes the posted word; the rank's [`proxy::Proxy`], which the executor handed the list of
//! signals the stream will post (which counter value carries which chunk), sees the word reach
//! a signal's value and sends a header and the chunk (straight from the outbox) to the peer's
//! proxy, which receives the chunk straight into its scratch and then raises its flag word for
//! the sender, in order. *Ready* and
//! *consumed* signals are messages without a chunk; they are the credits: a sender fills a slot
//! again only after the receiver's *consumed* of the chunk that last filled it. Over the network
//! the slots are carried from group to group ([`crate::plan::p2p::plan_net`]), so there are no
//! *ready* signals and a group's first chunks wait only for an earlier group's credits.
//!
//! Every wait is bounded (a send in flight, the closing handshake, [`proxy::Proxy::wait`]); a
//! lost peer (UCX's endpoint error handler) fails the proxy, which releases its worker, so that
//! the failure reaches every rank, and raises every flag and credit word by 2^62, so that no stream
//! waits forever (the host then reads [`proxy::Proxy::error`]); UCX's errors keep their text
//! ([`crate::Error::Network`]). UCX is loaded at run time ([`ucp`]); building ringccl needs
//! none.

mod carry;
pub mod pinned;
pub mod proxy;
pub mod ucp;

#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicU64;

use crate::{Error, Result};
pub use carry::{Carry, NET_SLOTS};
use proxy::Proxy;

/// A rank's side of the network path: its proxy (over its [`NetMem`]) and the per-pair signal
/// counters of its earlier groups.
#[derive(Debug)]
pub struct NetRank {
    /// This rank.
    pub rank: usize,
    /// The proxy, with the rank's memory ([`Proxy::mem`]).
    pub proxy: Proxy,
    /// Signals this rank has sent to each rank so far.
    pub sent: Vec<u64>,
    /// Signals each rank has sent to this rank so far.
    pub received: Vec<u64>,
    /// Where each pair's next chunks go and what frees their slots (`plan::p2p::plan_net`).
    pub carry: Carry,
    /// Set when a group failed half-issued: the counters no longer agree with the peers'.
    pub broken: bool,
}

impl NetRank {
    /// Rank `rank` of `nranks` with `proxy`, before its first group.
    pub fn new(rank: usize, nranks: usize, proxy: Proxy) -> NetRank {
        NetRank {
            rank,
            proxy,
            sent: vec![0; nranks],
            received: vec![0; nranks],
            carry: Carry::new(nranks, NET_SLOTS),
            broken: false,
        }
    }
}

/// A rank's memory of the network path: `nranks` flag words, `nranks` posted words, `nranks` credit words, then the
/// scratch (inbox) and the outbox, each of `scratch_bytes`. It owns its allocation (plain host
/// memory, or pinned memory mapped into a device: [`pinned::pinned`]), freed with the last
/// reference (the proxy holds one).
pub struct NetMem {
    base: *mut u8,
    nranks: usize,
    scratch_bytes: usize,
    /// The device address of `base`, for memory mapped into a device.
    device: Option<u64>,
    /// The allocation.
    _owner: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for NetMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetMem")
            .field("nranks", &self.nranks)
            .field("scratch_bytes", &self.scratch_bytes)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

// SAFETY: the counters are atomics; the slot bytes are written and read through raw pointers
// only, by one side at a time, as the protocol's counters order (module docs).
unsafe impl Send for NetMem {}
// SAFETY: as above.
unsafe impl Sync for NetMem {}

impl NetMem {
    /// Bytes of a `NetMem` for `nranks` ranks and `scratch_bytes` of scratch.
    pub fn bytes(nranks: usize, scratch_bytes: usize) -> Option<usize> {
        nranks
            .checked_mul(24)?
            .checked_add(scratch_bytes.checked_mul(2)?)
    }

    /// Zeroed host memory for `nranks` ranks with `scratch_bytes` of scratch (a multiple of 8).
    ///
    /// ```
    /// use ringccl::internals::transport::net::NetMem;
    /// let m = NetMem::new(2, 1024)?;
    /// assert_eq!(m.scratch_bytes(), 1024);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    // Ranks whose "stream" is host code (tests, tools) use plain memory.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn new(nranks: usize, scratch_bytes: usize) -> Result<NetMem> {
        let bytes = NetMem::bytes(nranks, scratch_bytes)
            .filter(|_| scratch_bytes.is_multiple_of(8) && nranks > 0)
            .ok_or_else(|| Error::Internal {
                reason: format!("network memory for {nranks} ranks and {scratch_bytes} bytes"),
            })?;
        let own: Box<[AtomicU64]> = (0..bytes / 8).map(|_| AtomicU64::new(0)).collect();
        Ok(NetMem {
            base: own.as_ptr() as *mut u8,
            nranks,
            scratch_bytes,
            device: None,
            _owner: Box::new(own),
        })
    }

    /// Memory at `base` (e.g. pinned host memory mapped into a device at `device`), laid out as
    /// above, kept alive by `owner` (dropped with the `NetMem`).
    ///
    /// # Safety
    /// `base` is 8-byte aligned, zeroed, and valid for reads and writes of
    /// [`NetMem::bytes`]`(nranks, scratch_bytes)` bytes until `owner` is dropped, and is not used
    /// otherwise; `scratch_bytes` is a multiple of 8.
    pub unsafe fn from_raw(
        base: *mut u8,
        nranks: usize,
        scratch_bytes: usize,
        device: Option<u64>,
        owner: Box<dyn Send + Sync>,
    ) -> NetMem {
        NetMem {
            base,
            nranks,
            scratch_bytes,
            device,
            _owner: owner,
        }
    }

    /// The device address of the memory's first byte, for memory mapped into a device.
    pub fn device_base(&self) -> Option<u64> {
        self.device
    }

    /// Ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Bytes of the scratch (and of the outbox).
    pub fn scratch_bytes(&self) -> usize {
        self.scratch_bytes
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        // SAFETY: callers pass `i < 3 * nranks`; the words are 8-aligned, inside the memory,
        // and only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(i * 8) as *mut u64) }
    }

    /// The latest signal counter from `peer` (written by the proxy, waited on by the stream).
    pub fn flag(&self, peer: usize) -> Option<&AtomicU64> {
        (peer < self.nranks).then(|| self.word(peer))
    }

    /// The latest signal counter this rank's stream issued to `peer` (read by the proxy).
    pub fn posted(&self, peer: usize) -> Option<&AtomicU64> {
        (peer < self.nranks).then(|| self.word(self.nranks + peer))
    }

    /// The counter of the latest credit (a signal without a chunk: *ready* or *consumed*) from
    /// `peer` up to which every credit from it has arrived (written by the proxy, waited on by
    /// the stream for credits). The flag word must wait for the peer's earlier chunks too,
    /// which in a transfer both ways are still on their way when the credit arrives.
    pub fn credit(&self, peer: usize) -> Option<&AtomicU64> {
        (peer < self.nranks).then(|| self.word(2 * self.nranks + peer))
    }

    /// Byte offset of the flag words, the posted words, the credit words, the scratch and the
    /// outbox.
    pub fn offsets(&self) -> [usize; 5] {
        let s = self.nranks * 24;
        [0, self.nranks * 8, self.nranks * 16, s, s + self.scratch_bytes]
    }

    fn range(&self, start: usize, at: usize, bytes: usize) -> Option<*mut u8> {
        let end = at.checked_add(bytes)?;
        // SAFETY: `start + end` is inside the memory (checked just before).
        (end <= self.scratch_bytes).then(|| unsafe { self.base.add(start + at) })
    }

    /// `bytes` of the scratch from `at`, if inside it.
    pub fn scratch_range(&self, at: usize, bytes: usize) -> Option<*mut u8> {
        self.range(self.offsets()[3], at, bytes)
    }

    /// `bytes` of the outbox from `at`, if inside it.
    pub fn outbox_range(&self, at: usize, bytes: usize) -> Option<*mut u8> {
        self.range(self.offsets()[4], at, bytes)
    }
}

/// Where in rank `me`'s outbox a plan's copy to `offset` of peer `peer`'s scratch goes, for
/// `slots` slots of `slot` bytes per region: the same slot, indexed by destination
/// (`(peer * slots + k % slots) * slot` rather than the plan's `(me * slots + k % slots) * slot`).
///
/// ```
/// use ringccl::internals::transport::net::outbox_offset;
/// // Rank 1 sends to rank 3, four slots per region: its region in rank 3's scratch starts at
/// // slot 4, and rank 3's region in rank 1's outbox at slot 12.
/// assert_eq!(outbox_offset(1, 3, 256, 4, 4 * 256 + 300), Some(12 * 256 + 300));
/// ```
pub fn outbox_offset(me: usize, peer: usize, slot: usize, slots: usize, offset: usize) -> Option<usize> {
    let region = slots.checked_mul(slot)?;
    let within = offset.checked_sub(me.checked_mul(region)?)?;
    if within >= region {
        return None;
    }
    peer.checked_mul(region)?.checked_add(within)
}
