//! Directory quotas through real mounts (`unkai quota`): bytes and inodes enforced with
//! EDQUOT at `write` and at create, kept right across truncate, hard links, renames between
//! quota trees (a whole directory's usage moves), the trash and restore; `check --repair`
//! recounts; on SQLite and on PostgreSQL, where two clients race to a quota's limit. Also
//! `unkai summary` and `unkai info`, which count a tree as a quota counts it.

use crate::common::*;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// Mounts here beat every 0.4 s, so that the first quota's wait for them is short.
fn fast_heartbeat() -> Vec<(String, String)> {
    vec![("UNKAI_SESSION_TIMEOUT".into(), "6".into())]
}

/// Writes `len` bytes to a new file in 128 KiB writes, then fsyncs and closes it: the bytes
/// `write` accepted, and the errno of the first failure.
fn write_file(path: &Path, len: u64) -> (u64, Result<(), i32>) {
    match File::create(path) {
        Ok(f) => write_to(f, len),
        Err(e) => (0, Err(errno(&e))),
    }
}

/// As [`write_file`], through `f`, open already.
fn write_to(mut f: File, len: u64) -> (u64, Result<(), i32>) {
    let chunk = vec![7u8; 128 << 10];
    let mut done = 0;
    while done < len {
        let n = chunk.len().min((len - done) as usize);
        if let Err(e) = f.write_all(&chunk[..n]) {
            return (done, Err(errno(&e)));
        }
        done += n as u64;
    }
    if let Err(e) = f.sync_all() {
        return (done, Err(errno(&e)));
    }
    (done, Ok(()))
}

/// The quota of `path` as `quota get --json` shows it: (used bytes, used inodes).
fn used(vol: &Volume, path: &str) -> (i64, i64) {
    let (ok, out, err) = vol.cmd("quota", &["get", "--json", "--path", path]);
    assert!(ok, "quota get {path}: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    (
        v[0]["used_bytes"].as_i64().unwrap(),
        v[0]["used_inodes"].as_i64().unwrap(),
    )
}

/// Waits until the quota of `path` says `want` (other processes see a mount's grouped
/// commits within milliseconds, not at once).
fn expect_used(vol: &Volume, path: &str, want: (i64, i64), what: &str) {
    let mut last = (0, 0);
    let ok = eventually(Duration::from_secs(30), || {
        last = used(vol, path);
        last == want
    });
    assert!(
        ok,
        "{what}: quota of {path} says {last:?}, expected {want:?}"
    );
}

fn check_agrees(vol: &Volume) {
    let (ok, out, err) = vol.cmd("quota", &["check"]);
    assert!(ok, "quota check: {out}{err}");
}

/// Under the kernel's writeback cache (which `auto` leaves off on a volume with quotas when
/// the mount starts) a quota set while mounted is kept at fsync and close, not at write(): the
/// kernel took the bytes. Those refused are forgotten by the kernel at close (before close(2)
/// returns, or at the release after it): the size and bytes it shows then are the stored
/// ones, not the ones it took.
#[test]
fn a_quota_set_under_the_writeback_cache_is_kept_at_fsync_and_close() {
    let vol = Volume::with_env(&[], fast_heartbeat());
    let m = vol.mount_with(&["--writeback-cache", "on"]);
    assert!(
        m.log_text().contains("writeback cache on"),
        "{}",
        m.log_text()
    );
    fs::create_dir(m.p("p")).unwrap();
    let (ok, out, err) = vol.cmd("quota", &["set", "--path", "/p", "--capacity", "2M"]);
    assert!(ok, "quota set: {out}{err}");
    // Opened right after the command wrote the database: a command is no company, so the
    // file keeps the cache (design.md, "Whole pages across mounts"; it bypassed the cache,
    // and its writes past the quota failed at write(), when any other writer counted).
    let f = File::create(m.p("p/g")).unwrap();
    let (accepted, res) = write_to(f, 3 * MIB);
    assert_eq!(res, Err(libc::EDQUOT), "fsync past the quota");
    assert_eq!(
        accepted,
        3 * MIB,
        "write() took every byte (the kernel's pages)"
    );
    // Write-backs refused at WRITE (the mount knew of the quota) are forgotten by the kernel
    // before close(2) returns. If the quota reached the mount only after it took them (it
    // learns of quotas at its heartbeat), their commit fails at fsync and close instead, and
    // the kernel forgets them at the RELEASE it sends after close(2) returned (docs/design.md,
    // "Writes refused or dropped after `write` returned"): a stat may come first.
    let mut len = u64::MAX;
    let forgotten = eventually(Duration::from_secs(30), || {
        len = fs::metadata(m.p("p/g")).unwrap().len();
        len <= 2 * MIB
    });
    assert!(forgotten, "the kernel shows {len} bytes past the quota");
    let data = fs::read(m.p("p/g")).unwrap();
    assert_eq!(data.len() as u64, len, "read and stat disagree");
    assert!(
        data.iter().all(|&b| b == 7 || b == 0),
        "bytes never written read back"
    );
    let stored = (len.div_ceil(4096) * 4096) as i64;
    expect_used(&vol, "/p", (stored, 1), "after the refused writes");
    m.unmount();
    let m = vol.mount();
    assert_eq!(fs::read(m.p("p/g")).unwrap(), data, "after a remount");
    m.unmount();
    check_agrees(&vol);
}

