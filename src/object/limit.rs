//! [`Limited`]: a bound on the requests in flight, as object_store's `LimitStore`, and a
//! tighter one on puts (`--max-uploads`). It is the outermost wrapper: a request holds its
//! permits through all its attempts and backoffs.
//!
//! Not for: rates or timeouts (retries and timeouts are `retry`).

use std::ops::Range;

use bytes::Bytes;
use tokio::sync::Semaphore;

use super::bucket::{Bucket, StoreResult};
use super::{ObjectInfo, Payload, Pin};

/// At most `max` requests of `inner` at a time, and `puts` puts among them; the others wait
/// for a permit.
pub struct Limited<B> {
    inner: B,
    permits: Semaphore,
    puts: Semaphore,
}

impl<B: Bucket> Limited<B> {
    pub fn new(inner: B, max: usize, puts: usize) -> Self {
        Limited {
            inner,
            permits: Semaphore::new(max.max(1)),
            puts: Semaphore::new(puts.max(1)),
        }
    }

    async fn permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.permits
            .acquire()
            .await
            .expect("semaphore is never closed")
    }
}

#[async_trait::async_trait]
impl<B: Bucket> Bucket for Limited<B> {
    async fn put(&self, key: &str, data: Payload) -> StoreResult<()> {
        // The put's own permit first: puts waiting for one leave the others to reads.
        let _put = self
            .puts
            .acquire()
            .await
            .expect("semaphore is never closed");
        let _permit = self.permit().await;
        self.inner.put(key, data).await
    }

    async fn get(&self, key: &str) -> StoreResult<Bytes> {
        let _permit = self.permit().await;
        self.inner.get(key).await
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        pin: Option<&Pin>,
    ) -> StoreResult<Bytes> {
        let _permit = self.permit().await;
        self.inner.get_range(key, range, pin).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        let _permit = self.permit().await;
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        let _permit = self.permit().await;
        self.inner.list(prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Gets that take a while, recording how many run at once.
    #[derive(Default)]
    struct Slow {
        now: AtomicUsize,
        most: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Bucket for Slow {
        async fn put(&self, _: &str, _: Payload) -> StoreResult<()> {
            self.get("").await.map(|_| ())
        }
        async fn get(&self, _: &str) -> StoreResult<Bytes> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            Ok(Bytes::new())
        }
        async fn get_range(&self, _: &str, _: Range<u64>, _: Option<&Pin>) -> StoreResult<Bytes> {
            unimplemented!()
        }
        async fn delete(&self, _: &str) -> StoreResult<()> {
            unimplemented!()
        }
        async fn list(&self, _: &str) -> StoreResult<Vec<ObjectInfo>> {
            unimplemented!()
        }
    }

    #[tokio::test]
    async fn at_most_max_requests_in_flight() {
        let l = Limited::new(Slow::default(), 3, 2);
        let gets = (0..12).map(|_| l.get("k"));
        for r in futures::future::join_all(gets).await {
            r.unwrap();
        }
        assert_eq!(l.inner.most.load(Ordering::SeqCst), 3);
    }

    /// Puts are held to their own, tighter bound (`--max-uploads`).
    #[tokio::test]
    async fn at_most_max_uploads_puts_in_flight() {
        let l = Limited::new(Slow::default(), 3, 2);
        let puts = (0..12).map(|_| l.put("k", Bytes::new().into()));
        for r in futures::future::join_all(puts).await {
            r.unwrap();
        }
        assert_eq!(l.inner.most.load(Ordering::SeqCst), 2);
    }
}
