//! `file:///dir`: a local directory used as the bucket.
//!
//! Not for: durability policy (callers decide when to `sync`).

use std::path::Path;
use std::sync::Arc;

use object_store::ObjectStore;

use super::Error;

pub fn build(url: &str, dir: &Path, create: bool) -> Result<Arc<dyn ObjectStore>, Error> {
    if create {
        std::fs::create_dir_all(dir).map_err(|e| Error::Unusable {
            url: url.into(),
            step: "creating the directory",
            msg: e.to_string(),
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })?;
    }
    if !dir.is_dir() {
        return Err(Error::Unusable {
            url: url.into(),
            step: "opening",
            msg: format!("{} is not a directory", dir.display()),
            errno: libc::ENOTDIR,
        });
    }
    let fs =
        object_store::local::LocalFileSystem::new_with_prefix(dir)?.with_automatic_cleanup(true);
    Ok(Arc::new(fs))
}

/// Makes the given objects (and their directories) durable.
pub fn sync(root: &Path, keys: &[String]) -> std::io::Result<()> {
    let mut dirs = std::collections::BTreeSet::new();
    for k in keys {
        let p = root.join(k);
        match std::fs::File::open(&p) {
            // Its data and the size needed to read it back (its times do not matter).
            Ok(f) => f.sync_data()?,
            // Deleted since it was written (its slice was truncated away or compacted).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        if let Some(d) = p.parent() {
            dirs.insert(d.to_path_buf());
        }
    }
    for d in dirs {
        match std::fs::File::open(&d) {
            Ok(f) => f.sync_all()?,
            // Emptied and removed since (the local store removes empty directories).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
