//! Thin wrappers over the system calls under test: each returns `Ok` or `Err(errno)`, never
//! panics (they run in forked children too), and does exactly one call, so that what is
//! asserted is what the kernel and the file system answered.

use crate::common::cpath;
use std::path::Path;

/// A result carrying the raw errno.
pub type R<T> = Result<T, i32>;

/// "Leave unchanged" for chown's uid and gid (-1).
pub const KEEP: u32 = u32::MAX;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn chk(r: libc::c_int) -> R<()> {
    if r == -1 { Err(errno()) } else { Ok(()) }
}

/// An open descriptor, closed on drop.
#[derive(Debug)]
pub struct Fd(pub i32);

impl Drop for Fd {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

/// A timestamp as stat reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ts {
    pub sec: i64,
    pub nsec: i64,
}

/// What stat/lstat/fstat report.
#[derive(Clone, Copy, Debug)]
pub struct St {
    pub mode: u32,
    pub ino: u64,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: i64,
    pub atime: Ts,
    pub mtime: Ts,
    pub ctime: Ts,
}

impl St {
    /// Permission bits with setuid/setgid/sticky.
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }
    /// The S_IFMT part.
    pub fn fmt(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.fmt() == libc::S_IFDIR
    }
    pub fn major(&self) -> u32 {
        libc::major(self.rdev)
    }
    pub fn minor(&self) -> u32 {
        libc::minor(self.rdev)
    }
}

fn st(s: &libc::stat) -> St {
    St {
        mode: s.st_mode,
        ino: s.st_ino,
        nlink: s.st_nlink,
        uid: s.st_uid,
        gid: s.st_gid,
        rdev: s.st_rdev,
        size: s.st_size,
        atime: Ts {
            sec: s.st_atime,
            nsec: s.st_atime_nsec,
        },
        mtime: Ts {
            sec: s.st_mtime,
            nsec: s.st_mtime_nsec,
        },
        ctime: Ts {
            sec: s.st_ctime,
            nsec: s.st_ctime_nsec,
        },
    }
}

pub fn stat(p: impl AsRef<Path>) -> R<St> {
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    chk(unsafe { libc::stat(cpath(p.as_ref()).as_ptr(), &mut s) })?;
    Ok(st(&s))
}

pub fn lstat(p: impl AsRef<Path>) -> R<St> {
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    chk(unsafe { libc::lstat(cpath(p.as_ref()).as_ptr(), &mut s) })?;
    Ok(st(&s))
}

pub fn fstat(fd: &Fd) -> R<St> {
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    chk(unsafe { libc::fstat(fd.0, &mut s) })?;
    Ok(st(&s))
}

