//! `unkai fsck`: check a volume and optionally repair it.

use anyhow::bail;

use std::collections::HashSet;
use std::path::PathBuf;

use crate::admin::fsck::{self, Severity};
use crate::data::keys::DataKey;
use crate::data::{self, stage::Stage};
use crate::meta::Format;
use crate::volume;
use std::sync::Arc;

/// Uploads the blocks that mounts of this machine left staged (the volume is unmounted).
fn upload_staged(
    fmt: &Format,
    dirs: &[PathBuf],
    blocks: usize,
    quiet: bool,
    key: Option<Arc<DataKey>>,
) -> anyhow::Result<()> {
    println!("uploading {blocks} blocks left staged on this machine");
    let store = volume::open_data(
        fmt,
        data::Config {
            stage: Some(data::StageConfig {
                dirs: dirs.to_vec(),
                limit: u64::MAX,
                wait: std::time::Duration::ZERO,
                blocks: true,
            }),
            key,
            ..data::Config::default()
        },
        None,
    )?;
    let bar = super::progress_bar(blocks as u64, "uploading staged blocks", quiet);
    store.drain(|left, _| bar.set_position(blocks as u64 - left.min(blocks as u64)));
    bar.finish_and_clear();
    Ok(())
}

/// Check a volume's invariants: link counts, entries pointing nowhere, inodes no directory
/// reaches, slices whose objects are missing, objects no slice references (leaked), chunk
/// records out of bounds, usage counters. Exits 0 if the volume is consistent (leaked objects
/// are harmless garbage: `unkai gc --delete` removes them), 1 otherwise.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai fsck sqlite:///var/lib/unkai/vol.db\n  unkai fsck /mnt/vol                                   # the volume mounted there\n  unkai fsck --repair sqlite:///var/lib/unkai/vol.db     # on an unmounted volume\n  unkai fsck --verify sqlite:///var/lib/unkai/vol.db     # read and check every object"
)]
pub struct Args {
    /// The volume's META-URL, or the mountpoint of a mounted volume (default: the embedded
    /// default volume).
    #[arg(value_name = "META-URL|MOUNTPOINT")]
    meta_url: Option<String>,
    /// Fix what is safe to fix (link counts, entries pointing nowhere, orphans, reference
    /// counts, counters; unreachable inodes go to /lost+found). The volume must be unmounted.
    #[arg(long)]
    repair: bool,
    /// Check only the metadata, not the objects in the bucket.
    #[arg(long)]
    skip_objects: bool,
    /// Also read every object and check its contents (checksums, and that each is the block
    /// its key names): finds damaged, swapped or misdirected objects. Reads the whole volume.
    #[arg(long, conflicts_with = "skip_objects")]
    verify: bool,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
    /// The cache directories of mounts on this machine, separated by ':' (blocks staged
    /// there and not uploaded yet are found there; --repair uploads them) [default: as mount].
    #[arg(long, env = "UNKAI_CACHE_DIR")]
    cache_dir: Option<String>,
    /// The key file of a volume encrypted with one (`format --encrypt-key-file`), or the PEM
    /// file of an RSA key recorded nowhere (`--allow-unencrypted-rsa-key`); a recorded RSA
    /// key's passphrase comes from UNKAI_RSA_PASSPHRASE.
    #[arg(long, value_name = "FILE", env = "UNKAI_ENCRYPT_KEY_FILE")]
    encrypt_key_file: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let url = super::meta_url_of(a.meta_url)?;
    let meta = volume::open_meta(&url)?;
    let damage = meta.check_storage()?;
    if !damage.is_empty() {
        for d in &damage {
            println!("damaged database: {d}");
        }
        bail!(
            "the metadata database of {url} is damaged ({} problem(s) above): fsck cannot \
             repair the database file itself; restore it from a backup, or salvage what is \
             readable with `sqlite3 FILE .recover | sqlite3 NEW` and check NEW",
            damage.len()
        );
    }
    // A client killed without unmounting still has its row until a mount cleans it up; it
    // holds nothing (its staged blocks are found below).
    let now = crate::meta::now_nanos();
    let sessions: Vec<_> = meta
        .sessions()?
        .into_iter()
        .filter(|s| !crate::meta::session::session_dead(s, s.heartbeat, now))
        .collect();
    if !sessions.is_empty() {
        if a.repair {
            bail!(
                "the volume is mounted ({} at {}): unmount it before `fsck --repair`",
                sessions[0].host,
                sessions[0].mountpoint
            );
        }
        eprintln!(
            "unkai: warning: the volume is mounted by {} client(s); findings may be in flux",
            sessions.len()
        );
    }
    let obj = if a.skip_objects {
        None
    } else {
        Some(volume::open_storage(&meta.format())?)
    };
    let cache_dirs = volume::cache_dirs(a.cache_dir.as_deref())?;
    let uuid = meta.format().uuid.clone();
    let mut staged: HashSet<String> = Stage::peek(&cache_dirs, &uuid).into_iter().collect();
    let upload = a.repair && !staged.is_empty() && obj.is_some();
    // Reading objects (--verify) or encoding staged packs needs an encrypted volume's key.
    let key = match a.verify || upload {
        true => volume::data_key(&meta.format(), a.encrypt_key_file.as_deref())?,
        false => None,
    };
    if upload {
        upload_staged(
            &meta.format(),
            &cache_dirs,
            staged.len(),
            a.quiet,
            key.clone(),
        )?;
        staged = Stage::peek(&cache_dirs, &uuid).into_iter().collect();
    }
    let verify = a
        .verify
        .then(|| data::ObjectCheck::new(&meta.format(), key.clone()));
    let mut report = fsck::check(&*meta, obj.as_ref(), &staged, verify.as_ref(), a.quiet)?;
    let mut rounds = 0;
    while a.repair && report.problems.iter().any(|p| !p.fixes.is_empty()) && rounds < 4 {
        for p in report.problems.iter().filter(|p| !p.fixes.is_empty()) {
            println!("repairing: {}", p.message);
        }
        fsck::repair(&*meta, &report)?;
        rounds += 1;
        report = fsck::check(&*meta, obj.as_ref(), &staged, verify.as_ref(), a.quiet)?;
    }
    println!(
        "checked {} inodes, {} entries, {} chunks, {} slices, {} objects",
        report.inodes, report.entries, report.chunks, report.slices, report.objects
    );
    for p in &report.problems {
        let tag = match p.severity {
            Severity::Error => "ERROR",
            Severity::Garbage => "LEAKED",
        };
        println!("{tag} {}", p.message);
    }
    let errors = report.errors().count();
    let fixable = report.errors().filter(|p| !p.fixes.is_empty()).count();
    super::print_in_flight(&report.in_flight, "");
    if report.staged > 0 {
        println!(
            "{} blocks are staged for upload, not in the bucket yet ({} on this machine): the \
             mount holding them uploads them; blocks left by a mount that ended go up at the \
             next mount here or with `unkai fsck --repair`",
            report.staged,
            staged.len()
        );
    }
    if report.external_slices > 0 {
        println!(
            "{} external slices (objects imported by reference: read in place, never deleted \
             by unkai)",
            report.external_slices
        );
    }
    for line in &report.external_changed {
        println!("CHANGED {line}");
    }
    let leaked_bytes: u64 = report.leaked.iter().map(|o| o.size).sum();
    if !report.leaked.is_empty() {
        println!(
            "{} leaked objects ({}): harmless; `unkai gc --delete {}` deletes them",
            report.leaked.len(),
            super::human_bytes(leaked_bytes),
            crate::meta::url::redact(&url)
        );
    }
    if errors == 0 {
        println!("volume is consistent");
        Ok(())
    } else {
        bail!(
            "{errors} problem{} found{}",
            if errors == 1 { "" } else { "s" },
            if fixable > 0 {
                format!(" ({fixable} fixable with --repair)")
            } else {
                String::new()
            }
        )
    }
}
