//! One process per GPU (`--procs`, or any launcher's environment): each process of the job is
//! one rank; ringccl-perf's own bootstrap world carries what the ranks must agree on.
//!
//! Two rendezvous run side by side: the communicator's ([`ringccl::Communicator::from_env`],
//! on the port [`LaunchEnv`] derives: `MASTER_PORT` + 1, or `RINGCCL_COMM_ID`'s port) and
//! ringccl-perf's, one port above it ([`tool_env`]). The ports differ, and so do the keys
//! derived from them, so neither service takes the other's ranks. ringccl-perf joins its own
//! world first and keeps it for the whole run: rank 0 hands NCCL's unique id to the others
//! through it, every rank's GPU is gathered for the report, and after each measurement every
//! rank's [`Outcome`] (wrong elements, per-iteration times, error) is gathered and combined
//! ([`combine`]): the slowest rank's time per iteration, the sum of the wrong elements, the
//! first error. Every rank then holds the same records; only rank 0 prints and writes them.

use std::time::Duration;

use ringccl::bootstrap::Bootstrap;
use ringccl::LaunchEnv;

/// The shortest time a gather waits for the other ranks once the world is joined (a
/// measurement of a large size, or a check, may keep a rank away longer than the join's
/// timeout).
pub const MIN_GATHER_TIMEOUT: Duration = Duration::from_secs(600);

/// The launch a run is in: `Ok(None)` for one process driving every GPU (no launcher),
/// `Ok(Some(env))` for one process per GPU. `procs` is `--procs`, `ngpus` `--ngpus`, `env`
/// what [`LaunchEnv::from_env`] read.
pub fn launch(
    procs: Option<usize>,
    ngpus: Option<usize>,
    env: ringccl::Result<Option<LaunchEnv>>,
) -> Result<Option<LaunchEnv>, String> {
    let env = env.map_err(|e| format!("the launcher's environment: {e}"))?;
    match (env, procs) {
        (None, None) => Ok(None),
        (None, Some(n)) => Err(format!(
            "--procs {n}: RANK and WORLD_SIZE are not set; start ringccl-perf with a launcher, \
             one process per GPU (ringccl-run -n {n} ringccl-perf --procs {n} ..., or torchrun \
             --nproc-per-node {n} ringccl-perf ...)"
        )),
        (Some(env), Some(n)) if n != env.world_size => Err(format!(
            "--procs {n}: the launcher started {} process(es) (WORLD_SIZE={})",
            env.world_size, env.world_size
        )),
        (Some(env), _) if ngpus.is_some() => Err(format!(
            "--ngpus is for one process driving several GPUs; started by a launcher \
             (WORLD_SIZE={}), each process drives GPU LOCAL_RANK",
            env.world_size
        )),
        (Some(env), _) => Ok(Some(env)),
    }
}

/// The launch environment of ringccl-perf's own rendezvous: the communicator's, one port up.
pub fn tool_env(env: &LaunchEnv) -> Result<LaunchEnv, String> {
    let mut tool = env.clone();
    tool.port = env.port.checked_add(1).ok_or_else(|| {
        format!(
            "ringccl's rendezvous port ({}, from {}) is 65535: ringccl-perf's own rendezvous \
             needs the port above it; choose a lower port",
            env.port, env.source
        )
    })?;
    Ok(tool)
}

/// One rank's result of one measurement, as the ranks exchange it.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Wrong elements over the check iterations (`None`: not checked).
    pub wrong: Option<usize>,
    /// Per-iteration (or per-replay) times, microseconds.
    pub times: Vec<f64>,
    /// Whether the times come from CUDA-graph replays.
    pub graph: bool,
    /// Host time per call of the timed eager loop (the call and the timing event's record,
    /// microseconds, wall clock); NaN where not measured (graph replays, failures).
    pub host_us: f64,
    /// Why the measurement failed.
    pub error: Option<String>,
}

impl Default for Outcome {
    fn default() -> Outcome {
        Outcome {
            wrong: None,
            times: Vec::new(),
            graph: false,
            host_us: f64::NAN,
            error: None,
        }
    }
}

