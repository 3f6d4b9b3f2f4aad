//! The C entry points that make communicators from other communicators (`ncclCommSplit`,
//! `ncclCommShrink`) or from several ids (`ncclCommInitRankScalable`). The new communicator's
//! ranks agree on its membership over the parent's bootstrap (no new id), then build it as
//! `ncclCommInitRank` does: resources of its own (never the parent's: `splitShare` and
//! `shrinkShare` are accepted and change nothing, since separate resources are always safe),
//! so the parent and the child may be used in any order on their streams.

use std::ffi::c_int;

use ringccl::{PendingCommunicator, UniqueId};

use crate::c_comm::start_member;
use crate::comm::{Handle, Member};
use crate::cuda::KeepContext;
use crate::error::{guard, Fail, Result};
use crate::types::*;
use crate::{blocking, ncclComm_t};

/// `NCCL_SPLIT_NOCOLOR`: the rank takes part in the split and gets no communicator.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_DEFAULT`.
pub const NCCL_SHRINK_DEFAULT: c_int = 0;
/// `NCCL_SHRINK_ABORT`: abort the parent's work first (an excluded rank died mid-call).
pub const NCCL_SHRINK_ABORT: c_int = 1;

/// The parent of a split or shrink: its rank, and whether it may be split here.
fn parent(comm: ncclComm_t, function: &str) -> Result<(&'static Handle, Member)> {
    let h = Handle::from_ptr(comm)?;
    let m = h.member()?;
    if m.world.comm.local_ranks().len() > 1 {
        return Err(Fail::unsupported(
            function,
            "the communicator is one of several ranks of ncclCommInitAll in this process; \
             split a communicator of one rank per process (ncclCommInitRank), or create the \
             new communicators with ncclCommInitAll",
        ));
    }
    Ok((h, m))
}

/// Finishes a child as the caller asked: now (blocking, outside a group), else in a thread of
/// its own (`ncclInProgress` for a non-blocking config; at `ncclGroupEnd` in a group).
///
/// # Safety
///
/// `newcomm` is valid to write.
unsafe fn finish(
    pending: PendingCommunicator,
    blocking: bool,
    newcomm: *mut ncclComm_t,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        start_member(newcomm, blocking, "ringccl-split".into(), move || {
            pending.finish().map_err(Fail::from)
        })
    }
}

/// The child's blocking mode: `config`'s, or the parent's for a NULL config (NCCL copies the
/// parent's config then).
///
/// # Safety
///
/// As for [`blocking`].
unsafe fn child_blocking(config: *const ncclConfig_t, parent: &Handle) -> Result<bool> {
    if config.is_null() {
        return Ok(parent.blocking);
    }
    // SAFETY: the caller's contract.
    unsafe { blocking(config) }
}

/// `ncclCommSplit`: a new communicator of the ranks of `comm` that pass the same `color`,
/// ranked by `key`, then by rank in `comm`; every rank of `comm` calls it. A rank passing
/// `NCCL_SPLIT_NOCOLOR` (-1) gets `*newcomm = NULL` and `ncclSuccess`; any other value, also
/// a negative one, is a color. `config` NULL: the parent's blocking mode; `blocking = 0`:
/// `ncclInProgress` once the ranks have agreed on the membership, the rest in the background
/// (poll `ncclCommGetAsyncError`). For a communicator of several ranks of one process
/// (`ncclCommInitAll`) it is not supported (`ncclInvalidUsage`).
///
/// # Safety
///
/// `newcomm` NULL or valid to write; `config` NULL or an initialised `ncclConfig_t`.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut out = null_mut();
/// // SAFETY: a NULL communicator is refused before anything is read.
/// assert_eq!(unsafe { ncclCommSplit(null_mut(), 0, 0, &mut out, null_mut()) }, 4);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclCommSplit", || {
        let h = Handle::from_ptr(comm)?;
        if newcomm.is_null() {
            return Err(Fail::arg("newcomm is NULL"));
        }
        let (_, m) = parent(comm, "ncclCommSplit")?;
        // SAFETY: checked non-null; the caller's contract. NULL until the split is complete.
        unsafe { newcomm.write(std::ptr::null_mut()) };
        // SAFETY: the caller's contract.
        let blocking = unsafe { child_blocking(config, h) }?;
        let color = (color != NCCL_SPLIT_NOCOLOR).then_some(color);
        crate::debug::info(|| format!("ncclCommSplit: rank {} color {color:?} key {key}", m.rank));
        match m.world.comm.split_begin(color, key).map_err(Fail::from)? {
            None => Ok(()),
            // SAFETY: checked non-null; the caller's contract.
            Some(p) => unsafe { finish(p, blocking, newcomm) },
        }
    })
}

