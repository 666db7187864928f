//! The embedded metadata engine: one SQLite file.
//!
//! Concurrency: one writer connection owns all writes (behind a mutex, `BEGIN IMMEDIATE`),
//! readers use their own connections beside it (WAL). A busy database (another process, e.g.
//! `unkai fsck` while mounted) is waited for and retried, never reported: no operation ever
//! fails with "database is locked". With one writer there is nothing to lock row by row:
//! the engine keeps the plain [`Txn`] defaults for locking.
//!
//! Durability: `synchronous=NORMAL` in WAL mode, so a commit is safe from a crash of this
//! process at once, and safe from power loss after [`Meta::sync`] (which fsyncs the WAL);
//! `fsync(2)` on a file calls it. That keeps metadata-heavy work free of per-operation fsyncs.
//! Checkpoints of the WAL run behind the writer (`checkpoint`), and a mount that has the
//! volume to itself groups namespace changes into shared commits (`group`).
//!
//! Not for: what operations mean (`ops`), caching (the kernel and `vfs`), object storage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::config::DbConfig;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{
    Connection, OpenFlags, OptionalExtension, TransactionBehavior, params, params_from_iter,
};

use super::engine::{
    Cell, Engine, SqlRow, TxError, TxKind, TxResult, TxStats, Txn, Val, decode_chunk,
};
use super::ops::{self, EngineMeta};
use super::slice::{self, SliceRec};
use super::*;

