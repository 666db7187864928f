//! Volumes whose metadata lives in PostgreSQL, through real mounts: every kind of change
//! survives a remount, the password never shows, and two mounts (two processes) of one volume
//! see each other's changes. Skipped, saying so, when UNKAI_TEST_POSTGRES is unset (see
//! tests/common/postgres.rs).

use crate::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a tree holds, as a person would compare it: kind, size, content digest, link target,
/// link count, mode and xattrs of every path.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let md = fs::symlink_metadata(&p).unwrap();
            let mut xattrs: Vec<String> = xattr_list(&p)
                .into_iter()
                .map(|n| {
                    let v = xattr_get(&p, &n).unwrap_or_default();
                    format!("{n}={}", String::from_utf8_lossy(&v))
                })
                .collect();
            xattrs.sort();
            let what = if md.file_type().is_symlink() {
                format!("symlink -> {}", fs::read_link(&p).unwrap().display())
            } else if md.is_dir() {
                format!("dir mode {:o} nlink {}", md.mode() & 0o7777, md.nlink())
            } else {
                let data = fs::read(&p).unwrap();
                format!(
                    "file {} bytes, digest {:016x}, nlink {}, mode {:o}, ino-group {}",
                    data.len(),
                    digest(&data),
                    md.nlink(),
                    md.mode() & 0o7777,
                    md.nlink() > 1
                )
            };
            out.insert(rel, format!("{what} xattrs {xattrs:?}"));
            if md.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn digest(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

fn xattr_set(p: &Path, name: &str, value: &[u8]) {
    if let Err(e) = xattr::lsetxattr(p, name, value, 0) {
        panic!("setxattr {name}: {e}");
    }
}

fn xattr_get(p: &Path, name: &str) -> Option<Vec<u8>> {
    xattr::lgetxattr_sized(p, name, 65536).ok().map(|(_, v)| v)
}

fn xattr_list(p: &Path) -> Vec<String> {
    match xattr::llistxattr_sized(p, 65536) {
        Ok((_, buf)) => xattr::user_names(&buf).collect(),
        Err(_) => Vec::new(),
    }
}

/// Five times the default TTL: enough for any kernel cache of the other mount to expire.
const SETTLE: Duration = Duration::from_secs(5);

/// How long a change may take to reach a mount whose kernel TTLs are 60 s for the test to
/// count it pushed: half the TTL, so only a push meets it, yet far beyond any delay a loaded
/// machine adds (the times are printed; speed is for benchmarks, not for assertions).
const PUSHED: Duration = Duration::from_secs(30);

/// Waits until `m`'s own process has logged `times` times that it listens for other mounts'
/// changes (twice: again, after losing the channel). Until then it keeps nothing it reads
/// and hands out 1 s TTLs, so a test of pushed changes begun earlier would time the TTL.
fn wait_listening(m: &Mount, times: usize) {
    let tag = format!("[{}]", m.pid());
    let count = || {
        m.log_text()
            .lines()
            .filter(|l| l.contains(&tag) && l.contains("listening for other mounts' changes"))
            .count()
    };
    assert!(
        eventually(Duration::from_secs(60), || count() >= times),
        "{} logged that it listens {} times, not {times}:\n{}",
        m.path.display(),
        count(),
        m.log_text()
    );
}

/// Every kind of change on a PostgreSQL volume (password in PGPASSWORD, not the URL)
/// survives an unmount and a remount; fsck finds it consistent; formatting over it is
/// refused without --force.
#[test]
fn changes_survive_a_remount() {
    if postgres::skip() {
        return;
    }
    let split = |url: &str| postgres::split_password(url);
    // Kept to the end: it holds the shared test server, whose password this is (dropped, the
    // server could stop and the volume's start another with another password).
    let Some(probe) = postgres::name_only() else {
        return;
    };
    let (_, pw) = split(&probe.url);
    let env = vec![("PGPASSWORD".to_string(), pw)];
    let vol = Volume::postgres(&["--block-size", "64K"], |u| split(u).0, env).unwrap();
    assert!(vol.meta_url.starts_with("postgres://"));
    let m = vol.mount();
    fs::create_dir_all(m.p("a/b/c")).unwrap();
    fs::write(m.p("a/small"), b"hello postgres").unwrap();
    let big = pattern(1_000_000, 7);
    fs::write(m.p("a/b/big"), &big).unwrap();
    fs::write(m.p("gone"), b"x").unwrap();
    fs::remove_file(m.p("gone")).unwrap();
    fs::write(m.p("old-name"), b"renamed").unwrap();
    fs::rename(m.p("old-name"), m.p("a/b/c/new-name")).unwrap();
    fs::hard_link(m.p("a/small"), m.p("a/b/hard")).unwrap();
    symlink("../small", m.p("a/b/link")).unwrap();
    xattr_set(&m.p("a/small"), "user.color", b"blue");
    xattr_set(&m.p("a/b"), "user.dir", b"yes");
    fs::set_permissions(
        m.p("a/b/big"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    fs::create_dir(m.p("empty")).unwrap();
    fs::create_dir(m.p("removed")).unwrap();
    fs::remove_dir(m.p("removed")).unwrap();
    // Overwrite the middle of the big file.
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(m.p("a/b/big"))
            .unwrap();
        f.seek(SeekFrom::Start(300_000)).unwrap();
        f.write_all(&pattern(70_000, 8)).unwrap();
    }
    let before = snapshot(&m.path);
    assert_eq!(fs::read(m.p("a/b/hard")).unwrap(), b"hello postgres");
    assert_eq!(fs::read(m.p("a/b/link")).unwrap(), b"hello postgres");
    assert!(!m.p("gone").exists() && !m.p("removed").exists());
    assert!(before.contains_key("a/b/c/new-name"), "{before:?}");
    m.unmount();

    let m = vol.mount();
    let after = snapshot(&m.path);
    assert_eq!(before, after);
    let mut want = big.clone();
    want[300_000..370_000].copy_from_slice(&pattern(70_000, 8));
    assert_eq!(fs::read(m.p("a/b/big")).unwrap(), want);
    assert_eq!(
        xattr_get(&m.p("a/b/hard"), "user.color").as_deref(),
        Some(&b"blue"[..])
    );
    m.unmount();

    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok, "fsck: {out}{err}");
    assert!(out.contains("volume is consistent"), "{out}");
    let storage = format!("file://{}/bucket", vol.dir.path().display());
    let (ok, out, err) = run_env(
        &["format", "--storage", &storage, &vol.meta_url, "other"],
        &vol.env,
    );
    assert!(!ok, "format over an existing volume succeeded: {out}");
    assert!(err.contains("already exists"), "{err}");
}

/// The password (in the URL here) shows in no output: format, status (text and JSON),
/// fsck, gc, a mount's log, nor the errors of a bad URL or a wrong password.
#[test]
fn the_password_never_shows() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let (_, pw) = postgres::split_password(&vol.meta_url);
    assert!(
        pw.len() >= 16,
        "the test server's password is long enough to spot"
    );
    let mut seen = Vec::new();
    for cmd in [
        vec!["status"],
        vec!["status", "--json"],
        vec!["fsck"],
        vec!["gc"],
    ] {
        let (ok, out, err) = vol.cmd(cmd[0], &cmd[1..]);
        assert!(ok, "{cmd:?}: {out}{err}");
        seen.push((format!("{cmd:?}"), format!("{out}{err}")));
    }
    // Formatting again (forced) prints the URL too.
    let storage = format!("file://{}/bucket", vol.dir.path().display());
    let (ok, out, err) = run(&[
        "format",
        "--force",
        "--storage",
        &storage,
        &vol.meta_url,
        "testvol",
    ]);
    assert!(ok && out.contains("postgres://unkai:***@"), "{out}{err}");
    seen.push(("format --force".into(), format!("{out}{err}")));
    let status = &seen[0].1;
    assert!(
        status.contains("postgres://unkai:***@127.0.0.1"),
        "{status}"
    );
    assert!(status.contains("volume 'testvol'"), "{status}");
    let m = vol.mount();
    fs::write(m.p("f"), b"x").unwrap();
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(
        ok && out.contains(&m.path.display().to_string()),
        "{out}{err}"
    );
    seen.push(("status while mounted".into(), format!("{out}{err}")));
    m.unmount();
    seen.push((
        "mount log".into(),
        fs::read_to_string(vol.dir.path().join("mount.log")).unwrap_or_default(),
    ));
    // A malformed URL, an unknown database, a wrong password: errors, without the secret.
    let (base, _) = postgres::split_password(&vol.meta_url);
    let (scheme, rest) = base.split_once("://").unwrap();
    let (user, host) = rest.split_once('@').unwrap();
    for (url, why) in [
        (
            format!("{scheme}://{user}:{pw}@{host}&sslmode=bogus"),
            "sslmode",
        ),
        (
            postgres::with_db(&vol.meta_url, "no_such_db"),
            "not formatted",
        ),
        (format!("{scheme}://{user}:Wr0ng{pw}@{host}"), "password"),
    ] {
        let (ok, out, err) = run(&["status", &url]);
        assert!(!ok, "status {url} succeeded: {out}");
        assert!(err.contains(why), "{why}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        seen.push((format!("status with a bad URL ({why})"), err));
    }
    for (what, text) in seen {
        assert!(!text.contains(&pw), "{what} shows the password: {text}");
    }
}

/// A rewrites `shared` (which B has read) with new bytes of the same size; returns whether B
/// read the new bytes within [`SETTLE`], and how many stale reads it made before.
fn overwrite_reaches(a: &Mount, b: &Mount) -> (bool, usize) {
    let v1 = pattern(3_000_000, 21);
    fs::write(a.p("shared"), &v1).unwrap();
    assert!(
        eventually(SETTLE, || fs::read(b.p("shared")).unwrap() == v1),
        "B never read the first version"
    );
    let v2 = pattern(3_000_000, 22);
    fs::write(a.p("shared"), &v2).unwrap();
    let mut stale_reads = 0;
    let fresh = eventually(SETTLE, || {
        let ok = fs::read(b.p("shared")).unwrap() == v2;
        if !ok {
            stale_reads += 1;
        }
        ok
    });
    (fresh, stale_reads)
}

/// Two default mounts (FOPEN_KEEP_CACHE on): B keeps a file's pages across opens only while
/// the file is unchanged, so it reads A's overwrite (once made it kept the old pages for good).
#[test]
fn default_mounts_read_each_others_overwrites() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount();
    let b = vol.mount();
    let (fresh, stale_reads) = overwrite_reaches(&a, &b);
    a.unmount();
    b.unmount();
    assert!(
        fresh,
        "B still reads the old content {SETTLE:?} after A's overwrite ({stale_reads} stale reads)"
    );
}

