//! Tests of clients among others (`ops/clients.rs`): sessions, opens kept across clients,
//! dead clients cleaned up, reserved slice ids, clients racing.

use super::*;

engine_tests!(
    sessions_register_and_close,
    close_session_reclaims_unlinked_open_inodes,
    new_session_reclaims_dead_sessions,
    open_in_one_client_survives_unlink_in_another,
    open_in_one_client_survives_rename_over_in_another,
    opens_before_another_client_joins_are_shared,
    dead_client_opens_are_reclaimed_on_heartbeat,
    slice_ids_are_reserved_until_the_session_ends,
    concurrent_clients_on_one_volume,
    the_engines_threads_leave_signals_to_the_process,
    a_second_client_is_company_at_once_and_a_command_is_not,
);

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

/// One client (a session at /mnt/one) of a fresh volume per backend: (storage, client).
fn one_client(e: Engine) -> Vec<(Place, Arc<dyn Meta>)> {
    let mut out = Vec::new();
    for b in backends(e) {
        eprintln!("--- engine {}", b.name);
        let place = (b.missing)();
        (place.create)(&test_format("vol"), false).unwrap();
        let m1 = (place.open)().unwrap();
        m1.new_session(session_info("/mnt/one")).unwrap();
        out.push((place, m1));
    }
    out
}

/// A second client of `place` (a session at /mnt/two).
fn second_client(place: &Place) -> Arc<dyn Meta> {
    let m2 = (place.open)().unwrap();
    m2.new_session(session_info("/mnt/two")).unwrap();
    m2
}

