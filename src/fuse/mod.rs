//! The FUSE front end: mounting a [`Vfs`](crate::vfs::Vfs) and serving kernel requests.
//!
//! [`adapter`] translates requests, [`mounts`] reads and changes the mount table.
//! Not for: file-system logic (vfs), volume setup (cli).

pub mod adapter;
pub mod coherence;
pub mod mounts;

use std::io;
use std::path::Path;
use std::sync::Arc;

use fuser::{Config, MountOption, SessionACL};

pub use adapter::{Adapter, CacheConfig};
pub use coherence::Coherence;

use crate::vfs::Vfs;

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
}

/// Mounts `vfs` at `mountpoint`. The mount is ready (the kernel handshake done) on return;
/// call `run()` on the session to serve requests until unmounted.
pub fn mount(
    vfs: Arc<Vfs>,
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
        MountOption::Dev,
        MountOption::Suid,
        if opts.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    cfg.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(opts.threads.max(1));
    cfg.clone_fd = true;
    let adapter = Adapter::new(vfs, opts.cache.clone(), opts.coherence.clone());
    let session = fuser::Session::new(adapter, mountpoint, &cfg)?;
    opts.coherence.set_notifier(session.notifier());
    Ok(session)
}
