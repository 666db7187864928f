//! A volume's garbage, one way for everyone: deleting the objects of dead slices (reclaim),
//! the slice table that says which slices are live or dying, the slice ids live sessions
//! reserved (their uploads may still be committed: in flight, not garbage), and which objects
//! in the bucket no slice references and no live session may still commit (leaked).
//!
//! Used by a mount's background work (`vfs::background`) and by `admin` (`fsck`, `gc`), so
//! that both reclaim and tell garbage from data the same way. Sits below both, above `meta`
//! and `data`.
//!
//! Not for: deciding when to reclaim or whether to delete leaked objects (the callers do), or
//! checking that referenced objects are present (that is `admin::fsck`).

use std::collections::HashMap;

use crate::data::layout::{self, Layout};
use crate::data::{self, DataStore};
use crate::meta::{self, Format, Meta};
use crate::object::ObjectInfo;

/// Errors of reclaiming.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Meta(#[from] meta::Error),
    #[error(transparent)]
    Data(#[from] data::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Dead slices reclaimed per round.
const RECLAIM_BATCH: usize = 1000;

/// Deletes the objects of up to `limit` dead slices and forgets them; returns how many slices
/// were reclaimed. A slice whose objects cannot be deleted is logged and left for later.
///
/// A dead slice may yet be referenced again if it is a pack (`data::pack`) whose pieces are
/// still being committed: such a slice is left for later. This client's own live packs are
/// read with the queue, while no pack may open or gain a piece; the ids other live sessions
/// reserved (read first: a pack of theirs no longer reserved has had its last commit) are
/// theirs to reclaim, or anyone's once they give them back.
pub fn reclaim(meta: &dyn Meta, store: &DataStore, limit: usize) -> Result<usize> {
    reclaim_some(meta, store, limit, false).map(|(n, _)| n)
}

/// As [`reclaim`], but of slices still in their trash period too, those dead longest first
/// (a disk short of room: `vfs::background`); returns how many slices were reclaimed, and
/// their bytes.
pub fn reclaim_early(meta: &dyn Meta, store: &DataStore, limit: usize) -> Result<(usize, u64)> {
    reclaim_some(meta, store, limit, true)
}

fn reclaim_some(
    meta: &dyn Meta,
    store: &DataStore,
    limit: usize,
    early: bool,
) -> Result<(usize, u64)> {
    let others = Reserved::load_except(meta, meta.session_id())?;
    let dead_slices = |limit| match early {
        true => meta.dead_slices_early(limit),
        false => meta.dead_slices(limit),
    };
    let (dead, live) = store.with_live_packs(|live| dead_slices(limit).map(|d| (d, live)))?;
    let mut bytes = 0;
    let mut done = Vec::with_capacity(dead.len());
    for d in &dead {
        if live.contains(&d.id) || others.contains(d.id) {
            continue;
        }
        match store.delete_slice(d.id, d.size) {
            Ok(()) => {
                done.push(d.id);
                bytes += d.size as u64;
            }
            Err(e) => tracing::warn!("deleting objects of slice {}: {e}", d.id),
        }
    }
    meta.forget_dead_slices(&done)?;
    Ok((done.len(), bytes))
}

/// Reclaims dead slices in rounds until a round finds fewer than a full batch; returns how
/// many slices were reclaimed. Stops at the first error.
pub fn reclaim_all(meta: &dyn Meta, store: &DataStore) -> Result<usize> {
    let mut total = 0;
    loop {
        let n = reclaim(meta, store, RECLAIM_BATCH)?;
        total += n;
        // A batch with slices left for later is not worth reading again at once.
        if n < RECLAIM_BATCH {
            return Ok(total);
        }
    }
}

/// The volume's slice table: live slices (referenced by chunks) and dead ones (queued for
/// deletion).
#[derive(Clone, Debug, Default)]
pub struct SliceTable {
    /// Live slices: id -> (size, references).
    pub live: HashMap<u64, (u32, u32)>,
    /// Dead slices: id -> size.
    pub dead: HashMap<u64, u32>,
}

impl SliceTable {
    /// Reads the whole table (live slices first, then dead ones).
    pub fn load(meta: &dyn Meta) -> meta::Result<SliceTable> {
        let live = meta
            .all_slices()?
            .into_iter()
            .map(|(id, size, refs)| (id, (size, refs)))
            .collect();
        let dead = meta
            .all_dead_slices()?
            .into_iter()
            .map(|d| (d.id, d.size))
            .collect();
        Ok(SliceTable { live, dead })
    }
}

/// The slice ids live sessions reserved (see [`Meta::reserved_slices`]): an object of such
/// an id may be an upload about to be committed.
#[derive(Clone, Debug, Default)]
pub struct Reserved {
    /// Ranges `lo..hi`, sorted by `lo`.
    ranges: Vec<(u64, u64)>,
}

impl Reserved {
    /// Reads the reserved ranges of live sessions. Read it after listing the objects and
    /// before the slice table: an upload listed was reserved before it was put, and stays
    /// reserved until after its commit, so it is either still reserved here or committed
    /// (and in the slice table read next).
    pub fn load(meta: &dyn Meta) -> meta::Result<Reserved> {
        Self::load_except(meta, 0)
    }

    /// The reserved ranges of live sessions other than `session`.
    pub fn load_except(meta: &dyn Meta, session: u64) -> meta::Result<Reserved> {
        let mut ranges: Vec<(u64, u64)> = meta
            .reserved_slices()?
            .into_iter()
            .filter(|(s, _, _)| *s != session || session == 0)
            .map(|(_, lo, hi)| (lo, hi))
            .collect();
        ranges.sort_unstable();
        Ok(Reserved { ranges })
    }

    /// Whether slice id `id` is reserved by a live session.
    pub fn contains(&self, id: u64) -> bool {
        // Ranges never overlap (each is cut from its own batch of the counter).
        let i = self.ranges.partition_point(|(lo, _)| *lo <= id);
        i > 0 && id < self.ranges[i - 1].1
    }

    /// Splits objects no slice references into those of reserved ids (in flight: a live
    /// session may still commit them) and the rest (leaked).
    pub fn split(&self, unreferenced: Vec<ObjectInfo>) -> (Vec<ObjectInfo>, Vec<ObjectInfo>) {
        unreferenced.into_iter().partition(|o| {
            layout::parse_block_key(&o.key).is_some_and(|(id, _, _)| self.contains(id))
        })
    }
}

/// Objects under the chunks prefix that belong to no live or dying slice (whether a live
/// session may still commit them is [`Reserved::split`]'s). `live`: id -> (size, references);
/// `dead`: id -> size.
pub fn leaked_objects(
    fmt: &Format,
    listed: &[ObjectInfo],
    live: &HashMap<u64, (u32, u32)>,
    dead: &HashMap<u64, u32>,
) -> Vec<ObjectInfo> {
    let layout = Layout::new(fmt);
    listed
        .iter()
        .filter(|o| {
            let Some((id, index, len)) = layout::parse_block_key(&o.key) else {
                return !o.key.rsplit('/').next().unwrap_or("").starts_with('.');
            };
            let size = live
                .get(&id)
                .map(|x| x.0)
                .or_else(|| dead.get(&id).copied());
            match size {
                None => true,
                Some(size) => {
                    !layout.blocks_of(size).any(|(i, l)| i == index && l == len)
                        || layout.block_key(id, index, len) != o.key
                }
            }
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(key: &str) -> ObjectInfo {
        ObjectInfo {
            key: key.into(),
            size: 1,
            modified: 0,
            etag: None,
        }
    }

    #[test]
    fn reserved_ranges_hold_their_ids_only() {
        let r = Reserved {
            ranges: vec![(1, 1025), (2049, 3073)],
        };
        for (id, held) in [
            (0, false),
            (1, true),
            (1024, true),
            (1025, false),
            (2048, false),
        ] {
            assert_eq!(r.contains(id), held, "{id}");
        }
        assert!(r.contains(3072) && !r.contains(3073));
        assert!(!Reserved::default().contains(1));
        let (in_flight, leaked) = r.split(vec![
            obj("v/chunks/0/1/1024_0_100"),
            obj("v/chunks/0/1/1025_0_100"),
            obj("v/chunks/0/0/stray"),
        ]);
        let keys = |v: Vec<ObjectInfo>| v.into_iter().map(|o| o.key).collect::<Vec<_>>();
        assert_eq!(keys(in_flight), ["v/chunks/0/1/1024_0_100"]);
        assert_eq!(
            keys(leaked),
            ["v/chunks/0/1/1025_0_100", "v/chunks/0/0/stray"]
        );
    }
}
