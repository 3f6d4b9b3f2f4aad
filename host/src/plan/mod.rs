//! Planning a call, as pure data: which algorithm, how big a chunk, which schedule, and which of
//! its steps record an event. Nothing here touches a GPU.
//!
//! * [`call`]: [`call::choose`], the plan of one call as a value ([`call::CallPlan`]), from
//!   the call ([`collective::Collective`]), the communicator and the configuration;
//! * [`tuning`]: the policy (algorithm, chunk size, launch caps) as functions of the call and
//!   the [`Config`](crate::Config);
//! * [`topology`]: the ring order, chosen from the peer-to-peer link scores;
//! * [`p2p`]: point-to-point groups among processes; [`net`]: collectives as such groups, for
//!   peers reached over the network;
//! * [`Prepared`] and [`PlanCache`]: a checked schedule with its event plan, built once per call
//!   shape and kept by the communicator.

pub mod call;
pub mod collective;
pub mod copy_engine;
pub mod p2p;
pub mod p2p_kernel;
pub mod net;
pub mod signals;
pub mod topology;
pub mod tuning;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::kind::CollectiveKind;
use crate::schedule::{Layout, Schedule};
use crate::{Error, Result};

/// A schedule checked ([`Schedule::validate`]) and planned for execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The schedule.
    pub schedule: Schedule,
    /// `needs_event[i]`: step `i` must record an event (a later step of another rank depends
    /// on it, or another rank's end waits for it).
    pub needs_event: Vec<bool>,
}

impl Prepared {
    /// Checks `schedule` and works out which steps record an event.
    pub fn new(schedule: Schedule) -> Result<Self> {
        schedule.validate().map_err(|e| Error::Internal {
            reason: format!("malformed schedule: {e}"),
        })?;
        let s = &schedule;
        let mut needs_event = vec![false; s.steps.len()];
        for step in &s.steps {
            for &d in &step.deps {
                if s.steps[d].exec != step.exec {
                    needs_event[d] = true;
                }
            }
        }
        for (r, waits) in s.end_waits.iter().enumerate() {
            for &d in waits {
                if s.steps[d].exec != r {
                    needs_event[d] = true;
                }
            }
        }
        Ok(Prepared {
            schedule,
            needs_event,
        })
    }
}

/// What a prepared schedule depends on: the call's shape (the ring is fixed per communicator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScheduleKey {
    /// The collective.
    pub kind: CollectiveKind,
    /// Its count argument.
    pub count: usize,
    /// In place or not.
    pub layout: Layout,
    /// Root rank, where the collective has one.
    pub root: Option<usize>,
    /// Elements per step.
    pub chunk: usize,
}

/// Prepared schedules (or what else a call shape plans: `T`) by call shape, so repeated calls of
/// one shape skip scheduling.
#[derive(Debug)]
pub struct PlanCache<T = Prepared> {
    map: Mutex<HashMap<ScheduleKey, Arc<T>>>,
}

impl<T> Default for PlanCache<T> {
    fn default() -> Self {
        PlanCache {
            map: Mutex::new(HashMap::new()),
        }
    }
}

/// A schedule for ranks in different processes ([`crate::schedule::through_scratch`]), prepared, with
/// its numbered signals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessPlan {
    /// The schedule, checked.
    pub prepared: Prepared,
    /// Its cross-rank orderings as signals.
    pub signals: signals::SignalPlan,
}

impl ProcessPlan {
    /// Rewrites `schedule` for processes (peers reach each other only in scratch), checks it and
    /// numbers its signals.
    pub fn new(schedule: &Schedule) -> Result<Self> {
        let staged = crate::schedule::through_scratch(schedule).map_err(|e| Error::Internal {
            reason: format!("malformed schedule: {e}"),
        })?;
        if let Some(step) = crate::schedule::peer_private_access(&staged) {
            return Err(Error::Internal {
                reason: format!("step {step} of a schedule for processes reaches a peer's own buffer"),
            });
        }
        let signals = signals::SignalPlan::new(&staged);
        Ok(ProcessPlan {
            prepared: Prepared::new(staged)?,
            signals,
        })
    }
}

/// Schedules kept before the cache is emptied.
pub const PLAN_CACHE_LIMIT: usize = 256;

