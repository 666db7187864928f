//! The FUSE front end: mounting a [`Vfs`](crate::vfs::Vfs) and serving kernel requests.
//!
//! [`adapter`] translates requests, [`inodes`] numbers them for the kernel (a subdir mount's
//! root), [`mounts`] reads and changes the mount table.
//! Not for: file-system logic (vfs), volume setup (cli).

pub mod adapter;
pub mod coherence;
pub mod inodes;
pub mod mounts;
pub mod passthrough;

use std::io;
use std::path::Path;
use std::sync::Arc;

use fuser::{Config, MountOption, SessionACL};
use nix::mount::MsFlags;

pub use adapter::{Adapter, CacheConfig};
pub use coherence::Coherence;
pub use inodes::Inodes;

use crate::vfs::export::Export;

/// Source name of every unkai mount in the mount table: `unkai:<volume>`.
pub const FSNAME_PREFIX: &str = "unkai:";

/// Options of a mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Let other users (not only the mounting user) use the mount.
    pub allow_other: bool,
    pub read_only: bool,
    /// Threads serving kernel requests, each with its own /dev/fuse descriptor.
    pub threads: usize,
    /// Volume name, shown in the mount table as `unkai:<name>`.
    pub volume: String,
    pub cache: CacheConfig,
    /// Where other clients' changes come in (see `Meta::watch`).
    pub coherence: Arc<Coherence>,
    /// The mount's flags from `-o` (nosuid, nodev, noexec, atime, sync...).
    pub flags: MountFlags,
    /// SELinux's labels (`context=...`), passed to the kernel as they are.
    pub labels: Vec<String>,
    /// Bytes of written pages the kernel may hold for the mount (its writeback cache) before
    /// it makes a writer wait, at most half the machine's dirty threshold ([`allow_dirty`]).
    pub dirty_allowance: u64,
}

/// When reads move access times: the mount's flag, which `vfs` applies (see `vfs::atime`).
pub use crate::vfs::atime::Atime;

/// The kernel's flags given with `-o`: per mount (nosuid, nodev, noexec, the atime ones,
/// nodiratime, nosymfollow) and of the file system (sync, dirsync, lazytime). The default
/// (no options) is what unkai has always mounted with: `suid`, `dev`, `exec`, `relatime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountFlags {
    pub suid: bool,
    pub dev: bool,
    pub exec: bool,
    pub atime: Atime,
    /// Listing a directory moves its access time (`diratime`, the default); `nodiratime`:
    /// never. `vfs` applies it (FUSE leaves access times to the file system).
    pub diratime: bool,
    /// `nosymfollow`: the kernel follows no symlink on the mount in a path walk (readlink
    /// still reads them).
    pub symfollow: bool,
    /// `sync`: every change (data included) is durable before the call returns.
    pub sync: bool,
    /// `dirsync`: changes of directories (create, link, unlink, rename...) are durable
    /// before the call returns.
    pub dirsync: bool,
    /// `lazytime`: the kernel keeps times it updates in memory (only with the kernel's
    /// writeback cache does it update any); unkai stores access times in groups anyway.
    pub lazytime: bool,
}

impl Default for MountFlags {
    fn default() -> Self {
        MountFlags {
            suid: true,
            dev: true,
            exec: true,
            atime: Atime::Relative,
            diratime: true,
            symfollow: true,
            sync: false,
            dirsync: false,
            lazytime: false,
        }
    }
}

/// Options mount(8) documents as file-system independent that unkai takes and cannot
/// honour, as Linux itself ignores them: each accepted with one warning line (see
/// [`MountFlags::apply`]).
pub const IGNORED: &[(&str, &str)] = &[
    (
        "iversion",
        "FUSE has no i_version change counter to keep (Linux ignores it on such file systems)",
    ),
    (
        "mand",
        "mandatory locks are gone from Linux since 5.15, which ignores this option too",
    ),
];