fn quotas_kept_right(vol: &Volume) {
    let m = vol.mount();
    let mib = MIB as i64;
    for d in ["p", "p/a", "p/b", "q", "q/d"] {
        fs::create_dir(m.p(d)).unwrap();
    }
    assert_eq!(write_file(&m.p("p/a/f"), 2 * MIB).1, Ok(()));
    let (ok, out, err) = vol.cmd(
        "quota",
        &["set", "--path", "/p", "--capacity", "4M", "--inodes", "8"],
    );
    assert!(ok, "quota set: {out}{err}");
    assert!(out.contains("/p"), "{out}");
    // The tree was counted when the quota was set: a, b and f, f's 2 MiB.
    expect_used(vol, "/p", (2 * mib, 3), "counted at set");
    // A mount that starts on a volume with quotas goes without the kernel's writeback cache
    // (`--writeback-cache auto`), so that write() itself fails past them, as checked below;
    // a quota set under a mount with the cache is kept at fsync and close (tests/writeback.rs).
    m.unmount();
    let m = vol.mount();

    // Bytes: a write past the limit fails at write(); what it accepted is kept, and fits.
    let (accepted, res) = write_file(&m.p("p/b/g"), 3 * MIB);
    assert_eq!(res, Err(libc::EDQUOT), "a write past the quota fails");
    assert!(
        accepted <= 2 * MIB,
        "accepted {accepted} bytes past the quota"
    );
    assert_eq!(fs::metadata(m.p("p/b/g")).unwrap().len(), accepted);
    fs::remove_file(m.p("p/b/g")).unwrap();
    expect_used(
        vol,
        "/p",
        (2 * mib, 3),
        "after the failed write's file went",
    );
    // Truncate counts too.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(m.p("p/a/f"))
        .unwrap();
    assert_eq!(
        f.set_len(5 * MIB).map_err(|e| errno(&e)),
        Err(libc::EDQUOT),
        "a truncate past the quota fails"
    );
    f.set_len(MIB).unwrap();
    drop(f);
    expect_used(vol, "/p", (mib, 3), "after a truncate down");
    // Outside the quota nothing is limited.
    assert_eq!(write_file(&m.p("q/d/x"), 4 * MIB).1, Ok(()));
    assert_eq!(write_file(&m.p("q/y"), MIB).1, Ok(()));

    // Hard links: a name in the tree counts the file, and its growth through any name.
    fs::hard_link(m.p("q/y"), m.p("p/a/y")).unwrap();
    expect_used(vol, "/p", (2 * mib, 4), "after a hard link into the tree");
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.p("q/y"))
        .unwrap();
    f.write_all(&vec![1u8; MIB as usize]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    expect_used(
        vol,
        "/p",
        (3 * mib, 4),
        "after the linked file grew elsewhere",
    );
    fs::remove_file(m.p("p/a/y")).unwrap();
    expect_used(vol, "/p", (mib, 3), "after the link in the tree went");

    // Renames between trees move a whole directory's usage, and are refused past a limit.
    assert_eq!(
        fs::rename(m.p("q/d"), m.p("p/d")).map_err(|e| errno(&e)),
        Err(libc::EDQUOT),
        "moving 4 MiB into a tree that holds 1 MiB of its 4"
    );
    assert!(m.p("q/d/x").exists(), "a refused rename changes nothing");
    fs::rename(m.p("p/a/f"), m.p("q/f")).unwrap();
    expect_used(vol, "/p", (0, 2), "after a file moved out");
    fs::rename(m.p("q/d"), m.p("p/d")).unwrap();
    expect_used(vol, "/p", (4 * mib, 4), "after a directory moved in");
    fs::rename(m.p("p/d"), m.p("p/a/d")).unwrap();
    expect_used(
        vol,
        "/p",
        (4 * mib, 4),
        "a move inside the tree changes nothing",
    );
    fs::rename(m.p("p/a"), m.p("q/a")).unwrap();
    expect_used(vol, "/p", (0, 1), "after a directory moved out");
    fs::rename(m.p("q/a"), m.p("p/a")).unwrap();

    // Inodes: creates until the limit.
    let mut made = 0;
    let err = loop {
        match File::create(m.p(&format!("p/b/n{made}"))) {
            Ok(_) => made += 1,
            Err(e) => break errno(&e),
        }
        assert!(made < 100, "the inode limit is never reached");
    };
    assert_eq!(err, libc::EDQUOT);
    assert_eq!(made, 4, "8 inodes: a, b, d, x and 4 more");
    assert_eq!(
        fs::create_dir(m.p("p/b/dir")).map_err(|e| errno(&e)),
        Err(libc::EDQUOT),
        "a directory is an inode too"
    );
    assert_eq!(
        fs::hard_link(m.p("q/f"), m.p("p/b/link")).map_err(|e| errno(&e)),
        Err(libc::EDQUOT),
        "a link is an entry too"
    );
    check_agrees(vol);

    // A mount of the directory alone shows its quota to df.
    let sub = vol.mount_with(&["--subdir", "/p"]);
    let st = nix::sys::statvfs::statvfs(&sub.path).unwrap();
    assert_eq!(
        st.blocks() * st.fragment_size(),
        4 * MIB,
        "df of a subdir mount"
    );
    assert_eq!(st.files(), 8, "df -i of a subdir mount");
    assert_eq!(st.files_free(), 0);
    drop(sub);

    // Limits change; get and list show them.
    let (ok, out, err) = vol.cmd("quota", &["set", "--path", "/p", "--inodes", "0"]);
    assert!(ok, "{out}{err}");
    File::create(m.p("p/b/more")).unwrap();
    let (ok, out, err) = vol.cmd("quota", &["list"]);
    assert!(
        ok && out.contains("/p") && out.contains("4.0 MiB"),
        "{out}{err}"
    );
    drop(m);
    check_agrees(vol);
    let (ok, out, err) = vol.cmd("quota", &["delete", "--path", "/p"]);
    assert!(ok, "{out}{err}");
    let (ok, out, _) = vol.cmd("quota", &["get", "--path", "/p"]);
    assert!(!ok && out.is_empty(), "a deleted quota is gone");
    let m = remount(vol);
    assert_eq!(
        write_file(&m.p("p/b/big"), 5 * MIB).1,
        Ok(()),
        "no limit any more"
    );
}

