//! Open-file and open-directory handles: what the kernel's `fh` numbers stand for.
//!
//! Not for: file data (writers and readers are per inode, in `vfs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::meta::Ino;

pub struct Handle {
    pub ino: Ino,
    /// Open flags (O_ACCMODE, O_APPEND, ...).
    pub flags: i32,
    /// Where the last read on this handle ended: a read starting there is sequential.
    pub read_end: AtomicU64,
    /// The lowest offset the current stream of reads read (reads near the last one's end
    /// continue it: the kernel sends a stream's reads several at a time, not in order).
    pub stream_start: AtomicU64,
    /// Bytes read in the current stream (a stream reads densely: see `Vfs::read`).
    pub stream_bytes: AtomicU64,
    /// Read-ahead of a sequential stream: fetched ahead up to this offset, and how far ahead
    /// of the reader the next fetches reach (0: no stream yet).
    pub ahead: AtomicU64,
    pub window: AtomicU64,
    /// Something was written through this handle (the antivirus scan follows its close).
    pub wrote: AtomicBool,
    /// O_APPEND writes through it go at the end the volume knows, whatever offset the kernel
    /// sent (see [`crate::vfs::Vfs::append_at_end`]).
    pub at_end: AtomicBool,
    /// A directory's handle: its listing was read to the end, whose cookie this is
    /// (`u64::MAX`: not yet). See `Vfs::readdir_open`.
    pub listed_to: AtomicU64,
}

#[derive(Default)]
pub struct Handles {
    next: AtomicU64,
    map: Mutex<HashMap<u64, Arc<Handle>>>,
}

impl Handles {
    pub fn insert(&self, ino: Ino, flags: i32) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let h = Arc::new(Handle {
            ino,
            flags,
            read_end: AtomicU64::new(0),
            stream_start: AtomicU64::new(0),
            stream_bytes: AtomicU64::new(0),
            ahead: AtomicU64::new(0),
            window: AtomicU64::new(0),
            wrote: AtomicBool::new(false),
            at_end: AtomicBool::new(false),
            listed_to: AtomicU64::new(u64::MAX),
        });
        self.map.lock().insert(fh, h);
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.map.lock().get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.map.lock().remove(&fh)
    }

    /// Whether any handle other than those removed is open on `ino`.
    pub fn any_open(&self, ino: Ino) -> bool {
        self.map.lock().values().any(|h| h.ino == ino)
    }

    /// Whether a handle that may write (or map and write) `ino` is open.
    pub fn any_open_for_writing(&self, ino: Ino) -> bool {
        self.map
            .lock()
            .values()
            .any(|h| h.ino == ino && h.flags & libc::O_ACCMODE != libc::O_RDONLY)
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
