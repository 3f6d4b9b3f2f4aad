//! Ranks in other processes: each rank's communication buffers, exported once and mapped by its
//! peers ([`Windows`]).
//!
//! Each rank allocates, with plain `cuMemAlloc` (what CUDA IPC exports):
//! * a **flag area** of [`FLAG_BYTES`]: word `p` holds the latest signal count rank `p` wrote
//!   there ([`crate::plan::signals`]), then the one-shot all-reduce's flag array, then the
//!   two-shot all-reduce's flag region, the LL kernels' area and the rank's own LL zeros and
//!   sink ([`Windows::ll_zeros`], [`Windows::ll_sink`]); fixed size, exchanged once;
//! * a **point-to-point buffer** (communicators of at most `gpu_kernels::p2p::MAX_RANKS`
//!   ranks): the device-side counters and slots of the point-to-point kernel
//!   (`gpu_kernels::p2p`), fixed size, exchanged once, touched by no other kernel;
//! * a **scratch** buffer: the only memory of a rank that its peers read and write (shadows of
//!   the caller's buffers, partial results: see [`crate::schedule::through_scratch`]). It grows with the
//!   calls; growing is collective (every rank runs the same calls, so every rank grows at the
//!   same call) and costs a blocking exchange, so it doubles.
//!
//! Peers in another process open the buffers through their IPC handles once per size
//! (milliseconds each); peers in the same process use the address directly, with peer access.
//! The exchange goes through an [`Exchange`] (the communicator's bootstrap).
//!
//! **Freeing.** A buffer a peer has mapped is freed only when this rank knows that no peer's
//! work still reads or writes it: after a failure (a timeout, a lost peer, an abort, a failed
//! exchange) a live peer's kernels may still run on it, and a kernel that touches freed memory
//! is a fatal GPU fault, which under MPS tears down every process on the GPU. Such buffers are
//! leaked instead (until the process exits), with a warning that says how many bytes
//! ([`Release`], [`Windows::set_release`]). In the same way this process's mappings of the
//! peers' buffers are closed only once its own work on them is done. Once a CUDA graph has
//! captured a call on the scratch ([`Windows::mark_captured`]), a growth keeps the old scratch
//! and its mappings (the graph replays on them) until the windows are dropped, which a
//! communicator dropped before its graphs leaves to the last of them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::config::DebugLevel;
use crate::driver::ipc::{DeviceAlloc, IpcHandle, Mapped};
use crate::driver::{can_access_peer, enable_peer_access};
use crate::transport::room::{twoshot_grid_cap, GpuRoom};
use crate::{Error, Result};

/// Bytes of a rank's flag area: one 8-byte signal word per possible peer, then the one-shot
/// all-reduce's flag array (`gpu_kernels::oneshot::FLAG_WORDS` words), then the two-shot
/// all-reduce's flag region (`TWO_SHOT_FLAG_WORDS` words), then (at [`LL_AREA_OFFSET`]) the LL
/// kernel's area (`gpu_kernels::ll::LL_AREA_BYTES`, about 1 MiB: it is used by nothing else,
/// so no other call's data can ever look like an LL packet's flag), then (at
/// [`LL_ROOTED_OFFSET`]) [`LL_ROOTED_BYTES`] that only the rank's own LL kernels touch.
pub const FLAG_BYTES: usize = LL_ROOTED_OFFSET + LL_ROOTED_BYTES;

/// Byte offset in a rank's flag area of its LL zeros and sink (after the LL area).
pub const LL_ROOTED_OFFSET: usize = (LL_AREA_OFFSET + gpu_kernels::ll::LL_AREA_BYTES).next_multiple_of(256);

/// Bytes of a rank's LL zeros and sink: `gpu_kernels::ll::LL_MAX_BYTES` of zeros (never
/// written: a non-root's input to the LL broadcast) and as many of sink (written, never read:
/// a non-root's output of the LL reduce; a root's of a broadcast with no receive buffer).
pub const LL_ROOTED_BYTES: usize = 2 * gpu_kernels::ll::LL_MAX_BYTES;

/// Byte offset of the LL area in a rank's flag area (256-byte aligned, after the two-shot
/// flag region).
pub const LL_AREA_OFFSET: usize = (SIGNAL_BYTES
    + (gpu_kernels::oneshot::FLAG_WORDS + gpu_kernels::oneshot::TWO_SHOT_FLAG_WORDS) * 8)
    .next_multiple_of(256);

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
    /// The device's UUID (ranks on one GPU under MPS share it).
    uuid: [u8; 16],
    /// [`GpuRoom::blocks_per_sm`].
    blocks_per_sm: u32,
    /// [`GpuRoom::comms`].
    comms: u32,
}

