//! Read-ahead: whole blocks fetched into the memory cache before a sequential reader asks
//! for them, a bounded number at once, each fetched once (a read that needs a block being
//! fetched waits for that fetch instead of starting its own).
//!
//! Not for: deciding what to fetch ahead (that is `vfs`, which knows the reader's stream), or
//! the cache itself (`data::cache`).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared as SharedFuture};
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use super::{DataStore, Shared, SliceRange};

/// Blocks fetched ahead at once (per mount).
const AHEAD_AT_ONCE: usize = 16;

/// A fetch ahead in progress: the block, or `None` if it failed (the reader then fetches it
/// itself, and reports what goes wrong).
pub(crate) type Fetching = SharedFuture<BoxFuture<'static, Option<Bytes>>>;

/// The fetches ahead of one mount.
pub(crate) struct Ahead {
    running: Mutex<HashMap<String, Fetching>>,
    permits: Arc<Semaphore>,
    /// Reads that waited for a fetch ahead instead of fetching themselves.
    pub(crate) joined: std::sync::atomic::AtomicU64,
}

impl Default for Ahead {
    fn default() -> Self {
        Ahead {
            running: Mutex::default(),
            permits: Arc::new(Semaphore::new(AHEAD_AT_ONCE)),
            joined: Default::default(),
        }
    }
}

impl Ahead {
    /// The fetch of `key` in progress, if any.
    pub(crate) fn running(&self, key: &str) -> Option<Fetching> {
        self.running.lock().get(key).cloned()
    }
}

impl DataStore {
    /// Starts fetching, in the background, every block that `ranges` touch and the memory
    /// cache lacks (whole blocks, into the cache). Returns at once.
    pub fn fetch_ahead(&self, ranges: &[SliceRange]) {
        let bs = self.block_size() as u64;
        let external = ranges.iter().map(|r| r.id);
        let external = external.filter(|id| crate::meta::slice::is_external(*id));
        if let Err(e) = self.shared.externals.learn(external) {
            tracing::debug!("no read-ahead of imported objects: {e}");
            return;
        }
        for r in ranges {
            let (start, end) = (r.start as u64, r.start as u64 + r.len as u64);
            let mut b = start / bs;
            while b * bs < end {
                let blen = (r.size as u64 - b * bs).min(bs) as usize;
                let key = self.shared.block_key(r.id, b as u32, blen as u32);
                self.start_ahead(key, blen);
                b += 1;
            }
        }
    }

    fn start_ahead(&self, key: String, blen: usize) {
        let shared = &self.shared;
        if shared.cache.contains(&key) {
            return;
        }
        let mut running = shared.ahead.running.lock();
        if running.contains_key(&key) {
            return;
        }
        // Only room free now: a reader holding room may be waiting for this very fetch.
        let Some(room) = shared.budget.try_take(blen) else {
            return;
        };
        let (sh, k, permits) = (shared.clone(), key.clone(), shared.ahead.permits.clone());
        let fut: Fetching = async move {
            let _room = room;
            let _permit = permits.acquire_owned().await.ok()?;
            if let Some(b) = sh.cache.get(&k) {
                return Some(b);
            }
            // Only settled bytes are shared with the readers that come: see `fetch_uncached`.
            match super::fetch_uncached(&sh, &k, blen, 0..blen, true).await {
                Ok((b, true)) => Some(b),
                _ => None,
            }
        }
        .boxed()
        .shared();
        running.insert(key.clone(), fut.clone());
        drop(running);
        let weak = Arc::downgrade(shared);
        self.runtime().spawn(async move {
            if fut.await.is_none() {
                tracing::debug!("fetching {key} ahead failed; its reader fetches it itself");
            }
            if let Some(sh) = weak.upgrade() {
                sh.ahead.running.lock().remove(&key);
            }
        });
    }
}

/// Waits for the fetch ahead of `key`, if one is running: its block, or `None`.
pub(crate) async fn wait_ahead(shared: &Shared, key: &str) -> Option<Bytes> {
    let fut = shared.ahead.running(key)?;
    shared
        .ahead
        .joined
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    fut.await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::{Duration, Instant};

    use bytes::Bytes;

    use crate::data::{Config, DataStore, SliceRange, SliceUpload};

    /// Blocks fetched ahead are each fetched once: a read of them while the fetches run
    /// waits for those instead of sending its own requests.
    #[test]
    fn a_read_waits_for_the_fetch_ahead_of_its_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let (obj, faults, hang) = crate::data::tests::hanging_bucket(dir.path());
        let fmt = crate::data::tests::store(1000).format().clone();
        let ds = DataStore::new(obj, fmt, Config::default()).unwrap();
        let data: Vec<u8> = (0..4000u32).map(|i| (i % 251) as u8).collect();
        let mut up = SliceUpload::start(&ds, || Ok::<_, ()>(5)).unwrap();
        for (i, part) in data.chunks(1000).enumerate() {
            up.put_block(i as u32, Bytes::copy_from_slice(part));
        }
        let keys = up.wait().unwrap();
        drop(up);
        for k in &keys {
            ds.shared.cache.remove(k);
        }
        let gets = || ds.traffic().gets.load(Relaxed);
        let before = gets();
        std::fs::write(&hang, b"").unwrap();
        let whole = SliceRange {
            id: 5,
            size: 4000,
            start: 0,
            len: 4000,
        };
        ds.fetch_ahead(&[whole]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while faults.held.load(Relaxed) < 4 {
            assert!(Instant::now() < deadline, "the fetches ahead did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        let reader = {
            let ds = ds.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4000];
                ds.read(&mut [(whole, &mut buf[..])], true).unwrap();
                buf
            })
        };
        // The read waits for the four fetches running (none of its own is held meanwhile).
        while ds.shared.ahead.joined.load(Relaxed) < 4 {
            assert!(
                Instant::now() < deadline,
                "the read did not wait for the fetches ahead"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(faults.held.load(Relaxed), 4);
        std::fs::remove_file(&hang).unwrap();
        assert_eq!(reader.join().unwrap(), data);
        assert_eq!(gets() - before, 4, "each block fetched once");
        // Cached now: nothing more to fetch ahead.
        ds.fetch_ahead(&[whole]);
        let mut buf = vec![0u8; 4000];
        ds.read(&mut [(whole, &mut buf[..])], false).unwrap();
        assert_eq!(gets() - before, 4);
    }
}
