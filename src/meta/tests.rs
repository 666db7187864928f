//! Tests of the metadata layer, written against the [`Meta`] trait so that every engine runs
//! the same suite: each test is a function of an [`Engine`], instantiated once per engine by
//! [`engine_tests!`] (`on_sqlite::NAME`, `on_postgres::NAME`). The PostgreSQL variants are
//! skipped, saying so, only when `UNKAI_TEST_POSTGRES` is unset (see
//! tests/common/postgres.rs for its values).

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

#[path = "../../tests/common/postgres.rs"]
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

engine_tests!(
    open_missing_or_unformatted_is_not_formatted,
    create_then_open_has_root,
    open_refuses_a_newer_schema,
    create_over_existing_refused_unless_forced,
    mknod_every_kind,
    mknod_errors,
    mknod_setgid_directory,
    mknod_updates_parent,
    link_and_unlink,
    rmdir_rules,
    unlinked_open_file_lives_until_close,
    rename_plain,
    rename_across_directories,
    rename_over_file,
    rename_over_directory,
    rename_kind_mismatch_and_loops,
    rename_exchange,
    rename_whiteout,
    inode_flags_protect_files_and_directories,
    rename_between_hard_links_is_a_noop,
    readdir_lists_everything_with_kinds,
    readdir_paging,
    readdir_respects_small_limits,
    readdir_paging_with_concurrent_changes,
    setattr_fields,
    write_slices_and_read_chunk,
    truncate_shrink_then_grow_reads_zeros,
    truncate_across_chunks_frees_slices,
    fallocate_modes,
    copy_range_references_source_slices,
    copy_range_across_chunk_boundaries,
    copy_range_same_file_and_errors,
    replace_slices_compaction,
    all_slices_refcounts,
    xattrs,
    sessions_register_and_close,
    close_session_reclaims_unlinked_open_inodes,
    new_session_reclaims_dead_sessions,
    open_in_one_client_survives_unlink_in_another,
    open_in_one_client_survives_rename_over_in_another,
    opens_before_another_client_joins_are_shared,
    dead_client_opens_are_reclaimed_on_heartbeat,
    slice_ids_are_reserved_until_the_session_ends,
    an_old_schema_is_upgraded,
    stored_bytes_count_data_not_holes,
    an_old_schema_counts_what_files_store,
    trash_days_delay_dead_slices,
    trash_purged_early_oldest_first_by_one_client,
    usage_counters,
    concurrent_clients_on_one_volume,
    concurrent_mknod_unlink,
);

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
    m.write_slices(ino, &slice_recs(id, off, len), now_nanos())
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

// ---------------------------------------------------------------------------------------------
// Format / open
// ---------------------------------------------------------------------------------------------

#[track_caller]
fn assert_not_formatted(r: Result<Arc<dyn Meta>>) {
    match r {
        Err(Error::NotFormatted(_)) => {}
        Err(e) => panic!("expected NotFormatted, got {e:?}"),
        Ok(_) => panic!("expected NotFormatted, but the volume opened"),
    }
}

fn open_missing_or_unformatted_is_not_formatted(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        assert_not_formatted((place.open)());
        // Opening must not have created a volume.
        assert_not_formatted((place.open)());
        for (what, make) in &b.unformatted {
            eprintln!("unformatted: {what}");
            let place = make();
            assert_not_formatted((place.open)());
            // And it can be formatted afterwards.
            (place.create)(&test_format("late"), false).unwrap();
            assert_eq!((place.open)().unwrap().format().name, "late");
        }
    }
}

fn create_then_open_has_root(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        let fmt = test_format("first");
        (place.create)(&fmt, false).unwrap();
        let m = (place.open)().unwrap();
        assert_eq!(m.format(), fmt);
        let root = m.getattr(ROOT_INO).unwrap();
        assert_eq!(root.ino, ROOT_INO);
        assert_eq!(root.kind, Kind::Dir);
        assert_eq!(root.nlink, 2);
        assert_eq!(root.length, 0);
        assert_eq!(root.mode & libc::S_IFMT, 0, "mode has no type bits");
        let l = listing(&*m, ROOT_INO);
        assert_eq!(l.len(), 2, "{l:?}");
        assert_eq!((l[0].name.as_slice(), l[0].ino), (&b"."[..], ROOT_INO));
        assert_eq!((l[1].name.as_slice(), l[1].ino), (&b".."[..], ROOT_INO));
        let u = m.usage().unwrap();
        assert_eq!((u.inodes, u.used_bytes, u.slices), (1, 0, 0));
        assert!(m.sessions().unwrap().is_empty());
    }
}

fn open_refuses_a_newer_schema(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        let mut fmt = test_format("future");
        fmt.schema = SCHEMA_VERSION + 1;
        (place.create)(&fmt, false).unwrap();
        match (place.open)() {
            Err(Error::Refused(msg)) => assert!(msg.contains("schema"), "{msg}"),
            Err(e) => panic!("expected Refused, got {e:?}"),
            Ok(_) => panic!("a volume of a newer schema opened"),
        }
    }
}

fn create_over_existing_refused_unless_forced(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        let old = test_format("precious");
        (place.create)(&old, false).unwrap();
        {
            let m = (place.open)().unwrap();
            mkfile(&*m, ROOT_INO, "keep");
            mkdir(&*m, ROOT_INO, "dir");
        }
        // Without force: refused, and nothing changed.
        match (place.create)(&test_format("new"), false) {
            Err(Error::Refused(msg)) => assert!(msg.contains("precious"), "{msg}"),
            other => panic!("expected Refused, got {other:?}"),
        }
        {
            let m = (place.open)().unwrap();
            assert_eq!(m.format(), old);
            assert_eq!(lookup(&*m, ROOT_INO, "keep").unwrap().kind, Kind::File);
            assert_eq!(nlink(&*m, ROOT_INO), 3);
        }
        // Mounted (a live session of this very process): even force is refused.
        {
            let m = (place.open)().unwrap();
            m.new_session(session_info("/mnt/x")).unwrap();
            match (place.create)(&test_format("new"), true) {
                Err(Error::Refused(_)) => {}
                other => panic!("expected Refused while mounted, got {other:?}"),
            }
            m.close_session().unwrap();
        }
        // With force: a fresh volume.
        let new = test_format("new");
        (place.create)(&new, true).unwrap();
        let m = (place.open)().unwrap();
        assert_eq!(m.format(), new);
        assert_errno(lookup(&*m, ROOT_INO, "keep"), libc::ENOENT);
        assert_errno(lookup(&*m, ROOT_INO, "dir"), libc::ENOENT);
        let root = m.getattr(ROOT_INO).unwrap();
        assert_eq!((root.kind, root.nlink), (Kind::Dir, 2));
        assert_eq!(listing(&*m, ROOT_INO).len(), 2);
        assert_eq!(m.usage().unwrap().inodes, 1);
        assert!(m.sessions().unwrap().is_empty());
        // And it works.
        let f = mkfile(&*m, ROOT_INO, "after");
        assert_eq!(lookup(&*m, ROOT_INO, "after").unwrap().ino, f.ino);
    }
}

// ---------------------------------------------------------------------------------------------
// mknod / lookup / getattr
// ---------------------------------------------------------------------------------------------

fn mknod_every_kind(e: Engine) {
    each(e, |m| {
        let t0 = tick();
        let rdev_c = libc::makedev(1, 3) as u32;
        let rdev_b = libc::makedev(8, 1) as u32;
        let cases: [(&str, Kind, u32, u32, Option<&[u8]>); 7] = [
            ("file", Kind::File, libc::S_IFREG | 0o640, 0, None),
            ("dir", Kind::Dir, libc::S_IFDIR | 0o750, 0, None),
            ("link", Kind::Symlink, 0o777, 0, Some(b"some/where/else")),
            ("fifo", Kind::Fifo, libc::S_IFIFO | 0o600, 0, None),
            ("chr", Kind::CharDev, libc::S_IFCHR | 0o620, rdev_c, None),
            ("blk", Kind::BlockDev, libc::S_IFBLK | 0o660, rdev_b, None),
            ("sock", Kind::Socket, libc::S_IFSOCK | 0o755, 0, None),
        ];
        let mut inos = HashSet::new();
        for (name, kind, mode, rdev, target) in cases {
            let a = m
                .mknod(&CTX, ROOT_INO, name.as_bytes(), kind, mode, rdev, target)
                .unwrap();
            let t1 = now_nanos();
            assert_eq!(a.kind, kind, "{name}");
            assert_eq!(a.mode, mode & 0o7777, "{name}");
            assert_eq!((a.uid, a.gid), (CTX.uid, CTX.gid), "{name}");
            assert_eq!(a.rdev, rdev, "{name}");
            assert_eq!(a.nlink, if kind == Kind::Dir { 2 } else { 1 }, "{name}");
            assert_eq!(a.length, target.map_or(0, |t| t.len() as u64), "{name}");
            if kind == Kind::Dir {
                assert_eq!(a.parent, ROOT_INO, "{name}");
            }
            for t in [a.atime, a.mtime, a.ctime] {
                assert!(t >= t0 && t <= t1, "{name}: time {t} not in [{t0}, {t1}]");
            }
            assert_ne!(a.ino, ROOT_INO);
            assert!(inos.insert(a.ino), "inode {} given twice", a.ino);
            assert_eq!(lookup(m, ROOT_INO, name).unwrap(), a, "{name}");
            assert_eq!(m.getattr(a.ino).unwrap(), a, "{name}");
            match target {
                Some(t) => assert_eq!(m.readlink(a.ino).unwrap(), t),
                None => assert_errno(m.readlink(a.ino), libc::EINVAL),
            }
        }
        // "." and "..".
        let dir = lookup(m, ROOT_INO, "dir").unwrap();
        assert_eq!(lookup(m, dir.ino, ".").unwrap().ino, dir.ino);
        assert_eq!(lookup(m, dir.ino, "..").unwrap().ino, ROOT_INO);
        assert_eq!(lookup(m, ROOT_INO, "..").unwrap().ino, ROOT_INO);
        // Missing names and inodes.
        assert_errno(lookup(m, ROOT_INO, "nothing"), libc::ENOENT);
        assert_errno(m.getattr(999_999), libc::ENOENT);
        assert_errno(lookup(m, 999_999, "x"), libc::ENOENT);
        let file = lookup(m, ROOT_INO, "file").unwrap();
        assert_errno(lookup(m, file.ino, "x"), libc::ENOTDIR);
        assert_errno(m.readlink(999_999), libc::ENOENT);
        assert_errno(
            lookup(m, ROOT_INO, &"n".repeat(MAX_NAME_LEN + 1)),
            libc::ENAMETOOLONG,
        );
    });
}

fn mknod_errors(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let d = mkdir(m, ROOT_INO, "d");
        let before = m.getattr(ROOT_INO).unwrap();
        // EEXIST, whatever the kinds.
        for (name, kind) in [("f", Kind::File), ("f", Kind::Dir), ("d", Kind::File)] {
            assert_errno(
                m.mknod(&CTX, ROOT_INO, name.as_bytes(), kind, 0o644, 0, None),
                libc::EEXIST,
            );
        }
        assert_errno(
            m.mknod(&CTX, ROOT_INO, b"d", Kind::Symlink, 0o777, 0, Some(b"t")),
            libc::EEXIST,
        );
        // Nothing changed by the failures.
        assert_eq!(m.getattr(ROOT_INO).unwrap(), before);
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().ino, f.ino);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().ino, d.ino);
        // Missing parent.
        assert_errno(
            m.mknod(&CTX, 999_999, b"x", Kind::File, 0o644, 0, None),
            libc::ENOENT,
        );
        assert_errno(
            m.mknod(&CTX, 999_999, b"x", Kind::Dir, 0o755, 0, None),
            libc::ENOENT,
        );
        // Parent is a file.
        assert_errno(
            m.mknod(&CTX, f.ino, b"x", Kind::File, 0o644, 0, None),
            libc::ENOTDIR,
        );
        assert_errno(
            m.mknod(&CTX, f.ino, b"x", Kind::Dir, 0o755, 0, None),
            libc::ENOTDIR,
        );
        // Names: 255 bytes are fine, 256 too long.
        let ok = "a".repeat(MAX_NAME_LEN);
        let long = "b".repeat(MAX_NAME_LEN + 1);
        mkfile(m, d.ino, &ok);
        assert_eq!(lookup(m, d.ino, &ok).unwrap().kind, Kind::File);
        assert_errno(
            m.mknod(&CTX, d.ino, long.as_bytes(), Kind::File, 0o644, 0, None),
            libc::ENAMETOOLONG,
        );
        assert_errno(
            m.mknod(&CTX, d.ino, long.as_bytes(), Kind::Dir, 0o755, 0, None),
            libc::ENAMETOOLONG,
        );
        assert_errno(lookup(m, d.ino, &long), libc::ENAMETOOLONG);
        // A removed directory takes no new entries.
        let gone = mkdir(m, ROOT_INO, "gone");
        m.rmdir(&CTX, ROOT_INO, b"gone").unwrap();
        assert_errno(
            m.mknod(&CTX, gone.ino, b"x", Kind::File, 0o644, 0, None),
            libc::ENOENT,
        );
        // Bad names and symlink targets.
        for bad in [&b""[..], b"a/b", b"a\0b"] {
            assert_errno(
                m.mknod(&CTX, d.ino, bad, Kind::File, 0o644, 0, None),
                libc::EINVAL,
            );
        }
        assert_errno(
            m.mknod(&CTX, d.ino, b"l", Kind::Symlink, 0o777, 0, Some(b"")),
            libc::ENOENT,
        );
        let long_target = vec![b't'; MAX_SYMLINK_LEN + 1];
        assert_errno(
            m.mknod(
                &CTX,
                d.ino,
                b"l",
                Kind::Symlink,
                0o777,
                0,
                Some(&long_target),
            ),
            libc::ENAMETOOLONG,
        );
        let max_target = vec![b't'; MAX_SYMLINK_LEN];
        let l = m
            .mknod(
                &CTX,
                d.ino,
                b"l",
                Kind::Symlink,
                0o777,
                0,
                Some(&max_target),
            )
            .unwrap();
        assert_eq!(m.readlink(l.ino).unwrap(), max_target);
        m.unlink(&CTX, d.ino, b"l").unwrap();
        assert_eq!(names(m, d.ino), vec![".", "..", ok.as_str()]);
    });
}

