//! Small files packed together (write-back only): the small pending bytes of many files are
//! appended to one staged slice, a *pack*, which goes up as one object once it is full or
//! quiet; each file commits a record pointing at its piece (`SliceRec::off`, `len`), so
//! extracting N small files costs far fewer than N PUTs.
//!
//! A pack is one block whose size is declared when it opens (its key names that size, and
//! records name it before it is full): it starts small after a quiet spell (64 KiB) and
//! doubles while packs fill, up to a block, which bounds the zeros a pack sealed early
//! carries. Its bytes are appended to a raw staged entry (`data::stage`): a piece is on local
//! disk before its file's commit, as any staged block is, and a mount that adopts a dead
//! mount's stage uploads the raw entry as it stands. Sealing queues it for upload
//! (`data::writeback` pads and encodes it).
//!
//! A pack stays *live* while it is open and while a piece of it is not yet committed (its
//! [`PackPiece`] alive): its last reference may go meanwhile (the files holding pieces
//! deleted), and a later commit gives it one again, so garbage must not reclaim a live pack
//! (`garbage::reclaim` asks [`DataStore::with_live_packs`]), and its id stays in flight.
//!
//! Not for: deciding which writes are small (that is `vfs::writer`), or uploading (that is
//! `data::writeback`).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{DataStore, Shared};

/// Declared size of the first pack after a quiet spell.
const FIRST_SIZE: u32 = 64 << 10;
/// A pack with no append for this long is sealed.
pub(crate) const QUIET: Duration = Duration::from_secs(1);

/// The largest piece packed, for a block size: larger writes keep slices of their own (and a
/// piece that does not fit leaves at most this much of a pack unused).
pub fn max_piece(block_size: u32) -> usize {
    (block_size / 8).max(FIRST_SIZE).min(block_size) as usize
}

/// The open pack and the live ones.
#[derive(Default)]
pub(crate) struct Packer {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    open: Option<Open>,
    /// Live packs: id -> pieces alive, plus one while open.
    live: HashMap<u64, usize>,
    /// Declared size of the next pack (0: the first size).
    next_size: u32,
}

impl State {
    /// One reason less for pack `id` to be live (a piece committed, or the pack sealed).
    fn unpin(&mut self, id: u64) {
        if let Some(n) = self.live.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                self.live.remove(&id);
            }
        }
    }
}

struct Open {
    id: u64,
    size: u32,
    used: u32,
    key: String,
    file: File,
    last: Instant,
}

/// Why a pack is sealed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seal {
    /// Full, or too full for the next piece: the next one is larger.
    Full,
    /// Quiet, or the mount is draining: the next one starts small.
    Quiet,
}

/// A piece of a pack: bytes `[off, off + len)` of slice `id` (of `size` bytes, one block
/// stored under `key`). Keep it until the record naming it is committed (or abandoned): the
/// pack stays live and in flight until then.
pub struct PackPiece {
    shared: Arc<Shared>,
    pub id: u64,
    pub size: u32,
    pub off: u32,
    pub key: String,
}

impl Drop for PackPiece {
    fn drop(&mut self) {
        if let Some(p) = &self.shared.packer {
            p.unpin(self.id);
        }
        self.shared.release(self.id);
    }
}

impl Packer {
    fn unpin(&self, id: u64) {
        self.state.lock().unpin(id);
    }

    /// Closes the open pack to appends and queues it for upload.
    fn seal(&self, shared: &Shared, st: &mut State, why: Seal) {
        let Some(o) = st.open.take() else {
            return;
        };
        let bs = shared.format.block_size;
        st.next_size = match why {
            Seal::Full => o.size.saturating_mul(2).min(bs),
            Seal::Quiet => 0,
        };
        st.unpin(o.id);
        drop(o.file);
        if let Some(up) = &shared.uploader {
            up.enqueue(o.key);
        }
    }

    /// Seals the open pack if it has had no append for `quiet` (all of it: `Duration::ZERO`).
    pub(crate) fn seal_quiet(&self, shared: &Shared, quiet: Duration) {
        let mut st = self.state.lock();
        if st.open.as_ref().is_some_and(|o| o.last.elapsed() >= quiet) {
            self.seal(shared, &mut st, Seal::Quiet);
        }
    }
}

