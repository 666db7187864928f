//! `unkai mount`: serve a volume at a mountpoint, in the foreground or as a daemon.
//!
//! Everything that can be checked is checked before anything starts, so a bad argument gets
//! a one-line error on the terminal (with `-d` too: the daemon reports back before detaching).
//! Then the checked flags go, as a plain [`MountConfig`], to `volume::serve`, which runs the
//! mount itself.
//!
//! Not for: the life of a mount (sessions, the kernel's cache policy, signals, the pid file,
//! shutdown: that is `volume::serve`).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::options;
use crate::fuse::{self, mounts};
use crate::volume::{
    self,
    serve::{self, MountConfig, StoreConfig, Writeback},
};

/// Mount a volume. With only MOUNTPOINT, mounts the embedded default volume (created on first
/// use under ~/.local/share/unkai/default).
#[derive(clap::Args, Clone)]
#[command(
    override_usage = "unkai mount [OPTIONS] [META-URL] <MOUNTPOINT>",
    // A flag given twice, or as a flag and again in -o, takes the last (as mount(8) does).
    args_override_self = true,
    after_help = "Examples:\n  unkai mount -d /mnt/unkai                                  # the default volume, in the background\n  unkai mount sqlite:///var/lib/unkai/vol.db /mnt/vol          # in the foreground; Ctrl-C unmounts\n  unkai mount -d --threads 16 --cache-size 50G sqlite:///var/lib/unkai/vol.db /mnt/vol\n  unkai mount -d --cache-dir /ssd1/unkai:/ssd2/unkai --stage-size 50G sqlite:///var/lib/unkai/vol.db /mnt/vol\n  UNKAI_RSA_PASSPHRASE=... unkai mount -d sqlite:///var/lib/unkai/vol.db /mnt/vol     # encrypted with --encrypt-rsa-key\n  unkai mount -d --encrypt-key-file /etc/unkai/vol.key sqlite:///var/lib/unkai/vol.db /mnt/vol\n  unkai mount -d --subdir /projects/a sqlite:///var/lib/unkai/vol.db /mnt/a   # one directory of the volume\n  unkai mount -d --metrics 127.0.0.1:9567 sqlite:///var/lib/unkai/vol.db /mnt/vol    # Prometheus scrapes /metrics\n  unkai mount -d -o nosuid,cache_size=50G,writeback=on sqlite:///var/lib/unkai/vol.db /mnt/vol\n  unkai mount -d --peer-cache 10.0.0.5:7600 --cache-group training postgres://db/vol /mnt/vol   # machines share their cached blocks"
)]
pub struct Args {
    /// [META-URL] MOUNTPOINT: the volume (default: the META-URL in the environment variable
    /// UNKAI_META_URL, which keeps a password out of the process list; else the embedded
    /// default volume) and where to mount it.
    #[arg(num_args = 1..=2, required = true, value_names = ["META-URL", "MOUNTPOINT"])]
    targets: Vec<String>,
    /// Run in the background, logging to a file; returns once the mount is ready.
    #[arg(short = 'd', long = "background")]
    background: bool,
    /// Log file of a background mount [default: one per mount, NAME@MOUNTPOINT.log (the
    /// mountpoint's '/' as '-') in /var/log/unkai for root, in ~/.local/share/unkai/log
    /// otherwise]. Every line names the volume and the pid; SIGHUP reopens the file.
    #[arg(long, env = "UNKAI_LOG_FILE")]
    log: Option<PathBuf>,
    /// Mount this directory of the volume (a path from its root, e.g. /projects/a) instead
    /// of its root; it must exist. Nothing above it can be reached through the mount (its
    /// `..` is itself); deletions still go to the volume's trash, at its root.
    #[arg(long, value_name = "PATH")]
    subdir: Option<String>,
    /// Let other users use the mount (always on when mounting as root).
    #[arg(long)]
    allow_other: bool,
    /// Mount read-only.
    #[arg(long)]
    read_only: bool,
    /// Mount options, comma-separated: nosuid, nodev, noexec (and suid, dev, exec, the
    /// defaults), noatime, relatime (the default), strictatime, nodiratime, lazytime, sync,
    /// dirsync, nosymfollow, ro, rw, allow_other, and every other option mount(8) calls
    /// file-system independent; every flag of this command as NAME=VALUE or NAME
    /// (cache_size=50G, subdir=/a, read_only); mount(8)'s _netdev, nofail, noauto, defaults
    /// and x-* are ignored.
    #[arg(short = 'o', long = "options", value_name = "OPTS")]
    options: Vec<String>,
    /// Threads serving kernel requests (each with its own /dev/fuse descriptor).
    #[arg(long, default_value_t = 8, env = "UNKAI_THREADS")]
    threads: usize,
    /// Seconds the kernel caches attributes [default: 30 when this mount has the volume to
    /// itself (an SQLite volume mounted nowhere else), 5 on a PostgreSQL volume (other mounts'
    /// changes are pushed; 1 while they cannot be), 1 otherwise].
    #[arg(long)]
    attr_ttl: Option<f64>,
    /// Seconds the kernel caches directory entries [default: as --attr-ttl].
    #[arg(long)]
    entry_ttl: Option<f64>,
    /// Seconds the kernel remembers that a name does not exist, 0 to disable [default: as
    /// --attr-ttl].
    #[arg(long)]
    negative_ttl: Option<f64>,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    scan: super::scan::ScanArgs,
    /// The kernel's writeback cache: small writes gather in the page cache and reach unkai
    /// in large batches; close and fsync still flush everything (the durability contract
    /// holds). `auto` (the default) turns it on when this mount starts with the volume to
    /// itself (an SQLite volume no other mount has open) and the volume has no capacity or
    /// quotas (write() itself must fail past them); PostgreSQL volumes and later mounts go
    /// without. While another client shares the volume, files opened for writing bypass it
    /// (it writes back whole pages, which would undo the other client's bytes beside ours).
    /// With it, times have the kernel's coarse clock, and a write refused later (past the
    /// largest file size, a limit set while mounted) fails at fsync or close instead.
    #[arg(long, value_enum, default_value_t = Toggle::Auto, env = "UNKAI_WRITEBACK_CACHE")]
    writeback_cache: Toggle,
    /// FUSE passthrough: a file opened for reading (at most 1 GiB) is copied to local disk
    /// (--cache-dir) at open and the kernel reads the copy directly, without unkai in the
    /// way. Needs root (CAP_SYS_ADMIN) and a kernel with FUSE passthrough (6.9+); `on` turns
    /// the writeback cache off (the kernel does not do both), `auto` is on for root when
    /// the writeback cache is off. While a file is open this way, opening it for writing
    /// on this mount fails with ETXTBSY. See docs/design.md, "FUSE passthrough".
    #[arg(long, value_enum, default_value_t = Toggle::Off, env = "UNKAI_PASSTHROUGH")]
    passthrough: Toggle,
    /// Drop the kernel's page cache of a file at every open (for volumes written elsewhere).
    #[arg(long)]
    no_keep_cache: bool,
    /// Serve the mount's figures at http://ADDR/metrics in Prometheus' text format (FUSE
    /// requests, bytes read and written, object requests, caches, staging, metadata
    /// transactions, memory), e.g. 127.0.0.1:9567. Off by default; `unkai stats MOUNTPOINT`
    /// needs no address.
    #[arg(long, value_name = "ADDR", env = "UNKAI_METRICS")]
    metrics: Option<String>,
    /// Also write the access log (one line per request: time, uid, gid, pid, process,
    /// operation, inodes and names, result, duration) to FILE; it is always readable live
    /// from MOUNTPOINT/.accesslog (by root), and `unkai profile` summarises either.
    #[arg(long, value_name = "FILE", env = "UNKAI_ACCESS_LOG")]
    access_log: Option<PathBuf>,
    /// Back up the metadata into the bucket this often (e.g. 1h, 30m, 2s; 0 turns it off):
    /// a compressed dump under NAME/UUID/meta/, the newest 24 kept, made by one mount of the
    /// volume at a time. `unkai load` restores one.
    #[arg(
        long,
        default_value = "1h",
        value_name = "INTERVAL",
        env = "UNKAI_BACKUP_META"
    )]
    backup_meta: String,
}

