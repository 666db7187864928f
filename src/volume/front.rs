//! The life of a network front end's client of a volume (`unkai nfs`, `gateway`, `webdav`):
//! the data side opened as a mount opens it, the session registered, a [`Vfs`] built, the
//! server run on a tokio runtime until it ends or SIGINT/SIGTERM comes, then everything
//! flushed and the session closed.
//!
//! Not for: any protocol (each server turns its requests into `vfs` calls in its own module),
//! flags (`cli::front`), or the FUSE mount (`volume::serve`).

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use nix::sys::signal::Signal;

use super::open::{self, StoreConfig};
use super::serve::{Ticker, block_signals, other_sessions, register_session};
use crate::meta::{Ino, Meta, ROOT_INO};
use crate::vfs::{self, Vfs};

/// How to serve a volume to a network front end; every field already checked by the caller.
#[derive(Clone, Debug)]
pub struct FrontConfig {
    /// What serves, for the session list and the log (`nfs`, `gateway`, `webdav`).
    pub what: &'static str,
    /// The data side: staging, caches, memory, the store's time limits, the data key.
    pub store: StoreConfig,
    /// The volume's directory served as the root (`--subdir`): its inode and path.
    pub subdir: Option<(Ino, String)>,
    /// Serve it read-only.
    pub read_only: bool,
    /// Where to serve `/metrics` (None: nowhere).
    pub metrics: Option<std::net::SocketAddr>,
    /// Backups of the metadata into the bucket (`--backup-meta`; None: off).
    pub backup_meta: Option<crate::admin::backup::Schedule>,
    /// Antivirus scanning of files written (None: off).
    pub scan: Option<open::ScanConfig>,
}

/// What a network server gets to serve.
#[derive(Clone)]
pub struct Front {
    pub vfs: Arc<Vfs>,
    /// The directory served as the root: `--subdir`'s inode, or the volume's root.
    pub root: Ino,
    /// Every change is to be refused (the protocol's read-only error).
    pub read_only: bool,
    /// The volume's name.
    pub name: String,
}

/// Serves the opened volume `meta` through `serve` (a protocol server: it binds its own
/// listener, so that the volume is open before anybody can connect) on a multi-threaded
/// tokio runtime, until it returns or SIGINT or SIGTERM comes; then flushes what is written
/// and closes the session. A server that fails is an error here.
pub fn run<F, Fut>(meta: Arc<dyn Meta>, cfg: &FrontConfig, serve: F) -> anyhow::Result<()>
where
    F: FnOnce(Front) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let fmt = meta.format().clone();
    // Signals are handled by one thread: block them before any thread starts.
    let sigs = block_signals()?;
    let metrics_listener = cfg.metrics.map(super::metrics::bind).transpose()?;
    let (store, backup_obj) =
        open::open_store(&fmt, meta.engine(), &cfg.store, cfg.backup_meta.is_some())?;
    register_session(&*meta, &format!("({} server)", cfg.what))?;
    let alone = |meta: &dyn Meta| {
        if meta.engine().one_machine() {
            if let Ok(n) = other_sessions(meta) {
                meta.set_alone(n == 0);
            }
        }
    };
    alone(&*meta);
    let vfs = Arc::new(Vfs::new(
        meta.clone(),
        store,
        vfs::Config {
            buffer_limit: cfg.store.budgets().1,
            ..vfs::Config::default()
        },
    ));
    if let Some(scan) = &cfg.scan {
        // Each event is logged by the scanner itself; a server has no access log of its own.
        open::start_scanning(&vfs, scan, Arc::new(|_: &str| {}))?;
    }
    let follower = {
        let meta = meta.clone();
        Ticker::start("unkai-sessions", super::serve::ALONE_CHECK, move || {
            alone(&*meta)
        })
    };
    let exporter = metrics_listener.map(|l| {
        let figures = super::metrics::Figures {
            volume: fmt.name.clone(),
            requests: Default::default(),
            vfs: vfs.clone(),
        };
        let socket = std::env::temp_dir().join(format!("unkai-stats-{}.sock", std::process::id()));
        super::metrics::Exporter::start(figures, socket, false, Some(l))
    });
    let exporter = exporter.transpose()?;
    let backups = cfg
        .backup_meta
        .clone()
        .zip(backup_obj)
        .map(|(schedule, obj)| crate::admin::backup::Backups::start(meta.clone(), obj, schedule));
    let front = Front {
        vfs: vfs.clone(),
        root: cfg.subdir.as_ref().map_or(ROOT_INO, |s| s.0),
        read_only: cfg.read_only,
        name: fmt.name.clone(),
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(format!("unkai-{}", cfg.what))
        .build()
        .context("cannot start the server's threads")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<Signal>();
    std::thread::Builder::new()
        .name("unkai-signals".into())
        .spawn(move || {
            while let Ok(sig) = sigs.wait() {
                if sig != Signal::SIGHUP {
                    let _ = stop.send(sig);
                    return;
                }
            }
        })?;
    let what = cfg.what;
    let served = rt.block_on(async move {
        let server = tokio::spawn(serve(front));
        tokio::select! {
            res = server => match res {
                Ok(res) => res,
                Err(e) => Err(anyhow::anyhow!("the {what} server stopped: {e}")),
            },
            sig = stopped => {
                if let Ok(sig) = sig {
                    tracing::info!("{sig:?}: stopping the {what} server");
                }
                Ok(())
            }
        }
    });
    // Requests still running hold handles; they end with the runtime.
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
    drop(follower);
    drop(backups);
    drop(exporter);
    let res = vfs.shutdown();
    served?;
    res.context("flushing at shutdown")?;
    tracing::info!("{what} server stopped; everything written is flushed");
    Ok(())
}
