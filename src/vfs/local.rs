//! Local copies of files, for FUSE passthrough (issue 36 item 1): a file's bytes laid out
//! as one unlinked file on local disk (O_TMPFILE in the mount's cache directory), which the
//! kernel then reads directly.
//!
//! A copy holds what a reader of this mount would read (committed bytes, with this mount's
//! pending writes laid over) as of its last fill, and remembers the attributes it was made
//! from: [`Vfs::refresh_local`] fills it again when the file's length or times moved (another
//! client's change, a truncate), so a copy never outlives the version it was made from
//! unnoticed.
//!
//! Not for: deciding which opens get a copy, or the kernel's backing files (`fuse`); writing
//! back through a copy (copies are read-only: passthrough is only for reading so far).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::Mutex;

use super::{Error, Result, Vfs};
use crate::meta::{Attr, Ino, Nanos};

/// Bytes read and written at a time while filling a copy.
const FILL_PIECE: usize = 4 << 20;

/// A local disk's error, as an errno.
fn io(e: std::io::Error) -> Error {
    Error::Sys(e.raw_os_error().unwrap_or(libc::EIO))
}

/// What a copy was made from: the file's length and times.
type Stamp = (u64, Nanos, Nanos);

fn stamp(a: &Attr) -> Stamp {
    (a.length, a.mtime, a.ctime)
}

/// A file's bytes on local disk (see the module's doc).
pub struct LocalCopy {
    ino: Ino,
    file: File,
    /// Held while filling: one fill at a time.
    made_from: Mutex<Stamp>,
}

impl LocalCopy {
    /// The open copy (read and write, so that the kernel may open it either way).
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn ino(&self) -> Ino {
        self.ino
    }
}

impl Vfs {
    /// Makes a local copy of the file `a` describes, as an unlinked file in `dir`.
    pub fn local_copy(&self, dir: &Path, a: &Attr) -> Result<LocalCopy> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(dir)
            .map_err(io)?;
        let copy = LocalCopy {
            ino: a.ino,
            file,
            made_from: Mutex::new((u64::MAX, 0, 0)),
        };
        self.refresh_local(&copy, a)?;
        Ok(copy)
    }

    /// Fills `copy` again if the file's length or times are no longer those it was made
    /// from (`a`: the file's attributes now). Returns whether it did.
    pub fn refresh_local(&self, copy: &LocalCopy, a: &Attr) -> Result<bool> {
        let mut made = copy.made_from.lock();
        if *made == stamp(a) {
            return Ok(false);
        }
        let mut off = 0u64;
        loop {
            // Not an access of the file's own (the open that asked for the copy was).
            let data = self.read_ino(copy.ino, off, FILL_PIECE, true, false)?;
            if data.is_empty() {
                break;
            }
            copy.file.write_all_at(&data, off).map_err(io)?;
            off += data.len() as u64;
        }
        copy.file.set_len(off).map_err(io)?;
        *made = stamp(a);
        Ok(true)
    }

    /// As [`Vfs::refresh_local`], with the file's attributes as the volume has them now.
    pub fn refresh_local_now(&self, copy: &LocalCopy) -> Result<bool> {
        let a = self.getattr(copy.ino)?;
        self.refresh_local(copy, &a)
    }
}
