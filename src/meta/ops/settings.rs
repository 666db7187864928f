//! The volume as a whole: its recorded settings (read, checked, changed, reformatted over),
//! the first rows of a new volume, quotas (as `meta::quota` keeps them), usage and summaries,
//! and its destruction.
//!
//! Not for: what each setting means (`meta::format`), how quotas are counted
//! (`meta::quota`), or SQL (the engines).

use super::*;
use crate::meta::PEER_KEY;

/// The root directory of a new volume.
pub(crate) fn root_node(now: Nanos) -> Attr {
    let (uid, gid) = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    new_node(ROOT_INO, Kind::Dir, 0o755, (uid, gid), ROOT_INO, now)
}

/// The bytes each file's data covers, from its chunks' rows `(ino, encoded records)`: what a
/// volume of a schema before 4, which did not count them, starts from.
pub(crate) fn stored_per_inode(
    rows: impl IntoIterator<Item = (i64, Vec<u8>)>,
) -> BTreeMap<i64, u64> {
    let mut out = BTreeMap::new();
    for (ino, blob) in rows {
        let covered = slice::decode(&blob).map_or(0, |recs| slice::covered(&recs));
        *out.entry(ino).or_insert(0) += covered;
    }
    out
}

/// The counters of a new volume, with their first values.
pub(crate) const NEW_COUNTERS: [(&str, i64); 4] = [
    ("nextInode", 2),
    ("nextSlice", 1),
    ("usedSpace", 0),
    ("totalInodes", 1),
];

/// Refuses to format over a volume (unless `force`), or over one that is mounted.
pub(crate) fn check_reformat(
    old: &Format,
    url: &str,
    force: bool,
    sessions: impl IntoIterator<Item = (String, Nanos)>,
) -> Result<()> {
    if !force {
        return Err(Error::Refused(format!(
            "a volume named '{}' already exists at {url}; refusing to format over it \
             (use --force to erase it and start afresh)",
            old.name
        )));
    }
    let now = now_nanos();
    let live = sessions
        .into_iter()
        .filter(|(info, hb)| !row_dead(info, *hb, now))
        .count();
    if live > 0 {
        return Err(Error::Refused(format!(
            "volume '{}' at {url} is mounted by {live} client(s); unmount it before \
             formatting with --force",
            old.name
        )));
    }
    Ok(())
}

/// Which setting that can never change after `format` differs between `old` and `new`.
pub(crate) fn fixed_setting_changed(old: &Format, new: &Format) -> Option<&'static str> {
    [
        ("the volume's name", old.name != new.name),
        ("the volume's id", old.uuid != new.uuid),
        ("the block size", old.block_size != new.block_size),
        ("the key layout", old.layout != new.layout),
        ("hashed key prefixes", old.hash_prefix != new.hash_prefix),
        ("checksums", old.checksums != new.checksums),
        ("compression", old.compress != new.compress),
        (
            "encryption",
            old.encryption != new.encryption
                && !format::Encryption::protected_in_place(
                    old.encryption.as_ref(),
                    new.encryption.as_ref(),
                ),
        ),
        ("the creation time", old.created != new.created),
    ]
    .into_iter()
    .find(|(_, changed)| *changed)
    .map(|(what, _)| what)
}

/// Reads a volume's recorded settings; refuses a schema newer than this binary's.
pub(crate) fn parse_format(json: &str, url: &str) -> Result<Format> {
    let format: Format = serde_json::from_str(json)
        .map_err(|e| Error::Engine(format!("unreadable volume settings in {url}: {e}")))?;
    if format.schema > format::SCHEMA_VERSION {
        return Err(Error::Refused(format!(
            "volume at {url} uses metadata schema {} but this unkai understands up to {}; \
             upgrade unkai",
            format.schema,
            format::SCHEMA_VERSION
        )));
    }
    if format.layout > format::LAYOUT_VERSION {
        return Err(Error::Refused(format!(
            "volume at {url} stores its blocks in layout {} but this unkai understands up to \
             {}; upgrade unkai",
            format.layout,
            format::LAYOUT_VERSION
        )));
    }
    Ok(format)
}