#[test]
fn quotas_kept_right_on_sqlite() {
    let vol = Volume::with_env(&[], fast_heartbeat());
    quotas_kept_right(&vol);
}

#[test]
fn quotas_kept_right_on_postgres() {
    match Volume::postgres(&[], |u| u.to_string(), fast_heartbeat()) {
        Some(vol) => quotas_kept_right(&vol),
        None => eprintln!("skipped: UNKAI_TEST_POSTGRES is unset"),
    }
}

/// A deleted file leaves its directory's quota at once (the trash counts in no directory
/// quota) and counts again when restored; the root cannot have a quota; a wrong path or
/// a file is refused in one line.
#[test]
fn the_trash_leaves_quotas_and_restore_comes_back() {
    let mut env = fast_heartbeat();
    env.push(("UNKAI_TRASH_DAYS".into(), "1".into()));
    let vol = Volume::with_env(&["--trash-days", "1"], env);
    let m = vol.mount();
    fs::create_dir_all(m.p("p/a")).unwrap();
    assert_eq!(write_file(&m.p("p/a/f"), MIB).1, Ok(()));
    let (ok, out, err) = vol.cmd("quota", &["set", "--path", "p", "--capacity", "2M"]);
    assert!(ok, "{out}{err}");
    expect_used(&vol, "/p", (MIB as i64, 2), "counted at set");
    fs::remove_file(m.p("p/a/f")).unwrap();
    fs::remove_dir(m.p("p/a")).unwrap();
    expect_used(&vol, "/p", (0, 0), "after deleting into the trash");
    assert_eq!(
        write_file(&m.p("p/g"), 2 * MIB).1,
        Ok(()),
        "the room came back"
    );
    fs::rename(m.p("p/g"), m.p("g")).unwrap();
    let (ok, out, err) = run(&["restore", m.path.to_str().unwrap()]);
    assert!(ok, "restore: {out}{err}");
    assert!(m.p("p/a/f").exists());
    expect_used(&vol, "/p", (MIB as i64, 2), "after restore");
    check_agrees(&vol);

    for (args, says) in [
        (vec!["set", "--path", "/", "--capacity", "1G"], "config"),
        (
            vec!["set", "--path", "/nope", "--capacity", "1G"],
            "no such directory",
        ),
        (
            vec!["set", "--path", "/p/a/f", "--capacity", "1G"],
            "not a directory",
        ),
        (
            vec!["set", "--path", "/p", "--capacity", "5"],
            "give a unit",
        ),
        (vec!["set", "--path", "/p"], "needs a limit"),
    ] {
        let (ok, out, err) = vol.cmd("quota", &args);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
    }
}

