//! `unkai clone`: copy a file or a whole tree inside one unkai mount without copying its
//! data: each file's contents are shared by reference (`copy_file_range`, which a mount
//! answers by referencing the source's slices), and diverge copy-on-write when either side
//! is written.
//!
//! Works through the mount like any program, so every client sees the clone as it is made
//! and permissions apply to the caller. Not for: copies between file systems (that is `cp`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};

/// Clone a file or a directory tree inside one unkai mount, sharing the data.
///
/// Only metadata is written: the clone's blocks are the source's, and a later write to
/// either copy stores new blocks for what it changes (copy-on-write). Modes, symlinks, hard
/// links inside the tree and extended attributes are kept; with --preserve also owners and
/// times (as `cp -a`). `cp` on a mount shares data the same way for single files
/// (`copy_file_range`); `cp --reflink=always` fails on every FUSE file system, whose kernel
/// side has no clone request.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai clone /mnt/unkai/dataset /mnt/unkai/dataset-v2\n  unkai clone --preserve /mnt/unkai/vm.img /mnt/unkai/vm-snapshot.img"
)]
pub struct Args {
    /// The file or directory to clone (inside an unkai mount).
    src: PathBuf,
    /// Where the clone goes (must not exist; on the same mount).
    dst: PathBuf,
    /// Also keep owners and times (needs root for other users' files).
    #[arg(long, short = 'p')]
    preserve: bool,
    /// No progress display.
    #[arg(long, short = 'q')]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let src_meta = fs::symlink_metadata(&a.src)
        .with_context(|| format!("cannot clone {}", a.src.display()))?;
    if fs::symlink_metadata(&a.dst).is_ok() {
        bail!(
            "cannot clone to {}: it exists; name a new path",
            a.dst.display()
        );
    }
    let parent = match a.dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent_meta =
        fs::metadata(&parent).with_context(|| format!("cannot clone to {}", a.dst.display()))?;
    let mounts = crate::fuse::mounts::containing(&a.src);
    if !mounts.is_some_and(|m| crate::fuse::mounts::is_unkai(&m)) {
        bail!(
            "{} is not on an unkai mount: clone shares data within one mount (use cp)",
            a.src.display()
        );
    }
    if parent_meta.dev() != src_meta.dev() {
        bail!(
            "{} and {} are on different file systems: clone shares data within one unkai \
             mount (use cp)",
            a.src.display(),
            a.dst.display()
        );
    }
    if src_meta.is_dir() && a.dst.starts_with(&a.src) {
        bail!(
            "cannot clone {} into itself ({})",
            a.src.display(),
            a.dst.display()
        );
    }
    let pb = if a.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    pb.set_style(ProgressStyle::with_template("cloning {spinner} {pos} entries, {msg}").unwrap());
    let mut c = Cloner {
        preserve: a.preserve,
        links: HashMap::new(),
        bytes: 0,
        pb,
    };
    c.clone_path(&a.src, &a.dst, &src_meta)?;
    c.pb.finish_and_clear();
    println!(
        "cloned {} to {}: {} entries, {} shared",
        a.src.display(),
        a.dst.display(),
        c.pb.position(),
        super::human_bytes(c.bytes)
    );
    Ok(())
}

struct Cloner {
    preserve: bool,
    /// Hard links met in the tree: (dev, ino) of the source -> the clone's first path.
    links: HashMap<(u64, u64), PathBuf>,
    bytes: u64,
    pb: ProgressBar,
}

