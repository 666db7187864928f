//! Namespace model test: a seeded random sequence of namespace operations applied side by side
//! to a directory in the mount and to a directory on a local Linux file system (the model).
//!
//! Operations: create (O_EXCL or O_TRUNC, with content), append, truncate, mkdir, rename
//! (plain, RENAME_NOREPLACE, RENAME_EXCHANGE via renameat2), link, unlink, rmdir, symlink,
//! setxattr / removexattr (user.*, following symlinks or not), chmod. Paths come from a small
//! pool of names and depths, so that collisions (EEXIST, ENOTEMPTY, ENOTDIR, EISDIR, EINVAL,
//! ENOENT, ELOOP, ...) are frequent.
//!
//! After every operation both sides must agree: success on both, or the same errno; and the
//! paths it named (and their parents) must lstat the same. Every `compare_every` operations
//! (and after a remount, and at the end) the two trees must be equal: names, types, sizes,
//! contents, modes, link counts, symlink targets, user xattrs, and which paths are hard links
//! of one another.
//!
//! Operands are drawn mostly from the paths that exist in the model (with a fresh name, or a
//! random pool path, part of the time), so both successes and each kind of error are common:
//! `NS_DEBUG=1` prints the count of every (operation, result) pair of a run.
//!
//! Reproduce a failure with the seed it prints: `NS_SEED=<seed> NS_OPS=<n> cargo test --test
//! namespace_model <test name>` (NS_SEED replaces the seed of every test, NS_OPS the count).

use crate::common;

use crate::common::rng::SplitMix;
use crate::common::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

const HISTORY: usize = 30;
/// Names of the path pool: every path is 1 to 3 of these (more with renames).
const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];
const XATTRS: [&str; 3] = ["user.one", "user.two", "user.three"];
const MODES: [u32; 10] = [
    0o644, 0o600, 0o755, 0o700, 0o777, 0o000, 0o4755, 0o2755, 0o1777, 0o640,
];

// ---------------------------------------------------------------------------------------------
// PRNG: splitmix64 (`common::rng::SplitMix`), salted with this test's constant.

const RNG_SALT: u64 = 0x0a11_ce5e_ed00_0000;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
    )
}

// ---------------------------------------------------------------------------------------------
// Operations.

