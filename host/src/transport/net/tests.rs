//! The network transport on the CPU: ranks as threads or processes of this test binary, UCX over
//! loopback TCP, host code standing in for each rank's GPU stream (it runs the point-to-point
//! plans' copies, signals and waits on the ranks' [`NetMem`]).
//!
//! These tests need UCX's `libucp.so.0`. Where `RINGCCL_REQUIRE_UCX=1` (CI sets it), a missing
//! UCX fails them; elsewhere they print why they skip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proxy::{frame_addresses, NetOptions, Outgoing, Proxy, DEFAULT_LANES};
use super::ucp::{Context, Ucp, Worker};
use super::{outbox_offset, Carry, NetMem, NET_SLOTS};
use crate::exec::net::program;
use crate::plan::net::ring_groups;
use crate::bootstrap::Bootstrap;
use crate::plan::p2p::{plan_net, slot_bytes, Action, Chunks, Dir, P2pOp, P2pPlan, Place};
use crate::transport::ipc::Exchange;
use crate::{Error, Result, UniqueId};

const TIMEOUT: Duration = Duration::from_secs(20);
/// Scratch of each rank in these tests (small, so that transfers take several chunks).
const SCRATCH: usize = 16 << 10;

/// Whether UCX can be loaded; fails if the environment requires it.
fn have_ucx() -> bool {
    match Ucp::load() {
        Ok(u) => {
            eprintln!("UCX {} loaded", u.version());
            true
        }
        Err(e) if std::env::var_os("RINGCCL_REQUIRE_UCX").is_some_and(|v| v == "1") => {
            panic!("RINGCCL_REQUIRE_UCX=1 but UCX cannot be loaded: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e} (set RINGCCL_REQUIRE_UCX=1 to make this a failure)");
            false
        }
    }
}

fn options() -> NetOptions {
    options_with(DEFAULT_LANES)
}

fn options_with(lanes: usize) -> NetOptions {
    NetOptions {
        timeout: TIMEOUT,
        ucx: [("TLS".into(), "tcp".into()), ("NET_DEVICES".into(), "lo".into())]
            .into_iter()
            .chain(super::proxy::ucx_defaults())
            .collect(),
        lanes,
        // `RINGCCL_NET_TEST_TRACE=1` prints the proxies' trace.
        trace: std::env::var_os("RINGCCL_NET_TEST_TRACE").is_some_and(|v| v == "1"),
    }
}

/// A rank: its proxy and the counters its "stream" has issued and waited on so far.
struct Rank {
    me: usize,
    n: usize,
    proxy: Proxy,
    sent: Vec<u64>,
    received: Vec<u64>,
    carry: Carry,
}

impl Rank {
    fn start(me: usize, n: usize, exchange: &dyn Exchange) -> Result<Rank> {
        Rank::start_with(me, n, exchange, SCRATCH, DEFAULT_LANES)
    }

    fn start_with(
        me: usize,
        n: usize,
        exchange: &dyn Exchange,
        scratch: usize,
        lanes: usize,
    ) -> Result<Rank> {
        let mem = Arc::new(NetMem::new(n, scratch)?);
        let proxy = Proxy::start(me, n, mem, exchange, options_with(lanes))?;
        Ok(Rank {
            me,
            n,
            proxy,
            sent: vec![0; n],
            received: vec![0; n],
            carry: Carry::new(n, NET_SLOTS),
        })
    }

    /// Runs one group: `ops[i]` with buffer `bufs[i]` (send data, or room for the receive).
    fn group(&mut self, ops: &[P2pOp], bufs: &mut [Vec<u8>]) -> Result<()> {
        let scratch = self.proxy.mem().scratch_bytes();
        let slot = slot_bytes(scratch, self.n, NET_SLOTS).ok_or_else(|| Error::Internal {
            reason: "no slot".into(),
        })?;
        let (p, carry) = plan_net(self.me, self.n, ops, (slot, NET_SLOTS, Chunks::ByPair), &self.carry, &self.received)?;
        let me = self.me;
        self.proxy.post(program(&p, me, &self.sent, |q| q != me)?)?;
        self.run(&p, bufs)?;
        self.carry = carry;
        for q in 0..self.n {
            self.sent[q] += p.sent[q];
            self.received[q] += p.received[q];
        }
        Ok(())
    }

