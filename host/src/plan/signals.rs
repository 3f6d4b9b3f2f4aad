//! Ordering across processes, planned: every place where one rank's stream must wait for
//! another rank's, as a numbered signal.
//!
//! Between processes an event cannot order two streams without the host, so a rank's stream
//! *signals* a peer by writing a counter into the peer's memory (after its earlier work, with a
//! memory fence: `cuStreamWriteValue64`), and the peer's stream waits until the counter reaches
//! a value (the bounded wait kernel, `gpu_kernels::oneshot::WAIT_ENTRY`). Counters only grow (no reset, no ABA): the `k`-th signal from
//! rank `p` to rank `e` in a call writes `base + k`, where `base` counts that pair's signals of
//! earlier calls; both processes know `base`, because every rank runs the same calls with the
//! same schedules.
//!
//! A schedule's cross-rank orderings become signals, in the order the signalling rank's stream
//! issues them:
//! * **start**: rank `q` signals rank `r` when it reaches the call, for each `q` in
//!   `start_waits[r]` (`r` touches `q`'s memory, so `q`'s earlier work must be done);
//! * **steps**: after step `d` of rank `p`, one signal to each other rank `e` that has a step
//!   depending on `d` or whose end waits for `d`.
//!
//! [`SignalPlan::new`] numbers them; the executor adds the per-pair bases.

use std::collections::BTreeMap;

use crate::schedule::Schedule;

/// One signal: the rank on the other side and its number (1-based) within the call for the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    /// The peer: the receiver for a signal to send, the sender for one to wait for.
    pub peer: usize,
    /// The signal's number in this call for its (sender, receiver) pair, from 1.
    pub k: u64,
}

/// Every signal of one schedule, by where the executor issues it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SignalPlan {
    /// Per rank: the signals it sends when it reaches the call.
    pub start_send: Vec<Vec<Signal>>,
    /// Per rank: the signals it waits for before its first step.
    pub start_wait: Vec<Vec<Signal>>,
    /// Per step: the signals its rank waits for before it.
    pub before: Vec<Vec<Signal>>,
    /// Per step: the signals its rank sends after it.
    pub after: Vec<Vec<Signal>>,
    /// Per rank: the signals it waits for at the end of the call.
    pub end_wait: Vec<Vec<Signal>>,
    /// Signals per (sender, receiver) pair in the call (`count[p * n + e]`).
    pub count: Vec<u64>,
}

