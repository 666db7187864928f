//! POSIX operations through a real FUSE mount, with ordinary syscalls: every call a program
//! makes, each checked for contents, attributes and errno.

use crate::common::rng::XorShift;
use crate::common::xattr::{
    getxattr, getxattr_sized, listxattr, listxattr_sized, lsetxattr, removexattr, setxattr,
};
use crate::common::*;
use std::collections::{BTreeSet, HashSet};
use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{
    DirBuilderExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A known umask, so that create modes are predictable (every test sets the same value).
fn setup() {
    unsafe { libc::umask(0o022) };
}

/// A libc return value as an io::Result.
fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

#[track_caller]
fn expect_errno<T: std::fmt::Debug>(r: io::Result<T>, want: i32) {
    match r {
        Ok(v) => panic!(
            "expected {} (errno {want}), got Ok({v:?})",
            io::Error::from_raw_os_error(want)
        ),
        Err(e) => assert_eq!(
            errno(&e),
            want,
            "expected {} (errno {want}), got {e}",
            io::Error::from_raw_os_error(want)
        ),
    }
}

/// For code running in a child process (as_user): an io::Result as Result<_, errno>.
fn io<T>(r: io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| errno(&e))
}

/// For code running in a child process: a failed check becomes exit code `code` (200+, so
/// that it cannot be mistaken for an errno). Never panic in a forked child.
fn ensure(cond: bool, code: i32) -> Result<(), i32> {
    if cond { Ok(()) } else { Err(code) }
}

/// Reads the whole file through `f` from the file system (page cache dropped first).
fn read_all_at(f: &File) -> Vec<u8> {
    drop_cache(f);
    let len = f.metadata().unwrap().len() as usize;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

/// Reads `len` bytes at `off` (fewer at the end of the file).
fn read_range(p: &Path, off: u64, len: usize) -> Vec<u8> {
    let f = File::open(p).unwrap();
    drop_cache(&f);
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = f.read_at(&mut buf[got..], off + got as u64).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    buf
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// (seconds, nanoseconds) of a modification/change time.
fn mtime(p: &Path) -> (i64, i64) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.mtime(), m.mtime_nsec())
}

fn ctime(p: &Path) -> (i64, i64) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.ctime(), m.ctime_nsec())
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn nlink(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().nlink()
}

fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

/// Lets the clock move on, so that a changed timestamp is visibly later.
fn tick() {
    std::thread::sleep(Duration::from_millis(20));
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let (a, b) = (cpath(from), cpath(to));
    cvt(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
    .map(|_| ())
}

fn mknod(p: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let cp = cpath(p);
    cvt(unsafe { libc::mknod(cp.as_ptr(), mode, dev) }).map(|_| ())
}

fn access(p: &Path, how: i32) -> io::Result<()> {
    let cp = cpath(p);
    cvt(unsafe { libc::access(cp.as_ptr(), how) }).map(|_| ())
}

fn utimensat(p: &Path, times: [(i64, i64); 2], flags: i32) -> io::Result<()> {
    let cp = cpath(p);
    let ts = times.map(|(s, n)| libc::timespec {
        tv_sec: s as libc::time_t,
        tv_nsec: n as _,
    });
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, cp.as_ptr(), ts.as_ptr(), flags) }).map(|_| ())
}

fn lseek(f: &File, off: u64, whence: i32) -> io::Result<u64> {
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as i64, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

/// A directory stream read with readdir(3): every entry, "." and ".." included.
struct RawDir(*mut libc::DIR);

impl RawDir {
    fn open(p: &Path) -> io::Result<RawDir> {
        let cp = cpath(p);
        let d = unsafe { libc::opendir(cp.as_ptr()) };
        if d.is_null() {
            Err(io::Error::last_os_error())
        } else {
            Ok(RawDir(d))
        }
    }

    /// (name, d_ino, d_type), or None at the end.
    fn next(&mut self) -> Option<(Vec<u8>, u64, u8)> {
        unsafe { *libc::__errno_location() = 0 };
        let e = unsafe { libc::readdir64(self.0) };
        if e.is_null() {
            let err = io::Error::last_os_error();
            assert_eq!(err.raw_os_error(), Some(0), "readdir failed: {err}");
            return None;
        }
        let e = unsafe { &*e };
        let name = unsafe { CStr::from_ptr(e.d_name.as_ptr()) }
            .to_bytes()
            .to_vec();
        Some((name, e.d_ino, e.d_type))
    }

    fn all(p: &Path) -> io::Result<Vec<(Vec<u8>, u64, u8)>> {
        let mut d = RawDir::open(p)?;
        let mut out = Vec::new();
        while let Some(e) = d.next() {
            out.push(e);
        }
        Ok(out)
    }
}

impl Drop for RawDir {
    fn drop(&mut self) {
        unsafe { libc::closedir(self.0) };
    }
}

/// Waits (up to 20 s) until none of `objs` exists in the bucket any more.
#[track_caller]
fn wait_objects_gone(vol: &Volume, objs: &[PathBuf]) {
    let start = Instant::now();
    loop {
        let now: HashSet<PathBuf> = vol.objects().into_iter().collect();
        let left: Vec<&PathBuf> = objs.iter().filter(|o| now.contains(*o)).collect();
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "objects of a deleted file still in the bucket after 20 s: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// Attributes: lookup, stat, chmod, chown, truncate, times
// ---------------------------------------------------------------------------------------------

#[test]
fn lookup_and_stat() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/f"), b"hello world").unwrap();

    let md = fs::metadata(m.p("d/f")).unwrap();
    assert!(md.is_file());
    assert_eq!(md.mode() & libc::S_IFMT, libc::S_IFREG);
    assert_eq!(md.mode() & 0o7777, 0o644);
    assert_eq!(md.len(), 11);
    assert_eq!((md.uid(), md.gid()), (0, 0));
    assert_eq!(md.nlink(), 1);
    assert!(md.blksize() > 0);
    // The same inode under other spellings of the path, and through fstat.
    assert_eq!(ino(&m.p("d/../d/./f")), md.ino());
    let f = File::open(m.p("d/f")).unwrap();
    let fm = f.metadata().unwrap();
    assert_eq!((fm.ino(), fm.len(), fm.mode()), (md.ino(), 11, md.mode()));

    let root = fs::metadata(&m.path).unwrap();
    let d = fs::metadata(m.p("d")).unwrap();
    assert!(root.is_dir() && d.is_dir());
    assert_eq!(d.mode() & 0o7777, 0o755);
    assert_eq!(d.nlink(), 2, "an empty directory has 2 links");
    assert_eq!(root.nlink(), 3, "root: 2 + one subdirectory");
    assert_eq!(ino(&m.p("d/..")), root.ino());
    assert_ne!(d.ino(), md.ino());

    expect_errno(fs::metadata(m.p("missing")), libc::ENOENT);
    expect_errno(fs::metadata(m.p("d/missing")), libc::ENOENT);
    expect_errno(fs::metadata(m.p("d/f/x")), libc::ENOTDIR);

    // Writing updates size and mtime; stat sees both, also before close.
    let before = mtime(&m.p("d/f"));
    tick();
    let mut w = OpenOptions::new().append(true).open(m.p("d/f")).unwrap();
    w.write_all(b"!!").unwrap();
    assert_eq!(fs::metadata(m.p("d/f")).unwrap().len(), 13);
    drop(w);
    assert_eq!(fs::metadata(m.p("d/f")).unwrap().len(), 13);
    assert!(mtime(&m.p("d/f")) > before, "write did not move mtime");
    assert_eq!(fs::read(m.p("d/f")).unwrap(), b"hello world!!");
}

#[test]
fn chmod_sets_permission_bits() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    for want in [
        0o600, 0o640, 0o755, 0o4755, 0o2755, 0o6711, 0o1644, 0o000, 0o7777,
    ] {
        chmod(&f, want);
        assert_eq!(mode(&f), want, "chmod {want:o}");
        assert_eq!(
            fs::metadata(&f).unwrap().mode() & libc::S_IFMT,
            libc::S_IFREG,
            "chmod changed the file type"
        );
    }
    // chmod changes ctime but not mtime.
    let (mt, ct) = (mtime(&f), ctime(&f));
    tick();
    chmod(&f, 0o640);
    assert_eq!(mtime(&f), mt);
    assert!(ctime(&f) > ct, "chmod did not move ctime");

    // fchmod, on a directory, and through a symlink (which changes the target).
    let file = File::open(&f).unwrap();
    file.set_permissions(fs::Permissions::from_mode(0o604))
        .unwrap();
    assert_eq!(mode(&f), 0o604);
    fs::create_dir(m.p("d")).unwrap();
    chmod(&m.p("d"), 0o1777);
    assert_eq!(mode(&m.p("d")), 0o1777);
    assert!(fs::metadata(m.p("d")).unwrap().is_dir());
    std::os::unix::fs::symlink("f", m.p("ln")).unwrap();
    chmod(&m.p("ln"), 0o600);
    assert_eq!(mode(&f), 0o600);
    assert_eq!(mode(&m.p("ln")), 0o777, "a symlink's own mode stays 0777");
    drop(file);

    // Survives a remount.
    m.unmount();
    let m = vol.mount();
    assert_eq!(mode(&m.p("f")), 0o600);
    assert_eq!(mode(&m.p("d")), 0o1777);
}

#[test]
fn chown_as_root() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    // Only the group; only the owner; neither.
    std::os::unix::fs::chown(&f, None, Some(100)).unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 100));
    std::os::unix::fs::chown(&f, Some(1000), None).unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 100));
    std::os::unix::fs::chown(&f, None, None).unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 100));

    // fchown.
    let file = File::open(&f).unwrap();
    std::os::unix::fs::fchown(&file, Some(7), Some(8)).unwrap();
    let md = file.metadata().unwrap();
    assert_eq!((md.uid(), md.gid()), (7, 8));
    drop(file);

    // lchown changes the symlink, not its target; chown follows it.
    std::os::unix::fs::symlink("f", m.p("ln")).unwrap();
    std::os::unix::fs::lchown(m.p("ln"), Some(1234), Some(4321)).unwrap();
    let lm = fs::symlink_metadata(m.p("ln")).unwrap();
    assert_eq!((lm.uid(), lm.gid()), (1234, 4321));
    assert_eq!(fs::metadata(&f).unwrap().uid(), 7);
    std::os::unix::fs::chown(m.p("ln"), Some(9), None).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().uid(), 9);
    assert_eq!(fs::symlink_metadata(m.p("ln")).unwrap().uid(), 1234);

    // Linux: chown of a regular file clears setuid, and setgid when group-executable.
    chmod(&f, 0o6755);
    std::os::unix::fs::chown(&f, Some(1), None).unwrap();
    assert_eq!(mode(&f), 0o755, "chown did not clear setuid/setgid");
    // ... but not on a directory.
    fs::create_dir(m.p("d")).unwrap();
    chmod(&m.p("d"), 0o2755);
    std::os::unix::fs::chown(m.p("d"), Some(1), Some(1)).unwrap();
    assert_eq!(mode(&m.p("d")), 0o2755);
    // ... nor setgid without group execute; and file capabilities go with any chown.
    chmod(&f, 0o6745);
    setxattr(&f, "security.capability", CAPS, 0).unwrap();
    std::os::unix::fs::chown(&f, Some(2), None).unwrap();
    assert_eq!(mode(&f), 0o2745);
    assert_eq!(io(getxattr(&f, "security.capability")), Err(libc::ENODATA));
}

/// A file capability value (version 2, CAP_NET_BIND_SERVICE permitted), as setcap writes it.
const CAPS: &[u8] = &[1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// Any write or truncate drops a file's capabilities, as Linux does (setuid and setgid:
/// `writing_clears_setuid_as_linux_does`). Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves
/// this to unkai.
#[test]
fn writes_drop_file_capabilities() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    // Capabilities: dropped by a write of root, also through a descriptor opened before
    // they were set, and by a truncate.
    setxattr(&f, "security.capability", CAPS, 0).unwrap();
    let mut h = OpenOptions::new().append(true).open(&f).unwrap();
    h.write_all(b"a").unwrap();
    assert_eq!(io(getxattr(&f, "security.capability")), Err(libc::ENODATA));
    setxattr(&f, "security.capability", CAPS, 0).unwrap();
    h.write_all(b"b").unwrap();
    assert_eq!(
        io(getxattr(&f, "security.capability")),
        Err(libc::ENODATA),
        "a write through a descriptor opened before setcap kept the capabilities"
    );
    drop(h);
    setxattr(&f, "security.capability", CAPS, 0).unwrap();
    File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert_eq!(io(getxattr(&f, "security.capability")), Err(libc::ENODATA));
    // Other xattrs stay.
    setxattr(&f, "user.keep", b"1", 0).unwrap();
    fs::write(&f, b"rewritten").unwrap();
    assert_eq!(getxattr(&f, "user.keep").unwrap(), b"1");
}

#[test]
fn truncate_grows_with_zeros_and_shrinks() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    let data = pattern(10_000, 1);
    fs::write(&p, &data).unwrap();

    // Grow: old bytes kept, new bytes zero.
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let mt = mtime(&p);
    tick();
    f.set_len(100_000).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 100_000);
    assert!(mtime(&p) > mt, "truncate did not move mtime");
    let all = read_all_at(&f);
    assert_eq!(all.len(), 100_000);
    assert_eq!(&all[..10_000], &data[..]);
    assert!(is_zero(&all[10_000..]));

    // Shrink by path.
    nix::unistd::truncate(&p, 5000).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 5000);
    assert_eq!(fs::read(&p).unwrap(), &data[..5000]);
    // Grow again: what was cut off must not come back.
    f.set_len(8000).unwrap();
    let all = read_all_at(&f);
    assert_eq!(&all[..5000], &data[..5000]);
    assert!(is_zero(&all[5000..8000]), "bytes cut by truncate came back");

    // Truncate with unflushed writes on an open descriptor.
    f.write_all_at(&[7u8; 3000], 6000).unwrap();
    f.set_len(7500).unwrap();
    let all = read_all_at(&f);
    assert_eq!(all.len(), 7500);
    assert!(is_zero(&all[5000..6000]));
    assert!(all[6000..7500].iter().all(|&b| b == 7));
    f.set_len(9000).unwrap();
    assert!(is_zero(&read_all_at(&f)[7500..9000]));

    // Across a block boundary (4 MiB): shrink into the middle of a block, grow back.
    let big = pattern(5 * MIB, 2);
    fs::write(&p, &big).unwrap();
    let cut = 4 * MIB + 100;
    nix::unistd::truncate(&p, cut as i64).unwrap();
    nix::unistd::truncate(&p, (6 * MIB) as i64).unwrap();
    let all = read_all_at(&f);
    assert_eq!(all.len(), 6 * MIB);
    assert!(all[..cut] == big[..cut]);
    assert!(is_zero(&all[cut..]));

    // To zero.
    f.set_len(0).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    assert!(fs::read(&p).unwrap().is_empty());
    drop(f);

    // And it all holds after a remount.
    fs::write(&p, &data).unwrap();
    nix::unistd::truncate(&p, 3000).unwrap();
    nix::unistd::truncate(&p, 4000).unwrap();
    m.unmount();
    let m = vol.mount();
    let got = fs::read(m.p("f")).unwrap();
    assert_eq!(&got[..3000], &data[..3000]);
    assert_eq!(got.len(), 4000);
    assert!(is_zero(&got[3000..]));
}