/// Two mounts of one volume, two processes: what A writes and closes, B reads whole after
/// opening (close-to-open); A's unlink, rename, mkdir and overwrite reach B once B's kernel
/// caches expire (TTL 1 s); and the same the other way round.
/// Close-to-open for files made in a group: a file created (and written or not) and closed
/// on one mount is found at once by an open on another, though the RELEASE that follows the
/// close reaches unkai after close(2) has returned (seen: two mounts appending to a log made
/// just before by one of them found no file).
#[test]
fn a_file_closed_on_one_mount_opens_at_once_on_another() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount();
    let b = vol.mount();
    std::fs::create_dir(a.p("d")).unwrap();
    // (A mkdir is no close: b sees it when a's group commits, within milliseconds.)
    assert!(eventually(Duration::from_secs(30), || b.p("d").is_dir()));
    for i in 0..100 {
        let name = format!("d/f{i}");
        match i % 2 {
            0 => drop(std::fs::File::create(a.p(&name)).unwrap()),
            _ => std::fs::write(a.p(&name), b"made on a").unwrap(),
        }
        let got = std::fs::read(b.p(&name));
        assert!(got.is_ok(), "{name}, closed on a, on b: {got:?}");
        let want: &[u8] = if i % 2 == 0 { b"" } else { b"made on a" };
        assert_eq!(got.unwrap(), want, "{name}");
    }
    a.unmount();
    b.unmount();
}

