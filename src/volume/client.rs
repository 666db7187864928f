//! The life of a client of a volume, whatever serves it (the FUSE mount, `volume::serve`; a
//! network server, `volume::front`): signals blocked for one thread to take, the data side
//! opened, the session registered and followed, the vfs and its [`Export`] built with the
//! access log and antivirus scanning, the figures served, the metadata backed up; and at
//! the end everything stopped in its order, what is written flushed and the session closed.
//!
//! Not for: anything a front end does with the export (mounting, listening), flags (`cli`),
//! or the kernel's cache policy (`volume::serve`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{SigSet, Signal};

use super::open::{self, ScanConfig, StoreConfig};
use crate::admin::backup::{Backups, Schedule};
use crate::data::DataStore;
use crate::data::peers::Group;
use crate::meta::{ChangeSink, Ino, Meta, PeerInfo, SessionInfo};
use crate::vfs::export::{AccessLog, Export, Proto};
use crate::vfs::{self, Vfs};

/// How often a client of a one-machine volume checks whether it is alone on it.
pub(super) const ALONE_CHECK: Duration = Duration::from_secs(2);

/// Set by `mount -d` for its daemon: the log file its output goes to, which SIGHUP reopens.
pub const DAEMON_LOG_ENV: &str = "UNKAI_DAEMON_LOG";

/// What a client serves, and how; every field already checked by the caller.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// What the session list shows: the mountpoint, or what serves (`(nfs server)`).
    pub session: String,
    /// The data side: staging, caches, memory, the store's time limits, the data key.
    pub store: StoreConfig,
    /// The directory served as the root (`--subdir`'s inode, or the volume's root).
    pub root: Ino,
    /// Serve it read-only.
    pub read_only: bool,
    /// Where to serve `/metrics` (None: nowhere).
    pub metrics: Option<SocketAddr>,
    /// The unix socket `unkai stats` reads the figures from (None: none), and whether every
    /// user may read it.
    pub stats_socket: Option<(PathBuf, bool)>,
    /// A file the access log is also written to (`--access-log`).
    pub access_log: Option<PathBuf>,
    /// Antivirus scanning of files written (None: off).
    pub scan: Option<ScanConfig>,
    /// Backups of the metadata into the bucket (`--backup-meta`; None: off).
    pub backup_meta: Option<Schedule>,
    /// What SIGHUP does.
    pub hangup: Hangup,
}

/// What SIGHUP does to a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hangup {
    /// It stops, as SIGINT and SIGTERM do (a mount in the foreground of a terminal that
    /// went away).
    Stop,
    /// It reopens its log files (logrotate's `kill -HUP`) and goes on.
    Reopen,
}

/// How the vfs is set up, decided by the front end once the session is registered (a mount
/// decides from the other clients of the volume).
#[derive(Default)]
pub struct Setup {
    /// The vfs's settings (its buffer limit is the store's share, set here).
    pub vfs: vfs::Config,
    /// Told, every [`ALONE_CHECK`], whether this client is alone on a one-machine volume.
    pub on_alone: Option<Box<dyn Fn(bool) + Send>>,
    /// Told of the changes this client makes by itself, outside any request (the antivirus
    /// scanner moving a file to quarantine), so that the front end's caches drop what they
    /// held of them (a mount's kernel caches names for up to 30 s).
    pub on_change: Option<ChangeSink>,
}

/// A client of a volume, serving it until [`Client::close`].
pub struct Client {
    meta: Arc<dyn Meta>,
    export: Arc<Export>,
    sigs: Option<SigSet>,
    hangup: Hangup,
    exporter: Option<super::metrics::Exporter>,
    backups: Option<Backups>,
    follower: Option<Ticker>,
    /// Learns the peer cache group's members from the sessions (with `--peer-cache`).
    peers: Option<Ticker>,
}