/// `ncclCommShrink`: a new communicator of the ranks of `comm` not in `excludeRanksList`, in
/// `comm`'s rank order; only those ranks call it, each with the same list (as in NCCL, the
/// list is sorted in place; an excluded rank calling it is `ncclInvalidArgument`). The
/// excluded ranks are never contacted, so they may have died. `NCCL_SHRINK_ABORT` first
/// aborts `comm`'s pending work; unlike NCCL, `comm` then stays aborted (every later call
/// fails; destroy it). Other flag bits are ignored, as in NCCL. `config` as for
/// [`ncclCommSplit`].
///
/// # Safety
///
/// `exclude_ranks_list` NULL or `exclude_ranks_count` ints valid to read and write;
/// `newcomm` NULL or valid to write; `config` NULL or an initialised `ncclConfig_t`.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut out = null_mut();
/// // SAFETY: a NULL communicator is refused before anything is read.
/// assert_eq!(unsafe { ncclCommShrink(null_mut(), null_mut(), 0, &mut out, null_mut(), 0) }, 4);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    exclude_ranks_list: *mut c_int,
    exclude_ranks_count: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrink_flags: c_int,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclCommShrink", || {
        let h = Handle::from_ptr(comm)?;
        if newcomm.is_null() {
            return Err(Fail::arg("newcomm is NULL"));
        }
        if exclude_ranks_list.is_null() {
            return Err(Fail::arg("excludeRanksList is NULL"));
        }
        let count = usize::try_from(exclude_ranks_count)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| {
                Fail::arg(format!(
                    "excludeRanksCount {exclude_ranks_count} must be at least 1"
                ))
            })?;
        // SAFETY: non-null; the caller passes `count` ints.
        let list = unsafe { std::slice::from_raw_parts_mut(exclude_ranks_list, count) };
        list.sort_unstable();
        let (_, m) = parent(comm, "ncclCommShrink")?;
        let n = m.world.comm.nranks();
        let exclude =
            list.iter()
                .map(|&r| {
                    usize::try_from(r).ok().filter(|&r| r < n).ok_or_else(|| {
                        Fail::arg(format!("excludeRanksList holds {r}, outside 0..{n}"))
                    })
                })
                .collect::<Result<Vec<usize>>>()?;
        if exclude.contains(&m.rank) {
            return Err(Fail::arg(format!(
                "rank {} is in excludeRanksList: an excluded rank does not call ncclCommShrink",
                m.rank
            )));
        }
        // SAFETY: checked non-null; the caller's contract. NULL until the shrink is complete.
        unsafe { newcomm.write(std::ptr::null_mut()) };
        // SAFETY: the caller's contract.
        let blocking = unsafe { child_blocking(config, h) }?;
        let comm = &m.world.comm;
        let pending = if shrink_flags & NCCL_SHRINK_ABORT != 0 {
            comm.shrink_aborting_begin(&exclude)
        } else {
            comm.shrink_begin(&exclude)
        }
        .map_err(Fail::from)?;
        // SAFETY: checked non-null; the caller's contract.
        unsafe { finish(pending, blocking, newcomm) }
    })
}