#[test]
fn two_mounts_see_each_other() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&["--block-size", "64K"], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount();
    // The default FOPEN_KEEP_CACHE is for a mount that is its volume's only writer.
    let b = vol.mount_with(&["--no-keep-cache"]);
    assert_ne!(a.path, b.path);
    assert_ne!(a.pid(), b.pid());

    // Close-to-open: written and closed in A, read whole in B.
    let data = pattern(3_000_000, 11);
    fs::write(a.p("shared"), &data).unwrap();
    assert_eq!(fs::read(b.p("shared")).unwrap(), data, "B reads A's file");

    // And back: B writes, A reads.
    let back = pattern(200_000, 12);
    fs::write(b.p("from-b"), &back).unwrap();
    assert_eq!(fs::read(a.p("from-b")).unwrap(), back, "A reads B's file");

    // A new directory and entries in it, seen by B.
    fs::create_dir(a.p("d")).unwrap();
    fs::write(a.p("d/inner"), b"inner").unwrap();
    assert!(
        eventually(SETTLE, || fs::read(b.p("d/inner")).ok().as_deref()
            == Some(b"inner")),
        "B never saw d/inner"
    );

    // An overwrite of a file B has read: same size, new bytes. B (no page cache kept across
    // opens) reads the new bytes once its attribute cache expires.
    let (fresh, stale_reads) = overwrite_reaches(&a, &b);
    assert!(
        fresh,
        "B still reads the old content of a file A overwrote, {SETTLE:?} later \
         ({stale_reads} stale reads)"
    );

    // Unlink and rename in A reach B.
    fs::remove_file(a.p("from-b")).unwrap();
    fs::rename(a.p("d/inner"), a.p("moved")).unwrap();
    assert!(
        eventually(SETTLE, || !b.p("from-b").exists()),
        "B still sees an unlinked file"
    );
    assert!(
        eventually(SETTLE, || !b.p("d/inner").exists()
            && fs::read(b.p("moved")).ok().as_deref() == Some(b"inner")),
        "B does not see the rename"
    );
    let mut names: Vec<String> = fs::read_dir(&b.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "moved", "shared"]);

    // Both mounts are registered.
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&a.path.display().to_string()) && out.contains(&b.path.display().to_string()),
        "{out}"
    );
    a.unmount();
    b.unmount();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
}

/// A client takes an inode its own commit changed last as that commit left it, and checks so
/// in the same message as its next change (a create in a directory it knows, a chmod of a
/// file it wrote: one round trip each). A change by another client in between fails that
/// check, and the change runs again reading under its lock: nothing the other client did is
/// overwritten with what the first one knew.
#[test]
fn a_change_by_another_client_between_two_of_mine_is_kept() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount();
    let b = vol.mount();
    // A knows d (two links and one from x) and f.
    fs::create_dir(a.p("d")).unwrap();
    fs::create_dir(a.p("d/x")).unwrap();
    fs::write(a.p("d/f"), b"mine").unwrap();
    assert!(
        eventually(SETTLE, || b.p("d/f").exists()),
        "B never saw A's d/f"
    );
    // B changes both: one more subdirectory in d, another owner for f.
    fs::create_dir(b.p("d/y")).unwrap();
    std::os::unix::fs::chown(b.p("d/f"), Some(4321), None).unwrap();
    // A changes both again, from what it knew.
    fs::create_dir(a.p("d/z")).unwrap();
    fs::set_permissions(a.p("d/f"), fs::Permissions::from_mode(0o640)).unwrap();
    for (m, who) in [(&a, "A"), (&b, "B")] {
        assert!(
            eventually(SETTLE, || fs::metadata(m.p("d")).unwrap().nlink() == 5),
            "{who}: d has {} links, not 5 (2 and x, y, z)",
            fs::metadata(m.p("d")).unwrap().nlink()
        );
        assert!(
            eventually(SETTLE, || {
                let md = fs::metadata(m.p("d/f")).unwrap();
                md.uid() == 4321 && md.mode() & 0o7777 == 0o640
            }),
            "{who}: f is {:?}, not owner 4321 and mode 640",
            fs::metadata(m.p("d/f")).map(|md| (md.uid(), md.mode() & 0o7777))
        );
    }
    a.unmount();
    b.unmount();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
}

/// A short session timeout for the mounts of a test (heartbeats and dead-session checks then
/// run every background tick).
fn short_timeout() -> Vec<(String, String)> {
    vec![("UNKAI_SESSION_TIMEOUT".to_string(), "3".to_string())]
}

/// POSIX: a file open on mount B stays readable and writable through B's descriptor after
/// mount A unlinks its last name; B's last close deletes it, and its objects go.
#[test]
fn a_file_open_on_one_mount_survives_an_unlink_on_another() {
    use std::io::{Read, Seek, SeekFrom, Write};
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&["--block-size", "64K"], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount();
    let b = vol.mount_with(&["--no-keep-cache"]);
    let data = pattern(1_000_000, 31);
    fs::write(a.p("f"), &data).unwrap();
    fs::write(a.p("keep"), b"kept").unwrap();
    let objects = vol.objects().len();
    assert!(objects > 1, "{objects} objects");
    let mut held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(b.p("f"))
        .unwrap();
    fs::remove_file(a.p("f")).unwrap();
    assert!(!a.p("f").exists());
    let mut got = Vec::new();
    let r = held.read_to_end(&mut got);
    // Writes through B's descriptor still land, and read back.
    let w = held
        .seek(SeekFrom::Start(10))
        .and_then(|_| held.write_all(b"written after the unlink"))
        .and_then(|_| held.sync_all());
    let mut back = vec![0u8; 24];
    let rb = held
        .seek(SeekFrom::Start(10))
        .and_then(|_| held.read_exact(&mut back));
    let nlink = held.metadata().map(|m| m.nlink());
    let during = vol.objects().len();
    drop(held);
    // B's close was the last: the inode and its data go (the objects once a background round
    // of either mount deletes them).
    let gone = eventually(SETTLE, || vol.objects().len() == 1);
    let left = vol.objects().len();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    a.unmount();
    b.unmount();
    r.unwrap();
    assert_eq!(got, data, "B read the unlinked file");
    w.unwrap();
    rb.unwrap();
    assert_eq!(&back, b"written after the unlink");
    assert_eq!(nlink.unwrap(), 0);
    assert!(
        during >= objects,
        "objects deleted while open: {during} < {objects}"
    );
    assert!(
        gone,
        "{left} objects left after B's last close (want 1: the other file's)"
    );
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
}

/// The same for a rename over the file on the other mount.
#[test]
fn a_file_open_on_one_mount_survives_a_rename_over_it_on_another() {
    use std::io::Read;
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&["--block-size", "64K"], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount();
    let b = vol.mount_with(&["--no-keep-cache"]);
    let old = pattern(500_000, 41);
    fs::write(a.p("target"), &old).unwrap();
    let mut held = fs::File::open(b.p("target")).unwrap();
    fs::write(a.p("new"), b"the new content").unwrap();
    let objects = vol.objects().len();
    fs::rename(a.p("new"), a.p("target")).unwrap();
    let mut got = Vec::new();
    let r = held.read_to_end(&mut got);
    let via_name = eventually(SETTLE, || {
        fs::read(b.p("target")).ok().as_deref() == Some(&b"the new content"[..])
    });
    drop(held);
    let gone = eventually(SETTLE, || vol.objects().len() == 1);
    let left = vol.objects().len();
    a.unmount();
    b.unmount();
    r.unwrap();
    assert_eq!(got, old, "B read the replaced file through its descriptor");
    assert!(via_name, "B never saw the new file under the name");
    assert!(objects > 1);
    assert!(gone, "{left} objects left after the last close (want 1)");
}