fn mknod_setgid_directory(e: Engine) {
    each(e, |m| {
        let sg = m
            .mknod(&Ctx::ROOT, ROOT_INO, b"sg", Kind::Dir, 0o2777, 0, None)
            .unwrap();
        let sg = m
            .setattr(
                &Ctx::ROOT,
                sg.ino,
                &SetAttr {
                    gid: Some(2000),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(sg.gid, 2000);
        assert_ne!(sg.mode & libc::S_ISGID, 0);
        // A file inherits the group, keeps its mode.
        let f = mkfile(m, sg.ino, "f");
        assert_eq!((f.uid, f.gid, f.mode), (CTX.uid, 2000, 0o644));
        // A subdirectory inherits the group and the setgid bit, and passes them on.
        let sub = mkdir(m, sg.ino, "sub");
        assert_eq!(sub.gid, 2000);
        assert_eq!(sub.mode, 0o755 | libc::S_ISGID);
        let subsub = mkdir(m, sub.ino, "subsub");
        assert_eq!(subsub.gid, 2000);
        assert_ne!(subsub.mode & libc::S_ISGID, 0);
        let deep = mkfile(m, subsub.ino, "deep");
        assert_eq!(deep.gid, 2000);
        // A setgid executable by a non-member loses the setgid bit; root keeps it.
        let x = m
            .mknod(&CTX, sg.ino, b"x", Kind::File, 0o2755, 0, None)
            .unwrap();
        assert_eq!((x.gid, x.mode), (2000, 0o755));
        let y = m
            .mknod(&Ctx::ROOT, sg.ino, b"y", Kind::File, 0o2755, 0, None)
            .unwrap();
        assert_eq!((y.gid, y.mode), (2000, 0o2755));
        // Without setgid on the parent, the caller's group is used.
        let plain = mkdir(m, ROOT_INO, "plain");
        let g = mkfile(m, plain.ino, "g");
        assert_eq!(g.gid, CTX.gid);
        let d = mkdir(m, plain.ino, "d");
        assert_eq!((d.gid, d.mode & libc::S_ISGID), (CTX.gid, 0));
    });
}

fn mknod_updates_parent(e: Engine) {
    each(e, |m| {
        assert_eq!(nlink(m, ROOT_INO), 2);
        let p = mkdir(m, ROOT_INO, "p");
        assert_eq!(nlink(m, ROOT_INO), 3);
        assert_eq!(p.nlink, 2);
        for i in 0..5 {
            mkdir(m, p.ino, &format!("sub{i}"));
            assert_eq!(nlink(m, p.ino), 3 + i);
        }
        for (i, kind) in [Kind::File, Kind::Fifo, Kind::Socket]
            .into_iter()
            .enumerate()
        {
            m.mknod(
                &CTX,
                p.ino,
                format!("n{i}").as_bytes(),
                kind,
                0o644,
                0,
                None,
            )
            .unwrap();
        }
        m.mknod(&CTX, p.ino, b"sym", Kind::Symlink, 0o777, 0, Some(b"x"))
            .unwrap();
        assert_eq!(nlink(m, p.ino), 7, "only subdirectories count");
        assert_eq!(nlink(m, ROOT_INO), 3);
        // mtime and ctime of the parent move on every creation.
        for (i, kind) in [Kind::File, Kind::Dir, Kind::Symlink]
            .into_iter()
            .enumerate()
        {
            let t0 = tick();
            let before = m.getattr(p.ino).unwrap();
            assert!(before.mtime < t0 && before.ctime < t0);
            let target: Option<&[u8]> = (kind == Kind::Symlink).then_some(b"t");
            m.mknod(
                &CTX,
                p.ino,
                format!("t{i}").as_bytes(),
                kind,
                0o644,
                0,
                target,
            )
            .unwrap();
            let after = m.getattr(p.ino).unwrap();
            assert!(after.mtime >= t0, "{kind:?}: parent mtime not updated");
            assert!(after.ctime >= t0, "{kind:?}: parent ctime not updated");
        }
        // A failed creation changes nothing.
        let before = m.getattr(p.ino).unwrap();
        tick();
        assert_errno(
            m.mknod(&CTX, p.ino, b"t0", Kind::File, 0o644, 0, None),
            libc::EEXIST,
        );
        assert_eq!(m.getattr(p.ino).unwrap(), before);
    });
}

// ---------------------------------------------------------------------------------------------
// link / unlink / rmdir
// ---------------------------------------------------------------------------------------------

fn link_and_unlink(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let f = mkfile(m, ROOT_INO, "f");
        let t0 = tick();
        let l = m.link(&CTX, f.ino, d.ino, b"g").unwrap();
        assert_eq!((l.ino, l.nlink), (f.ino, 2));
        assert!(l.ctime >= t0, "link must update the inode's ctime");
        let dd = m.getattr(d.ino).unwrap();
        assert!(
            dd.mtime >= t0 && dd.ctime >= t0,
            "link must update the parent"
        );
        assert_eq!(dd.nlink, 2, "a link is not a subdirectory");
        assert_eq!(lookup(m, d.ino, "g").unwrap().ino, f.ino);
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().nlink, 2);
        let l3 = m.link(&CTX, f.ino, ROOT_INO, b"h").unwrap();
        assert_eq!(l3.nlink, 3);
        assert_eq!(nlink(m, f.ino), 3);
        // Errors.
        assert_errno(m.link(&CTX, f.ino, d.ino, b"g"), libc::EEXIST);
        assert_errno(m.link(&CTX, f.ino, ROOT_INO, b"d"), libc::EEXIST);
        assert_errno(m.link(&CTX, d.ino, ROOT_INO, b"d2"), libc::EPERM);
        assert_errno(m.link(&CTX, f.ino, 999_999, b"x"), libc::ENOENT);
        assert_errno(m.link(&CTX, 999_999, ROOT_INO, b"x"), libc::ENOENT);
        assert_errno(m.link(&CTX, f.ino, f.ino, b"x"), libc::ENOTDIR);
        assert_errno(
            m.link(&CTX, f.ino, ROOT_INO, "x".repeat(256).as_bytes()),
            libc::ENAMETOOLONG,
        );
        assert_eq!(nlink(m, f.ino), 3, "failed links change nothing");
        // Unlink, one name at a time.
        let t1 = tick();
        let a = m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!((a.ino, a.nlink), (f.ino, 2));
        assert!(a.ctime >= t1, "unlink must update the inode's ctime");
        let root = m.getattr(ROOT_INO).unwrap();
        assert!(root.mtime >= t1 && root.ctime >= t1);
        assert_errno(lookup(m, ROOT_INO, "f"), libc::ENOENT);
        assert_eq!(nlink(m, f.ino), 2);
        assert_eq!(m.unlink(&CTX, ROOT_INO, b"h").unwrap().nlink, 1);
        assert_eq!(lookup(m, d.ino, "g").unwrap().nlink, 1);
        let last = m.unlink(&CTX, d.ino, b"g").unwrap();
        assert_eq!((last.ino, last.nlink), (f.ino, 0));
        assert_errno(m.getattr(f.ino), libc::ENOENT);
        assert_errno(lookup(m, d.ino, "g"), libc::ENOENT);
        // A gone inode cannot be linked again.
        assert_errno(m.link(&CTX, f.ino, ROOT_INO, b"back"), libc::ENOENT);
        // Unlink errors.
        assert_errno(m.unlink(&CTX, ROOT_INO, b"f"), libc::ENOENT);
        assert_errno(m.unlink(&CTX, ROOT_INO, b"d"), libc::EISDIR);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().ino, d.ino);
        let g = mkfile(m, ROOT_INO, "g");
        assert_errno(m.unlink(&CTX, g.ino, b"x"), libc::ENOTDIR);
        assert_errno(m.unlink(&CTX, 999_999, b"x"), libc::ENOENT);
        // Every kind can be unlinked.
        for (i, kind) in [Kind::Symlink, Kind::Fifo, Kind::CharDev, Kind::Socket]
            .into_iter()
            .enumerate()
        {
            let name = format!("k{i}");
            let target: Option<&[u8]> = (kind == Kind::Symlink).then_some(b"t");
            let a = m
                .mknod(&CTX, d.ino, name.as_bytes(), kind, 0o644, 0, target)
                .unwrap();
            assert_eq!(m.unlink(&CTX, d.ino, name.as_bytes()).unwrap().nlink, 0);
            assert_errno(m.getattr(a.ino), libc::ENOENT);
        }
        assert_eq!(names(m, d.ino), vec![".", ".."]);
    });
}

fn rmdir_rules(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let sub = mkdir(m, d.ino, "sub");
        mkfile(m, ROOT_INO, "f");
        assert_eq!(nlink(m, ROOT_INO), 3);
        assert_errno(m.rmdir(&CTX, ROOT_INO, b"f"), libc::ENOTDIR);
        assert_errno(m.rmdir(&CTX, ROOT_INO, b"d"), libc::ENOTEMPTY);
        assert_errno(m.rmdir(&CTX, ROOT_INO, b"nothing"), libc::ENOENT);
        assert_errno(m.rmdir(&CTX, 999_999, b"x"), libc::ENOENT);
        assert_eq!(nlink(m, ROOT_INO), 3, "failed rmdirs change nothing");
        assert_eq!(nlink(m, d.ino), 3);
        // A directory holding only a file is not empty either.
        mkfile(m, sub.ino, "x");
        assert_errno(m.rmdir(&CTX, d.ino, b"sub"), libc::ENOTEMPTY);
        m.unlink(&CTX, sub.ino, b"x").unwrap();
        let t0 = tick();
        m.rmdir(&CTX, d.ino, b"sub").unwrap();
        let da = m.getattr(d.ino).unwrap();
        assert_eq!(da.nlink, 2);
        assert!(da.mtime >= t0 && da.ctime >= t0);
        assert_errno(m.getattr(sub.ino), libc::ENOENT);
        assert_errno(lookup(m, d.ino, "sub"), libc::ENOENT);
        m.rmdir(&CTX, ROOT_INO, b"d").unwrap();
        assert_eq!(nlink(m, ROOT_INO), 2);
        assert_errno(m.getattr(d.ino), libc::ENOENT);
        assert_errno(m.readdir(d.ino, 0, 10, false), libc::ENOENT);
        assert_eq!(names(m, ROOT_INO), vec![".", "..", "f"]);
    });
}

fn unlinked_open_file_lives_until_close(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let s = write(m, f.ino, 0, 10_000);
        let inodes = m.usage().unwrap().inodes;
        m.open_inode(f.ino).unwrap();
        m.open_inode(f.ino).unwrap();
        let a = m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!(a.nlink, 0);
        assert_errno(lookup(m, ROOT_INO, "f"), libc::ENOENT);
        // Still there for its open handles, data included.
        let g = m.getattr(f.ino).unwrap();
        assert_eq!((g.nlink, g.length), (0, 10_000));
        assert_eq!(extents(m, f.ino, 0, 10_000), vec![(0, 10_000, s, 0)]);
        assert!(!dead_ids(m).contains(&s));
        assert_eq!(refs(m).get(&s), Some(&1));
        // Writes through an open handle still work.
        let s2 = write(m, f.ino, 10_000, 100);
        assert_eq!(m.getattr(f.ino).unwrap().length, 10_100);
        // First close: another handle is open.
        m.close_inode(f.ino).unwrap();
        assert_eq!(m.getattr(f.ino).unwrap().nlink, 0);
        assert!(!dead_ids(m).contains(&s));
        // Last close: gone, slices dead (trash_days 0).
        m.close_inode(f.ino).unwrap();
        assert_errno(m.getattr(f.ino), libc::ENOENT);
        let dead = m.dead_slices(1000).unwrap();
        assert!(
            dead.contains(&DeadSlice {
                id: s,
                size: 10_000
            }),
            "{dead:?}"
        );
        assert!(dead.contains(&DeadSlice { id: s2, size: 100 }), "{dead:?}");
        let r = refs(m);
        assert!(!r.contains_key(&s) && !r.contains_key(&s2), "{r:?}");
        assert_eq!(m.usage().unwrap().inodes, inodes - 1);
        assert_eq!(m.usage().unwrap().used_bytes, 0);
        // Opening a missing inode fails.
        assert_errno(m.open_inode(999_999), libc::ENOENT);
        // A close of a file that is still linked keeps it.
        let h = mkfile(m, ROOT_INO, "h");
        m.open_inode(h.ino).unwrap();
        m.close_inode(h.ino).unwrap();
        assert_eq!(m.getattr(h.ino).unwrap().nlink, 1);
        // Unlinked, not open: gone at once, slices dead at once.
        let s3 = write(m, h.ino, 0, 4096);
        m.unlink(&CTX, ROOT_INO, b"h").unwrap();
        assert_errno(m.getattr(h.ino), libc::ENOENT);
        assert!(dead_ids(m).contains(&s3));
        // Forgetting dead slices.
        m.forget_dead_slices(&[s, s2, s3]).unwrap();
        let left = dead_ids(m);
        assert!(!left.contains(&s) && !left.contains(&s3), "{left:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// rename
// ---------------------------------------------------------------------------------------------

fn rename_plain(e: Engine) {
    each(e, |m| {
        let a = mkfile(m, ROOT_INO, "a");
        let t0 = tick();
        assert!(rename(m, ROOT_INO, "a", ROOT_INO, "b").unwrap().is_none());
        assert_errno(lookup(m, ROOT_INO, "a"), libc::ENOENT);
        let b = lookup(m, ROOT_INO, "b").unwrap();
        assert_eq!(b.ino, a.ino);
        assert_eq!(b.nlink, 1);
        assert!(b.ctime >= t0, "rename must update the moved inode's ctime");
        let root = m.getattr(ROOT_INO).unwrap();
        assert!(root.mtime >= t0 && root.ctime >= t0);
        assert_eq!(root.nlink, 2);
        assert_eq!(names(m, ROOT_INO), vec![".", "..", "b"]);
        // A directory too.
        let d = mkdir(m, ROOT_INO, "d");
        let t1 = tick();
        rename(m, ROOT_INO, "d", ROOT_INO, "e").unwrap();
        let e = lookup(m, ROOT_INO, "e").unwrap();
        assert_eq!((e.ino, e.nlink, e.parent), (d.ino, 2, ROOT_INO));
        assert!(e.ctime >= t1);
        assert_eq!(nlink(m, ROOT_INO), 3);
        // Errors.
        assert_errno(rename(m, ROOT_INO, "a", ROOT_INO, "c"), libc::ENOENT);
        assert_errno(rename(m, 999_999, "a", ROOT_INO, "c"), libc::ENOENT);
        assert_errno(rename(m, ROOT_INO, "b", 999_999, "c"), libc::ENOENT);
        assert_errno(rename(m, ROOT_INO, "b", b.ino, "c"), libc::ENOTDIR);
        assert_errno(
            rename(m, ROOT_INO, "b", ROOT_INO, &"n".repeat(256)),
            libc::ENAMETOOLONG,
        );
        // Renaming onto itself changes nothing.
        assert!(rename(m, ROOT_INO, "b", ROOT_INO, "b").unwrap().is_none());
        assert_eq!(lookup(m, ROOT_INO, "b").unwrap().ino, a.ino);
        assert_eq!(nlink(m, a.ino), 1);
    });
}

fn rename_across_directories(e: Engine) {
    each(e, |m| {
        let p1 = mkdir(m, ROOT_INO, "p1");
        let p2 = mkdir(m, ROOT_INO, "p2");
        let f = mkfile(m, p1.ino, "f");
        let t0 = tick();
        assert!(rename(m, p1.ino, "f", p2.ino, "g").unwrap().is_none());
        assert_errno(lookup(m, p1.ino, "f"), libc::ENOENT);
        assert_eq!(lookup(m, p2.ino, "g").unwrap().ino, f.ino);
        assert!(m.getattr(f.ino).unwrap().ctime >= t0);
        for p in [p1.ino, p2.ino] {
            let a = m.getattr(p).unwrap();
            assert!(a.mtime >= t0 && a.ctime >= t0, "parent {p} times");
            assert_eq!(a.nlink, 2, "moving a file changes no nlink");
        }
        // A directory carries its parent's nlink along.
        let d = mkdir(m, p1.ino, "d");
        mkfile(m, d.ino, "inside");
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 2));
        let t1 = tick();
        rename(m, p1.ino, "d", p2.ino, "d").unwrap();
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (2, 3));
        assert_eq!(nlink(m, ROOT_INO), 4);
        let da = m.getattr(d.ino).unwrap();
        assert_eq!((da.parent, da.nlink), (p2.ino, 2));
        assert!(da.ctime >= t1);
        assert_eq!(lookup(m, d.ino, "..").unwrap().ino, p2.ino);
        let l = listing(m, d.ino);
        assert_eq!((l[1].name.as_slice(), l[1].ino), (&b".."[..], p2.ino));
        assert_eq!(lookup(m, d.ino, "inside").unwrap().kind, Kind::File);
        // And up to the root.
        rename(m, p2.ino, "d", ROOT_INO, "top").unwrap();
        assert_eq!((nlink(m, p2.ino), nlink(m, ROOT_INO)), (2, 5));
        assert_eq!(m.getattr(d.ino).unwrap().parent, ROOT_INO);
    });
}

fn rename_over_file(e: Engine) {
    each(e, |m| {
        let a = mkfile(m, ROOT_INO, "a");
        let b = mkfile(m, ROOT_INO, "b");
        let s = write(m, b.ino, 0, 5000);
        let inodes = m.usage().unwrap().inodes;
        let t0 = tick();
        let victim = rename(m, ROOT_INO, "a", ROOT_INO, "b")
            .unwrap()
            .expect("the replaced inode is returned");
        assert_eq!((victim.ino, victim.nlink), (b.ino, 0));
        assert_errno(m.getattr(b.ino), libc::ENOENT);
        assert_eq!(lookup(m, ROOT_INO, "b").unwrap().ino, a.ino);
        assert_errno(lookup(m, ROOT_INO, "a"), libc::ENOENT);
        assert!(m.getattr(a.ino).unwrap().ctime >= t0);
        assert!(dead_ids(m).contains(&s), "the victim's slices die with it");
        assert_eq!(m.usage().unwrap().inodes, inodes - 1);
        assert_eq!(names(m, ROOT_INO), vec![".", "..", "b"]);
        // Across directories, over a file that has another name: it survives.
        let d = mkdir(m, ROOT_INO, "d");
        let c = mkfile(m, d.ino, "c");
        m.link(&CTX, c.ino, ROOT_INO, b"c2").unwrap();
        let victim = rename(m, ROOT_INO, "b", d.ino, "c").unwrap().unwrap();
        assert_eq!((victim.ino, victim.nlink), (c.ino, 1));
        assert_eq!(m.getattr(c.ino).unwrap().nlink, 1);
        assert_eq!(lookup(m, d.ino, "c").unwrap().ino, a.ino);
        assert_eq!(lookup(m, ROOT_INO, "c2").unwrap().ino, c.ino);
        // Over an open file: kept until closed.
        let e = mkfile(m, d.ino, "e");
        m.open_inode(e.ino).unwrap();
        let victim = rename(m, ROOT_INO, "c2", d.ino, "e").unwrap().unwrap();
        assert_eq!((victim.ino, victim.nlink), (e.ino, 0));
        assert_eq!(m.getattr(e.ino).unwrap().nlink, 0);
        m.close_inode(e.ino).unwrap();
        assert_errno(m.getattr(e.ino), libc::ENOENT);
    });
}

