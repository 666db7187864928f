//! Tests of what gc reads (`ops/maintenance.rs`): dead slices kept for the trash's days,
//! purged early when short of room.

use super::*;

engine_tests!(
    trash_days_delay_dead_slices,
    trash_purged_early_oldest_first_by_one_client,
    directory_deleted_into_the_trash_takes_nothing_new,
);

/// Runs `f` on each engine of `e` with a new volume keeping a trash (1 day), given how to
/// open a client of it.
fn with_trash(e: Engine, f: impl Fn(&dyn Fn() -> Arc<dyn Meta>)) {
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        let mut fmt = test_format("trash");
        fmt.trash_days = 1;
        (place.create)(&fmt, false).unwrap();
        f(&|| (place.open)().unwrap());
    }
}

fn trash_days_delay_dead_slices(e: Engine) {
    with_trash(e, |open| {
        let m = open();
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
    });
}

/// A directory deleted into the trash is gone for those still knowing it by its inode
/// (another client's lookup made just before): nothing is made in it, linked or moved into
/// it (ENOENT, as in a directory removed for good), until it is restored.
fn directory_deleted_into_the_trash_takes_nothing_new(e: Engine) {
    with_trash(e, |open| {
        let m = open();
        let d = mkdir(&*m, ROOT_INO, "d");
        let f = mkfile(&*m, ROOT_INO, "f");
        m.rmdir(&CTX, ROOT_INO, b"d").unwrap();
        let kept = m.getattr(d.ino).unwrap();
        assert_eq!(kept.kind, Kind::Dir, "kept in the trash");
        assert_errno(
            m.mknod(&CTX, d.ino, b"x", Kind::File, 0o644, 0, None),
            libc::ENOENT,
        );
        assert_errno(
            m.mknod(&CTX, d.ino, b"x", Kind::Dir, 0o755, 0, None),
            libc::ENOENT,
        );
        assert_errno(m.link(&CTX, f.ino, d.ino, b"x"), libc::ENOENT);
        assert_errno(
            m.rename(&CTX, ROOT_INO, b"f", d.ino, b"x", RenameFlags::default()),
            libc::ENOENT,
        );
        assert!(m.readdir(d.ino, 2, 10, false).unwrap().is_empty());
        // Restored (`unkai restore` renames it back): a directory like any other again.
        let trash = m.lookup(&CTX, ROOT_INO, b".trash").unwrap();
        let hour = m.readdir(trash.ino, 2, 10, false).unwrap().remove(0);
        let name = m.readdir(hour.ino, 2, 10, false).unwrap().remove(0).name;
        m.rename(
            &CTX,
            hour.ino,
            &name,
            ROOT_INO,
            b"d",
            RenameFlags::default(),
        )
        .unwrap();
        mkfile(&*m, d.ino, "x");
        assert_eq!(m.getattr(d.ino).unwrap().flags, 0);
    });
}

/// `purge_trash_early`: the oldest deletions go first, as many as the bytes asked for; one
/// client at a time (another's claim holds until given back or lapsed); counted in the usage;
/// the slices of what went can be reclaimed at once.
fn trash_purged_early_oldest_first_by_one_client(e: Engine) {
    with_trash(e, |open| {
        let clients: Vec<Arc<dyn Meta>> = (0..2)
            .map(|i| {
                let m = open();
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
    });
}
