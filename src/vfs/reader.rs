//! Reading committed file data: chunk slice lists → visible pieces → block ranges.
//!
//! Not for: pending (unflushed) writes, which `vfs` lays over the result.

use crate::data::{DataStore, SliceRange};
use crate::meta::{CHUNK_SIZE, Ino, Meta, SliceRec, slice};

use super::Result;

/// Fills `buf` with the committed bytes of `ino` from `off` (holes read as zeros; `buf`
/// must be zeroed by the caller).
pub fn read_committed(
    meta: &dyn Meta,
    store: &DataStore,
    ino: Ino,
    off: u64,
    buf: &mut [u8],
    sequential: bool,
) -> Result<()> {
    read_planned(meta, store, ino, off, buf, sequential, None)
}

/// [`read_committed`], from `planned` (what [`plan`] said for the same range, if the caller
/// has it) rather than planning first.
pub fn read_planned(
    meta: &dyn Meta,
    store: &DataStore,
    ino: Ino,
    off: u64,
    buf: &mut [u8],
    sequential: bool,
    mut planned: Option<Vec<(usize, SliceRange)>>,
) -> Result<()> {
    // A block missing from the bucket may be one a compaction replaced (and reclaiming
    // deleted) between the plan and the fetch: the chunk is read again, and a block still
    // missing then is an error.
    let mut attempts = 0;
    loop {
        let wanted = match planned.take() {
            Some(w) => w,
            None => plan(meta, ino, off, buf.len() as u64)?,
        };
        match read_ranges(store, wanted, buf, sequential) {
            Err(super::Error::Data(crate::data::Error::Object(
                crate::object::Error::NotFound(key),
            ))) if attempts < 2 => {
                attempts += 1;
                tracing::debug!("block {key} gone while reading inode {ino}; reading again");
            }
            other => return other,
        }
    }
}

/// Where the committed bytes `[off, off + len)` of `ino` are: each `(offset from off, range
/// of a slice)`, in order of offset, holes left out.
pub fn plan(meta: &dyn Meta, ino: Ino, off: u64, len: u64) -> Result<Vec<(usize, SliceRange)>> {
    let end = off + len;
    let mut wanted: Vec<(usize, SliceRange)> = Vec::new();
    let mut at = off;
    while at < end {
        let index = (at / CHUNK_SIZE) as u32;
        let base = index as u64 * CHUNK_SIZE;
        let (a, b) = (at - base, (end - base).min(CHUNK_SIZE));
        let view = slice::build_view(&meta.read_chunk(ino, index)?);
        for p in view
            .iter()
            .filter(|p| p.id != 0 && p.end() > a && (p.pos as u64) < b)
        {
            let (ps, pe) = ((p.pos as u64).max(a), p.end().min(b));
            wanted.push(((base + ps - off) as usize, piece_range(p, ps, pe)));
        }
        at = base + b;
    }
    Ok(wanted)
}

/// Bytes `[from, to)` (positions in the chunk) of a data piece of a chunk's view, as a range
/// of its slice.
pub fn piece_range(p: &SliceRec, from: u64, to: u64) -> SliceRange {
    SliceRange {
        id: p.id,
        size: p.size,
        start: p.off + (from - p.pos as u64) as u32,
        len: (to - from) as u32,
    }
}

/// Reads slice ranges into `buf`: each `(offset in buf, range)`, in order of offset, not
/// overlapping.
pub fn read_ranges(
    store: &DataStore,
    wanted: Vec<(usize, SliceRange)>,
    buf: &mut [u8],
    sequential: bool,
) -> Result<()> {
    if wanted.is_empty() {
        return Ok(());
    }
    // Carve `buf` into the disjoint, ordered destinations.
    let mut parts = Vec::with_capacity(wanted.len());
    let mut rest = buf;
    let mut consumed = 0usize;
    for (dst, r) in wanted {
        let tail = std::mem::take(&mut rest);
        let (_, tail) = tail.split_at_mut(dst - consumed);
        let (mine, tail) = tail.split_at_mut(r.len as usize);
        parts.push((r, mine));
        rest = tail;
        consumed = dst + r.len as usize;
    }
    store.read(&mut parts, sequential)?;
    Ok(())
}