fn rename_over_directory(e: Engine) {
    each(e, |m| {
        let x = mkdir(m, ROOT_INO, "x");
        let y = mkdir(m, ROOT_INO, "y");
        mkfile(m, x.ino, "content");
        assert_eq!(nlink(m, ROOT_INO), 4);
        let victim = rename(m, ROOT_INO, "x", ROOT_INO, "y")
            .unwrap()
            .expect("the replaced directory is returned");
        assert_eq!((victim.ino, victim.nlink), (y.ino, 0));
        assert_errno(m.getattr(y.ino), libc::ENOENT);
        assert_eq!(nlink(m, ROOT_INO), 3);
        let now_y = lookup(m, ROOT_INO, "y").unwrap();
        assert_eq!((now_y.ino, now_y.nlink), (x.ino, 2));
        assert_eq!(lookup(m, x.ino, "content").unwrap().kind, Kind::File);
        // Across directories.
        let p1 = mkdir(m, ROOT_INO, "p1");
        let p2 = mkdir(m, ROOT_INO, "p2");
        mkdir(m, p1.ino, "a");
        let b = mkdir(m, p2.ino, "b");
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 3));
        let victim = rename(m, p1.ino, "a", p2.ino, "b").unwrap().unwrap();
        assert_eq!((victim.ino, victim.nlink), (b.ino, 0));
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (2, 3));
        // Non-empty destination.
        let q = mkdir(m, ROOT_INO, "q");
        let r = mkdir(m, ROOT_INO, "r");
        mkfile(m, r.ino, "f");
        let before = nlink(m, ROOT_INO);
        assert_errno(rename(m, ROOT_INO, "q", ROOT_INO, "r"), libc::ENOTEMPTY);
        assert_eq!(lookup(m, ROOT_INO, "q").unwrap().ino, q.ino);
        assert_eq!(lookup(m, ROOT_INO, "r").unwrap().ino, r.ino);
        assert_eq!(nlink(m, ROOT_INO), before);
        // A subdirectory makes it non-empty too.
        let r2 = mkdir(m, ROOT_INO, "r2");
        mkdir(m, r2.ino, "sub");
        assert_errno(rename(m, ROOT_INO, "q", ROOT_INO, "r2"), libc::ENOTEMPTY);
    });
}

fn rename_kind_mismatch_and_loops(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let d = mkdir(m, ROOT_INO, "d");
        assert_errno(rename(m, ROOT_INO, "f", ROOT_INO, "d"), libc::EISDIR);
        assert_errno(rename(m, ROOT_INO, "d", ROOT_INO, "f"), libc::ENOTDIR);
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().ino, f.ino);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().ino, d.ino);
        // A directory into itself or below it.
        let a = mkdir(m, ROOT_INO, "a");
        let b = mkdir(m, a.ino, "b");
        let c = mkdir(m, b.ino, "c");
        assert_errno(rename(m, ROOT_INO, "a", a.ino, "z"), libc::EINVAL);
        assert_errno(rename(m, ROOT_INO, "a", b.ino, "z"), libc::EINVAL);
        assert_errno(rename(m, ROOT_INO, "a", c.ino, "z"), libc::EINVAL);
        assert_errno(rename(m, a.ino, "b", c.ino, "z"), libc::EINVAL);
        assert_eq!(m.getattr(a.ino).unwrap().parent, ROOT_INO);
        assert_eq!(lookup(m, ROOT_INO, "a").unwrap().ino, a.ino);
        assert_eq!((nlink(m, a.ino), nlink(m, b.ino)), (3, 3));
        // Moving a directory next to itself or up is fine.
        rename(m, b.ino, "c", a.ino, "c").unwrap();
        assert_eq!((nlink(m, a.ino), nlink(m, b.ino)), (4, 2));
        // noreplace.
        let g = mkfile(m, ROOT_INO, "g");
        assert_errno(
            m.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"g", flags(true, false)),
            libc::EEXIST,
        );
        assert_errno(
            m.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"d", flags(true, false)),
            libc::EEXIST,
        );
        assert_eq!(lookup(m, ROOT_INO, "g").unwrap().ino, g.ino);
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().ino, f.ino);
        assert!(
            m.rename(&CTX, ROOT_INO, b"f", ROOT_INO, b"h", flags(true, false))
                .unwrap()
                .is_none()
        );
        assert_eq!(lookup(m, ROOT_INO, "h").unwrap().ino, f.ino);
        assert_errno(
            m.rename(&CTX, ROOT_INO, b"h", ROOT_INO, b"g", flags(true, true)),
            libc::EINVAL,
        );
    });
}

fn rename_exchange(e: Engine) {
    each(e, |m| {
        // Same directory, file <-> directory.
        let f = mkfile(m, ROOT_INO, "f");
        let d = mkdir(m, ROOT_INO, "d");
        let root_nlink = nlink(m, ROOT_INO);
        let t0 = tick();
        assert!(exchange(m, ROOT_INO, "f", ROOT_INO, "d").unwrap().is_none());
        let now_f = lookup(m, ROOT_INO, "f").unwrap();
        let now_d = lookup(m, ROOT_INO, "d").unwrap();
        assert_eq!((now_f.ino, now_f.kind), (d.ino, Kind::Dir));
        assert_eq!((now_d.ino, now_d.kind), (f.ino, Kind::File));
        assert!(now_f.ctime >= t0 && now_d.ctime >= t0, "both ctimes move");
        assert_eq!(nlink(m, ROOT_INO), root_nlink);
        assert_eq!(m.getattr(d.ino).unwrap().parent, ROOT_INO);
        let kinds: HashMap<Vec<u8>, (Ino, Kind)> = listing(m, ROOT_INO)
            .into_iter()
            .map(|e| (e.name, (e.ino, e.kind)))
            .collect();
        assert_eq!(kinds[&b"f".to_vec()], (d.ino, Kind::Dir));
        assert_eq!(kinds[&b"d".to_vec()], (f.ino, Kind::File));
        // And back.
        exchange(m, ROOT_INO, "d", ROOT_INO, "f").unwrap();
        assert_eq!(lookup(m, ROOT_INO, "f").unwrap().ino, f.ino);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().ino, d.ino);

        // Across directories: a directory and a file.
        let p1 = mkdir(m, ROOT_INO, "p1");
        let p2 = mkdir(m, ROOT_INO, "p2");
        let d1 = mkdir(m, p1.ino, "d1");
        let f2 = mkfile(m, p2.ino, "f2");
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 2));
        let t1 = tick();
        exchange(m, p1.ino, "d1", p2.ino, "f2").unwrap();
        assert_eq!(lookup(m, p1.ino, "d1").unwrap().ino, f2.ino);
        assert_eq!(lookup(m, p2.ino, "f2").unwrap().ino, d1.ino);
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (2, 3));
        assert_eq!(m.getattr(d1.ino).unwrap().parent, p2.ino);
        assert_eq!(lookup(m, d1.ino, "..").unwrap().ino, p2.ino);
        for p in [p1.ino, p2.ino] {
            let a = m.getattr(p).unwrap();
            assert!(a.mtime >= t1 && a.ctime >= t1, "parent {p} times");
        }
        // The other way round restores everything.
        exchange(m, p2.ino, "f2", p1.ino, "d1").unwrap();
        assert_eq!(lookup(m, p1.ino, "d1").unwrap().ino, d1.ino);
        assert_eq!(lookup(m, p2.ino, "f2").unwrap().ino, f2.ino);
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 2));
        assert_eq!(m.getattr(d1.ino).unwrap().parent, p1.ino);

        // Two directories across: nlinks stay, parents swap.
        let d2 = mkdir(m, p2.ino, "d2");
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 3));
        exchange(m, p1.ino, "d1", p2.ino, "d2").unwrap();
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 3));
        assert_eq!(m.getattr(d1.ino).unwrap().parent, p2.ino);
        assert_eq!(m.getattr(d2.ino).unwrap().parent, p1.ino);
        assert_eq!(lookup(m, p1.ino, "d1").unwrap().ino, d2.ino);
        assert_eq!(lookup(m, p2.ino, "d2").unwrap().ino, d1.ino);

        // Two files across.
        let g1 = mkfile(m, p1.ino, "g1");
        let g2 = mkfile(m, p2.ino, "g2");
        exchange(m, p1.ino, "g1", p2.ino, "g2").unwrap();
        assert_eq!(lookup(m, p1.ino, "g1").unwrap().ino, g2.ino);
        assert_eq!(lookup(m, p2.ino, "g2").unwrap().ino, g1.ino);
        assert_eq!((nlink(m, p1.ino), nlink(m, p2.ino)), (3, 3));

        // Errors: a missing side, a directory into its own subtree.
        assert_errno(exchange(m, p1.ino, "g1", p2.ino, "none"), libc::ENOENT);
        assert_errno(exchange(m, p1.ino, "none", p2.ino, "g2"), libc::ENOENT);
        let inner = mkdir(m, p1.ino, "inner");
        assert_errno(exchange(m, ROOT_INO, "p1", p1.ino, "inner"), libc::EINVAL);
        assert_errno(exchange(m, p1.ino, "inner", ROOT_INO, "p1"), libc::EINVAL);
        assert_eq!(m.getattr(inner.ino).unwrap().parent, p1.ino);
        assert_eq!(m.getattr(p1.ino).unwrap().parent, ROOT_INO);
    });
}

fn rename_whiteout(e: Engine) {
    each(e, |m| {
        let whiteout = RenameFlags {
            whiteout: true,
            ..RenameFlags::default()
        };
        let a = mkfile(m, ROOT_INO, "a");
        let d = mkdir(m, ROOT_INO, "d");
        let b = mkfile(m, d.ino, "b");
        let inodes = m.usage().unwrap().inodes;
        let ctx = Ctx {
            uid: 7,
            gid: 8,
            ..CTX
        };
        // Over another file, across directories: the old name becomes a whiteout.
        let victim = m
            .rename(&ctx, ROOT_INO, b"a", d.ino, b"b", whiteout)
            .unwrap()
            .expect("the replaced inode is returned");
        assert_eq!(victim.ino, b.ino);
        assert_eq!(lookup(m, d.ino, "b").unwrap().ino, a.ino);
        let w = lookup(m, ROOT_INO, "a").unwrap();
        assert_ne!(w.ino, a.ino);
        assert_eq!((w.kind, w.rdev, w.mode), (Kind::CharDev, 0, 0));
        assert_eq!((w.uid, w.gid, w.nlink), (7, 8, 1));
        let kinds: Vec<(String, Kind)> = listing(m, ROOT_INO)
            .into_iter()
            .map(|e| (String::from_utf8(e.name).unwrap(), e.kind))
            .filter(|(n, _)| n == "a")
            .collect();
        assert_eq!(kinds, vec![("a".to_string(), Kind::CharDev)]);
        // One inode replaced, one whiteout made.
        assert_eq!(m.usage().unwrap().inodes, inodes);
        // To a free name, with noreplace; a directory too.
        let noreplace = RenameFlags {
            noreplace: true,
            ..whiteout
        };
        m.rename(&ctx, ROOT_INO, b"d", ROOT_INO, b"e", noreplace)
            .unwrap();
        assert_eq!(lookup(m, ROOT_INO, "e").unwrap().ino, d.ino);
        assert_eq!(lookup(m, ROOT_INO, "d").unwrap().kind, Kind::CharDev);
        // Nothing to move: nothing made. With exchange: refused.
        assert_errno(
            m.rename(&ctx, ROOT_INO, b"nope", ROOT_INO, b"x", whiteout),
            libc::ENOENT,
        );
        assert_errno(lookup(m, ROOT_INO, "nope"), libc::ENOENT);
        let both = RenameFlags {
            exchange: true,
            ..whiteout
        };
        assert_errno(
            m.rename(&ctx, ROOT_INO, b"e", ROOT_INO, b"a", both),
            libc::EINVAL,
        );
        // A whiteout is deleted as any inode.
        m.unlink(&CTX, ROOT_INO, b"a").unwrap();
        assert_errno(m.getattr(w.ino), libc::ENOENT);
    });
}

fn inode_flags_protect_files_and_directories(e: Engine) {
    each(e, |m| {
        let root = Ctx {
            uid: 0,
            gid: 0,
            ..CTX
        };
        let f = mkfile(m, ROOT_INO, "f");
        write(m, f.ino, 0, 100);
        // Who may set what.
        let other = Ctx { uid: 4242, ..CTX };
        assert_errno(m.set_flags(&other, f.ino, flags::NODUMP), libc::EPERM);
        assert_errno(m.set_flags(&CTX, f.ino, flags::IMMUTABLE), libc::EPERM);
        assert_errno(m.set_flags(&root, f.ino, 0x8000), libc::EOPNOTSUPP);
        assert_eq!(
            m.set_flags(&CTX, f.ino, flags::NODUMP).unwrap().flags,
            flags::NODUMP
        );
        let a = m.set_flags(&root, f.ino, flags::IMMUTABLE).unwrap();
        assert_eq!(m.getattr(f.ino).unwrap().flags, flags::IMMUTABLE);
        assert!(a.ctime > f.ctime);

        // Immutable: nothing changes, root included.
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        let touch = SetAttr {
            mtime: Some(SetTime::Now),
            ..SetAttr::default()
        };
        let punch = FallocMode {
            punch_hole: true,
            keep_size: true,
            ..FallocMode::default()
        };
        assert_errno(m.setattr(&root, f.ino, &chmod), libc::EPERM);
        assert_errno(m.setattr(&root, f.ino, &touch), libc::EPERM);
        assert_errno(m.truncate(&root, f.ino, 0), libc::EPERM);
        assert_errno(
            m.fallocate(&root, f.ino, FallocMode::default(), 0, 10),
            libc::EPERM,
        );
        let id = m.new_slice_id().unwrap();
        assert_errno(
            m.write_slices(f.ino, &slice_recs(id, 0, 10), now_nanos()),
            libc::EPERM,
        );
        assert_errno(m.unlink(&root, ROOT_INO, b"f"), libc::EPERM);
        assert_errno(
            m.rename(&root, ROOT_INO, b"f", ROOT_INO, b"g", flags(false, false)),
            libc::EPERM,
        );
        assert_errno(m.link(&root, f.ino, ROOT_INO, b"h"), libc::EPERM);
        assert_errno(
            m.set_xattr(&root, f.ino, b"user.x", b"1", XattrSet::Any),
            libc::EPERM,
        );
        let g = mkfile(m, ROOT_INO, "g");
        assert_errno(
            m.rename(&root, ROOT_INO, b"g", ROOT_INO, b"f", flags(false, false)),
            libc::EPERM,
        );
        assert_eq!(m.getattr(f.ino).unwrap().length, 100);

        // Append-only: grows, its times may be set to now; nothing else.
        m.set_flags(&root, f.ino, flags::APPEND).unwrap();
        write(m, f.ino, 100, 50);
        assert_eq!(m.getattr(f.ino).unwrap().length, 150);
        m.setattr(&root, f.ino, &touch).unwrap();
        m.fallocate(&root, f.ino, FallocMode::default(), 0, 4096)
            .unwrap();
        assert_errno(m.fallocate(&root, f.ino, punch, 0, 10), libc::EPERM);
        assert_errno(m.setattr(&root, f.ino, &chmod), libc::EPERM);
        assert_errno(m.truncate(&root, f.ino, 0), libc::EPERM);
        assert_errno(m.unlink(&root, ROOT_INO, b"f"), libc::EPERM);
        assert_errno(m.copy_range(&root, g.ino, 0, f.ino, 0, 10), libc::EBADF);

        // Directories: immutable takes no entries, append-only keeps those it has.
        let d = mkdir(m, ROOT_INO, "d");
        mkfile(m, d.ino, "in");
        m.set_flags(&root, d.ino, flags::IMMUTABLE).unwrap();
        assert_errno(
            m.mknod(&root, d.ino, b"new", Kind::File, 0o644, 0, None),
            libc::EPERM,
        );
        assert_errno(m.unlink(&root, d.ino, b"in"), libc::EPERM);
        assert_errno(
            m.rename(&root, ROOT_INO, b"g", d.ino, b"g", flags(false, false)),
            libc::EPERM,
        );
        m.set_flags(&root, d.ino, flags::APPEND).unwrap();
        mkfile(m, d.ino, "new");
        m.rename(&root, ROOT_INO, b"g", d.ino, b"g", flags(false, false))
            .unwrap();
        assert_errno(m.unlink(&root, d.ino, b"in"), libc::EPERM);
        assert_errno(
            m.rename(&root, d.ino, b"g", ROOT_INO, b"g", flags(false, false)),
            libc::EPERM,
        );

        // Cleared: everything works again.
        m.set_flags(&root, d.ino, 0).unwrap();
        m.set_flags(&root, f.ino, 0).unwrap();
        m.truncate(&root, f.ino, 0).unwrap();
        m.unlink(&root, d.ino, b"in").unwrap();
        m.unlink(&root, ROOT_INO, b"f").unwrap();
    });
}

fn rename_between_hard_links_is_a_noop(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let d = mkdir(m, ROOT_INO, "d");
        m.link(&CTX, f.ino, ROOT_INO, b"g").unwrap();
        m.link(&CTX, f.ino, d.ino, b"h").unwrap();
        assert!(rename(m, ROOT_INO, "f", ROOT_INO, "g").unwrap().is_none());
        assert!(rename(m, ROOT_INO, "f", d.ino, "h").unwrap().is_none());
        assert!(exchange(m, ROOT_INO, "f", d.ino, "h").unwrap().is_none());
        for (p, n) in [(ROOT_INO, "f"), (ROOT_INO, "g"), (d.ino, "h")] {
            assert_eq!(lookup(m, p, n).unwrap().ino, f.ino, "{n}");
        }
        assert_eq!(nlink(m, f.ino), 3);
    });
}

