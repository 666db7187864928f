//! Checkpoints of the SQLite write-ahead log, behind the writer.
//!
//! SQLite copies its WAL back into the database file (a checkpoint) from inside the commit
//! that crosses `wal_autocheckpoint` pages, and with `synchronous=NORMAL` a checkpoint
//! fsyncs the WAL and then the database: every few hundred commits one of them waited for
//! two disk flushes, which made most of a small transaction's cost (a create and an unlink
//! measured 120 µs in SQLite, 50 µs without those flushes). The writer runs with automatic
//! checkpoints off; this thread checkpoints on a connection of its own, in `PASSIVE` mode
//! (it copies what no reader still needs and never waits for, or holds up, the writer),
//! once enough commits have piled up or a second after the last one.
//!
//! While writes never stop, a passive checkpoint never catches up with the writer, and
//! SQLite restarts the WAL from its start only after a checkpoint that copied all of it:
//! past [`MAX_FRAMES`] left behind, the next checkpoint holds the writer's lock (the mutex
//! every write takes) while it runs, so that the WAL is copied whole and restarts.
//!
//! Durability does not change: a commit is in the WAL (safe from a crash of the process) as
//! before, and the checkpoint still flushes the WAL before copying it.
//!
//! Not for: the engine's transactions (`sqlite`), fsync of the WAL for `fsync(2)`
//! (`Engine::sync`).

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;

/// Commits after which a checkpoint starts (about SQLite's own 1,000 pages at 4 or 5 pages
/// a small transaction).
const COMMITS: u64 = 200;

/// How long after a commit a checkpoint starts anyway.
const IDLE: Duration = Duration::from_secs(1);

/// WAL frames left uncopied by a passive checkpoint past which the next one holds the
/// writer's lock (64 MiB of 4 KiB pages).
const MAX_FRAMES: i64 = 16_384;

#[derive(Default)]
struct State {
    /// Commits since the last checkpoint.
    commits: u64,
    stop: bool,
}

/// The checkpointing thread of an SQLite engine; stops when dropped.
pub(super) struct Checkpointer {
    state: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing the database at `path` (whose writer is `writer`) on the
    /// connection `conn`.
    pub(super) fn start(conn: Connection, writer: Arc<Mutex<Connection>>, path: &Path) -> Self {
        let state: Arc<(Mutex<State>, Condvar)> = Default::default();
        let st = state.clone();
        let path = path.display().to_string();
        let thread = crate::meta::spawn_background("unkai-checkpoint", move || {
            run(&conn, &writer, &st, &path)
        });
        Checkpointer { state, thread }
    }

    /// What counts the writer's commits for this checkpointer.
    pub(super) fn commits(&self) -> Commits {
        Commits(self.state.clone())
    }

    /// Whether the thread runs (else the writer must checkpoint itself).
    pub(super) fn running(&self) -> bool {
        self.thread.is_some()
    }
}

/// Counts the commits of a writer for its [`Checkpointer`].
#[derive(Clone)]
pub(super) struct Commits(Arc<(Mutex<State>, Condvar)>);

impl Commits {
    /// Counts a commit of the writer.
    pub(super) fn committed(&self) {
        let (lock, cv) = &*self.0;
        let mut st = lock.lock();
        st.commits += 1;
        if st.commits == 1 || st.commits >= COMMITS {
            cv.notify_one();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.state.0.lock().stop = true;
        self.state.1.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(conn: &Connection, writer: &Mutex<Connection>, state: &(Mutex<State>, Condvar), path: &str) {
    let (lock, cv) = state;
    let mut behind = 0i64;
    let mut failing = false;
    loop {
        {
            let mut st = lock.lock();
            // Wait for a first commit, then for enough of them or a quiet second.
            while !st.stop && st.commits == 0 {
                cv.wait(&mut st);
            }
            if !st.stop && st.commits < COMMITS {
                let _ = cv.wait_for(&mut st, IDLE);
            }
            if st.stop {
                return;
            }
            st.commits = 0;
        }
        let res = if behind > MAX_FRAMES {
            let _w = writer.lock();
            passive(conn)
        } else {
            passive(conn)
        };
        match res {
            Ok((log, copied)) => {
                behind = log - copied;
                if failing {
                    tracing::info!("checkpoints of {path} work again");
                    failing = false;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("checkpoint of {path} failed ({e}); trying again later");
                    failing = true;
                }
            }
        }
    }
}

/// Runs a passive checkpoint: (frames in the WAL, frames copied).
fn passive(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
    })
}
