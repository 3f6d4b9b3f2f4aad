#![cfg_attr(not(feature = "internals"), allow(dead_code))]
//! Registered user buffers of a rank among processes: which of this rank's allocations every
//! peer has mapped (so that the one-shot kernel's peers read this rank's input in place, with
//! no staging copy), and this process's mappings of the peers' registered allocations.
//!
//! **Registration** (`Communicator::register`, `ncclCommWindowRegister`) is collective: every
//! rank registers one buffer at the same point, in the same order, and the n-th registration
//! has the id `n` on every rank. Each rank finds its buffer's allocation (base and size with
//! `cuMemGetAddressRange`, its buffer id with `cuPointerGetAttribute(BUFFER_ID)`: a number the
//! driver never reuses in the process) and its IPC handle (`cuIpcGetMemHandle`; the driver
//! refuses memory of stream-ordered pools and VMM (`cuMemCreate`) allocations: that rank's
//! registration is then kept unmapped, with the reason logged); the ranks all-gather the
//! handles, each maps the peers' allocations (`cuIpcOpenMemHandle`), and a second all-gather
//! tells each owner where every peer mapped its allocation. An allocation every peer mapped
//! gives zero-copy; any other is staged as before.
//!
//! **Per call** the executor looks up the call's input in a sorted map of this rank's
//! registered allocations ([`Registry::publish_for`]): nothing is asked of the driver unless
//! the input lies inside a registered range; then one `cuPointerGetAttribute(BUFFER_ID)`
//! checks that the allocation is still the one registered (freed and re-allocated at the same
//! address, it has another id): a stale registration is never used again and the call is
//! staged. The ranks need not agree on which inputs are registered: each kernel publishes, per
//! peer, where that peer reads its input (`gpu_kernels::oneshot::PUBLISHED`).
//!
//! **Deregistration** is collective too (same order): each rank waits for the end of its
//! previous call (its kernels no longer read the peers' registered buffers), forgets its own
//! allocation and closes its mappings of the peers'. Once a CUDA graph captured a call of the
//! communicator, the mappings are kept until the communicator's windows are released instead
//! (a replay may still read them).

use std::collections::BTreeMap;

use crate::driver::ipc::Mapped;
use gpu_kernels::oneshot::MAX_RANKS;

/// One of this rank's registered allocations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnRegistration {
    /// The registration's id (the same on every rank: registrations are collective).
    pub id: u64,
    /// The allocation's base address in this process.
    pub base: u64,
    /// The allocation's size in bytes.
    pub bytes: u64,
    /// The driver's buffer id of the allocation when it was registered.
    pub buffer_id: u64,
    /// Per rank, where that rank mapped the allocation (this rank: `base`); `None` when some
    /// peer could not map it (the calls on it are staged).
    pub peers: Option<Vec<u64>>,
    /// The allocation was freed (and maybe re-allocated) since: never used again.
    pub stale: bool,
}

/// What a call's input is, for the one-shot kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Not inside a usable registered allocation: stage it into the scratch.
    Staged,
    /// Registered: per rank `q`, where `q` reads it in its own process (this rank's entry is
    /// the input itself), the kernel's `publish` argument.
    ZeroCopy([u64; MAX_RANKS]),
}

/// A rank's registered buffers and its mappings of the peers' (see the module docs).
#[derive(Debug, Default)]
pub struct Registry {
    /// This rank's registrations by `(base, id)`.
    own: BTreeMap<(u64, u64), OwnRegistration>,
    /// This process's mappings of the peers' allocations, per registration id.
    mapped: Vec<(u64, Vec<Mapped>)>,
    /// Mappings of deregistered allocations kept for CUDA graphs.
    kept: Vec<Mapped>,
    /// The next registration's id.
    next_id: u64,
    /// The ids registered and not deregistered (the same on every rank, exported or not).
    live: Vec<u64>,
}