impl Outcome {
    /// A failed measurement.
    pub fn failed(error: String) -> Outcome {
        Outcome {
            error: Some(error),
            ..Outcome::default()
        }
    }

    /// The bytes: wrong (u64, `u64::MAX` for none), graph (u8), the host time's bits (u64),
    /// the number of times (u32) and each time's bits (u64), then the error's UTF-8 text after
    /// a flag byte. Big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(22 + 8 * self.times.len());
        v.extend_from_slice(&self.wrong.map_or(u64::MAX, |w| w as u64).to_be_bytes());
        v.push(u8::from(self.graph));
        v.extend_from_slice(&self.host_us.to_bits().to_be_bytes());
        v.extend_from_slice(&(self.times.len() as u32).to_be_bytes());
        for t in &self.times {
            v.extend_from_slice(&t.to_bits().to_be_bytes());
        }
        match &self.error {
            Some(e) => {
                v.push(1);
                v.extend_from_slice(e.as_bytes());
            }
            None => v.push(0),
        }
        v
    }

    /// Reads [`Outcome::encode`]'s bytes back.
    pub fn decode(b: &[u8]) -> Result<Outcome, String> {
        let bad = || format!("a malformed measurement result ({} bytes)", b.len());
        let take = |at: usize, n: usize| b.get(at..at + n).ok_or_else(bad);
        let u64_at = |at: usize| -> Result<u64, String> {
            let mut x = [0u8; 8];
            x.copy_from_slice(take(at, 8)?);
            Ok(u64::from_be_bytes(x))
        };
        let wrong = match u64_at(0)? {
            u64::MAX => None,
            w => Some(usize::try_from(w).map_err(|_| bad())?),
        };
        let graph = match take(8, 1)?[0] {
            0 => false,
            1 => true,
            _ => return Err(bad()),
        };
        let host_us = f64::from_bits(u64_at(9)?);
        let mut k = [0u8; 4];
        k.copy_from_slice(take(17, 4)?);
        let k = u32::from_be_bytes(k) as usize;
        let mut times = Vec::with_capacity(k.min(b.len() / 8));
        let mut at = 21;
        for _ in 0..k {
            times.push(f64::from_bits(u64_at(at)?));
            at += 8;
        }
        let error = match take(at, 1)?[0] {
            0 if b.len() == at + 1 => None,
            1 => Some(String::from_utf8_lossy(&b[at + 1..]).into_owned()),
            _ => return Err(bad()),
        };
        Ok(Outcome {
            wrong,
            times,
            graph,
            host_us,
            error,
        })
    }
}

/// The slowest rank's time of each sample: the element-wise maximum of every rank's times.
/// An error when the ranks timed different numbers of samples.
pub fn slowest(per_rank: &[Vec<f64>]) -> Result<Vec<f64>, String> {
    let Some(first) = per_rank.first() else {
        return Ok(Vec::new());
    };
    if let Some(r) = per_rank.iter().position(|t| t.len() != first.len()) {
        return Err(format!(
            "rank {r} timed {} samples, rank 0 {}",
            per_rank[r].len(),
            first.len()
        ));
    }
    Ok((0..first.len())
        .map(|k| {
            per_rank
                .iter()
                .map(|t| t[k])
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .collect())
}

/// Every rank's outcome (in rank order) as one: the first failure, named by its rank (and how
/// many other ranks failed); otherwise the sum of the wrong elements, the slowest rank's time
/// of each sample, the slowest rank's host time per call (NaN if any rank has none), and graph
/// timing only if every rank replayed graphs.
pub fn combine(parts: &[Outcome]) -> Outcome {
    let failed: Vec<(usize, &String)> = parts
        .iter()
        .enumerate()
        .filter_map(|(r, p)| p.error.as_ref().map(|e| (r, e)))
        .collect();
    if let Some(&(r, e)) = failed.first() {
        let more = match failed.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more rank)".into(),
            k => format!(" (and {k} more ranks)"),
        };
        return Outcome::failed(format!("rank {r}: {e}{more}"));
    }
    let times: Vec<Vec<f64>> = parts.iter().map(|p| p.times.clone()).collect();
    let times = match slowest(&times) {
        Ok(t) => t,
        Err(e) => return Outcome::failed(e),
    };
    let wrong = parts
        .iter()
        .filter_map(|p| p.wrong)
        .reduce(|a, b| a.saturating_add(b));
    let host_us = if parts.iter().any(|p| p.host_us.is_nan()) {
        f64::NAN
    } else {
        parts.iter().map(|p| p.host_us).fold(f64::NAN, f64::max)
    };
    Outcome {
        wrong,
        times,
        graph: !parts.is_empty() && parts.iter().all(|p| p.graph),
        host_us,
        error: None,
    }
}

