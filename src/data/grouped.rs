//! The data store as a member of a peer cache group (`peers`): what it serves to the others
//! (its staged blocks, its disk cache, the blocks in its memory cache), how it fetches and
//! keeps the blocks it owns, and how a read asks the group before the bucket.
//!
//! Not for: the group's protocol, placement or trust (`peers`), or reads without a group
//! (`data::fetch_uncached`).

use std::ops::Range;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use futures::future::BoxFuture;

use super::peers::{Group, Holder, Source};
use super::{Decoder, Shared};
use crate::object;

/// The data store under its group (weak: the store holds the group).
pub(crate) struct Held(pub(crate) Weak<Shared>);

fn closed() -> object::Error {
    object::Error::Io(std::io::Error::other("the data store is closing"))
}

impl Holder for Held {
    fn held(&self, key: &str) -> BoxFuture<'static, Option<Bytes>> {
        let (shared, key) = (self.0.upgrade(), key.to_string());
        Box::pin(async move {
            let s = shared?;
            // A pack still open is not served: bytes are appended to it.
            if let Some(st) = s.stage.as_ref().filter(|st| !st.is_raw(&key)) {
                if let Ok(Some(obj)) = st.read(&key) {
                    return Some(obj);
                }
            }
            if let Some(d) = s.disk.clone().filter(|d| d.may_have(&key)) {
                let k = key.clone();
                if let Ok(Some(obj)) =
                    tokio::task::spawn_blocking(move || d.get_object(&k, Ok)).await
                {
                    return Some(obj);
                }
            }
            // Encoding again an encrypted or compressed block costs more than the bucket's.
            if s.codec.is_none() {
                if let Some(data) = s.cache.get(&key) {
                    return Some(s.encode(&key, data).concat().into());
                }
            }
            None
        })
    }

    fn held_ranges(
        &self,
        key: &str,
        ranges: Vec<Range<usize>>,
    ) -> BoxFuture<'static, Option<Vec<u8>>> {
        let (shared, key) = (self.0.upgrade(), key.to_string());
        Box::pin(async move {
            let s = shared?;
            let cut = |obj: &[u8]| -> Option<Vec<u8>> {
                let mut out = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum());
                for r in &ranges {
                    out.extend_from_slice(obj.get(r.clone())?);
                }
                Some(out)
            };
            // A staged block is read whole (it is on local disk, and rarely asked for).
            if let Some(st) = s.stage.as_ref().filter(|st| !st.is_raw(&key)) {
                if let Ok(Some(obj)) = st.read(&key) {
                    return cut(&obj);
                }
            }
            // From the disk cache only the ranges are read (4 KiB, not the 4 MiB object).
            if let Some(d) = s.disk.clone().filter(|d| d.may_have(&key)) {
                let (k, r) = (key.clone(), ranges.clone());
                if let Ok(Some(got)) =
                    tokio::task::spawn_blocking(move || d.get_object_ranges(&k, &r)).await
                {
                    return Some(got);
                }
            }
            if s.codec.is_none() {
                if let Some(data) = s.cache.get(&key) {
                    // The object is the data then its checksums: a range may span both,
                    // so the parts are cut where they meet, not joined (4 MiB copied).
                    let parts = s.encode(&key, data);
                    let total: usize = parts.iter().map(|p| p.len()).sum();
                    if ranges.iter().any(|r| r.start > r.end || r.end > total) {
                        return None;
                    }
                    let mut out = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum());
                    for r in &ranges {
                        let mut base = 0;
                        for part in &parts {
                            let (a, b) = (r.start.max(base), r.end.min(base + part.len()));
                            if a < b {
                                out.extend_from_slice(&part[a - base..b - base]);
                            }
                            base += part.len();
                        }
                    }
                    return Some(out);
                }
            }
            None
        })
    }

    fn fetch(&self, key: &str) -> BoxFuture<'static, object::Result<Bytes>> {
        let (shared, key) = (self.0.upgrade(), key.to_string());
        Box::pin(async move { shared.ok_or_else(closed)?.obj.get(&key).await })
    }

    fn keep(&self, key: &str, obj: Bytes) -> BoxFuture<'static, ()> {
        let (shared, key) = (self.0.upgrade(), key.to_string());
        Box::pin(async move {
            let Some(s) = shared else {
                return;
            };
            let Some(disk) = &s.disk else {
                return;
            };
            // The disk cache keeps objects with their checksums: a volume without them
            // stores the bare data.
            let obj = match s.format.checksums || s.codec.is_some() {
                true => obj,
                false => s.layout.sums(&key).encode(&obj),
            };
            // Kept in the page cache: the group reads it from there, once per asker.
            disk.put_behind(key, obj, true).await;
        })
    }

    fn is_block(&self, key: &str) -> bool {
        let Some(s) = self.0.upgrade() else {
            return false;
        };
        !key.contains("..")
            && s.layout
                .chunks_prefixes()
                .iter()
                .any(|p| key.starts_with(p.as_str()))
    }
}

/// The data of block `key` through the group: from its owner (checked as any stored object;
/// a wrong answer is reported and the bucket read instead), or from the bucket once for the
/// group. None: read it as without a group (no group, or the bucket failed or was wrong).
pub(crate) async fn from_group(shared: &Shared, key: &str, decoder: &Decoder) -> Option<Bytes> {
    let g: Arc<Group> = shared.peers.get()?.clone();
    let (obj, src) = g.object(key).await.ok()?;
    match decoder.clone().decode_async(obj).await {
        Ok(d) => return Some(d),
        Err(problem) => match src {
            Source::Peer(member) => g.wrong(member, key, &problem),
            Source::Bucket => return None,
        },
    }
    let obj = g.own(key).await.ok()?;
    decoder.clone().decode_async(obj).await.ok()
}

/// Bytes `a` of block `key` (`blen` bytes) and their checksums (`s`, ranges of its object),
/// from the block's owner if it holds it: a small read's, verified here by `check`. None:
/// read them from the bucket (no group, the owner does not hold the block, failed, or
/// answered wrong: then reported).
pub(crate) async fn held_ranges_from_group(
    shared: &Shared,
    key: &str,
    a: std::ops::Range<usize>,
    s: std::ops::Range<usize>,
    check: impl FnOnce(&[u8], &[u8]) -> bool,
) -> Option<Bytes> {
    let g: Arc<Group> = shared.peers.get()?.clone();
    let (got, member) = g.held_ranges(key, &[a.clone(), s]).await?;
    let (d, trailer) = got.split_at(a.len().min(got.len()));
    if d.len() == a.len() && check(d, trailer) {
        return Some(got.slice(..a.len()));
    }
    g.wrong(
        member,
        key,
        "a small read's segments failed their checksums",
    );
    None
}