// ---------------------------------------------------------------------------------------------
// readdir
// ---------------------------------------------------------------------------------------------

fn readdir_lists_everything_with_kinds(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let mut want: HashMap<Vec<u8>, (Ino, Kind)> = HashMap::new();
        for (name, kind) in [
            ("file", Kind::File),
            ("dir", Kind::Dir),
            ("link", Kind::Symlink),
            ("fifo", Kind::Fifo),
            ("chr", Kind::CharDev),
            ("blk", Kind::BlockDev),
            ("sock", Kind::Socket),
        ] {
            let target: Option<&[u8]> = (kind == Kind::Symlink).then_some(b"t");
            let a = m
                .mknod(&CTX, d.ino, name.as_bytes(), kind, 0o644, 0, target)
                .unwrap();
            want.insert(name.as_bytes().to_vec(), (a.ino, kind));
        }
        let l = m.readdir(d.ino, 0, 1000, false).unwrap();
        assert_eq!(l.len(), 9, "{l:?}");
        assert_eq!(
            (l[0].name.as_slice(), l[0].ino, l[0].kind),
            (&b"."[..], d.ino, Kind::Dir)
        );
        assert_eq!(
            (l[1].name.as_slice(), l[1].ino, l[1].kind),
            (&b".."[..], ROOT_INO, Kind::Dir)
        );
        let got: HashMap<Vec<u8>, (Ino, Kind)> = l[2..]
            .iter()
            .map(|e| (e.name.clone(), (e.ino, e.kind)))
            .collect();
        assert_eq!(got, want);
        assert!(l.iter().all(|e| e.attr.is_none()), "no attrs without plus");
        // Cookies resume after the entry.
        let cookies: HashSet<u64> = l.iter().map(|e| e.cookie).collect();
        assert_eq!(cookies.len(), l.len(), "cookies are distinct");
        for (i, e) in l.iter().enumerate() {
            let rest = m.readdir(d.ino, e.cookie, 1000, false).unwrap();
            let rest: Vec<&[u8]> = rest.iter().map(|e| e.name.as_slice()).collect();
            let expect: Vec<&[u8]> = l[i + 1..].iter().map(|e| e.name.as_slice()).collect();
            assert_eq!(rest, expect, "after entry {i}");
        }
        // With attributes.
        let lp = m.readdir(d.ino, 0, 1000, true).unwrap();
        assert_eq!(lp.len(), 9);
        for e in &lp {
            let a = e.attr.as_ref().expect("plus fills attrs");
            assert_eq!(a, &m.getattr(e.ino).unwrap(), "{:?}", e.name);
            assert_eq!(a.kind, e.kind);
        }
        assert_eq!(lp[0].attr.as_ref().unwrap().ino, d.ino);
        assert_eq!(lp[1].attr.as_ref().unwrap().ino, ROOT_INO);
        // The root's ".." is the root; an empty directory has just "." and "..".
        let r = m.readdir(ROOT_INO, 0, 1000, true).unwrap();
        assert_eq!((r[1].name.as_slice(), r[1].ino), (&b".."[..], ROOT_INO));
        let dir = want[&b"dir".to_vec()].0;
        assert_eq!(names(m, dir), vec![".", ".."]);
        // Not a directory, or missing.
        let file = want[&b"file".to_vec()].0;
        assert_errno(m.readdir(file, 0, 10, false), libc::ENOTDIR);
        assert_errno(m.readdir(999_999, 0, 10, false), libc::ENOENT);
    });
}

/// Lists a directory in pages of `limit`; checks each page's size.
fn paged(m: &dyn Meta, dir: Ino, limit: usize, plus: bool) -> Vec<DirEntry> {
    let mut out: Vec<DirEntry> = Vec::new();
    let mut cookie = 0;
    for _ in 0..100_000 {
        let page = m.readdir(dir, cookie, limit, plus).unwrap();
        assert!(
            page.len() <= limit,
            "page of {} > limit {limit}",
            page.len()
        );
        let Some(last) = page.last() else {
            return out;
        };
        cookie = last.cookie;
        out.extend(page);
    }
    panic!("listing never ends");
}

fn readdir_paging(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        let mut want: HashSet<Vec<u8>> = [b".".to_vec(), b"..".to_vec()].into();
        for i in 0..1000 {
            let name = format!("entry-{i:04}");
            if i % 10 == 0 {
                mkdir(m, d.ino, &name);
            } else {
                mkfile(m, d.ino, &name);
            }
            want.insert(name.into_bytes());
        }
        for plus in [false, true] {
            let all = paged(m, d.ino, 7, plus);
            assert_eq!(all.len(), 1002, "plus={plus}");
            let got: HashSet<Vec<u8>> = all.iter().map(|e| e.name.clone()).collect();
            assert_eq!(got.len(), 1002, "plus={plus}: duplicates");
            assert_eq!(got, want, "plus={plus}");
            for e in &all {
                if e.name.starts_with(b"entry-") {
                    let i: usize = std::str::from_utf8(&e.name[6..]).unwrap().parse().unwrap();
                    let k = if i % 10 == 0 { Kind::Dir } else { Kind::File };
                    assert_eq!(e.kind, k, "{i}");
                }
                assert_eq!(e.attr.is_some(), plus);
                if let Some(a) = &e.attr {
                    assert_eq!((a.ino, a.kind), (e.ino, e.kind));
                }
            }
        }
    });
}

fn readdir_respects_small_limits(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        for i in 0..5 {
            mkfile(m, d.ino, &format!("f{i}"));
        }
        for limit in [1, 2, 3] {
            let all = paged(m, d.ino, limit, false);
            let got: Vec<&[u8]> = all.iter().map(|e| e.name.as_slice()).collect();
            let want: Vec<&[u8]> = vec![b".", b"..", b"f0", b"f1", b"f2", b"f3", b"f4"];
            assert_eq!(got, want, "limit {limit}");
        }
    });
}

fn readdir_paging_with_concurrent_changes(e: Engine) {
    each(e, |m| {
        let d = mkdir(m, ROOT_INO, "d");
        for i in 0..100 {
            mkfile(m, d.ino, &format!("old-{i:03}"));
        }
        let mut seen: Vec<Vec<u8>> = Vec::new();
        let mut cookie = 0;
        let mut pages = 0;
        let mut removed = HashSet::new();
        loop {
            let page = m.readdir(d.ino, cookie, 7, false).unwrap();
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            seen.extend(page.into_iter().map(|e| e.name));
            pages += 1;
            let pause = match pages {
                3 => Some((["old-003", "old-004"], ["old-090", "old-091"], "old-013")),
                8 => Some((["old-020", "old-021"], ["old-092", "old-093"], "old-040")),
                _ => None,
            };
            if let Some((listed, unlisted, moved)) = pause {
                for n in listed.iter().chain([moved].iter()) {
                    assert!(seen.contains(&n.as_bytes().to_vec()), "{n} listed already");
                }
                // New entries while the listing is under way...
                for j in 0..30 {
                    mkfile(m, d.ino, &format!("new-{pages}-{j:02}"));
                }
                // ...removals of entries listed already and not listed yet...
                for n in listed.iter().chain(unlisted.iter()) {
                    m.unlink(&CTX, d.ino, n.as_bytes()).unwrap();
                    removed.insert(n.to_string());
                }
                // ...and a rename of an entry listed already (to a new name).
                m.rename(
                    &CTX,
                    d.ino,
                    moved.as_bytes(),
                    d.ino,
                    format!("moved-{pages}").as_bytes(),
                    RenameFlags::default(),
                )
                .unwrap();
                removed.insert(moved.to_string());
            }
            assert!(pages < 1000, "listing never ends");
        }
        let mut counts: HashMap<&[u8], usize> = HashMap::new();
        for n in &seen {
            *counts.entry(n.as_slice()).or_default() += 1;
        }
        let dups: Vec<_> = counts
            .iter()
            .filter(|(_, c)| **c > 1)
            .map(|(n, _)| String::from_utf8_lossy(n))
            .collect();
        assert!(dups.is_empty(), "listed twice: {dups:?}");
        // Every entry that existed throughout is listed.
        for i in 0..100 {
            let name = format!("old-{i:03}");
            if !removed.contains(&name) {
                assert_eq!(counts.get(name.as_bytes()), Some(&1), "{name} missing");
            }
        }
        // Removed entries that had not been listed yet do not show up.
        for n in ["old-090", "old-091", "old-092", "old-093"] {
            assert!(!counts.contains_key(n.as_bytes()), "{n} was removed");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// setattr
// ---------------------------------------------------------------------------------------------

fn setattr_fields(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let set = |s: SetAttr| m.setattr(&CTX, f.ino, &s).unwrap();
        // Nothing to change: nothing changes, ctime included.
        tick();
        assert_eq!(set(SetAttr::default()), f);
        assert_eq!(m.getattr(f.ino).unwrap(), f);
        // Mode.
        let t0 = tick();
        let a = set(SetAttr {
            mode: Some(0o4711),
            ..Default::default()
        });
        assert_eq!(a.mode, 0o4711);
        assert!(a.ctime >= t0, "ctime moves");
        assert_eq!((a.mtime, a.atime), (f.mtime, f.atime), "only ctime moves");
        assert_eq!(m.getattr(f.ino).unwrap(), a);
        let a = set(SetAttr {
            mode: Some(libc::S_IFREG | 0o640),
            ..Default::default()
        });
        assert_eq!((a.mode, a.kind), (0o640, Kind::File), "type bits ignored");
        // Owner.
        let t1 = tick();
        let a = set(SetAttr {
            uid: Some(4242),
            gid: Some(4343),
            ..Default::default()
        });
        assert_eq!((a.uid, a.gid, a.mode), (4242, 4343, 0o640));
        assert!(a.ctime >= t1);
        let a = set(SetAttr {
            gid: Some(7),
            ..Default::default()
        });
        assert_eq!((a.uid, a.gid), (4242, 7), "uid kept");
        // Times at given instants.
        let t2 = tick();
        let a = set(SetAttr {
            atime: Some(SetTime::At(1_234_567_891)),
            mtime: Some(SetTime::At(987_654_321_000)),
            ..Default::default()
        });
        assert_eq!((a.atime, a.mtime), (1_234_567_891, 987_654_321_000));
        assert!(a.ctime >= t2, "ctime is now, not the given time");
        let a = set(SetAttr {
            mtime: Some(SetTime::At(5)),
            ..Default::default()
        });
        assert_eq!((a.atime, a.mtime), (1_234_567_891, 5), "atime kept");
        // Times set to now.
        let t3 = tick();
        let a = set(SetAttr {
            atime: Some(SetTime::Now),
            ..Default::default()
        });
        let t4 = now_nanos();
        assert!(a.atime >= t3 && a.atime <= t4);
        assert_eq!(a.mtime, 5);
        let a = set(SetAttr {
            mtime: Some(SetTime::Now),
            ..Default::default()
        });
        assert!(a.mtime >= t3 && a.mtime <= now_nanos());
        assert_eq!(m.getattr(f.ino).unwrap(), a);
        // Then again nothing.
        tick();
        assert_eq!(set(SetAttr::default()), a);
        assert_eq!(m.getattr(f.ino).unwrap(), a);
        // Directories and the root too.
        let r = m
            .setattr(
                &CTX,
                ROOT_INO,
                &SetAttr {
                    mode: Some(0o1777),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!((r.mode, r.kind, r.nlink), (0o1777, Kind::Dir, 2));
        assert_errno(m.setattr(&CTX, 999_999, &SetAttr::default()), libc::ENOENT);
    });
}

// ---------------------------------------------------------------------------------------------
// File data
// ---------------------------------------------------------------------------------------------

fn write_slices_and_read_chunk(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        // Fresh slice ids are distinct and never 0.
        let ids: HashSet<u64> = (0..2000).map(|_| m.new_slice_id().unwrap()).collect();
        assert_eq!(ids.len(), 2000);
        assert!(!ids.contains(&0));
        let rec = |pos: u32, id: u64, len: u32| SliceRec {
            pos,
            id,
            size: len,
            off: 0,
            len,
        };
        let (a, b, c) = (
            m.new_slice_id().unwrap(),
            m.new_slice_id().unwrap(),
            m.new_slice_id().unwrap(),
        );
        assert!(!ids.contains(&a) && !ids.contains(&b) && !ids.contains(&c));
        let t = 1_700_000_000_123_456_000;
        let at = m
            .write_slices(f.ino, &[(0, rec(0, a, 1000)), (0, rec(500, b, 100))], t)
            .unwrap();
        assert_eq!(at.length, 1000);
        assert_eq!((at.mtime, at.ctime), (t, t));
        assert_eq!(m.getattr(f.ino).unwrap(), at);
        assert_eq!(
            m.read_chunk(f.ino, 0).unwrap(),
            vec![rec(0, a, 1000), rec(500, b, 100)]
        );
        // A later write appends after the earlier records.
        let at = m
            .write_slices(f.ino, &[(0, rec(200, c, 50))], t + 1)
            .unwrap();
        assert_eq!((at.length, at.mtime), (1000, t + 1), "no shrink");
        assert_eq!(
            m.read_chunk(f.ino, 0).unwrap(),
            vec![rec(0, a, 1000), rec(500, b, 100), rec(200, c, 50)]
        );
        assert_eq!(
            extents(m, f.ino, 0, 1000),
            vec![
                (0, 200, a, 0),
                (200, 50, c, 0),
                (250, 250, a, 250),
                (500, 100, b, 0),
                (600, 400, a, 600)
            ]
        );
        // A write in a later chunk grows the file to there; chunks between are empty.
        let d = m.new_slice_id().unwrap();
        let at = m
            .write_slices(f.ino, &[(2, rec(5, d, 4096))], t + 2)
            .unwrap();
        assert_eq!(at.length, 2 * CHUNK_SIZE + 5 + 4096);
        assert!(m.read_chunk(f.ino, 1).unwrap().is_empty());
        assert_eq!(m.read_chunk(f.ino, 2).unwrap(), vec![rec(5, d, 4096)]);
        assert!(m.read_chunk(f.ino, 3).unwrap().is_empty());
        assert!(m.read_chunk(999_999, 0).unwrap_or_default().is_empty());
        // Refcounts.
        let r = refs(m);
        for id in [a, b, c, d] {
            assert_eq!(r.get(&id), Some(&1), "slice {id}");
        }
        let sizes: HashMap<u64, u32> = m
            .all_slices()
            .unwrap()
            .into_iter()
            .map(|(id, s, _)| (id, s))
            .collect();
        assert_eq!((sizes[&a], sizes[&d]), (1000, 4096));
        // Only files take data.
        let dir = mkdir(m, ROOT_INO, "d");
        assert!(m.write_slices(dir.ino, &[(0, rec(0, d, 1))], t).is_err());
        assert_errno(
            m.write_slices(999_999, &[(0, rec(0, d, 1))], t),
            libc::ENOENT,
        );
    });
}

fn truncate_shrink_then_grow_reads_zeros(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let s = write(m, f.ino, 0, MIB as u32);
        let t0 = tick();
        let a = m.truncate(&CTX, f.ino, 100).unwrap();
        assert_eq!(a.length, 100);
        assert!(a.mtime >= t0 && a.ctime >= t0);
        assert_eq!(extents(m, f.ino, 0, 100), vec![(0, 100, s, 0)]);
        let a = m.truncate(&CTX, f.ino, MIB).unwrap();
        assert_eq!(a.length, MIB);
        assert_eq!(m.getattr(f.ino).unwrap().length, MIB);
        assert_eq!(
            extents(m, f.ino, 0, MIB),
            vec![(0, 100, s, 0), (100, MIB - 100, 0, 0)],
            "bytes cut by truncate must read as zeros after growing"
        );
        // Still referenced by the first 100 bytes.
        assert_eq!(refs(m).get(&s), Some(&1));
        assert!(!dead_ids(m).contains(&s));
        // A write over the zeros shows through.
        let s2 = write(m, f.ino, 4096, 4096);
        assert_eq!(
            extents(m, f.ino, 0, MIB),
            vec![
                (0, 100, s, 0),
                (100, 3996, 0, 0),
                (4096, 4096, s2, 0),
                (8192, MIB - 8192, 0, 0)
            ]
        );
        // Shrink to a point inside the second slice, grow again.
        m.truncate(&CTX, f.ino, 5000).unwrap();
        m.truncate(&CTX, f.ino, 3 * CHUNK_SIZE).unwrap();
        assert_eq!(
            extents(m, f.ino, 0, 3 * CHUNK_SIZE),
            vec![
                (0, 100, s, 0),
                (100, 3996, 0, 0),
                (4096, 904, s2, 0),
                (5000, 3 * CHUNK_SIZE - 5000, 0, 0)
            ]
        );
        // Errors.
        let d = mkdir(m, ROOT_INO, "d");
        assert_errno(m.truncate(&CTX, d.ino, 0), libc::EISDIR);
        let l = m
            .mknod(&CTX, ROOT_INO, b"l", Kind::Symlink, 0o777, 0, Some(b"x"))
            .unwrap();
        assert_errno(m.truncate(&CTX, l.ino, 0), libc::EINVAL);
        assert_errno(m.truncate(&CTX, 999_999, 0), libc::ENOENT);
    });
}

