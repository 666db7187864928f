//! The format of a block object: the data, then one CRC32C per 64 KiB segment (little endian)
//! when the volume has checksums. A whole block or any segment-aligned range can be verified,
//! so random reads check what they read without fetching whole blocks.
//!
//! Each checksum is sealed with the block's identity (`seal`, from its key: the volume's
//! uuid, the slice id, the block index, its length; 0 on volumes of layout 0, whose sums are
//! plain) and its segment number, so that a block read under another block's key — swapped,
//! misdirected, a stale copy of another volume's — fails verification like a damaged one.
//!
//! Not for: where blocks live (keys are `data::layout`).

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes covered by one checksum.
pub const SEGMENT: usize = 64 << 10;

fn crc(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// The seal of the block stored under `key` (layout 1 and later): a hash of its key.
pub fn seal_of(key: &str) -> u32 {
    crc(key.as_bytes())
}

/// The checksum of segment number `i` of a block sealed with `seal`.
fn sum(seg: &[u8], seal: u32, i: usize) -> u32 {
    let ident = if seal == 0 {
        0
    } else {
        seal ^ (i as u32).wrapping_mul(0x9E37_79B9)
    };
    crc(seg) ^ ident
}

/// Bytes of checksums after `len` bytes of data.
pub fn trailer_len(len: usize) -> usize {
    len.div_ceil(SEGMENT) * 4
}

/// The object for a block of data, sealed with `seal` (see [`seal_of`]).
pub fn encode(data: &[u8], seal: u32) -> Bytes {
    let mut out = BytesMut::with_capacity(data.len() + trailer_len(data.len()));
    out.put_slice(data);
    for (i, seg) in data.chunks(SEGMENT).enumerate() {
        out.put_u32_le(sum(seg, seal, i));
    }
    out.freeze()
}

/// The data of a whole block object holding `len` bytes, if its size and checksums (sealed
/// with `seal`) match.
pub fn decode(obj: Bytes, len: usize, seal: u32) -> Option<Bytes> {
    if obj.len() != len + trailer_len(len) {
        return None;
    }
    let (data, sums) = (obj.slice(..len), &obj[len..]);
    verify(&data, sums, seal, 0).then_some(data)
}

/// The segment-aligned range covering `range` in a block of `len` bytes.
pub fn aligned(range: Range<usize>, len: usize) -> Range<usize> {
    let start = range.start / SEGMENT * SEGMENT;
    let end = (range.end.div_ceil(SEGMENT) * SEGMENT).min(len);
    start..end
}

/// Where the checksums of the segments of `aligned` are, in the object of a `len`-byte block.
pub fn sums_range(aligned: &Range<usize>, len: usize) -> Range<usize> {
    let first = aligned.start / SEGMENT;
    let last = aligned.end.div_ceil(SEGMENT);
    len + first * 4..len + last * 4
}

/// Whether `data` (segment-aligned, whole segments except perhaps a block's last, starting
/// at segment number `first`) matches the checksums `sums` (one per segment) of a block
/// sealed with `seal`.
pub fn verify(data: &[u8], sums: &[u8], seal: u32, first: usize) -> bool {
    let n = data.len().div_ceil(SEGMENT);
    sums.len() == n * 4
        && data
            .chunks(SEGMENT)
            .zip(sums.chunks_exact(4))
            .enumerate()
            .all(|(i, (seg, s))| {
                sum(seg, seal, first + i) == u32::from_le_bytes(s.try_into().unwrap())
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn whole_blocks_roundtrip_and_corruption_is_caught() {
        for n in [0, 1, SEGMENT - 1, SEGMENT, SEGMENT + 1, 4 << 20] {
            let d = data(n);
            let obj = encode(&d, 0);
            assert_eq!(obj.len(), n + trailer_len(n));
            assert_eq!(decode(obj.clone(), n, 0).unwrap(), Bytes::from(d.clone()));
            if n > 0 {
                let mut bad = obj.to_vec();
                bad[n / 2] ^= 1;
                assert!(decode(Bytes::from(bad), n, 0).is_none(), "flip in {n}");
                assert!(
                    decode(obj.slice(..obj.len() - 1), n, 0).is_none(),
                    "truncated {n}"
                );
                // Sealed: read back under its own key only.
                let (mine, other) = (
                    seal_of("v/u/chunks/0/0/1_0_9"),
                    seal_of("v/u/chunks/0/0/2_0_9"),
                );
                let obj = encode(&d, mine);
                assert_eq!(
                    decode(obj.clone(), n, mine).unwrap(),
                    Bytes::from(d.clone())
                );
                assert!(
                    decode(obj.clone(), n, other).is_none(),
                    "another key's block"
                );
                assert!(decode(obj, n, 0).is_none(), "sealed read as plain");
            }
        }
    }

    #[test]
    fn ranges_verify_by_segment() {
        let n = 3 * SEGMENT + 100;
        let d = data(n);
        let seal = seal_of("k");
        let obj = encode(&d, seal);
        for r in [
            0..1,
            10..SEGMENT + 5,
            SEGMENT..2 * SEGMENT,
            3 * SEGMENT + 50..n,
            5..n,
        ] {
            let a = aligned(r.clone(), n);
            assert!(a.start <= r.start && a.end >= r.end && a.start % SEGMENT == 0);
            let s = sums_range(&a, n);
            let first = a.start / SEGMENT;
            assert!(
                verify(&obj[a.clone()], &obj[s.clone()], seal, first),
                "{r:?}"
            );
            let mut bad = obj[a.clone()].to_vec();
            bad[r.start - a.start] ^= 0x80;
            assert!(!verify(&bad, &obj[s.clone()], seal, first), "{r:?}");
            if a.len() >= SEGMENT {
                // A segment read as another segment of the same block fails too.
                assert!(!verify(&obj[a.clone()], &obj[s], seal, first + 1), "{r:?}");
            }
        }
    }
}
