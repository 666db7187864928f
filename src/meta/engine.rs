//! What a metadata engine provides, so that every [`Meta`](super::Meta) operation is written
//! once (in `ops`) over any database: transactions ([`Engine`]) and the rows they read and
//! write ([`Txn`]: nodes, entries, chunks' slice records, slice references, xattrs, sessions,
//! open-file records, locks, counters), each row operation written once in SQL (as JuiceFS's
//! `sql.go` is for its SQL databases).
//!
//! An engine provides statements ([`Txn::exec`], [`Txn::scan`]) and overrides a row
//! operation where it can do the same in fewer round trips (PostgreSQL's combined statements
//! and row locks) or must say it in its own dialect. Every method runs inside the transaction
//! it is called on, and none decides anything POSIX: what an operation means lives in `ops`.
//!
//! Not for: connections, dialect translation, change notification (each engine), caching,
//! file data.

use super::lock::{LockOwner, LockRange};
use super::slice;
use super::slice::SliceRec;
use super::{
    Attr, Change, ChangeSink, DeadSlice, DirEntry, EngineKind, Error, Ino, Kind, LockKind, Nanos,
    Quota, Summary,
};
use super::{EntryVisitor, Result, Usage};

/// How a statement or a transaction failed: a POSIX outcome or an engine failure (ended), or
/// a conflict with another transaction (`Conflict`: the engine runs it again).
#[derive(Debug)]
pub enum TxError {
    Meta(Error),
    Conflict(String),
}

impl From<Error> for TxError {
    fn from(e: Error) -> Self {
        TxError::Meta(e)
    }
}

impl TxError {
    /// The error a caller sees (a conflict that escaped its retries is an engine failure).
    pub(crate) fn into_meta(self) -> Error {
        match self {
            TxError::Meta(m) => m,
            TxError::Conflict(why) => Error::Engine(why),
        }
    }

    /// Whether this is a POSIX outcome (not a failure of the engine).
    pub(crate) fn is_posix(&self) -> bool {
        matches!(self, TxError::Meta(Error::Sys(_)))
    }

    /// Whether this is the POSIX outcome `errno`.
    pub(crate) fn is_sys(&self, errno: i32) -> bool {
        matches!(self, TxError::Meta(Error::Sys(e)) if *e == errno)
    }
}

/// The result of a statement inside a transaction.
pub type TxResult<T> = std::result::Result<T, TxError>;

/// A POSIX outcome, inside a transaction.
pub(crate) fn fail<T>(errno: i32) -> TxResult<T> {
    Err(TxError::Meta(Error::Sys(errno)))
}

/// Damaged metadata, inside a transaction.
pub(crate) fn corrupt(what: String) -> TxError {
    TxError::Meta(Error::Engine(what))
}

/// `Ok(None)` for ENOENT: for rows that may be gone by the time they are looked at.
pub(crate) fn unless_gone<T>(r: TxResult<T>) -> TxResult<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_sys(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What an engine's transactions did since it opened, for the mount's metrics
/// ([`Meta::figures`](super::Meta::figures)): each transaction's time by kind (a write's
/// retries included), the conflicts that made one run again, and the round trips to a
/// database server (none for an embedded engine). Atomics only.
#[derive(Debug)]
pub struct TxStats {
    /// By [`TxKind`]: `Write` (write transactions and lone statements), `Read`.
    latency: [crate::metrics::Histogram; 2],
    retries: std::sync::atomic::AtomicU64,
    /// Waits for one of the client's own connections because the server had no slot left.
    conn_waits: std::sync::atomic::AtomicU64,
    /// Message exchanges with the server: [0] for operations (statements, BEGIN, COMMIT, a
    /// pipelined batch: each one), [1] for change notifications (sent behind, in batches).
    round_trips: [std::sync::atomic::AtomicU64; 2],
}

/// The kind of a transaction, as [`TxStats`] counts it.
#[derive(Clone, Copy, Debug)]
pub enum TxKind {
    Write,
    Read,
}

impl Default for TxStats {
    fn default() -> Self {
        let h = |kind| {
            crate::metrics::latency(
                "unkai_meta_transaction_duration_seconds",
                "Metadata transactions by kind (write, read), and their time, retries included.",
                ("kind", kind),
            )
        };
        TxStats {
            latency: [h("write"), h("read")],
            retries: Default::default(),
            conn_waits: Default::default(),
            round_trips: Default::default(),
        }
    }
}

/// A transaction being timed: recorded when dropped, unless [`Timed::cancel`]ed.
pub struct Timed<'a> {
    stats: Option<&'a TxStats>,
    kind: TxKind,
    start: std::time::Instant,
}

impl Timed<'_> {
    /// Records nothing (the transaction is handed to another method, which times it).
    pub fn cancel(mut self) {
        self.stats = None;
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.stats {
            s.latency[self.kind as usize].observe(self.start.elapsed().as_secs_f64());
        }
    }
}

