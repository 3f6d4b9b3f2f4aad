//! Unit tests of the wire format and of the rendezvous against hand-made clients (the
//! public behaviour is tested in `host/tests/bootstrap*.rs`).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::*;
use super::*;

fn loopback_id() -> UniqueId {
    UniqueId::new_at("127.0.0.1:0".parse().unwrap()).unwrap()
}

fn failure(r: &Result<impl fmt::Debug>) -> BootstrapFailure {
    match r {
        Err(Error::Bootstrap { failure, .. }) => *failure,
        other => panic!("expected a bootstrap error, got {other:?}"),
    }
}

/// A raw hello of `rank` of `nranks` for `id`, listening nowhere useful.
fn hello(id: &UniqueId, nranks: u32, rank: u32, listen: SocketAddr) -> Vec<u8> {
    Hello {
        key: id.key(),
        nranks,
        rank,
        left_ms: 5000,
        listen,
    }
    .encode()
}

/// The root's answer to a raw client: (kind, failure code if any, body).
fn answer(s: &TcpStream) -> (u8, Option<BootstrapFailure>, Vec<u8>) {
    let (kind, body) = read_frame(s, MAX_CONTROL, Deadline::after(Duration::from_secs(3)), None, "root").unwrap();
    let f = (kind == KIND_FAIL).then(|| failure_of(body[0]));
    (kind, f, body)
}

#[test]
fn headers_are_checked() {
    let f = frame(KIND_HELLO, &[1, 2, 3]);
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&f[..HEADER_LEN]);
    assert_eq!(parse_header(&h, 10), Ok(Header { kind: KIND_HELLO, len: 3 }));
    assert_eq!(parse_header(&h, 2).unwrap_err().0, BootstrapFailure::Protocol);
    let mut v = h;
    v[9] = 2;
    assert_eq!(parse_header(&v, 10).unwrap_err().0, BootstrapFailure::WrongVersion);
    let mut m = h;
    m[0] = b'X';
    assert_eq!(parse_header(&m, 10).unwrap_err().0, BootstrapFailure::Protocol);
}

#[test]
fn addresses_and_hellos_round_trip() {
    for a in ["127.0.0.1:1", "10.1.2.3:65535", "[::1]:80", "[fe80::1%3]:9"] {
        let a: SocketAddr = a.parse().unwrap();
        let mut b = Vec::new();
        put_addr(&mut b, &a);
        assert_eq!(b.len(), ADDR_LEN);
        assert_eq!(get_addr(b.as_slice().try_into().unwrap()), Some(a));
    }
    let h = Hello { key: 7, nranks: 3, rank: 2, left_ms: 99, listen: "[::1]:5".parse().unwrap() };
    let f = h.encode();
    assert_eq!(Hello::decode(&f[HEADER_LEN..]), Some(h));
    assert_eq!(Hello::decode(&f[HEADER_LEN..f.len() - 1]), None);
    for f in [BootstrapFailure::Timeout, BootstrapFailure::Protocol, BootstrapFailure::PeerLost] {
        assert_eq!(failure_of(failure_code(f)), f);
    }
}

#[test]
fn fail_frames_cut_long_messages_at_a_char_boundary() {
    let f = fail_frame(BootstrapFailure::Network, &"é".repeat(5000));
    let text = std::str::from_utf8(&f[HEADER_LEN + 1..]).unwrap();
    assert!(text.len() <= 4096 && !text.is_empty());
}

#[test]
fn a_hello_of_another_version_is_answered_and_the_waiting_rank_times_out_naming_it() {
    let id = loopback_id();
    let t0 = Instant::now();
    let rank0 = thread::spawn(move || Bootstrap::join(&id, 2, 0, Duration::from_millis(1500)));
    let s = TcpStream::connect(id.address()).unwrap();
    let mut h = hello(&id, 2, 1, "127.0.0.1:9".parse().unwrap());
    h[8..10].copy_from_slice(&2u16.to_be_bytes());
    write_all_by(&s, &h, Deadline::after(Duration::from_secs(1))).unwrap();
    assert_eq!(answer(&s).1, Some(BootstrapFailure::WrongVersion));
    let r = rank0.join().unwrap();
    assert_eq!(failure(&r), BootstrapFailure::Timeout);
    assert!(t0.elapsed() < Duration::from_millis(2000));
    assert!(format!("{}", r.unwrap_err()).contains("version"));
}