/// What rank 0 hands to the others: NCCL's unique id (128 bytes after a 1), or why there is
/// none (its text after a 0).
pub fn encode_id(id: Result<[u8; 128], String>) -> Vec<u8> {
    match id {
        Ok(b) => std::iter::once(1).chain(b).collect(),
        Err(e) => std::iter::once(0).chain(e.into_bytes()).collect(),
    }
}

/// Reads [`encode_id`]'s bytes back.
pub fn decode_id(b: &[u8]) -> Result<[u8; 128], String> {
    match b.split_first() {
        Some((1, id)) => id
            .try_into()
            .map_err(|_| format!("rank 0 sent an NCCL id of {} bytes, not 128", id.len())),
        Some((0, why)) => Err(format!("rank 0: {}", String::from_utf8_lossy(why))),
        _ => Err("rank 0 sent no NCCL id".into()),
    }
}

/// ringccl-perf's own world of processes (see the module's documentation).
pub struct World {
    boot: Bootstrap,
}

impl World {
    /// Joins ringccl-perf's world: [`tool_env`]'s rendezvous, rank `RANK` of `WORLD_SIZE`,
    /// waiting `RINGCCL_BOOTSTRAP_TIMEOUT` for the others (as the communicator does).
    pub fn join(env: &LaunchEnv) -> Result<World, String> {
        let tool = tool_env(env)?;
        let timeout = ringccl::Config::from_env()
            .map_err(|e| e.to_string())?
            .bootstrap_timeout;
        let mut boot = Bootstrap::join_env(&tool, timeout).map_err(|e| {
            format!(
                "ringccl-perf's rendezvous at {}:{} (ringccl's port + 1): {e}",
                tool.host, tool.port
            )
        })?;
        boot.set_timeout(timeout.max(MIN_GATHER_TIMEOUT));
        Ok(World { boot })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.boot.rank()
    }

    /// The number of ranks (processes).
    pub fn nranks(&self) -> usize {
        self.boot.nranks()
    }

