//! One fetch from the bucket per block however many ask for it at once (single-flight):
//! the first asker fetches, the others wait for its answer; and the objects fetched lately,
//! kept a little while (bounded in bytes), for askers that come just after.
//!
//! Not for: whether to fetch (`peers`), or keeping blocks for long (the disk cache).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::object;

type Cell = Arc<tokio::sync::OnceCell<Result<Bytes, String>>>;

/// The fetches in flight, and the objects fetched lately.
pub struct Flights {
    live: Mutex<HashMap<String, Cell>>,
    recent: Mutex<Recent>,
}

/// Objects fetched lately, the oldest dropped beyond `cap` bytes.
struct Recent {
    order: lru::LruCache<String, Bytes>,
    bytes: usize,
    cap: usize,
}

impl Flights {
    /// Keeping up to `recent_bytes` of objects fetched lately.
    pub fn new(recent_bytes: usize) -> Flights {
        Flights {
            live: Mutex::default(),
            recent: Mutex::new(Recent {
                order: lru::LruCache::unbounded(),
                bytes: 0,
                cap: recent_bytes,
            }),
        }
    }

    /// An object fetched lately.
    pub fn recent(&self, key: &str) -> Option<Bytes> {
        self.recent.lock().order.get(key).cloned()
    }

    /// The object of `key` as `fetch` gets it, run once for all who ask at the same time; with
    /// whether this caller's `fetch` ran.
    pub async fn run<F>(&self, key: &str, fetch: F) -> (object::Result<Bytes>, bool)
    where
        F: Future<Output = object::Result<Bytes>>,
    {
        let cell = self.live.lock().entry(key.to_string()).or_default().clone();
        let mut mine = None;
        let shared = cell
            .get_or_init(|| async {
                let got = fetch.await;
                let out = match &got {
                    Ok(b) => Ok(b.clone()),
                    Err(e) => Err(e.to_string()),
                };
                mine = Some(got);
                out
            })
            .await
            .clone();
        {
            let mut live = self.live.lock();
            if live.get(key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                live.remove(key);
            }
        }
        if let Some(Ok(obj)) = &mine {
            let mut r = self.recent.lock();
            r.bytes += obj.len();
            if let Some(old) = r.order.put(key.to_string(), obj.clone()) {
                r.bytes -= old.len();
            }
            while r.bytes > r.cap {
                match r.order.pop_lru() {
                    Some((_, o)) => r.bytes -= o.len(),
                    None => break,
                }
            }
        }
        match mine {
            Some(got) => (got, true),
            None => (
                shared.map_err(|e| object::Error::Io(std::io::Error::other(e))),
                false,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn many_askers_at_once_fetch_once() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let flights = Arc::new(Flights::new(1 << 20));
        let fetched = Arc::new(AtomicUsize::new(0));
        let got = rt.block_on(async {
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let (f, n) = (flights.clone(), fetched.clone());
                    tokio::spawn(async move {
                        f.run("k", async {
                            n.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                            Ok(Bytes::from_static(b"block"))
                        })
                        .await
                        .0
                        .unwrap()
                    })
                })
                .collect();
            futures::future::join_all(tasks).await
        });
        assert_eq!(fetched.load(Ordering::SeqCst), 1);
        assert!(
            got.iter()
                .all(|r| r.as_ref().unwrap() == &Bytes::from_static(b"block"))
        );
        assert_eq!(flights.recent("k").unwrap(), Bytes::from_static(b"block"));
        assert!(flights.live.lock().is_empty());
    }
}
