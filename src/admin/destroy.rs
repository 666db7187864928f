//! `destroy`: delete a volume, its metadata and every object of it in the bucket.
//!
//! Not for: asking the user (the command line does), or any volume other than the one opened:
//! only keys under the volume's own prefixes (`NAME/UUID/chunks/`, and `NAME/UUID/meta/` of
//! its metadata backups) are deleted, or, on volumes
//! of layout 0 whose prefix a same-named volume may share, only the keys its metadata names.

use std::collections::BTreeSet;

use indicatif::{ProgressBar, ProgressStyle};

use crate::data::layout::Layout;
use crate::meta::{Meta, session};
use crate::object::ObjectStorage;

/// What `destroy` did.
#[derive(Debug, Default)]
pub struct DestroyReport {
    /// Objects deleted from the bucket.
    pub deleted: u64,
}

/// The live clients other than this process that have the volume mounted.
pub fn live_mounts(meta: &dyn Meta) -> anyhow::Result<usize> {
    let now = crate::meta::now_nanos();
    Ok(meta
        .sessions()?
        .iter()
        .filter(|s| !session::session_dead(s, s.heartbeat, now))
        .count())
}

/// Deletes the volume: its metadata first (refused while it is mounted anywhere; once it is
/// gone no client can mount the volume again), then its objects. Needs no key of an
/// encrypted volume: nothing is read.
pub fn destroy(meta: &dyn Meta, obj: &ObjectStorage, quiet: bool) -> anyhow::Result<DestroyReport> {
    let fmt = meta.format();
    let layout = Layout::new(&fmt);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let list = || -> anyhow::Result<Vec<String>> {
        let listed = rt.block_on(crate::data::list_blocks(obj, &layout))?;
        Ok(listed.into_iter().map(|o| o.key).collect())
    };
    // Layout 0: the prefix may hold a same-named volume's keys; only ours are named here.
    let mut named = BTreeSet::new();
    if fmt.layout == 0 {
        let slices = meta
            .all_slices()?
            .into_iter()
            .map(|(id, size, _)| (id, size))
            .chain(meta.all_dead_slices()?.into_iter().map(|d| (d.id, d.size)));
        // External slices' objects (`unkai import`) are not the volume's: never named.
        for (id, size) in slices.filter(|(id, _)| !crate::meta::slice::is_external(*id)) {
            for (i, len) in layout.blocks_of(size) {
                named.insert(layout.block_key(id, i, len));
            }
        }
    }
    meta.destroy()?;
    let mut keys: Vec<String> = if fmt.layout == 0 {
        let listed: BTreeSet<String> = list()?.into_iter().collect();
        named.into_iter().filter(|k| listed.contains(k)).collect()
    } else {
        list()?
    };
    // The metadata backups (`mount --backup-meta`), under a prefix of this volume's alone.
    let backups = rt.block_on(obj.list(&Layout::backups_prefix(&fmt)))?;
    keys.extend(backups.into_iter().map(|o| o.key));
    let pb = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(keys.len() as u64)
    };
    pb.set_style(ProgressStyle::with_template("deleting objects {bar:30} {pos}/{len}").unwrap());
    let mut rep = DestroyReport::default();
    for k in &keys {
        rt.block_on(obj.delete(k))?;
        rep.deleted += 1;
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(rep)
}
