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
