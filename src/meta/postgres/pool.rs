//! Connections to a PostgreSQL volume's database: a bounded pool of our own, each connection
//! with its prepared statements, and the driver's errors as the engine reports them.
//!
//! A connection is rust-postgres' asynchronous client on a runtime of its own (as the
//! synchronous client is), so that it can pipeline ([`Conn::pipeline`]): several statements
//! sent in one message and their answers read together, one round trip for all. Every
//! exchange is counted (`TxStats::round_trip`).
//!
//! Not for: transactions or SQL of operations (the engine, `postgres`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use ::postgres::error::SqlState;
use ::postgres::types::ToSql;
use futures::StreamExt;
use parking_lot::{Condvar, Mutex};
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::{Client, Row, SimpleQueryMessage, Statement};

use super::tls::TlsPlan;
use super::url::PgUrl;
use crate::meta::engine::{TxError, TxResult, TxStats};
use crate::meta::{Attr, Error, Ino, Result};

/// Connections one client keeps at most for its operations, unless the URL says
/// (`pool_max=N`). Its listening connection (`watch`) is one more.
pub(super) const POOL_SIZE: usize = 8;

/// How long a connection beyond the first stays open unused before it is closed, unless the
/// URL says (`pool_idle=SECONDS`): an idle client gives the server's slots back.
pub(super) const IDLE_CLOSE: Duration = Duration::from_secs(60);

/// How long a server may leave what was sent unacknowledged (TCP), or a connection silent,
/// before the connection counts as lost.
const SILENT_PEER: Duration = Duration::from_secs(10);

/// After the server refused a connection for want of slots, how long the client makes do
/// with the connections it has before it asks for one more again.
const FULL_BACKOFF: Duration = Duration::from_secs(1);

/// Whether the server refused a connection because it has no slot left: `too many clients
/// already`, or the remaining slots are reserved (for superusers, or for roles with
/// pg_use_reserved_connections). Both are SQLSTATE 53300.
fn no_slot_left(e: &PgError) -> bool {
    e.code() == Some(&SqlState::TOO_MANY_CONNECTIONS)
        || e.as_db_error().is_some_and(|d| {
            d.message().contains("too many clients")
                || d.message()
                    .contains("remaining connection slots are reserved")
        })
}

pub(super) type P<'a> = &'a (dyn ToSql + Sync);
pub(super) type PgError = tokio_postgres::Error;

/// The whole message of a driver error (its `Display` alone says only "db error").
pub(super) fn pg_msg(e: &PgError) -> String {
    if let Some(db) = e.as_db_error() {
        let mut m = format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
        if let Some(d) = db.detail() {
            m.push_str(&format!("; {d}"));
        }
        return m;
    }
    let mut m = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        m.push_str(&format!(": {s}"));
        src = s.source();
    }
    m
}

pub(super) fn pg_err(e: PgError) -> Error {
    match e.code() {
        Some(c) if *c == SqlState::DISK_FULL => Error::Sys(libc::ENOSPC),
        _ => Error::Engine(pg_msg(&e)),
    }
}

