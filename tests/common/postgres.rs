//! PostgreSQL for the tests, chosen by `UNKAI_TEST_POSTGRES`:
//! - unset: the PostgreSQL variants of the tests are skipped (they say so);
//! - `local`: a private server is started with `scripts/postgres.sh start` in a temporary
//!   directory, on a free port of 127.0.0.1, shared by the tests of one binary while any of
//!   them runs, and stopped (`scripts/postgres.sh stop`) when the last one is done;
//! - a `postgres://` URL: that server (its user must be allowed to create databases).
//!
//! Every test gets a database of its own, dropped when its guard drops.
//!
//! Servers with TLS ([`tls_server`]) are started only with `local`: `scripts/postgres.sh
//! certs` makes them a CA of their own (the openssl CLI) and a certificate it signs.
//!
//! Also compiled into the crate's unit tests (src/meta/tests/mod.rs includes this file).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

pub const ENV: &str = "UNKAI_TEST_POSTGRES";

/// Whether PostgreSQL tests run (else they are skipped).
pub fn enabled() -> bool {
    std::env::var(ENV).is_ok_and(|v| !v.is_empty())
}

/// Prints why a test is skipped; true if it must be.
pub fn skip() -> bool {
    if enabled() {
        return false;
    }
    eprintln!("skipped: {ENV} is unset (set it to `local` or a postgres:// admin URL)");
    true
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres.sh")
}

/// A private server; stopped (and its directory removed) on drop.
pub struct Server {
    dir: tempfile::TempDir,
    /// The URL of its `postgres` database, as superuser `unkai`.
    pub admin: String,
}

impl Server {
    fn start() -> Server {
        Server::start_in(
            tempfile::Builder::new()
                .prefix("unkai-pg-")
                .tempdir()
                .expect("tempdir"),
        )
    }

    /// A server with `ssl=on`, its certificate (for `san`, e.g. `IP:127.0.0.1,DNS:localhost`)
    /// signed by a CA of its own: [`Server::ca`].
    fn start_tls(san: &str) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("unkai-pgtls-")
            .tempdir()
            .expect("tempdir");
        let out = Command::new(script())
            .arg("certs")
            .arg(dir.path())
            .arg(san)
            .output()
            .expect("run scripts/postgres.sh certs");
        assert!(
            out.status.success(),
            "scripts/postgres.sh certs failed (is openssl installed?): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Server::start_in(dir)
    }

    /// The PEM file of the CA that signed a TLS server's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn start_in(dir: tempfile::TempDir) -> Server {
        Self::start_with(dir, false)
    }

    fn start_with(dir: tempfile::TempDir, durable: bool) -> Server {
        Self::start_opts(dir, durable, None)
    }

    /// Starts a server in `dir`; `durable`: with PostgreSQL's own settings (fsync and
    /// synchronous_commit on) instead of the tests' fast ones; `max_connections` unless the
    /// script's (300).
    fn start_opts(dir: tempfile::TempDir, durable: bool, max_connections: Option<u32>) -> Server {
        let mut cmd = Command::new(script());
        if let Some(n) = max_connections {
            cmd.env("PG_MAX_CONNECTIONS", n.to_string());
        }
        let out = cmd
            .arg("start")
            .arg(dir.path())
            .env("PG_DURABLE", if durable { "1" } else { "" })
            .output()
            .expect("run scripts/postgres.sh");
        assert!(
            out.status.success(),
            "scripts/postgres.sh start failed (install PostgreSQL with `scripts/postgres.sh \
             install`): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let admin = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            admin.starts_with("postgres://"),
            "unexpected output: {admin}"
        );
        Server { dir, admin }
    }
}

impl Server {
    /// Its port (from its URL).
    pub fn port(&self) -> u16 {
        let after = self.admin.split_once("@127.0.0.1:").expect("a local URL").1;
        after.split('/').next().unwrap().parse().expect("a port")
    }

    /// Stops it as a crash would (`pg_ctl stop -m immediate`: no checkpoint, nothing
    /// written that was not yet).
    pub fn crash(&self) {
        let out = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .output()
            .expect("run scripts/postgres.sh stop");
        assert!(out.status.success(), "{out:?}");
    }

