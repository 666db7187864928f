//! `unkai dump`: write a volume's metadata to a file (or standard output) as JSON lines.

use std::io::IsTerminal;

use crate::admin::dump;
use crate::volume;

/// Write a volume's metadata to FILE as JSON lines (docs/dump-format.md): every inode,
/// entry, symlink, xattr, chunk, slice reference count, counter and setting, read in one
/// snapshot (consistent even while the volume is mounted). `unkai load` puts it back into an
/// empty database of either engine. File data stays in the bucket: it is not dumped.
///
/// FILE `-` writes to standard output; a name ending in `.zst` is compressed (zstd).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai dump sqlite:///var/lib/unkai/vol.db vol.json.zst\n  unkai dump 'postgres://unkai@db.internal/unkai' - | gzip > vol.json.gz\n  unkai dump sqlite:///var/lib/unkai/vol.db vol.json.zst && unkai load postgres://unkai@db.internal/unkai vol.json.zst   # SQLite to PostgreSQL"
)]
pub struct Args {
    /// The volume's META-URL.
    meta_url: String,
    /// Where to write: a file (`.zst`: compressed), or `-` for standard output.
    file: String,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let meta = volume::open_meta(&a.meta_url)?;
    let quiet = a.quiet || !std::io::stderr().is_terminal();
    let pb = super::progress_spinner("dumping", quiet);
    let counts = dump::dump_to(&*meta, &a.file, &pb, None)?;
    pb.finish_and_clear();
    let name = meta.format().name;
    eprintln!(
        "unkai: dumped volume '{name}': {} inodes, {} entries, {} xattrs, {} chunks, {} slices{}",
        counts.nodes,
        counts.edges,
        counts.xattrs,
        counts.chunks,
        counts.slices,
        if a.file == "-" {
            String::new()
        } else {
            format!(" to {}", a.file)
        }
    );
    Ok(())
}