#[test]
fn utimensat_nanoseconds_now_and_omit() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    fs::write(&p, b"x").unwrap();

    utimensat(
        &p,
        [(1_000_000_000, 123_456_789), (1_500_000_000, 987_654_321)],
        0,
    )
    .unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_500_000_000, 987_654_321));

    // UTIME_OMIT keeps atime, UTIME_NOW sets mtime to now.
    let t0 = now_secs();
    utimensat(&p, [(0, libc::UTIME_OMIT), (0, libc::UTIME_NOW)], 0).unwrap();
    let t1 = now_secs();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert!(
        md.mtime() >= t0 - 1 && md.mtime() <= t1 + 1,
        "UTIME_NOW: mtime {} not now ({t0}..{t1})",
        md.mtime()
    );
    let now_mtime = (md.mtime(), md.mtime_nsec());

    // UTIME_NOW for atime, UTIME_OMIT for mtime.
    utimensat(&p, [(0, libc::UTIME_NOW), (0, libc::UTIME_OMIT)], 0).unwrap();
    let md = fs::metadata(&p).unwrap();
    assert!(md.atime() >= t0 - 1, "UTIME_NOW did not set atime");
    assert_eq!((md.mtime(), md.mtime_nsec()), now_mtime);

    // Both omitted: nothing changes.
    utimensat(&p, [(5, 0), (6, 0)], 0).unwrap();
    utimensat(&p, [(0, libc::UTIME_OMIT), (0, libc::UTIME_OMIT)], 0).unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.atime(), md.mtime()), (5, 6));

    // Explicit times change ctime to now.
    let ct = ctime(&p);
    tick();
    utimensat(&p, [(10, 1), (20, 2)], 0).unwrap();
    assert!(ctime(&p) > ct, "utimensat did not move ctime");

    // futimens on a descriptor; AT_SYMLINK_NOFOLLOW on a symlink changes only the link.
    let f = File::open(&p).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: 2_000_000_000,
            tv_nsec: 1,
        },
        libc::timespec {
            tv_sec: 2_000_000_001,
            tv_nsec: 999_999_999,
        },
    ];
    cvt(unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) }).unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (2_000_000_000, 1));
    assert_eq!((md.mtime(), md.mtime_nsec()), (2_000_000_001, 999_999_999));
    drop(f);
    std::os::unix::fs::symlink("f", m.p("ln")).unwrap();
    utimensat(&m.p("ln"), [(300, 3), (400, 4)], libc::AT_SYMLINK_NOFOLLOW).unwrap();
    let lm = fs::symlink_metadata(m.p("ln")).unwrap();
    assert_eq!((lm.mtime(), lm.mtime_nsec()), (400, 4));
    assert_eq!(fs::metadata(&p).unwrap().mtime(), 2_000_000_001);

    // Times survive a remount, to the nanosecond.
    m.unmount();
    let m = vol.mount();
    let md = fs::metadata(m.p("f")).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (2_000_000_000, 1));
    assert_eq!((md.mtime(), md.mtime_nsec()), (2_000_000_001, 999_999_999));
}

#[test]
fn utimensat_before_the_epoch() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    fs::write(&p, b"x").unwrap();
    // 1969-12-31T23:59:59.5 and 1901-12-14.
    utimensat(&p, [(-1, 500_000_000), (-2_147_483_648, 250)], 0).unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (-1, 500_000_000));
    assert_eq!((md.mtime(), md.mtime_nsec()), (-2_147_483_648, 250));
}

// ---------------------------------------------------------------------------------------------
// Opening, reading and writing
// ---------------------------------------------------------------------------------------------

#[test]
fn open_flags_creat_excl_trunc_append() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");

    // O_CREAT|O_EXCL: creates once, then EEXIST.
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    f.write_all(b"first").unwrap();
    drop(f);
    expect_errno(
        OpenOptions::new().write(true).create_new(true).open(&p),
        libc::EEXIST,
    );
    // Also on a dangling symlink (which must not be followed).
    std::os::unix::fs::symlink("nowhere", m.p("dangling")).unwrap();
    expect_errno(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.p("dangling")),
        libc::EEXIST,
    );
    expect_errno(fs::metadata(m.p("nowhere")), libc::ENOENT);
    // O_CREAT without O_EXCL on an existing file keeps its contents.
    drop(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .unwrap(),
    );
    assert_eq!(fs::read(&p).unwrap(), b"first");
    // Without O_CREAT, a missing file is ENOENT.
    expect_errno(File::open(m.p("missing")), libc::ENOENT);
    expect_errno(
        OpenOptions::new().write(true).open(m.p("missing")),
        libc::ENOENT,
    );

    // The create mode is honoured (under umask 022).
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(m.p("private"))
        .unwrap();
    drop(f);
    assert_eq!(mode(&m.p("private")), 0o600);
    drop(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o777)
            .open(m.p("exec"))
            .unwrap(),
    );
    assert_eq!(mode(&m.p("exec")), 0o755);

    // O_TRUNC empties the file; later writes leave no stale tail.
    fs::write(&p, pattern(MIB, 3)).unwrap();
    let mt = mtime(&p);
    tick();
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    assert!(mtime(&p) > mt, "O_TRUNC did not move mtime");
    f.write_all(b"short").unwrap();
    drop(f);
    assert_eq!(fs::read(&p).unwrap(), b"short");
    // O_TRUNC on an empty file and via File::create.
    fs::write(&p, b"again").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"again");

    // O_APPEND: every write lands at the end, wherever the offset was.
    let mut a = OpenOptions::new().append(true).open(&p).unwrap();
    let mut b = OpenOptions::new().append(true).open(&p).unwrap();
    a.write_all(b"-a1").unwrap();
    b.write_all(b"-b1").unwrap();
    a.seek(SeekFrom::Start(0)).unwrap();
    a.write_all(b"-a2").unwrap();
    drop((a, b));
    assert_eq!(fs::read(&p).unwrap(), b"again-a1-b1-a2");

    // O_DIRECTORY on a file, writing a directory.
    expect_errno(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&p),
        libc::ENOTDIR,
    );
    fs::create_dir(m.p("d")).unwrap();
    expect_errno(OpenOptions::new().write(true).open(m.p("d")), libc::EISDIR);
    // O_NOFOLLOW on a symlink.
    std::os::unix::fs::symlink("f", m.p("ln")).unwrap();
    expect_errno(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(m.p("ln")),
        libc::ELOOP,
    );
}

#[test]
fn read_and_write_at_offsets() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    f.write_all_at(b"hello", 0).unwrap();
    f.write_all_at(b"world", 100).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 105);
    let mut want = b"hello".to_vec();
    want.resize(100, 0);
    want.extend_from_slice(b"world");
    assert_eq!(read_all_at(&f), want);
    f.write_all_at(b"XY", 1).unwrap();
    want[1..3].copy_from_slice(b"XY");
    assert_eq!(read_all_at(&f), want);

    // Reads at and past the end.
    let mut buf = [0u8; 10];
    assert_eq!(f.read_at(&mut buf, 105).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf, 5000).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf, 100).unwrap(), 5);
    assert_eq!(&buf[..5], b"world");

    // A large unaligned write straddling the 4 MiB block boundary.
    let big = pattern(3 * MIB + 7, 4);
    let off = 4 * MIB as u64 - 3;
    f.write_all_at(&big, off).unwrap();
    want.resize(off as usize, 0);
    want.extend_from_slice(&big);
    assert_eq!(read_all_at(&f), want);
    // Small overwrites around the boundary.
    for (i, o) in [4 * MIB - 1, 4 * MIB, 4 * MIB + 1, 4 * MIB - 4096]
        .into_iter()
        .enumerate()
    {
        let d = pattern(5000, 100 + i as u64);
        f.write_all_at(&d, o as u64).unwrap();
        want[o..o + 5000].copy_from_slice(&d);
    }
    assert_eq!(read_all_at(&f), want);

    // Sequential read/write with the file offset.
    let mut g = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    g.seek(SeekFrom::Start(2)).unwrap();
    g.write_all(b"ZZ").unwrap();
    want[2..4].copy_from_slice(b"ZZ");
    let mut head = [0u8; 6];
    g.seek(SeekFrom::Start(0)).unwrap();
    g.read_exact(&mut head).unwrap();
    assert_eq!(&head, &want[..6]);
    drop((f, g));

    assert_eq!(fs::read(&p).unwrap(), want);
    m.unmount();
    let m = vol.mount();
    assert_eq!(fs::read(m.p("f")).unwrap(), want);
}

#[test]
fn random_writes_match_a_model() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    let reader = File::open(&p).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut rng = XorShift(0x9e3779b97f4a7c15);
    let space = 6 * MIB as u64; // spans a block boundary
    for i in 0..1500u64 {
        let off = rng.below(space) as usize;
        let len = 1 + if rng.below(5) == 0 {
            rng.below(300_000)
        } else {
            rng.below(5000)
        } as usize;
        let data = pattern(len, i);
        f.write_all_at(&data, off as u64).unwrap();
        if model.len() < off + len {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&data);
        if i % 250 == 249 {
            // A truncation now and then (shrink or grow).
            let to = rng.below(space) as usize;
            f.set_len(to as u64).unwrap();
            model.resize(to, 0);
        }
        if i % 100 == 99 {
            // Spot checks through another descriptor, page cache dropped.
            drop_cache(&reader);
            assert_eq!(reader.metadata().unwrap().len(), model.len() as u64);
            for _ in 0..5 {
                if model.is_empty() {
                    break;
                }
                let o = rng.below(model.len() as u64) as usize;
                let n = (1 + rng.below(200_000) as usize).min(model.len() - o);
                let mut buf = vec![0u8; n];
                reader.read_exact_at(&mut buf, o as u64).unwrap();
                assert!(buf == model[o..o + n], "write {i}: range {o}+{n} differs");
            }
        }
    }
    assert!(read_all_at(&f) == model, "file differs from the model");
    if let Err(e) = f.sync_all() {
        panic!("fsync: {e}; server log:\n{}", m.log_text());
    }
    assert!(
        read_all_at(&f) == model,
        "file differs from the model after fsync"
    );
    drop((f, reader));
    assert!(fs::read(&p).unwrap() == model);
    m.unmount();
    let m = vol.mount();
    assert!(
        fs::read(m.p("f")).unwrap() == model,
        "after remount the file differs from the model"
    );
}

#[test]
fn fsync_and_fsyncdir_make_data_survive_a_crash() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let data = pattern(5 * MIB + 123, 7);
    let mut f = File::create(m.p("f")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    assert!(
        !vol.objects().is_empty(),
        "fsync left no object in the bucket"
    );
    // More writes, fdatasync, still open when the server dies.
    f.write_all(b"tail").unwrap();
    f.sync_data().unwrap();

    fs::create_dir(m.p("d")).unwrap();
    let mut g = File::create(m.p("d/x")).unwrap();
    g.write_all(b"x").unwrap();
    g.sync_all().unwrap();
    let dir = File::open(m.p("d")).unwrap();
    dir.sync_all().unwrap(); // fsyncdir
    File::open(&m.path).unwrap().sync_all().unwrap();

    m.kill9();
    drop((f, g, dir));
    let m = vol.mount();
    let mut want = data.clone();
    want.extend_from_slice(b"tail");
    assert!(
        fs::read(m.p("f")).unwrap() == want,
        "fsynced data lost in a crash"
    );
    assert_eq!(fs::read(m.p("d/x")).unwrap(), b"x");
}

#[test]
fn fsync_after_truncating_away_written_data() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(m.p("f"))
        .unwrap();
    f.write_all_at(&pattern(5 * MIB, 23), 0).unwrap();
    f.set_len(0).unwrap();
    // Once the truncated data's objects are gone, fsync must still work.
    let start = Instant::now();
    while !vol.objects().is_empty() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Err(e) = f.sync_all() {
        panic!("fsync after truncate: {e}; server log:\n{}", m.log_text());
    }
    f.write_all_at(b"after", 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(read_all_at(&f), b"after");
}

// ---------------------------------------------------------------------------------------------
// Namespace: mkdir, rmdir, unlink, rename, links, symlinks, mknod, readdir
// ---------------------------------------------------------------------------------------------

#[test]
fn mkdir_and_rmdir() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let root_mt = mtime(&m.path);
    tick();
    fs::create_dir(m.p("a")).unwrap();
    assert!(
        mtime(&m.path) > root_mt,
        "mkdir did not move the parent's mtime"
    );
    expect_errno(fs::create_dir(m.p("a")), libc::EEXIST);
    fs::write(m.p("file"), b"x").unwrap();
    expect_errno(fs::create_dir(m.p("file")), libc::EEXIST);
    expect_errno(fs::create_dir(m.p("missing/x")), libc::ENOENT);
    expect_errno(fs::create_dir(m.p("file/x")), libc::ENOTDIR);

    // Mode under umask 022.
    fs::DirBuilder::new()
        .mode(0o750)
        .create(m.p("a/b"))
        .unwrap();
    assert_eq!(mode(&m.p("a/b")), 0o750);
    assert_eq!(nlink(&m.p("a")), 3);
    fs::create_dir_all(m.p("a/b/c/d/e")).unwrap();
    assert!(fs::metadata(m.p("a/b/c/d/e")).unwrap().is_dir());

    // rmdir: not empty, not a directory, missing.
    expect_errno(fs::remove_dir(m.p("a")), libc::ENOTEMPTY);
    expect_errno(fs::remove_dir(m.p("file")), libc::ENOTDIR);
    expect_errno(fs::remove_dir(m.p("missing")), libc::ENOENT);
    expect_errno(fs::remove_file(m.p("a")), libc::EISDIR);
    fs::write(m.p("a/b/c/d/e/f"), b"x").unwrap();
    expect_errno(fs::remove_dir(m.p("a/b/c/d/e")), libc::ENOTEMPTY);
    fs::remove_file(m.p("a/b/c/d/e/f")).unwrap();
    fs::remove_dir(m.p("a/b/c/d/e")).unwrap();
    expect_errno(fs::metadata(m.p("a/b/c/d/e")), libc::ENOENT);
    assert_eq!(nlink(&m.p("a/b/c/d")), 2);
    fs::remove_dir_all(m.p("a")).unwrap();
    expect_errno(fs::metadata(m.p("a")), libc::ENOENT);
    assert_eq!(nlink(&m.path), 2);
    assert_eq!(names(&m.path), BTreeSet::from(["file".to_string()]));
    // A name can be reused after rmdir.
    fs::create_dir(m.p("a")).unwrap();
    assert_eq!(nlink(&m.p("a")), 2);
    assert!(names(&m.p("a")).is_empty());
}

