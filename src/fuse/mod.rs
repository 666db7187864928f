//! The FUSE front end: mounting a [`Vfs`](crate::vfs::Vfs) and serving kernel requests.
//!
//! [`adapter`] translates requests, [`inodes`] numbers them for the kernel (a subdir mount's
//! root), [`mounts`] reads and changes the mount table.
//! Not for: file-system logic (vfs), volume setup (cli).

pub mod adapter;
pub mod coherence;
pub mod inodes;
pub mod mounts;

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
    /// The mount's flags from `-o` (nosuid, nodev, noexec, atime).
    pub flags: MountFlags,
}

/// When reads move access times: the mount's flag, which `vfs` applies (see `vfs::atime`).
pub use crate::vfs::atime::Atime;

/// The kernel's per-mount flags given with `-o`. The default (no options) is what unkai has
/// always mounted with: `suid`, `dev`, `exec`, `relatime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountFlags {
    pub suid: bool,
    pub dev: bool,
    pub exec: bool,
    pub atime: Atime,
}

impl Default for MountFlags {
    fn default() -> Self {
        MountFlags {
            suid: true,
            dev: true,
            exec: true,
            atime: Atime::Relative,
        }
    }
}

impl MountFlags {
    /// Applies one `-o` option if it is one of these flags; false if it is not (the caller
    /// decides what else it may be). A later option overrides an earlier one, as in mount(8).
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
        v
    }

    /// fuser's options for these flags. `strictatime` has none (fuser cannot pass
    /// MS_STRICTATIME): [`mount`] sets it afterwards.
    fn mount_options(self) -> Vec<MountOption> {
        vec![
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
        ]
    }

    /// The mount(2) flags of a remount that keeps these flags and `read_only` (a remount
    /// sets every per-mount flag: one left out is cleared).
    pub fn ms_flags(self, read_only: bool) -> MsFlags {
        let mut f = MsFlags::empty();
        f.set(MsFlags::MS_NOSUID, !self.suid);
        f.set(MsFlags::MS_NODEV, !self.dev);
        f.set(MsFlags::MS_NOEXEC, !self.exec);
        f.set(MsFlags::MS_RDONLY, read_only);
        match self.atime {
            Atime::Relative => f |= MsFlags::MS_RELATIME,
            Atime::Never => f |= MsFlags::MS_NOATIME,
            Atime::Strict => f |= MsFlags::MS_STRICTATIME,
        }
        f
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
    cfg.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(opts.threads.max(1));
    cfg.clone_fd = true;
    let inodes = Inodes::at(export.root());
    let adapter = Adapter::new(export, opts.cache.clone(), opts.coherence.clone(), inodes);
    let session = fuser::Session::new(adapter, mountpoint, &cfg)?;
    if opts.flags.atime == Atime::Strict {
        // Only a remount of the mount itself can set it (as root); on failure the session,
        // dropped, unmounts.
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | opts.flags.ms_flags(opts.read_only);
        nix::mount::mount(None::<&str>, mountpoint, None::<&str>, flags, None::<&str>)
            .map_err(|e| io::Error::other(format!("setting strictatime: {e}")))?;
    }
    opts.coherence.set_notifier(session.notifier(), inodes);
    Ok(session)
}