impl MountFlags {
    /// Applies one `-o` option if it is one of these flags; false if it is not (the caller
    /// decides what else it may be). A later option overrides an earlier one, as in mount(8).
    /// Options that change nothing here are taken too: `async`, `nolazytime`, `norelatime`
    /// (the kernel's default stays relatime), `noiversion`, `nomand`, and the [`IGNORED`].
    pub fn apply(&mut self, opt: &str) -> bool {
        match opt {
            "suid" => self.suid = true,
            "nosuid" => self.suid = false,
            "dev" => self.dev = true,
            "nodev" => self.dev = false,
            "exec" => self.exec = true,
            "noexec" => self.exec = false,
            "atime" | "relatime" => self.atime = Atime::Relative,
            "noatime" => self.atime = Atime::Never,
            "strictatime" => self.atime = Atime::Strict,
            "nostrictatime" => {
                if self.atime == Atime::Strict {
                    self.atime = Atime::Relative
                }
            }
            "norelatime" => {}
            "diratime" => self.diratime = true,
            "nodiratime" => self.diratime = false,
            "symfollow" => self.symfollow = true,
            "nosymfollow" => self.symfollow = false,
            "sync" => self.sync = true,
            "async" => self.sync = false,
            "dirsync" => self.dirsync = true,
            "lazytime" => self.lazytime = true,
            "nolazytime" => self.lazytime = false,
            "noiversion" | "nomand" => {}
            o if IGNORED.iter().any(|(n, _)| *n == o) => {}
            _ => return false,
        }
        true
    }

    /// The flags as options, e.g. `nosuid,noexec` (only those that differ from the default).
    pub fn to_options(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if !self.suid {
            v.push("nosuid");
        }
        if !self.dev {
            v.push("nodev");
        }
        if !self.exec {
            v.push("noexec");
        }
        match self.atime {
            Atime::Relative => {}
            Atime::Never => v.push("noatime"),
            Atime::Strict => v.push("strictatime"),
        }
        for (on, name) in [
            (!self.diratime, "nodiratime"),
            (!self.symfollow, "nosymfollow"),
            (self.sync, "sync"),
            (self.dirsync, "dirsync"),
            (self.lazytime, "lazytime"),
        ] {
            if on {
                v.push(name);
            }
        }
        v
    }

    /// What `vfs` makes durable before a change returns.
    pub fn durability(self) -> crate::vfs::Durability {
        use crate::vfs::Durability;
        match (self.sync, self.dirsync) {
            (true, _) => Durability::Sync,
            (false, true) => Durability::DirSync,
            (false, false) => Durability::Async,
        }
    }

    /// fuser's options for these flags. Per-mount flags fuser has no option for
    /// (strictatime, nodiratime, nosymfollow) are set by [`mount`] afterwards.
    fn mount_options(self) -> Vec<MountOption> {
        let mut v = vec![
            if self.dev {
                MountOption::Dev
            } else {
                MountOption::NoDev
            },
            if self.suid {
                MountOption::Suid
            } else {
                MountOption::NoSuid
            },
            if self.exec {
                MountOption::Exec
            } else {
                MountOption::NoExec
            },
            // `atime` lets the kernel apply its default, relatime (strictatime has no fuser
            // option: see `mount`).
            if self.atime == Atime::Never {
                MountOption::NoAtime
            } else {
                MountOption::Atime
            },
        ];
        if self.sync {
            v.push(MountOption::Sync);
        }
        if self.dirsync {
            v.push(MountOption::DirSync);
        }
        if self.lazytime {
            // A flag of the superblock the kernel takes among the mount's data options
            // (its generic `lazytime`), as fusermount3 passes it on too.
            v.push(MountOption::CUSTOM("lazytime".into()));
        }
        v
    }