/// Files by name, and their bytes.
type Files = Vec<(String, Vec<u8>)>;

/// A mount killed (kill -9) in the middle of a group of changes (see `meta/postgres/group`):
/// every file whose close returned is there whole after it, under its name, on another
/// mount; what no close covered may be missing, never half there; fsck finds nothing wrong.
#[test]
fn a_kill_of_a_client_mid_group_loses_nothing_acknowledged() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount();
    let b = vol.mount();
    let root = a.p("t");
    fs::create_dir(&root).unwrap();
    let acked: Arc<Mutex<Files>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (root, acked, stop) = (root.clone(), acked.clone(), stop.clone());
        std::thread::spawn(move || {
            // Directories made as it goes, files written and closed in them, empty files
            // and chmods between: creates and mkdirs join the open group, each close of a
            // written file commits it.
            for i in 0u64.. {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let dir = format!("d{}", i / 10);
                if fs::create_dir_all(root.join(&dir)).is_err() {
                    return;
                }
                let _ = fs::File::create(root.join(format!("{dir}/e{i}")));
                let name = format!("{dir}/f{i}");
                let data = pattern(100 + (i as usize * 37) % 5000, i);
                if fs::write(root.join(&name), &data).is_err() {
                    return;
                }
                // Killed under this lock: a write that ended after the kill (on the bare
                // mountpoint) is not counted.
                let mut acked = acked.lock().unwrap();
                if stop.load(Ordering::Acquire) {
                    return;
                }
                acked.push((name, data));
            }
        })
    };
    // Killed while it writes.
    let started = eventually(Duration::from_secs(60), || {
        acked.lock().unwrap().len() >= 60
    });
    {
        let _held = acked.lock().unwrap();
        a.kill9();
        stop.store(true, Ordering::Release);
    }
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(started, "the writer made only {} files", acked.len());
    for (name, data) in &acked {
        let got = fs::read(b.p(&format!("t/{name}"))).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            got == *data,
            "{name}: {} bytes, {} expected",
            got.len(),
            data.len()
        );
    }
    b.unmount();
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(
        ok && !out.lines().any(|l| l.starts_with("ERROR")),
        "{out}{err}"
    );
}

/// Mount B dies (kill -9) holding an unlinked file open: once B's session is found dead (its
/// process is gone, or its heartbeat is older than the session timeout), mount A reclaims
/// the file and its objects.
#[test]
fn a_dead_mount_s_unlinked_open_file_is_reclaimed() {
    if postgres::skip() {
        return;
    }
    let vol =
        Volume::postgres(&["--block-size", "64K"], |u| u.to_string(), short_timeout()).unwrap();
    let a = vol.mount();
    let b = vol.mount_with(&["--no-keep-cache"]);
    let data = pattern(300_000, 51);
    fs::write(a.p("f"), &data).unwrap();
    let objects = vol.objects().len();
    let held = fs::File::open(b.p("f")).unwrap();
    fs::remove_file(a.p("f")).unwrap();
    // Kept while B lives (several heartbeats of A).
    std::thread::sleep(Duration::from_secs(2));
    let kept = vol.objects().len();
    b.kill9();
    drop(held);
    let gone = eventually(Duration::from_secs(20), || vol.objects().is_empty());
    let left = vol.objects().len();
    a.unmount();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert_eq!(kept, objects, "objects deleted while B had the file open");
    assert!(gone, "{left} objects left after B died");
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
}

/// How many pages of the file at `p` are in the page cache: (resident, total). Opening the
/// file is part of the question: an open that drops the file's pages shows here.
fn resident_pages(p: &Path) -> (usize, usize) {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let pages = len.div_ceil(page);
    if pages == 0 {
        return (0, 0);
    }
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped below; mincore only
    // reports on it (it touches no page).
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            addr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        let mut vec = vec![0u8; pages];
        let r = libc::mincore(addr, len, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(addr, len);
        assert_eq!(r, 0, "mincore: {err}");
        (vec.iter().filter(|v| **v & 1 != 0).count(), pages)
    }
}

/// Re-reading a file nobody changed stays in the kernel's page cache (FOPEN_KEEP_CACHE at the
/// next open), also after a change to another file elsewhere and after this mount's own
/// writes; once another mount rewrote it, the next open drops the pages and reads the new
/// bytes.
#[test]
fn a_reread_of_an_unchanged_file_comes_from_the_page_cache() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount();
    let b = vol.mount();
    let v1 = pattern(2_000_000, 41);
    fs::write(a.p("f"), &v1).unwrap();
    // A's change reaches B's kernel as an invalidation a few ms after the close: let it pass
    // before B fills its cache.
    std::thread::sleep(Duration::from_millis(300));
    assert!(fs::read(b.p("f")).unwrap() == v1, "read the wrong bytes");
    let (res, total) = resident_pages(&b.p("f"));
    assert_eq!(
        res, total,
        "B's pages of f after reading it and opening it again"
    );
    // A change of another file elsewhere leaves f's pages alone.
    fs::write(a.p("other"), b"something else").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(fs::read(b.p("f")).unwrap() == v1, "read the wrong bytes");
    assert_eq!(resident_pages(&b.p("f")), (total, total));
    // B's own writes keep (nearly all) the pages they left: the kernel may drop a few (the
    // partial last page, one at a request boundary; CI once saw 243 of 245), but a mount that
    // invalidated its own writes would keep next to none.
    let mine = pattern(1_000_000, 42);
    fs::write(b.p("mine"), &mine).unwrap();
    let (res, pages) = resident_pages(&b.p("mine"));
    assert!(
        res * 10 >= pages * 9,
        "only {res} of {pages} pages of B's own file stayed"
    );
    assert!(
        fs::read(b.p("mine")).unwrap() == mine,
        "read the wrong bytes"
    );
    // Rewritten on A: B reads the new bytes.
    let v2 = pattern(2_000_000, 43);
    fs::write(a.p("f"), &v2).unwrap();
    assert!(fs::read(b.p("f")).unwrap() == v2, "read the wrong bytes");
    a.unmount();
    b.unmount();
}