/// Two clients (two sessions) of one fresh volume: (storage guard, first, second). The first
/// registers before the second exists.
fn two_clients(e: Engine) -> Vec<(Place, Arc<dyn Meta>, Arc<dyn Meta>)> {
    one_client(e)
        .into_iter()
        .map(|(place, m1)| {
            let m2 = second_client(&place);
            (place, m1, m2)
        })
        .collect()
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
        // Another client sees a change once it is committed: on PostgreSQL a group of
        // changes commits within 10 ms, and at once at sync.
        m1.sync().unwrap();
        m1.open_inode(h.ino).unwrap();
        m2.open_inode(h.ino).unwrap();
        m2.unlink(&CTX, ROOT_INO, b"h").unwrap();
        m1.close_inode(h.ino).unwrap();
        assert_eq!(m2.getattr(h.ino).unwrap().nlink, 0);
        m2.close_inode(h.ino).unwrap();
        assert_errno(m1.getattr(h.ino), libc::ENOENT);

        // Not open anywhere (opened and closed in 2 before): deleted at once.
        let k = mkfile(m1, ROOT_INO, "k");
        m1.sync().unwrap();
        m2.open_inode(k.ino).unwrap();
        m2.close_inode(k.ino).unwrap();
        m1.unlink(&CTX, ROOT_INO, b"k").unwrap();
        assert_errno(m2.getattr(k.ino), libc::ENOENT);

        // Client 2 ends its session with an unlinked file open: reclaimed then.
        let l = mkfile(m1, ROOT_INO, "l");
        m1.sync().unwrap();
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
    for (place, m1) in one_client(e) {
        let f = mkfile(&*m1, ROOT_INO, "f");
        let s = write(&*m1, f.ino, 0, 4096);
        m1.open_inode(f.ino).unwrap();
        let m2 = second_client(&place);
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

/// A client alone asks, before what only a client alone may do (a mount's writeback cache
/// for a file opened for writing), whether another client came since its last check of
/// sessions (every 2 s): on SQLite a second client's registration is known at once (it
/// writes the database). A command that writes without a session (`unkai quota set`,
/// `fsck --repair`) is no company: the client stays alone, grouping goes on, and its cache
/// forgets what the command may have changed. (PostgreSQL's clients learn of each other
/// from their check of sessions only.)
fn a_second_client_is_company_at_once_and_a_command_is_not(e: Engine) {
    for (place, m1) in one_client(e) {
        m1.set_alone(true);
        mkfile(&*m1, ROOT_INO, "mine");
        assert_errno(m1.lookup(&CTX, ROOT_INO, b"theirs"), libc::ENOENT);
        assert!(!m1.others_wrote(), "nobody else wrote");
        // A command: the volume opened without a session, writing.
        let cmd = (place.open)().unwrap();
        mkfile(&*cmd, ROOT_INO, "theirs");
        drop(cmd);
        assert!(!m1.others_wrote(), "a command is no company");
        assert!(!m1.others_wrote(), "nor after it");
        assert!(
            m1.lookup(&CTX, ROOT_INO, b"theirs").is_ok(),
            "its change is seen"
        );
        mkfile(&*m1, ROOT_INO, "mine-too");
        let _m2 = second_client(&place);
        assert_eq!(
            m1.others_wrote(),
            matches!(e, Engine::Sqlite),
            "a second client registered"
        );
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
        // Committed for the other client to see (a group commits within 10 ms, at sync).
        live.sync().unwrap();
        dying.open_inode(f.ino).unwrap();
        dying.open_inode(g.ino).unwrap();
        // Also open in the live client: that one is kept.
        let h = mkfile(&*live, ROOT_INO, "h");
        live.sync().unwrap();
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
        // Committed before the other client looks for it (a group commits within 10 ms, at
        // once at sync).
        clients[0].sync().unwrap();
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
        // Both clients see the same 400 survivors, once each has committed what it answered
        // (on PostgreSQL within 10 ms, at once at sync).
        for m in &clients {
            m.sync().unwrap();
        }
        for m in &clients {
            assert_eq!(listing(&**m, d.ino).len(), 2 + 400);
            assert_eq!(m.usage().unwrap().inodes, 2 + 400);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------

/// The names (as /proc shows them, cut to 15 bytes) of the threads the engines start.
const ENGINE_THREADS: &[&str] = &[
    "unkai-pg-group",
    "unkai-notify",
    "unkai-listen",
    "unkai-group",
    "unkai-checkpoin",
];

/// The engine threads of this process (tid, name) and whether each blocks SIGTERM (bit 15 of
/// its `SigBlk`).
fn engine_threads() -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let name = comm.trim();
        if !ENGINE_THREADS.contains(&name) {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let Some(blk) = status.lines().find_map(|l| l.strip_prefix("SigBlk:")) else {
            continue;
        };
        let mask = u64::from_str_radix(blk.trim(), 16).unwrap();
        out.push((
            t.file_name().to_string_lossy().into_owned(),
            name.to_string(),
            mask & (1 << (15 - 1)) != 0,
        ));
    }
    out
}

/// Every thread an engine starts blocks SIGINT, SIGTERM and SIGHUP: an engine opens before a
/// server blocks them for its signal thread, and a SIGTERM meant to stop the server cleanly
/// that reached an engine's thread would end the process at once (seen: a gateway and an NFS
/// server on PostgreSQL killed that way, the signal taken by the group commit's timer). The
/// test harness's threads block nothing, so an engine thread that does not block them itself
/// shows here. (Other tests' engine threads are checked as well.)
fn the_engines_threads_leave_signals_to_the_process(e: Engine) {
    for (name, make) in engines(e) {
        let (_g, m) = make();
        // Started: the grouping (SQLite alone, PostgreSQL always) and the notifications.
        m.watch(Box::new(|_| {})).unwrap();
        mkdir(&*m, ROOT_INO, "d");
        // A lone-less SQLite volume may start none yet; the others have their timer.
        let some = name != "sqlite";
        let mut threads = Vec::new();
        let blocked = eventually(Duration::from_secs(30), || {
            threads = engine_threads();
            (!some || !threads.is_empty()) && threads.iter().all(|t| t.2)
        });
        let open: Vec<_> = threads.iter().filter(|t| !t.2).collect();
        assert!(
            blocked,
            "{name}: engine threads that take SIGTERM: {open:?} (of {threads:?})"
        );
    }
}
