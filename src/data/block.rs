//! The format of a block object: the data, then one CRC32C per segment (little endian) when
//! the volume has checksums. A whole block or any segment-aligned range can be verified, so
//! random reads check what they read without fetching whole blocks.
//!
//! Segments are 4 KiB on volumes of layout 2 and later, so that a random 4 KiB read fetches
//! 4 KiB (and 4 bytes of checksum), not 16 times that; they were 64 KiB before (layouts 0
//! and 1), and those volumes keep them. The trailer costs 0.1% of the data.
//!
//! Each checksum is sealed with the block's identity (`seal`, from its key: the volume's
//! uuid, the slice id, the block index, its length; 0 on volumes of layout 0, whose sums are
//! plain) and its segment number, so that a block read under another block's key — swapped,
//! misdirected, a stale copy of another volume's — fails verification like a damaged one.
//!
//! Not for: where blocks live or which sums a volume uses (`data::layout`).

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes covered by one checksum on volumes of layout 2 and later.
pub const SEGMENT: usize = 4 << 10;

/// Bytes covered by one checksum on volumes of layouts 0 and 1.
pub const OLD_SEGMENT: usize = 64 << 10;

fn crc(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// The seal of the block stored under `key` (layout 1 and later): a hash of its key.
pub fn seal_of(key: &str) -> u32 {
    crc(key.as_bytes())
}

/// How the checksums of one block object are made: the seal of its key (see [`seal_of`]; 0
/// for plain sums) and the bytes each one covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sums {
    pub seal: u32,
    pub segment: usize,
}

impl Sums {
    /// The checksum of segment number `i`.
    fn sum(&self, seg: &[u8], i: usize) -> u32 {
        let ident = if self.seal == 0 {
            0
        } else {
            self.seal ^ (i as u32).wrapping_mul(0x9E37_79B9)
        };
        crc(seg) ^ ident
    }

    /// Bytes of checksums after `len` bytes of data.
    pub fn trailer_len(&self, len: usize) -> usize {
        len.div_ceil(self.segment) * 4
    }

    /// The checksums that follow `data` in its object.
    pub fn trailer(&self, data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(self.trailer_len(data.len()));
        for (i, seg) in data.chunks(self.segment).enumerate() {
            out.put_u32_le(self.sum(seg, i));
        }
        out.freeze()
    }

    /// The object for a block of data, in one buffer.
    pub fn encode(&self, data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(data.len() + self.trailer_len(data.len()));
        out.put_slice(data);
        out.put_slice(&self.trailer(data));
        out.freeze()
    }

    /// The object for a block of data as its two parts, the data (not copied) and its
    /// checksums: what a put sends and a staged file is written from.
    pub fn parts(&self, data: Bytes) -> [Bytes; 2] {
        let trailer = self.trailer(&data);
        [data, trailer]
    }

    /// The data of a whole block object holding `len` bytes, if its size and checksums match.
    pub fn decode(&self, obj: Bytes, len: usize) -> Option<Bytes> {
        if obj.len() != len + self.trailer_len(len) {
            return None;
        }
        let (data, sums) = (obj.slice(..len), &obj[len..]);
        self.verify(&data, sums, 0).then_some(data)
    }

    /// The length of the data in an object of `obj_len` bytes (the inverse of `len +
    /// trailer_len(len)`), if an object can have that size: for objects whose data length
    /// their key does not say (encoded objects, `data::codec`).
    pub fn data_len(&self, obj_len: usize) -> Option<usize> {
        let whole = self.segment + 4;
        let (n, rest) = (obj_len / whole, obj_len % whole);
        match rest {
            0 => Some(n * self.segment),
            1..=4 => None,
            r => Some(n * self.segment + r - 4),
        }
    }

    /// The data of a whole block object of any length, if its checksums match.
    pub fn decode_sized(&self, obj: Bytes) -> Option<Bytes> {
        let len = self.data_len(obj.len())?;
        self.decode(obj, len)
    }

    /// The segment-aligned range covering `range` in a block of `len` bytes.
    pub fn aligned(&self, range: Range<usize>, len: usize) -> Range<usize> {
        let seg = self.segment;
        let start = range.start / seg * seg;
        let end = (range.end.div_ceil(seg) * seg).min(len);
        start..end
    }

    /// Where the checksums of the segments of `aligned` are, in the object of a `len`-byte
    /// block.
    pub fn sums_range(&self, aligned: &Range<usize>, len: usize) -> Range<usize> {
        let first = aligned.start / self.segment;
        let last = aligned.end.div_ceil(self.segment);
        len + first * 4..len + last * 4
    }

