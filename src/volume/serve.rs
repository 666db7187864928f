//! The life of one mount: from registering the session to the flush at unmount.
//!
//! [`serve`] takes an opened volume and a plain [`MountConfig`], decides how long the kernel
//! may cache (from the engine's kind, who else has the volume mounted and whether their
//! changes are pushed), mounts, writes the pid file, unmounts on SIGINT, SIGTERM or SIGHUP
//! (a daemon's SIGHUP reopens its log instead), and flushes everything before it returns.
//!
//! Not for: parsing or checking flags, the mountpoint or the volume (that is `cli::mount`,
//! which reports such errors on the terminal before anything starts), daemonizing (also
//! `cli::mount`), or translating kernel requests (that is `fuse`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use super::client::{Client, ClientConfig, DAEMON_LOG_ENV, Hangup, Setup, other_sessions};
use crate::fuse::{self, CacheConfig, MountOptions, mounts};
use crate::meta::{EngineKind, Meta};
use crate::vfs;

/// TTLs of the kernel's caches when this mount is the volume's only client: nobody else can
/// change what the kernel remembers.
const EXCLUSIVE_TTL: f64 = 30.0;
/// ... and when others may write: how late another client's change may show.
const SHARED_TTL: f64 = 1.0;
/// ... and when others' changes are pushed (PostgreSQL): how late one may show if its
/// notification is lost (the channel breaks, a client dies between commit and notify).
const PUSHED_TTL: f64 = 5.0;

pub use super::open::{StoreConfig, Writeback};

/// How to serve a mount; every field already checked by the caller.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Where to mount (canonical, an existing directory not mounted yet).
    pub mountpoint: PathBuf,
    /// The pid file of the mount, written once it is ready and removed at unmount.
    pub pid_file: PathBuf,
    /// Let other users use the mount.
    pub allow_other: bool,
    pub read_only: bool,
    /// The kernel's flags from `-o`: nosuid, nodev, noexec, atime, nodiratime, nosymfollow,
    /// sync, dirsync, lazytime.
    pub flags: fuse::MountFlags,
    /// SELinux's labels of the mount (`context=...`), for the kernel.
    pub labels: Vec<String>,
    /// Threads serving kernel requests.
    pub threads: usize,
    /// Seconds the kernel caches attributes (None: the policy's default).
    pub attr_ttl: Option<f64>,
    /// Seconds the kernel caches directory entries (None: as attributes).
    pub entry_ttl: Option<f64>,
    /// Seconds the kernel remembers a missing name (None: as attributes).
    pub negative_ttl: Option<f64>,
    /// The kernel's writeback cache.
    pub writeback_cache: Writeback,
    /// FUSE passthrough (`--passthrough`: `auto` is on for root without the writeback
    /// cache; `on` turns the writeback cache off), and the directory of its local copies.
    pub passthrough: Writeback,
    pub passthrough_dir: PathBuf,
    /// The data side: staging, caches, memory, the store's time limits, the data key.
    pub store: StoreConfig,
    /// Antivirus scanning of files written (None: off).
    pub scan: Option<super::open::ScanConfig>,
    /// Keep the kernel's page cache of a file across opens (false: drop it at every open).
    pub keep_cache: bool,
    /// Served in the foreground of a terminal (not as a daemon): say so on stderr when ready.
    pub foreground: bool,
    /// Where to serve `/metrics` (None: nowhere; the stats socket is always served).
    pub metrics: Option<std::net::SocketAddr>,
    /// A file the access log is also written to (`--access-log`).
    pub access_log: Option<PathBuf>,
    /// The volume's directory served as the mount's root (`--subdir`): its inode
    /// (`volume::subdir_ino`) and its path; None for a mount of the whole volume.
    pub subdir: Option<(crate::meta::Ino, String)>,
    /// The META-URL the volume was opened with: kept, readable by the mount's user only,
    /// beside the pid file while mounted ([`meta_url_file`]), for commands given the
    /// mountpoint instead.
    pub meta_url: String,
    /// Backups of the metadata into the bucket (`--backup-meta`; None: off).
    pub backup_meta: Option<crate::admin::backup::Schedule>,
}

