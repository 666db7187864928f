//! The flags every network server takes (`unkai nfs`, `gateway`, `webdav`): the volume, its
//! data side as `mount` has it, the directory served, read-only, metrics and backups; and
//! [`run`], which checks them and serves the volume through a server (`volume::front`).
//! The Python package takes the same flags as its options ([`prepare`]).
//!
//! Not for: a server's own flags (listen address, credentials, export options: each in its
//! own command), or any protocol.

use std::future::Future;
use std::sync::Arc;

use anyhow::bail;

use super::mount::StoreArgs;
use crate::vfs::export::Export;
use crate::volume::{self, front::FrontConfig};

/// The volume a network server serves, and how.
#[derive(clap::Args, Clone)]
pub struct VolumeArgs {
    /// The volume (default: the embedded default volume).
    #[arg(value_name = "META-URL")]
    meta_url: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    scan: super::scan::ScanArgs,
    /// Serve this directory of the volume (a path from its root, e.g. /projects/a) instead
    /// of its root; it must exist. Nothing above it can be reached.
    #[arg(long, value_name = "PATH")]
    subdir: Option<String>,
    /// Serve the volume read-only: every change is refused with the protocol's error.
    #[arg(long)]
    read_only: bool,
    /// Serve the server's figures at http://ADDR/metrics in Prometheus' text format, e.g.
    /// 127.0.0.1:9567. Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Write a line per request to FILE (appended; SIGHUP reopens it, for logrotate): who,
    /// what, the result and how long it took, as a mount's `.accesslog` (see `unkai profile`).
    #[arg(long, value_name = "FILE")]
    access_log: Option<std::path::PathBuf>,
    /// Back up the metadata into the bucket this often (e.g. 1h; 0 turns it off), as
    /// `mount --backup-meta` does.
    #[arg(long, default_value = "1h", value_name = "INTERVAL")]
    backup_meta: String,
}

impl VolumeArgs {
    /// A volume opened by another command (`unkai sync`): its data side and scanning as
    /// given, the whole volume, writable, no figures served and no backups taken.
    pub fn of(meta_url: &str, store: StoreArgs, scan: super::scan::ScanArgs) -> VolumeArgs {
        VolumeArgs {
            meta_url: Some(meta_url.to_string()),
            store,
            scan,
            subdir: None,
            read_only: false,
            metrics: None,
            access_log: None,
            backup_meta: "0".into(),
        }
    }
}

/// Checks `args` (one line on the terminal for a bad one), opens the volume and serves it
/// through `serve` until it ends or SIGINT/SIGTERM comes; `what` names the server.
pub fn run<F, Fut>(args: &VolumeArgs, what: &'static str, serve: F) -> anyhow::Result<()>
where
    F: FnOnce(Arc<Export>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (meta, cfg) = prepare(args, what)?;
    volume::front::run(meta, &cfg, serve)
}

/// Checks `args` (one line for a bad one) and opens the volume's metadata: what
/// `volume::front` needs to serve it; `what` names the front end. For the servers above and
/// the in-process Python client, whose options are these flags.
pub fn prepare(
    args: &VolumeArgs,
    what: &'static str,
) -> anyhow::Result<(Arc<dyn crate::meta::Meta>, FrontConfig)> {
    let meta_url = match &args.meta_url {
        Some(u) if !u.contains("://") => bail!(
            "invalid META-URL '{u}': give a URL such as sqlite:///var/lib/unkai/vol.db or \
             postgres://user@host/db (leave it out for the embedded default volume)"
        ),
        Some(u) => u.clone(),
        None => volume::ensure_default()?,
    };
    let metrics = args
        .metrics
        .as_deref()
        .map(volume::metrics::check_addr)
        .transpose()?;
    let backup_every = super::mount::parse_interval("--backup-meta", &args.backup_meta)?;
    let meta = volume::open_meta(&meta_url)?;
    let damage = meta.check_storage()?;
    if let Some(first) = damage.first() {
        bail!(
            "the metadata database of {meta_url} is damaged ({first}); not serving it: run \
             `unkai fsck {meta_url}` for the whole report"
        );
    }
    let fmt = meta.format().clone();
    super::tag_log(&fmt.name);
    let subdir = match &args.subdir {
        Some(path) => Some((volume::subdir_ino(&*meta, path)?, path.clone())),
        None => None,
    };
    let store = args.store.check(&fmt)?;
    let scan = args.scan.check()?;
    let backup_meta = (!backup_every.is_zero()).then(|| crate::admin::backup::Schedule {
        every: backup_every,
        tmp_dir: store.cache_dirs[0].join(&fmt.uuid).join("backup"),
        meta_url: meta_url.clone(),
    });
    let cfg = FrontConfig {
        what,
        store,
        subdir,
        read_only: args.read_only,
        metrics,
        backup_meta,
        scan,
        access_log: args.access_log.clone(),
    };
    Ok((meta, cfg))
}