impl DataStore {
    /// Appends `data` (small pending bytes of one file) to the mount's open pack, opening one
    /// (its id taken by `alloc`) if needed; returns the piece once its bytes are on local disk.
    /// `None`: no packing here (write-through, too large, or the stage refused: a warning
    /// says why), and the caller stores the bytes as a slice of their own.
    pub fn pack<E>(
        &self,
        data: &[u8],
        alloc: impl FnOnce() -> std::result::Result<u64, E>,
    ) -> std::result::Result<Option<PackPiece>, E> {
        let shared = &self.shared;
        let (Some(stage), Some(packer)) = (&shared.stage, &shared.packer) else {
            return Ok(None);
        };
        let bs = shared.format.block_size;
        let len = data.len() as u32;
        if data.is_empty() || data.len() > max_piece(bs) {
            return Ok(None);
        }
        let mut st = packer.state.lock();
        if st.open.as_ref().is_some_and(|o| o.used + len > o.size) {
            packer.seal(shared, &mut st, Seal::Full);
        }
        if st.open.is_none() {
            let size = match st.next_size {
                0 => FIRST_SIZE,
                n => n,
            }
            .max(len.next_power_of_two())
            .min(bs);
            // Taken under the lock of what is in flight, as `SliceUpload::start` does; this
            // count is the staged entry's, ended by its upload (or its removal).
            let id = {
                let mut live = shared.in_flight.lock();
                let id = alloc()?;
                *live.entry(id).or_default() += 1;
                id
            };
            let key = shared.layout.block_key(id, 0, size);
            match stage.open_raw(&key, id, size as u64, shared.stage_wait) {
                Ok(file) => {
                    st.live.insert(id, 1);
                    st.open = Some(Open {
                        id,
                        size,
                        used: 0,
                        key,
                        file,
                        last: Instant::now(),
                    });
                }
                Err(e) => {
                    shared.release(id);
                    tracing::warn!("{e}: small files go up one by one meanwhile");
                    return Ok(None);
                }
            }
        }
        let o = st.open.as_mut().expect("a pack is open");
        if let Err(e) = o.file.write_all_at(data, o.used as u64) {
            tracing::warn!("appending to the pack staged as {}: {e}; sealing it", o.key);
            packer.seal(shared, &mut st, Seal::Quiet);
            return Ok(None);
        }
        let piece = PackPiece {
            shared: shared.clone(),
            id: o.id,
            size: o.size,
            off: o.used,
            key: o.key.clone(),
        };
        o.used += len;
        o.last = Instant::now();
        let full = o.used == o.size;
        *st.live.entry(piece.id).or_default() += 1;
        shared.hold(piece.id);
        if full {
            packer.seal(shared, &mut st, Seal::Full);
        }
        Ok(Some(piece))
    }

