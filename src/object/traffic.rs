//! [`Counted`]: counts the objects and bytes put to and got from the bucket ([`Traffic`]),
//! and times every request by kind, its errors counted. It is the innermost wrapper: it sees
//! each attempt the store answered (a retried request is several), what the bucket itself
//! took and returned (objects and bytes count once per successful request; injected faults
//! are applied after).
//!
//! Not for: deciding anything from the counts (they are reported: at unmount, and as the
//! mount's metrics, `Traffic::figures`).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;

use super::bucket::{Bucket, StoreResult};
use super::{ObjectInfo, Payload, Pin};
use crate::metrics::{self, Families, Histogram};

/// The kinds of request made of a bucket (a HEAD is never made: reads are GETs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    GetRange,
    Put,
    Delete,
    List,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Get, Op::GetRange, Op::Put, Op::Delete, Op::List];

    /// The label of the kind in the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::GetRange => "get_range",
            Op::Put => "put",
            Op::Delete => "delete",
            Op::List => "list",
        }
    }
}

/// Objects and bytes put and got through one `ObjectStorage` since it opened, and the time
/// and errors of its requests by kind.
#[derive(Debug)]
pub struct Traffic {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    /// Objects of a local-directory bucket made durable (fdatasync) for fsyncs.
    pub synced: AtomicU64,
    /// Each attempt's time by kind (`Op as usize`), failed ones too.
    latency: [Histogram; 5],
    /// Attempts that failed by kind (an object not found is an answer, not an error).
    errors: [AtomicU64; 5],
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            puts: AtomicU64::new(0),
            put_bytes: AtomicU64::new(0),
            gets: AtomicU64::new(0),
            get_bytes: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            latency: Op::ALL.map(|op| {
                metrics::latency(
                    "unkai_object_request_duration_seconds",
                    "Requests to the object store by kind (each attempt), and their time.",
                    ("op", op.name()),
                )
            }),
            errors: Default::default(),
        }
    }
}

impl Traffic {
    /// Attempts of kind `op` the store answered so far, failed ones included.
    pub fn requests(&self, op: Op) -> u64 {
        self.latency[op as usize].get_sample_count()
    }

    /// Failed attempts of kind `op` so far.
    pub fn errors(&self, op: Op) -> u64 {
        self.errors[op as usize].load(Ordering::Relaxed)
    }

    /// Records one attempt of kind `op`, begun at `start`, and whether it failed.
    fn record<T>(&self, op: Op, start: Instant, res: &StoreResult<T>) {
        self.latency[op as usize].observe(start.elapsed().as_secs_f64());
        if matches!(res, Err(e) if !matches!(e, object_store::Error::NotFound { .. })) {
            self.errors[op as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The figures as the mount's metrics.
    pub fn figures(&self, out: &mut Families) {
        out.histograms(&self.latency);
        for op in Op::ALL {
            out.counter(
                "unkai_object_request_errors_total",
                "Requests to the object store that failed, by kind (each attempt).",
                &[("op", op.name())],
                self.errors(op),
            );
        }
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.counter(
            "unkai_object_put_bytes_total",
            "Bytes stored in the object store (objects as stored: encoded, with checksums).",
            &[],
            n(&self.put_bytes),
        );
        out.counter(
            "unkai_object_get_bytes_total",
            "Bytes read from the object store.",
            &[],
            n(&self.get_bytes),
        );
        out.counter(
            "unkai_object_synced_total",
            "Objects of a local-directory bucket made durable (fdatasync) for fsyncs.",
            &[],
            n(&self.synced),
        );
    }
}

/// Counts the successful puts and gets of `inner` into a shared [`Traffic`], and times every
/// request.
pub struct Counted<B> {
    inner: B,
    traffic: Arc<Traffic>,
}

impl<B: Bucket> Counted<B> {
    pub fn new(inner: B, traffic: Arc<Traffic>) -> Self {
        Counted { inner, traffic }
    }

    fn got(&self, op: Op, start: Instant, res: StoreResult<Bytes>) -> StoreResult<Bytes> {
        self.traffic.record(op, start, &res);
        let b = res?;
        self.traffic.gets.fetch_add(1, Ordering::Relaxed);
        self.traffic
            .get_bytes
            .fetch_add(b.len() as u64, Ordering::Relaxed);
        Ok(b)
    }
}

#[async_trait::async_trait]
impl<B: Bucket> Bucket for Counted<B> {
    async fn put(&self, key: &str, data: Payload) -> StoreResult<()> {
        let len = data.content_length() as u64;
        let start = Instant::now();
        let res = self.inner.put(key, data).await;
        self.traffic.record(Op::Put, start, &res);
        res?;
        self.traffic.puts.fetch_add(1, Ordering::Relaxed);
        self.traffic.put_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    async fn get(&self, key: &str) -> StoreResult<Bytes> {
        let start = Instant::now();
        self.got(Op::Get, start, self.inner.get(key).await)
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        pin: Option<&Pin>,
    ) -> StoreResult<Bytes> {
        let start = Instant::now();
        self.got(
            Op::GetRange,
            start,
            self.inner.get_range(key, range, pin).await,
        )
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        let start = Instant::now();
        let res = self.inner.delete(key).await;
        self.traffic.record(Op::Delete, start, &res);
        res
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        let start = Instant::now();
        let res = self.inner.list(prefix).await;
        self.traffic.record(Op::List, start, &res);
        res
    }
}
