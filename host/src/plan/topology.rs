//! The ring order of the collectives, chosen from the link topology.
//!
//! Ring collectives move data only between neighbours of the ring, so on a machine whose GPUs
//! are not all connected alike (two NVLink pairs joined by PCIe, a hybrid cube-mesh) the order of
//! the ranks in the ring decides which links carry the traffic, and the weakest of them bounds
//! the bandwidth of every step. [`best_ring`] picks the order from a matrix of link scores
//! (higher is better, 0 = no direct peer access); the communicator builds that matrix from the
//! driver's peer-to-peer attributes ([`crate::driver::p2p_link_scores`]) once, at creation.
//!
//! * A link's score is the smaller of its two directions (`min(score[a][b], score[b][a])`): the
//!   two directions of a ring use the same links, so the ring does not depend on the direction
//!   the schedules send in.
//! * The best ring maximises its weakest link first, then the sum of its links.
//! * Rings are returned normalised: they start with rank 0 and, of the two directions, the
//!   lexicographically smaller one is returned (`ring[1] < ring[n - 1]`). Among equally good
//!   rings the lexicographically smallest wins, so the identity `0, 1, …, n - 1` (the smallest
//!   of all) is kept whenever it is among the best, and the result is deterministic.
//! * Up to [`EXHAUSTIVE_MAX`] ranks every ring is tried (`(n - 1)! / 2`: 2520 for 8 ranks,
//!   20160 for 9); above that, a greedy nearest-neighbour ring and the identity are improved by
//!   2-opt moves and the better is kept.
//!
//! `RINGCCL_RING` ([`Config::ring`](crate::Config::ring)) fixes the ring instead.
//!
//! ```
//! use ringccl::internals::topology::best_ring;
//! // Two NVLink pairs (0-2 and 1-3, score 10) joined by PCIe (score 2).
//! let s = vec![
//!     vec![0, 2, 10, 2],
//!     vec![2, 0, 2, 10],
//!     vec![10, 2, 0, 2],
//!     vec![2, 10, 2, 0],
//! ];
//! assert_eq!(best_ring(&s), vec![0, 1, 3, 2]); // uses 1-3 and 2-0
//! ```

/// Rings of up to this many ranks are found by trying every ring.
pub const EXHAUSTIVE_MAX: usize = 9;

/// How good a ring is: compared by `weakest` link first, then by `total`.
///
/// ```
/// use ringccl::internals::topology::{ring_quality, RingQuality};
/// let s = vec![vec![0, 5, 1], vec![5, 0, 3], vec![1, 3, 0]];
/// assert_eq!(ring_quality(&s, &[0, 1, 2]), RingQuality { weakest: 1, total: 9 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RingQuality {
    /// The smallest link score of the ring.
    pub weakest: u32,
    /// The sum of the ring's link scores.
    pub total: u64,
}

/// The score of the link between ranks `a` and `b`: the smaller of its two directions (an
/// entry missing from a ragged matrix counts as 0).
fn link(score: &[Vec<u32>], a: usize, b: usize) -> u32 {
    let get = |x: usize, y: usize| score.get(x).and_then(|r| r.get(y)).copied().unwrap_or(0);
    get(a, b).min(get(b, a))
}

/// The quality of `ring` (a sequence of ranks, closed back to its first) under `score`; see
/// the [module docs](self) for how links are scored. A ring of fewer than two ranks has no
/// links: `weakest` is `u32::MAX` and `total` 0.
///
/// ```
/// use ringccl::internals::topology::ring_quality;
/// let s = vec![vec![0, 4], vec![2, 0]];
/// let q = ring_quality(&s, &[0, 1]);
/// assert_eq!((q.weakest, q.total), (2, 4)); // the link 0-1 counted both ways round
/// ```
pub fn ring_quality(score: &[Vec<u32>], ring: &[usize]) -> RingQuality {
    let n = ring.len();
    if n < 2 {
        return RingQuality {
            weakest: u32::MAX,
            total: 0,
        };
    }
    let mut weakest = u32::MAX;
    let mut total = 0u64;
    for i in 0..n {
        let l = link(score, ring[i], ring[(i + 1) % n]);
        weakest = weakest.min(l);
        total += u64::from(l);
    }
    RingQuality { weakest, total }
}