#[test]
fn unlink_removes_names() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/f"), b"x").unwrap();
    let mt = mtime(&m.p("d"));
    tick();
    fs::remove_file(m.p("d/f")).unwrap();
    assert!(
        mtime(&m.p("d")) > mt,
        "unlink did not move the parent's mtime"
    );
    expect_errno(fs::metadata(m.p("d/f")), libc::ENOENT);
    expect_errno(fs::remove_file(m.p("d/f")), libc::ENOENT);
    assert!(names(&m.p("d")).is_empty());
    // Recreate with the same name: a new, empty file.
    fs::write(m.p("d/f"), b"").unwrap();
    assert_eq!(fs::metadata(m.p("d/f")).unwrap().len(), 0);
    // Unlinking a symlink removes the link, not the target.
    fs::write(m.p("t"), b"target").unwrap();
    std::os::unix::fs::symlink("t", m.p("ln")).unwrap();
    fs::remove_file(m.p("ln")).unwrap();
    assert_eq!(fs::read(m.p("t")).unwrap(), b"target");
}

#[test]
fn rename_over_existing_file_and_directories() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("a"), b"AAA").unwrap();
    fs::write(m.p("b"), b"BB").unwrap();
    let ia = ino(&m.p("a"));
    // Keep the victim open: it stays readable.
    let victim = File::open(m.p("b")).unwrap();
    fs::rename(m.p("a"), m.p("b")).unwrap();
    assert_eq!(fs::read(m.p("b")).unwrap(), b"AAA");
    assert_eq!(ino(&m.p("b")), ia);
    assert_eq!(nlink(&m.p("b")), 1);
    expect_errno(fs::metadata(m.p("a")), libc::ENOENT);
    assert_eq!(names(&m.path), BTreeSet::from(["b".to_string()]));
    assert_eq!(read_all_at(&victim), b"BB");
    assert_eq!(victim.metadata().unwrap().nlink(), 0);
    drop(victim);

    // Rename onto itself, and onto another link of the same inode: nothing happens.
    fs::rename(m.p("b"), m.p("b")).unwrap();
    fs::hard_link(m.p("b"), m.p("b2")).unwrap();
    fs::rename(m.p("b"), m.p("b2")).unwrap();
    assert_eq!(fs::read(m.p("b")).unwrap(), b"AAA");
    assert_eq!(fs::read(m.p("b2")).unwrap(), b"AAA");
    assert_eq!(nlink(&m.p("b")), 2);

    // A file over an empty directory, a directory over a file.
    fs::create_dir(m.p("empty")).unwrap();
    expect_errno(fs::rename(m.p("b"), m.p("empty")), libc::EISDIR);
    fs::create_dir(m.p("dir")).unwrap();
    fs::write(m.p("dir/inside"), b"in").unwrap();
    expect_errno(fs::rename(m.p("dir"), m.p("b")), libc::ENOTDIR);
    assert_eq!(nlink(&m.path), 4);
    // A directory over an empty directory.
    let idir = ino(&m.p("dir"));
    fs::rename(m.p("dir"), m.p("empty")).unwrap();
    assert_eq!(ino(&m.p("empty")), idir);
    assert_eq!(fs::read(m.p("empty/inside")).unwrap(), b"in");
    expect_errno(fs::metadata(m.p("dir")), libc::ENOENT);
    assert_eq!(
        nlink(&m.path),
        3,
        "root nlink after a directory replaced another"
    );
    // A directory over a non-empty directory.
    fs::create_dir(m.p("other")).unwrap();
    let e = fs::rename(m.p("other"), m.p("empty")).unwrap_err();
    assert!(
        matches!(errno(&e), libc::ENOTEMPTY | libc::EEXIST),
        "dir over non-empty dir: {e}"
    );
    assert_eq!(fs::read(m.p("empty/inside")).unwrap(), b"in");
    // A directory into its own subdirectory.
    fs::create_dir(m.p("other/sub")).unwrap();
    expect_errno(fs::rename(m.p("other"), m.p("other/sub/x")), libc::EINVAL);
    // The source must exist.
    expect_errno(fs::rename(m.p("nope"), m.p("x")), libc::ENOENT);

    m.unmount();
    let m = vol.mount();
    assert_eq!(
        names(&m.path),
        BTreeSet::from(["b", "b2", "empty", "other"].map(String::from))
    );
    assert_eq!(fs::read(m.p("empty/inside")).unwrap(), b"in");
}

#[test]
fn rename_across_directories() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir_all(m.p("a/sub")).unwrap();
    fs::create_dir(m.p("b")).unwrap();
    fs::write(m.p("a/f"), b"file").unwrap();
    fs::write(m.p("a/sub/g"), b"deep").unwrap();
    let (ma, mb) = (mtime(&m.p("a")), mtime(&m.p("b")));
    tick();
    fs::rename(m.p("a/f"), m.p("b/f2")).unwrap();
    assert!(mtime(&m.p("a")) > ma && mtime(&m.p("b")) > mb);
    assert_eq!(fs::read(m.p("b/f2")).unwrap(), b"file");
    expect_errno(fs::metadata(m.p("a/f")), libc::ENOENT);

    assert_eq!((nlink(&m.p("a")), nlink(&m.p("b"))), (3, 2));
    let isub = ino(&m.p("a/sub"));
    fs::rename(m.p("a/sub"), m.p("b/sub2")).unwrap();
    assert_eq!((nlink(&m.p("a")), nlink(&m.p("b"))), (2, 3));
    assert_eq!(ino(&m.p("b/sub2")), isub);
    assert_eq!(ino(&m.p("b/sub2/..")), ino(&m.p("b")), "'..' not updated");
    assert_eq!(fs::read(m.p("b/sub2/g")).unwrap(), b"deep");
    assert!(names(&m.p("a")).is_empty());
    assert_eq!(
        names(&m.p("b")),
        BTreeSet::from(["f2", "sub2"].map(String::from))
    );
    // rmdir of the old parent now works; the moved tree stays.
    fs::remove_dir(m.p("a")).unwrap();

    m.unmount();
    let m = vol.mount();
    assert_eq!(ino(&m.p("b/sub2/..")), ino(&m.p("b")));
    assert_eq!(fs::read(m.p("b/sub2/g")).unwrap(), b"deep");
    assert_eq!(nlink(&m.p("b")), 3);
}

#[test]
fn rename_noreplace() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("a"), b"A").unwrap();
    fs::write(m.p("b"), b"B").unwrap();
    expect_errno(
        renameat2(&m.p("a"), &m.p("b"), libc::RENAME_NOREPLACE),
        libc::EEXIST,
    );
    assert_eq!(fs::read(m.p("a")).unwrap(), b"A");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"B");
    fs::create_dir(m.p("d")).unwrap();
    expect_errno(
        renameat2(&m.p("a"), &m.p("d"), libc::RENAME_NOREPLACE),
        libc::EEXIST,
    );
    renameat2(&m.p("a"), &m.p("d/c"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(fs::read(m.p("d/c")).unwrap(), b"A");
    expect_errno(fs::metadata(m.p("a")), libc::ENOENT);
}

#[test]
fn rename_exchange_swaps() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("a"), b"A").unwrap();
    fs::write(m.p("b"), b"BB").unwrap();
    let (ia, ib) = (ino(&m.p("a")), ino(&m.p("b")));
    renameat2(&m.p("a"), &m.p("b"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"BB");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"A");
    assert_eq!((ino(&m.p("a")), ino(&m.p("b"))), (ib, ia));

    // A file and a directory, across directories.
    fs::create_dir_all(m.p("x")).unwrap();
    fs::create_dir_all(m.p("y/d")).unwrap();
    fs::write(m.p("x/f"), b"file").unwrap();
    fs::write(m.p("y/d/child"), b"child").unwrap();
    assert_eq!((nlink(&m.p("x")), nlink(&m.p("y"))), (2, 3));
    renameat2(&m.p("x/f"), &m.p("y/d"), libc::RENAME_EXCHANGE).unwrap();
    assert!(fs::metadata(m.p("x/f")).unwrap().is_dir());
    assert_eq!(fs::read(m.p("x/f/child")).unwrap(), b"child");
    assert_eq!(fs::read(m.p("y/d")).unwrap(), b"file");
    assert_eq!((nlink(&m.p("x")), nlink(&m.p("y"))), (3, 2));
    assert_eq!(ino(&m.p("x/f/..")), ino(&m.p("x")));

    // Exchange needs both names.
    expect_errno(
        renameat2(&m.p("a"), &m.p("missing"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
    );
    assert_eq!(fs::read(m.p("a")).unwrap(), b"BB");

    m.unmount();
    let m = vol.mount();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"BB");
    assert_eq!(fs::read(m.p("x/f/child")).unwrap(), b"child");
    assert_eq!(fs::read(m.p("y/d")).unwrap(), b"file");
    assert_eq!(ino(&m.p("x/f/..")), ino(&m.p("x")));
}

#[test]
fn hard_links_count_right() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("f"), b"data").unwrap();
    let ct = ctime(&m.p("f"));
    tick();
    fs::hard_link(m.p("f"), m.p("g")).unwrap();
    assert!(ctime(&m.p("f")) > ct, "link did not move ctime");
    assert_eq!((nlink(&m.p("f")), nlink(&m.p("g"))), (2, 2));
    assert_eq!(ino(&m.p("f")), ino(&m.p("g")));
    fs::create_dir(m.p("d")).unwrap();
    fs::hard_link(m.p("g"), m.p("d/h")).unwrap();
    assert_eq!(nlink(&m.p("f")), 3);
    // One inode: a write through one name shows through the others.
    OpenOptions::new()
        .append(true)
        .open(m.p("g"))
        .unwrap()
        .write_all(b"+more")
        .unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"data+more");
    assert_eq!(fs::read(m.p("d/h")).unwrap(), b"data+more");

    fs::remove_file(m.p("g")).unwrap();
    assert_eq!((nlink(&m.p("f")), nlink(&m.p("d/h"))), (2, 2));
    // Rename onto another link of the same inode: nothing changes.
    fs::rename(m.p("f"), m.p("d/h")).unwrap();
    assert_eq!(nlink(&m.p("f")), 2);
    // Renaming another file over one link drops the count.
    fs::write(m.p("o"), b"other").unwrap();
    fs::rename(m.p("o"), m.p("d/h")).unwrap();
    assert_eq!(nlink(&m.p("f")), 1);
    assert_eq!(fs::read(m.p("d/h")).unwrap(), b"other");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"data+more");
    // A renamed link keeps the count.
    fs::hard_link(m.p("f"), m.p("l1")).unwrap();
    fs::rename(m.p("l1"), m.p("d/l2")).unwrap();
    assert_eq!((nlink(&m.p("f")), nlink(&m.p("d/l2"))), (2, 2));

    // Errors.
    expect_errno(fs::hard_link(m.p("d"), m.p("dlink")), libc::EPERM);
    expect_errno(fs::hard_link(m.p("f"), m.p("d/h")), libc::EEXIST);
    expect_errno(fs::hard_link(m.p("missing"), m.p("x")), libc::ENOENT);

    m.unmount();
    let m = vol.mount();
    assert_eq!(nlink(&m.p("f")), 2);
    assert_eq!(ino(&m.p("f")), ino(&m.p("d/l2")));
    assert_eq!(fs::read(m.p("d/l2")).unwrap(), b"data+more");
}

