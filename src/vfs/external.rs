//! Files whose bytes are objects imported by reference (`unkai import`): making one, and
//! telling which external slices a file's bytes come from (for `--refresh`, `unkai info`).
//! Reading them is the ordinary read path (`reader`, `data::external`); writing them is an
//! ordinary write, whose slices lie over the external ones (copy on write).
//!
//! Not for: listing a bucket or deciding what to import (`import`), the rows (`meta`).

use crate::meta::{CHUNK_SIZE, External, Ino, Nanos, slice};

use super::{Attr, Result, Vfs};

/// Which external slices a file's bytes come from.
#[derive(Clone, Debug, Default)]
pub struct ExternalParts {
    /// Their rows, in order of position in the file (each once).
    pub rows: Vec<External>,
    /// Bytes of the file that are the volume's own (written since the import).
    pub own_bytes: u64,
}

impl ExternalParts {
    /// Whether every byte of the file is still an imported object's (none written since).
    pub fn wholly_external(&self) -> bool {
        self.own_bytes == 0
    }
}

impl Vfs {
    /// Makes the empty regular file `ino` the bytes of an imported object: `parts` are its
    /// external slices, one per chunk (see `Meta::attach_external`).
    pub fn attach_external(&self, ino: Ino, parts: &[External], mtime: Nanos) -> Result<Attr> {
        let a = self.meta.attach_external(ino, parts, mtime)?;
        self.restamp(&a);
        Ok(a)
    }

    /// The external slices the committed bytes of file `ino` come from, and how many of its
    /// bytes are the volume's own.
    pub fn external_parts(&self, ino: Ino) -> Result<ExternalParts> {
        let a = self.getattr(ino)?;
        let mut out = ExternalParts::default();
        let mut seen = std::collections::HashSet::new();
        for index in 0..a.length.div_ceil(CHUNK_SIZE) {
            let view = slice::build_view(&self.meta.read_chunk(ino, index as u32)?);
            for p in view.iter().filter(|p| p.id != 0) {
                if !slice::is_external(p.id) {
                    out.own_bytes += p.len as u64;
                } else if seen.insert(p.id) {
                    match self.meta.external(p.id)? {
                        Some(row) => out.rows.push(row),
                        // A row lost: not an imported object's bytes any more.
                        None => out.own_bytes += p.len as u64,
                    }
                }
            }
        }
        Ok(out)
    }
}