/// With long kernel TTLs (60 s) on both mounts, what A changes reaches B's kernel caches
/// pushed (LISTEN/NOTIFY → FUSE invalidations) within a fraction of a second: a new name B
/// had looked up in vain, a chmod, a rename, an unlink, an overwrite read through a
/// descriptor B holds open (no re-open), a size change.
#[test]
fn changes_on_one_mount_reach_another_at_once() {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let long = [
        "--attr-ttl",
        "60",
        "--entry-ttl",
        "60",
        "--negative-ttl",
        "60",
    ];
    let a = vol.mount_with(&long);
    let b = vol.mount_with(&long);
    wait_listening(&a, 1);
    wait_listening(&b, 1);
    fs::create_dir(a.p("d")).unwrap();
    let v1 = pattern(300_000, 51);
    fs::write(a.p("d/f"), &v1).unwrap();
    fs::write(a.p("d/victim"), b"v").unwrap();
    fs::write(a.p("d/old-name"), b"o").unwrap();
    // B caches all of it: names, attributes, a negative entry, pages.
    assert!(!b.p("d/new").exists());
    assert_eq!(fs::metadata(b.p("d/f")).unwrap().mode() & 0o7777, 0o644);
    assert!(b.p("d/victim").exists() && b.p("d/old-name").exists());
    let held = fs::File::open(b.p("d/f")).unwrap();
    let mut buf = vec![0u8; v1.len()];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf == v1);

    let mut seen = Vec::new();
    let mut shows = |what: &str, f: &mut dyn FnMut() -> bool| {
        let start = Instant::now();
        assert!(
            eventually(PUSHED, &mut *f),
            "B does not see A's {what} after {PUSHED:?} (its TTLs are 60 s); B's log:\n{}",
            b.log_text()
        );
        seen.push(format!("{what} {:?}", start.elapsed()));
    };
    fs::write(a.p("d/new"), b"new").unwrap();
    shows("create", &mut || b.p("d/new").exists());
    fs::set_permissions(a.p("d/f"), fs::Permissions::from_mode(0o600)).unwrap();
    shows("chmod", &mut || {
        fs::metadata(b.p("d/f")).unwrap().mode() & 0o7777 == 0o600
    });
    fs::rename(a.p("d/old-name"), a.p("d/renamed")).unwrap();
    shows("rename", &mut || {
        !b.p("d/old-name").exists() && b.p("d/renamed").exists()
    });
    fs::remove_file(a.p("d/victim")).unwrap();
    shows("unlink", &mut || !b.p("d/victim").exists());
    let mut names: Vec<String> = fs::read_dir(b.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["f", "new", "renamed"]);
    // Same size, new bytes, written and closed on A: B's open descriptor reads them.
    let v2 = pattern(300_000, 52);
    {
        let f = fs::OpenOptions::new().write(true).open(a.p("d/f")).unwrap();
        f.write_all_at(&v2, 0).unwrap();
    }
    shows("overwrite", &mut || {
        held.read_exact_at(&mut buf, 0).unwrap();
        buf == v2
    });
    {
        let f = fs::OpenOptions::new()
            .append(true)
            .open(a.p("d/f"))
            .unwrap();
        f.write_all_at(b"tail", v2.len() as u64).unwrap();
    }
    shows("append", &mut || {
        fs::metadata(b.p("d/f")).unwrap().len() == v2.len() as u64 + 4
    });
    // And the other way round.
    fs::write(b.p("from-b"), b"b").unwrap();
    shows("create on B", &mut || a.p("from-b").exists());
    drop(held);
    eprintln!("seen on the other mount after: {}", seen.join(", "));
    a.unmount();
    b.unmount();
}

/// The latency of a change on one mount reaching another (long TTLs, pushed): a chmod on A
/// until `stat` on B shows it, polled every millisecond; printed, and far below the TTL.
#[test]
fn the_latency_of_a_pushed_change() {
    use std::os::unix::fs::PermissionsExt;
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let long = ["--attr-ttl", "60", "--entry-ttl", "60"];
    let a = vol.mount_with(&long);
    let b = vol.mount_with(&long);
    wait_listening(&a, 1);
    wait_listening(&b, 1);
    fs::write(a.p("f"), b"x").unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&b.p("f")), 0o644);
    let mut took = Vec::new();
    for (i, m) in [0o600, 0o640, 0o604, 0o644, 0o600].into_iter().enumerate() {
        fs::set_permissions(a.p("f"), fs::Permissions::from_mode(m)).unwrap();
        let start = Instant::now();
        while mode(&b.p("f")) != m {
            assert!(
                start.elapsed() < PUSHED,
                "change {i} not seen in {PUSHED:?} (B's TTLs are 60 s); B's log:\n{}",
                b.log_text()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        took.push(start.elapsed());
    }
    took.sort();
    eprintln!(
        "chmod on A seen by stat on B after {took:?} (median {:?})",
        took[2]
    );
    a.unmount();
    b.unmount();
}

/// Two mounts of one SQLite volume (no change notification): the first has 30 s TTLs (it was
/// alone when it mounted), yet an open on either reads what the last close on the other
/// left, new size included (close-to-open, checked at open).
#[test]
fn sqlite_mounts_read_each_others_overwrites_at_open() {
    let vol = Volume::new();
    let a = vol.mount();
    let b = vol.mount();
    let v1 = pattern(500_000, 61);
    fs::write(a.p("f"), &v1).unwrap();
    assert!(fs::read(a.p("f")).unwrap() == v1, "read the wrong bytes");
    assert!(fs::read(b.p("f")).unwrap() == v1, "read the wrong bytes");
    let v2 = pattern(500_000, 62);
    fs::write(b.p("f"), &v2).unwrap();
    assert!(fs::read(a.p("f")).unwrap() == v2, "A reads B's overwrite");
    let v3 = pattern(700_000, 63);
    fs::write(b.p("f"), &v3).unwrap();
    assert_eq!(
        fs::read(a.p("f")).unwrap(),
        v3,
        "A reads B's longer file whole"
    );
    let v4 = pattern(600_000, 64);
    fs::write(a.p("f"), &v4).unwrap();
    assert!(
        fs::read(b.p("f")).unwrap() == v4,
        "B reads A's shorter file"
    );
    a.unmount();
    b.unmount();
}

/// The server ends both mounts' listening connections: each reconnects within a moment
/// (short TTLs meanwhile), and changes are pushed again after.
#[test]
fn pushed_changes_resume_after_the_channel_breaks() {
    use std::os::unix::fs::PermissionsExt;
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let long = ["--attr-ttl", "60", "--entry-ttl", "60"];
    let a = vol.mount_with(&long);
    let b = vol.mount_with(&long);
    let listeners = |admin: &mut ::postgres::Client| -> i64 {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = 'unkai-listen' AND datname = current_database()",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let mut admin = ::postgres::Client::connect(&vol.meta_url, ::postgres::NoTls).unwrap();
    assert!(
        eventually(SETTLE, || listeners(&mut admin) == 2),
        "two mounts, two listeners"
    );
    wait_listening(&a, 1);
    wait_listening(&b, 1);
    fs::write(a.p("f"), b"x").unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&b.p("f")), 0o644);
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = 'unkai-listen' AND datname = current_database()",
            &[],
        )
        .unwrap()
        .len();
    assert_eq!(killed, 2);
    wait_listening(&a, 2);
    wait_listening(&b, 2);
    assert_eq!(listeners(&mut admin), 2, "the mounts listen again");
    assert_eq!(mode(&b.p("f")), 0o644);
    fs::set_permissions(a.p("f"), fs::Permissions::from_mode(0o600)).unwrap();
    let start = Instant::now();
    assert!(
        eventually(PUSHED, || mode(&b.p("f")) == 0o600),
        "B does not see A's chmod after the reconnection; B's log:\n{}",
        b.log_text()
    );
    eprintln!("seen after the reconnection in {:?}", start.elapsed());
    assert!(
        a.logs("lost the channel", SETTLE),
        "A never said it lost the channel:\n{}",
        a.log_text()
    );
    a.unmount();
    b.unmount();
}

