//! `unkai gc`: find and delete garbage objects.

use std::time::Duration;

use crate::admin::gc;
use crate::volume;

/// Find objects no slice references (leaked by a crash between upload and commit) and, with
/// --delete, delete them together with the objects of dead slices whose trash period is over.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai gc sqlite:///var/lib/unkai/vol.db              # report only\n  unkai gc /mnt/vol                                    # the volume mounted there\n  unkai gc --delete sqlite:///var/lib/unkai/vol.db"
)]
pub struct Args {
    /// The volume's META-URL, or the mountpoint of a mounted volume (default: the embedded
    /// default volume).
    #[arg(value_name = "META-URL|MOUNTPOINT")]
    meta_url: Option<String>,
    /// Delete what is found (without it, only report).
    #[arg(long)]
    delete: bool,
    /// On a mounted volume, leave unreferenced objects younger than this many seconds too
    /// (uploads a live client may still commit are left alone whatever their age).
    #[arg(long, default_value_t = 3600)]
    min_age: u64,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
    /// The key file of a volume encrypted with one (`format --encrypt-key-file`), or the PEM
    /// file of an RSA key recorded nowhere (`--allow-unencrypted-rsa-key`); a recorded RSA
    /// key's passphrase comes from UNKAI_RSA_PASSPHRASE.
    #[arg(long, value_name = "FILE", env = "UNKAI_ENCRYPT_KEY_FILE")]
    encrypt_key_file: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let url = super::meta_url_of(a.meta_url)?;
    let meta = volume::open_meta(&url)?;
    let store = volume::open_data(
        &meta.format(),
        crate::data::Config::default(),
        a.encrypt_key_file.as_deref(),
    )?;
    let rep = gc::gc(
        &*meta,
        &store,
        a.delete,
        Duration::from_secs(a.min_age),
        a.quiet,
    )?;
    let bytes: u64 = rep.leaked.iter().map(|o| o.size).sum();
    println!(
        "{} leaked objects ({})",
        rep.leaked.len(),
        super::human_bytes(bytes)
    );
    super::print_in_flight(&rep.in_flight, "; left alone");
    if a.delete {
        let young = if rep.young > 0 {
            format!(
                " ({} left: younger than {}s on a mounted volume)",
                rep.young, a.min_age
            )
        } else {
            String::new()
        };
        println!(
            "deleted {} leaked objects{young}; reclaimed {} dead slices",
            rep.deleted, rep.reclaimed
        );
    } else if !rep.leaked.is_empty() {
        println!("run with --delete to delete them");
    }
    Ok(())
}
