//! The trash through real mounts, on SQLite and PostgreSQL: deleted files and directories, and
//! files replaced by a rename, kept in `/.trash/HOUR/` with their origin; `unkai restore` puts
//! them back (conflicts reported); hard links, open-then-deleted files, who may do what in the
//! trash; expired entries purged, and the usage they held given back; the oldest entries
//! purged early when the disk under a local bucket runs short of room.

use crate::common;

use crate::common::*;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

/// Mounts here beat every 0.4 s: a `config` (and the purge it allows) reaches them at once.
fn env() -> Vec<(String, String)> {
    vec![("UNKAI_SESSION_TIMEOUT".into(), "6".into())]
}

fn on_both(f: fn(&Volume)) {
    f(&Volume::with_env(&["--trash-days", "1"], env()));
    match Volume::postgres(&["--trash-days", "1"], |u| u.to_string(), env()) {
        Some(vol) => f(&vol),
        None => eprintln!("skipped on PostgreSQL: UNKAI_TEST_POSTGRES is unset"),
    }
}

/// The one hour directory of the trash, and its entries by origin path.
fn trash(m: &Mount) -> (PathBuf, Vec<(String, PathBuf)>) {
    let hours: Vec<PathBuf> = fs::read_dir(m.p(".trash"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(hours.len(), 1, "{hours:?}");
    let mut out = Vec::new();
    for e in fs::read_dir(&hours[0]).unwrap() {
        let p = e.unwrap().path();
        let o = common::xattr::lgetxattr_sized(&p, "trusted.unkai.origin", 4096)
            .unwrap()
            .1;
        out.push((String::from_utf8(o).unwrap(), p));
    }
    out.sort();
    (hours[0].clone(), out)
}

fn origins(m: &Mount) -> Vec<String> {
    trash(m).1.into_iter().map(|(o, _)| o).collect()
}

fn restore(vol: &Volume, m: &Mount) -> (bool, String, String) {
    common::run_env(&["restore", m.path.to_str().unwrap()], &vol.env)
}

fn keeps_and_restores(vol: &Volume) {
    let m = vol.mount();
    fs::create_dir_all(m.p("a/b")).unwrap();
    fs::write(m.p("a/b/f1"), b"one").unwrap();
    fs::write(m.p("a/f2"), b"two").unwrap();
    fs::write(m.p("new"), b"newer two").unwrap();
    // Replaced by a rename: the old a/f2 goes to the trash.
    fs::rename(m.p("new"), m.p("a/f2")).unwrap();
    assert_eq!(origins(&m), ["/a/f2"]);
    fs::remove_dir_all(m.p("a")).unwrap();
    assert!(!m.p("a").exists());
    assert_eq!(
        origins(&m),
        ["/a", "/a/b", "/a/b/f1", "/a/f2", "/a/f2"],
        "each deleted entry, with the path it had"
    );
    let root: Vec<String> = fs::read_dir(&m.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(root.is_empty(), "the trash is not listed: {root:?}");

    // Something new took /a/f2's place meanwhile: reported, left in the trash.
    fs::create_dir(m.p("a")).unwrap();
    fs::write(m.p("a/f2"), b"in the way").unwrap();
    let (ok, out, err) = restore(vol, &m);
    assert!(ok, "restore: {out}{err}");
    assert!(err.contains("/a/f2 exists"), "{err}");
    assert!(out.contains("restored 2 entries"), "{out}");
    assert_eq!(fs::read(m.p("a/b/f1")).unwrap(), b"one");
    assert_eq!(fs::read(m.p("a/f2")).unwrap(), b"in the way");
    assert_eq!(origins(&m), ["/a", "/a/f2", "/a/f2"]);
    // Moved away (a deletion would send it to the trash, the last deleted of /a/f2).
    fs::rename(m.p("a/f2"), m.p("a/f2.mine")).unwrap();
    let (ok, out, err) = restore(vol, &m);
    assert!(ok, "restore: {out}{err}");
    assert_eq!(
        fs::read(m.p("a/f2")).unwrap(),
        b"newer two",
        "the last deleted of one path goes back"
    );
    // Restored entries carry no trash mark.
    assert!(common::xattr::getxattr(&m.p("a/f2"), "trusted.unkai.origin").is_err());
    let m = {
        m.unmount();
        remount(vol)
    };
    assert_eq!(fs::read(m.p("a/b/f1")).unwrap(), b"one");
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok, "fsck: {out}{err}");
}

#[test]
fn deleted_and_replaced_entries_are_kept_and_restored() {
    on_both(keeps_and_restores);
}

fn links_and_open_files(vol: &Volume) {
    let m = vol.mount();
    fs::write(m.p("f"), b"linked").unwrap();
    fs::hard_link(m.p("f"), m.p("g")).unwrap();
    fs::remove_file(m.p("f")).unwrap();
    let kept = fs::read_dir(m.p(".trash"))
        .map(|hours| {
            hours
                .map(|h| fs::read_dir(h.unwrap().path()).unwrap().count())
                .sum::<usize>()
        })
        .unwrap_or(0);
    assert_eq!(kept, 0, "a link that is not the last goes without trace");
    fs::remove_file(m.p("g")).unwrap();
    assert_eq!(origins(&m), ["/g"]);

    // Open, then deleted: still read and written through the descriptor, kept in the trash.
    fs::write(m.p("open"), b"0123456789").unwrap();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("open"))
        .unwrap();
    fs::remove_file(m.p("open")).unwrap();
    assert_eq!(
        f.metadata().unwrap().nlink(),
        0,
        "deleted, as on any file system, though kept in the trash"
    );
    std::io::Write::write_all(&mut f, b"AB").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"AB23456789");
    drop(f);
    let (_, entries) = trash(&m);
    let kept = entries.iter().find(|(o, _)| o == "/open").unwrap();
    assert_eq!(fs::read(&kept.1).unwrap(), b"AB23456789");
}

