//! Connections to a PostgreSQL volume's database: a bounded pool of our own, each
//! connection with its prepared statements, and the driver's errors as the engine reports
//! them.
//!
//! Not for: transactions or SQL of operations (the engine, `postgres`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ::postgres::error::SqlState;
use ::postgres::fallible_iterator::FallibleIterator;
use ::postgres::types::ToSql;
use ::postgres::{Client, Row, Statement};
use parking_lot::{Condvar, Mutex};

use super::tls::TlsPlan;
use super::url::PgUrl;
use crate::meta::engine::{TxError, TxResult, TxStats};
use crate::meta::{Attr, Error, Ino, Result};

/// Connections one client keeps at most.
const POOL_SIZE: usize = 8;

pub(super) type P<'a> = &'a (dyn ToSql + Sync);

/// The whole message of a driver error (its `Display` alone says only "db error").
pub(super) fn pg_msg(e: &::postgres::Error) -> String {
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

pub(super) fn pg_err(e: ::postgres::Error) -> Error {
    match e.code() {
        Some(c) if *c == SqlState::DISK_FULL => Error::Sys(libc::ENOSPC),
        _ => Error::Engine(pg_msg(&e)),
    }
}

/// A conflict with another transaction (deadlock, serialization failure): run it again.
impl From<::postgres::Error> for TxError {
    fn from(e: ::postgres::Error) -> Self {
        match e.code() {
            Some(c)
                if *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED =>
            {
                TxError::Conflict(pg_msg(&e))
            }
            _ => TxError::Meta(pg_err(e)),
        }
    }
}

/// One connection and the statements prepared on it. Every exchange with the server goes
/// through its methods, which count it (`TxStats::round_trip`).
pub(super) struct Conn {
    pub(super) client: Client,
    stats: Arc<TxStats>,
    stmts: HashMap<&'static str, Statement>,
    /// Inodes locked (and read) by the statement that began the current transaction, not yet
    /// handed out: [`lock_node`] takes them from here instead of asking again.
    pub(super) prelocked: HashMap<Ino, Attr>,
    /// Inodes locked by that statement which have no default ACL (read with the lock, and
    /// true while it is held: every change of an inode's xattrs locks the inode first).
    pub(super) no_default_acl: HashSet<Ino>,
}

impl Conn {
    pub(super) fn stmt(
        &mut self,
        sql: &'static str,
    ) -> std::result::Result<Statement, ::postgres::Error> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        self.stats.round_trip();
        let s = self.client.prepare(sql)?;
        self.stmts.insert(sql, s.clone());
        Ok(s)
    }

    pub(super) fn query(&mut self, sql: &'static str, p: &[P<'_>]) -> TxResult<Vec<Row>> {
        let s = self.stmt(sql)?;
        self.stats.round_trip();
        Ok(self.client.query(&s, p)?)
    }

    pub(super) fn query_opt(&mut self, sql: &'static str, p: &[P<'_>]) -> TxResult<Option<Row>> {
        let s = self.stmt(sql)?;
        self.stats.round_trip();
        Ok(self.client.query_opt(&s, p)?)
    }

    pub(super) fn query_one(&mut self, sql: &'static str, p: &[P<'_>]) -> TxResult<Row> {
        let s = self.stmt(sql)?;
        self.stats.round_trip();
        Ok(self.client.query_one(&s, p)?)
    }

    pub(super) fn execute(&mut self, sql: &'static str, p: &[P<'_>]) -> TxResult<u64> {
        let s = self.stmt(sql)?;
        self.stats.round_trip();
        Ok(self.client.execute(&s, p)?)
    }

    /// Streams the rows of a query to `f`.
    pub(super) fn stream<Q: ToSql>(
        &mut self,
        sql: &'static str,
        p: &[Q],
        mut f: impl FnMut(&Row) -> TxResult<()>,
    ) -> TxResult<()> {
        let s = self.stmt(sql)?;
        self.stats.round_trip();
        let mut it = self.client.query_raw(&s, p)?;
        while let Some(r) = it.next()? {
            f(&r)?;
        }
        Ok(())
    }

    /// Statements of the simple protocol in one message (one round trip), without results.
    pub(super) fn batch(&mut self, sql: &str) -> std::result::Result<(), ::postgres::Error> {
        self.stats.round_trip();
        self.client.batch_execute(sql)
    }

    /// Statements of the simple protocol in one message (one round trip), with their rows.
    pub(super) fn simple(
        &mut self,
        sql: &str,
    ) -> std::result::Result<Vec<::postgres::SimpleQueryMessage>, ::postgres::Error> {
        self.stats.round_trip();
        self.client.simple_query(sql)
    }

    /// A statement not prepared (setup and upgrades: run once), with its rows.
    pub(super) fn once(
        &mut self,
        sql: &str,
        p: &[P<'_>],
    ) -> std::result::Result<Vec<Row>, ::postgres::Error> {
        self.stats.round_trip();
        self.client.query(sql, p)
    }
}