/// The flags of the data side, shared by `mount` and the network servers (`cli::front`).
#[derive(clap::Args, Clone)]
pub struct StoreArgs {
    /// Write-back: a file's new blocks are staged on local disk (--cache-dir) and uploaded
    /// behind the application; close and fsync wait for local disk only, and nothing staged
    /// is lost to a crash (the next mount uploads it). `auto`: on for a volume this client has
    /// to itself (SQLite) whose store is not a plain local directory; on a plain local
    /// directory, only small files are staged (packed together, one object for many). On a
    /// PostgreSQL volume,
    /// `on` weakens close-to-open: another client may read EIO until the upload lands (see
    /// the README's durability contract).
    #[arg(long, value_enum, default_value_t = Toggle::Auto, env = "UNKAI_WRITEBACK")]
    writeback: Toggle,
    /// Local directories for the staging area and the block cache, separated by ':' (blocks
    /// are spread over them) [default: /var/cache/unkai for root, ~/.cache/unkai otherwise].
    #[arg(long, env = "UNKAI_CACHE_DIR")]
    cache_dir: Option<String>,
    /// Bytes staged at most before writers wait for uploads to make room, e.g. 10G.
    #[arg(long, default_value = "10G", env = "UNKAI_STAGE_SIZE")]
    stage_size: String,
    /// The block cache on local disk (under --cache-dir), e.g. 50G; 0 turns it off. Blocks
    /// read or uploaded stay there across remounts, the least recently used evicted
    /// [default: the smaller of 100G and half the free space when the store is remote or
    /// answers late; 0 for a plain local directory, which is local disk already].
    #[arg(long, env = "UNKAI_CACHE_SIZE")]
    cache_size: Option<String>,
    /// The share of the cache directories' disks the block cache leaves free (0 to 1); on a
    /// file:// bucket, also the share of its disk below which the oldest trash is deleted
    /// early, to make room.
    #[arg(long, default_value_t = 0.1, env = "UNKAI_FREE_SPACE_RATIO")]
    free_space_ratio: f64,
    /// Memory for cached blocks (the first level, before the disk cache), e.g. 256M.
    #[arg(long, default_value = "256M", env = "UNKAI_MEMORY_CACHE_SIZE")]
    memory_cache_size: String,
    /// Memory the mount keeps within, e.g. 2G: a quarter at most for the memory cache, a
    /// quarter for write buffers, a quarter for blocks in flight (uploads, fetches, read-ahead:
    /// beyond it they wait, and read-ahead holds back); the rest is the metadata engine's
    /// caches and the threads.
    #[arg(long, default_value = "1G", env = "UNKAI_MEMORY_LIMIT")]
    memory_limit: String,
    /// Memory for buffered writes before writers flush themselves, e.g. 256M.
    #[arg(long, default_value = "256M")]
    buffer_size: String,
    /// Seconds one request to the object store may take before it is tried again.
    #[arg(long, default_value_t = 20.0, env = "UNKAI_IO_TIMEOUT")]
    io_timeout: f64,
    /// Seconds a request to the object store may take, its retries included, before the
    /// application gets EIO (a store that does not answer no longer blocks reads and fsync
    /// for as long as it hangs).
    #[arg(long, default_value_t = 60.0, env = "UNKAI_IO_DEADLINE")]
    io_deadline: f64,
    /// Uploads to the object store at most at once (puts of blocks, written through or from
    /// the staging area), as JuiceFS's flag of the same name.
    #[arg(
        long,
        default_value = "20",
        value_name = "N",
        env = "UNKAI_MAX_UPLOADS"
    )]
    max_uploads: String,
    /// Bandwidth of uploads to the object store at most, in Mbps (megabits per second, as
    /// JuiceFS's flag of the same name; 0: no limit), e.g. 100.
    #[arg(
        long,
        default_value = "0",
        value_name = "MBPS",
        env = "UNKAI_UPLOAD_LIMIT"
    )]
    upload_limit: String,
    /// Bandwidth of downloads from the object store at most, in Mbps (megabits per second;
    /// 0: no limit), e.g. 100.
    #[arg(
        long,
        default_value = "0",
        value_name = "MBPS",
        env = "UNKAI_DOWNLOAD_LIMIT"
    )]
    download_limit: String,
    /// The key file of a volume encrypted with one (`format --encrypt-key-file`), or the PEM
    /// file of an RSA key recorded nowhere (`format --allow-unencrypted-rsa-key`). A volume
    /// whose RSA key is recorded needs its passphrase in UNKAI_RSA_PASSPHRASE instead.
    #[arg(long, value_name = "FILE", env = "UNKAI_ENCRYPT_KEY_FILE")]
    encrypt_key_file: Option<PathBuf>,
    /// Join the volume's peer cache group: serve the blocks this client holds (cached,
    /// staged) to the group's other members on LISTEN-ADDR, an address and port they reach
    /// this machine at (e.g. 10.0.0.5:7600; port 0 picks a free one), and ask a block's owner
    /// among them before the bucket. Members find each other through the volume's sessions;
    /// they authenticate with a key kept in the volume's metadata. Listens nowhere else.
    #[arg(long, value_name = "LISTEN-ADDR", env = "UNKAI_PEER_CACHE")]
    peer_cache: Option<String>,
    /// The peer cache group's name: members of one group share blocks, other groups of the
    /// volume are not asked (as JuiceFS's flag of the same name).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "default",
        env = "UNKAI_CACHE_GROUP"
    )]
    cache_group: String,
    /// Ask the peer cache group's members for blocks but serve none (no LISTEN-ADDR needed;
    /// as JuiceFS's flag of the same name).
    #[arg(long)]
    no_sharing: bool,
    /// Bandwidth of the blocks served to the peer cache group at most, in Mbps (0: no limit).
    #[arg(long, default_value = "0", value_name = "MBPS")]
    peer_serve_limit: String,
    /// Seconds a request to a member of the peer cache group may take before the block is
    /// read from the bucket instead (the member is then bypassed for a while).
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    peer_timeout: f64,
}