#[test]
fn hard_links_and_open_files_in_the_trash() {
    on_both(links_and_open_files);
}

fn who_may_do_what(vol: &Volume) {
    let m = vol.mount();
    fs::create_dir(m.p("home")).unwrap();
    fs::set_permissions(m.p("home"), fs::Permissions::from_mode(0o777)).unwrap();
    let mine = m.p("home/mine");
    as_user(1000, 1000, || {
        fs::write(&mine, b"user data").map_err(|e| errno(&e))?;
        fs::set_permissions(&mine, fs::Permissions::from_mode(0o600)).map_err(|e| errno(&e))?;
        fs::remove_file(&mine).map_err(|e| errno(&e))
    })
    .unwrap();
    fs::write(m.p("secret"), b"root data").unwrap();
    fs::set_permissions(m.p("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(m.p("secret")).unwrap();
    let (hour, entries) = trash(&m);
    let path = |o: &str| entries.iter().find(|(x, _)| x == o).unwrap().1.clone();
    let (theirs, roots) = (path("/home/mine"), path("/secret"));
    assert_eq!(fs::metadata(&theirs).unwrap().uid(), 1000);
    as_user(1000, 1000, || {
        // Their own file they read; another's they cannot; nothing is made in the trash.
        let got = fs::read(&theirs).map_err(|e| errno(&e))?;
        assert_eq!(got, b"user data");
        // Listed, the hour shows them only their own entries.
        let seen: Vec<PathBuf> = fs::read_dir(&hour)
            .map_err(|e| errno(&e))?
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(seen, std::slice::from_ref(&theirs));
        assert_eq!(fs::read(&roots).map_err(|e| errno(&e)), Err(libc::EACCES));
        for p in [hour.join("new"), m.p(".trash/new")] {
            let e = File::create(&p).map_err(|e| errno(&e)).unwrap_err();
            assert!(e == libc::EPERM || e == libc::EACCES, "{p:?}: {e}");
        }
        assert_eq!(
            fs::remove_file(&roots).map_err(|e| errno(&e)),
            Err(libc::EPERM),
            "the sticky bit keeps another's entry"
        );
        Ok(())
    })
    .unwrap();
    // The trash itself cannot go, nor be replaced.
    assert_eq!(
        fs::remove_dir(m.p(".trash")).map_err(|e| errno(&e)),
        Err(libc::EPERM)
    );
    assert_eq!(
        fs::rename(m.p("home"), m.p(".trash")).map_err(|e| errno(&e)),
        Err(libc::EPERM)
    );
    // Deleted from the trash by its owner: gone for good.
    as_user(1000, 1000, || {
        fs::remove_file(&theirs).map_err(|e| errno(&e))
    })
    .unwrap();
    assert_eq!(origins(&m), ["/secret"]);
}

#[test]
fn owners_read_their_own_and_nothing_is_made_in_the_trash() {
    on_both(who_may_do_what);
}

fn status_usage(vol: &Volume) -> (u64, u64) {
    let (ok, out, err) = vol.cmd("status", &["--json"]);
    assert!(ok, "status: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    (
        v["usage"]["bytes"].as_u64().unwrap(),
        v["usage"]["inodes"].as_u64().unwrap(),
    )
}

fn expired_entries_are_purged(vol: &Volume) {
    let m = vol.mount();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/big"), vec![5u8; 3 << 20]).unwrap();
    let before = status_usage(vol);
    fs::remove_dir_all(m.p("d")).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || status_usage(vol).0 == before.0),
        "the trash still counts in the usage"
    );
    let (ok, out, err) = vol.cmd("config", &["--trash-days", "0"]);
    assert!(ok, "config: {out}{err}");
    // Purged at the mount's next heartbeat: the bytes and inodes held are given back.
    assert!(
        eventually(Duration::from_secs(60), || status_usage(vol).0 == 0),
        "never purged: {:?}",
        status_usage(vol)
    );
    // Deletions no longer keep anything.
    fs::write(m.p("x"), b"x").unwrap();
    fs::remove_file(m.p("x")).unwrap();
    let m = {
        m.unmount();
        remount(vol)
    };
    assert_eq!(fs::read_dir(m.p(".trash")).unwrap().count(), 0);
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok, "fsck after the purge: {out}{err}");
    // The root and the trash are what is left.
    assert_eq!(status_usage(vol), (0, 2));
}

