//! The list of collectives: one enum that the library, the simulator, the tests and the perf
//! tool share, so a collective is named and described in one place.

use std::fmt;
use std::str::FromStr;

/// Which collective, without its arguments.
///
/// ```
/// use ringccl::CollectiveKind;
/// assert_eq!(CollectiveKind::ALL.len(), 9);
/// assert_eq!(CollectiveKind::AllReduce.name(), "all_reduce");
/// assert_eq!("all-gather".parse::<CollectiveKind>(), Ok(CollectiveKind::AllGather));
/// assert!(CollectiveKind::Reduce.has_op() && CollectiveKind::Reduce.has_root());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    /// Every rank gets the reduction of every rank's input.
    AllReduce,
    /// Rank `r` gets block `r` of the reduction.
    ReduceScatter,
    /// Every rank gets every rank's input, in rank order.
    AllGather,
    /// Every rank gets the root's input.
    Broadcast,
    /// The root gets the reduction of every rank's input.
    Reduce,
    /// Block `j` of rank `i`'s input goes to block `i` of rank `j`'s output.
    AllToAll,
    /// The root gets every rank's input, in rank order.
    Gather,
    /// Rank `r` gets block `r` of the root's input.
    Scatter,
    /// A group of point-to-point transfers.
    SendRecv,
}

impl CollectiveKind {
    /// Every collective, in this order.
    pub const ALL: [CollectiveKind; 9] = [
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllGather,
        CollectiveKind::Broadcast,
        CollectiveKind::Reduce,
        CollectiveKind::AllToAll,
        CollectiveKind::Gather,
        CollectiveKind::Scatter,
        CollectiveKind::SendRecv,
    ];

    /// The name of the `Communicator` method (`"all_reduce"`, ...), used in errors and logs.
    pub const fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Reduce => "reduce",
            CollectiveKind::AllToAll => "all_to_all",
            CollectiveKind::Gather => "gather",
            CollectiveKind::Scatter => "scatter",
            CollectiveKind::SendRecv => "send_recv",
        }
    }

    /// Whether the collective takes a reduction operator.
    pub const fn has_op(self) -> bool {
        matches!(
            self,
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter | CollectiveKind::Reduce
        )
    }

    /// Whether the collective has a root rank.
    pub const fn has_root(self) -> bool {
        matches!(
            self,
            CollectiveKind::Broadcast
                | CollectiveKind::Reduce
                | CollectiveKind::Gather
                | CollectiveKind::Scatter
        )
    }

    /// Whether the collective can run in place (as in NCCL: not all-to-all, not send/recv).
    pub const fn has_in_place(self) -> bool {
        !matches!(self, CollectiveKind::AllToAll | CollectiveKind::SendRecv)
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing a [`CollectiveKind`]: the text that is not a collective's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownCollective(pub String);

impl fmt::Display for UnknownCollective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = CollectiveKind::ALL.iter().map(|k| k.name()).collect();
        write!(
            f,
            "unknown collective {:?} (expected one of {})",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownCollective {}

impl FromStr for CollectiveKind {
    type Err = UnknownCollective;

    /// Parses a name, ignoring case, `_` and `-` (`all_reduce`, `AllReduce`, `all-reduce`);
    /// `bcast` is broadcast.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let key: String = s
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect::<String>()
            .to_ascii_lowercase();
        if key == "bcast" {
            return Ok(CollectiveKind::Broadcast);
        }
        CollectiveKind::ALL
            .into_iter()
            .find(|k| k.name().replace('_', "") == key)
            .ok_or_else(|| UnknownCollective(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases() {
        for k in CollectiveKind::ALL {
            assert_eq!(k.name().parse::<CollectiveKind>(), Ok(k));
            assert_eq!(k.to_string(), k.name());
        }
        assert_eq!("AllReduce".parse(), Ok(CollectiveKind::AllReduce));
        assert_eq!("all-to-all".parse(), Ok(CollectiveKind::AllToAll));
        assert_eq!("bcast".parse(), Ok(CollectiveKind::Broadcast));
        let e = "gatherall".parse::<CollectiveKind>().unwrap_err();
        assert!(e.to_string().contains("all_reduce"));
    }

    #[test]
    fn properties() {
        let ops: Vec<_> = CollectiveKind::ALL
            .into_iter()
            .filter(|k| k.has_op())
            .collect();
        assert_eq!(ops.len(), 3);
        assert!(!CollectiveKind::AllToAll.has_in_place());
        assert!(CollectiveKind::Gather.has_root());
        assert!(!CollectiveKind::AllGather.has_root());
    }
}