    /// Runs `f` with the ids of the packs live (open, or with pieces not yet committed),
    /// while none may open or gain a piece: garbage reads the dead slices inside, and leaves
    /// these alone even when they have no reference (see the module's doc).
    pub fn with_live_packs<T>(&self, f: impl FnOnce(HashSet<u64>) -> T) -> T {
        match &self.shared.packer {
            Some(p) => {
                let st = p.state.lock();
                f(st.live.keys().copied().collect())
            }
            None => f(HashSet::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::data::{Config, DataStore, SliceRange, StageConfig};
    use crate::object::ObjectStorage;

    /// A store with blocks of `block_size` in `bucket`, staging under `cache`.
    fn store(bucket: &std::path::Path, cache: &std::path::Path, block_size: u32) -> DataStore {
        let mut fmt = crate::data::tests::store(block_size).format().clone();
        fmt.storage = format!("file://{}", bucket.display());
        let cfg = Config {
            cache_bytes: 1 << 20,
            stage: Some(StageConfig {
                dirs: vec![cache.to_path_buf()],
                limit: 1 << 30,
                wait: Duration::from_secs(5),
                blocks: true,
            }),
            ..Config::default()
        };
        let obj = ObjectStorage::open(&fmt.storage, true).unwrap();
        DataStore::new(obj, fmt, cfg).unwrap()
    }

    fn read(ds: &DataStore, id: u64, size: u32, start: u32, len: u32) -> Vec<u8> {
        let mut buf = vec![0u8; len as usize];
        let r = SliceRange {
            id,
            size,
            start,
            len,
        };
        ds.read(&mut [(r, &mut buf[..])], false).unwrap();
        buf
    }

    /// Pieces share one pack until it is full; they read back from the stage while it fills,
    /// from a raw entry a killed mount left (adopted and uploaded, checksums and all), and
    /// from the bucket.
    #[test]
    fn pieces_share_a_pack_that_outlives_a_killed_mount() {
        let (bucket, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ds = store(bucket.path(), cache.path(), 64 << 10);
        let mut ids = 100..;
        let mut alloc = || Ok::<_, ()>(ids.next().unwrap());
        let mut pieces = Vec::new();
        for i in 0..30u8 {
            let data = vec![i + 1; 2000];
            pieces.push((ds.pack(&data, &mut alloc).unwrap().unwrap(), data));
        }
        // 64 KiB hold 32 pieces of 2,000 bytes: one pack, pieces end to end.
        assert!(
            pieces
                .iter()
                .all(|(p, _)| p.id == 100 && p.size == 64 << 10)
        );
        let offs: Vec<u32> = pieces.iter().map(|(p, _)| p.off).collect();
        assert_eq!(offs, (0..30).map(|i| i * 2000).collect::<Vec<_>>());
        for (p, data) in &pieces {
            assert_eq!(&read(&ds, p.id, p.size, p.off, 2000), data);
        }
        ds.sync(&[pieces[0].0.key.clone()]).unwrap();
        let want: Vec<(u32, Vec<u8>)> = pieces.iter().map(|(p, d)| (p.off, d.clone())).collect();
        // Killed: nothing sealed, nothing uploaded.
        drop(pieces);
        drop(ds);
        let ds = store(bucket.path(), cache.path(), 64 << 10);
        ds.drain(|_, _| {});
        let listed = ds.list_blocks().unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(
            listed[0].key.ends_with(&format!("100_0_{}", 64 << 10)),
            "{listed:?}"
        );
        drop(ds);
        let ds = store(bucket.path(), cache.path(), 64 << 10);
        for (off, data) in &want {
            assert_eq!(&read(&ds, 100, 64 << 10, *off, 2000), data);
        }
    }

    /// A pack still open is read for the piece asked and never handed out whole: its bytes
    /// past the last piece are zeros that later pieces replace, and a fetch ahead of it
    /// shared with later readers gave them those zeros (fsx read zeros for small writes, and
    /// compaction stored them).
    #[test]
    fn an_open_pack_is_never_shared_whole() {
        let (bucket, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ds = store(bucket.path(), cache.path(), 64 << 10);
        let mut ids = 100..;
        let mut alloc = || Ok::<_, ()>(ids.next().unwrap());
        let a = ds.pack(&[1u8; 2000], &mut alloc).unwrap().unwrap();
        let blen = a.size as usize;
        let (whole, settled) = ds
            .rt
            .block_on(super::super::fetch_uncached(
                &ds.shared,
                &a.key,
                blen,
                0..blen,
                true,
            ))
            .unwrap();
        assert!(!settled, "an open pack read whole must not be shared");
        assert_eq!(&whole[..2000], &[1u8; 2000][..]);
        assert!(whole[2000..].iter().all(|b| *b == 0));
        // What a fetch ahead of it would have shared is not what is there now.
        let b = ds.pack(&[2u8; 2000], &mut alloc).unwrap().unwrap();
        assert_eq!((b.id, b.off), (a.id, 2000));
        ds.fetch_ahead(&[crate::data::SliceRange {
            id: a.id,
            size: a.size,
            start: 0,
            len: 4000,
        }]);
        assert_eq!(read(&ds, b.id, b.size, b.off, 2000), vec![2u8; 2000]);
    }

    /// A pack that gets too full for the next piece is sealed and the next one is larger; a
    /// quiet one is sealed and the next one starts small again. Large writes are not packed.
    #[test]
    fn packs_grow_while_they_fill_and_shrink_when_quiet() {
        let (bucket, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ds = store(bucket.path(), cache.path(), 1 << 20);
        let mut ids = 1..;
        let mut alloc = || Ok::<_, ()>(ids.next().unwrap());
        let mut piece = |n: usize, b: u8| ds.pack(&vec![b; n], &mut alloc).unwrap();
        let a = piece(40_000, 1).unwrap();
        let b = piece(40_000, 2).unwrap();
        let c = piece(70_000, 3).unwrap();
        let got: Vec<(u64, u32, u32)> =
            [&a, &b, &c].iter().map(|p| (p.id, p.size, p.off)).collect();
        assert_eq!(
            got,
            vec![(1, 64 << 10, 0), (2, 128 << 10, 0), (2, 128 << 10, 40_000)]
        );
        assert!(
            piece(200_000, 4).is_none(),
            "larger than an eighth of a block"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while ds.list_blocks().unwrap().len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "a quiet pack was not sealed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let d = piece(1000, 5).unwrap();
        assert_eq!((d.id, d.size), (3, 64 << 10));
        drop((a, b, c, d));
        ds.drain(|_, _| {});
        assert_eq!(ds.list_blocks().unwrap().len(), 3);
        assert_eq!(read(&ds, 2, 128 << 10, 40_000, 70_000), vec![3; 70_000]);
    }
}
