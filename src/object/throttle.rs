//! [`Throttled`]: bandwidth limits on the bytes sent to the store (puts) and read from it
//! (gets), as `--upload-limit` and `--download-limit` set them (JuiceFS's flags of the same
//! names, in Mbps). Each is a token bucket of governor's (GCRA) counting KiB, shared by every
//! request of the store; a request larger than the bucket's burst waits for it piece by piece,
//! so that N bytes never pass in much less than N / limit, however they are split.
//!
//! Not for: how many requests run at once (that is `limit`), or retries (`retry`): this
//! wrapper sits under the retries, so an attempt that is tried again is paid for again, as
//! it is on the wire.

use std::num::NonZeroU32;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::bucket::{Bucket, StoreResult};
use super::{ObjectInfo, Payload, Pin};

/// Bytes in one cell of the buckets.
const CELL: u64 = 1024;

/// One direction's limit: a token bucket of KiB.
pub struct Rate {
    limiter: DefaultDirectRateLimiter,
    /// Cells that may pass at once (a quarter of a second's worth, at least one).
    burst: u32,
}

impl Rate {
    /// A limit of `bytes_per_sec` (at least one KiB/s).
    pub fn new(bytes_per_sec: u64) -> Rate {
        let per_sec = (bytes_per_sec / CELL).clamp(1, u32::MAX as u64) as u32;
        let burst = (per_sec / 4).max(1);
        let quota = Quota::per_second(NonZeroU32::new(per_sec).expect("at least 1"))
            .allow_burst(NonZeroU32::new(burst).expect("at least 1"));
        Rate {
            limiter: RateLimiter::direct(quota),
            burst,
        }
    }

    /// Waits until `bytes` may pass.
    pub async fn take(&self, bytes: u64) {
        let mut cells = bytes.div_ceil(CELL);
        while cells > 0 {
            let n = cells.min(self.burst as u64) as u32;
            // n is within the burst: never InsufficientCapacity.
            let _ = self
                .limiter
                .until_n_ready(NonZeroU32::new(n).expect("n > 0"))
                .await;
            cells -= n as u64;
        }
    }
}

/// The limits of one store, shared by its wrappers (the probe's requests count too).
#[derive(Default)]
pub struct Rates {
    pub up: Option<Rate>,
    pub down: Option<Rate>,
}

impl Rates {
    /// Limits in bytes per second; None: unlimited.
    pub fn new(up: Option<u64>, down: Option<u64>) -> Rates {
        Rates {
            up: up.map(Rate::new),
            down: down.map(Rate::new),
        }
    }
}

/// `inner`, its puts and gets held to `rates`.
pub struct Throttled<B> {
    inner: B,
    rates: Arc<Rates>,
}

impl<B: Bucket> Throttled<B> {
    pub fn new(inner: B, rates: Arc<Rates>) -> Self {
        Throttled { inner, rates }
    }

    async fn down(&self, got: StoreResult<Bytes>) -> StoreResult<Bytes> {
        // A get's size is known once it is read: its bytes are paid for before it is
        // handed over, which holds back the reads that follow.
        if let (Ok(b), Some(r)) = (&got, &self.rates.down) {
            r.take(b.len() as u64).await;
        }
        got
    }
}

#[async_trait::async_trait]
impl<B: Bucket> Bucket for Throttled<B> {
    async fn put(&self, key: &str, data: Payload) -> StoreResult<()> {
        if let Some(r) = &self.rates.up {
            r.take(data.content_length() as u64).await;
        }
        self.inner.put(key, data).await
    }

    async fn get(&self, key: &str) -> StoreResult<Bytes> {
        let got = self.inner.get(key).await;
        self.down(got).await
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        pin: Option<&Pin>,
    ) -> StoreResult<Bytes> {
        let got = self.inner.get_range(key, range, pin).await;
        self.down(got).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.inner.list(prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn mem() -> super::super::bucket::Native {
        super::super::bucket::Native(Arc::new(object_store::memory::InMemory::new()))
    }

    /// N bytes at a limit of L take at least about N / L (less the burst), in whatever
    /// pieces they pass; only a lower bound is asserted (a slow machine only makes it
    /// longer). Unlimited, the same bytes pass at once (no bound asserted either).
    #[tokio::test]
    async fn puts_and_gets_take_at_least_their_bytes_over_the_limit() {
        let limit = 2_000_000u64; // bytes/s (16 Mbps)
        let t = Throttled::new(mem(), Arc::new(Rates::new(Some(limit), Some(limit))));
        let block = Bytes::from(vec![7u8; 1 << 20]);
        let n = 4u64;
        let least = Duration::from_secs_f64(0.7 * (n << 20) as f64 / limit as f64);
        let start = Instant::now();
        for i in 0..n {
            t.put(&format!("k{i}"), block.clone().into()).await.unwrap();
        }
        let up = start.elapsed();
        assert!(up >= least, "{n} MiB up in {up:?}, under {least:?}");
        let start = Instant::now();
        for i in 0..n {
            let got = t.get(&format!("k{i}")).await.unwrap();
            assert_eq!(got.len(), 1 << 20);
        }
        let down = start.elapsed();
        assert!(down >= least, "{n} MiB down in {down:?}, under {least:?}");
        // Ranges count what they read, not the object's size.
        let start = Instant::now();
        for i in 0..n {
            let got = t
                .get_range(&format!("k{i}"), 0..(1 << 20), None)
                .await
                .unwrap();
            assert_eq!(got.len(), 1 << 20);
        }
        let ranged = start.elapsed();
        assert!(
            ranged >= least,
            "{n} MiB of ranges in {ranged:?}, under {least:?}"
        );
    }
}
