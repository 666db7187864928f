//! The embedded metadata engine: one SQLite file.
//!
//! Concurrency: one writer connection owns all writes (behind a mutex, `BEGIN IMMEDIATE`),
//! readers use their own connections beside it (WAL). A busy database (another process, e.g.
//! `unkai fsck` while mounted) is waited for and retried, never reported: no operation ever
//! fails with "database is locked".
//!
//! Durability: `synchronous=NORMAL` in WAL mode, so a commit is safe from a crash of this
//! process at once, and safe from power loss after [`Meta::sync`] (which fsyncs the WAL);
//! `fsync(2)` on a file calls it. That keeps metadata-heavy work free of per-operation fsyncs.
//!
//! Not for: caching (the kernel and `vfs` do that), object storage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use super::shared::MAX_FILE_SIZE;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use super::format::SCHEMA_VERSION;
use super::lock;
use super::shared::{
    FRAGMENTED_AT, ID_BATCH, OpenCounts, align4k, by_chunk, check_name, plan_copy, row_dead,
    session_dead, zero_recs,
};
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

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// An error inside a transaction: a POSIX outcome, or SQLite's.
enum TxError {
    Meta(Error),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        TxError::Sql(e)
    }
}
impl From<Error> for TxError {
    fn from(e: Error) -> Self {
        TxError::Meta(e)
    }
}

type Tx<T> = std::result::Result<T, TxError>;

fn fail<T>(errno: i32) -> Tx<T> {
    Err(TxError::Meta(Error::Sys(errno)))
}

struct IdPool {
    next: u64,
    end: u64,
}

pub struct SqliteMeta {
    path: PathBuf,
    url: String,
    format: Format,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    inos: Mutex<IdPool>,
    slices: Mutex<IdPool>,
    /// Open counts of inodes opened through this client; also recorded in `open_file` once
    /// another client shares the volume (see [`SqliteMeta::share_opens`]).
    opens: OpenCounts,
    session: Mutex<u64>,
    fragmented: Mutex<HashMap<(Ino, u32), usize>>,
    /// Group fsync (see [`Meta::sync`]): tickets handed out, and the last ticket covered by
    /// a finished fsync (under this lock, which also makes fsyncs take turns).
    sync_tickets: std::sync::atomic::AtomicU64,
    synced: Mutex<u64>,
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

/// Runs `f` once in a read transaction of `c`.
fn read_once<T>(c: &mut Connection, f: &mut impl FnMut(&Connection) -> Tx<T>) -> Tx<T> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Deferred)?;
    let v = f(&tx)?;
    tx.finish()?;
    Ok(v)
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

const NODE_COLS: &str = "n.ino, n.kind, n.mode, n.uid, n.gid, n.nlink, n.length, n.rdev, \
                         n.atime, n.mtime, n.ctime, n.parent";

fn get_node(c: &Connection, ino: Ino) -> Tx<Attr> {
    let sql = format!("SELECT {NODE_COLS} FROM node n WHERE n.ino = ?1");
    match c
        .prepare_cached(&sql)?
        .query_row([ino as i64], |r| row_attr(r, 0))
        .optional()?
    {
        Some(a) => Ok(a),
        None => fail(libc::ENOENT),
    }
}

fn insert_node(c: &Connection, a: &Attr) -> Tx<()> {
    c.prepare_cached(
        "INSERT INTO node (ino, kind, mode, uid, gid, nlink, length, rdev, atime, mtime, ctime, parent)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?
    .execute(params![
        a.ino as i64, a.kind as u8, a.mode, a.uid, a.gid, a.nlink, a.length as i64, a.rdev,
        a.atime, a.mtime, a.ctime, a.parent as i64
    ])?;
    Ok(())
}

fn update_node(c: &Connection, a: &Attr) -> Tx<()> {
    c.prepare_cached(
        "UPDATE node SET mode=?2, uid=?3, gid=?4, nlink=?5, length=?6, rdev=?7, atime=?8,
         mtime=?9, ctime=?10, parent=?11 WHERE ino=?1",
    )?
    .execute(params![
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
    ])?;
    Ok(())
}

/// A directory entry: (edge id, inode, kind).
fn get_edge(c: &Connection, parent: Ino, name: &[u8]) -> Tx<Option<(i64, Ino, u8)>> {
    Ok(
        c.prepare_cached("SELECT id, ino, kind FROM edge WHERE parent=?1 AND name=?2")?
            .query_row(params![parent as i64, name], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)? as u64, r.get(2)?))
            })
            .optional()?,
    )
}

fn dir_is_empty(c: &Connection, ino: Ino) -> Tx<bool> {
    Ok(
        c.prepare_cached("SELECT 1 FROM edge WHERE parent=?1 LIMIT 1")?
            .query_row([ino as i64], |_| Ok(()))
            .optional()?
            .is_none(),
    )
}

fn add_counter(c: &Connection, name: &str, delta: i64) -> Tx<()> {
    if delta != 0 {
        c.prepare_cached("UPDATE counter SET value = value + ?2 WHERE name = ?1")?
            .execute(params![name, delta])?;
    }
    Ok(())
}