// ---------------------------------------------------------------------------------------------
// TLS (sslmode)
// ---------------------------------------------------------------------------------------------

/// The certificate of the shared TLS test server names these.
const LOCAL_SAN: &str = "IP:127.0.0.1,DNS:localhost";

/// How many of unkai's connections to `db` there are, and how many of them are encrypted
/// (asked over the admin connection, from the server's side).
fn unkai_connections(admin: &str, db: &str) -> (i64, i64) {
    let mut c = ::postgres::Client::connect(admin, ::postgres::NoTls).unwrap();
    let r = c
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = $1 AND a.application_name LIKE 'unkai%'",
            &[&db],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// `url` to a server's `localhost` instead of 127.0.0.1.
fn by_name(url: &str) -> String {
    url.replacen("@127.0.0.1:", "@localhost:", 1)
}

/// A command that must fail with one line naming `why`, without the password.
fn fails_clearly(url: &str, why: &str) {
    let (_, pw) = postgres::split_password(url);
    let (ok, out, err) = run(&["status", url]);
    assert!(!ok, "status succeeded: {out}");
    assert!(err.contains(why), "wanted '{why}': {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!err.contains(&pw), "shows the password: {err}");
}

/// sslmode=require (no root given: the certificate is not checked): format, mount, a file
/// written and read back after a remount, every connection of the mount encrypted.
#[test]
fn tls_require_formats_mounts_and_encrypts() {
    let Some(srv) = postgres::tls_server(LOCAL_SAN) else {
        return;
    };
    let db = postgres::database_on(&srv);
    let name = db.name.clone();
    let vol = Volume::postgres_in(
        db,
        &[],
        |u| postgres::with_query(u, "sslmode=require"),
        Vec::new(),
    );
    let m = vol.mount();
    fs::write(m.p("f"), b"over TLS").unwrap();
    // The pool's connections and the LISTEN/NOTIFY ones alike.
    assert!(
        eventually(SETTLE, || {
            let (all, tls) = unkai_connections(&srv.admin, &name);
            all >= 2 && all == tls
        }),
        "not every connection is encrypted: {:?}",
        unkai_connections(&srv.admin, &name)
    );
    m.unmount();
    let m = vol.mount();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"over TLS");
    m.unmount();
    // pg_stat_ssl tells a plain connection (the check above can fail): the admin's own.
    let mut c = ::postgres::Client::connect(&srv.admin, ::postgres::NoTls).unwrap();
    let ssl: bool = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!ssl, "a NoTls connection counted as encrypted");
    // sslmode=disable still connects plain to a server with TLS.
    let plain = postgres::with_query(&vol.meta_url, "sslmode=disable");
    let (ok, out, err) = run(&["status", &plain]);
    assert!(ok, "{out}{err}");
}

/// sslmode=verify-full with the server's CA passes against host `localhost`; without the CA
/// (the system's roots) it fails, saying what to do.
#[test]
fn tls_verify_full_checks_the_chain() {
    let Some(srv) = postgres::tls_server(LOCAL_SAN) else {
        return;
    };
    let ca = srv.ca().display().to_string();
    let vol = Volume::postgres_in(
        postgres::database_on(&srv),
        &[],
        |u| {
            by_name(&postgres::with_query(
                u,
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ))
        },
        Vec::new(),
    );
    assert!(vol.meta_url.contains("@localhost:"), "{}", vol.meta_url);
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(ok && out.contains("volume 'testvol'"), "{out}{err}");
    // By address too: the certificate lists 127.0.0.1.
    let by_ip = vol.meta_url.replacen("@localhost:", "@127.0.0.1:", 1);
    let (ok, out, err) = run(&["status", &by_ip]);
    assert!(ok, "{out}{err}");
    // The root also from PGSSLROOTCERT.
    let env_only = postgres::with_query(&vol.meta_url, "sslmode=verify-full");
    let (ok, out, err) = run_env(
        &["status", &env_only],
        &[("PGSSLROOTCERT".to_string(), ca.clone())],
    );
    assert!(ok, "{out}{err}");
    // Without it: the system's roots do not know this CA.
    fails_clearly(&env_only, "not signed by a trusted root");
    // sslmode=require with a root given checks the chain too (libpq): another CA fails.
    let other = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres.sh"),
    )
    .args([
        "certs",
        &other.path().display().to_string(),
        "DNS:localhost",
    ])
    .output()
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let wrong_ca = other.path().join("ca.crt").display().to_string();
    fails_clearly(
        &postgres::with_query(
            &vol.meta_url,
            &format!("sslmode=require&sslrootcert={wrong_ca}"),
        ),
        "not signed by a trusted root",
    );
    fails_clearly(
        &postgres::with_query(
            &vol.meta_url,
            "sslmode=verify-full&sslrootcert=/no/such.pem",
        ),
        "sslrootcert=/no/such.pem",
    );
}

