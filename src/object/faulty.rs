//! Fault injection, for tests: errors, throttling, latency, a store that is down, and reads
//! that come back truncated or corrupted. Enabled by `UNKAI_FAULTS`, e.g.
//! `UNKAI_FAULTS=error=0.1,slowdown=0.05,latency_ms=2,truncate=0.05,corrupt=0.02,down_file=/tmp/x`
//! (while `down_file` exists, every request fails; while `hang_file` exists, every request
//! waits without an answer, as a store that accepts connections and never replies).
//!
//! [`Faulty`] injects them per attempt, inside the retry loop (`retry::Retried`), exactly
//! where a network failure would surface; the bytes read are damaged after they were counted
//! (`traffic::Counted`). Not for: production use.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

use super::bucket::{Bucket, StoreResult};
use super::{ObjectInfo, Payload, Pin};

/// What a request is, for fault decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Put,
    Get,
    Delete,
    List,
}

#[derive(Debug)]
pub struct Faults {
    pub error: f64,
    pub slowdown: f64,
    pub latency: Duration,
    pub truncate: f64,
    pub corrupt: f64,
    pub down_file: Option<PathBuf>,
    pub hang_file: Option<PathBuf>,
    rng: Mutex<rand::rngs::StdRng>,
    /// Faults injected so far.
    pub injected: AtomicU64,
    /// Requests held by `hang_file` right now.
    pub held: AtomicU64,
}

impl Faults {
    /// Parses a spec such as `error=0.1,latency_ms=5,down_file=/tmp/down`.
    pub fn parse(spec: &str) -> Result<Faults, String> {
        let mut f = Faults {
            error: 0.0,
            slowdown: 0.0,
            latency: Duration::ZERO,
            truncate: 0.0,
            corrupt: 0.0,
            down_file: None,
            hang_file: None,
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(1)),
            injected: AtomicU64::new(0),
            held: AtomicU64::new(0),
        };
        for item in spec.split(',').filter(|s| !s.trim().is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("fault '{item}' has no value"))?;
            let rate = || v.parse::<f64>().map_err(|e| format!("fault {k}: {e}"));
            match k.trim() {
                "error" => f.error = rate()?,
                "slowdown" => f.slowdown = rate()?,
                "truncate" => f.truncate = rate()?,
                "corrupt" => f.corrupt = rate()?,
                "latency_ms" => {
                    f.latency = Duration::from_millis(v.parse().map_err(|e| format!("{k}: {e}"))?)
                }
                "down_file" => f.down_file = Some(PathBuf::from(v)),
                "hang_file" => f.hang_file = Some(PathBuf::from(v)),
                "seed" => {
                    f.rng = Mutex::new(rand::rngs::StdRng::seed_from_u64(
                        v.parse().map_err(|e| format!("{k}: {e}"))?,
                    ))
                }
                other => return Err(format!("unknown fault '{other}'")),
            }
        }
        Ok(f)
    }

    /// The faults `UNKAI_FAULTS` asks for, if any.
    pub fn from_env() -> Option<Faults> {
        let spec = std::env::var("UNKAI_FAULTS").ok()?;
        match Faults::parse(&spec) {
            Ok(f) => {
                tracing::warn!("fault injection enabled: {spec}");
                Some(f)
            }
            Err(e) => {
                tracing::error!("ignoring UNKAI_FAULTS: {e}");
                None
            }
        }
    }

    fn roll(&self, p: f64) -> bool {
        p > 0.0 && self.rng.lock().random_bool(p.min(1.0))
    }

    fn fail(&self, msg: &str) -> object_store::Error {
        self.injected.fetch_add(1, Ordering::Relaxed);
        object_store::Error::Generic {
            store: "faults",
            source: msg.to_string().into(),
        }
    }

    /// Called before each attempt: may delay it or fail it.
    pub async fn before(&self, op: Op) -> Result<(), object_store::Error> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        if self.down_file.as_ref().is_some_and(|p| p.exists()) {
            return Err(self.fail(&format!("injected: store is down ({op:?})")));
        }
        if let Some(hang) = self.hang_file.as_ref().filter(|h| h.exists()) {
            self.held.fetch_add(1, Ordering::Relaxed);
            while hang.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        if self.roll(self.slowdown) {
            return Err(self.fail("injected: 503 SlowDown, please reduce your request rate"));
        }
        if self.roll(self.error) {
            return Err(self.fail("injected: connection reset by peer"));
        }
        Ok(())
    }

    /// Called on the bytes a read returned: may cut them short or flip a byte.
    pub fn after_get(&self, data: Bytes) -> Bytes {
        if data.len() > 1 && self.roll(self.truncate) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return data.slice(..data.len() / 2);
        }
        if !data.is_empty() && self.roll(self.corrupt) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            let mut v = data.to_vec();
            let i = self.rng.lock().random_range(0..v.len());
            v[i] ^= 0x5a;
            return Bytes::from(v);
        }
        data
    }
}

/// Injects `faults` into every request of `inner`: before each (delay, failure), and into
/// the bytes each read returns.
pub struct Faulty<B> {
    inner: B,
    faults: Arc<Faults>,
}

impl<B: Bucket> Faulty<B> {
    pub fn new(inner: B, faults: Arc<Faults>) -> Self {
        Faulty { inner, faults }
    }
}

#[async_trait::async_trait]
impl<B: Bucket> Bucket for Faulty<B> {
    async fn put(&self, key: &str, data: Payload) -> StoreResult<()> {
        self.faults.before(Op::Put).await?;
        self.inner.put(key, data).await
    }

    async fn get(&self, key: &str) -> StoreResult<Bytes> {
        self.faults.before(Op::Get).await?;
        Ok(self.faults.after_get(self.inner.get(key).await?))
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        pin: Option<&Pin>,
    ) -> StoreResult<Bytes> {
        self.faults.before(Op::Get).await?;
        Ok(self
            .faults
            .after_get(self.inner.get_range(key, range, pin).await?))
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.faults.before(Op::Delete).await?;
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.faults.before(Op::List).await?;
        self.inner.list(prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let f = Faults::parse("error=0.5,latency_ms=3,down_file=/x,seed=9").unwrap();
        assert_eq!(f.error, 0.5);
        assert_eq!(f.latency, Duration::from_millis(3));
        assert_eq!(f.down_file, Some(PathBuf::from("/x")));
        assert!(Faults::parse("nope=1").is_err());
        assert!(Faults::parse("error").is_err());
    }

    #[tokio::test]
    async fn injects_what_it_is_told() {
        let dir = tempfile::tempdir().unwrap();
        let down = dir.path().join("down");
        let f = Faults::parse(&format!("error=1.0,down_file={}", down.display())).unwrap();
        assert!(f.before(Op::Get).await.is_err());
        let f = Faults::parse(&format!("truncate=1.0,down_file={}", down.display())).unwrap();
        assert!(f.before(Op::Put).await.is_ok());
        assert_eq!(f.after_get(Bytes::from_static(b"abcdef")).len(), 3);
        std::fs::write(&down, b"").unwrap();
        let e = f.before(Op::List).await.unwrap_err().to_string();
        assert!(e.contains("down"), "{e}");
        let f = Faults::parse("corrupt=1.0").unwrap();
        assert_ne!(
            f.after_get(Bytes::from_static(b"abcdef")),
            Bytes::from_static(b"abcdef")
        );
        assert_eq!(f.injected.load(Ordering::Relaxed), 1);
    }
}