/// Whether `e` ended its connection: the connection closed or broke, or the server ended the
/// session (a FATAL error: a shutdown, a crash of the server, an administrator's kill). Such
/// a connection is never used again; whether a change sent on it was committed is unknown.
pub(super) fn ends_connection(e: &PgError) -> bool {
    e.is_closed()
        || e.as_db_error()
            .is_some_and(|d| matches!(d.severity(), "FATAL" | "PANIC"))
        || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

/// A conflict with another transaction (deadlock, serialization failure): run it again.
impl From<PgError> for TxError {
    fn from(e: PgError) -> Self {
        match e.code() {
            // (A division by zero is the check of inodes guessed (`known`) failing.)
            Some(c)
                if *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED
                    || *c == SqlState::DIVISION_BY_ZERO =>
            {
                TxError::Conflict(pg_msg(&e))
            }
            _ => TxError::Meta(pg_err(e)),
        }
    }
}

/// One statement of a pipeline.
pub(super) enum Step<'a> {
    /// Statements of the simple protocol (no parameters; several in one string), answered
    /// with their rows as text.
    Simple(&'a str),
    /// A prepared statement, answered with its rows.
    Rows(&'a Statement, &'a [P<'a>]),
    /// A prepared statement, answered with the number of rows it changed.
    Count(&'a Statement, &'a [P<'a>]),
}

/// The answer to a [`Step`].
pub(super) enum Answer {
    Simple(Vec<SimpleQueryMessage>),
    Rows(Vec<Row>),
    Count(u64),
}

type Io = Pin<Box<dyn Future<Output = std::result::Result<(), PgError>> + Send>>;

/// Runs `fut` to its end on `rt`, driving the connection's I/O meanwhile.
fn drive<T>(rt: &tokio::runtime::Runtime, io: &mut Option<Io>, fut: impl Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    rt.block_on(std::future::poll_fn(|cx| {
        if let Some(d) = io {
            if d.as_mut().poll(cx).is_ready() {
                // Closed: the client's requests fail from now on.
                *io = None;
            }
        }
        fut.as_mut().poll(cx)
    }))
}

/// Where this client's commits that did not wait for the WAL flush (lazy ones) went since
/// the last flush: they are durable once a flush commits after them on the same server.
/// A flush that commits on another server (a standby promoted meanwhile, the server
/// restarted) cannot vouch for them: they may be lost, and that flush says so (EIO), once.
#[derive(Default)]
pub(super) struct Unflushed {
    /// The server of the lazy commits since the last flush (None: there were none).
    server: Option<Arc<str>>,
    /// Whether they went to more than one server.
    mixed: bool,
    /// Whether a flush that cannot vouch for them only says so in the log: the client is
    /// ending its session, and no application waits for the answer ([`Pool::closing`]).
    quiet: bool,
}

impl Unflushed {
    fn add(&mut self, server: &Arc<str>) {
        match &self.server {
            None => self.server = Some(server.clone()),
            Some(s) if s != server => self.mixed = true,
            Some(_) => {}
        }
    }

    fn merge(&mut self, other: Unflushed) {
        if let Some(s) = &other.server {
            self.add(s);
        }
        self.mixed |= other.mixed;
    }
}

/// An entry by its directory and name.
pub(super) type Named = (Ino, Vec<u8>);

/// One connection and the statements prepared on it. Every exchange with the server goes
/// through its methods, which count it.
pub(super) struct Conn {
    client: Client,
    /// The connection's I/O, polled while we wait for answers (None once it ended).
    io: Option<Io>,
    rt: tokio::runtime::Runtime,
    stats: Arc<TxStats>,
    /// Which server (and which run of it) this connection reaches: its address, port and
    /// start time.
    server: Arc<str>,
    /// The client's commits not yet covered by a flush (shared by its connections).
    unflushed: Arc<Mutex<Unflushed>>,
    stmts: HashMap<&'static str, Statement>,
    /// Inodes locked (and read) by the statement that began the current transaction, not yet
    /// handed out: [`lock_node`] takes them from here instead of asking again.
    pub(super) prelocked: HashMap<Ino, Attr>,
    /// Inodes locked by that statement which have no default ACL (read with the lock, and
    /// true while it is held: every change of an inode's xattrs locks the inode first).
    pub(super) no_default_acl: HashSet<Ino>,
    /// An exchange failed in a way that ended the connection ([`ends_connection`]).
    lost: bool,
    /// Since it was lent: whether a statement was sent (preparing one aside), i.e. whether a
    /// change may have been made by this lender.
    sent: bool,
    /// Since it was lent: whether a COMMIT was sent (set by the engine when it sends one).
    /// A connection lost after that leaves the transaction's outcome unknown.
    pub(super) commit_sent: bool,
    /// Entries (and their inodes, locked) read by that statement, for `lock_entry`.
    pub(super) entries: HashMap<Named, Option<(i64, Attr)>>,
    /// Entries looked up by that statement, for `get_edge`.
    pub(super) edges: HashMap<Named, Option<(i64, Ino)>>,
    /// Whether directories were empty, read by that statement after their lock, for
    /// `dir_is_empty`.
    pub(super) empty: HashMap<Ino, bool>,
    /// Inodes the current transaction took as this client last knew them (see `known`),
    /// besides those of its first statement.
    pub(super) guessed: Vec<Ino>,
    /// Inodes read under a shared lock (`FOR KEY SHARE`: the trash's hour directory), which
    /// the transaction changes only in place and last (`Txn::touch_dir`).
    pub(super) shared: HashMap<Ino, Attr>,
}

impl Conn {
    /// Forgets what the statement that began a transaction read.
    pub(super) fn forget_prefetched(&mut self) {
        self.prelocked.clear();
        self.no_default_acl.clear();
        self.entries.clear();
        self.edges.clear();
        self.empty.clear();
        self.guessed.clear();
        self.shared.clear();
    }
}

impl Conn {
    /// Whether the connection is gone: closed, or lost in an exchange.
    pub(super) fn is_closed(&self) -> bool {
        self.lost || self.client.is_closed()
    }

    /// Whether the connection is still usable, as far as can be told without an exchange:
    /// whatever the server sent meanwhile is read first (an idle connection learns here that
    /// its server shut down or went away).
    fn alive(&mut self) -> bool {
        if !self.is_closed() {
            let Conn { io, rt, .. } = self;
            drive(rt, io, std::future::ready(()));
        }
        !self.is_closed()
    }

    /// Notes a lazy commit (one that did not wait for the WAL flush) just made on this
    /// connection, for the next flush to check ([`Conn::flush_covers`]).
    pub(super) fn committed_lazily(&self) {
        self.unflushed.lock().add(&self.server);
    }

    /// Runs `flush`, a commit that waits for the WAL flush, and checks that it covers the
    /// lazy commits made before it: they went to the server it committed on. If they did not
    /// (a failover or a restart came between), they may be lost: an error, reported by this
    /// flush only. A flush that fails leaves them for the next one.
    pub(super) fn flush_covers<T>(
        &mut self,
        flush: impl FnOnce(&mut Conn) -> TxResult<T>,
    ) -> TxResult<T> {
        let (before, quiet) = {
            let mut u = self.unflushed.lock();
            let quiet = u.quiet;
            (
                std::mem::replace(
                    &mut *u,
                    Unflushed {
                        quiet,
                        ..Unflushed::default()
                    },
                ),
                quiet,
            )
        };
        match flush(self) {
            Ok(v) => match before.server {
                Some(s) if before.mixed || s != self.server => {
                    let why = format!(
                        "changes not yet flushed may be lost: they were committed on {s}, and \
                         the database now answers from {} (a failover or a restart came \
                         between)",
                        self.server
                    );
                    if quiet {
                        tracing::warn!("{why}");
                        return Ok(v);
                    }
                    Err(TxError::Meta(Error::Engine(why)))
                }
                _ => Ok(v),
            },
            Err(e) => {
                self.unflushed.lock().merge(before);
                Err(e)
            }
        }
    }

    /// Whether something other than preparing a statement was sent since it was lent.
    pub(super) fn sent(&self) -> bool {
        self.sent
    }

    /// Notes the outcome of an exchange: an error that ended the connection marks it lost.
    fn note<T>(&mut self, r: std::result::Result<T, PgError>) -> std::result::Result<T, PgError> {
        if let Err(e) = &r {
            if ends_connection(e) {
                self.lost = true;
            }
        }
        r
    }

    /// The statement `sql`, prepared on this connection (a round trip the first time).
    pub(super) fn stmt(&mut self, sql: &'static str) -> std::result::Result<Statement, PgError> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        self.stats.round_trip();
        let Conn { client, io, rt, .. } = self;
        let r = drive(rt, io, client.prepare(sql));
        let s = self.note(r)?;
        self.stmts.insert(sql, s.clone());
        Ok(s)
    }

    /// Sends `steps` in one message and reads their answers (one round trip), in order. The
    /// answers of the steps sent: all of them, unless one could not be sent (its parameters
    /// did not encode, the connection is closed), which ends the list with its error (the
    /// steps after it are not sent). A step that fails on the server fails the transaction
    /// it is in: later steps in it fail too, a COMMIT among them rolls back.
    pub(super) fn pipeline(
        &mut self,
        steps: &[Step<'_>],
    ) -> Vec<std::result::Result<Answer, PgError>> {
        self.stats.round_trip();
        self.sent = true;
        let Conn { client, io, rt, .. } = self;
        let client = &*client;
        type Fut<'f> = Pin<Box<dyn Future<Output = std::result::Result<Answer, PgError>> + 'f>>;
        let mut futs: Vec<Fut<'_>> = steps
            .iter()
            .map(|s| -> Fut<'_> {
                match *s {
                    Step::Simple(q) => {
                        Box::pin(async move { client.simple_query(q).await.map(Answer::Simple) })
                    }
                    Step::Rows(st, p) => {
                        Box::pin(async move { client.query(st, p).await.map(Answer::Rows) })
                    }
                    Step::Count(st, p) => {
                        Box::pin(async move { client.execute(st, p).await.map(Answer::Count) })
                    }
                }
            })
            .collect();
        let n = futs.len();
        let mut out: Vec<Option<std::result::Result<Answer, PgError>>> =
            (0..n).map(|_| None).collect();
        // A step is sent when first polled: in order, and none after one that failed then.
        let (mut sent, mut stop) = (0, false);
        drive(
            rt,
            io,
            std::future::poll_fn(|cx| {
                let mut waiting = false;
                for i in 0..n {
                    if out[i].is_some() {
                        continue;
                    }
                    if i >= sent {
                        if stop {
                            break;
                        }
                        sent = i + 1;
                    }
                    match futs[i].as_mut().poll(cx) {
                        Poll::Ready(r) => {
                            stop |= r.is_err() && i + 1 == sent;
                            out[i] = Some(r);
                        }
                        Poll::Pending => waiting = true,
                    }
                }
                match waiting {
                    true => Poll::Pending,
                    false => Poll::Ready(()),
                }
            }),
        );
        let out: Vec<_> = out
            .into_iter()
            .take(sent)
            .map(|o| o.expect("every step sent is answered"))
            .collect();
        if out.iter().any(|r| r.as_ref().is_err_and(ends_connection)) {
            self.lost = true;
        }
        out
    }

    /// One step alone (one round trip).
    fn one(&mut self, step: Step<'_>) -> std::result::Result<Answer, PgError> {
        self.pipeline(&[step])
            .pop()
            .expect("a step sent alone is answered")
    }

    pub(super) fn query(&mut self, sql: &'static str, p: &[P<'_>]) -> TxResult<Vec<Row>> {
        let s = self.stmt(sql)?;
        match self.one(Step::Rows(&s, p))? {
            Answer::Rows(r) => Ok(r),
            _ => unreachable!("rows asked"),
        }
    }

    pub(super) fn execute(&mut self, sql: &'static str, p: &[P<'_>]) -> TxResult<u64> {
        let s = self.stmt(sql)?;
        match self.one(Step::Count(&s, p))? {
            Answer::Count(n) => Ok(n),
            _ => unreachable!("a count asked"),
        }
    }

    /// Streams the rows of a query to `f`.
    pub(super) fn stream<Q: ToSql + Sync>(
        &mut self,
        sql: &'static str,
        p: &[Q],
        mut f: impl FnMut(&Row) -> TxResult<()>,
    ) -> TxResult<()> {
        let s = self.stmt(sql)?;
        self.stats.round_trip();
        self.sent = true;
        let mut ended = false;
        let Conn { client, io, rt, .. } = self;
        let client = &*client;
        let mut mark = |e: &PgError| ended |= ends_connection(e);
        let r = drive(rt, io, async {
            let params: Vec<P<'_>> = p.iter().map(|q| q as P<'_>).collect();
            let rows = client.query_raw(&s, params).await.inspect_err(&mut mark)?;
            let mut rows = std::pin::pin!(rows);
            while let Some(r) = rows.next().await {
                f(&r.inspect_err(&mut mark)?)?;
            }
            Ok(())
        });
        self.lost |= ended;
        r
    }

    /// Statements of the simple protocol in one message (one round trip), without results.
    pub(super) fn batch(&mut self, sql: &str) -> std::result::Result<(), PgError> {
        self.one(Step::Simple(sql)).map(|_| ())
    }

    /// Statements of the simple protocol in one message (one round trip), with their rows.
    pub(super) fn simple(
        &mut self,
        sql: &str,
    ) -> std::result::Result<Vec<SimpleQueryMessage>, PgError> {
        match self.one(Step::Simple(sql))? {
            Answer::Simple(m) => Ok(m),
            _ => unreachable!("a simple query asked"),
        }
    }

    /// A statement not kept prepared (setup and upgrades: run once), with its rows.
    pub(super) fn once(
        &mut self,
        sql: &str,
        p: &[P<'_>],
    ) -> std::result::Result<Vec<Row>, PgError> {
        self.stats.round_trip();
        self.sent = true;
        let Conn { client, io, rt, .. } = self;
        let r = drive(rt, io, client.query(sql, p));
        self.note(r)
    }
}

pub(super) struct PoolState {
    /// Idle connections and since when each is, the most recently returned last.
    pub(super) idle: Vec<(Conn, Instant)>,
    /// Connections in existence: idle, lent, or being opened.
    pub(super) total: usize,
    /// Until when no new connection is asked for: the server last refused one for want of
    /// slots, and the client waits for one of its own instead.
    full_until: Option<Instant>,
    /// Whether that wait was logged (once per client).
    said_full: bool,
}

impl PoolState {
    pub(super) fn new() -> PoolState {
        PoolState {
            idle: Vec::new(),
            total: 0,
            full_until: None,
            said_full: false,
        }
    }

    /// Closes the connections idle for `limit` or more, keeping one connection at least.
    fn close_idle(&mut self, limit: Duration) {
        let now = Instant::now();
        while self.total > 1 && self.idle.first().is_some_and(|(_, t)| now - *t >= limit) {
            self.idle.remove(0);
            self.total -= 1;
        }
    }
}

/// A bounded pool of connections: at most `pool_max` ([`POOL_SIZE`]), waiting for one to
/// come back when all are lent, or when the server has no slot left for another and the
/// client holds one at least. Connections beyond the first that stay unused for `pool_idle`
/// ([`IDLE_CLOSE`]) are closed. (r2d2 would add a dependency and a reaper thread for what is
/// a stack of connections; our connections also carry their prepared statements.)
pub(super) struct Pool {
    pub(super) config: tokio_postgres::Config,
    /// How its connections speak TLS (sslmode).
    pub(super) tls: TlsPlan,
    /// The redacted URL, for messages.
    pub(super) url: String,
    /// What its connections did (the engine's figures).
    pub(super) stats: Arc<TxStats>,
    pub(super) state: Mutex<PoolState>,
    /// Lazy commits not yet covered by a flush (see [`Unflushed`]).
    unflushed: Arc<Mutex<Unflushed>>,
    returned: Condvar,
    /// Connections kept at most.
    max: usize,
    /// How long a connection beyond the first may stay unused.
    idle_close: Duration,
}

pub(super) struct Lent<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
    pub(super) broken: bool,
}

impl std::ops::Deref for Lent<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().expect("connection")
    }
}
impl std::ops::DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("connection")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        let conn = self.conn.take();
        let mut st = self.pool.state.lock();
        match conn {
            // A panic may have left a transaction open on it: never lend it again.
            Some(c) if !self.broken && !c.is_closed() && !std::thread::panicking() => {
                st.idle.push((c, Instant::now()))
            }
            Some(_) => st.total -= 1,
            // Detached: kept by its holder, still counted (see `Lent::detach`).
            None => return,
        }
        st.close_idle(self.pool.idle_close);
        drop(st);
        self.pool.returned.notify_one();
    }
}

