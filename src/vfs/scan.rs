//! Antivirus scanning of what is written (`--scan`), whichever front end wrote it: after a
//! file's last close following a write, its committed bytes are streamed to a [`Scanner`]
//! (clamd, [`clamd`]) by one background thread. An infected file is flagged
//! [`flags::QUARANTINED`] (every open of it, by any client, is EACCES) and moved to
//! `/.quarantine` at the volume's root; the event goes to the log and to the front end's
//! event sink (the FUSE mount's access log). When the scanner cannot answer, the policy
//! decides ([`FailPolicy`]) and the file is scanned again later, with a growing delay.
//! What the move changes is told to the front end ([`ChangeSink`]: a mount's kernel would
//! otherwise show the file under its old name for as long as it caches names).
//!
//! Until its verdict, a file just closed reads as usual (as clamd's own on-access scanning
//! in notify mode); files queued when the client stops are not scanned by it (the next
//! write and close of them is).
//!
//! Not for: the scanner's protocol (each [`Scanner`] in its own module), or deciding what is
//! written (that is `vfs::write`).

pub mod clamd;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::data::DataStore;
use crate::meta::{Change, ChangeSink, Ctx, Ino, Kind, Meta, ROOT_INO, RenameFlags, flags};

/// Where infected files go, at the volume's root.
pub const QUARANTINE_DIR: &[u8] = b".quarantine";

/// Bytes read and sent to the scanner at a time.
const CHUNK: usize = 1 << 20;

/// What a scanner found in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Clean,
    /// Infected: the signature's name.
    Infected(String),
}

/// Why a file could not be scanned.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("cannot reach the scanner at {0}: {1}")]
    Unreachable(String, std::io::Error),
    #[error("the scanner at {0} answered: {1}")]
    Failed(String, String),
    #[error("cannot read the file: {0}")]
    Read(String),
}

/// Something that tells whether bytes are infected.
pub trait Scanner: Send + Sync {
    /// Scans the bytes `next` yields, chunk after chunk (None: the end).
    fn scan(
        &self,
        next: &mut dyn FnMut() -> Result<Option<Vec<u8>>, ScanError>,
    ) -> Result<Verdict, ScanError>;
    /// Where the scanner is, for messages.
    fn describe(&self) -> String;
}

/// What happens to a file when the scanner cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailPolicy {
    /// It stays readable (a warning is logged) until a later scan decides.
    Open,
    /// Every open of it is refused (EACCES) until a later scan finds it clean.
    Closed,
}

/// A line for the front end's event log (the FUSE mount's access log), without time stamp.
pub type Events = Arc<dyn Fn(&str) + Send + Sync>;

/// Retries of a file that could not be scanned start this late and double up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_secs(2);
const MAX_RETRY: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Queue {
    /// Files to scan, each once, with when it is due and its retry delay so far.
    due: VecDeque<(Instant, Ino, Duration)>,
    queued: HashSet<Ino>,
    /// Being scanned now.
    busy: Option<Ino>,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    meta: Arc<dyn Meta>,
    store: DataStore,
    scanner: Arc<dyn Scanner>,
    policy: FailPolicy,
    events: Events,
    /// Told of each entry and inode a move to quarantine changes.
    changed: Option<ChangeSink>,
    /// Whether the scanner's last attempt failed (its failures are warned about once).
    down: Mutex<bool>,
}

