use super::*;
use super::super::test_util::*;

const AR: Collective = Collective::AllReduce { count: 100 };
// ---- all-reduce ----

#[test]
fn all_reduce_out_of_place_ok() {
    let args = oop(4, 100, 100);
    let plan = run(AR, &args).unwrap();
    assert_eq!(plan.layout, Layout::OutOfPlace);
    for (r, p) in plan.ptrs.iter().enumerate() {
        assert_eq!(
            (p.send, p.recv),
            (args[r].send.unwrap().ptr, args[r].recv.unwrap().ptr)
        );
        assert!(p.reads_send && p.writes_recv);
    }
}

#[test]
fn all_reduce_in_place_flag() {
    let plan = run(AR, &inp(4, 100)).unwrap();
    assert_eq!(plan.layout, Layout::SendInRecv { stride: 0 });
    assert!(plan.ptrs.iter().all(|p| p.send == p.recv && p.send != 0));
}

#[test]
fn all_reduce_in_place_by_equal_pointers() {
    let args: Vec<_> = (0..3)
        .map(|r| RankArgs::out_of_place(buf(r, 2, 100), buf(r, 2, 100)))
        .collect();
    assert_eq!(
        run(AR, &args).unwrap().layout,
        Layout::SendInRecv { stride: 0 }
    );
}

#[test]
fn wrong_number_of_rank_arguments() {
    let d = devs(4);
    let reason = err(
        validate(AR, &oop(3, 100, 100), &d, &d, F32),
        None,
        Arg::Ranks,
    );
    assert!(reason.contains('3') && reason.contains('4'), "{reason}");
}

#[test]
fn wrong_number_of_streams() {
    let d = devs(4);
    let reason = err(
        validate(AR, &oop(4, 100, 100), &d, &d[..2], F32),
        None,
        Arg::Stream,
    );
    assert!(reason.contains("2 streams"), "{reason}");
}

#[test]
fn empty_communicator_is_rejected() {
    err(validate(AR, &[], &[], &[], F32), None, Arg::Ranks);
}

#[test]
fn missing_send_names_rank() {
    let mut args = oop(4, 100, 100);
    args[2] = RankArgs::recv_only(buf(2, 1, 100));
    let reason = err(run(AR, &args), Some(2), Arg::Send);
    assert!(reason.contains("send buffer"), "{reason}");
}

#[test]
fn missing_recv_names_rank() {
    let mut args = oop(4, 100, 100);
    args[1] = RankArgs::send_only(buf(1, 0, 100));
    err(run(AR, &args), Some(1), Arg::Recv);
}

#[test]
fn send_too_short_says_needed_and_given() {
    let mut args = oop(4, 100, 100);
    args[3].send = Some(buf(3, 0, 99));
    let reason = err(run(AR, &args), Some(3), Arg::Send);
    assert!(reason.contains("100") && reason.contains("99"), "{reason}");
}

#[test]
fn recv_too_short() {
    let mut args = oop(2, 100, 100);
    args[0].recv = Some(buf(0, 1, 10));
    let reason = err(run(AR, &args), Some(0), Arg::Recv);
    assert!(
        reason.contains("needs 100") && reason.contains("10 given"),
        "{reason}"
    );
}

#[test]
fn longer_buffers_are_fine() {
    assert!(run(AR, &oop(2, 1000, 5000)).is_ok());
}

#[test]
fn send_on_wrong_device() {
    let mut args = oop(4, 100, 100);
    args[1].send = Some(buf(2, 5, 100));
    let reason = err(run(AR, &args), Some(1), Arg::Send);
    assert!(
        reason.contains("device 2") && reason.contains("device 1"),
        "{reason}"
    );
}

#[test]
fn recv_on_wrong_device() {
    let mut args = oop(4, 100, 100);
    args[3].recv = Some(buf(0, 5, 100));
    err(run(AR, &args), Some(3), Arg::Recv);
}