    /// Starts it again after [`Server::crash`], on the same port, as it was started
    /// (durable or not: `durable`).
    pub fn restart(&self, durable: bool) {
        let out = Command::new(script())
            .arg("start")
            .arg(self.dir.path())
            .arg(self.port().to_string())
            .env("PG_DURABLE", if durable { "1" } else { "" })
            .output()
            .expect("run scripts/postgres.sh start");
        assert!(
            out.status.success(),
            "restart failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A private server of one test with PostgreSQL's durable settings (fsync and
/// synchronous_commit on, as a real server runs), which the test may crash and restart;
/// None, saying so, unless UNKAI_TEST_POSTGRES=local.
pub fn durable_server() -> Option<Arc<Server>> {
    if std::env::var(ENV).as_deref() != Ok("local") {
        eprintln!(
            "skipped: tests that crash PostgreSQL start servers of their own, only with {ENV}=local"
        );
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("unkai-pgdur-")
        .tempdir()
        .expect("tempdir");
    Some(Arc::new(Server::start_with(dir, true)))
}

/// A primary and a streaming standby of it (`scripts/postgres.sh standby`), both private to
/// one test and durable (PostgreSQL's own settings), the primary committing synchronously: a
/// commit that waits for the WAL flush also waits until the standby has flushed it. None,
/// saying so, unless UNKAI_TEST_POSTGRES=local.
pub fn primary_and_standby() -> Option<(Arc<Server>, Arc<Server>)> {
    if std::env::var(ENV).as_deref() != Ok("local") {
        eprintln!("skipped: failover tests start servers of their own, only with {ENV}=local");
        return None;
    }
    let dir = |prefix| {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("tempdir")
    };
    let primary = Arc::new(Server::start_with(dir("unkai-pgpri-"), true));
    let sdir = dir("unkai-pgsby-");
    let out = Command::new(script())
        .arg("standby")
        .arg(primary.dir.path())
        .arg(sdir.path())
        .env("PG_DURABLE", "1")
        .output()
        .expect("run scripts/postgres.sh standby");
    // Dropped (stopped) on every path from here: a failed start leaves nothing running.
    let standby = Server {
        dir: sdir,
        admin: String::from_utf8_lossy(&out.stdout).trim().to_string(),
    };
    assert!(
        out.status.success() && standby.admin.starts_with("postgres://"),
        "scripts/postgres.sh standby failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((primary, Arc::new(standby)))
}

impl Server {
    /// Promotes a standby to a primary (`pg_ctl promote`, waiting until it accepts writes).
    pub fn promote(&self) {
        let out = Command::new(script())
            .arg("promote")
            .arg(self.dir.path())
            .output()
            .expect("run scripts/postgres.sh promote");
        assert!(
            out.status.success(),
            "promote failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A private server of one test with `max_connections` (PostgreSQL's default is 100; three
/// of them are kept for superusers); None, saying so, unless UNKAI_TEST_POSTGRES=local.
pub fn server_with_max_connections(n: u32) -> Option<Arc<Server>> {
    if std::env::var(ENV).as_deref() != Ok("local") {
        eprintln!(
            "skipped: tests of max_connections start servers of their own, only with {ENV}=local"
        );
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("unkai-pgmax-")
        .tempdir()
        .expect("tempdir");
    Some(Arc::new(Server::start_opts(dir, false, Some(n))))
}

/// A new database on `server` owned by `role`, an ordinary role (no superuser: it gets no
/// reserved connection slot) made with password `password` if it does not exist; the
/// database's URL logs in as that role.
pub fn database_for_role(server: &Arc<Server>, role: &str, password: &str) -> TestDb {
    let name = fresh_name();
    let mut admin = TestDb::admin_client(&server.admin);
    let exists = !admin
        .query("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
        .expect("look the role up")
        .is_empty();
    if !exists {
        admin
            .batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
            .expect("create role");
    }
    admin
        .batch_execute(&format!("CREATE DATABASE {name} OWNER {role}"))
        .expect("create database");
    let (base, _) = split_password(&server.admin);
    let url = with_db(&base, &name).replacen("://unkai@", &format!("://{role}:{password}@"), 1);
    TestDb {
        url,
        name,
        admin: server.admin.clone(),
        _server: Some(server.clone()),
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

fn shared_server() -> Arc<Server> {
    static SERVER: Mutex<Weak<Server>> = Mutex::new(Weak::new());
    let mut s = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(srv) = s.upgrade() {
        return srv;
    }
    let srv = Arc::new(Server::start());
    *s = Arc::downgrade(&srv);
    srv
}

/// A private server with TLS whose certificate names `san` (shared by the tests of one
/// binary asking for the same `san` while any of them runs); None, saying so, unless
/// UNKAI_TEST_POSTGRES=local.
pub fn tls_server(san: &str) -> Option<Arc<Server>> {
    if std::env::var(ENV).as_deref() != Ok("local") {
        eprintln!("skipped: TLS tests start servers of their own, only with {ENV}=local");
        return None;
    }
    static SERVERS: Mutex<Vec<(String, Weak<Server>)>> = Mutex::new(Vec::new());
    let mut all = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    if let Some(srv) = all
        .iter()
        .find(|(s, _)| s == san)
        .and_then(|(_, w)| w.upgrade())
    {
        return Some(srv);
    }
    let srv = Arc::new(Server::start_tls(san));
    all.push((san.to_string(), Arc::downgrade(&srv)));
    Some(srv)
}

/// A new, empty database on `server`.
pub fn database_on(server: &Arc<Server>) -> TestDb {
    let name = fresh_name();
    TestDb::admin_client(&server.admin)
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create database");
    TestDb {
        url: with_db(&server.admin, &name),
        name,
        admin: server.admin.clone(),
        _server: Some(server.clone()),
    }
}

/// `url` with its query (`?...`) replaced by `query`.
pub fn with_query(url: &str, query: &str) -> String {
    let base = url.split_once('?').map_or(url, |(b, _)| b);
    format!("{base}?{query}")
}

/// `url` with its database replaced by `db`.
pub fn with_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let auth_start = base.find("://").map_or(0, |i| i + 3);
    let slash = base[auth_start..]
        .find('/')
        .map_or(base.len(), |i| auth_start + i);
    format!("{}/{db}{query}", &base[..slash])
}

/// `url` without its password, and the password.
pub fn split_password(url: &str) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("scheme");
    let at = rest.find('@').expect("user@");
    let (user, pw) = rest[..at].split_once(':').expect("user:password");
    (format!("{scheme}://{user}{}", &rest[at..]), pw.to_string())
}

/// A database of one test; dropped (connections and all) on drop.
pub struct TestDb {
    /// Its URL (with the password).
    pub url: String,
    pub name: String,
    admin: String,
    _server: Option<Arc<Server>>,
}

impl TestDb {
    fn admin_client(admin: &str) -> postgres::Client {
        postgres::Client::connect(admin, postgres::NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to the test server: {e:?}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

fn admin_url() -> (String, Option<Arc<Server>>) {
    let v = std::env::var(ENV).unwrap_or_default();
    if v.starts_with("postgres://") || v.starts_with("postgresql://") {
        (v, None)
    } else {
        let srv = shared_server();
        (srv.admin.clone(), Some(srv))
    }
}

fn fresh_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "unkai_t{}_{}_{:04x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        rand_u16()
    )
}

fn rand_u16() -> u16 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.subsec_nanos() ^ (t.as_secs() as u32)) as u16
}

/// A new, empty database (None when PostgreSQL tests are off).
pub fn database() -> Option<TestDb> {
    let db = name_only()?;
    TestDb::admin_client(&db.admin)
        .batch_execute(&format!("CREATE DATABASE {}", db.name))
        .expect("create database");
    Some(db)
}

/// The URL of a database that does not exist yet (dropped on drop if something created it).
pub fn name_only() -> Option<TestDb> {
    if !enabled() {
        return None;
    }
    let (admin, server) = admin_url();
    let name = fresh_name();
    Some(TestDb {
        url: with_db(&admin, &name),
        name,
        admin,
        _server: server,
    })
}
