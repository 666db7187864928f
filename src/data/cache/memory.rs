//! The in-memory block cache (the first level): recently read or written blocks, decoded,
//! the least recently used evicted past its size.
//!
//! Blocks are immutable (a key never changes meaning), so a cached block is never stale.
//! Not for: partial blocks or anything mutable.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use hashlink::LruCache;
use parking_lot::Mutex;

pub struct MemoryCache {
    capacity: usize,
    inner: Mutex<Inner>,
    /// Lookups that found their block (and its bytes), and those that did not.
    pub hits: AtomicU64,
    pub hit_bytes: AtomicU64,
    pub misses: AtomicU64,
}

struct Inner {
    /// Blocks by key, least recently used first.
    blocks: LruCache<String, Bytes>,
    size: usize,
}

impl MemoryCache {
    pub fn new(capacity: usize) -> MemoryCache {
        MemoryCache {
            capacity,
            inner: Mutex::new(Inner {
                blocks: LruCache::new_unbounded(),
                size: 0,
            }),
            hits: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn get(&self, key: &str) -> Option<Bytes> {
        let got = self.inner.lock().blocks.get(key).cloned();
        match &got {
            Some(b) => {
                self.hits.fetch_add(1, Relaxed);
                self.hit_bytes.fetch_add(b.len() as u64, Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Relaxed);
            }
        }
        got
    }

    pub fn put(&self, key: &str, block: Bytes) {
        if block.len() > self.capacity {
            return;
        }
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.size += block.len();
        if let Some(old) = inner.blocks.insert(key.to_string(), block) {
            inner.size -= old.len();
        }
        while inner.size > self.capacity {
            let Some((_, b)) = inner.blocks.remove_lru() else {
                break;
            };
            inner.size -= b.len();
        }
    }

    /// Whether `key` is cached (without making it more recent).
    pub fn contains(&self, key: &str) -> bool {
        self.inner.lock().blocks.contains_key(key)
    }

    pub fn remove(&self, key: &str) {
        let mut g = self.inner.lock();
        if let Some(b) = g.blocks.remove(key) {
            g.size -= b.len();
        }
    }

    pub fn used(&self) -> usize {
        self.inner.lock().size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let c = MemoryCache::new(10);
        c.put("a", Bytes::from_static(b"1234"));
        c.put("b", Bytes::from_static(b"1234"));
        assert!(c.get("a").is_some()); // a is now newer than b
        c.put("c", Bytes::from_static(b"1234"));
        assert!(c.get("b").is_none());
        assert!(c.get("a").is_some());
        assert!(c.get("c").is_some());
        assert_eq!(c.used(), 8);
        c.remove("a");
        assert_eq!(c.used(), 4);
        c.put("huge", Bytes::from(vec![0u8; 11]));
        assert!(c.get("huge").is_none());
        assert_eq!(c.hits.load(Relaxed), 3);
        assert_eq!(c.hit_bytes.load(Relaxed), 12);
        assert_eq!(c.misses.load(Relaxed), 2);
    }
}