    /// The "GPU stream": the plan's actions on host memory.
    fn run(&self, p: &P2pPlan, bufs: &mut [Vec<u8>]) -> Result<()> {
        let mem = self.proxy.mem();
        let bad = || Error::Internal {
            reason: "a copy outside its buffer".into(),
        };
        for a in &p.actions {
            match *a {
                Action::Signal { peer, k } => {
                    let w = mem.posted(peer).ok_or_else(bad)?;
                    w.store(self.sent[peer] + k, std::sync::atomic::Ordering::Release);
                }
                Action::Wait { peer, k, credit } => {
                    self.proxy.wait(peer, self.received[peer] + k, credit, TIMEOUT)?
                }
                Action::WaitCarried { peer, at } => self.proxy.wait(peer, at, true, TIMEOUT)?,
                Action::Copy { from, to, bytes } => {
                    let src: Vec<u8> = match from {
                        Place::Op { op, offset } => {
                            bufs.get(op).and_then(|b| b.get(offset..offset + bytes)).ok_or_else(bad)?.to_vec()
                        }
                        Place::Scratch { offset, .. } => {
                            let s = mem.scratch_range(offset, bytes).ok_or_else(bad)?;
                            // SAFETY: inside the scratch; the wait before this copy ordered the
                            // proxy's write of these bytes before it.
                            unsafe { std::slice::from_raw_parts(s, bytes) }.to_vec()
                        }
                    };
                    match to {
                        Place::Op { op, offset } => bufs
                            .get_mut(op)
                            .and_then(|b| b.get_mut(offset..offset + bytes))
                            .ok_or_else(bad)?
                            .copy_from_slice(&src),
                        Place::Scratch { rank, offset } => {
                            let at = outbox_offset(self.me, rank, p.slot, p.slots, offset).ok_or_else(bad)?;
                            let d = mem.outbox_range(at, bytes).ok_or_else(bad)?;
                            // SAFETY: inside the outbox; the plan's waits keep the proxy from
                            // reading this slot now (its previous chunk was consumed).
                            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), d, bytes) };
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Test data of rank `r`: `count` f32 values of varied magnitude (so that the order of a sum
/// shows in its bits).
fn values(r: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| {
            let h = (i as u64 * 2654435761 + r as u64 * 40503) % 100_003;
            (h as f32 - 50_000.0) * 10f32.powi((i % 7) as i32 - 3)
        })
        .collect()
}

fn chunk(c: usize, n: usize, count: usize) -> std::ops::Range<usize> {
    c * count / n..(c + 1) * count / n
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A ring all-reduce (sum) of `data` over the network, with the GPU executor's groups
/// ([`ring_groups`]): each receive combined (`received + own`) or copied on the host.
fn ring_all_reduce(rank: &mut Rank, data: &mut [f32]) -> Result<()> {
    let (r, n) = (rank.me, rank.n);
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for g in ring_groups(r, n, data.len()) {
        let (sr, rr) = (g.send.0..g.send.0 + g.send.1, g.recv.0..g.recv.0 + g.recv.1);
        let ops = [
            P2pOp { dir: Dir::Send, peer: next, bytes: sr.len() * 4 },
            P2pOp { dir: Dir::Recv, peer: prev, bytes: rr.len() * 4 },
        ];
        let mut bufs = vec![bytes_of(&data[sr]), vec![0u8; rr.len() * 4]];
        rank.group(&ops, &mut bufs)?;
        for (x, b) in data[rr].iter_mut().zip(bufs[1].chunks_exact(4)) {
            let got = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            *x = if g.reduce { got + *x } else { got };
        }
    }
    Ok(())
}

/// What the ring computes, in its order: chunk `c` is `((x_c + x_{c+1}) + …) + x_{c-1}`.
fn reference(n: usize, count: usize) -> Vec<f32> {
    let xs: Vec<Vec<f32>> = (0..n).map(|r| values(r, count)).collect();
    let mut out = vec![0f32; count];
    for c in 0..n {
        for i in chunk(c, n, count) {
            let mut acc = xs[c][i];
            for j in 1..n {
                acc += xs[(c + j) % n][i];
            }
            out[i] = acc;
        }
    }
    out
}

fn check_all_reduce(rank: &mut Rank, count: usize) -> Result<()> {
    let mut data = values(rank.me, count);
    ring_all_reduce(rank, &mut data)?;
    let want = reference(rank.n, count);
    let wrong = data.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(wrong, 0, "rank {}: {wrong} of {count} values differ", rank.me);
    Ok(())
}

/// Runs `f(rank)` on `n` threads joined through a real bootstrap over loopback.
fn threads(n: usize, f: impl Fn(&mut Rank) -> Result<()> + Sync) {
    threads_with(n, SCRATCH, DEFAULT_LANES, f)
}

/// [`threads`] with `scratch` bytes of scratch per rank and `lanes` proxy lanes.
fn threads_with(n: usize, scratch: usize, lanes: usize, f: impl Fn(&mut Rank) -> Result<()> + Sync) {
    let id = UniqueId::new_at("127.0.0.1:0".parse().expect("an address")).expect("a rendezvous");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let f = &f;
                s.spawn(move || -> Result<()> {
                    let boot = Bootstrap::join(&id, n, r, TIMEOUT)?;
                    let mut rank = Rank::start_with(r, n, &boot, scratch, lanes)?;
                    f(&mut rank)?;
                    rank.proxy.close()
                })
            })
            .collect();
        for (r, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(res) => res.unwrap_or_else(|e| panic!("rank {r}: {e}")),
                Err(_) => panic!("rank {r} panicked"),
            }
        }
    });
}

