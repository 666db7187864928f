//! External slices (`unkai import`): blocks of slices whose bytes are an object outside the
//! volume, fetched by ranged GETs pinned to the version that was imported (`If-Match` on its
//! ETag, the answer's ETag and size compared: `object::get_pinned`). They go through the same
//! memory cache, read-ahead and disk cache as the volume's blocks, keyed `ext/ID_INDEX_LEN`
//! (outside every prefix of the volume, and never a key of the bucket), so a cached block
//! holds bytes of the recorded version only and a read never mixes two versions.
//!
//! Not for: which slices are external and their rows (`meta`; `vfs` hands the store a
//! resolver), the pinned GET itself (`object`), or importing (`import`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::{Error, Result, Shared};
use crate::meta::{External, slice};
use crate::object::{self, ObjectStorage, Pin};

/// Looks up the row of an external slice (`Meta::external`), from a plain thread.
pub type Resolver = Box<dyn Fn(u64) -> std::result::Result<Option<External>, String> + Send + Sync>;

/// The key of block `index` (of `len` bytes) of external slice `id`, in the caches.
pub fn block_key(id: u64, index: u32, len: u32) -> String {
    format!("ext/{id}_{index}_{len}")
}

/// The slice id and block index of an external block's key.
fn parse(key: &str) -> Option<(u64, u32)> {
    let rest = key.strip_prefix("ext/")?;
    let mut it = rest.split('_');
    let id: u64 = it.next()?.parse().ok()?;
    let index = it.next()?.parse().ok()?;
    slice::is_external(id).then_some((id, index))
}

/// An external slice's row and the store that holds its object.
struct Known {
    row: External,
    store: Arc<ObjectStorage>,
}

/// The external slices this store has read, and the stores of their objects.
#[derive(Default)]
pub(crate) struct Externals {
    resolver: Mutex<Option<Arc<Resolver>>>,
    /// Rows never change (a refreshed object gets new ids): kept for the store's life.
    known: Mutex<HashMap<u64, Arc<Known>>>,
    stores: Mutex<HashMap<String, Arc<ObjectStorage>>>,
    /// Objects already reported changed (one warning each).
    warned: Mutex<HashSet<(String, String, String)>>,
}

impl Externals {
    fn get(&self, id: u64) -> Option<Arc<Known>> {
        self.known.lock().get(&id).cloned()
    }

    /// Learns the rows of `ids` not known yet (from a plain thread: the resolver may wait
    /// for the metadata engine).
    pub(crate) fn learn(&self, ids: impl Iterator<Item = u64>) -> Result<()> {
        for id in ids {
            if self.known.lock().contains_key(&id) {
                continue;
            }
            let Some(resolve) = self.resolver.lock().clone() else {
                return Err(Error::External(format!(
                    "external slice {id}: this client cannot read imported objects"
                )));
            };
            let row = resolve(id)
                .map_err(|e| Error::External(format!("external slice {id}: {e}")))?
                .ok_or_else(|| {
                    Error::External(format!("external slice {id} has no row (run unkai fsck)"))
                })?;
            let store = {
                let mut stores = self.stores.lock();
                match stores.get(&row.url) {
                    Some(s) => s.clone(),
                    None => {
                        let s = Arc::new(ObjectStorage::open(&row.url, false)?);
                        stores.insert(row.url.clone(), s.clone());
                        s
                    }
                }
            };
            self.known.lock().insert(id, Arc::new(Known { row, store }));
        }
        Ok(())
    }
}

impl super::DataStore {
    /// How this store finds the rows of external slices (`vfs` hands it `Meta::external`).
    pub fn resolve_externals_with(&self, f: Resolver) {
        *self.shared.externals.resolver.lock() = Some(Arc::new(f));
    }
}

/// Where an imported object lives, for messages: its store's URL and its key.
pub fn object_name(row: &External) -> String {
    format!("{}/{}", row.url.trim_end_matches('/'), row.key)
}

/// Bytes `range` of the external block `key` (`blen` bytes), if `key` is one: from the disk
/// cache, or a ranged GET of the object pinned to its imported version (a whole block, cached,
/// when `whole` or most of it is asked for).
pub(crate) async fn fetch(
    shared: &Shared,
    key: &str,
    blen: usize,
    range: std::ops::Range<usize>,
    whole: bool,
) -> Option<Result<Bytes>> {
    let (id, index) = parse(key)?;
    Some(fetch_block(shared, id, index, key, blen, range, whole).await)
}

async fn fetch_block(
    shared: &Shared,
    id: u64,
    index: u32,
    key: &str,
    blen: usize,
    range: std::ops::Range<usize>,
    whole: bool,
) -> Result<Bytes> {
    let known = shared.externals.get(id).ok_or_else(|| {
        Error::External(format!(
            "external slice {id} was read before its row was known"
        ))
    })?;
    let whole = whole || range.len() * 2 >= blen;
    let sums = shared.layout.sums(key);
    // On a volume that encrypts or compresses, the disk cache holds encoded objects only:
    // an imported object's bytes (plain, as the bucket holds them) are not kept there.
    let disk = shared.disk.clone().filter(|_| shared.codec.is_none());
    if whole {
        if let Some(disk) = disk.clone().filter(|d| d.may_have(key)) {
            let k = key.to_string();
            let got = tokio::task::spawn_blocking(move || {
                disk.get_object(&k, |obj| {
                    sums.decode(obj, blen)
                        .ok_or_else(|| "checksum mismatch or wrong size".to_string())
                })
            })
            .await
            .ok()
            .flatten();
            if let Some(d) = got {
                shared.cache.put(key, d.clone());
                return Ok(d.slice(range));
            }
        }
    }
    let row = &known.row;
    let start = row.base + index as u64 * shared.format.block_size as u64;
    let want = if whole {
        start..start + blen as u64
    } else {
        start + range.start as u64..start + range.end as u64
    };
    let pin = Pin {
        etag: row.etag.clone(),
        size: row.object_size,
    };
    match known.store.get_pinned(&row.key, want.clone(), &pin).await {
        Ok(b) if b.len() as u64 == want.end - want.start => {
            if !whole {
                return Ok(b);
            }
            shared.cache.put(key, b.clone());
            if let Some(disk) = &disk {
                disk.put_block_behind(key.to_string(), b.clone(), sums)
                    .await;
            }
            Ok(b.slice(range))
        }
        Ok(b) => Err(Error::Corrupt {
            key: object_name(row),
            problem: format!("range {want:?}: {} bytes", b.len()),
        }),
        Err(e @ object::Error::Changed { .. }) => {
            let what = match &e {
                object::Error::Changed { what, .. } => what.clone(),
                _ => String::new(),
            };
            let first = shared.externals.warned.lock().insert((
                row.url.clone(),
                row.key.clone(),
                row.etag.clone(),
            ));
            if first {
                tracing::warn!(
                    "imported object {} changed behind unkai ({what}): reads of it fail with \
                     EIO until unkai import --refresh",
                    object_name(row)
                );
            }
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_keys_parse_back_and_are_not_block_keys() {
        let id = 7 | slice::EXTERNAL;
        let k = block_key(id, 3, 4096);
        assert_eq!(parse(&k), Some((id, 3)));
        assert_eq!(parse(&block_key(7, 3, 4096)), None);
        assert_eq!(parse("vol/chunks/0/0/7_3_4096"), None);
    }
}
