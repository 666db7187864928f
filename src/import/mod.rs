//! `unkai import`: files of a volume made from a bucket's objects by reference, without
//! copying a byte. Each object under the source prefix becomes the file `AT/KEY`, whose
//! slices are external (the object by key, ETag and size: `meta::External`); `--refresh`
//! lists again and brings the files in line with the bucket (new objects imported, changed
//! ones re-pointed, deleted ones unlinked), leaving alone every file written since its import.
//! It works through the `vfs` of a client opened in this process (no mount), as `sync` does.
//!
//! Not for: reading imported files (`data::external`), the rows (`meta`), opening the volume
//! or printing (`cli::import`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};

use crate::meta::{CHUNK_SIZE, Ctx, External, Ino, Kind, ROOT_INO};
use crate::object::{self, ObjectInfo, ObjectStorage};
use crate::vfs::{self, Vfs, paths};

/// What to import.
pub struct Options {
    /// The source: `s3://bucket[/prefix]` (or any store URL `unkai` reads).
    pub source: String,
    /// The directory of the volume that receives the files (made when missing).
    pub at: String,
    /// List again and bring existing files in line with the bucket.
    pub refresh: bool,
    pub quiet: bool,
}

/// What an import did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Objects listed.
    pub listed: u64,
    /// Files made for new objects.
    pub imported: u64,
    /// Their bytes (none copied).
    pub bytes: u64,
    /// Files re-pointed at an object that changed (`--refresh`).
    pub changed: u64,
    /// Files unlinked whose object was deleted (`--refresh`).
    pub deleted: u64,
    /// Files already in line with their object.
    pub unchanged: u64,
    /// Files left as they are: written since their import, or not imported at all.
    pub kept: u64,
    /// Objects that could not be imported (named in the log).
    pub failed: u64,
    pub first_failure: Option<String>,
}

/// The summary line printed at the end.
pub fn summary_line(s: &Summary, took: Duration) -> String {
    let secs = took.as_secs_f64().max(1e-3);
    format!(
        "{} objects listed: {} imported ({}, no byte copied), {} changed, {} deleted, {} \
         unchanged, {} kept (written since their import, or not imported), {} failed in \
         {:.1} s ({:.0} objects/s)",
        s.listed,
        s.imported,
        indicatif::HumanBytes(s.bytes),
        s.changed,
        s.deleted,
        s.unchanged,
        s.kept,
        s.failed,
        secs,
        s.listed as f64 / secs
    )
}

fn err(e: vfs::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// The external slices of an object of `size` bytes (one per chunk; ids are taken when
/// they are recorded).
pub fn parts_of(url: &str, o: &ObjectInfo, etag: &str) -> Vec<External> {
    (0..o.size.div_ceil(CHUNK_SIZE))
        .map(|i| {
            let base = i * CHUNK_SIZE;
            External {
                id: 0,
                url: url.to_string(),
                key: o.key.clone(),
                etag: etag.to_string(),
                object_size: o.size,
                base,
                size: (o.size - base).min(CHUNK_SIZE) as u32,
            }
        })
        .collect()
}

/// Keys as listings give them are percent-encoded where object_store's paths need it.
fn decoded(mut o: ObjectInfo) -> ObjectInfo {
    o.key = percent_encoding::percent_decode_str(&o.key)
        .decode_utf8_lossy()
        .into_owned();
    o
}

/// Whether a key can be a path under the import's directory: no empty, `.` or `..` part.
fn usable_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() < 4096
        && key
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= 255)
}

