//! `unkai config`: show and change the settings of a formatted volume.
//!
//! Not for: settings a volume cannot change once formatted (refused here, with the reason),
//! or options of one mount (flags of `mount`).

use anyhow::bail;

use crate::volume;

/// Show a volume's settings, or change those that can change after `format`.
///
/// Mounted clients take a change at their next heartbeat (a few seconds).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai config sqlite:///var/lib/unkai/vol.db                       # show the settings\n  unkai config --capacity 200G --inodes 5000000 sqlite:///var/lib/unkai/vol.db\n  unkai config --trash-days 7 postgres://unkai@db.example:5432/unkai\n  unkai config --capacity 0 sqlite:///var/lib/unkai/vol.db          # no byte limit\n  UNKAI_RSA_PASSPHRASE=... unkai config --protect-rsa-key sqlite:///var/lib/unkai/vol.db"
)]
pub struct Args {
    /// The volume's META-URL, or the mountpoint of a mounted volume (default: the embedded
    /// default volume).
    #[arg(value_name = "META-URL|MOUNTPOINT")]
    meta_url: Option<String>,
    /// Days deleted data is kept before its objects are deleted (0: delete at once).
    #[arg(long)]
    trash_days: Option<u32>,
    /// Most bytes the volume may hold, e.g. 100G (0: unlimited).
    #[arg(long)]
    capacity: Option<String>,
    /// Most inodes the volume may hold (0: unlimited).
    #[arg(long)]
    inodes: Option<u64>,
    /// Refused: a volume's block size is fixed when it is formatted.
    #[arg(long, hide = true)]
    block_size: Option<String>,
    /// Refused: compression is fixed when a volume is formatted.
    #[arg(long, hide = true)]
    compress: Option<String>,
    /// Encrypt the RSA private key that a volume formatted by an older unkai holds in the
    /// clear, with the passphrase in UNKAI_RSA_PASSPHRASE (which mounts then need). Dumps and
    /// backups made before still hold it: delete them.
    #[arg(long)]
    protect_rsa_key: bool,
    /// Print the settings as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(b) = &a.block_size {
        bail!(
            "--block-size {b}: the block size cannot change once a volume is formatted (its \
             blocks are stored at that size); format a new volume to use another"
        );
    }
    if let Some(c) = &a.compress {
        bail!(
            "--compress {c}: compression cannot change once a volume is formatted (its blocks \
             are stored with it); format a new volume and copy the data to change it"
        );
    }
    let url = super::meta_url_of(a.meta_url)?;
    let meta = volume::open_meta(&url)?;
    let old = meta.format();
    let mut new = old.clone();
    if let Some(d) = a.trash_days {
        new.trash_days = d;
    }
    if let Some(c) = &a.capacity {
        new.capacity = volume::parse_size_flag("--capacity", c, "GiB")?;
    }
    if let Some(n) = a.inodes {
        new.inodes = n;
    }
    if a.protect_rsa_key {
        let pass = std::env::var("UNKAI_RSA_PASSPHRASE").unwrap_or_default();
        new.encryption = Some(crate::data::keys::protect(&old, &pass)?);
    }
    let mut changes = Vec::new();
    if new.trash_days != old.trash_days {
        changes.push(format!(
            "trash: {} -> {}",
            super::days(old.trash_days),
            super::days(new.trash_days)
        ));
    }
    if new.capacity != old.capacity {
        changes.push(format!(
            "capacity: {} -> {}",
            limit_bytes(old.capacity),
            limit_bytes(new.capacity)
        ));
    }
    if new.inodes != old.inodes {
        changes.push(format!(
            "inodes: {} -> {}",
            limit_count(old.inodes),
            limit_count(new.inodes)
        ));
    }
    if new.encryption != old.encryption {
        changes.push(
            "RSA key: in the clear -> encrypted by the passphrase in UNKAI_RSA_PASSPHRASE (dumps \
             and backups made before still hold it in the clear: delete them)"
                .into(),
        );
    }
    if !changes.is_empty() {
        meta.set_format(&new)?;
        let usage = meta.usage()?;
        for c in &changes {
            eprintln!("unkai: changed {c}");
        }
        if new.capacity > 0 && usage.used_bytes > new.capacity {
            eprintln!(
                "unkai: warning: the volume already holds {}, more than its new capacity: \
                 writes that grow it fail until files are deleted",
                super::human_bytes(usage.used_bytes)
            );
        }
        if new.inodes > 0 && usage.inodes > new.inodes {
            eprintln!(
                "unkai: warning: the volume already holds {} inodes, more than its new limit: \
                 creates fail until files are deleted",
                usage.inodes
            );
        }
    }
    if a.json {
        // As `status`: of the encryption only what it is, no wrapped key, no RSA key.
        let mut shown = serde_json::to_value(&new)?;
        if let Some(e) = &new.encryption {
            shown["encryption"] = serde_json::json!({ "cipher": e.cipher, "wrap": e.wrap });
        }
        println!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(());
    }
    println!("volume '{}' ({})", new.name, new.uuid);
    println!("  storage:    {}", new.storage);
    println!(
        "  block size: {} (fixed)",
        super::human_bytes(new.block_size as u64)
    );
    println!("  compression: {} (fixed)", new.compress.name());
    if let Some(e) = &new.encryption {
        println!("  encryption: {} (fixed)", e.describe());
    }
    println!("  trash:      {}", super::days(new.trash_days));
    println!("  capacity:   {}", limit_bytes(new.capacity));
    println!("  inodes:     {}", limit_count(new.inodes));
    Ok(())
}

fn limit_bytes(n: u64) -> String {
    if n == 0 {
        "unlimited".into()
    } else {
        super::human_bytes(n)
    }
}

fn limit_count(n: u64) -> String {
    if n == 0 {
        "unlimited".into()
    } else {
        n.to_string()
    }
}