#[test]
fn two_threads_send_both_ways_in_many_sizes() {
    if !have_ucx() {
        return;
    }
    let sizes = [0usize, 1, 255, 4096, 4097, 40_000, 100_003];
    threads(2, |rank| {
        let peer = 1 - rank.me;
        for (i, &a) in sizes.iter().enumerate() {
            let b = sizes[(i + 3) % sizes.len()];
            let (mine, theirs) = if rank.me == 0 { (a, b) } else { (b, a) };
            let pattern = |from: usize, len: usize| -> Vec<u8> {
                (0..len).map(|j| (j * 7 + from * 101 + i) as u8).collect()
            };
            let ops = [
                P2pOp { dir: Dir::Send, peer, bytes: mine },
                P2pOp { dir: Dir::Recv, peer, bytes: theirs },
            ];
            let mut bufs = vec![pattern(rank.me, mine), vec![0u8; theirs]];
            rank.group(&ops, &mut bufs)?;
            assert!(bufs[1] == pattern(peer, theirs), "rank {}: group {i} wrong", rank.me);
        }
        Ok(())
    });
}

#[test]
fn megabyte_chunks_both_ways() {
    if !have_ucx() {
        return;
    }
    // The GPU path's slots: its scratch for 2 ranks is 1 MiB per chunk (UCX's rendezvous
    // protocol, where small chunks go eagerly).
    threads_with(2, crate::transport::net::pinned::NET_SCRATCH_BYTES, DEFAULT_LANES, |rank| {
        let peer = 1 - rank.me;
        let bytes = (9 << 20) + 12_345;
        let pattern = |from: usize| -> Vec<u8> {
            (0..bytes).map(|j| (j * 31 + from * 7 + j / 65_537) as u8).collect()
        };
        let ops = [
            P2pOp { dir: Dir::Send, peer, bytes },
            P2pOp { dir: Dir::Recv, peer, bytes },
        ];
        for round in 0..3 {
            let mut bufs = vec![pattern(rank.me), vec![0u8; bytes]];
            let t = Instant::now();
            rank.group(&ops, &mut bufs)?;
            let s = t.elapsed().as_secs_f64();
            assert!(bufs[1] == pattern(peer), "rank {}: round {round} wrong", rank.me);
            eprintln!(
                "rank {}: {bytes} B each way in {:.1} ms ({:.0} MB/s one way)",
                rank.me,
                s * 1e3,
                bytes as f64 / s / 1e6
            );
        }
        Ok(())
    });
}