/// `check` finds a quota whose usage is wrong and `--repair` stores the count.
#[test]
fn check_repair_recounts() {
    let vol = Volume::with_env(&[], fast_heartbeat());
    {
        let m = vol.mount();
        fs::create_dir_all(m.p("p/a")).unwrap();
        assert_eq!(write_file(&m.p("p/a/f"), MIB).1, Ok(()));
    }
    let (ok, out, err) = vol.cmd("quota", &["set", "--path", "/p", "--inodes", "100"]);
    assert!(ok, "{out}{err}");
    let db = vol.dir.path().join("meta.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute("UPDATE quota SET used_bytes = 5, used_inodes = 77", [])
        .unwrap();
    drop(c);
    let (ok, out, err) = vol.cmd("quota", &["check"]);
    assert!(!ok, "a wrong quota passed the check: {out}");
    assert!(out.contains("77") && err.contains("--repair"), "{out}{err}");
    let (ok, out, err) = vol.cmd("quota", &["check", "--repair"]);
    assert!(ok, "{out}{err}");
    assert_eq!(used(&vol, "/p"), (MIB as i64, 2));
    check_agrees(&vol);
}

/// Two clients of one PostgreSQL volume fill a directory with a quota at once: together
/// they never pass it and leave less than a file's room, each file a call said was written
/// is whole, and any other holds what its earlier writes put (the README: "what earlier
/// writes put is kept, as on a disk that fills"), never more than was written.
#[test]
fn two_clients_race_to_a_quota_on_postgres() {
    let Some(vol) = Volume::postgres(&[], |u| u.to_string(), fast_heartbeat()) else {
        eprintln!("skipped: UNKAI_TEST_POSTGRES is unset");
        return;
    };
    let (m1, m2) = (vol.mount(), vol.mount());
    fs::create_dir_all(m1.p("p/one")).unwrap();
    fs::create_dir_all(m1.p("p/two")).unwrap();
    // Another client finds a change once it is committed (10 ms at most after it was
    // answered): fsyncdir commits it now, for `quota set` to find /p.
    fs::File::open(m1.p("p")).unwrap().sync_all().unwrap();
    let (ok, out, err) = vol.cmd("quota", &["set", "--path", "/p", "--capacity", "20M"]);
    assert!(ok, "{out}{err}");
    assert!(eventually(Duration::from_secs(30), || m2
        .p("p/two")
        .exists()));
    // Each client: how many files it wrote whole, and where its first failure came (file,
    // bytes written when it failed, errno).
    let fill = |dir: std::path::PathBuf| {
        std::thread::spawn(move || {
            let mut whole = 0;
            for i in 0..40 {
                match write_file(&dir.join(format!("f{i}")), MIB) {
                    (_, Ok(())) => whole += 1,
                    (done, Err(e)) => return (whole, Some((i, done, e))),
                }
            }
            (whole, None)
        })
    };
    let (t1, t2) = (fill(m1.p("p/one")), fill(m2.p("p/two")));
    let (r1, r2) = (t1.join().unwrap(), t2.join().unwrap());
    let why = || {
        format!(
            "one: {r1:?}, two: {r2:?} (whole files, then (file, bytes written, errno) of the \
             failure); the quota now {:?}; logs:\n{}",
            used(&vol, "/p"),
            m1.log_text()
        )
    };
    for (_, failed) in [r1, r2] {
        let e = failed.map(|(_, _, e)| e);
        assert_eq!(e, Some(libc::EDQUOT), "{}", why());
    }
    // What the calls said: a file is whole when its writes and fsync succeeded. A file
    // whose fsync or close failed may still hold bytes (seen in full runs of the suite,
    // 2026-12-02: an fsync that failed with EDQUOT after its bytes were counted, its close
    // then storing the file whole; a file of 7 writes whose 8th found no room, kept by its
    // close), so the exact checks are on what the volume holds.
    let said = why();
    assert!(
        r1.0 + r2.0 <= 20,
        "more whole files than the quota holds: {said}"
    );
    drop((m1, m2));
    let m = remount(&vol);
    let mut total = 0;
    for (dir, whole) in [(m.p("p/one"), r1.0), (m.p("p/two"), r2.0)] {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let len = e.metadata().unwrap().len();
            let name = e.file_name().into_string().unwrap();
            let i: usize = name.trim_start_matches('f').parse().unwrap();
            if i < whole {
                assert_eq!(len, MIB, "{name} was written whole: {said}");
            }
            assert!(
                len <= MIB && len % (128 << 10) == 0,
                "{name} holds {len} bytes, not what its writes put: {said}"
            );
            total += len;
        }
    }
    // Neither client stopped while a file's room was left: the quota only fills.
    assert!(
        total > 19 * MIB && total <= 20 * MIB,
        "the files hold {total} bytes: {said}"
    );
    drop(m);
    assert_eq!(used(&vol, "/p").0, total as i64);
    check_agrees(&vol);
}

