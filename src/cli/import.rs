//! `unkai import META-URL SOURCE --at DIR`: flags, opening the volume (its data side's flags,
//! as `mount` takes them) and the closing summary; the work is `crate::import`.
//!
//! Not for: listing or comparing objects (that is `import`).

use anyhow::bail;

/// Make files of a volume from a bucket's objects, by reference: no byte is copied.
#[derive(clap::Args)]
#[command(
    long_about = "Make files of a volume from a bucket's objects, by reference: no byte is \
copied. Each object under SOURCE becomes the file AT/KEY, whose bytes are read from the \
object itself (ranged GETs pinned to the ETag it had when imported, through the mount's block \
caches and read-ahead). Writing such a file copies on write into the volume's own blocks: the \
object is never changed, and gc, destroy and fsck never delete it. An object changed or \
deleted behind unkai makes reads of its file fail with EIO (and a log line naming it) until \
`unkai import --refresh` picks up the change; bytes of two versions are never mixed.\n\n\
--refresh lists SOURCE again: new objects are imported, files of changed objects are \
re-pointed at the new version, files of deleted objects are unlinked (to the trash); a file \
written since its import is left as it is (your bytes win).\n\n\
Every client that reads imported files needs credentials for SOURCE in its environment \
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL or ?endpoint=..., as for any \
s3:// store).",
    after_help = "Examples:\n  unkai import sqlite:///var/lib/unkai/vol.db s3://my-bucket/photos --at /photos\n  unkai import postgres://u@db/vol 's3://data?endpoint=http://10.0.0.5:9000' --at /data\n  unkai import --refresh sqlite:///var/lib/unkai/vol.db s3://my-bucket/photos --at /photos"
)]
pub struct Args {
    /// The volume.
    #[arg(value_name = "META-URL")]
    meta_url: String,
    /// The objects to import: s3://bucket[/prefix][?endpoint=...] (or gs://, az://, file://).
    source: String,
    /// The volume's directory that receives the files (made when missing).
    #[arg(long, default_value = "/", value_name = "DIR")]
    at: String,
    /// List SOURCE again: import new objects, re-point files of changed ones, unlink files
    /// of deleted ones (files written since their import are left as they are).
    #[arg(long)]
    refresh: bool,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten, next_help_heading = "The volume's data side")]
    store: super::mount::StoreArgs,
    #[command(flatten, next_help_heading = "The volume's data side")]
    scan: super::scan::ScanArgs,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if !a.meta_url.contains("://") {
        bail!(
            "invalid META-URL '{}': give the volume's URL first, e.g. unkai import \
             sqlite:///var/lib/unkai/vol.db s3://bucket/prefix --at /data",
            a.meta_url
        );
    }
    if !a.at.starts_with('/') || a.at.split('/').any(|c| c == "..") {
        bail!(
            "--at '{}': give a path from the volume's root that stays inside it, e.g. --at /data",
            a.at
        );
    }
    // The source first: a bad one changes nothing (the volume is not even opened).
    let started = std::time::Instant::now();
    let listed = crate::import::list_with_progress(&a.source, a.quiet)?;
    let args = super::front::VolumeArgs::of(&a.meta_url, a.store.clone(), a.scan.clone());
    let (meta, cfg) = super::front::prepare(&args, "import")?;
    let client = crate::volume::front::client(meta, &cfg, "(unkai import)".into())?;
    let vfs = client.export().vfs().clone();
    let ctx = crate::meta::Ctx {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        pid: std::process::id(),
        umask: 0o022,
    };
    let o = crate::import::Options {
        source: a.source,
        at: a.at,
        refresh: a.refresh,
        quiet: a.quiet,
    };
    let res = crate::import::run(&vfs, &ctx, &o, listed, started);
    drop(vfs);
    let closed = client.close(None);
    let (s, took) = res?;
    closed?;
    println!("{}", crate::import::summary_line(&s, took));
    if let Some(first) = &s.first_failure {
        bail!(
            "{} objects failed (the first: {first}); run the same command with --refresh to \
             retry them",
            s.failed
        );
    }
    Ok(())
}