impl SignalPlan {
    /// Numbers the signals of a finished, valid schedule (see the module docs).
    ///
    /// ```
    /// use ringccl::internals::plan::signals::SignalPlan;
    /// use ringccl::internals::schedule::{all_reduce, Layout};
    /// let s = all_reduce(&[0, 1], 8, Layout::OutOfPlace, 8);
    /// let p = SignalPlan::new(&s);
    /// // Each rank signals the other that it started, and after its step that it is done.
    /// assert_eq!(p.count, vec![0, 2, 2, 0]);
    /// ```
    pub fn new(s: &Schedule) -> SignalPlan {
        let n = s.nranks;
        let mut plan = SignalPlan {
            start_send: vec![Vec::new(); n],
            start_wait: vec![Vec::new(); n],
            before: vec![Vec::new(); s.steps.len()],
            after: vec![Vec::new(); s.steps.len()],
            end_wait: vec![Vec::new(); n],
            count: vec![0; n * n],
        };
        let next = |plan: &mut SignalPlan, from: usize, to: usize| -> u64 {
            let c = &mut plan.count[from * n + to];
            *c += 1;
            *c
        };
        // Start signals come first on every stream.
        for (r, waits) in s.start_waits.iter().enumerate() {
            for &q in waits {
                if q == r || q >= n {
                    continue;
                }
                let k = next(&mut plan, q, r);
                plan.start_send[q].push(Signal { peer: r, k });
                plan.start_wait[r].push(Signal { peer: q, k });
            }
        }
        // Who needs each step: other ranks' steps that depend on it, other ranks' ends.
        let mut consumers: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for step in &s.steps {
            for &d in &step.deps {
                if let Some(src) = s.steps.get(d) {
                    if src.exec != step.exec {
                        consumers.entry(d).or_default().push(step.exec);
                    }
                }
            }
        }
        for (r, waits) in s.end_waits.iter().enumerate() {
            for &d in waits {
                if s.steps.get(d).is_some_and(|src| src.exec != r) {
                    consumers.entry(d).or_default().push(r);
                }
            }
        }
        // Number each step's signals in step order (each rank's stream issues its steps in
        // list order, so per pair the numbers follow the sender's stream).
        let mut number: BTreeMap<(usize, usize), u64> = BTreeMap::new();
        for (d, mut to) in consumers {
            to.sort_unstable();
            to.dedup();
            let from = s.steps[d].exec;
            for e in to {
                let k = next(&mut plan, from, e);
                plan.after[d].push(Signal { peer: e, k });
                number.insert((d, e), k);
            }
        }
        for (i, step) in s.steps.iter().enumerate() {
            for &d in &step.deps {
                if let Some(&k) = number.get(&(d, step.exec)) {
                    plan.before[i].push(Signal {
                        peer: s.steps[d].exec,
                        k,
                    });
                }
            }
        }
        for (r, waits) in s.end_waits.iter().enumerate() {
            for &d in waits {
                if let Some(&k) = number.get(&(d, r)) {
                    plan.end_wait[r].push(Signal {
                        peer: s.steps[d].exec,
                        k,
                    });
                }
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{all_gather, all_reduce, broadcast, reduce_scatter, Layout};

    /// Replays the plan: per rank, the stream's order of sends and waits; checks that every
    /// wait is for a signal its sender issues, in increasing order per pair, and that every
    /// cross-rank dependency of the schedule is covered by a wait.
    fn check(s: &Schedule) {
        let n = s.nranks;
        let p = SignalPlan::new(s);
        let mut sent: Vec<Vec<u64>> = vec![Vec::new(); n * n];
        for (q, sends) in p.start_send.iter().enumerate() {
            for sig in sends {
                sent[q * n + sig.peer].push(sig.k);
            }
        }
        for (i, step) in s.steps.iter().enumerate() {
            for sig in &p.after[i] {
                sent[step.exec * n + sig.peer].push(sig.k);
            }
        }
        for (pair, ks) in sent.iter().enumerate() {
            let want: Vec<u64> = (1..=p.count[pair]).collect();
            let mut got = ks.clone();
            got.sort_unstable();
            assert_eq!(got, want, "pair {pair}: every number sent once");
        }
        // Per sender, the numbers to one receiver rise in the sender's stream order.
        for q in 0..n {
            let mut last = vec![0u64; n];
            let sends = p.start_send[q]
                .iter()
                .copied()
                .chain(s.steps.iter().enumerate().filter(|(_, st)| st.exec == q).flat_map(|(i, _)| p.after[i].iter().copied()));
            for sig in sends {
                assert!(sig.k > last[sig.peer], "rank {q} → {}: {} after {}", sig.peer, sig.k, last[sig.peer]);
                last[sig.peer] = sig.k;
            }
        }
        for (i, step) in s.steps.iter().enumerate() {
            for &d in &step.deps {
                let from = s.steps[d].exec;
                assert!(
                    p.before[i].iter().any(|sig| sig.peer == from && p.after[d].iter().any(|a| a.peer == step.exec && a.k == sig.k)),
                    "step {i} waits for step {d}"
                );
            }
        }
        for (r, waits) in s.end_waits.iter().enumerate() {
            for &d in waits.iter().filter(|&&d| s.steps[d].exec != r) {
                let from = s.steps[d].exec;
                assert!(p.end_wait[r].iter().any(|sig| sig.peer == from && p.after[d].iter().any(|a| a.peer == r && a.k == sig.k)));
            }
        }
        for (r, waits) in s.start_waits.iter().enumerate() {
            for &q in waits {
                assert!(p.start_wait[r].iter().any(|sig| sig.peer == q));
            }
        }
    }

    #[test]
    fn every_cross_rank_order_is_a_numbered_signal() {
        for n in 1..=6 {
            let ring: Vec<usize> = (0..n).collect();
            for count in [0, 1, 7, 64, 1000] {
                for chunk in [1, 3, 64, 1 << 20] {
                    if chunk == 1 && count > 64 {
                        continue;
                    }
                    check(&all_reduce(&ring, count, Layout::OutOfPlace, chunk));
                    check(&all_reduce(&ring, count, Layout::SendInRecv { stride: 0 }, chunk));
                    check(&reduce_scatter(&ring, count, Layout::OutOfPlace, chunk));
                    check(&all_gather(&ring, count, Layout::OutOfPlace, chunk));
                    check(&broadcast(&ring, count, n / 2, Layout::OutOfPlace, chunk));
                }
            }
        }
    }

    #[test]
    fn a_single_rank_signals_nothing() {
        let p = SignalPlan::new(&all_reduce(&[0], 100, Layout::OutOfPlace, 10));
        assert_eq!(p.count, vec![0]);
        assert!(p.after.iter().all(Vec::is_empty));
    }
}