#[test]
fn stream_on_wrong_device() {
    let d = devs(4);
    let streams = [0, 1, 3, 3];
    let reason = err(
        validate(AR, &oop(4, 100, 100), &d, &streams, F32),
        Some(2),
        Arg::Stream,
    );
    assert!(reason.contains("device 3"), "{reason}");
}

#[test]
fn ranks_on_non_identity_devices() {
    // Rank r on device 3 - r: buffers and streams must follow the rank's device.
    let d = vec![3, 2, 1, 0];
    let args: Vec<_> = d
        .iter()
        .map(|&dev| RankArgs::out_of_place(buf(dev, 0, 8), buf(dev, 1, 8)))
        .collect();
    assert!(validate(Collective::AllReduce { count: 8 }, &args, &d, &d, F32).is_ok());
    err(
        validate(Collective::AllReduce { count: 8 }, &args, &d, &devs(4), F32),
        Some(0),
        Arg::Stream,
    );
}

#[test]
fn partial_overlap_is_rejected() {
    let mut args = oop(2, 100, 100);
    let s = buf(1, 0, 200);
    args[1] = RankArgs::out_of_place(s, s.offset(10, F32).unwrap());
    let reason = err(run(AR, &args), Some(1), Arg::Recv);
    assert!(
        reason.contains("overlaps") && reason.contains("send == recv"),
        "{reason}"
    );
}

#[test]
fn adjacent_buffers_do_not_overlap() {
    let mut args = oop(2, 100, 100);
    let s = buf(1, 0, 200);
    args[1] = RankArgs::out_of_place(s, s.offset(100, F32).unwrap());
    assert_eq!(run(AR, &args).unwrap().layout, Layout::OutOfPlace);
}

#[test]
fn overlap_only_counts_the_elements_used() {
    // The buffers overlap beyond `count` elements, which the call never touches.
    let s = buf(0, 0, 300);
    let args = [RankArgs::out_of_place(s, s.offset(100, F32).unwrap())];
    assert!(run(AR, &args).is_ok());
}

#[test]
fn mixed_in_place_is_rejected() {
    let mut args = inp(3, 100);
    args[2] = RankArgs::out_of_place(buf(2, 0, 100), buf(2, 1, 100));
    let reason = err(run(AR, &args), Some(2), Arg::Recv);
    assert!(reason.contains("rank 0 is in place"), "{reason}");
}

#[test]
fn count_zero_is_valid_with_empty_buffers() {
    let plan = run(Collective::AllReduce { count: 0 }, &oop(4, 0, 0)).unwrap();
    assert_eq!(plan.ptrs.len(), 4);
}

#[test]
fn count_zero_still_checks_devices_and_presence() {
    let mut args = oop(2, 0, 0);
    args[1].send = Some(buf(0, 0, 0));
    err(
        run(Collective::AllReduce { count: 0 }, &args),
        Some(1),
        Arg::Send,
    );
    args[1] = RankArgs::send_only(buf(1, 0, 0));
    err(
        run(Collective::AllReduce { count: 0 }, &args),
        Some(1),
        Arg::Recv,
    );
}

#[test]
fn one_rank_is_valid() {
    assert_eq!(
        run(AR, &oop(1, 100, 100)).unwrap().layout,
        Layout::OutOfPlace
    );
    assert_eq!(
        run(AR, &inp(1, 100)).unwrap().layout,
        Layout::SendInRecv { stride: 0 }
    );
}

#[test]
fn count_overflow_is_rejected() {
    let c = Collective::AllReduce {
        count: usize::MAX / 2,
    };
    err(run(c, &oop(2, 0, 0)), None, Arg::Count);
    let g = Collective::AllGather {
        sendcount: usize::MAX / 3,
    };
    err(run(g, &oop(4, 0, 0)), None, Arg::Count);
}