fn get_counter(c: &Connection, name: &str) -> Tx<i64> {
    Ok(c.prepare_cached("SELECT value FROM counter WHERE name=?1")?
        .query_row([name], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

fn read_recs(c: &Connection, ino: Ino, index: u32) -> Tx<Vec<SliceRec>> {
    let blob: Option<Vec<u8>> = c
        .prepare_cached("SELECT slices FROM chunk WHERE ino=?1 AND indx=?2")?
        .query_row(params![ino as i64, index], |r| r.get(0))
        .optional()?;
    match blob {
        None => Ok(Vec::new()),
        Some(b) => slice::decode(&b).ok_or_else(|| {
            TxError::Meta(Error::Engine(format!(
                "chunk {index} of inode {ino} is corrupt"
            )))
        }),
    }
}

/// Appends records to a chunk; returns the chunk's record count after.
fn append_recs(c: &Connection, ino: Ino, index: u32, recs: &[SliceRec]) -> Tx<usize> {
    let n: i64 = c
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

fn incref(c: &Connection, r: &SliceRec) -> Tx<()> {
    if r.id != 0 {
        c.prepare_cached(
            "INSERT INTO slice_ref (id, size, refs) VALUES (?1, ?2, 1)
             ON CONFLICT (id) DO UPDATE SET refs = refs + 1",
        )?
        .execute(params![r.id as i64, r.size])?;
    }
    Ok(())
}

fn decref(c: &Connection, r: &SliceRec, now: Nanos) -> Tx<()> {
    if r.id == 0 {
        return Ok(());
    }
    let left: Option<i64> = c
        .prepare_cached("UPDATE slice_ref SET refs = refs - 1 WHERE id=?1 RETURNING refs")?
        .query_row([r.id as i64], |r| r.get(0))
        .optional()?;
    if left.is_none_or(|n| n <= 0) {
        c.prepare_cached("DELETE FROM slice_ref WHERE id=?1")?
            .execute([r.id as i64])?;
        c.prepare_cached("INSERT OR IGNORE INTO dead_slice (id, size, died) VALUES (?1, ?2, ?3)")?
            .execute(params![r.id as i64, r.size, now])?;
    }
    Ok(())
}

/// Drops the chunks of `ino` from index `from` on, releasing their slices.
fn drop_chunks(c: &Connection, ino: Ino, from: u64, now: Nanos) -> Tx<()> {
    let from = from.min(u32::MAX as u64 + 1) as i64;
    let rows: Vec<Vec<u8>> = c
        .prepare_cached("SELECT slices FROM chunk WHERE ino=?1 AND indx>=?2")?
        .query_map(params![ino as i64, from], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for b in rows {
        for r in slice::decode(&b).unwrap_or_default() {
            decref(c, &r, now)?;
        }
    }
    c.prepare_cached("DELETE FROM chunk WHERE ino=?1 AND indx>=?2")?
        .execute(params![ino as i64, from])?;
    Ok(())
}

/// Whether any client has recorded an open of the inode: in `open_file`, or in `sustained`
/// (an unlinked inode a client keeps while it records its opens only in memory).
fn open_anywhere(c: &Connection, ino: Ino) -> Tx<bool> {
    Ok(c.prepare_cached(
        "SELECT 1 FROM open_file WHERE ino=?1
             UNION ALL SELECT 1 FROM sustained WHERE ino=?1 LIMIT 1",
    )?
    .query_row([ino as i64], |_| Ok(()))
    .optional()?
    .is_some())
}

/// Deletes an inode whose last link and last open are gone.
/// Every lock held on an inode, by every owner of every live session.
fn load_locks(c: &Connection, ino: Ino) -> Tx<Vec<(lock::LockOwner, LockRange)>> {
    let mut st = c.prepare_cached(
        "SELECT session, owner, kind, start, last, pid FROM plock \
         WHERE ino=?1 AND session IN (SELECT id FROM session)",
    )?;
    let rows = st
        .query_map([ino as i64], |r| {
            Ok((
                lock::LockOwner {
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
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

fn delete_inode(c: &Connection, a: &Attr, now: Nanos) -> Tx<()> {
    drop_chunks(c, a.ino, 0, now)?;
    let ino = a.ino as i64;
    c.prepare_cached("DELETE FROM node WHERE ino=?1")?
        .execute([ino])?;
    c.prepare_cached("DELETE FROM symlink WHERE ino=?1")?
        .execute([ino])?;
    c.prepare_cached("DELETE FROM xattr WHERE ino=?1")?
        .execute([ino])?;
    add_counter(c, "totalInodes", -1)?;
    if a.kind == Kind::File {
        add_counter(c, "usedSpace", -align4k(a.length))?;
    }
    Ok(())
}

impl SqliteMeta {
    /// Creates (or with `force`, re-creates) a volume.
    pub fn create(path: &Path, url: &str, fmt: &Format, force: bool) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::Engine(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
        let mut c = open_conn(path, true)
            .map_err(|e| Error::Engine(format!("cannot open {}: {e}", path.display())))?;
        c.execute_batch(SCHEMA)?;
        let existing: Option<String> = c
            .query_row("SELECT value FROM setting WHERE name='format'", [], |r| {
                r.get(0)
            })
            .optional()?;
        if let Some(old) = existing {
            let old: Format = serde_json::from_str(&old)
                .map_err(|e| Error::Engine(format!("unreadable format: {e}")))?;
            if !force {
                return Err(Error::Refused(format!(
                    "a volume named '{}' already exists at {url}; refusing to format over it \
                     (use --force to erase it and start afresh)",
                    old.name
                )));
            }
            let now = now_nanos();
            let mut live = 0;
            let mut stmt = c.prepare("SELECT info, heartbeat FROM session")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            for row in rows {
                let (info, hb) = row?;
                if let Ok(info) = serde_json::from_str::<SessionInfo>(&info) {
                    if !session_dead(&info, hb, now) {
                        live += 1;
                    }
                }
            }
            drop(stmt);
            if live > 0 {
                return Err(Error::Refused(format!(
                    "volume '{}' at {url} is mounted by {live} client(s); unmount it before \
                     formatting with --force",
                    old.name
                )));
            }
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
        for (name, v) in [
            ("nextInode", 2i64),
            ("nextSlice", 1),
            ("usedSpace", 0),
            ("totalInodes", 1),
        ] {
            tx.execute(
                "INSERT INTO counter (name, value) VALUES (?1, ?2)",
                params![name, v],
            )?;
        }
        let now = now_nanos();
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let root = Attr {
            ino: ROOT_INO,
            kind: Kind::Dir,
            mode: 0o755,
            uid,
            gid,
            nlink: 2,
            length: 0,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            parent: ROOT_INO,
        };
        insert_node(&tx, &root).map_err(tx_err)?;
        tx.commit()?;
        Ok(())
    }

    /// Opens an existing volume.
    pub fn open(path: &Path, url: &str) -> Result<SqliteMeta> {
        if !path.exists() {
            return Err(Error::NotFormatted(url.to_string()));
        }
        let c = open_conn(path, false)
            .map_err(|e| Error::Engine(format!("cannot open {}: {e}", path.display())))?;
        let has_setting: bool = c
            .query_row(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='setting'",
                [],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        let json: Option<String> = if has_setting {
            c.query_row("SELECT value FROM setting WHERE name='format'", [], |r| {
                r.get(0)
            })
            .optional()?
        } else {
            None
        };
        let Some(json) = json else {
            return Err(Error::NotFormatted(url.to_string()));
        };
        let format: Format = serde_json::from_str(&json)
            .map_err(|e| Error::Engine(format!("unreadable volume settings in {url}: {e}")))?;
        if format.schema > SCHEMA_VERSION {
            return Err(Error::Refused(format!(
                "volume at {url} uses metadata schema {} but this unkai understands up to {}; \
                 upgrade unkai",
                format.schema, SCHEMA_VERSION
            )));
        }
        c.execute_batch(SCHEMA)?;
        let mut format = format;
        if format.schema < SCHEMA_VERSION {
            // Schema 2 added `open_file` (created above); binaries that do not record opens
            // refuse the volume from now on.
            format.schema = SCHEMA_VERSION;
            let json = serde_json::to_string(&format).expect("format serializes");
            c.execute("UPDATE setting SET value=?1 WHERE name='format'", [json])?;
        }
        Ok(SqliteMeta {
            path: path.to_path_buf(),
            url: url.to_string(),
            format,
            writer: Mutex::new(c),
            readers: Mutex::new(Vec::new()),
            inos: Mutex::new(IdPool { next: 0, end: 0 }),
            slices: Mutex::new(IdPool { next: 0, end: 0 }),
            opens: OpenCounts::new(false),
            session: Mutex::new(0),
            fragmented: Mutex::new(HashMap::new()),
            sync_tickets: std::sync::atomic::AtomicU64::new(0),
            synced: Mutex::new(0),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs `f` in a write transaction, retrying while the database is busy.
    fn write<T>(&self, mut f: impl FnMut(&Connection) -> Tx<T>) -> Result<T> {
        let mut conn = self.writer.lock();
        let mut delay = Duration::from_millis(1);
        loop {
            let attempt = (|| -> Tx<T> {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let v = f(&tx)?;
                tx.commit()?;
                Ok(v)
            })();
            match attempt {
                Ok(v) => return Ok(v),
                Err(TxError::Sql(e)) if is_busy(&e) => {
                    tracing::debug!("metadata database busy, retrying: {e}");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                Err(e) => return Err(tx_err(e)),
            }
        }
    }

    /// Runs `f` on a reader connection (in a read transaction), retrying while busy.
    fn read<T>(&self, mut f: impl FnMut(&Connection) -> Tx<T>) -> Result<T> {
        // SQLite drops a connection's page cache whenever another connection changed the
        // database, so a reader between two writes reads every page again; the writer's
        // cache survives its own commits. An idle writer answers reads itself.
        if let Some(mut w) = self.writer.try_lock() {
            match read_once(&mut w, &mut f) {
                // Another process holds the database: wait on a reader instead of the writer.
                Err(TxError::Sql(e)) if is_busy(&e) => {}
                other => return other.map_err(tx_err),
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
                Err(TxError::Sql(e)) if is_busy(&e) => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                other => break other,
            }
        };
        let mut pool = self.readers.lock();
        if pool.len() < 16 {
            pool.push(conn);
        }
        out.map_err(tx_err)
    }

    fn alloc(&self, pool: &Mutex<IdPool>, counter: &'static str) -> Result<u64> {
        let mut p = pool.lock();
        if p.next >= p.end {
            let start = self.write(|c| {
                let v = c
                    .prepare_cached(
                        "UPDATE counter SET value = value + ?2 WHERE name=?1 RETURNING value",
                    )?
                    .query_row(params![counter, ID_BATCH as i64], |r| r.get::<_, i64>(0))?;
                Ok(v as u64 - ID_BATCH)
            })?;
            p.next = start;
            p.end = start + ID_BATCH;
        }
        let id = p.next;
        p.next += 1;
        Ok(id)
    }

    fn is_open(&self, ino: Ino) -> bool {
        self.opens.is_open(ino)
    }

    fn sid(&self) -> i64 {
        *self.session.lock() as i64
    }

    /// Unlinked to zero links: keep the inode (nlink 0) if open here (recorded in
    /// `sustained` for the cleanup after a crash) or in another client (`open_file`), else
    /// delete it. The last close anywhere deletes a kept one.
    fn release_or_sustain(&self, c: &Connection, a: &Attr, now: Nanos) -> Tx<()> {
        if self.is_open(a.ino) {
            c.prepare_cached("INSERT OR IGNORE INTO sustained (session, ino) VALUES (?1, ?2)")?
                .execute(params![self.sid(), a.ino as i64])?;
            update_node(c, a)
        } else if open_anywhere(c, a.ino)? {
            update_node(c, a)
        } else {
            delete_inode(c, a, now)
        }
    }

    /// Whether other live clients share the volume.
    fn others_alive(&self, c: &Connection) -> Tx<bool> {
        let now = now_nanos();
        let rows: Vec<(String, i64)> = c
            .prepare_cached("SELECT info, heartbeat FROM session WHERE id <> ?1")?
            .query_map([self.sid()], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows.into_iter().any(|(info, hb)| {
            serde_json::from_str::<SessionInfo>(&info).is_ok_and(|i| !session_dead(&i, hb, now))
        }))
    }

    /// Once another client shares the volume, records this client's opens in `open_file`
    /// (those open now, and every first open from now on) so that its unlinks keep them.
    /// Never goes back: the cost is one write per first open and last close.
    fn share_opens(&self) -> Result<()> {
        if self.opens.is_shared() || !self.read(|c| self.others_alive(c))? {
            return Ok(());
        }
        let sid = self.sid();
        let n = self.write(|c| {
            // Under the writer lock: a first open or last close that saw `shared` false has
            // written nothing, and one that sees it true writes its row after this.
            let open = self.opens.share();
            for ino in &open {
                c.prepare_cached("INSERT OR IGNORE INTO open_file (ino, session) VALUES (?1, ?2)")?
                    .execute(params![*ino as i64, sid])?;
            }
            Ok(open.len())
        })?;
        tracing::info!("another client shares the volume: recording opens ({n} open now)");
        Ok(())
    }

    /// Deletes a session and its open records; the unlinked inodes no other client has open
    /// any more are deleted.
    fn release_session(&self, c: &Connection, sid: i64, now: Nanos) -> Tx<()> {
        let inos: Vec<i64> = c
            .prepare(
                "SELECT ino FROM sustained WHERE session=?1
                 UNION SELECT ino FROM open_file WHERE session=?1",
            )?
            .query_map([sid], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        c.execute("DELETE FROM sustained WHERE session=?1", [sid])?;
        c.execute("DELETE FROM open_file WHERE session=?1", [sid])?;
        for ino in inos {
            match get_node(c, ino as u64) {
                Ok(a) if a.nlink == 0 && !open_anywhere(c, a.ino)? => delete_inode(c, &a, now)?,
                _ => {}
            }
        }
        c.execute("DELETE FROM session WHERE id=?1", [sid])?;
        Ok(())
    }

    fn note_fragmented(&self, ino: Ino, index: u32, count: usize) {
        if count >= FRAGMENTED_AT {
            self.fragmented.lock().insert((ino, index), count);
        }
    }

    fn lock_owner(&self, owner: u64) -> lock::LockOwner {
        lock::LockOwner {
            session: *self.session.lock(),
            owner,
        }
    }

    /// Whether a session stopped: its row is gone, or its client is known dead.
    fn session_is_dead(&self, id: u64) -> Result<bool> {
        let row: Option<(String, i64)> = self.read(|c| {
            Ok(
                c.prepare_cached("SELECT info, heartbeat FROM session WHERE id=?1")?
                    .query_row([id as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?,
            )
        })?;
        Ok(match row {
            None => true,
            Some((info, hb)) => row_dead(&info, hb, now_nanos()),
        })
    }

    /// Cleans up after sessions whose process is gone (or that stopped heartbeating): their
    /// open records, and the unlinked inodes only they had open.
    fn clean_dead_sessions(&self) -> Result<usize> {
        let now = now_nanos();
        let sessions: Vec<(i64, String, i64)> = self.read(|c| {
            let mut s = c.prepare("SELECT id, info, heartbeat FROM session")?;
            let rows = s
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })?;
        let mut cleaned = 0;
        for (id, info, hb) in sessions {
            let dead = row_dead(&info, hb, now);
            if !dead || id == self.sid() {
                continue;
            }
            self.write(|c| self.release_session(c, id, now))?;
            tracing::info!("cleaned up after dead session {id}");
            cleaned += 1;
        }
        Ok(cleaned)
    }

    fn parent_dir(c: &Connection, parent: Ino) -> Tx<Attr> {
        let p = get_node(c, parent)?;
        if p.kind != Kind::Dir {
            return fail(libc::ENOTDIR);
        }
        if p.nlink == 0 {
            return fail(libc::ENOENT);
        }
        Ok(p)
    }

    /// EINVAL if `dir` is `ancestor` or lies below it.
    fn check_not_below(c: &Connection, dir: Ino, ancestor: Ino) -> Tx<()> {
        let mut cur = dir;
        for _ in 0..100_000 {
            if cur == ancestor {
                return fail(libc::EINVAL);
            }
            if cur == ROOT_INO {
                return Ok(());
            }
            cur = get_node(c, cur)?.parent;
        }
        Err(TxError::Meta(Error::Engine(
            "directory tree has a cycle".into(),
        )))
    }
}

fn tx_err(e: TxError) -> Error {
    match e {
        TxError::Meta(m) => m,
        TxError::Sql(s) => Error::from(s),
    }
}

impl Meta for SqliteMeta {
    fn format(&self) -> &Format {
        &self.format
    }

    fn engine(&self) -> EngineKind {
        EngineKind::Sqlite
    }

    fn new_session(&self, mut info: SessionInfo) -> Result<u64> {
        self.clean_dead_sessions()?;
        let now = now_nanos();
        info.started = now;
        info.heartbeat = now;
        let id = self.write(|c| {
            c.execute(
                "INSERT INTO session (info, heartbeat) VALUES (?1, ?2)",
                params![serde_json::to_string(&info).unwrap_or_default(), now],
            )?;
            Ok(c.last_insert_rowid() as u64)
        })?;
        *self.session.lock() = id;
        self.share_opens()?;
        Ok(id)
    }

    fn heartbeat(&self) -> Result<()> {
        let sid = *self.session.lock();
        self.write(|c| {
            c.execute(
                "UPDATE session SET heartbeat=?2 WHERE id=?1",
                params![sid as i64, now_nanos()],
            )?;
            Ok(())
        })?;
        self.clean_dead_sessions()?;
        self.share_opens()
    }

    fn watch_sessions(&self) -> Result<()> {
        self.share_opens()
    }

    fn close_session(&self) -> Result<()> {
        let sid = *self.session.lock();
        if sid == 0 {
            return Ok(());
        }
        let now = now_nanos();
        self.write(|c| self.release_session(c, sid as i64, now))?;
        *self.session.lock() = 0;
        self.sync()
    }

    fn sessions(&self) -> Result<Vec<SessionInfo>> {
        self.read(|c| {
            let mut s = c.prepare("SELECT id, info, heartbeat FROM session ORDER BY id")?;
            let rows = s
                .query_map([], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows
                .into_iter()
                .filter_map(|(id, info, hb)| {
                    let mut s: SessionInfo = serde_json::from_str(&info).ok()?;
                    s.id = id as u64;
                    s.heartbeat = hb;
                    Some(s)
                })
                .collect())
        })
    }

    fn usage(&self) -> Result<Usage> {
        self.read(|c| {
            let (slices, slice_bytes): (i64, i64) = c.query_row(
                "SELECT count(*), coalesce(sum(size), 0) FROM slice_ref",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let pending: i64 = c.query_row("SELECT count(*) FROM dead_slice", [], |r| r.get(0))?;
            Ok(Usage {
                used_bytes: get_counter(c, "usedSpace")?.max(0) as u64,
                inodes: get_counter(c, "totalInodes")?.max(0) as u64,
                slice_bytes: slice_bytes as u64,
                slices: slices as u64,
                pending_delete: pending as u64,
            })
        })
    }

    fn lookup(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > MAX_NAME_LEN {
            return sys(libc::ENAMETOOLONG);
        }
        self.read(|c| {
            if name == b"." {
                return get_node(c, parent);
            }
            if name == b".." {
                let p = get_node(c, parent)?;
                return get_node(c, p.parent.max(ROOT_INO));
            }
            let sql = format!(
                "SELECT {NODE_COLS} FROM edge e JOIN node n ON n.ino = e.ino
                 WHERE e.parent=?1 AND e.name=?2"
            );
            let found = c
                .prepare_cached(&sql)?
                .query_row(params![parent as i64, name], |r| row_attr(r, 0))
                .optional()?;
            match found {
                Some(a) => Ok(a),
                None => {
                    let p = get_node(c, parent)?;
                    if p.kind != Kind::Dir {
                        return fail(libc::ENOTDIR);
                    }
                    fail(libc::ENOENT)
                }
            }
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.read(|c| get_node(c, ino))
    }

    fn setattr(&self, _ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.write(|c| {
            let mut a = get_node(c, ino)?;
            let now = now_nanos();
            let mut changed = false;
            if let Some(m) = set.mode {
                a.mode = m & 0o7777;
                changed = true;
            }
            if let Some(u) = set.uid {
                a.uid = u;
                changed = true;
            }
            if let Some(g) = set.gid {
                a.gid = g;
                changed = true;
            }
            if let Some(t) = set.atime {
                a.atime = match t {
                    SetTime::Now => now,
                    SetTime::At(n) => n,
                };
                changed = true;
            }
            if let Some(t) = set.mtime {
                a.mtime = match t {
                    SetTime::Now => now,
                    SetTime::At(n) => n,
                };
                changed = true;
            }
            if changed {
                a.ctime = now;
                update_node(c, &a)?;
            }
            Ok(a)
        })
    }

    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        mode: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        check_name(name)?;
        if let Some(t) = target {
            if t.is_empty() {
                return sys(libc::ENOENT);
            }
            if t.len() > MAX_SYMLINK_LEN {
                return sys(libc::ENAMETOOLONG);
            }
        }
        let ino = self.alloc(&self.inos, "nextInode")?;
        self.write(|c| {
            let mut p = Self::parent_dir(c, parent)?;
            if get_edge(c, parent, name)?.is_some() {
                return fail(libc::EEXIST);
            }
            let now = now_nanos();
            let mut mode = mode & 0o7777;
            let mut gid = ctx.gid;
            if p.mode & libc::S_ISGID != 0 {
                gid = p.gid;
                if kind == Kind::Dir {
                    mode |= libc::S_ISGID;
                } else if mode & (libc::S_ISGID | libc::S_IXGRP) == (libc::S_ISGID | libc::S_IXGRP)
                    && ctx.uid != 0
                    && !ctx.in_group(gid)
                {
                    mode &= !libc::S_ISGID;
                }
            }
            let a = Attr {
                ino,
                kind,
                mode,
                uid: ctx.uid,
                gid,
                nlink: if kind == Kind::Dir { 2 } else { 1 },
                length: target.map_or(0, |t| t.len() as u64),
                rdev,
                atime: now,
                mtime: now,
                ctime: now,
                parent: if kind == Kind::Dir { parent } else { 0 },
            };
            insert_node(c, &a)?;
            c.prepare_cached("INSERT INTO edge (parent, name, ino, kind) VALUES (?1, ?2, ?3, ?4)")?
                .execute(params![parent as i64, name, ino as i64, kind as u8])?;
            if let Some(t) = target {
                c.prepare_cached("INSERT INTO symlink (ino, target) VALUES (?1, ?2)")?
                    .execute(params![ino as i64, t])?;
            }
            p.mtime = now;
            p.ctime = now;
            if kind == Kind::Dir {
                p.nlink += 1;
            }
            update_node(c, &p)?;
            add_counter(c, "totalInodes", 1)?;
            Ok(a)
        })
    }

    fn link(&self, _ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        self.write(|c| {
            let mut a = get_node(c, ino)?;
            if a.kind == Kind::Dir {
                return fail(libc::EPERM);
            }
            if a.nlink == 0 {
                return fail(libc::ENOENT);
            }
            let mut p = Self::parent_dir(c, parent)?;
            if get_edge(c, parent, name)?.is_some() {
                return fail(libc::EEXIST);
            }
            if a.nlink >= u32::MAX - 1 {
                return fail(libc::EMLINK);
            }
            let now = now_nanos();
            c.prepare_cached("INSERT INTO edge (parent, name, ino, kind) VALUES (?1, ?2, ?3, ?4)")?
                .execute(params![parent as i64, name, ino as i64, a.kind as u8])?;
            a.nlink += 1;
            a.ctime = now;
            update_node(c, &a)?;
            p.mtime = now;
            p.ctime = now;
            update_node(c, &p)?;
            Ok(a)
        })
    }

    fn unlink(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > MAX_NAME_LEN {
            return sys(libc::ENAMETOOLONG);
        }
        self.write(|c| {
            let mut p = Self::parent_dir(c, parent)?;
            let Some((eid, ino, _)) = get_edge(c, parent, name)? else {
                return fail(libc::ENOENT);
            };
            let mut a = get_node(c, ino)?;
            if a.kind == Kind::Dir {
                return fail(libc::EISDIR);
            }
            let now = now_nanos();
            c.prepare_cached("DELETE FROM edge WHERE id=?1")?
                .execute([eid])?;
            p.mtime = now;
            p.ctime = now;
            update_node(c, &p)?;
            a.nlink = a.nlink.saturating_sub(1);
            a.ctime = now;
            if a.nlink == 0 {
                self.release_or_sustain(c, &a, now)?;
            } else {
                update_node(c, &a)?;
            }
            Ok(a)
        })
    }

    fn rmdir(&self, _ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        if name.len() > MAX_NAME_LEN {
            return sys(libc::ENAMETOOLONG);
        }
        if name == b"." {
            return sys(libc::EINVAL);
        }
        if name == b".." {
            return sys(libc::ENOTEMPTY);
        }
        self.write(|c| {
            let mut p = Self::parent_dir(c, parent)?;
            let Some((eid, ino, _)) = get_edge(c, parent, name)? else {
                return fail(libc::ENOENT);
            };
            let mut a = get_node(c, ino)?;
            if a.kind != Kind::Dir {
                return fail(libc::ENOTDIR);
            }
            if !dir_is_empty(c, ino)? {
                return fail(libc::ENOTEMPTY);
            }
            let now = now_nanos();
            c.prepare_cached("DELETE FROM edge WHERE id=?1")?
                .execute([eid])?;
            p.nlink = p.nlink.saturating_sub(1);
            p.mtime = now;
            p.ctime = now;
            update_node(c, &p)?;
            a.nlink = 0;
            a.ctime = now;
            self.release_or_sustain(c, &a, now)
        })
    }

    fn rename(
        &self,
        _ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<Option<Attr>> {
        if name.len() > MAX_NAME_LEN {
            return sys(libc::ENAMETOOLONG);
        }
        check_name(new_name)?;
        if flags.exchange && flags.noreplace {
            return sys(libc::EINVAL);
        }
        self.write(|c| {
            let now = now_nanos();
            let mut p1 = Self::parent_dir(c, parent)?;
            let mut p2 = if new_parent == parent {
                p1.clone()
            } else {
                Self::parent_dir(c, new_parent)?
            };
            let Some((src_eid, src_ino, _)) = get_edge(c, parent, name)? else {
                return fail(libc::ENOENT);
            };
            let mut src = get_node(c, src_ino)?;
            let dst_edge = get_edge(c, new_parent, new_name)?;
            let cross = parent != new_parent;

            if flags.exchange {
                let Some((dst_eid, dst_ino, _)) = dst_edge else {
                    return fail(libc::ENOENT);
                };
                if dst_ino == src_ino {
                    return Ok(None);
                }
                let mut dst = get_node(c, dst_ino)?;
                if cross {
                    if src.kind == Kind::Dir {
                        Self::check_not_below(c, new_parent, src.ino)?;
                    }
                    if dst.kind == Kind::Dir {
                        Self::check_not_below(c, parent, dst.ino)?;
                    }
                }
                let set = "UPDATE edge SET ino=?2, kind=?3 WHERE id=?1";
                c.prepare_cached(set)?
                    .execute(params![src_eid, dst.ino as i64, dst.kind as u8])?;
                c.prepare_cached(set)?
                    .execute(params![dst_eid, src.ino as i64, src.kind as u8])?;
                if cross {
                    if src.kind == Kind::Dir {
                        src.parent = new_parent;
                        p1.nlink -= 1;
                        p2.nlink += 1;
                    }
                    if dst.kind == Kind::Dir {
                        dst.parent = parent;
                        p2.nlink -= 1;
                        p1.nlink += 1;
                    }
                }
                src.ctime = now;
                dst.ctime = now;
                update_node(c, &src)?;
                update_node(c, &dst)?;
                p1.mtime = now;
                p1.ctime = now;
                update_node(c, &p1)?;
                if cross {
                    p2.mtime = now;
                    p2.ctime = now;
                    update_node(c, &p2)?;
                }
                return Ok(None);
            }

            let mut replaced = None;
            if let Some((dst_eid, dst_ino, _)) = dst_edge {
                if flags.noreplace {
                    return fail(libc::EEXIST);
                }
                if dst_ino == src_ino {
                    return Ok(None);
                }
                let dst = get_node(c, dst_ino)?;
                if src.kind == Kind::Dir {
                    if dst.kind != Kind::Dir {
                        return fail(libc::ENOTDIR);
                    }
                    if !dir_is_empty(c, dst.ino)? {
                        return fail(libc::ENOTEMPTY);
                    }
                } else if dst.kind == Kind::Dir {
                    return fail(libc::EISDIR);
                }
                replaced = Some((dst_eid, dst));
            }
            if src.kind == Kind::Dir && cross {
                Self::check_not_below(c, new_parent, src.ino)?;
            }
            let mut victim = None;
            if let Some((dst_eid, mut dst)) = replaced {
                c.prepare_cached("DELETE FROM edge WHERE id=?1")?
                    .execute([dst_eid])?;
                dst.ctime = now;
                if dst.kind == Kind::Dir {
                    dst.nlink = 0;
                    p2.nlink -= 1;
                } else {
                    dst.nlink = dst.nlink.saturating_sub(1);
                }
                if dst.nlink == 0 {
                    self.release_or_sustain(c, &dst, now)?;
                } else {
                    update_node(c, &dst)?;
                }
                victim = Some(dst);
            }
            c.prepare_cached("UPDATE edge SET parent=?2, name=?3 WHERE id=?1")?
                .execute(params![src_eid, new_parent as i64, new_name])?;
            if src.kind == Kind::Dir && cross {
                src.parent = new_parent;
                p1.nlink -= 1;
                p2.nlink += 1;
            }
            src.ctime = now;
            update_node(c, &src)?;
            if cross {
                p1.mtime = now;
                p1.ctime = now;
                update_node(c, &p1)?;
                p2.mtime = now;
                p2.ctime = now;
                update_node(c, &p2)?;
            } else {
                // Same directory: p2 carries the nlink changes of a replaced directory.
                p2.mtime = now;
                p2.ctime = now;
                update_node(c, &p2)?;
            }
            Ok(victim)
        })
    }

    fn readdir(&self, ino: Ino, cookie: u64, limit: usize, plus: bool) -> Result<Vec<DirEntry>> {
        self.read(|c| {
            let dir = get_node(c, ino)?;
            if dir.kind != Kind::Dir {
                return fail(libc::ENOTDIR);
            }
            let mut out = Vec::new();
            if cookie < 1 && out.len() < limit {
                out.push(DirEntry {
                    name: b".".to_vec(),
                    ino,
                    kind: Kind::Dir,
                    cookie: 1,
                    attr: plus.then(|| dir.clone()),
                });
            }
            if cookie < 2 && out.len() < limit {
                let pino = dir.parent.max(ROOT_INO);
                let pattr = if plus { Some(get_node(c, pino)?) } else { None };
                out.push(DirEntry {
                    name: b"..".to_vec(),
                    ino: pino,
                    kind: Kind::Dir,
                    cookie: 2,
                    attr: pattr,
                });
            }
            let want = limit.saturating_sub(out.len()) as i64;
            if want == 0 {
                return Ok(out);
            }
            let after = cookie.saturating_sub(2) as i64;
            if plus {
                let sql = format!(
                    "SELECT e.id, e.name, {NODE_COLS} FROM edge e JOIN node n ON n.ino = e.ino
                     WHERE e.parent=?1 AND e.id>?2 ORDER BY e.id LIMIT ?3"
                );
                let mut s = c.prepare_cached(&sql)?;
                let rows = s.query_map(params![ino as i64, after, want], |r| {
                    let id: i64 = r.get(0)?;
                    let name = bytes_at(r, 1)?;
                    let a = row_attr(r, 2)?;
                    Ok(DirEntry { name, ino: a.ino, kind: a.kind, cookie: id as u64 + 2, attr: Some(a) })
                })?;
                for e in rows {
                    out.push(e?);
                }
            } else {
                let mut s = c.prepare_cached(
                    "SELECT id, name, ino, kind FROM edge WHERE parent=?1 AND id>?2 ORDER BY id LIMIT ?3",
                )?;
                let rows = s.query_map(params![ino as i64, after, want], |r| {
                    let id: i64 = r.get(0)?;
                    Ok(DirEntry {
                        name: bytes_at(r, 1)?,
                        ino: r.get::<_, i64>(2)? as u64,
                        kind: Kind::from_u8(r.get(3)?).unwrap_or(Kind::File),
                        cookie: id as u64 + 2,
                        attr: None,
                    })
                })?;
                for e in rows {
                    out.push(e?);
                }
            }
            Ok(out)
        })
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.read(|c| {
            let t: Option<Vec<u8>> = c
                .prepare_cached("SELECT target FROM symlink WHERE ino=?1")?
                .query_row([ino as i64], |r| r.get(0))
                .optional()?;
            match t {
                Some(t) => Ok(t),
                None => {
                    get_node(c, ino)?;
                    fail(libc::EINVAL)
                }
            }
        })
    }

    fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<LockRange>> {
        let me = self.lock_owner(owner);
        let held = self.read(|c| load_locks(c, ino))?;
        Ok(lock::conflict(&held, me, kind, start, end).map(|(_, r)| r))
    }

    fn setlk(&self, ino: Ino, owner: u64, req: LockRequest) -> Result<Option<LockRange>> {
        let me = self.lock_owner(owner);
        lock::settle(
            || {
                self.write(|c| {
                    // Locks of sessions that ended are void.
                    c.prepare_cached(
                    "DELETE FROM plock WHERE ino=?1 AND session NOT IN (SELECT id FROM session)",
                )?
                .execute([ino as i64])?;
                    let held = load_locks(c, ino)?;
                    let d = lock::decide(&held, me, req);
                    if let lock::Decision::Store(ranges) = &d {
                        c.prepare_cached(
                            "DELETE FROM plock WHERE ino=?1 AND session=?2 AND owner=?3",
                        )?
                        .execute(params![
                            ino as i64,
                            me.session as i64,
                            me.owner as i64
                        ])?;
                        let mut ins = c.prepare_cached(
                            "INSERT INTO plock (ino, session, owner, kind, start, last, pid) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                        )?;
                        for r in ranges {
                            ins.execute(params![
                                ino as i64,
                                me.session as i64,
                                me.owner as i64,
                                r.kind.code(),
                                r.start as i64,
                                r.end as i64,
                                r.pid as i64
                            ])?;
                        }
                    }
                    Ok(d)
                })
            },
            |s| self.session_is_dead(s),
            || self.clean_dead_sessions(),
        )
    }

    fn open(&self, ino: Ino) -> Result<Attr> {
        let t = self.opens.transition(ino);
        // Counted before the lookup: an unlink or a rename over the name committing after the
        // lookup then sees the open and keeps the inode (counting after the lookup left a
        // window in which the inode was deleted under a successful open).
        let (first, shared) = self.opens.add(ino);
        if !(first && shared) {
            drop(t);
            // Counting first is not enough: a write transaction in flight (an unlink, a rename
            // over the name) may have found the inode not open just before the count and be
            // about to commit its deletion, which a reader would not see yet. Wait for the
            // writer: once it is free, that transaction has committed (the lookup below then
            // fails) or it saw the count (and kept the inode).
            drop(self.writer.lock());
            return self.getattr(ino).inspect_err(|_| {
                let _ = self.close(ino);
            });
        }
        // Another client shares the volume: the first open here is recorded for its unlinks
        // to see (writes are serialized: an unlink either came first, or sees the row).
        let sid = self.sid();
        self.write(|c| {
            let a = get_node(c, ino)?;
            c.prepare_cached("INSERT OR IGNORE INTO open_file (ino, session) VALUES (?1, ?2)")?
                .execute(params![ino as i64, sid])?;
            Ok(a)
        })
        .inspect_err(|_| {
            self.opens.remove(ino);
        })
    }

    fn close(&self, ino: Ino) -> Result<()> {
        let _t = self.opens.transition(ino);
        let (last, shared) = self.opens.remove(ino);
        if !last {
            return Ok(());
        }
        let sid = self.sid();
        self.write(|c| {
            if shared {
                c.prepare_cached("DELETE FROM open_file WHERE ino=?1 AND session=?2")?
                    .execute(params![ino as i64, sid])?;
            }
            let a = match get_node(c, ino) {
                Ok(a) => a,
                Err(TxError::Meta(Error::Sys(libc::ENOENT))) => return Ok(()),
                Err(e) => return Err(e),
            };
            if a.nlink == 0 {
                c.prepare_cached("DELETE FROM sustained WHERE session=?1 AND ino=?2")?
                    .execute(params![sid, ino as i64])?;
                // The last close anywhere deletes it.
                if !open_anywhere(c, ino)? {
                    delete_inode(c, &a, now_nanos())?;
                }
            }
            Ok(())
        })
    }

    fn truncate(&self, _ctx: &Ctx, ino: Ino, length: u64) -> Result<Attr> {
        if length > MAX_FILE_SIZE {
            return sys(libc::EFBIG);
        }
        self.write(|c| {
            let mut a = get_node(c, ino)?;
            match a.kind {
                Kind::File => {}
                Kind::Dir => return fail(libc::EISDIR),
                _ => return fail(libc::EINVAL),
            }
            let now = now_nanos();
            if length < a.length {
                drop_chunks(c, ino, length.div_ceil(CHUNK_SIZE), now)?;
                let pos = length % CHUNK_SIZE;
                if pos != 0 {
                    let index = (length / CHUNK_SIZE) as u32;
                    let recs = read_recs(c, ino, index)?;
                    if recs.iter().any(|r| r.end() > pos) {
                        let z = SliceRec::zero(pos as u32, (CHUNK_SIZE - pos) as u32);
                        let n = append_recs(c, ino, index, &[z])?;
                        self.note_fragmented(ino, index, n);
                    }
                }
            }
            add_counter(c, "usedSpace", align4k(length) - align4k(a.length))?;
            a.length = length;
            a.mtime = now;
            a.ctime = now;
            update_node(c, &a)?;
            Ok(a)
        })
    }

    fn fallocate(
        &self,
        _ctx: &Ctx,
        ino: Ino,
        mode: FallocMode,
        off: u64,
        len: u64,
    ) -> Result<Attr> {
        let end = off.checked_add(len).filter(|e| *e <= MAX_FILE_SIZE);
        let Some(end) = end else {
            return sys(libc::EFBIG);
        };
        if len == 0 {
            return sys(libc::EINVAL);
        }
        self.write(|c| {
            let mut a = get_node(c, ino)?;
            match a.kind {
                Kind::File => {}
                Kind::Dir => return fail(libc::EISDIR),
                _ => return fail(libc::ENODEV),
            }
            let now = now_nanos();
            let zero_end = if mode.punch_hole || mode.keep_size {
                end.min(a.length)
            } else {
                end
            };
            if (mode.punch_hole || mode.zero_range) && off < zero_end {
                let mut by_chunk: Vec<(u32, Vec<SliceRec>)> = Vec::new();
                for (index, r) in zero_recs(off, zero_end) {
                    by_chunk.push((index, vec![r]));
                }
                for (index, recs) in by_chunk {
                    let n = append_recs(c, ino, index, &recs)?;
                    self.note_fragmented(ino, index, n);
                }
            }
            let old = a.length;
            if !mode.keep_size && !mode.punch_hole && end > a.length {
                a.length = end;
            }
            add_counter(c, "usedSpace", align4k(a.length) - align4k(old))?;
            if a.length != old || mode.punch_hole || mode.zero_range {
                a.mtime = now;
                a.ctime = now;
            }
            update_node(c, &a)?;
            Ok(a)
        })
    }

    fn read_chunk(&self, ino: Ino, index: u32) -> Result<Vec<SliceRec>> {
        self.read(|c| read_recs(c, ino, index))
    }

    fn new_slice_id(&self) -> Result<u64> {
        self.alloc(&self.slices, "nextSlice")
    }

    fn write_slices(&self, ino: Ino, slices: &[(u32, SliceRec)], mtime: Nanos) -> Result<Attr> {
        self.write(|c| {
            let mut a = get_node(c, ino)?;
            if a.kind != Kind::File {
                return fail(libc::EBADF);
            }
            let old = a.length;
            let mut i = 0;
            while i < slices.len() {
                let index = slices[i].0;
                let mut j = i;
                while j < slices.len() && slices[j].0 == index {
                    j += 1;
                }
                let recs: Vec<SliceRec> = slices[i..j].iter().map(|(_, r)| *r).collect();
                for r in &recs {
                    incref(c, r)?;
                    a.length = a.length.max(index as u64 * CHUNK_SIZE + r.end());
                }
                let n = append_recs(c, ino, index, &recs)?;
                self.note_fragmented(ino, index, n);
                i = j;
            }
            add_counter(c, "usedSpace", align4k(a.length) - align4k(old))?;
            a.mtime = mtime;
            a.ctime = mtime;
            update_node(c, &a)?;
            Ok(a)
        })
    }

    fn copy_range(
        &self,
        _ctx: &Ctx,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
    ) -> Result<(u64, Attr)> {
        self.write(|c| {
            let s = get_node(c, src)?;
            let mut d = get_node(c, dst)?;
            if s.kind == Kind::Dir || d.kind == Kind::Dir {
                return fail(libc::EISDIR);
            }
            if s.kind != Kind::File || d.kind != Kind::File {
                return fail(libc::EINVAL);
            }
            if src_off >= s.length || len == 0 {
                return Ok((0, d));
            }
            let len = len.min(s.length - src_off);
            if dst_off.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE) {
                return fail(libc::EFBIG);
            }
            if src == dst && src_off < dst_off + len && dst_off < src_off + len {
                return fail(libc::EINVAL);
            }
            // Destination records, computed from the source as it is before the copy.
            let out = plan_copy(src_off, dst_off, len, |index| read_recs(c, src, index))?;
            for (index, recs) in by_chunk(&out) {
                for r in &recs {
                    incref(c, r)?;
                }
                let n = append_recs(c, dst, index, &recs)?;
                self.note_fragmented(dst, index, n);
            }
            let now = now_nanos();
            let old = d.length;
            d.length = d.length.max(dst_off + len);
            add_counter(c, "usedSpace", align4k(d.length) - align4k(old))?;
            d.mtime = now;
            d.ctime = now;
            update_node(c, &d)?;
            Ok((len, d))
        })
    }

    fn replace_slices(
        &self,
        ino: Ino,
        index: u32,
        old: &[SliceRec],
        new: &[SliceRec],
    ) -> Result<bool> {
        self.write(|c| {
            let cur = read_recs(c, ino, index)?;
            if cur.len() < old.len() || cur[..old.len()] != *old {
                return Ok(false);
            }
            let now = now_nanos();
            let mut list = new.to_vec();
            list.extend_from_slice(&cur[old.len()..]);
            for r in new {
                incref(c, r)?;
            }
            for r in old {
                decref(c, r, now)?;
            }
            if list.is_empty() {
                c.prepare_cached("DELETE FROM chunk WHERE ino=?1 AND indx=?2")?
                    .execute(params![ino as i64, index])?;
            } else {
                c.prepare_cached("UPDATE chunk SET slices=?3 WHERE ino=?1 AND indx=?2")?
                    .execute(params![ino as i64, index, slice::encode(&list)])?;
            }
            Ok(true)
        })
    }

    fn fragmented_chunks(&self, min_records: usize, limit: usize) -> Result<Vec<(Ino, u32)>> {
        let mut f = self.fragmented.lock();
        let picked: Vec<(Ino, u32)> = f
            .iter()
            .filter(|(_, n)| **n >= min_records)
            .map(|(k, _)| *k)
            .take(limit)
            .collect();
        for k in &picked {
            f.remove(k);
        }
        Ok(picked)
    }

    fn set_xattr(
        &self,
        _ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        if name.is_empty() {
            return sys(libc::EINVAL);
        }
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        if value.len() > MAX_XATTR_VALUE {
            return sys(libc::E2BIG);
        }
        self.write(|c| {
            let mut a = get_node(c, ino)?;
            let exists = c
                .prepare_cached("SELECT 1 FROM xattr WHERE ino=?1 AND name=?2")?
                .query_row(params![ino as i64, name], |_| Ok(()))
                .optional()?
                .is_some();
            match how {
                XattrSet::Create if exists => return fail(libc::EEXIST),
                XattrSet::Replace if !exists => return fail(libc::ENODATA),
                _ => {}
            }
            c.prepare_cached(
                "INSERT OR REPLACE INTO xattr (ino, name, value) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![ino as i64, name, value])?;
            a.ctime = now_nanos();
            update_node(c, &a)?;
            Ok(())
        })
    }

    fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        self.read(|c| {
            let v: Option<Vec<u8>> = c
                .prepare_cached("SELECT value FROM xattr WHERE ino=?1 AND name=?2")?
                .query_row(params![ino as i64, name], |r| r.get(0))
                .optional()?;
            match v {
                Some(v) => Ok(v),
                None => {
                    get_node(c, ino)?;
                    fail(libc::ENODATA)
                }
            }
        })
    }

    fn list_xattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.read(|c| {
            get_node(c, ino)?;
            let names = c
                .prepare_cached("SELECT name FROM xattr WHERE ino=?1 ORDER BY name")?
                .query_map([ino as i64], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<Vec<u8>>>>()?;
            Ok(names)
        })
    }

    fn remove_xattr(&self, _ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        if name.len() > MAX_XATTR_NAME {
            return sys(libc::ERANGE);
        }
        self.write(|c| {
            let mut a = get_node(c, ino)?;
            let n = c
                .prepare_cached("DELETE FROM xattr WHERE ino=?1 AND name=?2")?
                .execute(params![ino as i64, name])?;
            if n == 0 {
                return fail(libc::ENODATA);
            }
            a.ctime = now_nanos();
            update_node(c, &a)?;
            Ok(())
        })
    }

    /// Fsyncs the WAL, without holding up writers, and once for every caller waiting: a
    /// ticket is taken after the caller's commits; an fsync that starts after a ticket was
    /// taken covers it (the WAL only grows, or restarts after a checkpoint, which fsyncs what
    /// it copies). Concurrent `fsync(2)` calls of many files so share one disk flush.
    fn sync(&self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
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

    fn dead_slices(&self, limit: usize) -> Result<Vec<DeadSlice>> {
        let cutoff = now_nanos() - self.format.trash_days as i64 * 86_400 * 1_000_000_000;
        self.read(|c| {
            let rows = c
                .prepare_cached(
                    "SELECT id, size FROM dead_slice WHERE died <= ?1 ORDER BY id LIMIT ?2",
                )?
                .query_map(params![cutoff, limit as i64], |r| {
                    Ok(DeadSlice {
                        id: r.get::<_, i64>(0)? as u64,
                        size: r.get(1)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    fn forget_dead_slices(&self, ids: &[u64]) -> Result<()> {
        self.write(|c| {
            let mut s = c.prepare_cached("DELETE FROM dead_slice WHERE id=?1")?;
            for id in ids {
                s.execute([*id as i64])?;
            }
            Ok(())
        })
    }

    fn scan_nodes(&self, f: &mut dyn FnMut(&Attr)) -> Result<()> {
        self.read(|c| {
            let sql = format!("SELECT {NODE_COLS} FROM node n ORDER BY n.ino");
            let mut s = c.prepare(&sql)?;
            let mut rows = s.query([])?;
            while let Some(r) = rows.next()? {
                f(&row_attr(r, 0)?);
            }
            Ok(())
        })
    }

    fn scan_entries(&self, f: &mut dyn FnMut(Ino, &[u8], Ino, Option<Kind>)) -> Result<()> {
        self.read(|c| {
            let mut s =
                c.prepare("SELECT parent, name, ino, kind FROM edge ORDER BY parent, id")?;
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
        })
    }

    fn scan_chunks(&self, f: &mut dyn FnMut(Ino, u32, Option<Vec<SliceRec>>)) -> Result<()> {
        self.read(|c| {
            let mut s = c.prepare("SELECT ino, indx, slices FROM chunk ORDER BY ino, indx")?;
            let mut rows = s.query([])?;
            while let Some(r) = rows.next()? {
                let blob: Vec<u8> = match r.get_ref(2)? {
                    rusqlite::types::ValueRef::Blob(b) => b.to_vec(),
                    rusqlite::types::ValueRef::Text(t) => t.to_vec(),
                    _ => Vec::new(),
                };
                f(r.get::<_, i64>(0)? as u64, r.get(1)?, slice::decode(&blob));
            }
            Ok(())
        })
    }

    fn all_dead_slices(&self) -> Result<Vec<DeadSlice>> {
        self.read(|c| {
            let rows = c
                .prepare("SELECT id, size FROM dead_slice ORDER BY id")?
                .query_map([], |r| {
                    Ok(DeadSlice {
                        id: r.get::<_, i64>(0)? as u64,
                        size: r.get(1)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    fn sustained(&self) -> Result<Vec<(u64, Ino)>> {
        self.read(|c| {
            let rows = c
                .prepare(
                    "SELECT session, ino FROM sustained
                     UNION SELECT session, ino FROM open_file ORDER BY 1, 2",
                )?
                .query_map([], |r| {
                    Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    fn repair(&self, fix: &Fix) -> Result<()> {
        let now = now_nanos();
        self.write(|c| {
            match fix {
                Fix::RemoveEntry { parent, name } => {
                    c.execute(
                        "DELETE FROM edge WHERE parent=?1 AND CAST(name AS BLOB)=?2",
                        params![*parent as i64, name],
                    )?;
                }
                Fix::SetEntryKind { parent, name, kind } => {
                    c.execute(
                        "UPDATE edge SET kind=?3 WHERE parent=?1 AND name=?2",
                        params![*parent as i64, name, *kind as u8],
                    )?;
                }
                Fix::SetNlink { ino, nlink } => {
                    c.execute(
                        "UPDATE node SET nlink=?2 WHERE ino=?1",
                        params![*ino as i64, nlink],
                    )?;
                }
                Fix::SetParent { ino, parent } => {
                    c.execute(
                        "UPDATE node SET parent=?2 WHERE ino=?1",
                        params![*ino as i64, *parent as i64],
                    )?;
                }
                Fix::DeleteInode { ino } => {
                    let a = get_node(c, *ino)?;
                    delete_inode(c, &a, now)?;
                    c.execute("DELETE FROM sustained WHERE ino=?1", [*ino as i64])?;
                    c.execute("DELETE FROM open_file WHERE ino=?1", [*ino as i64])?;
                }
                Fix::Link {
                    ino,
                    parent,
                    name,
                    kind,
                } => {
                    c.execute(
                        "INSERT INTO edge (parent, name, ino, kind) VALUES (?1, ?2, ?3, ?4)",
                        params![*parent as i64, name, *ino as i64, *kind as u8],
                    )?;
                }
                Fix::DropChunk { ino, index } => {
                    let recs = read_recs(c, *ino, *index).unwrap_or_default();
                    for r in &recs {
                        decref(c, r, now)?;
                    }
                    c.execute(
                        "DELETE FROM chunk WHERE ino=?1 AND indx=?2",
                        params![*ino as i64, index],
                    )?;
                }
                Fix::SetSliceRefs { id, size, refs } => {
                    if *refs == 0 {
                        c.execute("DELETE FROM slice_ref WHERE id=?1", [*id as i64])?;
                        c.execute(
                            "INSERT OR IGNORE INTO dead_slice (id, size, died) VALUES (?1, ?2, ?3)",
                            params![*id as i64, size, now],
                        )?;
                    } else {
                        c.execute(
                            "INSERT INTO slice_ref (id, size, refs) VALUES (?1, ?2, ?3)
                             ON CONFLICT (id) DO UPDATE SET refs=excluded.refs, size=excluded.size",
                            params![*id as i64, size, refs],
                        )?;
                    }
                }
                Fix::UndeadSlice { id } => {
                    c.execute("DELETE FROM dead_slice WHERE id=?1", [*id as i64])?;
                }
                Fix::RemoveSustained { session, ino } => {
                    c.execute(
                        "DELETE FROM sustained WHERE session=?1 AND ino=?2",
                        params![*session as i64, *ino as i64],
                    )?;
                    c.execute(
                        "DELETE FROM open_file WHERE session=?1 AND ino=?2",
                        params![*session as i64, *ino as i64],
                    )?;
                }
                Fix::SetUsage { used_bytes, inodes } => {
                    c.execute(
                        "UPDATE counter SET value=?1 WHERE name='usedSpace'",
                        [*used_bytes as i64],
                    )?;
                    c.execute(
                        "UPDATE counter SET value=?1 WHERE name='totalInodes'",
                        [*inodes as i64],
                    )?;
                }
            }
            Ok(())
        })
    }

    fn all_slices(&self) -> Result<Vec<(u64, u32, u32)>> {
        self.read(|c| {
            let rows = c
                .prepare("SELECT id, size, refs FROM slice_ref ORDER BY id")?
                .query_map([], |r| {
                    Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }
}