#[test]
fn symlinks_and_readlink() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("target"), b"contents").unwrap();
    std::os::unix::fs::symlink("../target", m.p("d/rel")).unwrap();
    std::os::unix::fs::symlink(m.p("target"), m.p("abs")).unwrap();
    let lm = fs::symlink_metadata(m.p("d/rel")).unwrap();
    assert!(lm.file_type().is_symlink());
    assert_eq!(lm.mode() & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(lm.len(), "../target".len() as u64);
    assert_eq!(fs::read_link(m.p("d/rel")).unwrap(), Path::new("../target"));
    assert_eq!(fs::read_link(m.p("abs")).unwrap(), m.p("target"));
    assert_eq!(fs::read(m.p("d/rel")).unwrap(), b"contents");
    assert_eq!(fs::read(m.p("abs")).unwrap(), b"contents");
    assert!(fs::metadata(m.p("d/rel")).unwrap().is_file());
    // A symlink to a directory, used in a path.
    std::os::unix::fs::symlink("d", m.p("dl")).unwrap();
    assert_eq!(fs::read(m.p("dl/rel")).unwrap(), b"contents");
    // Dangling.
    std::os::unix::fs::symlink("nowhere", m.p("dangling")).unwrap();
    expect_errno(fs::metadata(m.p("dangling")), libc::ENOENT);
    assert!(fs::symlink_metadata(m.p("dangling")).is_ok());
    // A loop.
    std::os::unix::fs::symlink("loop2", m.p("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", m.p("loop2")).unwrap();
    expect_errno(fs::metadata(m.p("loop1")), libc::ELOOP);
    // A long target (PATH_MAX - 1) and odd bytes.
    let long = "x/".repeat(2047) + "y";
    assert_eq!(long.len(), 4095);
    std::os::unix::fs::symlink(&long, m.p("long")).unwrap();
    assert_eq!(fs::read_link(m.p("long")).unwrap(), Path::new(&long));
    let odd = std::ffi::OsStr::from_bytes(b"sp ace/\xff\x01name");
    std::os::unix::fs::symlink(odd, m.p("odd")).unwrap();
    assert_eq!(fs::read_link(m.p("odd")).unwrap().as_os_str(), odd);
    // readlink of something else; symlink over an existing name.
    expect_errno(fs::read_link(m.p("target")), libc::EINVAL);
    expect_errno(std::os::unix::fs::symlink("x", m.p("target")), libc::EEXIST);

    m.unmount();
    let m = vol.mount();
    assert_eq!(fs::read_link(m.p("d/rel")).unwrap(), Path::new("../target"));
    assert_eq!(fs::read_link(m.p("long")).unwrap(), Path::new(&long));
    assert_eq!(fs::read(m.p("dl/rel")).unwrap(), b"contents");
}

#[test]
fn mknod_fifo_socket_and_devices() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    nix::unistd::mkfifo(
        &m.p("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    let md = fs::symlink_metadata(m.p("fifo")).unwrap();
    assert!(md.file_type().is_fifo());
    assert_eq!(md.mode() & 0o7777, 0o640);

    let chr = libc::makedev(1, 5); // /dev/zero
    mknod(&m.p("zero"), libc::S_IFCHR | 0o666, chr).unwrap();
    let md = fs::symlink_metadata(m.p("zero")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), chr);
    assert_eq!(md.mode() & 0o7777, 0o644);

    let blk = libc::makedev(259, 65537); // a minor above 255 and 65535
    mknod(&m.p("blk"), libc::S_IFBLK | 0o600, blk).unwrap();
    let md = fs::symlink_metadata(m.p("blk")).unwrap();
    assert!(md.file_type().is_block_device());
    assert_eq!(md.rdev(), blk);
    assert_eq!(
        (libc::major(md.rdev()), libc::minor(md.rdev())),
        (259, 65537)
    );

    // mknod of a regular file.
    mknod(&m.p("regular"), libc::S_IFREG | 0o644, 0).unwrap();
    let md = fs::symlink_metadata(m.p("regular")).unwrap();
    assert!(md.is_file() && md.len() == 0);
    expect_errno(
        mknod(&m.p("regular"), libc::S_IFIFO | 0o644, 0),
        libc::EEXIST,
    );

    // A unix socket bound in the mount.
    let listener = std::os::unix::net::UnixListener::bind(m.p("sock")).unwrap();
    let md = fs::symlink_metadata(m.p("sock")).unwrap();
    assert!(md.file_type().is_socket());
    let mut client = std::os::unix::net::UnixStream::connect(m.p("sock")).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");

    // The special files work: the fifo carries data, the device node is /dev/zero.
    let fifo = m.p("fifo");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        File::open(fifo).unwrap().read_to_end(&mut s).unwrap();
        s
    });
    OpenOptions::new()
        .write(true)
        .open(m.p("fifo"))
        .unwrap()
        .write_all(b"through the pipe")
        .unwrap();
    assert_eq!(reader.join().unwrap(), b"through the pipe");
    let mut z = [1u8; 64];
    File::open(m.p("zero")).unwrap().read_exact(&mut z).unwrap();
    assert!(is_zero(&z));

    // readdir reports the types.
    for (name, want) in [
        ("fifo", libc::DT_FIFO),
        ("zero", libc::DT_CHR),
        ("blk", libc::DT_BLK),
        ("sock", libc::DT_SOCK),
        ("regular", libc::DT_REG),
    ] {
        let e = RawDir::all(&m.path)
            .unwrap()
            .into_iter()
            .find(|e| e.0 == name.as_bytes())
            .unwrap_or_else(|| panic!("{name} not listed"));
        assert_eq!(e.2, want, "d_type of {name}");
    }
    drop((listener, client, server));

    m.unmount();
    let m = vol.mount();
    assert_eq!(fs::symlink_metadata(m.p("blk")).unwrap().rdev(), blk);
    assert_eq!(fs::symlink_metadata(m.p("zero")).unwrap().rdev(), chr);
    assert!(
        fs::symlink_metadata(m.p("sock"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    assert!(
        fs::symlink_metadata(m.p("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

#[test]
fn readdir_names_and_types() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir(m.p("d")).unwrap();
    // Empty: only "." and "..".
    let e = RawDir::all(&m.p("d")).unwrap();
    let n: BTreeSet<Vec<u8>> = e.iter().map(|e| e.0.clone()).collect();
    assert_eq!(n, BTreeSet::from([b".".to_vec(), b"..".to_vec()]));

    fs::write(m.p("d/file"), b"x").unwrap();
    fs::create_dir(m.p("d/sub")).unwrap();
    std::os::unix::fs::symlink("file", m.p("d/link")).unwrap();
    nix::unistd::mkfifo(
        &m.p("d/pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"\xe6\x97\xa5 \xff name\n");
    fs::write(m.p("d").join(odd), b"").unwrap();

    let entries = RawDir::all(&m.p("d")).unwrap();
    assert_eq!(entries.len(), 7, "{entries:?}");
    let by_name: std::collections::HashMap<Vec<u8>, (u64, u8)> = entries
        .iter()
        .map(|(n, i, t)| (n.clone(), (*i, *t)))
        .collect();
    assert_eq!(by_name.len(), 7, "duplicate names: {entries:?}");
    assert_eq!(by_name[&b"."[..]], (ino(&m.p("d")), libc::DT_DIR));
    assert_eq!(by_name[&b".."[..]].0, ino(&m.path));
    assert_eq!(by_name[&b"file"[..]], (ino(&m.p("d/file")), libc::DT_REG));
    assert_eq!(by_name[&b"sub"[..]], (ino(&m.p("d/sub")), libc::DT_DIR));
    assert_eq!(by_name[&b"link"[..]], (ino(&m.p("d/link")), libc::DT_LNK));
    assert_eq!(by_name[&b"pipe"[..]].1, libc::DT_FIFO);
    assert_eq!(by_name[odd.as_bytes()].1, libc::DT_REG);

    // std's read_dir (with readdirplus attributes).
    let mut seen = BTreeSet::new();
    for e in fs::read_dir(m.p("d")).unwrap() {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        assert_eq!(md.ino(), ino(&e.path()));
        assert_eq!(md.file_type(), e.file_type().unwrap());
        seen.insert(e.file_name());
    }
    assert_eq!(seen.len(), 5);
    assert!(seen.contains(odd));

    expect_errno(fs::read_dir(m.p("d/file")), libc::ENOTDIR);
    expect_errno(fs::read_dir(m.p("missing")), libc::ENOENT);
}

#[test]
fn readdir_of_2000_entries() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let d = m.p("big");
    fs::create_dir(&d).unwrap();
    let want: BTreeSet<String> = (0..2000)
        .map(|i| format!("entry-{i:05}-{}", "x".repeat(i % 60)))
        .collect();
    for n in &want {
        File::create(d.join(n)).unwrap();
    }
    let got: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(got.len(), 2000, "listing has {} entries", got.len());
    let set: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(set.len(), 2000, "duplicates in the listing");
    assert_eq!(set, want);
    let raw = RawDir::all(&d).unwrap();
    assert_eq!(raw.len(), 2002);
    assert!(
        raw.iter()
            .all(|e| e.2 == libc::DT_REG || e.0.starts_with(b"."))
    );

    // Unlink entries while listing: every entry not removed is seen exactly once.
    let mut dir = RawDir::open(&d).unwrap();
    let mut seen: Vec<String> = Vec::new();
    let mut removed: HashSet<String> = HashSet::new();
    let all: Vec<&String> = want.iter().collect();
    let mut count = 0;
    while let Some((n, _, _)) = dir.next() {
        let n = String::from_utf8(n).unwrap();
        if n == "." || n == ".." {
            continue;
        }
        seen.push(n);
        count += 1;
        if count == 300 {
            // Remove every third entry (seen or not).
            for name in all.iter().step_by(3) {
                fs::remove_file(d.join(name)).unwrap();
                removed.insert((*name).clone());
            }
        }
    }
    drop(dir);
    let seen_set: HashSet<&String> = seen.iter().collect();
    assert_eq!(seen_set.len(), seen.len(), "an entry was listed twice");
    for n in &want {
        if !removed.contains(n) {
            assert!(seen_set.contains(n), "{n} was not listed");
        }
    }
    let left = names(&d);
    assert_eq!(left.len(), 2000 - removed.len());
    assert!(left.iter().all(|n| !removed.contains(n)));

    m.unmount();
    let m = vol.mount();
    assert_eq!(names(&m.p("big")).len(), 2000 - removed.len());
}

// ---------------------------------------------------------------------------------------------
// Volume: statfs, access
// ---------------------------------------------------------------------------------------------

#[test]
fn statfs_reports_blocks_and_inodes() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let s = nix::sys::statvfs::statvfs(&m.path).unwrap();
    assert_eq!(s.block_size(), 4096);
    assert_eq!(s.name_max(), 255);
    assert!(s.blocks() > 0);
    assert!(s.blocks_free() <= s.blocks());
    assert!(s.blocks_available() <= s.blocks());
    let inodes0 = s.files() - s.files_free();
    let used0 = s.blocks() - s.blocks_free();

    let mut fsf: libc::statfs = unsafe { std::mem::zeroed() };
    let cp = cpath(&m.path);
    cvt(unsafe { libc::statfs(cp.as_ptr(), &mut fsf) }).unwrap();
    assert_eq!(fsf.f_type as i64, 0x65735546, "not a FUSE file system");

    for i in 0..10 {
        File::create(m.p(&format!("f{i}"))).unwrap();
    }
    fs::write(m.p("big"), pattern(8 * MIB, 9)).unwrap();
    let s = nix::sys::statvfs::statvfs(&m.path).unwrap();
    assert_eq!(s.files() - s.files_free(), inodes0 + 11, "inodes in use");
    let used = s.blocks() - s.blocks_free();
    assert!(
        used >= used0 + 2040 && used <= used0 + 2100,
        "8 MiB written: used blocks went from {used0} to {used}"
    );
    // Deleting gives the space back. The kernel sends RELEASE for the closed descriptor
    // asynchronously, so the unlink may arrive while the file still counts as open: then its
    // space comes back at that release, a moment later.
    fs::remove_file(m.p("big")).unwrap();
    let start = std::time::Instant::now();
    loop {
        let s = nix::sys::statvfs::statvfs(&m.path).unwrap();
        let (used, inodes) = (s.blocks() - s.blocks_free(), s.files() - s.files_free());
        if used < used0 + 10 && inodes == inodes0 + 10 {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "space not given back: used {used} (was {used0}), inodes {inodes} (want {})",
            inodes0 + 10
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn access_checks_mode_bits() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    fs::write(&p, b"x").unwrap();
    chmod(&p, 0o644);
    access(&p, libc::F_OK).unwrap();
    access(&p, libc::R_OK | libc::W_OK).unwrap();
    // Root needs an x bit somewhere to execute.
    expect_errno(access(&p, libc::X_OK), libc::EACCES);
    chmod(&p, 0o744);
    access(&p, libc::X_OK).unwrap();
    expect_errno(access(&m.p("missing"), libc::F_OK), libc::ENOENT);

    chmod(&p, 0o640);
    let q = p.clone();
    assert_eq!(
        as_user(65534, 65534, || io(access(&q, libc::R_OK))),
        Err(libc::EACCES)
    );
    chmod(&p, 0o604);
    let q = p.clone();
    assert_eq!(
        as_user(65534, 65534, || {
            io(access(&q, libc::R_OK))?;
            ensure(
                access(&q, libc::W_OK).map_err(|e| errno(&e)) == Err(libc::EACCES),
                201,
            )?;
            ensure(
                access(&q, libc::X_OK).map_err(|e| errno(&e)) == Err(libc::EACCES),
                202,
            )
        }),
        Ok(())
    );
    // Group bits apply to members of the group.
    std::os::unix::fs::chown(&p, Some(0), Some(4242)).unwrap();
    chmod(&p, 0o070);
    let q = p.clone();
    assert_eq!(
        as_user(1000, 4242, || io(access(
            &q,
            libc::R_OK | libc::W_OK | libc::X_OK
        ))),
        Ok(())
    );
    let q = p.clone();
    assert_eq!(
        as_user(1000, 1000, || io(access(&q, libc::R_OK))),
        Err(libc::EACCES)
    );
}

// ---------------------------------------------------------------------------------------------
// Extended attributes
// ---------------------------------------------------------------------------------------------

#[test]
fn xattrs_set_get_list_remove() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    fs::write(&p, b"x").unwrap();
    assert!(listxattr(&p).unwrap().is_empty());
    expect_errno(getxattr(&p, "user.color"), libc::ENODATA);

    setxattr(&p, "user.color", b"blue", 0).unwrap();
    assert_eq!(getxattr(&p, "user.color").unwrap(), b"blue");
    assert_eq!(getxattr_sized(&p, "user.color", 0).unwrap().0, 4);
    expect_errno(getxattr_sized(&p, "user.color", 2), libc::ERANGE);

    // XATTR_CREATE / XATTR_REPLACE.
    expect_errno(
        setxattr(&p, "user.color", b"red", libc::XATTR_CREATE),
        libc::EEXIST,
    );
    assert_eq!(getxattr(&p, "user.color").unwrap(), b"blue");
    expect_errno(
        setxattr(&p, "user.shape", b"round", libc::XATTR_REPLACE),
        libc::ENODATA,
    );
    expect_errno(getxattr(&p, "user.shape"), libc::ENODATA);
    setxattr(&p, "user.color", b"red", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&p, "user.color").unwrap(), b"red");
    setxattr(&p, "user.shape", b"round", libc::XATTR_CREATE).unwrap();

    // Empty, binary and the largest values.
    setxattr(&p, "user.empty", b"", 0).unwrap();
    assert_eq!(getxattr_sized(&p, "user.empty", 0).unwrap().0, 0);
    assert_eq!(getxattr(&p, "user.empty").unwrap(), b"");
    let bin = [0u8, 1, 255, 0, 7, b'\n', 0];
    setxattr(&p, "user.bin", &bin, 0).unwrap();
    assert_eq!(getxattr(&p, "user.bin").unwrap(), bin);
    let big = pattern(65536, 12);
    setxattr(&p, "user.big", &big, 0).unwrap();
    assert_eq!(getxattr(&p, "user.big").unwrap(), big);

    // listxattr, with a too-small buffer.
    let want: BTreeSet<String> = [
        "user.color",
        "user.shape",
        "user.empty",
        "user.bin",
        "user.big",
    ]
    .map(String::from)
    .into();
    assert_eq!(listxattr(&p).unwrap(), want);
    let (n, _) = listxattr_sized(&p, 0).unwrap();
    assert_eq!(
        n,
        want.iter().map(|s| s.len() + 1).sum::<usize>(),
        "list size"
    );
    expect_errno(listxattr_sized(&p, n - 1), libc::ERANGE);

    // removexattr.
    removexattr(&p, "user.color").unwrap();
    expect_errno(getxattr(&p, "user.color"), libc::ENODATA);
    expect_errno(removexattr(&p, "user.color"), libc::ENODATA);
    assert!(!listxattr(&p).unwrap().contains("user.color"));

    // On a directory, through a descriptor; user.* on a symlink is refused by Linux.
    fs::create_dir(m.p("d")).unwrap();
    setxattr(&m.p("d"), "user.dir", b"yes", 0).unwrap();
    assert_eq!(getxattr(&m.p("d"), "user.dir").unwrap(), b"yes");
    let f = File::open(&p).unwrap();
    let name = CString::new("user.viafd").unwrap();
    cvt(unsafe { libc::fsetxattr(f.as_raw_fd(), name.as_ptr(), b"fd".as_ptr().cast(), 2, 0) })
        .unwrap();
    let mut buf = [0u8; 8];
    let n = cvt_size(unsafe {
        libc::fgetxattr(
            f.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
    .unwrap();
    assert_eq!(&buf[..n], b"fd");
    drop(f);
    std::os::unix::fs::symlink("f", m.p("ln")).unwrap();
    expect_errno(lsetxattr(&m.p("ln"), "user.x", b"1", 0), libc::EPERM);
    // Through the symlink: the target's attributes.
    assert_eq!(getxattr(&m.p("ln"), "user.shape").unwrap(), b"round");

    // Attributes of a file are its own; they survive a remount.
    fs::write(m.p("g"), b"").unwrap();
    assert!(listxattr(&m.p("g")).unwrap().is_empty());
    m.unmount();
    let m = vol.mount();
    assert_eq!(getxattr(&m.p("f"), "user.bin").unwrap(), bin);
    assert_eq!(getxattr(&m.p("f"), "user.big").unwrap(), big);
    assert_eq!(getxattr(&m.p("d"), "user.dir").unwrap(), b"yes");
    expect_errno(getxattr(&m.p("f"), "user.color"), libc::ENODATA);
}

// ---------------------------------------------------------------------------------------------
// Space: fallocate, holes, sparse files, big files, copy_file_range
// ---------------------------------------------------------------------------------------------

#[test]
fn fallocate_modes() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    // Plain: extends the size, reads zeros.
    fallocate(&f, 0, 0, MIB as u64).unwrap();
    assert_eq!(f.metadata().unwrap().len(), MIB as u64);
    let all = read_all_at(&f);
    assert_eq!(all.len(), MIB);
    assert!(is_zero(&all));
    fallocate(&f, 0, 2 * MIB as u64, 4096).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 2 * MIB as u64 + 4096);
    assert!(is_zero(&read_all_at(&f)));
    // Inside the file: changes nothing.
    let data = pattern(2 * MIB + 4096, 13);
    f.write_all_at(&data, 0).unwrap();
    fallocate(&f, 0, 1000, 5000).unwrap();
    assert_eq!(read_all_at(&f), data);
    // KEEP_SIZE: the size stays.
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 8 * MIB as u64).unwrap();
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    assert_eq!(read_all_at(&f), data);

    // PUNCH_HOLE|KEEP_SIZE: zeros in the hole, the rest intact, same size.
    let mut want = data.clone();
    let (ho, hl) = (4096 + 100, 70_000);
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        ho as u64,
        hl as u64,
    )
    .unwrap();
    want[ho..ho + hl].fill(0);
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    assert!(read_all_at(&f) == want, "punched file differs");
    // A hole past the end changes nothing.
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        10 * MIB as u64,
        MIB as u64,
    )
    .unwrap();
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    // PUNCH_HOLE without KEEP_SIZE is not a valid mode.
    expect_errno(
        fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE, 0, 10),
        libc::EOPNOTSUPP,
    );
    drop(f);

    // A hole across the 4 MiB block boundary of a bigger file.
    let q = m.p("g");
    let data = pattern(5 * MIB, 14);
    fs::write(&q, &data).unwrap();
    let g = OpenOptions::new().read(true).write(true).open(&q).unwrap();
    let mut want2 = data.clone();
    let (ho2, hl2) = (4 * MIB - 1000, 2000);
    fallocate(
        &g,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        ho2 as u64,
        hl2 as u64,
    )
    .unwrap();
    want2[ho2..ho2 + hl2].fill(0);
    assert!(read_all_at(&g) == want2);
    drop(g);

    m.unmount();
    let m = vol.mount();
    assert!(fs::read(m.p("f")).unwrap() == want, "after remount");
    assert!(fs::read(m.p("g")).unwrap() == want2, "after remount");
}

#[test]
fn fallocate_zero_range() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    let data = pattern(300_000, 15);
    fs::write(&p, &data).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 100, 100_000).unwrap();
    let mut want = data.clone();
    want[100..100_100].fill(0);
    assert!(read_all_at(&f) == want);
    // Beyond the end: extends (without KEEP_SIZE).
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 400_000, 1000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 401_000);
    want.resize(401_000, 0);
    assert!(read_all_at(&f) == want);
}

