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
//!
//! Not for: what operations mean (`ops`), caching (the kernel and `vfs`), object storage.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use super::engine::{Engine, SessionRow, TxError, TxResult, Txn, corrupt, fail};
use super::lock::{LockOwner, LockRange};
use super::ops::{self, EngineMeta};
use super::slice::{self, SliceRec};
use super::*;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS setting (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counter (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS node (
  ino INTEGER PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT NULL,
  uid INTEGER NOT NULL, gid INTEGER NOT NULL, nlink INTEGER NOT NULL,
  length INTEGER NOT NULL, rdev INTEGER NOT NULL,
  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,
  parent INTEGER NOT NULL);
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

fn open_conn(path: &Path, create: bool) -> rusqlite::Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let c = Connection::open_with_flags(path, flags)?;
    c.busy_timeout(Duration::from_secs(60))?;
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
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    /// Group fsync (see [`Engine::sync`]): tickets handed out, and the last ticket covered by
    /// a finished fsync (under this lock, which also makes fsyncs take turns).
    sync_tickets: AtomicU64,
    synced: Mutex<u64>,
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
        let c = open_conn(path, false).map_err(|e| cannot_open(path, e))?;
        let Some(json) = stored_format(&c)? else {
            return Err(Error::NotFormatted(url.to_string()));
        };
        let mut format = ops::parse_format(&json, url)?;
        c.execute_batch(SCHEMA)?;
        if format.schema < format::SCHEMA_VERSION {
            // Schema 2 added `open_file` (created above); binaries that do not record opens
            // refuse the volume from now on.
            format.schema = format::SCHEMA_VERSION;
            let json = serde_json::to_string(&format).expect("format serializes");
            c.execute("UPDATE setting SET value=?1 WHERE name='format'", [json])?;
        }
        let engine = Sqlite {
            path: path.to_path_buf(),
            writer: Mutex::new(c),
            readers: Mutex::new(Vec::new()),
            sync_tickets: AtomicU64::new(0),
            synced: Mutex::new(0),
        };
        Ok(EngineMeta::new(engine, format))
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

    /// Runs `f` in a write transaction of the one writer, retrying while the database is
    /// busy. Nothing to lock: writes take turns.
    fn write<T>(
        &self,
        _lock: &[Ino],
        _rename_lock: bool,
        mut f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T> {
        let mut conn = self.writer.lock();
        let mut delay = Duration::from_millis(1);
        loop {
            let attempt = (|| -> TxResult<T> {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let v = f(&mut SqlTx(&tx))?;
                tx.commit()?;
                Ok(v)
            })();
            match attempt {
                Err(TxError::Conflict(e)) => {
                    tracing::debug!("metadata database busy, retrying: {e}");
                    backoff(&mut delay);
                }
                other => return other.map_err(TxError::into_meta),
            }
        }
    }

    fn single<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T> {
        self.write(&[], false, f)
    }

    /// Runs `f` in a read transaction, retrying while busy.
    fn read<T>(&self, mut f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T> {
        // SQLite drops a connection's page cache whenever another connection changed the
        // database, so a reader between two writes reads every page again; the writer's
        // cache survives its own commits. An idle writer answers reads itself.
        if let Some(mut w) = self.writer.try_lock() {
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
                Err(TxError::Conflict(_)) => backoff(&mut delay),
                other => break other,
            }
        };
        let mut pool = self.readers.lock();
        if pool.len() < 16 {
            pool.push(conn);
        }
        out.map_err(TxError::into_meta)
    }

    fn settle_writes(&self) {
        drop(self.writer.lock());
    }

    /// Fsyncs the WAL, without holding up writers, and once for every caller waiting: a
    /// ticket is taken after the caller's commits; an fsync that starts after a ticket was
    /// taken covers it (the WAL only grows, or restarts after a checkpoint, which fsyncs what
    /// it copies). Concurrent `fsync(2)` calls of many files so share one disk flush.
    fn sync(&self) -> Result<()> {
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

fn row_attr(r: &rusqlite::Row<'_>, base: usize) -> rusqlite::Result<Attr> {
    let kind: u8 = r.get(base + 1)?;
    Ok(Attr {
        ino: r.get::<_, i64>(base)? as u64,
        kind: Kind::from_u8(kind).unwrap_or(Kind::File),
        mode: r.get(base + 2)?,
        uid: r.get(base + 3)?,
        gid: r.get(base + 4)?,
        nlink: r.get(base + 5)?,
        length: r.get::<_, i64>(base + 6)? as u64,
        rdev: r.get(base + 7)?,
        atime: r.get(base + 8)?,
        mtime: r.get(base + 9)?,
        ctime: r.get(base + 10)?,
        parent: r.get::<_, i64>(base + 11)? as u64,
    })
}

/// Bytes of a column stored as BLOB (or, if written by hand, TEXT).
fn bytes_at(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Vec<u8>> {
    Ok(r.get_ref(i)?
        .as_bytes()
        .map(|b| b.to_vec())
        .unwrap_or_default())
}

fn dead_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DeadSlice> {
    Ok(DeadSlice {
        id: r.get::<_, i64>(0)? as u64,
        size: r.get(1)?,
    })
}

/// The records of chunk rows (undecodable ones count as none).
fn decoded(blobs: Vec<Vec<u8>>) -> Vec<SliceRec> {
    blobs
        .iter()
        .flat_map(|b| slice::decode(b).unwrap_or_default())
        .collect()
}

const NODE_COLS: &str = "n.ino, n.kind, n.mode, n.uid, n.gid, n.nlink, n.length, n.rdev, \
                         n.atime, n.mtime, n.ctime, n.parent";

/// Statements of one SQLite transaction.
struct SqlTx<'c>(&'c Connection);

impl SqlTx<'_> {
    fn run(&self, sql: &str, p: impl rusqlite::Params) -> TxResult<usize> {
        Ok(self.0.prepare_cached(sql)?.execute(p)?)
    }

    fn counter_add(&self, name: &str, delta: i64) -> TxResult<()> {
        if delta != 0 {
            self.run(
                "UPDATE counter SET value = value + ?2 WHERE name = ?1",
                params![name, delta],
            )?;
        }
        Ok(())
    }

    fn counter(&self, name: &str) -> TxResult<i64> {
        Ok(self
            .0
            .prepare_cached("SELECT value FROM counter WHERE name=?1")?
            .query_row([name], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    fn ids(&self, sql: &str, p: impl rusqlite::Params) -> TxResult<Vec<(u64, u64)>> {
        Ok(self
            .0
            .prepare_cached(sql)?
            .query_map(p, |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })?
            .collect::<rusqlite::Result<_>>()?)
    }
}

impl Txn for SqlTx<'_> {
    fn get_node(&mut self, ino: Ino) -> TxResult<Attr> {
        let sql = format!("SELECT {NODE_COLS} FROM node n WHERE n.ino = ?1");
        match self
            .0
            .prepare_cached(&sql)?
            .query_row([ino as i64], |r| row_attr(r, 0))
            .optional()?
        {
            Some(a) => Ok(a),
            None => fail(libc::ENOENT),
        }
    }

    fn insert_node(&mut self, a: &Attr) -> TxResult<()> {
        self.run(
            "INSERT INTO node (ino, kind, mode, uid, gid, nlink, length, rdev, atime, mtime,
             ctime, parent) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                a.ino as i64,
                a.kind as u8,
                a.mode,
                a.uid,
                a.gid,
                a.nlink,
                a.length as i64,
                a.rdev,
                a.atime,
                a.mtime,
                a.ctime,
                a.parent as i64
            ],
        )?;
        Ok(())
    }

    fn update_node(&mut self, a: &Attr) -> TxResult<()> {
        self.run(
            "UPDATE node SET mode=?2, uid=?3, gid=?4, nlink=?5, length=?6, rdev=?7, atime=?8,
             mtime=?9, ctime=?10, parent=?11 WHERE ino=?1",
            params![
                a.ino as i64,
                a.mode,
                a.uid,
                a.gid,
                a.nlink,
                a.length as i64,
                a.rdev,
                a.atime,
                a.mtime,
                a.ctime,
                a.parent as i64
            ],
        )?;
        Ok(())
    }

    fn delete_node_rows(&mut self, ino: Ino) -> TxResult<Vec<SliceRec>> {
        let recs = self.drop_chunks(ino, 0, u64::MAX)?;
        for sql in [
            "DELETE FROM node WHERE ino=?1",
            "DELETE FROM symlink WHERE ino=?1",
            "DELETE FROM xattr WHERE ino=?1",
        ] {
            self.run(sql, [ino as i64])?;
        }
        Ok(recs)
    }

    fn add_usage(&mut self, used_bytes: i64, inodes: i64) -> TxResult<()> {
        self.counter_add("usedSpace", used_bytes)?;
        self.counter_add("totalInodes", inodes)
    }

    fn set_usage(&mut self, used_bytes: u64, inodes: u64) -> TxResult<()> {
        let set = "UPDATE counter SET value=?2 WHERE name=?1";
        self.run(set, params!["usedSpace", used_bytes as i64])?;
        self.run(set, params!["totalInodes", inodes as i64])?;
        Ok(())
    }

    fn take_ids(&mut self, name: &'static str, n: u64) -> TxResult<u64> {
        let v: i64 = self
            .0
            .prepare_cached("UPDATE counter SET value = value + ?2 WHERE name=?1 RETURNING value")?
            .query_row(params![name, n as i64], |r| r.get(0))?;
        Ok(v as u64 - n)
    }

    fn usage(&mut self) -> TxResult<Usage> {
        let (slices, slice_bytes): (i64, i64) = self.0.query_row(
            "SELECT count(*), coalesce(sum(size), 0) FROM slice_ref",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let pending: i64 = self
            .0
            .query_row("SELECT count(*) FROM dead_slice", [], |r| r.get(0))?;
        Ok(Usage {
            used_bytes: self.counter("usedSpace")?.max(0) as u64,
            inodes: self.counter("totalInodes")?.max(0) as u64,
            slice_bytes: slice_bytes as u64,
            slices: slices as u64,
            pending_delete: pending as u64,
        })
    }

    fn get_edge(&mut self, parent: Ino, name: &[u8]) -> TxResult<Option<(i64, Ino)>> {
        Ok(self
            .0
            .prepare_cached("SELECT id, ino FROM edge WHERE parent=?1 AND name=?2")?
            .query_row(params![parent as i64, name], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)? as u64))
            })
            .optional()?)
    }

    fn child(&mut self, parent: Ino, name: &[u8]) -> TxResult<Option<Attr>> {
        let sql = format!(
            "SELECT {NODE_COLS} FROM edge e JOIN node n ON n.ino = e.ino
             WHERE e.parent=?1 AND e.name=?2"
        );
        Ok(self
            .0
            .prepare_cached(&sql)?
            .query_row(params![parent as i64, name], |r| row_attr(r, 0))
            .optional()?)
    }

    fn insert_edge(&mut self, parent: Ino, name: &[u8], ino: Ino, kind: Kind) -> TxResult<()> {
        self.run(
            "INSERT INTO edge (parent, name, ino, kind) VALUES (?1, ?2, ?3, ?4)",
            params![parent as i64, name, ino as i64, kind as u8],
        )?;
        Ok(())
    }

    fn delete_edge(&mut self, id: i64) -> TxResult<()> {
        self.run("DELETE FROM edge WHERE id=?1", [id])?;
        Ok(())
    }

    fn set_edge_target(&mut self, id: i64, ino: Ino, kind: Kind) -> TxResult<()> {
        self.run(
            "UPDATE edge SET ino=?2, kind=?3 WHERE id=?1",
            params![id, ino as i64, kind as u8],
        )?;
        Ok(())
    }

    fn move_edge(&mut self, id: i64, parent: Ino, name: &[u8]) -> TxResult<()> {
        self.run(
            "UPDATE edge SET parent=?2, name=?3 WHERE id=?1",
            params![id, parent as i64, name],
        )?;
        Ok(())
    }

    fn dir_is_empty(&mut self, ino: Ino) -> TxResult<bool> {
        Ok(self
            .0
            .prepare_cached("SELECT 1 FROM edge WHERE parent=?1 LIMIT 1")?
            .query_row([ino as i64], |_| Ok(()))
            .optional()?
            .is_none())
    }

    fn list_entries(
        &mut self,
        dir: Ino,
        after: i64,
        limit: i64,
        plus: bool,
    ) -> TxResult<Vec<DirEntry>> {
        let p = params![dir as i64, after, limit];
        let rows = if plus {
            let sql = format!(
                "SELECT e.id, e.name, {NODE_COLS} FROM edge e JOIN node n ON n.ino = e.ino
                 WHERE e.parent=?1 AND e.id>?2 ORDER BY e.id LIMIT ?3"
            );
            self.0
                .prepare_cached(&sql)?
                .query_map(p, |r| {
                    let a = row_attr(r, 2)?;
                    Ok(DirEntry {
                        name: bytes_at(r, 1)?,
                        ino: a.ino,
                        kind: a.kind,
                        cookie: r.get::<_, i64>(0)? as u64 + 2,
                        attr: Some(a),
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?
        } else {
            self.0
                .prepare_cached(
                    "SELECT id, name, ino, kind FROM edge WHERE parent=?1 AND id>?2
                     ORDER BY id LIMIT ?3",
                )?
                .query_map(p, |r| {
                    Ok(DirEntry {
                        name: bytes_at(r, 1)?,
                        ino: r.get::<_, i64>(2)? as u64,
                        kind: Kind::from_u8(r.get(3)?).unwrap_or(Kind::File),
                        cookie: r.get::<_, i64>(0)? as u64 + 2,
                        attr: None,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?
        };
        Ok(rows)
    }

    fn remove_edge_named(&mut self, parent: Ino, name: &[u8]) -> TxResult<()> {
        self.run(
            "DELETE FROM edge WHERE parent=?1 AND CAST(name AS BLOB)=?2",
            params![parent as i64, name],
        )?;
        Ok(())
    }

    fn set_edge_kind(&mut self, parent: Ino, name: &[u8], kind: Kind) -> TxResult<()> {
        self.run(
            "UPDATE edge SET kind=?3 WHERE parent=?1 AND name=?2",
            params![parent as i64, name, kind as u8],
        )?;
        Ok(())
    }

    fn insert_symlink(&mut self, ino: Ino, target: &[u8]) -> TxResult<()> {
        self.run(
            "INSERT INTO symlink (ino, target) VALUES (?1, ?2)",
            params![ino as i64, target],
        )?;
        Ok(())
    }

    fn symlink(&mut self, ino: Ino) -> TxResult<Option<Vec<u8>>> {
        Ok(self
            .0
            .prepare_cached("SELECT target FROM symlink WHERE ino=?1")?
            .query_row([ino as i64], |r| r.get(0))
            .optional()?)
    }

    fn xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<Option<Vec<u8>>> {
        Ok(self
            .0
            .prepare_cached("SELECT value FROM xattr WHERE ino=?1 AND name=?2")?
            .query_row(params![ino as i64, name], |r| r.get(0))
            .optional()?)
    }

    fn put_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> TxResult<()> {
        self.run(
            "INSERT OR REPLACE INTO xattr (ino, name, value) VALUES (?1, ?2, ?3)",
            params![ino as i64, name, value],
        )?;
        Ok(())
    }

    fn delete_xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<bool> {
        let n = self.run(
            "DELETE FROM xattr WHERE ino=?1 AND name=?2",
            params![ino as i64, name],
        )?;
        Ok(n > 0)
    }

    fn xattr_names(&mut self, ino: Ino) -> TxResult<Vec<Vec<u8>>> {
        Ok(self
            .0
            .prepare_cached("SELECT name FROM xattr WHERE ino=?1 ORDER BY name")?
            .query_map([ino as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn chunk(&mut self, ino: Ino, index: u32) -> TxResult<Vec<SliceRec>> {
        let blob: Option<Vec<u8>> = self
            .0
            .prepare_cached("SELECT slices FROM chunk WHERE ino=?1 AND indx=?2")?
            .query_row(params![ino as i64, index], |r| r.get(0))
            .optional()?;
        match blob {
            None => Ok(Vec::new()),
            Some(b) => slice::decode(&b)
                .ok_or_else(|| corrupt(format!("chunk {index} of inode {ino} is corrupt"))),
        }
    }

    fn append_chunk(&mut self, ino: Ino, index: u32, recs: &[SliceRec]) -> TxResult<usize> {
        let n: i64 = self
            .0
            .prepare_cached(
                "INSERT INTO chunk (ino, indx, slices) VALUES (?1, ?2, ?3)
                 ON CONFLICT (ino, indx) DO UPDATE
                   SET slices = CAST(slices || excluded.slices AS BLOB)
                 RETURNING length(slices)",
            )?
            .query_row(params![ino as i64, index, slice::encode(recs)], |r| {
                r.get(0)
            })?;
        Ok(n as usize / slice::REC_SIZE)
    }

    fn set_chunk(&mut self, ino: Ino, index: u32, recs: &[SliceRec]) -> TxResult<()> {
        if recs.is_empty() {
            self.run(
                "DELETE FROM chunk WHERE ino=?1 AND indx=?2",
                params![ino as i64, index],
            )?;
        } else {
            self.run(
                "UPDATE chunk SET slices=?3 WHERE ino=?1 AND indx=?2",
                params![ino as i64, index, slice::encode(recs)],
            )?;
        }
        Ok(())
    }

    fn drop_chunks(&mut self, ino: Ino, from: u64, to: u64) -> TxResult<Vec<SliceRec>> {
        let lim = |i: u64| i.min(u32::MAX as u64 + 1) as i64;
        let p = params![ino as i64, lim(from), lim(to)];
        let blobs: Vec<Vec<u8>> = self
            .0
            .prepare_cached("SELECT slices FROM chunk WHERE ino=?1 AND indx>=?2 AND indx<?3")?
            .query_map(p, |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        self.run("DELETE FROM chunk WHERE ino=?1 AND indx>=?2 AND indx<?3", p)?;
        Ok(decoded(blobs))
    }

    fn incref(&mut self, recs: &[SliceRec]) -> TxResult<()> {
        for r in recs.iter().filter(|r| r.id != 0) {
            self.run(
                "INSERT INTO slice_ref (id, size, refs) VALUES (?1, ?2, 1)
                 ON CONFLICT (id) DO UPDATE SET refs = refs + 1",
                params![r.id as i64, r.size],
            )?;
        }
        Ok(())
    }

    fn decref(&mut self, recs: &[SliceRec], now: Nanos) -> TxResult<()> {
        for r in recs.iter().filter(|r| r.id != 0) {
            let left: Option<i64> = self
                .0
                .prepare_cached("UPDATE slice_ref SET refs = refs - 1 WHERE id=?1 RETURNING refs")?
                .query_row([r.id as i64], |r| r.get(0))
                .optional()?;
            if left.is_none_or(|n| n <= 0) {
                self.set_slice_refs(r.id, r.size, 0, now)?;
            }
        }
        Ok(())
    }

    fn set_slice_refs(&mut self, id: u64, size: u32, refs: u32, now: Nanos) -> TxResult<()> {
        if refs == 0 {
            self.run("DELETE FROM slice_ref WHERE id=?1", [id as i64])?;
            self.run(
                "INSERT OR IGNORE INTO dead_slice (id, size, died) VALUES (?1, ?2, ?3)",
                params![id as i64, size, now],
            )?;
        } else {
            self.run(
                "INSERT INTO slice_ref (id, size, refs) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET refs=excluded.refs, size=excluded.size",
                params![id as i64, size, refs],
            )?;
        }
        Ok(())
    }

    fn dead_slices(&mut self, cutoff: Option<Nanos>, limit: usize) -> TxResult<Vec<DeadSlice>> {
        Ok(self
            .0
            .prepare_cached(
                "SELECT id, size FROM dead_slice WHERE died <= ?1 ORDER BY id LIMIT ?2",
            )?
            .query_map(
                params![
                    cutoff.unwrap_or(i64::MAX),
                    limit.min(i64::MAX as usize) as i64
                ],
                dead_row,
            )?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn forget_dead(&mut self, ids: &[u64]) -> TxResult<()> {
        for id in ids {
            self.run("DELETE FROM dead_slice WHERE id=?1", [*id as i64])?;
        }
        Ok(())
    }

    fn insert_session(&mut self, info: &str, now: Nanos) -> TxResult<u64> {
        self.run(
            "INSERT INTO session (info, heartbeat) VALUES (?1, ?2)",
            params![info, now],
        )?;
        Ok(self.0.last_insert_rowid() as u64)
    }

    fn touch_session(&mut self, id: u64, now: Nanos) -> TxResult<bool> {
        let n = self.run(
            "UPDATE session SET heartbeat=?2 WHERE id=?1",
            params![id as i64, now],
        )?;
        Ok(n > 0)
    }

    fn session(&mut self, id: u64) -> TxResult<Option<SessionRow>> {
        Ok(self
            .0
            .prepare_cached("SELECT info, heartbeat FROM session WHERE id=?1")?
            .query_row([id as i64], |r| Ok((id, r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    fn sessions(&mut self) -> TxResult<Vec<SessionRow>> {
        Ok(self
            .0
            .prepare_cached("SELECT id, info, heartbeat FROM session ORDER BY id")?
            .query_map([], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?))
            })?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn delete_session(&mut self, id: u64) -> TxResult<()> {
        self.run("DELETE FROM session WHERE id=?1", [id as i64])?;
        Ok(())
    }

    fn take_session_opens(&mut self, session: u64) -> TxResult<Vec<Ino>> {
        let sid = session as i64;
        let inos = self.ids(
            "SELECT ino, 0 FROM sustained WHERE session=?1
             UNION SELECT ino, 0 FROM open_file WHERE session=?1",
            [sid],
        )?;
        self.run("DELETE FROM sustained WHERE session=?1", [sid])?;
        self.run("DELETE FROM open_file WHERE session=?1", [sid])?;
        Ok(inos.into_iter().map(|(ino, _)| ino).collect())
    }

    fn insert_open(&mut self, ino: Ino, session: u64) -> TxResult<()> {
        self.run(
            "INSERT OR IGNORE INTO open_file (ino, session) VALUES (?1, ?2)",
            params![ino as i64, session as i64],
        )?;
        Ok(())
    }

    fn delete_open(&mut self, ino: Ino, session: Option<u64>) -> TxResult<()> {
        match session {
            Some(s) => self.run(
                "DELETE FROM open_file WHERE ino=?1 AND session=?2",
                params![ino as i64, s as i64],
            )?,
            None => self.run("DELETE FROM open_file WHERE ino=?1", [ino as i64])?,
        };
        Ok(())
    }

    /// Recorded in `open_file`, or in `sustained` (an unlinked inode a client keeps while it
    /// counts its opens only in memory).
    fn open_anywhere(&mut self, ino: Ino) -> TxResult<bool> {
        Ok(self
            .0
            .prepare_cached(
                "SELECT 1 FROM open_file WHERE ino=?1
                 UNION ALL SELECT 1 FROM sustained WHERE ino=?1 LIMIT 1",
            )?
            .query_row([ino as i64], |_| Ok(()))
            .optional()?
            .is_some())
    }

    fn insert_sustained(&mut self, session: u64, ino: Ino) -> TxResult<()> {
        self.run(
            "INSERT OR IGNORE INTO sustained (session, ino) VALUES (?1, ?2)",
            params![session as i64, ino as i64],
        )?;
        Ok(())
    }

    fn delete_sustained(&mut self, ino: Ino, session: Option<u64>) -> TxResult<()> {
        match session {
            Some(s) => self.run(
                "DELETE FROM sustained WHERE session=?1 AND ino=?2",
                params![s as i64, ino as i64],
            )?,
            None => self.run("DELETE FROM sustained WHERE ino=?1", [ino as i64])?,
        };
        Ok(())
    }

    fn open_records(&mut self) -> TxResult<Vec<(u64, Ino)>> {
        self.ids(
            "SELECT session, ino FROM sustained
             UNION SELECT session, ino FROM open_file ORDER BY 1, 2",
            [],
        )
    }

    fn locks(&mut self, ino: Ino) -> TxResult<Vec<(LockOwner, LockRange)>> {
        Ok(self
            .0
            .prepare_cached(
                "SELECT session, owner, kind, start, last, pid FROM plock \
                 WHERE ino=?1 AND session IN (SELECT id FROM session)",
            )?
            .query_map([ino as i64], |r| {
                Ok((
                    LockOwner {
                        session: r.get::<_, i64>(0)? as u64,
                        owner: r.get::<_, i64>(1)? as u64,
                    },
                    LockRange {
                        kind: LockKind::from_code(r.get(2)?),
                        start: r.get::<_, i64>(3)? as u64,
                        end: r.get::<_, i64>(4)? as u64,
                        pid: r.get::<_, i64>(5)? as u32,
                    },
                ))
            })?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn drop_orphan_locks(&mut self, ino: Ino) -> TxResult<()> {
        self.run(
            "DELETE FROM plock WHERE ino=?1 AND session NOT IN (SELECT id FROM session)",
            [ino as i64],
        )?;
        Ok(())
    }

    fn store_locks(&mut self, ino: Ino, me: LockOwner, ranges: &[LockRange]) -> TxResult<()> {
        let (ino, session, owner) = (ino as i64, me.session as i64, me.owner as i64);
        self.run(
            "DELETE FROM plock WHERE ino=?1 AND session=?2 AND owner=?3",
            params![ino, session, owner],
        )?;
        for r in ranges {
            self.run(
                "INSERT INTO plock (ino, session, owner, kind, start, last, pid) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    ino,
                    session,
                    owner,
                    r.kind.code(),
                    r.start as i64,
                    r.end as i64,
                    r.pid as i64
                ],
            )?;
        }
        Ok(())
    }

    fn slice_refs(&mut self) -> TxResult<Vec<(u64, u32, u32)>> {
        Ok(self
            .0
            .prepare("SELECT id, size, refs FROM slice_ref ORDER BY id")?
            .query_map([], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?))
            })?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn scan_nodes(&mut self, f: &mut dyn FnMut(&Attr)) -> TxResult<()> {
        let sql = format!("SELECT {NODE_COLS} FROM node n ORDER BY n.ino");
        let mut s = self.0.prepare(&sql)?;
        let mut rows = s.query([])?;
        while let Some(r) = rows.next()? {
            f(&row_attr(r, 0)?);
        }
        Ok(())
    }

    fn scan_entries(&mut self, f: &mut dyn FnMut(Ino, &[u8], Ino, Option<Kind>)) -> TxResult<()> {
        let mut s = self
            .0
            .prepare("SELECT parent, name, ino, kind FROM edge ORDER BY parent, id")?;
        let mut rows = s.query([])?;
        while let Some(r) = rows.next()? {
            let name = bytes_at(r, 1)?;
            f(
                r.get::<_, i64>(0)? as u64,
                &name,
                r.get::<_, i64>(2)? as u64,
                Kind::from_u8(r.get(3)?),
            );
        }
        Ok(())
    }

    fn scan_chunks(&mut self, f: &mut dyn FnMut(Ino, u32, Option<Vec<SliceRec>>)) -> TxResult<()> {
        let mut s = self
            .0
            .prepare("SELECT ino, indx, slices FROM chunk ORDER BY ino, indx")?;
        let mut rows = s.query([])?;
        while let Some(r) = rows.next()? {
            let blob = bytes_at(r, 2)?;
            f(r.get::<_, i64>(0)? as u64, r.get(1)?, slice::decode(&blob));
        }
        Ok(())
    }
}
