//! The proxy's wire format: the tags UCX matches messages by, the header of a signal (and of
//! the goodbye), and the framing of the worker addresses a rank publishes through the
//! bootstrap.

/// The tag of every header (one worker per communicator, so one tag suffices).
pub(super) const TAG_HEADER: u64 = 0x1 << 60;
/// The tag of a chunk: this kind, the source rank (20 bits) and the low 40 bits of its signal
/// counter, so that each chunk matches the receive posted for it whatever the order in which
/// its header was handled.
const TAG_CHUNK: u64 = 0x2 << 60;
/// Bytes of a message's header.
pub const HEADER_BYTES: usize = 48;

pub(super) fn chunk_tag(src: usize, k: u64) -> u64 {
    TAG_CHUNK | ((src as u64 & 0xf_ffff) << 40) | (k & 0xff_ffff_ffff)
}
const MAGIC: u32 = 0x5443_4e52;
pub(super) const KIND_SIGNAL: u32 = 1;
pub(super) const KIND_BYE: u32 = 2;
/// Framing of a rank's published worker addresses: magic, rank, nranks, lanes (u32 each,
/// little-endian), then per lane its length (u32) and its bytes.
const ADDRESS_MAGIC: &[u8; 8] = b"RCCLUCX2";

/// The bytes a rank publishes for its lanes' worker `addresses` (see [`ADDRESS_MAGIC`]).
pub(crate) fn frame_addresses(rank: usize, nranks: usize, addresses: &[Vec<u8>]) -> Vec<u8> {
    let mut blob = ADDRESS_MAGIC.to_vec();
    for v in [rank, nranks, addresses.len()] {
        blob.extend_from_slice(&(v as u32).to_le_bytes());
    }
    for a in addresses {
        blob.extend_from_slice(&(a.len() as u32).to_le_bytes());
        blob.extend_from_slice(a);
    }
    blob
}

/// The lanes' worker addresses that rank `q` of `nranks` published, if the blob is framed as
/// [`frame_addresses`] does, for `lanes` lanes, and no address is empty.
pub(super) fn parse_addresses(b: &[u8], q: usize, nranks: usize, lanes: usize) -> Option<Vec<&[u8]>> {
    let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize);
    let m = ADDRESS_MAGIC.len();
    if b.get(..m)? != ADDRESS_MAGIC || u32_at(m)? != q || u32_at(m + 4)? != nranks {
        return None;
    }
    if u32_at(m + 8)? != lanes {
        return None;
    }
    let mut at = m + 12;
    let mut out = Vec::with_capacity(lanes);
    for _ in 0..lanes {
        let len = u32_at(at)?;
        let a = b.get(at + 4..at.checked_add(4)?.checked_add(len)?)?;
        if a.is_empty() {
            return None;
        }
        out.push(a);
        at += 4 + len;
    }
    (at == b.len()).then_some(out)
}

/// A parsed message header.
pub(super) struct Header {
    pub(super) kind: u32,
    pub(super) src: usize,
    pub(super) k: u64,
    pub(super) to: usize,
    pub(super) bytes: usize,
    /// For a credit, the counter of the previous credit from the same rank (0 for none).
    pub(super) prev_credit: u64,
}

impl Header {
    pub(super) fn parse(b: &[u8]) -> Option<Header> {
        let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        if u32_at(0)? != MAGIC {
            return None;
        }
        Some(Header {
            kind: u32_at(4)?,
            src: u32_at(8)? as usize,
            k: u64_at(16)?,
            to: usize::try_from(u64_at(24)?).ok()?,
            bytes: usize::try_from(u64_at(32)?).ok()?,
            prev_credit: u64_at(40)?,
        })
    }
}

/// The bytes of a header: `kind`, the source rank, the signal counter and the previous credit,
/// where the chunk lands and its bytes.
pub(super) fn header(kind: u32, src: usize, (k, prev_credit): (u64, u64), to: usize, bytes: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_BYTES + bytes);
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&(src as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&k.to_le_bytes());
    v.extend_from_slice(&(to as u64).to_le_bytes());
    v.extend_from_slice(&(bytes as u64).to_le_bytes());
    v.extend_from_slice(&prev_credit.to_le_bytes());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_bad_framing_is_refused() {
        let addresses = vec![vec![1u8, 2, 3], vec![4u8; 70]];
        let b = frame_addresses(1, 3, &addresses);
        let got = parse_addresses(&b, 1, 3, 2).expect("framed");
        assert_eq!(got, vec![&addresses[0][..], &addresses[1][..]]);
        assert!(parse_addresses(&b, 0, 3, 2).is_none(), "another rank's");
        assert!(parse_addresses(&b, 1, 4, 2).is_none(), "another world's");
        assert!(parse_addresses(&b, 1, 3, 1).is_none(), "another lane count");
        assert!(parse_addresses(&b[..b.len() - 1], 1, 3, 2).is_none(), "truncated");
        let mut long = b.clone();
        long.push(0);
        assert!(parse_addresses(&long, 1, 3, 2).is_none(), "trailing bytes");
        assert!(parse_addresses(&frame_addresses(1, 3, &[vec![], vec![1]]), 1, 3, 2).is_none());
    }
}