impl Client {
    /// Opens the client of `meta` as `cfg` says: signals blocked (before any thread starts,
    /// so that every thread inherits the mask), the `/metrics` address bound and the access
    /// log opened (either refused is an error on the terminal), the data side opened, the
    /// session registered; then `setup` decides the vfs's settings, and the vfs, its export,
    /// scanning, the figures, backups and the following of other sessions start.
    pub fn open(
        meta: Arc<dyn Meta>,
        cfg: &ClientConfig,
        setup: impl FnOnce(&Arc<dyn Meta>) -> anyhow::Result<Setup>,
    ) -> anyhow::Result<Client> {
        let fmt = meta.format().clone();
        let sigs = block_signals()?;
        let metrics_listener = cfg.metrics.map(super::metrics::bind).transpose()?;
        let log = AccessLog::new(cfg.access_log.as_deref()).with_context(|| {
            format!(
                "cannot open the access log {} (--access-log)",
                cfg.access_log.as_deref().unwrap_or(Path::new("")).display()
            )
        })?;
        let (store, backup_obj) =
            open::open_store(&fmt, meta.engine(), &cfg.store, cfg.backup_meta.is_some())?;
        let peer = match &cfg.store.peer {
            Some(pc) => {
                let key = meta.peer_key()?;
                Some(store.join_group(pc, &key)?)
            }
            None => None,
        };
        let published = peer.as_ref().map(|g| PeerInfo {
            group: g.name().to_string(),
            addr: g.addr().map(|a| a.to_string()),
        });
        register_session(&*meta, &cfg.session, published)?;
        let peers = peer.map(|g| follow_peers(meta.clone(), g));
        let setup = setup(&meta)?;
        let vfs = Arc::new(Vfs::new(
            meta.clone(),
            store,
            vfs::Config {
                buffer_limit: cfg.store.budgets().1,
                ..setup.vfs
            },
        ));
        let export = Arc::new(Export::new(
            vfs.clone(),
            cfg.root,
            cfg.read_only,
            fmt.name.clone(),
            log,
        ));
        if let Some(scan) = &cfg.scan {
            // Weak: the vfs holds the scanner, which must not hold the vfs.
            let ex = Arc::downgrade(&export);
            let events = Arc::new(move |line: &str| {
                if let Some(ex) = ex.upgrade() {
                    ex.log().scan_event(line)
                }
            });
            if let Err(e) = open::start_scanning(&vfs, scan, events, setup.on_change) {
                let _ = vfs.shutdown();
                return Err(e);
            }
        }
        let exporter = super::metrics::Exporter::start(
            super::metrics::Figures {
                volume: fmt.name.clone(),
                export: export.clone(),
            },
            cfg.stats_socket.clone(),
            metrics_listener,
        );
        let exporter = match exporter {
            Ok(e) => e,
            Err(e) => {
                let _ = vfs.shutdown();
                return Err(e);
            }
        };
        if let Some(a) = exporter.as_ref().and_then(|e| e.http_addr()) {
            tracing::info!("metrics served at http://{a}/metrics");
        }
        let backups = cfg
            .backup_meta
            .clone()
            .zip(backup_obj)
            .map(|(schedule, obj)| Backups::start(meta.clone(), obj, schedule));
        let follower = meta
            .engine()
            .one_machine()
            .then(|| follow_sessions(meta.clone(), setup.on_alone));
        Ok(Client {
            meta,
            export,
            sigs: Some(sigs),
            hangup: cfg.hangup,
            exporter,
            backups,
            follower,
            peers,
        })
    }

    /// What this client serves.
    pub fn export(&self) -> &Arc<Export> {
        &self.export
    }

    /// Takes the signals in a thread of its own: SIGINT and SIGTERM (and SIGHUP, if it
    /// stops this client) each call `stop`; otherwise SIGHUP reopens the log files: the
    /// access log's, and a daemon's own (see [`DAEMON_LOG_ENV`]).
    pub fn on_signals(
        &mut self,
        mut stop: impl FnMut(Signal) + Send + 'static,
    ) -> anyhow::Result<()> {
        let sigs = self.sigs.take().context("the signals are taken already")?;
        let hangup = self.hangup;
        // Weak: the thread outlives the client (it waits for signals until the process
        // ends), and the volume must close with the client.
        let export = Arc::downgrade(&self.export);
        std::thread::Builder::new()
            .name("unkai-signals".into())
            .spawn(move || {
                let daemon_log = std::env::var_os(DAEMON_LOG_ENV).map(PathBuf::from);
                while let Ok(sig) = sigs.wait() {
                    if sig == Signal::SIGHUP && hangup == Hangup::Reopen {
                        if let Some(log) = &daemon_log {
                            match reopen_log(log) {
                                Ok(()) => {
                                    tracing::info!("SIGHUP: log file {} reopened", log.display())
                                }
                                Err(e) => {
                                    tracing::warn!("SIGHUP: cannot reopen {}: {e}", log.display())
                                }
                            }
                        }
                        if let Some(ex) = export.upgrade() {
                            ex.log().reopen();
                        }
                        continue;
                    }
                    stop(sig);
                }
            })?;
        Ok(())
    }

    /// Stops serving and closes: the following of other sessions and the backups first,
    /// then everything written flushed (while uploads remain, their progress is written to
    /// `progress` once a second, for `unkai umount` to show), then the figures; the session
    /// closes with the flush.
    pub fn close(mut self, progress: Option<&Path>) -> anyhow::Result<()> {
        // The mount's are logged as the kernel's connection ends (`fuse::adapter`).
        for p in self.export.requests().protocols() {
            if p != Proto::Fuse {
                tracing::info!("{}", self.export.requests().summary(p));
            }
        }
        drop(self.follower.take());
        drop(self.peers.take());
        drop(self.backups.take());
        let progress = progress.map(|p| {
            (
                upload_progress(self.export.vfs().store().clone(), p.to_path_buf()),
                p,
            )
        });
        let res = self.export.vfs().shutdown();
        drop(self.exporter.take());
        if let Some((ticker, path)) = progress {
            drop(ticker);
            let _ = std::fs::remove_file(path);
        }
        drop(self.meta);
        Ok(res?)
    }
}