/// `ncclCommInitRankScalable`: [`ncclCommInitRankConfig`](crate::ncclCommInitRankConfig)
/// with `nId` ids. NCCL spreads its rendezvous over the ids' roots (each rank reaches one of
/// them, the roots then connect); ringccl's rendezvous has a single root, so every rank joins
/// the first id's, which exists since every rank passes the same array (as NCCL requires).
/// The other ids' services stay idle and end by themselves. Every id is checked to be an id
/// of this library (`ncclInvalidArgument` otherwise).
///
/// # Safety
///
/// `newcomm` NULL or valid to write; `comm_ids` NULL or `n_id` ids; `config` NULL or an
/// initialised `ncclConfig_t`.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut comm = null_mut();
/// // SAFETY: no ids: refused.
/// assert_eq!(unsafe { ncclCommInitRankScalable(&mut comm, 2, 0, 0, null_mut(), null_mut()) }, 4);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    comm_ids: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclCommInitRankScalable", || {
        let count = usize::try_from(n_id).ok().filter(|&c| c >= 1);
        let (Some(count), false) = (count, comm_ids.is_null()) else {
            return Err(Fail::arg(format!("commIds is NULL or nId {n_id} < 1")));
        };
        // SAFETY: non-null; the caller passes `n_id` ids.
        let ids = unsafe { std::slice::from_raw_parts(comm_ids, count) };
        for (i, id) in ids.iter().enumerate() {
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            UniqueId::from_bytes(&bytes).map_err(|e| {
                Fail::arg(format!(
                    "commIds[{i}] is not an id from ncclGetUniqueId: {e}"
                ))
            })?;
        }
        // SAFETY: the caller's contract.
        unsafe { crate::c_comm::init_rank(newcomm, nranks, &ids[0], myrank, config) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::null_mut;

    #[test]
    fn split_and_shrink_check_their_arguments_before_anything() {
        let mut out: ncclComm_t = 7usize as ncclComm_t;
        let mut x = 0u64;
        let fake: ncclComm_t = (&mut x as *mut u64).cast();
        // SAFETY: every pointer is NULL, valid, or refused before use.
        unsafe {
            assert_eq!(
                ncclCommSplit(null_mut(), 0, 0, &mut out, null_mut()),
                NCCL_INVALID_ARGUMENT
            );
            assert_eq!(
                ncclCommSplit(fake, 0, 0, &mut out, null_mut()),
                NCCL_INVALID_ARGUMENT
            );
            assert!(crate::error::last().contains("not a communicator"));
            let mut list = [1];
            assert_eq!(
                ncclCommShrink(null_mut(), list.as_mut_ptr(), 1, &mut out, null_mut(), 0),
                NCCL_INVALID_ARGUMENT
            );
            assert_eq!(
                ncclCommShrink(fake, list.as_mut_ptr(), 1, &mut out, null_mut(), 0),
                NCCL_INVALID_ARGUMENT
            );
        }
        assert_eq!(x, 0);
    }

    #[test]
    fn scalable_init_checks_every_id() {
        let good_bytes = UniqueId::new_at("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut good = ncclUniqueId { internal: [0; 128] };
        for (d, s) in good.internal.iter_mut().zip(good_bytes.as_bytes()) {
            *d = *s as _;
        }
        let mut ids = [good, ncclUniqueId { internal: [0; 128] }];
        let mut comm = null_mut();
        // SAFETY: two ids; the second is garbage and refused before any rendezvous.
        let r =
            unsafe { ncclCommInitRankScalable(&mut comm, 2, 0, 2, ids.as_mut_ptr(), null_mut()) };
        assert_eq!(r, NCCL_INVALID_ARGUMENT);
        assert!(
            crate::error::last().contains("commIds[1]"),
            "{}",
            crate::error::last()
        );
    }
}