/// The best ring over the ranks `0..score.len()` for the link scores `score[a][b]` (link
/// quality from rank `a` to rank `b`, higher is better, 0 = no direct peer access): the
/// normalised ring that maximises the weakest link, then the sum of the links; the identity
/// when it is among the best, and the identity for 3 ranks or fewer (where every ring is the
/// same). See the [module docs](self). Never panics: missing entries of a ragged matrix count
/// as 0.
///
/// ```
/// use ringccl::internals::topology::best_ring;
/// // Poor links 0-1 and 2-3, good links everywhere else.
/// let s = vec![
///     vec![0, 1, 9, 9],
///     vec![1, 0, 9, 9],
///     vec![9, 9, 0, 1],
///     vec![9, 9, 1, 0],
/// ];
/// assert_eq!(best_ring(&s), vec![0, 2, 1, 3]);
/// assert_eq!(best_ring(&[vec![0, 1], vec![1, 0]]), vec![0, 1]);
/// ```
pub fn best_ring(score: &[Vec<u32>]) -> Vec<usize> {
    let n = score.len();
    let identity: Vec<usize> = (0..n).collect();
    if n <= 3 {
        return identity;
    }
    let best = if n <= EXHAUSTIVE_MAX {
        exhaustive(score, n)
    } else {
        let from_identity = two_opt(score, identity.clone());
        let from_greedy = two_opt(score, greedy(score, n));
        let (a, b) = (normalise(from_identity), normalise(from_greedy));
        let (qa, qb) = (ring_quality(score, &a), ring_quality(score, &b));
        if qb > qa || (qb == qa && b < a) {
            b
        } else {
            a
        }
    };
    // Identity wins ties (the exhaustive search finds it anyway: it is the smallest ring).
    if ring_quality(score, &identity) >= ring_quality(score, &best) {
        identity
    } else {
        best
    }
}

/// Every normalised ring, in lexicographic order; the first of the best is kept.
fn exhaustive(score: &[Vec<u32>], n: usize) -> Vec<usize> {
    let mut ring: Vec<usize> = (0..n).collect();
    let mut best = ring.clone();
    let mut best_q = ring_quality(score, &ring);
    while next_permutation(&mut ring[1..]) {
        if ring[1] > ring[n - 1] {
            continue; // the other direction of a ring seen (or to be seen) normalised
        }
        let q = ring_quality(score, &ring);
        if q > best_q {
            best_q = q;
            best.copy_from_slice(&ring);
        }
    }
    best
}

/// The next permutation of `v` in lexicographic order; false (and `v` unchanged) at the last.
fn next_permutation(v: &mut [usize]) -> bool {
    let Some(i) = (1..v.len()).rev().find(|&i| v[i - 1] < v[i]) else {
        return false;
    };
    let pivot = i - 1;
    // A successor exists because v[pivot] < v[i].
    let Some(j) = (i..v.len()).rev().find(|&j| v[j] > v[pivot]) else {
        return false;
    };
    v.swap(pivot, j);
    v[i..].reverse();
    true
}

/// From rank 0, always to the unvisited rank of the best link (the lowest rank among equals).
fn greedy(score: &[Vec<u32>], n: usize) -> Vec<usize> {
    let mut ring = Vec::with_capacity(n);
    let mut used = vec![false; n];
    let mut at = 0;
    ring.push(0);
    used[0] = true;
    for _ in 1..n {
        let mut next = None;
        for (b, &u) in used.iter().enumerate() {
            if !u && next.is_none_or(|(_, l)| link(score, at, b) > l) {
                next = Some((b, link(score, at, b)));
            }
        }
        let Some((b, _)) = next else { break };
        used[b] = true;
        ring.push(b);
        at = b;
    }
    ring
}

/// 2-opt: reverses a stretch of the ring (rank 0 stays first) while that makes it strictly
/// better, at most `n` passes.
fn two_opt(score: &[Vec<u32>], mut ring: Vec<usize>) -> Vec<usize> {
    let n = ring.len();
    let mut q = ring_quality(score, &ring);
    for _ in 0..n {
        let mut improved = false;
        for i in 1..n {
            for j in i + 1..n {
                if i == 1 && j == n - 1 {
                    continue; // the same ring the other way round
                }
                ring[i..=j].reverse();
                let q2 = ring_quality(score, &ring);
                if q2 > q {
                    q = q2;
                    improved = true;
                } else {
                    ring[i..=j].reverse();
                }
            }
        }
        if !improved {
            break;
        }
    }
    ring
}