impl StoreArgs {
    /// Checks the flags: one line naming the flag and the fix for a bad one.
    pub fn check(&self, fmt: &crate::meta::Format) -> anyhow::Result<StoreConfig> {
        let a = self;
        let cache_bytes =
            volume::parse_size_flag("--memory-cache-size", &a.memory_cache_size, "MiB")? as usize;
        let disk_cache = a
            .cache_size
            .as_deref()
            .map(|s| volume::parse_size_flag("--cache-size", s, "MiB"))
            .transpose()?;
        if !(0.0..1.0).contains(&a.free_space_ratio) {
            bail!(
                "invalid --free-space-ratio {}: give the share of the disk to keep free, from 0 \
                 to below 1, e.g. 0.1",
                a.free_space_ratio
            );
        }
        let buffer_bytes =
            volume::parse_size_flag("--buffer-size", &a.buffer_size, "MiB")? as usize;
        let memory_limit = volume::parse_size_flag("--memory-limit", &a.memory_limit, "MiB")?;
        if memory_limit < 64 << 20 {
            bail!(
                "invalid --memory-limit {}: give at least 64M, e.g. 1G",
                a.memory_limit
            );
        }
        let stage_bytes = volume::parse_size_flag("--stage-size", &a.stage_size, "MiB")?;
        let cache_dirs = volume::cache_dirs(a.cache_dir.as_deref())?;
        let io_timeout = serve::ttl(a.io_timeout, "io-timeout")?;
        let io_deadline = serve::ttl(a.io_deadline, "io-deadline")?;
        if io_timeout.is_zero() || io_deadline < io_timeout {
            bail!(
                "invalid --io-timeout {} / --io-deadline {}: both above 0, the deadline at \
                 least the timeout",
                a.io_timeout,
                a.io_deadline
            );
        }
        let max_uploads = match a.max_uploads.trim().parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => n,
            _ => bail!(
                "invalid --max-uploads '{}': give how many uploads may run at once, a whole \
                 number from 1 to 1024, e.g. 20",
                a.max_uploads
            ),
        };
        Ok(StoreConfig {
            max_uploads,
            upload_limit: bandwidth("--upload-limit", &a.upload_limit)?,
            download_limit: bandwidth("--download-limit", &a.download_limit)?,
            writeback: a.writeback.into(),
            cache_dirs,
            stage_bytes,
            cache_bytes,
            disk_cache,
            free_space_ratio: a.free_space_ratio,
            buffer_bytes,
            memory_limit,
            io_timeout,
            io_deadline,
            data_key: volume::data_key(fmt, a.encrypt_key_file.as_deref())?,
            peer: self.peer()?,
        })
    }

    /// The peer cache flags: None without `--peer-cache` or `--no-sharing`.
    fn peer(&self) -> anyhow::Result<Option<crate::data::peers::Config>> {
        let listen = match (&self.peer_cache, self.no_sharing) {
            (None, false) => return Ok(None),
            (_, true) => None,
            (Some(s), false) => {
                let bad = || {
                    anyhow::anyhow!(
                        "invalid --peer-cache '{s}': give the IP address and port the other                          members reach this machine at, e.g. 10.0.0.5:7600 (port 0: any free one)"
                    )
                };
                let a: std::net::SocketAddr = s.trim().parse().map_err(|_| bad())?;
                if a.ip().is_unspecified() {
                    bail!(
                        "invalid --peer-cache '{s}': the other members need an address they                          can reach, not {}; give this machine's, e.g. 10.0.0.5:{}",
                        a.ip(),
                        a.port()
                    );
                }
                Some(a)
            }
        };
        let g = &self.cache_group;
        if g.is_empty()
            || g.len() > 64
            || !g
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            bail!(
                "invalid --cache-group '{g}': give a name of 1 to 64 letters, digits, '.', '_'                  or '-', e.g. training"
            );
        }
        if !(self.peer_timeout > 0.0 && self.peer_timeout <= 600.0) {
            bail!(
                "invalid --peer-timeout {}: give the seconds a member may take, above 0 and at                  most 600, e.g. 5",
                self.peer_timeout
            );
        }
        Ok(Some(crate::data::peers::Config {
            listen,
            group: g.clone(),
            serve_limit: bandwidth("--peer-serve-limit", &self.peer_serve_limit)?,
            timeout: std::time::Duration::from_secs_f64(self.peer_timeout),
        }))
    }
}