    /// Whether `data` (whole segments from byte `at` of the block, which is segment-aligned,
    /// except perhaps the block's last segment) matches the checksums `sums` (one per
    /// segment).
    pub fn verify(&self, data: &[u8], sums: &[u8], at: usize) -> bool {
        let (n, first) = (data.len().div_ceil(self.segment), at / self.segment);
        at % self.segment == 0
            && sums.len() == n * 4
            && data
                .chunks(self.segment)
                .zip(sums.chunks_exact(4))
                .enumerate()
                .all(|(i, (seg, s))| {
                    self.sum(seg, first + i) == u32::from_le_bytes(s.try_into().unwrap())
                })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn sums(seal: u32, segment: usize) -> Sums {
        Sums { seal, segment }
    }

    #[test]
    fn whole_blocks_roundtrip_and_corruption_is_caught() {
        for segment in [SEGMENT, OLD_SEGMENT] {
            for n in [0, 1, segment - 1, segment, segment + 1, 4 << 20] {
                let (d, plain) = (data(n), sums(0, segment));
                let obj = plain.encode(&d);
                let parts = plain.parts(Bytes::from(d.clone()));
                assert_eq!(parts.concat(), obj.to_vec(), "parts make the object");
                assert_eq!(obj.len(), n + plain.trailer_len(n));
                assert_eq!(
                    plain.decode(obj.clone(), n).unwrap(),
                    Bytes::from(d.clone())
                );
                if n == 0 {
                    continue;
                }
                let mut bad = obj.to_vec();
                bad[n / 2] ^= 1;
                assert!(plain.decode(Bytes::from(bad), n).is_none(), "flip in {n}");
                assert!(
                    plain.decode(obj.slice(..obj.len() - 1), n).is_none(),
                    "truncated {n}"
                );
                // Sealed: read back under its own key only.
                let mine = sums(seal_of("v/u/chunks/0/0/1_0_9"), segment);
                let other = sums(seal_of("v/u/chunks/0/0/2_0_9"), segment);
                let obj = mine.encode(&d);
                assert_eq!(mine.decode(obj.clone(), n).unwrap(), Bytes::from(d.clone()));
                assert!(
                    other.decode(obj.clone(), n).is_none(),
                    "another key's block"
                );
                assert!(
                    plain.decode(obj.clone(), n).is_none(),
                    "sealed read as plain"
                );
                if n > SEGMENT {
                    let wrong = sums(mine.seal, SEGMENT + OLD_SEGMENT - segment);
                    assert!(wrong.decode(obj, n).is_none(), "read with other segments");
                }
            }
        }
    }

    /// The data length of an object is found from its size alone, for every length.
    #[test]
    fn data_lengths_follow_from_object_sizes() {
        for segment in [SEGMENT, OLD_SEGMENT] {
            let s = sums(seal_of("k"), segment);
            let mut sizes = std::collections::HashSet::new();
            for n in (0..3 * segment + 7).chain([4 << 20, (4 << 20) + 1]) {
                let size = n + s.trailer_len(n);
                assert_eq!(s.data_len(size), Some(n), "{n} bytes");
                sizes.insert(size);
            }
            for size in 0..3 * (segment + 4) {
                if !sizes.contains(&size) {
                    assert_eq!(s.data_len(size), None, "no object is {size} bytes");
                }
            }
            let d = data(segment + 10);
            let obj = s.encode(&d);
            assert_eq!(s.decode_sized(obj.clone()).unwrap(), Bytes::from(d));
            assert!(s.decode_sized(obj.slice(..obj.len() - 1)).is_none());
        }
    }

    #[test]
    fn ranges_verify_by_segment() {
        for segment in [SEGMENT, OLD_SEGMENT] {
            let n = 3 * segment + 100;
            let d = data(n);
            let s = sums(seal_of("k"), segment);
            let obj = s.encode(&d);
            for r in [
                0..1,
                10..segment + 5,
                segment..2 * segment,
                3 * segment + 50..n,
                5..n,
            ] {
                let a = s.aligned(r.clone(), n);
                assert!(a.start <= r.start && a.end >= r.end && a.start % segment == 0);
                assert!(a.len() < r.len() + 2 * segment, "{r:?} fetches too much");
                let t = s.sums_range(&a, n);
                assert!(s.verify(&obj[a.clone()], &obj[t.clone()], a.start), "{r:?}");
                let mut bad = obj[a.clone()].to_vec();
                bad[r.start - a.start] ^= 0x80;
                assert!(!s.verify(&bad, &obj[t.clone()], a.start), "{r:?}");
                if a.len() >= segment {
                    // A segment read as another segment of the same block fails too.
                    let next = a.start + segment;
                    assert!(!s.verify(&obj[a.clone()], &obj[t], next), "{r:?}");
                }
            }
        }
    }

    #[test]
    fn a_small_read_fetches_one_small_segment() {
        let s = sums(1, SEGMENT);
        let a = s.aligned(8192 + 100..8192 + 4000, 4 << 20);
        assert_eq!(a, 8192..12288);
        assert_eq!(s.sums_range(&a, 4 << 20), (4 << 20) + 8..(4 << 20) + 12);
    }
}