const PUBLISHED_BYTES: usize = 4 + 4 + 8 + 4 + 8 + 8 + 64 + 16 + 4 + 4;

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
        v.extend_from_slice(&self.uuid);
        v.extend_from_slice(&self.blocks_per_sm.to_le_bytes());
        v.extend_from_slice(&self.comms.to_le_bytes());
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
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[100..116]);
        Ok(Published {
            pid: u32_at(0),
            sms: u32_at(4),
            machine: u64_at(8),
            ordinal: u32_at(16),
            ptr: u64_at(20),
            bytes: u64_at(28),
            handle: IpcHandle(handle),
            uuid,
            blocks_per_sm: u32_at(116),
            comms: u32_at(120),
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
    /// This rank's buffer (`None` once leaked: see [`Shared::leak_own`]).
    own: Option<DeviceAlloc>,
    /// Its size in bytes.
    bytes: usize,
    reach: Vec<Reach>,
    /// Every rank's buffer address in this process.
    addr: Vec<u64>,
    /// Every rank's machine identifier ([`machine_id`]).
    machines: Vec<u64>,
    /// Every rank's GPU, for the two-shot grid ([`twoshot_grid_cap`]).
    rooms: Vec<GpuRoom>,
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
        (blocks_per_sm, comms): (u32, u32),
    ) -> Result<Self> {
        let r = Some(rank);
        let own = DeviceAlloc::zeroed(ctx, bytes, r)?;
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::cuda("cuDeviceGetAttribute", r, e))?;
        let uuid = ctx.uuid().map_err(|e| Error::cuda("cuDeviceGetUuid", r, e))?;
        let mine = Published {
            pid: std::process::id(),
            sms: u32::try_from(sms).unwrap_or(1).max(1),
            machine,
            ordinal: ctx.ordinal() as u32,
            ptr: own.ptr(),
            bytes: own.bytes() as u64,
            handle: own.ipc_handle(r)?,
            // `CUuuid` is 16 `c_char`s: the same bytes.
            uuid: uuid.bytes.map(|b| b as u8),
            blocks_per_sm,
            comms,
        };
        // From here on some peer may have this buffer's handle, map it and run kernels on it:
        // on an error it is leaked, not freed (see the module's "Freeing").
        match Self::map_all(ctx, rank, &mine, remote_ok, ex) {
            Ok((reach, addr, machines, rooms)) => Ok(Shared {
                own: Some(own),
                bytes: mine.bytes as usize,
                reach,
                addr,
                machines,
                rooms,
            }),
            Err(e) => {
                crate::debug::warn(format_args!(
                    "rank {rank}: the exchange of a buffer of {} bytes failed ({e}); it is left \
                     allocated until the process exits, since a peer may have mapped it",
                    own.bytes()
                ));
                std::mem::forget(own);
                Err(e)
            }
        }
    }

    /// Publishes `mine` and maps every peer's buffer (those on another machine are left
    /// unmapped if `remote_ok`): every rank's reach, address, machine, SM count and device
    /// ordinal, in rank order.
    #[allow(clippy::type_complexity)]
    fn map_all(
        ctx: &Arc<CudaContext>,
        rank: usize,
        mine: &Published,
        remote_ok: bool,
        ex: &dyn Exchange,
    ) -> Result<(Vec<Reach>, Vec<u64>, Vec<u64>, Vec<GpuRoom>)> {
        let r = Some(rank);
        let all = ex.all_gather(&mine.encode())?;
        let mut reach = Vec::with_capacity(all.len());
        let mut addr = Vec::with_capacity(all.len());
        let mut machines = Vec::with_capacity(all.len());
        let mut rooms = Vec::with_capacity(all.len());
        for (q, b) in all.iter().enumerate() {
            let p = Published::decode(b, q)?;
            machines.push(p.machine);
            rooms.push(GpuRoom {
                gpu: (p.machine, p.uuid),
                sms: p.sms,
                blocks_per_sm: p.blocks_per_sm,
                comms: p.comms,
            });
            if q == rank {
                reach.push(Reach::Own);
                addr.push(mine.ptr);
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
        Ok((reach, addr, machines, rooms))
    }

    /// Leaks this rank's buffer (never freed): its bytes, 0 if it was leaked already.
    fn leak_own(&mut self) -> usize {
        match self.own.take() {
            Some(own) => {
                let bytes = own.bytes();
                std::mem::forget(own);
                bytes
            }
            None => 0,
        }
    }

    /// Leaks this process's mappings of the peers' buffers (never closed).
    fn leak_mappings(&mut self) {
        std::mem::forget(std::mem::take(&mut self.reach));
    }

    /// Nothing: what [`Windows::detach`] leaves behind (its drop releases nothing).
    fn empty() -> Self {
        Shared {
            own: None,
            bytes: 0,
            reach: Vec::new(),
            addr: Vec::new(),
            machines: Vec::new(),
            rooms: Vec::new(),
        }
    }

    /// The bytes of this rank's own buffer, 0 once leaked.
    fn own_bytes(&self) -> usize {
        self.own.as_ref().map_or(0, DeviceAlloc::bytes)
    }
}

/// What dropping a rank's [`Windows`] releases: this rank's own flag area and scratch
/// (`cuMemFree`), which its peers have mapped, and this process's mappings of the peers'
/// buffers (`cuIpcCloseMemHandle`). What is not released is leaked until the process exits.
///
/// ```
/// use ringccl::internals::transport::ipc::Release;
/// // A communicator that ended without a failure, its work done: everything is released.
/// assert_eq!(Release::at_drop(false, true), Release { free_own: true, unmap_peers: true });
/// // After a failure a peer's kernels may still use this rank's buffers: they are leaked.
/// assert_eq!(Release::at_drop(true, true), Release { free_own: false, unmap_peers: true });
/// // This rank's own work still runs on the peers' buffers: nothing is released.
/// assert_eq!(Release::at_drop(true, false), Release { free_own: false, unmap_peers: false });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    /// Free this rank's own buffers.
    pub free_own: bool,
    /// Close this process's mappings of the peers' buffers.
    pub unmap_peers: bool,
}

