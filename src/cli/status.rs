//! `unkai status`: a volume's settings, usage and active mounts.

use crate::volume;

/// Show a volume's settings, usage (bytes, inodes, objects) and the clients mounting it.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai status sqlite:///var/lib/unkai/vol.db\n  unkai status --json sqlite:///var/lib/unkai/vol.db\n  unkai status /mnt/vol                           # the volume mounted there"
)]
pub struct Args {
    /// The volume's META-URL, or the mountpoint of a mounted volume (default: the embedded
    /// default volume).
    #[arg(value_name = "META-URL|MOUNTPOINT")]
    meta_url: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let url = super::meta_url_of(a.meta_url)?;
    let meta = volume::open_meta(&url)?;
    let fmt = meta.format().clone();
    let usage = meta.usage()?;
    let sessions = meta.sessions()?;
    let objects: u64 = meta
        .all_slices()?
        .iter()
        .map(|(_, size, _)| (*size as u64).div_ceil(fmt.block_size as u64))
        .sum();
    if a.json {
        // The settings, but of the encryption only what it is: no wrapped key, no RSA key.
        let mut shown = serde_json::to_value(&fmt)?;
        if let Some(e) = &fmt.encryption {
            shown["encryption"] = serde_json::json!({ "cipher": e.cipher, "wrap": e.wrap });
        }
        let v = serde_json::json!({
            "format": shown,
            "usage": {
                "bytes": usage.used_bytes,
                "inodes": usage.inodes,
                "slices": usage.slices,
                "slice_bytes": usage.slice_bytes,
                "objects": objects,
                "pending_delete_slices": usage.pending_delete,
                "trash_purged_early": {
                    "entries": usage.trash_purged_early,
                    "bytes": usage.trash_purged_early_bytes,
                },
            },
            "sessions": sessions,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("volume '{}' ({})", fmt.name, fmt.uuid);
    println!("  metadata:   {}", crate::meta::url::redact(&url));
    println!("  storage:    {}", fmt.storage);
    println!(
        "  block size: {}   trash: {}   capacity: {}   inodes: {}",
        super::human_bytes(fmt.block_size as u64),
        super::days(fmt.trash_days),
        if fmt.capacity == 0 {
            "unlimited".to_string()
        } else {
            super::human_bytes(fmt.capacity)
        },
        if fmt.inodes == 0 {
            "unlimited".to_string()
        } else {
            fmt.inodes.to_string()
        }
    );
    println!(
        "  compression: {}   encryption: {}",
        fmt.compress.name(),
        fmt.encryption
            .as_ref()
            .map_or_else(|| "none".to_string(), |e| e.describe())
    );
    println!(
        "usage: {} in {} inodes; {} objects holding {} in {} slices; {} slices awaiting deletion",
        super::human_bytes(usage.used_bytes),
        usage.inodes,
        objects,
        super::human_bytes(usage.slice_bytes),
        usage.slices,
        usage.pending_delete
    );
    if usage.trash_purged_early > 0 {
        println!(
            "trash purged early for disk space: {} entries, {} (the disk under the bucket fell \
             below its free-space floor)",
            usage.trash_purged_early,
            super::human_bytes(usage.trash_purged_early_bytes)
        );
    }
    if sessions.is_empty() {
        println!("mounts: none");
    } else {
        println!("mounts:");
        for s in sessions {
            let age = (crate::meta::now_nanos() - s.heartbeat) / 1_000_000_000;
            println!(
                "  #{} {} pid {} at {} (unkai {}, heartbeat {}s ago; staged for upload: {} \
                 blocks, {})",
                s.id,
                s.host,
                s.pid,
                s.mountpoint,
                s.version,
                age,
                s.staged_blocks,
                super::human_bytes(s.staged_bytes)
            );
        }
    }
    Ok(())
}
