//! Background work of a mounted volume: compaction of fragmented chunks, deleting the objects
//! of dead slices (with `garbage::reclaim_all`, as `gc` does), the session heartbeat, and
//! making room on the disk under a local bucket that runs short of it (`data::room`) by
//! deleting the trash early, oldest first.
//!
//! Not for: anything an application waits on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::data::room::Outcome;
use crate::data::{DataStore, SliceUpload};
use crate::garbage;
use crate::meta::{Ino, Meta, Purged, SliceRec, slice};

use super::Result;
use super::atime::Atimes;
use super::reader::{piece_range, read_ranges};

/// Records a chunk must have before it is compacted.
pub const COMPACT_AT: usize = 16;
const TICK: Duration = Duration::from_millis(500);

/// Rewrites a chunk's visible data as one new slice, if the chunk did not change meanwhile.
/// Returns whether it replaced the chunk's records.
pub fn compact_chunk(meta: &dyn Meta, store: &DataStore, ino: Ino, index: u32) -> Result<bool> {
    let recs = meta.read_chunk(ino, index)?;
    if recs.len() < 2 {
        return Ok(false);
    }
    let view = slice::build_view(&recs);
    // Merge the data pieces into runs, each run a contiguous part of the new slice.
    let mut runs: Vec<(u32, u32)> = Vec::new(); // (pos, len)
    for p in view.iter().filter(|p| p.id != 0) {
        match runs.last_mut() {
            Some((pos, len)) if *pos as u64 + *len as u64 == p.pos as u64 => *len += p.len,
            _ => runs.push((p.pos, p.len)),
        }
    }
    let total: u64 = runs.iter().map(|r| r.1 as u64).sum();
    // The data pieces, in order, are the runs laid end to end: read them all at once from
    // the view already built (committed data only: compaction must not see pending writes).
    let mut at = 0usize;
    let wanted = view
        .iter()
        .filter(|p| p.id != 0)
        .map(|p| {
            let dst = at;
            at += p.len as usize;
            (dst, piece_range(p, p.pos as u64, p.end()))
        })
        .collect();
    let mut buf = vec![0u8; total as usize];
    read_ranges(store, wanted, &mut buf, true)?;
    // Handed over as it is: each block is a view of it, not a copy.
    let buf = Bytes::from(buf);
    let mut new = Vec::new();
    let mut upload = None;
    // Kept (in flight, see `SliceUpload::start`) until the new slice is committed.
    let mut in_flight = None;
    if total > 0 {
        let mut up = SliceUpload::start(store, || meta.new_slice_id())?;
        let id = up.id();
        let bs = store.block_size() as usize;
        for (i, start) in (0..buf.len()).step_by(bs).enumerate() {
            up.put_block(i as u32, buf.slice(start..(start + bs).min(buf.len())));
        }
        up.wait()?;
        let mut off = 0u32;
        for (pos, len) in &runs {
            new.push(SliceRec {
                pos: *pos,
                id,
                size: total as u32,
                off,
                len: *len,
            });
            off += len;
        }
        upload = Some((id, total as u32));
        in_flight = Some(up);
    }
    // Reserved ranges (fallocate) stay reserved: merged, beside the data.
    for p in view.iter().filter(|p| p.is_reserved()) {
        match new.last_mut() {
            Some(r) if r.is_reserved() && r.end() == p.pos as u64 => r.len += p.len,
            _ => new.push(SliceRec::reserved(p.pos, p.len)),
        }
    }
    let replaced = meta.replace_slices(ino, index, &recs, &new)?;
    if !replaced {
        if let Some((id, size)) = upload {
            store.delete_slice(id, size)?;
        }
    }
    drop(in_flight);
    Ok(replaced)
}

/// The background thread of a mount; stops (after one last round) when dropped.
pub struct Background {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    pub fn start(meta: Arc<dyn Meta>, store: DataStore, atimes: Arc<Atimes>) -> Background {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = stop.clone();
        // A put the disk refused wakes the thread up to make room at once.
        let w = stop.clone();
        store.room().serve(move || {
            w.1.notify_all();
        });
        let thread = std::thread::Builder::new()
            .name("unkai-bg".into())
            .spawn(move || {
                let mut last_hb = Instant::now();
                let mut trimmed = 0;
                let mut reported = (0, 0);
                let mut early = Early::default();
                loop {
                    {
                        let (lock, cv) = &*s;
                        let mut stopped = lock.lock();
                        if !*stopped {
                            cv.wait_for(&mut stopped, TICK);
                        }
                        if *stopped {
                            break;
                        }
                    }
                    let stopping = || *s.0.lock();
                    make_room(&*meta, &store, &mut early);
                    store_atimes(&*meta, &atimes);
                    round(&*meta, &store, &stopping);
                    if let Err(e) = meta.watch_sessions() {
                        tracing::warn!("watching sessions: {e}");
                    }
                    if last_hb.elapsed() >= crate::meta::session::heartbeat_interval() {
                        if let Err(e) = meta.heartbeat() {
                            tracing::warn!("session heartbeat: {e}");
                        }
                        trim_reserved(&*meta, &store, &mut trimmed);
                        let now = store.staged();
                        if now != reported {
                            match meta.report_staged(now.0, now.1) {
                                Ok(()) => reported = now,
                                Err(e) => tracing::debug!("reporting staged blocks: {e}"),
                            }
                        }
                        last_hb = Instant::now();
                    }
                }
                // Unmounting: access times are stored and dead slices go (quick deletes);
                // compaction waits for the next mount, whose reads it only speeds up.
                store.room().unserve();
                store_atimes(&*meta, &atimes);
                if let Err(e) = garbage::reclaim_all(&*meta, &store) {
                    tracing::warn!("reclaiming dead slices: {e}");
                }
            })
            .expect("spawn background thread");
        Background {
            stop,
            thread: Some(thread),
        }
    }
}

