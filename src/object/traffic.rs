//! [`Counted`]: counts the objects and bytes put to and got from the bucket ([`Traffic`]).
//! It is the innermost wrapper: it counts what the bucket itself took and returned, once per
//! successful request (failed attempts count nothing; injected faults are applied after).
//!
//! Not for: deciding anything from the counts (they are reported, e.g. at unmount).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::bucket::{Bucket, StoreResult};
use super::{ObjectInfo, Payload};

/// Objects and bytes put and got through one `ObjectStorage` since it opened.
#[derive(Debug, Default)]
pub struct Traffic {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
}

impl Traffic {
    /// Takes one put and one get of `len` bytes back off the counts (a probe of the store,
    /// which is not the traffic of what the store is used for).
    pub fn forget_round_trip(&self, len: u64) {
        self.puts.fetch_sub(1, Ordering::Relaxed);
        self.put_bytes.fetch_sub(len, Ordering::Relaxed);
        self.gets.fetch_sub(1, Ordering::Relaxed);
        self.get_bytes.fetch_sub(len, Ordering::Relaxed);
    }
}

/// Counts the successful puts and gets of `inner` into a shared [`Traffic`].
pub struct Counted<B> {
    inner: B,
    traffic: Arc<Traffic>,
}

impl<B: Bucket> Counted<B> {
    pub fn new(inner: B, traffic: Arc<Traffic>) -> Self {
        Counted { inner, traffic }
    }

    fn got(&self, b: Bytes) -> Bytes {
        self.traffic.gets.fetch_add(1, Ordering::Relaxed);
        self.traffic
            .get_bytes
            .fetch_add(b.len() as u64, Ordering::Relaxed);
        b
    }
}

#[async_trait::async_trait]
impl<B: Bucket> Bucket for Counted<B> {
    async fn put(&self, key: &str, data: Payload) -> StoreResult<()> {
        let len = data.content_length() as u64;
        self.inner.put(key, data).await?;
        self.traffic.puts.fetch_add(1, Ordering::Relaxed);
        self.traffic.put_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    async fn get(&self, key: &str) -> StoreResult<Bytes> {
        Ok(self.got(self.inner.get(key).await?))
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> StoreResult<Bytes> {
        Ok(self.got(self.inner.get_range(key, range).await?))
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.inner.list(prefix).await
    }
}