impl Registry {
    /// The id the next registration gets (registrations are collective: the same on every
    /// rank).
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Records a registration: this rank's allocation `own` (`None`: it could not be exported)
    /// and this process's mappings of the peers' allocations of the same registration. Returns
    /// its id.
    pub fn insert(&mut self, own: Option<OwnRegistration>, mapped: Vec<Mapped>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.live.push(id);
        if let Some(mut own) = own {
            own.id = id;
            self.own.insert((own.base, id), own);
        }
        if !mapped.is_empty() {
            self.mapped.push((id, mapped));
        }
        id
    }

    /// Forgets registration `id`; its mappings of the peers' allocations are closed, or kept
    /// until the registry is dropped when `keep` (a CUDA graph may replay a call on them).
    /// Whether `id` was known.
    pub fn remove(&mut self, id: u64, keep: bool) -> bool {
        self.live.retain(|&i| i != id);
        let before = self.own.len();
        self.own.retain(|&(_, i), _| i != id);
        let mut found = self.own.len() != before;
        if let Some(at) = self.mapped.iter().position(|(i, _)| *i == id) {
            let (_, maps) = self.mapped.swap_remove(at);
            found = true;
            if keep {
                self.kept.extend(maps);
            }
        }
        found || id < self.next_id
    }

    /// This rank's registrations (for diagnostics and tests).
    pub fn own(&self) -> impl Iterator<Item = &OwnRegistration> {
        self.own.values()
    }

    /// Whether any registration is live (made and not undone), on any rank: registrations are
    /// collective, so every rank answers alike between the same calls, whether or not its own
    /// buffer could be exported. Point-to-point transfers are then posted
    /// (`gpu_kernels::p2p::kind::POSTED`).
    pub fn has_live(&self) -> bool {
        !self.live.is_empty()
    }

    /// Whether nothing of this rank is registered (the per-call lookup is then free).
    pub fn is_empty(&self) -> bool {
        self.own.is_empty()
    }

    /// Leaks the mappings of the peers' allocations (never closed: this rank's work on them
    /// may not have ended).
    pub fn leak_mappings(&mut self) {
        std::mem::forget(std::mem::take(&mut self.mapped));
        std::mem::forget(std::mem::take(&mut self.kept));
    }

    /// Where every rank reads this rank's input of `bytes` at `ptr` (rank `rank` of `nranks`):
    /// [`Input::ZeroCopy`] if it lies inside a registered allocation that every peer mapped
    /// and that is still the one registered. `buffer_id(base)` is the driver's current buffer
    /// id of the allocation at `base` (`None`: freed), asked only when `ptr` hits a registered
    /// range; a registration whose id changed is marked stale, with a warning, and never used
    /// again.
    pub fn publish_for(
        &mut self,
        ptr: u64,
        bytes: u64,
        rank: usize,
        nranks: usize,
        mut buffer_id: impl FnMut(u64) -> Option<u64>,
    ) -> Input {
        if self.own.is_empty() || nranks > MAX_RANKS || rank >= nranks || bytes == 0 {
            return Input::Staged;
        }
        let Some(end) = ptr.checked_add(bytes) else {
            return Input::Staged;
        };
        for (_, reg) in self.own.range_mut(..=(ptr, u64::MAX)).rev() {
            let inside = reg.base <= ptr && reg.base.checked_add(reg.bytes).is_some_and(|e| end <= e);
            if !inside || reg.stale {
                continue;
            }
            let Some(peers) = reg.peers.as_ref().filter(|p| p.len() == nranks) else {
                continue;
            };
            if buffer_id(reg.base) != Some(reg.buffer_id) {
                reg.stale = true;
                crate::debug::warn(format_args!(
                    "rank {rank}: the registered allocation at {:#x} ({} bytes, registration {}) \
                     was freed since it was registered; calls on that range are staged (register \
                     the new buffer to read it in place)",
                    reg.base, reg.bytes, reg.id
                ));
                continue;
            }
            let offset = ptr - reg.base;
            let mut out = [0u64; MAX_RANKS];
            for (q, (slot, &at)) in out.iter_mut().zip(peers).enumerate() {
                *slot = if q == rank { ptr } else { at + offset };
            }
            return Input::ZeroCopy(out);
        }
        Input::Staged
    }
}

