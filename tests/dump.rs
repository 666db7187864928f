//! `unkai dump` and `unkai load` move a volume between engines (SQLite to PostgreSQL and
//! back) with everything a user sees through a mount intact: the tree, contents (sparse files
//! too), inode numbers, link counts, modes, owners, times to the nanosecond, flags, symlinks,
//! xattrs and ACLs, devices and fifos, and the trash. `mount --backup-meta` puts such dumps in
//! the bucket, where gc leaves them and destroy removes them, and `load` restores one.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::xattr::{lgetxattr_sized, llistxattr_sized, split_names};
use crate::common::{Mount, Volume, cpath, eventually, pattern, postgres, run, run_env, unkai};

/// Every mount of these tests: reads must not move access times, which are compared.
const MOUNT: &[&str] = &["-o", "noatime"];

/// What a path shows through a mount.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: u64,
    blocks: u64,
    rdev: u64,
    times: [(i64, i64); 3],
    flags: Option<u32>,
    target: Option<Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    contents: Option<u64>,
}

fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            cpath(p).as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

/// The inode flags (`lsattr`) of a file or directory.
fn inode_flags(p: &Path) -> Option<u32> {
    let f = std::fs::File::open(p).ok()?;
    let mut flags: libc::c_long = 0;
    // FS_IOC_GETFLAGS
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x8008_6601, &mut flags) };
    (r == 0).then_some(flags as u32)
}

fn hash(data: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut h);
    h.finish()
}

