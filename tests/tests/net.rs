//! The network transport on GPUs: two processes, one GPU each (or both on one GPU), peers
//! reached only through the network path (UCX; over loopback TCP with `UCX_TLS=tcp
//! UCX_NET_DEVICES=lo`). Each rank's stream copies chunks into its pinned, device-mapped outbox
//! and signals with `cuStreamWriteValue64`; its proxy carries them to the peer's proxy, which
//! fills the peer's pinned inbox. Transfers of 1 B to 64 MiB both ways, checked byte for byte,
//! with the bandwidth of each size.
//!
//! Run: `cargo test --release -p ringccl-tests --test net -- --include-ignored --nocapture
//! net_p2p_across_two_processes` (with UCX's `libucp.so.0` on the library path).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, DevicePtr};
use ringccl::bootstrap::Bootstrap;
use ringccl::internals::driver::ipc::MemOps;
use ringccl::internals::driver::Kernels;
use ringccl::internals::exec::net::{execute, Bound};
use ringccl::internals::plan::p2p::{Dir, P2pOp};
use ringccl::internals::resources::Health;
use ringccl::internals::transport::net::pinned::pinned;
use ringccl::internals::transport::net::proxy::{NetOptions, Proxy};
use ringccl::internals::transport::net::NetRank;
use ringccl::UniqueId;

const ENV: &str = "RINGCCL_NET_GPU_CHILD";
const SCRATCH: usize = 8 << 20;

fn pattern(rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 13 + rank * 71 + i / 4099) as u8)
        .collect()
}

/// One rank (a child process of [`job`]); run directly (without the variable), the whole job.
#[test]
#[ignore = "needs a CUDA GPU and UCX; the entry point of the job's child processes"]
fn net_rank() {
    let Ok(spec) = std::env::var(ENV) else {
        job();
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let [r, n, id] = parts[..] else {
        panic!("{ENV}={spec:?}")
    };
    let (r, n): (usize, usize) = (r.parse().expect("rank"), n.parse().expect("nranks"));
    let id: UniqueId = id.parse().expect("an id");
    let devices = CudaContext::device_count().expect("the CUDA driver") as usize;
    let ctx = CudaContext::new(r % devices).expect("a context");
    let stream = ctx.new_stream().expect("a stream");
    let boot = Bootstrap::join(&id, n, r, Duration::from_secs(60)).expect("joined");
    let mem = Arc::new(pinned(&ctx, n, SCRATCH, r).expect("pinned memory"));
    let opts = NetOptions {
        timeout: Duration::from_secs(60),
        ..NetOptions::default()
    };
    let proxy = Proxy::start(r, n, mem, &boot, opts).expect("a proxy");
    let mut net = NetRank::new(r, n, proxy);
    let mut order = ringccl::internals::resources::order::CallOrder::new(
        ctx.new_event(None).expect("an event"),
        ringccl::internals::driver::stream::StreamIds::load().expect("cuStreamGetId"),
    );
    let ops = MemOps::load().expect("stream memory operations");
    // The waits for the peer are the bounded wait kernel, with a control block of their own.
    let kernels = Kernels::load(&ctx, Some(r)).expect("ringccl's kernels");
    let health =
        Health::new(&ctx, vec![r], Some(Duration::from_secs(60))).expect("a control block");
    let bound = Bound {
        kernels: &kernels,
        health: &health,
    };
    let peer = 1 - r;
    for bytes in [1usize, 4096, 1 << 20, 8 << 20, 64 << 20] {
        let send = stream
            .clone_htod(&pattern(r, bytes))
            .expect("a send buffer");
        let recv = stream.alloc_zeros::<u8>(bytes).expect("a receive buffer");
        let group = [
            P2pOp {
                dir: Dir::Send,
                peer,
                bytes,
            },
            P2pOp {
                dir: Dir::Recv,
                peer,
                bytes,
            },
        ];
        let reps = if bytes >= 1 << 20 { 5 } else { 20 };
        let mut best = f64::MAX;
        for _ in 0..reps {
            boot.barrier().expect("a barrier");
            let t = Instant::now();
            {
                let (s, _g1) = send.device_ptr(&stream);
                let (d, _g2) = recv.device_ptr(&stream);
                // SAFETY: `s` and `d` are `bytes`-long buffers of this rank's GPU, alive and held
                // by their guards until the synchronize below; `order` and `net` are this rank's.
                unsafe { execute(&mut net, &ops, bound, &group, &[s, d], &stream, &mut order) }
                    .expect("enqueued");
            }
            stream.synchronize().expect("synchronized");
            if let Some(e) = net.proxy.error() {
                panic!("rank {r}: {e}");
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let got = stream.clone_dtoh(&recv).expect("the result");
        assert!(
            got == pattern(peer, bytes),
            "rank {r}: {bytes} bytes from rank {peer} wrong"
        );
        println!(
            "rank {r}: {bytes} B each way correct, best of {reps}: {:.1} us, {:.3} GB/s one way",
            best * 1e6,
            bytes as f64 / best / 1e9
        );
    }
    net.proxy.close().expect("closed");
}

#[test]
#[ignore = "needs a CUDA GPU and UCX (libucp.so.0)"]
fn net_p2p_across_two_processes() {
    job();
}

/// Two processes of this test binary, each running [`net_rank`] as one rank.
fn job() {
    let n = 2;
    let id = UniqueId::new_at("127.0.0.1:0".parse().expect("an address")).expect("an id");
    let exe = std::env::current_exe().expect("this test binary");
    let mut children: Vec<_> = (0..n)
        .map(|r| {
            Command::new(&exe)
                .args(["net_rank", "--exact", "--include-ignored", "--nocapture"])
                .env(ENV, format!("{r} {n} {id}"))
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut status = vec![None; n];
    while status.iter().any(Option::is_none) && Instant::now() < deadline {
        for (r, c) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = c.try_wait().expect("wait for a rank");
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (r, c) in children.iter_mut().enumerate() {
        if status[r].is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    for (r, s) in status.iter().enumerate() {
        match s {
            Some(s) if s.success() => {}
            Some(s) => panic!("rank {r} failed: {s}"),
            None => panic!("rank {r} did not finish within 300 s"),
        }
    }
}