#[test]
fn lseek_data_and_hole() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("sparse");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    // data [0, 4K), hole [4K, 1M), data [1M, 1M+4K), hole to 3M (EOF).
    f.write_all_at(&[1u8; 4096], 0).unwrap();
    f.write_all_at(&[2u8; 4096], MIB as u64).unwrap();
    f.set_len(3 * MIB as u64).unwrap();
    let k = 4096u64;
    let mb = MIB as u64;
    assert_eq!(lseek(&f, 0, libc::SEEK_DATA).unwrap(), 0);
    assert_eq!(lseek(&f, 0, libc::SEEK_HOLE).unwrap(), k);
    assert_eq!(lseek(&f, 100, libc::SEEK_HOLE).unwrap(), k);
    assert_eq!(lseek(&f, k, libc::SEEK_DATA).unwrap(), mb);
    assert_eq!(lseek(&f, k + 10, libc::SEEK_DATA).unwrap(), mb);
    assert_eq!(lseek(&f, k + 10, libc::SEEK_HOLE).unwrap(), k + 10);
    assert_eq!(lseek(&f, mb, libc::SEEK_HOLE).unwrap(), mb + k);
    assert_eq!(lseek(&f, mb + 5, libc::SEEK_DATA).unwrap(), mb + 5);
    expect_errno(lseek(&f, mb + k, libc::SEEK_DATA), libc::ENXIO);
    assert_eq!(lseek(&f, 2 * mb, libc::SEEK_HOLE).unwrap(), 2 * mb);
    expect_errno(lseek(&f, 3 * mb, libc::SEEK_DATA), libc::ENXIO);
    expect_errno(lseek(&f, 3 * mb, libc::SEEK_HOLE), libc::ENXIO);
    expect_errno(lseek(&f, 4 * mb, libc::SEEK_HOLE), libc::ENXIO);

    // Data beyond a whole empty chunk (64 MiB).
    let q = m.p("far");
    let g = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&q)
        .unwrap();
    let far = 100 * mb;
    g.write_all_at(b"end", far).unwrap();
    assert_eq!(lseek(&g, 0, libc::SEEK_DATA).unwrap(), far);
    assert_eq!(lseek(&g, 0, libc::SEEK_HOLE).unwrap(), 0);
    assert_eq!(lseek(&g, far, libc::SEEK_HOLE).unwrap(), far + 3);
    // A punched hole is a hole.
    let h = m.p("punched");
    fs::write(&h, pattern(3 * MIB, 16)).unwrap();
    let hf = OpenOptions::new().read(true).write(true).open(&h).unwrap();
    fallocate(
        &hf,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        mb,
        mb,
    )
    .unwrap();
    assert_eq!(lseek(&hf, 0, libc::SEEK_HOLE).unwrap(), mb);
    assert_eq!(lseek(&hf, mb, libc::SEEK_DATA).unwrap(), 2 * mb);
}

#[test]
fn sparse_file_at_100_mib() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("sparse");
    let off = 100 * MIB as u64;
    {
        let f = File::create(&p).unwrap();
        f.write_all_at(b"the end", off).unwrap();
    }
    assert_eq!(fs::metadata(&p).unwrap().len(), off + 7);
    assert!(is_zero(&read_range(&p, 0, MIB)));
    assert!(is_zero(&read_range(&p, 64 * MIB as u64 - 4096, 8192)));
    // Beyond the largest file size: EFBIG, and the file is unchanged. With the kernel's
    // writeback cache (the default for a mount alone) the write lands in the kernel's pages
    // (FUSE fixes the largest size at 2^63 - 1 for every file system) and the error comes
    // at fsync, not lost; this kernel's size of the file stays wrong until it forgets the
    // inode, so what is stored is checked through a second mount (which has no writeback
    // cache beside the first).
    let cached = {
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        let cached = match f.write_at(b"x", 1 << 60) {
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
                false
            }
            Ok(_) => {
                let e = f
                    .sync_all()
                    .expect_err("fsync after a write past the largest size");
                assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
                true
            }
        };
        expect_errno(f.set_len(1 << 60), libc::EFBIG);
        cached
    };
    let other = cached.then(|| vol.mount());
    let p = match &other {
        Some(o) => o.p("sparse"),
        None => p,
    };
    assert_eq!(fs::metadata(&p).unwrap().len(), off + 7);
    let tail = read_range(&p, off - MIB as u64, MIB + 100);
    assert_eq!(tail.len(), MIB + 7);
    assert!(is_zero(&tail[..MIB]));
    assert_eq!(&tail[MIB..], b"the end");
    // The hole is not stored.
    let stored: u64 = vol
        .objects()
        .iter()
        .map(|o| fs::metadata(o).unwrap().len())
        .sum();
    assert!(stored < MIB as u64, "a sparse file stored {stored} bytes");

    drop(other);
    m.unmount();
    let m = vol.mount();
    let p = m.p("sparse");
    assert_eq!(fs::metadata(&p).unwrap().len(), off + 7);
    assert!(is_zero(&read_range(&p, 50 * MIB as u64, MIB)));
    assert_eq!(read_range(&p, off, 100), b"the end");
}

#[test]
fn file_across_the_64_mib_chunk_boundary() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("big");
    let mut data = pattern(66 * MIB + 1234, 17);
    fs::write(&p, &data).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), data.len() as u64);
    let b = 64 * MIB;
    assert!(read_range(&p, (b - 5000) as u64, 10_000) == data[b - 5000..b + 5000]);
    // Overwrite straddling the boundary, and a write exactly at it.
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let patch = pattern(300_001, 18);
    f.write_all_at(&patch, (b - 150_000) as u64).unwrap();
    data[b - 150_000..b + 150_001].copy_from_slice(&patch);
    f.write_all_at(b"@", b as u64).unwrap();
    data[b] = b'@';
    drop(f);
    assert!(fs::read(&p).unwrap() == data, "file differs");

    m.unmount();
    let m = vol.mount();
    let p = m.p("big");
    assert!(read_range(&p, (b - 200_000) as u64, 400_000) == data[b - 200_000..b + 200_000]);
    assert!(fs::read(&p).unwrap() == data, "file differs after remount");
}

#[test]
fn random_operations_across_the_chunk_boundary_match_a_model() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let (lo, hi) = (62 * MIB, 66 * MIB); // a window around the 64 MiB chunk boundary
    let src_data = pattern(4 * MIB, 31);
    fs::write(m.p("src"), &src_data).unwrap();
    let src = File::open(m.p("src")).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(m.p("f"))
        .unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut rng = XorShift(0x5eed);
    let mut log: Vec<String> = Vec::new();
    for i in 0..400u64 {
        let off = lo + rng.below((hi - lo) as u64) as usize;
        let len = 1 + rng.below(400_000) as usize;
        match rng.below(10) {
            0..=4 => {
                f.write_all_at(&pattern(len, 1000 + i), off as u64).unwrap();
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&pattern(len, 1000 + i));
                log.push(format!("write {off}+{len}"));
            }
            5 => {
                f.set_len(off as u64).unwrap();
                model.resize(off, 0);
                log.push(format!("truncate {off}"));
            }
            6 => {
                fallocate(
                    &f,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off as u64,
                    len as u64,
                )
                .unwrap();
                let end = (off + len).min(model.len());
                if off < end {
                    model[off..end].fill(0);
                }
                log.push(format!("punch {off}+{len}"));
            }
            7 => {
                fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, off as u64, len as u64).unwrap();
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].fill(0);
                log.push(format!("zero {off}+{len}"));
            }
            8 => {
                let so = rng.below(src_data.len() as u64 - 1) as usize;
                let n = len.min(src_data.len() - so);
                let (mut oi, mut oo) = (so as i64, off as i64);
                let mut done = 0;
                while done < n {
                    let r = cvt_size(unsafe {
                        libc::copy_file_range(
                            src.as_raw_fd(),
                            &mut oi,
                            f.as_raw_fd(),
                            &mut oo,
                            n - done,
                            0,
                        )
                    })
                    .unwrap();
                    assert!(r > 0, "copy_file_range copied nothing");
                    done += r;
                }
                if model.len() < off + n {
                    model.resize(off + n, 0);
                }
                model[off..off + n].copy_from_slice(&src_data[so..so + n]);
                log.push(format!("copy {so}+{n} -> {off}"));
            }
            _ => {
                drop_cache(&f);
                assert_eq!(
                    f.metadata().unwrap().len(),
                    model.len() as u64,
                    "size after: {:?}",
                    &log[log.len().saturating_sub(5)..]
                );
                let o = lo.min(model.len());
                let n = (hi - lo + 400_000).min(model.len() - o);
                let mut buf = vec![0u8; n];
                f.read_exact_at(&mut buf, o as u64).unwrap();
                if buf != model[o..o + n] {
                    let bad = (0..n).find(|&k| buf[k] != model[o + k]).unwrap() + o;
                    panic!(
                        "op {i}: byte {bad} differs (last ops: {:?})",
                        &log[log.len().saturating_sub(5)..]
                    );
                }
            }
        }
    }
    let check = |f: &File| {
        let all = read_all_at(f);
        assert_eq!(all.len(), model.len());
        assert!(
            is_zero(&all[..lo.min(all.len())]),
            "bytes before the window"
        );
        if all != model {
            let bad = (0..all.len()).find(|&k| all[k] != model[k]).unwrap();
            panic!("byte {bad} differs from the model");
        }
    };
    check(&f);
    drop((f, src));
    m.unmount();
    let m = vol.mount();
    check(&File::open(m.p("f")).unwrap());
}

#[test]
fn copy_file_range_copies_contents() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let src_data = pattern(3 * MIB, 19);
    fs::write(m.p("src"), &src_data).unwrap();
    let mut dst_data = pattern(MIB, 20);
    fs::write(m.p("dst"), &dst_data).unwrap();
    let src = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("src"))
        .unwrap();
    let dst = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("dst"))
        .unwrap();

    fn copy(src: &File, off_in: u64, dst: &File, off_out: u64, len: usize) -> usize {
        let (mut oi, mut oo) = (off_in as i64, off_out as i64);
        let mut done = 0;
        while done < len {
            let n = cvt_size(unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut oi,
                    dst.as_raw_fd(),
                    &mut oo,
                    len - done,
                    0,
                )
            })
            .unwrap();
            if n == 0 {
                break;
            }
            done += n;
        }
        done
    }

    // Into the middle of dst, extending it.
    let (oi, oo, len) = (1000, 5000, 2 * MIB);
    assert_eq!(copy(&src, oi, &dst, oo, len), len);
    dst_data.resize(oo as usize + len, 0);
    dst_data[oo as usize..].copy_from_slice(&src_data[oi as usize..oi as usize + len]);
    assert!(read_all_at(&dst) == dst_data, "copied contents differ");
    assert!(read_all_at(&src) == src_data, "source changed");

    // Past the source's end: a short copy.
    assert_eq!(copy(&src, 3 * MIB as u64 - 10, &dst, 0, 100), 10);
    dst_data[..10].copy_from_slice(&src_data[3 * MIB - 10..]);
    // Writing to the source afterwards does not change the copy.
    src.write_all_at(&[0xAA; 5000], 2000).unwrap();
    let mut src_now = src_data.clone();
    src_now[2000..7000].fill(0xAA);
    assert!(
        read_all_at(&dst) == dst_data,
        "copy changed with its source"
    );
    assert!(read_all_at(&src) == src_now);

    // Unflushed writes of the source are copied too.
    src.write_all_at(b"fresh bytes", 100).unwrap();
    src_now[100..111].copy_from_slice(b"fresh bytes");
    assert_eq!(copy(&src, 100, &dst, 200, 11), 11);
    dst_data[200..211].copy_from_slice(b"fresh bytes");
    assert!(read_all_at(&dst) == dst_data);

    // Within one file, without overlap.
    assert_eq!(copy(&src, 0, &src, 2 * MIB as u64, 4096), 4096);
    let head: Vec<u8> = src_now[..4096].to_vec();
    src_now[2 * MIB..2 * MIB + 4096].copy_from_slice(&head);
    assert!(read_all_at(&src) == src_now);
    drop((src, dst));

    m.unmount();
    let m = vol.mount();
    assert!(fs::read(m.p("dst")).unwrap() == dst_data);
    assert!(fs::read(m.p("src")).unwrap() == src_now);
}

