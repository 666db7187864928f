//! Slice records: how a chunk refers to the immutable slices that hold its bytes.
//!
//! A chunk keeps an ordered list of records, oldest first. A record says "bytes
//! `[pos, pos+len)` of this chunk are bytes `[off, off+len)` of slice `id`" (a slice of total
//! size `size`). Slice id 0 means zeros: with `size` 0, zeros that hold their place (a range
//! reserved by `fallocate`, counted as stored as ext4 counts its unwritten extents), else
//! zeros written by truncate and hole punching (a hole's). A read takes, for every byte, the
//! newest record covering it; bytes no record covers are a hole (zeros).
//!
//! Also the pure arithmetic of records: zero records over a range, a copy's records.
//!
//! Not for: reading or writing the blocks of a slice (that is `data`).

use std::collections::BTreeMap;

use super::CHUNK_SIZE;

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

/// The bit of a slice id that says its bytes are not the volume's: an external slice, bytes
/// of an object imported by reference (`unkai import`; its row, [`super::External`], says
/// which). Ordinary ids are counted from 1 and never reach it.
pub const EXTERNAL: u64 = 1 << 62;

/// Whether slice `id` is external (see [`EXTERNAL`]).
pub fn is_external(id: u64) -> bool {
    id & EXTERNAL != 0
}

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

    /// Zeros that hold their place: reserved by `fallocate` (or zeroed by its
    /// FALLOC_FL_ZERO_RANGE), counted as stored (`st_blocks`) as ext4 counts the unwritten
    /// extents it allocates. Told from a hole's zeros by `size` 0.
    pub fn reserved(pos: u32, len: u32) -> SliceRec {
        SliceRec {
            pos,
            id: 0,
            size: 0,
            off: 0,
            len,
        }
    }

    /// Whether these are zeros that hold their place ([`SliceRec::reserved`]).
    pub fn is_reserved(&self) -> bool {
        self.id == 0 && self.size == 0
    }

    /// Whether the bytes are stored: data, or zeros reserved.
    pub fn is_stored(&self) -> bool {
        self.id != 0 || self.is_reserved()
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
///
/// O(n log n) in the records: a chunk written by random 4 KiB writes (mmap writeback) holds
/// tens of thousands of them until compaction, and every read of it builds this view.
pub fn build_view(recs: &[SliceRec]) -> Vec<SliceRec> {
    // Pieces by position.
    let mut view: BTreeMap<u32, SliceRec> = BTreeMap::new();
    let mut covered: Vec<u32> = Vec::new();
    for r in recs.iter().filter(|r| r.len > 0) {
        let (start, end) = (r.pos as u64, r.end());
        // A piece that starts before the record and reaches into it keeps its head (and its
        // part past the record, if it spans it).
        if let Some((_, &p)) = view.range(..r.pos).next_back() {
            if p.end() > start {
                view.insert(
                    p.pos,
                    SliceRec {
                        len: (start - p.pos as u64) as u32,
                        ..p
                    },
                );
                if p.end() > end {
                    view.insert(end as u32, past(p, end));
                }
            }
        }
        // Pieces that start inside the record go, but for the part of the last past its end.
        covered.clear();
        covered.extend(
            view.range(r.pos..)
                .take_while(|(k, _)| (**k as u64) < end)
                .map(|(k, _)| *k),
        );
        for k in &covered {
            if let Some(p) = view.remove(k) {
                if p.end() > end {
                    view.insert(end as u32, past(p, end));
                }
            }
        }
        view.insert(r.pos, *r);
    }
    view.into_values().collect()
}

/// The part of piece `p` from `end` on.
fn past(p: SliceRec, end: u64) -> SliceRec {
    let cut = (end - p.pos as u64) as u32;
    SliceRec {
        pos: end as u32,
        off: if p.id == 0 { 0 } else { p.off + cut },
        len: p.len - cut,
        ..p
    }
}

/// Bytes of a chunk that are stored: what its records show of data and of ranges reserved
/// ([`SliceRec::reserved`]); holes and zeroed ranges not counted.
pub fn covered(recs: &[SliceRec]) -> u64 {
    build_view(recs)
        .iter()
        .filter(|p| p.is_stored())
        .map(|p| p.len as u64)
        .sum()
}

/// What appending `added` to a chunk's records `before` does to its stored bytes
/// ([`covered`]): `(after, before)`, the stored bytes of the ranges `added` covers once they
/// are appended and before. `covered(before ++ added) - covered(before)` is `after - before`.
///
/// Outside those ranges nothing changes, so only they are looked at: the newest records of
/// `before` are walked back until the ranges are accounted for, where [`covered`] would
/// build two whole views. A file written by sync writes appends a record per write to a
/// chunk of hundreds until compaction: two views per write were a fifth of the mount's CPU.
pub fn covered_change(before: &[SliceRec], added: &[SliceRec]) -> (u64, u64) {
    let after = covered(added);
    // The ranges `added` covers, disjoint and sorted: what of them is not yet accounted for.
    let mut open: Vec<(u64, u64)> = Vec::new();
    for r in build_view(added) {
        match open.last_mut() {
            Some((_, end)) if *end == r.pos as u64 => *end = r.end(),
            _ => open.push((r.pos as u64, r.end())),
        }
    }
    let mut old = 0;
    for r in before.iter().rev().filter(|r| r.len > 0) {
        if open.is_empty() {
            break;
        }
        let (start, end) = (r.pos as u64, r.end());
        let mut left = Vec::with_capacity(open.len() + 1);
        for &(s, e) in &open {
            let (from, to) = (s.max(start), e.min(end));
            if from >= to {
                left.push((s, e));
                continue;
            }
            if r.is_stored() {
                old += to - from;
            }
            if s < from {
                left.push((s, from));
            }
            if to < e {
                left.push((to, e));
            }
        }
        open = left;
    }
    (after, old)
}

/// Whether the view has data (a non-zero slice) anywhere in `[start, end)`.
pub fn has_data(view: &[SliceRec], start: u64, end: u64) -> bool {
    view.iter()
        .any(|p| p.id != 0 && (p.pos as u64) < end && p.end() > start)
}

/// Zero records covering `[start, end)` of a file, chunk by chunk.
pub(crate) fn zero_recs(start: u64, end: u64) -> Vec<(u32, SliceRec)> {
    let mut out = Vec::new();
    let mut off = start;
    while off < end {
        let index = off / CHUNK_SIZE;
        let pos = off % CHUNK_SIZE;
        let n = (CHUNK_SIZE - pos).min(end - off);
        out.push((index as u32, SliceRec::zero(pos as u32, n as u32)));
        off += n;
    }
    out
}

/// Reserved records ([`SliceRec::reserved`]) covering `[start, end)` of a file, chunk by
/// chunk: what FALLOC_FL_ZERO_RANGE leaves (zeros, still allocated).
pub(crate) fn reserved_recs(start: u64, end: u64) -> Vec<(u32, SliceRec)> {
    zero_recs(start, end)
        .into_iter()
        .map(|(i, r)| (i, SliceRec::reserved(r.pos, r.len)))
        .collect()
}

/// Reserved records over what of `[start, end)` of a file holds neither data nor a
/// reservation (holes, and a hole's zeros), chunk by chunk, from each chunk's records as
/// `read` returns them: what `fallocate` adds, leaving the data as it is.
pub(crate) fn reserve_holes<E>(
    start: u64,
    end: u64,
    mut read: impl FnMut(u32) -> std::result::Result<Vec<SliceRec>, E>,
) -> std::result::Result<Vec<(u32, SliceRec)>, E> {
    let mut out = Vec::new();
    let mut off = start;
    while off < end {
        let index = (off / CHUNK_SIZE) as u32;
        let base = index as u64 * CHUNK_SIZE;
        let (a, b) = (off - base, (end - base).min(CHUNK_SIZE));
        let view = build_view(&read(index)?);
        let mut cur = a;
        for p in view
            .iter()
            .filter(|p| p.is_stored() && p.end() > a && (p.pos as u64) < b)
        {
            let ps = (p.pos as u64).max(a);
            if ps > cur {
                out.push((index, SliceRec::reserved(cur as u32, (ps - cur) as u32)));
            }
            cur = cur.max(p.end().min(b));
        }
        if cur < b {
            out.push((index, SliceRec::reserved(cur as u32, (b - cur) as u32)));
        }
        off = base + b;
    }
    Ok(out)
}

/// Splits `(chunk index, record)` pairs (sorted by chunk) into runs of one chunk each.
pub(crate) fn by_chunk(recs: &[(u32, SliceRec)]) -> Vec<(u32, Vec<SliceRec>)> {
    let mut out: Vec<(u32, Vec<SliceRec>)> = Vec::new();
    for (index, r) in recs {
        match out.last_mut() {
            Some((i, v)) if i == index => v.push(*r),
            _ => out.push((*index, vec![*r])),
        }
    }
    out
}

/// The destination records of copying `[src_off, src_off + len)` of a file to `dst_off`,
/// from the source's chunks as `read` returns them (before the copy). Holes and zero records
/// become zero records; records are cut at destination chunk boundaries.
pub(crate) fn plan_copy<E>(
    src_off: u64,
    dst_off: u64,
    len: u64,
    mut read: impl FnMut(u32) -> std::result::Result<Vec<SliceRec>, E>,
) -> std::result::Result<Vec<(u32, SliceRec)>, E> {
    let mut out: Vec<(u32, SliceRec)> = Vec::new();
    let mut push = |dpos: u64, r: SliceRec| {
        // Split at destination chunk boundaries.
        let mut done = 0u32;
        while done < r.len {
            let at = dpos + done as u64;
            let room = (CHUNK_SIZE - at % CHUNK_SIZE).min((r.len - done) as u64) as u32;
            let piece = if r.is_reserved() {
                SliceRec::reserved((at % CHUNK_SIZE) as u32, room)
            } else if r.id == 0 {
                SliceRec::zero((at % CHUNK_SIZE) as u32, room)
            } else {
                SliceRec {
                    pos: (at % CHUNK_SIZE) as u32,
                    id: r.id,
                    size: r.size,
                    off: r.off + done,
                    len: room,
                }
            };
            out.push(((at / CHUNK_SIZE) as u32, piece));
            done += room;
        }
    };
    let mut off = src_off;
    let end = src_off + len;
    while off < end {
        let index = (off / CHUNK_SIZE) as u32;
        let base = index as u64 * CHUNK_SIZE;
        let (a, b) = (off - base, (end - base).min(CHUNK_SIZE));
        let view = build_view(&read(index)?);
        let mut cur = a;
        for p in view.iter().filter(|p| p.end() > a && (p.pos as u64) < b) {
            let ps = (p.pos as u64).max(a);
            let pe = p.end().min(b);
            if ps > cur {
                push(
                    dst_off + (base + cur - src_off),
                    SliceRec::zero(0, (ps - cur) as u32),
                );
            }
            let skip = (ps - p.pos as u64) as u32;
            let piece = SliceRec {
                pos: 0,
                id: p.id,
                size: p.size,
                off: if p.id == 0 { 0 } else { p.off + skip },
                len: (pe - ps) as u32,
            };
            push(dst_off + (base + ps - src_off), piece);
            cur = pe;
        }
        if cur < b {
            push(
                dst_off + (base + cur - src_off),
                SliceRec::zero(0, (b - cur) as u32),
            );
        }
        off = base + b;
    }
    Ok(out)
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
    fn covered_change_matches_two_views() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let random_rec = |rng: &mut rand::rngs::StdRng, i: u64| {
            let n = 200u32;
            let pos = rng.random_range(0..n);
            let len = rng.random_range(0..(n - pos + 1));
            match rng.random_range(0..5) {
                0 => SliceRec::zero(pos, len),
                1 => SliceRec::reserved(pos, len),
                _ => rec(pos, i + 1, len),
            }
        };
        for _ in 0..500 {
            let all: Vec<SliceRec> = (0..rng.random_range(1..30))
                .map(|i| random_rec(&mut rng, i))
                .collect();
            let split = rng.random_range(0..all.len());
            let (before, added) = all.split_at(split);
            let (after, old) = covered_change(before, added);
            assert_eq!(
                covered(&all) as i64 - covered(before) as i64,
                after as i64 - old as i64,
                "before {before:?} added {added:?}"
            );
        }
        // A sync write after a fallocate: 4 KiB of the reservation becomes data.
        let before = [SliceRec::reserved(0, 1 << 20), rec(0, 1, 4096)];
        assert_eq!(covered_change(&before, &[rec(4096, 2, 4096)]), (4096, 4096));
        // Into a hole: the bytes are new.
        assert_eq!(covered_change(&[rec(0, 1, 10)], &[rec(20, 2, 10)]), (10, 0));
    }

    #[test]
    fn data_detection() {
        let v = build_view(&[rec(0, 1, 100), SliceRec::zero(50, 50)]);
        assert!(has_data(&v, 0, 10));
        assert!(!has_data(&v, 50, 100));
        assert!(!has_data(&v, 100, 200));
    }

    #[test]
    fn fallocate_reserves_holes_and_leaves_data() {
        // Data at 100..200, a hole's zeros at 300..400, a reservation at 500..600.
        let recs = vec![
            rec(100, 7, 100),
            SliceRec::zero(300, 100),
            SliceRec::reserved(500, 100),
        ];
        let out = reserve_holes::<()>(50, 700, |_| Ok(recs.clone())).unwrap();
        let got: Vec<(u32, u32)> = out.iter().map(|(_, r)| (r.pos, r.len)).collect();
        assert_eq!(got, [(50, 50), (200, 300), (600, 100)]);
        assert!(out.iter().all(|(i, r)| *i == 0 && r.is_reserved()));
        let mut all = recs.clone();
        all.extend(out.iter().map(|(_, r)| *r));
        // Stored: the data and every reserved byte; the data still reads as itself.
        assert_eq!(covered(&all), 650);
        assert!(build_view(&all).iter().any(|p| p.id == 7 && p.len == 100));
        // Across chunks: one record per chunk.
        let out =
            reserve_holes::<()>(CHUNK_SIZE - 10, CHUNK_SIZE + 10, |_| Ok(Vec::new())).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].0, out[1].0), (0, 1));
        // A hole's zeros are not stored; a copy keeps a reservation a reservation.
        assert_eq!(covered(&[SliceRec::zero(0, 10)]), 0);
        let copy = plan_copy::<()>(0, 0, 600, |_| Ok(recs.clone())).unwrap();
        assert_eq!(
            covered(&copy.iter().map(|(_, r)| *r).collect::<Vec<_>>()),
            200
        );
    }
}