#[test]
fn buffer_past_the_address_space_is_rejected() {
    let mut args = oop(2, 100, 100);
    args[0].recv = Some(RawBuf::new(u64::MAX - 100, 100, 0));
    let reason = err(run(AR, &args), Some(0), Arg::Recv);
    assert!(reason.contains("address space"), "{reason}");
}

#[test]
fn in_place_flag_without_buffer_is_rejected() {
    let mut args = inp(2, 100);
    args[1] = RankArgs {
        send: None,
        recv: None,
        in_place: true,
    };
    err(run(AR, &args), Some(1), Arg::Recv);
}

// ---- reduce-scatter ----

const RS: Collective = Collective::ReduceScatter { recvcount: 10 };

#[test]
fn reduce_scatter_shapes() {
    assert!(run(RS, &oop(4, 40, 10)).is_ok());
    let reason = err(run(RS, &oop(4, 39, 10)), Some(0), Arg::Send);
    assert!(reason.contains("40") && reason.contains("39"), "{reason}");
    err(run(RS, &oop(4, 40, 9)), Some(0), Arg::Recv);
}

#[test]
fn reduce_scatter_in_place_flag_offsets_recv() {
    let args = inp(4, 40);
    let plan = run(RS, &args).unwrap();
    assert_eq!(plan.layout, Layout::RecvInSend { stride: 10 });
    for (r, p) in plan.ptrs.iter().enumerate() {
        assert_eq!(p.send, args[r].send.unwrap().ptr);
        assert_eq!(p.recv, p.send + (r * 10 * F32) as u64);
    }
}

#[test]
fn reduce_scatter_in_place_flag_checks_whole_buffer() {
    let reason = err(run(RS, &inp(4, 30)), Some(0), Arg::Send);
    assert!(reason.contains("40"), "{reason}");
}

#[test]
fn reduce_scatter_exact_pointer_in_place() {
    let args: Vec<_> = (0..4)
        .map(|r| {
            let s = buf(r, 0, 40);
            RankArgs::out_of_place(s, s.offset(r * 10, F32).unwrap())
        })
        .collect();
    assert_eq!(
        run(RS, &args).unwrap().layout,
        Layout::RecvInSend { stride: 10 }
    );
}

#[test]
fn reduce_scatter_same_pointer_is_not_in_place_except_rank0() {
    // recv == send is NCCL's in-place layout only for rank 0.
    let args: Vec<_> = (0..3)
        .map(|r| RankArgs::out_of_place(buf(r, 0, 30), buf(r, 0, 30)))
        .collect();
    let reason = err(run(RS, &args), Some(1), Arg::Recv);
    assert!(
        reason.contains("recv == send + rank * recvcount"),
        "{reason}"
    );
}

// ---- all-gather ----

const AG: Collective = Collective::AllGather { sendcount: 10 };

#[test]
fn all_gather_shapes() {
    assert!(run(AG, &oop(3, 10, 30)).is_ok());
    err(run(AG, &oop(3, 9, 30)), Some(0), Arg::Send);
    let reason = err(run(AG, &oop(3, 10, 29)), Some(0), Arg::Recv);
    assert!(reason.contains("30") && reason.contains("29"), "{reason}");
}

#[test]
fn all_gather_in_place_flag_offsets_send() {
    let args = inp(3, 30);
    let plan = run(AG, &args).unwrap();
    assert_eq!(plan.layout, Layout::SendInRecv { stride: 10 });
    for (r, p) in plan.ptrs.iter().enumerate() {
        assert_eq!(p.recv, args[r].recv.unwrap().ptr);
        assert_eq!(p.send, p.recv + (r * 10 * F32) as u64);
    }
}

#[test]
fn all_gather_in_place_buffer_too_short() {
    let reason = err(run(AG, &inp(3, 25)), Some(0), Arg::Recv);
    assert!(reason.contains("30") && reason.contains("25"), "{reason}");
}