pub fn open(p: impl AsRef<Path>, flags: i32, mode: u32) -> R<Fd> {
    let fd = unsafe { libc::open(cpath(p.as_ref()).as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 { Err(errno()) } else { Ok(Fd(fd)) }
}

/// open(2) and close at once, for checks that only care whether the open succeeds.
pub fn open_close(p: impl AsRef<Path>, flags: i32, mode: u32) -> R<()> {
    open(p, flags, mode).map(drop)
}

pub fn write(fd: &Fd, data: &[u8]) -> R<usize> {
    let n = unsafe { libc::write(fd.0, data.as_ptr().cast(), data.len()) };
    if n < 0 { Err(errno()) } else { Ok(n as usize) }
}

pub fn pwrite(fd: &Fd, data: &[u8], off: i64) -> R<usize> {
    let n = unsafe { libc::pwrite(fd.0, data.as_ptr().cast(), data.len(), off) };
    if n < 0 { Err(errno()) } else { Ok(n as usize) }
}

pub fn read(fd: &Fd, len: usize) -> R<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = unsafe { libc::read(fd.0, buf.as_mut_ptr().cast(), len) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn pread(fd: &Fd, len: usize, off: i64) -> R<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = unsafe { libc::pread(fd.0, buf.as_mut_ptr().cast(), len, off) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn lseek(fd: &Fd, off: i64, whence: i32) -> R<i64> {
    let r = unsafe { libc::lseek(fd.0, off, whence) };
    if r < 0 { Err(errno()) } else { Ok(r) }
}

pub fn chmod(p: impl AsRef<Path>, mode: u32) -> R<()> {
    chk(unsafe { libc::chmod(cpath(p.as_ref()).as_ptr(), mode) })
}

pub fn fchmod(fd: &Fd, mode: u32) -> R<()> {
    chk(unsafe { libc::fchmod(fd.0, mode) })
}

pub fn chown(p: impl AsRef<Path>, uid: u32, gid: u32) -> R<()> {
    chk(unsafe { libc::chown(cpath(p.as_ref()).as_ptr(), uid, gid) })
}

pub fn lchown(p: impl AsRef<Path>, uid: u32, gid: u32) -> R<()> {
    chk(unsafe { libc::lchown(cpath(p.as_ref()).as_ptr(), uid, gid) })
}

pub fn fchown(fd: &Fd, uid: u32, gid: u32) -> R<()> {
    chk(unsafe { libc::fchown(fd.0, uid, gid) })
}

pub fn truncate(p: impl AsRef<Path>, len: i64) -> R<()> {
    chk(unsafe { libc::truncate(cpath(p.as_ref()).as_ptr(), len) })
}

pub fn ftruncate(fd: &Fd, len: i64) -> R<()> {
    chk(unsafe { libc::ftruncate(fd.0, len) })
}

/// posix_fallocate(3) returns the error number instead of setting errno.
pub fn posix_fallocate(fd: &Fd, off: i64, len: i64) -> R<()> {
    match unsafe { libc::posix_fallocate(fd.0, off, len) } {
        0 => Ok(()),
        e => Err(e),
    }
}

pub fn fallocate(fd: &Fd, mode: i32, off: i64, len: i64) -> R<()> {
    chk(unsafe { libc::fallocate(fd.0, mode, off, len) })
}

pub fn link(from: impl AsRef<Path>, to: impl AsRef<Path>) -> R<()> {
    chk(unsafe { libc::link(cpath(from.as_ref()).as_ptr(), cpath(to.as_ref()).as_ptr()) })
}

pub fn linkat_follow(from: impl AsRef<Path>, to: impl AsRef<Path>) -> R<()> {
    chk(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            cpath(from.as_ref()).as_ptr(),
            libc::AT_FDCWD,
            cpath(to.as_ref()).as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

pub fn mkdir(p: impl AsRef<Path>, mode: u32) -> R<()> {
    chk(unsafe { libc::mkdir(cpath(p.as_ref()).as_ptr(), mode) })
}

pub fn mkfifo(p: impl AsRef<Path>, mode: u32) -> R<()> {
    chk(unsafe { libc::mkfifo(cpath(p.as_ref()).as_ptr(), mode) })
}

pub fn mknod(p: impl AsRef<Path>, mode: u32, major: u32, minor: u32) -> R<()> {
    let dev = libc::makedev(major, minor);
    chk(unsafe { libc::mknod(cpath(p.as_ref()).as_ptr(), mode, dev) })
}

pub fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> R<()> {
    chk(unsafe { libc::rename(cpath(from.as_ref()).as_ptr(), cpath(to.as_ref()).as_ptr()) })
}

pub fn renameat2(from: impl AsRef<Path>, to: impl AsRef<Path>, flags: u32) -> R<()> {
    let (a, b) = (cpath(from.as_ref()), cpath(to.as_ref()));
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == -1 { Err(errno()) } else { Ok(()) }
}

pub fn rmdir(p: impl AsRef<Path>) -> R<()> {
    chk(unsafe { libc::rmdir(cpath(p.as_ref()).as_ptr()) })
}

pub fn unlink(p: impl AsRef<Path>) -> R<()> {
    chk(unsafe { libc::unlink(cpath(p.as_ref()).as_ptr()) })
}

pub fn symlink(target: impl AsRef<Path>, p: impl AsRef<Path>) -> R<()> {
    chk(unsafe { libc::symlink(cpath(target.as_ref()).as_ptr(), cpath(p.as_ref()).as_ptr()) })
}

pub fn readlink(p: impl AsRef<Path>) -> R<Vec<u8>> {
    let mut buf = vec![0u8; 8192];
    let n = unsafe {
        libc::readlink(
            cpath(p.as_ref()).as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Creates a UNIX domain socket file by binding one (and closing it).
pub fn bind(p: impl AsRef<Path>) -> R<()> {
    std::os::unix::net::UnixListener::bind(p.as_ref())
        .map(drop)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

/// A `timespec` for utimensat: (seconds, nanoseconds); nanoseconds may be UTIME_NOW/OMIT.
pub type Time = (i64, i64);

pub const NOW: Time = (0, libc::UTIME_NOW);
pub const OMIT: Time = (0, libc::UTIME_OMIT);

fn timespecs(t: [Time; 2]) -> [libc::timespec; 2] {
    t.map(|(s, n)| libc::timespec {
        tv_sec: s,
        tv_nsec: n,
    })
}

/// utimensat(AT_FDCWD, p, times, flags); `None` passes a NULL `times` (both to now).
pub fn utimensat(p: impl AsRef<Path>, times: Option<[Time; 2]>, flags: i32) -> R<()> {
    let ts = times.map(timespecs);
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    chk(unsafe { libc::utimensat(libc::AT_FDCWD, cpath(p.as_ref()).as_ptr(), ptr, flags) })
}

pub fn futimens(fd: &Fd, times: [Time; 2]) -> R<()> {
    let ts = timespecs(times);
    chk(unsafe { libc::futimens(fd.0, ts.as_ptr()) })
}

pub fn access(p: impl AsRef<Path>, mode: i32) -> R<()> {
    chk(unsafe { libc::access(cpath(p.as_ref()).as_ptr(), mode) })
}
