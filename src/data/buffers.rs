//! Block buffers used again: a write that fills whole blocks takes each block's buffer from a
//! small pool, and the buffer goes back to it once the last view of the block (its upload, the
//! memory cache, a reader) is dropped. A fresh buffer of several MiB is memory the kernel must
//! map and zero page by page as it is first written (and the allocator hands such buffers back
//! to the kernel when they are freed), which cost a large write about as much as copying its
//! bytes in (issue 36: page faults and `clear_page` beside the copy, in a profile of `dd`).
//!
//! Not for: deciding when a block is complete (`vfs::writer`), or caching blocks (`cache`).

use bytes::Bytes;
use parking_lot::Mutex;

/// Bytes of idle buffers the pool keeps at most (the rest are freed).
const KEPT_BYTES: usize = 32 << 20;

static IDLE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// An empty buffer of exactly `cap` bytes of capacity: an idle one of that size if any.
pub fn take(cap: usize) -> Vec<u8> {
    {
        let mut idle = IDLE.lock();
        if let Some(i) = idle.iter().rposition(|v| v.capacity() == cap) {
            return idle.swap_remove(i);
        }
    }
    Vec::with_capacity(cap)
}

/// `v` as shared bytes; a buffer of a size the pool keeps (`full` bytes of capacity) goes
/// back to it when the last view of them is dropped.
pub fn freeze(v: Vec<u8>, full: usize) -> Bytes {
    if v.capacity() != full || full > KEPT_BYTES / 2 {
        return Bytes::from(v);
    }
    Bytes::from_owner(Pooled(v))
}

/// A buffer on loan from the pool, as the owner of a `Bytes`.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.0);
        v.clear();
        let mut idle = IDLE.lock();
        let kept: usize = idle.iter().map(Vec::capacity).sum();
        if kept + v.capacity() <= KEPT_BYTES {
            idle.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer frozen and dropped comes back for the next block of its size, its bytes
    /// never seen through a view still alive; another size, or a buffer not full-sized, is
    /// not pooled.
    #[test]
    fn buffers_come_back_once_no_view_is_left() {
        let cap = 1 << 20 | 4096; // a size no other test uses
        let mut v = take(cap);
        v.extend_from_slice(&vec![5u8; cap]);
        let ptr = v.as_ptr();
        let b = freeze(v, cap);
        let view = b.slice(10..20);
        drop(b);
        // Still seen through `view`: not handed out again.
        let other = take(cap);
        assert_ne!(other.as_ptr(), ptr);
        assert_eq!(&view[..], &[5u8; 10]);
        drop(view);
        let again = take(cap);
        assert_eq!(again.as_ptr(), ptr, "the buffer came back");
        assert!(again.is_empty() && again.capacity() == cap);
        // Not full-sized: an ordinary Bytes.
        let small = freeze(vec![1u8; 10], cap);
        assert_eq!(&small[..], &[1u8; 10]);
    }
}