#[test]
fn ring_all_reduce_of_three_threads_is_bit_exact() {
    if !have_ucx() {
        return;
    }
    threads(3, |rank| {
        check_all_reduce(rank, 50_001)?;
        check_all_reduce(rank, 7) // a second call on the same counters, tiny
    });
}

/// Rank `r`'s input of `len` u32 values.
fn input_u32(r: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| (r * 1000 + i) as u32).collect()
}

/// Collective `c` (sum of u32, out of place) with the network executor's groups
/// ([`crate::plan::net::groups`]), each receive of a reducing group added on the host; checked
/// against the collective's definition.
fn check_collective(rank: &mut Rank, c: crate::api::collective::Collective) -> Result<()> {
    use crate::api::collective::Collective as C;
    use crate::plan::net::{groups, At};
    let (r, n, k) = (rank.me, rank.n, c.count());
    let (ns, nr) = c.needs(r, n);
    let (send_len, recv_len) = (ns.elems(), nr.elems());
    let mut send = input_u32(r, send_len);
    let input = send.clone();
    let mut recv = vec![0u32; recv_len];
    for g in groups((c.kind(), k, c.root().unwrap_or(0)), (r, n), 4, false) {
        let ops: Vec<P2pOp> = g.ops.iter().map(|o| P2pOp { dir: o.dir, peer: o.peer, bytes: o.bytes }).collect();
        let mut bufs: Vec<Vec<u8>> = g
            .ops
            .iter()
            .map(|o| match (o.dir, o.at) {
                (Dir::Send, At::Send(b)) => send[b / 4..(b + o.bytes) / 4].iter().flat_map(|x| x.to_le_bytes()).collect(),
                (Dir::Send, At::Recv(b)) => recv[b / 4..(b + o.bytes) / 4].iter().flat_map(|x| x.to_le_bytes()).collect(),
                (Dir::Recv, _) => vec![0u8; o.bytes],
            })
            .collect();
        rank.group(&ops, &mut bufs)?;
        for (o, b) in g.ops.iter().zip(&bufs).filter(|(o, _)| o.dir == Dir::Recv) {
            let dst = match o.at {
                At::Send(off) => &mut send[off / 4..(off + o.bytes) / 4],
                At::Recv(off) => &mut recv[off / 4..(off + o.bytes) / 4],
            };
            for (x, w) in dst.iter_mut().zip(b.chunks_exact(4)) {
                let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                *x = if g.reduce && o.peer != r { x.wrapping_add(v) } else { v };
            }
        }
    }
    let all = |len| -> Vec<Vec<u32>> { (0..n).map(|q| input_u32(q, len)).collect() };
    let sum = |vals: &[Vec<u32>], i: usize| vals.iter().fold(0u32, |a, v| a.wrapping_add(v[i]));
    let root = c.root().unwrap_or(0);
    let want: Option<Vec<u32>> = match c {
        C::AllReduce { .. } => Some((0..k).map(|i| sum(&all(k), i)).collect()),
        C::ReduceScatter { .. } => Some((0..k).map(|i| sum(&all(n * k), r * k + i)).collect()),
        C::Reduce { .. } if r == root => Some((0..k).map(|i| sum(&all(k), i)).collect()),
        C::AllGather { .. } => Some(all(k).concat()),
        C::Broadcast { .. } => Some(input_u32(root, k)),
        C::AllToAll { .. } => Some((0..n).flat_map(|q| input_u32(q, n * k)[r * k..(r + 1) * k].to_vec()).collect()),
        C::Gather { .. } if r == root => Some(all(k).concat()),
        C::Scatter { .. } => Some(input_u32(root, n * k)[r * k..(r + 1) * k].to_vec()),
        _ => None,
    };
    if let Some(want) = want {
        assert_eq!(recv, want, "rank {r}: {c:?}");
    }
    assert_eq!(send, input, "rank {r}: {c:?} changed its input");
    Ok(())
}