/// A certificate for another name: verify-full fails, naming the host; verify-ca (chain
/// only) connects.
#[test]
fn tls_verify_full_checks_the_name() {
    let Some(srv) = postgres::tls_server("DNS:db.other.example") else {
        return;
    };
    let db = postgres::database_on(&srv);
    let ca = srv.ca().display().to_string();
    let url =
        |mode: &str| postgres::with_query(&db.url, &format!("sslmode={mode}&sslrootcert={ca}"));
    fails_clearly(&url("verify-full"), "not valid for the host '127.0.0.1'");
    fails_clearly(
        &by_name(&url("verify-full")),
        "not valid for the host 'localhost'",
    );
    // Connected: the database is there, only not formatted.
    let (ok, out, err) = run(&["status", &url("verify-ca")]);
    assert!(!ok && err.contains("not formatted"), "{out}{err}");
}

/// Against a server without TLS: sslmode=require fails, saying so; prefer (the default)
/// falls back to plain.
#[test]
fn tls_against_a_server_without_it() {
    if postgres::skip() {
        return;
    }
    let Some(vol) = Volume::postgres(
        &[],
        |u| postgres::with_query(u, "sslmode=prefer"),
        Vec::new(),
    ) else {
        return;
    };
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(ok && out.contains("volume 'testvol'"), "{out}{err}");
    if std::env::var(postgres::ENV).as_deref() == Ok("local") {
        fails_clearly(
            &postgres::with_query(&vol.meta_url, "sslmode=require"),
            "the server does not accept TLS connections (sslmode=require)",
        );
    }
}