/// `unkai summary` and `unkai info` read a mount's own view through its virtual xattrs:
/// what a tree holds (the trash not counted), and where a file's data lives.
#[test]
fn summary_and_info_through_the_mount() {
    let mut env = fast_heartbeat();
    env.push(("UNKAI_TRASH_DAYS".into(), "1".into()));
    let vol = Volume::with_env(&["--trash-days", "1"], env);
    let m = vol.mount();
    fs::create_dir_all(m.p("t/d/e")).unwrap();
    assert_eq!(write_file(&m.p("t/d/big"), 5 * MIB).1, Ok(()));
    fs::write(m.p("t/small"), b"hello").unwrap();
    std::os::unix::fs::symlink("small", m.p("t/link")).unwrap();
    fs::write(m.p("t/gone"), b"to the trash").unwrap();
    fs::remove_file(m.p("t/gone")).unwrap();
    let f = File::create(m.p("t/sparse")).unwrap();
    f.set_len(3 * MIB).unwrap();
    drop(f);
    let json = |cmd: &str, p: &Path| -> serde_json::Value {
        let (ok, out, err) = run(&[cmd, "--json", p.to_str().unwrap()]);
        assert!(ok, "{cmd} {}: {out}{err}", p.display());
        serde_json::from_str(out.trim()).unwrap()
    };
    let s = json("summary", &m.p("t"));
    assert_eq!(
        (
            s["files"].as_u64(),
            s["dirs"].as_u64(),
            s["symlinks"].as_u64()
        ),
        (Some(3), Some(2), Some(1)),
        "{s}"
    );
    assert_eq!(s["length"].as_u64(), Some(8 * MIB + 5), "{s}");
    assert_eq!(
        s["stored"].as_u64(),
        Some(5 * MIB + 5),
        "holes do not count: {s}"
    );
    let root = json("summary", &m.path);
    assert_eq!(
        root["files"].as_u64(),
        Some(3),
        "the trash is not counted: {root}"
    );
    assert_eq!(root["dirs"].as_u64(), Some(3), "{root}");

    let i = json("info", &m.p("t/d/big"));
    assert_eq!(i["length"].as_u64(), Some(5 * MIB), "{i}");
    let keys: Vec<String> = i["chunks"][0]["slices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["objects"].as_array().unwrap().clone())
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    assert_eq!(keys.len() as u64, i["objects"].as_u64().unwrap());
    assert!(keys.len() >= 2, "5 MiB in 4 MiB blocks: {i}");
    drop(m);
    for k in &keys {
        assert!(
            vol.bucket().join(k).exists(),
            "object {k} is not in the bucket"
        );
    }
    let m = remount(&vol);
    let (ok, _, err) = run(&["summary", m.p("t/small").to_str().unwrap()]);
    assert!(!ok && err.contains("not a directory"), "{err}");
    let (ok, _, err) = run(&["info", vol.dir.path().to_str().unwrap()]);
    assert!(
        !ok && err.contains("not in a mounted unkai volume"),
        "{err}"
    );
    assert_eq!(
        xattr_set(&m.p("t/small"), "user.unkai.info"),
        Err(libc::EPERM),
        "the virtual xattrs cannot be set"
    );
}

fn xattr_set(p: &Path, name: &str) -> Result<(), i32> {
    let c = cpath(p);
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated strings and a valid one-byte buffer.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// A dump carries the quotas (limits and usage) and a load restores them, enforced.
#[test]
fn quotas_survive_dump_and_load() {
    let vol = Volume::with_env(&[], fast_heartbeat());
    {
        let m = vol.mount();
        fs::create_dir_all(m.p("p/a")).unwrap();
        assert_eq!(write_file(&m.p("p/a/f"), MIB).1, Ok(()));
    }
    let (ok, out, err) = vol.cmd("quota", &["set", "--path", "/p", "--capacity", "2M"]);
    assert!(ok, "{out}{err}");
    let dump = vol.dir.path().join("meta.json");
    let (ok, out, err) = run_env(
        &["dump", "-q", &vol.meta_url, dump.to_str().unwrap()],
        &vol.env,
    );
    assert!(ok, "dump: {out}{err}");
    assert!(fs::read_to_string(&dump).unwrap().contains("\"quota\""));
    let other = vol.dir.path().join("other.db");
    let url = format!("sqlite://{}", other.display());
    let (ok, out, err) = run_env(&["load", "-q", &url, dump.to_str().unwrap()], &vol.env);
    assert!(ok, "load: {out}{err}");
    let (ok, out, err) = run_env(&["quota", "get", "--json", "--path", "/p", &url], &vol.env);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["max_bytes"].as_u64(), Some(2 * MIB));
    assert_eq!(v[0]["used_bytes"].as_u64(), Some(MIB));
    let (ok, out, err) = run_env(&["quota", "check", &url], &vol.env);
    assert!(ok, "the loaded quota agrees with its tree: {out}{err}");
}