fn truncate_across_chunks_frees_slices(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let a = write(m, f.ino, 0, 4096);
        // One slice across the first chunk boundary (two records).
        let b = write(m, f.ino, CHUNK_SIZE - 4096, 8192);
        let c = write(m, f.ino, 2 * CHUNK_SIZE, 4096);
        let d = write(m, f.ino, 3 * CHUNK_SIZE + 100, 4096);
        assert_eq!(m.getattr(f.ino).unwrap().length, 3 * CHUNK_SIZE + 4196);
        assert_eq!(m.read_chunk(f.ino, 1).unwrap().len(), 1);
        assert_eq!(
            extents(m, f.ino, CHUNK_SIZE - 4096, CHUNK_SIZE + 4096),
            vec![(CHUNK_SIZE - 4096, 8192, b, 0)]
        );
        // Cut inside chunk 1: chunks 2 and 3 go, their slices die.
        let t = m.truncate(&CTX, f.ino, CHUNK_SIZE + 100).unwrap();
        assert_eq!(t.length, CHUNK_SIZE + 100);
        assert!(m.read_chunk(f.ino, 2).unwrap().is_empty());
        assert!(m.read_chunk(f.ino, 3).unwrap().is_empty());
        let dead = dead_ids(m);
        assert!(dead.contains(&c) && dead.contains(&d), "{dead:?}");
        assert!(!dead.contains(&a) && !dead.contains(&b), "{dead:?}");
        let r = refs(m);
        assert!(!r.contains_key(&c) && !r.contains_key(&d));
        assert_eq!(r.get(&b), Some(&2), "b still has both records");
        assert_eq!(
            extents(m, f.ino, CHUNK_SIZE, CHUNK_SIZE + 100),
            vec![(CHUNK_SIZE, 100, b, 4096)]
        );
        assert_eq!(m.usage().unwrap().used_bytes, align4k(CHUNK_SIZE + 100));
        // Cut exactly at the chunk boundary: chunk 1 goes; b lives on in chunk 0.
        m.truncate(&CTX, f.ino, CHUNK_SIZE).unwrap();
        assert!(m.read_chunk(f.ino, 1).unwrap().is_empty());
        assert_eq!(refs(m).get(&b), Some(&1));
        assert!(!dead_ids(m).contains(&b));
        // Grow back: the dropped range reads as zeros.
        m.truncate(&CTX, f.ino, 4 * CHUNK_SIZE).unwrap();
        assert_eq!(
            extents(m, f.ino, 0, 4 * CHUNK_SIZE),
            vec![
                (0, 4096, a, 0),
                (4096, CHUNK_SIZE - 8192, 0, 0),
                (CHUNK_SIZE - 4096, 4096, b, 0),
                (CHUNK_SIZE, 3 * CHUNK_SIZE, 0, 0)
            ]
        );
        // To zero: everything dies.
        let t = m.truncate(&CTX, f.ino, 0).unwrap();
        assert_eq!(t.length, 0);
        for i in 0..4 {
            assert!(m.read_chunk(f.ino, i).unwrap().is_empty(), "chunk {i}");
        }
        let dead = dead_ids(m);
        for id in [a, b, c, d] {
            assert!(dead.contains(&id), "slice {id} not dead: {dead:?}");
        }
        assert!(refs(m).is_empty());
        assert_eq!(m.usage().unwrap().used_bytes, 0);
        assert_eq!(m.usage().unwrap().slices, 0);
    });
}

fn fallocate_modes(e: Engine) {
    each(e, |m| {
        let plain = FallocMode::default();
        let keep = FallocMode {
            keep_size: true,
            ..Default::default()
        };
        let punch = FallocMode {
            punch_hole: true,
            keep_size: true,
            ..Default::default()
        };
        let zero = FallocMode {
            zero_range: true,
            ..Default::default()
        };
        let zero_keep = FallocMode {
            zero_range: true,
            keep_size: true,
            ..Default::default()
        };
        // Plain: extends, reads zeros, never shrinks.
        let f = mkfile(m, ROOT_INO, "f");
        let a = m.fallocate(&CTX, f.ino, plain, 0, 8192).unwrap();
        assert_eq!(a.length, 8192);
        assert_eq!(m.getattr(f.ino).unwrap().length, 8192);
        assert_eq!(extents(m, f.ino, 0, 8192), vec![(0, 8192, 0, 0)]);
        assert_eq!(
            m.fallocate(&CTX, f.ino, plain, 100, 100).unwrap().length,
            8192
        );
        assert_eq!(
            m.fallocate(&CTX, f.ino, plain, CHUNK_SIZE, 10)
                .unwrap()
                .length,
            CHUNK_SIZE + 10
        );
        // Plain over data keeps the data.
        let g = mkfile(m, ROOT_INO, "g");
        let s = write(m, g.ino, 0, 4096);
        m.fallocate(&CTX, g.ino, plain, 0, 16384).unwrap();
        assert_eq!(
            extents(m, g.ino, 0, 16384),
            vec![(0, 4096, s, 0), (4096, 12288, 0, 0)]
        );
        // keep_size: no growth.
        let k = mkfile(m, ROOT_INO, "k");
        assert_eq!(m.fallocate(&CTX, k.ino, keep, 0, 8192).unwrap().length, 0);
        assert_eq!(m.getattr(k.ino).unwrap().length, 0);
        // Punch a hole: zeros inside, size kept, data around kept.
        let h = mkfile(m, ROOT_INO, "h");
        let s = write(m, h.ino, 0, 16384);
        let t0 = tick();
        let a = m.fallocate(&CTX, h.ino, punch, 4096, 4096).unwrap();
        assert_eq!(a.length, 16384);
        assert!(a.mtime >= t0 && a.ctime >= t0);
        assert_eq!(
            extents(m, h.ino, 0, 16384),
            vec![(0, 4096, s, 0), (4096, 4096, 0, 0), (8192, 8192, s, 8192)]
        );
        // Punching past the end does not grow the file.
        let a = m.fallocate(&CTX, h.ino, punch, 16000, 10_000).unwrap();
        assert_eq!(a.length, 16384);
        assert_eq!(
            extents(m, h.ino, 12288, 16384),
            vec![(12288, 3712, s, 12288), (16000, 384, 0, 0)]
        );
        // Zero range: zeros, grows the file.
        let z = mkfile(m, ROOT_INO, "z");
        let s = write(m, z.ino, 0, 8192);
        let a = m.fallocate(&CTX, z.ino, zero, 4096, 8192).unwrap();
        assert_eq!(a.length, 12288);
        assert_eq!(
            extents(m, z.ino, 0, 12288),
            vec![(0, 4096, s, 0), (4096, 8192, 0, 0)]
        );
        // Zero range with keep_size: zeros, no growth.
        let a = m.fallocate(&CTX, z.ino, zero_keep, 0, 100_000).unwrap();
        assert_eq!(a.length, 12288);
        assert_eq!(extents(m, z.ino, 0, 12288), vec![(0, 12288, 0, 0)]);
        // Across a chunk boundary.
        let y = mkfile(m, ROOT_INO, "y");
        let s = write(m, y.ino, CHUNK_SIZE - 4096, 8192);
        m.fallocate(&CTX, y.ino, punch, CHUNK_SIZE - 1000, 2000)
            .unwrap();
        assert_eq!(
            extents(m, y.ino, CHUNK_SIZE - 4096, CHUNK_SIZE + 4096),
            vec![
                (CHUNK_SIZE - 4096, 3096, s, 0),
                (CHUNK_SIZE - 1000, 2000, 0, 0),
                (CHUNK_SIZE + 1000, 3096, s, 5096)
            ]
        );
        assert_eq!(m.getattr(y.ino).unwrap().length, CHUNK_SIZE + 4096);
        // Errors.
        assert_errno(m.fallocate(&CTX, f.ino, plain, 0, 0), libc::EINVAL);
        let d = mkdir(m, ROOT_INO, "d");
        assert_errno(m.fallocate(&CTX, d.ino, plain, 0, 10), libc::EISDIR);
        assert_errno(m.fallocate(&CTX, 999_999, plain, 0, 10), libc::ENOENT);
    });
}

fn copy_range_references_source_slices(e: Engine) {
    each(e, |m| {
        let src = mkfile(m, ROOT_INO, "src");
        let s1 = write(m, src.ino, 0, 4096);
        let s2 = write(m, src.ino, 8192, 4096);
        assert_eq!(m.getattr(src.ino).unwrap().length, 12288);
        // The destination holds data everywhere: the source's hole must become zeros.
        let dst = mkfile(m, ROOT_INO, "dst");
        let dd = write(m, dst.ino, 0, 20_000);
        let t0 = tick();
        let (n, a) = m.copy_range(&CTX, src.ino, 0, dst.ino, 100, 12288).unwrap();
        assert_eq!(n, 12288);
        assert_eq!(a.length, 20_000);
        assert!(a.mtime >= t0 && a.ctime >= t0);
        assert_eq!(m.getattr(dst.ino).unwrap(), a);
        assert_eq!(
            extents(m, dst.ino, 0, 20_000),
            vec![
                (0, 100, dd, 0),
                (100, 4096, s1, 0),
                (4196, 4096, 0, 0),
                (8292, 4096, s2, 0),
                (12388, 20_000 - 12388, dd, 12388)
            ]
        );
        // The source is untouched.
        assert_eq!(
            extents(m, src.ino, 0, 12288),
            vec![(0, 4096, s1, 0), (4096, 4096, 0, 0), (8192, 4096, s2, 0)]
        );
        let r = refs(m);
        assert_eq!((r[&s1], r[&s2], r[&dd]), (2, 2, 1));
        // Part of a slice, to a new file.
        let part = mkfile(m, ROOT_INO, "part");
        let (n, a) = m
            .copy_range(&CTX, src.ino, 1000, part.ino, 0, 2000)
            .unwrap();
        assert_eq!((n, a.length), (2000, 2000));
        assert_eq!(extents(m, part.ino, 0, 2000), vec![(0, 2000, s1, 1000)]);
        // Clamped at the source's end.
        let tail = mkfile(m, ROOT_INO, "tail");
        let (n, a) = m
            .copy_range(&CTX, src.ino, 10_000, tail.ino, 0, 1 << 30)
            .unwrap();
        assert_eq!((n, a.length), (2288, 2288));
        assert_eq!(extents(m, tail.ino, 0, 2288), vec![(0, 2288, s2, 1808)]);
        // Nothing to copy at or past the end.
        let (n, a) = m
            .copy_range(&CTX, src.ino, 12288, tail.ino, 0, 100)
            .unwrap();
        assert_eq!((n, a.length), (0, 2288));
        let (n, _) = m
            .copy_range(&CTX, src.ino, 50_000, tail.ino, 0, 100)
            .unwrap();
        assert_eq!(n, 0);
        // A source ending in a hole (fallocate) copied over data: the hole becomes zeros.
        let src2 = mkfile(m, ROOT_INO, "src2");
        let s3 = write(m, src2.ino, 0, 4096);
        m.fallocate(&CTX, src2.ino, FallocMode::default(), 0, 16384)
            .unwrap();
        // ...and a punched hole (a zero record) inside its data.
        let punch = FallocMode {
            punch_hole: true,
            keep_size: true,
            ..Default::default()
        };
        m.fallocate(&CTX, src2.ino, punch, 1000, 1000).unwrap();
        let dst2 = mkfile(m, ROOT_INO, "dst2");
        let dd2 = write(m, dst2.ino, 0, 20_000);
        let (n, a) = m.copy_range(&CTX, src2.ino, 0, dst2.ino, 0, 16384).unwrap();
        assert_eq!((n, a.length), (16384, 20_000));
        assert_eq!(
            extents(m, dst2.ino, 0, 20_000),
            vec![
                (0, 1000, s3, 0),
                (1000, 1000, 0, 0),
                (2000, 2096, s3, 2000),
                (4096, 12288, 0, 0),
                (16384, 20_000 - 16384, dd2, 16384)
            ]
        );
        // Past the destination's end: a hole before the copy.
        let far = mkfile(m, ROOT_INO, "far");
        let (n, a) = m
            .copy_range(&CTX, src.ino, 0, far.ino, 1 << 20, 4096)
            .unwrap();
        assert_eq!((n, a.length), (4096, (1 << 20) + 4096));
        assert_eq!(
            extents(m, far.ino, 0, (1 << 20) + 4096),
            vec![(0, 1 << 20, 0, 0), (1 << 20, 4096, s1, 0)]
        );
        // Deleting the source keeps the copies' slices alive.
        m.unlink(&CTX, ROOT_INO, b"src").unwrap();
        let dead = dead_ids(m);
        assert!(!dead.contains(&s1) && !dead.contains(&s2), "{dead:?}");
        assert_eq!(
            extents(m, dst.ino, 100, 4196),
            vec![(100, 4096, s1, 0)],
            "copy survives its source"
        );
    });
}

fn copy_range_across_chunk_boundaries(e: Engine) {
    each(e, |m| {
        let src = mkfile(m, ROOT_INO, "src");
        // A 3 MiB slice across the first chunk boundary of the source.
        let s = write(m, src.ino, CHUNK_SIZE - MIB, 3 * MIB as u32);
        let dst = mkfile(m, ROOT_INO, "dst");
        // Source range crosses its boundary 512 KiB in; destination crosses 256 KiB in.
        let (src_off, dst_off, len) = (
            CHUNK_SIZE - 512 * KIB,
            2 * CHUNK_SIZE - 256 * KIB,
            1536 * KIB,
        );
        let (n, a) = m
            .copy_range(&CTX, src.ino, src_off, dst.ino, dst_off, len)
            .unwrap();
        assert_eq!(n, len);
        assert_eq!(a.length, dst_off + len);
        assert_eq!(
            extents(m, dst.ino, 0, dst_off + len),
            vec![(0, dst_off, 0, 0), (dst_off, len, s, 512 * KIB)]
        );
        // Each destination chunk holds only its own part.
        let c1 = slice::build_view(&m.read_chunk(dst.ino, 1).unwrap());
        let c2 = slice::build_view(&m.read_chunk(dst.ino, 2).unwrap());
        assert!(c1.iter().all(|r| r.end() <= CHUNK_SIZE), "{c1:?}");
        assert_eq!(
            c1.iter()
                .filter(|r| r.id == s)
                .map(|r| r.len as u64)
                .sum::<u64>(),
            256 * KIB
        );
        assert_eq!(
            c2.iter()
                .filter(|r| r.id == s)
                .map(|r| r.len as u64)
                .sum::<u64>(),
            len - 256 * KIB
        );
        assert!(m.read_chunk(dst.ino, 0).unwrap().iter().all(|r| r.id == 0));
        // A copy spanning a hole, a chunk boundary and data.
        let h = mkfile(m, ROOT_INO, "h");
        let t = write(m, h.ino, CHUNK_SIZE + 4096, 4096);
        let out = mkfile(m, ROOT_INO, "out");
        let (n, _) = m
            .copy_range(&CTX, h.ino, CHUNK_SIZE - 4096, out.ino, 10, 3 * 4096)
            .unwrap();
        assert_eq!(n, 3 * 4096);
        assert_eq!(
            extents(m, out.ino, 0, 10 + 3 * 4096),
            vec![(0, 8202, 0, 0), (8202, 4096, t, 0)]
        );
    });
}

fn copy_range_same_file_and_errors(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let s = write(m, f.ino, 0, 8192);
        // Overlapping ranges of one file (after clamping at the end of the source).
        for (so, doff, len) in [
            (0, 0, 100),
            (0, 4096, 8192),
            (4096, 100, 8192),
            (100, 50, 100),
        ] {
            assert_errno(
                m.copy_range(&CTX, f.ino, so, f.ino, doff, len),
                libc::EINVAL,
            );
        }
        assert_eq!(extents(m, f.ino, 0, 8192), vec![(0, 8192, s, 0)]);
        // Disjoint ranges of one file are fine.
        let (n, a) = m.copy_range(&CTX, f.ino, 0, f.ino, 8192, 4096).unwrap();
        assert_eq!((n, a.length), (4096, 12288));
        assert_eq!(
            extents(m, f.ino, 0, 12288),
            vec![(0, 8192, s, 0), (8192, 4096, s, 0)]
        );
        let (n, _) = m.copy_range(&CTX, f.ino, 8192, f.ino, 0, 4096).unwrap();
        assert_eq!(n, 4096);
        assert_eq!(refs(m)[&s], 3);
        // Directories and missing inodes.
        let d = mkdir(m, ROOT_INO, "d");
        assert_errno(m.copy_range(&CTX, d.ino, 0, f.ino, 0, 10), libc::EISDIR);
        assert_errno(m.copy_range(&CTX, f.ino, 0, d.ino, 0, 10), libc::EISDIR);
        assert_errno(m.copy_range(&CTX, 999_999, 0, f.ino, 0, 10), libc::ENOENT);
        assert_errno(m.copy_range(&CTX, f.ino, 0, 999_999, 0, 10), libc::ENOENT);
    });
}

