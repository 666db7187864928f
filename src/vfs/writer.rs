//! Buffered writes of one file, turned into slices.
//!
//! Writes are gathered per chunk into pending slices (a slice is one continuous run of bytes
//! inside one chunk). A write that continues or overwrites the unsent tail of a recent slice
//! joins it (when no newer slice overlaps); otherwise it starts a new slice. A slice that comes
//! to end where another starts takes that one's unsent bytes, so that writes of one run that
//! arrive out of order (the kernel's writeback cache sends them in parallel) still make whole
//! blocks; a slice off the block grid holds its blocks back for a while for that. Every block
//! that fills up is uploaded at once in the background; `flush` uploads the rest, waits, and commits
//! all pending slices to the metadata in one transaction. Until then `overlay` lets reads see
//! the pending bytes, which are newer than anything committed.
//!
//! Not for: reading committed data, or deciding when to flush (that is `vfs`).

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::data::{DataStore, PackPiece, SliceUpload};
use crate::meta::{Attr, CHUNK_SIZE, Ino, Meta, Nanos, SliceRec};

use super::{Error, Result};

/// How many recent slices of a chunk a write may join.
const JOIN_WINDOW: usize = 4;

/// A slice that starts off the block grid (its first block is not where a block of the slice
/// before it would end) holds its full blocks back while it is at most this long (or two
/// blocks, if more) and nothing of it is sent: the gap before it may still fill, and it then
/// joins the slice before it whole (see [`merge`]). The kernel's writes that overtake one
/// another are those in flight at once: one per FUSE thread (8 by default) of up to 1 MiB.
/// Beyond that (an append after a commit, a gap that never fills), it uploads its blocks as
/// they fill, as any slice does; the write buffers' bound flushes it before, if smaller.
const HOLD_BYTES: usize = 16 << 20;

struct Pending {
    /// Position in the chunk.
    pos: u32,
    buf: SliceBytes,
    /// Bytes `[0, frozen)` are uploaded or uploading: they may no longer change.
    frozen: usize,
    upload: Option<SliceUpload>,
    /// Packed with other small slices of its chunk (and, with write-back, of other files)
    /// into one object at flush: the pack's index in `FileWriter::packs`, and where this
    /// slice's bytes start in the bytes sent with it.
    pack: Option<(usize, u32)>,
}

/// Small pending slices sent together (see `FileWriter::pack`).
enum Packed {
    /// As a slice of their own, one object (write-through, or too large to share): its
    /// upload and size.
    Own(SliceUpload, u32),
    /// As a piece of the mount's shared pack (`data::pack`), already on local disk.
    Shared(PackPiece),
}

impl Packed {
    /// The record of `len` bytes at `off` of what was sent.
    fn rec(&self, pos: u32, off: u32, len: u32) -> SliceRec {
        let (id, size, base) = match self {
            Packed::Own(up, size) => (up.id(), *size, 0),
            Packed::Shared(p) => (p.id, p.size, p.off),
        };
        SliceRec {
            pos,
            id,
            size,
            off: base + off,
            len,
        }
    }
}

impl Pending {
    fn end(&self) -> u64 {
        self.pos as u64 + self.buf.len() as u64
    }

    /// Whether its last, partial block was sent (by a flush that then failed): growing it
    /// would change that block's length, hence its key.
    fn sealed(&self, bs: usize) -> bool {
        self.frozen % bs != 0
    }

    /// Nothing of it is sent: its bytes may still move into the slice before it.
    fn unsent(&self) -> bool {
        self.upload.is_none() && self.pack.is_none()
    }

    /// Whether it holds its full blocks back (see [`HOLD_BYTES`]).
    fn holds(&self, bs: usize) -> bool {
        self.unsent() && self.pos as usize % bs != 0 && self.buf.len() <= HOLD_BYTES.max(2 * bs)
    }
}

/// Moves the bytes of slice `from` onto the end of slice `into`, which ends where `from`
/// starts, if nothing of `from` is sent, `into` may grow, and no slice between the two in age
/// overlaps them (so every byte keeps its place among older and newer writes). Returns the
/// index of the grown slice.
///
/// The kernel's writeback cache sends a file written in order as parallel writes of up to
/// 1 MiB that reach the writer out of order: one that arrives before the write just before it
/// starts a slice of its own, off the block grid. Without this, each such slice made its own
/// partial blocks (a 20 MiB file went up as 14 objects instead of 5).
fn merge(slices: &mut Vec<Pending>, into: usize, from: usize, bs: usize) -> Option<usize> {
    let (a, b) = (&slices[into], &slices[from]);
    if into == from || a.end() != b.pos as u64 || !b.unsent() || a.pack.is_some() || a.sealed(bs) {
        return None;
    }
    let (lo, hi) = (a.pos as u64, b.end());
    let (i, j) = (into.min(from), into.max(from));
    if slices[i + 1..j]
        .iter()
        .any(|t| (t.pos as u64) < hi && t.end() > lo)
    {
        return None;
    }
    let b = slices.remove(from);
    let into = if from < into { into - 1 } else { into };
    slices[into].buf.append(b.buf);
    Some(into)
}