/// Everything under `root` (the trash included), as seen through the mount: stats first,
/// then contents (reads change nothing under `noatime`).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Seen> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Seen>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        if dir == root && root.join(".trash").exists() {
            entries.push(root.join(".trash"));
        }
        for p in entries {
            let m = std::fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let mut xattrs = BTreeMap::new();
            let (_, names) = llistxattr_sized(&p, 65536).unwrap();
            for n in split_names(&names) {
                let name = String::from_utf8(n.to_vec()).unwrap();
                let (_, v) = lgetxattr_sized(&p, &name, 65536).unwrap();
                xattrs.insert(n.to_vec(), v);
            }
            let seen = Seen {
                ino: m.ino(),
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                nlink: m.nlink(),
                size: m.size(),
                blocks: m.blocks(),
                rdev: m.rdev(),
                times: [
                    (m.atime(), m.atime_nsec()),
                    (m.mtime(), m.mtime_nsec()),
                    (m.ctime(), m.ctime_nsec()),
                ],
                flags: (ft.is_file() || ft.is_dir())
                    .then(|| inode_flags(&p))
                    .flatten(),
                target: ft.is_symlink().then(|| {
                    std::fs::read_link(&p)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec()
                }),
                xattrs,
                contents: ft.is_file().then(|| hash(&std::fs::read(&p).unwrap())),
            };
            out.insert(p.strip_prefix(root).unwrap().to_path_buf(), seen);
            if ft.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// A tree of everything a volume records, on a volume that keeps a trash.
fn make_tree(m: &Mount) {
    let d = m.p("d");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::write(d.join("a.txt"), pattern(3 << 20, 1)).unwrap();
    std::fs::write(d.join("small"), b"hello\n").unwrap();
    std::fs::write(m.p("empty"), b"").unwrap();
    // Sparse: a hole over the whole first chunk (64 MiB), data in the second.
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(m.p("sparse"))
        .unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&pattern(5000, 2), (64 << 20) + 12345)
        .unwrap();
    f.set_len((64 << 20) + 100_000).unwrap();
    drop(f);
    std::fs::hard_link(d.join("a.txt"), d.join("sub/a-link")).unwrap();
    std::os::unix::fs::symlink("d/a.txt", m.p("ln")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", d.join("dangling")).unwrap();
    // A name that is not UTF-8.
    let odd = m.path.join(std::ffi::OsStr::from_bytes(b"bin-\xff\xfe"));
    std::fs::write(&odd, b"odd name").unwrap();
    common::xattr::setxattr(&d.join("a.txt"), "user.color", b"blue", 0).unwrap();
    common::xattr::setxattr(&d.join("small"), "user.bin", &[0xff, 0, 1, 2], 0).unwrap();
    common::xattr::lsetxattr(&m.p("ln"), "trusted.on-link", b"yes", 0).unwrap();
    let acl = |args: &[&str]| {
        let st = std::process::Command::new("setfacl")
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "setfacl {args:?}");
    };
    acl(&[
        "-m",
        "u:1234:rwx,g:5678:r",
        d.join("small").to_str().unwrap(),
    ]);
    acl(&["-d", "-m", "u:1234:rx", d.join("sub").to_str().unwrap()]);
    // A file inheriting the default ACL.
    std::fs::write(d.join("sub/inherits"), b"acl").unwrap();
    unsafe {
        assert_eq!(libc::mkfifo(cpath(&m.p("fifo")).as_ptr(), 0o640), 0);
        let dev = libc::makedev(1, 3);
        assert_eq!(
            libc::mknod(cpath(&m.p("null")).as_ptr(), libc::S_IFCHR | 0o600, dev),
            0
        );
    }
    std::fs::set_permissions(d.join("small"), std::fs::Permissions::from_mode(0o4751)).unwrap();
    std::fs::create_dir(m.p("tmp")).unwrap();
    std::fs::set_permissions(m.p("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::os::unix::fs::chown(m.p("empty"), Some(1234), Some(5678)).unwrap();
    let st = std::process::Command::new("chattr")
        .args(["+d", m.p("empty").to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success(), "chattr +d");
    // Times to the nanosecond.
    set_times(
        &d.join("a.txt"),
        (1_500_000_000, 123_456_789),
        (1_600_000_000, 987_654_321),
    );
    set_times(&m.p("ln"), (1_400_000_000, 1), (1_400_000_001, 999_999_999));
    // A file in the trash.
    std::fs::write(d.join("gone.txt"), pattern(10_000, 3)).unwrap();
    std::fs::remove_file(d.join("gone.txt")).unwrap();
}

/// The tree's snapshot, with checks that it holds what the comparison must cover.
fn checked_snapshot(root: &Path) -> BTreeMap<PathBuf, Seen> {
    let s = snapshot(root);
    let a = &s[Path::new("d/a.txt")];
    assert_eq!(a.nlink, 2, "{a:?}");
    assert_eq!(a.times[1], (1_600_000_000, 987_654_321));
    assert!(
        s[Path::new("d/small")]
            .xattrs
            .contains_key(b"system.posix_acl_access".as_slice()),
        "{:?}",
        s[Path::new("d/small")]
    );
    assert!(
        s.keys()
            .any(|p| p.starts_with(".trash") && p.to_string_lossy().ends_with("gone.txt")),
        "nothing in the trash: {:?}",
        s.keys().collect::<Vec<_>>()
    );
    assert_eq!(s[Path::new("empty")].flags.map(|f| f & 0x40), Some(0x40));
    s
}

/// The differences between two snapshots, one line each.
fn differences(a: &BTreeMap<PathBuf, Seen>, b: &BTreeMap<PathBuf, Seen>) -> Vec<String> {
    let keys: BTreeSet<&PathBuf> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{}: {:?} != {:?}", k.display(), a.get(k), b.get(k)))
        .collect()
}

/// A volume whose metadata lives at `meta_url` (loaded there), its temporary directory and
/// PostgreSQL database kept alive with it.
fn loaded(meta_url: String, dir: tempfile::TempDir, db: Option<postgres::TestDb>) -> Volume {
    let env = common::with_cache_dir(Vec::new(), dir.path());
    Volume {
        dir,
        meta_url,
        name: "testvol".into(),
        env,
        db,
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("unkai-test-")
        .tempdir()
        .unwrap()
}

fn fsck_clean(vol: &Volume) {
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
    assert!(!out.contains("ERROR") && !out.contains("LEAKED"), "{out}");
}

/// Makes the tree on `src`, dumps it to `file`, loads it into `dst` and compares them through
/// mounts; fsck is clean after; a second load into `dst` is refused.
fn round_trip(src: &Volume, file: &Path, dst: &Volume) {
    let m = src.mount_with(MOUNT);
    make_tree(&m);
    let before = checked_snapshot(&m.path);
    m.unmount();
    let file = file.to_str().unwrap();
    let (ok, out, err) = run_env(&["dump", &src.meta_url, file], &src.env);
    assert!(ok, "dump: {out}{err}");
    let (ok, out, err) = run_env(&["load", &dst.meta_url, file], &dst.env);
    assert!(ok, "load: {out}{err}");
    let m = dst.mount_with(MOUNT);
    let after = snapshot(&m.path);
    let diff = differences(&before, &after);
    assert!(diff.is_empty(), "{}", diff.join("\n"));
    m.unmount();
    fsck_clean(dst);
    let (ok, _, err) = run_env(&["load", &dst.meta_url, file], &dst.env);
    assert!(!ok, "a second load was accepted");
    assert!(
        err.contains("already holds volume 'testvol'") && err.trim().lines().count() == 1,
        "{err}"
    );
}

#[test]
fn sqlite_to_postgres() {
    let Some(db) = postgres::database() else {
        eprintln!("skipped: UNKAI_TEST_POSTGRES is unset");
        return;
    };
    let src = Volume::with_args(&["--trash-days", "1"]);
    let file = src.dir.path().join("vol.json.zst");
    let dst = loaded(db.url.clone(), tempdir(), Some(db));
    round_trip(&src, &file, &dst);
    // Compressed: zstd's magic.
    assert_eq!(
        &std::fs::read(&file).unwrap()[..4],
        &[0x28, 0xb5, 0x2f, 0xfd]
    );
}

#[test]
fn postgres_to_sqlite() {
    let Some(src) = Volume::postgres(&["--trash-days", "1"], |u| u.to_string(), Vec::new()) else {
        eprintln!("skipped: UNKAI_TEST_POSTGRES is unset");
        return;
    };
    let file = src.dir.path().join("vol.json");
    let dir = tempdir();
    let url = format!("sqlite://{}/meta.db", dir.path().display());
    let dst = loaded(url, dir, None);
    round_trip(&src, &file, &dst);
    // Not compressed: JSON lines, the header first.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("{\"unkai_dump\":{\"version\":1"),
        "{}",
        &text[..80]
    );
    assert!(
        text.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
    );
}

/// Standard output to standard input, SQLite to SQLite (runs without PostgreSQL too).
#[test]
fn through_a_pipe() {
    let src = Volume::with_args(&["--trash-days", "1"]);
    let m = src.mount_with(MOUNT);
    make_tree(&m);
    let before = checked_snapshot(&m.path);
    m.unmount();
    let dump = unkai()
        .args(["dump", &src.meta_url, "-"])
        .envs(src.env.iter().cloned())
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dir = tempdir();
    let url = format!("sqlite://{}/meta.db", dir.path().display());
    let dst = loaded(url, dir, None);
    let mut load = unkai()
        .args(["load", &dst.meta_url, "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    load.stdin.take().unwrap().write_all(&dump.stdout).unwrap();
    let out = load.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = dst.mount_with(MOUNT);
    let diff = differences(&before, &snapshot(&m.path));
    assert!(diff.is_empty(), "{}", diff.join("\n"));
    m.unmount();
    fsck_clean(&dst);

    // A dump cut short is refused, and leaves nothing behind.
    let dir = tempdir();
    let url = format!("sqlite://{}/meta.db", dir.path().display());
    let cut = dir.path().join("cut.json");
    let end = dump
        .stdout
        .windows(7)
        .rposition(|w| w == b"{\"end\":")
        .unwrap();
    std::fs::write(&cut, &dump.stdout[..end]).unwrap();
    let (ok, _, err) = run(&["load", &url, cut.to_str().unwrap()]);
    assert!(!ok && err.contains("cut short"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let (ok, _, err) = run(&["status", &url]);
    assert!(!ok && err.contains("not formatted"), "{err}");
    let (ok, out, err) = run(&[
        "load",
        &url,
        cut.to_str().unwrap().trim_end_matches(".json"),
    ]);
    assert!(!ok && err.contains("cannot open"), "{out}{err}");
}

/// The backups of a volume: `NAME/UUID/meta/dump-*.json.zst` in its bucket.
fn backups(vol: &Volume) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = common::files_under(&vol.bucket().join(&vol.name))
        .into_iter()
        .filter(|p| {
            p.parent().is_some_and(|d| d.ends_with("meta"))
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("dump-")
        })
        .collect();
    out.sort();
    out
}

#[test]
fn backups_into_the_bucket_restore_and_survive_gc() {
    let src = Volume::new();
    let mut args = MOUNT.to_vec();
    args.extend(["--backup-meta", "2s"]);
    let m = src.mount_with(&args);
    std::fs::create_dir(m.p("dir")).unwrap();
    for i in 0..20 {
        std::fs::write(m.p(&format!("dir/f{i}")), pattern(1000 + i * 100, i as u64)).unwrap();
    }
    std::fs::hard_link(m.p("dir/f1"), m.p("link")).unwrap();
    common::xattr::setxattr(&m.p("dir/f2"), "user.k", b"v", 0).unwrap();
    let before = snapshot(&m.path);
    // A backup begun after all that (its name is the second it began).
    let written = unkai::meta::now_nanos() + 1_000_000_000;
    let after_writes = unkai::admin::backup::backup_name(written);
    assert!(
        eventually(Duration::from_secs(60), || {
            backups(&src)
                .iter()
                .any(|b| b.file_name().unwrap().to_string_lossy().as_ref() > after_writes.as_str())
        }),
        "no backup after {after_writes}: {:?}; log:\n{}",
        backups(&src),
        common::tail(&m.log_text(), 20)
    );
    m.unmount();
    let made = backups(&src);
    assert!(
        made.iter()
            .all(|b| b.to_string_lossy().contains(&format!("/{}/", src.name))),
        "{made:?}"
    );

    // gc never takes them for garbage.
    let (ok, out, err) = src.cmd("gc", &["--delete", "--min-age", "0"]);
    assert!(ok, "{out}{err}");
    assert_eq!(backups(&src), made);
    fsck_clean(&src);

    // The newest restores into a new database, with the same files.
    let newest = made.last().unwrap().clone();
    let dir = tempdir();
    let url = format!("sqlite://{}/meta.db", dir.path().display());
    let dst = loaded(url, dir, None);
    let (ok, out, err) = run(&["load", &dst.meta_url, newest.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let m = dst.mount_with(MOUNT);
    let diff = differences(&before, &snapshot(&m.path));
    assert!(diff.is_empty(), "{}", diff.join("\n"));
    m.unmount();
    fsck_clean(&dst);

    // destroy removes them with the volume.
    let uuid = newest
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (ok, out, err) = run_env(&["destroy", "--yes", &src.meta_url, &uuid], &src.env);
    assert!(ok, "{out}{err}");
    assert!(backups(&src).is_empty(), "{:?}", backups(&src));
}

/// Two mounts of one volume, both asked to back up every 2 s: each backup is made by one of
/// them (the claim), never by both. (On SQLite writers take turns; on PostgreSQL the claim's
/// compare-and-swap decides, but two mounts only race when their looks coincide.)
fn one_mount_makes_each_backup(vol: &Volume) {
    let args = ["--backup-meta", "2s"];
    let a = vol.mount_with(&args);
    let b = vol.mount_with(&args);
    std::fs::write(a.p("f"), b"x").unwrap();
    assert!(
        eventually(Duration::from_secs(90), || backups(vol).len() >= 3),
        "{:?}",
        backups(vol)
    );
    a.unmount();
    b.unmount();
    let made = backups(vol);
    let log = std::fs::read_to_string(vol.dir.path().join("mount.log")).unwrap();
    let logged = log.matches("metadata backed up to").count();
    // Two mounts backing up at once would write one key twice (same second) or two keys
    // less than the interval apart.
    assert_eq!(logged, made.len(), "{made:?}\n{log}");
    let secs = |p: &PathBuf| -> (String, i64) {
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        // dump-YYYY-MM-DD-HHMMSS.json.zst
        let day = n[5..15].to_string();
        let t = &n[16..22];
        let v = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
        (day, v(0..2) * 3600 + v(2..4) * 60 + v(4..6))
    };
    for w in made.windows(2) {
        let ((d0, s0), (d1, s1)) = (secs(&w[0]), secs(&w[1]));
        if d0 == d1 {
            assert!(
                s1 - s0 >= 1,
                "backups {w:?} closer than the interval allows"
            );
        }
    }
}

both_engines!(one_mount_makes_each_backup(Vec::new()));