impl Release {
    /// What the drop of windows no communicator took charge of releases (a communicator whose
    /// creation failed after the exchange): no work of this rank ran on the peers' buffers
    /// (they are unmapped), but a peer that finished its creation may have begun calls that
    /// touch this rank's (they are leaked).
    pub const UNCLAIMED: Release = Release {
        free_own: false,
        unmap_peers: true,
    };

    /// The rule at a communicator's drop: `failed`, whether it failed (a timeout, a lost peer,
    /// an abort, a half-issued call: its peers may still be in a call that reads or writes this
    /// rank's buffers); `work_done`, whether every piece of work it enqueued has ended.
    ///
    /// This rank's buffers are freed only without a failure and with the work done: the end of
    /// its last call then also means every peer is done with them (a call's end waits for the
    /// peers' last touches of this rank's memory). The peers' buffers are unmapped only once
    /// this rank's own work, which reads and writes them, has ended.
    pub fn at_drop(failed: bool, work_done: bool) -> Release {
        Release {
            free_own: !failed && work_done,
            unmap_peers: work_done,
        }
    }
}

/// Every rank's flag area and scratch, as this process reaches them.
#[derive(Debug)]
pub struct Windows {
    ctx: Arc<CudaContext>,
    rank: usize,
    flags: Shared,
    scratch: Shared,
    /// The point-to-point buffer (`gpu_kernels::p2p`): exchanged with the others when the
    /// communicator has at most `gpu_kernels::p2p::MAX_RANKS` ranks, never grown, used only by
    /// the point-to-point kernel ([`Windows::p2p`]).
    p2p: Shared,
    /// This rank's machine identifier, and whether ranks on other machines are allowed (left
    /// unmapped).
    locality: (u64, bool),
    /// This rank's two-shot blocks per SM and its process's live communicators of processes
    /// at the creation, as published ([`GpuRoom`]).
    room: (u32, u32),
    /// This communicator's place in that count, given back when the windows (and the CUDA
    /// graphs that may still launch its kernels) are gone.
    live: Option<LiveComm>,
    /// What the drop releases ([`Windows::set_release`]), and the level of its report.
    release: (Release, DebugLevel),
    /// A CUDA graph captured a call that uses the scratch ([`Windows::mark_captured`]).
    captured: bool,
    /// Scratch buffers replaced by a growth while a CUDA graph may still use them (this
    /// rank's own and this process's mappings of the peers'): released with the windows, by
    /// the same rule.
    retired: Vec<Shared>,
    /// Registered user buffers: this rank's and this process's mappings of the peers'
    /// (closed with the windows, by the same rule).
    registry: crate::transport::registry::Registry,
}