/// A bandwidth flag in Mbps (megabits per second, as JuiceFS takes it; fractions allowed) as
/// bytes per second; 0: None, no limit.
fn bandwidth(flag: &str, given: &str) -> anyhow::Result<Option<u64>> {
    match given.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        // At least 8 Kbps (one KiB/s), at most 1 Tbps.
        Ok(m) if (0.008..=1e6).contains(&m) => Ok(Some((m * 1e6 / 8.0) as u64)),
        _ => bail!(
            "invalid {flag} '{given}': give the bandwidth in Mbps (megabits per second), from \
             0.008 to 1000000, e.g. 100; 0 for no limit"
        ),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Toggle {
    Auto,
    On,
    Off,
}

impl From<Toggle> for Writeback {
    fn from(t: Toggle) -> Writeback {
        match t {
            Toggle::Auto => Writeback::Auto,
            Toggle::On => Writeback::On,
            Toggle::Off => Writeback::Off,
        }
    }
}

/// Set in the environment of the daemon: the fd to report readiness on.
const READY_FD_ENV: &str = "UNKAI_READY_FD";

/// Checks the mountpoint: it must exist, be a directory and not be mounted already.
fn check_mountpoint(mp: &Path) -> anyhow::Result<PathBuf> {
    if mounts::is_stale(mp) {
        tracing::warn!(
            "{} is a stale mount (its server died); unmounting it",
            mp.display()
        );
        mounts::unmount(mp, true)
            .with_context(|| format!("cannot clear the stale mount at {}", mp.display()))?;
    }
    let meta = match std::fs::metadata(mp) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "mountpoint {} does not exist: create it with `mkdir -p {}`",
                mp.display(),
                mp.display()
            )
        }
        Err(e) => bail!("mountpoint {}: {e}", mp.display()),
    };
    if !meta.is_dir() {
        bail!(
            "mountpoint {} is not a directory: mount on an empty directory",
            mp.display()
        );
    }
    let canon = std::fs::canonicalize(mp)?;
    if let Some(m) = mounts::find(&canon) {
        bail!(
            "{} is already mounted ({} {}): unmount it first (`unkai umount {}`)",
            canon.display(),
            m.fstype,
            m.source,
            canon.display()
        );
    }
    if std::fs::read_dir(&canon).is_ok_and(|mut d| d.next().is_some()) {
        tracing::warn!(
            "mountpoint {} is not empty: its files are hidden while the volume is mounted",
            canon.display()
        );
    }
    Ok(canon)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Ok(v) = std::env::var(crate::cli::LOG_VOLUME_ENV) {
        // A daemon: its log's lines name the volume from the first one.
        crate::cli::tag_log(&v);
    }
    let mut ready = Ready(
        std::env::var(READY_FD_ENV)
            .ok()
            .and_then(|v| v.parse::<i32>().ok()),
    );
    let res = check_and_serve(a, &mut ready);
    if let Err(e) = &res {
        ready.report(Err(&format!("{e:#}")));
    }
    res
}

