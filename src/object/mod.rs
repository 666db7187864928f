//! The bucket: a thin wrapper over the `object_store` crate.
//!
//! One type, [`ObjectStorage`], built from a storage URL (`file:///dir`, `memory://`), with the
//! few calls the data layer needs: put, get (whole or a range), delete, list, and `sync` (which
//! makes local-directory objects durable on disk; remote stores are durable once put returns).
//!
//! Not for: block layout or caching (that is `data`).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// Errors of the object layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    BadUrl(String),
    #[error("object {0} not found")]
    NotFound(String),
    #[error("object storage {url}: {step} failed: {msg}")]
    Unusable {
        url: String,
        step: &'static str,
        msg: String,
        /// The errno an application would see for the failure.
        errno: i32,
    },
    #[error("object storage: {0}")]
    Store(#[from] object_store::Error),
    #[error("object storage: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The errno an application should see for this failure.
    pub fn errno(&self) -> i32 {
        let io = match self {
            Error::Io(e) => Some(e),
            Error::Store(object_store::Error::Generic { source, .. }) => find_io(source.as_ref()),
            Error::Unusable { errno, .. } => return *errno,
            _ => None,
        };
        match io.and_then(|e| e.raw_os_error()) {
            Some(libc::ENOSPC) => libc::ENOSPC,
            Some(libc::EDQUOT) => libc::EDQUOT,
            _ => libc::EIO,
        }
    }
}

fn find_io<'a>(mut e: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    loop {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        e = e.source()?;
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// An object as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Last modification, ns since the epoch.
    pub modified: i64,
}

/// A bucket (or a local directory used as one).
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    url: String,
    /// For `file://`: the directory, so that written objects can be fsynced.
    local_root: Option<PathBuf>,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectStorage({})", self.url)
    }
}

impl ObjectStorage {
    /// Opens the storage a URL names. `create` makes a missing local directory.
    pub fn open(url: &str, create: bool) -> Result<ObjectStorage> {
        let bad = |why: &str| {
            Error::BadUrl(format!(
                "invalid storage URL '{url}': {why}; expected file:///abs/dir or memory://"
            ))
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        match scheme {
            "file" => {
                if !rest.starts_with('/') {
                    return Err(bad(
                        "the path must be absolute (three slashes: file:///abs/dir)",
                    ));
                }
                let dir = PathBuf::from(rest);
                if create {
                    std::fs::create_dir_all(&dir).map_err(|e| Error::Unusable {
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
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)?
                    .with_automatic_cleanup(true);
                Ok(ObjectStorage {
                    store: Arc::new(fs),
                    url: url.into(),
                    local_root: Some(dir),
                })
            }
            "memory" => Ok(ObjectStorage {
                store: Arc::new(object_store::memory::InMemory::new()),
                url: url.into(),
                local_root: None,
            }),
            "s3" | "gs" | "az" => Err(bad(&format!(
                "{scheme}:// is not supported by this build yet"
            ))),
            other => Err(bad(&format!("unknown scheme '{other}'"))),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The local directory, for `file://` storage.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local_root.as_deref()
    }

    pub async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        self.store
            .put(&ObjPath::from(key), PutPayload::from(data))
            .await?;
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<Bytes> {
        match self.store.get(&ObjPath::from(key)).await {
            Ok(r) => Ok(r.bytes().await?),
            Err(object_store::Error::NotFound { .. }) => Err(Error::NotFound(key.into())),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        match self.store.get_range(&ObjPath::from(key), range).await {
            Ok(b) => Ok(b),
            Err(object_store::Error::NotFound { .. }) => Err(Error::NotFound(key.into())),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes an object; a missing object is not an error.
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&ObjPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Every object under `prefix`.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let p = ObjPath::from(prefix.trim_end_matches('/'));
        let items: Vec<_> = self.store.list(Some(&p)).try_collect().await?;
        Ok(items
            .into_iter()
            .map(|m| ObjectInfo {
                key: m.location.to_string(),
                size: m.size,
                modified: m.last_modified.timestamp_nanos_opt().unwrap_or(0),
            })
            .collect())
    }

    /// Makes the given objects durable (fsync for a local directory; nothing otherwise).
    pub fn sync(&self, keys: &[String]) -> Result<()> {
        let Some(root) = &self.local_root else {
            return Ok(());
        };
        let mut dirs = std::collections::BTreeSet::new();
        for k in keys {
            let p = root.join(k);
            match std::fs::File::open(&p) {
                Ok(f) => f.sync_all()?,
                // Deleted since it was written (its slice was truncated away or compacted).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            }
            if let Some(d) = p.parent() {
                dirs.insert(d.to_path_buf());
            }
        }
        for d in dirs {
            std::fs::File::open(&d)?.sync_all()?;
        }
        Ok(())
    }

    /// Proves the storage usable: put, get, list and delete a probe object.
    pub async fn check(&self, prefix: &str) -> Result<()> {
        let key = format!("{prefix}/.probe-{}", std::process::id());
        let fail = |step: &'static str, e: Error| Error::Unusable {
            url: self.url.clone(),
            step,
            msg: e.to_string(),
            errno: e.errno(),
        };
        let body = Bytes::from_static(b"unkai probe");
        self.put(&key, body.clone())
            .await
            .map_err(|e| fail("writing a probe object", e))?;
        let got = self
            .get(&key)
            .await
            .map_err(|e| fail("reading the probe object", e))?;
        if got != body {
            return Err(fail(
                "reading the probe object",
                Error::NotFound("content differs".into()),
            ));
        }
        let listed = self.list(prefix).await.map_err(|e| fail("listing", e))?;
        if !listed.iter().any(|o| o.key == key) {
            return Err(fail("listing", Error::NotFound(key.clone())));
        }
        self.delete(&key)
            .await
            .map_err(|e| fail("deleting the probe object", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn local_roundtrip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/bucket", dir.path().display());
        assert!(
            ObjectStorage::open(&url, false).is_err(),
            "missing dir must be refused"
        );
        let s = ObjectStorage::open(&url, true).unwrap();
        let rt = rt();
        rt.block_on(async {
            s.check("vol").await.unwrap();
            s.put("vol/a/b", Bytes::from_static(b"hello world"))
                .await
                .unwrap();
            assert_eq!(
                s.get("vol/a/b").await.unwrap(),
                Bytes::from_static(b"hello world")
            );
            assert_eq!(
                s.get_range("vol/a/b", 6..11).await.unwrap(),
                Bytes::from_static(b"world")
            );
            let listed = s.list("vol").await.unwrap();
            assert_eq!(listed.len(), 1);
            assert_eq!((listed[0].key.as_str(), listed[0].size), ("vol/a/b", 11));
            assert!(listed[0].modified > 0);
            assert!(matches!(s.get("vol/nope").await, Err(Error::NotFound(_))));
            s.delete("vol/a/b").await.unwrap();
            s.delete("vol/a/b").await.unwrap();
            assert!(s.list("vol").await.unwrap().is_empty());
        });
        assert!(dir.path().join("bucket").is_dir());
        s.sync(&[]).unwrap();
    }

    #[test]
    fn bad_urls() {
        for u in ["bucket", "file://rel/dir", "ftp://x", "s3://bucket"] {
            let e = ObjectStorage::open(u, false).unwrap_err().to_string();
            assert!(e.contains("storage URL"), "{u}: {e}");
        }
    }
}
