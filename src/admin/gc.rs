//! `gc`: delete objects no slice references (left by a crash between upload and commit, or
//! by an interrupted deletion), and the objects of dead slices whose trash period is over.
//!
//! An unreferenced object of a slice id a live session reserved is an upload that session may
//! still commit (a file being written): it is in flight, never deleted. On a mounted volume,
//! objects younger than `min_age` are left alone too (a margin, e.g. for a client whose
//! heartbeat is late). Reclaiming and telling leaked objects are `garbage`'s, shared with a
//! mount's background work and with `fsck`.
//!
//! Not for: checking the volume (that is `fsck`).

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::data::DataStore;
use crate::garbage::{self, Reserved, SliceTable};
use crate::meta::{Meta, now_nanos};
use crate::object::ObjectInfo;

#[derive(Debug, Default)]
pub struct GcReport {
    /// Objects no slice references and no live session may still commit.
    pub leaked: Vec<ObjectInfo>,
    /// Objects no slice references yet, of slice ids live sessions reserved (uploads that
    /// may still be committed): never deleted.
    pub in_flight: Vec<ObjectInfo>,
    /// Leaked objects deleted.
    pub deleted: usize,
    /// Leaked objects left alone because they are younger than `min_age` on a mounted volume.
    pub young: usize,
    /// Dead slices whose objects were deleted.
    pub reclaimed: usize,
}

pub fn gc(
    meta: &dyn Meta,
    store: &DataStore,
    delete: bool,
    min_age: Duration,
    quiet: bool,
) -> anyhow::Result<GcReport> {
    let mut rep = GcReport::default();
    if delete {
        rep.reclaimed = garbage::reclaim_all(meta, store)?;
    }
    let fmt = meta.format().clone();
    let listed = store.list_blocks()?;
    // In this order (see `Reserved::load`): an upload listed is reserved or committed.
    let reserved = Reserved::load(meta)?;
    let table = SliceTable::load(meta)?;
    let unreferenced = garbage::leaked_objects(&fmt, &listed, &table.live, &table.dead);
    (rep.in_flight, rep.leaked) = reserved.split(unreferenced);
    if !delete || rep.leaked.is_empty() {
        return Ok(rep);
    }
    let mounted = !meta.sessions()?.is_empty();
    let cutoff = now_nanos() - min_age.as_nanos() as i64;
    let pb = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(rep.leaked.len() as u64)
    };
    pb.set_style(
        ProgressStyle::with_template("deleting leaked objects {bar:30} {pos}/{len}").unwrap(),
    );
    for o in &rep.leaked {
        pb.inc(1);
        if mounted && o.modified > cutoff {
            rep.young += 1;
            continue;
        }
        store.delete_block(&o.key)?;
        rep.deleted += 1;
    }
    pb.finish_and_clear();
    Ok(rep)
}
