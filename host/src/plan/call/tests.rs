//! Every branch of [`choose`], one row each: what the call asks, what the communicator offers,
//! the configuration, and the plan (or error) expected.

use std::cell::Cell;
use std::sync::Arc;

use super::*;
use crate::config::DEFAULT_ONESHOT_MAX_BYTES;
use Collective as C;

const SMS: u32 = 132;
const F32: DataType = DataType::F32;
const OUT: Layout = Layout::OutOfPlace;
const IN: Layout = Layout::SendInRecv { stride: 0 };

/// What the communicator offers in one row.
#[derive(Clone, Copy)]
enum Comm {
    /// One process of `n` ranks: (one-shot usable, copy engines usable, capturing).
    Local(usize, bool, bool, bool),
    /// Rank 0 of `n` processes on one machine.
    Procs(usize),
    /// Rank 0 of `n` processes over the network: every pair (`true`) or across machines
    /// (two machines of n/2 ranks).
    Net(usize, bool),
    /// Rank 0 of `n` processes, a peer on another machine, no network path.
    Remote(usize),
    /// Rank 0 of `n` processes on one machine, its stream being captured into a CUDA graph.
    ProcsCapturing(usize),
    /// Rank 0 of `n` processes over the network (every pair), its stream being captured.
    NetCapturing(usize),
}

