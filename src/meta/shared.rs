//! What every engine shares: limits, name checks, session liveness, and the pure parts of
//! operations (zero records, the plan of a `copy_range`), so that engines differ only in how
//! they store and lock.
//!
//! Not for: SQL of any engine.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use super::slice::{self, SliceRec};
use super::*;

/// Records a chunk may gather before it is offered to compaction.
pub(crate) const FRAGMENTED_AT: usize = 16;
/// How many ids are taken from the counters at once.
pub(crate) const ID_BATCH: u64 = 1024;
/// A session whose heartbeat is older than this is dead (unless `UNKAI_SESSION_TIMEOUT`, in
/// seconds, says otherwise: tests shorten it).
pub(crate) const SESSION_TIMEOUT: Duration = Duration::from_secs(300);

/// The session timeout in force: [`SESSION_TIMEOUT`] or `UNKAI_SESSION_TIMEOUT` (seconds).
pub(crate) fn session_timeout() -> Duration {
    static T: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("UNKAI_SESSION_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(SESSION_TIMEOUT, Duration::from_secs_f64)
    })
}

/// How often a mount heartbeats (and looks for dead sessions): 15 beats per timeout.
pub(crate) fn heartbeat_interval() -> Duration {
    session_timeout() / 15
}
/// Largest file: the chunk index must fit in 32 bits.
pub const MAX_FILE_SIZE: u64 = (u32::MAX as u64) * CHUNK_SIZE;

/// Space a file of `n` bytes is counted for (4 KiB units).
pub(crate) fn align4k(n: u64) -> i64 {
    n.div_ceil(4096) as i64 * 4096
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

/// Checks a name a new entry gets.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME_LEN {
        return sys(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return sys(libc::EINVAL);
    }
    Ok(())
}

pub(crate) fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// Whether a session row (its info as stored, its last heartbeat) belongs to a client known to
/// be gone; an unreadable row counts as gone.
pub(crate) fn row_dead(info: &str, heartbeat: Nanos, now: Nanos) -> bool {
    match serde_json::from_str::<SessionInfo>(info) {
        Ok(info) => session_dead(&info, heartbeat, now),
        Err(_) => true,
    }
}

/// Whether a session's process is known to be gone (same host, pid no longer an unkai).
pub(crate) fn session_dead(info: &SessionInfo, heartbeat: Nanos, now: Nanos) -> bool {
    if now - heartbeat > session_timeout().as_nanos() as i64 {
        return true;
    }
    if info.host != host_name() {
        return false;
    }
    if info.pid == std::process::id() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{}/comm", info.pid)) {
        Ok(comm) => !comm.trim().starts_with("unkai"),
        Err(_) => true,
    }
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
            let piece = if r.id == 0 {
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
        let view = slice::build_view(&read(index)?);
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

/// How many times this client has each inode open, and whether its opens are also recorded
/// in the volume (table `open` of the engine) for other clients to see.
///
/// The first open and the last close of an inode here are *transitions*: the engine records or
/// removes the inode's row while holding [`OpenCounts::transition`] for that inode, so that a
/// close and an open of one inode in this process cannot interleave their rows.
pub(crate) struct OpenCounts {
    state: Mutex<OpenState>,
    stripes: Box<[Mutex<()>]>,
}

struct OpenState {
    counts: HashMap<Ino, u32>,
    /// Opens are recorded in the volume (other clients may unlink what is open here).
    shared: bool,
}

const STRIPES: usize = 64;

impl OpenCounts {
    /// `shared`: record opens in the volume from the start (PostgreSQL).
    pub(crate) fn new(shared: bool) -> OpenCounts {
        OpenCounts {
            state: Mutex::new(OpenState {
                counts: HashMap::new(),
                shared,
            }),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Serializes the transitions (first open, last close) of one inode in this client.
    pub(crate) fn transition(&self, ino: Ino) -> parking_lot::MutexGuard<'_, ()> {
        self.stripes[(ino as usize) % STRIPES].lock()
    }

    /// Counts an open. Call it before looking the inode up, so that an unlink committing
    /// after the lookup sees the open. Returns (first open here, opens are recorded in the
    /// volume).
    pub(crate) fn add(&self, ino: Ino) -> (bool, bool) {
        let mut st = self.state.lock();
        let n = st.counts.entry(ino).or_insert(0);
        *n += 1;
        (*n == 1, st.shared)
    }

    /// Counts a close. Returns (last open here, opens are recorded in the volume).
    pub(crate) fn remove(&self, ino: Ino) -> (bool, bool) {
        let mut st = self.state.lock();
        let shared = st.shared;
        match st.counts.get_mut(&ino) {
            Some(n) if *n > 1 => {
                *n -= 1;
                (false, shared)
            }
            Some(_) => {
                st.counts.remove(&ino);
                (true, shared)
            }
            None => (false, shared),
        }
    }

    pub(crate) fn is_open(&self, ino: Ino) -> bool {
        self.state.lock().counts.get(&ino).is_some_and(|n| *n > 0)
    }

    pub(crate) fn is_shared(&self) -> bool {
        self.state.lock().shared
    }

    /// Starts recording opens in the volume; returns the inodes open now, whose rows the
    /// caller writes (in a transaction that serializes with the rows of transitions: a
    /// transition after this call sees `shared` and writes or removes its own row).
    pub(crate) fn share(&self) -> Vec<Ino> {
        let mut st = self.state.lock();
        st.shared = true;
        st.counts.keys().copied().collect()
    }
}
