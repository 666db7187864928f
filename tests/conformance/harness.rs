//! The conformance harness: where a family of cases runs (a fresh unkai mount, or a local
//! directory on the host's own file system as the reference), how a case runs (its own fresh
//! directory; a failure is recorded with the case's name and the run goes on), and the helpers
//! the cases share: running as another user, creating each type of file, errno assertions,
//! long names and paths, and the path-resolution errors every path-taking call has in common.

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::fmt::{Debug, Display};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use crate::common;
use crate::sys::{self, R, St, Ts};

/// uid/gid "nobody", the main unprivileged user of the cases.
pub const NOBODY: u32 = 65534;
/// A second unprivileged user (and group), as pjdfstest uses.
pub const OTHER: u32 = 65533;
/// Further groups for group-membership cases.
pub const G3: u32 = 65532;
pub const G4: u32 = 65531;

pub const NAME_MAX: usize = 255;
pub const PATH_MAX: usize = 4096;

// ---------------------------------------------------------------------------------------------
// Process-wide setup.

thread_local! {
    /// Set while a case runs on this thread: panics are recorded, not printed.
    static IN_CASE: Cell<bool> = const { Cell::new(false) };
    /// Where the last recorded panic happened.
    static PANIC_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Families run one at a time: a forked child (as_user) inherits every open descriptor of the
/// process and closes them when it exits, which on a FUSE mount is a FLUSH of those files.
/// Run in parallel, one family's children would flush another family's files at random
/// moments; the `write` family exercises that interplay on purpose, deterministically.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Set while a family runs on a file system whose timestamps are coarse (a local one without
/// multigrain timestamps, or a mount with the kernel's writeback cache): `st`/`lst` then wait
/// a clock tick so that a following change is visible.
static COARSE_LOCAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether two changes in a row can get the same ctime on the file system of `dir`.
fn coarse_timestamps(dir: &Path) -> bool {
    let f = dir.join(".probe");
    if make(Reg, &f).is_err() {
        return true;
    }
    let coarse = (0..20).any(|i| {
        let a = sys::lstat(&f).map(|s| s.ctime);
        let _ = sys::chmod(&f, if i % 2 == 0 { 0o600 } else { 0o644 });
        a == sys::lstat(&f).map(|s| s.ctime)
    });
    let _ = sys::unlink(&f);
    coarse
}

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Modes in the cases are exact (as pjdfstest's fstest runs them): no umask.
        unsafe { libc::umask(0) };
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_CASE.with(|c| c.get()) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                PANIC_AT.with(|p| *p.borrow_mut() = Some(at));
            } else {
                prev(info);
            }
        }));
    });
}

// ---------------------------------------------------------------------------------------------
// Where a family runs.

/// A family of cases: one directory on one file system, failures collected.
pub struct Env {
    family: &'static str,
    root: PathBuf,
    /// Running on an unkai mount (false: on the host's local file system, the reference).
    pub fuse: bool,
    /// A directory on another file system (for EXDEV), if there is one.
    pub other_fs: Option<PathBuf>,
    /// Give each case a fresh directory (false on a read-only mount: cases share the root).
    fresh: bool,
    count: Cell<u32>,
    failures: RefCell<Vec<String>>,
}

/// The fresh directory of one case (mode 0755, owned by root).
pub struct Dir {
    pub path: PathBuf,
    pub fuse: bool,
    pub other_fs: Option<PathBuf>,
}

impl Dir {
    /// A path inside the case's directory.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }
}

impl Env {
    /// Runs one case in a fresh directory; a failure is recorded and the family goes on.
    pub fn case(&self, name: &str, f: impl FnOnce(&Dir)) {
        let n = self.count.get() + 1;
        self.count.set(n);
        let path = if self.fresh {
            self.root.join(format!("c{n:03}"))
        } else {
            self.root.clone()
        };
        let made = if self.fresh {
            sys::mkdir(&path, 0o755)
        } else {
            Ok(())
        };
        if let Err(e) = made {
            self.failures.borrow_mut().push(format!(
                "{}: {name}: could not create the case directory: {}",
                self.family,
                errname(e)
            ));
            return;
        }
        let d = Dir {
            path,
            fuse: self.fuse,
            other_fs: self.other_fs.clone(),
        };
        IN_CASE.with(|c| c.set(true));
        let res = catch_unwind(AssertUnwindSafe(|| f(&d)));
        IN_CASE.with(|c| c.set(false));
        if let Err(payload) = res {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            let at = PANIC_AT.with(|p| p.borrow_mut().take()).unwrap_or_default();
            self.failures
                .borrow_mut()
                .push(format!("{}: {name}: {msg}  [{at}]", self.family));
        }
    }