/// Lists the source, each object's key relative to it; fails with one line naming the fix.
pub fn list_source(source: &str) -> anyhow::Result<(ObjectStorage, Vec<ObjectInfo>)> {
    let kind = object::StorageUrl::parse(source).map_err(|e| {
        anyhow::anyhow!(
            "source '{source}': {e}; give s3://bucket[/prefix] (or gs://, az://, file://)"
        )
    })?;
    if matches!(kind, object::StorageUrl::Memory) {
        bail!(
            "source '{source}': a memory store holds nothing to import; give s3://bucket[/prefix]"
        );
    }
    let store = ObjectStorage::open(source, false).map_err(|e| {
        anyhow::anyhow!(
            "source '{source}': {}; check the URL",
            object::one_line(&e.to_string())
        )
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listed = match rt.block_on(store.list("")) {
        Ok(l) => l,
        Err(e) if object::is_missing_bucket(&e) => {
            bail!("source '{source}': the bucket does not exist; check its name (and the endpoint)")
        }
        Err(e) => bail!(
            "source '{source}': cannot list it: {}; check the URL, the endpoint (reachable?) \
             and the credentials (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...)",
            object::one_line(&e.to_string())
        ),
    };
    Ok((store, listed.into_iter().map(decoded).collect()))
}

/// The directory `at` of the volume (made when missing); `..` is refused.
pub fn import_dir(vfs: &Vfs, ctx: &Ctx, at: &str) -> anyhow::Result<Ino> {
    if !at.starts_with('/') || at.split('/').any(|c| c == "..") {
        bail!(
            "--at '{at}': give a path from the volume's root that stays inside it, e.g. \
             --at /data"
        );
    }
    match paths::resolve(vfs, ctx, ROOT_INO, at.as_bytes()) {
        Ok(a) if a.kind == Kind::Dir => Ok(a.ino),
        Ok(_) => bail!("--at '{at}': not a directory in the volume; give a directory"),
        Err(e) if e.errno() == libc::ENOENT => {
            let a = paths::mkdir_all(vfs, ctx, ROOT_INO, at.as_bytes(), 0o755)
                .map_err(|e| anyhow::anyhow!("--at '{at}': cannot make it: {e}"))?;
            Ok(a.ino)
        }
        Err(e) => bail!("--at '{at}': {e}; give an existing directory of the volume"),
    }
}

/// Lists the source with a spinner (see [`list_source`]).
pub fn list_with_progress(source: &str, quiet: bool) -> anyhow::Result<Vec<ObjectInfo>> {
    let spinner = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    spinner.set_message(format!("listing {source}"));
    spinner.enable_steady_tick(Duration::from_millis(200));
    let res = list_source(source);
    spinner.finish_and_clear();
    Ok(res?.1)
}

/// Runs an import (or a refresh) of the objects `listed` (from [`list_source`], started at
/// `started`) into the volume `vfs` serves.
pub fn run(
    vfs: &Arc<Vfs>,
    ctx: &Ctx,
    o: &Options,
    listed: Vec<ObjectInfo>,
    started: Instant,
) -> anyhow::Result<(Summary, Duration)> {
    let root = import_dir(vfs, ctx, &o.at)?;
    let url = o.source.trim_end_matches('/').to_string();
    let mut s = Summary::default();
    let objects: Vec<ObjectInfo> = listed
        .into_iter()
        .filter(|x| !x.key.ends_with('/'))
        .collect();
    s.listed = objects.len() as u64;
    let bar = if o.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(objects.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} objects {per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut dirs: HashMap<String, Ino> = HashMap::new();
    dirs.insert(String::new(), root);
    let mut keys = HashSet::new();
    for x in &objects {
        bar.inc(1);
        keys.insert(x.key.clone());
        if let Err(e) = one(vfs, ctx, o, &url, x, &mut dirs, &mut s) {
            let line = format!("{}: {e:#}", x.key);
            tracing::warn!("importing {line}");
            s.failed += 1;
            s.first_failure.get_or_insert(line);
        }
    }
    bar.finish_and_clear();
    if o.refresh {
        remove_deleted(vfs, ctx, root, &url, &keys, &mut s)?;
    }
    Ok((s, started.elapsed()))
}

/// The directory that holds `key`'s file (made when missing), and the file's name.
fn parent_of<'k>(
    vfs: &Vfs,
    ctx: &Ctx,
    key: &'k str,
    dirs: &mut HashMap<String, Ino>,
) -> anyhow::Result<(Ino, &'k str)> {
    let (dir, name) = key.rsplit_once('/').unwrap_or(("", key));
    if let Some(ino) = dirs.get(dir) {
        return Ok((*ino, name));
    }
    let root = dirs[""];
    let a = paths::mkdir_all(vfs, ctx, root, dir.as_bytes(), 0o755).map_err(err)?;
    if a.kind != Kind::Dir {
        bail!("{dir} is not a directory in the volume");
    }
    dirs.insert(dir.to_string(), a.ino);
    Ok((a.ino, name))
}

/// Imports (or refreshes) the file of one object.
fn one(
    vfs: &Vfs,
    ctx: &Ctx,
    o: &Options,
    url: &str,
    x: &ObjectInfo,
    dirs: &mut HashMap<String, Ino>,
    s: &mut Summary,
) -> anyhow::Result<()> {
    if !usable_key(&x.key) {
        bail!("the key is not a path (an empty, '.' or '..' part, or a name over 255 bytes)");
    }
    let Some(etag) = x.etag.as_deref() else {
        bail!("the store lists no ETag for it: its reads could not be pinned to this version");
    };
    let (dir, name) = parent_of(vfs, ctx, &x.key, dirs)?;
    let mtime = x.modified;
    match vfs.lookup(ctx, dir, name.as_bytes()) {
        Ok(a) => {
            if !o.refresh || a.kind != Kind::File {
                s.kept += 1;
                return Ok(());
            }
            let now = vfs.external_parts(a.ino).map_err(err)?;
            if !now.wholly_external() || now.rows.iter().any(|r| r.url != url || r.key != x.key) {
                // Written since (the user's bytes win), or not an import of this object.
                s.kept += 1;
                return Ok(());
            }
            if now.rows.is_empty() && a.length != 0 {
                s.kept += 1;
                return Ok(());
            }
            let same = a.length == x.size
                && now
                    .rows
                    .iter()
                    .all(|r| r.etag == etag && r.object_size == x.size);
            if same {
                s.unchanged += 1;
                return Ok(());
            }
            // Changed: the file is re-pointed at the new version (new slice ids: blocks
            // cached of the old one never serve it).
            let set = crate::meta::SetAttr::default();
            vfs.setattr(ctx, a.ino, &set, Some(0), false).map_err(err)?;
            vfs.attach_external(a.ino, &parts_of(url, x, etag), mtime)
                .map_err(err)?;
            s.changed += 1;
        }
        Err(e) if e.errno() == libc::ENOENT => {
            let a = vfs
                .mknod(ctx, dir, name.as_bytes(), Kind::File, 0o644, 0)
                .map_err(err)?;
            let made = vfs.attach_external(a.ino, &parts_of(url, x, etag), mtime);
            if let Err(e) = made {
                let _ = vfs.unlink(ctx, dir, name.as_bytes());
                return Err(err(e));
            }
            s.imported += 1;
            s.bytes += x.size;
        }
        Err(e) => return Err(err(e)).context("looking it up"),
    }
    Ok(())
}

/// `--refresh`: unlinks the files under the import's directory that are still wholly an
/// import of an object of this source that is gone.
fn remove_deleted(
    vfs: &Vfs,
    ctx: &Ctx,
    root: Ino,
    url: &str,
    keys: &HashSet<String>,
    s: &mut Summary,
) -> anyhow::Result<()> {
    let mut todo = vec![(root, String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        let mut cookie = 0;
        let mut gone = Vec::new();
        let fh = vfs.opendir(dir, libc::O_RDONLY).map_err(err)?;
        loop {
            let page = vfs.readdir(ctx, dir, cookie, 1000, true);
            let page = match page {
                Ok(p) => p,
                Err(e) => {
                    let _ = vfs.releasedir(fh);
                    return Err(err(e));
                }
            };
            let Some(last) = page.last() else {
                break;
            };
            cookie = last.cookie;
            for e in page {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                if dir == ROOT_INO && e.name == crate::meta::trash::TRASH_NAME {
                    continue;
                }
                let Ok(name) = std::str::from_utf8(&e.name) else {
                    continue;
                };
                let key = format!("{prefix}{name}");
                let a = match e.attr {
                    Some(a) => a,
                    None => vfs.getattr(e.ino).map_err(err)?,
                };
                match a.kind {
                    Kind::Dir => todo.push((a.ino, format!("{key}/"))),
                    Kind::File if !keys.contains(&key) => {
                        let parts = vfs.external_parts(a.ino).map_err(err)?;
                        let ours = !parts.rows.is_empty()
                            && parts.wholly_external()
                            && parts.rows.iter().all(|r| r.url == url && r.key == key);
                        if ours {
                            gone.push(e.name.clone());
                        } else {
                            s.kept += 1;
                        }
                    }
                    _ => {}
                }
            }
        }
        let _ = vfs.releasedir(fh);
        for name in gone {
            vfs.unlink(ctx, dir, &name).map_err(err)?;
            s.deleted += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_are_not_paths_are_refused_and_parts_cover_the_object() {
        assert!(usable_key("a/b.txt"));
        for bad in ["", "a//b", "./a", "a/../b", "a/"] {
            assert!(!usable_key(bad), "{bad}");
        }
        let o = ObjectInfo {
            key: "k".into(),
            size: 2 * CHUNK_SIZE + 5,
            modified: 0,
            etag: Some("\"e\"".into()),
        };
        let p = parts_of("s3://b", &o, "\"e\"");
        assert_eq!(p.len(), 3);
        assert_eq!((p[2].base, p[2].size), (2 * CHUNK_SIZE, 5));
        assert!(p.iter().all(|x| x.object_size == o.size && x.key == "k"));
    }
}
