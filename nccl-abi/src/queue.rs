//! The calls waiting to be issued: what NCCL's per-rank calls are turned into before ringccl
//! takes them over the ranks a process holds (plain data, no CUDA).
//!
//! Each queued call carries the tag of the group that queued it ([`crate::group`]; 0 outside
//! a group), so that a group that failed can drop exactly its own calls at `ncclGroupEnd`.
//!
//! This module is the bottom of the crate's call path: `comm` holds a [`Queues`] per world,
//! `group` and `coll` use it; it uses none of them (only the plain data of `ops`).

use std::collections::{HashMap, VecDeque};

use ringccl::{DataType, RedOp};

use crate::ops::PreMul;

/// The collectives of nccl.h.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclBroadcast` (and `ncclBcast`).
    Broadcast,
    /// `ncclReduce`.
    Reduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclGather`.
    Gather,
    /// `ncclScatter`.
    Scatter,
}

impl Kind {
    /// The NCCL function's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::Reduce => "ncclReduce",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
            Kind::AllToAll => "ncclAlltoAll",
            Kind::Gather => "ncclGather",
            Kind::Scatter => "ncclScatter",
        }
    }

    /// Whether the call has a root.
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Kind::Broadcast | Kind::Reduce | Kind::Gather | Kind::Scatter
        )
    }
}

/// One rank's collective call, as plain data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollCall {
    /// Which collective.
    pub kind: Kind,
    /// The count argument (NCCL's meaning for the collective).
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
    /// The operator (`Sum` where there is none, and for PreMulSum).
    pub op: RedOp,
    /// The PreMulSum operator, when the call has one (its factor is applied to every input
    /// before the sum; [`crate::ops::premul_for`]).
    pub premul: Option<PreMul>,
    /// The root (0 where there is none).
    pub root: usize,
    /// `sendbuff`.
    pub send: u64,
    /// `recvbuff`.
    pub recv: u64,
    /// The `cudaStream_t`/`CUstream`, as an address.
    pub stream: usize,
}

impl CollCall {
    /// Whether two ranks' calls are the same collective. PreMulSum calls match whatever
    /// their scalars (each rank has its own, as in NCCL).
    pub fn same_as(&self, o: &CollCall) -> bool {
        let premul = |c: &CollCall| c.premul.map(|p| p.dtype);
        (
            self.kind,
            self.count,
            self.dtype,
            self.op,
            premul(self),
            self.root,
        ) == (o.kind, o.count, o.dtype, o.op, premul(o), o.root)
    }

    /// The operator's name, for messages (`premulsum` for a PreMulSum).
    fn op_name(&self) -> &'static str {
        if self.premul.is_some() {
            "premulsum"
        } else {
            self.op.name()
        }
    }

    /// The call in words, for messages.
    pub fn describe(&self) -> String {
        if self.kind.rooted() {
            format!(
                "{} count {} {} {} root {}",
                self.kind.name(),
                self.count,
                self.dtype.name(),
                self.op_name(),
                self.root
            )
        } else {
            format!(
                "{} count {} {} {}",
                self.kind.name(),
                self.count,
                self.dtype.name(),
                self.op_name()
            )
        }
    }
}

/// One rank's `ncclSend` or `ncclRecv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pCall {
    /// `true`: a send to `peer`; `false`: a receive from `peer`.
    pub send: bool,
    /// The calling rank.
    pub rank: usize,
    /// The other rank.
    pub peer: usize,
    /// Elements.
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
    /// The buffer.
    pub buf: u64,
    /// The stream, as an address.
    pub stream: usize,
}

/// A queued collective: the call and the tag of the group that queued it.
#[derive(Clone, Copy, Debug)]
struct Queued {
    call: CollCall,
    tag: u64,
}

/// The calls of a world's local ranks waiting for the other ranks' (one queue per local rank),
/// and the sends and receives waiting for their other side.
pub struct Queues {
    per_rank: Vec<VecDeque<Queued>>,
    p2p: Vec<(P2pCall, u64)>,
}

impl Queues {
    /// Empty queues for `n` local ranks.
    pub fn new(n: usize) -> Queues {
        Queues {
            per_rank: vec![VecDeque::new(); n],
            p2p: Vec::new(),
        }
    }

    /// Queues local rank `index`'s collective, queued by the group `tag` (0: none).
    pub fn push_coll(&mut self, index: usize, call: CollCall, tag: u64) {
        if let Some(q) = self.per_rank.get_mut(index) {
            q.push_back(Queued { call, tag });
        }
    }

