//! Ranks in other processes: each rank's communication buffers, exported once and mapped by its
//! peers ([`Windows`]).
//!
//! Each rank allocates, with plain `cuMemAlloc` (what CUDA IPC exports):
//! * a **flag area** of [`FLAG_BYTES`]: word `p` holds the latest signal count rank `p` wrote
//!   there ([`crate::plan::signals`]), then the one-shot all-reduce's flag array, then the
//!   two-shot all-reduce's flag region; fixed size, exchanged once;
//! * a **scratch** buffer: the only memory of a rank that its peers read and write (shadows of
//!   the caller's buffers, partial results: see [`crate::schedule::through_scratch`]). It grows with the
//!   calls; growing is collective (every rank runs the same calls, so every rank grows at the
//!   same call) and costs a blocking exchange, so it doubles.
//!
//! Peers in another process open the buffers through their IPC handles once per size
//! (milliseconds each); peers in the same process use the address directly, with peer access.
//! The exchange goes through an [`Exchange`] (the communicator's bootstrap).

use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::driver::ipc::{DeviceAlloc, IpcHandle, Mapped};
use crate::driver::{can_access_peer, enable_peer_access};
use crate::{Error, Result};

/// Bytes of a rank's flag area: one 8-byte signal word per possible peer, then the one-shot
/// all-reduce's flag array (`gpu_kernels::oneshot::FLAG_WORDS` words), then the two-shot
/// all-reduce's flag region (`TWO_SHOT_FLAG_WORDS` words).
pub const FLAG_BYTES: usize =
    SIGNAL_BYTES + (gpu_kernels::oneshot::FLAG_WORDS + gpu_kernels::oneshot::TWO_SHOT_FLAG_WORDS) * 8;

/// Bytes of the signal words at the start of a flag area.
pub const SIGNAL_BYTES: usize = MAX_PROCESS_RANKS * 8;

/// The most ranks a communicator of processes supports (the flag area's words).
pub const MAX_PROCESS_RANKS: usize = 1024;

/// Smallest scratch buffer of a communicator of processes. Point-to-point groups move data in
/// chunks of a quarter of it between two ranks (`crate::plan::p2p::slot_bytes` with
/// `IPC_SLOTS`), and each chunk costs a copy, a signal and a wait on the stream (about 21 µs on
/// 2 × H200), so it is sized for 8 MiB chunks: send/recv between two GPUs then reached
/// 170–174 GB/s from 16 MiB, against 35–41 GB/s with smaller chunks (docs/PERFORMANCE.md).
pub const MIN_SCRATCH_BYTES: usize = 32 << 20;

/// The all-gather the buffers are exchanged with (a communicator's bootstrap).
pub trait Exchange {
    /// Every rank's `mine`, in rank order (collective).
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
}

/// What a rank publishes about one of its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Published {
    pid: u32,
    /// The device's streaming multiprocessors (the two-shot kernel's grid is the same on every
    /// rank: at most one block per SM of the smallest GPU).
    sms: u32,
    machine: u64,
    ordinal: u32,
    ptr: u64,
    bytes: u64,
    handle: IpcHandle,
}

const PUBLISHED_BYTES: usize = 4 + 4 + 8 + 4 + 8 + 8 + 64;

impl Published {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PUBLISHED_BYTES);
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.sms.to_le_bytes());
        v.extend_from_slice(&self.machine.to_le_bytes());
        v.extend_from_slice(&self.ordinal.to_le_bytes());
        v.extend_from_slice(&self.ptr.to_le_bytes());
        v.extend_from_slice(&self.bytes.to_le_bytes());
        v.extend_from_slice(&self.handle.0);
        v
    }

    fn decode(b: &[u8], rank: usize) -> Result<Self> {
        if b.len() != PUBLISHED_BYTES {
            return Err(Error::Internal {
                reason: format!("rank {rank} published {} bytes, not {PUBLISHED_BYTES}", b.len()),
            });
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[36..100]);
        Ok(Published {
            pid: u32_at(0),
            sms: u32_at(4),
            machine: u64_at(8),
            ordinal: u32_at(16),
            ptr: u64_at(20),
            bytes: u64_at(28),
            handle: IpcHandle(handle),
        })
    }
}