#[test]
fn every_collective_as_network_groups_of_three_threads() {
    use crate::api::collective::Collective as C;
    if !have_ucx() {
        return;
    }
    threads(3, |rank| {
        // One after the other on the same counters, with counts that take several chunks
        // (the scratch's slots are 16 KiB / 3 ranks / 2).
        for k in [5usize, 3000] {
            for c in [
                C::AllReduce { count: k },
                C::ReduceScatter { recvcount: k },
                C::AllGather { sendcount: k },
                C::Broadcast { count: k, root: 1 },
                C::Reduce { count: k, root: 2 },
                C::AllToAll { count_per_peer: k },
                C::Gather { sendcount: k, root: 0 },
                C::Scatter { recvcount: k, root: 1 },
            ] {
                check_collective(rank, c)?;
            }
        }
        Ok(())
    });
}

#[test]
fn closing_waits_for_the_peers_goodbye_within_the_timeout() {
    if !have_ucx() {
        return;
    }
    let id = UniqueId::new_at("127.0.0.1:0".parse().expect("an address")).expect("a rendezvous");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || -> Result<Duration> {
                    let boot = Bootstrap::join(&id, 2, r, TIMEOUT)?;
                    let opts = NetOptions {
                        timeout: Duration::from_secs(1),
                        ..options()
                    };
                    let proxy = Proxy::start(r, 2, Arc::new(NetMem::new(2, SCRATCH)?), &boot, opts)?;
                    if r == 1 {
                        // Rank 1 closes late: rank 0 gives up waiting for its goodbye.
                        std::thread::sleep(Duration::from_secs(3));
                    }
                    let t = Instant::now();
                    proxy.close().map(|()| t.elapsed())
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("no panic")).collect();
        let e = results[0].as_ref().expect_err("rank 0 gives up");
        assert!(e.to_string().contains("no goodbye from rank(s) [1]"), "{e}");
        eprintln!("{e}");
        // Rank 1 got rank 0's goodbye before rank 0 gave up: it closes at once.
        let t = results[1].as_ref().expect("rank 1 closes");
        assert!(*t < Duration::from_secs(1), "{t:?}");
    });
}

/// An exchange that answers for a world of two where rank 1 published `other`.
struct Fake {
    other: Vec<u8>,
}

impl Exchange for Fake {
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec(), self.other.clone()])
    }
}

#[test]
fn a_malformed_address_is_refused_before_ucx_sees_it() {
    if !have_ucx() {
        return;
    }
    let mem = Arc::new(NetMem::new(2, SCRATCH).expect("memory"));
    let fake = Fake {
        other: frame_addresses(1, 2, &[]), // framing without an address
    };
    let e = Proxy::start(0, 2, mem, &fake, options()).expect_err("no address");
    assert!(matches!(e, Error::Network { peer: Some(1), .. }), "{e}");
    eprintln!("{e}");
}

#[test]
fn ranks_with_different_lane_counts_are_refused_naming_the_variable() {
    if !have_ucx() {
        return;
    }
    // Rank 1 published one lane's address where this rank has two.
    let ctx = Context::new(Ucp::load().expect("UCX"), &[("TLS", "tcp"), ("NET_DEVICES", "lo")])
        .expect("a context");
    let w = Worker::new(&ctx).expect("a worker");
    let fake = Fake {
        other: frame_addresses(1, 2, &[w.address().expect("an address")]),
    };
    let mem = Arc::new(NetMem::new(2, SCRATCH).expect("memory"));
    let e = Proxy::start(0, 2, mem, &fake, options_with(2)).expect_err("one lane against two");
    assert!(matches!(e, Error::Network { peer: Some(1), .. }), "{e}");
    assert!(e.to_string().contains("RINGCCL_NET_LANES"), "{e}");
    let mem = Arc::new(NetMem::new(2, SCRATCH).expect("memory"));
    let e = Proxy::start(0, 2, mem, &fake, options_with(0)).expect_err("no lanes");
    assert!(matches!(e, Error::Config { .. }), "{e}");
}