    /// The mount(2) flags of a remount that keeps these per-mount flags and `read_only` (a
    /// remount sets every per-mount flag: one left out is cleared), and the superblock's
    /// (sync, dirsync, lazytime) for a remount that is not a bind remount.
    pub fn ms_flags(self, read_only: bool) -> MsFlags {
        let mut f = MsFlags::empty();
        f.set(MsFlags::MS_NOSUID, !self.suid);
        f.set(MsFlags::MS_NODEV, !self.dev);
        f.set(MsFlags::MS_NOEXEC, !self.exec);
        f.set(MsFlags::MS_RDONLY, read_only);
        f.set(MsFlags::MS_NODIRATIME, !self.diratime);
        f.set(
            MsFlags::from_bits_retain(libc::MS_NOSYMFOLLOW),
            !self.symfollow,
        );
        f.set(MsFlags::MS_SYNCHRONOUS, self.sync);
        f.set(MsFlags::MS_DIRSYNC, self.dirsync);
        f.set(MsFlags::MS_LAZYTIME, self.lazytime);
        match self.atime {
            Atime::Relative => f |= MsFlags::MS_RELATIME,
            Atime::Never => f |= MsFlags::MS_NOATIME,
            Atime::Strict => f |= MsFlags::MS_STRICTATIME,
        }
        f
    }

    /// Per-mount flags fuser cannot set, which [`mount`] sets by remounting the new mount
    /// (root only): their names, if any are asked for. `nodiratime` only as root: `vfs`
    /// honours it for everyone, the mount table shows it only when root can set it.
    fn set_after(self, root: bool) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.atime == Atime::Strict {
            v.push("strictatime");
        }
        if !self.symfollow {
            v.push("nosymfollow");
        }
        if !self.diratime && root {
            v.push("nodiratime");
        }
        v
    }
}

/// Lets the kernel hold up to `want` bytes of this mount's written pages (at most half the
/// machine's dirty threshold) before it makes the writer wait for unkai. The kernel gives a
/// FUSE mount 1% of that threshold (`/sys/class/bdi/DEV/max_ratio`, with `strict_limit`): a
/// few MiB on a machine of a few GiB, where a writer then waited for every few MiB to reach
/// unkai (a sequential write at half its speed), and random writes were sent on long before
/// they would have gathered (docs/benchmarks.md, 2026-12-01, sixth). Only raised, never
/// lowered (an administrator's larger setting stays); as root, on kernels with `max_bytes`
/// (6.2 and later); otherwise nothing changes (said in the debug log).
///
/// The mount is also promised a floor (`min_bytes`: half of that, at most a sixteenth of the
/// threshold). The kernel divides the threshold between devices by their share of the pages
/// written out lately, and a new mount has none: its first writes were held to a few pages
/// and the writer made to wait at the pace of a bandwidth estimate that starts low, until
/// the mount had written for some seconds (S0's first run on a new mount at half the speed
/// of its second, docs/benchmarks.md). The floor is taken from every other device's share
/// while the mount lives (which is why it is small); a mount goes without once every
/// device's floor together would pass a quarter of the threshold.
fn allow_dirty(mountpoint: &Path, want: u64) {
    let Some(m) = mounts::table()
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == mountpoint)
    else {
        return;
    };
    let bdi = Path::new("/sys/class/bdi").join(&m.dev);
    let read = |name: &str| {
        std::fs::read_to_string(bdi.join(name))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    // The share in millionths (1% = 10,000) and in bytes give the machine's threshold.
    let (Some(bytes), Some(fine)) = (read("max_bytes"), read("max_ratio_fine")) else {
        tracing::debug!("{}: no max_bytes (kernel before 6.2)", bdi.display());
        return;
    };
    let threshold = bytes.saturating_mul(1_000_000) / fine.max(1);
    let target = want.min(threshold / 2);
    if bytes < target {
        match std::fs::write(bdi.join("max_bytes"), target.to_string()) {
            Ok(()) => tracing::debug!(
                "{}: the mount's written pages held at most raised from {} to {} MiB",
                bdi.display(),
                bytes >> 20,
                target >> 20
            ),
            Err(e) => tracing::debug!("{}: max_bytes not raised: {e}", bdi.display()),
        }
    }
    let floor = (target / 2).min(threshold / 16);
    // Every device's floor is taken from the others: all of them together stay within a
    // quarter of the threshold (a machine with many mounts gives the later ones none).
    let others: u64 = std::fs::read_dir("/sys/class/bdi")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().as_os_str() != m.dev.as_str())
        .filter_map(|e| std::fs::read_to_string(e.path().join("min_bytes")).ok())
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .sum();
    if others.saturating_add(floor) > threshold / 4 {
        tracing::debug!(
            "{}: no floor for the mount's written pages: other devices hold {} MiB of floors",
            bdi.display(),
            others >> 20
        );
    } else if read("min_bytes").is_some_and(|b| b < floor) {
        match std::fs::write(bdi.join("min_bytes"), floor.to_string()) {
            Ok(()) => tracing::debug!(
                "{}: the mount's written pages held at least {} MiB",
                bdi.display(),
                floor >> 20
            ),
            Err(e) => tracing::debug!("{}: min_bytes not set: {e}", bdi.display()),
        }
    }
}

