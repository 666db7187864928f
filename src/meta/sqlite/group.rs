//! Grouped commits of the SQLite writer: namespace and attribute changes (create, mkdir,
//! unlink, rename, link, setattr, xattrs) of a mount that has the volume to itself share one
//! transaction, committed when [`MAX_OPS`] have joined it, [`MAX_AGE`] after it opened, or
//! as soon as an operation that promises more runs: a commit of file data (every close and
//! fsync of a written file), `fsync`/`fsyncdir` (which also flush the WAL), anything that
//! decides what to delete from the bucket, and unmount. A commit writes the pages it changed
//! into the WAL once, however many operations changed them: a create or an unlink was one
//! transaction of four or five pages each, most of its cost.
//!
//! Each operation runs in a savepoint inside the group, so one that fails (a POSIX error)
//! leaves the others as they were. Reads of this process see the group (they run on the
//! writer's connection while it is open); other processes see it once committed, at most
//! [`MAX_AGE`] later. What a crash of the process can lose is the group not committed yet:
//! operations no `close`, `fsync` or `fsyncdir` has covered, at most [`MAX_AGE`] old (a
//! local file system loses its last seconds of them to a power cut).
//!
//! This module keeps the group's clock and the thread that ends a group that grew old; the
//! engine (`sqlite`) begins, joins and commits groups under its writer lock.
//!
//! Not for: what an operation does (`ops`), WAL checkpoints (`checkpoint`), PostgreSQL (each
//! of its clients is one of many: its commits are its own).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;

/// Operations a group takes at most before it commits.
pub(super) const MAX_OPS: usize = 128;

/// How long a group stays open at most.
pub(super) const MAX_AGE: Duration = Duration::from_millis(10);

#[derive(Default)]
struct Clock {
    /// When the open group began (None: none is open).
    since: Option<Instant>,
    /// Operations in it.
    ops: usize,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    /// Whether operations may group (this mount has the volume to itself).
    enabled: AtomicBool,
    /// Whether a group is open (mirrors the writer's connection, set under its lock): a read
    /// that finds the writer busy waits for it instead of reading without the group.
    open: AtomicBool,
    clock: Mutex<Clock>,
    cv: Condvar,
    /// SQLite's `data_version` of the writer when grouping began: it moves when another
    /// connection (another process: a second mount, `fsck --repair`) commits.
    version: Mutex<Option<i64>>,
    /// Grouping stopped because another process wrote ([`Group::stop_for_company`]), until
    /// it is turned on again.
    suspected: AtomicBool,
}

/// The state of grouping of one engine, and the thread that commits old groups.
pub(super) struct Group {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Group {
    /// Starts the thread that commits groups of `writer` that grow old (`commit` commits the
    /// transaction open on it).
    pub(super) fn start(
        writer: Arc<Mutex<Connection>>,
        commit: impl Fn(&Connection) + Send + 'static,
    ) -> Group {
        let shared: Arc<Shared> = Default::default();
        let sh = shared.clone();
        let thread =
            crate::meta::spawn_background("unkai-group", move || run(&writer, &sh, commit));
        Group { shared, thread }
    }

    /// Turns grouping on or off (off: the caller commits the open group); `version`: the
    /// writer's `data_version` now, what later ones are compared with (see
    /// [`Group::alone_since`]).
    ///
    /// Off also ends a suspicion ([`Group::stop_for_company`]): what this client was told
    /// or saw is no longer a guess. The state changes under the version's lock, as
    /// [`Group::rebase`]'s do.
    pub(super) fn enable(&self, on: bool, version: impl FnOnce() -> Option<i64>) {
        let on = on && self.thread.is_some();
        if !on {
            let _v = self.shared.version.lock();
            self.shared.enabled.store(false, SeqCst);
            self.shared.suspected.store(false, SeqCst);
            return;
        }
        if self.shared.enabled.load(SeqCst) {
            return;
        }
        // Read before the lock: `version` takes the writer's, which `rebase`'s callers hold
        // while they take this one.
        let v = version();
        let mut ver = self.shared.version.lock();
        if !self.shared.enabled.swap(true, SeqCst) {
            *ver = v;
            self.shared.suspected.store(false, SeqCst);
        }
    }