/// The identifier of the machine a rank counts as on: a hash of `host_id` if given
/// ([`crate::Config::host_id`]), else of this machine's current boot id (ranks on one machine
/// share it). CUDA IPC works only between processes of one machine; ranks whose identifiers
/// differ are reached only over the network.
///
/// ```
/// use ringccl::internals::transport::ipc::machine_id;
/// assert_eq!(machine_id(None), machine_id(None));
/// assert_ne!(machine_id(Some("node-a")), machine_id(Some("node-b")));
/// ```
pub fn machine_id(host_id: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    let id = match host_id {
        Some(id) => format!("host-id:{id}"),
        None => std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .or_else(|_| std::fs::read_to_string("/etc/machine-id"))
            .unwrap_or_default(),
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.trim().hash(&mut h);
    h.finish()
}

/// A peer's buffer as this process reaches it.
#[derive(Debug)]
enum Reach {
    /// This rank's own buffer.
    Own,
    /// A buffer of another rank of this process (peer access).
    Direct,
    /// A buffer of another process, mapped (unmapped when dropped).
    Mapped { _mapping: Mapped },
    /// A buffer of a process on another machine: not reachable (address 0); only the network
    /// transport reaches that rank.
    Remote,
}

/// One exchanged buffer of every rank, as this process reaches it.
#[derive(Debug)]
struct Shared {
    own: DeviceAlloc,
    reach: Vec<Reach>,
    /// Every rank's buffer address in this process.
    addr: Vec<u64>,
    /// Every rank's machine identifier ([`machine_id`]).
    machines: Vec<u64>,
    /// Every rank's device's SM count.
    sms: Vec<u32>,
    /// Every rank's device ordinal.
    ordinals: Vec<u32>,
}

impl Shared {
    /// Allocates this rank's buffer of `bytes`, exchanges it and maps every peer's (those on
    /// another machine are left unmapped if `remote_ok`, else an error).
    fn exchange(
        ctx: &Arc<CudaContext>,
        rank: usize,
        bytes: usize,
        ex: &dyn Exchange,
        (machine, remote_ok): (u64, bool),
    ) -> Result<Self> {
        let r = Some(rank);
        let own = DeviceAlloc::zeroed(ctx, bytes, r)?;
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::cuda("cuDeviceGetAttribute", r, e))?;
        let mine = Published {
            pid: std::process::id(),
            sms: u32::try_from(sms).unwrap_or(1).max(1),
            machine,
            ordinal: ctx.ordinal() as u32,
            ptr: own.ptr(),
            bytes: own.bytes() as u64,
            handle: own.ipc_handle(r)?,
        };
        let all = ex.all_gather(&mine.encode())?;
        let mut reach = Vec::with_capacity(all.len());
        let mut addr = Vec::with_capacity(all.len());
        let mut machines = Vec::with_capacity(all.len());
        let mut sms = Vec::with_capacity(all.len());
        let mut ordinals = Vec::with_capacity(all.len());
        for (q, b) in all.iter().enumerate() {
            let p = Published::decode(b, q)?;
            machines.push(p.machine);
            sms.push(p.sms);
            ordinals.push(p.ordinal);
            if q == rank {
                reach.push(Reach::Own);
                addr.push(own.ptr());
                continue;
            }
            if p.machine != mine.machine && remote_ok {
                reach.push(Reach::Remote);
                addr.push(0);
                continue;
            }
            if p.machine != mine.machine {
                return Err(Error::Kernel {
                    reason: format!(
                        "rank {q} runs on another machine: ranks of one communicator must share \
                         a machine (CUDA IPC)"
                    ),
                });
            }
            let peer_ordinal = p.ordinal as usize;
            if peer_ordinal != ctx.ordinal() && !can_access_peer(ctx.ordinal(), peer_ordinal)? {
                return Err(Error::Kernel {
                    reason: format!(
                        "device {} cannot access device {peer_ordinal} (rank {q}) directly",
                        ctx.ordinal()
                    ),
                });
            }
            if p.pid == mine.pid {
                if peer_ordinal != ctx.ordinal() {
                    let peer_ctx = CudaContext::new(peer_ordinal)
                        .map_err(|e| Error::cuda("cuDevicePrimaryCtxRetain", Some(q), e))?;
                    enable_peer_access(ctx, &peer_ctx)?;
                }
                reach.push(Reach::Direct);
                addr.push(p.ptr);
            } else {
                let m = p.handle.open(ctx, r)?;
                addr.push(m.ptr());
                reach.push(Reach::Mapped { _mapping: m });
            }
        }
        Ok(Shared {
            own,
            reach,
            addr,
            machines,
            sms,
            ordinals,
        })
    }
}

/// Every rank's flag area and scratch, as this process reaches them.
#[derive(Debug)]
pub struct Windows {
    ctx: Arc<CudaContext>,
    rank: usize,
    flags: Shared,
    scratch: Shared,
    /// This rank's machine identifier, and whether ranks on other machines are allowed (left
    /// unmapped).
    locality: (u64, bool),
}

impl Windows {
    /// Allocates this rank's flag area and first scratch and maps every peer's (collective).
    /// `machine` is this rank's machine identifier ([`machine_id`]); ranks with another one are
    /// an error, unless `remote_ok`: then they are left unmapped ([`Windows::remote_peer`]),
    /// for the network transport to reach.
    pub fn connect(
        ctx: &Arc<CudaContext>,
        rank: usize,
        nranks: usize,
        ex: &dyn Exchange,
        (machine, remote_ok): (u64, bool),
    ) -> Result<Self> {
        if nranks > MAX_PROCESS_RANKS {
            return Err(Error::invalid(
                None,
                crate::Arg::Ranks,
                format!("{nranks} ranks: a communicator of processes has at most {MAX_PROCESS_RANKS}"),
            ));
        }
        let locality = (machine, remote_ok);
        let flags = Shared::exchange(ctx, rank, FLAG_BYTES, ex, locality)?;
        let scratch = Shared::exchange(ctx, rank, MIN_SCRATCH_BYTES, ex, locality)?;
        if flags.addr.len() != nranks || scratch.addr.len() != nranks {
            return Err(Error::Internal {
                reason: format!("{} ranks answered the exchange, not {nranks}", flags.addr.len()),
            });
        }
        Ok(Windows {
            ctx: ctx.clone(),
            rank,
            flags,
            scratch,
            locality,
        })
    }