/// The environment variable that may hold the META-URL instead of the command line (which
/// every user of the machine can read in /proc): `unkai csi` mounts so.
pub(crate) const META_URL_ENV: &str = "UNKAI_META_URL";

/// Checks the flags, the mountpoint and the volume, then daemonizes or serves.
fn check_and_serve(a: Args, ready: &mut Ready) -> anyhow::Result<()> {
    let (meta_url, mountpoint) = match a.targets.as_slice() {
        [url] if url.contains("://") => bail!(
            "no MOUNTPOINT given after the META-URL: `unkai mount {url} /mnt/unkai` \
             (with a MOUNTPOINT alone, the embedded default volume is mounted)"
        ),
        [mp] => (
            std::env::var(META_URL_ENV).ok().filter(|u| !u.is_empty()),
            PathBuf::from(mp),
        ),
        [url, mp] => (Some(url.clone()), PathBuf::from(mp)),
        _ => bail!("expected [META-URL] MOUNTPOINT"),
    };
    let daemon = ready.0;
    let opts = mount_options(&a.options)?;
    if opts.remount {
        // `unkai mount -o remount,ro MOUNTPOINT`, as `mount -o remount,...` (the helper).
        let given: Vec<String> = a.options.iter().flat_map(|o| options::split(o)).collect();
        return super::helper::remount(&mountpoint.to_string_lossy(), &given);
    }
    let mountpoint = check_mountpoint(&mountpoint)?;
    let meta_url = match meta_url {
        Some(u) => u,
        None => volume::ensure_default()?,
    };
    for (v, what) in [
        (a.attr_ttl, "attr-ttl"),
        (a.entry_ttl, "entry-ttl"),
        (a.negative_ttl, "negative-ttl"),
    ] {
        if let Some(v) = v {
            serve::ttl(v, what)?;
        }
    }
    opts.warn();
    let MountOpts {
        flags,
        ro,
        allow_other,
        labels,
        ..
    } = opts;
    let metrics = a
        .metrics
        .as_deref()
        .map(crate::volume::metrics::check_addr)
        .transpose()?;
    let backup_every = parse_interval("--backup-meta", &a.backup_meta)?;
    // Open and check the volume here, so that errors reach the terminal.
    let meta = volume::open_meta(&meta_url)?;
    if daemon.is_none() {
        // Once, on the terminal's side (a daemon's parent checked before starting it).
        let damage = meta.check_storage()?;
        if let Some(first) = damage.first() {
            bail!(
                "the metadata database of {meta_url} is damaged ({first}); not mounting it: \
                 run `unkai fsck {meta_url}` for the whole report"
            );
        }
    }
    let fmt = meta.format().clone();
    crate::cli::tag_log(&fmt.name);
    let subdir = match &a.subdir {
        Some(path) => Some((volume::subdir_ino(&*meta, path)?, path.clone())),
        None => None,
    };
    // Checked here, so that a bad flag or a missing or wrong key is said on the terminal (a
    // daemon checks again: the key never crosses the pipe).
    let store = a.store.check(&fmt)?;
    let scan = a.scan.check()?;
    volume::open_storage(&fmt)?;

    if a.background && daemon.is_none() {
        drop(meta);
        return spawn_daemon(&a, &mountpoint, &fmt.name);
    }

    let backup_meta = (!backup_every.is_zero()).then(|| crate::admin::backup::Schedule {
        every: backup_every,
        tmp_dir: store.cache_dirs[0].join(&fmt.uuid).join("backup"),
        meta_url: meta_url.clone(),
    });
    let cfg = MountConfig {
        pid_file: crate::cli::pid_file(&mountpoint),
        mountpoint,
        allow_other: a.allow_other || allow_other || nix::unistd::geteuid().is_root(),
        read_only: ro.unwrap_or(a.read_only),
        flags,
        labels,
        threads: a.threads,
        attr_ttl: a.attr_ttl,
        entry_ttl: a.entry_ttl,
        negative_ttl: a.negative_ttl,
        writeback_cache: a.writeback_cache.into(),
        passthrough: a.passthrough.into(),
        passthrough_dir: store.cache_dirs[0].join(&fmt.uuid).join("passthrough"),
        store,
        scan,
        keep_cache: !a.no_keep_cache,
        foreground: daemon.is_none(),
        backup_meta,
        metrics,
        access_log: a.access_log,
        subdir,
        meta_url,
    };
    serve::serve(meta, &cfg, || ready.report(Ok(())))
}