impl Lent<'_> {
    /// The connection, kept outside the pool (still counted as this client's) until it is
    /// lent back with [`Pool::lend`]: an open group's.
    pub(super) fn detach(mut self) -> Conn {
        self.conn.take().expect("connection")
    }
}

impl Pool {
    /// `c`, detached before ([`Lent::detach`]), lent again: back in the pool when dropped.
    pub(super) fn lend(&self, c: Conn) -> Lent<'_> {
        Lent {
            pool: self,
            conn: Some(c),
            broken: false,
        }
    }

    pub(super) fn new(u: &PgUrl) -> Result<Pool> {
        let tls =
            TlsPlan::new(u).map_err(|e| Error::Refused(format!("cannot connect to {u}: {e}")))?;
        let mut config = tokio_postgres::Config::new();
        config
            .user(&u.user)
            .dbname(&u.dbname)
            .application_name("unkai")
            .ssl_mode(tls.mode)
            .connect_timeout(Duration::from_secs(u.connect_timeout.unwrap_or(30)))
            // A server that vanished without closing (a host down, a network cut) fails the
            // exchange within seconds instead of the system's minutes: the connection is then
            // dropped and the next one goes to whichever server is primary.
            .tcp_user_timeout(SILENT_PEER)
            .keepalives_idle(SILENT_PEER)
            .target_session_attrs(match u.target_session_attrs.as_deref() {
                Some("read-write") => TargetSessionAttrs::ReadWrite,
                _ => TargetSessionAttrs::Any,
            });
        // Tried in order (each with its own connect_timeout).
        for (host, port) in u.hosts() {
            config.host(host).port(port);
        }
        if let Some(pw) = u.resolve_password() {
            config.password(pw.expose());
        }
        Ok(Pool {
            config,
            tls,
            url: u.to_string(),
            stats: Arc::new(TxStats::default()),
            state: Mutex::new(PoolState::new()),
            unflushed: Arc::default(),
            returned: Condvar::new(),
            max: u.pool_max.unwrap_or(POOL_SIZE),
            idle_close: u.pool_idle.map_or(IDLE_CLOSE, Duration::from_secs),
        })
    }

    /// The client is ending its session: a flush that cannot vouch for earlier lazy commits
    /// (see [`Unflushed`]) says so in the log instead of failing, since no application waits
    /// for its answer (the unmount goes on).
    pub(super) fn closing(&self) {
        self.unflushed.lock().quiet = true;
    }

    /// A new connection (not counted in the pool).
    pub(super) fn connect(&self) -> std::result::Result<Conn, PgError> {
        self.stats.round_trip();
        // Fails only in a process out of file descriptors.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for a PostgreSQL connection");
        let (client, connection) = rt.block_on(self.config.connect(self.tls.connector.clone()))?;
        let mut io: Option<Io> = Some(Box::pin(connection));
        // Which server and which run of it: a standby promoted, or the server restarted,
        // is another (see `Unflushed`).
        self.stats.round_trip();
        let server = drive(
            &rt,
            &mut io,
            client.simple_query(
                "SELECT coalesce(host(inet_server_addr()), 'local') || ':' || \
                 coalesce(inet_server_port(), 0) || ' started ' || pg_postmaster_start_time()",
            ),
        )?
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(Arc::<str>::from),
            _ => None,
        })
        .unwrap_or_else(|| Arc::from("?"));
        Ok(Conn {
            client,
            io,
            rt,
            stats: self.stats.clone(),
            server,
            unflushed: self.unflushed.clone(),
            stmts: HashMap::new(),
            prelocked: HashMap::new(),
            no_default_acl: HashSet::new(),
            lost: false,
            sent: false,
            commit_sent: false,
            entries: HashMap::new(),
            edges: HashMap::new(),
            empty: HashMap::new(),
            guessed: Vec::new(),
            shared: HashMap::new(),
        })
    }

    pub(super) fn connect_err(&self, e: PgError) -> Error {
        if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) {
            return Error::NotFormatted(self.url.clone());
        }
        if let Some(why) = self.tls.explain(&e) {
            return Error::Engine(format!("cannot connect to {}: {why}", self.url));
        }
        Error::Engine(format!("cannot connect to {}: {}", self.url, pg_msg(&e)))
    }

    pub(super) fn get(&self) -> Result<Lent<'_>> {
        let mut st = self.state.lock();
        st.close_idle(self.idle_close);
        loop {
            if let Some((mut c, _)) = st.idle.pop() {
                // One that died while idle (its server shut down, failed over) is dropped.
                if !c.alive() {
                    st.total -= 1;
                    continue;
                }
                c.sent = false;
                c.commit_sent = false;
                return Ok(Lent {
                    pool: self,
                    conn: Some(c),
                    broken: false,
                });
            }
            let now = Instant::now();
            let full = st.total > 0 && st.full_until.is_some_and(|t| now < t);
            if st.total < self.max && !full {
                // After a refusal, one thread asks again while the others keep waiting.
                let probing = st.full_until.is_some();
                if probing {
                    st.full_until = Some(now + FULL_BACKOFF);
                }
                st.total += 1;
                drop(st);
                let e = match self.connect() {
                    Ok(c) => {
                        if probing {
                            self.state.lock().full_until = None;
                            self.returned.notify_all();
                        }
                        return Ok(Lent {
                            pool: self,
                            conn: Some(c),
                            broken: false,
                        });
                    }
                    Err(e) => e,
                };
                st = self.state.lock();
                st.total -= 1;
                self.returned.notify_one();
                // The server has no slot left: make do with the connections this client has
                // (they come back as their operations end). A client with none fails.
                if st.total == 0 || !no_slot_left(&e) {
                    return Err(self.connect_err(e));
                }
                st.full_until = Some(Instant::now() + FULL_BACKOFF);
                if !st.said_full {
                    st.said_full = true;
                    tracing::info!(
                        "{}: the server has no connection slot left ({}); operations wait for \
                         this client's {} connection(s) instead (raise max_connections, or \
                         lower pool_max in the URL)",
                        self.url,
                        pg_msg(&e),
                        st.total
                    );
                }
            }
            match st.full_until {
                Some(t) if st.total > 0 && st.total < self.max => {
                    self.stats.conn_waited();
                    // Woken by a connection coming back, else asks the server again then.
                    self.returned.wait_until(&mut st, t);
                }
                _ => self.returned.wait(&mut st),
            }
        }
    }
}

