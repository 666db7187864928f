//! What `unkai info` and `unkai summary` read through a mount: virtual xattrs, answered from
//! the metadata and never stored. `user.unkai.summary` of a directory is what its tree holds
//! (an aggregate per directory in the database); `user.unkai.info` of any inode is its
//! attributes and, for a file, its chunks, slices and the objects they are stored in. Through
//! xattrs (as CephFS's `ceph.dir.rbytes`) they need no META-URL, work for any user who may
//! read the xattrs of the path, and reach the mount's own view of a file being written.
//!
//! Not for: real xattrs (`meta`), or printing (`cli::info`).

use serde_json::json;

use super::{Result, Vfs};
use crate::meta::{CHUNK_SIZE, Ino, Kind, slice};

/// A directory's tree (JSON of [`meta::Summary`]).
pub const SUMMARY: &[u8] = b"user.unkai.summary";
/// An inode's attributes and where its data lives (JSON).
pub const INFO: &[u8] = b"user.unkai.info";

/// Whether `name` is one of the virtual xattrs (never set, removed or listed).
pub fn is_virtual(name: &[u8]) -> bool {
    name == SUMMARY || name == INFO
}

impl Vfs {
    /// The value of a virtual xattr of `ino`, None if `name` is not one.
    pub(super) fn virtual_xattr(&self, ino: Ino, name: &[u8]) -> Option<Result<Vec<u8>>> {
        match name {
            SUMMARY => Some(self.summary_json(ino)),
            INFO => Some(self.info_json(ino)),
            _ => None,
        }
    }

    fn summary_json(&self, ino: Ino) -> Result<Vec<u8>> {
        let s = self.meta.summary(ino)?;
        Ok(serde_json::to_vec(&s).expect("summary serializes"))
    }

    fn info_json(&self, ino: Ino) -> Result<Vec<u8>> {
        // Writes of this mount not committed yet are committed first: the answer is the file.
        self.flush_ino(ino)?;
        let a = self.meta.getattr(ino)?;
        let mut v = json!({
            "inode": a.ino,
            "kind": format!("{:?}", a.kind).to_lowercase(),
            "mode": format!("{:04o}", a.mode),
            "uid": a.uid, "gid": a.gid, "nlink": a.visible_nlink(),
            "length": a.length, "stored": a.stored,
        });
        match a.kind {
            Kind::Dir => {
                if let Ok(p) = self.meta.dir_path(ino) {
                    v["path"] = json!(String::from_utf8_lossy(&p));
                }
                v["summary"] = serde_json::to_value(self.meta.summary(ino)?).unwrap();
            }
            Kind::File => {
                let layout = self.store.layout();
                let mut chunks = Vec::new();
                let (mut slices, mut objects) = (0u64, std::collections::BTreeSet::new());
                for index in 0..a.length.div_ceil(CHUNK_SIZE) as u32 {
                    let recs = self.meta.read_chunk(ino, index)?;
                    if recs.is_empty() {
                        continue;
                    }
                    let mut out = Vec::new();
                    for r in &recs {
                        let mut keys = Vec::new();
                        if slice::is_external(r.id) {
                            // An imported object's bytes (`unkai import`): the object itself.
                            let ext = self.meta.external(r.id)?;
                            let (name, etag) = match &ext {
                                Some(e) => (crate::data::external::object_name(e), e.etag.clone()),
                                None => ("(row missing: run unkai fsck)".into(), String::new()),
                            };
                            let base = ext.as_ref().map_or(0, |e| e.base);
                            slices += 1;
                            out.push(json!({
                                "pos": r.pos, "id": r.id, "size": r.size, "off": r.off,
                                "len": r.len, "objects": [],
                                "external": { "object": name, "etag": etag,
                                              "from": base + r.off as u64 },
                            }));
                            continue;
                        }
                        if r.id != 0 {
                            let mut at = 0u64;
                            for (i, len) in layout.blocks_of(r.size) {
                                let (lo, hi) = (at, at + len as u64);
                                at = hi;
                                if hi > r.off as u64 && lo < r.off as u64 + r.len as u64 {
                                    let k = layout.block_key(r.id, i, len);
                                    objects.insert(k.clone());
                                    keys.push(k);
                                }
                            }
                            slices += 1;
                        }
                        out.push(json!({
                            "pos": r.pos, "id": r.id, "size": r.size, "off": r.off,
                            "len": r.len, "objects": keys,
                        }));
                    }
                    chunks.push(json!({ "index": index, "slices": out }));
                }
                v["chunks"] = json!(chunks);
                v["slices"] = json!(slices);
                v["objects"] = json!(objects.len());
            }
            Kind::Symlink => {
                v["target"] = json!(String::from_utf8_lossy(&self.meta.readlink(ino)?));
            }
            _ => {}
        }
        Ok(serde_json::to_vec(&v).expect("info serializes"))
    }
}
