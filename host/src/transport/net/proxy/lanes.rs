//! Dealing a rank's signals to the proxy's lanes: per peer, the signals that carry a chunk and
//! those that carry none, each kind in turn over the lanes (see [`deal`]).

/// Whose turn it is, per peer, among the lanes: for the next signal that carries a chunk and
/// for the next that does not; and the counter of the last credit dealt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    /// The lane of the next signal with a chunk.
    pub data: usize,
    /// The lane of the next signal without one.
    pub control: usize,
    /// The counter of the last credit (signal without a chunk) dealt to this peer, 0 for none.
    pub last_credit: u64,
}

/// A signal as a lane sends it: with the counter of the previous credit to the same peer, if
/// it is a credit (the receiver raises its credit word through the chain: `NetMem::credit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dealt {
    /// The signal.
    pub o: Outgoing,
    /// For a credit, the counter of the previous credit to the same peer (0 for none); 0
    /// otherwise.
    pub prev_credit: u64,
}

/// Whether a signal is a credit: it carries no bytes.
fn is_credit(o: &Outgoing) -> bool {
    o.data.is_none_or(|c| c.bytes == 0)
}

/// Deals `program` (in posting order) to `lanes` lanes: per peer, the signals that carry a
/// chunk go to the lanes in turn, and so do those that carry none, each from where the
/// previous program left off (`turns`, per peer). Dealing the two kinds separately matters: a
/// pair's signals alternate between a chunk and a credit in the steady state of a transfer
/// both ways, so dealing by counter would put every chunk on the same lanes.
///
/// ```
/// use ringccl::internals::transport::net::proxy::{deal, Chunk, Outgoing, Turn};
/// let c = Some(Chunk { from: 0, to: 0, bytes: 8 });
/// // Rank 1's signals: a chunk, a credit, a chunk, a credit.
/// let program: Vec<Outgoing> = (1..=4)
///     .map(|k| Outgoing { peer: 1, k, data: if k % 2 == 1 { c } else { None } })
///     .collect();
/// let mut turns = vec![Turn::default(); 2];
/// let lanes = deal(program, 2, &mut turns);
/// let ks: Vec<Vec<(u64, u64)>> =
///     lanes.iter().map(|l| l.iter().map(|d| (d.o.k, d.prev_credit)).collect()).collect();
/// // Credits 2 and 4 name the credit before them.
/// assert_eq!(ks, vec![vec![(1, 0), (2, 0)], vec![(3, 0), (4, 2)]]);
/// assert_eq!(turns[1], Turn { data: 0, control: 0, last_credit: 4 });
/// ```
pub fn deal(program: Vec<Outgoing>, lanes: usize, turns: &mut [Turn]) -> Vec<Vec<Dealt>> {
    let lanes = lanes.max(1);
    let mut parts: Vec<Vec<Dealt>> = vec![Vec::new(); lanes];
    for o in program {
        let credit = is_credit(&o);
        let (lane, prev_credit) = match turns.get_mut(o.peer) {
            Some(t) => {
                let next = if credit { &mut t.control } else { &mut t.data };
                let lane = *next % lanes;
                *next = (lane + 1) % lanes;
                let prev = if credit {
                    std::mem::replace(&mut t.last_credit, o.k)
                } else {
                    0
                };
                (lane, prev)
            }
            // An unknown peer: the lane refuses it (`Run::take_programs`).
            None => (0, 0),
        };
        parts[lane].push(Dealt { o, prev_credit });
    }
    parts
}

/// A chunk that a signal carries: `bytes` from this rank's outbox at `from` into the peer's
/// scratch at `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset in this rank's outbox.
    pub from: usize,
    /// Offset in the peer's scratch.
    pub to: usize,
    /// Bytes.
    pub bytes: usize,
}

/// One signal this rank's stream will post to a network peer (its counter reaching `k`), and
/// the chunk it announces, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The receiving rank.
    pub peer: usize,
    /// The pair's counter value once the stream has posted this signal.
    pub k: u64,
    /// The chunk that travels with it.
    pub data: Option<Chunk>,
}


#[cfg(test)]
mod tests {
    use super::*;

    fn signal(peer: usize, k: u64, data: bool) -> Outgoing {
        let chunk = Chunk { from: 0, to: 0, bytes: 256 };
        Outgoing { peer, k, data: data.then_some(chunk) }
    }

    #[test]
    fn chunks_and_credits_are_dealt_to_the_lanes_in_turn_across_programs() {
        // The steady state of a transfer both ways: data, credit, data, credit... to rank 1,
        // and only chunks to rank 2.
        let mut turns = vec![Turn::default(); 3];
        let mut seen = vec![Vec::new(); 3];
        let mut credits: Vec<Dealt> = Vec::new();
        let mut k = [0u64; 3];
        for program in 0..5 {
            let mut p = Vec::new();
            for i in 0..6 {
                k[1] += 1;
                p.push(signal(1, k[1], i % 2 == 0));
                k[2] += 1;
                p.push(signal(2, k[2], true));
            }
            let parts = deal(p, 3, &mut turns);
            for (lane, part) in parts.iter().enumerate() {
                // Each lane's part keeps the posting order per peer.
                for q in [1, 2] {
                    let ks: Vec<u64> = part.iter().filter(|d| d.o.peer == q).map(|d| d.o.k).collect();
                    assert!(ks.windows(2).all(|w| w[0] < w[1]), "program {program} lane {lane}");
                }
                seen[lane].extend(part.iter().map(|d| d.o));
                credits.extend(part.iter().filter(|d| d.o.data.is_none()));
            }
        }
        // Chunks to each peer are spread evenly over the lanes (30 to rank 2, 15 to rank 1),
        // and so are rank 1's credits.
        for (lane, got) in seen.iter().enumerate() {
            let count = |q: usize, data: bool| {
                got.iter().filter(|o| o.peer == q && o.data.is_some() == data).count()
            };
            assert_eq!((count(2, true), count(1, true), count(1, false)), (10, 5, 5), "lane {lane}");
        }
        // Each credit names the one before it (across lanes and programs), the first none.
        credits.sort_by_key(|d| d.o.k);
        let mut prev = 0;
        for d in &credits {
            assert_eq!(d.prev_credit, prev, "credit {}", d.o.k);
            prev = d.o.k;
        }
        assert_eq!(turns[1].last_credit, prev);
        // One lane: everything in order on it.
        let mut one = vec![Turn::default(); 3];
        let parts = deal(vec![signal(1, 1, true), signal(1, 2, false)], 1, &mut one);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].len(), 2);
    }
}