/// What this mount deleted early to make room, for its log.
#[derive(Default)]
struct Early {
    /// The first early deletion was said (at warning level; the rest at debug level).
    said: bool,
}

/// Makes room on the disk under a local bucket when it is below its free-space floor, or a
/// put was refused for want of room (`data::room`): first the dead slices kept for the trash
/// period (overwritten data, and files deleted from the trash: nobody can restore them), those
/// dead longest first; then the oldest entries of the trash, for good, through
/// [`Meta::purge_trash_early`] (one client of the volume at a time; counted in the volume for
/// `unkai status`), and the objects of their slices at once. Aims at the floor and a few
/// blocks above it. Said in the log once; the waiting puts learn how it went.
fn make_room(meta: &dyn Meta, store: &DataStore, early: &mut Early) {
    let room = store.room();
    let Some(short) = room.shortage() else {
        return;
    };
    let mut want = short.want;
    let mut slices = (0, 0);
    let mut purged = Purged::default();
    let mut elsewhere = false;
    // Slices first, in batches, until enough went.
    while want > 0 {
        match garbage::reclaim_early(meta, store, 256) {
            Ok((0, _)) => break,
            Ok((n, b)) => {
                slices.0 += n;
                slices.1 += b;
                want = room.want();
            }
            Err(e) => {
                tracing::warn!("making room: reclaiming dead slices: {e}");
                break;
            }
        }
    }
    if want > 0 {
        match meta.purge_trash_early(want) {
            Ok(Some(p)) => purged = p,
            Ok(None) => elsewhere = true,
            Err(e) => tracing::warn!("making room: purging the trash: {e}"),
        }
        if purged.entries > 0 {
            // Their slices just died: their objects go now, not after the trash period.
            loop {
                match garbage::reclaim_early(meta, store, 1000) {
                    Ok((0, _)) => break,
                    Ok((n, b)) => {
                        slices.0 += n;
                        slices.1 += b;
                    }
                    Err(e) => {
                        tracing::warn!("making room: reclaiming dead slices: {e}");
                        break;
                    }
                }
            }
        }
    }
    let made = slices.0 > 0 || purged.entries > 0;
    if made {
        let what = format!(
            "{} trash entries ({} bytes of files) deleted, and the objects of {} dead \
             slices ({} bytes)",
            purged.entries, purged.bytes, slices.0, slices.1
        );
        if !std::mem::replace(&mut early.said, true) {
            tracing::warn!(
                "trash purged early for disk space: the disk under the bucket ({}) is below \
                 its free-space floor ({} bytes free, {:.0}% kept: --free-space-ratio), so \
                 the oldest trash is deleted for good to make room: {what} this time \
                 (`unkai status` counts the entries; later purges are logged at debug level)",
                short.dir.display(),
                short.avail,
                room.ratio() * 100.0
            );
        } else {
            tracing::debug!("trash purged early for disk space: {what}");
        }
    }
    room.made(if made || short.want == 0 {
        Outcome::Made
    } else if elsewhere {
        Outcome::Elsewhere
    } else {
        Outcome::Nothing
    });
}

/// Stores the access times reads moved, in one transaction (kept for the next round if
/// that fails).
pub fn store_atimes(meta: &dyn Meta, atimes: &Atimes) {
    let times = atimes.to_store();
    if times.is_empty() {
        return;
    }
    match meta.set_atimes(&times) {
        Ok(()) => atimes.stored(&times),
        Err(e) => tracing::warn!("storing access times: {e}"),
    }
}

/// Gives back the reservation of the slice ids below the lowest this client may still commit
/// (`trimmed`: the bound given last time), so that what it uploaded and abandoned becomes
/// garbage `gc` may take, and its reserved ranges stay few in a long-lived mount.
fn trim_reserved(meta: &dyn Meta, store: &DataStore, trimmed: &mut u64) {
    let floor = store.in_flight_floor(|| meta.slice_id_floor());
    if floor <= *trimmed {
        return;
    }
    match meta.trim_reserved(floor) {
        Ok(()) => *trimmed = floor,
        Err(e) => tracing::warn!("trimming reserved slice ids: {e}"),
    }
}

/// Compacts the fragmented chunks (until `stopping` says the mount is ending: a chunk takes
/// up to a chunk's worth of reads and writes), then deletes dead slices.
fn round(meta: &dyn Meta, store: &DataStore, stopping: &dyn Fn() -> bool) {
    match meta.fragmented_chunks(COMPACT_AT, 64) {
        Ok(chunks) => {
            for (ino, index) in chunks {
                if stopping() {
                    return;
                }
                if let Err(e) = compact_chunk(meta, store, ino, index) {
                    tracing::warn!("compacting chunk {index} of inode {ino}: {e}");
                }
            }
        }
        Err(e) => tracing::warn!("listing fragmented chunks: {e}"),
    }
    if let Err(e) = garbage::reclaim_all(meta, store) {
        tracing::warn!("reclaiming dead slices: {e}");
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock() = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
