//! The bound on block bytes in flight: blocks being encoded and uploaded, fetched and not yet
//! copied out to a reader, fetched ahead. Part of `--memory-limit` (the memory cache and the
//! write buffers have bounds of their own). Whoever holds block bytes in flight takes room
//! here first and waits while there is none; read-ahead only takes room that is free (a
//! reader holding room may wait for a fetch ahead, which must not wait for that room).
//!
//! Not for: memory that stays (caches, buffers), or counting requests (that is `object`).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Room is counted in units of this many bytes.
const UNIT: usize = 64 << 10;

/// Room for block bytes in flight.
#[derive(Clone)]
pub(crate) struct Budget {
    room: Arc<Semaphore>,
    units: usize,
}

/// Room taken; given back when dropped.
pub(crate) struct Room(#[allow(dead_code)] OwnedSemaphorePermit);

impl Budget {
    pub(crate) fn new(bytes: usize) -> Budget {
        let units = bytes.div_ceil(UNIT).max(1);
        Budget {
            room: Arc::new(Semaphore::new(units)),
            units,
        }
    }

    /// The units of `bytes`; more than the whole budget takes all of it.
    fn units(&self, bytes: usize) -> u32 {
        bytes.div_ceil(UNIT).clamp(1, self.units) as u32
    }

    /// Room for `bytes`, waiting for it.
    pub(crate) async fn take(&self, bytes: usize) -> Room {
        let permit = self
            .room
            .clone()
            .acquire_many_owned(self.units(bytes))
            .await;
        Room(permit.expect("the budget's semaphore is never closed"))
    }

    /// Room for `bytes` if it is free now.
    pub(crate) fn try_take(&self, bytes: usize) -> Option<Room> {
        self.room
            .clone()
            .try_acquire_many_owned(self.units(bytes))
            .ok()
            .map(Room)
    }

    /// Bytes of room taken now.
    pub(crate) fn used(&self) -> usize {
        (self.units - self.room.available_permits()) * UNIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_taken_and_given_back() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let b = Budget::new(4 * UNIT);
        let a = rt.block_on(b.take(3 * UNIT));
        assert_eq!(b.used(), 3 * UNIT);
        assert!(b.try_take(2 * UNIT).is_none());
        let c = b.try_take(1).unwrap();
        assert_eq!(b.used(), 4 * UNIT);
        drop(a);
        drop(c);
        // More than the whole budget takes all of it, and gets it.
        let all = rt.block_on(b.take(100 * UNIT));
        assert_eq!(b.used(), 4 * UNIT);
        drop(all);
        assert_eq!(b.used(), 0);
    }
}