impl<T> PlanCache<T> {
    /// The plan for `key`, built with `build` the first time; the flag says whether it was
    /// built now. A plan that fails to build is not kept.
    pub fn get_or_build(
        &self,
        key: ScheduleKey,
        build: impl FnOnce() -> Result<T>,
    ) -> Result<(Arc<T>, bool)> {
        // A panic while the lock was held cannot leave the map inconsistent (entries are only
        // inserted whole), so recover from poisoning.
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(&key) {
            return Ok((p.clone(), false));
        }
        let p = Arc::new(build()?);
        if map.len() >= PLAN_CACHE_LIMIT {
            map.clear();
        }
        map.insert(key, p.clone());
        Ok((p, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{BufId, Region, Step};

    fn reg(rank: usize, buf: BufId, offset: usize, len: usize) -> Region {
        Region::new(rank, buf, offset, len)
    }

    fn step(exec: usize, srcs: Vec<Region>, dsts: Vec<Region>, deps: Vec<usize>) -> Step {
        Step {
            exec,
            srcs,
            dsts,
            finish: false,
            deps,
        }
    }

    /// Two ranks, one-step all-reduce of 8 elements, then two local steps on rank 0.
    pub(crate) fn two_rank_schedule() -> Schedule {
        use BufId::*;
        Schedule {
            nranks: 2,
            steps: vec![
                step(
                    0,
                    vec![reg(0, Send, 0, 4), reg(1, Send, 0, 4)],
                    vec![reg(0, Recv, 0, 4), reg(1, Recv, 0, 4)],
                    vec![],
                ),
                step(
                    1,
                    vec![reg(0, Send, 4, 4), reg(1, Send, 4, 4)],
                    vec![reg(1, Recv, 4, 4), reg(0, Recv, 4, 4)],
                    vec![],
                ),
                step(0, vec![reg(0, Recv, 4, 4)], vec![reg(0, Scratch, 0, 4)], vec![1]),
                step(0, vec![reg(0, Scratch, 0, 4)], vec![reg(0, Scratch, 4, 4)], vec![]),
            ],
            scratch_len: 8,
            start_waits: vec![vec![1], vec![0]],
            end_waits: vec![vec![1], vec![0]],
        }
    }

    #[test]
    fn events_only_where_another_rank_waits() {
        let p = Prepared::new(two_rank_schedule()).unwrap();
        // Step 0: rank 1's end waits it. Step 1: step 2 (rank 0) and rank 0's end wait it.
        // Steps 2 and 3: only same-rank successors.
        assert_eq!(p.needs_event, vec![true, true, false, false]);
        let mut s = two_rank_schedule();
        s.end_waits = vec![vec![0, 3], vec![]];
        assert_eq!(Prepared::new(s).unwrap().needs_event, vec![false, true, false, false]);
    }

    #[test]
    fn malformed_schedules_are_internal_errors() {
        let base = two_rank_schedule();
        let mut bad = Vec::new();
        let mut s = base.clone();
        s.steps[2].deps = vec![2];
        bad.push(("self dependency", s));
        let mut s = base.clone();
        s.steps[0].srcs[1].rank = 2;
        bad.push(("rank out of range", s));
        let mut s = base.clone();
        s.steps[0].exec = 5;
        bad.push(("exec out of range", s));
        let mut s = base.clone();
        s.steps[0].srcs.push(reg(0, BufId::Scratch, 0, 4));
        bad.push(("3 sources, 2 destinations", s));
        let mut s = base.clone();
        s.steps[0].dsts[1].len = 3;
        bad.push(("lengths differ", s));
        let mut s = base.clone();
        s.steps[0].srcs.clear();
        bad.push(("no source", s));
        let mut s = base.clone();
        s.end_waits[0] = vec![9];
        bad.push(("end wait out of range", s));
        let mut s = base.clone();
        s.start_waits.pop();
        bad.push(("waits for one rank", s));
        for (what, s) in bad {
            assert!(
                matches!(Prepared::new(s), Err(Error::Internal { .. })),
                "{what} accepted"
            );
        }
    }

    #[test]
    fn the_cache_builds_once_per_key() {
        let cache: PlanCache = PlanCache::default();
        let key = ScheduleKey {
            kind: CollectiveKind::AllReduce,
            count: 8,
            layout: Layout::OutOfPlace,
            root: None,
            chunk: 4,
        };
        let build = || Prepared::new(two_rank_schedule());
        let (a, new) = cache.get_or_build(key, build).unwrap();
        assert!(new);
        let (b, new) = cache
            .get_or_build(key, || unreachable!("cached"))
            .unwrap();
        assert!(!new && Arc::ptr_eq(&a, &b));
        let other = ScheduleKey { count: 9, ..key };
        assert!(cache.get_or_build(other, build).unwrap().1);
        // A schedule that fails its check is not cached.
        let third = ScheduleKey { count: 10, ..key };
        let mut broken = two_rank_schedule();
        broken.steps[0].exec = 7;
        assert!(cache.get_or_build(third, || Prepared::new(broken)).is_err());
        assert!(cache.get_or_build(third, build).unwrap().1);
    }
}