    /// The first rank this process cannot map (on another machine), if any.
    pub fn remote_peer(&self) -> Option<usize> {
        self.scratch.reach.iter().position(|r| matches!(r, Reach::Remote))
    }

    /// Whether rank `q` is on another machine (reached only over the network).
    pub fn is_remote(&self, q: usize) -> bool {
        matches!(self.scratch.reach.get(q), Some(Reach::Remote))
    }

    /// Every rank's machine identifier, in rank order (the same list on every rank).
    pub fn machines(&self) -> &[u64] {
        &self.flags.machines
    }

    /// The address, in this process, of the flag word rank `from` signals rank `to` with.
    pub fn flag(&self, to: usize, from: usize) -> Option<u64> {
        self.flags.addr.get(to).map(|base| base + 8 * from as u64)
    }

    /// The address, in this process, of rank `q`'s one-shot flag array.
    pub fn oneshot_flags(&self, q: usize) -> Option<u64> {
        self.flags.addr.get(q).map(|base| base + SIGNAL_BYTES as u64)
    }

    /// The address, in this process, of rank `q`'s two-shot flag region.
    pub fn twoshot_flags(&self, q: usize) -> Option<u64> {
        let at = SIGNAL_BYTES + gpu_kernels::oneshot::FLAG_WORDS * 8;
        self.flags.addr.get(q).map(|base| base + at as u64)
    }

    /// The SMs a two-shot kernel may fill on every rank's device (the same answer on every
    /// rank): the fewest SMs of any rank's device, divided by the most ranks that share one
    /// device (processes on one GPU, under MPS), so that every block of every rank can be
    /// resident at once (each block waits at its barriers for the peers' same-numbered
    /// blocks).
    pub fn two_shot_sms(&self) -> u32 {
        let f = &self.flags;
        let min = f.sms.iter().copied().min().unwrap_or(1);
        let share = (0..f.ordinals.len())
            .map(|q| {
                (0..f.ordinals.len())
                    .filter(|&p| f.ordinals[p] == f.ordinals[q] && f.machines[p] == f.machines[q])
                    .count()
            })
            .max()
            .unwrap_or(1);
        (min / u32::try_from(share).unwrap_or(u32::MAX).max(1)).max(1)
    }

    /// Every rank's scratch address in this process.
    pub fn scratch(&self) -> &[u64] {
        &self.scratch.addr
    }

    /// Bytes of every rank's scratch now.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.own.bytes()
    }

    /// Grows every rank's scratch to at least `bytes` (collective: every rank calls it at the
    /// same call with the same `bytes`). The caller has waited for this rank's previous call
    /// to end (every peer's use of this rank's buffer, and this rank's use of the peers', ends
    /// before it). Exchanges the new buffers, and frees the old ones once every rank has its
    /// new mappings.
    pub fn grow_scratch(&mut self, bytes: usize, ex: &dyn Exchange) -> Result<()> {
        if bytes <= self.scratch_bytes() {
            return Ok(());
        }
        let target = bytes.next_power_of_two().max(MIN_SCRATCH_BYTES);
        let new = Shared::exchange(&self.ctx, self.rank, target, ex, self.locality)?;
        let Shared { own, reach, .. } = std::mem::replace(&mut self.scratch, new);
        // Close this process's mappings of the old buffers, wait until every rank has, then
        // free the old buffer.
        drop(reach);
        ex.all_gather(&[])?;
        drop(own);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_records_round_trip() {
        let p = Published {
            pid: 4242,
            sms: 132,
            machine: 0x0123_4567_89ab_cdef,
            ordinal: 3,
            ptr: 0x7f00_0000_1000,
            bytes: 4 << 20,
            handle: IpcHandle([7; 64]),
        };
        let b = p.encode();
        assert_eq!(b.len(), PUBLISHED_BYTES);
        assert_eq!(Published::decode(&b, 1).unwrap(), p);
        assert!(matches!(Published::decode(&b[1..], 1), Err(Error::Internal { .. })));
    }

    #[test]
    fn the_machine_id_is_stable_and_a_host_id_replaces_it() {
        assert_eq!(machine_id(None), machine_id(None));
        assert_eq!(machine_id(Some("a")), machine_id(Some("a")));
        assert_ne!(machine_id(Some("a")), machine_id(None));
    }
}