#[test]
fn every_lane_count_carries_a_ring_all_reduce_bit_exact() {
    if !have_ucx() {
        return;
    }
    // A pair's chunks and credits are dealt to the lanes; the receivers publish in counter
    // order.
    for lanes in [1, 3, 4] {
        threads_with(3, SCRATCH, lanes, |rank| {
            check_all_reduce(rank, 10_000)?;
            check_all_reduce(rank, 7)
        });
        threads_with(2, SCRATCH, lanes, |rank| {
            let peer = 1 - rank.me;
            let bytes = 100_003;
            let pattern = |from: usize| -> Vec<u8> { (0..bytes).map(|j| (j * 13 + from) as u8).collect() };
            let ops = [
                P2pOp { dir: Dir::Send, peer, bytes },
                P2pOp { dir: Dir::Recv, peer, bytes },
            ];
            let mut bufs = vec![pattern(rank.me), vec![0u8; bytes]];
            rank.group(&ops, &mut bufs)?;
            assert!(bufs[1] == pattern(peer), "rank {} with {lanes} lanes: wrong", rank.me);
            Ok(())
        });
    }
}

#[test]
fn a_peer_that_is_gone_is_an_error_not_a_hang() {
    if !have_ucx() {
        return;
    }
    // A real worker's address, framed as rank 1's, whose worker is destroyed before use.
    let stale = {
        let ctx = Context::new(Ucp::load().expect("UCX"), &[("TLS", "tcp"), ("NET_DEVICES", "lo")])
            .expect("a context");
        let workers: Vec<Worker> =
            (0..DEFAULT_LANES).map(|_| Worker::new(&ctx).expect("a worker")).collect();
        let addresses: Vec<Vec<u8>> =
            workers.iter().map(|w| w.address().expect("an address")).collect();
        frame_addresses(1, 2, &addresses)
    };
    let mem = Arc::new(NetMem::new(2, SCRATCH).expect("memory"));
    let opts = NetOptions {
        timeout: Duration::from_secs(10),
        ..options()
    };
    let t = Instant::now();
    // UCX may fail the connection when the endpoint is created (TCP connects at once) or at the
    // first message; either way, an error naming the peer, in bounded time.
    let e = match Proxy::start(0, 2, mem.clone(), &Fake { other: stale }, opts) {
        Err(e) => e,
        Ok(proxy) => {
            // Rank 0's stream signals rank 1 (a credit) and waits for its reply.
            proxy
                .post(vec![Outgoing { peer: 1, k: 1, data: None }])
                .expect("posted");
            mem.posted(1).expect("word").store(1, std::sync::atomic::Ordering::Release);
            let e = proxy.wait(1, 1, true, Duration::from_secs(15)).expect_err("rank 1 is gone");
            assert!(proxy.close().is_err());
            e
        }
    };
    assert!(matches!(e, Error::Network { rank: Some(0), peer: Some(1), .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(15));
    eprintln!("after {:?}: {e}", t.elapsed());
}

// ---- ranks as processes: this test binary, started again once per rank ----

const CHILD: &str = "RINGCCL_NET_TEST_CHILD";

/// Starts `n` copies of this test binary running [`child`] with `scenario`; returns their exit
/// codes and outputs.
fn processes(n: usize, scenario: &str) -> Vec<(Option<i32>, String)> {
    let id = UniqueId::new_at("127.0.0.1:0".parse().expect("an address")).expect("a rendezvous");
    let exe = std::env::current_exe().expect("this test binary");
    let children: Vec<_> = (0..n)
        .map(|r| {
            std::process::Command::new(&exe)
                .args(["--exact", "transport::net::tests::child", "--include-ignored", "--nocapture"])
                .env(CHILD, format!("{scenario} {r} {n} {id}"))
                .env("UCX_TLS", "tcp")
                .env("UCX_NET_DEVICES", "lo")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("a child process")
        })
        .collect();
    // The children's own waits are bounded; this bounds a child that is stuck anyway.
    let deadline = Instant::now() + 4 * TIMEOUT;
    children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
            }
            let out = c.wait_with_output().expect("the child's output");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            (out.status.code(), text)
        })
        .collect()
}