    /// Stops grouping because another process wrote (the caller commits the open group).
    pub(super) fn stop_for_company(&self) {
        let _v = self.shared.version.lock();
        self.shared.enabled.store(false, SeqCst);
        self.shared.suspected.store(true, SeqCst);
    }

    /// Goes on grouping from the writer's `data_version` `version`: another process wrote,
    /// but no other client is there (a command without a session: `quota set`, `fsck`).
    /// Not if grouping stopped meanwhile for a reason other than a suspicion (this client
    /// was told it is not alone, or a group was lost): whether it goes on.
    pub(super) fn rebase(&self, version: i64) -> bool {
        let mut ver = self.shared.version.lock();
        if !self.shared.enabled.load(SeqCst) && !self.shared.suspected.load(SeqCst) {
            return false;
        }
        *ver = Some(version);
        self.shared.suspected.store(false, SeqCst);
        self.shared.enabled.store(true, SeqCst);
        true
    }

    /// Whether no other connection has committed since grouping began, given the writer's
    /// `data_version` now (read in the transaction that would open a group). Another process
    /// that writes (a second mount registering its session) turns grouping off at once,
    /// before the 2 s check of sessions does: it must read what this mount did.
    pub(super) fn alone_since(&self, version: i64) -> bool {
        *self.shared.version.lock() == Some(version)
    }

    pub(super) fn enabled(&self) -> bool {
        self.shared.enabled.load(SeqCst)
    }

    /// Whether grouping stopped because another process wrote (see [`Group::alone_since`]),
    /// not because this client was told it is not alone: until the next check of sessions
    /// says alone again.
    pub(super) fn suspects_company(&self) -> bool {
        self.shared.suspected.load(SeqCst)
    }

    pub(super) fn is_open(&self) -> bool {
        self.shared.open.load(SeqCst)
    }

    /// A group began (under the writer lock).
    pub(super) fn began(&self) {
        self.shared.open.store(true, SeqCst);
        let mut c = self.shared.clock.lock();
        c.since = Some(Instant::now());
        c.ops = 0;
        self.shared.cv.notify_one();
    }

    /// An operation joined the open group: whether the group is full and must commit now.
    pub(super) fn joined(&self) -> bool {
        let mut c = self.shared.clock.lock();
        c.ops += 1;
        c.ops >= MAX_OPS
    }

    /// The group ended, committed or not (under the writer lock).
    pub(super) fn ended(&self) {
        self.shared.ended();
    }
}

impl Shared {
    fn ended(&self) {
        self.open.store(false, SeqCst);
        self.clock.lock().since = None;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.shared.clock.lock().stop = true;
        self.shared.cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(writer: &Mutex<Connection>, shared: &Shared, commit: impl Fn(&Connection)) {
    loop {
        {
            let mut c = shared.clock.lock();
            loop {
                if c.stop {
                    return;
                }
                match c.since {
                    None => shared.cv.wait(&mut c),
                    Some(t) if t.elapsed() >= MAX_AGE => break,
                    Some(t) => {
                        let _ = shared
                            .cv
                            .wait_for(&mut c, MAX_AGE.saturating_sub(t.elapsed()));
                    }
                }
            }
        }
        // Not under the clock's lock: the writer takes it while it holds its own.
        let conn = writer.lock();
        let old = shared
            .clock
            .lock()
            .since
            .is_some_and(|t| t.elapsed() >= MAX_AGE);
        if old {
            if !conn.is_autocommit() {
                commit(&conn);
            }
            shared.ended();
        }
    }
}