#[test]
fn all_gather_exact_pointer_in_place() {
    let args: Vec<_> = (0..3)
        .map(|r| {
            let q = buf(r, 0, 30);
            RankArgs::out_of_place(q.offset(r * 10, F32).unwrap(), q)
        })
        .collect();
    assert_eq!(
        run(AG, &args).unwrap().layout,
        Layout::SendInRecv { stride: 10 }
    );
}

#[test]
fn all_gather_send_at_wrong_slot_is_rejected() {
    let mut args: Vec<_> = (0..3)
        .map(|r| {
            let q = buf(r, 0, 30);
            RankArgs::out_of_place(q.offset(r * 10, F32).unwrap(), q)
        })
        .collect();
    let q = buf(1, 0, 30);
    args[1] = RankArgs::out_of_place(q.offset(20, F32).unwrap(), q); // rank 2's slot
    let reason = err(run(AG, &args), Some(1), Arg::Recv);
    assert!(
        reason.contains("send == recv + rank * sendcount"),
        "{reason}"
    );
}

// ---- broadcast ----

fn bcast_args(n: usize, root: usize, count: usize) -> Vec<RankArgs> {
    (0..n)
        .map(|r| {
            if r == root {
                RankArgs::send_only(buf(r, 0, count))
            } else {
                RankArgs::recv_only(buf(r, 1, count))
            }
        })
        .collect()
}

#[test]
fn broadcast_send_only_root_stands_in_for_its_recv() {
    let c = Collective::Broadcast { count: 50, root: 2 };
    let args = bcast_args(4, 2, 50);
    let plan = run(c, &args).unwrap();
    assert_eq!(plan.layout, Layout::SendInRecv { stride: 0 });
    let root = plan.ptrs[2];
    assert_eq!(
        (root.send, root.recv),
        (args[2].send.unwrap().ptr, args[2].send.unwrap().ptr)
    );
    assert!(root.reads_send && !root.writes_recv);
    for r in [0, 1, 3] {
        assert_eq!(plan.ptrs[r].recv, args[r].recv.unwrap().ptr);
        assert!(!plan.ptrs[r].reads_send && plan.ptrs[r].writes_recv);
    }
}

#[test]
fn broadcast_root_out_of_place() {
    let c = Collective::Broadcast { count: 50, root: 0 };
    let mut args = bcast_args(3, 0, 50);
    args[0] = RankArgs::out_of_place(buf(0, 0, 50), buf(0, 1, 50));
    let plan = run(c, &args).unwrap();
    assert_eq!(plan.layout, Layout::OutOfPlace);
    assert_eq!(plan.ptrs[1].send, 0);
}

#[test]
fn broadcast_root_in_place() {
    let c = Collective::Broadcast { count: 50, root: 1 };
    assert_eq!(
        run(c, &inp(3, 50)).unwrap().layout,
        Layout::SendInRecv { stride: 0 }
    );
}

#[test]
fn broadcast_root_needs_send() {
    let c = Collective::Broadcast { count: 50, root: 1 };
    let mut args = bcast_args(3, 1, 50);
    args[1] = RankArgs::recv_only(buf(1, 1, 50));
    err(run(c, &args), Some(1), Arg::Send);
}

#[test]
fn broadcast_non_root_needs_recv() {
    let c = Collective::Broadcast { count: 50, root: 0 };
    let mut args = bcast_args(3, 0, 50);
    args[2] = RankArgs::send_only(buf(2, 0, 50));
    err(run(c, &args), Some(2), Arg::Recv);
}

#[test]
fn broadcast_root_out_of_range() {
    let c = Collective::Broadcast { count: 50, root: 3 };
    let reason = err(run(c, &bcast_args(3, 0, 50)), None, Arg::Root);
    assert!(
        reason.contains("root 3") && reason.contains("3 ranks"),
        "{reason}"
    );
}

