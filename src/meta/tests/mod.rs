//! Tests of the metadata layer, written against the [`Meta`] trait so that every engine runs
//! the same suite: each test is a function of an [`Engine`], instantiated once per engine by
//! [`engine_tests!`] in its file (`JOB::on_sqlite::NAME`, `JOB::on_postgres::NAME`). The
//! PostgreSQL variants are skipped, saying so, only when `UNKAI_TEST_POSTGRES` is unset (see
//! tests/common/postgres.rs for its values).
//!
//! This file holds the engines and the helpers the tests share; the tests are in one file per
//! job, as `ops` is split (`namespace`, `attrs`, `files`, `clients`, `settings`,
//! `maintenance`), and `postgres_only`.

#![allow(clippy::type_complexity)]

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::format::SCHEMA_VERSION;
use super::postgres::PgMeta;
use super::slice::{self, SliceRec};
use super::sqlite::SqliteMeta;
use super::url::{MetaUrl, PgUrl};
use super::*;

#[path = "../../../tests/common/postgres.rs"]
mod pg_server;

// ---------------------------------------------------------------------------------------------
// Engines
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Sqlite,
    Postgres,
}

/// Instantiates each test function (of an [`Engine`]) once per engine.
macro_rules! engine_tests {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $( #[test] fn $name() { super::$name(super::Engine::Sqlite) } )*
        }
        mod on_postgres {
            $(
                #[test]
                fn $name() {
                    if super::pg_server::skip() {
                        return;
                    }
                    super::$name(super::Engine::Postgres)
                }
            )*
        }
    };
}

mod attrs;
mod clients;
mod files;
mod maintenance;
mod namespace;
mod postgres_only;
mod settings;

/// Keeps a volume's storage alive (a temporary directory, a test database).
type Guard = Box<dyn Any>;
type Factory = Box<dyn Fn() -> (Guard, Arc<dyn Meta>)>;

fn pg_url(url: &str) -> PgUrl {
    match MetaUrl::parse(url).expect("test URL parses") {
        MetaUrl::Postgres(u) => u,
        other => panic!("not a PostgreSQL URL: {other}"),
    }
}

/// The engine, as a factory of a freshly formatted volume with a session registered.
/// A fresh SQLite volume; `alone`: told it has the volume to itself (changes grouped,
/// answers from memory).
fn sqlite_volume(alone: bool) -> (Guard, Arc<dyn Meta>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("meta.db");
    let url = format!("sqlite://{}", path.display());
    SqliteMeta::create(&path, &url, &test_format("vol"), false).expect("create");
    let m = SqliteMeta::open(&path, &url).expect("open");
    m.new_session(session_info("/mnt/test"))
        .expect("new_session");
    m.set_alone(alone);
    (Box::new(dir) as Guard, Arc::new(m) as Arc<dyn Meta>)
}

fn engines(e: Engine) -> Vec<(&'static str, Factory)> {
    match e {
        Engine::Sqlite => vec![
            ("sqlite", Box::new(|| sqlite_volume(false))),
            (
                "sqlite, alone (grouped, answered from memory)",
                Box::new(|| sqlite_volume(true)),
            ),
        ],
        Engine::Postgres => vec![(
            "postgres",
            Box::new(|| {
                let db = pg_server::database().expect("UNKAI_TEST_POSTGRES is set");
                let u = pg_url(&db.url);
                PgMeta::create(&u, &test_format("vol"), false).expect("create");
                let m = PgMeta::open(&u).expect("open");
                m.new_session(session_info("/mnt/test"))
                    .expect("new_session");
                (Box::new(db) as Guard, Arc::new(m) as Arc<dyn Meta>)
            }),
        )],
    }
}

/// A place where a volume may be created and opened (for the format/open tests).
struct Place {
    _guard: Guard,
    create: Box<dyn Fn(&Format, bool) -> Result<()>>,
    open: Box<dyn Fn() -> Result<Arc<dyn Meta>>>,
    /// Runs SQL on the volume's database directly (to build an old or damaged volume).
    sql: Box<dyn Fn(&str)>,
}

