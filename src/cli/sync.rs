//! `unkai sync SRC DST`: flags, how a volume endpoint is opened (its data side's flags, as
//! `mount` takes them) and the closing summary; the work is `crate::sync`.
//!
//! Not for: comparing or copying (that is `sync`).

use anyhow::bail;

/// Copy a tree of files between local directories, buckets and volumes, incrementally: what
/// is missing or differs (by size, and mtime where both sides keep one) is copied.
#[derive(clap::Args)]
#[command(
    long_about = "Copy a tree of files between local directories, buckets and volumes, \
incrementally: what is missing at DST or differs (by size; by size or mtime where both sides \
keep mtimes: directories and volumes) is copied, streamed in 8 MiB pieces, in parallel. Each \
file is written under a temporary name and renamed (a PUT of the whole object on a bucket), so \
a run killed half-way is resumed by running it again.\n\n\
SRC and DST are each a local directory (its contents are synced), file:///dir, \
s3://bucket[/prefix][?endpoint=...], gs://bucket[/prefix], az://container[/prefix] \
(credentials from the usual environment variables), or a volume: META-URL[:/path], e.g. \
sqlite:///var/lib/unkai/vol.db:/data. A volume is opened in this process, without a mount: \
its quotas, trash and scanning (--scan) apply; its data side takes mount's flags \
(--cache-dir, --max-uploads, ...).\n\n\
--dirs, --perms and --links keep directories, permission bits and symbolic links between \
directories and volumes (a bucket keeps directories as empty 'dir/' objects, and no \
permissions or links).\n\n\
--include/--exclude follow rsync: tried in the order given, the first match decides, an \
excluded directory excludes all under it; 'NAME' matches at any depth, '/NAME' at the top, \
'DIR/' directories only, '*' stays within a name, '**' crosses '/'.",
    after_help = "Examples:\n  unkai sync /data/photos s3://my-bucket/photos\n  unkai sync s3://my-bucket/photos sqlite:///var/lib/unkai/vol.db:/photos\n  unkai sync --dirs --perms --links /srv/www postgres://u@db/vol:/www\n  unkai sync s3://my-bucket/photos /mnt/unkai/photos --threads 32\n  unkai sync --dry-run --delete-dst /src/ /mnt/unkai/copy/\n  unkai sync --exclude '*.tmp' --exclude '.git/' ~/project file:///backup/project\n  unkai sync --include '*/' --include '*.csv' --exclude '*' s3://raw/ /mnt/unkai/csv"
)]
pub struct Args {
    /// Where to copy from: a directory, file:///dir, s3://, gs://, az:// URL, or
    /// META-URL[:/path].
    src: String,
    /// Where to copy to (created if missing): a directory, file:///dir, s3://, gs://,
    /// az://, or META-URL[:/path].
    dst: String,
    /// Replace an existing file only when the source's is newer (by mtime).
    #[arg(short, long, conflicts_with = "force_update")]
    update: bool,
    /// Replace every existing file, whatever its size or mtime.
    #[arg(short, long)]
    force_update: bool,
    /// Also compare the contents (SHA-256) of files whose size and mtime match.
    #[arg(long)]
    check_all: bool,
    /// Read back each copied file and compare its SHA-256 with the source's.
    #[arg(long)]
    check_new: bool,
    /// Show what would be copied and deleted; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Delete files at DST that SRC does not have (excluded files are kept).
    #[arg(long)]
    delete_dst: bool,
    /// Sync the paths this glob matches (before the rules given after it; rsync's rules).
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Skip the paths this glob matches (unless an earlier --include matched; rsync's rules).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Delete each file from SRC once DST has it (a move).
    #[arg(long)]
    delete_src: bool,
    /// Sync directories too, empty ones included.
    #[arg(long)]
    dirs: bool,
    /// Keep permission bits (between directories and volumes).
    #[arg(long)]
    perms: bool,
    /// Copy symbolic links as links (between directories and volumes); without it they
    /// are left out.
    #[arg(short, long)]
    links: bool,
    /// Files copied at once.
    #[arg(short = 'p', long, default_value_t = 10)]
    threads: usize,
    /// Directories listed at once.
    #[arg(long, default_value_t = 10)]
    list_threads: usize,
    /// Read at most this many megabits per second from SRC, all files together (0: no
    /// limit), as juicefs sync's --bwlimit.
    #[arg(long, default_value_t = 0, value_name = "MBPS")]
    bwlimit: u64,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
    #[command(
        flatten,
        next_help_heading = "A volume's data side (META-URL endpoints)"
    )]
    store: super::mount::StoreArgs,
    #[command(
        flatten,
        next_help_heading = "A volume's data side (META-URL endpoints)"
    )]
    scan: super::scan::ScanArgs,
}