#[test]
fn broadcast_ignores_non_root_send() {
    let c = Collective::Broadcast { count: 50, root: 0 };
    let mut args = bcast_args(2, 0, 50);
    // A send buffer on the wrong device and too short: unused, so ignored (as NCCL does).
    args[1] = RankArgs::out_of_place(buf(0, 7, 1), buf(1, 1, 50));
    let plan = run(c, &args).unwrap();
    assert!(!plan.ptrs[1].reads_send);
}

#[test]
fn broadcast_root_recv_too_short_when_given() {
    let c = Collective::Broadcast { count: 50, root: 0 };
    let mut args = bcast_args(2, 0, 50);
    args[0] = RankArgs::out_of_place(buf(0, 0, 50), buf(0, 1, 49));
    err(run(c, &args), Some(0), Arg::Recv);
}

// ---- reduce ----

#[test]
fn reduce_out_of_place() {
    let c = Collective::Reduce { count: 20, root: 1 };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 20))).collect();
    args[1] = RankArgs::out_of_place(buf(1, 0, 20), buf(1, 1, 20));
    let plan = run(c, &args).unwrap();
    assert_eq!(plan.layout, Layout::OutOfPlace);
    assert_eq!(plan.ptrs[0].recv, 0);
    assert!(plan.ptrs[1].writes_recv && !plan.ptrs[0].writes_recv);
}

#[test]
fn reduce_root_in_place_aliases_non_roots() {
    let c = Collective::Reduce { count: 20, root: 0 };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 20))).collect();
    args[0] = RankArgs::in_place(buf(0, 0, 20));
    let plan = run(c, &args).unwrap();
    assert_eq!(plan.layout, Layout::SendInRecv { stride: 0 });
    // Every rank's send is reachable through its recv at offset 0.
    assert!(plan.ptrs.iter().all(|p| p.send == p.recv));
}

#[test]
fn reduce_ignores_non_root_recv() {
    let c = Collective::Reduce { count: 20, root: 0 };
    let mut args = oop(2, 20, 20);
    args[1].recv = Some(buf(0, 9, 0)); // wrong device, too short: unused
    assert!(run(c, &args).is_ok());
}

#[test]
fn reduce_needs_send_everywhere() {
    let c = Collective::Reduce { count: 20, root: 0 };
    let mut args = oop(3, 20, 20);
    args[2] = RankArgs::recv_only(buf(2, 1, 20));
    err(run(c, &args), Some(2), Arg::Send);
}

#[test]
fn reduce_root_needs_recv() {
    let c = Collective::Reduce { count: 20, root: 2 };
    let args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 20))).collect();
    err(run(c, &args), Some(2), Arg::Recv);
}

#[test]
fn reduce_root_out_of_range() {
    err(
        run(Collective::Reduce { count: 20, root: 9 }, &oop(3, 20, 20)),
        None,
        Arg::Root,
    );
}

// ---- all-to-all ----

const A2A: Collective = Collective::AllToAll { count_per_peer: 5 };

#[test]
fn all_to_all_shapes() {
    assert!(run(A2A, &oop(4, 20, 20)).is_ok());
    err(run(A2A, &oop(4, 19, 20)), Some(0), Arg::Send);
    err(run(A2A, &oop(4, 20, 19)), Some(0), Arg::Recv);
}

#[test]
fn all_to_all_in_place_is_rejected() {
    let reason = err(run(A2A, &inp(2, 10)), Some(0), Arg::Recv);
    assert!(reason.contains("in place"), "{reason}");
}

#[test]
fn all_to_all_same_pointer_is_rejected() {
    let args: Vec<_> = (0..2)
        .map(|r| RankArgs::out_of_place(buf(r, 0, 10), buf(r, 0, 10)))
        .collect();
    err(run(A2A, &args), Some(0), Arg::Recv);
}

// ---- gather ----

#[test]
fn gather_out_of_place() {
    let c = Collective::Gather {
        sendcount: 8,
        root: 1,
    };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 8))).collect();
    args[1] = RankArgs::out_of_place(buf(1, 0, 8), buf(1, 1, 24));
    assert_eq!(run(c, &args).unwrap().layout, Layout::OutOfPlace);
    args[1] = RankArgs::out_of_place(buf(1, 0, 8), buf(1, 1, 23));
    err(run(c, &args), Some(1), Arg::Recv);
}