    /// Queues a send or receive, queued by the group `tag` (0: none).
    pub fn push_p2p(&mut self, call: P2pCall, tag: u64) {
        self.p2p.push((call, tag));
    }

    /// Drops every call the group `tag` queued (a group that failed); returns how many.
    pub fn discard(&mut self, tag: u64) -> usize {
        let before = self.len();
        for q in &mut self.per_rank {
            q.retain(|c| c.tag != tag);
        }
        self.p2p.retain(|(_, t)| *t != tag);
        before - self.len()
    }

    /// How many calls wait.
    pub fn len(&self) -> usize {
        self.p2p.len() + self.per_rank.iter().map(VecDeque::len).sum::<usize>()
    }

    /// Whether nothing waits.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether sends or receives wait.
    pub fn has_p2p(&self) -> bool {
        !self.p2p.is_empty()
    }

    /// Takes every waiting send and receive.
    pub fn take_p2p(&mut self) -> Vec<P2pCall> {
        std::mem::take(&mut self.p2p)
            .into_iter()
            .map(|(c, _)| c)
            .collect()
    }

    /// Whether every (sender, receiver) pair's queued sends add up, in bytes, to the receiver's
    /// queued receives from that sender.
    pub fn p2p_balanced(&self) -> bool {
        let mut sums: HashMap<(usize, usize), i128> = HashMap::new();
        for (c, _) in &self.p2p {
            let bytes = (c.count as i128) * (c.dtype.size() as i128);
            let (key, v) = if c.send {
                ((c.rank, c.peer), bytes)
            } else {
                ((c.peer, c.rank), -bytes)
            };
            *sums.entry(key).or_default() += v;
        }
        sums.values().all(|&v| v == 0)
    }

    /// Takes the next set of calls, one per local rank, if every rank has one.
    pub fn next_set(&mut self) -> Option<Vec<CollCall>> {
        if self.per_rank.iter().any(VecDeque::is_empty) {
            return None;
        }
        let mut set = Vec::with_capacity(self.per_rank.len());
        for q in &mut self.per_rank {
            set.push(q.pop_front()?.call);
        }
        Some(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: Kind, send: u64) -> CollCall {
        CollCall {
            kind,
            count: 4,
            dtype: DataType::F32,
            op: RedOp::Sum,
            premul: None,
            root: 0,
            send,
            recv: send,
            stream: 0,
        }
    }

    fn p2p(send: bool, rank: usize, peer: usize, count: usize, dtype: DataType) -> P2pCall {
        P2pCall {
            send,
            rank,
            peer,
            count,
            dtype,
            buf: 0x1000,
            stream: 0,
        }
    }

    #[test]
    fn transfers_balance_in_bytes() {
        let mut q = Queues::new(2);
        q.push_p2p(p2p(true, 0, 1, 4, DataType::F32), 0);
        assert!(!q.p2p_balanced());
        q.push_p2p(p2p(false, 1, 0, 16, DataType::U8), 0);
        assert!(q.p2p_balanced());
        q.push_p2p(p2p(false, 0, 1, 1, DataType::F64), 0);
        assert!(!q.p2p_balanced());
        assert_eq!(q.take_p2p().len(), 3);
        assert!(!q.has_p2p());
    }

    #[test]
    fn sets_form_when_every_rank_has_a_call() {
        let mut q = Queues::new(2);
        q.push_coll(0, call(Kind::AllReduce, 1), 0);
        assert!(q.next_set().is_none());
        q.push_coll(1, call(Kind::AllReduce, 2), 0);
        assert_eq!(q.next_set().map(|s| s.len()), Some(2));
        assert!(q.is_empty());
    }

    #[test]
    fn a_failed_group_drops_only_its_own_calls() {
        let mut q = Queues::new(2);
        q.push_coll(0, call(Kind::AllReduce, 1), 0);
        q.push_coll(1, call(Kind::Broadcast, 2), 7);
        q.push_p2p(p2p(true, 0, 1, 4, DataType::F32), 7);
        q.push_p2p(p2p(false, 1, 0, 4, DataType::F32), 8);
        assert_eq!(q.discard(7), 2);
        assert_eq!(q.len(), 2);
        assert_eq!(q.discard(7), 0);
        assert_eq!(q.take_p2p()[0].rank, 1);
    }
}
