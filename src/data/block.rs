//! The format of a block object: the data, then one CRC32C per 64 KiB segment (little endian)
//! when the volume has checksums. A whole block or any segment-aligned range can be verified,
//! so random reads check what they read without fetching whole blocks.
//!
//! Not for: where blocks live (keys are `data::layout`).

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes covered by one checksum.
pub const SEGMENT: usize = 64 << 10;

fn crc(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// Bytes of checksums after `len` bytes of data.
pub fn trailer_len(len: usize) -> usize {
    len.div_ceil(SEGMENT) * 4
}

/// The object for a block of data.
pub fn encode(data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(data.len() + trailer_len(data.len()));
    out.put_slice(data);
    for seg in data.chunks(SEGMENT) {
        out.put_u32_le(crc(seg));
    }
    out.freeze()
}

/// The data of a whole block object holding `len` bytes, if its size and checksums match.
pub fn decode(obj: Bytes, len: usize) -> Option<Bytes> {
    if obj.len() != len + trailer_len(len) {
        return None;
    }
    let (data, sums) = (obj.slice(..len), &obj[len..]);
    verify(&data, sums).then_some(data)
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

/// Whether `data` (segment-aligned, whole segments except perhaps a block's last) matches
/// the checksums `sums` (one per segment).
pub fn verify(data: &[u8], sums: &[u8]) -> bool {
    let n = data.len().div_ceil(SEGMENT);
    sums.len() == n * 4
        && data
            .chunks(SEGMENT)
            .zip(sums.chunks_exact(4))
            .all(|(seg, s)| crc(seg) == u32::from_le_bytes(s.try_into().unwrap()))
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
            let obj = encode(&d);
            assert_eq!(obj.len(), n + trailer_len(n));
            assert_eq!(decode(obj.clone(), n).unwrap(), Bytes::from(d.clone()));
            if n > 0 {
                let mut bad = obj.to_vec();
                bad[n / 2] ^= 1;
                assert!(decode(Bytes::from(bad), n).is_none(), "flip in {n}");
                assert!(
                    decode(obj.slice(..obj.len() - 1), n).is_none(),
                    "truncated {n}"
                );
            }
        }
    }

    #[test]
    fn ranges_verify_by_segment() {
        let n = 3 * SEGMENT + 100;
        let d = data(n);
        let obj = encode(&d);
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
            assert!(verify(&obj[a.clone()], &obj[s.clone()]), "{r:?}");
            let mut bad = obj[a.clone()].to_vec();
            bad[r.start - a.start] ^= 0x80;
            assert!(!verify(&bad, &obj[s]), "{r:?}");
        }
    }
}