impl Drop for Windows {
    fn drop(&mut self) {
        let (Release { free_own, unmap_peers }, debug) = self.release;
        if !unmap_peers {
            self.flags.leak_mappings();
            self.scratch.leak_mappings();
            self.p2p.leak_mappings();
            self.retired.iter_mut().for_each(Shared::leak_mappings);
            self.registry.leak_mappings();
        }
        if !free_own {
            let retired: usize = self.retired.iter_mut().map(Shared::leak_own).sum();
            let (flags, scratch) = (
                self.flags.leak_own() + self.p2p.leak_own(),
                self.scratch.leak_own() + retired,
            );
            if flags + scratch > 0 {
                crate::debug::emit(
                    debug,
                    DebugLevel::Warn,
                    format_args!(
                        "rank {}: {} bytes of device memory that the peers have mapped (scratch \
                         {scratch}, flag area {flags}) stay allocated until the process exits: \
                         the communicator failed, so a peer's kernels may still read or write \
                         them (freeing memory under a kernel is a fatal GPU fault, which under \
                         MPS ends every process on the GPU){}",
                        self.rank,
                        flags + scratch,
                        if unmap_peers {
                            ""
                        } else {
                            "; the mappings of the peers' buffers are kept too, as this rank's \
                             work on them had not ended"
                        }
                    ),
                );
            }
        }
    }
}

/// Communicators of processes alive in this process: windows not yet dropped (those a
/// communicator's drop handed to its CUDA graphs included).
static LIVE_COMMS: AtomicU32 = AtomicU32::new(0);

/// One count in [`LIVE_COMMS`], given back on drop.
#[derive(Debug)]
struct LiveComm;

impl LiveComm {
    /// Counts one more communicator; returns its guard and the count with it.
    fn enter() -> (Self, u32) {
        (LiveComm, LIVE_COMMS.fetch_add(1, Ordering::AcqRel).saturating_add(1))
    }
}