fn replace_slices_compaction(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let a = write(m, f.ino, 0, 1000);
        let b = write(m, f.ino, 1000, 1000);
        let c = write(m, f.ino, 500, 1000);
        let recs = m.read_chunk(f.ino, 0).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs.iter().map(|r| r.id).collect::<Vec<_>>(), vec![a, b, c]);
        let before = extents(m, f.ino, 0, 2000);
        // Compact the first two records into one new slice.
        let n = m.new_slice_id().unwrap();
        let rn = SliceRec {
            pos: 0,
            id: n,
            size: 2000,
            off: 0,
            len: 2000,
        };
        assert!(m.replace_slices(f.ino, 0, &recs[..2], &[rn]).unwrap());
        assert_eq!(m.read_chunk(f.ino, 0).unwrap(), vec![rn, recs[2]]);
        let r = refs(m);
        assert!(!r.contains_key(&a) && !r.contains_key(&b), "{r:?}");
        assert_eq!((r[&n], r[&c]), (1, 1));
        let dead = dead_ids(m);
        assert!(dead.contains(&a) && dead.contains(&b), "{dead:?}");
        assert!(!dead.contains(&n) && !dead.contains(&c));
        assert_eq!(
            extents(m, f.ino, 0, 2000),
            vec![(0, 500, n, 0), (500, 1000, c, 0), (1500, 500, n, 1500)]
        );
        assert_ne!(
            extents(m, f.ino, 0, 2000),
            before,
            "ids changed, layout same"
        );
        // A stale prefix is refused, and nothing changes.
        let x = m.new_slice_id().unwrap();
        let rx = SliceRec { id: x, ..rn };
        assert!(!m.replace_slices(f.ino, 0, &recs[..2], &[rx]).unwrap());
        assert!(
            !m.replace_slices(f.ino, 0, &[rn, recs[2], rn], &[rx])
                .unwrap()
        );
        assert!(!m.replace_slices(f.ino, 0, &[recs[2]], &[rx]).unwrap());
        assert_eq!(m.read_chunk(f.ino, 0).unwrap(), vec![rn, recs[2]]);
        assert!(
            !refs(m).contains_key(&x),
            "a refused replace takes no reference"
        );
        // A record appended meanwhile stays after the replaced prefix.
        let cur = m.read_chunk(f.ino, 0).unwrap();
        let d = write(m, f.ino, 100, 10);
        assert!(m.replace_slices(f.ino, 0, &cur, &[rx]).unwrap());
        let after = m.read_chunk(f.ino, 0).unwrap();
        assert_eq!(after.len(), 2);
        assert_eq!((after[0], after[1].id), (rx, d));
        let dead = dead_ids(m);
        assert!(dead.contains(&n) && dead.contains(&c));
        // A slice also referenced elsewhere survives compaction of one file.
        let g = mkfile(m, ROOT_INO, "g");
        let h = mkfile(m, ROOT_INO, "h");
        let s = write(m, g.ino, 0, 4096);
        m.copy_range(&CTX, g.ino, 0, h.ino, 0, 4096).unwrap();
        assert_eq!(refs(m)[&s], 2);
        let y = m.new_slice_id().unwrap();
        let gr = m.read_chunk(g.ino, 0).unwrap();
        let ry = SliceRec { id: y, ..gr[0] };
        assert!(m.replace_slices(g.ino, 0, &gr, &[ry]).unwrap());
        let r = refs(m);
        assert_eq!((r[&s], r[&y]), (1, 1));
        assert!(!dead_ids(m).contains(&s));
        // Replacing a whole chunk with nothing empties it.
        let hr = m.read_chunk(h.ino, 0).unwrap();
        assert!(m.replace_slices(h.ino, 0, &hr, &[]).unwrap());
        assert!(m.read_chunk(h.ino, 0).unwrap().is_empty());
        assert!(dead_ids(m).contains(&s));
        // A slice both in the old and the new records never dies on the way.
        let k = mkfile(m, ROOT_INO, "k");
        let p = write(m, k.ino, 0, 4096);
        let q = write(m, k.ino, 0, 100);
        let kr = m.read_chunk(k.ino, 0).unwrap();
        let trimmed = SliceRec {
            pos: 100,
            off: 100,
            len: 3996,
            ..kr[0]
        };
        assert!(m.replace_slices(k.ino, 0, &kr, &[kr[1], trimmed]).unwrap());
        let r = refs(m);
        assert_eq!((r.get(&p), r.get(&q)), (Some(&1), Some(&1)), "{r:?}");
        let dead = dead_ids(m);
        assert!(!dead.contains(&p) && !dead.contains(&q), "{dead:?}");
        assert_eq!(
            extents(m, k.ino, 0, 4096),
            vec![(0, 100, q, 0), (100, 3996, p, 100)]
        );
    });
}

fn all_slices_refcounts(e: Engine) {
    each(e, |m| {
        assert!(m.all_slices().unwrap().is_empty());
        let f = mkfile(m, ROOT_INO, "f");
        let s = m.new_slice_id().unwrap();
        // One slice referenced by two records.
        let recs = [
            (
                0,
                SliceRec {
                    pos: 0,
                    id: s,
                    size: 300,
                    off: 0,
                    len: 100,
                },
            ),
            (
                0,
                SliceRec {
                    pos: 200,
                    id: s,
                    size: 300,
                    off: 200,
                    len: 100,
                },
            ),
        ];
        m.write_slices(f.ino, &recs, now_nanos()).unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 2)]);
        // Zero records are no slices.
        m.write_slices(f.ino, &[(0, SliceRec::zero(50, 10))], now_nanos())
            .unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 2)]);
        // A copy adds references.
        let g = mkfile(m, ROOT_INO, "g");
        m.copy_range(&CTX, f.ino, 0, g.ino, 0, 50).unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 3)]);
        let u = m.usage().unwrap();
        assert_eq!((u.slices, u.slice_bytes), (1, 300));
        // Removing files drops them.
        m.unlink(&CTX, ROOT_INO, b"g").unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 2)]);
        assert!(!dead_ids(m).contains(&s));
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert!(m.all_slices().unwrap().is_empty());
        assert_eq!(
            m.dead_slices(10).unwrap(),
            vec![DeadSlice { id: s, size: 300 }]
        );
        let u = m.usage().unwrap();
        assert_eq!((u.slices, u.slice_bytes, u.pending_delete), (0, 0, 1));
        // A reference committed after the slice died (a piece of a pack, committed after the
        // pack's other files went) takes it off the deletion queue.
        let h = mkfile(m, ROOT_INO, "h");
        m.write_slices(h.ino, &recs[1..], now_nanos()).unwrap();
        assert_eq!(m.all_slices().unwrap(), vec![(s, 300, 1)]);
        assert!(m.dead_slices(10).unwrap().is_empty());
        m.unlink(&CTX, ROOT_INO, b"h").unwrap();
        assert_eq!(
            m.dead_slices(10).unwrap(),
            vec![DeadSlice { id: s, size: 300 }]
        );
        m.forget_dead_slices(&[s]).unwrap();
        assert!(m.dead_slices(10).unwrap().is_empty());
        assert_eq!(m.usage().unwrap().pending_delete, 0);
    });
}

// ---------------------------------------------------------------------------------------------
// xattrs
// ---------------------------------------------------------------------------------------------

fn xattrs(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        assert!(m.list_xattr(f.ino).unwrap().is_empty());
        assert_errno(m.get_xattr(f.ino, b"user.a"), libc::ENODATA);
        let t0 = tick();
        m.set_xattr(&CTX, f.ino, b"user.b", b"2", XattrSet::Any)
            .unwrap();
        assert!(m.getattr(f.ino).unwrap().ctime >= t0, "set moves ctime");
        m.set_xattr(&CTX, f.ino, b"user.a", b"1", XattrSet::Any)
            .unwrap();
        m.set_xattr(&CTX, f.ino, b"user.empty", b"", XattrSet::Any)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, b"user.a").unwrap(), b"1");
        assert_eq!(m.get_xattr(f.ino, b"user.b").unwrap(), b"2");
        assert_eq!(m.get_xattr(f.ino, b"user.empty").unwrap(), b"");
        let mut l = m.list_xattr(f.ino).unwrap();
        l.sort();
        assert_eq!(
            l,
            vec![
                b"user.a".to_vec(),
                b"user.b".to_vec(),
                b"user.empty".to_vec()
            ]
        );
        // Any overwrites.
        m.set_xattr(&CTX, f.ino, b"user.a", b"one", XattrSet::Any)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, b"user.a").unwrap(), b"one");
        // Create / Replace.
        assert_errno(
            m.set_xattr(&CTX, f.ino, b"user.a", b"x", XattrSet::Create),
            libc::EEXIST,
        );
        assert_eq!(m.get_xattr(f.ino, b"user.a").unwrap(), b"one");
        m.set_xattr(&CTX, f.ino, b"user.c", b"3", XattrSet::Create)
            .unwrap();
        assert_errno(
            m.set_xattr(&CTX, f.ino, b"user.none", b"x", XattrSet::Replace),
            libc::ENODATA,
        );
        assert_errno(m.get_xattr(f.ino, b"user.none"), libc::ENODATA);
        m.set_xattr(&CTX, f.ino, b"user.c", b"three", XattrSet::Replace)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, b"user.c").unwrap(), b"three");
        // Binary values, exactly at the limit.
        let big: Vec<u8> = (0..MAX_XATTR_VALUE).map(|i| (i * 7) as u8).collect();
        m.set_xattr(&CTX, f.ino, b"user.big", &big, XattrSet::Any)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, b"user.big").unwrap(), big);
        let long_ok = vec![b'n'; MAX_XATTR_NAME];
        m.set_xattr(&CTX, f.ino, &long_ok, b"v", XattrSet::Any)
            .unwrap();
        assert_eq!(m.get_xattr(f.ino, &long_ok).unwrap(), b"v");
        // Over the limits.
        let too_long = vec![b'n'; MAX_XATTR_NAME + 1];
        assert_errno(
            m.set_xattr(&CTX, f.ino, &too_long, b"v", XattrSet::Any),
            libc::ERANGE,
        );
        assert_errno(m.get_xattr(f.ino, &too_long), libc::ERANGE);
        assert_errno(
            m.set_xattr(
                &CTX,
                f.ino,
                b"user.huge",
                &vec![0u8; MAX_XATTR_VALUE + 1],
                XattrSet::Any,
            ),
            libc::E2BIG,
        );
        assert_errno(m.get_xattr(f.ino, b"user.huge"), libc::ENODATA);
        // Remove.
        let t1 = tick();
        m.remove_xattr(&CTX, f.ino, b"user.a").unwrap();
        assert!(m.getattr(f.ino).unwrap().ctime >= t1, "remove moves ctime");
        assert_errno(m.get_xattr(f.ino, b"user.a"), libc::ENODATA);
        assert_errno(m.remove_xattr(&CTX, f.ino, b"user.a"), libc::ENODATA);
        assert_errno(m.remove_xattr(&CTX, f.ino, b"user.none"), libc::ENODATA);
        let l = m.list_xattr(f.ino).unwrap();
        assert_eq!(l.len(), 5, "{l:?}");
        assert!(!l.contains(&b"user.a".to_vec()));
        // Per inode: a directory has its own, and a new file none.
        let d = mkdir(m, ROOT_INO, "d");
        m.set_xattr(&CTX, d.ino, b"user.a", b"dir", XattrSet::Create)
            .unwrap();
        assert_eq!(m.get_xattr(d.ino, b"user.a").unwrap(), b"dir");
        assert_errno(m.get_xattr(f.ino, b"user.a"), libc::ENODATA);
        assert_errno(
            m.set_xattr(&CTX, d.ino, b"", b"x", XattrSet::Any),
            libc::EINVAL,
        );
        // Missing inode.
        assert_errno(m.get_xattr(999_999, b"user.a"), libc::ENOENT);
        assert_errno(m.list_xattr(999_999), libc::ENOENT);
        assert_errno(
            m.set_xattr(&CTX, 999_999, b"user.a", b"x", XattrSet::Any),
            libc::ENOENT,
        );
        assert_errno(m.remove_xattr(&CTX, 999_999, b"user.a"), libc::ENOENT);
        // A deleted inode's xattrs do not leak to anything later.
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_errno(m.list_xattr(f.ino), libc::ENOENT);
    });
}

// ---------------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------------

fn sessions_register_and_close(e: Engine) {
    each(e, |m| {
        let s = m.sessions().unwrap();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].pid, std::process::id());
        assert_eq!(s[0].mountpoint, "/mnt/test");
        assert_eq!(s[0].host, host());
        assert!(s[0].id != 0);
        assert!(s[0].heartbeat > 0 && s[0].started > 0);
        let hb = s[0].heartbeat;
        tick();
        m.heartbeat().unwrap();
        assert!(m.sessions().unwrap()[0].heartbeat > hb, "heartbeat moves");
        m.close_session().unwrap();
        assert!(m.sessions().unwrap().is_empty());
        // A new one.
        let t0 = tick();
        let id = m.new_session(session_info("/mnt/other")).unwrap();
        let s = m.sessions().unwrap();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].id, s[0].pid), (id, std::process::id()));
        assert_eq!(s[0].mountpoint, "/mnt/other");
        assert!(s[0].started >= t0);
        m.close_session().unwrap();
        assert!(m.sessions().unwrap().is_empty());
    });
}

fn close_session_reclaims_unlinked_open_inodes(e: Engine) {
    each(e, |m| {
        let f = mkfile(m, ROOT_INO, "f");
        let s = write(m, f.ino, 0, 4096);
        let keep = mkfile(m, ROOT_INO, "keep");
        let inodes = m.usage().unwrap().inodes;
        m.open_inode(f.ino).unwrap();
        m.open_inode(keep.ino).unwrap();
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!(m.getattr(f.ino).unwrap().nlink, 0);
        assert!(!dead_ids(m).contains(&s));
        m.close_session().unwrap();
        assert_errno(m.getattr(f.ino), libc::ENOENT);
        assert!(dead_ids(m).contains(&s));
        assert_eq!(m.usage().unwrap().inodes, inodes - 1);
        // Open but linked: kept.
        assert_eq!(m.getattr(keep.ino).unwrap().nlink, 1);
        // Late closes of the handles are harmless.
        m.close_inode(f.ino).unwrap();
        m.close_inode(keep.ino).unwrap();
        assert_eq!(m.getattr(keep.ino).unwrap().nlink, 1);
    });
}

fn new_session_reclaims_dead_sessions(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        (place.create)(&test_format("vol"), false).unwrap();
        // A process that has exited: its pid is dead on this host.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        // Client A (the dead process) left an unlinked-but-open file behind.
        let a = (place.open)().unwrap();
        let mut info = session_info("/mnt/a");
        info.pid = dead_pid;
        a.new_session(info).unwrap();
        let f = mkfile(&*a, ROOT_INO, "f");
        let s = write(&*a, f.ino, 0, 4096);
        a.open_inode(f.ino).unwrap();
        a.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!(a.getattr(f.ino).unwrap().nlink, 0);
        // Client C, alive (this process), also keeps one.
        let c = (place.open)().unwrap();
        c.new_session(session_info("/mnt/c")).unwrap();
        let g = mkfile(&*c, ROOT_INO, "g");
        c.open_inode(g.ino).unwrap();
        c.unlink(&CTX, ROOT_INO, b"g").unwrap();
        std::mem::forget(a); // as if the process died: no close_session
        // Client B mounts: A's leftovers are reclaimed, C's are not.
        let bm = (place.open)().unwrap();
        bm.new_session(session_info("/mnt/b")).unwrap();
        let pids: Vec<u32> = bm.sessions().unwrap().iter().map(|s| s.pid).collect();
        assert!(
            !pids.contains(&dead_pid),
            "dead session still listed: {pids:?}"
        );
        assert_eq!(pids.len(), 2, "{pids:?}");
        assert_errno(bm.getattr(f.ino), libc::ENOENT);
        assert!(dead_ids(&*bm).contains(&s));
        assert_eq!(bm.getattr(g.ino).unwrap().nlink, 0);
        c.close_inode(g.ino).unwrap();
        assert_errno(bm.getattr(g.ino), libc::ENOENT);
    }
}

/// Two clients (two sessions) of one fresh volume: (storage guard, first, second). The first
/// registers before the second exists.
fn two_clients(e: Engine) -> Vec<(Place, Arc<dyn Meta>, Arc<dyn Meta>)> {
    let mut out = Vec::new();
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        (place.create)(&test_format("vol"), false).unwrap();
        let m1 = (place.open)().unwrap();
        m1.new_session(session_info("/mnt/one")).unwrap();
        let m2 = (place.open)().unwrap();
        m2.new_session(session_info("/mnt/two")).unwrap();
        out.push((place, m1, m2));
    }
    out
}

fn session_id(m: &dyn Meta, mountpoint: &str) -> u64 {
    m.sessions()
        .unwrap()
        .iter()
        .find(|s| s.mountpoint == mountpoint)
        .unwrap()
        .id
}