impl<E: Engine> EngineMeta<E> {
    /// The peer cache groups' key: read, or created by the first client that asks (of two
    /// racing, one creates it and both read it).
    pub(super) fn peer_key(&self) -> Result<String> {
        if let Some(k) = self.engine.read(|tx| tx.setting(PEER_KEY))? {
            return Ok(k);
        }
        let mut fresh = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut fresh)
            .map_err(|_| Error::Engine("the system's random numbers failed".into()))?;
        let fresh = hex::encode(fresh);
        self.engine.write(&[], false, |tx| {
            tx.swap_setting(PEER_KEY, None, &fresh)?;
            Ok(())
        })?;
        self.engine
            .read(|tx| tx.setting(PEER_KEY))?
            .ok_or_else(|| Error::Engine("the peer key was not recorded".into()))
    }

    /// Reads the volume's settings again (a `config` elsewhere may have changed them).
    pub(super) fn reload_format(&self) -> Result<()> {
        let Some(json) = self.engine.read(|tx| tx.setting("format"))? else {
            return Ok(());
        };
        let new = parse_format(&json, "the volume")?;
        let mut cur = self.format.write();
        if new.uuid == cur.uuid && *cur != new {
            tracing::info!(
                "volume settings changed: trash {} day{}, capacity {}, inodes {}",
                new.trash_days,
                if new.trash_days == 1 { "" } else { "s" },
                new.capacity,
                new.inodes
            );
            *cur = new;
        }
        Ok(())
    }

    pub(super) fn set_format(&self, new: &Format) -> Result<()> {
        let json = serde_json::to_string(new).expect("format serializes");
        self.engine.write(&[], false, |tx| {
            let old = tx
                .setting("format")?
                .ok_or_else(|| corrupt("the volume's settings are missing".into()))?;
            let old = parse_format(&old, "the volume").map_err(|e| corrupt(e.to_string()))?;
            if let Some(what) = fixed_setting_changed(&old, new) {
                return Err(crate::meta::engine::TxError::Meta(Error::Refused(format!(
                    "{what} cannot change once a volume is formatted"
                ))));
            }
            tx.set_setting("format", &json)
        })?;
        *self.format.write() = new.clone();
        Ok(())
    }

    pub(super) fn summary(&self, dir: Ino) -> Result<Summary> {
        self.engine.snapshot(|tx| {
            if tx.get_node(dir)?.kind != Kind::Dir {
                return fail(libc::ENOTDIR);
            }
            let mut s = quota::tree_summary(tx, dir)?;
            // The trash is not part of the tree a program sees (the root does not list it).
            if dir == ROOT_INO {
                if let Some((_, t)) = tx.get_edge(ROOT_INO, trash::TRASH_NAME)? {
                    let mut gone = quota::tree_summary(tx, t)?;
                    gone.dirs += 1;
                    s = s.minus(&gone);
                }
            }
            Ok(s)
        })
    }

    pub(super) fn destroy(&self) -> Result<()> {
        let me = self.sid();
        self.engine.write(&[], true, |tx| {
            let now = now_nanos();
            let live = tx
                .sessions()?
                .into_iter()
                .filter(|(id, info, hb)| *id != me && !row_dead(info, *hb, now))
                .count();
            if live > 0 {
                return Err(Error::Refused(format!(
                    "the volume is mounted by {live} client(s) (see `unkai status`); unmount \
                     it everywhere first"
                ))
                .into());
            }
            tx.erase_volume()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings from a newer unkai (a schema or a block layout this binary does not know) are
    /// refused in one line that says to upgrade, never read with the wrong meaning.
    #[test]
    fn newer_volumes_are_refused() {
        let mut f = Format::for_tests("v", "file:///b", 4 << 20);
        f.layout = format::LAYOUT_VERSION;
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(parse_format(&json, "u").unwrap(), f);
        for (schema, layout) in [
            (format::SCHEMA_VERSION + 1, format::LAYOUT_VERSION),
            (format::SCHEMA_VERSION, format::LAYOUT_VERSION + 1),
        ] {
            let mut g = f.clone();
            (g.schema, g.layout) = (schema, layout);
            let json = serde_json::to_string(&g).unwrap();
            let e = parse_format(&json, "u").unwrap_err().to_string();
            assert!(e.contains("upgrade unkai") && !e.contains('\n'), "{e}");
        }
    }
}