impl Drop for LiveComm {
    fn drop(&mut self) {
        LIVE_COMMS.fetch_sub(1, Ordering::AcqRel);
    }
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
        blocks_per_sm: u32,
    ) -> Result<Self> {
        if nranks > MAX_PROCESS_RANKS {
            return Err(Error::invalid(
                None,
                crate::Arg::Ranks,
                format!("{nranks} ranks: a communicator of processes has at most {MAX_PROCESS_RANKS}"),
            ));
        }
        let locality = (machine, remote_ok);
        let (live, comms) = LiveComm::enter();
        let room = (blocks_per_sm, comms);
        let mut flags = Shared::exchange(ctx, rank, FLAG_BYTES, ex, locality, room)?;
        // The flag area is published: a peer may signal into it from now on.
        let mut scratch = match Shared::exchange(ctx, rank, MIN_SCRATCH_BYTES, ex, locality, room) {
            Ok(s) => s,
            Err(e) => {
                flags.leak_own();
                return Err(e);
            }
        };
        if flags.addr.len() != nranks || scratch.addr.len() != nranks {
            flags.leak_own();
            scratch.leak_own();
            return Err(Error::Internal {
                reason: format!("{} ranks answered the exchange, not {nranks}", flags.addr.len()),
            });
        }
        // Every rank takes the same branch (the same `nranks`).
        let p2p = if nranks <= gpu_kernels::p2p::MAX_RANKS {
            match Shared::exchange(ctx, rank, gpu_kernels::p2p::buffer_bytes(nranks), ex, locality, room) {
                Ok(p) if p.addr.len() == nranks => p,
                Ok(mut p) => {
                    p.leak_own();
                    flags.leak_own();
                    scratch.leak_own();
                    return Err(Error::Internal {
                        reason: format!("{} ranks answered the exchange, not {nranks}", p.addr.len()),
                    });
                }
                Err(e) => {
                    flags.leak_own();
                    scratch.leak_own();
                    return Err(e);
                }
            }
        } else {
            Shared::empty()
        };
        Ok(Windows {
            ctx: ctx.clone(),
            rank,
            flags,
            scratch,
            p2p,
            locality,
            room,
            live: Some(live),
            release: (Release::UNCLAIMED, DebugLevel::Warn),
            captured: false,
            retired: Vec::new(),
            registry: Default::default(),
        })
    }

    /// Notes that a CUDA graph captured a call that uses the scratch (its addresses, this
    /// rank's and the peers', are in the graph): from now on a growth keeps the old buffers
    /// and mappings ([`Windows::grow_scratch`]) until the windows are dropped. Every rank
    /// captures the same calls, so every rank marks its windows alike.
    pub fn mark_captured(&mut self) {
        self.captured = true;
    }

    /// Whether a CUDA graph captured a call that uses the scratch.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn captured(&self) -> bool {
        self.captured
    }

    /// Bytes of this rank's scratch buffers kept for CUDA graphs after growths.
    pub fn retired_bytes(&self) -> usize {
        self.retired.iter().map(Shared::own_bytes).sum()
    }

    /// Moves everything these windows hold (buffers, mappings, retired scratch, the release
    /// rule) into the windows returned, leaving these empty: the communicator's drop hands
    /// them to the CUDA graphs that still use them, to be released by the rule already set
    /// ([`Windows::set_release`]) when the last graph is gone.
    pub fn detach(&mut self) -> Windows {
        Windows {
            ctx: self.ctx.clone(),
            rank: self.rank,
            flags: std::mem::replace(&mut self.flags, Shared::empty()),
            scratch: std::mem::replace(&mut self.scratch, Shared::empty()),
            p2p: std::mem::replace(&mut self.p2p, Shared::empty()),
            locality: self.locality,
            room: self.room,
            live: self.live.take(),
            release: self.release,
            captured: self.captured,
            retired: std::mem::take(&mut self.retired),
            registry: std::mem::take(&mut self.registry),
        }
    }

    /// The registered user buffers ([`crate::transport::registry`]).
    pub fn registry(&mut self) -> &mut crate::transport::registry::Registry {
        &mut self.registry
    }

    /// The registered buffers, to read.
    pub fn registry_ref(&self) -> &crate::transport::registry::Registry {
        &self.registry
    }

    /// This rank's device context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Whether rank `q` is this rank or another rank of this process (its buffers are used
    /// directly, with peer access, not mapped).
    pub fn same_process(&self, q: usize) -> bool {
        matches!(self.scratch.reach.get(q), Some(Reach::Direct | Reach::Own))
    }

    /// Sets what dropping these windows releases ([`Release::at_drop`]; until called,
    /// [`Release::UNCLAIMED`]), and the level (`debug`, the communicator's) of the warning that
    /// reports leaked memory. Returns the bytes of this rank's own buffers that the drop leaks.
    pub fn set_release(&mut self, release: Release, debug: DebugLevel) -> usize {
        self.release = (release, debug);
        if release.free_own {
            0
        } else {
            self.flags.own_bytes() + self.scratch.own_bytes() + self.p2p.own_bytes() + self.retired_bytes()
        }
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

    /// The address, in this process, of rank `q`'s LL area (see `gpu_kernels::ll`).
    pub fn ll_area(&self, q: usize) -> Option<u64> {
        self.flags.addr.get(q).map(|base| base + LL_AREA_OFFSET as u64)
    }

    /// This rank's `gpu_kernels::ll::LL_MAX_BYTES` of zeros in its flag area (zeroed at the
    /// creation, written by no kernel): the input a non-root gives the LL all-reduce kernel
    /// when it runs a broadcast (`exec::ll`).
    pub fn ll_zeros(&self) -> Option<u64> {
        self.flags.addr.get(self.rank).map(|base| base + LL_ROOTED_OFFSET as u64)
    }

    /// This rank's `gpu_kernels::ll::LL_MAX_BYTES` of sink in its flag area, after
    /// [`Windows::ll_zeros`]: written by this rank's LL kernels where a rank has no output of
    /// its own (a non-root of an LL reduce), read by no one.
    pub fn ll_sink(&self) -> Option<u64> {
        self.ll_zeros().map(|z| z + gpu_kernels::ll::LL_MAX_BYTES as u64)
    }

    /// The most blocks of this communicator's two-shot kernel (the same answer on every rank):
    /// [`twoshot_grid_cap`] of every rank's published GPU room, so that every block of every
    /// two-shot kernel that can be in flight at once on a GPU (this communicator's ranks that
    /// share it under MPS, and the other communicators of their processes) is resident
    /// together: each block waits at its barriers for the peers' same-numbered blocks.
    pub fn two_shot_sms(&self) -> u32 {
        twoshot_grid_cap(&self.flags.rooms)
    }

    /// Every rank's GPU as published at the creation ([`GpuRoom`]).
    pub fn rooms(&self) -> &[GpuRoom] {
        &self.flags.rooms
    }

    /// Every rank's point-to-point buffer (`gpu_kernels::p2p`) in this process, in rank order
    /// (0 for a rank on another machine); empty when the communicator has more than
    /// `gpu_kernels::p2p::MAX_RANKS` ranks (its groups take the scratch path).
    pub fn p2p(&self) -> &[u64] {
        &self.p2p.addr
    }

    /// Every rank's scratch address in this process.
    pub fn scratch(&self) -> &[u64] {
        &self.scratch.addr
    }

    /// Bytes of every rank's scratch now.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.bytes
    }

    /// Grows every rank's scratch to at least `bytes` (collective: every rank calls it at the
    /// same call with the same `bytes`). The caller has waited for this rank's previous call
    /// to end (every peer's use of this rank's buffer, and this rank's use of the peers', ends
    /// before it). Exchanges the new buffers, and frees the old ones once every rank has its
    /// new mappings. If the exchange fails, the old buffers stay (the windows' drop decides
    /// their fate); if the last step fails (some rank may not have closed its mappings of the
    /// old buffer, or not be done with it), the old buffer is leaked, not freed.
    ///
    /// Once a CUDA graph has captured a call that uses the scratch ([`Windows::mark_captured`])
    /// the old buffer and this process's mappings of the peers' old buffers are kept instead
    /// (retired, released with the windows): the graph's replays still use them, on every rank.
    /// The ranks still meet after the exchange, so that every rank takes part in the same
    /// exchanges whatever it captured.
    pub fn grow_scratch(&mut self, bytes: usize, ex: &dyn Exchange) -> Result<()> {
        if bytes <= self.scratch_bytes() {
            return Ok(());
        }
        let target = bytes.next_power_of_two().max(MIN_SCRATCH_BYTES);
        let new = Shared::exchange(&self.ctx, self.rank, target, ex, self.locality, self.room)?;
        let mut old = std::mem::replace(&mut self.scratch, new);
        if self.captured {
            self.retired.push(old);
            return ex.all_gather(&[]).map(drop);
        }
        // Close this process's mappings of the old buffers (this rank's work on them has ended),
        // wait until every rank has, then free the old buffer.
        drop(std::mem::take(&mut old.reach));
        if let Err(e) = ex.all_gather(&[]) {
            let bytes = old.leak_own();
            crate::debug::warn(format_args!(
                "rank {}: the scratch growth failed after the exchange ({e}); the old scratch of \
                 {bytes} bytes is left allocated until the process exits, since a peer may still \
                 use it",
                self.rank
            ));
            return Err(e);
        }
        drop(old);
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
            uuid: [9; 16],
            blocks_per_sm: 3,
            comms: 2,
        };
        let b = p.encode();
        assert_eq!(b.len(), PUBLISHED_BYTES);
        assert_eq!(Published::decode(&b, 1).unwrap(), p);
        assert!(matches!(Published::decode(&b[1..], 1), Err(Error::Internal { .. })));
    }

    #[test]
    fn live_communicators_are_counted_until_dropped() {
        // (No other CPU test makes windows: the count moves by this test alone.)
        let (a, n) = LiveComm::enter();
        let (b, m) = LiveComm::enter();
        assert_eq!(m, n + 1);
        drop(a);
        let (c, k) = LiveComm::enter();
        assert_eq!(k, m, "a dropped communicator gives its count back");
        drop((b, c));
        assert_eq!(LIVE_COMMS.load(Ordering::Acquire), n - 1);
    }

    #[test]
    fn memory_peers_have_mapped_is_freed_only_after_a_clean_end() {
        // (failed, work done) -> (free own buffers, unmap the peers')
        let table = [
            ((false, true), (true, true)),
            ((true, true), (false, true)),
            ((false, false), (false, false)),
            ((true, false), (false, false)),
        ];
        for ((failed, done), (free_own, unmap_peers)) in table {
            assert_eq!(
                Release::at_drop(failed, done),
                Release { free_own, unmap_peers },
                "failed {failed}, work done {done}"
            );
        }
        // Windows no communicator took charge of (a creation that failed after the exchange):
        // no work of this rank ran on the peers' buffers, but a peer may use this rank's.
        assert_eq!(Release::UNCLAIMED, Release { free_own: false, unmap_peers: true });
    }

    #[test]
    fn the_machine_id_is_stable_and_a_host_id_replaces_it() {
        assert_eq!(machine_id(None), machine_id(None));
        assert_eq!(machine_id(Some("a")), machine_id(Some("a")));
        assert_ne!(machine_id(Some("a")), machine_id(None));
    }
}
