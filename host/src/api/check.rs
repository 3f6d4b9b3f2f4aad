//! The optional check that every rank of a job of processes makes the same call
//! (`RINGCCL_CHECK_CALLS=1`, [`Config::check_calls`](crate::Config::check_calls)): before
//! anything is enqueued, each rank's call is described ([`CallSig`]) and the descriptions are
//! exchanged over the bootstrap connections; a rank that called a different collective, type,
//! operation, count or root than its peers, or point-to-point groups whose sends and receives do
//! not pair up, makes the call fail on every rank with [`Error::InvalidArgument`] naming the
//! rank and both calls, instead of corrupting data or waiting for a timeout.
//!
//! It costs one all-gather over TCP per call (tens of microseconds), so it is off by default,
//! like PyTorch's collective fingerprint check (`TORCH_DISTRIBUTED_DEBUG=DETAIL`).

use crate::{Arg, DataType, Error, RedOp, Result};

/// One rank's call, as the check compares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallSig {
    /// A collective.
    Collective {
        /// Its name (`all_reduce`, …).
        name: String,
        /// The element type.
        dtype: String,
        /// The reduction, for the collectives that reduce.
        op: Option<String>,
        /// The count argument.
        count: usize,
        /// The root, for the collectives that have one.
        root: Option<usize>,
    },
    /// A point-to-point group: bytes this rank sends to and receives from each rank.
    PeerOps {
        /// The element type.
        dtype: String,
        /// Bytes to each rank.
        sends: Vec<u64>,
        /// Bytes from each rank.
        recvs: Vec<u64>,
    },
}

impl CallSig {
    /// A collective's description.
    pub fn collective(
        name: &str,
        dtype: DataType,
        op: Option<RedOp>,
        count: usize,
        root: Option<usize>,
    ) -> Self {
        CallSig::Collective {
            name: name.into(),
            dtype: dtype.name().into(),
            op: op.map(|o| o.name().into()),
            count,
            root,
        }
    }

    /// Encodes the description as one line of text (what the ranks exchange).
    ///
    /// ```
    /// use ringccl::internals::api::check::CallSig;
    /// use ringccl::{DataType, RedOp};
    /// let s = CallSig::collective("all_reduce", DataType::F32, Some(RedOp::Sum), 8, None);
    /// assert_eq!(CallSig::decode(&s.encode()), Some(s));
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        match self {
            CallSig::Collective {
                name,
                dtype,
                op,
                count,
                root,
            } => format!(
                "C {name} {dtype} {} {count} {}",
                op.as_deref().unwrap_or("-"),
                root.map_or("-".to_string(), |r| r.to_string())
            ),
            CallSig::PeerOps { dtype, sends, recvs } => {
                format!("P {dtype} {} {}", list(sends), list(recvs))
            }
        }
        .into_bytes()
    }

    /// The description [`CallSig::encode`] wrote (`None` for anything else).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        let f: Vec<&str> = text.split(' ').collect();
        let opt = |s: &str| (s != "-").then(|| s.to_string());
        let list = |s: &str| -> Option<Vec<u64>> {
            if s.is_empty() {
                return Some(Vec::new());
            }
            s.split(',').map(|x| x.parse().ok()).collect()
        };
        match f.as_slice() {
            ["C", name, dtype, op, count, root] => Some(CallSig::Collective {
                name: name.to_string(),
                dtype: dtype.to_string(),
                op: opt(op),
                count: count.parse().ok()?,
                root: match *root {
                    "-" => None,
                    r => Some(r.parse().ok()?),
                },
            }),
            ["P", dtype, sends, recvs] => Some(CallSig::PeerOps {
                dtype: dtype.to_string(),
                sends: list(sends)?,
                recvs: list(recvs)?,
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for CallSig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallSig::Collective {
                name,
                dtype,
                op,
                count,
                root,
            } => {
                write!(f, "{name} {dtype} count {count}")?;
                if let Some(op) = op {
                    write!(f, " op {op}")?;
                }
                if let Some(r) = root {
                    write!(f, " root {r}")?;
                }
                Ok(())
            }
            CallSig::PeerOps { dtype, .. } => write!(f, "a point-to-point group of {dtype}"),
        }
    }
}