#[test]
fn a_stray_client_is_rejected_without_disturbing_the_world() {
    let id = loopback_id();
    let s = TcpStream::connect(id.address()).unwrap();
    write_all_by(&s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Deadline::after(Duration::from_secs(1))).unwrap();
    assert_eq!(answer(&s).1, Some(BootstrapFailure::Protocol));
    let joins: Vec<_> = (0..2)
        .map(|r| thread::spawn(move || Bootstrap::join(&id, 2, r, Duration::from_secs(5)).map(|b| b.rank())))
        .collect();
    for (r, j) in joins.into_iter().enumerate() {
        assert_eq!(j.join().unwrap().unwrap(), r);
    }
}

#[test]
fn a_rank_that_drops_its_connection_after_its_hello_is_lost_to_the_others() {
    // Four ranks, rank 3 never comes: the world cannot complete before rank 1 leaves.
    let id = loopback_id();
    let t0 = Instant::now();
    let waiting: Vec<_> = [0, 2]
        .into_iter()
        .map(|r| thread::spawn(move || Bootstrap::join(&id, 4, r, Duration::from_secs(4))))
        .collect();
    let s = TcpStream::connect(id.address()).unwrap();
    write_all_by(&s, &hello(&id, 4, 1, "127.0.0.1:9".parse().unwrap()), Deadline::after(Duration::from_secs(1))).unwrap();
    thread::sleep(Duration::from_millis(100));
    drop(s);
    for w in waiting {
        let r = w.join().unwrap();
        assert_eq!(failure(&r), BootstrapFailure::PeerLost, "{r:?}");
    }
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_rank_that_leaves_after_the_table_is_lost_to_the_ranks_that_connect_to_it() {
    let id = loopback_id();
    // A hand-made rank 0: joins, gets the table, then closes its listener.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = listener.local_addr().unwrap();
    let s = TcpStream::connect(id.address()).unwrap();
    write_all_by(&s, &hello(&id, 2, 0, listen), Deadline::after(Duration::from_secs(1))).unwrap();
    let rank1 = thread::spawn(move || Bootstrap::join(&id, 2, 1, Duration::from_secs(4)));
    let (kind, f, _) = answer(&s);
    assert_eq!((kind, f), (KIND_TABLE, None));
    drop(listener);
    drop(s);
    let r = rank1.join().unwrap();
    // The connect may still land in the listener's backlog before it closes; then the barrier
    // finds the connection closed. Either way: the peer is lost.
    assert_eq!(failure(&r), BootstrapFailure::PeerLost, "{r:?}");
}

#[test]
fn a_silent_connection_is_dropped_and_does_not_block_the_world() {
    let id = loopback_id();
    let _silent = TcpStream::connect(id.address()).unwrap();
    let joins: Vec<_> = (0..3)
        .map(|r| thread::spawn(move || Bootstrap::join(&id, 3, r, Duration::from_secs(5)).map(|b| b.nranks())))
        .collect();
    for j in joins {
        assert_eq!(j.join().unwrap().unwrap(), 3);
    }
}

#[test]
fn collectives_called_in_different_orders_are_reported() {
    let id = loopback_id();
    let joins: Vec<_> = (0..2)
        .map(|r| {
            thread::spawn(move || {
                let b = Bootstrap::join(&id, 2, r, Duration::from_secs(3))?;
                if r == 0 {
                    b.barrier()
                } else {
                    b.all_gather(b"x").map(drop)
                }
            })
        })
        .collect();
    for j in joins {
        let r = j.join().unwrap();
        assert_eq!(failure(&r), BootstrapFailure::Protocol, "{r:?}");
    }
}

#[test]
fn a_broken_bootstrap_keeps_returning_its_error() {
    let id = loopback_id();
    let joins: Vec<_> = (0..2)
        .map(|r| thread::spawn(move || Bootstrap::join(&id, 2, r, Duration::from_millis(300))))
        .collect();
    let mut boots: Vec<Bootstrap> = joins.into_iter().map(|j| j.join().unwrap().unwrap()).collect();
    let b1 = boots.pop().unwrap();
    let b0 = boots.pop().unwrap();
    // Rank 1 never answers: rank 0's barrier times out, then stays broken.
    let e = b0.barrier().unwrap_err();
    assert!(matches!(e, Error::Bootstrap { failure: BootstrapFailure::Timeout, rank: Some(0), .. }), "{e}");
    assert_eq!(b0.all_gather(b"y").unwrap_err(), e);
    drop(b1);
}

/// `n` joined ranks (threads), with `timeout`.
fn world(n: usize, timeout: Duration) -> Vec<Bootstrap> {
    let id = loopback_id();
    let joins: Vec<_> = (0..n)
        .map(|r| thread::spawn(move || Bootstrap::join(&id, n, r, timeout)))
        .collect();
    joins.into_iter().map(|j| j.join().unwrap().unwrap()).collect()
}

/// Runs `f` on every rank of `boots` in its own thread; the results in rank order.
fn on_each<T: Send>(boots: &[Bootstrap], f: impl Fn(&Bootstrap) -> T + Sync) -> Vec<T> {
    thread::scope(|s| {
        let f = &f;
        let joins: Vec<_> = boots.iter().map(|b| s.spawn(move || f(b))).collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// Each child's (rank, nranks, the parent ranks of its members as seen by an all-gather).
fn describe(child: &Option<Bootstrap>, parent_rank: usize) -> Option<(usize, usize, Vec<usize>)> {
    child.as_ref().map(|c| {
        let all = c.all_gather(&(parent_rank as u32).to_be_bytes()).unwrap();
        let members = all
            .iter()
            .map(|b| u32::from_be_bytes(b[..4].try_into().unwrap()) as usize)
            .collect();
        (c.rank(), c.nranks(), members)
    })
}

#[test]
fn splits_of_2_to_8_ranks_order_by_key_then_parent_rank() {
    for n in 2..=8usize {
        let boots = world(n, Duration::from_secs(10));
        // Three colors (rank % 3), rank n-1 without a color; keys descending by halves, so
        // that pairs of ranks tie and the tie goes to the lower parent rank.
        let color = |r: usize| (r + 1 != n || n == 2).then_some((r % 3) as i32 - 1);
        let key = |r: usize| ((n - r) / 2) as i32;
        let got = on_each(&boots, |b| {
            let r = b.rank();
            let child = b.split(color(r), key(r)).unwrap();
            describe(&child, r)
        });
        for (r, g) in got.iter().enumerate() {
            let Some(c) = color(r) else {
                assert!(g.is_none(), "n {n} rank {r}: no color, no child");
                continue;
            };
            let mut expect: Vec<usize> = (0..n).filter(|&p| color(p) == Some(c)).collect();
            expect.sort_by_key(|&p| (key(p), p));
            let pos = expect.iter().position(|&p| p == r).unwrap();
            assert_eq!(*g, Some((pos, expect.len(), expect.clone())), "n {n} rank {r}");
        }
        // The parent is still usable, and its ranks still agree on its operations.
        let gathered = on_each(&boots, |b| b.all_gather(&[b.rank() as u8]).unwrap());
        for g in gathered {
            assert_eq!(g, (0..n).map(|r| vec![r as u8]).collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_negative_color_other_than_none_is_a_color_and_keys_may_be_negative() {
    let boots = world(4, Duration::from_secs(5));
    let got = on_each(&boots, |b| {
        let r = b.rank();
        describe(&b.split(Some(-7), -(r as i32)).unwrap(), r)
    });
    for (r, g) in got.into_iter().enumerate() {
        assert_eq!(g, Some((3 - r, 4, vec![3, 2, 1, 0])));
    }
}

#[test]
fn two_splits_in_a_row_and_a_split_of_a_child() {
    let boots = world(4, Duration::from_secs(5));
    let got = on_each(&boots, |b| {
        let r = b.rank();
        let halves = b.split(Some((r / 2) as i32), 0).unwrap().unwrap();
        let pairs = b.split(Some((r % 2) as i32), 0).unwrap().unwrap();
        // The two children and the parent interleave.
        let a = halves.all_gather(&[r as u8]).unwrap();
        b.barrier().unwrap();
        let p = pairs.all_gather(&[r as u8]).unwrap();
        let grand = halves.split(Some(0), -(halves.rank() as i32)).unwrap().unwrap();
        let g = grand.all_gather(&[r as u8]).unwrap();
        (a, p, g)
    });
    for (r, (a, p, g)) in got.into_iter().enumerate() {
        let half: Vec<Vec<u8>> = (0..2).map(|i| vec![(r / 2 * 2 + i) as u8]).collect();
        assert_eq!(a, half);
        assert_eq!(p, vec![vec![(r % 2) as u8], vec![(r % 2 + 2) as u8]]);
        let mut rev = half.clone();
        rev.reverse();
        assert_eq!(g, rev);
    }
}

#[test]
fn every_rank_without_a_color_gets_nothing_and_the_parent_goes_on() {
    let boots = world(3, Duration::from_secs(5));
    let got = on_each(&boots, |b| {
        let none = b.split(None, 0).unwrap().is_none();
        b.barrier().unwrap();
        none
    });
    assert_eq!(got, [true, true, true]);
}

#[test]
fn a_split_of_one_rank() {
    let boots = world(1, Duration::from_secs(5));
    let child = boots[0].split(Some(0), 5).unwrap().unwrap();
    assert_eq!((child.rank(), child.nranks()), (0, 1));
    assert!(boots[0].split(None, 0).unwrap().is_none());
}

#[test]
fn a_rank_that_calls_something_else_than_split_is_a_protocol_error() {
    let boots = world(2, Duration::from_secs(3));
    let got = on_each(&boots, |b| match b.rank() {
        0 => b.split(Some(0), 0).map(drop),
        _ => b.all_gather(b"x").map(drop),
    });
    // Rank 1's all-gather gets rank 0's split entry: it receives the bytes (all-gather
    // carries anything); rank 0 gets bytes that are not a split entry.
    assert_eq!(failure(&got[0]), BootstrapFailure::Protocol, "{:?}", got[0]);
    assert!(format!("{:?}", got[0]).contains("split"));
}

#[test]
fn a_member_that_leaves_after_the_exchange_is_a_bounded_error_naming_the_world() {
    let boots = world(3, Duration::from_millis(1500));
    let t0 = Instant::now();
    let got = on_each(&boots, |b| {
        let pending = b.split_exchange(Some(0), 0).unwrap().unwrap();
        if b.rank() == 1 {
            drop(pending); // its listener closes: it never joins the child
            return Ok(None);
        }
        pending.connect().map(Some)
    });
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    for r in [0, 2] {
        let f = failure(&got[r]);
        assert!(matches!(f, BootstrapFailure::PeerLost | BootstrapFailure::Timeout), "{:?}", got[r]);
        let text = format!("{}", got[r].as_ref().unwrap_err());
        assert!(text.contains("parent's ranks [0, 1, 2]"), "{text}");
    }
}

#[test]
fn a_rank_that_never_splits_times_the_others_out() {
    let boots = world(3, Duration::from_millis(800));
    let t0 = Instant::now();
    let got = on_each(&boots, |b| match b.rank() {
        2 => Ok(None),
        _ => b.split(Some(0), 0),
    });
    assert!(t0.elapsed() < Duration::from_secs(3));
    for r in [0, 1] {
        assert_eq!(failure(&got[r]), BootstrapFailure::Timeout, "{:?}", got[r]);
    }
}

#[test]
fn shrink_leaves_out_the_excluded_ranks_without_contacting_them() {
    for n in 2..=6usize {
        let mut boots = world(n, Duration::from_secs(5));
        // The excluded ranks are gone altogether: their connections are closed.
        let exclude: Vec<usize> = (0..n).filter(|r| r % 3 == 1).collect();
        for &r in exclude.iter().rev() {
            drop(boots.remove(r));
        }
        let mut list = exclude.clone();
        list.reverse();
        list.push(exclude[0]); // order and repeats do not matter
        let got = on_each(&boots, |b| {
            let c = Some(b.shrink(&list).unwrap());
            describe(&c, b.rank())
        });
        let stay: Vec<usize> = (0..n).filter(|r| !exclude.contains(r)).collect();
        for (i, g) in got.into_iter().enumerate() {
            assert_eq!(g, Some((i, stay.len(), stay.clone())), "n {n}");
        }
    }
}

#[test]
fn shrink_arguments_are_checked() {
    let boots = world(1, Duration::from_secs(5));
    for bad in [&[][..], &[0], &[1]] {
        let e = boots[0].shrink(bad).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { arg: Arg::Ranks, .. }), "{e}");
    }
}

#[test]
fn ranks_that_shrink_with_different_lists_are_told() {
    let boots = world(4, Duration::from_secs(2));
    let t0 = Instant::now();
    let got = on_each(&boots, |b| match b.rank() {
        0 => b.shrink(&[3]).map(drop),
        1 => b.shrink(&[3, 3]).map(drop), // the same list
        2 => b.shrink(&[3, 1]).map(drop),
        _ => Ok(()), // excluded: does not call
    });
    assert!(t0.elapsed() < Duration::from_secs(4));
    // Ranks 0 and 2 read each other's entries: each is told; rank 1 waits for rank 2, which
    // does not count it in, and is told by the deadline.
    for r in [0, 2] {
        assert_eq!(failure(&got[r]), BootstrapFailure::Protocol, "{:?}", got[r]);
        assert!(format!("{:?}", got[r]).contains("another list"), "{:?}", got[r]);
    }
    assert!(got[1].is_err());
}