/// The body of a child process (run by [`processes`]). Run directly (without the variable), it
/// runs the all-reduce scenario on two threads instead.
#[test]
#[ignore = "the entry point of the multi-process tests' child processes"]
fn child() {
    let Ok(spec) = std::env::var(CHILD) else {
        if have_ucx() {
            threads(2, |rank| check_all_reduce(rank, 10_000));
        }
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let [scenario, r, n, id] = parts[..] else {
        panic!("{CHILD}={spec:?}");
    };
    let (r, n): (usize, usize) = (r.parse().expect("rank"), n.parse().expect("nranks"));
    let id: UniqueId = id.parse().expect("an id");
    let boot = Bootstrap::join(&id, n, r, TIMEOUT).expect("joined");
    let mut rank = Rank::start(r, n, &boot).expect("a proxy");
    match scenario {
        "allreduce" => {
            check_all_reduce(&mut rank, 100_000).expect("all-reduce");
            check_all_reduce(&mut rank, 1_000).expect("all-reduce");
            rank.proxy.close().expect("closed");
            println!("rank {r}: all-reduce bit-exact");
        }
        "die" => {
            check_all_reduce(&mut rank, 1_000).expect("all-reduce");
            // Both ranks are done with the first call (rank 1's proxy may still hold the
            // group's trailing signals, which rank 0 needs only for its next call).
            boot.barrier().expect("a barrier");
            if r == 1 {
                // Gone without closing: its sockets close with the process.
                std::process::exit(7);
            }
            let t = Instant::now();
            let e = check_all_reduce(&mut rank, 1_000).expect_err("rank 1 is gone");
            assert!(matches!(e, Error::Network { rank: Some(0), .. }), "{e}");
            // The failed proxy released every wait a GPU stream could be blocked in.
            let flag = rank.proxy.mem().flag(1).expect("a flag word");
            assert!(flag.load(std::sync::atomic::Ordering::Acquire) >= 1 << 62);
            let credit = rank.proxy.mem().credit(1).expect("a credit word");
            assert!(credit.load(std::sync::atomic::Ordering::Acquire) >= 1 << 62);
            println!("rank {r}: error after {:?}: {e}", t.elapsed());
            assert!(t.elapsed() < TIMEOUT + Duration::from_secs(5));
        }
        s => panic!("scenario {s}"),
    }
}

fn have_child_support(scenario: &str, n: usize) -> Option<Vec<(Option<i32>, String)>> {
    if !have_ucx() {
        return None;
    }
    let out = processes(n, scenario);
    for (r, (code, text)) in out.iter().enumerate() {
        for line in text.lines().filter(|l| l.starts_with("rank ") || l.contains("panicked")) {
            eprintln!("[process {r}, exit {code:?}] {line}");
        }
    }
    Some(out)
}

#[test]
fn ring_all_reduce_of_three_processes_is_bit_exact() {
    let Some(out) = have_child_support("allreduce", 3) else {
        return;
    };
    for (r, (code, text)) in out.iter().enumerate() {
        assert_eq!(*code, Some(0), "process {r}:\n{text}");
        assert!(text.contains("all-reduce bit-exact"), "process {r}:\n{text}");
    }
}

#[test]
fn a_peer_that_exits_mid_job_fails_the_others_within_the_timeout() {
    let Some(out) = have_child_support("die", 2) else {
        return;
    };
    assert_eq!(out[1].0, Some(7), "process 1:\n{}", out[1].1);
    assert_eq!(out[0].0, Some(0), "process 0:\n{}", out[0].1);
    assert!(out[0].1.contains("rank 0: error after"), "process 0:\n{}", out[0].1);
}