/// What a rank publishes about its allocation of one registration (first all-gather).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    /// Whether the allocation can be mapped (`handle` valid).
    pub ok: bool,
    /// The owner's process id (a peer of the same process uses `base` directly).
    pub pid: u32,
    /// The allocation's base in the owner's process.
    pub base: u64,
    /// Its size.
    pub bytes: u64,
    /// Its IPC handle.
    pub handle: [u8; 64],
}

const OFFER_BYTES: usize = 1 + 4 + 8 + 8 + 64;

impl Offer {
    /// The bytes exchanged.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(OFFER_BYTES);
        v.push(u8::from(self.ok));
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.base.to_le_bytes());
        v.extend_from_slice(&self.bytes.to_le_bytes());
        v.extend_from_slice(&self.handle);
        v
    }

    /// The offer in `b`, `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<Offer> {
        if b.len() != OFFER_BYTES {
            return None;
        }
        let u64_at = |i: usize| b.get(i..i + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes);
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[21..85]);
        Some(Offer {
            ok: b[0] == 1,
            pid: u32::from_le_bytes(b[1..5].try_into().ok()?),
            base: u64_at(5)?,
            bytes: u64_at(13)?,
            handle,
        })
    }
}

/// The second all-gather: where this rank mapped every rank's allocation (0: not mapped).
pub fn encode_addrs(addrs: &[u64]) -> Vec<u8> {
    addrs.iter().flat_map(|a| a.to_le_bytes()).collect()
}

/// The addresses of [`encode_addrs`], `None` if malformed.
pub fn decode_addrs(b: &[u8], nranks: usize) -> Option<Vec<u64>> {
    if b.len() != nranks * 8 {
        return None;
    }
    Some(
        b.chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect(),
    )
}