    fn finish(&self) {
        let failures = self.failures.borrow();
        let total = self.count.get();
        let where_ = if self.fuse {
            "unkai"
        } else {
            "local reference"
        };
        println!(
            "{} on {where_}: {} of {total} cases passed",
            self.family,
            total as usize - failures.len()
        );
        if !failures.is_empty() {
            panic!(
                "{} of {total} {} cases failed on {where_}:\n  - {}",
                failures.len(),
                self.family,
                failures.join("\n  - ")
            );
        }
    }
}

/// Runs a family on a freshly formatted and mounted unkai volume (unmounted at the end,
/// failure included).
pub fn run_on_unkai(family: &'static str, f: fn(&Env)) {
    init();
    let _serial = serial();
    let vol = common::Volume::new();
    let m = vol.mount();
    let root = m.p(family);
    sys::mkdir(&root, 0o755).expect("family directory on the mount");
    let other = tempfile::Builder::new()
        .prefix("unkai-conf-other-")
        .tempdir()
        .expect("tempdir");
    let env = Env {
        family,
        root,
        fuse: true,
        other_fs: Some(other.path().to_path_buf()),
        fresh: true,
        count: Cell::new(0),
        failures: RefCell::new(Vec::new()),
    };
    // With the kernel's writeback cache (the default for a mount alone) the kernel stamps a
    // cached file's times with its coarse clock, and so does unkai (one clock, no step back):
    // two changes within a tick get the same time, as on a local file system without
    // multigrain timestamps.
    let coarse = coarse_timestamps(&env.root);
    if coarse {
        println!("{family}: the mount has coarse timestamps: stat waits a tick");
    }
    COARSE_LOCAL.store(coarse, std::sync::atomic::Ordering::Relaxed);
    f(&env);
    COARSE_LOCAL.store(false, std::sync::atomic::Ordering::Relaxed);
    drop(m);
    env.finish();
}

/// Runs a family on the host's local file system: the reference the cases are checked against
/// (a case failing here is a wrong expectation, not an unkai bug).
pub fn run_on_local(family: &'static str, f: fn(&Env)) {
    init();
    let _serial = serial();
    let tmp = tempfile::Builder::new()
        .prefix("unkai-conf-")
        .tempdir()
        .expect("tempdir");
    sys::chmod(tmp.path(), 0o755).unwrap();
    let root = tmp.path().join(family);
    sys::mkdir(&root, 0o755).unwrap();
    // Another file system for EXDEV: /dev/shm (tmpfs) when it is one.
    let shm = tempfile::Builder::new()
        .prefix("unkai-conf-other-")
        .tempdir_in("/dev/shm")
        .ok();
    let env = Env {
        family,
        root,
        fuse: false,
        other_fs: shm.as_ref().map(|t| t.path().to_path_buf()),
        fresh: true,
        count: Cell::new(0),
        failures: RefCell::new(Vec::new()),
    };
    let coarse = coarse_timestamps(&env.root);
    if coarse {
        println!("{family}: the local file system has coarse timestamps: stat waits a tick");
    }
    COARSE_LOCAL.store(coarse, std::sync::atomic::Ordering::Relaxed);
    f(&env);
    COARSE_LOCAL.store(false, std::sync::atomic::Ordering::Relaxed);
    env.finish();
}

/// Runs cases that share one existing directory `root` (on a mount set up by the caller, e.g.
/// read-only) and reports like the other families.
/// The caller holds [`serial`].
pub fn run_in(family: &'static str, root: PathBuf, f: impl FnOnce(&Env)) {
    init();
    let env = Env {
        family,
        root,
        fuse: true,
        other_fs: None,
        fresh: false,
        count: Cell::new(0),
        failures: RefCell::new(Vec::new()),
    };
    f(&env);
    env.finish();
}

// ---------------------------------------------------------------------------------------------
// Other users.