impl Cloner {
    fn clone_path(&mut self, src: &Path, dst: &Path, m: &fs::Metadata) -> anyhow::Result<()> {
        let ft = m.file_type();
        let what = || format!("cloning {} to {}", src.display(), dst.display());
        if ft.is_dir() {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(dst)
                .with_context(what)?;
            let mut names: Vec<_> = fs::read_dir(src)
                .with_context(what)?
                .collect::<std::io::Result<Vec<_>>>()
                .with_context(what)?;
            names.sort_by_key(|e| e.file_name());
            for e in names {
                let child = e.path();
                let cm = fs::symlink_metadata(&child).with_context(what)?;
                self.clone_path(&child, &dst.join(e.file_name()), &cm)?;
            }
        } else if ft.is_symlink() {
            let target = fs::read_link(src).with_context(what)?;
            std::os::unix::fs::symlink(target, dst).with_context(what)?;
        } else if m.nlink() > 1 && self.links.contains_key(&(m.dev(), m.ino())) {
            fs::hard_link(&self.links[&(m.dev(), m.ino())], dst).with_context(what)?;
            self.pb.inc(1);
            return Ok(());
        } else if ft.is_file() {
            self.clone_file(src, dst, m).with_context(what)?;
        } else {
            nix::sys::stat::mknod(
                dst,
                nix::sys::stat::SFlag::from_bits_truncate(m.mode() & libc::S_IFMT),
                nix::sys::stat::Mode::from_bits_truncate(m.mode() & 0o7777),
                m.rdev(),
            )
            .with_context(what)?;
        }
        if m.nlink() > 1 && !ft.is_dir() {
            self.links.insert((m.dev(), m.ino()), dst.to_path_buf());
        }
        copy_xattrs(src, dst).with_context(what)?;
        self.finish(dst, m).with_context(what)?;
        self.pb.inc(1);
        self.pb.set_message(super::human_bytes(self.bytes));
        Ok(())
    }

    /// The contents shared by `copy_file_range`, which an unkai mount answers with
    /// references to the source's slices.
    fn clone_file(&mut self, src: &Path, dst: &Path, m: &fs::Metadata) -> anyhow::Result<()> {
        let from = File::open(src)?;
        let to = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)?;
        let mut left = m.len();
        let (mut off_in, mut off_out): (i64, i64) = (0, 0);
        while left > 0 {
            // SAFETY: both descriptors are open for the call; the offsets are ours.
            let n = unsafe {
                libc::copy_file_range(
                    from.as_raw_fd(),
                    &mut off_in,
                    to.as_raw_fd(),
                    &mut off_out,
                    left.min(1 << 30) as usize,
                    0,
                )
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            if n == 0 {
                break;
            }
            left -= n as u64;
            self.bytes += n as u64;
        }
        Ok(())
    }

    /// The mode (owners and times too with --preserve), once the contents are in place.
    fn finish(&self, dst: &Path, m: &fs::Metadata) -> anyhow::Result<()> {
        let symlink = m.file_type().is_symlink();
        if self.preserve {
            nix::unistd::fchownat(
                nix::fcntl::AT_FDCWD,
                dst,
                Some(nix::unistd::Uid::from_raw(m.uid())),
                Some(nix::unistd::Gid::from_raw(m.gid())),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
        }
        if !symlink {
            fs::set_permissions(dst, fs::Permissions::from_mode(m.mode() & 0o7777))?;
        }
        if self.preserve {
            let ts = |s: i64, ns: i64| nix::sys::time::TimeSpec::new(s, ns);
            nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                dst,
                &ts(m.atime(), m.atime_nsec()),
                &ts(m.mtime(), m.mtime_nsec()),
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            )?;
        }
        Ok(())
    }
}

/// Copies the extended attributes of `src` to `dst` (ACLs included: they are xattrs).
fn copy_xattrs(src: &Path, dst: &Path) -> std::io::Result<()> {
    for name in list_xattrs(src)? {
        let mut buf = vec![0u8; 64 << 10];
        let c = super::cstr(src.as_os_str())?;
        let n = super::cstr(OsStr::from_bytes(&name))?;
        // SAFETY: valid C strings and a buffer of the length given.
        let len =
            unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if len < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let d = super::cstr(dst.as_os_str())?;
        // SAFETY: as above.
        let r = unsafe {
            libc::lsetxattr(d.as_ptr(), n.as_ptr(), buf.as_ptr().cast(), len as usize, 0)
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            // A user may not set trusted.* or security.* names: left out, as cp -a does.
            if e.raw_os_error() != Some(libc::EPERM) {
                return Err(e);
            }
        }
    }
    Ok(())
}

fn list_xattrs(p: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    let c = super::cstr(p.as_os_str())?;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: a valid C string and a buffer of the length given.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOTSUP) => Ok(Vec::new()),
            _ => Err(e),
        };
    }
    Ok(buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| n.to_vec())
        .collect())
}