/// Where every rank mapped `owner`'s allocation, from every rank's second all-gather: `None`
/// unless every peer mapped it.
pub fn owner_peers(all: &[Vec<u64>], owner: usize) -> Option<Vec<u64>> {
    let v: Vec<u64> = all.iter().map(|a| a.get(owner).copied().unwrap_or(0)).collect();
    v.iter().all(|&a| a != 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(base: u64, bytes: u64, buffer_id: u64, peers: Option<Vec<u64>>) -> OwnRegistration {
        OwnRegistration {
            id: 0,
            base,
            bytes,
            buffer_id,
            peers,
            stale: false,
        }
    }

    #[test]
    fn an_empty_registry_asks_the_driver_nothing() {
        let mut r = Registry::default();
        let mut asked = 0;
        let got = r.publish_for(0x1000, 64, 0, 2, |_| {
            asked += 1;
            Some(1)
        });
        assert_eq!(got, Input::Staged);
        assert_eq!(asked, 0);
    }

    #[test]
    fn a_registered_range_publishes_each_peers_mapping_plus_the_offset() {
        let mut r = Registry::default();
        let id = r.insert(Some(reg(0x10_0000, 0x1000, 7, Some(vec![0x10_0000, 0xa0_0000]))), Vec::new());
        assert_eq!(id, 0);
        let got = r.publish_for(0x10_0100, 0x100, 0, 2, |b| (b == 0x10_0000).then_some(7));
        let mut want = [0u64; MAX_RANKS];
        want[0] = 0x10_0100;
        want[1] = 0xa0_0100;
        assert_eq!(got, Input::ZeroCopy(want));
        // Past the allocation's end, or straddling it: staged, without a driver query.
        let mut asked = 0;
        for (p, n) in [(0x10_0f00, 0x200), (0x10_1000, 8), (0xf_ff00, 0x200)] {
            let got = r.publish_for(p, n, 0, 2, |_| {
                asked += 1;
                Some(7)
            });
            assert_eq!(got, Input::Staged, "{p:#x}+{n}");
        }
        assert_eq!(asked, 0);
    }

    #[test]
    fn a_freed_and_reallocated_range_is_never_used_again() {
        let mut r = Registry::default();
        r.insert(Some(reg(0x2000, 0x1000, 5, Some(vec![0x2000, 0x9000]))), Vec::new());
        assert!(matches!(r.publish_for(0x2000, 8, 0, 2, |_| Some(5)), Input::ZeroCopy(_)));
        // Another allocation at the same address: another buffer id.
        assert_eq!(r.publish_for(0x2000, 8, 0, 2, |_| Some(6)), Input::Staged);
        assert!(r.own().all(|x| x.stale));
        // Even if the id came back (it never does), the stale entry stays unused.
        assert_eq!(r.publish_for(0x2000, 8, 0, 2, |_| Some(5)), Input::Staged);
        // Freed and not re-allocated: the query fails.
        let mut r = Registry::default();
        r.insert(Some(reg(0x2000, 0x1000, 5, Some(vec![0x2000, 0x9000]))), Vec::new());
        assert_eq!(r.publish_for(0x2000, 8, 0, 2, |_| None), Input::Staged);
    }

    #[test]
    fn a_re_registration_over_a_stale_one_is_found() {
        let mut r = Registry::default();
        r.insert(Some(reg(0x2000, 0x1000, 5, Some(vec![0x2000, 0x9000]))), Vec::new());
        assert_eq!(r.publish_for(0x2000, 8, 1, 2, |_| Some(6)), Input::Staged);
        r.insert(Some(reg(0x2000, 0x800, 6, Some(vec![0x7000, 0x2000]))), Vec::new());
        let got = r.publish_for(0x2010, 8, 1, 2, |_| Some(6));
        let mut want = [0u64; MAX_RANKS];
        want[0] = 0x7010;
        want[1] = 0x2010;
        assert_eq!(got, Input::ZeroCopy(want));
    }

    #[test]
    fn a_registration_some_peer_could_not_map_is_staged() {
        let mut r = Registry::default();
        r.insert(Some(reg(0x2000, 0x1000, 5, None)), Vec::new());
        assert_eq!(r.publish_for(0x2000, 8, 0, 2, |_| Some(5)), Input::Staged);
        // Nor is a registration recorded for another rank count used.
        let mut r = Registry::default();
        r.insert(Some(reg(0x2000, 0x1000, 5, Some(vec![0x2000, 1]))), Vec::new());
        assert_eq!(r.publish_for(0x2000, 8, 0, 3, |_| Some(5)), Input::Staged);
    }

    #[test]
    fn ids_follow_the_order_of_registration_even_unmapped_ones() {
        let mut r = Registry::default();
        assert_eq!(r.insert(None, Vec::new()), 0);
        assert_eq!(r.insert(Some(reg(0x100, 8, 1, None)), Vec::new()), 1);
        assert_eq!(r.next_id(), 2);
        assert!(r.has_live());
        assert!(r.remove(1, false));
        assert!(r.is_empty());
        assert!(r.has_live(), "registration 0 is live though this rank could not export it");
        assert!(r.remove(0, false), "an unmapped registration is known too");
        assert!(!r.has_live());
        assert!(!r.remove(9, false));
    }

    #[test]
    fn offers_and_addresses_round_trip() {
        let o = Offer {
            ok: true,
            pid: 42,
            base: 0xdead_beef_0000,
            bytes: 1 << 20,
            handle: [3; 64],
        };
        assert_eq!(Offer::decode(&o.encode()), Some(o));
        assert_eq!(Offer::decode(&[0; 3]), None);
        let a = vec![1, 0, u64::MAX];
        assert_eq!(decode_addrs(&encode_addrs(&a), 3), Some(a));
        assert_eq!(decode_addrs(&[0; 7], 1), None);
    }

    #[test]
    fn an_owner_is_zero_copy_only_if_every_peer_mapped_it() {
        // Rows: what each rank mapped of every rank's allocation.
        let all = vec![vec![0x10, 0x21, 0x32], vec![0x11, 0x20, 0], vec![0x12, 0x22, 0x30]];
        assert_eq!(owner_peers(&all, 0), Some(vec![0x10, 0x11, 0x12]));
        assert_eq!(owner_peers(&all, 1), Some(vec![0x21, 0x20, 0x22]));
        assert_eq!(owner_peers(&all, 2), None, "rank 1 could not map rank 2's allocation");
    }
}