/// errno reported when a closure panicked in a child.
pub const CHILD_PANIC: i32 = 254;
/// What a child closure returns when a check of its own (not a call) failed.
pub const MISMATCH: i32 = 200;

/// Runs `f` as uid/gid (the only group) through the shared harness's `as_user`.
pub fn as_user(uid: u32, gid: u32, f: impl FnOnce() -> R<()>) -> R<()> {
    common::as_user(uid, gid, move || {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(CHILD_PANIC))
    })
}

/// Runs `f` as uid 65534, gid 65534.
pub fn as_nobody(f: impl FnOnce() -> R<()>) -> R<()> {
    as_user(NOBODY, NOBODY, f)
}

/// Runs `f` in a forked child as `uid` with `groups[0]` as gid and all of `groups` as the
/// supplementary groups, and with `umask` if given.
pub fn in_child(uid: u32, groups: &[u32], umask: Option<u32>, f: impl FnOnce() -> R<()>) -> R<()> {
    let gid = groups[0];
    match unsafe { libc::fork() } {
        -1 => panic!("fork failed"),
        0 => {
            let code = (|| {
                if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0
                    || unsafe { libc::setgid(gid) } != 0
                    || unsafe { libc::setuid(uid) } != 0
                {
                    return 255;
                }
                if let Some(m) = umask {
                    unsafe { libc::umask(m) };
                }
                match catch_unwind(AssertUnwindSafe(f)) {
                    Ok(Ok(())) => 0,
                    Ok(Err(e)) => e.clamp(1, 253),
                    Err(_) => CHILD_PANIC,
                }
            })();
            unsafe { libc::_exit(code) }
        }
        pid => {
            let mut status = 0;
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            assert_eq!(r, pid, "waitpid");
            assert!(libc::WIFEXITED(status), "child ended abnormally: {status}");
            match libc::WEXITSTATUS(status) {
                0 => Ok(()),
                255 => panic!("could not switch to uid {uid} groups {groups:?}"),
                c => Err(c),
            }
        }
    }
}

/// Runs `f` as root with the given umask (in a child: the umask is process-wide).
pub fn with_umask(umask: u32, f: impl FnOnce() -> R<()>) -> R<()> {
    in_child(0, &[0], Some(umask), f)
}

// ---------------------------------------------------------------------------------------------
// Assertions.

/// A readable name for an errno.
pub fn errname(e: i32) -> String {
    let n = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ETXTBSY => "ETXTBSY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EOVERFLOW => "EOVERFLOW",
        CHILD_PANIC => "(a panic in the child process)",
        MISMATCH => "(a check in the child process failed)",
        _ => "",
    };
    if n.is_empty() {
        format!("errno {e}")
    } else {
        n.to_string()
    }
}

/// Asserts success and returns the value.
#[track_caller]
pub fn ok<T>(r: R<T>, what: impl Display) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: expected success, got {}", errname(e)),
    }
}

/// Asserts failure with exactly `want`.
#[track_caller]
pub fn fails<T: Debug>(r: R<T>, want: i32, what: impl Display) {
    fails_any(r, &[want], what)
}

/// Asserts failure with one of `want`.
#[track_caller]
pub fn fails_any<T: Debug>(r: R<T>, want: &[i32], what: impl Display) {
    let names = want
        .iter()
        .map(|e| errname(*e))
        .collect::<Vec<_>>()
        .join(" or ");
    match r {
        Err(e) if want.contains(&e) => {}
        Err(e) => panic!("{what}: expected {names}, got {}", errname(e)),
        Ok(v) => panic!("{what}: expected {names}, but it succeeded ({v:?})"),
    }
}

/// Asserts that `after` is strictly later than `before`.
#[track_caller]
pub fn later(before: Ts, after: Ts, what: impl Display) {
    assert!(
        after > before,
        "{what}: expected a timestamp later than {before:?}, got {after:?}"
    );
}

/// Asserts that a timestamp did not change.
#[track_caller]
pub fn same(before: Ts, after: Ts, what: impl Display) {
    assert!(
        after == before,
        "{what}: expected the timestamp to stay {before:?}, got {after:?}"
    );
}

/// Asserts that a path does not exist (lstat gives ENOENT).
#[track_caller]
pub fn gone(p: impl AsRef<Path>, what: impl Display) {
    fails(sys::lstat(p.as_ref()), libc::ENOENT, what);
}