/// A client certificate (sslcert, sslkey) logs in a user the server admits by certificate
/// alone; without it the server's refusal is shown.
#[test]
fn tls_client_certificate() {
    let Some(srv) = postgres::tls_server(LOCAL_SAN) else {
        return;
    };
    let db = postgres::database_on(&srv);
    let mut admin = ::postgres::Client::connect(&srv.admin, ::postgres::NoTls).unwrap();
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE unkai_cert LOGIN; EXCEPTION WHEN duplicate_object \
             THEN NULL; END $$; ALTER DATABASE {} OWNER TO unkai_cert",
            db.name
        ))
        .unwrap();
    let dir = srv.ca().parent().unwrap().to_path_buf();
    let (base, _) = postgres::split_password(&db.url);
    let base = base.replacen("://unkai@", "://unkai_cert@", 1);
    let ca = srv.ca().display().to_string();
    let with_cert = postgres::with_query(
        &base,
        &format!(
            "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
            dir.join("client.crt").display(),
            dir.join("client.key").display()
        ),
    );
    // Connected and logged in: only not formatted.
    let (ok, out, err) = run(&["status", &with_cert]);
    assert!(!ok && err.contains("not formatted"), "{out}{err}");
    let vol = Volume::postgres_in(db, &[], |_| with_cert.clone(), Vec::new());
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(ok && out.contains("volume 'testvol'"), "{out}{err}");
    let (ok, out, err) = run(&[
        "status",
        &postgres::with_query(&base, &format!("sslmode=verify-full&sslrootcert={ca}")),
    ]);
    assert!(!ok && err.contains("certificate"), "{out}{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

/// PostgreSQL crashing (stopped in immediate mode, as a power cut or a kill -9 of the
/// server) loses nothing that close or fsync acknowledged. Namespace and attribute changes
/// commit without waiting for the WAL flush, but the commit of a written file's data at its
/// close, fsync and fsyncdir wait for everything before them. After the restart a new mount
/// reads every such file whole under its name, and fsck finds nothing wrong.
#[test]
fn a_crash_of_the_database_loses_nothing_acknowledged() {
    let Some(srv) = postgres::durable_server() else {
        return;
    };
    let vol = Volume::postgres_in(
        postgres::database_on(&srv),
        &[],
        |u| u.to_string(),
        Vec::new(),
    );
    let m = vol.mount();
    let mut expect: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    fs::create_dir(m.p("d")).unwrap();
    // Written and closed: each close waits for its data's commit, and so for the creates
    // and the mkdir before it.
    for i in 0..40u64 {
        let data = pattern(1000 + 37 * i as usize, i);
        fs::write(m.p(&format!("d/w{i}")), &data).unwrap();
        expect.insert(format!("d/w{i}"), data);
    }
    // Renamed, a mode changed, an empty file and a directory made: lazy commits, made
    // durable by the fsync and fsyncdir that follow.
    for i in 0..10 {
        fs::rename(m.p(&format!("d/w{i}")), m.p(&format!("d/r{i}"))).unwrap();
        let data = expect.remove(&format!("d/w{i}")).unwrap();
        expect.insert(format!("d/r{i}"), data);
    }
    fs::set_permissions(m.p("d/w10"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir(m.p("d/sub")).unwrap();
    let empty = fs::File::create(m.p("d/sub/empty")).unwrap();
    empty.sync_all().unwrap();
    drop(empty);
    expect.insert("d/sub/empty".into(), Vec::new());
    fs::File::open(m.p("d")).unwrap().sync_all().unwrap();
    // At once: the server's WAL writer has not flushed lazy commits yet on its own.
    srv.crash();
    srv.restart(true);
    m.unmount();

    let m = vol.mount();
    for (name, data) in &expect {
        let got = fs::read(m.p(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            got == *data,
            "{name}: {} bytes, {} expected",
            got.len(),
            data.len()
        );
    }
    for i in 0..10 {
        assert!(!m.p(&format!("d/w{i}")).exists(), "d/w{i} was renamed");
    }
    let mode = fs::metadata(m.p("d/w10")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o600, "the chmod fsyncdir covered");
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(
        ok && !out.lines().any(|l| l.starts_with("ERROR")),
        "{out}{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Connections (max_connections)
// ---------------------------------------------------------------------------------------------

/// `threads` threads on each mount at once write `files` small files each, in a directory of
/// their own; then every file is read on the next mount and must be whole. Returns how many
/// files were checked.
fn small_files_everywhere(mounts: &[Mount], threads: usize, files: usize) -> usize {
    let seed = |i: usize, t: usize, k: usize| (i * 100_000 + t * 1000 + k) as u64;
    let len = |k: usize| 100 + 397 * k;
    std::thread::scope(|s| {
        let mut workers = Vec::new();
        for (i, m) in mounts.iter().enumerate() {
            for t in 0..threads {
                workers.push(s.spawn(move || -> Result<(), String> {
                    let d = m.p(&format!("m{i}/t{t}"));
                    fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
                    for k in 0..files {
                        let p = d.join(format!("f{k}"));
                        fs::write(&p, pattern(len(k), seed(i, t, k)))
                            .map_err(|e| format!("{}: {e}", p.display()))?;
                    }
                    Ok(())
                }));
            }
        }
        for w in workers {
            if let Err(e) = w.join().expect("a writer panicked") {
                panic!("a write failed: {e}");
            }
        }
    });
    let n = mounts.len();
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..n)
            .map(|i| {
                let other = &mounts[(i + 1) % n];
                s.spawn(move || {
                    let mut checked = 0;
                    for t in 0..threads {
                        for k in 0..files {
                            let p = other.p(&format!("m{i}/t{t}/f{k}"));
                            let got = fs::read(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
                            assert!(
                                got == pattern(len(k), seed(i, t, k)),
                                "{p:?}: {} bytes, not what mount {i} wrote",
                                got.len()
                            );
                            checked += 1;
                        }
                    }
                    checked
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| r.join().expect("a reader panicked"))
            .sum()
    })
}

/// Polls the server's client backends until told to stop: the most seen in all, and the
/// most seen on database `db`.
struct ConnWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<(i64, i64)>>,
}

impl ConnWatch {
    fn start(admin: &str, db: &str) -> ConnWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut c = ::postgres::Client::connect(admin, ::postgres::NoTls).unwrap();
        let (db, stop2) = (db.to_string(), stop.clone());
        let handle = std::thread::spawn(move || {
            let (mut all, mut ours) = (0i64, 0i64);
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c
                    .query_one(
                        "SELECT count(*), count(*) FILTER (WHERE datname = $1) \
                         FROM pg_stat_activity WHERE backend_type = 'client backend'",
                        &[&db],
                    )
                    .unwrap();
                all = all.max(r.get(0));
                ours = ours.max(r.get(1));
                std::thread::sleep(Duration::from_millis(50));
            }
            (all, ours)
        });
        ConnWatch {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> (i64, i64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap()
    }
}

impl Drop for ConnWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Lines of a mount log where the server refused a connection, other than the note that
/// operations wait for the client's own connections instead.
fn refusals(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            (l.contains("too many clients") || l.contains("remaining connection slots"))
                && !l.contains("operations wait for this client's")
        })
        .collect()
}

/// Twenty mounts of one volume against a server with PostgreSQL's default max_connections
/// (100, three of them for superusers; the mounts log in as an ordinary role), each mount
/// writing small files from eight threads at once (each mount would open up to 8 + 1
/// connections: 180 in all): every operation succeeds, every file is read back whole on
/// another mount, and the server never had more client connections than max_connections.
#[test]
fn twenty_mounts_fit_in_default_max_connections() {
    let Some(srv) = postgres::server_with_max_connections(100) else {
        return;
    };
    let db = postgres::database_for_role(&srv, "unkai_app", "app-secret");
    let db_name = db.name.clone();
    let vol = Volume::postgres_in(db, &[], |u| u.to_string(), Vec::new());
    let mut mounts = Vec::new();
    for _ in 0..20 {
        mounts.push(vol.mount());
    }
    let watch = ConnWatch::start(&srv.admin, &db_name);
    let checked = small_files_everywhere(&mounts, 8, 12);
    let (all, ours) = watch.finish();
    assert_eq!(checked, 20 * 8 * 12);
    eprintln!("most client connections seen: {all} in all, {ours} of the volume");
    assert!(
        all <= 100,
        "{all} client connections, max_connections is 100"
    );
    assert!(ours >= 20, "{ours}: not even one connection per mount seen");
    let log = mounts[0].log_text();
    let bad = refusals(&log);
    assert!(bad.is_empty(), "connections refused: {bad:#?}");
    for m in mounts {
        m.unmount();
    }
}

/// A server with max_connections = 12 (nine for ordinary roles) and three mounts that would
/// each open up to nine: the mounts wait for their own connections instead of failing
/// (they say so once, and count it), every file written is read back whole elsewhere, and
/// with `pool_idle=2` each mount closes the connections it no longer uses, down to one.
#[test]
fn a_full_server_makes_mounts_wait_for_their_own_connections() {
    let Some(srv) = postgres::server_with_max_connections(12) else {
        return;
    };
    let db = postgres::database_for_role(&srv, "unkai_app", "app-secret");
    let db_name = db.name.clone();
    let vol = Volume::postgres_in(db, &[], |u| format!("{u}&pool_idle=2"), Vec::new());
    let mounts: Vec<Mount> = (0..3).map(|_| vol.mount()).collect();
    let checked = small_files_everywhere(&mounts, 8, 25);
    assert_eq!(checked, 3 * 8 * 25);
    let log = mounts[0].log_text();
    assert!(
        log.contains("operations wait for this client's"),
        "no mount waited for its own connections: {log}"
    );
    let bad = refusals(&log);
    assert!(bad.is_empty(), "connections refused: {bad:#?}");
    // Idle: each mount keeps one connection for its operations (and its listener).
    let mut admin = ::postgres::Client::connect(&srv.admin, ::postgres::NoTls).unwrap();
    let mut n = 0;
    let mut pooled = || -> i64 {
        // A lookup of a new name asks the database, and returns a connection to the pool.
        n += 1;
        for m in &mounts {
            let _ = fs::metadata(m.p(&format!("absent{n}")));
        }
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = $1 AND application_name = 'unkai'",
                &[&db_name],
            )
            .unwrap()
            .get(0)
    };
    assert!(
        eventually_every(Duration::from_secs(120), Duration::from_millis(500), || {
            pooled() == 3
        }),
        "idle connections were not closed: {} open",
        pooled()
    );
    for m in mounts {
        m.unmount();
    }
}

/// A bad pool size in the URL is one line naming it.
#[test]
fn a_bad_pool_size_is_refused_in_one_line() {
    let Some(db) = postgres::database() else {
        return;
    };
    fails_clearly(&format!("{}&pool_max=0", db.url), "pool_max=0");
    fails_clearly(&format!("{}&pool_max=lots", db.url), "pool_max=lots");
    fails_clearly(&format!("{}&pool_idle=-1", db.url), "pool_idle=-1");
}