/// What `-o` says once expanded (`cli::options`): the kernel's flags, read-only (if `ro` or
/// `rw` was given), `allow_other`, SELinux's labels, and whether it is a remount.
struct MountOpts {
    flags: fuse::MountFlags,
    ro: Option<bool>,
    allow_other: bool,
    labels: Vec<String>,
    remount: bool,
    /// Options taken and ignored (`fuse::IGNORED`): each is said once.
    ignored: Vec<(String, &'static str)>,
}

impl MountOpts {
    /// One warning line for each option taken that changes nothing.
    fn warn(&self) {
        for (o, why) in &self.ignored {
            tracing::warn!("mount option '{o}' is ignored: {why}");
        }
    }
}

/// The options of `-o`. An unknown option is an error rather than silently dropped.
fn mount_options(given: &[String]) -> anyhow::Result<MountOpts> {
    let mut out = MountOpts {
        flags: fuse::MountFlags::default(),
        ro: None,
        allow_other: false,
        labels: Vec::new(),
        remount: false,
        ignored: Vec::new(),
    };
    let all: Vec<String> = given.iter().flat_map(|o| options::split(o)).collect();
    for o in all.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        match o {
            "ro" => out.ro = Some(true),
            "rw" => out.ro = Some(false),
            "allow_other" => out.allow_other = true,
            "remount" => out.remount = true,
            "defaults" => {}
            // Checked by `options::expand` (SELinux must be on), which every `-o` went through.
            _ if options::is_label(o) => out.labels.push(o.to_string()),
            _ if out.flags.apply(o) => {
                if let Some((_, why)) = fuse::IGNORED.iter().find(|(n, _)| *n == o) {
                    if !out.ignored.iter().any(|(i, _)| i == o) {
                        out.ignored.push((o.to_string(), why));
                    }
                }
            }
            _ => bail!(
                "unknown mount option '{o}' (known: nosuid, nodev, noexec, suid, dev, exec, \
                 noatime, relatime, atime, strictatime, nodiratime, lazytime, sync, dirsync, \
                 nosymfollow, ro, rw, allow_other, defaults)"
            ),
        }
    }
    Ok(out)
}