/// The scanning of one client: its queue and its thread (stopped and joined when dropped).
pub struct Scanning {
    shared: Arc<Shared>,
    /// Inodes written through handles since closed, awaiting their last close.
    written: Mutex<HashSet<Ino>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scanning {
    pub fn start(
        meta: Arc<dyn Meta>,
        store: DataStore,
        scanner: Arc<dyn Scanner>,
        policy: FailPolicy,
        events: Events,
        changed: Option<ChangeSink>,
    ) -> Scanning {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            meta,
            store,
            scanner,
            policy,
            events,
            changed,
            down: Mutex::new(false),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("unkai-scan".into())
            .spawn(move || worker.run())
            .inspect_err(|e| tracing::error!("cannot start the scanning thread: {e}"))
            .ok();
        Scanning {
            shared,
            written: Mutex::new(HashSet::new()),
            thread,
        }
    }

    /// A handle on `ino` that wrote closed; `last`: no handle on it is left open. Its last
    /// close after a write queues it.
    pub fn closed(&self, ino: Ino, wrote: bool, last: bool) {
        let mut written = self.written.lock();
        if wrote {
            written.insert(ino);
        }
        if last && written.remove(&ino) {
            drop(written);
            self.shared.queue(ino, Instant::now(), Duration::ZERO);
        }
    }

    /// Whether nothing is queued or being scanned (for tests and shutdown messages).
    pub fn idle(&self) -> bool {
        let q = self.shared.queue.lock();
        q.due.is_empty() && q.busy.is_none()
    }
}

impl Scanning {
    /// Stops, once the files closed so far are scanned (those waiting for a retry are
    /// not waited for) or `limit` has passed.
    pub fn finish(self, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            {
                let q = self.shared.queue.lock();
                if q.busy.is_none() && !q.due.iter().any(|(_, _, d)| d.is_zero()) {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Scanning {
    fn drop(&mut self) {
        let left = {
            let mut q = self.shared.queue.lock();
            q.stop = true;
            q.due.len()
        };
        self.shared.wake.notify_all();
        if left > 0 {
            tracing::warn!(
                "{left} file(s) written were not scanned yet; they are scanned when next \
                 written and closed"
            );
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn queue(&self, ino: Ino, at: Instant, delay: Duration) {
        let mut q = self.queue.lock();
        if q.queued.insert(ino) {
            q.due.push_back((at, ino, delay));
            self.wake.notify_one();
        }
    }

    /// The next file due, waiting for one; None once stopped.
    fn next(&self) -> Option<(Ino, Duration)> {
        let mut q = self.queue.lock();
        q.busy = None;
        loop {
            if q.stop {
                return None;
            }
            let now = Instant::now();
            if let Some(i) = q.due.iter().position(|(at, _, _)| *at <= now) {
                let (_, ino, delay) = q.due.remove(i).expect("found");
                q.queued.remove(&ino);
                q.busy = Some(ino);
                return Some((ino, delay));
            }
            match q.due.iter().map(|(at, _, _)| *at).min() {
                Some(at) => {
                    self.wake.wait_until(&mut q, at);
                }
                None => self.wake.wait(&mut q),
            }
        }
    }

    fn run(&self) {
        while let Some((ino, delay)) = self.next() {
            self.scan_one(ino, delay);
        }
    }

    fn scan_one(&self, ino: Ino, delay: Duration) {
        let a = match self.meta.getattr(ino) {
            Ok(a) => a,
            // Gone meanwhile: nothing to scan.
            Err(e) if e.errno() == libc::ENOENT => return,
            Err(e) => {
                tracing::warn!("scanning inode {ino}: {e}");
                return self.retry(ino, delay);
            }
        };
        if a.kind != Kind::File {
            return;
        }
        let mut off = 0u64;
        let mut next = || -> Result<Option<Vec<u8>>, ScanError> {
            if off >= a.length {
                return Ok(None);
            }
            let mut buf = vec![0u8; CHUNK.min((a.length - off) as usize)];
            super::reader::read_committed(&*self.meta, &self.store, ino, off, &mut buf, true)
                .map_err(|e| ScanError::Read(e.to_string()))?;
            off += buf.len() as u64;
            Ok(Some(buf))
        };
        match self.scanner.scan(&mut next) {
            Ok(verdict) => {
                let was_down = std::mem::replace(&mut *self.down.lock(), false);
                if was_down {
                    tracing::info!("the scanner at {} answers again", self.scanner.describe());
                }
                match verdict {
                    Verdict::Clean => {
                        tracing::debug!("inode {ino}: clean");
                        if a.flags & flags::QUARANTINED != 0 {
                            // Held back while the scanner was down (fail closed): let it be.
                            if let Err(e) = self.meta.set_quarantined(ino, false) {
                                tracing::warn!("inode {ino}: cannot release it: {e}");
                            }
                        }
                    }
                    Verdict::Infected(sig) => self.quarantine(ino, &sig),
                }
            }
            Err(ScanError::Read(e)) => {
                // The file itself is unreadable (the store failing): the scanner is not to blame.
                tracing::warn!("inode {ino}: cannot read it to scan it: {e}");
                self.retry(ino, delay);
            }
            Err(e) => {
                let first = !std::mem::replace(&mut *self.down.lock(), true);
                let path = self.path_of(ino);
                match self.policy {
                    FailPolicy::Open => {
                        if first {
                            tracing::warn!(
                                "{e}: files written stay readable unscanned until it answers \
                                 (--scan-fail open)"
                            );
                        }
                    }
                    FailPolicy::Closed => {
                        if first {
                            tracing::warn!(
                                "{e}: files written are refused (EACCES) until it answers and \
                                 finds them clean (--scan-fail closed)"
                            );
                        }
                        if let Err(e) = self.meta.set_quarantined(ino, true) {
                            tracing::error!("{path}: cannot hold it back: {e}");
                        }
                    }
                }
                (self.events)(&format!("scan {path} (inode {ino}): NOT SCANNED: {e}"));
                self.retry(ino, delay);
            }
        }
    }

    fn changed(&self, c: Change) {
        if let Some(f) = &self.changed {
            f(c);
        }
    }

    fn retry(&self, ino: Ino, delay: Duration) {
        let delay = (delay * 2).clamp(FIRST_RETRY, MAX_RETRY);
        self.queue(ino, Instant::now() + delay, delay);
    }

    /// `/dir/name` of one of the inode's names (`inode N` if it has none).
    fn path_of(&self, ino: Ino) -> String {
        let names = self.meta.names_of(ino).unwrap_or_default();
        match names.first() {
            Some((dir, name)) => {
                let mut p = self.meta.dir_path(*dir).unwrap_or_default();
                if p.last() != Some(&b'/') {
                    p.push(b'/');
                }
                p.extend_from_slice(name);
                String::from_utf8_lossy(&p).into_owned()
            }
            None => format!("inode {ino}"),
        }
    }

    /// Refuses every open of `ino` and moves one of its names to `/.quarantine`.
    fn quarantine(&self, ino: Ino, sig: &str) {
        let path = self.path_of(ino);
        if let Err(e) = self.meta.set_quarantined(ino, true) {
            tracing::error!("{path} is infected ({sig}) but cannot be held back: {e}");
            return;
        }
        let moved = self.move_to_quarantine(ino);
        let whither = match &moved {
            Ok(Some(name)) => format!(
                "moved to /{}/{}",
                String::from_utf8_lossy(QUARANTINE_DIR),
                String::from_utf8_lossy(name)
            ),
            Ok(None) => "already in quarantine".to_string(),
            Err(e) => format!("left in place ({e})"),
        };
        tracing::warn!("{path} (inode {ino}) is infected ({sig}): {whither}; opens are refused");
        (self.events)(&format!(
            "scan {path} (inode {ino}): INFECTED {sig}: {whither}"
        ));
    }

    fn move_to_quarantine(&self, ino: Ino) -> crate::meta::Result<Option<Vec<u8>>> {
        let root = Ctx::ROOT;
        let dir = match self.meta.lookup(&root, ROOT_INO, QUARANTINE_DIR) {
            Ok(a) => a.ino,
            Err(e) if e.errno() == libc::ENOENT => {
                match self
                    .meta
                    .mknod(&root, ROOT_INO, QUARANTINE_DIR, Kind::Dir, 0o700, 0, None)
                {
                    Ok(a) => {
                        self.changed(Change::Entry {
                            parent: ROOT_INO,
                            name: QUARANTINE_DIR.to_vec(),
                        });
                        self.changed(Change::Inode {
                            ino: ROOT_INO,
                            data: false,
                        });
                        a.ino
                    }
                    Err(e) if e.errno() == libc::EEXIST => {
                        self.meta.lookup(&root, ROOT_INO, QUARANTINE_DIR)?.ino
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        let names = self.meta.names_of(ino)?;
        if names.iter().any(|(d, _)| *d == dir) {
            return Ok(None);
        }
        let Some((parent, name)) = names.first() else {
            return Ok(None);
        };
        for n in 0.. {
            let mut new = format!("{ino}-").into_bytes();
            if n > 0 {
                new.extend_from_slice(format!("{n}-").as_bytes());
            }
            new.extend_from_slice(name);
            new.truncate(255);
            match self.meta.rename(
                &root,
                *parent,
                name,
                dir,
                &new,
                RenameFlags {
                    noreplace: true,
                    ..Default::default()
                },
            ) {
                Ok(_) => {
                    self.changed(Change::Entry {
                        parent: *parent,
                        name: name.clone(),
                    });
                    self.changed(Change::Entry {
                        parent: dir,
                        name: new.clone(),
                    });
                    for ino in [ino, *parent, dir] {
                        self.changed(Change::Inode { ino, data: false });
                    }
                    return Ok(Some(new));
                }
                Err(e) if e.errno() == libc::EEXIST && n < 100 => continue,
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }
}
