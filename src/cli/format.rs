//! `unkai format`: create a volume.

use anyhow::Context;

use crate::meta::format::Compression;
use crate::meta::url::MetaUrl;
use crate::volume::{self, EncryptWith, FormatSpec};

/// Create a volume: its settings go into the metadata, so later commands need only META-URL.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai format sqlite:///var/lib/unkai/vol.db myvol\n  PGPASSWORD=secret unkai format --storage s3://bucket/vols postgres://unkai@db.example:5432/unkai myvol\n  unkai format --storage file:///data/bucket --block-size 1M sqlite:///var/lib/unkai/vol.db myvol\n  unkai format --compress zstd --storage s3://bucket/vols sqlite:///var/lib/unkai/vol.db myvol\n\n  # encrypted, the data key wrapped by an RSA key whose passphrase mounts need:\n  openssl genrsa -aes256 -out my.pem 2048\n  export UNKAI_RSA_PASSPHRASE=...   # the passphrase given to openssl\n  unkai format --encrypt-rsa-key my.pem --compress lz4 sqlite:///var/lib/unkai/vol.db myvol\n\n  # the same with a key that has no passphrase: recorded nowhere, every mount needs the file:\n  unkai format --encrypt-rsa-key open.pem --allow-unencrypted-rsa-key sqlite:///var/lib/unkai/vol.db myvol\n  unkai mount -d --encrypt-key-file open.pem sqlite:///var/lib/unkai/vol.db /mnt/vol\n\n  # encrypted, the data key wrapped by a key file that mounts need (--encrypt-key-file):\n  head -c 32 /dev/urandom > /etc/unkai/vol.key && chmod 600 /etc/unkai/vol.key\n  unkai format --encrypt-key-file /etc/unkai/vol.key sqlite:///var/lib/unkai/vol.db myvol\n  unkai format --capacity 100G --inodes 1000000 --trash-days 7 sqlite:///var/lib/unkai/vol.db myvol\n\n  unkai format --force sqlite:///var/lib/unkai/vol.db myvol    # erase and start afresh"
)]
pub struct Args {
    /// Where the metadata lives: sqlite:///var/lib/unkai/vol.db (an absolute path) or
    /// postgres://user@host:5432/db (password from PGPASSWORD or a password file).
    meta_url: String,
    /// Name of the volume (a-z, 0-9, '-'); also the key prefix of its objects in the bucket.
    name: String,
    /// Where the data blocks live: file:///abs/dir (a local directory used as the bucket),
    /// s3://bucket[/prefix][?endpoint=URL&region=R] (credentials from AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY or the usual AWS sources), gs://bucket[/prefix],
    /// az://container[/prefix], or memory:// (tests only). Default: a `bucket` directory beside
    /// the SQLite file.
    #[arg(long, env = "UNKAI_STORAGE")]
    storage: Option<String>,
    /// Size of a block, the unit of object storage (64K to 16M).
    #[arg(long, default_value = "4M")]
    block_size: String,
    /// Days deleted files and directories are kept in MOUNTPOINT/.trash before they go for
    /// good (`unkai restore` puts them back); 0: no trash, a deletion frees space at once.
    #[arg(long, default_value_t = 1, env = "UNKAI_TRASH_DAYS")]
    trash_days: u32,
    /// Most bytes the volume may hold, e.g. 100G or 1T: a write past it fails with ENOSPC,
    /// and `df` shows it (default: unlimited; `df` then shows the free space of a local
    /// bucket).
    #[arg(long)]
    capacity: Option<String>,
    /// Most inodes (files, directories, links...) the volume may hold; 0: unlimited. A create
    /// past it fails with ENOSPC.
    #[arg(long, default_value_t = 0)]
    inodes: u64,
    /// Start object keys with a hashed prefix (00/ to ff/), so that a busy volume spreads over
    /// many S3 partitions instead of hitting one.
    #[arg(long)]
    hash_prefix: bool,
    /// Compress each block before it is stored: lz4 (fast), zstd (smaller) or none. A block
    /// that does not shrink is stored as it is. Compressed volumes read whole blocks.
    #[arg(long, default_value = "none", value_name = "lz4|zstd|none")]
    compress: String,
    /// Encrypt every block (AES-256-GCM) under a random data key wrapped by this RSA private
    /// key (PEM, e.g. from `openssl genrsa -aes256`); its passphrase comes from
    /// UNKAI_RSA_PASSPHRASE (or JFS_RSA_PASSPHRASE), for format and every mount. The encrypted
    /// PEM is recorded in the volume, so mounts need only the passphrase. A key without a
    /// passphrase is refused (see --allow-unencrypted-rsa-key).
    #[arg(long, value_name = "FILE.pem", conflicts_with = "encrypt_key_file")]
    encrypt_rsa_key: Option<std::path::PathBuf>,
    /// Take an --encrypt-rsa-key without a passphrase. It is then recorded nowhere (a private
    /// key is never written in the clear into the metadata, dumps or backups): every mount
    /// and command that reads data needs the PEM file (--encrypt-key-file FILE.pem), and
    /// whoever reads that file can decrypt the data.
    #[arg(long, requires = "encrypt_rsa_key")]
    allow_unencrypted_rsa_key: bool,
    /// Encrypt every block (AES-256-GCM) under a random data key wrapped by this key file (32
    /// random bytes, or 64 hex digits), recorded nowhere: every mount needs it too
    /// (`--encrypt-key-file`, or UNKAI_ENCRYPT_KEY_FILE).
    #[arg(long, value_name = "FILE")]
    encrypt_key_file: Option<std::path::PathBuf>,
    /// Erase an existing volume at META-URL and create a new one. Its metadata is lost.
    #[arg(long)]
    force: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let url = MetaUrl::parse(&a.meta_url)?;
    let storage = match a.storage {
        Some(s) => s,
        None => match &url {
            MetaUrl::Sqlite(p) => {
                let dir = p.parent().context("the SQLite path has no directory")?;
                format!("file://{}", dir.join("bucket").display())
            }
            MetaUrl::Postgres(_) => anyhow::bail!(
                "--storage is required with a PostgreSQL META-URL (e.g. --storage \
                 s3://bucket/prefix, or file:///shared/dir for a single machine)"
            ),
        },
    };
    let block_size = volume::parse_size_flag("--block-size", &a.block_size, "KiB")?;
    if !(64 << 10..=16 << 20).contains(&block_size) {
        anyhow::bail!(
            "invalid block size {}: it must be between 64K and 16M (e.g. --block-size 4M)",
            a.block_size
        );
    }
    let capacity = a
        .capacity
        .as_deref()
        .map(|c| volume::parse_size_flag("--capacity", c, "GiB"))
        .transpose()?
        .unwrap_or(0);
    let compress = Compression::parse(&a.compress).map_err(anyhow::Error::msg)?;
    let encrypt = match (a.encrypt_rsa_key, a.encrypt_key_file) {
        (Some(pem), _) => Some(EncryptWith::RsaKey {
            pem,
            unrecorded: a.allow_unencrypted_rsa_key,
        }),
        (None, Some(file)) => Some(EncryptWith::KeyFile(file)),
        (None, None) => None,
    };
    let spec = FormatSpec {
        name: a.name,
        storage,
        block_size: block_size as u32,
        trash_days: a.trash_days,
        capacity,
        inodes: a.inodes,
        hash_prefix: a.hash_prefix,
        compress,
        encrypt,
        force: a.force,
    };
    let fmt = volume::format(&a.meta_url, &spec)?;
    println!(
        "formatted volume '{}' ({})\n  metadata: {}\n  storage:  {}\n  block size: {}, trash: {}\n  compression: {}, encryption: {}",
        fmt.name,
        fmt.uuid,
        url,
        fmt.storage,
        super::human_bytes(fmt.block_size as u64),
        super::days(fmt.trash_days),
        fmt.compress.name(),
        fmt.encryption
            .as_ref()
            .map_or_else(|| "none".to_string(), |e| e.describe())
    );
    Ok(())
}
