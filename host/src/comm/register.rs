//! `Communicator::register`: user buffers the peers in other processes read in place (see
//! [`crate::transport::registry`] for the exchange, the per-call lookup and the generation
//! check).

use super::Communicator;
use crate::driver::ipc::{IpcHandle, Mapped};
use crate::driver::registered::{allocation_of, ipc_handle_of};
use crate::driver::zc_counters;
use crate::resources::poll_until;
use crate::transport::registry::{decode_addrs, encode_addrs, owner_peers, Offer, OwnRegistration};
use crate::{Arg, Error, Result};

/// A buffer registered with a communicator ([`Communicator::register`]): while it lives, the
/// one-shot all-reduce among processes reads an input inside the buffer's allocation in place
/// in every peer (where [`crate::Config::zero_copy_reads`] is on), and a point-to-point
/// receive of more than 64 KiB into it on the point-to-point kernel is written by the sender
/// directly, with no staging copy. Dropping it (or [`Registered::deregister`]) undoes
/// the registration; like the registration, that is collective: every rank drops its
/// registrations in the same order, between the same calls.
#[derive(Debug)]
#[must_use = "dropping a registration deregisters the buffer (collectively)"]
pub struct Registered<'c> {
    comm: &'c Communicator,
    /// The registration's id among processes; `None` in a communicator of one process.
    id: Option<u64>,
}

impl<'c> Registered<'c> {
    /// The guard of registration `id` of `comm` (made by `Communicator::register`).
    pub(crate) fn new(comm: &'c Communicator, id: Option<u64>) -> Self {
        Registered { comm, id }
    }
}

impl Registered<'_> {
    /// Whether one-shot all-reduces read this rank's buffer in place: it lies in a
    /// communicator of processes, every peer mapped its allocation, and
    /// [`crate::Config::zero_copy_reads`] is on (the point-to-point receives into it are
    /// zero-copy whatever that switch says). A registration the driver refused (for
    /// example memory of a stream-ordered pool or a VMM allocation, which CUDA IPC cannot
    /// export) is kept, and its calls are staged.
    pub fn zero_copy(&self) -> bool {
        if !self.comm.config().zero_copy_reads {
            // The reads in place are switched off (`Config::zero_copy_reads`): every call
            // stages.
            return false;
        }
        let (Some(id), Some(p)) = (self.id, self.comm.process()) else {
            return false;
        };
        let mut st = p.lock();
        let found = st.windows.registry().own().any(|x| x.id == id && x.peers.is_some() && !x.stale);
        found
    }

    /// Deregisters the buffer (collective: every rank, in the same order), reporting an error
    /// the drop would only log.
    pub fn deregister(mut self) -> Result<()> {
        match self.id.take() {
            Some(id) => self.comm.deregister_id(id),
            None => Ok(()),
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            if let Err(e) = self.comm.deregister_id(id) {
                crate::debug::warn(format_args!("deregistering buffer registration {id}: {e}"));
            }
        }
    }
}

/// The id of a registration made with [`Communicator::register_raw`] (the form without a
/// guard, for foreign-function callers that keep the registration in a table of their own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegistrationId(pub u64);