/// Connects to the database of `u`, creating the database first if it does not exist (and
/// the user may).
pub(super) fn connect_creating(u: &PgUrl, pool: &Pool) -> Result<Conn> {
    match pool.connect() {
        Ok(c) => Ok(c),
        Err(e) if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
            let mut admin_url = u.clone();
            admin_url.dbname = "postgres".into();
            let admin = Pool::new(&admin_url)?;
            let mut a = admin.connect().map_err(|e2| {
                Error::Refused(format!(
                    "database '{}' does not exist at {} and cannot be created ({}); create it \
                     (createdb {}) and format again",
                    u.dbname,
                    pool.url,
                    pg_msg(&e2),
                    u.dbname
                ))
            })?;
            let quoted = format!("\"{}\"", u.dbname.replace('"', "\"\""));
            a.batch(&format!("CREATE DATABASE {quoted}"))
                .map_err(|e2| {
                    Error::Refused(format!(
                        "database '{}' does not exist at {} and cannot be created ({}); create \
                         it (createdb {}) and format again",
                        u.dbname,
                        pool.url,
                        pg_msg(&e2),
                        u.dbname
                    ))
                })?;
            eprintln!("unkai: created database '{}'", u.dbname);
            pool.connect().map_err(|e| pool.connect_err(e))
        }
        Err(e) => Err(pool.connect_err(e)),
    }
}