#[test]
fn names_longer_than_255_bytes() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let ok = "a".repeat(255);
    let long = "b".repeat(256);
    fs::write(m.p(&ok), b"x").unwrap();
    assert_eq!(fs::read(m.p(&ok)).unwrap(), b"x");
    assert!(names(&m.path).contains(&ok));
    expect_errno(File::create(m.p(&long)), libc::ENAMETOOLONG);
    expect_errno(fs::create_dir(m.p(&long)), libc::ENAMETOOLONG);
    expect_errno(
        std::os::unix::fs::symlink("x", m.p(&long)),
        libc::ENAMETOOLONG,
    );
    expect_errno(fs::hard_link(m.p(&ok), m.p(&long)), libc::ENAMETOOLONG);
    expect_errno(fs::rename(m.p(&ok), m.p(&long)), libc::ENAMETOOLONG);
    expect_errno(fs::metadata(m.p(&long)), libc::ENAMETOOLONG);
    expect_errno(
        mknod(&m.p(&long), libc::S_IFIFO | 0o644, 0),
        libc::ENAMETOOLONG,
    );
    assert_eq!(names(&m.path), BTreeSet::from([ok]));
}

// ---------------------------------------------------------------------------------------------
// Locks
// ---------------------------------------------------------------------------------------------

fn flock(f: &File, op: i32) -> io::Result<()> {
    cvt(unsafe { libc::flock(f.as_raw_fd(), op) }).map(|_| ())
}

fn fcntl_lock(f: &File, cmd: i32, typ: i32, start: i64, len: i64) -> io::Result<libc::flock> {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start;
    fl.l_len = len;
    cvt(unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) })?;
    Ok(fl)
}

#[test]
fn flock_conflicts() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    fs::write(&p, b"lock me").unwrap();
    let a = File::open(&p).unwrap();
    let b = File::open(&p).unwrap();
    flock(&a, libc::LOCK_EX).unwrap();
    expect_errno(flock(&b, libc::LOCK_EX | libc::LOCK_NB), libc::EWOULDBLOCK);
    expect_errno(flock(&b, libc::LOCK_SH | libc::LOCK_NB), libc::EWOULDBLOCK);
    // Another process sees the conflict too.
    let q = p.clone();
    assert_eq!(
        as_user(0, 0, || {
            let f = io(File::open(&q))?;
            match flock(&f, libc::LOCK_EX | libc::LOCK_NB) {
                Err(e) if errno(&e) == libc::EWOULDBLOCK => Ok(()),
                Err(e) => Err(errno(&e)),
                Ok(()) => Err(201),
            }
        }),
        Ok(())
    );
    flock(&a, libc::LOCK_UN).unwrap();
    flock(&b, libc::LOCK_EX | libc::LOCK_NB).unwrap();
    flock(&b, libc::LOCK_UN).unwrap();
    // Shared locks coexist; an exclusive one waits for all of them.
    flock(&a, libc::LOCK_SH).unwrap();
    flock(&b, libc::LOCK_SH | libc::LOCK_NB).unwrap();
    let c2 = File::open(&p).unwrap();
    expect_errno(flock(&c2, libc::LOCK_EX | libc::LOCK_NB), libc::EWOULDBLOCK);
    drop((a, b));
    // A child forked by a parallel test holds copies of a and b (flock locks belong to the
    // open file description) until it execs or exits: allow it a moment.
    let start = Instant::now();
    while let Err(e) = flock(&c2, libc::LOCK_EX | libc::LOCK_NB) {
        assert_eq!(errno(&e), libc::EWOULDBLOCK, "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the shared locks were not released by closing their descriptors"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn fcntl_locks_conflict() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    fs::write(&p, vec![0u8; 1000]).unwrap();
    let a = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    // A process-wide (POSIX) write lock on [0, 100), tested from a forked child.
    fcntl_lock(&a, libc::F_SETLK, libc::F_WRLCK, 0, 100).unwrap();
    let parent = std::process::id() as i32;
    let q = p.clone();
    assert_eq!(
        as_user(0, 0, || {
            let f = io(OpenOptions::new().read(true).write(true).open(&q))?;
            match fcntl_lock(&f, libc::F_SETLK, libc::F_WRLCK, 50, 10) {
                Err(e) if matches!(errno(&e), libc::EAGAIN | libc::EACCES) => {}
                Err(e) => return Err(errno(&e)),
                Ok(_) => return Err(201),
            }
            match fcntl_lock(&f, libc::F_SETLK, libc::F_RDLCK, 0, 1) {
                Err(e) if matches!(errno(&e), libc::EAGAIN | libc::EACCES) => {}
                Err(e) => return Err(errno(&e)),
                Ok(_) => return Err(202),
            }
            let fl = io(fcntl_lock(&f, libc::F_GETLK, libc::F_WRLCK, 0, 10))?;
            ensure(fl.l_type as i32 == libc::F_WRLCK, 203)?;
            ensure(fl.l_pid == parent, 204)?;
            // A range nobody holds.
            io(fcntl_lock(&f, libc::F_SETLK, libc::F_WRLCK, 200, 100))?;
            Ok(())
        }),
        Ok(())
    );
    // Open file description locks: two descriptors of one process conflict.
    let b = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let c2 = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 500, 10).unwrap();
    expect_errno(
        fcntl_lock(&c2, libc::F_OFD_SETLK, libc::F_WRLCK, 505, 10),
        libc::EAGAIN,
    );
    fcntl_lock(&c2, libc::F_OFD_SETLK, libc::F_WRLCK, 510, 10).unwrap();
    fcntl_lock(&b, libc::F_OFD_SETLK, libc::F_UNLCK, 500, 10).unwrap();
    fcntl_lock(&c2, libc::F_OFD_SETLK, libc::F_WRLCK, 505, 10).unwrap();
    // After the parent unlocks, the child gets the lock.
    fcntl_lock(&a, libc::F_SETLK, libc::F_UNLCK, 0, 100).unwrap();
    let q = p.clone();
    assert_eq!(
        as_user(0, 0, || {
            let f = io(OpenOptions::new().read(true).write(true).open(&q))?;
            io(fcntl_lock(&f, libc::F_SETLK, libc::F_WRLCK, 0, 100)).map(|_| ())
        }),
        Ok(())
    );
}

// ---------------------------------------------------------------------------------------------
// Open files outliving their names
// ---------------------------------------------------------------------------------------------

#[test]
fn unlinked_open_file_lives_until_last_close() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    let data = pattern(6 * MIB, 21);
    fs::write(&p, &data).unwrap();
    let objs = vol.objects();
    assert!(!objs.is_empty());
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let f2 = File::open(&p).unwrap();
    fs::remove_file(&p).unwrap();
    expect_errno(fs::metadata(&p), libc::ENOENT);
    assert!(names(&m.path).is_empty());
    assert_eq!(f.metadata().unwrap().nlink(), 0);

    // Still readable and writable.
    assert!(read_all_at(&f) == data, "unlinked file not readable");
    f.write_all_at(b"more", data.len() as u64).unwrap();
    f.sync_all().unwrap();
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64 + 4);
    let mut want = data.clone();
    want.extend_from_slice(b"more");
    assert!(read_all_at(&f2) == want);
    let objs: Vec<PathBuf> = vol.objects();
    assert!(objs.len() >= 2);

    // A new file under the old name is another file.
    fs::write(&p, b"new").unwrap();
    assert_ne!(ino(&p), f.metadata().unwrap().ino());
    assert_eq!(fs::read(&p).unwrap(), b"new");
    let new_objs: Vec<PathBuf> = vol
        .objects()
        .into_iter()
        .filter(|o| !objs.contains(o))
        .collect();

    // Close one descriptor: the other still reads everything, the objects are still there.
    drop(f);
    let now = vol.objects();
    assert!(
        objs.iter().all(|o| now.contains(o)),
        "objects deleted while the file is open"
    );
    assert!(read_all_at(&f2) == want, "unlinked file changed");
    drop(f2);
    // After the last close, its objects go; the new file's stay.
    wait_objects_gone(&vol, &objs);
    let now = vol.objects();
    assert!(new_objs.iter().all(|o| now.contains(o)));
    assert_eq!(fs::read(&p).unwrap(), b"new");
}

#[test]
fn renamed_over_open_file_lives_until_close() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let old = pattern(5 * MIB, 22);
    fs::write(m.p("victim"), &old).unwrap();
    let objs = vol.objects();
    let f = File::open(m.p("victim")).unwrap();
    fs::write(m.p("new"), b"replacement").unwrap();
    fs::rename(m.p("new"), m.p("victim")).unwrap();
    assert_eq!(fs::read(m.p("victim")).unwrap(), b"replacement");
    assert!(read_all_at(&f) == old);
    let now = vol.objects();
    assert!(objs.iter().all(|o| now.contains(o)));
    drop(f);
    wait_objects_gone(&vol, &objs);
    assert_eq!(fs::read(m.p("victim")).unwrap(), b"replacement");
}

#[test]
fn unlinked_open_file_is_reclaimed_after_a_crash() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("keep"), pattern(MIB, 24)).unwrap();
    let keep = vol.objects();
    fs::write(m.p("f"), pattern(5 * MIB, 25)).unwrap();
    let objs: Vec<PathBuf> = vol
        .objects()
        .into_iter()
        .filter(|o| !keep.contains(o))
        .collect();
    assert!(!objs.is_empty());
    let f = File::open(m.p("f")).unwrap();
    fs::remove_file(m.p("f")).unwrap();
    // The unlink made durable, as by any program that must not see the name again after a
    // crash (an unlink alone may wait up to 10 ms in a group of commits).
    File::open(&m.path).unwrap().sync_all().unwrap();
    // The server dies while the deleted file is open: the next mount reclaims it.
    m.kill9();
    drop(f);
    let m = vol.mount();
    wait_objects_gone(&vol, &objs);
    assert!(keep.iter().all(|o| vol.objects().contains(o)));
    assert_eq!(fs::read(m.p("keep")).unwrap(), pattern(MIB, 24));
    assert_eq!(names(&m.path), BTreeSet::from(["keep".to_string()]));
}

// ---------------------------------------------------------------------------------------------
// Memory maps and programs
// ---------------------------------------------------------------------------------------------

#[test]
fn mmap_shared_read_and_write() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("mapped");
    let len = 2 * MIB + 4096;
    let initial = pattern(len, 26);
    fs::write(&p, &initial).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "{}", io::Error::last_os_error());
    let map = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
    assert!(map[..] == initial[..], "mapped contents differ");
    let mut want = initial.clone();
    let patch = pattern(100_000, 27);
    map[12_345..112_345].copy_from_slice(&patch);
    want[12_345..112_345].copy_from_slice(&patch);
    map[len - 1] = 0x5a;
    want[len - 1] = 0x5a;
    cvt(unsafe { libc::msync(ptr, len, libc::MS_SYNC) }).unwrap();
    cvt(unsafe { libc::munmap(ptr, len) }).unwrap();
    drop(f);
    assert!(
        read_range(&p, 0, len) == want,
        "mmap writes not in the file"
    );
    m.unmount();
    let m = vol.mount();
    assert!(
        fs::read(m.p("mapped")).unwrap() == want,
        "mmap writes lost at remount"
    );
}

/// Runs a program, retrying while it is busy for writing (ETXTBSY: a child forked by another
/// test thread may briefly hold a copy of the descriptor that wrote it).
fn run_program(p: &Path, args: &[&str]) -> io::Result<std::process::Output> {
    let start = Instant::now();
    loop {
        match std::process::Command::new(p).args(args).output() {
            Err(e) if errno(&e) == libc::ETXTBSY && start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            res => return res,
        }
    }
}

#[test]
fn programs_run_from_the_mount() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let echo = fs::read("/bin/echo").unwrap();
    fs::write(m.p("echo"), &echo).unwrap();
    chmod(&m.p("echo"), 0o755);
    let out = run_program(&m.p("echo"), &["hello from unkai"]).unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, b"hello from unkai\n");
    // Without x permission, exec is refused.
    chmod(&m.p("echo"), 0o644);
    expect_errno(run_program(&m.p("echo"), &[]), libc::EACCES);
    // A script through its interpreter line.
    fs::write(m.p("script.sh"), b"#!/bin/sh\necho \"script $1\"\n").unwrap();
    chmod(&m.p("script.sh"), 0o755);
    let out = run_program(&m.p("script.sh"), &["ran"]).unwrap();
    assert_eq!(out.stdout, b"script ran\n");
}

// ---------------------------------------------------------------------------------------------
// Permissions, as other users
// ---------------------------------------------------------------------------------------------