/// What a row expects.
#[derive(Debug)]
enum Want {
    Shot(Shot, bool),
    CopyEngine,
    Ring,
    ProcessShot(Shot, usize),
    ProcessLl,
    ProcessLlReduceScatter,
    ProcessLlGather,
    /// A broadcast (of this many bytes) or reduce on the LL kernel, with this root.
    ProcessLlBroadcast(usize, usize),
    ProcessLlReduce(usize),
    /// Chunks of this many elements.
    ProcessShotChunks(usize),
    ProcessPeers,
    ProcessRing,
    Network(bool),
    Hybrid(bool),
    NetworkError,
    /// Refused under capture: `InvalidArgument` on the stream, naming rank 0, its reason
    /// containing the text.
    NotCapturable(&'static str),
}

fn forced(a: Algorithm) -> Config {
    Config {
        algorithm: Some(a),
        ..Config::default()
    }
}

/// Chooses `c` on `comm`; also returns how often the SM count was asked.
fn run(c: Collective, layout: Layout, comm: Comm, config: &Config) -> (Result<(CallPlan, bool)>, u32) {
    let asked = Cell::new(0);
    let sms = || {
        asked.set(asked.get() + 1);
        SMS
    };
    let local_plans = PlanCache::default();
    let process_plans = PlanCache::default();
    let call = CallShape {
        collective: c,
        dtype: F32,
        layout,
    };
    let ring: Vec<usize>;
    let machines;
    let result = match comm {
        Comm::Local(n, oneshot_usable, copy_engine_usable, capturing) => {
            ring = (0..n).collect();
            let view = CommView::Local(LocalView {
                ring: &ring,
                oneshot_usable,
                copy_engine_usable,
                capturing,
                sms: &sms,
                plans: &local_plans,
            });
            choose(&call, &view, config)
        }
        Comm::Procs(n) | Comm::Net(n, _) | Comm::Remote(n) | Comm::ProcsCapturing(n) | Comm::NetCapturing(n) => {
            ring = (0..n).collect();
            let ids: Vec<u64> = (0..n).map(|r| u64::from(r >= n / 2)).collect();
            machines = Machines::new(&ids);
            let net = match comm {
                Comm::Net(_, all) => Some(NetView {
                    all,
                    machines: &machines,
                }),
                Comm::NetCapturing(_) => Some(NetView {
                    all: true,
                    machines: &machines,
                }),
                _ => None,
            };
            let capturing = matches!(comm, Comm::ProcsCapturing(_) | Comm::NetCapturing(_));
            let remote = matches!(comm, Comm::Remote(_)).then_some(n - 1);
            let view = CommView::Process(ProcessView {
                rank: 0,
                nranks: n,
                ring: &ring,
                net,
                remote_peer: &|| remote,
                sms: &sms,
                plans: &process_plans,
                capturing,
            });
            choose(&call, &view, config)
        }
    };
    (result, asked.get())
}

fn two(of: TwoShotOf, bytes: usize, n: usize) -> Shot {
    Shot::Two {
        blocks: tuning::twoshot_blocks(bytes, n, SMS),
        of,
    }
}

fn matches(plan: &Result<(CallPlan, bool)>, want: &Want, count: usize) -> bool {
    match (plan, want) {
        (Ok((CallPlan::Shot { shot, count: k, in_place }, _)), Want::Shot(w, ip)) => {
            shot == w && *k == count && in_place == ip
        }
        (Ok((CallPlan::CopyEngine(_), _)), Want::CopyEngine) => true,
        (Ok((CallPlan::Ring { prepared, .. }, new)), Want::Ring) => *new && !prepared.schedule.steps.is_empty(),
        (Ok((CallPlan::ProcessShot { shot, count: k, scratch }, _)), Want::ProcessShot(w, s)) => {
            shot == w && *k == count && scratch == s
        }
        (Ok((CallPlan::ProcessLl { count: k }, new)), Want::ProcessLl) => *k == count && !*new,
        (Ok((CallPlan::ProcessLlGather { sendcount }, new)), Want::ProcessLlGather) => *sendcount == count && !*new,
        (Ok((CallPlan::ProcessLlReduceScatter { recvcount }, new)), Want::ProcessLlReduceScatter) => {
            *recvcount == count && !*new
        }
        (Ok((CallPlan::ProcessLlBroadcast { bytes, root }, new)), Want::ProcessLlBroadcast(b, r)) => {
            bytes == b && root == r && !*new
        }
        (Ok((CallPlan::ProcessLlReduce { count: k, root }, new)), Want::ProcessLlReduce(r)) => {
            *k == count && root == r && !*new
        }
        (Ok((CallPlan::ProcessPeers { collective }, new)), Want::ProcessPeers) => collective.count() == count && !*new,
        (Ok((CallPlan::ProcessShotChunks { shot: Shot::Two { .. }, count: k, chunk, scratch }, new)), Want::ProcessShotChunks(c)) => {
            *k == count && chunk == c && *scratch <= crate::transport::ipc::MIN_SCRATCH_BYTES && !*new
        }
        (Ok((CallPlan::ProcessRing { plan, .. }, new)), Want::ProcessRing) => {
            *new && !plan.prepared.schedule.steps.is_empty()
        }
        (Ok((CallPlan::Network(p), _)), Want::Network(h)) => p.hierarchical == *h && p.unit == count * 4,
        (Ok((CallPlan::Hybrid(p), _)), Want::Hybrid(h)) => p.hierarchical == *h && p.unit == count * 4,
        (Err(Error::Network { rank: Some(0), peer: Some(_), .. }), Want::NetworkError) => true,
        (Err(Error::InvalidArgument { rank: Some(0), arg: crate::Arg::Stream, reason }), Want::NotCapturable(text)) => {
            reason.contains(text) && reason.contains("cannot be captured into a CUDA graph in a job of processes")
        }
        _ => false,
    }
}

#[test]
fn every_branch_of_the_choice() {
    let d = Config::default();
    let small = 1024; // elements: 4 KiB
    let mid = 1 << 18; // 1 MiB
    let big = 4 << 20; // 16 MiB
    let huge = 1 << 28; // 1 GiB
    let all = Comm::Local(2, true, true, false);
    let no_p2p = Comm::Local(2, false, false, false);
    let capturing = Comm::Local(2, true, true, true);
    let ts = |of, count: usize, n| two(of, count * 4, n);
    let pc2 = Comm::ProcsCapturing(2);
    let tmax = d.twoshot_max_bytes / 4;
    let ll_max = gpu_kernels::ll::LL_MAX_BYTES / 4;
    let ll_off = Config { ll_max_bytes: 0, ..Config::default() };
    let ll_1k = Config { ll_max_bytes: 1024, ..Config::default() };
    let ll_big = Config { ll_max_bytes: 1 << 30, ..Config::default() };
    let gather_on = Config { ll_all_gather: true, ..Config::default() };
    let gather_forced = Config { ll_all_gather: true, algorithm: Some(Algorithm::TwoShot), ..Config::default() };
    let gather_off = Config { ll_all_gather: false, ..Config::default() };
    #[rustfmt::skip]
    let rows: Vec<(&str, Collective, Layout, Comm, Config, Want)> = vec![
        // One process, all-reduce.
        ("small all-reduce: one-shot", C::AllReduce { count: small }, OUT, all, d.clone(), Want::Shot(Shot::One, false)),
        ("in place", C::AllReduce { count: small }, IN, all, d.clone(), Want::Shot(Shot::One, true)),
        ("mid all-reduce: two-shot", C::AllReduce { count: mid }, OUT, all, d.clone(), Want::Shot(ts(TwoShotOf::AllReduce, mid, 2), false)),
        ("mid all-reduce under capture: ring", C::AllReduce { count: mid }, OUT, capturing, d.clone(), Want::Ring),
        ("small all-reduce under capture: one-shot", C::AllReduce { count: small }, OUT, capturing, d.clone(), Want::Shot(Shot::One, false)),
        ("16 MiB all-reduce: ring", C::AllReduce { count: big }, OUT, all, d.clone(), Want::Ring),
        ("1 GiB all-reduce: copy engines", C::AllReduce { count: huge }, OUT, all, d.clone(), Want::CopyEngine),
        ("no peer access: ring", C::AllReduce { count: small }, OUT, no_p2p, d.clone(), Want::Ring),
        ("one rank: ring", C::AllReduce { count: small }, OUT, Comm::Local(1, true, true, false), d.clone(), Want::Ring),
        ("nine ranks: no one-shot", C::AllReduce { count: small }, OUT, Comm::Local(9, true, true, false), d.clone(), Want::Ring),
        ("forced copy engines", C::AllReduce { count: small }, OUT, all, forced(Algorithm::CopyEngine), Want::CopyEngine),
        ("forced two-shot", C::AllReduce { count: small }, OUT, all, forced(Algorithm::TwoShot), Want::Shot(ts(TwoShotOf::AllReduce, small, 2), false)),
        ("forced one-shot, impossible: ring", C::AllReduce { count: small }, OUT, no_p2p, forced(Algorithm::OneShot), Want::Ring),
        // One process, the other collectives.
        ("reduce-scatter: ring by default", C::ReduceScatter { recvcount: mid }, OUT, all, d.clone(), Want::Ring),
        ("forced two-shot reduce-scatter", C::ReduceScatter { recvcount: small }, OUT, all, forced(Algorithm::TwoShot), Want::Shot(ts(TwoShotOf::ReduceScatter, 2 * small, 2), false)),
        ("forced two-shot broadcast", C::Broadcast { count: small, root: 1 }, IN, all, forced(Algorithm::TwoShot), Want::Shot(ts(TwoShotOf::Broadcast { root: 1 }, small, 2), true)),
        ("forced two-shot under capture: ring", C::Reduce { count: small, root: 0 }, OUT, capturing, forced(Algorithm::TwoShot), Want::Ring),
        ("forced two-shot gather: ring", C::Gather { sendcount: small, root: 0 }, OUT, all, forced(Algorithm::TwoShot), Want::Ring),
        ("16 MiB all-gather: copy engines", C::AllGather { sendcount: big / 2 }, OUT, all, d.clone(), Want::CopyEngine),
        ("small all-gather: ring", C::AllGather { sendcount: small }, OUT, all, d.clone(), Want::Ring),
        ("1 MiB broadcast: copy engines", C::Broadcast { count: mid, root: 0 }, OUT, all, d.clone(), Want::CopyEngine),
        ("broadcast under capture: ring", C::Broadcast { count: mid, root: 0 }, OUT, capturing, d.clone(), Want::Ring),
        ("16 MiB all-to-all: copy engines", C::AllToAll { count_per_peer: big / 2 }, OUT, all, d.clone(), Want::CopyEngine),
        ("forced copy engines reduce: ring", C::Reduce { count: small, root: 0 }, OUT, all, forced(Algorithm::CopyEngine), Want::Ring),
        ("scatter: ring", C::Scatter { recvcount: small, root: 0 }, OUT, all, d.clone(), Want::Ring),
        // Processes of one machine.
        ("processes, small all-reduce: LL", C::AllReduce { count: small }, OUT, Comm::Procs(2), d.clone(), Want::ProcessLl),
        ("processes, small all-reduce in place: LL", C::AllReduce { count: small }, IN, Comm::Procs(8), d.clone(), Want::ProcessLl),
        ("processes, all-reduce at the LL limit: LL", C::AllReduce { count: ll_max }, OUT, Comm::Procs(2), d.clone(), Want::ProcessLl),
        ("processes, all-reduce above the LL limit: one-shot", C::AllReduce { count: ll_max + 1 }, OUT, Comm::Procs(2), d.clone(), Want::ProcessShot(Shot::One, (ll_max + 1) * 4)),
        ("processes, LL off: one-shot", C::AllReduce { count: small }, OUT, Comm::Procs(2), ll_off.clone(), Want::ProcessShot(Shot::One, small * 4)),
        ("processes, LL limit lowered: one-shot above it", C::AllReduce { count: small }, OUT, Comm::Procs(2), ll_1k.clone(), Want::ProcessShot(Shot::One, small * 4)),
        ("processes, LL limit above its area: the area's", C::AllReduce { count: ll_max + 1 }, OUT, Comm::Procs(2), ll_big.clone(), Want::ProcessShot(Shot::One, (ll_max + 1) * 4)),
        ("processes, small all-gather, LL all-gather on: LL", C::AllGather { sendcount: small }, OUT, Comm::Procs(4), gather_on.clone(), Want::ProcessLlGather),
        ("processes, all-gather at the LL limit, LL all-gather on: LL", C::AllGather { sendcount: ll_max }, IN, Comm::Procs(2), gather_on.clone(), Want::ProcessLlGather),
        ("processes, all-gather above the LL limit: two-shot", C::AllGather { sendcount: ll_max + 1 }, OUT, Comm::Procs(2), gather_on.clone(), Want::ProcessShot(ts(TwoShotOf::AllGather, 2 * (ll_max + 1), 2), 2 * (ll_max + 1) * 4)),
        ("processes, small all-gather, forced two-shot: two-shot", C::AllGather { sendcount: small }, OUT, Comm::Procs(2), gather_forced, Want::ProcessShot(ts(TwoShotOf::AllGather, 2 * small, 2), 2 * small * 4)),
        ("processes, small all-gather, nine ranks: ring", C::AllGather { sendcount: small }, OUT, Comm::Procs(9), gather_on.clone(), Want::ProcessRing),
        ("captured small all-gather, LL all-gather on: LL", C::AllGather { sendcount: small }, IN, pc2, gather_on.clone(), Want::ProcessLlGather),
        ("processes, forced one-shot: one-shot, not LL", C::AllReduce { count: small }, OUT, Comm::Procs(2), forced(Algorithm::OneShot), Want::ProcessShot(Shot::One, small * 4)),
        ("captured forced one-shot: one-shot, not LL", C::AllReduce { count: small }, IN, pc2, forced(Algorithm::OneShot), Want::ProcessShot(Shot::One, small * 4)),
        ("processes, forced two-shot: no LL", C::AllReduce { count: small }, OUT, Comm::Procs(2), forced(Algorithm::TwoShot), Want::ProcessShot(ts(TwoShotOf::AllReduce, small, 2), scratch_for(ts(TwoShotOf::AllReduce, small, 2), small * 4, 2).unwrap_or(0))),
        ("processes, small reduce-scatter: LL", C::ReduceScatter { recvcount: small }, OUT, Comm::Procs(2), d.clone(), Want::ProcessLlReduceScatter),
        ("processes, small reduce-scatter in place: LL", C::ReduceScatter { recvcount: small }, IN, Comm::Procs(8), d.clone(), Want::ProcessLlReduceScatter),
        ("processes, reduce-scatter at the LL limit: LL", C::ReduceScatter { recvcount: ll_max }, OUT, Comm::Procs(2), d.clone(), Want::ProcessLlReduceScatter),
        ("processes, reduce-scatter above the LL limit: two-shot", C::ReduceScatter { recvcount: ll_max + 1 }, OUT, Comm::Procs(2), d.clone(), Want::ProcessShot(ts(TwoShotOf::ReduceScatter, 2 * (ll_max + 1), 2), 2 * (ll_max + 1) * 4)),
        ("processes, small reduce-scatter, LL off: two-shot", C::ReduceScatter { recvcount: small }, OUT, Comm::Procs(2), ll_off.clone(), Want::ProcessShot(ts(TwoShotOf::ReduceScatter, 2 * small, 2), 2 * small * 4)),
        ("processes, small reduce-scatter, forced two-shot: two-shot", C::ReduceScatter { recvcount: small }, OUT, Comm::Procs(2), forced(Algorithm::TwoShot), Want::ProcessShot(ts(TwoShotOf::ReduceScatter, 2 * small, 2), 2 * small * 4)),
        ("processes, small reduce-scatter, nine ranks: ring", C::ReduceScatter { recvcount: small }, OUT, Comm::Procs(9), d.clone(), Want::ProcessRing),
        ("processes, mid all-reduce: two-shot", C::AllReduce { count: mid }, OUT, Comm::Procs(2), d.clone(), Want::ProcessShot(ts(TwoShotOf::AllReduce, mid, 2), scratch_for(ts(TwoShotOf::AllReduce, mid, 2), mid * 4, 2).unwrap_or(0))),
        ("processes, 64 MiB all-reduce: ring", C::AllReduce { count: 4 * big }, OUT, Comm::Procs(2), d.clone(), Want::ProcessRing),
        ("processes, forced copy engines: ring", C::AllReduce { count: small }, OUT, Comm::Procs(2), forced(Algorithm::CopyEngine), Want::ProcessRing),
        ("processes, sixteen ranks: ring", C::AllReduce { count: small }, OUT, Comm::Procs(16), d.clone(), Want::ProcessRing),
        ("processes, small all-gather: LL by default", C::AllGather { sendcount: small }, OUT, Comm::Procs(4), d.clone(), Want::ProcessLlGather),
        ("processes, all-gather, LL all-gather off: two-shot", C::AllGather { sendcount: small }, OUT, Comm::Procs(4), gather_off.clone(), Want::ProcessShot(ts(TwoShotOf::AllGather, 4 * small, 4), 4 * small * 4)),
        ("processes, small reduce: LL", C::Reduce { count: small, root: 1 }, OUT, Comm::Procs(2), d.clone(), Want::ProcessLlReduce(1)),
        ("processes, small broadcast in place: LL", C::Broadcast { count: small, root: 3 }, IN, Comm::Procs(4), d.clone(), Want::ProcessLlBroadcast(small * 4, 3)),
        ("processes, broadcast at the LL limit: LL", C::Broadcast { count: ll_max, root: 0 }, OUT, Comm::Procs(2), d.clone(), Want::ProcessLlBroadcast(ll_max * 4, 0)),
        ("processes, broadcast above the LL limit: two-shot", C::Broadcast { count: ll_max + 1, root: 0 }, OUT, Comm::Procs(2), d.clone(), Want::ProcessShot(ts(TwoShotOf::Broadcast { root: 0 }, ll_max + 1, 2), (ll_max + 1) * 4)),
        ("processes, reduce, LL off: two-shot", C::Reduce { count: small, root: 1 }, OUT, Comm::Procs(2), ll_off.clone(), Want::ProcessShot(ts(TwoShotOf::Reduce { root: 1 }, small, 2), small * 4)),
        ("processes, broadcast, forced two-shot: two-shot", C::Broadcast { count: small, root: 1 }, OUT, Comm::Procs(2), forced(Algorithm::TwoShot), Want::ProcessShot(ts(TwoShotOf::Broadcast { root: 1 }, small, 2), small * 4)),
        ("processes, gather: ring", C::Gather { sendcount: small, root: 0 }, OUT, Comm::Procs(2), d.clone(), Want::ProcessRing),
        ("processes, large all-gather: ring", C::AllGather { sendcount: big }, OUT, Comm::Procs(2), d.clone(), Want::ProcessRing),
        // Processes of one machine, under CUDA-graph capture: the one-shot and two-shot
        // kernels for every size they can, forced algorithms notwithstanding; the rest refused.
        ("captured small all-reduce: LL", C::AllReduce { count: small }, IN, pc2, d.clone(), Want::ProcessLl),
        ("captured small all-reduce, LL off: one-shot", C::AllReduce { count: small }, IN, pc2, ll_off.clone(), Want::ProcessShot(Shot::One, small * 4)),
        ("captured mid all-reduce: two-shot", C::AllReduce { count: mid }, OUT, pc2, d.clone(), Want::ProcessShot(ts(TwoShotOf::AllReduce, mid, 2), scratch_for(ts(TwoShotOf::AllReduce, mid, 2), mid * 4, 2).unwrap_or(0))),
        ("captured all-reduce at the two-shot limit: two-shot", C::AllReduce { count: tmax }, OUT, pc2, d.clone(), Want::ProcessShot(ts(TwoShotOf::AllReduce, tmax, 2), scratch_for(ts(TwoShotOf::AllReduce, tmax, 2), tmax * 4, 2).unwrap_or(0))),
        ("captured all-reduce above the two-shot limit: two-shot chunks", C::AllReduce { count: tmax + 1 }, OUT, pc2, d.clone(), Want::ProcessShotChunks((8 << 20) / 4)),
        ("captured 1 GiB all-reduce in place: two-shot chunks", C::AllReduce { count: huge }, IN, Comm::ProcsCapturing(8), d.clone(), Want::ProcessShotChunks((8 << 20) / 4)),
        ("captured large broadcast: two-shot chunks", C::Broadcast { count: big, root: 1 }, OUT, pc2, d.clone(), Want::ProcessShotChunks((8 << 20) / 4)),
        ("captured large reduce: two-shot chunks", C::Reduce { count: big, root: 0 }, OUT, pc2, d.clone(), Want::ProcessShotChunks((8 << 20) / 4)),
        ("captured large all-reduce, two-shot off: refused", C::AllReduce { count: big }, OUT, pc2, Config { twoshot_max_bytes: 0, oneshot_max_bytes: 0, ..Config::default() }, Want::NotCapturable("sizes up to 0 bytes can")),
        ("captured large all-reduce, nine ranks: refused", C::AllReduce { count: big }, OUT, Comm::ProcsCapturing(9), d.clone(), Want::NotCapturable("jobs of 2")),
        ("captured large reduce-scatter: a point-to-point group and a reduction", C::ReduceScatter { recvcount: big }, OUT, pc2, d.clone(), Want::ProcessPeers),
        ("captured forced ring: two-shot all the same", C::AllReduce { count: mid }, OUT, pc2, forced(Algorithm::Ring), Want::ProcessShot(ts(TwoShotOf::AllReduce, mid, 2), scratch_for(ts(TwoShotOf::AllReduce, mid, 2), mid * 4, 2).unwrap_or(0))),
        ("captured forced copy engines: LL", C::AllReduce { count: small }, OUT, pc2, forced(Algorithm::CopyEngine), Want::ProcessLl),
        ("captured forced two-shot above the limit: two-shot", C::AllReduce { count: big }, OUT, pc2, forced(Algorithm::TwoShot), Want::ProcessShot(ts(TwoShotOf::AllReduce, big, 2), scratch_for(ts(TwoShotOf::AllReduce, big, 2), big * 4, 2).unwrap_or(0))),
        ("captured small reduce-scatter: LL", C::ReduceScatter { recvcount: small }, OUT, Comm::ProcsCapturing(4), d.clone(), Want::ProcessLlReduceScatter),
        ("captured reduce-scatter, LL off: two-shot", C::ReduceScatter { recvcount: small }, OUT, Comm::ProcsCapturing(4), ll_off.clone(), Want::ProcessShot(ts(TwoShotOf::ReduceScatter, 4 * small, 4), 4 * small * 4)),
        ("captured all-gather, LL all-gather off: two-shot", C::AllGather { sendcount: small }, IN, Comm::ProcsCapturing(4), gather_off.clone(), Want::ProcessShot(ts(TwoShotOf::AllGather, 4 * small, 4), 4 * small * 4)),
        ("captured small broadcast: LL", C::Broadcast { count: small, root: 1 }, OUT, pc2, d.clone(), Want::ProcessLlBroadcast(small * 4, 1)),
        ("captured broadcast, LL off: two-shot", C::Broadcast { count: small, root: 1 }, OUT, pc2, ll_off.clone(), Want::ProcessShot(ts(TwoShotOf::Broadcast { root: 1 }, small, 2), small * 4)),
        ("captured small reduce: LL", C::Reduce { count: small, root: 0 }, IN, Comm::ProcsCapturing(4), d.clone(), Want::ProcessLlReduce(0)),
        ("captured all-to-all: two-shot", C::AllToAll { count_per_peer: small }, OUT, pc2, d.clone(), Want::ProcessShot(ts(TwoShotOf::AllToAll, 2 * small, 2), 2 * small * 4)),
        ("captured large all-gather: a point-to-point group", C::AllGather { sendcount: big }, OUT, pc2, d.clone(), Want::ProcessPeers),
        ("captured gather: a point-to-point group", C::Gather { sendcount: small, root: 0 }, OUT, pc2, d.clone(), Want::ProcessPeers),
        ("captured scatter: a point-to-point group", C::Scatter { recvcount: big, root: 1 }, IN, Comm::ProcsCapturing(8), d.clone(), Want::ProcessPeers),
        ("captured large all-to-all: a point-to-point group", C::AllToAll { count_per_peer: big }, OUT, Comm::ProcsCapturing(4), d.clone(), Want::ProcessPeers),
        ("captured gather, nine ranks: refused", C::Gather { sendcount: small, root: 0 }, OUT, Comm::ProcsCapturing(9), d.clone(), Want::NotCapturable("jobs of 2")),
        ("captured small scatter: a point-to-point group", C::Scatter { recvcount: small, root: 0 }, OUT, pc2, d.clone(), Want::ProcessPeers),
        ("captured, sixteen ranks: refused", C::AllReduce { count: small }, OUT, Comm::ProcsCapturing(16), d.clone(), Want::NotCapturable("jobs of 2 to 8 processes can")),
        ("captured, one rank: its ring (a copy)", C::AllReduce { count: big }, OUT, Comm::ProcsCapturing(1), d.clone(), Want::ProcessRing),
        ("captured gather, one rank: its ring", C::Gather { sendcount: small, root: 0 }, OUT, Comm::ProcsCapturing(1), d.clone(), Want::ProcessRing),
        ("captured over the network: refused", C::AllReduce { count: small }, OUT, Comm::NetCapturing(4), d.clone(), Want::NotCapturable("over the network path")),
        // Processes over the network.
        ("every pair over the network: flat", C::AllReduce { count: small }, OUT, Comm::Net(4, true), d.clone(), Want::Network(false)),
        ("two machines of two: hierarchical", C::AllReduce { count: small }, OUT, Comm::Net(4, false), d.clone(), Want::Hybrid(true)),
        ("two machines of one: flat", C::AllReduce { count: small }, OUT, Comm::Net(2, false), d.clone(), Want::Hybrid(false)),
        ("a peer on another machine, no network", C::AllReduce { count: small }, OUT, Comm::Remote(2), d.clone(), Want::NetworkError),
    ];
    for (what, c, layout, comm, config, want) in rows {
        let (plan, sms_asked) = run(c, layout, comm, &config);
        assert!(matches(&plan, &want, c.count()), "{what}: {plan:?}, expected {want:?}");
        // The SM count is asked only for a two-shot plan.
        let two_shot = matches!(&plan, Ok((CallPlan::Shot { shot: Shot::Two { .. }, .. } | CallPlan::ProcessShot { shot: Shot::Two { .. }, .. } | CallPlan::ProcessShotChunks { .. }, _)));
        assert_eq!(sms_asked, u32::from(two_shot), "{what}: SMs asked {sms_asked} times");
    }
}

#[test]
fn the_default_thresholds_are_the_boundaries() {
    let d = Config::default();
    let all = Comm::Local(2, true, true, false);
    let at = DEFAULT_ONESHOT_MAX_BYTES / 4;
    let (p, _) = run(C::AllReduce { count: at }, OUT, all, &d);
    assert_eq!(p.map(|(p, _)| p.algorithm()), Ok(Algorithm::OneShot));
    let (p, _) = run(C::AllReduce { count: at + 1 }, OUT, all, &d);
    assert_eq!(p.map(|(p, _)| p.algorithm()), Ok(Algorithm::TwoShot));
}

#[test]
fn ring_plans_are_cached_by_shape() {
    let plans = PlanCache::default();
    let ring = [0, 1, 2];
    let view = CommView::Local(LocalView {
        ring: &ring,
        oneshot_usable: false,
        copy_engine_usable: false,
        capturing: false,
        sms: &|| SMS,
        plans: &plans,
    });
    let call = CallShape {
        collective: C::AllReduce { count: 4096 },
        dtype: F32,
        layout: OUT,
    };
    let d = Config::default();
    let first = choose(&call, &view, &d);
    let again = choose(&call, &view, &d);
    let (Ok((CallPlan::Ring { prepared: a, .. }, true)), Ok((CallPlan::Ring { prepared: b, .. }, false))) = (first, again)
    else {
        panic!("expected a new ring plan, then the cached one");
    };
    assert!(Arc::ptr_eq(&a, &b));
    let other = CallShape { layout: IN, ..call };
    assert!(matches!(choose(&other, &view, &d), Ok((CallPlan::Ring { .. }, true))));
}

#[test]
fn the_debug_line_is_a_summary() {
    let (p, _) = run(C::AllReduce { count: 1 << 22 }, OUT, Comm::Local(4, false, false, false), &Config::default());
    let line = format!("{:?}", p.map(|(p, _)| p));
    assert!(line.contains("Ring") && line.contains("steps") && line.len() < 120, "{line}");
}

#[test]
fn a_captured_ring_of_one_rank_has_no_signal() {
    // `exec::run` captures a ring of a job of processes only when it has no signal.
    let d = Config::default();
    for (c, layout) in [
        (C::AllReduce { count: 4 << 20 }, OUT),
        (C::AllReduce { count: 1000 }, IN),
        (C::AllGather { sendcount: 1000 }, OUT),
        (C::Scatter { recvcount: 1000, root: 0 }, OUT),
        (C::Broadcast { count: 1000, root: 0 }, IN),
    ] {
        let (plan, _) = run(c, layout, Comm::ProcsCapturing(1), &d);
        match plan {
            Ok((CallPlan::ProcessRing { plan, .. }, _)) => {
                assert!(plan.signals.count.iter().all(|&k| k == 0), "{c:?}: signals {:?}", plan.signals.count)
            }
            other => panic!("{c:?}: {other:?}"),
        }
    }
}