/// Rotates `ring` to start at its smallest rank and picks the lexicographically smaller
/// direction.
fn normalise(mut ring: Vec<usize>) -> Vec<usize> {
    let n = ring.len();
    if n == 0 {
        return ring;
    }
    let start = (0..n).min_by_key(|&i| ring[i]).unwrap_or(0);
    ring.rotate_left(start);
    if n > 2 && ring[1] > ring[n - 1] {
        ring[1..].reverse();
    }
    ring
}

/// The link scores the ring is chosen from: the driver's scores (`driver_scores[a][b]`) where
/// rank `a` accesses rank `b`'s memory directly (`direct(a, b)`), 0 where it does not
/// (disabled, unsupported, or refused), so without peer access every link scores the same and
/// the ring is the identity. A short matrix counts as 0.
pub fn reachable_scores(
    driver_scores: &[Vec<u32>],
    direct: impl Fn(usize, usize) -> bool,
) -> Vec<Vec<u32>> {
    let n = driver_scores.len();
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    let score = driver_scores.get(a).and_then(|r| r.get(b)).copied();
                    if a != b && direct(a, b) {
                        score.unwrap_or(0)
                    } else {
                        0
                    }
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // score matrices read better indexed
mod tests {
    use super::*;

    fn is_permutation(ring: &[usize], n: usize) -> bool {
        let mut seen = vec![false; n];
        ring.len() == n
            && ring
                .iter()
                .all(|&r| r < n && !std::mem::replace(&mut seen[r], true))
    }

    fn is_normalised(ring: &[usize]) -> bool {
        let n = ring.len();
        n == 0 || (ring[0] == 0 && (n < 3 || ring[1] < ring[n - 1]))
    }

    /// Every normalised ring of `n` ranks (for checking the exhaustive search against).
    fn all_rings(n: usize) -> Vec<Vec<usize>> {
        let mut out = Vec::new();
        let mut ring: Vec<usize> = (0..n).collect();
        loop {
            if is_normalised(&ring) {
                out.push(ring.clone());
            }
            if !next_permutation(&mut ring[1..]) {
                break;
            }
        }
        out
    }

    /// Whether the ring links `a` and `b` directly.
    fn adjacent(ring: &[usize], a: usize, b: usize) -> bool {
        let n = ring.len();
        (0..n).any(|i| {
            let (x, y) = (ring[i], ring[(i + 1) % n]);
            (x, y) == (a, b) || (x, y) == (b, a)
        })
    }

    /// A deterministic pseudo-random matrix (xorshift), symmetric or not.
    fn random_matrix(n: usize, seed: u64, symmetric: bool) -> Vec<Vec<u32>> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 20) as u32
        };
        let mut m = vec![vec![0; n]; n];
        for a in 0..n {
            for b in 0..n {
                if a != b && (!symmetric || a < b) {
                    m[a][b] = next();
                    if symmetric {
                        m[b][a] = m[a][b];
                    }
                }
            }
        }
        m
    }

    #[test]
    fn all_equal_scores_give_the_identity() {
        for n in 0..=12 {
            for v in [0, 1, 7] {
                let s = vec![vec![v; n]; n];
                assert_eq!(
                    best_ring(&s),
                    (0..n).collect::<Vec<_>>(),
                    "n = {n}, v = {v}"
                );
            }
        }
    }

    #[test]
    fn small_rings_are_the_identity() {
        assert_eq!(best_ring(&[]), Vec::<usize>::new());
        assert_eq!(best_ring(&[vec![0]]), vec![0]);
        assert_eq!(best_ring(&[vec![0, 0], vec![9, 0]]), vec![0, 1]);
        let s = vec![vec![0, 1, 9], vec![1, 0, 9], vec![9, 9, 0]];
        assert_eq!(best_ring(&s), vec![0, 1, 2]);
    }

    #[test]
    fn two_nvlink_pairs_joined_by_pcie() {
        // NVLink pairs {0, 2} and {1, 3} (score 10), PCIe elsewhere (2): the identity ring
        // 0-1-2-3 uses no NVLink at all.
        let s = vec![
            vec![0, 2, 10, 2],
            vec![2, 0, 2, 10],
            vec![10, 2, 0, 2],
            vec![2, 10, 2, 0],
        ];
        let ring = best_ring(&s);
        assert!(adjacent(&ring, 0, 2) && adjacent(&ring, 1, 3), "{ring:?}");
        assert!(is_normalised(&ring) && is_permutation(&ring, 4));
        assert_eq!(ring_quality(&s, &ring).total, 24);
        assert_eq!(ring_quality(&s, &[0, 1, 2, 3]).total, 8);
    }

    /// The DGX-1 (V100) hybrid cube-mesh: two quads of fully connected GPUs {0..3}, {4..7},
    /// plus links i - i+4. `double` lists the pairs with two NVLinks.
    fn cube_mesh(double: &[(usize, usize)]) -> Vec<Vec<u32>> {
        let mut s = vec![vec![1u32; 8]; 8]; // PCIe / SMP between the rest
        for (a, row) in s.iter_mut().enumerate() {
            row[a] = 0;
        }
        let mut set = |a: usize, b: usize, v: u32| {
            s[a][b] = v;
            s[b][a] = v;
        };
        for q in [0, 4] {
            for a in q..q + 4 {
                for b in a + 1..q + 4 {
                    set(a, b, 10);
                }
            }
        }
        for i in 0..4 {
            set(i, i + 4, 10);
        }
        for &(a, b) in double {
            set(a, b, 20);
        }
        s
    }

    #[test]
    fn hybrid_cube_mesh_ring_uses_only_nvlink() {
        // Identity 0..7 has the link 3-4, which is not NVLink.
        let s = cube_mesh(&[]);
        assert_eq!(ring_quality(&s, &(0..8).collect::<Vec<_>>()).weakest, 1);
        let ring = best_ring(&s);
        assert!(is_permutation(&ring, 8) && is_normalised(&ring), "{ring:?}");
        assert_eq!(ring_quality(&s, &ring).weakest, 10, "{ring:?}");
        // With double links on some pairs, the ring still uses only NVLink, and as many
        // double links as a ring can hold.
        let s = cube_mesh(&[
            (0, 3),
            (1, 2),
            (4, 7),
            (5, 6),
            (0, 4),
            (1, 5),
            (2, 6),
            (3, 7),
        ]);
        let ring = best_ring(&s);
        let q = ring_quality(&s, &ring);
        assert_eq!(q.weakest, 10, "{ring:?}");
        let best_total = all_rings(8).iter().map(|r| ring_quality(&s, r).total).max();
        assert_eq!(Some(q.total), best_total);
    }

    #[test]
    fn a_bad_identity_is_replaced() {
        // A chain 0-2-4-1-3-0 of good links; everything else, including every identity link,
        // is poor.
        let mut s = vec![vec![1u32; 5]; 5];
        for (a, b) in [(0, 2), (2, 4), (4, 1), (1, 3), (3, 0)] {
            s[a][b] = 8;
            s[b][a] = 8;
        }
        let ring = best_ring(&s);
        assert_eq!(ring, vec![0, 2, 4, 1, 3]);
        assert_eq!(ring_quality(&s, &ring).weakest, 8);
    }

    #[test]
    fn weakest_link_beats_total() {
        // Ring 0-1-2-3: links 100, 100, 100, 1 (weakest 1, total 301);
        // ring 0-1-3-2: links 100, 5, 100, 5 (weakest 5, total 210): it must win.
        let mut s = vec![vec![0u32; 4]; 4];
        for (a, b, v) in [
            (0, 1, 100),
            (1, 2, 100),
            (2, 3, 100),
            (3, 0, 5),
            (0, 2, 5),
            (1, 3, 5),
        ] {
            s[a][b] = v;
            s[b][a] = v;
        }
        s[3][0] = 1; // asymmetric: the link 0-3 counts as 1
        assert_eq!(link(&s, 0, 3), 1);
        assert_eq!(best_ring(&s), vec![0, 1, 3, 2]);
    }

    #[test]
    fn exhaustive_search_matches_brute_force() {
        for n in 4..=7 {
            let rings = all_rings(n);
            let mut count = 1;
            for k in 1..n {
                count *= k;
            }
            assert_eq!(rings.len(), count / 2);
            for seed in 0..20u64 {
                let s = random_matrix(n, seed * 7919 + n as u64, seed % 2 == 0);
                let ring = best_ring(&s);
                let best = rings.iter().map(|r| ring_quality(&s, r)).max();
                assert_eq!(
                    Some(ring_quality(&s, &ring)),
                    best,
                    "n = {n}, seed = {seed}"
                );
                // The first (lexicographically) of the best rings.
                let first = rings.iter().find(|r| Some(ring_quality(&s, r)) == best);
                assert_eq!(Some(&ring), first);
            }
        }
    }

    #[test]
    fn results_are_normalised_deterministic_permutations() {
        for n in 0..=18 {
            for seed in 0..4u64 {
                let s = random_matrix(n, seed * 31 + n as u64, seed % 2 == 1);
                let ring = best_ring(&s);
                assert!(is_permutation(&ring, n), "n = {n}: {ring:?}");
                assert!(is_normalised(&ring), "n = {n}: {ring:?}");
                assert_eq!(best_ring(&s), ring);
                // Never worse than the identity.
                let id: Vec<usize> = (0..n).collect();
                assert!(ring_quality(&s, &ring) >= ring_quality(&s, &id));
            }
        }
    }

    #[test]
    fn relabelled_rings_find_the_same_quality() {
        // Relabelling the ranks moves the best ring but not its quality.
        let n = 8;
        let s = cube_mesh(&[(0, 3), (5, 6)]);
        let perm = [5, 2, 7, 0, 3, 6, 1, 4];
        let mut t = vec![vec![0; n]; n];
        for a in 0..n {
            for b in 0..n {
                t[perm[a]][perm[b]] = s[a][b];
            }
        }
        assert_eq!(
            ring_quality(&s, &best_ring(&s)),
            ring_quality(&t, &best_ring(&t))
        );
    }

    #[test]
    fn sixteen_ranks_use_the_greedy_path() {
        // Two 8-GPU NVLink islands {even}, {odd}, joined by two NVLink bridges 0-1 and 14-15;
        // everything else PCIe. A ring that is NVLink all the way exists:
        // 0 2 4 ... 14 15 13 ... 1 (0).
        let n = 16;
        let mut s = vec![vec![1u32; n]; n];
        for a in 0..n {
            s[a][a] = 0;
            for b in 0..n {
                if a != b && a % 2 == b % 2 {
                    s[a][b] = 10;
                }
            }
        }
        for (a, b) in [(0, 1), (14, 15)] {
            s[a][b] = 10;
            s[b][a] = 10;
        }
        assert_eq!(ring_quality(&s, &(0..n).collect::<Vec<_>>()).weakest, 1);
        let ring = best_ring(&s);
        assert!(is_permutation(&ring, n) && is_normalised(&ring), "{ring:?}");
        assert_eq!(ring_quality(&s, &ring).weakest, 10, "{ring:?}");
        assert!(adjacent(&ring, 0, 1) && adjacent(&ring, 14, 15), "{ring:?}");
        // Equal scores at 16 ranks: still the identity.
        let eq = vec![vec![3u32; n]; n];
        assert_eq!(best_ring(&eq), (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn ragged_matrices_do_not_panic() {
        let s = vec![vec![0, 5], vec![], vec![1, 2, 3, 4, 5], vec![9]];
        let ring = best_ring(&s);
        assert!(is_permutation(&ring, 4) && is_normalised(&ring));
        let big: Vec<Vec<u32>> = (0..12).map(|a| vec![a; a as usize]).collect();
        assert!(is_permutation(&best_ring(&big), 12));
    }

    #[test]
    fn normalise_rotates_and_picks_the_smaller_direction() {
        assert_eq!(normalise(vec![2, 3, 0, 1]), vec![0, 1, 2, 3]);
        assert_eq!(normalise(vec![3, 2, 1, 0]), vec![0, 1, 2, 3]);
        assert_eq!(normalise(vec![1, 0]), vec![0, 1]);
        assert_eq!(normalise(vec![4, 0, 3, 1, 2]), vec![0, 3, 1, 2, 4]);
    }

    #[test]
    fn reachable_scores_keep_only_links_with_peer_access() {
        let driver = vec![vec![0, 16, 9], vec![16, 0, 1], vec![9, 5, 0]];
        // Rank 2 could not enable access to rank 1; the diagonal never counts.
        let s = reachable_scores(&driver, |a, b| (a, b) != (2, 1));
        assert_eq!(s, vec![vec![0, 16, 9], vec![16, 0, 1], vec![9, 0, 0]]);
        // Peer access disabled everywhere: all links 0, so the best ring is the identity.
        let driver4 = vec![
            vec![0, 2, 16, 2],
            vec![2, 0, 2, 16],
            vec![16, 2, 0, 2],
            vec![2, 16, 2, 0],
        ];
        let s = reachable_scores(&driver4, |a, b| a == b);
        assert!(s.iter().flatten().all(|&x| x == 0));
        assert_eq!(best_ring(&s), vec![0, 1, 2, 3]);
        assert_eq!(best_ring(&reachable_scores(&driver4, |_, _| true)), vec![0, 1, 3, 2]);
        // A ragged driver matrix does not panic.
        assert_eq!(reachable_scores(&[vec![0], vec![]], |_, _| true), vec![vec![0, 0], vec![0, 0]]);
    }
}