fn settle() {
    if COARSE_LOCAL.load(std::sync::atomic::Ordering::Relaxed) {
        tick();
    }
}

/// stat(2) that must succeed.
#[track_caller]
pub fn st(p: impl AsRef<Path>) -> St {
    settle();
    let p = p.as_ref();
    match sys::stat(p) {
        Ok(s) => s,
        Err(e) => panic!("stat {}: {}", p.display(), errname(e)),
    }
}

/// lstat(2) that must succeed.
#[track_caller]
pub fn lst(p: impl AsRef<Path>) -> St {
    settle();
    let p = p.as_ref();
    match sys::lstat(p) {
        Ok(s) => s,
        Err(e) => panic!("lstat {}: {}", p.display(), errname(e)),
    }
}

/// Lets the clock move on before an operation whose new timestamps are compared with
/// timestamps taken earlier: waits until the kernel's coarse clock, the one coarse
/// timestamps come from (the kernel's `current_time`, and unkai's under the writeback
/// cache), is past the precise time at the call, so that whatever is stamped from now on is
/// later than anything stamped before (the coarse clock moves every 1/HZ s, 4 ms at HZ=250,
/// and can lag further on an idle machine: waiting for it to change is not enough).
pub fn tick() {
    let read = |clock| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec to write to.
        let r = unsafe { libc::clock_gettime(clock, &mut t) };
        assert_eq!(r, 0, "clock_gettime({clock})");
        (t.tv_sec, t.tv_nsec)
    };
    let start = read(libc::CLOCK_REALTIME);
    while read(libc::CLOCK_REALTIME_COARSE) <= start {
        std::thread::sleep(Duration::from_micros(500));
    }
}

// ---------------------------------------------------------------------------------------------
// Files of each type.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Reg,
    Dir,
    Fifo,
    Blk,
    Chr,
    Sock,
    Symlink,
}

pub use Kind::*;

/// Every type pjdfstest loops over.
pub const ALL: [Kind; 7] = [Reg, Dir, Fifo, Blk, Chr, Sock, Symlink];
/// Every type but symlinks (for calls that follow symlinks).
pub const NOT_SYMLINK: [Kind; 6] = [Reg, Dir, Fifo, Blk, Chr, Sock];
/// Every type but directories (what link/unlink accept).
pub const NOT_DIR: [Kind; 6] = [Reg, Fifo, Blk, Chr, Sock, Symlink];
/// Types that are neither directories nor symlinks.
pub const PLAIN: [Kind; 5] = [Reg, Fifo, Blk, Chr, Sock];

impl Kind {
    /// The S_IFMT value of the type.
    pub fn fmt(self) -> u32 {
        match self {
            Reg => libc::S_IFREG,
            Dir => libc::S_IFDIR,
            Fifo => libc::S_IFIFO,
            Blk => libc::S_IFBLK,
            Chr => libc::S_IFCHR,
            Sock => libc::S_IFSOCK,
            Symlink => libc::S_IFLNK,
        }
    }
}