/// An engine seen from its constructors.
struct Backend {
    name: &'static str,
    /// A place where nothing exists yet.
    missing: Box<dyn Fn() -> Place>,
    /// Places whose storage exists but holds no formatted volume.
    unformatted: Vec<(&'static str, Box<dyn Fn() -> Place>)>,
}

fn sqlite_place(prepare: fn(&std::path::Path)) -> Place {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("meta.db");
    prepare(&path);
    let url = format!("sqlite://{}", path.display());
    let (p1, u1) = (path.clone(), url.clone());
    let (p2, u2) = (path.clone(), url);
    Place {
        _guard: Box::new(dir),
        create: Box::new(move |f, force| SqliteMeta::create(&p1, &u1, f, force)),
        open: Box::new(move || Ok(Arc::new(SqliteMeta::open(&p2, &u2)?) as Arc<dyn Meta>)),
        sql: Box::new(move |sql| {
            rusqlite::Connection::open(&path)
                .unwrap()
                .execute_batch(sql)
                .unwrap()
        }),
    }
}

/// A PostgreSQL place: a database that does not exist yet (`prepare` = None), or one
/// created and then given `prepare`'s SQL.
fn pg_place(prepare: Option<&str>) -> Place {
    let db = match prepare {
        None => pg_server::name_only(),
        Some(_) => pg_server::database(),
    }
    .expect("UNKAI_TEST_POSTGRES is set");
    if let Some(sql) = prepare {
        let mut c = ::postgres::Client::connect(&db.url, ::postgres::NoTls).unwrap();
        c.batch_execute(sql).unwrap();
    }
    let u = pg_url(&db.url);
    let u2 = u.clone();
    let url = db.url.clone();
    Place {
        _guard: Box::new(db),
        create: Box::new(move |f, force| PgMeta::create(&u, f, force)),
        open: Box::new(move || Ok(Arc::new(PgMeta::open(&u2)?) as Arc<dyn Meta>)),
        sql: Box::new(move |sql| {
            ::postgres::Client::connect(&url, ::postgres::NoTls)
                .unwrap()
                .batch_execute(sql)
                .unwrap()
        }),
    }
}

fn backends(e: Engine) -> Vec<Backend> {
    match e {
        Engine::Sqlite => vec![Backend {
            name: "sqlite",
            missing: Box::new(|| sqlite_place(|_| {})),
            unformatted: vec![
                (
                    "empty file",
                    Box::new(|| sqlite_place(|p| std::fs::write(p, b"").unwrap())),
                ),
                (
                    "database without a volume",
                    Box::new(|| {
                        sqlite_place(|p| {
                            let c = rusqlite::Connection::open(p).unwrap();
                            c.execute_batch(
                                "CREATE TABLE other (x INTEGER); INSERT INTO other VALUES (1);",
                            )
                            .unwrap();
                        })
                    }),
                ),
            ],
        }],
        Engine::Postgres => vec![Backend {
            name: "postgres",
            missing: Box::new(|| pg_place(None)),
            unformatted: vec![
                ("empty database", Box::new(|| pg_place(Some("")))),
                (
                    "database without a volume",
                    Box::new(|| {
                        pg_place(Some(
                            "CREATE TABLE other (x INTEGER); INSERT INTO other VALUES (1);",
                        ))
                    }),
                ),
            ],
        }],
    }
}

/// Runs `f` against a fresh volume of the engine.
fn each(e: Engine, f: impl Fn(&dyn Meta)) {
    for (name, make) in engines(e) {
        eprintln!("--- engine {name}");
        let (_guard, m) = make();
        f(&*m);
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const CTX: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 0,
    umask: 0,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn test_format(name: &str) -> Format {
    Format {
        name: name.into(),
        uuid: format!("uuid-of-{name}"),
        storage: "memory://".into(),
        block_size: 4 << 20,
        trash_days: 0,
        capacity: 0,
        inodes: 0,
        created: now_nanos(),
        schema: SCHEMA_VERSION,
        checksums: true,
        hash_prefix: false,
        layout: 0,
        compress: Default::default(),
        encryption: None,
        quotas: false,
    }
}

fn host() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

fn session_info(mountpoint: &str) -> SessionInfo {
    SessionInfo {
        host: host(),
        pid: std::process::id(),
        mountpoint: mountpoint.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        started: 0,
        heartbeat: 0,
        id: 0,
        ..Default::default()
    }
}

/// Whether `f` holds within `limit`, tried every 20 ms (as tests/common's `eventually`).
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[track_caller]
fn assert_errno<T: std::fmt::Debug>(r: Result<T>, errno: i32) {
    match r {
        Err(Error::Sys(e)) if e == errno => {}
        other => panic!(
            "expected errno {errno} ({}), got {other:?}",
            std::io::Error::from_raw_os_error(errno)
        ),
    }
}

/// Waits a little, then returns the time (rounded down to microseconds, so that an engine
/// keeping microseconds still compares as later): anything stamped after this is `>=`.
fn tick() -> Nanos {
    std::thread::sleep(Duration::from_millis(3));
    let t = now_nanos() / 1000 * 1000;
    std::thread::sleep(Duration::from_millis(1));
    t
}

fn mkfile(m: &dyn Meta, parent: Ino, name: &str) -> Attr {
    m.mknod(&CTX, parent, name.as_bytes(), Kind::File, 0o644, 0, None)
        .unwrap_or_else(|e| panic!("create {name}: {e:?}"))
}

fn mkdir(m: &dyn Meta, parent: Ino, name: &str) -> Attr {
    m.mknod(&CTX, parent, name.as_bytes(), Kind::Dir, 0o755, 0, None)
        .unwrap_or_else(|e| panic!("mkdir {name}: {e:?}"))
}

fn lookup(m: &dyn Meta, parent: Ino, name: &str) -> Result<Attr> {
    m.lookup(&CTX, parent, name.as_bytes())
}

fn nlink(m: &dyn Meta, ino: Ino) -> u32 {
    m.getattr(ino).unwrap().nlink
}

fn flags(noreplace: bool, exchange: bool) -> RenameFlags {
    RenameFlags {
        noreplace,
        exchange,
        ..RenameFlags::default()
    }
}

fn rename(m: &dyn Meta, p: Ino, n: &str, np: Ino, nn: &str) -> Result<Option<Attr>> {
    m.rename(
        &CTX,
        p,
        n.as_bytes(),
        np,
        nn.as_bytes(),
        RenameFlags::default(),
    )
}

fn exchange(m: &dyn Meta, p: Ino, n: &str, np: Ino, nn: &str) -> Result<Option<Attr>> {
    m.rename(&CTX, p, n.as_bytes(), np, nn.as_bytes(), flags(false, true))
}

/// The records of one slice of `len` bytes written at file offset `off`, cut at chunk
/// boundaries.
fn slice_recs(id: u64, off: u64, len: u32) -> Vec<(u32, SliceRec)> {
    let mut out = Vec::new();
    let mut done = 0u32;
    while done < len {
        let at = off + done as u64;
        let room = (CHUNK_SIZE - at % CHUNK_SIZE).min((len - done) as u64) as u32;
        out.push((
            (at / CHUNK_SIZE) as u32,
            SliceRec {
                pos: (at % CHUNK_SIZE) as u32,
                id,
                size: len,
                off: done,
                len: room,
            },
        ));
        done += room;
    }
    out
}

/// Writes a new slice of `len` bytes at `off`; returns its id.
fn write(m: &dyn Meta, ino: Ino, off: u64, len: u32) -> u64 {
    let id = m.new_slice_id().unwrap();
    assert_ne!(id, 0, "slice id 0 means zeros");
    m.write_slices(ino, &slice_recs(id, off, len), Some(now_nanos()))
        .unwrap();
    id
}

/// One piece of what a file holds: (file offset, length, slice id, offset in the slice).
type Ext = (u64, u64, u64, u64);

fn push_ext(out: &mut Vec<Ext>, off: u64, len: u64, id: u64, soff: u64) {
    if len == 0 {
        return;
    }
    let soff = if id == 0 { 0 } else { soff };
    if let Some(last) = out.last_mut() {
        if last.0 + last.1 == off && last.2 == id && (id == 0 || last.3 + last.1 == soff) {
            last.1 += len;
            return;
        }
    }
    out.push((off, len, id, soff));
}

/// What a file holds over `[start, end)`, from its chunks' records through
/// [`slice::build_view`]: pieces in order, contiguous pieces of one slice merged, zero
/// records and holes both shown as slice id 0.
fn extents(m: &dyn Meta, ino: Ino, start: u64, end: u64) -> Vec<Ext> {
    let mut out = Vec::new();
    let mut off = start;
    while off < end {
        let index = off / CHUNK_SIZE;
        let base = index * CHUNK_SIZE;
        let (a, b) = (off - base, (end - base).min(CHUNK_SIZE));
        let view = slice::build_view(&m.read_chunk(ino, index as u32).unwrap());
        let mut cur = a;
        for p in view.iter().filter(|p| p.end() > a && (p.pos as u64) < b) {
            let ps = (p.pos as u64).max(a);
            let pe = p.end().min(b);
            if ps > cur {
                push_ext(&mut out, base + cur, ps - cur, 0, 0);
            }
            let soff = p.off as u64 + (ps - p.pos as u64);
            push_ext(&mut out, base + ps, pe - ps, p.id, soff);
            cur = pe;
        }
        if cur < b {
            push_ext(&mut out, base + cur, b - cur, 0, 0);
        }
        off = base + b;
    }
    out
}

fn dead_ids(m: &dyn Meta) -> HashSet<u64> {
    m.dead_slices(100_000)
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect()
}

fn refs(m: &dyn Meta) -> HashMap<u64, u32> {
    m.all_slices()
        .unwrap()
        .into_iter()
        .map(|(id, _, r)| (id, r))
        .collect()
}

fn listing(m: &dyn Meta, dir: Ino) -> Vec<DirEntry> {
    m.readdir(dir, 0, 100_000, false).unwrap()
}

fn names(m: &dyn Meta, dir: Ino) -> Vec<String> {
    listing(m, dir)
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect()
}

fn align4k(n: u64) -> u64 {
    n.div_ceil(4096) * 4096
}

fn session_id(m: &dyn Meta, mountpoint: &str) -> u64 {
    m.sessions()
        .unwrap()
        .iter()
        .find(|s| s.mountpoint == mountpoint)
        .unwrap()
        .id
}
