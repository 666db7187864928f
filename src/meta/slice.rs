//! Slice records: how a chunk refers to the immutable slices that hold its bytes.
//!
//! A chunk keeps an ordered list of records, oldest first. A record says "bytes
//! `[pos, pos+len)` of this chunk are bytes `[off, off+len)` of slice `id`" (a slice of total
//! size `size`). Slice id 0 means zeros (written by truncate and hole punching). A read takes,
//! for every byte, the newest record covering it; bytes no record covers are a hole (zeros).
//!
//! Not for: reading or writing the blocks of a slice (that is `data`).

/// One record of a chunk's slice list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceRec {
    /// Position of the first byte in the chunk.
    pub pos: u32,
    /// Slice id; 0 = zeros.
    pub id: u64,
    /// Total size of the slice (to find its blocks).
    pub size: u32,
    /// Offset of the first byte within the slice.
    pub off: u32,
    /// Number of bytes.
    pub len: u32,
}

/// Size of an encoded record.
pub const REC_SIZE: usize = 24;

impl SliceRec {
    pub fn zero(pos: u32, len: u32) -> SliceRec {
        SliceRec {
            pos,
            id: 0,
            size: len,
            off: 0,
            len,
        }
    }

    pub fn end(&self) -> u64 {
        self.pos as u64 + self.len as u64
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pos.to_be_bytes());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.off.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }
}

pub fn encode(recs: &[SliceRec]) -> Vec<u8> {
    let mut out = Vec::with_capacity(recs.len() * REC_SIZE);
    for r in recs {
        r.encode_into(&mut out);
    }
    out
}

/// Decodes a record list; `None` if the buffer is not a whole number of records.
pub fn decode(buf: &[u8]) -> Option<Vec<SliceRec>> {
    if buf.len() % REC_SIZE != 0 {
        return None;
    }
    let u32_at = |b: &[u8], i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    Some(
        buf.chunks_exact(REC_SIZE)
            .map(|b| SliceRec {
                pos: u32_at(b, 0),
                id: u64::from_be_bytes(b[4..12].try_into().unwrap()),
                size: u32_at(b, 12),
                off: u32_at(b, 16),
                len: u32_at(b, 20),
            })
            .collect(),
    )
}

/// The visible layout of a chunk: non-overlapping pieces of records, sorted by position.
/// Gaps between pieces are holes. Each piece is itself a `SliceRec` (a trimmed record).
pub fn build_view(recs: &[SliceRec]) -> Vec<SliceRec> {
    let mut view: Vec<SliceRec> = Vec::new();
    for r in recs.iter().filter(|r| r.len > 0) {
        let (start, end) = (r.pos as u64, r.end());
        // First piece that ends after `start`.
        let first = view.partition_point(|p| p.end() <= start);
        let mut last = first;
        while last < view.len() && (view[last].pos as u64) < end {
            last += 1;
        }
        // Pieces view[first..last] overlap [start, end): keep their outside parts.
        let mut repl: Vec<SliceRec> = Vec::with_capacity(3);
        if first < last {
            let head = view[first];
            if (head.pos as u64) < start {
                let keep = (start - head.pos as u64) as u32;
                repl.push(SliceRec { len: keep, ..head });
            }
        }
        repl.push(*r);
        if first < last {
            let tail = view[last - 1];
            if tail.end() > end {
                let cut = (end - tail.pos as u64) as u32;
                repl.push(SliceRec {
                    pos: end as u32,
                    off: if tail.id == 0 { 0 } else { tail.off + cut },
                    len: tail.len - cut,
                    ..tail
                });
            }
        }
        view.splice(first..last, repl);
    }
    view
}

/// Whether the view has data (a non-zero slice) anywhere in `[start, end)`.
pub fn has_data(view: &[SliceRec], start: u64, end: u64) -> bool {
    view.iter()
        .any(|p| p.id != 0 && (p.pos as u64) < end && p.end() > start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pos: u32, id: u64, len: u32) -> SliceRec {
        SliceRec {
            pos,
            id,
            size: len,
            off: 0,
            len,
        }
    }

    /// Reference model: the newest record covering each byte, byte by byte.
    fn model(recs: &[SliceRec], n: usize) -> Vec<Option<(u64, u32)>> {
        let mut m = vec![None; n];
        for r in recs {
            for i in 0..r.len {
                let p = (r.pos + i) as usize;
                if p < n {
                    m[p] = Some((r.id, if r.id == 0 { 0 } else { r.off + i }));
                }
            }
        }
        m
    }

    fn flatten(view: &[SliceRec], n: usize) -> Vec<Option<(u64, u32)>> {
        let mut m = vec![None; n];
        for p in view {
            for i in 0..p.len {
                let x = (p.pos + i) as usize;
                assert!(m[x].is_none(), "pieces overlap at {x}");
                m[x] = Some((p.id, if p.id == 0 { 0 } else { p.off + i }));
            }
        }
        m
    }

    #[test]
    fn encode_roundtrip() {
        let recs = vec![
            rec(0, 7, 100),
            SliceRec {
                pos: 5,
                id: 9,
                size: 50,
                off: 3,
                len: 20,
            },
        ];
        assert_eq!(decode(&encode(&recs)).unwrap(), recs);
        assert!(decode(&[1, 2, 3]).is_none());
    }

    #[test]
    fn newest_wins_simple() {
        let v = build_view(&[rec(0, 1, 100), rec(10, 2, 10)]);
        assert_eq!(v.len(), 3);
        assert_eq!(
            v[0],
            SliceRec {
                pos: 0,
                id: 1,
                size: 100,
                off: 0,
                len: 10
            }
        );
        assert_eq!(v[1], rec(10, 2, 10));
        assert_eq!(
            v[2],
            SliceRec {
                pos: 20,
                id: 1,
                size: 100,
                off: 20,
                len: 80
            }
        );
    }

    #[test]
    fn random_against_model() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        for _ in 0..300 {
            let n = 200usize;
            let recs: Vec<SliceRec> = (0..rng.random_range(1..30))
                .map(|i| {
                    let pos = rng.random_range(0..n as u32);
                    let len = rng.random_range(0..(n as u32 - pos + 1));
                    let id = if rng.random_bool(0.2) { 0 } else { i + 1 };
                    let off = if id == 0 { 0 } else { rng.random_range(0..10) };
                    SliceRec {
                        pos,
                        id,
                        size: off + len,
                        off,
                        len,
                    }
                })
                .collect();
            let view = build_view(&recs);
            assert!(view.windows(2).all(|w| w[0].end() <= w[1].pos as u64));
            assert_eq!(flatten(&view, n), model(&recs, n), "records {recs:?}");
        }
    }

    #[test]
    fn data_detection() {
        let v = build_view(&[rec(0, 1, 100), SliceRec::zero(50, 50)]);
        assert!(has_data(&v, 0, 10));
        assert!(!has_data(&v, 50, 100));
        assert!(!has_data(&v, 100, 200));
    }
}
