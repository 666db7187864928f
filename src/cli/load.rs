//! `unkai load`: restore a volume's metadata from a dump into an empty database.

use std::io::IsTerminal;

use crate::admin::dump;
use crate::meta::url::MetaUrl;

/// Load a dump (`unkai dump`, or a backup `mount --backup-meta` made) into META-URL, which
/// must hold no volume: the volume is created there as it was dumped (same name, id, bucket
/// and settings), so mounting it shows the same files. Moves a volume between engines
/// (SQLite to PostgreSQL and back).
///
/// The loaded volume uses the same bucket and keys as the one dumped: mount one or the
/// other afterwards, never both, and never `unkai destroy` the old one (that deletes the
/// blocks both use): drop its database instead.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai load postgres://unkai@db.internal/unkai vol.json.zst        # from `unkai dump`\n  unkai load sqlite:///var/lib/unkai/restored.db /var/lib/unkai/bucket/myvol/UUID/meta/dump-2026-11-26-170405.json.zst\n  gunzip -c vol.json.gz | unkai load sqlite:///var/lib/unkai/vol.db -"
)]
pub struct Args {
    /// Where to load: the META-URL of an empty database.
    meta_url: String,
    /// The dump: a file (compressed with zstd or not), or `-` for standard input.
    file: String,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let url = MetaUrl::parse(&a.meta_url)?;
    let quiet = a.quiet || !std::io::stderr().is_terminal() || a.file == "-";
    let pb = super::progress_bar(0, "loading", quiet);
    let mut input = dump::open_dump(&a.file, &pb)?;
    let (fmt, counts) = dump::load(&url, &mut input)?;
    pb.finish_and_clear();
    eprintln!(
        "unkai: loaded volume '{}' ({}) into {url}: {} inodes, {} entries, {} xattrs, {} \
         chunks, {} slices; its data is in {}",
        fmt.name,
        fmt.uuid,
        counts.nodes,
        counts.edges,
        counts.xattrs,
        counts.chunks,
        counts.slices,
        fmt.storage
    );
    Ok(())
}