/// Creates a file of type `kind` the way pjdfstest's create_file does (files 0644, directories
/// 0755, devices 1,2, symlinks to "test").
pub fn make(kind: Kind, p: impl AsRef<Path>) -> R<()> {
    let p = p.as_ref();
    match kind {
        Reg => sys::open_close(p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
        Dir => sys::mkdir(p, 0o755),
        Fifo => sys::mkfifo(p, 0o644),
        Blk => sys::mknod(p, libc::S_IFBLK | 0o644, 1, 2),
        Chr => sys::mknod(p, libc::S_IFCHR | 0o644, 1, 2),
        Sock => sys::bind(p),
        Symlink => sys::symlink("test", p),
    }
}

/// `make` that must succeed.
#[track_caller]
pub fn create(kind: Kind, p: impl AsRef<Path>) {
    let p = p.as_ref();
    if let Err(e) = make(kind, p) {
        panic!("creating {kind:?} {}: {}", p.display(), errname(e));
    }
}

/// Creates a file of type `kind` owned by uid/gid.
#[track_caller]
pub fn create_owned(kind: Kind, p: impl AsRef<Path>, uid: u32, gid: u32) {
    let p = p.as_ref();
    create(kind, p);
    ok(sys::lchown(p, uid, gid), format!("lchown {}", p.display()));
}

/// Creates a regular file with `data`.
#[track_caller]
pub fn write_file(p: impl AsRef<Path>, data: &[u8]) {
    let p = p.as_ref();
    let fd = ok(
        sys::open(p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644),
        format!("create {}", p.display()),
    );
    let n = ok(sys::write(&fd, data), "write");
    assert_eq!(n, data.len(), "short write");
}

/// Reads a whole regular file.
#[track_caller]
pub fn read_file(p: impl AsRef<Path>) -> Vec<u8> {
    let p = p.as_ref();
    let fd = ok(
        sys::open(p, libc::O_RDONLY, 0),
        format!("open {}", p.display()),
    );
    let mut out = Vec::new();
    loop {
        let b = ok(sys::read(&fd, 1 << 20), "read");
        if b.is_empty() {
            return out;
        }
        out.extend_from_slice(&b);
    }
}

/// Removes whatever is at `p` (rmdir for directories, unlink otherwise).
pub fn remove(p: impl AsRef<Path>) -> R<()> {
    let p = p.as_ref();
    if sys::lstat(p)?.is_dir() {
        sys::rmdir(p)
    } else {
        sys::unlink(p)
    }
}

// ---------------------------------------------------------------------------------------------
// Long names and paths.

/// A name of `len` bytes (not containing '/').
pub fn name_of_len(len: usize, fill: char) -> String {
    std::iter::repeat_n(fill, len).collect()
}

/// Creates directories below `dir` and returns an absolute path of exactly PATH_MAX - 1 bytes
/// whose last component (not created) is at most 100 bytes long.
#[track_caller]
pub fn max_path(dir: &Path) -> PathBuf {
    let mut path = dir.to_string_lossy().into_owned();
    let mut remaining = PATH_MAX - 1 - path.len();
    let mut fill = b'a';
    while remaining > 101 {
        let c = NAME_MAX.min(remaining - 3);
        path.push('/');
        path.push_str(&name_of_len(c, fill as char));
        fill += 1;
        ok(sys::mkdir(&path, 0o755), "mkdir for a long path");
        remaining -= 1 + c;
    }
    path.push('/');
    path.push_str(&name_of_len(remaining - 1, 'z'));
    assert_eq!(path.len(), PATH_MAX - 1);
    PathBuf::from(path)
}

/// `p` with `s` appended to its last component.
pub fn append(p: &Path, s: &str) -> PathBuf {
    let mut o = p.as_os_str().to_owned();
    o.push(s);
    PathBuf::from(o)
}

// ---------------------------------------------------------------------------------------------
// The path-resolution errors every call taking a path has.

/// What must exist at the path for the call to succeed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    File,
    Dir,
    /// The call creates it.
    Nothing,
}

/// A path-taking call, for [`path_errors`].
pub struct PathOp<'a> {
    pub name: &'a str,
    pub needs: Needs,
    /// Whether the call follows a symlink in the last component.
    pub follows: bool,
    /// Setup as root in the case's directory before the call (e.g. a rename's source).
    pub prep: &'a dyn Fn(&Dir),
    /// The call on a path.
    pub op: &'a dyn Fn(&Dir, &Path) -> R<()>,
}

pub fn no_prep(_: &Dir) {}

#[track_caller]
fn provide(needs: Needs, p: &Path) {
    match needs {
        Needs::File => create(Reg, p),
        Needs::Dir => create(Dir, p),
        Needs::Nothing => {}
    }
}