/// Where a mount whose pid file is `pid_file` keeps its META-URL while mounted.
pub fn meta_url_file(pid_file: &std::path::Path) -> PathBuf {
    pid_file.with_extension("url")
}

/// Checks a TTL given in seconds; `what` names its flag.
pub fn ttl(secs: f64, what: &str) -> anyhow::Result<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        bail!("invalid --{what} {secs}: must be a number of seconds >= 0");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Who else may change the volume, as far as the kernel's caches are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sharing {
    /// This mount has the volume to itself.
    Exclusive,
    /// Others may write; their changes are pushed into the kernel's caches.
    Pushed,
    /// Others may write, unannounced.
    Shared,
}

impl Sharing {
    /// Alone on the volume? A volume of a one-machine engine (SQLite) lives on this machine;
    /// if no other mount of it is alive, the kernel may cache for long and write back (a
    /// later second mount of the same file is warned about in the docs: mount both with
    /// --attr-ttl 1 --writeback-cache off).
    fn alone(engine: EngineKind, other_sessions: usize) -> bool {
        engine.one_machine() && other_sessions == 0
    }

    fn default_ttl(self) -> f64 {
        match self {
            Sharing::Exclusive => EXCLUSIVE_TTL,
            Sharing::Pushed => PUSHED_TTL,
            Sharing::Shared => SHARED_TTL,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Sharing::Exclusive => "this mount has the volume to itself",
            Sharing::Pushed => "the volume may be shared; other mounts' changes are pushed",
            Sharing::Shared => "the volume may be shared",
        }
    }
}

/// Whether the TTLs follow other mounts coming and going: on a volume of one machine, unless
/// the user set them.
fn ttls_follow(cfg: &MountConfig, engine: EngineKind) -> bool {
    engine.one_machine()
        && cfg.attr_ttl.is_none()
        && cfg.entry_ttl.is_none()
        && cfg.negative_ttl.is_none()
}

/// The kernel's cache settings for a mount shared as `sharing`, with the user's overrides.
/// With `follow`, the TTLs are the shared ones, raised while the mount is alone
/// ([`CacheConfig::alone_ttl`]); the writeback cache stays as `sharing` decided.
/// `limited`: the volume has a capacity or quotas, which `write` itself must keep (the
/// writeback cache takes writes the kernel only hands over later, so `auto` leaves it off).
fn cache_config(
    cfg: &MountConfig,
    sharing: Sharing,
    follow: bool,
    limited: bool,
) -> anyhow::Result<CacheConfig> {
    let exclusive = sharing == Sharing::Exclusive;
    let writeback = match cfg.writeback_cache {
        Writeback::Auto => exclusive && !limited,
        Writeback::On => true,
        Writeback::Off => false,
    };
    let passthrough = match cfg.passthrough {
        Writeback::Auto => !writeback && nix::unistd::geteuid().is_root(),
        Writeback::On => {
            if writeback {
                tracing::info!("FUSE passthrough on: the kernel's writeback cache goes off");
            }
            true
        }
        Writeback::Off => false,
    };
    let attr_ttl = match follow {
        true => SHARED_TTL,
        false => cfg.attr_ttl.unwrap_or(sharing.default_ttl()),
    };
    Ok(CacheConfig {
        attr_ttl: ttl(attr_ttl, "attr-ttl")?,
        entry_ttl: ttl(cfg.entry_ttl.unwrap_or(attr_ttl), "entry-ttl")?,
        negative_ttl: ttl(cfg.negative_ttl.unwrap_or(attr_ttl), "negative-ttl")?,
        keep_cache: cfg.keep_cache,
        writeback: writeback && !passthrough,
        passthrough: passthrough.then(|| cfg.passthrough_dir.clone()),
        shared: !exclusive,
        fallback_ttl: (sharing == Sharing::Pushed).then(|| Duration::from_secs_f64(SHARED_TTL)),
        alone_ttl: follow.then(|| Duration::from_secs_f64(EXCLUSIVE_TTL)),
    })
}