/// Merges slice `k` with every slice that now starts where it ends or ends where it starts
/// (see [`merge`]); returns the index of the slice that holds `k`'s bytes after.
fn merge_neighbours(slices: &mut Vec<Pending>, mut k: usize, bs: usize) -> usize {
    'again: loop {
        let (pos, end) = (slices[k].pos as u64, slices[k].end());
        for m in 0..slices.len() {
            let t = &slices[m];
            let merged = if t.pos as u64 == end {
                merge(slices, k, m, bs)
            } else if t.end() == pos {
                merge(slices, m, k, bs)
            } else {
                None
            };
            if let Some(n) = merged {
                k = n;
                continue 'again;
            }
        }
        return k;
    }
}

/// The bytes of a pending slice, block by block. A block is allocated once (at its full size
/// when writes are large), filled in place, and handed to its upload as it is: the upload and
/// the reads that see it pending share it. A stream of large writes used to pay, per byte, a
/// zero fill and a reallocation of one growing buffer, then a copy of each block for its
/// upload (issue 34: large O_DIRECT writes at a tenth of the local disk's rate).
struct SliceBytes {
    /// The block size.
    bs: usize,
    /// All full but the last.
    blocks: Vec<Part>,
    len: usize,
}

enum Part {
    /// Still filling.
    Open(Vec<u8>),
    /// Handed to its upload: never written again.
    Sent(Bytes),
}

impl Part {
    fn bytes(&self) -> &[u8] {
        match self {
            Part::Open(v) => v,
            Part::Sent(b) => b,
        }
    }
}

impl SliceBytes {
    fn new(bs: usize) -> SliceBytes {
        SliceBytes {
            bs,
            blocks: Vec::new(),
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `data` at `at` (zeros fill any gap past the end). Only bytes of blocks not sent
    /// may be written (the writer's join rule sees to it).
    fn write(&mut self, at: usize, data: &[u8]) {
        let bs = self.bs;
        if at > self.len {
            let gap = vec![0u8; at - self.len];
            self.write(self.len, &gap);
        }
        let mut done = 0;
        while done < data.len() {
            let pos = at + done;
            let (index, off) = (pos / bs, pos % bs);
            let n = (bs - off).min(data.len() - done);
            if index == self.blocks.len() {
                self.blocks.push(Part::Open(Vec::new()));
            }
            let Part::Open(v) = &mut self.blocks[index] else {
                panic!("a write into a block already sent");
            };
            let part = &data[done..done + n];
            let over = v.len().saturating_sub(off).min(n);
            v[off..off + over].copy_from_slice(&part[..over]);
            let more = n - over;
            if more > 0 {
                if v.capacity() < off + n {
                    // Large writes get the whole block at once (no reallocation copies), a
                    // buffer used before if one is idle (`data::buffers`: no fresh pages to
                    // map and zero); small ones grow it by doublings.
                    let want = off + n;
                    if want >= bs / 8 && v.capacity() == 0 {
                        *v = crate::data::buffers::take(bs);
                    } else {
                        let cap = if want >= bs / 8 {
                            bs
                        } else {
                            want.next_power_of_two().min(bs)
                        };
                        v.reserve_exact(cap - v.len());
                    }
                }
                v.extend_from_slice(&part[over..]);
            }
            done += n;
        }
        self.len = self.len.max(at + data.len());
    }

    /// Appends the bytes of `other` (none of them sent). Its blocks are moved as they are when
    /// this ends on a block boundary, copied otherwise.
    fn append(&mut self, other: SliceBytes) {
        if self.len % self.bs == 0 {
            self.blocks.extend(other.blocks);
            self.len += other.len;
            return;
        }
        let at = self.len;
        for (n, p) in other.blocks.iter().enumerate() {
            self.write(at + n * self.bs, p.bytes());
        }
    }

    /// Hands block `index` (whole, or the last, partial one) to its upload: its bytes, shared.
    fn send(&mut self, index: usize) -> Bytes {
        let part = &mut self.blocks[index];
        if let Part::Open(v) = part {
            *part = Part::Sent(crate::data::buffers::freeze(std::mem::take(v), self.bs));
        }
        match part {
            Part::Sent(b) => b.clone(),
            Part::Open(_) => unreachable!("sent just above"),
        }
    }

    /// Copies bytes `[from, from + out.len())` into `out`.
    fn copy_to(&self, from: usize, out: &mut [u8]) {
        let bs = self.bs;
        let mut done = 0;
        while done < out.len() {
            let pos = from + done;
            let (index, off) = (pos / bs, pos % bs);
            let b = self.blocks[index].bytes();
            let n = (b.len() - off).min(out.len() - done);
            out[done..done + n].copy_from_slice(&b[off..off + n]);
            done += n;
        }
    }

    /// Appends every byte to `out`.
    fn append_to(&self, out: &mut Vec<u8>) {
        for p in &self.blocks {
            out.extend_from_slice(p.bytes());
        }
    }
}

pub struct FileWriter {
    ino: Ino,
    chunks: BTreeMap<u32, Vec<Pending>>,
    /// Modification time of the latest write that stamps one (`None`: none does; the kernel's
    /// writeback cache stamps the times of the writes it sends back and hands them over
    /// itself, so their commit keeps the file's times).
    mtime: Option<Nanos>,
    /// End of the furthest pending byte (0 if none).
    end: u64,
    /// Bytes buffered.
    bytes: usize,
    /// Keys uploaded since the last fsync (to make durable on fsync, for local buckets).
    unsynced: Vec<String>,
    /// The file's attributes as the last commit left them (until taken).
    committed: Option<Attr>,
    /// What the small pending slices were sent as at flush (see `pack`).
    packs: Vec<Packed>,
    /// A close (FUSE flush, or the setattr of times the kernel's writeback cache sends
    /// first) told the application these writes failed, and no flush has succeeded since:
    /// they are dropped at the last release, never committed later.
    close_failed: bool,
    /// A commit of the pending slices failed without a POSIX answer (the engine's error: a
    /// connection lost after its COMMIT was sent, in a database failover): it may have
    /// committed, so their blocks may be referenced and are never deleted here (gc deletes
    /// them if nothing does).
    maybe_committed: bool,
    /// What writes through this writer already dropped ([`Privs`]): checked once, not per
    /// write, until a chmod or setxattr through this mount makes it worth checking again.
    pub privs_dropped: Privs,
    /// The end of the file up to which writes were found to fit the volume's limits (see
    /// `Vfs::write`): past it, the writer asks again.
    pub room_to: u64,
    /// The mount's map of writers let go of this one (see [`FileWriter::retire`]).
    retired: bool,
}

/// What a write drops, as Linux does (see `Vfs::drop_privs`): file capabilities (on any
/// write) and setuid/setgid (on a write by a caller without CAP_FSETID).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Privs {
    pub caps: bool,
    pub suidgid: bool,
}

impl FileWriter {
    pub fn new(ino: Ino) -> FileWriter {
        FileWriter {
            ino,
            chunks: BTreeMap::new(),
            mtime: None,
            end: 0,
            bytes: 0,
            unsynced: Vec::new(),
            committed: None,
            packs: Vec::new(),
            close_failed: false,
            maybe_committed: false,
            privs_dropped: Privs::default(),
            room_to: 0,
            retired: false,
        }
    }