/// The daemon's line back to its parent: how the mount went (reported once; no-op in the
/// foreground).
struct Ready(Option<i32>);

impl Ready {
    fn report(&mut self, res: Result<(), &str>) {
        if res.is_ok() {
            notify_systemd();
        }
        let Some(fd) = self.0.take() else { return };
        // SAFETY: the parent passed this descriptor for us alone; we close it after writing.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let _ = match res {
            Ok(()) => f.write_all(b"ok\n"),
            Err(msg) => f.write_all(format!("err {msg}\n").as_bytes()),
        };
    }
}

/// Tells systemd the mount is ready when it runs us as a `Type=notify` service
/// (contrib/unkai@.service): `READY=1` to the datagram socket `NOTIFY_SOCKET` names (a path,
/// or `@name` in the abstract namespace), as sd_notify(3) does.
fn notify_systemd() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    };
    let sent = addr.and_then(|addr| {
        let sock = UnixDatagram::unbound()?;
        sock.send_to_addr(b"READY=1\n", &addr)
    });
    if let Err(e) = sent {
        tracing::warn!("cannot tell systemd the mount is ready (NOTIFY_SOCKET={path}): {e}");
    }
}

/// The log file of a background mount of volume `volume` at `mountpoint` when none is given:
/// one per mount, `NAME@MOUNTPOINT.log` (`myvol@mnt-vol.log` for /mnt/vol), in /var/log/unkai
/// for root and beside the default volume's directory otherwise.
fn default_log_file(volume: &str, mountpoint: &Path) -> PathBuf {
    let dir = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/var/log/unkai")
    } else {
        volume::default_dir()
            .parent()
            .map(|d| d.join("log"))
            .unwrap_or_else(|| "log".into())
    };
    let mp: String = mountpoint
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| match c {
            '/' => '-',
            c if c.is_ascii_alphanumeric() || "._-".contains(c) => c,
            _ => '_',
        })
        .collect();
    dir.join(format!("{volume}@{mp}.log"))
}

