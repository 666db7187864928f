//! Room on the disk under a `file://` bucket: its free-space floor (the share of the disk
//! `--free-space-ratio` keeps free, as the disk cache keeps on its own disks), and the
//! handshake by which a put the disk refused (ENOSPC) waits for whoever makes room — a
//! mount's background, which deletes the oldest trash early — instead of failing at once.
//!
//! The staging area and the disk cache count where they share the bucket's file system (the
//! default volume keeps all three under /var): deleting the trash frees nothing on another
//! disk (there the cache evicts down to its own floor, and staged blocks leave with their
//! upload).
//!
//! Not for: making room (that is `vfs::background`, with `meta` and `garbage`), the disk
//! cache's own floor (`cache::disk`), or a remote bucket (no disk of ours to watch).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

/// Bytes above the floor a round of making room aims for, in blocks: room for a few puts in
/// flight, so that a writer waiting for room finds some.
const HEADROOM_BLOCKS: u64 = 16;
/// How long a put refused for want of room waits for room to be made, at most.
const WAIT: Duration = Duration::from_secs(60);

/// How a round of making room ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Something was deleted, or there was room already: worth trying again.
    Made,
    /// Another client makes room for the volume now.
    Elsewhere,
    /// Nothing was left to delete.
    Nothing,
}

/// How far the disk under the bucket is below what a round aims for.
#[derive(Clone, Debug)]
pub struct Shortage {
    pub dir: PathBuf,
    /// Bytes available, and the floor of free bytes to keep.
    pub avail: u64,
    pub floor: u64,
    /// Bytes to free to reach the floor and the headroom above it (0: none).
    pub want: u64,
}

/// Makes room when called (a mount's background: wakes it up).
type Waker = Box<dyn Fn() + Send + Sync>;

/// The free-space floor of the disk under a local bucket, and who waits for room there.
pub struct Room {
    /// The bucket's directory (None: the bucket is not a local directory).
    dir: Option<PathBuf>,
    ratio: f64,
    headroom: u64,
    /// A put was refused for want of room since the last round.
    asked: AtomicBool,
    /// Whoever makes room (none: a refused put fails at once).
    maker: Mutex<Option<Waker>>,
    /// Rounds of making room: how many, and how the last one ended.
    rounds: watch::Sender<(u64, Outcome)>,
}

impl Room {
    pub(crate) fn new(dir: Option<&Path>, ratio: f64, block_size: u32) -> Room {
        Room {
            dir: dir.map(Path::to_path_buf),
            ratio: ratio.clamp(0.0, 1.0),
            headroom: HEADROOM_BLOCKS * block_size as u64,
            asked: AtomicBool::new(false),
            maker: Mutex::new(None),
            rounds: watch::Sender::new((0, Outcome::Made)),
        }
    }

    /// The share of the disk kept free.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// Makes room from now on: `wake` is called when a put is refused for want of room; the
    /// caller then looks at [`Room::shortage`] and says how it went with [`Room::made`].
    pub fn serve(&self, wake: impl Fn() + Send + Sync + 'static) {
        *self.maker.lock() = Some(Box::new(wake));
    }

    /// Nobody makes room any longer (the mount is ending): refused puts fail at once.
    pub fn unserve(&self) {
        *self.maker.lock() = None;
        self.made(Outcome::Nothing);
    }

    /// How far the disk is below what a round aims for, when it is below its floor or a put
    /// was refused since the last look; None when the bucket is not local, or all is well.
    pub fn shortage(&self) -> Option<Shortage> {
        let dir = self.dir.as_ref()?;
        let asked = self.asked.swap(false, Ordering::AcqRel);
        let (avail, floor) = self.space()?;
        if avail >= floor && !asked {
            return None;
        }
        let want = (floor + self.headroom).saturating_sub(avail);
        Some(Shortage {
            dir: dir.clone(),
            avail,
            floor,
            // Refused with bytes to spare: out of inodes, or a round just made room (then
            // this much more goes, once).
            want: if asked { want.max(self.headroom) } else { want },
        })
    }

    /// Bytes to free now to reach the floor and the headroom above it.
    pub fn want(&self) -> u64 {
        self.space().map_or(0, |(avail, floor)| {
            (floor + self.headroom).saturating_sub(avail)
        })
    }

    /// Bytes available on the bucket's disk and the floor of free bytes to keep.
    fn space(&self) -> Option<(u64, u64)> {
        let st = nix::sys::statvfs::statvfs(self.dir.as_ref()?).ok()?;
        let unit = st.fragment_size() as u64;
        let (total, avail) = (
            st.blocks() as u64 * unit,
            st.blocks_available() as u64 * unit,
        );
        Some((avail, (total as f64 * self.ratio) as u64))
    }

    /// A round of making room ended so.
    pub fn made(&self, outcome: Outcome) {
        self.rounds.send_modify(|r| *r = (r.0 + 1, outcome));
    }

    /// A put was refused for want of room (its own retries go on): room is made at the next
    /// round.
    pub(crate) fn ask(&self) {
        self.asked.store(true, Ordering::Release);
        if let Some(wake) = &*self.maker.lock() {
            wake();
        }
    }

    /// A put was refused for want of room: asks for room and waits for the round that makes
    /// it. Whether to try again: false when nobody makes room, the round found nothing left
    /// to delete, or [`WAIT`] passed since `since` (the first refusal).
    pub(crate) async fn wait(&self, since: tokio::time::Instant) -> bool {
        if self.dir.is_none() || self.maker.lock().is_none() {
            return false;
        }
        let mut rx = self.rounds.subscribe();
        rx.borrow_and_update();
        self.ask();
        let outcome = match tokio::time::timeout_at(since + WAIT, rx.changed()).await {
            Ok(Ok(())) => rx.borrow().1,
            _ => return false,
        };
        if outcome == Outcome::Elsewhere {
            // Not at once: the round that asks again would find the other client at it still.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        outcome != Outcome::Nothing
    }
}
