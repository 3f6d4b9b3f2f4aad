//! The bootstrap over loopback TCP, ranks as threads: joins, collectives, every typed failure,
//! ids and the launcher's variables. Every test is bounded by timeouts of a few seconds.

use std::net::{SocketAddr, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use ringccl::bootstrap::{Bootstrap, LaunchEnv, UNIQUE_ID_BYTES};
use ringccl::{BootstrapFailure, Error, UniqueId};

fn loopback_id() -> UniqueId {
    UniqueId::new_at("127.0.0.1:0".parse().unwrap()).unwrap()
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free port below the system's range of ephemeral ports (`ip_local_port_range`, 32768 by
/// default), so that no listener bound to port 0 (the ranks' own, other tests') takes it before
/// the rank meant to listen there does; each call starts at another port.
fn free_port_outside_ephemeral() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let start = lo.saturating_sub(10_000).max(1024);
    let span = lo.saturating_sub(start).max(1);
    let seed = (std::process::id() as u16).wrapping_mul(7919);
    for _ in 0..span {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = start + seed.wrapping_add(k.wrapping_mul(97)) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    free_port()
}

/// Runs `f(rank)` for each `(rank, nranks)` in its own thread; the results in that order.
fn each<T: Send + 'static>(
    ranks: &[(usize, usize)],
    f: impl Fn(usize, usize) -> ringccl::Result<T> + Send + Sync + Copy + 'static,
) -> Vec<ringccl::Result<T>> {
    let threads: Vec<_> = ranks
        .iter()
        .map(|&(rank, n)| thread::spawn(move || f(rank, n)))
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn failure<T: std::fmt::Debug>(r: &ringccl::Result<T>) -> (Option<usize>, BootstrapFailure) {
    match r {
        Err(Error::Bootstrap { rank, failure, .. }) => (*rank, *failure),
        other => panic!("expected a bootstrap error, got {other:?}"),
    }
}

#[test]
fn worlds_of_1_2_4_8_ranks_gather_in_rank_order() {
    for n in [1usize, 2, 4, 8] {
        let id = loopback_id();
        let ranks: Vec<_> = (0..n).map(|r| (r, n)).collect();
        let out = each(&ranks, move |rank, n| {
            let b = Bootstrap::join(&id, n, rank, Duration::from_secs(5))?;
            assert_eq!((b.rank(), b.nranks()), (rank, n));
            // Different lengths per rank, rank 0 sends nothing.
            let mine = vec![rank as u8; rank * 3];
            let all = b.all_gather(&mine)?;
            b.barrier()?;
            let again = b.all_gather(&(rank as u64).to_be_bytes())?;
            Ok((all, again))
        });
        for r in out {
            let (all, again) = r.unwrap();
            for (j, v) in all.iter().enumerate() {
                assert_eq!(*v, vec![j as u8; j * 3], "world of {n}");
            }
            for (j, v) in again.iter().enumerate() {
                assert_eq!(*v, (j as u64).to_be_bytes());
            }
        }
    }
}

#[test]
fn large_all_gathers_and_send_recv_around_a_ring() {
    let id = loopback_id();
    let n = 4;
    let ranks: Vec<_> = (0..n).map(|r| (r, n)).collect();
    let out = each(&ranks, move |rank, n| {
        let b = Bootstrap::join(&id, n, rank, Duration::from_secs(5))?;
        // More than a socket buffer holds: the exchange must not block on itself.
        let big = vec![rank as u8; 3 << 20];
        let all = b.all_gather(&big)?;
        assert!(all
            .iter()
            .enumerate()
            .all(|(j, v)| v.len() == 3 << 20 && v[0] == j as u8));
        b.send((rank + 1) % n, format!("from {rank}").as_bytes())?;
        let got = b.recv((rank + n - 1) % n)?;
        Ok(String::from_utf8(got).unwrap())
    });
    for (rank, r) in out.into_iter().enumerate() {
        assert_eq!(r.unwrap(), format!("from {}", (rank + n - 1) % n));
    }
}

#[test]
fn bootstrap_can_be_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Bootstrap>();
    send_sync::<UniqueId>();
}

#[test]
fn bad_peers_are_invalid_arguments() {
    let id = loopback_id();
    let b = Bootstrap::join(&id, 1, 0, Duration::from_secs(5)).unwrap();
    assert!(matches!(
        b.send(0, b"x"),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(b.recv(3), Err(Error::InvalidArgument { .. })));
    assert_eq!(b.all_gather(b"only").unwrap(), vec![b"only".to_vec()]);
    let e = Bootstrap::join(&id, 0, 0, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

/// Runs the ranks and checks that each gets `want` within `limit`.
fn expect_all(ranks: &[(usize, usize)], id: UniqueId, timeout: Duration, want: BootstrapFailure) {
    let t0 = Instant::now();
    let out = each(ranks, move |rank, n| Bootstrap::join(&id, n, rank, timeout));
    for (r, &(rank, _)) in out.iter().zip(ranks) {
        assert_eq!(failure(r), (Some(rank), want), "rank {rank}: {r:?}");
    }
    assert!(
        t0.elapsed() < timeout + Duration::from_millis(800),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn ranks_that_disagree_on_the_rank_count_all_hear_it() {
    expect_all(
        &[(0, 2), (1, 3)],
        loopback_id(),
        Duration::from_secs(3),
        BootstrapFailure::NranksMismatch,
    );
}

#[test]
fn a_duplicate_rank_is_told_to_both() {
    expect_all(
        &[(1, 2), (1, 2)],
        loopback_id(),
        Duration::from_secs(3),
        BootstrapFailure::DuplicateRank,
    );
}

#[test]
fn a_rank_out_of_range_is_told_to_everyone() {
    let id = loopback_id();
    let t0 = Instant::now();
    let waiting = thread::spawn(move || Bootstrap::join(&id, 2, 0, Duration::from_secs(3)));
    thread::sleep(Duration::from_millis(50));
    let bad = Bootstrap::join(&id, 2, 2, Duration::from_secs(3));
    assert_eq!(failure(&bad), (Some(2), BootstrapFailure::RankOutOfRange));
    let r = waiting.join().unwrap();
    assert_eq!(
        failure(&r),
        (Some(0), BootstrapFailure::RankOutOfRange),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_wrong_key_is_rejected_and_the_waiting_rank_times_out_naming_it() {
    let id = loopback_id();
    let other = UniqueId::with_address(id.address(), id.key() ^ 1);
    let t0 = Instant::now();
    let waiting = thread::spawn(move || Bootstrap::join(&id, 2, 0, Duration::from_millis(1500)));
    thread::sleep(Duration::from_millis(50));
    let stray = Bootstrap::join(&other, 2, 1, Duration::from_millis(1500));
    assert_eq!(failure(&stray), (Some(1), BootstrapFailure::WrongKey));
    let r = waiting.join().unwrap();
    assert_eq!(failure(&r), (Some(0), BootstrapFailure::Timeout));
    let text = r.unwrap_err().to_string();
    assert!(
        text.contains("another key") && text.contains("missing rank(s) 1"),
        "{text}"
    );
    assert!(t0.elapsed() < Duration::from_millis(2300));
}

#[test]
fn ranks_that_never_arrive_time_out_everywhere_within_the_timeout() {
    // One rank alone, then two of three.
    expect_all(
        &[(0, 2)],
        loopback_id(),
        Duration::from_secs(1),
        BootstrapFailure::Timeout,
    );
    expect_all(
        &[(0, 3), (2, 3)],
        loopback_id(),
        Duration::from_secs(1),
        BootstrapFailure::Timeout,
    );
}

#[test]
fn an_unreachable_root_times_out() {
    let id = UniqueId::with_address(SocketAddr::from(([127, 0, 0, 1], free_port())), 1);
    let t0 = Instant::now();
    let r = Bootstrap::join(&id, 2, 0, Duration::from_millis(700));
    assert_eq!(failure(&r), (Some(0), BootstrapFailure::Timeout));
    assert!(t0.elapsed() < Duration::from_millis(1500));
    let nowhere = UniqueId::with_address(SocketAddr::from(([0, 0, 0, 0], 0)), 1);
    let r = Bootstrap::join(&nowhere, 1, 0, Duration::from_millis(700));
    assert_eq!(failure(&r), (Some(0), BootstrapFailure::Network));
}

#[test]
fn ids_round_trip_through_bytes_and_text() {
    for addr in ["127.0.0.1:29500", "[::1]:1", "[fe80::2%7]:65535"] {
        let id = UniqueId::with_address(addr.parse().unwrap(), 0xdead_beef_0123_4567);
        assert_eq!(id.as_bytes().len(), UNIQUE_ID_BYTES);
        assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
        let text = id.to_string();
        assert_eq!(text.parse::<UniqueId>().unwrap(), id);
        assert_eq!(
            format!(" {} \n", text.to_uppercase())
                .parse::<UniqueId>()
                .unwrap(),
            id
        );
        assert_eq!(id.address(), addr.parse::<SocketAddr>().unwrap());
        assert!(format!("{id:?}").contains(&id.address().to_string()));
    }
    assert_eq!(std::mem::size_of::<UniqueId>(), 128);
}

#[test]
fn corrupt_ids_are_rejected_with_typed_errors() {
    let id = UniqueId::with_address("127.0.0.1:29500".parse().unwrap(), 5);
    let invalid = |r: ringccl::Result<UniqueId>| failure(&r) == (None, BootstrapFailure::InvalidId);
    assert!(invalid(UniqueId::from_bytes(&id.as_bytes()[..127])));
    assert!(invalid(UniqueId::from_bytes(
        &[id.as_bytes().as_slice(), &[0]].concat()
    )));
    for at in [0, 20, 35, 60, 127] {
        let mut b = *id.as_bytes();
        b[at] ^= 0x10;
        assert!(invalid(UniqueId::from_bytes(&b)), "byte {at}");
    }
    let mut v2 = *id.as_bytes();
    v2[8..10].copy_from_slice(&2u16.to_be_bytes());
    let r = UniqueId::from_bytes(&v2);
    assert_eq!(failure(&r), (None, BootstrapFailure::WrongVersion));
    let text = id.to_string();
    assert!(invalid(text[..254].parse()));
    assert!(invalid(format!("{}zz", &text[..254]).parse()));
    assert!(invalid("".parse()));
}

#[test]
fn errors_say_what_to_do() {
    let e = Error::Bootstrap {
        rank: Some(2),
        failure: BootstrapFailure::NranksMismatch,
        detail: "rank 2 joined a world of 3 ranks, rank 0 one of 2".into(),
    };
    let s = e.to_string();
    assert!(s.contains("rank 2") && s.contains("WORLD_SIZE"), "{s}");
}

fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl FnMut(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

fn config_error(r: ringccl::Result<Option<LaunchEnv>>) -> String {
    match r {
        Err(Error::Config { variable, .. }) => variable,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn launch_env_reads_torchrun_variables() {
    assert_eq!(LaunchEnv::from_lookup(|_| None).unwrap(), None);
    let env = LaunchEnv::from_lookup(vars(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", " node7 "),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!((env.rank, env.world_size, env.local_rank), (3, 8, 1));
    assert_eq!(
        (env.host.as_str(), env.port, env.source),
        ("node7", 29501, "MASTER_ADDR/MASTER_PORT")
    );
    let env = LaunchEnv::from_lookup(vars(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "[::1]"),
        ("MASTER_PORT", "100"),
        ("RINGCCL_COMM_ID", ""),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        (env.local_rank, env.host.as_str(), env.port),
        (2, "::1", 101)
    );
}

#[test]
fn ringccl_comm_id_wins_over_master_variables() {
    let env = LaunchEnv::from_lookup(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("RINGCCL_COMM_ID", "10.0.0.9:4000"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        (env.host.as_str(), env.port, env.source),
        ("10.0.0.9", 4000, "RINGCCL_COMM_ID")
    );
    // No MASTER_* needed with it.
    let env = LaunchEnv::from_lookup(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("RINGCCL_COMM_ID", "[fe80::1]:7"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!((env.host.as_str(), env.port), ("fe80::1", 7));
}

#[test]
fn bad_launch_variables_name_the_variable() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("RANK", "0")], "WORLD_SIZE"),
        (&[("WORLD_SIZE", "2")], "RANK"),
        (&[("RANK", "x"), ("WORLD_SIZE", "2")], "RANK"),
        (&[("RANK", "-1"), ("WORLD_SIZE", "2")], "RANK"),
        (&[("RANK", "2"), ("WORLD_SIZE", "2")], "RANK"),
        (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE"),
        (&[("RANK", "0"), ("WORLD_SIZE", "100000")], "WORLD_SIZE"),
        (
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "a")],
            "LOCAL_RANK",
        ),
        (
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")],
            "MASTER_ADDR",
        ),
        (
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")],
            "MASTER_PORT",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "65535"),
            ],
            "MASTER_PORT",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "0"),
            ],
            "MASTER_PORT",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h:1"),
                ("MASTER_PORT", "5"),
            ],
            "MASTER_ADDR",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("RINGCCL_COMM_ID", "host"),
            ],
            "RINGCCL_COMM_ID",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("RINGCCL_COMM_ID", "host:0"),
            ],
            "RINGCCL_COMM_ID",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("RINGCCL_COMM_ID", "::1:80"),
            ],
            "RINGCCL_COMM_ID",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("RINGCCL_COMM_ID", ":80"),
            ],
            "RINGCCL_COMM_ID",
        ),
    ];
    for (pairs, want) in cases {
        let r = LaunchEnv::from_lookup(|name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        });
        assert_eq!(config_error(r), *want, "{pairs:?}");
    }
}

#[test]
fn launched_ranks_compute_the_same_id_and_rank_0_hosts_the_rendezvous() {
    // Ranks 1 and 2 bind their own listeners before rank 0 hosts the rendezvous: a port of
    // the ephemeral range could be taken by one of them (or another test) first.
    let comm_id = format!("127.0.0.1:{}", free_port_outside_ephemeral());
    let n = 3;
    let envs: Vec<LaunchEnv> = (0..n)
        .map(|r| {
            LaunchEnv::from_lookup(|name| match name {
                "RANK" => Some(r.to_string()),
                "WORLD_SIZE" => Some(n.to_string()),
                "RINGCCL_COMM_ID" => Some(comm_id.clone()),
                _ => None,
            })
            .unwrap()
            .unwrap()
        })
        .collect();
    // Ranks 1 and 2 first: they wait for rank 0's service.
    let threads: Vec<_> = envs
        .into_iter()
        .rev()
        .map(|env| {
            let t = thread::spawn(move || {
                let b = Bootstrap::join_env(&env, Duration::from_secs(5))?;
                b.all_gather(&[env.rank as u8])
            });
            thread::sleep(Duration::from_millis(30));
            t
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap().unwrap(), vec![vec![0], vec![1], vec![2]]);
    }
    // Another world size gives another key on the same address.
    let a = LaunchEnv::from_lookup(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("RINGCCL_COMM_ID", "127.0.0.1:9"),
    ]));
    let b = LaunchEnv::from_lookup(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "3"),
        ("RINGCCL_COMM_ID", "127.0.0.1:9"),
    ]));
    let (a, b) = (
        a.unwrap().unwrap().unique_id().unwrap(),
        b.unwrap().unwrap().unique_id().unwrap(),
    );
    assert_eq!(a.address(), b.address());
    assert_ne!(a.key(), b.key());
}