#[test]
fn other_users_are_denied_by_mode_bits() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let secret = m.p("secret");
    fs::write(&secret, b"top secret").unwrap();
    chmod(&secret, 0o600);
    let q = secret.clone();
    assert_eq!(
        as_user(65534, 65534, || io(File::open(&q)).map(|_| ())),
        Err(libc::EACCES)
    );
    let q = secret.clone();
    assert_eq!(
        as_user(65534, 65534, || io(OpenOptions::new().write(true).open(&q))
            .map(|_| ())),
        Err(libc::EACCES)
    );
    let q = secret.clone();
    assert_eq!(
        as_user(65534, 65534, || io(
            nix::unistd::truncate(&q, 0).map_err(io::Error::from)
        )),
        Err(libc::EACCES)
    );
    assert_eq!(fs::read(&secret).unwrap(), b"top secret");

    // 0644: readable, not writable.
    let public = m.p("public");
    fs::write(&public, b"hello").unwrap();
    let q = public.clone();
    assert_eq!(
        as_user(65534, 65534, || {
            let got = io(fs::read(&q))?;
            ensure(got == b"hello", 201)?;
            match OpenOptions::new().write(true).open(&q) {
                Err(e) if errno(&e) == libc::EACCES => Ok(()),
                Err(e) => Err(errno(&e)),
                Ok(_) => Err(202),
            }
        }),
        Ok(())
    );

    // Directories: 0700 hides everything, 0711 allows lookup but not listing, 0755 no create.
    fs::create_dir(m.p("closed")).unwrap();
    fs::write(m.p("closed/f"), b"x").unwrap();
    chmod(&m.p("closed/f"), 0o644);
    chmod(&m.p("closed"), 0o700);
    let q = m.p("closed");
    assert_eq!(
        as_user(65534, 65534, || io(fs::read_dir(&q)).map(|_| ())),
        Err(libc::EACCES)
    );
    let q = m.p("closed/f");
    assert_eq!(
        as_user(65534, 65534, || io(fs::metadata(&q)).map(|_| ())),
        Err(libc::EACCES)
    );
    chmod(&m.p("closed"), 0o711);
    let q = m.p("closed/f");
    assert_eq!(
        as_user(65534, 65534, || io(fs::read(&q)).map(|_| ())),
        Ok(())
    );
    let q = m.p("closed");
    assert_eq!(
        as_user(65534, 65534, || io(fs::read_dir(&q)).map(|_| ())),
        Err(libc::EACCES)
    );
    chmod(&m.p("closed"), 0o755);
    let q = m.p("closed/new");
    assert_eq!(
        as_user(65534, 65534, || io(File::create(&q)).map(|_| ())),
        Err(libc::EACCES)
    );
    let q = m.p("closed/f");
    assert_eq!(
        as_user(65534, 65534, || io(fs::remove_file(&q))),
        Err(libc::EACCES)
    );
    assert!(fs::metadata(m.p("closed/f")).is_ok());

    // A world-writable directory: files are created with the caller's ids.
    fs::create_dir(m.p("open")).unwrap();
    chmod(&m.p("open"), 0o777);
    let q = m.p("open/mine");
    assert_eq!(as_user(65534, 65534, || io(fs::write(&q, b"mine"))), Ok(()));
    let md = fs::metadata(m.p("open/mine")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    // Non-owners cannot chmod, utimes or set user xattrs without write permission.
    let q = secret.clone();
    assert_eq!(
        as_user(65534, 65534, || io(fs::set_permissions(
            &q,
            fs::Permissions::from_mode(0o666)
        ))),
        Err(libc::EPERM)
    );
    assert_eq!(mode(&secret), 0o600);
    chmod(&public, 0o644);
    let q = public.clone();
    assert_eq!(
        as_user(65534, 65534, || io(setxattr(&q, "user.x", b"1", 0))),
        Err(libc::EACCES)
    );
    let q = public.clone();
    assert_eq!(
        as_user(65534, 65534, || io(utimensat(&q, [(1, 0), (1, 0)], 0))),
        Err(libc::EPERM)
    );
    let q = public.clone();
    assert_eq!(
        as_user(65534, 65534, || io(utimensat(
            &q,
            [(0, libc::UTIME_NOW), (0, libc::UTIME_NOW)],
            0
        ))),
        Err(libc::EACCES)
    );
    // With write permission, a non-owner may set the times to now, but not to a given time.
    chmod(&public, 0o666);
    let q = public.clone();
    assert_eq!(
        as_user(65534, 65534, || io(utimensat(
            &q,
            [(0, libc::UTIME_NOW), (0, libc::UTIME_NOW)],
            0
        ))),
        Ok(())
    );
    let q = public.clone();
    assert_eq!(
        as_user(65534, 65534, || io(utimensat(&q, [(1, 0), (1, 0)], 0))),
        Err(libc::EPERM)
    );
}

#[test]
fn sticky_directory_protects_other_users_files() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir(m.p("tmp")).unwrap();
    chmod(&m.p("tmp"), 0o1777);
    let t = m.p("tmp");
    let d = t.clone();
    assert_eq!(
        as_user(1000, 1000, || io(fs::write(d.join("mine"), b"1000's"))),
        Ok(())
    );
    let d = t.clone();
    assert_eq!(
        as_user(1001, 1001, || io(fs::remove_file(d.join("mine")))),
        Err(libc::EPERM)
    );
    let d = t.clone();
    assert_eq!(
        as_user(1001, 1001, || io(fs::rename(
            d.join("mine"),
            d.join("stolen")
        ))),
        Err(libc::EPERM)
    );
    // Nor replace it by renaming over it.
    let d = t.clone();
    assert_eq!(
        as_user(1001, 1001, || {
            io(fs::write(d.join("theirs"), b"1001's"))?;
            io(fs::rename(d.join("theirs"), d.join("mine")))
        }),
        Err(libc::EPERM)
    );
    assert_eq!(fs::read(m.p("tmp/mine")).unwrap(), b"1000's");
    // Their own files they may delete; the owner may delete its own.
    let d = t.clone();
    assert_eq!(
        as_user(1001, 1001, || io(fs::remove_file(d.join("theirs")))),
        Ok(())
    );
    let d = t.clone();
    assert_eq!(
        as_user(1000, 1000, || io(fs::rename(
            d.join("mine"),
            d.join("mine2")
        ))),
        Ok(())
    );
    let d = t.clone();
    assert_eq!(
        as_user(1000, 1000, || io(fs::remove_file(d.join("mine2")))),
        Ok(())
    );
    assert!(names(&t).is_empty());

    // The owner of a sticky directory may delete anything in it.
    fs::create_dir(m.p("owned")).unwrap();
    std::os::unix::fs::chown(m.p("owned"), Some(1002), Some(1002)).unwrap();
    chmod(&m.p("owned"), 0o1777);
    let d = m.p("owned");
    assert_eq!(
        as_user(1000, 1000, || io(fs::write(d.join("f"), b"x"))),
        Ok(())
    );
    let d = m.p("owned");
    assert_eq!(
        as_user(1001, 1001, || io(fs::remove_file(d.join("f")))),
        Err(libc::EPERM)
    );
    let d = m.p("owned");
    assert_eq!(
        as_user(1002, 1002, || io(fs::remove_file(d.join("f")))),
        Ok(())
    );

    // Without the sticky bit, anyone with write permission on the directory may delete.
    fs::create_dir(m.p("open")).unwrap();
    chmod(&m.p("open"), 0o777);
    let d = m.p("open");
    assert_eq!(
        as_user(1000, 1000, || io(fs::write(d.join("f"), b"x"))),
        Ok(())
    );
    let d = m.p("open");
    assert_eq!(
        as_user(1001, 1001, || io(fs::remove_file(d.join("f")))),
        Ok(())
    );
}

#[test]
fn setgid_directory_passes_its_group() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let d = m.p("shared");
    fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(0), Some(4242)).unwrap();
    chmod(&d, 0o2777);
    assert_eq!(mode(&d), 0o2777);

    // Created by root: the directory's group.
    fs::write(d.join("rootfile"), b"x").unwrap();
    assert_eq!(fs::metadata(d.join("rootfile")).unwrap().gid(), 4242);
    fs::create_dir(d.join("rootsub")).unwrap();
    let md = fs::metadata(d.join("rootsub")).unwrap();
    assert_eq!(md.gid(), 4242);
    assert_ne!(md.mode() & libc::S_ISGID, 0, "subdirectory lacks setgid");

    // Created by another user: the directory's group, not the user's.
    let q = d.clone();
    assert_eq!(
        as_user(1000, 1000, || {
            io(fs::write(q.join("userfile"), b"x"))?;
            io(fs::create_dir(q.join("usersub")))?;
            io(fs::write(q.join("usersub/deeper"), b"y"))
        }),
        Ok(())
    );
    let md = fs::metadata(d.join("userfile")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 4242));
    assert_eq!(
        md.mode() & libc::S_ISGID,
        0,
        "a plain file must not get setgid"
    );
    let md = fs::metadata(d.join("usersub")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 4242));
    assert_ne!(md.mode() & libc::S_ISGID, 0);
    assert_eq!(fs::metadata(d.join("usersub/deeper")).unwrap().gid(), 4242);

    // Outside the setgid directory: the creator's group.
    fs::create_dir(m.p("plain")).unwrap();
    chmod(&m.p("plain"), 0o777);
    let q = m.p("plain/f");
    assert_eq!(as_user(1000, 1000, || io(fs::write(&q, b"x"))), Ok(()));
    assert_eq!(fs::metadata(m.p("plain/f")).unwrap().gid(), 1000);
}

#[test]
fn writing_clears_setuid_as_linux_does() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("prog");
    fs::write(&p, b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
    chmod(&p, 0o6755);
    assert_eq!(mode(&p), 0o6755);
    // Written by its non-root owner: setuid goes, and setgid (the group may execute).
    let q = p.clone();
    assert_eq!(
        as_user(1000, 1000, || {
            let f = io(OpenOptions::new().append(true).open(&q))?;
            io((&f).write_all(b"echo hi\n"))
        }),
        Ok(())
    );
    assert_eq!(
        mode(&p),
        0o755,
        "write by the owner did not clear setuid/setgid"
    );
    assert_eq!(fs::read(&p).unwrap(), b"#!/bin/sh\necho hi\n");

    // Truncation by the owner clears it too.
    chmod(&p, 0o4755);
    let q = p.clone();
    assert_eq!(
        as_user(1000, 1000, || io(
            nix::unistd::truncate(&q, 3).map_err(io::Error::from)
        )),
        Ok(())
    );
    assert_eq!(
        mode(&p),
        0o755,
        "truncate by the owner did not clear setuid"
    );
    assert_eq!(fs::metadata(&p).unwrap().len(), 3);

    // setgid without group-execute (not a real setgid) stays when the owner is in the group.
    chmod(&p, 0o2644);
    let q = p.clone();
    assert_eq!(
        as_user(1000, 1000, || {
            let f = io(OpenOptions::new().append(true).open(&q))?;
            io((&f).write_all(b"x"))
        }),
        Ok(())
    );
    assert_eq!(mode(&p), 0o2644);

    // Root (CAP_FSETID) writing keeps setuid.
    chmod(&p, 0o4755);
    OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(b"root")
        .unwrap();
    assert_eq!(mode(&p), 0o4755, "root's write cleared setuid");
}

#[test]
fn chown_and_chmod_rules_for_non_root() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("f");
    fs::write(&p, b"x").unwrap();
    std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
    chmod(&p, 0o644);

    // The owner may not give the file away...
    let q = p.clone();
    assert_eq!(
        as_user(1000, 1000, || io(std::os::unix::fs::chown(
            &q,
            Some(1001),
            None
        ))),
        Err(libc::EPERM)
    );
    // ... nor hand it to a group it is not in ...
    let q = p.clone();
    assert_eq!(
        as_user(1000, 1000, || io(std::os::unix::fs::chown(
            &q,
            None,
            Some(0)
        ))),
        Err(libc::EPERM)
    );
    // ... but may "change" to its own uid and to a group it is in.
    let q = p.clone();
    assert_eq!(
        as_user(1000, 2000, || io(std::os::unix::fs::chown(
            &q,
            Some(1000),
            Some(2000)
        ))),
        Ok(())
    );
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 2000));
    // Someone else may do nothing.
    let q = p.clone();
    assert_eq!(
        as_user(1001, 1001, || io(std::os::unix::fs::chown(
            &q,
            None,
            Some(1001)
        ))),
        Err(libc::EPERM)
    );
    let q = p.clone();
    assert_eq!(
        as_user(1001, 1001, || io(fs::set_permissions(
            &q,
            fs::Permissions::from_mode(0o777)
        ))),
        Err(libc::EPERM)
    );
    assert_eq!(mode(&p), 0o644);
    // The owner may chmod.
    let q = p.clone();
    assert_eq!(
        as_user(1000, 2000, || io(fs::set_permissions(
            &q,
            fs::Permissions::from_mode(0o4750)
        ))),
        Ok(())
    );
    assert_eq!(mode(&p), 0o4750);
    // setgid on a file of a group the owner is not in is silently dropped.
    let q = p.clone();
    assert_eq!(
        as_user(1000, 1000, || io(fs::set_permissions(
            &q,
            fs::Permissions::from_mode(0o2755)
        ))),
        Ok(())
    );
    assert_eq!(mode(&p), 0o755, "setgid kept for a non-member");
    // Root may change anything.
    std::os::unix::fs::chown(&p, Some(5), Some(6)).unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.uid(), md.gid()), (5, 6));
}

/// `cp -p` sets the times on the descriptor it wrote before closing it: the commit of the
/// writes at close must not put the write time back.
#[test]
fn times_set_on_a_written_descriptor_survive_its_close() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("copied");
    let mut f = File::create(&p).unwrap();
    f.write_all(&pattern(300_000, 5)).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: 1_500_000_000,
            tv_nsec: 7,
        },
        libc::timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 123_456_789,
        },
    ];
    cvt(unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) }).unwrap();
    drop(f);
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123_456_789));
    assert_eq!(md.len(), 300_000);
    m.unmount();
    let m = vol.mount();
    let md = fs::metadata(m.p("copied")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123_456_789));
    assert_eq!(fs::read(m.p("copied")).unwrap(), pattern(300_000, 5));
}

/// The handle of `p` (name_to_handle_at), as a buffer holding a `struct file_handle`.
fn file_handle(p: &Path) -> Vec<u8> {
    let mut buf = vec![0u8; 8 + 128];
    buf[..4].copy_from_slice(&128u32.to_ne_bytes());
    let mut mount_id = 0;
    let c = cpath(p);
    // SAFETY: buf holds a file_handle header with room for 128 bytes of handle, as its
    // handle_bytes says; c is a NUL-terminated path.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            buf.as_mut_ptr().cast::<libc::file_handle>(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
    buf
}

/// Opens a file handle made by [`file_handle`] on the mount of `root`.
fn open_by_handle(root: &File, handle: &mut [u8], flags: i32) -> io::Result<File> {
    // SAFETY: handle is a file_handle filled by name_to_handle_at.
    let fd = unsafe {
        libc::open_by_handle_at(
            root.as_raw_fd(),
            handle.as_mut_ptr().cast::<libc::file_handle>(),
            flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// File handles (what NFS re-export and backup tools use) still open their file after the
/// kernel forgot every inode; unknown ioctls are ENOTTY, and lsattr's flags read as none.
#[test]
fn file_handles_open_after_the_kernel_forgets_and_ioctls_answer() {
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/f"), b"by handle").unwrap();
    let (mut hf, mut hd) = (file_handle(&m.p("d/f")), file_handle(&m.p("d")));
    let root = File::open(&m.path).unwrap();
    // Forget the cached names and inodes (the mount's root stays, held open).
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let mut f = open_by_handle(&root, &mut hf, libc::O_RDONLY).expect("open_by_handle_at file");
    let mut got = String::new();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "by handle");
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let d = open_by_handle(&root, &mut hd, libc::O_RDONLY | libc::O_DIRECTORY)
        .expect("open_by_handle_at directory");
    let names = names(Path::new(&format!("/proc/self/fd/{}", d.as_raw_fd())));
    assert!(names.contains("f"), "{names:?}");

    // FS_IOC_GETFLAGS: no flags; an ioctl of another file system: ENOTTY.
    let mut flags: libc::c_int = -1;
    // SAFETY: FS_IOC_GETFLAGS writes an int into flags.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x8008_6601u64 as _, &mut flags) };
    assert_eq!(r, 0, "FS_IOC_GETFLAGS: {}", io::Error::last_os_error());
    assert_eq!(flags, 0);
    // SAFETY: an ioctl number no file system knows, with no argument.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x8004_7aff_u64 as _, 0) };
    assert_eq!(r, -1);
    assert_eq!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTTY)
    );
    assert!(
        !m.log_text().contains("Not Implemented"),
        "{}",
        tail(&m.log_text(), 5)
    );
}

/// An overlayfs mount, unmounted when dropped (the test's failure included).
struct Overlay(PathBuf);

impl Drop for Overlay {
    fn drop(&mut self) {
        let p = cpath(&self.0);
        // SAFETY: a plain umount2 of a path we mounted.
        unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
    }
}