    /// Every rank's bytes, in rank order. An error here leaves the ranks out of step: the run
    /// cannot go on.
    pub fn gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        self.boot
            .all_gather(mine)
            .map_err(|e| format!("ringccl-perf's exchange between the ranks failed: {e}"))
    }

    /// Every rank's outcome, [`combine`]d: the same on every rank.
    pub fn combine(&self, mine: &Outcome) -> Result<Outcome, String> {
        let parts = self
            .gather(&mine.encode())?
            .iter()
            .enumerate()
            .map(|(r, b)| Outcome::decode(b).map_err(|e| format!("rank {r}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(combine(&parts))
    }

    /// Whether every rank succeeded: the outer error is the exchange's (fatal), the inner one
    /// the first rank's failure (the same on every rank).
    pub fn agree(&self, mine: Result<(), String>) -> Result<Result<(), String>, String> {
        let o = match mine {
            Ok(()) => Outcome::default(),
            Err(e) => Outcome::failed(e),
        };
        Ok(match self.combine(&o)?.error {
            Some(e) => Err(e),
            None => Ok(()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> ringccl::Result<Option<LaunchEnv>> {
        LaunchEnv::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    const TWO: [(&str, &str); 4] = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];

    #[test]
    fn launch_modes() {
        // No launcher: one process, as without the option.
        assert_eq!(launch(None, None, env(&[])), Ok(None));
        assert_eq!(launch(None, Some(2), env(&[])), Ok(None));
        // Under a launcher, with or without the confirmation.
        let e = launch(None, None, env(&TWO)).unwrap().unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.port),
            (1, 2, 1, 29501)
        );
        assert_eq!(launch(Some(2), None, env(&TWO)), Ok(Some(e)));
    }

    #[test]
    fn launch_errors() {
        let no_env = launch(Some(2), None, env(&[])).unwrap_err();
        assert!(
            no_env.contains("--procs 2") && no_env.contains("RANK and WORLD_SIZE are not set"),
            "{no_env}"
        );
        assert!(
            no_env.contains("ringccl-run -n 2 ringccl-perf --procs 2"),
            "{no_env}"
        );
        let mismatch = launch(Some(4), None, env(&TWO)).unwrap_err();
        assert!(
            mismatch.contains("--procs 4") && mismatch.contains("WORLD_SIZE=2"),
            "{mismatch}"
        );
        let ngpus = launch(None, Some(2), env(&TWO)).unwrap_err();
        assert!(ngpus.contains("--ngpus"), "{ngpus}");
        // A launcher's environment that does not make sense, with or without --procs.
        let bad = launch(Some(2), None, env(&[("RANK", "0")])).unwrap_err();
        assert!(bad.contains("WORLD_SIZE"), "{bad}");
        let bad = launch(None, None, env(&[("RANK", "5"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(bad.contains("RANK"), "{bad}");
    }

    #[test]
    fn the_tools_rendezvous_is_one_port_up() {
        let e = env(&TWO).unwrap().unwrap();
        let t = tool_env(&e).unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.rank, t.world_size),
            ("127.0.0.1", 29502, 1, 2)
        );
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("RINGCCL_COMM_ID", "[::1]:7000"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(tool_env(&e).unwrap().port, 7001);
        let top = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("RINGCCL_COMM_ID", "localhost:65535"),
        ])
        .unwrap()
        .unwrap();
        let err = tool_env(&top).unwrap_err();
        assert!(
            err.contains("65535") && err.contains("RINGCCL_COMM_ID"),
            "{err}"
        );
    }

    #[test]
    fn slowest_rank_per_sample() {
        let t = slowest(&[
            vec![1.0, 5.0, 3.0],
            vec![2.0, 4.0, 3.5],
            vec![0.5, 4.5, 1.0],
        ]);
        assert_eq!(t, Ok(vec![2.0, 5.0, 3.5]));
        assert_eq!(slowest(&[vec![7.0]]), Ok(vec![7.0]));
        assert_eq!(slowest(&[]), Ok(vec![]));
        // A NaN (no time) does not hide another rank's time.
        assert_eq!(slowest(&[vec![f64::NAN], vec![3.0]]), Ok(vec![3.0]));
        let e = slowest(&[vec![1.0, 2.0], vec![1.0]]).unwrap_err();
        assert!(e.contains("rank 1 timed 1 samples, rank 0 2"), "{e}");
    }

    #[test]
    fn outcomes_combine() {
        let a = Outcome {
            wrong: Some(0),
            times: vec![10.0, 12.0],
            graph: true,
            host_us: 4.5,
            error: None,
        };
        let b = Outcome {
            wrong: Some(3),
            times: vec![11.0, 9.0],
            graph: false,
            host_us: 6.0,
            error: None,
        };
        let c = combine(&[a.clone(), b.clone()]);
        assert_eq!(c.wrong, Some(3));
        assert_eq!(c.times, vec![11.0, 12.0]);
        // The slowest rank's host time; none where a rank has none.
        assert_eq!(c.host_us, 6.0);
        let mut none = b.clone();
        none.host_us = f64::NAN;
        assert!(combine(&[a.clone(), none]).host_us.is_nan());
        assert!(!c.graph && c.error.is_none());
        assert!(combine(&[a.clone(), a.clone()]).graph);
        // Not checked.
        let mut u = a.clone();
        u.wrong = None;
        assert_eq!(combine(&[u.clone(), u]).wrong, None);
        // The first failure wins, named by its rank.
        let f = combine(&[
            a.clone(),
            Outcome::failed("oom".into()),
            Outcome::failed("x".into()),
        ]);
        assert_eq!(f.error.as_deref(), Some("rank 1: oom (and 1 more rank)"));
        assert!(f.times.is_empty() && f.wrong.is_none());
        let f = combine(&[Outcome::failed("oom".into()), b]);
        assert_eq!(f.error.as_deref(), Some("rank 0: oom"));
        // Ranks that disagree on the samples.
        let mut short = a.clone();
        short.times.pop();
        assert!(combine(&[a, short]).error.unwrap().contains("samples"));
    }

    #[test]
    fn outcomes_round_trip() {
        for o in [
            Outcome::default(),
            Outcome {
                wrong: Some(7),
                times: vec![1.5, f64::NAN, 1e-9, f64::INFINITY],
                graph: true,
                host_us: 5.25,
                error: None,
            },
            Outcome::failed("CUDA_ERROR_OUT_OF_MEMORY on rank 1 \u{e9}".into()),
        ] {
            let back = Outcome::decode(&o.encode()).unwrap();
            assert_eq!(back.encode(), o.encode());
            assert_eq!(
                (back.wrong, back.graph, &back.error),
                (o.wrong, o.graph, &o.error)
            );
            assert_eq!(back.host_us.to_bits(), o.host_us.to_bits());
        }
        // Malformed bytes are errors, not panics.
        let good = Outcome {
            wrong: Some(1),
            times: vec![2.0],
            graph: false,
            host_us: 3.0,
            error: None,
        }
        .encode();
        for cut in 0..good.len() {
            assert!(Outcome::decode(&good[..cut]).is_err(), "{cut}");
        }
        let mut extra = good.clone();
        extra.push(0);
        assert!(Outcome::decode(&extra).is_err());
        let mut bad_graph = good.clone();
        bad_graph[8] = 2;
        assert!(Outcome::decode(&bad_graph).is_err());
        let mut huge = good;
        huge[17..21].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Outcome::decode(&huge).is_err());
    }

    /// Two ranks (threads) join the tool's world over loopback, combine their outcomes and
    /// agree on a failure; the communicator's port stays free.
    #[test]
    fn world_over_loopback() {
        // The tool listens one port above ringccl's: find a free one for it.
        let tool_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let comm_id = format!("127.0.0.1:{}", tool_port - 1);
        let results: Vec<_> = std::thread::scope(|s| {
            let joins: Vec<_> = (0..2)
                .map(|rank| {
                    let comm_id = comm_id.clone();
                    s.spawn(
                        move || -> Result<(usize, Outcome, Result<(), String>), String> {
                            let rank_text = rank.to_string();
                            let e = env(&[
                                ("RANK", &rank_text),
                                ("WORLD_SIZE", "2"),
                                ("RINGCCL_COMM_ID", &comm_id),
                            ])
                            .map_err(|e| e.to_string())?
                            .ok_or("no launch")?;
                            let w = World::join(&e)?;
                            let mine = Outcome {
                                wrong: Some(rank),
                                times: vec![1.0 + rank as f64, 5.0 - rank as f64],
                                graph: false,
                                host_us: 4.0 + rank as f64,
                                error: None,
                            };
                            let all = w.combine(&mine)?;
                            let agreed = w.agree(if rank == 1 {
                                Err("out of memory".into())
                            } else {
                                Ok(())
                            })?;
                            Ok((w.nranks(), all, agreed))
                        },
                    )
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        for r in results {
            let (n, all, agreed) = r.unwrap();
            assert_eq!(n, 2);
            assert_eq!(all.times, vec![2.0, 5.0]);
            assert_eq!(all.wrong, Some(1));
            assert_eq!(all.host_us, 5.0);
            assert_eq!(agreed, Err("rank 1: out of memory".into()));
        }
    }

    #[test]
    fn nccl_id_round_trip() {
        let mut id = [0u8; 128];
        id[0] = 2;
        id[127] = 0xff;
        assert_eq!(decode_id(&encode_id(Ok(id))), Ok(id));
        assert_eq!(
            decode_id(&encode_id(Err("libnccl.so not found".into()))),
            Err("rank 0: libnccl.so not found".into())
        );
        assert!(decode_id(&[]).is_err());
        assert!(decode_id(&[1, 2, 3]).unwrap_err().contains("2 bytes"));
        assert!(decode_id(&[9]).is_err());
    }
}