fn open_in_one_client_survives_unlink_in_another(e: Engine) {
    for (_place, m1, m2) in two_clients(e) {
        let (m1, m2) = (&*m1, &*m2);
        let f = mkfile(m1, ROOT_INO, "f");
        let s = write(m1, f.ino, 0, 10_000);
        let inodes = m1.usage().unwrap().inodes;
        m2.open_inode(f.ino).unwrap();
        let a = m1.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!(a.nlink, 0);
        assert_errno(lookup(m1, ROOT_INO, "f"), libc::ENOENT);
        // Client 2 still reads and writes it; client 1 sees it too (nlink 0).
        let g = m2.getattr(f.ino).unwrap();
        assert_eq!((g.nlink, g.length), (0, 10_000));
        assert_eq!(extents(m2, f.ino, 0, 10_000), vec![(0, 10_000, s, 0)]);
        let s2 = write(m2, f.ino, 10_000, 100);
        assert_eq!(m1.getattr(f.ino).unwrap().length, 10_100);
        assert!(!dead_ids(m1).contains(&s));
        // Recorded as open in client 2's session.
        let sid2 = session_id(m1, "/mnt/two");
        assert!(m1.sustained().unwrap().contains(&(sid2, f.ino)));
        // Client 1 opening and closing it does not delete it: client 2 still has it.
        m1.open_inode(f.ino).unwrap();
        m1.close_inode(f.ino).unwrap();
        assert_eq!(m2.getattr(f.ino).unwrap().nlink, 0);
        // The last close anywhere deletes it.
        m2.close_inode(f.ino).unwrap();
        assert_errno(m1.getattr(f.ino), libc::ENOENT);
        let dead = dead_ids(m1);
        assert!(dead.contains(&s) && dead.contains(&s2), "{dead:?}");
        assert_eq!(m1.usage().unwrap().inodes, inodes - 1);
        assert!(m1.sustained().unwrap().is_empty());

        // Open in both: the last of the two closes deletes, whichever it is.
        let h = mkfile(m1, ROOT_INO, "h");
        m1.open_inode(h.ino).unwrap();
        m2.open_inode(h.ino).unwrap();
        m2.unlink(&CTX, ROOT_INO, b"h").unwrap();
        m1.close_inode(h.ino).unwrap();
        assert_eq!(m2.getattr(h.ino).unwrap().nlink, 0);
        m2.close_inode(h.ino).unwrap();
        assert_errno(m1.getattr(h.ino), libc::ENOENT);

        // Not open anywhere (opened and closed in 2 before): deleted at once.
        let k = mkfile(m1, ROOT_INO, "k");
        m2.open_inode(k.ino).unwrap();
        m2.close_inode(k.ino).unwrap();
        m1.unlink(&CTX, ROOT_INO, b"k").unwrap();
        assert_errno(m2.getattr(k.ino), libc::ENOENT);

        // Client 2 ends its session with an unlinked file open: reclaimed then.
        let l = mkfile(m1, ROOT_INO, "l");
        m2.open_inode(l.ino).unwrap();
        m1.unlink(&CTX, ROOT_INO, b"l").unwrap();
        assert_eq!(m1.getattr(l.ino).unwrap().nlink, 0);
        m2.close_session().unwrap();
        assert_errno(m1.getattr(l.ino), libc::ENOENT);
        assert!(m1.sustained().unwrap().is_empty());
    }
}

fn open_in_one_client_survives_rename_over_in_another(e: Engine) {
    for (_place, m1, m2) in two_clients(e) {
        let (m1, m2) = (&*m1, &*m2);
        let old = mkfile(m1, ROOT_INO, "target");
        let s = write(m1, old.ino, 0, 4096);
        m2.open_inode(old.ino).unwrap();
        let new = mkfile(m1, ROOT_INO, "new");
        let victim = rename(m1, ROOT_INO, "new", ROOT_INO, "target").unwrap();
        assert_eq!(victim.map(|v| (v.ino, v.nlink)), Some((old.ino, 0)));
        assert_eq!(lookup(m2, ROOT_INO, "target").unwrap().ino, new.ino);
        assert_eq!(extents(m2, old.ino, 0, 4096), vec![(0, 4096, s, 0)]);
        assert!(!dead_ids(m1).contains(&s));
        m2.close_inode(old.ino).unwrap();
        assert_errno(m1.getattr(old.ino), libc::ENOENT);
        assert!(dead_ids(m1).contains(&s));
    }
}

/// Files a client opened while it was alone on the volume are protected too, once it has
/// noticed the other client (SQLite records opens only from then on).
fn opens_before_another_client_joins_are_shared(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        (place.create)(&test_format("vol"), false).unwrap();
        let m1 = (place.open)().unwrap();
        m1.new_session(session_info("/mnt/one")).unwrap();
        let f = mkfile(&*m1, ROOT_INO, "f");
        let s = write(&*m1, f.ino, 0, 4096);
        m1.open_inode(f.ino).unwrap();
        let m2 = (place.open)().unwrap();
        m2.new_session(session_info("/mnt/two")).unwrap();
        // What the mount's background thread does every tick.
        m1.watch_sessions().unwrap();
        m2.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!(m2.getattr(f.ino).unwrap().nlink, 0);
        assert_eq!(extents(&*m1, f.ino, 0, 4096), vec![(0, 4096, s, 0)]);
        // A second open and close in 1, then the last close: deleted.
        m1.open_inode(f.ino).unwrap();
        m1.close_inode(f.ino).unwrap();
        assert_eq!(m2.getattr(f.ino).unwrap().nlink, 0);
        m1.close_inode(f.ino).unwrap();
        assert_errno(m2.getattr(f.ino), libc::ENOENT);
        assert!(dead_ids(&*m2).contains(&s));
    }
}

/// A client whose process died with an unlinked file open: the next heartbeat of a live
/// client reclaims the file.
fn dead_client_opens_are_reclaimed_on_heartbeat(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        (place.create)(&test_format("vol"), false).unwrap();
        let live = (place.open)().unwrap();
        live.new_session(session_info("/mnt/live")).unwrap();
        // A process that has exited: its pid is dead on this host.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let dying = (place.open)().unwrap();
        let mut info = session_info("/mnt/dying");
        info.pid = dead_pid;
        dying.new_session(info).unwrap();
        let f = mkfile(&*live, ROOT_INO, "f");
        let s = write(&*live, f.ino, 0, 4096);
        let g = mkfile(&*live, ROOT_INO, "g");
        dying.open_inode(f.ino).unwrap();
        dying.open_inode(g.ino).unwrap();
        // Also open in the live client: that one is kept.
        let h = mkfile(&*live, ROOT_INO, "h");
        dying.open_inode(h.ino).unwrap();
        live.open_inode(h.ino).unwrap();
        live.unlink(&CTX, ROOT_INO, b"f").unwrap();
        live.unlink(&CTX, ROOT_INO, b"h").unwrap();
        assert_eq!(live.getattr(f.ino).unwrap().nlink, 0);
        std::mem::forget(dying); // as if the process died: no close_session
        live.heartbeat().unwrap();
        assert_errno(live.getattr(f.ino), libc::ENOENT);
        assert!(dead_ids(&*live).contains(&s));
        assert_eq!(live.getattr(g.ino).unwrap().nlink, 1);
        assert_eq!(live.getattr(h.ino).unwrap().nlink, 0);
        let sid = session_id(&*live, "/mnt/live");
        let open = live.sustained().unwrap();
        assert!(open.iter().all(|(s, _)| *s == sid), "{open:?}");
        live.close_inode(h.ino).unwrap();
        assert_errno(live.getattr(h.ino), libc::ENOENT);
    }
}

/// The slice ids a session takes are reserved by it (gc leaves their objects alone) until it
/// trims them, closes, or dies and a live client cleans up after it; ranges of dead sessions
/// are not listed even before that.
fn slice_ids_are_reserved_until_the_session_ends(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        (place.create)(&test_format("vol"), false).unwrap();
        let live = (place.open)().unwrap();
        live.new_session(session_info("/mnt/live")).unwrap();
        let me = session_id(&*live, "/mnt/live");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let dying = (place.open)().unwrap();
        let mut info = session_info("/mnt/dying");
        info.pid = dead_pid;
        dying.new_session(info).unwrap();
        let in_range =
            |r: &[(u64, u64, u64)], id: u64| r.iter().any(|(_, lo, hi)| *lo <= id && id < *hi);

        // Every id handed out is reserved, one range per batch, extended while contiguous.
        let first = live.new_slice_id().unwrap();
        let mut last = first;
        for _ in 0..1500 {
            last = live.new_slice_id().unwrap();
        }
        let theirs = dying.new_slice_id().unwrap();
        let r = live.reserved_slices().unwrap();
        assert!(
            r.iter().all(|(s, _, _)| *s == me),
            "dead sessions are left out: {r:?}"
        );
        assert!(in_range(&r, first) && in_range(&r, last), "{r:?}");
        assert!(!in_range(&r, theirs), "{r:?}");
        assert!(r.len() <= 2, "contiguous batches share a range: {r:?}");

        // Trimming forgets ids below the bound, never ids not handed out yet.
        live.trim_reserved(last).unwrap();
        let r = live.reserved_slices().unwrap();
        assert!(!in_range(&r, first) && in_range(&r, last), "{r:?}");
        live.trim_reserved(u64::MAX).unwrap();
        let r = live.reserved_slices().unwrap();
        assert!(!in_range(&r, last), "{r:?}");
        let next = live.new_slice_id().unwrap();
        assert!(in_range(&live.reserved_slices().unwrap(), next));

        // The dead session's range goes with it at the next heartbeat's cleanup (its row and
        // its ranges go in one transaction), and a closed session's with it.
        let dead_sid = session_id(&*dying, "/mnt/dying");
        std::mem::forget(dying); // as if the process died: no close_session
        live.heartbeat().unwrap();
        assert!(live.sessions().unwrap().iter().all(|s| s.id != dead_sid));
        let other = (place.open)().unwrap();
        other.new_session(session_info("/mnt/other")).unwrap();
        let id = other.new_slice_id().unwrap();
        assert!(in_range(&other.reserved_slices().unwrap(), id));
        live.close_session().unwrap();
        let r = other.reserved_slices().unwrap();
        assert!(!in_range(&r, next), "closed session's range dropped: {r:?}");
        assert!(in_range(&r, id), "{r:?}");
        other.close_session().unwrap();
        assert_eq!(other.reserved_slices().unwrap(), vec![]);
    }
}

/// A volume of schema 1 (no table of opens, no reserved slice ids) opens, gains the tables
/// and records the current schema.
fn an_old_schema_is_upgraded(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        let mut fmt = test_format("vol");
        fmt.schema = 1;
        (place.create)(&fmt, false).unwrap();
        (place.sql)(match e {
            Engine::Sqlite => "DROP TABLE open_file; DROP TABLE reserved",
            Engine::Postgres => "DROP TABLE unkai_open; DROP TABLE unkai_reserved",
        });
        let m = (place.open)().unwrap();
        assert_eq!(m.format().schema, SCHEMA_VERSION);
        m.new_session(session_info("/mnt/x")).unwrap();
        let f = mkfile(&*m, ROOT_INO, "f");
        m.open_inode(f.ino).unwrap();
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        m.close_inode(f.ino).unwrap();
        assert_errno(m.getattr(f.ino), libc::ENOENT);
        let id = m.new_slice_id().unwrap();
        let r = m.reserved_slices().unwrap();
        assert!(r.iter().any(|(_, lo, hi)| *lo <= id && id < *hi), "{r:?}");
        let again = (place.open)().unwrap();
        assert_eq!(again.format().schema, SCHEMA_VERSION);
    }
}

/// `stored` follows what a file's data covers through every change of its slices.
fn stored_bytes_count_data_not_holes(e: Engine) {
    each(e, |m| {
        let stored = |ino| m.getattr(ino).unwrap().stored;
        let f = mkfile(m, ROOT_INO, "f");
        write(m, f.ino, 0, 10_000);
        assert_eq!(stored(f.ino), 10_000);
        // Far away, across a chunk boundary: the hole between is not stored.
        write(m, f.ino, CHUNK_SIZE - 1000, 3000);
        assert_eq!(stored(f.ino), 13_000);
        assert!(m.getattr(f.ino).unwrap().length > CHUNK_SIZE);
        // Overwriting stored bytes adds only what was a hole.
        write(m, f.ino, 5000, 10_000);
        assert_eq!(stored(f.ino), 18_000);
        // Punching a hole: gone from what is stored.
        let punch = FallocMode {
            punch_hole: true,
            keep_size: true,
            ..FallocMode::default()
        };
        m.fallocate(&CTX, f.ino, punch, 1000, 2000).unwrap();
        assert_eq!(stored(f.ino), 16_000);
        // Zeroing a range keeps it allocated (as ext4's unwritten extents): its data stays
        // counted, and so does the hole it covers (15,000..16,000).
        let zero = FallocMode {
            zero_range: true,
            ..FallocMode::default()
        };
        m.fallocate(&CTX, f.ino, zero, 14_000, 2000).unwrap();
        assert_eq!(stored(f.ino), 17_000);
        // Preallocation reserves every hole of its range (the punched one too); growth by
        // truncate stores nothing.
        m.fallocate(&CTX, f.ino, FallocMode::default(), 0, 4 * CHUNK_SIZE)
            .unwrap();
        assert_eq!(stored(f.ino), 4 * CHUNK_SIZE);
        m.truncate(&CTX, f.ino, 5 * CHUNK_SIZE).unwrap();
        assert_eq!(stored(f.ino), 4 * CHUNK_SIZE);
        // A copy stores what its source stored in the range, reservations included.
        let g = mkfile(m, ROOT_INO, "g");
        m.copy_range(&CTX, f.ino, 0, g.ino, 0, 20_000).unwrap();
        assert_eq!(stored(g.ino), 20_000);
        // A cut frees what lies past the new end, reservations too.
        m.truncate(&CTX, f.ino, CHUNK_SIZE + 10).unwrap();
        assert_eq!(stored(f.ino), CHUNK_SIZE + 10);
        // Compaction into one slice (here: of 16,000 bytes) keeps holes holes.
        let old = m.read_chunk(f.ino, 0).unwrap();
        let id = m.new_slice_id().unwrap();
        let whole = SliceRec {
            pos: 0,
            id,
            size: 16_000,
            off: 0,
            len: 16_000,
        };
        assert!(m.replace_slices(f.ino, 0, &old, &[whole]).unwrap());
        assert_eq!(stored(f.ino), 16_000 + 10);
        // Cut to less than what is stored.
        m.truncate(&CTX, f.ino, 100).unwrap();
        assert_eq!(stored(f.ino), 100);
        m.truncate(&CTX, f.ino, 0).unwrap();
        assert_eq!(stored(f.ino), 0);
    });
}

/// A volume of schema 3 (no `flags` or `stored`) gains them, counted from its chunks.
fn an_old_schema_counts_what_files_store(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        let mut fmt = test_format("vol");
        fmt.schema = 3;
        (place.create)(&fmt, false).unwrap();
        let m = (place.open)().unwrap();
        let f = mkfile(&*m, ROOT_INO, "f");
        write(&*m, f.ino, 0, 5000);
        write(&*m, f.ino, 3 * CHUNK_SIZE, 7000);
        let g = mkfile(&*m, ROOT_INO, "g");
        m.truncate(&CTX, g.ino, 1 << 30).unwrap();
        drop(m);
        (place.sql)(match e {
            Engine::Sqlite => {
                "UPDATE setting SET value = replace(value, '\"schema\":5', '\"schema\":3')
                   WHERE name = 'format';
                 ALTER TABLE node DROP COLUMN flags; ALTER TABLE node DROP COLUMN stored"
            }
            Engine::Postgres => {
                "UPDATE unkai_setting SET value = replace(value, '\"schema\":5', '\"schema\":3')
                   WHERE name = 'format';
                 ALTER TABLE unkai_node DROP COLUMN flags, DROP COLUMN stored"
            }
        });
        let m = (place.open)().unwrap();
        assert_eq!(m.format().schema, SCHEMA_VERSION);
        assert_eq!(m.getattr(f.ino).unwrap().stored, 12_000);
        assert_eq!(m.getattr(g.ino).unwrap().stored, 0);
        assert_eq!(m.getattr(ROOT_INO).unwrap().flags, 0);
    }
}

fn trash_days_delay_dead_slices(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        let mut fmt = test_format("trash");
        fmt.trash_days = 1;
        (place.create)(&fmt, false).unwrap();
        let m = (place.open)().unwrap();
        assert_eq!(m.format().trash_days, 1);
        let f = mkfile(&*m, ROOT_INO, "f");
        write(&*m, f.ino, 0, 4096);
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        // Kept in the trash (`meta::trash`), its origin readable, its slices alive.
        let trash = m.lookup(&CTX, ROOT_INO, b".trash").unwrap();
        let listed = |dir: Ino| -> Vec<(Vec<u8>, Ino)> {
            m.readdir(dir, 2, 100, false)
                .unwrap()
                .into_iter()
                .map(|e| (e.name, e.ino))
                .collect()
        };
        assert!(
            listed(ROOT_INO).iter().all(|(n, _)| n != b".trash"),
            "the trash is not listed"
        );
        let hours = listed(trash.ino);
        assert_eq!(hours.len(), 1);
        let entries = listed(hours[0].1);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].1, f.ino);
        assert_eq!(
            m.get_xattr(f.ino, crate::meta::trash::ORIGIN).unwrap(),
            b"/f"
        );
        assert_eq!(m.all_slices().unwrap().len(), 1);
        assert_eq!(
            m.mknod(&CTX, hours[0].1, b"x", Kind::File, 0o644, 0, None)
                .unwrap_err()
                .errno(),
            libc::EPERM,
            "nothing is made in the trash"
        );
        // Deleted from the trash: gone for good, its slices dead.
        m.unlink(&CTX, hours[0].1, &entries[0].0).unwrap();
        assert!(m.all_slices().unwrap().is_empty());
        assert!(
            m.dead_slices(10).unwrap().is_empty(),
            "still in the trash period"
        );
        assert_eq!(m.usage().unwrap().pending_delete, 1);
    }
}