/// Compares rank `me`'s call with every rank's (`all[q]`: rank `q`'s encoded description).
/// Pure. Errors name the first rank that disagrees.
///
/// ```
/// use ringccl::internals::api::check::{compare, CallSig};
/// use ringccl::{DataType, RedOp};
/// let a = CallSig::collective("all_reduce", DataType::F32, Some(RedOp::Sum), 8, None);
/// let b = CallSig::collective("all_reduce", DataType::F32, Some(RedOp::Sum), 9, None);
/// assert!(compare(0, &[a.encode(), a.encode()]).is_ok());
/// let e = compare(0, &[a.encode(), b.encode()]).unwrap_err().to_string();
/// assert!(e.contains("rank 1") && e.contains("count 9"), "{e}");
/// ```
pub fn compare(me: usize, all: &[Vec<u8>]) -> Result<()> {
    let mine = all.get(me).and_then(|b| CallSig::decode(b)).ok_or_else(|| Error::Internal {
        reason: format!("rank {me}'s call description is missing"),
    })?;
    for (q, bytes) in all.iter().enumerate() {
        let Some(theirs) = CallSig::decode(bytes) else {
            return Err(mismatch(q, format!("rank {q} sent an unreadable call description")));
        };
        match (&mine, &theirs) {
            (CallSig::PeerOps { dtype, sends, recvs }, CallSig::PeerOps { dtype: d2, sends: s2, recvs: r2 }) => {
                if dtype != d2 {
                    return Err(mismatch(q, format!(
                        "rank {q} made a point-to-point group of {d2}, rank {me} of {dtype}"
                    )));
                }
                let get = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
                if get(sends, q) != get(r2, me) {
                    return Err(mismatch(q, format!(
                        "rank {me} sends {} bytes to rank {q}, which receives {} bytes from it",
                        get(sends, q),
                        get(r2, me)
                    )));
                }
                if get(recvs, q) != get(s2, me) {
                    return Err(mismatch(q, format!(
                        "rank {me} receives {} bytes from rank {q}, which sends {} bytes to it",
                        get(recvs, q),
                        get(s2, me)
                    )));
                }
            }
            (a, b) if a != b => {
                return Err(mismatch(q, format!(
                    "rank {q} called {b} while rank {me} called {a}"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

fn mismatch(rank: usize, what: String) -> Error {
    Error::invalid(
        Some(rank),
        Arg::Ranks,
        format!("the ranks' calls differ (checked because RINGCCL_CHECK_CALLS is set): {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coll(name: &str, count: usize, root: Option<usize>) -> Vec<u8> {
        CallSig::collective(name, DataType::F32, Some(RedOp::Sum), count, root).encode()
    }

    fn p2p(sends: &[u64], recvs: &[u64]) -> Vec<u8> {
        CallSig::PeerOps {
            dtype: "f32".into(),
            sends: sends.to_vec(),
            recvs: recvs.to_vec(),
        }
        .encode()
    }

    #[test]
    fn equal_calls_pass() {
        let all = vec![coll("broadcast", 10, Some(1)); 3];
        for me in 0..3 {
            compare(me, &all).unwrap();
        }
    }

    #[test]
    fn each_difference_names_the_rank_and_both_calls() {
        let base = coll("all_reduce", 10, None);
        for other in [
            coll("all_gather", 10, None),
            coll("all_reduce", 11, None),
            CallSig::collective("all_reduce", DataType::BF16, Some(RedOp::Sum), 10, None).encode(),
            CallSig::collective("all_reduce", DataType::F32, Some(RedOp::Max), 10, None).encode(),
            coll("all_reduce", 10, Some(0)),
            p2p(&[0, 4], &[0, 4]),
        ] {
            let e = compare(0, &[base.clone(), other.clone()]).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { rank: Some(1), arg: Arg::Ranks, .. }), "{e}");
            // Every rank sees it (from its own side).
            let e = compare(1, &[base.clone(), other]).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { rank: Some(0), .. }), "{e}");
        }
    }

    #[test]
    fn point_to_point_bytes_must_pair_up() {
        // Rank 0 sends 8 bytes to rank 1 and receives 4 from it; rank 1 the mirror.
        let ok = [p2p(&[0, 8], &[0, 4]), p2p(&[4, 0], &[8, 0])];
        compare(0, &ok).unwrap();
        compare(1, &ok).unwrap();
        let bad = [p2p(&[0, 8], &[0, 4]), p2p(&[4, 0], &[6, 0])];
        let e = compare(0, &bad).unwrap_err().to_string();
        assert!(e.contains("sends 8 bytes to rank 1, which receives 6"), "{e}");
        let e = compare(1, &bad).unwrap_err().to_string();
        assert!(e.contains("receives 6 bytes from rank 0, which sends 8"), "{e}");
        // Ranks outside the group (nothing to or from anyone) pass.
        let three = [p2p(&[0, 8, 0], &[0, 0, 0]), p2p(&[0, 0, 0], &[8, 0, 0]), p2p(&[], &[])];
        for me in 0..3 {
            compare(me, &three).unwrap();
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let e = compare(0, &[coll("all_reduce", 1, None), b"\xff\x00".to_vec()]).unwrap_err();
        assert!(e.to_string().contains("unreadable"), "{e}");
        assert!(compare(2, &[coll("all_reduce", 1, None)]).is_err());
        assert_eq!(CallSig::decode(b"C all_reduce f32 sum x -"), None);
    }
}
