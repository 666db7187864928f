//! The five requests unkai makes of a bucket (put, get, ranged get, delete, list) as one
//! small trait, [`Bucket`], and [`Native`], which makes them of an `object_store` store.
//!
//! What surrounds every request is one wrapper per concern, each a `Bucket` around another
//! `Bucket`, in the manner of object_store's `LimitStore` and `ThrottledStore`. From the
//! outside in: [`limit::Limited`](super::limit::Limited) (requests in flight),
//! [`retry::Retried`](super::retry::Retried) (a timeout per attempt, retries with backoff),
//! [`faulty::Faulty`](super::faulty::Faulty) (fault injection, only with `UNKAI_FAULTS`),
//! [`traffic::Counted`](super::traffic::Counted) (objects and bytes moved), then `Native`.
//!
//! Why not wrap `ObjectStore` itself as `LimitStore` does: unkai retries a whole get (the
//! request and reading its body) and injects faults into the bytes read, which `get_opts`
//! (a response whose body is read later) does not allow; and unkai needs five requests, not
//! the whole trait (multipart uploads, copies, renames, listings by delimiter...).
//!
//! Not for: mapping errors for callers (`NotFound`, errno: that is `ObjectStorage`), or
//! keys' meaning (that is `data::layout`).

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::{ObjectInfo, Pin};

/// The result of one request, with object_store's error (whose kind decides retries).
pub type StoreResult<T> = std::result::Result<T, object_store::Error>;

/// The requests unkai makes of a bucket, by key.
#[async_trait::async_trait]
pub trait Bucket: Send + Sync {
    /// `data` may come in parts (a block, then its checksums), sent as one object.
    async fn put(&self, key: &str, data: PutPayload) -> StoreResult<()>;
    /// The whole object.
    async fn get(&self, key: &str) -> StoreResult<Bytes>;
    /// Bytes `range` of the object; with a `pin`, only of the version it names (an object
    /// imported by reference): another ETag or size is `Precondition`, a missing object
    /// `NotFound`, never bytes of another version.
    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        pin: Option<&Pin>,
    ) -> StoreResult<Bytes>;
    async fn delete(&self, key: &str) -> StoreResult<()>;
    /// Every object under `prefix`.
    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>>;
}

/// The requests made of an `object_store` store, once each.
pub struct Native(pub Arc<dyn ObjectStore>);

#[async_trait::async_trait]
impl Bucket for Native {
    async fn put(&self, key: &str, data: PutPayload) -> StoreResult<()> {
        self.0.put(&ObjPath::from(key), data).await?;
        Ok(())
    }

    async fn get(&self, key: &str) -> StoreResult<Bytes> {
        self.0.get(&ObjPath::from(key)).await?.bytes().await
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        pin: Option<&Pin>,
    ) -> StoreResult<Bytes> {
        let path = ObjPath::from(key);
        let Some(pin) = pin else {
            return self.0.get_range(&path, range).await;
        };
        // If-Match asks the server; the answer's own ETag and size are compared too, for
        // servers that ignore If-Match on a ranged GET.
        let opts = object_store::GetOptions::new()
            .with_range(Some(range))
            .with_if_match(Some(pin.etag.clone()));
        let got = self.0.get_opts(&path, opts).await?;
        let (etag, size) = (got.meta.e_tag.clone().unwrap_or_default(), got.meta.size);
        if etag != pin.etag || size != pin.size {
            return Err(object_store::Error::Precondition {
                path: key.into(),
                source: format!("ETag {} -> {}, size {} -> {size}", pin.etag, etag, pin.size)
                    .into(),
            });
        }
        got.bytes().await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.0.delete(&ObjPath::from(key)).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        let p = ObjPath::from(prefix.trim_end_matches('/'));
        let items: Vec<object_store::ObjectMeta> = self.0.list(Some(&p)).try_collect().await?;
        Ok(items
            .into_iter()
            .map(|m| ObjectInfo {
                key: m.location.to_string(),
                size: m.size,
                modified: m.last_modified.timestamp_nanos_opt().unwrap_or(0),
                etag: m.e_tag,
            })
            .collect())
    }
}