/// Decides how the volume is shared, and starts other clients' changes flowing into
/// `coherence` when it may be.
fn sharing(meta: &dyn Meta, coherence: &Arc<fuse::Coherence>) -> anyhow::Result<Sharing> {
    let others = other_sessions(meta)?;
    if Sharing::alone(meta.engine(), others) {
        return Ok(Sharing::Exclusive);
    }
    // Other clients' changes pushed into the kernel's caches as they happen (PostgreSQL).
    Ok(if meta.watch(coherence.sink())? {
        Sharing::Pushed
    } else {
        Sharing::Shared
    })
}

/// Unmounts (detaching the mount if it is busy): what a signal that stops the mount does.
fn unmount(unmounter: &mut fuser::SessionUnmounter, mp: &std::path::Path) {
    if let Err(e) = unmounter.unmount() {
        tracing::warn!(
            "{} is busy ({e}); detaching it, files still open keep working",
            mp.display()
        );
        if let Err(e) = mounts::unmount(mp, true) {
            tracing::error!("cannot unmount {}: {e}", mp.display());
        }
    }
}

fn write_pid_file(path: &std::path::Path, meta_url: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(path, format!("{}\n", std::process::id()));
    // The URL may hold a password: mode 0600 from its creation on.
    let url_file = meta_url_file(path);
    let _ = std::fs::remove_file(&url_file);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&url_file)
        .and_then(|mut f| writeln!(f, "{meta_url}"));
    if let Err(e) = written {
        tracing::warn!(
            "cannot write {}: commands given the mountpoint will need the META-URL ({e})",
            url_file.display()
        );
    }
}