/// Starts this same command as a daemon and waits until it reports the mount ready.
fn spawn_daemon(a: &Args, mountpoint: &Path, volume: &str) -> anyhow::Result<()> {
    let log = a
        .log
        .clone()
        .unwrap_or_else(|| default_log_file(volume, mountpoint));
    if let Some(d) = log.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("cannot open log file {}", log.display()))?;
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let w_raw = w.as_raw_fd();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|x| x != "-d" && x != "--background")
        .collect();
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(&args)
        .env(READY_FD_ENV, "3")
        .env(crate::volume::client::DAEMON_LOG_ENV, &log)
        .env(crate::cli::LOG_VOLUME_ENV, volume)
        .stdin(std::process::Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if w_raw == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            } else if libc::dup2(w_raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context("cannot start the mount daemon")?;
    drop(w);
    let mut answer = String::new();
    let mut rf = std::fs::File::from(r);
    let _ = rf.read_to_string(&mut answer);
    let answer = answer.trim();
    if answer == "ok" {
        println!(
            "unkai: volume '{volume}' mounted at {} (pid {}, log {})",
            mountpoint.display(),
            child.id(),
            log.display()
        );
        return Ok(());
    }
    if let Some(msg) = answer.strip_prefix("err ") {
        bail!("{msg}");
    }
    bail!(
        "the mount daemon exited before the mount was ready; see {}",
        log.display()
    )
}

/// Parses an interval as JuiceFS writes them (Go's durations): `1h`, `30m`, `1h30m`, `90s`,
/// `500ms`; a bare `0` is zero. The error names `flag` and gives an example.
pub(crate) fn parse_interval(flag: &str, s: &str) -> anyhow::Result<std::time::Duration> {
    let bad = || {
        anyhow::anyhow!(
            "invalid {flag} {s}: give a duration such as 1h, 30m or 90s (0 turns it off)"
        )
    };
    let t = s.trim();
    if t == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let secs = match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return Err(bad()),
        };
        total += n * secs;
        rest = &rest[unit..];
    }
    if t.is_empty() || !total.is_finite() {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs_f64(total))
}

#[cfg(test)]
mod interval_tests {
    use std::time::Duration;

    #[test]
    fn intervals() {
        let p = |s| super::parse_interval("--backup-meta", s);
        assert_eq!(p("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(p("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(p("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(p("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(p("0").unwrap(), Duration::ZERO);
        for bad in ["", "1", "h", "1d", "1h x", "-1h"] {
            let e = p(bad).unwrap_err().to_string();
            assert!(
                e.contains("--backup-meta") && e.contains("1h"),
                "{bad}: {e}"
            );
        }
    }
}
