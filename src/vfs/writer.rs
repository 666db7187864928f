//! Buffered writes of one file, turned into slices.
//!
//! Writes are gathered per chunk into pending slices (a slice is one continuous run of bytes
//! inside one chunk). A write that continues or overwrites the unsent tail of a recent slice
//! joins it (when no newer slice overlaps); otherwise it starts a new slice. Every block that
//! fills up is uploaded at once in the background; `flush` uploads the rest, waits, and commits
//! all pending slices to the metadata in one transaction. Until then `overlay` lets reads see
//! the pending bytes, which are newer than anything committed.
//!
//! Not for: reading committed data, or deciding when to flush (that is `vfs`).

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::data::{DataStore, SliceUpload};
use crate::meta::{CHUNK_SIZE, Ino, Meta, Nanos, SliceRec};

use super::{Error, Result};

/// How many recent slices of a chunk a write may join.
const JOIN_WINDOW: usize = 4;

struct Pending {
    /// Position in the chunk.
    pos: u32,
    buf: Vec<u8>,
    /// Bytes `[0, frozen)` are uploaded or uploading: they may no longer change.
    frozen: usize,
    upload: Option<SliceUpload>,
}

impl Pending {
    fn end(&self) -> u64 {
        self.pos as u64 + self.buf.len() as u64
    }
}

pub struct FileWriter {
    ino: Ino,
    chunks: BTreeMap<u32, Vec<Pending>>,
    /// Modification time of the latest write.
    mtime: Nanos,
    /// End of the furthest pending byte (0 if none).
    end: u64,
    /// Bytes buffered.
    bytes: usize,
    /// Keys uploaded since the last fsync (to make durable on fsync, for local buckets).
    unsynced: Vec<String>,
}

impl FileWriter {
    pub fn new(ino: Ino) -> FileWriter {
        FileWriter {
            ino,
            chunks: BTreeMap::new(),
            mtime: 0,
            end: 0,
            bytes: 0,
            unsynced: Vec::new(),
        }
    }

    pub fn is_dirty(&self) -> bool {
        !self.chunks.is_empty()
    }

    /// End of the pending data, if any.
    pub fn pending_end(&self) -> Option<u64> {
        self.is_dirty().then_some(self.end)
    }

    pub fn mtime(&self) -> Option<Nanos> {
        self.is_dirty().then_some(self.mtime)
    }

    pub fn buffered(&self) -> usize {
        self.bytes
    }

    /// Buffers `data` at `off`. Returns the growth of the buffer in bytes.
    pub fn write(
        &mut self,
        meta: &dyn Meta,
        store: &DataStore,
        off: u64,
        data: &[u8],
        now: Nanos,
    ) -> Result<usize> {
        let before = self.bytes;
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
        self.mtime = now;
        Ok(self.bytes - before)
    }

    fn write_chunk(
        &mut self,
        meta: &dyn Meta,
        store: &DataStore,
        index: u32,
        pos: u32,
        data: &[u8],
    ) -> Result<()> {
        let slices = self.chunks.entry(index).or_default();
        let (start, end) = (pos as u64, pos as u64 + data.len() as u64);
        let mut target = None;
        for k in (slices.len().saturating_sub(JOIN_WINDOW)..slices.len()).rev() {
            let s = &slices[k];
            let open_from = s.pos as u64 + s.frozen as u64;
            if start >= open_from
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
                    buf: Vec::new(),
                    frozen: 0,
                    upload: None,
                });
                slices.len() - 1
            }
        };
        let s = &mut slices[k];
        let rel = (start - s.pos as u64) as usize;
        if rel + data.len() > s.buf.len() {
            self.bytes += rel + data.len() - s.buf.len();
            s.buf.resize(rel + data.len(), 0);
        }
        s.buf[rel..rel + data.len()].copy_from_slice(data);
        // A block that failed to upload fails the writes that follow, not only the close.
        if let Some(up) = &mut s.upload {
            up.poll().map_err(Error::Data)?;
        }
        // Upload every block that is now complete.
        let bs = store.block_size() as usize;
        while s.buf.len() - s.frozen >= bs {
            let up = match &mut s.upload {
                Some(u) => u,
                None => s
                    .upload
                    .insert(SliceUpload::new(store, meta.new_slice_id()?)),
            };
            let block = Bytes::copy_from_slice(&s.buf[s.frozen..s.frozen + bs]);
            up.put_block((s.frozen / bs) as u32, block);
            s.frozen += bs;
        }
        Ok(())
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
                    buf[(a - off) as usize..(b - off) as usize]
                        .copy_from_slice(&s.buf[(a - s_start) as usize..(b - s_start) as usize]);
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
        for slices in self.chunks.values_mut() {
            for s in slices.iter_mut() {
                let up = match &mut s.upload {
                    Some(u) => u,
                    None => s
                        .upload
                        .insert(SliceUpload::new(store, meta.new_slice_id()?)),
                };
                while s.frozen < s.buf.len() {
                    let n = (s.buf.len() - s.frozen).min(bs);
                    up.put_block(
                        (s.frozen / bs) as u32,
                        Bytes::copy_from_slice(&s.buf[s.frozen..s.frozen + n]),
                    );
                    s.frozen += n;
                }
            }
        }
        let mut recs = Vec::new();
        for (index, slices) in self.chunks.iter_mut() {
            for s in slices.iter_mut() {
                let up = s
                    .upload
                    .as_mut()
                    .expect("every pending slice has an upload");
                up.wait().map_err(Error::Data)?;
                let len = s.buf.len() as u32;
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
        meta.write_slices(self.ino, &recs, self.mtime)?;
        if store.storage().local_root().is_some() {
            for slices in self.chunks.values() {
                for s in slices {
                    if let Some(up) = &s.upload {
                        self.unsynced.extend_from_slice(up.keys());
                    }
                }
            }
        }
        self.chunks.clear();
        self.end = 0;
        self.bytes = 0;
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
        for k in &keys {
            if let Err(e) = store.block_on(store.storage().delete(k)) {
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
}