/// Serves the opened volume `meta` at `cfg.mountpoint` until it is unmounted (by a signal or
/// `unkai umount`), then flushes. Calls `ready` once the mount is in place.
pub fn serve(meta: Arc<dyn Meta>, cfg: &MountConfig, ready: impl FnOnce()) -> anyhow::Result<()> {
    let fmt = meta.format().clone();
    let coherence = Arc::new(fuse::Coherence::default());
    let follow = ttls_follow(cfg, meta.engine());
    let mut decided = None;
    let client = ClientConfig {
        session: cfg.mountpoint.display().to_string(),
        store: cfg.store.clone(),
        root: cfg.subdir.as_ref().map_or(crate::meta::ROOT_INO, |s| s.0),
        read_only: cfg.read_only,
        metrics: cfg.metrics,
        // The figures are counts, never names: every user of the mount may read them.
        stats_socket: Some((
            super::metrics::socket_path(&cfg.pid_file, std::process::id()),
            cfg.allow_other,
        )),
        access_log: cfg.access_log.clone(),
        scan: cfg.scan.clone(),
        backup_meta: cfg.backup_meta.clone(),
        // A daemon's SIGHUP (logrotate's) reopens its logs; a terminal's hangup unmounts.
        hangup: match std::env::var_os(DAEMON_LOG_ENV) {
            Some(_) => Hangup::Reopen,
            None => Hangup::Stop,
        },
    };
    let mut client = Client::open(meta.clone(), &client, |meta| {
        let sharing = sharing(&**meta, &coherence)?;
        coherence.start_alone(sharing == Sharing::Exclusive);
        meta.set_alone(sharing == Sharing::Exclusive);
        let cache = cache_config(cfg, sharing, follow, meta.limited())?;
        let now = |t: Duration| match cache.alone_ttl {
            Some(a) if sharing == Sharing::Exclusive => a,
            _ => t,
        };
        tracing::info!(
            "{}: kernel caches attributes {:?}, entries {:?}{}, writeback cache {}",
            sharing.describe(),
            now(cache.attr_ttl),
            now(cache.entry_ttl),
            if follow {
                " (following other mounts as they come and go)"
            } else {
                ""
            },
            if cache.writeback { "on" } else { "off" }
        );
        if cache.writeback {
            // The kernel stamps cached files' times with its coarse clock: ours must agree.
            crate::meta::use_coarse_clock();
        }
        let vfs = vfs::Config {
            background: true,
            append_at_end: !cache.writeback,
            atime: cfg.flags.atime,
            diratime: cfg.flags.diratime,
            durability: cfg.flags.durability(),
            ..vfs::Config::default()
        };
        let writeback = cache.writeback;
        decided = Some(cache);
        let coherence = coherence.clone();
        Ok(Setup {
            vfs,
            // The scanner's moves to quarantine, out of the kernel's caches.
            on_change: Some(coherence.sink()),
            on_alone: Some(Box::new(move |alone| {
                if coherence.set_alone(alone) {
                    let ttls = match (follow, alone) {
                        (false, _) => "",
                        (true, true) => ": long kernel cache TTLs",
                        (true, false) => ": short kernel cache TTLs",
                    };
                    let cache = match (writeback, alone) {
                        (false, _) => "",
                        (true, true) => "; the writeback cache takes writes again",
                        (true, false) => {
                            "; files opened for writing bypass the writeback cache (see \
                             docs/design.md)"
                        }
                    };
                    match alone {
                        true => {
                            tracing::info!("this mount now has the volume to itself{ttls}{cache}")
                        }
                        false => tracing::info!("another client mounted the volume{ttls}{cache}"),
                    }
                }
            })),
        })
    })?;
    let cache = decided.expect("decided when the client opened");
    let opts = MountOptions {
        allow_other: cfg.allow_other,
        read_only: cfg.read_only,
        flags: cfg.flags,
        labels: cfg.labels.clone(),
        threads: cfg.threads,
        volume: fmt.name.clone(),
        cache,
        coherence,
        // As much as unkai's own write buffers hold.
        dirty_allowance: cfg.store.budgets().1 as u64,
    };
    let mountpoint = &cfg.mountpoint;
    let mut session = match fuse::mount(client.export().clone(), mountpoint, &opts) {
        Ok(s) => s,
        Err(e) => {
            let _ = client.close(None);
            bail!("cannot mount at {}: {e}", mountpoint.display());
        }
    };
    write_pid_file(&cfg.pid_file, &cfg.meta_url);
    tracing::info!(
        "volume '{}'{} mounted at {} (pid {})",
        fmt.name,
        match &cfg.subdir {
            Some((_, path)) => format!(" (its directory {path})"),
            None => String::new(),
        },
        mountpoint.display(),
        std::process::id()
    );
    if cfg.foreground {
        eprintln!(
            "unkai: volume '{}' mounted at {} (Ctrl-C to unmount)",
            fmt.name,
            mountpoint.display()
        );
    }
    ready();

    let mut unmounter = session.unmount_callable();
    let mp = mountpoint.clone();
    client.on_signals(move |sig| {
        tracing::info!("{sig:?}: unmounting {}", mp.display());
        unmount(&mut unmounter, &mp);
    })?;

    let served = match session.run() {
        // The kernel ended the connection itself (seen now and then when a mount detached
        // while busy loses its last open file, and on `umount -f`): nothing more can come
        // through it, and what is pending is flushed below as at any unmount.
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            tracing::info!("the kernel closed the FUSE connection ({e})");
            Ok(())
        }
        other => other,
    };
    let res = client.close(Some(&cfg.pid_file.with_extension("staged")));
    let _ = std::fs::remove_file(meta_url_file(&cfg.pid_file));
    let _ = std::fs::remove_file(&cfg.pid_file);
    served.context("serving FUSE requests")?;
    res.context("flushing at unmount")?;
    tracing::info!("unmounted {}", mountpoint.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> MountConfig {
        MountConfig {
            mountpoint: "/mnt".into(),
            pid_file: "/run/x.pid".into(),
            allow_other: false,
            read_only: false,
            flags: fuse::MountFlags::default(),
            labels: Vec::new(),
            threads: 1,
            attr_ttl: None,
            entry_ttl: None,
            negative_ttl: None,
            writeback_cache: Writeback::Auto,
            passthrough: Writeback::Off,
            passthrough_dir: "/tmp/c/p".into(),
            scan: None,
            store: StoreConfig {
                writeback: Writeback::Auto,
                cache_dirs: vec!["/tmp/c".into()],
                stage_bytes: 1 << 30,
                cache_bytes: 0,
                disk_cache: None,
                free_space_ratio: 0.1,
                buffer_bytes: 0,
                memory_limit: 1 << 30,
                io_timeout: Duration::from_secs(20),
                io_deadline: Duration::from_secs(60),
                max_uploads: 20,
                upload_limit: None,
                download_limit: None,
                data_key: None,
                peer: None,
            },
            keep_cache: true,
            foreground: true,
            metrics: None,
            access_log: None,
            subdir: None,
            meta_url: "sqlite:///x".into(),
            backup_meta: None,
        }
    }

    #[test]
    fn alone_only_on_one_machine_engines() {
        assert!(Sharing::alone(EngineKind::Sqlite, 0));
        assert!(!Sharing::alone(EngineKind::Sqlite, 1));
        assert!(!Sharing::alone(EngineKind::Postgres, 0));
    }

    #[test]
    fn ttl_defaults_and_overrides() {
        let c = cache_config(&cfg(), Sharing::Exclusive, false, false).unwrap();
        assert_eq!(c.attr_ttl, Duration::from_secs(30));
        assert_eq!(c.negative_ttl, Duration::from_secs(30));
        assert!(c.writeback && !c.shared && c.fallback_ttl.is_none());
        // A capacity or quotas: write() itself must fail past them, which the cache cannot.
        let c = cache_config(&cfg(), Sharing::Exclusive, false, true).unwrap();
        assert!(!c.writeback);
        let c = cache_config(&cfg(), Sharing::Pushed, false, false).unwrap();
        assert_eq!(c.entry_ttl, Duration::from_secs(5));
        assert_eq!(c.fallback_ttl, Some(Duration::from_secs(1)));
        assert!(!c.writeback && c.shared);
        let mut o = cfg();
        o.attr_ttl = Some(2.0);
        o.negative_ttl = Some(0.0);
        o.writeback_cache = Writeback::On;
        let c = cache_config(&o, Sharing::Shared, false, false).unwrap();
        assert_eq!(c.attr_ttl, Duration::from_secs(2));
        assert_eq!(c.entry_ttl, Duration::from_secs(2));
        assert_eq!(c.negative_ttl, Duration::ZERO);
        assert!(c.writeback && c.fallback_ttl.is_none());
        // TTLs that follow other mounts: short while shared, long while alone; set ones don't.
        assert!(ttls_follow(&cfg(), EngineKind::Sqlite));
        assert!(!ttls_follow(&o, EngineKind::Sqlite));
        assert!(!ttls_follow(&cfg(), EngineKind::Postgres));
        let c = cache_config(&cfg(), Sharing::Shared, true, false).unwrap();
        assert_eq!(c.attr_ttl, Duration::from_secs(1));
        assert_eq!(c.alone_ttl, Some(Duration::from_secs(30)));
        assert!(!c.writeback && c.shared);
        let c = cache_config(&cfg(), Sharing::Exclusive, true, false).unwrap();
        assert_eq!(c.alone_ttl, Some(Duration::from_secs(30)));
        assert!(c.writeback);
    }
}