/// The rules in their order on the command line (clap keeps each flag's values apart).
fn ordered_rules(a: &Args) -> Vec<(bool, String)> {
    let m = super::Cli::command_for_sync()
        .try_get_matches_from(std::env::args_os())
        .ok();
    let sub = m.as_ref().and_then(|m| m.subcommand_matches("sync"));
    let mut rules: Vec<(usize, bool, String)> = Vec::new();
    match sub {
        Some(sub) => {
            for (id, inc) in [("include", true), ("exclude", false)] {
                if let (Some(ix), Some(vals)) = (sub.indices_of(id), sub.get_many::<String>(id)) {
                    rules.extend(ix.zip(vals).map(|(i, v)| (i, inc, v.clone())));
                }
            }
            rules.sort_by_key(|r| r.0);
        }
        // Not called from the command line: includes first.
        None => {
            rules.extend(a.include.iter().map(|p| (0, true, p.clone())));
            rules.extend(a.exclude.iter().map(|p| (0, false, p.clone())));
        }
    }
    rules.into_iter().map(|(_, i, p)| (i, p)).collect()
}

/// Opens a client of the volume `meta_url` for a sync; SIGINT and SIGTERM stop starting
/// new files (a second one ends the process at once).
fn open_volume(
    meta_url: &str,
    store: &super::mount::StoreArgs,
    scan: &super::scan::ScanArgs,
) -> anyhow::Result<crate::volume::client::Client> {
    let args = super::front::VolumeArgs::of(meta_url, store.clone(), scan.clone());
    let (meta, cfg) = super::front::prepare(&args, "sync")?;
    let mut client = crate::volume::front::client(meta, &cfg, "(unkai sync)".into())?;
    client.on_signals(|sig| {
        if crate::sync::STOP.swap(true, std::sync::atomic::Ordering::Relaxed) {
            std::process::exit(130);
        }
        tracing::warn!("{sig:?}: no new file is started; stopping once those begun are done");
    })?;
    Ok(client)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let (store, scan) = (a.store.clone(), a.scan.clone());
    let mut filter = crate::sync::Filter::default();
    for (include, p) in ordered_rules(&a) {
        filter.push(include, &p).map_err(|e| {
            anyhow::anyhow!("--{} {e}", if include { "include" } else { "exclude" })
        })?;
    }
    let o = crate::sync::Options {
        src: a.src,
        dst: a.dst,
        update: a.update,
        force_update: a.force_update,
        check_all: a.check_all,
        check_new: a.check_new,
        dry_run: a.dry_run,
        delete_dst: a.delete_dst,
        delete_src: a.delete_src,
        dirs: a.dirs,
        perms: a.perms,
        links: a.links,
        filter,
        threads: a.threads,
        list_threads: a.list_threads,
        bwlimit: (a.bwlimit > 0).then(|| a.bwlimit * 1_000_000 / 8),
        quiet: a.quiet,
        open_volume: Some(Box::new(move |url: &str| open_volume(url, &store, &scan))),
    };
    let (s, took) = crate::sync::run(&o)?;
    println!("{}", crate::sync::summary_line(&s, took, o.dry_run));
    if let Some(first) = &s.first_failure {
        bail!(
            "{} files failed (the first: {first}); run the same command again to retry them",
            s.failed
        );
    }
    Ok(())
}