impl TxStats {
    /// Times a transaction of `kind` until the result is dropped.
    pub fn begin(&self, kind: TxKind) -> Timed<'_> {
        Timed {
            stats: Some(self),
            kind,
            start: std::time::Instant::now(),
        }
    }

    /// Counts a transaction run again after a conflict (SQLite busy, PostgreSQL
    /// serialization failure or deadlock).
    pub fn retried(&self) {
        self.retries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts a wait for one of the client's own connections, the server having refused
    /// another (too many connections).
    pub fn conn_waited(&self) {
        self.conn_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one message exchange with the database server made for an operation (and
    /// tallies it for the thread's request: `metrics::round_trips`).
    pub fn round_trip(&self) {
        self.round_trips[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::metrics::round_trips(1);
    }

    /// Counts one exchange made to tell other clients of changes (behind the operations).
    pub fn notify_round_trip(&self) {
        self.round_trips[1].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Round trips made for operations so far.
    pub fn round_trips(&self) -> u64 {
        self.round_trips[0].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Transactions of `kind` so far.
    pub fn count(&self, kind: TxKind) -> u64 {
        self.latency[kind as usize].get_sample_count()
    }

    /// The figures as the mount's metrics.
    pub fn figures(&self, out: &mut crate::metrics::Families) {
        out.histograms(&self.latency);
        out.counter(
            "unkai_meta_retries_total",
            "Metadata transactions run again after a conflict with another transaction.",
            &[],
            self.retries.load(std::sync::atomic::Ordering::Relaxed),
        );
        out.counter(
            "unkai_meta_connection_waits_total",
            "Waits for one of the client's own database connections because the server had no \
             connection slot left for another (max_connections). None for an embedded engine.",
            &[],
            self.conn_waits.load(std::sync::atomic::Ordering::Relaxed),
        );
        for (i, what) in ["operations", "notifications"].into_iter().enumerate() {
            out.counter(
                "unkai_meta_round_trips_total",
                "Message exchanges with the metadata database server (a statement, BEGIN, \
                 COMMIT, a pipelined batch: one each), for operations or to tell other clients \
                 of changes. None for an embedded engine.",
                &[("for", what)],
                self.round_trips[i].load(std::sync::atomic::Ordering::Relaxed),
            );
        }
    }
}

/// A session as stored: (id, its `SessionInfo` as JSON, last heartbeat).
pub type SessionRow = (u64, String, Nanos);

/// Transactions of one engine.
pub trait Engine: Send + Sync + 'static {
    /// Whether every open is recorded in the volume from the start (PostgreSQL). If not
    /// (SQLite), a client counts its opens in memory, keeps an unlinked inode it has open
    /// itself (a `sustained` row), and records opens only once another client shares the
    /// volume.
    const RECORDS_OPENS: bool;

    fn kind(&self) -> EngineKind;

    /// What its transactions did (the mount's metrics).
    fn stats(&self) -> &TxStats;

    /// Runs `f` in one write transaction, again from the start after a conflict. `lock`: the
    /// inodes `f` will lock (an engine with row locks may lock them in its first round trip);
    /// `rename_lock`: the volume's lock on moves between directories.
    fn write<T>(
        &self,
        lock: &[Ino],
        rename_lock: bool,
        f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T>;

    /// Runs `f`, which makes one statement that is atomic on its own (it may write): outside
    /// an explicit transaction where the engine allows that, else in a write transaction.
    fn single<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T>;

    /// As [`Engine::write`], for a change that need not be committed before its reply
    /// (namespace and attributes): an engine may group it with others into one commit, made
    /// before any operation that promises more returns ([`Engine::write`], [`Engine::sync`],
    /// [`Engine::commit_group`]). Reads of this process see it at once.
    fn write_grouped<T>(
        &self,
        lock: &[Ino],
        rename_lock: bool,
        f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T> {
        self.write(lock, rename_lock, f)
    }

    /// As [`Engine::write_grouped`] locking `parent`, for a change that makes an entry in the
    /// directory `parent`: an engine may read the directory's other entries with its lock.
    /// `contained`: `f` locks and changes no row but the directory's, its new entry's and
    /// the new inode's (no quota or inode limit to charge), so an engine may run it inside
    /// a transaction that holds the directory, where it cannot wait for another's lock.
    fn write_in_dir<T>(
        &self,
        parent: Ino,
        contained: bool,
        f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T> {
        let _ = contained;
        self.write_grouped(&[parent], false, f)
    }

    /// As [`Engine::write_grouped`], for a change of the entry `hints.entry` names (its inode
    /// locked with [`Txn::lock_entry`], and if `hints.dir` its emptiness read with
    /// [`Txn::dir_is_empty`]) that may look up `hints.edges` ([`Txn::get_edge`]): an engine may
    /// read all of it with its locks, in its first round trip.
    fn write_entry<T>(
        &self,
        lock: &[Ino],
        hints: &EntryHints<'_>,
        f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T> {
        let _ = hints;
        self.write_grouped(lock, false, f)
    }

    /// As [`Engine::write_grouped`], for `f` that makes one statement, atomic on its own: an
    /// engine may run it outside an explicit transaction, in one round trip (PostgreSQL).
    fn single_grouped<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T> {
        self.write_grouped(&[], false, f)
    }

    /// Lets [`Engine::write_grouped`] group changes (only while this client has the volume
    /// to itself), or stops it.
    fn group_writes(&self, on: bool) {
        let _ = on;
    }

    /// Whether changes are being grouped now: on as [`Engine::group_writes`] said, until the
    /// engine sees another process write or a group fail to commit.
    fn grouping(&self) -> bool {
        false
    }

    /// Whether another process wrote since this client was last found alone (SQLite: the
    /// database's `data_version` moved), and if so whether `company` (run in a read
    /// transaction that sees that write) finds another client there: `None`, nobody wrote;
    /// `Some(true)`, another client (grouping stops at once, as at a write); `Some(false)`,
    /// a process without a session (`unkai quota set`, `config`, `fsck --repair`), whose
    /// change of unknown extent the caller's caches must forget (grouping goes on from it).
    /// `None` where the engine cannot tell.
    fn others_wrote(
        &self,
        company: &mut dyn FnMut(&mut dyn Txn) -> TxResult<bool>,
    ) -> Option<bool> {
        let _ = company;
        None
    }

    /// Commits the changes grouped so far (before deciding from committed state what to
    /// delete from the bucket).
    fn commit_group(&self) -> Result<()> {
        Ok(())
    }

    /// Commits the group of changes if it made inode `ino` (see [`Meta::share`]).
    fn share(&self, ino: Ino) -> Result<()> {
        let _ = ino;
        Ok(())
    }

    /// Runs `f`, which only reads; statements need not see one snapshot.
    fn read<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T>;

    /// Runs `f`, which only reads, in one snapshot (its statements agree).
    fn snapshot<T>(&self, f: impl FnMut(&mut dyn Txn) -> TxResult<T>) -> Result<T> {
        self.read(f)
    }

    /// Waits until the write transaction in flight, if any, has committed (SQLite's single
    /// writer: an open must not miss an unlink about to commit; see `ops`).
    fn settle_writes(&self) {}

    /// Makes every commit so far durable on stable storage.
    fn sync(&self) -> Result<()>;

    /// Starts writing out what [`Engine::sync`] will make durable, without waiting, so that
    /// it has less to wait for while the caller makes what the commits refer to durable (a
    /// sync write's staged piece, written out at the same time). Nothing by default: the
    /// commit waits for `sync`, after the caller's data (SQLite commits here, see there).
    fn begin_sync(&self) -> Result<()> {
        Ok(())
    }

    /// The local file `sync` is an fdatasync of (SQLite's database, its WAL beside it), if it
    /// is one: the data layer's syncs of staged packs on the same disk share its flush (see
    /// `data::stage`).
    fn sync_file(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// The engine's own check of its storage (SQLite's `quick_check`): the problems found,
    /// none when it is sound. Engines that guard their storage themselves find none.
    fn check_storage(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Starts exchanging changes with other clients (see [`Meta::watch`](super::Meta::watch)).
    fn watch(&self, session: u64, sink: ChangeSink) -> Result<bool> {
        let _ = (session, sink);
        Ok(false)
    }

    /// Stops what [`Engine::watch`] started.
    fn unwatch(&self) {}

    /// Tells the other clients what a committed change touched (`f` runs only if they
    /// listen).
    fn publish(&self, f: impl FnOnce() -> Vec<Change>) {
        let _ = f;
    }
}

/// A parameter of a statement.
#[derive(Clone, Copy, Debug)]
pub enum Val<'a> {
    Int(i64),
    Bytes(&'a [u8]),
    Text(&'a str),
}

/// A value of a result row.
#[derive(Clone, Debug)]
pub enum Cell {
    Int(i64),
    Bytes(Vec<u8>),
    Text(String),
    Bool(bool),
    Null,
}

/// A result row, its values in column order.
pub struct SqlRow(pub Vec<Cell>);

impl SqlRow {
    fn cell(&self, i: usize) -> TxResult<&Cell> {
        self.0
            .get(i)
            .ok_or_else(|| corrupt(format!("result row has no column {i}")))
    }

    pub fn int(&self, i: usize) -> TxResult<i64> {
        match self.cell(i)? {
            Cell::Int(v) => Ok(*v),
            Cell::Bool(b) => Ok(*b as i64),
            other => Err(corrupt(format!("column {i}: {other:?} is not an integer"))),
        }
    }

    pub fn opt_int(&self, i: usize) -> TxResult<Option<i64>> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    /// Bytes of a BLOB/BYTEA column (or of text, as a name written by hand may be).
    pub fn bytes(&self, i: usize) -> TxResult<Vec<u8>> {
        match self.cell(i)? {
            Cell::Bytes(b) => Ok(b.clone()),
            Cell::Text(t) => Ok(t.as_bytes().to_vec()),
            _ => Ok(Vec::new()),
        }
    }

    pub fn text(&self, i: usize) -> TxResult<String> {
        match self.cell(i)? {
            Cell::Text(t) => Ok(t.clone()),
            Cell::Bytes(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            other => Err(corrupt(format!("column {i}: {other:?} is not text"))),
        }
    }

    /// An inode's attributes from [`node_cols!`] starting at column `base`.
    pub fn attr(&self, base: usize) -> TxResult<Attr> {
        attr_from(|i| self.int(base + i))
    }
}

/// An inode's attributes from its fields in [`node_cols!`]'s order, as `field(i)` reads them.
pub(crate) fn attr_from<E>(
    field: impl Fn(usize) -> std::result::Result<i64, E>,
) -> std::result::Result<Attr, E> {
    Ok(Attr {
        ino: field(0)? as u64,
        kind: Kind::from_u8(field(1)? as u8).unwrap_or(Kind::File),
        mode: field(2)? as u32,
        uid: field(3)? as u32,
        gid: field(4)? as u32,
        nlink: field(5)? as u32,
        length: field(6)? as u64,
        rdev: field(7)? as u32,
        atime: field(8)?,
        mtime: field(9)?,
        ctime: field(10)?,
        parent: field(11)? as u64,
        flags: field(12)? as u32,
        stored: field(13)? as u64,
    })
}

/// The records of chunk `index` of inode `ino` from its stored form.
/// Rows of `id, size` from `unkai_dead_slice`.
fn dead_slice_rows(rows: &[SqlRow]) -> TxResult<Vec<DeadSlice>> {
    rows.iter()
        .map(|r| {
            Ok(DeadSlice {
                id: r.int(0)? as u64,
                size: r.int(1)? as u32,
            })
        })
        .collect()
}

fn external_from(r: &SqlRow) -> TxResult<super::External> {
    Ok(super::External {
        id: r.int(0)? as u64,
        url: r.text(1)?,
        key: r.text(2)?,
        etag: r.text(3)?,
        object_size: r.int(4)? as u64,
        base: r.int(5)? as u64,
        size: r.int(6)? as u32,
    })
}

fn quota_from(r: &SqlRow) -> TxResult<Quota> {
    Ok(Quota {
        ino: r.int(0)? as Ino,
        max_bytes: r.int(1)?.max(0) as u64,
        max_inodes: r.int(2)?.max(0) as u64,
        used_bytes: r.int(3)?,
        used_inodes: r.int(4)?,
    })
}

pub(crate) fn decode_chunk(b: &[u8], ino: Ino, index: u32) -> TxResult<Vec<SliceRec>> {
    slice::decode(b).ok_or_else(|| corrupt(format!("chunk {index} of inode {ino} is corrupt")))
}

/// The columns of an inode, in [`SqlRow::attr`]'s order, of `unkai_node n`.
macro_rules! node_cols {
    () => {
        "n.ino, n.kind, n.mode, n.uid, n.gid, n.nlink, n.length, n.rdev, n.atime, n.mtime, \
         n.ctime, n.parent, n.flags, n.stored"
    };
}
pub(crate) use node_cols;

/// The parameters `$1..=$14` of an inode, in [`node_cols!`]'s order.
pub(crate) fn node_vals(a: &Attr) -> [Val<'static>; 14] {
    [
        a.ino as i64,
        a.kind as i64,
        a.mode as i64,
        a.uid as i64,
        a.gid as i64,
        a.nlink as i64,
        a.length as i64,
        a.rdev as i64,
        a.atime,
        a.mtime,
        a.ctime,
        a.parent as i64,
        a.flags as i64,
        a.stored as i64,
    ]
    .map(Val::Int)
}

/// Writes an inode's fields from [`node_vals`]. The kind never changes; naming it in the
/// WHERE clause lets PostgreSQL type every parameter of the shared parameter list.
pub(crate) const UPDATE_NODE: &str = "UPDATE unkai_node SET mode=$3, uid=$4, gid=$5, nlink=$6, length=$7, \
                           rdev=$8, atime=$9, mtime=$10, ctime=$11, parent=$12, flags=$13, \
                           stored=$14 WHERE ino=$1 AND kind=$2";

/// Directory `d` as [`Txn::touch_dir`] leaves it.
pub(crate) fn touched(d: &Attr, now: Nanos, links: i32) -> Attr {
    let mut t = d.clone();
    t.mtime = now;
    t.ctime = now;
    t.nlink = t.nlink.saturating_add_signed(links);
    t
}

fn ino(i: Ino) -> Val<'static> {
    Val::Int(i as i64)
}

/// The rows of a volume, as one transaction sees them.
///
/// An engine provides [`Txn::exec`] and [`Txn::scan`]; every other method has a body in SQL,
/// written once in PostgreSQL's dialect (`$N` parameters, tables `unkai_*`), which an SQL
/// engine translates (SQLite: `?N`, tables without the prefix, `open_file`). An engine
/// overrides a method where it can do the same in fewer round trips, or must say it
/// differently; an engine that is not SQL would override them all.
/// What a change of one entry will read (see [`Engine::write_entry`]).
pub struct EntryHints<'a> {
    /// The entry: (parent, name).
    pub entry: (Ino, &'a [u8]),
    /// Whether it should be a directory whose emptiness is read.
    pub dir: bool,
    /// Other entries looked up: (parent, name).
    pub edges: Vec<(Ino, Vec<u8>)>,
    /// The trash's hour directory the entry goes to, if it goes to the trash (its inode
    /// stays: nothing to ask about opens of it).
    pub trash_hour: Option<Ino>,
}

/// A directory, its parent and entries, as [`Txn::read_dir`] reads them.
pub type ReadDir = (Attr, Option<Attr>, Vec<DirEntry>);

/// A directory below the one listed, read with it by [`Txn::read_dir_tree`]: its
/// attributes, its parent's inode, and its first entries (with their attributes).
pub struct SubDir {
    pub attr: Attr,
    pub parent: Ino,
    pub entries: Vec<DirEntry>,
}

pub trait Txn {
    /// Runs a statement; returns the rows it changed.
    fn exec(&mut self, sql: &'static str, p: &[Val<'_>]) -> TxResult<u64>;
    /// A write whose count nothing reads: an engine may send it later, with the next
    /// statement or COMMIT (its failure then fails that).
    fn put(&mut self, sql: &'static str, p: &[Val<'_>]) -> TxResult<()> {
        self.exec(sql, p).map(|_| ())
    }
    /// Runs a query, handing its rows to `f` one by one.
    fn scan(
        &mut self,
        sql: &'static str,
        p: &[Val<'_>],
        f: &mut dyn FnMut(SqlRow) -> TxResult<()>,
    ) -> TxResult<()>;

    /// Every row of a query.
    fn rows(&mut self, sql: &'static str, p: &[Val<'_>]) -> TxResult<Vec<SqlRow>> {
        let mut out = Vec::new();
        self.scan(sql, p, &mut |r| {
            out.push(r);
            Ok(())
        })?;
        Ok(out)
    }
    /// The first row of a query, if any.
    fn row(&mut self, sql: &'static str, p: &[Val<'_>]) -> TxResult<Option<SqlRow>> {
        Ok(self.rows(sql, p)?.into_iter().next())
    }

    // ---- nodes ----
    /// An inode's attributes (ENOENT if it has none).
    fn get_node(&mut self, i: Ino) -> TxResult<Attr> {
        let sql = concat!(
            "SELECT ",
            node_cols!(),
            " FROM unkai_node n WHERE n.ino = $1"
        );
        match self.row(sql, &[ino(i)])? {
            Some(r) => r.attr(0),
            None => fail(libc::ENOENT),
        }
    }
    /// [`Txn::get_node`], locking the row for the rest of the transaction where rows are
    /// locked.
    fn lock_node(&mut self, ino: Ino) -> TxResult<Attr> {
        self.get_node(ino)
    }
    /// Locks two inodes (in an order that cannot deadlock); the same twice if `a == b`.
    fn lock_two(&mut self, a: Ino, b: Ino) -> TxResult<(Attr, Attr)> {
        let x = self.lock_node(a)?;
        let y = if a == b {
            x.clone()
        } else {
            self.lock_node(b)?
        };
        Ok((x, y))
    }
    fn insert_node(&mut self, a: &Attr) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_node (ino, kind, mode, uid, gid, nlink, length, rdev, atime, mtime,
               ctime, parent, flags, stored)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
            &node_vals(a),
        )?;
        Ok(())
    }
    fn update_node(&mut self, a: &Attr) -> TxResult<()> {
        self.exec(UPDATE_NODE, &node_vals(a))?;
        Ok(())
    }
    /// Directory `d` (as locked) gained or lost an entry at `now`: its mtime and ctime become
    /// `now` and its link count changes by `links`. Nothing else of `d` is written, so an
    /// engine may change the row in place without trusting the rest of `d`: the trash's hour
    /// directory, which every client deletes into at once, is guessed only loosely (see
    /// `postgres::known`).
    fn touch_dir(&mut self, d: &Attr, now: Nanos, links: i32) -> TxResult<()> {
        self.update_node(&touched(d, now, links))
    }
    /// Applies a setattr to the inode and writes it (see [`SetAttr::apply`](super::SetAttr::apply)): an engine may do
    /// both in one statement.
    /// EPERM if the inode's flags forbid the change ([`SetAttr::blocked_by`](super::SetAttr::blocked_by)).
    fn set_attr(&mut self, ino: Ino, set: &super::SetAttr, now: Nanos) -> TxResult<Attr> {
        let mut a = self.lock_node(ino)?;
        if a.flags & set.blocked_by() != 0 {
            return fail(libc::EPERM);
        }
        if set.apply(&mut a, now) {
            self.update_node(&a)?;
        }
        Ok(a)
    }
    /// [`Txn::set_attr`] (a chmod), and then the inode's access ACL as it stands under the
    /// lock the change took (for the chmod to rewrite it).
    fn set_attr_with_acl(
        &mut self,
        ino: Ino,
        set: &super::SetAttr,
        now: Nanos,
    ) -> TxResult<(Attr, Option<Vec<u8>>)> {
        let a = self.set_attr(ino, set, now)?;
        Ok((a, self.xattr(ino, super::acl::ACCESS)?))
    }
    /// Deletes an inode's rows (node, symlink target, xattrs, chunks); returns the records of
    /// its chunks, whose slices the caller releases.
    fn delete_node_rows(&mut self, i: Ino) -> TxResult<Vec<SliceRec>> {
        let recs = self.drop_chunks(i, 0, u64::MAX)?.concat();
        for sql in [
            "DELETE FROM unkai_node WHERE ino=$1",
            "DELETE FROM unkai_symlink WHERE ino=$1",
            "DELETE FROM unkai_xattr WHERE ino=$1",
        ] {
            self.exec(sql, &[ino(i)])?;
        }
        Ok(recs)
    }
    /// The volume setting `name` (`format`: its JSON), if recorded.
    fn setting(&mut self, name: &str) -> TxResult<Option<String>> {
        let r = self.row(
            "SELECT value FROM unkai_setting WHERE name=$1",
            &[Val::Text(name)],
        )?;
        r.map(|r| r.text(0)).transpose()
    }
    /// Records the volume setting `name` (which exists).
    fn set_setting(&mut self, name: &str, value: &str) -> TxResult<()> {
        self.exec(
            "UPDATE unkai_setting SET value=$2 WHERE name=$1",
            &[Val::Text(name), Val::Text(value)],
        )?;
        Ok(())
    }
    /// Deletes every row of the volume, its settings included: the database then holds no
    /// volume (`unkai destroy`).
    fn erase_volume(&mut self) -> TxResult<()> {
        for sql in [
            "DELETE FROM unkai_open",
            "DELETE FROM unkai_sustained",
            "DELETE FROM unkai_plock",
            "DELETE FROM unkai_reserved",
            "DELETE FROM unkai_session",
            "DELETE FROM unkai_quota",
            "DELETE FROM unkai_xattr",
            "DELETE FROM unkai_chunk",
            "DELETE FROM unkai_slice_ref",
            "DELETE FROM unkai_dead_slice",
            "DELETE FROM unkai_external",
            "DELETE FROM unkai_symlink",
            "DELETE FROM unkai_edge",
            "DELETE FROM unkai_node",
            "DELETE FROM unkai_counter",
            "DELETE FROM unkai_setting",
        ] {
            self.exec(sql, &[])?;
        }
        Ok(())
    }
    /// Adds to the volume's usage counters (an engine may gather them until commit).
    fn add_usage(&mut self, used_bytes: i64, inodes: i64) -> TxResult<()> {
        for (name, delta) in [("usedSpace", used_bytes), ("totalInodes", inodes)] {
            if delta != 0 {
                self.exec(
                    "UPDATE unkai_counter SET value = value + $2 WHERE name = $1",
                    &[Val::Text(name), Val::Int(delta)],
                )?;
            }
        }
        Ok(())
    }
    /// [`Txn::add_usage`], then ENOSPC if what grows passes its limit (`max_bytes`,
    /// `max_inodes`; 0: none). An engine whose writers run at once makes the check exact by
    /// holding the counter's row until commit.
    fn charge(
        &mut self,
        used_bytes: i64,
        inodes: i64,
        max_bytes: u64,
        max_inodes: u64,
    ) -> TxResult<()> {
        self.add_usage(used_bytes, inodes)?;
        for (name, delta, max) in [
            ("usedSpace", used_bytes, max_bytes),
            ("totalInodes", inodes, max_inodes),
        ] {
            if delta > 0 && max > 0 {
                let r = self.row(
                    "SELECT value FROM unkai_counter WHERE name=$1",
                    &[Val::Text(name)],
                )?;
                if r.map(|r| r.int(0)).transpose()?.unwrap_or(0) > max as i64 {
                    return fail(libc::ENOSPC);
                }
            }
        }
        Ok(())
    }
    /// Sets the usage counters (fsck).
    fn set_usage(&mut self, used_bytes: u64, inodes: u64) -> TxResult<()> {
        for (name, v) in [("usedSpace", used_bytes), ("totalInodes", inodes)] {
            self.exec(
                "UPDATE unkai_counter SET value = $2 WHERE name = $1",
                &[Val::Text(name), Val::Int(v as i64)],
            )?;
        }
        Ok(())
    }
    /// Takes `n` ids from the counter `name` (`nextInode`, `nextSlice`); returns the first.
    fn take_ids(&mut self, name: &'static str, n: u64) -> TxResult<u64> {
        let r = self.row(
            "UPDATE unkai_counter SET value = value + $2 WHERE name = $1 RETURNING value",
            &[Val::Text(name), Val::Int(n as i64)],
        )?;
        match r {
            Some(r) => Ok(r.int(0)? as u64 - n),
            None => Err(corrupt(format!("counter {name} is missing"))),
        }
    }
    fn usage(&mut self) -> TxResult<Usage> {
        let r = self.row(
            "SELECT (SELECT count(*) FROM unkai_slice_ref),
                    (SELECT CAST(coalesce(sum(size), 0) AS BIGINT) FROM unkai_slice_ref),
                    (SELECT count(*) FROM unkai_dead_slice),
                    (SELECT value FROM unkai_counter WHERE name = 'usedSpace'),
                    (SELECT value FROM unkai_counter WHERE name = 'totalInodes'),
                    (SELECT value FROM unkai_counter WHERE name = 'trashPurgedEarly'),
                    (SELECT value FROM unkai_counter WHERE name = 'trashPurgedEarlyBytes')",
            &[],
        )?;
        let Some(r) = r else {
            return Ok(Usage::default());
        };
        let get = |i: usize| -> TxResult<u64> { Ok(r.opt_int(i)?.unwrap_or(0).max(0) as u64) };
        Ok(Usage {
            slices: get(0)?,
            slice_bytes: get(1)?,
            pending_delete: get(2)?,
            used_bytes: get(3)?,
            inodes: get(4)?,
            trash_purged_early: get(5)?,
            trash_purged_early_bytes: get(6)?,
        })
    }

    // ---- directory quotas (see `meta::quota`) ----
    /// The directories that have a quota.
    fn quota_dirs(&mut self) -> TxResult<Vec<Ino>> {
        let mut out = Vec::new();
        self.scan("SELECT ino FROM unkai_quota", &[], &mut |r| {
            out.push(r.int(0)? as Ino);
            Ok(())
        })?;
        Ok(out)
    }
    /// Every quota, by directory.
    fn quotas(&mut self) -> TxResult<Vec<Quota>> {
        let mut out = Vec::new();
        let sql = "SELECT ino, max_bytes, max_inodes, used_bytes, used_inodes FROM unkai_quota
                   ORDER BY ino";
        self.scan(sql, &[], &mut |r| {
            out.push(quota_from(&r)?);
            Ok(())
        })?;
        Ok(out)
    }
    /// Adds to a quota's usage; returns it after, or None if `dir` has no quota. An engine
    /// whose writers run at once holds the row until commit, so that racing clients take
    /// turns at the limit.
    fn quota_add(&mut self, dir: Ino, bytes: i64, inodes: i64) -> TxResult<Option<Quota>> {
        let r = self.row(
            "UPDATE unkai_quota SET used_bytes = used_bytes + $2, used_inodes = used_inodes + $3
             WHERE ino = $1 RETURNING ino, max_bytes, max_inodes, used_bytes, used_inodes",
            &[ino(dir), Val::Int(bytes), Val::Int(inodes)],
        )?;
        r.map(|r| quota_from(&r)).transpose()
    }
    /// Creates or replaces a quota.
    fn put_quota(&mut self, q: &Quota) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_quota (ino, max_bytes, max_inodes, used_bytes, used_inodes)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (ino) DO UPDATE SET max_bytes = $2, max_inodes = $3,
               used_bytes = $4, used_inodes = $5",
            &[
                ino(q.ino),
                Val::Int(q.max_bytes as i64),
                Val::Int(q.max_inodes as i64),
                Val::Int(q.used_bytes),
                Val::Int(q.used_inodes),
            ],
        )?;
        Ok(())
    }
    /// Deletes a directory's quota; whether it had one.
    fn delete_quota(&mut self, dir: Ino) -> TxResult<bool> {
        Ok(self.exec("DELETE FROM unkai_quota WHERE ino = $1", &[ino(dir)])? > 0)
    }
    /// What the entries of `dir` hold, its subdirectories' trees not included, and the
    /// subdirectories: one aggregate in the database, whatever the number of files.
    fn dir_summary(&mut self, dir: Ino) -> TxResult<(Summary, Vec<Ino>)> {
        let mut sum = Summary::default();
        let sql = "SELECT n.kind, count(*), CAST(coalesce(sum(n.length), 0) AS BIGINT),
                     CAST(coalesce(sum((n.length + 4095) / 4096 * 4096), 0) AS BIGINT),
                     CAST(coalesce(sum(n.stored), 0) AS BIGINT)
                   FROM unkai_edge e JOIN unkai_node n ON n.ino = e.ino
                   WHERE e.parent = $1 GROUP BY n.kind";
        self.scan(sql, &[ino(dir)], &mut |r| {
            let n = r.int(1)?.max(0) as u64;
            match Kind::from_u8(r.int(0)? as u8) {
                Some(Kind::File) => {
                    sum.files += n;
                    sum.length += r.int(2)?.max(0) as u64;
                    sum.size += r.int(3)?.max(0) as u64;
                    sum.stored += r.int(4)?.max(0) as u64;
                }
                Some(Kind::Dir) => sum.dirs += n,
                Some(Kind::Symlink) => sum.symlinks += n,
                _ => sum.others += n,
            }
            Ok(())
        })?;
        let mut subdirs = Vec::new();
        self.scan(
            "SELECT ino FROM unkai_edge WHERE parent = $1 AND kind = $2",
            &[ino(dir), Val::Int(Kind::Dir as i64)],
            &mut |r| {
                subdirs.push(r.int(0)? as Ino);
                Ok(())
            },
        )?;
        Ok((sum, subdirs))
    }
    /// The directories holding an entry of inode `i`, once per entry.
    fn link_parents(&mut self, i: Ino) -> TxResult<Vec<Ino>> {
        let mut out = Vec::new();
        self.scan(
            "SELECT parent FROM unkai_edge WHERE ino = $1",
            &[ino(i)],
            &mut |r| {
                out.push(r.int(0)? as Ino);
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// The entries of inode `i`: (directory, name), once per entry.
    fn names_of(&mut self, i: Ino) -> TxResult<Vec<(Ino, Vec<u8>)>> {
        let mut out = Vec::new();
        self.scan(
            "SELECT parent, name FROM unkai_edge WHERE ino = $1",
            &[ino(i)],
            &mut |r| {
                out.push((r.int(0)? as Ino, r.bytes(1)?));
                Ok(())
            },
        )?;
        Ok(out)
    }

    // ---- directory entries ----
    /// The entry `name` of `parent`: (entry id, inode).
    fn get_edge(&mut self, parent: Ino, name: &[u8]) -> TxResult<Option<(i64, Ino)>> {
        let r = self.row(
            "SELECT id, ino FROM unkai_edge WHERE parent=$1 AND name=$2",
            &[ino(parent), Val::Bytes(name)],
        )?;
        r.map(|r| Ok((r.int(0)?, r.int(1)? as Ino))).transpose()
    }
    /// The inode `name` of `parent` names: ENOENT if none, ENOTDIR if `parent` is not a
    /// directory.
    fn find(&mut self, parent: Ino, name: &[u8]) -> TxResult<Attr> {
        let sql = concat!(
            "SELECT ",
            node_cols!(),
            " FROM unkai_edge e JOIN unkai_node n ON n.ino = e.ino
             WHERE e.parent = $1 AND e.name = $2"
        );
        match self.row(sql, &[ino(parent), Val::Bytes(name)])? {
            Some(r) => r.attr(0),
            None if self.get_node(parent)?.kind != Kind::Dir => fail(libc::ENOTDIR),
            None => fail(libc::ENOENT),
        }
    }
    /// The entry `name` of `parent` and its inode, locked: (entry id, attributes).
    fn lock_entry(&mut self, parent: Ino, name: &[u8]) -> TxResult<Option<(i64, Attr)>> {
        match self.get_edge(parent, name)? {
            Some((id, ino)) => Ok(Some((id, self.lock_node(ino)?))),
            None => Ok(None),
        }
    }
    fn insert_edge(&mut self, parent: Ino, name: &[u8], i: Ino, kind: Kind) -> TxResult<()> {
        self.put(
            "INSERT INTO unkai_edge (parent, name, ino, kind) VALUES ($1, $2, $3, $4)",
            &[ino(parent), Val::Bytes(name), ino(i), Val::Int(kind as i64)],
        )
    }
    /// The default ACL of directory `dir` (locked), which a create in it inherits.
    fn default_acl(&mut self, dir: Ino) -> TxResult<Option<Vec<u8>>> {
        self.xattr(dir, super::acl::DEFAULT)
    }
    /// Creates inode `a` as entry `name` of directory `dir` (locked), and writes `dir` as
    /// given (its new times and link count); EEXIST if the name is taken.
    fn create_in(&mut self, a: &Attr, dir: &Attr, name: &[u8]) -> TxResult<()> {
        self.create_entry(a, dir.ino, name)?;
        self.update_node(dir)
    }
    /// Inserts a new inode and its first entry; EEXIST if the name is taken.
    fn create_entry(&mut self, a: &Attr, parent: Ino, name: &[u8]) -> TxResult<()> {
        if self.get_edge(parent, name)?.is_some() {
            return fail(libc::EEXIST);
        }
        self.insert_node(a)?;
        self.insert_edge(parent, name, a.ino, a.kind)
    }
    /// The name of inode `i` in directory `parent` (a scan of its entries: for the rare
    /// caller, such as the trash's origin paths).
    fn name_in(&mut self, parent: Ino, i: Ino) -> TxResult<Option<Vec<u8>>> {
        let r = self.row(
            "SELECT name FROM unkai_edge WHERE parent=$1 AND ino=$2 LIMIT 1",
            &[ino(parent), ino(i)],
        )?;
        r.map(|r| r.bytes(0)).transpose()
    }
    fn delete_edge(&mut self, id: i64) -> TxResult<()> {
        self.put("DELETE FROM unkai_edge WHERE id=$1", &[Val::Int(id)])
    }
    /// Removes entry `id` and writes its directory `dir`. Returns whether the entry's inode
    /// `ino` is recorded open anywhere, where the engine learns it in the same round trip
    /// (`None`: ask [`Txn::open_anywhere`]).
    fn remove_entry(&mut self, id: i64, dir: &Attr, ino: Ino) -> TxResult<Option<bool>> {
        let _ = ino;
        self.delete_edge(id)?;
        self.update_node(dir)?;
        Ok(None)
    }
    /// Points entry `id` at another inode (rename's exchange).
    fn set_edge_target(&mut self, id: i64, i: Ino, kind: Kind) -> TxResult<()> {
        self.put(
            "UPDATE unkai_edge SET ino=$2, kind=$3 WHERE id=$1",
            &[Val::Int(id), ino(i), Val::Int(kind as i64)],
        )
    }
    /// Moves entry `id` to `parent`/`name`.
    fn move_edge(&mut self, id: i64, parent: Ino, name: &[u8]) -> TxResult<()> {
        self.put(
            "UPDATE unkai_edge SET parent=$2, name=$3 WHERE id=$1",
            &[Val::Int(id), ino(parent), Val::Bytes(name)],
        )
    }
    fn dir_is_empty(&mut self, dir: Ino) -> TxResult<bool> {
        let sql = "SELECT 1 FROM unkai_edge WHERE parent=$1 LIMIT 1";
        Ok(self.row(sql, &[ino(dir)])?.is_none())
    }
    /// Entries of `dir` after entry id `after`, at most `limit`, in id order; with their
    /// attributes if `plus`. Cookies are the entry id + 2 (after "." and "..").
    fn list_entries(
        &mut self,
        dir: Ino,
        after: i64,
        limit: i64,
        plus: bool,
    ) -> TxResult<Vec<DirEntry>> {
        let p = [ino(dir), Val::Int(after), Val::Int(limit)];
        let mut out = Vec::new();
        if plus {
            let sql = concat!(
                "SELECT e.id, e.name, ",
                node_cols!(),
                " FROM unkai_edge e JOIN unkai_node n ON n.ino = e.ino
                 WHERE e.parent=$1 AND e.id>$2 ORDER BY e.id LIMIT $3"
            );
            self.scan(sql, &p, &mut |r| {
                let a = r.attr(2)?;
                out.push(DirEntry {
                    name: r.bytes(1)?,
                    ino: a.ino,
                    kind: a.kind,
                    cookie: r.int(0)? as u64 + 2,
                    attr: Some(a),
                });
                Ok(())
            })?;
        } else {
            let sql = "SELECT id, name, ino, kind FROM unkai_edge WHERE parent=$1 AND id>$2
                       ORDER BY id LIMIT $3";
            self.scan(sql, &p, &mut |r| {
                out.push(DirEntry {
                    name: r.bytes(1)?,
                    ino: r.int(2)? as u64,
                    kind: Kind::from_u8(r.int(3)? as u8).unwrap_or(Kind::File),
                    cookie: r.int(0)? as u64 + 2,
                    attr: None,
                });
                Ok(())
            })?;
        }
        Ok(out)
    }
    /// What readdir lists: the directory's attributes (ENOTDIR if it is none), its parent's
    /// if `parent`, and its entries as [`Txn::list_entries`] gives them (none if `limit` is 0).
    fn read_dir(
        &mut self,
        dir: Ino,
        parent: bool,
        after: i64,
        limit: i64,
        plus: bool,
    ) -> TxResult<ReadDir> {
        let d = self.get_node(dir)?;
        if d.kind != Kind::Dir {
            return fail(libc::ENOTDIR);
        }
        let p = match parent {
            true => Some(self.get_node(d.parent.max(super::ROOT_INO))?),
            false => None,
        };
        let list = match limit > 0 {
            true => self.list_entries(dir, after, limit, plus)?,
            false => Vec::new(),
        };
        Ok((d, p, list))
    }
    /// [`Txn::read_dir`] from the start, with attributes and the parent's (`want` entries at
    /// most), and in the same read the same first page of up to `dirs` directories below it,
    /// breadth first (not the trash's; of its own entries, those from id `from` on): a walk
    /// of the tree then lists them from memory. `None` where an engine would read no faster
    /// so (each listing then reads alone).
    fn read_dir_tree(
        &mut self,
        _dir: Ino,
        _want: i64,
        _dirs: i64,
        _from: i64,
    ) -> TxResult<Option<(ReadDir, Vec<SubDir>)>> {
        Ok(None)
    }
    /// Removes the entry `name` of `parent` (fsck).
    fn remove_edge_named(&mut self, parent: Ino, name: &[u8]) -> TxResult<()> {
        self.exec(
            "DELETE FROM unkai_edge WHERE parent=$1 AND name=$2",
            &[ino(parent), Val::Bytes(name)],
        )?;
        Ok(())
    }
    /// Corrects the kind an entry records (fsck).
    fn set_edge_kind(&mut self, parent: Ino, name: &[u8], kind: Kind) -> TxResult<()> {
        self.exec(
            "UPDATE unkai_edge SET kind=$3 WHERE parent=$1 AND name=$2",
            &[ino(parent), Val::Bytes(name), Val::Int(kind as i64)],
        )?;
        Ok(())
    }

    // ---- symlinks and xattrs ----
    fn insert_symlink(&mut self, i: Ino, target: &[u8]) -> TxResult<()> {
        self.put(
            "INSERT INTO unkai_symlink (ino, target) VALUES ($1, $2)",
            &[ino(i), Val::Bytes(target)],
        )
    }
    fn symlink(&mut self, i: Ino) -> TxResult<Option<Vec<u8>>> {
        let sql = "SELECT target FROM unkai_symlink WHERE ino=$1";
        self.row(sql, &[ino(i)])?.map(|r| r.bytes(0)).transpose()
    }
    fn xattr(&mut self, i: Ino, name: &[u8]) -> TxResult<Option<Vec<u8>>> {
        let sql = "SELECT value FROM unkai_xattr WHERE ino=$1 AND name=$2";
        self.row(sql, &[ino(i), Val::Bytes(name)])?
            .map(|r| r.bytes(0))
            .transpose()
    }
    fn put_xattr(&mut self, i: Ino, name: &[u8], value: &[u8]) -> TxResult<()> {
        self.put(
            "INSERT INTO unkai_xattr (ino, name, value) VALUES ($1, $2, $3)
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            &[ino(i), Val::Bytes(name), Val::Bytes(value)],
        )
    }
    /// Whether there was one to delete.
    fn delete_xattr(&mut self, i: Ino, name: &[u8]) -> TxResult<bool> {
        let sql = "DELETE FROM unkai_xattr WHERE ino=$1 AND name=$2";
        Ok(self.exec(sql, &[ino(i), Val::Bytes(name)])? > 0)
    }
    fn xattr_names(&mut self, i: Ino) -> TxResult<Vec<Vec<u8>>> {
        let sql = "SELECT name FROM unkai_xattr WHERE ino=$1 ORDER BY name";
        self.rows(sql, &[ino(i)])?
            .iter()
            .map(|r| r.bytes(0))
            .collect()
    }

    // ---- chunks and slices ----
    /// The records of one chunk, oldest first (none for a missing chunk).
    fn chunk(&mut self, i: Ino, index: u32) -> TxResult<Vec<SliceRec>> {
        let sql = "SELECT slices FROM unkai_chunk WHERE ino=$1 AND indx=$2";
        match self.row(sql, &[ino(i), Val::Int(index as i64)])? {
            None => Ok(Vec::new()),
            Some(r) => decode_chunk(&r.bytes(0)?, i, index),
        }
    }
    /// Appends records to a chunk; returns all its records after.
    fn append_chunk(&mut self, ino: Ino, index: u32, recs: &[SliceRec]) -> TxResult<Vec<SliceRec>>;
    /// Replaces a chunk's records (deletes the chunk if `recs` is empty).
    fn set_chunk(&mut self, i: Ino, index: u32, recs: &[SliceRec]) -> TxResult<()> {
        let (i, index) = (ino(i), Val::Int(index as i64));
        if recs.is_empty() {
            self.exec(
                "DELETE FROM unkai_chunk WHERE ino=$1 AND indx=$2",
                &[i, index],
            )?;
        } else {
            self.exec(
                "UPDATE unkai_chunk SET slices=$3 WHERE ino=$1 AND indx=$2",
                &[i, index, Val::Bytes(&slice::encode(recs))],
            )?;
        }
        Ok(())
    }
    /// Deletes the chunks of `ino` with index in `from..to`; returns their records (of the
    /// decodable ones, chunk by chunk), whose slices the caller releases.
    fn drop_chunks(&mut self, i: Ino, from: u64, to: u64) -> TxResult<Vec<Vec<SliceRec>>> {
        let lim = |i: u64| Val::Int(i.min(u32::MAX as u64 + 1) as i64);
        let rows = self.rows(
            "DELETE FROM unkai_chunk WHERE ino=$1 AND indx>=$2 AND indx<$3 RETURNING slices",
            &[ino(i), lim(from), lim(to)],
        )?;
        let mut chunks = Vec::new();
        for r in rows {
            chunks.push(slice::decode(&r.bytes(0)?).unwrap_or_default());
        }
        Ok(chunks)
    }
    /// One more reference to each record's slice. A slice queued for deletion lives again: a
    /// pack (`data::pack`) may lose its last reference while pieces of it are still being
    /// committed (garbage never reclaims a pack its writer still holds).
    fn incref(&mut self, recs: &[SliceRec]) -> TxResult<()> {
        for r in recs.iter().filter(|r| r.id != 0) {
            self.exec(
                "DELETE FROM unkai_dead_slice WHERE id=$1",
                &[Val::Int(r.id as i64)],
            )?;
            self.exec(
                "INSERT INTO unkai_slice_ref (id, size, refs) VALUES ($1, $2, 1)
                 ON CONFLICT (id) DO UPDATE SET refs = unkai_slice_ref.refs + 1",
                &[Val::Int(r.id as i64), Val::Int(r.size as i64)],
            )?;
        }
        Ok(())
    }
    /// One reference less to each record's slice; a slice left with none is queued for
    /// deletion (dead since `now`).
    fn decref(&mut self, recs: &[SliceRec], now: Nanos) -> TxResult<()> {
        for r in recs.iter().filter(|r| r.id != 0) {
            let left = self.row(
                "UPDATE unkai_slice_ref SET refs = refs - 1 WHERE id=$1 RETURNING refs",
                &[Val::Int(r.id as i64)],
            )?;
            if left.map(|l| l.int(0)).transpose()?.is_none_or(|n| n <= 0) {
                self.set_slice_refs(r.id, r.size, 0, now)?;
            }
        }
        Ok(())
    }
    /// Sets a slice's reference count; 0 queues it for deletion (fsck).
    fn set_slice_refs(&mut self, id: u64, size: u32, refs: u32, now: Nanos) -> TxResult<()> {
        let (id, size) = (Val::Int(id as i64), Val::Int(size as i64));
        if refs == 0 {
            self.exec("DELETE FROM unkai_slice_ref WHERE id=$1", &[id])?;
            self.exec(
                "INSERT INTO unkai_dead_slice (id, size, died) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO NOTHING",
                &[id, size, Val::Int(now)],
            )?;
        } else {
            self.exec(
                "INSERT INTO unkai_slice_ref (id, size, refs) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET refs = excluded.refs, size = excluded.size",
                &[id, size, Val::Int(refs as i64)],
            )?;
        }
        Ok(())
    }
    /// Slices queued for deletion that died at or before `cutoff` (all if `None`).
    fn dead_slices(&mut self, cutoff: Option<Nanos>, limit: usize) -> TxResult<Vec<DeadSlice>> {
        let rows = self.rows(
            "SELECT id, size FROM unkai_dead_slice WHERE died <= $1 ORDER BY id LIMIT $2",
            &[
                Val::Int(cutoff.unwrap_or(i64::MAX)),
                Val::Int(limit.min(i64::MAX as usize) as i64),
            ],
        )?;
        dead_slice_rows(&rows)
    }
    /// Slices queued for deletion, trash period or not, those dead longest first.
    fn dead_slices_by_age(&mut self, limit: usize) -> TxResult<Vec<DeadSlice>> {
        let rows = self.rows(
            "SELECT id, size FROM unkai_dead_slice ORDER BY died, id LIMIT $1",
            &[Val::Int(limit.min(i64::MAX as usize) as i64)],
        )?;
        dead_slice_rows(&rows)
    }
    /// Records an external slice's row (`unkai import`).
    fn insert_external(&mut self, e: &super::External) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_external (id, url, object_key, etag, object_size, base, size)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                Val::Int(e.id as i64),
                Val::Text(&e.url),
                Val::Text(&e.key),
                Val::Text(&e.etag),
                Val::Int(e.object_size as i64),
                Val::Int(e.base as i64),
                Val::Int(e.size as i64),
            ],
        )?;
        Ok(())
    }
    /// The row of external slice `id`, if any.
    fn external(&mut self, id: u64) -> TxResult<Option<super::External>> {
        let r = self.row(
            "SELECT id, url, object_key, etag, object_size, base, size FROM unkai_external
             WHERE id=$1",
            &[Val::Int(id as i64)],
        )?;
        r.map(|r| external_from(&r)).transpose()
    }
    /// Every external slice's row, by id.
    fn externals(&mut self) -> TxResult<Vec<super::External>> {
        let rows = self.rows(
            "SELECT id, url, object_key, etag, object_size, base, size FROM unkai_external
             ORDER BY id",
            &[],
        )?;
        rows.iter().map(external_from).collect()
    }
    /// Drops the rows of external slices no longer referenced (their objects are never
    /// deleted: they are not the volume's).
    fn forget_externals(&mut self, ids: &[u64]) -> TxResult<()> {
        for id in ids.iter().filter(|i| slice::is_external(**i)) {
            self.exec(
                "DELETE FROM unkai_external WHERE id=$1",
                &[Val::Int(*id as i64)],
            )?;
        }
        Ok(())
    }
    /// Removes slices from the deletion queue.
    fn forget_dead(&mut self, ids: &[u64]) -> TxResult<()> {
        for id in ids {
            self.exec(
                "DELETE FROM unkai_dead_slice WHERE id=$1",
                &[Val::Int(*id as i64)],
            )?;
        }
        Ok(())
    }

    // ---- sessions and open files ----
    fn insert_session(&mut self, info: &str, now: Nanos) -> TxResult<u64> {
        let r = self.row(
            "INSERT INTO unkai_session (info, heartbeat) VALUES ($1, $2) RETURNING id",
            &[Val::Text(info), Val::Int(now)],
        )?;
        match r {
            Some(r) => Ok(r.int(0)? as u64),
            None => Err(corrupt("no session id returned".into())),
        }
    }
    /// Records a heartbeat; false if the session's row is gone.
    fn touch_session(&mut self, id: u64, now: Nanos) -> TxResult<bool> {
        let sql = "UPDATE unkai_session SET heartbeat=$2 WHERE id=$1";
        Ok(self.exec(sql, &[Val::Int(id as i64), Val::Int(now)])? > 0)
    }
    /// Replaces what a session says about itself (see [`SessionInfo`]).
    fn set_session_info(&mut self, id: u64, info: &str) -> TxResult<()> {
        let sql = "UPDATE unkai_session SET info=$2 WHERE id=$1";
        self.exec(sql, &[Val::Int(id as i64), Val::Text(info)])?;
        Ok(())
    }
    fn session(&mut self, id: u64) -> TxResult<Option<SessionRow>> {
        let sql = "SELECT info, heartbeat FROM unkai_session WHERE id=$1";
        self.row(sql, &[Val::Int(id as i64)])?
            .map(|r| Ok((id, r.text(0)?, r.int(1)?)))
            .transpose()
    }
    fn sessions(&mut self) -> TxResult<Vec<SessionRow>> {
        let sql = "SELECT id, info, heartbeat FROM unkai_session ORDER BY id";
        self.rows(sql, &[])?
            .iter()
            .map(|r| Ok((r.int(0)? as u64, r.text(1)?, r.int(2)?)))
            .collect()
    }
    fn delete_session(&mut self, id: u64) -> TxResult<()> {
        self.exec(
            "DELETE FROM unkai_session WHERE id=$1",
            &[Val::Int(id as i64)],
        )?;
        Ok(())
    }
    /// Removes every open-file record of a session; returns their inodes. (`sustained` is
    /// where SQLite, and PostgreSQL clients of schema 1, recorded unlinked inodes kept open.)
    fn take_session_opens(&mut self, session: u64) -> TxResult<Vec<Ino>> {
        let s = [Val::Int(session as i64)];
        let inos = self.rows(
            "SELECT ino FROM unkai_sustained WHERE session=$1
             UNION SELECT ino FROM unkai_open WHERE session=$1 ORDER BY 1",
            &s,
        )?;
        self.exec("DELETE FROM unkai_sustained WHERE session=$1", &s)?;
        self.exec("DELETE FROM unkai_open WHERE session=$1", &s)?;
        inos.iter().map(|r| Ok(r.int(0)? as Ino)).collect()
    }
    /// Records that `session` has `ino` open.
    fn insert_open(&mut self, i: Ino, session: u64) -> TxResult<()> {
        self.put(
            "INSERT INTO unkai_open (ino, session) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[ino(i), Val::Int(session as i64)],
        )
    }
    /// Forgets that `session` has `ino` open (every session if `None`).
    fn delete_open(&mut self, i: Ino, session: Option<u64>) -> TxResult<()> {
        match session {
            Some(s) => self.exec(
                "DELETE FROM unkai_open WHERE ino=$1 AND session=$2",
                &[ino(i), Val::Int(s as i64)],
            )?,
            None => self.exec("DELETE FROM unkai_open WHERE ino=$1", &[ino(i)])?,
        };
        Ok(())
    }
    /// Reads an inode and records that `session` has it open.
    fn open_node(&mut self, ino: Ino, session: u64) -> TxResult<Attr> {
        let a = self.get_node(ino)?;
        self.insert_open(ino, session)?;
        Ok(a)
    }
    /// Forgets the open of `ino` by `session` (if `recorded`), then reads its link count
    /// (`None` if the inode is gone).
    fn close_node(&mut self, ino: Ino, session: u64, recorded: bool) -> TxResult<Option<u32>> {
        if recorded {
            self.delete_open(ino, Some(session))?;
        }
        Ok(unless_gone(self.get_node(ino))?.map(|a| a.nlink))
    }
    /// Whether any client has the inode recorded open (call with the inode locked).
    fn open_anywhere(&mut self, i: Ino) -> TxResult<bool> {
        let sql = "SELECT 1 FROM unkai_open WHERE ino=$1 LIMIT 1";
        Ok(self.row(sql, &[ino(i)])?.is_some())
    }
    /// Records that this client keeps an unlinked inode it has open (engines that count
    /// opens in memory).
    fn insert_sustained(&mut self, session: u64, i: Ino) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_sustained (session, ino) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[Val::Int(session as i64), ino(i)],
        )?;
        Ok(())
    }
    /// Forgets such records of `ino` (of every session if `None`).
    fn delete_sustained(&mut self, i: Ino, session: Option<u64>) -> TxResult<()> {
        match session {
            Some(s) => self.exec(
                "DELETE FROM unkai_sustained WHERE session=$1 AND ino=$2",
                &[Val::Int(s as i64), ino(i)],
            )?,
            None => self.exec("DELETE FROM unkai_sustained WHERE ino=$1", &[ino(i)])?,
        };
        Ok(())
    }
    /// Every open-file record: (session, inode), sorted.
    fn open_records(&mut self) -> TxResult<Vec<(u64, Ino)>> {
        let rows = self.rows(
            "SELECT session, ino FROM unkai_sustained
             UNION SELECT session, ino FROM unkai_open ORDER BY 1, 2",
            &[],
        )?;
        rows.iter()
            .map(|r| Ok((r.int(0)? as u64, r.int(1)? as Ino)))
            .collect()
    }

    // ---- slice ids reserved by sessions ----
    /// Records that `session` took the slice ids `[lo, hi)`: its uploads of them may still be
    /// committed. Extends the session's range that ends at `lo`, if any.
    fn reserve_slices(&mut self, session: u64, lo: u64, hi: u64) -> TxResult<()> {
        let s = Val::Int(session as i64);
        let (lo, hi) = (Val::Int(lo as i64), Val::Int(hi as i64));
        let sql = "UPDATE unkai_reserved SET hi=$3 WHERE session=$1 AND hi=$2";
        if self.exec(sql, &[s, lo, hi])? == 0 {
            self.exec(
                "INSERT INTO unkai_reserved (session, lo, hi) VALUES ($1, $2, $3)",
                &[s, lo, hi],
            )?;
        }
        Ok(())
    }
    /// Every reserved range: (session, lo, hi), sorted.
    fn reserved_slices(&mut self) -> TxResult<Vec<(u64, u64, u64)>> {
        let rows = self.rows(
            "SELECT session, lo, hi FROM unkai_reserved ORDER BY session, lo",
            &[],
        )?;
        rows.iter()
            .map(|r| Ok((r.int(0)? as u64, r.int(1)? as u64, r.int(2)? as u64)))
            .collect()
    }
    /// Forgets a session's reserved ids below `below` (all of them if `None`).
    fn release_slices(&mut self, session: u64, below: Option<u64>) -> TxResult<()> {
        let s = Val::Int(session as i64);
        match below {
            None => self.exec("DELETE FROM unkai_reserved WHERE session=$1", &[s])?,
            Some(b) => {
                let b = Val::Int(b as i64);
                self.exec(
                    "DELETE FROM unkai_reserved WHERE session=$1 AND hi<=$2",
                    &[s, b],
                )?;
                self.exec(
                    "UPDATE unkai_reserved SET lo=$2 WHERE session=$1 AND lo<$2",
                    &[s, b],
                )?
            }
        };
        Ok(())
    }

    // ---- file locks ----
    /// Every lock held on `ino` by a live session.
    fn locks(&mut self, i: Ino) -> TxResult<Vec<(LockOwner, LockRange)>> {
        let rows = self.rows(
            "SELECT session, owner, kind, start, last, pid FROM unkai_plock \
             WHERE ino=$1 AND session IN (SELECT id FROM unkai_session)",
            &[ino(i)],
        )?;
        rows.iter()
            .map(|r| {
                Ok((
                    LockOwner {
                        session: r.int(0)? as u64,
                        owner: r.int(1)? as u64,
                    },
                    LockRange {
                        kind: LockKind::from_code(r.int(2)?),
                        start: r.int(3)? as u64,
                        end: r.int(4)? as u64,
                        pid: r.int(5)? as u32,
                    },
                ))
            })
            .collect()
    }
    /// Deletes the locks on `ino` of sessions that ended.
    fn drop_orphan_locks(&mut self, i: Ino) -> TxResult<()> {
        self.exec(
            "DELETE FROM unkai_plock WHERE ino=$1 \
             AND session NOT IN (SELECT id FROM unkai_session)",
            &[ino(i)],
        )?;
        Ok(())
    }
    /// Replaces the ranges `owner` holds on `ino`.
    fn store_locks(&mut self, i: Ino, me: LockOwner, ranges: &[LockRange]) -> TxResult<()> {
        let (i, session, owner) = (
            ino(i),
            Val::Int(me.session as i64),
            Val::Int(me.owner as i64),
        );
        self.exec(
            "DELETE FROM unkai_plock WHERE ino=$1 AND session=$2 AND owner=$3",
            &[i, session, owner],
        )?;
        for r in ranges {
            self.exec(
                "INSERT INTO unkai_plock (ino, session, owner, kind, start, last, pid) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    i,
                    session,
                    owner,
                    Val::Int(r.kind.code()),
                    Val::Int(r.start as i64),
                    Val::Int(r.end as i64),
                    Val::Int(r.pid as i64),
                ],
            )?;
        }
        Ok(())
    }

    // ---- whole-volume scans (fsck, gc, status) ----
    /// Every referenced slice: (id, size, references).
    fn slice_refs(&mut self) -> TxResult<Vec<(u64, u32, u32)>> {
        let rows = self.rows(
            "SELECT id, size, refs FROM unkai_slice_ref ORDER BY id",
            &[],
        )?;
        rows.iter()
            .map(|r| Ok((r.int(0)? as u64, r.int(1)? as u32, r.int(2)? as u32)))
            .collect()
    }
    fn scan_nodes(&mut self, f: &mut dyn FnMut(&Attr)) -> TxResult<()> {
        self.each_node(&mut |a| {
            f(&a);
            Ok(())
        })
    }
    fn scan_entries(&mut self, f: &mut EntryVisitor<'_>) -> TxResult<()> {
        self.each_entry(&mut |parent, name, ino, kind| {
            f(parent, &name, ino, kind);
            Ok(())
        })
    }
    fn scan_chunks(&mut self, f: &mut dyn FnMut(Ino, u32, Option<Vec<SliceRec>>)) -> TxResult<()> {
        self.each_chunk(&mut |ino, index, recs| {
            f(ino, index, recs);
            Ok(())
        })
    }

    // ---- the whole volume, row by row (`admin::dump`: dump and load) ----
    // Scans stream their rows in a stable order and stop at the first error `f` returns.
    /// Every inode, by number.
    fn each_node(&mut self, f: &mut dyn FnMut(Attr) -> TxResult<()>) -> TxResult<()> {
        let sql = concat!("SELECT ", node_cols!(), " FROM unkai_node n ORDER BY n.ino");
        self.scan(sql, &[], &mut |r| f(r.attr(0)?))
    }
    /// Every directory entry: (parent, name, inode, kind recorded), each directory's in the
    /// order it lists them.
    fn each_entry(
        &mut self,
        f: &mut dyn FnMut(Ino, Vec<u8>, Ino, Option<Kind>) -> TxResult<()>,
    ) -> TxResult<()> {
        let sql = "SELECT parent, name, ino, kind FROM unkai_edge ORDER BY parent, id";
        self.scan(sql, &[], &mut |r| {
            let kind = u8::try_from(r.int(3)?).ok().and_then(Kind::from_u8);
            f(r.int(0)? as u64, r.bytes(1)?, r.int(2)? as u64, kind)
        })
    }
    /// Every chunk: (inode, index, records; `None` if they cannot be decoded).
    fn each_chunk(
        &mut self,
        f: &mut dyn FnMut(Ino, u32, Option<Vec<SliceRec>>) -> TxResult<()>,
    ) -> TxResult<()> {
        let sql = "SELECT ino, indx, slices FROM unkai_chunk ORDER BY ino, indx";
        self.scan(sql, &[], &mut |r| {
            f(
                r.int(0)? as u64,
                r.int(1)? as u32,
                slice::decode(&r.bytes(2)?),
            )
        })
    }
    /// Every volume setting: (name, value), by name.
    fn each_setting(&mut self, f: &mut dyn FnMut(String, String) -> TxResult<()>) -> TxResult<()> {
        let sql = "SELECT name, value FROM unkai_setting ORDER BY name";
        self.scan(sql, &[], &mut |r| f(r.text(0)?, r.text(1)?))
    }
    /// Every counter: (name, value), by name.
    fn each_counter(&mut self, f: &mut dyn FnMut(String, i64) -> TxResult<()>) -> TxResult<()> {
        let sql = "SELECT name, value FROM unkai_counter ORDER BY name";
        self.scan(sql, &[], &mut |r| f(r.text(0)?, r.int(1)?))
    }
    /// Every symlink's target: (inode, target), by inode.
    fn each_symlink(&mut self, f: &mut dyn FnMut(Ino, Vec<u8>) -> TxResult<()>) -> TxResult<()> {
        let sql = "SELECT ino, target FROM unkai_symlink ORDER BY ino";
        self.scan(sql, &[], &mut |r| f(r.int(0)? as u64, r.bytes(1)?))
    }
    /// Every xattr: (inode, name, value), by inode and name.
    fn each_xattr(
        &mut self,
        f: &mut dyn FnMut(Ino, Vec<u8>, Vec<u8>) -> TxResult<()>,
    ) -> TxResult<()> {
        let sql = "SELECT ino, name, value FROM unkai_xattr ORDER BY ino, name";
        self.scan(sql, &[], &mut |r| {
            f(r.int(0)? as u64, r.bytes(1)?, r.bytes(2)?)
        })
    }
    /// Every referenced slice: (id, size, references), by id.
    fn each_slice_ref(&mut self, f: &mut dyn FnMut(u64, u32, u32) -> TxResult<()>) -> TxResult<()> {
        let sql = "SELECT id, size, refs FROM unkai_slice_ref ORDER BY id";
        self.scan(sql, &[], &mut |r| {
            f(r.int(0)? as u64, r.int(1)? as u32, r.int(2)? as u32)
        })
    }
    /// Every slice queued for deletion: (slice, when it died), by id.
    fn each_dead_slice(
        &mut self,
        f: &mut dyn FnMut(DeadSlice, Nanos) -> TxResult<()>,
    ) -> TxResult<()> {
        let sql = "SELECT id, size, died FROM unkai_dead_slice ORDER BY id";
        self.scan(sql, &[], &mut |r| {
            let d = DeadSlice {
                id: r.int(0)? as u64,
                size: r.int(1)? as u32,
            };
            f(d, r.int(2)?)
        })
    }
    /// Records the volume setting `name`, recorded before or not.
    fn put_setting(&mut self, name: &str, value: &str) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_setting (name, value) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            &[Val::Text(name), Val::Text(value)],
        )?;
        Ok(())
    }
    /// Sets the setting `name` to `value` if it still holds `old` (`None`: if it is not
    /// recorded); whether it did. Of two transactions racing to do it, one does (a claim).
    fn swap_setting(&mut self, name: &str, old: Option<&str>, value: &str) -> TxResult<bool> {
        let n = match old {
            None => self.exec(
                "INSERT INTO unkai_setting (name, value) VALUES ($1, $2)
                 ON CONFLICT (name) DO NOTHING",
                &[Val::Text(name), Val::Text(value)],
            )?,
            Some(old) => self.exec(
                "UPDATE unkai_setting SET value=$2 WHERE name=$1 AND value=$3",
                &[Val::Text(name), Val::Text(value), Val::Text(old)],
            )?,
        };
        Ok(n > 0)
    }
    /// Adds `delta` to the counter `name`, recorded before or not (counters a volume gained
    /// after it was formatted: `trashPurgedEarly`).
    fn bump_counter(&mut self, name: &str, delta: i64) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_counter (name, value) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET value = unkai_counter.value + excluded.value",
            &[Val::Text(name), Val::Int(delta)],
        )?;
        Ok(())
    }
    /// Sets the counter `name`, recorded before or not.
    fn put_counter(&mut self, name: &str, value: i64) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_counter (name, value) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            &[Val::Text(name), Val::Int(value)],
        )?;
        Ok(())
    }
    /// Inserts a chunk's records (a chunk the inode does not have yet).
    fn insert_chunk(&mut self, i: Ino, index: u32, recs: &[SliceRec]) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_chunk (ino, indx, slices) VALUES ($1, $2, $3)",
            &[
                ino(i),
                Val::Int(index as i64),
                Val::Bytes(&slice::encode(recs)),
            ],
        )?;
        Ok(())
    }
    /// Inserts a slice's reference count as it is (a slice not recorded yet).
    fn insert_slice_ref(&mut self, id: u64, size: u32, refs: u32) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_slice_ref (id, size, refs) VALUES ($1, $2, $3)",
            &[
                Val::Int(id as i64),
                Val::Int(size as i64),
                Val::Int(refs as i64),
            ],
        )?;
        Ok(())
    }
    /// Queues a slice for deletion, dead since `died` (a slice not recorded yet).
    fn insert_dead_slice(&mut self, d: DeadSlice, died: Nanos) -> TxResult<()> {
        self.exec(
            "INSERT INTO unkai_dead_slice (id, size, died) VALUES ($1, $2, $3)",
            &[
                Val::Int(d.id as i64),
                Val::Int(d.size as i64),
                Val::Int(died),
            ],
        )?;
        Ok(())
    }
}