/// renameat2(RENAME_WHITEOUT) leaves a whiteout (a character device 0:0) under the old name,
/// so an overlayfs whose upper layer lives on unkai deletes and renames lower files (was
/// EINVAL). O_TMPFILE and FIEMAP say what FUSE lets them say (see docs/design.md).
#[test]
fn rename_whiteout_leaves_a_whiteout_for_overlayfs() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("a"), b"moved").unwrap();
    renameat2(&m.p("a"), &m.p("b"), libc::RENAME_WHITEOUT).expect("RENAME_WHITEOUT");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"moved");
    let w = fs::symlink_metadata(m.p("a")).expect("a whiteout under the old name");
    assert!(w.file_type().is_char_device(), "{:?}", w.file_type());
    assert_eq!((w.rdev(), w.mode() & 0o7777), (0, 0));
    expect_errno(
        renameat2(
            &m.p("b"),
            &m.p("a"),
            libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE,
        ),
        libc::EINVAL,
    );

    // overlayfs with its upper layer on the mount: deleting and renaming lower files.
    let tmp = tempfile::tempdir().unwrap();
    let (lower, merged) = (tmp.path().join("lower"), tmp.path().join("merged"));
    fs::create_dir(&lower).unwrap();
    fs::create_dir(&merged).unwrap();
    fs::create_dir(m.p("upper")).unwrap();
    fs::create_dir(m.p("work")).unwrap();
    fs::write(lower.join("gone"), b"lower").unwrap();
    fs::write(lower.join("old"), b"renamed").unwrap();
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        m.p("upper").display(),
        m.p("work").display()
    );
    let (src, target, fstype, data) = (
        CString::new("overlay").unwrap(),
        cpath(&merged),
        CString::new("overlay").unwrap(),
        CString::new(opts).unwrap(),
    );
    // SAFETY: mount(2) with valid C strings.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    if r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENODEV) {
        eprintln!("no overlayfs in this kernel: its part of the test is skipped");
        return;
    }
    cvt(r).expect("mount overlayfs over the mount");
    let ov = Overlay(merged.clone());
    fs::remove_file(merged.join("gone")).unwrap();
    fs::rename(merged.join("old"), merged.join("new")).unwrap();
    fs::write(merged.join("added"), b"upper").unwrap();
    assert_eq!(names(&merged), strs(&["added", "new"]));
    assert_eq!(fs::read(merged.join("new")).unwrap(), b"renamed");
    drop(ov);
    for name in ["gone", "old"] {
        let w = fs::symlink_metadata(m.p("upper").join(name)).unwrap();
        assert!(w.file_type().is_char_device() && w.rdev() == 0, "{name}");
    }
    // The lower layer is untouched; a fresh overlay sees the same.
    assert_eq!(names(&lower), strs(&["gone", "old"]));

    // O_TMPFILE: the kernel asks FUSE_TMPFILE, which fuser does not pass on; programs get
    // EOPNOTSUPP and fall back to a named file. FIEMAP never reaches a FUSE server: the
    // kernel answers EOPNOTSUPP (SEEK_DATA and SEEK_HOLE give holes and data instead).
    let dir = cpath(&m.path);
    // SAFETY: open(2) of a directory path with O_TMPFILE.
    let fd = unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) };
    expect_errno(cvt(fd), libc::EOPNOTSUPP);
    let f = File::open(m.p("b")).unwrap();
    let mut fiemap = [0u64; 4]; // struct fiemap's 32-byte header, asking for no extents
    fiemap[1] = u64::MAX; // fm_length
    // SAFETY: FS_IOC_FIEMAP reads and writes the 32-byte header.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0xc020_660bu64 as _, fiemap.as_mut_ptr()) };
    expect_errno(cvt(r), libc::EOPNOTSUPP);
}

fn strs(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// st_blocks counts the bytes a file really stores: holes are not (du of a sparse file was
/// its size), and a written file counts its writes before they are committed.
#[test]
fn st_blocks_count_what_is_stored_not_holes() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let used = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    // 1.69 MB with 50 KB written in five pieces.
    let f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(m.p("sparse"))
        .unwrap();
    for i in 0..5u64 {
        f.write_all_at(&[7u8; 10_000], i * 420_000).unwrap();
    }
    // Writes pending here count. With the kernel's writeback cache (the default for a mount
    // alone) they are in the kernel's pages, which it does not ask us to count: from fsync on.
    if !m.log_text().contains("writeback cache on") {
        assert!(used(&m.p("sparse")) >= 50_000, "pending writes count");
    }
    f.sync_all().unwrap();
    drop(f);
    let (size, stored) = (
        fs::metadata(m.p("sparse")).unwrap().len(),
        used(&m.p("sparse")),
    );
    assert_eq!(size, 1_690_000);
    assert!(
        (50_000..=64 * 1024).contains(&stored),
        "{stored} bytes for 50 KB written"
    );
    // A hole punched: less; a file written whole: all of it.
    let f = OpenOptions::new().write(true).open(m.p("sparse")).unwrap();
    // SAFETY: fallocate on an open descriptor.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            10_000,
        )
    };
    cvt(r).unwrap();
    drop(f);
    let after = used(&m.p("sparse"));
    assert!(
        after <= stored - 9_000,
        "{after} after punching 10 KB out of {stored}"
    );
    fs::write(m.p("dense"), vec![1u8; 300_000]).unwrap();
    assert!((300_000..=300_000 + 4096).contains(&used(&m.p("dense"))));
    // What du reports, through another mount's eyes too.
    let m2 = vol.mount();
    assert_eq!(used(&m2.p("sparse")), after);
}

/// A range reserved with fallocate counts as stored, as on ext4 (its unwritten extents):
/// `du` of a preallocated file shows its size, writing into it grows nothing, a reservation
/// past the end (FALLOC_FL_KEEP_SIZE) counts too, a zeroed range stays allocated, and a
/// punched hole is freed. (Was: a preallocated file stored nothing, and writing into it
/// "grew" it.) Kept across compaction and remounts.
#[test]
fn fallocated_ranges_count_as_stored() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let used = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    let mib = 1u64 << 20;
    let f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(m.p("pre"))
        .unwrap();
    fallocate(&f, 0, 0, mib).unwrap();
    assert_eq!(f.metadata().unwrap().len(), mib);
    assert_eq!(used(&m.p("pre")), mib, "a preallocated MiB");
    let du = std::process::Command::new("du")
        .args(["-k", m.p("pre").to_str().unwrap()])
        .output()
        .unwrap();
    let du = String::from_utf8_lossy(&du.stdout).into_owned();
    assert!(du.starts_with("1024\t"), "du -k: {du}");
    // Written into (and compacted: many small writes): still one MiB.
    for i in 0..40u64 {
        f.write_all_at(&[i as u8 + 1; 4096], i * 20_000).unwrap();
    }
    f.sync_all().unwrap();
    assert_eq!(used(&m.p("pre")), mib, "writes into the reservation");
    // Past the end, with the size kept: counted, the size as it was.
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, mib, mib).unwrap();
    assert_eq!(f.metadata().unwrap().len(), mib);
    assert_eq!(used(&m.p("pre")), 2 * mib, "reserved past the end");
    // Zeroed: still allocated; punched: freed.
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 0, 64 << 10).unwrap();
    assert_eq!(used(&m.p("pre")), 2 * mib, "a zeroed range");
    let mut head = vec![1u8; 64 << 10];
    f.read_exact_at(&mut head, 0).unwrap();
    assert!(head.iter().all(|b| *b == 0), "zeroed");
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        0,
        128 << 10,
    )
    .unwrap();
    assert_eq!(used(&m.p("pre")), 2 * mib - (128 << 10), "a hole punched");
    // The data written stays what it was.
    let mut b = vec![0u8; 4096];
    f.read_exact_at(&mut b, 39 * 20_000).unwrap();
    assert!(b.iter().all(|x| *x == 40));
    drop(f);
    let before = used(&m.p("pre"));
    // Cutting the file frees what lies past its new end, reservations included.
    fs::OpenOptions::new()
        .write(true)
        .open(m.p("pre"))
        .unwrap()
        .set_len(mib / 2)
        .unwrap();
    assert_eq!(used(&m.p("pre")), mib / 2 - (128 << 10), "after truncate");
    m.unmount();
    let m = vol.mount();
    assert_eq!(used(&m.p("pre")), mib / 2 - (128 << 10), "after a remount");
    assert!(before > mib);
    // fsck agrees with what is counted.
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
}

/// `statx` cannot report the chattr flags of a FUSE file: the kernel asks FUSE servers for
/// statx only for what getattr lacks (the birth time), and keeps nothing of their answer's
/// `stx_attributes` (Linux 6.18, fs/fuse/dir.c); fuser 0.18 does not answer FUSE_STATX
/// anyway. So `stx_attributes` has none of APPEND, IMMUTABLE, NODUMP, and
/// `stx_attributes_mask` says so: those bits are not supported here, rather than not set.
/// lsattr (FS_IOC_GETFLAGS) shows them, and `chattr +d` (nodump) is taken like +a and +i.
#[test]
fn statx_says_it_does_not_know_the_chattr_flags_and_lsattr_shows_them() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    let statx = |p: &Path| {
        // SAFETY: an all-zero statx is a valid buffer; statx(2) fills it.
        let mut sx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: a valid path and buffer.
        let r = unsafe {
            libc::statx(
                libc::AT_FDCWD,
                cpath(p).as_ptr(),
                0,
                libc::STATX_BASIC_STATS | libc::STATX_BTIME,
                &mut sx,
            )
        };
        cvt(r).unwrap();
        (sx.stx_attributes, sx.stx_attributes_mask)
    };
    let chattr_bits =
        (libc::STATX_ATTR_APPEND | libc::STATX_ATTR_IMMUTABLE | libc::STATX_ATTR_NODUMP) as u64;
    for (flag, shown) in [("+d", "------d"), ("+a", "-----ad"), ("+i", "----iad")] {
        let (ok, out) = tool("chattr", &[&f], flag);
        assert!(ok, "chattr {flag}: {out}");
        let (ok, out) = tool("lsattr", &[&f], "-d");
        assert!(ok && out.starts_with(shown), "lsattr after {flag}: {out}");
        let (attrs, mask) = statx(&f);
        assert_eq!(attrs & chattr_bits, 0, "statx after {flag}: {attrs:#x}");
        assert_eq!(mask & chattr_bits, 0, "statx claims to know: {mask:#x}");
    }
    tool("chattr", &[&f], "-i");
    tool("chattr", &[&f], "-a");
    let (ok, out) = tool("chattr", &[&f], "-d");
    assert!(ok, "chattr -d: {out}");
    let (_, out) = tool("lsattr", &[&f], "-d");
    assert!(out.starts_with("-------"), "{out}");
    // nodump on a directory, and by the owner who is not root.
    let d = m.p("d");
    fs::create_dir(&d).unwrap();
    assert!(tool("chattr", &[&d], "+d").0);
    let (_, out) = tool("lsattr", &[&d], "-d");
    assert!(out.starts_with("------d"), "{out}");
    let own = m.p("own");
    fs::write(&own, b"").unwrap();
    std::os::unix::fs::chown(&own, Some(65534), Some(65534)).unwrap();
    let r = as_user(65534, 65534, || {
        let flags: libc::c_int = 0x40; // FS_NODUMP_FL
        let fd = File::open(&own).map_err(|e| errno(&e))?;
        // SAFETY: FS_IOC_SETFLAGS reads an int.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), 0x4008_6602u64 as _, &flags) };
        if r < 0 {
            Err(errno(&io::Error::last_os_error()))
        } else {
            Ok(())
        }
    });
    assert_eq!(r, Ok(()), "nodump by its owner");
    let (_, out) = tool("lsattr", &[&own], "-d");
    assert!(out.starts_with("------d"), "{out}");
}

/// Runs a tool; its status and what it printed.
fn tool(prog: &str, args: &[&Path], flag: &str) -> (bool, String) {
    let out = std::process::Command::new(prog)
        .arg(flag)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// chattr +i and +a (e2fsprogs' own tools) hold as on ext4: an immutable file takes no
/// change at all, an append-only one only appends; lsattr shows them (was EOPNOTSUPP).
#[test]
fn chattr_immutable_and_append_only_hold() {
    setup();
    let vol = Volume::new();
    let m = vol.mount();
    let f = m.p("f");
    fs::write(&f, b"kept\n").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/in"), b"x").unwrap();

    let (ok, out) = tool("chattr", &[&f], "+i");
    assert!(ok, "chattr +i: {out}");
    let (ok, out) = tool("lsattr", &[&f], "-d");
    assert!(ok && out.starts_with("----i"), "lsattr: {out}");
    let eperm = |r: io::Result<()>| expect_errno(r, libc::EPERM);
    eperm(OpenOptions::new().append(true).open(&f).map(drop));
    eperm(OpenOptions::new().write(true).open(&f).map(drop));
    eperm(fs::remove_file(&f));
    eperm(fs::rename(&f, m.p("g")));
    eperm(fs::hard_link(&f, m.p("h")));
    eperm(fs::set_permissions(&f, fs::Permissions::from_mode(0o600)));
    eperm(setxattr(&f, "user.x", b"1", 0));
    assert_eq!(fs::read(&f).unwrap(), b"kept\n", "reads still work");

    tool("chattr", &[&f], "-i");
    let (ok, out) = tool("chattr", &[&f], "+a");
    assert!(ok, "chattr +a: {out}");
    let mut a = OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b"more\n").unwrap();
    drop(a);
    eperm(OpenOptions::new().write(true).open(&f).map(drop));
    let cf = cpath(&f);
    // SAFETY: open(2) of a valid path; closed at once if it opened.
    let fd = unsafe { libc::open(cf.as_ptr(), libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC) };
    if fd >= 0 {
        unsafe { libc::close(fd) };
    }
    eperm(cvt(fd).map(drop));
    // SAFETY: truncate(2) of a valid path.
    eperm(cvt(unsafe { libc::truncate(cf.as_ptr(), 0) }).map(drop));
    eperm(fs::remove_file(&f));
    assert_eq!(fs::read(&f).unwrap(), b"kept\nmore\n");

    // A directory: immutable takes no names; append-only keeps its names.
    let d = m.p("d");
    assert!(tool("chattr", &[&d], "+i").0);
    eperm(fs::write(m.p("d/new"), b"").map(drop));
    eperm(fs::remove_file(m.p("d/in")));
    tool("chattr", &[&d], "-i");
    assert!(tool("chattr", &[&d], "+a").0);
    fs::write(m.p("d/new"), b"").unwrap();
    eperm(fs::remove_file(m.p("d/in")));

    // Cleared, all goes; the flags are the volume's, seen from another mount.
    let m2 = vol.mount();
    let (ok, out) = tool("lsattr", &[&m2.p("f")], "-d");
    assert!(
        ok && out.starts_with("-----a"),
        "lsattr on another mount: {out}"
    );
    tool("chattr", &[&f, &d], "-a");
    fs::remove_file(&f).unwrap();
    fs::remove_file(m.p("d/in")).unwrap();
}