    /// Marks the writer let go of by the mount (under its lock, as it leaves the mount's map
    /// of writers): a write that took it from the map just before must not buffer into it,
    /// since no flush would ever find it again (see `Vfs::write_with`).
    pub fn retire(&mut self) {
        self.retired = true;
    }

    pub fn retired(&self) -> bool {
        self.retired
    }

    /// Whether a close reported these writes failed (and nothing stored them since).
    pub fn close_failed(&self) -> bool {
        self.close_failed && self.is_dirty()
    }

    /// Notes that a close reported the pending writes failed; a successful flush clears it.
    pub fn set_close_failed(&mut self) {
        self.close_failed = true;
    }

    /// The attributes the last commit returned, if not taken yet.
    pub fn take_committed(&mut self) -> Option<Attr> {
        self.committed.take()
    }

    pub fn is_dirty(&self) -> bool {
        !self.chunks.is_empty()
    }

    /// End of the pending data, if any.
    pub fn pending_end(&self) -> Option<u64> {
        self.is_dirty().then_some(self.end)
    }

    pub fn mtime(&self) -> Option<Nanos> {
        self.mtime.filter(|_| self.is_dirty())
    }

    pub fn buffered(&self) -> usize {
        self.bytes
    }

    /// Buffers `data` at `off` (the buffer grows by what `buffered()` then shows), written at
    /// `now` (`None`: a write whose time the kernel keeps, see [`FileWriter::mtime`]).
    pub fn write(
        &mut self,
        meta: &dyn Meta,
        store: &DataStore,
        off: u64,
        data: &[u8],
        now: impl Into<Option<Nanos>>,
    ) -> Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let at = off + done as u64;
            let index = (at / CHUNK_SIZE) as u32;
            let pos = (at % CHUNK_SIZE) as u32;
            let n = ((CHUNK_SIZE - pos as u64) as usize).min(data.len() - done);
            self.write_chunk(meta, store, index, pos, &data[done..done + n])?;
            done += n;
        }
        self.end = self.end.max(off + data.len() as u64);
        if let Some(now) = now.into() {
            self.mtime = Some(now);
        }
        Ok(())
    }

    fn write_chunk(
        &mut self,
        meta: &dyn Meta,
        store: &DataStore,
        index: u32,
        pos: u32,
        data: &[u8],
    ) -> Result<()> {
        let bs = store.block_size() as usize;
        let slices = self.chunks.entry(index).or_default();
        let (start, end) = (pos as u64, pos as u64 + data.len() as u64);
        let mut target = None;
        for k in (slices.len().saturating_sub(JOIN_WINDOW)..slices.len()).rev() {
            let s = &slices[k];
            let open_from = s.pos as u64 + s.frozen as u64;
            if !s.sealed(bs)
                && start >= open_from
                && start <= s.end()
                && slices[k + 1..]
                    .iter()
                    .all(|t| t.end() <= start || t.pos as u64 >= end)
            {
                target = Some(k);
                break;
            }
        }
        let k = match target {
            Some(k) => k,
            None => {
                slices.push(Pending {
                    pos,
                    buf: SliceBytes::new(bs),
                    frozen: 0,
                    upload: None,
                    pack: None,
                });
                slices.len() - 1
            }
        };
        let s = &mut slices[k];
        // A block that failed to upload fails the writes that follow (before their bytes are
        // buffered: a write that reports an error must not be committed later).
        if let Some(up) = &mut s.upload {
            up.poll().map_err(Error::Data)?;
        }
        let rel = (start - s.pos as u64) as usize;
        if rel + data.len() > s.buf.len() {
            self.bytes += rel + data.len() - s.buf.len();
        }
        s.buf.write(rel, data);
        // The write may have closed the gap to a slice after it (or this slice may start
        // where an older one ends): they become one.
        let k = merge_neighbours(slices, k, bs);
        let s = &mut slices[k];
        // Upload every block that is now complete, unless the slice holds them back.
        while !s.holds(bs) && s.buf.len() - s.frozen >= bs {
            let up = match &mut s.upload {
                Some(u) => u,
                None => s
                    .upload
                    .insert(SliceUpload::start(store, || meta.new_slice_id())?),
            };
            let block = s.buf.send(s.frozen / bs);
            up.put_block((s.frozen / bs) as u32, block);
            s.frozen += bs;
        }
        Ok(())
    }

    /// Packs the small slices of each chunk (those with no block uploaded yet: random writes,
    /// appends) into one new slice, uploaded as one object, that their records point into
    /// (`off`). Random 4 KiB writes to a file then cost one PUT per flush instead of one
    /// each. Records keep their order, so newer bytes still win where they overlap. With
    /// write-back, small files' bytes go into the mount's shared pack instead (`data::pack`),
    /// so that many small files make one PUT.
    fn pack(&mut self, meta: &dyn Meta, store: &DataStore) -> Result<()> {
        // Less than a block: a slice that held its blocks back (see `HOLD_BYTES`) and is
        // larger goes up on its own.
        let bs = store.block_size() as usize;
        let small = |s: &Pending| s.unsent() && !s.buf.is_empty() && s.buf.len() < bs;
        let (shared, limit) = match store.packs_small() {
            true => (true, crate::data::pack::max_piece(store.block_size())),
            false => (false, CHUNK_SIZE as usize),
        };
        for slices in self.chunks.values_mut() {
            let n = slices.iter().filter(|s| small(s)).count();
            if n == 0 || (n == 1 && !shared) {
                continue;
            }
            let mut buf: Vec<u8> = Vec::new();
            let mut members: Vec<(usize, u32)> = Vec::new();
            for k in 0..slices.len() {
                if !small(&slices[k]) {
                    continue;
                }
                if buf.len() + slices[k].buf.len() > limit {
                    Self::send_pack(meta, store, &mut self.packs, slices, &mut buf, &mut members)?;
                }
                members.push((k, buf.len() as u32));
                slices[k].buf.append_to(&mut buf);
            }
            Self::send_pack(meta, store, &mut self.packs, slices, &mut buf, &mut members)?;
        }
        Ok(())
    }

    /// Sends `buf`, the bytes of `members` (index, offset in it): into the shared pack if it
    /// takes them, else as one new slice of their own.
    fn send_pack(
        meta: &dyn Meta,
        store: &DataStore,
        packs: &mut Vec<Packed>,
        slices: &mut [Pending],
        buf: &mut Vec<u8>,
        members: &mut Vec<(usize, u32)>,
    ) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(piece) = store.pack(buf, || meta.new_slice_id())? {
            buf.clear();
            Self::packed(packs, Packed::Shared(piece), slices, members);
            return Ok(());
        }
        let mut up = SliceUpload::start(store, || meta.new_slice_id())?;
        // The packed bytes are handed over as they are: each block is a view of them, not a copy.
        let packed = Bytes::from(std::mem::take(buf));
        let bs = store.block_size() as usize;
        for (i, start) in (0..packed.len()).step_by(bs).enumerate() {
            up.put_block(
                i as u32,
                packed.slice(start..(start + bs).min(packed.len())),
            );
        }
        let size = packed.len() as u32;
        Self::packed(packs, Packed::Own(up, size), slices, members);
        Ok(())
    }

    /// Notes that `members` were sent as `sent`.
    fn packed(
        packs: &mut Vec<Packed>,
        sent: Packed,
        slices: &mut [Pending],
        members: &mut Vec<(usize, u32)>,
    ) {
        let p = packs.len();
        packs.push(sent);
        for (k, off) in members.drain(..) {
            let s = &mut slices[k];
            s.pack = Some((p, off));
            // Sealed: its bytes are sent (see `write_chunk`).
            s.frozen = s.buf.len();
        }
    }

    /// Copies pending bytes over `buf` (which holds the file's committed bytes from `off`).
    pub fn overlay(&self, off: u64, buf: &mut [u8]) {
        let end = off + buf.len() as u64;
        let first = (off / CHUNK_SIZE) as u32;
        let last = ((end.max(1) - 1) / CHUNK_SIZE) as u32;
        for (index, slices) in self.chunks.range(first..=last) {
            let base = *index as u64 * CHUNK_SIZE;
            for s in slices {
                let (s_start, s_end) = (base + s.pos as u64, base + s.end());
                let (a, b) = (s_start.max(off), s_end.min(end));
                if a < b {
                    s.buf.copy_to(
                        (a - s_start) as usize,
                        &mut buf[(a - off) as usize..(b - off) as usize],
                    );
                }
            }
        }
    }

    /// Uploads everything pending and commits it. On failure the data stays buffered.
    pub fn flush(&mut self, meta: &dyn Meta, store: &DataStore) -> Result<()> {
        if self.chunks.is_empty() {
            return Ok(());
        }
        let bs = store.block_size() as usize;
        self.pack(meta, store)?;
        // One block in all left to send (a small file's, a `tar -x`'s; blocks sent while
        // writing may still be going up): uploaded by this thread at the wait below.
        let to_send: usize = self
            .chunks
            .values()
            .flatten()
            .filter(|s| s.pack.is_none())
            .map(|s| s.buf.len().saturating_sub(s.frozen).div_ceil(bs))
            .sum();
        let own_packs = self.packs.iter().any(|p| matches!(p, Packed::Own(..)));
        let here = to_send == 1 && !own_packs;
        for slices in self.chunks.values_mut() {
            for s in slices.iter_mut().filter(|s| s.pack.is_none()) {
                let up = match &mut s.upload {
                    Some(u) => u,
                    None => s
                        .upload
                        .insert(SliceUpload::start(store, || meta.new_slice_id())?),
                };
                while s.frozen < s.buf.len() {
                    let n = (s.buf.len() - s.frozen).min(bs);
                    let (index, block) = ((s.frozen / bs) as u32, s.buf.send(s.frozen / bs));
                    match here {
                        true => up.put_block_at_wait(index, block),
                        false => up.put_block(index, block),
                    }
                    s.frozen += n;
                }
            }
        }
        for p in &mut self.packs {
            if let Packed::Own(up, _) = p {
                up.wait().map_err(Error::Data)?;
            }
        }
        let mut recs = Vec::new();
        for (index, slices) in self.chunks.iter_mut() {
            for s in slices.iter_mut() {
                let len = s.buf.len() as u32;
                if let Some((p, off)) = s.pack {
                    recs.push((*index, self.packs[p].rec(s.pos, off, len)));
                    continue;
                }
                let up = s
                    .upload
                    .as_mut()
                    .expect("every pending slice has an upload");
                up.wait().map_err(Error::Data)?;
                recs.push((
                    *index,
                    SliceRec {
                        pos: s.pos,
                        id: up.id(),
                        size: len,
                        off: 0,
                        len,
                    },
                ));
            }
        }
        let committed = meta.write_slices(self.ino, &recs, self.mtime);
        if let Err(e) = &committed {
            self.maybe_committed |= !matches!(e, crate::meta::Error::Sys(_));
        }
        self.committed = Some(committed?);
        if store.syncs_keys() {
            for slices in self.chunks.values() {
                for s in slices {
                    if let Some(up) = &s.upload {
                        self.unsynced.extend_from_slice(up.keys());
                    }
                }
            }
            for p in &self.packs {
                match p {
                    Packed::Own(up, _) => self.unsynced.extend_from_slice(up.keys()),
                    Packed::Shared(piece) => self.unsynced.push(piece.key.clone()),
                }
            }
        }
        self.packs.clear();
        self.chunks.clear();
        self.mtime = None;
        self.end = 0;
        self.bytes = 0;
        self.close_failed = false;
        self.maybe_committed = false;
        Ok(())
    }

    /// Drops everything pending (the file is gone) and deletes the blocks already uploaded.
    pub fn discard(&mut self, store: &DataStore) {
        let mut keys = Vec::new();
        for slices in self.chunks.values_mut() {
            for s in slices.iter_mut() {
                if let Some(up) = &mut s.upload {
                    keys.extend(up.cancel());
                }
            }
        }
        for p in &mut self.packs {
            // A piece of the shared pack is just not referenced: the pack goes when its last
            // piece does.
            if let Packed::Own(up, _) = p {
                keys.extend(up.cancel());
            }
        }
        self.packs.clear();
        if self.maybe_committed {
            // Perhaps referenced: left to gc, which deletes what nothing references.
            tracing::warn!(
                "inode {}: {} blocks of a write whose commit may have gone through are kept \
                 (gc deletes them if it did not)",
                self.ino,
                keys.len()
            );
            keys.clear();
        }
        for k in &keys {
            if let Err(e) = store.delete_block(k) {
                tracing::warn!("deleting {k} of a discarded write: {e}");
            }
        }
        self.chunks.clear();
        self.end = 0;
        self.bytes = 0;
    }

    /// Takes the keys uploaded since the last call (to fsync them).
    pub fn take_unsynced(&mut self) -> Vec<String> {
        std::mem::take(&mut self.unsynced)
    }

    /// Returns keys taken by [`FileWriter::take_unsynced`] whose sync failed.
    pub fn give_back_unsynced(&mut self, mut keys: Vec<String>) {
        keys.append(&mut self.unsynced);
        self.unsynced = keys;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::data::{Config, DataStore};
    use crate::meta::{Ctx, Format, Kind, ROOT_INO, slice};
    use crate::object::ObjectStorage;

    /// A volume with a 64 KiB block size on memory:// storage, and one empty file.
    fn setup() -> (tempfile::TempDir, Arc<dyn Meta>, DataStore, Ino) {
        let fmt = Format::for_tests("w", "memory://", 64 << 10);
        let (dir, meta) = crate::meta::sqlite::scratch(&fmt);
        let store = DataStore::new(
            ObjectStorage::open("memory://", false).unwrap(),
            fmt,
            Config::default(),
        )
        .unwrap();
        let f = meta
            .mknod(&Ctx::ROOT, ROOT_INO, b"f", Kind::File, 0o644, 0, None)
            .unwrap();
        (dir, meta, store, f.ino)
    }

    /// As `setup`, with write-back: blocks staged under the returned directory.
    fn staged_setup() -> (tempfile::TempDir, Arc<dyn Meta>, DataStore) {
        let (d, meta, store, _) = setup();
        let cache = d.path().join("cache");
        let cfg = Config {
            stage: Some(crate::data::StageConfig {
                dirs: vec![cache],
                limit: 1 << 30,
                wait: std::time::Duration::from_secs(5),
                blocks: true,
            }),
            ..Config::default()
        };
        let obj = ObjectStorage::open("memory://", false).unwrap();
        let store = DataStore::new(obj, store.format().clone(), cfg).unwrap();
        (d, meta, store)
    }

    fn committed(meta: &dyn Meta, store: &DataStore, ino: Ino) -> Vec<u8> {
        let len = meta.getattr(ino).unwrap().length as usize;
        let mut buf = vec![0u8; len];
        crate::vfs::reader::read_committed(meta, store, ino, 0, &mut buf, true).unwrap();
        buf
    }

    #[test]
    fn sequential_writes_make_one_slice() {
        let (_d, meta, store, ino) = setup();
        let mut w = FileWriter::new(ino);
        let data: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for part in data.chunks(4096) {
            let off = (part.as_ptr() as usize - data.as_ptr() as usize) as u64;
            w.write(&*meta, &store, off, part, 1).unwrap();
        }
        assert_eq!(w.pending_end(), Some(200_000));
        w.flush(&*meta, &store).unwrap();
        assert!(!w.is_dirty());
        let recs = meta.read_chunk(ino, 0).unwrap();
        assert_eq!(recs.len(), 1, "{recs:?}");
        assert_eq!(committed(&*meta, &store, ino), data);
        assert_eq!(meta.getattr(ino).unwrap().mtime, 1);
    }

    #[test]
    fn overwrites_join_the_unsent_tail_and_overlay_reads() {
        let (_d, meta, store, ino) = setup();
        let mut w = FileWriter::new(ino);
        w.write(&*meta, &store, 0, &[1u8; 1000], 1).unwrap();
        w.write(&*meta, &store, 500, &[2u8; 100], 2).unwrap(); // inside the unsent tail: joins
        w.write(&*meta, &store, 5000, &[3u8; 10], 3).unwrap(); // a gap: a new slice
        let mut buf = vec![0u8; 5010];
        w.overlay(0, &mut buf);
        assert_eq!(&buf[..500], &[1u8; 500][..]);
        assert_eq!(&buf[500..600], &[2u8; 100][..]);
        assert_eq!(&buf[600..1000], &[1u8; 400][..]);
        assert_eq!(&buf[1000..5000], &[0u8; 4000][..]);
        assert_eq!(&buf[5000..], &[3u8; 10][..]);
        w.flush(&*meta, &store).unwrap();
        assert_eq!(meta.read_chunk(ino, 0).unwrap().len(), 2);
        assert_eq!(committed(&*meta, &store, ino), buf);
    }

    #[test]
    fn a_write_under_a_newer_slice_starts_its_own() {
        let (_d, meta, store, ino) = setup();
        let mut w = FileWriter::new(ino);
        w.write(&*meta, &store, 0, &[1u8; 100], 1).unwrap();
        w.write(&*meta, &store, 50, &[2u8; 100], 2).unwrap(); // joins slice 1 (its tail)
        w.write(&*meta, &store, 200, &[3u8; 10], 3).unwrap(); // new slice B at 200
        // Overlaps B's range start? No: [100, 250) overlaps B, so it must not join slice 1.
        w.write(&*meta, &store, 100, &[4u8; 150], 4).unwrap();
        let mut want = vec![1u8; 50];
        want.extend([2u8; 50]);
        want.extend([4u8; 150]);
        let mut buf = vec![0u8; 250];
        w.overlay(0, &mut buf);
        assert_eq!(buf, want);
        w.flush(&*meta, &store).unwrap();
        assert_eq!(committed(&*meta, &store, ino), want);
    }

    #[test]
    fn full_blocks_upload_before_flush_and_freeze() {
        let (_d, meta, store, ino) = setup();
        let mut w = FileWriter::new(ino);
        let bs = 64 << 10;
        w.write(&*meta, &store, 0, &vec![7u8; bs + 10], 1).unwrap();
        // The first block is frozen: rewriting inside it starts a new slice.
        w.write(&*meta, &store, 10, &[8u8; 10], 2).unwrap();
        w.flush(&*meta, &store).unwrap();
        let view = slice::build_view(&meta.read_chunk(ino, 0).unwrap());
        assert_eq!(view.len(), 3, "{view:?}");
        let data = committed(&*meta, &store, ino);
        assert_eq!(&data[10..20], &[8u8; 10]);
        assert_eq!(data.len(), bs + 10);
        assert!(data[..10].iter().chain(&data[20..]).all(|b| *b == 7));
    }

    #[test]
    fn writes_across_chunk_boundaries_split() {
        let (_d, meta, store, ino) = setup();
        let mut w = FileWriter::new(ino);
        let off = CHUNK_SIZE - 100;
        w.write(&*meta, &store, off, &[9u8; 300], 1).unwrap();
        w.flush(&*meta, &store).unwrap();
        assert_eq!(meta.read_chunk(ino, 0).unwrap().len(), 1);
        assert_eq!(meta.read_chunk(ino, 1).unwrap().len(), 1);
        assert_eq!(meta.getattr(ino).unwrap().length, off + 300);
    }

    #[test]
    fn small_random_writes_go_up_as_one_object() {
        let (_d, meta, store, ino) = setup();
        let mut w = FileWriter::new(ino);
        let mut want = vec![0u8; 300_000];
        // Scattered 4 KiB writes, some overlapping earlier ones, and one write large enough
        // to upload its own block (it stays a slice of its own, between the packed ones).
        let offs = [200_000u64, 8_192, 100_000, 10_000, 250_000, 9_000, 150_000];
        for (i, off) in offs.iter().enumerate() {
            let data = vec![i as u8 + 1; 4096];
            w.write(&*meta, &store, *off, &data, 1).unwrap();
            want[*off as usize..*off as usize + 4096].copy_from_slice(&data);
            if i == 3 {
                let big = vec![42u8; 70_000];
                w.write(&*meta, &store, 20_000, &big, 1).unwrap();
                want[20_000..90_000].copy_from_slice(&big);
            }
        }
        w.flush(&*meta, &store).unwrap();
        let recs = meta.read_chunk(ino, 0).unwrap();
        // 8,192, 10,000 and 9,000 join in one pending slice; the others stay apart.
        assert_eq!(recs.len(), 6, "{recs:?}");
        let ids: std::collections::BTreeSet<u64> = recs.iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), 2, "the small writes share one slice: {recs:?}");
        // The big slice's two blocks, and the small writes' five pending slices in one object.
        let objects = store.block_on(store.storage().list("w")).unwrap();
        assert_eq!(objects.len(), 3, "{objects:?}");
        want.truncate(254_096);
        assert_eq!(committed(&*meta, &store, ino), want);
    }

    /// A file written in order whose writes reach the writer out of order (the kernel's
    /// writeback cache sends 1 MiB pieces in parallel; here 16 KiB pieces of 64 KiB blocks,
    /// the first piece of the file last, every pair swapped, and runs reversed) still makes
    /// whole blocks: one slice, one object per block, and full blocks go up before the flush.
    #[test]
    fn out_of_order_writes_of_one_run_make_whole_blocks() {
        let (_d, meta, store, ino) = setup();
        let bs = 64 << 10;
        let piece = 16 << 10;
        let data: Vec<u8> = (0..5 * bs as u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect();
        let n = data.len() / piece;
        // 1, 0 swapped... then runs of three reversed, and piece 0 at the very end.
        let mut order: Vec<usize> = (1..n).collect();
        for run in order.chunks_mut(3) {
            run.reverse();
        }
        for pair in order.chunks_mut(2) {
            pair.reverse();
        }
        order.push(0);
        let objects = || store.block_on(store.storage().list("w")).unwrap().len();
        let wait_objects = |n: usize| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while objects() < n {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{} of {n} up",
                    objects()
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        let mut w = FileWriter::new(ino);
        for p in &order {
            let off = p * piece;
            w.write(&*meta, &store, off as u64, &data[off..off + piece], 1)
                .unwrap();
        }
        // Every block is full once the first piece closed the last gap: all go up before any
        // flush, and the flush sends nothing more.
        wait_objects(5);
        w.flush(&*meta, &store).unwrap();
        let all = store.block_on(store.storage().list("w")).unwrap();
        assert_eq!(all.len(), 5, "{all:?}");
        assert_eq!(committed(&*meta, &store, ino), data);

        // A slice off the grid whose gap never fills holds its blocks while it is short, and
        // uploads them once it is long.
        let mut w = FileWriter::new(ino);
        let (start, mib) = (100, 1 << 20);
        let n = HOLD_BYTES / mib + 1;
        for i in 0..n {
            let at = (start + i * mib) as u64;
            w.write(&*meta, &store, at, &vec![5u8; mib], 2).unwrap();
            if i + 2 == n {
                assert_eq!(objects(), 5, "held while short");
            }
        }
        wait_objects(6);
        w.flush(&*meta, &store).unwrap();
        let got = committed(&*meta, &store, ino);
        assert_eq!(&got[..start], &data[..start]);
        assert!(got[start..].iter().all(|b| *b == 5));
        assert_eq!(got.len(), start + n * mib);
    }

    /// A write between two slices merges them only where no slice between them in age
    /// overlaps: newer bytes still win.
    #[test]
    fn merges_keep_newer_bytes_on_top() {
        let (_d, meta, store, ino) = setup();
        let mut w = FileWriter::new(ino);
        w.write(&*meta, &store, 0, &[1u8; 100], 1).unwrap(); // A [0, 100)
        w.write(&*meta, &store, 200, &[2u8; 100], 1).unwrap(); // B [200, 300)
        w.write(&*meta, &store, 250, &[3u8; 10], 1).unwrap(); // joins B
        w.write(&*meta, &store, 150, &[4u8; 200], 1).unwrap(); // C [150, 350) over B
        w.write(&*meta, &store, 100, &[5u8; 100], 1).unwrap(); // joins A, meets B under C
        let mut want = vec![1u8; 100];
        want.extend([5u8; 100]);
        want.extend([4u8; 150]);
        let mut buf = vec![0u8; 350];
        w.overlay(0, &mut buf);
        assert_eq!(buf, want);
        w.flush(&*meta, &store).unwrap();
        assert_eq!(committed(&*meta, &store, ino), want);
    }

    #[test]
    fn discard_deletes_uploaded_blocks() {
        let (_d, meta, store, ino) = setup();
        let mut w = FileWriter::new(ino);
        w.write(&*meta, &store, 0, &vec![1u8; 3 * (64 << 10)], 1)
            .unwrap();
        w.discard(&store);
        assert!(!w.is_dirty());
        let left = store.block_on(store.storage().list("w")).unwrap();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(meta.getattr(ino).unwrap().length, 0);
    }

    /// With write-back, small files' bytes go into one shared pack (one object for many
    /// files), and read back before and after it goes up.
    #[test]
    fn small_files_share_one_pack_with_write_back() {
        let (_d, meta, store) = staged_setup();
        let mut files = Vec::new();
        for i in 0..20u8 {
            let name = format!("s{i}");
            let f = meta
                .mknod(
                    &Ctx::ROOT,
                    ROOT_INO,
                    name.as_bytes(),
                    Kind::File,
                    0o644,
                    0,
                    None,
                )
                .unwrap();
            let mut w = FileWriter::new(f.ino);
            let data = vec![i + 1; 1000 + i as usize];
            w.write(&*meta, &store, 0, &data, 1).unwrap();
            w.flush(&*meta, &store).unwrap();
            files.push((f.ino, data));
        }
        let ids: std::collections::BTreeSet<u64> = files
            .iter()
            .flat_map(|(ino, _)| meta.read_chunk(*ino, 0).unwrap())
            .map(|r| r.id)
            .collect();
        // One pack, unless the machine stalled long enough for it to be sealed as quiet.
        assert!(ids.len() <= 3, "{ids:?}");
        for (ino, data) in &files {
            assert_eq!(&committed(&*meta, &store, *ino), data);
        }
        store.drain(|_, _| {});
        let objects = store.list_blocks().unwrap();
        assert_eq!(objects.len(), ids.len(), "{objects:?}");
        for (ino, data) in &files {
            assert_eq!(&committed(&*meta, &store, *ino), data);
        }
    }

    /// A pack whose files all went while a piece of it is still to be committed is dead for
    /// the metadata, but garbage leaves it; the commit brings it back to life, its bytes
    /// intact; once no piece is pending, it dies and goes like any slice.
    #[test]
    fn garbage_leaves_a_pack_with_pieces_still_to_commit() {
        let (_d, meta, store) = staged_setup();
        let mk = |name: &[u8]| {
            meta.mknod(&Ctx::ROOT, ROOT_INO, name, Kind::File, 0o644, 0, None)
                .unwrap()
                .ino
        };
        let (f1, f2) = (mk(b"f1"), mk(b"f2"));
        let piece = store
            .pack(b"0123456789", || meta.new_slice_id())
            .unwrap()
            .unwrap();
        let rec = |len| {
            vec![(
                0,
                SliceRec {
                    pos: 0,
                    id: piece.id,
                    size: piece.size,
                    off: piece.off,
                    len,
                },
            )]
        };
        meta.write_slices(f1, &rec(5), Some(1)).unwrap();
        meta.unlink(&Ctx::ROOT, ROOT_INO, b"f1").unwrap();
        let dead = |m: &dyn Meta| -> Vec<u64> {
            m.dead_slices(100).unwrap().iter().map(|d| d.id).collect()
        };
        assert_eq!(dead(&*meta), vec![piece.id]);
        assert_eq!(crate::garbage::reclaim_all(&*meta, &store).unwrap(), 0);
        assert_eq!(
            dead(&*meta),
            vec![piece.id],
            "left for later, not forgotten"
        );
        meta.write_slices(f2, &rec(10), Some(1)).unwrap();
        assert!(dead(&*meta).is_empty(), "alive again");
        drop(piece);
        assert_eq!(crate::garbage::reclaim_all(&*meta, &store).unwrap(), 0);
        store.drain(|_, _| {});
        assert_eq!(committed(&*meta, &store, f2), b"0123456789");
        assert_eq!(store.list_blocks().unwrap().len(), 1);
        meta.unlink(&Ctx::ROOT, ROOT_INO, b"f2").unwrap();
        assert_eq!(crate::garbage::reclaim_all(&*meta, &store).unwrap(), 1);
        assert!(store.list_blocks().unwrap().is_empty());
    }

    /// A slice's bytes, written in pieces of every size across block boundaries (appends,
    /// overwrites of the open block, a gap), read back whole and in ranges, before and after
    /// blocks are handed over, match a plain buffer written the same way.
    #[test]
    fn slice_bytes_match_a_plain_buffer() {
        let bs = 64;
        let mut sb = SliceBytes::new(bs);
        let mut plain: Vec<u8> = Vec::new();
        let put = |sb: &mut SliceBytes, plain: &mut Vec<u8>, at: usize, len: usize, v: u8| {
            let data: Vec<u8> = (0..len).map(|i| v.wrapping_add(i as u8)).collect();
            sb.write(at, &data);
            if plain.len() < at + len {
                plain.resize(at + len, 0);
            }
            plain[at..at + len].copy_from_slice(&data);
        };
        put(&mut sb, &mut plain, 0, 5, 1);
        put(&mut sb, &mut plain, 5, 100, 2);
        put(&mut sb, &mut plain, 70, 10, 3);
        put(&mut sb, &mut plain, 105, 300, 4);
        let first = sb.send(0);
        assert_eq!(&first[..], &plain[..bs]);
        put(&mut sb, &mut plain, 200, 9, 5);
        put(&mut sb, &mut plain, 420, 7, 6);
        assert_eq!(sb.len(), plain.len());
        let mut all = Vec::new();
        sb.append_to(&mut all);
        assert_eq!(all, plain);
        for (from, len) in [(0, 1), (60, 10), (63, 130), (100, 327), (426, 1)] {
            let mut out = vec![0u8; len];
            sb.copy_to(from, &mut out);
            assert_eq!(out, plain[from..from + len], "range {from}+{len}");
        }
        let last = plain.len() / bs;
        assert_eq!(&sb.send(last)[..], &plain[last * bs..]);
        assert_eq!(
            &first[..],
            &plain[..bs],
            "a block handed over does not change"
        );
    }
}