mod checkpoint;
mod group;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS setting (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counter (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS node (
  ino INTEGER PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT NULL,
  uid INTEGER NOT NULL, gid INTEGER NOT NULL, nlink INTEGER NOT NULL,
  length INTEGER NOT NULL, rdev INTEGER NOT NULL,
  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,
  parent INTEGER NOT NULL, flags INTEGER NOT NULL DEFAULT 0, stored INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS edge (
  id INTEGER PRIMARY KEY, parent INTEGER NOT NULL, name BLOB NOT NULL,
  ino INTEGER NOT NULL, kind INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS edge_name ON edge(parent, name);
CREATE INDEX IF NOT EXISTS edge_order ON edge(parent, id);
CREATE TABLE IF NOT EXISTS symlink (ino INTEGER PRIMARY KEY, target BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS chunk (
  ino INTEGER NOT NULL, indx INTEGER NOT NULL, slices BLOB NOT NULL,
  PRIMARY KEY (ino, indx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS slice_ref (
  id INTEGER PRIMARY KEY, size INTEGER NOT NULL, refs INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS dead_slice (
  id INTEGER PRIMARY KEY, size INTEGER NOT NULL, died INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS xattr (
  ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY (ino, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session (
  id INTEGER PRIMARY KEY, info TEXT NOT NULL, heartbeat INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sustained (
  session INTEGER NOT NULL, ino INTEGER NOT NULL,
  PRIMARY KEY (session, ino)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS plock (
  ino INTEGER NOT NULL, session INTEGER NOT NULL, owner INTEGER NOT NULL,
  kind INTEGER NOT NULL, start INTEGER NOT NULL, last INTEGER NOT NULL, pid INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS plock_ino ON plock(ino);
CREATE TABLE IF NOT EXISTS open_file (
  ino INTEGER NOT NULL, session INTEGER NOT NULL,
  PRIMARY KEY (ino, session)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reserved (
  session INTEGER NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
  PRIMARY KEY (session, lo)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS edge_ino ON edge(ino);
CREATE TABLE IF NOT EXISTS quota (
  ino INTEGER PRIMARY KEY, max_bytes INTEGER NOT NULL, max_inodes INTEGER NOT NULL,
  used_bytes INTEGER NOT NULL, used_inodes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS external (
  id INTEGER PRIMARY KEY, url TEXT NOT NULL, object_key TEXT NOT NULL, etag TEXT NOT NULL,
  object_size INTEGER NOT NULL, base INTEGER NOT NULL, size INTEGER NOT NULL);
";

const TABLES: &[&str] = &[
    "setting",
    "counter",
    "node",
    "edge",
    "symlink",
    "chunk",
    "slice_ref",
    "dead_slice",
    "xattr",
    "session",
    "sustained",
    "plock",
    "open_file",
    "reserved",
    "quota",
    "external",
];

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            // The disk under the database is full: the application should hear ENOSPC.
            Some(rusqlite::ErrorCode::DiskFull) => Error::Sys(libc::ENOSPC),
            _ => Error::Engine(e.to_string()),
        }
    }
}

/// Another connection (another process) holds the database: wait and run again.
impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                TxError::Conflict(e.to_string())
            }
            _ => TxError::Meta(Error::from(e)),
        }
    }
}

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 256;

fn open_conn(path: &Path, create: bool) -> rusqlite::Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let c = Connection::open_with_flags(path, flags)?;
    c.busy_timeout(Duration::from_secs(60))?;
    // Every statement the engine runs stays prepared (rusqlite keeps 16 by default, fewer
    // than the engine's statements, so a busy mount parsed SQL over and over).
    c.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // A prepared statement keeps its plan whatever values are bound to it (the query
    // planner stability guarantee). Without it, SQLite (built with STAT4) marks statements
    // whose plan might depend on a bound value and re-prepares them, parsing the SQL again,
    // at every new binding: most of a lookup's time went to that.
    c.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    c.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA temp_store=MEMORY;
         PRAGMA cache_size=-32768;",
    )?;
    Ok(c)
}

fn cannot_open(path: &Path, e: rusqlite::Error) -> Error {
    Error::Engine(format!("cannot open {}: {e}", path.display()))
}

/// The volume's recorded settings, if the database has any.
fn stored_format(c: &Connection) -> rusqlite::Result<Option<String>> {
    let has_setting = c
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='setting'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if !has_setting {
        return Ok(None);
    }
    c.query_row("SELECT value FROM setting WHERE name='format'", [], |r| {
        r.get(0)
    })
    .optional()
}

/// A volume in an SQLite file: the [`Meta`] of the embedded engine.
pub type SqliteMeta = EngineMeta<Sqlite>;

/// The SQLite engine: its connections, and the group fsync of its WAL.
pub struct Sqlite {
    path: PathBuf,
    /// Copies the WAL into the database behind the writer (None: the writer does, as SQLite
    /// does by default). Dropped first: it stops before the connections close.
    _checkpointer: Option<checkpoint::Checkpointer>,
    /// Counts commits for the checkpointer.
    commits: Option<checkpoint::Commits>,
    /// Grouped commits (see `group`); stops before the connections close.
    group: group::Group,
    writer: Arc<Mutex<Connection>>,
    readers: Mutex<Vec<Connection>>,
    /// Group fsync (see [`Engine::sync`]): tickets handed out, and the last ticket covered by
    /// a finished fsync (under this lock, which also makes fsyncs take turns).
    sync_tickets: AtomicU64,
    synced: Mutex<u64>,
    /// What its transactions did (the mount's metrics).
    stats: TxStats,
}

impl EngineMeta<Sqlite> {
    /// Creates (or with `force`, re-creates) a volume.
    pub fn create(path: &Path, url: &str, fmt: &Format, force: bool) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::Engine(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
        let mut c = open_conn(path, true).map_err(|e| cannot_open(path, e))?;
        c.execute_batch(SCHEMA)?;
        if let Some(old) = stored_format(&c)? {
            let old: Format = serde_json::from_str(&old)
                .map_err(|e| Error::Engine(format!("unreadable format: {e}")))?;
            let sessions = c
                .prepare("SELECT info, heartbeat FROM session")?
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            ops::check_reformat(&old, url, force, sessions)?;
        }
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for t in TABLES {
            tx.execute(&format!("DELETE FROM {t}"), [])?;
        }
        let json = serde_json::to_string(fmt).expect("format serializes");
        tx.execute(
            "INSERT INTO setting (name, value) VALUES ('format', ?1)",
            [json],
        )?;
        for (name, v) in ops::NEW_COUNTERS {
            tx.execute(
                "INSERT INTO counter (name, value) VALUES (?1, ?2)",
                params![name, v],
            )?;
        }
        SqlTx(&tx)
            .insert_node(&ops::root_node(now_nanos()))
            .map_err(TxError::into_meta)?;
        tx.commit()?;
        Ok(())
    }

    /// Opens an existing volume.
    pub fn open(path: &Path, url: &str) -> Result<SqliteMeta> {
        if !path.exists() {
            return Err(Error::NotFormatted(url.to_string()));
        }
        let mut c = open_conn(path, false).map_err(|e| cannot_open(path, e))?;
        let Some(json) = stored_format(&c)? else {
            return Err(Error::NotFormatted(url.to_string()));
        };
        let mut format = ops::parse_format(&json, url)?;
        c.execute_batch(SCHEMA)?;
        if format.schema < format::SCHEMA_VERSION {
            // Schema 2 added `open_file`, 3 `reserved`, 6 `external` (created above), 4 the
            // columns `flags` and `stored` of `node`; binaries that do not keep them refuse the volume from
            // now on.
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if format.schema < 4 {
                let has = tx
                    .prepare("SELECT 1 FROM pragma_table_info('node') WHERE name='stored'")?
                    .exists([])?;
                if !has {
                    tx.execute_batch(
                        "ALTER TABLE node ADD COLUMN flags INTEGER NOT NULL DEFAULT 0;
                         ALTER TABLE node ADD COLUMN stored INTEGER NOT NULL DEFAULT 0;",
                    )?;
                }
                let rows = tx
                    .prepare("SELECT ino, slices FROM chunk")?
                    .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let mut set = tx.prepare("UPDATE node SET stored=?2 WHERE ino=?1")?;
                for (ino, stored) in ops::stored_per_inode(rows) {
                    set.execute(params![ino, stored as i64])?;
                }
            }
            format.schema = format::SCHEMA_VERSION;
            let json = serde_json::to_string(&format).expect("format serializes");
            tx.execute("UPDATE setting SET value=?1 WHERE name='format'", [json])?;
            tx.commit()?;
        }
        catch_up(&c);
        let writer = Arc::new(Mutex::new(c));
        let checkpointer = open_conn(path, false)
            .ok()
            .map(|conn| checkpoint::Checkpointer::start(conn, writer.clone(), path))
            .filter(|c| c.running());
        if checkpointer.is_some() {
            writer.lock().execute_batch("PRAGMA wal_autocheckpoint=0")?;
        }
        let commits = checkpointer.as_ref().map(|c| c.commits());
        let counter = commits.clone();
        let group = group::Group::start(writer.clone(), move |conn| {
            let _ = commit_open(conn, counter.as_ref());
        });
        let engine = Sqlite {
            path: path.to_path_buf(),
            writer,
            readers: Mutex::new(Vec::new()),
            _checkpointer: checkpointer,
            commits,
            group,
            sync_tickets: AtomicU64::new(0),
            synced: Mutex::new(0),
            stats: TxStats::default(),
        };
        Ok(EngineMeta::new(engine, format))
    }
}

/// Waits until no other connection holds the database's write lock, taking it and letting
/// it go at once. A mount's group of changes (`group`) holds that lock from its first change
/// to its commit, so once this returns every change a mount of this file had answered before
/// is committed, and what this process reads next includes it: `unkai quota set --path /q`
/// right after `mkdir /mnt/v/q` finds `/q`. Writes nothing (another mount's grouping goes
/// on). Without write access to the file there is no lock to take: the changes of the last
/// moment may then be missed.
fn catch_up(c: &Connection) {
    let mut delay = Duration::from_millis(1);
    loop {
        match c.execute_batch("BEGIN IMMEDIATE") {
            Ok(()) => {
                let _ = c.execute_batch("ROLLBACK");
                return;
            }
            Err(e) => match TxError::from(e) {
                TxError::Conflict(_) => backoff(&mut delay),
                other => {
                    tracing::debug!("not waiting for other writers of the database: {other:?}");
                    return;
                }
            },
        }
    }
}

/// SQLite's `data_version` of `c`: it moves when another connection commits.
fn data_version(c: &Connection) -> Option<i64> {
    c.prepare_cached("PRAGMA data_version")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .ok()
}

/// Runs `f` in a savepoint of the transaction open on `c` (a failure undoes only what `f`
/// did).
fn in_savepoint<T>(
    c: &mut Connection,
    f: &mut impl FnMut(&mut dyn Txn) -> TxResult<T>,
) -> TxResult<T> {
    let sp = c.savepoint()?;
    let v = f(&mut SqlTx(&sp))?;
    sp.commit()?;
    Ok(v)
}

/// The outcome of an operation that ran in a group and then committed it: its own failure
/// first, else the commit's.
fn settle<T>(res: TxResult<T>, committed: rusqlite::Result<()>) -> Result<T> {
    match (res, committed) {
        (Err(e), _) => Err(e.into_meta()),
        (Ok(_), Err(e)) => Err(TxError::from(e).into_meta()),
        (Ok(v), Ok(())) => Ok(v),
    }
}

/// Commits the transaction open on `c` (a group), counting the commit for the checkpointer.
/// A failure (the disk is full or failing) rolls the group back: said in the log, since the
/// operations in it were answered already.
fn commit_open(c: &Connection, commits: Option<&checkpoint::Commits>) -> rusqlite::Result<()> {
    match c.execute_batch("COMMIT") {
        Ok(()) => {
            if let Some(n) = commits {
                n.committed();
            }
            Ok(())
        }
        Err(e) => {
            tracing::error!(
                "metadata changes of the last {:?} could not be committed and are lost: {e}; \
                 free space on the disk of the metadata file, then check the volume with \
                 `unkai fsck`",
                group::MAX_AGE
            );
            let _ = c.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

impl Sqlite {
    /// Commits the open group, if any (`conn`: the writer, locked).
    fn end_group(&self, conn: &Connection) -> rusqlite::Result<()> {
        if conn.is_autocommit() {
            return Ok(());
        }
        let r = commit_open(conn, self.commits.as_ref());
        self.group.ended();
        if r.is_err() {
            // What was answered from the lost changes must not be answered again.
            self.group.enable(false, || None);
        }
        r
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        // The group's thread stops with the engine: what is open commits now.
        self.group.enable(false, || None);
        let _ = self.commit_group();
    }
}

/// Runs `f` once in a read transaction of `c`.
fn read_once<T>(
    c: &mut Connection,
    f: &mut impl FnMut(&mut dyn Txn) -> TxResult<T>,
) -> TxResult<T> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Deferred)?;
    let v = f(&mut SqlTx(&tx))?;
    tx.finish()?;
    Ok(v)
}

fn backoff(delay: &mut Duration) {
    std::thread::sleep(*delay);
    *delay = (*delay * 2).min(Duration::from_millis(200));
}

impl Engine for Sqlite {
    const RECORDS_OPENS: bool = false;

    fn kind(&self) -> EngineKind {
        EngineKind::Sqlite
    }

    fn stats(&self) -> &TxStats {
        &self.stats
    }

    /// Runs `f` in a write transaction of the one writer, retrying while the database is
    /// busy. Nothing to lock: writes take turns. An open group (see `group`) takes `f` and
    /// commits with it.
    fn write<T>(
        &self,
        _lock: &[Ino],
        _rename_lock: bool,
        mut f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T> {
        let _timed = self.stats.begin(TxKind::Write);
        let mut conn = self.writer.lock();
        if !conn.is_autocommit() {
            let res = in_savepoint(&mut conn, &mut f);
            let committed = self.end_group(&conn);
            return settle(res, committed);
        }
        let mut delay = Duration::from_millis(1);
        loop {
            let attempt = (|| -> TxResult<T> {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let v = f(&mut SqlTx(&tx))?;
                tx.commit()?;
                if let Some(c) = &self.commits {
                    c.committed();
                }
                Ok(v)
            })();
            match attempt {
                Err(TxError::Conflict(e)) => {
                    tracing::debug!("metadata database busy, retrying: {e}");
                    self.stats.retried();
                    backoff(&mut delay);
                }
                other => return other.map_err(TxError::into_meta),
            }
        }
    }

    /// As [`Engine::write`], but while grouping is on `f` joins the open group (or opens
    /// one) and is committed with it later (see `group`).
    fn write_grouped<T>(
        &self,
        lock: &[Ino],
        rename_lock: bool,
        mut f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T> {
        if !self.group.enabled() {
            return self.write(lock, rename_lock, f);
        }
        let timed = self.stats.begin(TxKind::Write);
        let mut conn = self.writer.lock();
        let mut delay = Duration::from_millis(1);
        while conn.is_autocommit() {
            match conn.execute_batch("BEGIN IMMEDIATE") {
                Ok(()) => self.group.began(),
                Err(e) => match TxError::from(e) {
                    TxError::Conflict(e) => {
                        tracing::debug!("metadata database busy, retrying: {e}");
                        self.stats.retried();
                        backoff(&mut delay);
                        continue;
                    }
                    other => return Err(other.into_meta()),
                },
            }
            if !data_version(&conn).is_some_and(|v| self.group.alone_since(v)) {
                // Another process wrote: no grouping until sessions say alone again. The
                // group just begun takes `f` and commits with it.
                self.group.stop_for_company();
                drop(conn);
                timed.cancel();
                return self.write(lock, rename_lock, f);
            }
        }
        let res = in_savepoint(&mut conn, &mut f);
        let committed = match self.group.joined() {
            true => self.end_group(&conn),
            false => Ok(()),
        };
        settle(res, committed)
    }

    fn single<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T> {
        self.write(&[], false, f)
    }

    /// Runs `f` in a read transaction, retrying while busy.
    fn read<T>(&self, mut f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T> {
        let _timed = self.stats.begin(TxKind::Read);
        // SQLite drops a connection's page cache whenever another connection changed the
        // database, so a reader between two writes reads every page again; the writer's
        // cache survives its own commits. An idle writer answers reads itself. While a group
        // is open only the writer sees it: a read then waits for the writer.
        let writer = match self.writer.try_lock() {
            Some(w) => Some(w),
            None if self.group.is_open() => Some(self.writer.lock()),
            None => None,
        };
        if let Some(mut w) = writer {
            if !w.is_autocommit() {
                return f(&mut SqlTx(&w)).map_err(TxError::into_meta);
            }
            match read_once(&mut w, &mut f) {
                // Another process holds the database: wait on a reader instead of the writer.
                Err(TxError::Conflict(_)) => {}
                other => return other.map_err(TxError::into_meta),
            }
        }
        let conn = self.readers.lock().pop();
        let mut conn = match conn {
            Some(c) => c,
            None => open_conn(&self.path, false)?,
        };
        let mut delay = Duration::from_millis(1);
        let out = loop {
            match read_once(&mut conn, &mut f) {
                Err(TxError::Conflict(_)) => {
                    self.stats.retried();
                    backoff(&mut delay)
                }
                other => break other,
            }
        };
        let mut pool = self.readers.lock();
        if pool.len() < 16 {
            pool.push(conn);
        }
        out.map_err(TxError::into_meta)
    }

    fn group_writes(&self, on: bool) {
        self.group.enable(on, || data_version(&self.writer.lock()));
        if !on {
            let _ = self.commit_group();
        }
    }

    fn grouping(&self) -> bool {
        self.group.enabled()
    }

    fn others_wrote(
        &self,
        company: &mut dyn FnMut(&mut dyn Txn) -> TxResult<bool>,
    ) -> Option<bool> {
        if !self.group.enabled() && !self.group.suspects_company() {
            // Not grouping: told this client is not alone, or a group was lost (or no
            // version to compare with).
            return None;
        }
        let mut conn = self.writer.lock();
        if self.group.enabled() {
            if !conn.is_autocommit() {
                // A group is open: it checked the version when it began, and holds the
                // database's write lock, so nobody has written since.
                return None;
            }
            if data_version(&conn).is_some_and(|v| self.group.alone_since(v)) {
                return None;
            }
        }
        // Another process wrote (now, or when a group began and stopped grouping): the
        // version and the sessions, read in one snapshot, tell whose write it was.
        let seen = (|| -> TxResult<(Option<i64>, bool)> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            let v = data_version(&tx);
            let others = company(&mut SqlTx(&tx))?;
            tx.finish()?;
            Ok((v, others))
        })();
        match seen {
            Ok((Some(v), false)) if self.group.rebase(v) => Some(false),
            // Told meanwhile that this client is not alone.
            Ok((_, false)) => None,
            _ => {
                self.group.stop_for_company();
                Some(true)
            }
        }
    }

    fn commit_group(&self) -> Result<()> {
        let conn = self.writer.lock();
        self.end_group(&conn)
            .map_err(|e| TxError::from(e).into_meta())
    }

    fn settle_writes(&self) {
        drop(self.writer.lock());
    }

    /// Fsyncs the WAL, without holding up writers, and once for every caller waiting: a
    /// ticket is taken after the caller's commits; an fsync that starts after a ticket was
    /// taken covers it (the WAL only grows, or restarts after a checkpoint, which fsyncs what
    /// it copies). Concurrent `fsync(2)` calls of many files so share one disk flush.
    fn check_storage(&self) -> Result<Vec<String>> {
        let c = self.writer.lock();
        let mut stmt = c.prepare("PRAGMA quick_check(20)")?;
        let found = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(found.into_iter().filter(|l| l != "ok").collect())
    }

    fn sync_file(&self) -> Option<PathBuf> {
        Some(self.path.clone())
    }

    /// The group's commit, then the WAL's new pages handed to the disk (`sync_file_range`,
    /// no wait and no flush): the fdatasync of [`Engine::sync`] then waits for writes already
    /// under way, beside the staged piece's. The commit is in the WAL's pages only, durable
    /// at that fdatasync (a commit of the group's timer is no more durable either).
    fn begin_sync(&self) -> Result<()> {
        self.commit_group()?;
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        if let Ok(f) = std::fs::File::open(&wal) {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain system call on a descriptor `f` keeps open. Its failure only
            // leaves the writing to the fdatasync.
            unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.commit_group()?;
        let mine = self.sync_tickets.fetch_add(1, SeqCst) + 1;
        let mut synced = self.synced.lock();
        if *synced >= mine {
            return Ok(());
        }
        let upto = self.sync_tickets.load(SeqCst);
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let target = if Path::new(&wal).exists() {
            PathBuf::from(wal)
        } else {
            self.path.clone()
        };
        // fdatasync, as SQLite syncs its WAL itself: the WAL's size is what recovery needs of
        // its inode (and fdatasync keeps that), its times are not.
        std::fs::File::open(&target)
            .and_then(|f| f.sync_data())
            .map_err(|e| Error::Engine(format!("fsync {}: {e}", target.display())))?;
        *synced = upto;
        Ok(())
    }
}

/// The shared SQL (see [`Txn`]) as SQLite takes it: `?N` parameters, tables without the
/// `unkai_` prefix (`unkai_open` is `open_file`). Translated once per statement and thread,
/// without a lock shared by the threads.
fn with_dialect<T>(sql: &'static str, f: impl FnOnce(&str) -> T) -> T {
    thread_local! {
        static DONE: std::cell::RefCell<HashMap<&'static str, String>> = Default::default();
    }
    DONE.with_borrow_mut(|done| {
        let t = done.entry(sql).or_insert_with(|| {
            sql.replace("unkai_open", "open_file")
                .replace("unkai_", "")
                .replace('$', "?")
        });
        f(t)
    })
}

impl rusqlite::ToSql for Val<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Val::Int(v) => ValueRef::Integer(v),
            Val::Bytes(b) => ValueRef::Blob(b),
            Val::Text(t) => ValueRef::Text(t.as_bytes()),
        }))
    }
}

fn cell(v: ValueRef<'_>) -> Cell {
    match v {
        ValueRef::Integer(i) => Cell::Int(i),
        ValueRef::Real(f) => Cell::Int(f as i64),
        ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
        ValueRef::Null => Cell::Null,
    }
}

/// Statements of one SQLite transaction.
struct SqlTx<'c>(&'c Connection);

impl Txn for SqlTx<'_> {
    fn exec(&mut self, sql: &'static str, p: &[Val<'_>]) -> TxResult<u64> {
        let n = with_dialect(sql, |q| {
            self.0.prepare_cached(q)?.execute(params_from_iter(p))
        })?;
        Ok(n as u64)
    }

    fn scan(
        &mut self,
        sql: &'static str,
        p: &[Val<'_>],
        f: &mut dyn FnMut(SqlRow) -> TxResult<()>,
    ) -> TxResult<()> {
        let mut st = with_dialect(sql, |q| self.0.prepare_cached(q))?;
        let n = st.column_count();
        let mut rows = st.query(params_from_iter(p))?;
        while let Some(r) = rows.next()? {
            let cells = (0..n)
                .map(|i| r.get_ref(i).map(cell))
                .collect::<rusqlite::Result<_>>()?;
            f(SqlRow(cells))?;
        }
        Ok(())
    }

    /// SQLite's `||` makes text of two BLOBs: cast back.
    fn append_chunk(&mut self, ino: Ino, index: u32, recs: &[SliceRec]) -> TxResult<Vec<SliceRec>> {
        let all: Vec<u8> = self
            .0
            .prepare_cached(
                "INSERT INTO chunk (ino, indx, slices) VALUES (?1, ?2, ?3)
                 ON CONFLICT (ino, indx) DO UPDATE
                   SET slices = CAST(slices || excluded.slices AS BLOB)
                 RETURNING slices",
            )?
            .query_row(params![ino as i64, index, slice::encode(recs)], |r| {
                r.get(0)
            })?;
        decode_chunk(&all, ino, index)
    }

    /// A name written by hand may be TEXT.
    fn remove_edge_named(&mut self, parent: Ino, name: &[u8]) -> TxResult<()> {
        self.exec(
            "DELETE FROM unkai_edge WHERE parent=$1 AND CAST(name AS BLOB)=$2",
            &[Val::Int(parent as i64), Val::Bytes(name)],
        )?;
        Ok(())
    }

    /// Recorded in `open_file`, or in `sustained` (an unlinked inode a client keeps while it
    /// counts its opens only in memory).
    fn open_anywhere(&mut self, ino: Ino) -> TxResult<bool> {
        let sql = "SELECT 1 FROM unkai_open WHERE ino=$1
                   UNION ALL SELECT 1 FROM unkai_sustained WHERE ino=$1 LIMIT 1";
        Ok(self.row(sql, &[Val::Int(ino as i64)])?.is_some())
    }
}

/// A scratch SQLite volume of format `fmt` in a temporary directory, with a session of this
/// process open: for the unit tests of the layers above.
#[cfg(test)]
pub(crate) fn scratch(fmt: &Format) -> (tempfile::TempDir, std::sync::Arc<dyn super::Meta>) {
    use super::{Meta, SessionInfo};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    SqliteMeta::create(&path, "sqlite://x", fmt, false).unwrap();
    let meta = SqliteMeta::open(&path, "sqlite://x").unwrap();
    meta.new_session(SessionInfo {
        host: "h".into(),
        pid: std::process::id(),
        mountpoint: "/m".into(),
        version: "t".into(),
        started: 0,
        heartbeat: 0,
        id: 0,
        ..Default::default()
    })
    .unwrap();
    (dir, std::sync::Arc::new(meta))
}
