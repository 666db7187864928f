//! FUSE passthrough (issue 36 item 1): a file opened for reading is served by the kernel
//! straight from a local copy of its bytes (a backing file registered with the
//! `FUSE_DEV_IOC_BACKING_OPEN` ioctl), so its reads never come to unkai.
//!
//! The kernel's rules decide the shape of this module: while an inode has a file open in
//! passthrough mode, every other open of it must be in passthrough mode on the same backing
//! file (an ordinary open fails with EIO), and while it has ordinary opens, a passthrough
//! open fails. So, per inode: if it has ordinary opens, a new open is ordinary; if it has
//! passthrough opens, a new read-only open shares their copy (filled again first if the file
//! moved since) and an open for writing (or O_TRUNC) is refused with ETXTBSY, as a running
//! program's file is; otherwise a read-only open of a regular file of at most
//! [`Passthrough::max`] bytes gets a fresh copy. The last passthrough close drops the copy.
//! A truncate by path, and another client's change pushed in (`Coherence`), fill the copy
//! again at once: its readers see the new bytes as the page cache's readers would.
//!
//! Not for: making or filling copies (`vfs::local`), or the reads and writes themselves
//! (the kernel does them on the copy).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fuser::{BackingId, Errno, FileHandle, FopenFlags, ReplyOpen};
use parking_lot::Mutex;

use crate::meta::{Attr, Ino, Kind};
use crate::vfs::Vfs;
use crate::vfs::local::LocalCopy;

/// Largest file given a local copy at open (bytes).
pub const DEFAULT_MAX: u64 = 1 << 30;

/// The passthrough state of a mount.
pub struct Passthrough {
    vfs: Arc<Vfs>,
    /// Where copies are made (unlinked files: nothing is left there after a crash).
    dir: PathBuf,
    /// Largest file copied.
    max: u64,
    /// Off once the kernel refused it (no FUSE_PASSTHROUGH, or no CAP_SYS_ADMIN).
    on: AtomicBool,
    state: Mutex<State>,
    /// Opens served in passthrough mode, opens refused (ETXTBSY), copies filled again.
    opened: AtomicU64,
    refused: AtomicU64,
    refilled: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Ordinary opens by inode.
    ordinary: HashMap<Ino, u32>,
    /// Passthrough opens by inode.
    backed: HashMap<Ino, Backed>,
    /// Open handles: their inode, and whether in passthrough mode.
    handles: HashMap<u64, (Ino, bool)>,
}

struct Backed {
    /// Dropped (the backing file closed in the kernel) with the last passthrough close.
    backing: BackingId,
    copy: Arc<LocalCopy>,
    opens: u32,
}

fn read_only(flags: i32) -> bool {
    flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_TRUNC == 0
}

