//! This client's open files: how many times each inode is open here, and whether the opens
//! are also recorded in the volume for other clients to see; and its open directories, which
//! are only counted here.
//!
//! Not for: the records themselves (the engines) or what an unlink does with them (`ops`).

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

use super::Ino;

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
    /// Directories open here: never recorded in the volume (see `ops::clients::open_dir`).
    dirs: HashMap<Ino, u32>,
    /// Directories open here that were removed here meanwhile, their inode kept (nlink 0,
    /// a `sustained` row) until the last close here.
    kept_dirs: HashSet<Ino>,
    /// Opens are recorded in the volume (other clients may unlink what is open here).
    recorded: bool,
}

const STRIPES: usize = 64;

impl OpenCounts {
    /// `recorded`: record opens in the volume from the start (PostgreSQL).
    pub(crate) fn new(recorded: bool) -> OpenCounts {
        OpenCounts {
            state: Mutex::new(OpenState {
                counts: HashMap::new(),
                dirs: HashMap::new(),
                kept_dirs: HashSet::new(),
                recorded,
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
        (*n == 1, st.recorded)
    }

    /// Counts a close. Returns (last open here, opens are recorded in the volume).
    pub(crate) fn remove(&self, ino: Ino) -> (bool, bool) {
        let mut st = self.state.lock();
        let recorded = st.recorded;
        match st.counts.get_mut(&ino) {
            Some(n) if *n > 1 => {
                *n -= 1;
                (false, recorded)
            }
            Some(_) => {
                st.counts.remove(&ino);
                (true, recorded)
            }
            None => (false, recorded),
        }
    }

    pub(crate) fn is_open(&self, ino: Ino) -> bool {
        self.state.lock().counts.get(&ino).is_some_and(|n| *n > 0)
    }

    /// Counts an open of a directory (never recorded in the volume).
    pub(crate) fn add_dir(&self, ino: Ino) {
        *self.state.lock().dirs.entry(ino).or_insert(0) += 1;
    }

    /// Counts a close of a directory. Returns whether it was the last close here of a
    /// directory removed here while open (whose kept inode the caller now deletes).
    pub(crate) fn remove_dir(&self, ino: Ino) -> bool {
        let mut st = self.state.lock();
        match st.dirs.get_mut(&ino) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                st.dirs.remove(&ino);
                st.kept_dirs.remove(&ino)
            }
            None => false,
        }
    }

    /// If directory `ino` is open here, notes that its removal keeps it (see
    /// [`remove_dir`](Self::remove_dir)) and returns true.
    pub(crate) fn keep_if_open_dir(&self, ino: Ino) -> bool {
        let mut st = self.state.lock();
        if !st.dirs.contains_key(&ino) {
            return false;
        }
        st.kept_dirs.insert(ino);
        true
    }

    pub(crate) fn is_recorded(&self) -> bool {
        self.state.lock().recorded
    }

    /// Starts recording opens in the volume; returns the inodes open now, whose rows the
    /// caller writes (in a transaction that serializes with the rows of transitions: a
    /// transition after this call sees `recorded` and writes or removes its own row).
    pub(crate) fn record_all(&self) -> Vec<Ino> {
        let mut st = self.state.lock();
        st.recorded = true;
        st.counts.keys().copied().collect()
    }
}
