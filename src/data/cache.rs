//! The in-memory block cache: recently read or written blocks, least recently used evicted.
//!
//! Blocks are immutable (a key never changes meaning), so a cached block is never stale.
//! Not for: partial blocks or anything mutable.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use parking_lot::Mutex;

pub struct MemoryCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, (Bytes, u64)>,
    order: BTreeMap<u64, String>,
    tick: u64,
    size: usize,
}

impl MemoryCache {
    pub fn new(capacity: usize) -> MemoryCache {
        MemoryCache {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn get(&self, key: &str) -> Option<Bytes> {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.tick += 1;
        let tick = inner.tick;
        let (b, t) = inner.map.get_mut(key)?;
        inner.order.remove(t);
        *t = tick;
        inner.order.insert(tick, key.to_string());
        Some(b.clone())
    }

    pub fn put(&self, key: &str, block: Bytes) {
        if block.len() > self.capacity {
            return;
        }
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.tick += 1;
        let tick = inner.tick;
        if let Some((old, t)) = inner.map.remove(key) {
            inner.order.remove(&t);
            inner.size -= old.len();
        }
        inner.size += block.len();
        inner.map.insert(key.to_string(), (block, tick));
        inner.order.insert(tick, key.to_string());
        while inner.size > self.capacity {
            let Some((_, k)) = inner.order.pop_first() else {
                break;
            };
            if let Some((b, _)) = inner.map.remove(&k) {
                inner.size -= b.len();
            }
        }
    }

    /// Whether `key` is cached (without making it more recent).
    pub fn contains(&self, key: &str) -> bool {
        self.inner.lock().map.contains_key(key)
    }

    pub fn remove(&self, key: &str) {
        let mut g = self.inner.lock();
        if let Some((b, t)) = g.map.remove(key) {
            g.order.remove(&t);
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
    }
}