impl Passthrough {
    pub fn new(vfs: Arc<Vfs>, dir: PathBuf, max: u64) -> std::io::Result<Passthrough> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        Ok(Passthrough {
            vfs,
            dir,
            max,
            on: AtomicBool::new(true),
            state: Mutex::new(State::default()),
            opened: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refilled: AtomicU64::new(0),
        })
    }

    /// The kernel could not do passthrough: every open is ordinary from now on.
    pub fn turn_off(&self, why: &str) {
        if self.on.swap(false, Ordering::AcqRel) {
            tracing::warn!("FUSE passthrough off: {why}");
        }
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Answers the kernel's open of `a` (opened in vfs as handle `fh` with `flags`):
    /// in passthrough mode, or ordinarily with `ordinary` flags. An error (ETXTBSY: an open
    /// for writing of a file open in passthrough mode) comes back with the reply unsent;
    /// the caller releases `fh`.
    pub fn open(
        &self,
        reply: ReplyOpen,
        a: &Attr,
        fh: u64,
        flags: i32,
        ordinary: FopenFlags,
    ) -> Result<(), (ReplyOpen, Errno)> {
        let ino = a.ino;
        let ro = read_only(flags);
        let wanted = self.is_on() && ro && a.kind == Kind::File && a.length <= self.max;
        // A fresh copy is made outside the lock (it may take a while); the state is looked
        // at again once it is made.
        let mut fresh: Option<LocalCopy> = None;
        loop {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            if let Some(b) = st.backed.get_mut(&ino) {
                if !ro {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        "inode {ino}: open for writing refused (ETXTBSY): open in passthrough mode"
                    );
                    return Err((reply, Errno::ETXTBSY));
                }
                // Close-to-open: the copy is brought up to the version this open saw.
                match self.vfs.refresh_local(&b.copy, a) {
                    Ok(true) => {
                        self.refilled.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!("inode {ino}: filling its local copy again: {e}");
                        return Err((reply, Errno::EIO));
                    }
                }
                b.opens += 1;
                st.handles.insert(fh, (ino, true));
                self.opened.fetch_add(1, Ordering::Relaxed);
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &b.backing);
                return Ok(());
            }
            let busy = st.ordinary.get(&ino).copied().unwrap_or(0) > 0;
            if !wanted || busy {
                *st.ordinary.entry(ino).or_default() += 1;
                st.handles.insert(fh, (ino, false));
                reply.opened(FileHandle(fh), ordinary);
                return Ok(());
            }
            if let Some(copy) = fresh.take() {
                let backing = match reply.open_backing(copy.file()) {
                    Ok(b) => b,
                    Err(e) => {
                        self.turn_off(&format!(
                            "the kernel refused a backing file ({e}; it needs CAP_SYS_ADMIN)"
                        ));
                        *st.ordinary.entry(ino).or_default() += 1;
                        st.handles.insert(fh, (ino, false));
                        reply.opened(FileHandle(fh), ordinary);
                        return Ok(());
                    }
                };
                tracing::debug!(
                    "inode {ino}: opened in passthrough mode ({} bytes)",
                    a.length
                );
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &backing);
                st.backed.insert(
                    ino,
                    Backed {
                        backing,
                        copy: Arc::new(copy),
                        opens: 1,
                    },
                );
                st.handles.insert(fh, (ino, true));
                self.opened.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            drop(guard);
            match self.vfs.local_copy(&self.dir, a) {
                Ok(c) => fresh = Some(c),
                Err(e) => {
                    // An ordinary open serves the file anyway.
                    tracing::warn!("inode {ino}: no local copy ({e}); opened ordinarily");
                    let mut st = self.state.lock();
                    *st.ordinary.entry(ino).or_default() += 1;
                    st.handles.insert(fh, (ino, false));
                    reply.opened(FileHandle(fh), ordinary);
                    return Ok(());
                }
            }
        }
    }

    /// Counts an open answered elsewhere, ordinarily (a create).
    pub fn opened_ordinarily(&self, ino: Ino, fh: u64) {
        let mut st = self.state.lock();
        *st.ordinary.entry(ino).or_default() += 1;
        st.handles.insert(fh, (ino, false));
    }

    /// The kernel released handle `fh`: the last passthrough close of an inode drops its
    /// copy and backing file.
    pub fn release(&self, fh: u64) {
        let mut st = self.state.lock();
        let Some((ino, backed)) = st.handles.remove(&fh) else {
            return;
        };
        if backed {
            if let Some(b) = st.backed.get_mut(&ino) {
                b.opens -= 1;
                if b.opens == 0 {
                    st.backed.remove(&ino);
                }
            }
        } else if let Some(n) = st.ordinary.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                st.ordinary.remove(&ino);
            }
        }
    }

    /// The copy of `ino`, if it has one.
    fn copy_of(&self, ino: Ino) -> Option<Arc<LocalCopy>> {
        self.state.lock().backed.get(&ino).map(|b| b.copy.clone())
    }

    /// `ino` changed (truncated, or changed by another client): its copy, if any, is filled
    /// again from what the volume has now.
    pub fn changed(&self, ino: Ino) {
        let Some(copy) = self.copy_of(ino) else {
            return;
        };
        match self.vfs.refresh_local_now(&copy) {
            Ok(true) => {
                self.refilled.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("inode {ino}: local copy filled again after a change");
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("inode {ino}: filling its local copy again: {e}"),
        }
    }

    /// As [`Passthrough::changed`], on a thread of its own (from the thread that takes
    /// other clients' changes, which must not wait for reads).
    pub fn changed_later(self: &Arc<Self>, ino: Ino) {
        if self.copy_of(ino).is_none() {
            return;
        }
        let me = self.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("unkai-passthrough".into())
            .spawn(move || me.changed(ino))
        {
            tracing::warn!("inode {ino}: cannot start a thread to fill its copy again: {e}");
        }
    }

    /// The line logged at unmount.
    pub fn summary(&self) -> String {
        format!(
            "passthrough: {} opens on local copies, {} opens for writing refused, {} copies filled again",
            self.opened.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.refilled.load(Ordering::Relaxed)
        )
    }
}