#[derive(Clone, Debug)]
enum Op {
    /// open(O_CREAT|O_WRONLY|(O_EXCL or O_TRUNC), mode), then write `data`.
    Create {
        path: String,
        mode: u32,
        excl: bool,
        data: Vec<u8>,
    },
    /// open(O_WRONLY|O_APPEND), write.
    Append {
        path: String,
        data: Vec<u8>,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    /// renameat2 with flags 0, RENAME_NOREPLACE or RENAME_EXCHANGE.
    Rename {
        from: String,
        to: String,
        flags: u32,
    },
    Link {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Symlink {
        target: String,
        path: String,
    },
    SetXattr {
        path: String,
        name: &'static str,
        value: Vec<u8>,
        flags: i32,
        follow: bool,
    },
    RemoveXattr {
        path: String,
        name: &'static str,
        follow: bool,
    },
    Chmod {
        path: String,
        mode: u32,
    },
}

impl Op {
    /// The paths the operation names.
    fn paths(&self) -> Vec<&str> {
        match self {
            Op::Create { path, .. }
            | Op::Append { path, .. }
            | Op::Truncate { path, .. }
            | Op::Mkdir { path, .. }
            | Op::Unlink { path }
            | Op::Rmdir { path }
            | Op::Symlink { path, .. }
            | Op::SetXattr { path, .. }
            | Op::RemoveXattr { path, .. }
            | Op::Chmod { path, .. } => vec![path],
            Op::Rename { from, to, .. } | Op::Link { from, to } => vec![from, to],
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Create {
                path,
                mode,
                excl,
                data,
            } => write!(
                f,
                "create {path:?} mode {mode:o} {} + write {} bytes",
                if *excl { "O_EXCL" } else { "O_TRUNC" },
                data.len()
            ),
            Op::Append { path, data } => write!(f, "append {} bytes to {path:?}", data.len()),
            Op::Truncate { path, len } => write!(f, "truncate {path:?} to {len}"),
            Op::Mkdir { path, mode } => write!(f, "mkdir {path:?} mode {mode:o}"),
            Op::Rename { from, to, flags } => {
                let fl = match *flags {
                    0 => "",
                    libc::RENAME_NOREPLACE => " RENAME_NOREPLACE",
                    libc::RENAME_EXCHANGE => " RENAME_EXCHANGE",
                    _ => " ?",
                };
                write!(f, "rename{fl} {from:?} -> {to:?}")
            }
            Op::Link { from, to } => write!(f, "link {from:?} -> {to:?}"),
            Op::Unlink { path } => write!(f, "unlink {path:?}"),
            Op::Rmdir { path } => write!(f, "rmdir {path:?}"),
            Op::Symlink { target, path } => write!(f, "symlink {path:?} -> target {target:?}"),
            Op::SetXattr {
                path,
                name,
                value,
                flags,
                follow,
            } => {
                let fl = match *flags {
                    0 => "0",
                    libc::XATTR_CREATE => "XATTR_CREATE",
                    libc::XATTR_REPLACE => "XATTR_REPLACE",
                    _ => "?",
                };
                write!(
                    f,
                    "{}setxattr {path:?} {name} = {} bytes, {fl}",
                    if *follow { "" } else { "l" },
                    value.len()
                )
            }
            Op::RemoveXattr { path, name, follow } => write!(
                f,
                "{}removexattr {path:?} {name}",
                if *follow { "" } else { "l" }
            ),
            Op::Chmod { path, mode } => write!(f, "chmod {path:?} {mode:o}"),
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(r: libc::c_int) -> Result<(), i32> {
    if r < 0 { Err(errno()) } else { Ok(()) }
}

fn write_all(fd: i32, data: &[u8]) -> Result<(), i32> {
    let mut done = 0;
    while done < data.len() {
        let n = unsafe {
            libc::write(
                fd,
                data[done..].as_ptr() as *const libc::c_void,
                data.len() - done,
            )
        };
        if n < 0 {
            return Err(errno());
        }
        done += n as usize;
    }
    Ok(())
}

fn open_write(path: &CString, flags: i32, mode: u32, data: &[u8]) -> Result<(), i32> {
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(errno());
    }
    let r = write_all(fd, data);
    let c = unsafe { libc::close(fd) };
    r?;
    if c < 0 { Err(errno()) } else { Ok(()) }
}

/// Applies `op` under `root`; Ok or the errno.
fn apply(op: &Op, root: &Path) -> Result<(), i32> {
    let p = |rel: &str| cpath(&root.join(rel));
    unsafe {
        match op {
            Op::Create {
                path,
                mode,
                excl,
                data,
            } => {
                let fl = libc::O_CREAT
                    | libc::O_WRONLY
                    | if *excl { libc::O_EXCL } else { libc::O_TRUNC };
                open_write(&p(path), fl, *mode, data)
            }
            Op::Append { path, data } => {
                open_write(&p(path), libc::O_WRONLY | libc::O_APPEND, 0, data)
            }
            Op::Truncate { path, len } => check(libc::truncate(p(path).as_ptr(), *len as i64)),
            Op::Mkdir { path, mode } => check(libc::mkdir(p(path).as_ptr(), *mode)),
            Op::Rename { from, to, flags } => check(libc::renameat2(
                libc::AT_FDCWD,
                p(from).as_ptr(),
                libc::AT_FDCWD,
                p(to).as_ptr(),
                *flags,
            )),
            Op::Link { from, to } => check(libc::link(p(from).as_ptr(), p(to).as_ptr())),
            Op::Unlink { path } => check(libc::unlink(p(path).as_ptr())),
            Op::Rmdir { path } => check(libc::rmdir(p(path).as_ptr())),
            Op::Symlink { target, path } => {
                let t = CString::new(target.as_bytes()).unwrap();
                check(libc::symlink(t.as_ptr(), p(path).as_ptr()))
            }
            Op::SetXattr {
                path,
                name,
                value,
                flags,
                follow,
            } => {
                let n = CString::new(*name).unwrap();
                let f = if *follow {
                    libc::setxattr
                } else {
                    libc::lsetxattr
                };
                check(f(
                    p(path).as_ptr(),
                    n.as_ptr(),
                    value.as_ptr() as *const libc::c_void,
                    value.len(),
                    *flags,
                ))
            }
            Op::RemoveXattr { path, name, follow } => {
                let n = CString::new(*name).unwrap();
                let f = if *follow {
                    libc::removexattr
                } else {
                    libc::lremovexattr
                };
                check(f(p(path).as_ptr(), n.as_ptr()))
            }
            Op::Chmod { path, mode } => check(libc::chmod(p(path).as_ptr(), *mode)),
        }
    }
}

fn show(r: &Result<(), i32>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("{} ({e})", errname(*e)),
    }
}

fn errname(e: i32) -> &'static str {
    match e {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EINVAL => "EINVAL",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::ELOOP => "ELOOP",
        libc::EXDEV => "EXDEV",
        libc::EBUSY => "EBUSY",
        libc::ENODATA => "ENODATA",
        libc::EIO => "EIO",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EMLINK => "EMLINK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        _ => "errno",
    }
}

// ---------------------------------------------------------------------------------------------
// Trees.

#[derive(Debug, PartialEq, Eq, Clone)]
struct Entry {
    /// st_mode: type and permission bits.
    mode: u32,
    nlink: u64,
    /// Size of files and symlinks (directories: not compared).
    size: Option<u64>,
    content: Option<Vec<u8>>,
    target: Option<String>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

struct Tree {
    entries: BTreeMap<String, Entry>,
    /// Paths of each non-directory inode with more than one name.
    links: BTreeSet<Vec<String>>,
}

fn list_xattrs(p: &Path) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let (_, buf) = xattr::llistxattr_sized(p, 4096)
        .map_err(|e| format!("llistxattr {}: {}", p.display(), errname(common::errno(&e))))?;
    let mut out = BTreeMap::new();
    for name in xattr::user_names(&buf) {
        let (_, v) = xattr::lgetxattr_sized(p, &name, 65536).map_err(|e| {
            format!(
                "lgetxattr {} {name}: {}",
                p.display(),
                errname(common::errno(&e))
            )
        })?;
        out.insert(name, v);
    }
    Ok(out)
}

fn scan(root: &Path) -> Result<Tree, String> {
    fn walk(
        root: &Path,
        rel: &str,
        entries: &mut BTreeMap<String, Entry>,
        inodes: &mut BTreeMap<u64, Vec<String>>,
    ) -> Result<(), String> {
        let dir = root.join(rel);
        let rd = std::fs::read_dir(&dir).map_err(|e| format!("readdir {}: {e}", dir.display()))?;
        let mut names = Vec::new();
        for e in rd {
            let e = e.map_err(|e| format!("readdir {}: {e}", dir.display()))?;
            names.push(e.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        for name in names {
            let r = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let p = root.join(&r);
            let md =
                std::fs::symlink_metadata(&p).map_err(|e| format!("lstat {}: {e}", p.display()))?;
            let ft = md.file_type();
            let mut e = Entry {
                mode: md.mode(),
                nlink: md.nlink(),
                size: None,
                content: None,
                target: None,
                xattrs: list_xattrs(&p)?,
            };
            if ft.is_file() {
                e.size = Some(md.size());
                e.content =
                    Some(std::fs::read(&p).map_err(|e| format!("read {}: {e}", p.display()))?);
            } else if ft.is_symlink() {
                e.size = Some(md.size());
                e.target = Some(
                    std::fs::read_link(&p)
                        .map_err(|e| format!("readlink {}: {e}", p.display()))?
                        .to_string_lossy()
                        .into_owned(),
                );
            }
            if !ft.is_dir() {
                inodes.entry(md.ino()).or_default().push(r.clone());
            }
            entries.insert(r.clone(), e);
            if ft.is_dir() {
                walk(root, &r, entries, inodes)?;
            }
        }
        Ok(())
    }
    let mut entries = BTreeMap::new();
    let mut inodes = BTreeMap::new();
    walk(root, "", &mut entries, &mut inodes)?;
    let links = inodes
        .into_values()
        .filter(|v| v.len() > 1)
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    Ok(Tree { entries, links })
}

/// What lstat says of a path, for the check after every operation: Err(errno), or the mode,
/// the link count, and the size (not of directories).
fn lstat_summary(p: &Path) -> Result<(u32, u64, Option<u64>), i32> {
    match std::fs::symlink_metadata(p) {
        Ok(md) => Ok((md.mode(), md.nlink(), (!md.is_dir()).then_some(md.size()))),
        Err(e) => Err(e.raw_os_error().unwrap_or(0)),
    }
}

fn short(v: &Option<Vec<u8>>) -> String {
    match v {
        None => "-".into(),
        Some(v) => format!("{} bytes {:02x?}", v.len(), &v[..v.len().min(12)]),
    }
}

/// Differences between the mount's tree and the model's, one per line (empty if equal).
fn diff_trees(mnt: &Tree, model: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    for (p, e) in &model.entries {
        match mnt.entries.get(p) {
            None => out.push(format!("{p:?}: missing in the mount (model: {e:?})")),
            Some(m) if m != e => {
                let mut d = Vec::new();
                if m.mode != e.mode {
                    d.push(format!("mode {:o} (model {:o})", m.mode, e.mode));
                }
                if m.nlink != e.nlink {
                    d.push(format!("nlink {} (model {})", m.nlink, e.nlink));
                }
                if m.size != e.size {
                    d.push(format!("size {:?} (model {:?})", m.size, e.size));
                }
                if m.content != e.content {
                    d.push(format!(
                        "content {} (model {})",
                        short(&m.content),
                        short(&e.content)
                    ));
                }
                if m.target != e.target {
                    d.push(format!("target {:?} (model {:?})", m.target, e.target));
                }
                if m.xattrs != e.xattrs {
                    d.push(format!("xattrs {:?} (model {:?})", m.xattrs, e.xattrs));
                }
                out.push(format!("{p:?}: {}", d.join(", ")));
            }
            Some(_) => {}
        }
    }
    for (p, m) in &mnt.entries {
        if !model.entries.contains_key(p) {
            out.push(format!("{p:?}: in the mount but not in the model ({m:?})"));
        }
    }
    if out.is_empty() && mnt.links != model.links {
        out.push(format!(
            "hard links differ: mount {:?}, model {:?}",
            mnt.links, model.links
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The run.

#[derive(Clone)]
struct Cfg {
    name: &'static str,
    seed: u64,
    ops: usize,
    /// Unmount and remount after these fractions of the run.
    remounts: Vec<f64>,
    /// `unkai mount` flags.
    mount: Vec<&'static str>,
    compare_every: usize,
}

impl Cfg {
    fn new(name: &'static str, seed: u64, ops: usize) -> Cfg {
        Cfg {
            name,
            seed: env_u64("NS_SEED").unwrap_or(seed),
            ops: env_u64("NS_OPS").map(|n| n as usize).unwrap_or(ops),
            remounts: Vec::new(),
            mount: Vec::new(),
            compare_every: 20,
        }
    }
}

struct Run<'v> {
    mount: Option<Mount>,
    vol: &'v Volume,
    local: tempfile::TempDir,
    cfg: Cfg,
    rng: SplitMix,
    history: VecDeque<String>,
    op: usize,
    counts: BTreeMap<String, (u64, u64)>,
    /// Paths of the model (directories flagged), for choosing operands.
    existing: Vec<(String, bool)>,
}

impl<'v> Run<'v> {
    fn mroot(&self) -> PathBuf {
        self.mount.as_ref().unwrap().p("t")
    }

    fn lroot(&self) -> PathBuf {
        self.local.path().join("t")
    }

    fn fail(&self, what: &str) -> ! {
        let mut msg = format!(
            "\nNAMESPACE MODEL FAILURE in {} (seed {}, op #{} of {}): {what}\n\
             reproduce: NS_SEED={} NS_OPS={} cargo test --test namespace_model {}\n\
             last operations (oldest first), result on the mount / on the model:\n",
            self.cfg.name,
            self.cfg.seed,
            self.op,
            self.cfg.ops,
            self.cfg.seed,
            self.cfg.ops,
            self.cfg.name
        );
        for h in &self.history {
            msg += "  ";
            msg += h;
            msg += "\n";
        }
        panic!("{msg}");
    }

    /// A path of the pool: 1 to 3 names.
    fn pool_path(&mut self) -> String {
        let depth = match self.rng.below(10) {
            0..4 => 1,
            4..8 => 2,
            _ => 3,
        };
        (0..depth)
            .map(|_| self.rng.pick(&NAMES))
            .collect::<Vec<_>>()
            .join("/")
    }

    /// A path: an existing one, a new name in an existing directory, or any path of the pool
    /// (so that most operations have a chance to succeed, and collisions stay frequent).
    fn path(&mut self) -> String {
        if self.rng.chance(1, 50) {
            // The longest name allowed (255 bytes), or one byte too long (ENAMETOOLONG).
            let long = if self.rng.chance(1, 2) { 255 } else { 256 };
            let name = "L".repeat(long);
            return if self.rng.chance(1, 3) {
                name
            } else {
                format!("{}/{name}", self.path_of(true))
            };
        }
        match self.rng.below(100) {
            0..45 if !self.existing.is_empty() => {
                let i = self.rng.below(self.existing.len() as u64) as usize;
                self.existing[i].0.clone()
            }
            0..80 => {
                let dirs: Vec<&String> = self
                    .existing
                    .iter()
                    .filter(|(p, d)| *d && p.matches('/').count() < 3)
                    .map(|(p, _)| p)
                    .collect();
                let k = self.rng.below(dirs.len() as u64 + 1) as usize;
                let name = self.rng.pick(&NAMES);
                match dirs.get(k) {
                    Some(d) => format!("{d}/{name}"),
                    None => name.to_string(),
                }
            }
            _ => self.pool_path(),
        }
    }

    /// Mostly an existing path of the given kind (directory or not), else any path.
    fn path_of(&mut self, dir: bool) -> String {
        let of: Vec<&String> = self
            .existing
            .iter()
            .filter(|(_, d)| *d == dir)
            .map(|(p, _)| p)
            .collect();
        if !of.is_empty() && self.rng.chance(1, 2) {
            let i = self.rng.below(of.len() as u64) as usize;
            return of[i].clone();
        }
        self.path()
    }

    /// Refreshes the list of paths in the model (it drives the choice of paths).
    fn refresh(&mut self) {
        fn walk(dir: &Path, rel: &str, out: &mut Vec<(String, bool)>) {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for n in names {
                let r = if rel.is_empty() {
                    n.clone()
                } else {
                    format!("{rel}/{n}")
                };
                let p = dir.join(&n);
                let is_dir = std::fs::symlink_metadata(&p).unwrap().is_dir();
                out.push((r.clone(), is_dir));
                if is_dir {
                    walk(&p, &r, out);
                }
            }
        }
        self.existing.clear();
        let root = self.lroot();
        walk(&root, "", &mut self.existing);
    }

    fn target(&mut self, at: &str) -> String {
        let depth = at.matches('/').count(); // how many ".." stay inside the root
        match self.rng.below(10) {
            0..6 => self.path(),
            6..8 if depth > 0 => format!("../{}", self.pool_path()),
            6..8 => self.pool_path(),
            8 => format!("{}/./{}", self.rng.pick(&NAMES), self.rng.pick(&NAMES)),
            _ => self
                .rng
                .pick(&["nowhere", "a/b/c/d/e", "a", "."])
                .to_string(),
        }
    }

    fn next_op(&mut self) -> Op {
        match self.rng.below(100) {
            0..13 => Op::Create {
                path: self.path(),
                mode: self.rng.pick(&MODES) & 0o777,
                excl: self.rng.chance(2, 3),
                data: self.rng.bytes(64),
            },
            13..17 => Op::Append {
                path: self.path_of(false),
                data: self.rng.bytes(32),
            },
            17..19 => Op::Truncate {
                path: self.path_of(false),
                len: self.rng.below(80),
            },
            19..33 => Op::Mkdir {
                path: self.path(),
                mode: if self.rng.chance(1, 5) {
                    self.rng.pick(&MODES)
                } else {
                    0o755
                },
            },
            33..51 => {
                let from = if !self.existing.is_empty() && self.rng.chance(2, 3) {
                    let i = self.rng.below(self.existing.len() as u64) as usize;
                    self.existing[i].0.clone()
                } else {
                    self.path()
                };
                let to = if self.rng.chance(1, 8) {
                    // Into itself (EINVAL) or onto an ancestor (ENOTEMPTY).
                    if self.rng.chance(1, 2) {
                        format!("{from}/{}", self.rng.pick(&NAMES))
                    } else {
                        from.rsplit_once('/')
                            .map(|(a, _)| a.to_string())
                            .unwrap_or_else(|| self.path())
                    }
                } else {
                    self.path()
                };
                let flags = match self.rng.below(10) {
                    0..6 => 0,
                    6..8 => libc::RENAME_NOREPLACE,
                    _ => libc::RENAME_EXCHANGE,
                };
                Op::Rename { from, to, flags }
            }
            51..57 => Op::Link {
                from: self.path_of(false),
                to: self.path(),
            },
            57..67 => Op::Unlink {
                path: self.path_of(false),
            },
            67..75 => Op::Rmdir {
                path: self.path_of(true),
            },
            75..81 => {
                let path = self.path();
                Op::Symlink {
                    target: self.target(&path),
                    path,
                }
            }
            81..89 => Op::SetXattr {
                path: self.path(),
                name: self.rng.pick(&XATTRS),
                value: self.rng.bytes(40),
                flags: self
                    .rng
                    .pick(&[0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE]),
                follow: self.rng.chance(1, 3),
            },
            89..92 => Op::RemoveXattr {
                path: self.path(),
                name: self.rng.pick(&XATTRS),
                follow: self.rng.chance(1, 3),
            },
            _ => Op::Chmod {
                path: self.path(),
                mode: self.rng.pick(&MODES),
            },
        }
    }

    fn compare(&self, why: &str) {
        let m =
            scan(&self.mroot()).unwrap_or_else(|e| self.fail(&format!("scanning the mount: {e}")));
        let l =
            scan(&self.lroot()).unwrap_or_else(|e| self.fail(&format!("scanning the model: {e}")));
        let d = diff_trees(&m, &l);
        if !d.is_empty() {
            self.fail(&format!("trees differ ({why}):\n    {}", d.join("\n    ")));
        }
    }

    /// After every operation: the paths it named, and their parents, look the same on both
    /// sides (lstat: existence or errno, mode, link count, size).
    fn check_paths(&self, op: &Op) {
        let mut paths = BTreeSet::new();
        for p in op.paths() {
            paths.insert(p.to_string());
            if let Some((parent, _)) = p.rsplit_once('/') {
                paths.insert(parent.to_string());
            }
        }
        paths.insert(String::new());
        for p in paths {
            let m = lstat_summary(&self.mroot().join(&p));
            let l = lstat_summary(&self.lroot().join(&p));
            if m != l {
                let show = |r: &Result<(u32, u64, Option<u64>), i32>| match r {
                    Ok((mode, nlink, size)) => {
                        format!("mode {mode:o} nlink {nlink} size {size:?}")
                    }
                    Err(e) => errname(*e).to_string(),
                };
                self.fail(&format!(
                    "lstat {p:?} after the operation: mount {}, model {}",
                    show(&m),
                    show(&l)
                ));
            }
        }
    }

    fn remount(&mut self) {
        if self.history.len() >= HISTORY {
            self.history.pop_front();
        }
        self.history
            .push_back(format!("#{} unmount + remount", self.op));
        let m = self.mount.take().unwrap();
        m.unmount();
        self.mount = Some(self.vol.mount_with(&self.cfg.mount));
        self.compare("after remount");
    }
}

fn run(cfg: Cfg) {
    let t0 = Instant::now();
    let vol = Volume::new();
    let mount = vol.mount_with(&cfg.mount);
    let local = tempfile::Builder::new()
        .prefix("unkai-nsmodel-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let mut r = Run {
        mount: Some(mount),
        vol: &vol,
        local,
        rng: SplitMix::salted(cfg.seed, RNG_SALT),
        cfg: cfg.clone(),
        history: VecDeque::new(),
        op: 0,
        counts: BTreeMap::new(),
        existing: Vec::new(),
    };
    std::fs::create_dir(r.mroot()).unwrap();
    std::fs::create_dir(r.lroot()).unwrap();
    let remount_at: Vec<usize> = cfg
        .remounts
        .iter()
        .map(|f| ((cfg.ops as f64) * f) as usize)
        .collect();
    let mut max_entries = 0;
    let mut errs = BTreeMap::new();
    for i in 0..cfg.ops {
        r.op = i;
        if remount_at.contains(&i) {
            r.remount();
        }
        r.refresh();
        max_entries = max_entries.max(r.existing.len());
        let op = r.next_op();
        let (mroot, lroot) = (r.mroot(), r.lroot());
        let got = apply(&op, &mroot);
        let want = apply(&op, &lroot);
        if r.history.len() >= HISTORY {
            r.history.pop_front();
        }
        r.history
            .push_back(format!("#{i} {op}: {} / {}", show(&got), show(&want)));
        let kind = format!("{op}").split(' ').next().unwrap().to_string();
        *errs
            .entry(format!("{kind} {}", show(&want)))
            .or_insert(0u64) += 1;
        let c = r.counts.entry(kind).or_default();
        c.0 += 1;
        if want.is_err() {
            c.1 += 1;
        }
        if got != want {
            r.fail(&format!(
                "results differ: mount {}, model {}",
                show(&got),
                show(&want)
            ));
        }
        r.check_paths(&op);
        if (i + 1) % cfg.compare_every == 0 {
            r.compare("periodic");
        }
    }
    r.op = cfg.ops;
    r.compare("end");
    r.remount();
    r.mount.take().unwrap().unmount();
    if std::env::var_os("NS_DEBUG").is_some() {
        eprintln!("results by operation: {errs:#?}");
    }
    eprintln!(
        "{}: seed {} ops {} in {:.1?}, up to {} entries; (ops, failed) by kind: {:?}",
        cfg.name,
        cfg.seed,
        cfg.ops,
        t0.elapsed(),
        max_entries,
        r.counts
    );
}

#[test]
fn ns_seed_1() {
    run(Cfg::new("ns_seed_1", 1, 3000));
}

#[test]
fn ns_seed_2() {
    run(Cfg::new("ns_seed_2", 2, 3000));
}

#[test]
fn ns_seed_3() {
    run(Cfg::new("ns_seed_3", 3, 3000));
}

/// Unmount and remount twice in the middle: the namespace must be what the model says.
#[test]
fn ns_remount() {
    let mut c = Cfg::new("ns_remount", 4, 3000);
    c.remounts = vec![0.33, 0.66];
    run(c);
}

/// No kernel caching of entries and attributes: every lookup and stat reaches unkai.
#[test]
fn ns_no_kernel_cache() {
    let mut c = Cfg::new("ns_no_kernel_cache", 5, 3000);
    c.mount = vec!["--attr-ttl", "0", "--entry-ttl", "0", "--negative-ttl", "0"];
    c.compare_every = 50; // every lookup is a round trip: scans cost more
    c.remounts = vec![0.5];
    run(c);
}