/// `purge_trash_early`: the oldest deletions go first, as many as the bytes asked for; one
/// client at a time (another's claim holds until given back or lapsed); counted in the usage;
/// the slices of what went can be reclaimed at once.
fn trash_purged_early_oldest_first_by_one_client(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        let mut fmt = test_format("trash");
        fmt.trash_days = 1;
        (place.create)(&fmt, false).unwrap();
        let clients: Vec<Arc<dyn Meta>> = (0..2)
            .map(|i| {
                let m = (place.open)().unwrap();
                m.new_session(session_info(&format!("/mnt/{i}"))).unwrap();
                m
            })
            .collect();
        let (one, two) = (&*clients[0], &*clients[1]);
        let mut inos = Vec::new();
        for i in 0..5 {
            let name = format!("f{i}");
            let f = mkfile(one, ROOT_INO, &name);
            write(one, f.ino, 0, 4096);
            one.unlink(&CTX, ROOT_INO, name.as_bytes()).unwrap();
            inos.push(f.ino);
        }
        let trash = one.lookup(&CTX, ROOT_INO, b".trash").unwrap().ino;
        let left = || -> Vec<Ino> {
            let mut out = Vec::new();
            for h in one.readdir(trash, 2, 100, false).unwrap() {
                for e in one.readdir(h.ino, 2, 100, false).unwrap() {
                    out.push(e.ino);
                }
            }
            out.sort();
            out
        };
        let claim = |who: String, until: Nanos| {
            one.write_rows(&mut |tx| tx.put_setting("trashPurger", &format!("{who}:{until}")))
                .unwrap()
        };
        let minute = 60_000_000_000;
        // While the first client holds the claim, the second deletes nothing.
        claim(one.session_id().to_string(), now_nanos() + minute);
        assert_eq!(two.purge_trash_early(8192).unwrap(), None);
        assert_eq!(left(), inos);
        // Its holder purges: the two oldest, and gives the claim back.
        assert_eq!(
            one.purge_trash_early(8192).unwrap(),
            Some(Purged {
                entries: 2,
                bytes: 8192
            })
        );
        assert_eq!(left(), inos[2..]);
        assert_eq!(
            two.purge_trash_early(1).unwrap(),
            Some(Purged {
                entries: 1,
                bytes: 4096
            })
        );
        assert_eq!(left(), inos[3..]);
        // A claim not given back (its client died) lapses.
        claim("999".into(), now_nanos() - 1);
        assert_eq!(
            two.purge_trash_early(1).unwrap().map(|p| p.entries),
            Some(1)
        );
        assert_eq!(left(), inos[4..]);
        let u = one.usage().unwrap();
        assert_eq!(
            (u.trash_purged_early, u.trash_purged_early_bytes),
            (4, 16384)
        );
        // Their slices are dead, within the trash period: reclaimed early only.
        assert!(one.dead_slices(10).unwrap().is_empty());
        assert_eq!(one.dead_slices_early(10).unwrap().len(), 4);
    }
}

// ---------------------------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------------------------

fn usage_counters(e: Engine) {
    each(e, |m| {
        let u = |m: &dyn Meta| {
            let u = m.usage().unwrap();
            (u.inodes, u.used_bytes)
        };
        assert_eq!(u(m), (1, 0));
        let f = mkfile(m, ROOT_INO, "f");
        assert_eq!(u(m), (2, 0));
        let d = mkdir(m, ROOT_INO, "d");
        assert_eq!(u(m), (3, 0));
        m.mknod(&CTX, d.ino, b"l", Kind::Symlink, 0o777, 0, Some(b"target"))
            .unwrap();
        assert_eq!(u(m), (4, 0), "a symlink's target takes no data space");
        write(m, f.ino, 0, 5000);
        assert_eq!(u(m), (4, 8192));
        write(m, f.ino, 4000, 6000);
        assert_eq!(u(m), (4, 12288));
        write(m, f.ino, 0, 100);
        assert_eq!(u(m), (4, 12288), "overwrites take no space");
        m.truncate(&CTX, f.ino, 100).unwrap();
        assert_eq!(u(m), (4, 4096));
        m.truncate(&CTX, f.ino, MIB).unwrap();
        assert_eq!(u(m), (4, MIB));
        m.fallocate(&CTX, f.ino, FallocMode::default(), 0, 2 * MIB)
            .unwrap();
        assert_eq!(u(m), (4, 2 * MIB));
        let g = mkfile(m, ROOT_INO, "g");
        m.copy_range(&CTX, f.ino, 0, g.ino, 0, 100).unwrap();
        assert_eq!(u(m), (5, 2 * MIB + 4096));
        // Hard links count once.
        m.link(&CTX, g.ino, d.ino, b"g2").unwrap();
        assert_eq!(u(m), (5, 2 * MIB + 4096));
        m.unlink(&CTX, ROOT_INO, b"g").unwrap();
        assert_eq!(u(m), (5, 2 * MIB + 4096));
        m.unlink(&CTX, d.ino, b"g2").unwrap();
        assert_eq!(u(m), (4, 2 * MIB));
        // Rename over a file drops the victim's.
        let h = mkfile(m, ROOT_INO, "h");
        write(m, h.ino, 0, 10);
        assert_eq!(u(m), (5, 2 * MIB + 4096));
        rename(m, ROOT_INO, "h", ROOT_INO, "f").unwrap();
        assert_eq!(u(m), (4, 4096));
        m.unlink(&CTX, ROOT_INO, b"f").unwrap();
        assert_eq!(u(m), (3, 0));
        m.unlink(&CTX, d.ino, b"l").unwrap();
        assert_eq!(u(m), (2, 0));
        m.rmdir(&CTX, ROOT_INO, b"d").unwrap();
        assert_eq!(u(m), (1, 0));
        // Failures count nothing.
        assert_errno(m.rmdir(&CTX, ROOT_INO, b"d"), libc::ENOENT);
        assert_errno(
            m.mknod(&CTX, 999_999, b"x", Kind::File, 0o644, 0, None),
            libc::ENOENT,
        );
        assert_eq!(u(m), (1, 0));
        // A directory replaced by rename is gone from the count.
        mkdir(m, ROOT_INO, "x");
        mkdir(m, ROOT_INO, "y");
        assert_eq!(u(m), (3, 0));
        rename(m, ROOT_INO, "x", ROOT_INO, "y").unwrap();
        assert_eq!(u(m), (2, 0));
    });
}

// ---------------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------------

/// Two clients of one volume (two engine instances, as two mounts or a mount and fsck would
/// be) writing at once: no "database is locked", no inode number given twice.
fn concurrent_clients_on_one_volume(e: Engine) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        (place.create)(&test_format("vol"), false).unwrap();
        let clients: Vec<Arc<dyn Meta>> = (0..2)
            .map(|i| {
                let m = (place.open)().unwrap();
                m.new_session(session_info(&format!("/mnt/{i}"))).unwrap();
                m
            })
            .collect();
        let d = mkdir(&*clients[0], ROOT_INO, "d");
        let unexpected = parking_lot::Mutex::new(Vec::<String>::new());
        let inos = parking_lot::Mutex::new(HashMap::<Ino, String>::new());
        std::thread::scope(|sc| {
            for (ci, m) in clients.iter().enumerate() {
                for t in 0..4 {
                    let (m, unexpected, inos) = (m.clone(), &unexpected, &inos);
                    sc.spawn(move || {
                        for i in 0..100 {
                            let name = format!("c{ci}-t{t}-{i}");
                            match m.mknod(&CTX, d.ino, name.as_bytes(), Kind::File, 0o644, 0, None)
                            {
                                Ok(a) => {
                                    if let Some(other) = inos.lock().insert(a.ino, name.clone()) {
                                        unexpected.lock().push(format!(
                                            "inode {} given to {other} and {name}",
                                            a.ino
                                        ));
                                    }
                                }
                                Err(e) => unexpected.lock().push(format!("mknod {name}: {e:?}")),
                            }
                            if i % 2 == 0 {
                                if let Err(e) = m.unlink(&CTX, d.ino, name.as_bytes()) {
                                    unexpected.lock().push(format!("unlink {name}: {e:?}"));
                                }
                            }
                        }
                    });
                }
            }
        });
        let unexpected = unexpected.into_inner();
        assert!(
            unexpected.is_empty(),
            "{} unexpected outcomes, e.g. {:?}",
            unexpected.len(),
            &unexpected[..unexpected.len().min(10)]
        );
        // Both clients see the same 400 survivors.
        for m in &clients {
            assert_eq!(listing(&**m, d.ino).len(), 2 + 400);
            assert_eq!(m.usage().unwrap().inodes, 2 + 400);
        }
    }
}

fn concurrent_mknod_unlink(e: Engine) {
    for (name, make) in engines(e) {
        eprintln!("--- engine {name}");
        let (_dir, m) = make();
        let d = mkdir(&*m, ROOT_INO, "d");
        let inodes = m.usage().unwrap().inodes;
        let done = std::sync::atomic::AtomicBool::new(false);
        let unexpected = parking_lot::Mutex::new(Vec::<String>::new());
        let bad = |what: String| unexpected.lock().push(what);
        std::thread::scope(|sc| {
            let mut writers = Vec::new();
            for t in 0..8 {
                let m = m.clone();
                let bad = &bad;
                writers.push(sc.spawn(move || {
                    for i in 0..200 {
                        let own = format!("t{t}-{i}");
                        if let Err(e) =
                            m.mknod(&CTX, d.ino, own.as_bytes(), Kind::File, 0o644, 0, None)
                        {
                            bad(format!("mknod {own}: {e:?}"));
                        }
                        // A name all threads fight over.
                        let shared = format!("shared-{}", i % 5);
                        match m.mknod(&CTX, d.ino, shared.as_bytes(), Kind::File, 0o644, 0, None) {
                            Ok(_) | Err(Error::Sys(libc::EEXIST)) => {}
                            Err(e) => bad(format!("mknod {shared}: {e:?}")),
                        }
                        match lookup(&*m, d.ino, &own) {
                            Ok(a) if a.kind == Kind::File => {}
                            other => bad(format!("lookup {own}: {other:?}")),
                        }
                        match m.unlink(&CTX, d.ino, shared.as_bytes()) {
                            Ok(a) if a.nlink == 0 => {}
                            Ok(a) => bad(format!("unlink {shared}: nlink {}", a.nlink)),
                            Err(Error::Sys(libc::ENOENT)) => {}
                            Err(e) => bad(format!("unlink {shared}: {e:?}")),
                        }
                        if let Err(e) = m.unlink(&CTX, d.ino, own.as_bytes()) {
                            bad(format!("unlink {own}: {e:?}"));
                        }
                    }
                }));
            }
            // Readers beside the writers.
            for _ in 0..2 {
                let m = m.clone();
                let (bad, done) = (&bad, &done);
                sc.spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Err(e) = m.readdir(d.ino, 0, 100, true) {
                            bad(format!("readdir: {e:?}"));
                        }
                        match lookup(&*m, d.ino, "shared-0") {
                            Ok(_) | Err(Error::Sys(libc::ENOENT)) => {}
                            Err(e) => bad(format!("lookup shared-0: {e:?}")),
                        }
                        if let Err(e) = m.getattr(d.ino) {
                            bad(format!("getattr: {e:?}"));
                        }
                    }
                });
            }
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let unexpected = unexpected.into_inner();
        assert!(
            unexpected.is_empty(),
            "{} unexpected outcomes, e.g. {:?}",
            unexpected.len(),
            &unexpected[..unexpected.len().min(10)]
        );
        assert_eq!(
            names(&*m, d.ino),
            vec![".", ".."],
            "directory left non-empty"
        );
        assert_eq!(nlink(&*m, d.ino), 2);
        assert_eq!(m.usage().unwrap().inodes, inodes);
    }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL only
// ---------------------------------------------------------------------------------------------

mod postgres_only {
    use super::*;

    /// A volume shares its database with other applications' tables: format (even --force)
    /// touches only its own `unkai_*` tables.
    #[test]
    fn keeps_other_tables() {
        if pg_server::skip() {
            return;
        }
        let db = pg_server::database().unwrap();
        let mut c = ::postgres::Client::connect(&db.url, ::postgres::NoTls).unwrap();
        c.batch_execute(
            "CREATE TABLE session (x TEXT); INSERT INTO session VALUES ('theirs');
             CREATE TABLE node (y BIGINT); INSERT INTO node VALUES (42);",
        )
        .unwrap();
        let u = pg_url(&db.url);
        PgMeta::create(&u, &test_format("a"), false).unwrap();
        {
            let m = PgMeta::open(&u).unwrap();
            mkfile(&m, ROOT_INO, "f");
        }
        PgMeta::create(&u, &test_format("b"), true).unwrap();
        let m = PgMeta::open(&u).unwrap();
        assert_eq!(m.format().name, "b");
        assert_errno(lookup(&m, ROOT_INO, "f"), libc::ENOENT);
        let x: String = c.query_one("SELECT x FROM session", &[]).unwrap().get(0);
        let y: i64 = c.query_one("SELECT y FROM node", &[]).unwrap().get(0);
        assert_eq!((x.as_str(), y), ("theirs", 42));
    }

    /// The password comes from the URL or a password file; a wrong one is refused with a
    /// message that does not show it; URLs print without it.
    #[test]
    fn password_sources() {
        if pg_server::skip() {
            return;
        }
        let db = pg_server::database().unwrap();
        let u = pg_url(&db.url);
        PgMeta::create(&u, &test_format("pw"), false).unwrap();
        let (bare, pw) = pg_server::split_password(&db.url);
        assert!(!u.to_string().contains(&pw), "{u}");
        assert!(!format!("{u:?}").contains(&pw));
        // From a password file (libpq's format, with wildcards).
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            format!("# comment\nother:1:x:y:nope\n*:*:{}:*:{pw}\n", db.name),
        )
        .unwrap();
        let with_file = format!("{bare}&passfile={}", file.display());
        let m = PgMeta::open(&pg_url(&with_file)).unwrap();
        assert_eq!(m.format().name, "pw");
        // A wrong password: refused, and the message does not carry it.
        let (scheme, rest) = bare.split_once("://").unwrap();
        let (user, host) = rest.split_once('@').unwrap();
        let wrong = format!("{scheme}://{user}:Wr0ngSecret@{host}");
        match PgMeta::open(&pg_url(&wrong)) {
            Err(Error::Engine(msg)) => {
                assert!(msg.contains("password"), "{msg}");
                assert!(!msg.contains("Wr0ngSecret"), "{msg}");
            }
            Err(e) => panic!("expected an engine error, got {e:?}"),
            Ok(_) => panic!("a wrong password was accepted"),
        }
        // No password at all (none in the environment either): refused.
        if std::env::var_os("PGPASSWORD").is_none() && std::env::var_os("PGPASSFILE").is_none() {
            let none = format!("{bare}&passfile={}", dir.path().join("missing").display());
            assert!(PgMeta::open(&pg_url(&none)).is_err());
        }
    }

    /// Many clients (pools of their own) creating in one directory at once: all succeed,
    /// none waits forever, counters agree.
    #[test]
    fn many_clients_one_directory() {
        if pg_server::skip() {
            return;
        }
        let db = pg_server::database().unwrap();
        let u = pg_url(&db.url);
        PgMeta::create(&u, &test_format("many"), false).unwrap();
        let clients: Vec<PgMeta> = (0..4).map(|_| PgMeta::open(&u).unwrap()).collect();
        let d = mkdir(&clients[0], ROOT_INO, "d");
        std::thread::scope(|sc| {
            for (ci, m) in clients.iter().enumerate() {
                for t in 0..4 {
                    sc.spawn(move || {
                        for i in 0..50 {
                            let n = format!("c{ci}-t{t}-{i}");
                            mkfile(m, d.ino, &n);
                            // Cross-directory renames take the volume's rename lock.
                            if i % 5 == 0 {
                                rename(m, d.ino, &n, ROOT_INO, &n).unwrap();
                            }
                        }
                    });
                }
            }
        });
        let m = &clients[3];
        assert_eq!(listing(m, d.ino).len(), 2 + 16 * 40);
        assert_eq!(listing(m, ROOT_INO).len(), 2 + 1 + 16 * 10);
        assert_eq!(m.usage().unwrap().inodes, 2 + 16 * 50);
        assert_eq!(m.getattr(d.ino).unwrap().nlink, 2);
    }
}
