//! Tests of the volume as a whole (`ops/settings.rs`): format and open, schema upgrades,
//! usage counters.

use super::*;

engine_tests!(
    open_missing_or_unformatted_is_not_formatted,
    create_then_open_has_root,
    open_refuses_a_newer_schema,
    create_over_existing_refused_unless_forced,
    an_old_schema_is_upgraded,
    an_old_schema_counts_what_files_store,
    usage_counters,
);

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

/// A volume of schema 3 (no `flags` or `stored`, nor schema 6's `external`) gains them, what
/// files store counted from its chunks.
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
                "UPDATE setting SET value = replace(value, '\"schema\":6', '\"schema\":3')
                   WHERE name = 'format';
                 ALTER TABLE node DROP COLUMN flags; ALTER TABLE node DROP COLUMN stored;
                 DROP TABLE external"
            }
            Engine::Postgres => {
                "UPDATE unkai_setting SET value = replace(value, '\"schema\":6', '\"schema\":3')
                   WHERE name = 'format';
                 ALTER TABLE unkai_node DROP COLUMN flags, DROP COLUMN stored;
                 DROP TABLE unkai_external"
            }
        });
        let m = (place.open)().unwrap();
        assert_eq!(m.format().schema, SCHEMA_VERSION);
        assert_eq!(m.getattr(f.ino).unwrap().stored, 12_000);
        assert_eq!(m.getattr(g.ino).unwrap().stored, 0);
        assert_eq!(m.getattr(ROOT_INO).unwrap().flags, 0);
        // Schema 6's table of external slices (`unkai import`) is made too.
        assert!(m.externals().unwrap().is_empty());
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
