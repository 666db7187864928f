//! The block caches: blocks read or written recently, kept so that reading them again does
//! not reach the bucket. Two levels: [`MemoryCache`] (decoded blocks in memory, the first
//! level) and, on a mount with a disk cache, the block objects on local disk (`disk`).
//!
//! Blocks are immutable (a key never changes meaning), so a cached block is never stale; it
//! only stops being needed when its slice dies.
//!
//! Not for: what to fetch or when (that is `data` and `vfs`), or blocks waiting for their
//! upload (`data::stage`, which must never lose one: a cache may drop anything at any time).

mod disk;
mod memory;

pub use disk::{DiskCache, DiskConfig, DiskStats};
pub use memory::MemoryCache;