/// Mounts `export` (its root: the volume's, or `--subdir`'s) at `mountpoint`. The mount is
/// ready (the kernel handshake done) on return; call `run()` on the session to serve
/// requests until unmounted. Its requests are counted and logged by the export.
pub fn mount(
    export: Arc<Export>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> io::Result<fuser::Session<Adapter>> {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(format!("{FSNAME_PREFIX}{}", opts.volume)),
        // A kernel option, so that the mount table says `fuse.unkai`: mount(8) then remounts
        // (`mount -o remount,ro`) by itself instead of calling the mount.fuse helper.
        MountOption::CUSTOM("subtype=unkai".into()),
        MountOption::DefaultPermissions,
        if opts.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    cfg.mount_options.extend(opts.flags.mount_options());
    cfg.mount_options
        .extend(opts.labels.iter().cloned().map(MountOption::CUSTOM));
    cfg.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(opts.threads.max(1));
    cfg.clone_fd = true;
    let inodes = Inodes::at(export.root());
    let adapter = Adapter::new(export, opts.cache.clone(), opts.coherence.clone(), inodes);
    // Resolved before the mount: after it, resolving the path asks the mount itself, which
    // does not answer until served.
    let resolved = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.into());
    let session = fuser::Session::new(adapter, mountpoint, &cfg)?;
    let later = opts.flags.set_after(nix::unistd::geteuid().is_root());
    if !later.is_empty() {
        // Only a remount of the mount itself can set them (as root); on failure the
        // session, dropped, unmounts. Per-mount flags only: a bind remount.
        // (Raw bits: nix does not know MS_NOSYMFOLLOW, and `!` of its flags drops it.)
        let sb = MsFlags::MS_SYNCHRONOUS | MsFlags::MS_DIRSYNC | MsFlags::MS_LAZYTIME;
        let flags = MsFlags::from_bits_retain(
            (MsFlags::MS_REMOUNT | MsFlags::MS_BIND).bits()
                | (opts.flags.ms_flags(opts.read_only).bits() & !sb.bits()),
        );
        nix::mount::mount(None::<&str>, mountpoint, None::<&str>, flags, None::<&str>).map_err(
            |e| {
                io::Error::other(format!(
                    "setting {}: {e} (only root can set {})",
                    later.join(", "),
                    if later.len() == 1 { "it" } else { "them" }
                ))
            },
        )?;
    }
    // After the flags, so that the mount table shows the flags asked for as soon as possible.
    allow_dirty(&resolved, opts.dirty_allowance);
    opts.coherence.set_notifier(session.notifier(), inodes);
    Ok(session)
}