/// ENAMETOOLONG (component and whole path, with the limits themselves working), ENOTDIR,
/// ENOENT, ELOOP and EACCES (search permission, as uid 65534) for one call.
pub fn path_errors(env: &Env, o: &PathOp) {
    let name = o.name;
    env.case(
        &format!("{name}: a name of NAME_MAX (255) bytes works"),
        |d| {
            (o.prep)(d);
            let p = d.p(&name_of_len(NAME_MAX, 'n'));
            provide(o.needs, &p);
            ok((o.op)(d, &p), "call on a 255-byte name");
            if o.needs == Needs::Nothing {
                lst(&p);
            }
        },
    );
    env.case(
        &format!("{name}: ENAMETOOLONG for a component of 256 bytes"),
        |d| {
            (o.prep)(d);
            let p = d.p(&name_of_len(NAME_MAX + 1, 'n'));
            fails((o.op)(d, &p), libc::ENAMETOOLONG, "call on a 256-byte name");
        },
    );
    env.case(
        &format!("{name}: a path of PATH_MAX - 1 bytes works"),
        |d| {
            (o.prep)(d);
            let p = max_path(&d.path);
            provide(o.needs, &p);
            ok((o.op)(d, &p), "call on a 4095-byte path");
        },
    );
    env.case(
        &format!("{name}: ENAMETOOLONG for a path of PATH_MAX bytes"),
        |d| {
            (o.prep)(d);
            let p = append(&max_path(&d.path), "x");
            fails(
                (o.op)(d, &p),
                libc::ENAMETOOLONG,
                "call on a 4096-byte path",
            );
        },
    );
    env.case(
        &format!("{name}: ENOTDIR when a path prefix is not a directory"),
        |d| {
            (o.prep)(d);
            for k in PLAIN {
                let f = d.p(&format!("{k:?}"));
                create(k, &f);
                fails(
                    (o.op)(d, &f.join("test")),
                    libc::ENOTDIR,
                    format!("call through a {k:?}"),
                );
            }
        },
    );
    env.case(
        &format!("{name}: ENOENT when a path prefix or the file is missing"),
        |d| {
            (o.prep)(d);
            fails(
                (o.op)(d, &d.p("missing/test")),
                libc::ENOENT,
                "missing prefix",
            );
            if o.needs != Needs::Nothing {
                fails((o.op)(d, &d.p("missing")), libc::ENOENT, "missing file");
                if o.follows {
                    ok(sys::symlink("nowhere", d.p("dangling")), "symlink");
                    fails(
                        (o.op)(d, &d.p("dangling")),
                        libc::ENOENT,
                        "dangling symlink",
                    );
                }
            }
        },
    );
    env.case(&format!("{name}: ELOOP on a symlink loop"), |d| {
        (o.prep)(d);
        ok(sys::symlink("loop2", d.p("loop1")), "symlink");
        ok(sys::symlink("loop1", d.p("loop2")), "symlink");
        fails(
            (o.op)(d, &d.p("loop1/test")),
            libc::ELOOP,
            "loop as a path prefix",
        );
        fails(
            (o.op)(d, &d.p("loop2/test")),
            libc::ELOOP,
            "loop as a path prefix",
        );
        if o.follows {
            fails((o.op)(d, &d.p("loop1")), libc::ELOOP, "loop as the file");
        }
    });
    env.case(
        &format!("{name}: EACCES without search permission on a prefix (uid 65534)"),
        |d| {
            (o.prep)(d);
            let sub = d.p("sub");
            ok(sys::mkdir(&sub, 0o755), "mkdir");
            ok(sys::chown(&sub, NOBODY, NOBODY), "chown");
            let p = sub.join("obj");
            provide(o.needs, &p);
            if o.needs != Needs::Nothing {
                ok(sys::lchown(&p, NOBODY, NOBODY), "chown");
            }
            ok(sys::chmod(&sub, 0o644), "chmod");
            fails(
                as_nobody(|| (o.op)(d, &p)),
                libc::EACCES,
                "call below a 0644 directory",
            );
            ok(sys::chmod(&sub, 0o755), "chmod");
        },
    );
}

// ---------------------------------------------------------------------------------------------
// A program being executed (for ETXTBSY).

/// A copy of `sleep` in `dir`, running until dropped.
pub struct Running {
    pub path: PathBuf,
    child: std::process::Child,
}

impl Running {
    #[track_caller]
    pub fn start(dir: &Path) -> Running {
        let path = dir.join("prog");
        let bin = std::fs::read("/bin/sleep").expect("read /bin/sleep");
        write_file(&path, &bin);
        ok(sys::chmod(&path, 0o755), "chmod the program");
        // spawn() returns once the exec has happened. A child forked meanwhile by another
        // test thread may briefly hold the descriptor that wrote the copy: retry ETXTBSY.
        let mut tries = 0;
        let child = loop {
            match std::process::Command::new(&path).arg("60").spawn() {
                Ok(c) => break c,
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("exec the copied program: {e}"),
            }
        };
        Running { path, child }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