#[test]
fn expired_entries_are_purged_and_their_space_given_back() {
    on_both(expired_entries_are_purged);
}

#[test]
fn a_new_volume_keeps_a_day_of_trash_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/meta.db", dir.path().display());
    let out = unkai()
        .env_remove("UNKAI_TRASH_DAYS")
        .args(["format", &url, "deflt"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (ok, out, err) = run(&["config", "--json", &url]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["trash_days"], 1);
}

#[test]
fn restore_without_a_trash_is_a_one_line_error() {
    let vol = Volume::new();
    let m = vol.mount();
    let (ok, _, err) = restore(&vol, &m);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("holds no trash"), "{err}");
}

/// The files in the trash (every hour directory), by the number in their names (`fNN`).
fn trashed_numbers(m: &Mount) -> Vec<usize> {
    let mut out = Vec::new();
    for hour in fs::read_dir(m.p(".trash")).unwrap() {
        for e in fs::read_dir(hour.unwrap().path()).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            // PARENT-INODE-fNN
            let n = name.rsplit('-').next().unwrap();
            out.push(n.trim_start_matches('f').parse::<usize>().unwrap());
        }
    }
    out.sort();
    out
}

/// A disk under a `file://` bucket does not fill up with trash: below its free-space floor
/// the oldest trash goes early (its objects deleted), writes go on, the log says so once and
/// `unkai status` counts what went. Twice a small disk's size is written and deleted, the
/// bucket and the cache directory on it, the default day of trash kept.
fn short_of_room(postgres: bool) {
    let Some(disk) = LoopDisk::new(128) else {
        return;
    };
    let storage = format!("file://{}/bucket", disk.path.display());
    let mut env = env();
    env.push((
        "UNKAI_CACHE_DIR".into(),
        disk.path.join("cache").display().to_string(),
    ));
    let args = [
        "--storage",
        &storage,
        "--trash-days",
        "1",
        "--block-size",
        "1M",
    ];
    let vol = match postgres {
        false => Volume::with_env(&args, env),
        true => match Volume::postgres(&args, |u| u.to_string(), env) {
            Some(vol) => vol,
            None => return eprintln!("skipped on PostgreSQL: UNKAI_TEST_POSTGRES is unset"),
        },
    };
    let m = vol.mount();
    const LEN: usize = 4 << 20;
    const FILES: usize = 64;
    for i in 0..FILES {
        let p = m.p(&format!("f{i:02}"));
        let data = pattern(LEN, i as u64);
        // Written and closed, the close's answer checked (a drop ignores it).
        let written = File::create(&p).and_then(|mut f| {
            f.write_all(&data)?;
            match unsafe { libc::close(f.into_raw_fd()) } {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
        if let Err(e) = written {
            panic!(
                "writing f{i:02} failed ({} bytes free on the disk): {e}; log:\n{}",
                disk.avail(),
                tail(&m.log_text(), 20)
            );
        }
        let mut f = File::open(&p).unwrap();
        drop_cache(&f);
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        if back != data {
            let first = back.iter().zip(&data).position(|(a, b)| a != b);
            panic!(
                "f{i:02} reads back wrong: {} bytes, the first wrong at {first:?}",
                back.len()
            );
        }
        fs::remove_file(&p).unwrap();
    }
    // What is left in the trash is the newest files, a run up to the last one deleted.
    let kept = trashed_numbers(&m);
    assert!(
        !kept.is_empty() && kept.len() < FILES,
        "the trash holds {kept:?}"
    );
    assert_eq!(
        kept,
        (FILES - kept.len()..FILES).collect::<Vec<_>>(),
        "the oldest trash goes first"
    );
    let log = m.log_text();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("trash purged early for disk space"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {said:#?}");
    // Counted in the volume: every file not in the trash went early.
    let gone = FILES - kept.len();
    let (ok, out, err) = vol.cmd("status", &["--json"]);
    assert!(ok, "status: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let early = &v["usage"]["trash_purged_early"];
    assert_eq!(early["entries"].as_u64(), Some(gone as u64), "{out}");
    assert_eq!(early["bytes"].as_u64(), Some((gone * LEN) as u64), "{out}");
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(ok, "status: {out}{err}");
    assert!(
        out.contains(&format!(
            "trash purged early for disk space: {gone} entries, {}.0 MiB",
            gone * 4
        )),
        "{out}"
    );
    m.unmount();
    // Nothing of what went is left in the bucket, and the volume is consistent.
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok && !out.contains("LEAKED"), "fsck: {out}{err}");
    // Counted in bytes, as the objects' names give them (`{slice}_{block}_{len}`), not in
    // objects: a file may go up as two slices where the kernel's writeback cache had handed
    // over only part of it when a FLUSH came (a close of the descriptor by a child of this
    // process at its exec: the other test here starts commands), and its slice then ends
    // off the block grid, one object more. The second slice may also begin before the
    // first ends (pages the application dirtied again while the kernel wrote them back go
    // up again: 24 KiB more once in CI), so the bytes may pass the files' by less than a
    // block; a file purged and left behind would add whole blocks (and fsck, above, finds
    // no leaked object).
    let objects = files_under(&disk.path.join("bucket").join(&vol.name));
    let bytes: usize = objects
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.rsplit('_').next().unwrap().parse::<usize>().unwrap()
        })
        .sum();
    assert!(
        (kept.len() * LEN..kept.len() * LEN + (1 << 20)).contains(&bytes),
        "{bytes} bytes of the objects left in the bucket, {} kept: {objects:#?}\nthe mount's \
         log:\n{}",
        kept.len() * LEN,
        tail(&log, 60)
    );
}

#[test]
fn a_disk_short_of_room_loses_the_oldest_trash_first() {
    short_of_room(false);
}

#[test]
fn a_disk_short_of_room_loses_the_oldest_trash_first_on_postgres() {
    short_of_room(true);
}
