//! The life of a network front end's client of a volume (`unkai nfs`, `gateway`, `webdav`):
//! a [`Client`] of the volume (the same life as a mount's), its export served by a protocol
//! server on a tokio runtime until the server ends or SIGINT/SIGTERM comes, then everything
//! flushed and the session closed.
//!
//! Not for: any protocol (each server turns its requests into `vfs` calls in its own module),
//! flags (`cli::front`), or the FUSE mount (`volume::serve`).

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use nix::sys::signal::Signal;

use super::client::{Client, ClientConfig, Hangup, Setup};
use super::open::{self, StoreConfig};
use crate::meta::{Ino, Meta, ROOT_INO};
use crate::vfs::export::Export;

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
    /// A file the access log is written to (`--access-log`; None: no log).
    pub access_log: Option<std::path::PathBuf>,
}

/// Serves the opened volume `meta` through `serve` (a protocol server: it binds its own
/// listener, so that the volume is open before anybody can connect) on a multi-threaded
/// tokio runtime, until it returns or SIGINT or SIGTERM comes; then flushes what is written
/// and closes the session. A server that fails is an error here.
pub fn run<F, Fut>(meta: Arc<dyn Meta>, cfg: &FrontConfig, serve: F) -> anyhow::Result<()>
where
    F: FnOnce(Arc<Export>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut client = client(meta, cfg, format!("({} server)", cfg.what))?;
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(format!("unkai-{}", cfg.what))
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = client.close(None);
            return Err(e).context("cannot start the server's threads");
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<Signal>();
    let mut stop = Some(stop);
    client.on_signals(move |sig| {
        if let Some(s) = stop.take() {
            let _ = s.send(sig);
        }
    })?;
    let what = cfg.what;
    let export = client.export().clone();
    let served = rt.block_on(async move {
        let server = tokio::spawn(serve(export));
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
    let res = client.close(None);
    served?;
    res.context("flushing at shutdown")?;
    tracing::info!("{what} server stopped; everything written is flushed");
    Ok(())
}

/// Opens a client of the volume `meta` as `cfg` says, its session shown as `session`: a
/// network server's, or the in-process Python client's (which serves no protocol). SIGINT,
/// SIGTERM and SIGHUP are blocked in the calling thread and the threads it starts (for
/// [`Client::on_signals`]).
pub fn client(meta: Arc<dyn Meta>, cfg: &FrontConfig, session: String) -> anyhow::Result<Client> {
    let client = ClientConfig {
        session,
        store: cfg.store.clone(),
        root: cfg.subdir.as_ref().map_or(ROOT_INO, |s| s.0),
        read_only: cfg.read_only,
        metrics: cfg.metrics,
        stats_socket: None,
        access_log: cfg.access_log.clone(),
        scan: cfg.scan.clone(),
        backup_meta: cfg.backup_meta.clone(),
        hangup: Hangup::Reopen,
    };
    let watched = meta.clone();
    let client = Client::open(meta, &client, |meta| {
        if meta.engine().one_machine() {
            if let Ok(n) = super::client::other_sessions(&**meta) {
                meta.set_alone(n == 0);
            }
        }
        Ok(Setup::default())
    })?;
    // Its changes are told to the other clients as they commit (PostgreSQL), and theirs keep
    // its cache coherent (a mount does the same, `serve::sharing`): without, a mount that
    // read a name before a change of this client committed (a group commits up to 10 ms
    // after it answered) kept the name.
    if let Err(e) = watched.watch(Box::new(|_| {})) {
        let _ = client.close(None);
        return Err(e.into());
    }
    Ok(client)
}