pub(super) struct PoolState {
    pub(super) idle: Vec<Conn>,
    /// Connections in existence: idle, lent, or being opened.
    pub(super) total: usize,
}

/// A bounded pool of connections: at most [`POOL_SIZE`], waiting for one to come back when
/// all are lent. (r2d2 would add a dependency and a reaper thread for what is a stack of
/// connections; our connections also carry their prepared statements.)
pub(super) struct Pool {
    pub(super) config: ::postgres::Config,
    /// How its connections speak TLS (sslmode).
    pub(super) tls: TlsPlan,
    /// The redacted URL, for messages.
    pub(super) url: String,
    /// What its connections did (the engine's figures).
    pub(super) stats: Arc<TxStats>,
    pub(super) state: Mutex<PoolState>,
    returned: Condvar,
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
            Some(c) if !self.broken && !c.client.is_closed() && !std::thread::panicking() => {
                st.idle.push(c)
            }
            _ => st.total -= 1,
        }
        drop(st);
        self.pool.returned.notify_one();
    }
}

impl Pool {
    pub(super) fn new(u: &PgUrl) -> Result<Pool> {
        let tls =
            TlsPlan::new(u).map_err(|e| Error::Refused(format!("cannot connect to {u}: {e}")))?;
        let mut config = ::postgres::Config::new();
        config
            .user(&u.user)
            .host(&u.host)
            .port(u.port)
            .dbname(&u.dbname)
            .application_name("unkai")
            .ssl_mode(tls.mode)
            .connect_timeout(Duration::from_secs(u.connect_timeout.unwrap_or(30)));
        if let Some(pw) = u.resolve_password() {
            config.password(pw.expose());
        }
        Ok(Pool {
            config,
            tls,
            url: u.to_string(),
            stats: Arc::new(TxStats::default()),
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                total: 0,
            }),
            returned: Condvar::new(),
        })
    }

    /// A new connection (not counted in the pool).
    pub(super) fn connect(&self) -> std::result::Result<Conn, ::postgres::Error> {
        self.stats.round_trip();
        let client = self.config.connect(self.tls.connector.clone())?;
        Ok(Conn {
            client,
            stats: self.stats.clone(),
            stmts: HashMap::new(),
            prelocked: HashMap::new(),
            no_default_acl: HashSet::new(),
        })
    }

    pub(super) fn connect_err(&self, e: ::postgres::Error) -> Error {
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
        loop {
            if let Some(c) = st.idle.pop() {
                if c.client.is_closed() {
                    st.total -= 1;
                    continue;
                }
                return Ok(Lent {
                    pool: self,
                    conn: Some(c),
                    broken: false,
                });
            }
            if st.total < POOL_SIZE {
                st.total += 1;
                drop(st);
                return match self.connect() {
                    Ok(c) => Ok(Lent {
                        pool: self,
                        conn: Some(c),
                        broken: false,
                    }),
                    Err(e) => {
                        self.state.lock().total -= 1;
                        self.returned.notify_one();
                        Err(self.connect_err(e))
                    }
                };
            }
            self.returned.wait(&mut st);
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
