//! `unkai destroy`: delete a volume, its metadata and its objects, after a confirmation.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::bail;

use crate::admin::destroy;
use crate::volume;

/// Delete a volume for good: its metadata and every object of it in the bucket.
///
/// Refused while any client has it mounted. Asks for the volume's name to confirm unless
/// --yes. Objects of other volumes in the same bucket are never touched.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai status sqlite:///var/lib/unkai/vol.db       # shows the volume's id\n  unkai destroy sqlite:///var/lib/unkai/vol.db 5f1c0c52-8f7e-4a51-9f0e-2b8d4c1e7a90\n  unkai destroy --yes postgres://unkai@db.example:5432/unkai 5f1c0c52-8f7e-4a51-9f0e-2b8d4c1e7a90"
)]
pub struct Args {
    /// The volume's META-URL.
    meta_url: String,
    /// The volume's id (as `unkai status` shows it): proof that this is the volume meant.
    uuid: String,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    yes: bool,
    /// Directories of the local staging and cache (default: as `mount`): the volume's
    /// directory there is removed too.
    #[arg(long, env = "UNKAI_CACHE_DIR")]
    cache_dir: Option<String>,
    /// No progress display.
    #[arg(long, short = 'q')]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let meta = volume::open_meta(&a.meta_url)?;
    let fmt = meta.format();
    if fmt.uuid != a.uuid {
        bail!(
            "the volume at {} is '{}' with id {}, not {}: check the id with `unkai status`",
            crate::meta::url::redact(&a.meta_url),
            fmt.name,
            fmt.uuid,
            a.uuid
        );
    }
    let live = destroy::live_mounts(&*meta)?;
    if live > 0 {
        bail!(
            "volume '{}' is mounted by {live} client(s) (see `unkai status`): unmount it \
             everywhere before destroying it",
            fmt.name
        );
    }
    let usage = meta.usage()?;
    if !a.yes {
        if !std::io::stdin().is_terminal() {
            bail!(
                "destroying volume '{}' needs a confirmation: pass --yes",
                fmt.name
            );
        }
        eprint!(
            "Destroy volume '{}' ({}): {} in {} inodes, in {}? Its data cannot be recovered.\n\
             Type the volume's name to confirm: ",
            fmt.name,
            fmt.uuid,
            super::human_bytes(usage.used_bytes),
            usage.inodes,
            fmt.storage
        );
        std::io::stderr().flush()?;
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        if line.trim() != fmt.name {
            bail!("not confirmed: nothing was deleted");
        }
    }
    let obj = volume::open_storage(&fmt)?;
    let rep = destroy::destroy(&*meta, &obj, a.quiet)?;
    drop(meta);
    if let crate::meta::url::MetaUrl::Sqlite(path) = crate::meta::url::MetaUrl::parse(&a.meta_url)?
    {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(&p);
        }
    }
    for dir in volume::cache_dirs(a.cache_dir.as_deref())? {
        let _ = std::fs::remove_dir_all(dir.join(&fmt.uuid));
    }
    println!(
        "destroyed volume '{}' ({}): {} objects deleted",
        fmt.name, fmt.uuid, rep.deleted
    );
    Ok(())
}