#[test]
fn gather_root_in_place_gives_non_roots_a_consistent_base() {
    let c = Collective::Gather {
        sendcount: 8,
        root: 1,
    };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 8))).collect();
    args[1] = RankArgs::in_place(buf(1, 0, 24));
    let plan = run(c, &args).unwrap();
    assert_eq!(plan.layout, Layout::SendInRecv { stride: 8 });
    for (r, p) in plan.ptrs.iter().enumerate() {
        assert_eq!(p.recv + (r * 8 * F32) as u64, p.send, "rank {r}");
    }
    assert_eq!(plan.ptrs[2].send, args[2].send.unwrap().ptr);
    assert_eq!(plan.ptrs[1].recv, args[1].recv.unwrap().ptr);
}

#[test]
fn gather_non_root_needs_send() {
    let c = Collective::Gather {
        sendcount: 8,
        root: 0,
    };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::send_only(buf(r, 0, 8))).collect();
    args[0] = RankArgs::out_of_place(buf(0, 0, 8), buf(0, 1, 24));
    args[2] = RankArgs::recv_only(buf(2, 1, 8));
    err(run(c, &args), Some(2), Arg::Send);
}

// ---- scatter ----

#[test]
fn scatter_out_of_place() {
    let c = Collective::Scatter {
        recvcount: 8,
        root: 0,
    };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::recv_only(buf(r, 1, 8))).collect();
    args[0] = RankArgs::out_of_place(buf(0, 0, 24), buf(0, 1, 8));
    let plan = run(c, &args).unwrap();
    assert_eq!(plan.layout, Layout::OutOfPlace);
    assert_eq!(plan.ptrs[2].send, 0);
}

#[test]
fn scatter_root_in_place_gives_non_roots_a_consistent_base() {
    let c = Collective::Scatter {
        recvcount: 8,
        root: 2,
    };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::recv_only(buf(r, 1, 8))).collect();
    args[2] = RankArgs::in_place(buf(2, 0, 24));
    let plan = run(c, &args).unwrap();
    assert_eq!(plan.layout, Layout::RecvInSend { stride: 8 });
    for (r, p) in plan.ptrs.iter().enumerate() {
        assert_eq!(p.send + (r * 8 * F32) as u64, p.recv, "rank {r}");
    }
}

#[test]
fn scatter_root_needs_whole_send() {
    let c = Collective::Scatter {
        recvcount: 8,
        root: 0,
    };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::recv_only(buf(r, 1, 8))).collect();
    args[0] = RankArgs::recv_only(buf(0, 1, 8));
    err(run(c, &args), Some(0), Arg::Send);
    args[0] = RankArgs::out_of_place(buf(0, 0, 16), buf(0, 1, 8));
    let reason = err(run(c, &args), Some(0), Arg::Send);
    assert!(reason.contains("24") && reason.contains("16"), "{reason}");
}

#[test]
fn scatter_non_root_needs_recv() {
    let c = Collective::Scatter {
        recvcount: 8,
        root: 0,
    };
    let mut args: Vec<_> = (0..3).map(|r| RankArgs::recv_only(buf(r, 1, 8))).collect();
    args[0] = RankArgs::out_of_place(buf(0, 0, 24), buf(0, 1, 8));
    args[1] = RankArgs::send_only(buf(1, 0, 8));
    err(run(c, &args), Some(1), Arg::Recv);
}
#[test]
fn errors_display_rank_and_say_nothing_ran() {
    let mut args = oop(2, 100, 100);
    args[1].recv = Some(buf(1, 1, 1));
    let msg = run(AR, &args).unwrap_err().to_string();
    assert!(
        msg.contains("rank 1") && msg.contains("no kernel was launched"),
        "{msg}"
    );
}