/// Other clients' sessions on the volume (dead ones go at the heartbeats' clean-ups).
pub(super) fn other_sessions(meta: &dyn Meta) -> anyhow::Result<usize> {
    Ok(meta
        .sessions()?
        .into_iter()
        .filter(|s| s.pid != std::process::id())
        .count())
}

/// A thread that runs a job every `period` until dropped; the drop stops and joins it.
pub(super) struct Ticker(Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>);

impl Ticker {
    pub(super) fn start(
        name: &str,
        period: Duration,
        mut job: impl FnMut() + Send + 'static,
    ) -> Ticker {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                    job();
                }
            });
        match thread {
            Ok(t) => Ticker(Some((stop, t))),
            Err(e) => {
                tracing::warn!("cannot start thread {name}: {e}");
                Ticker(None)
            }
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some((stop, t)) = self.0.take() {
            drop(stop);
            let _ = t.join();
        }
    }
}

/// Keeps the volume told whether this client is alone on it (whether it may group commits
/// and answer from its cache), and `on_alone` (a mount's kernel TTLs). Drop it before the
/// volume closes, so that the volume's last reference goes with the client (SQLite
/// checkpoints its WAL when its connections close).
fn follow_sessions(meta: Arc<dyn Meta>, on_alone: Option<Box<dyn Fn(bool) + Send>>) -> Ticker {
    let check = move || match other_sessions(&*meta) {
        Ok(n) => {
            meta.set_alone(n == 0);
            if let Some(f) = &on_alone {
                f(n == 0);
            }
        }
        Err(e) => tracing::debug!("counting other sessions: {e}"),
    };
    Ticker::start("unkai-sessions", ALONE_CHECK, check)
}

/// While stopping: what is left to upload ("BLOCKS BYTES"), and on a second line why
/// uploads fail while they do, written once a second to `path` for `unkai umount` to show
/// (see `cli::umount`). Stops when dropped; the caller removes the file.
fn upload_progress(store: DataStore, path: PathBuf) -> Ticker {
    Ticker::start("unkai-progress", Duration::from_secs(1), move || {
        let (blocks, bytes) = store.staged();
        if blocks > 0 {
            let trouble = store.upload_trouble().unwrap_or_default();
            let _ = std::fs::write(&path, format!("{blocks} {bytes}\n{trouble}\n"));
        }
    })
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and so in every thread started after),
/// for one thread to wait for them.
fn block_signals() -> anyhow::Result<SigSet> {
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        sigs.add(s);
    }
    sigs.thread_block()?;
    Ok(sigs)
}

/// How often the members of a peer cache group are read from the sessions.
const PEERS_CHECK: Duration = Duration::from_secs(2);

/// Keeps `group` told its members: the live sessions of the volume that publish an address
/// in the same group (a session that ends, or whose client is found dead, drops out).
fn follow_peers(meta: Arc<dyn Meta>, group: Arc<Group>) -> Ticker {
    let check = move || match peer_members(&*meta, group.name()) {
        Ok(m) => group.set_members(m),
        Err(e) => tracing::debug!("reading the peer cache group's members: {e}"),
    };
    check();
    Ticker::start("unkai-peers", PEERS_CHECK, check)
}

/// The addresses the live sessions of group `name` serve blocks on.
fn peer_members(meta: &dyn Meta, name: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let now = crate::meta::now_nanos();
    Ok(meta
        .sessions()?
        .into_iter()
        .filter(|s| !crate::meta::session::session_dead(s, s.heartbeat, now))
        .filter_map(|s| s.peer.filter(|p| p.group == name)?.addr)
        .filter_map(|a| a.parse().ok())
        .collect())
}

/// Registers this client's session in the volume; `what` is what the session list shows,
/// `peer` the peer cache group it serves in.
fn register_session(meta: &dyn Meta, what: &str, peer: Option<PeerInfo>) -> anyhow::Result<()> {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    meta.new_session(SessionInfo {
        host,
        pid: std::process::id(),
        proc_start: crate::meta::session::proc_start(std::process::id()).unwrap_or(0),
        mountpoint: what.to_string(),
        version: env!("CARGO_PKG_VERSION").into(),
        started: 0,
        heartbeat: 0,
        id: 0,
        peer,
        ..Default::default()
    })?;
    Ok(())
}

/// Points standard output and error at `path` again (after logrotate moved the old file).
fn reopen_log(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    for fd in [1, 2] {
        // SAFETY: dup2 onto the process's own standard descriptors; `f` is open.
        if unsafe { libc::dup2(f.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