impl Communicator {
    /// Registers `bytes` at device address `ptr` like [`Communicator::register`] (collective),
    /// without a guard: the caller undoes it with [`Communicator::deregister_raw`] (collective,
    /// same order). `None` in a communicator of one process (nothing to map). Registering
    /// reads no memory; the generation check makes a registration of freed memory harmless.
    ///
    /// ```no_run
    /// # fn main() -> ringccl::Result<()> {
    /// # let (comm, ptr): (ringccl::Communicator, u64) = todo!();
    /// let id = comm.register_raw(ptr, 1 << 20)?;
    /// if let Some(id) = id {
    ///     comm.deregister_raw(id)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn register_raw(&self, ptr: u64, bytes: usize) -> Result<Option<RegistrationId>> {
        Ok(self.register_bytes(ptr, bytes)?.map(RegistrationId))
    }

    /// Undoes a registration of [`Communicator::register_raw`] (collective, in registration
    /// order); see [`Registered::deregister`].
    pub fn deregister_raw(&self, id: RegistrationId) -> Result<()> {
        self.deregister_id(id.0)
    }


    /// Registers `bytes` at device address `ptr` (see [`Communicator::register`]): the id
    /// among processes, `None` in a communicator of one process.
    pub(crate) fn register_bytes(&self, ptr: u64, bytes: usize) -> Result<Option<u64>> {
        if ptr == 0 || bytes == 0 {
            return Err(Error::invalid(
                None,
                Arg::Send,
                format!("cannot register {bytes} bytes at address {ptr:#x}"),
            ));
        }
        let Some(p) = self.process() else {
            return Ok(None);
        };
        let call = self.process_call(p);
        let health = call.health;
        health.check()?;
        let mut st = call.state;
        let (r, n) = (st.rank, st.sent.len());
        let ctx = st.windows.context().clone();
        let found = allocation_of(&ctx, ptr).and_then(|a| {
            let end = ptr.checked_add(bytes as u64);
            if end.is_none_or(|e| e > a.base + a.bytes) {
                return Err(format!(
                    "{bytes} bytes at {ptr:#x} run past their allocation ({} bytes at {:#x})",
                    a.bytes, a.base
                ));
            }
            Ok((a, ipc_handle_of(&ctx, a.base)?))
        });
        let offer = match &found {
            Ok((a, handle)) => Offer {
                ok: true,
                pid: std::process::id(),
                base: a.base,
                bytes: a.bytes,
                handle: *handle,
            },
            Err(why) => {
                crate::debug::warn(format_args!(
                    "rank {r}: the buffer at {ptr:#x} stays unregistered (its calls are staged): \
                     {why}"
                ));
                Offer {
                    ok: false,
                    pid: std::process::id(),
                    base: 0,
                    bytes: 0,
                    handle: [0; 64],
                }
            }
        };
        // From the first exchange on, a failure leaves the ranks' exchanges out of step: the
        // communicator is failed.
        let fail = |e: Error| {
            health.fail(e.clone());
            e
        };
        let all = call.exchange.all_gather(&offer.encode()).map_err(fail)?;
        if all.len() != n {
            return Err(fail(Error::Internal {
                reason: format!("{} ranks answered the registration exchange, not {n}", all.len()),
            }));
        }
        let mut addrs = vec![0u64; n];
        let mut mapped: Vec<Mapped> = Vec::new();
        for (q, b) in all.iter().enumerate() {
            let o = Offer::decode(b).ok_or_else(|| {
                fail(Error::Internal {
                    reason: format!("rank {q} sent a malformed registration"),
                })
            })?;
            if !o.ok {
                continue;
            }
            if q == r || st.windows.same_process(q) {
                addrs[q] = o.base;
                continue;
            }
            if st.windows.is_remote(q) {
                continue;
            }
            zc_counters::ipc_open();
            match IpcHandle(o.handle).open(&ctx, Some(r)) {
                Ok(m) => {
                    addrs[q] = m.ptr();
                    mapped.push(m);
                }
                Err(e) => crate::debug::warn(format_args!(
                    "rank {r}: rank {q}'s registered buffer could not be mapped ({e}); its calls \
                     are staged"
                )),
            }
        }
        let all = call.exchange.all_gather(&encode_addrs(&addrs)).map_err(fail)?;
        let mut rows = Vec::with_capacity(n);
        for (q, b) in all.iter().enumerate() {
            rows.push(decode_addrs(b, n).ok_or_else(|| {
                fail(Error::Internal {
                    reason: format!("rank {q} sent malformed registration addresses"),
                })
            })?);
        }
        let own = found.ok().map(|(a, _)| OwnRegistration {
            id: 0,
            base: a.base,
            bytes: a.bytes,
            buffer_id: a.buffer_id,
            peers: owner_peers(&rows, r),
            stale: false,
        });
        Ok(Some(st.windows.registry().insert(own, mapped)))
    }

    /// Undoes registration `id` (collective, in registration order): waits for this rank's
    /// previous call (its kernels may read the peers' registered buffers), then closes the
    /// mappings, or keeps them until the windows are released if a CUDA graph captured a call
    /// or the wait failed.
    pub(crate) fn deregister_id(&self, id: u64) -> Result<()> {
        let Some(p) = self.process() else {
            return Ok(());
        };
        let call = self.process_call(p);
        let (health, mut st) = (call.health, call.state);
        let rank = st.rank;
        let done = poll_until(health.timeout(), || match st.order.end().try_is_complete() {
            Ok(true) => Ok(Some(())),
            Ok(false) => {
                health.check()?;
                Ok(None)
            }
            Err(e) => Err(Error::cuda("cuEventQuery", Some(rank), e)),
        });
        let keep = st.windows.captured() || !matches!(done, Ok(Some(())));
        if !st.windows.registry().remove(id, keep) {
            return Err(Error::invalid(
                Some(rank),
                Arg::Send,
                format!("no buffer registration {id} in this communicator"),
            ));
        }
        match done {
            Ok(Some(())) => Ok(()),
            Ok(None) => Err(Error::Timeout {
                rank: Some(rank),
                peer: None,
                what: "the previous call before deregistering a buffer".into(),
            }),
            Err(e) => Err(e),
        }
    }
}
