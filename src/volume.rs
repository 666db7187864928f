//! Volumes as a user names them: META-URLs, the embedded default volume, formatting and
//! opening (metadata engine + bucket) with errors that say what to do; [`client`] runs the
//! life of a client of an opened volume, which [`serve`] mounts and [`front`] serves
//! through a network server.
//!
//! Not for: parsing flags (that is `cli`), or the file system a mount serves (that is `vfs`
//! + `fuse`).

pub mod client;
pub mod front;
pub mod metrics;
pub mod open;
pub mod serve;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::data::keys::{self, DataKey, Unlock};
use crate::data::{self, DataStore};
use crate::meta::format::{Compression, SCHEMA_VERSION};
use crate::meta::url::MetaUrl;
use crate::meta::{self, Format, Meta};
use crate::object::{self, ObjectStorage, Policy};

/// Where the embedded default volume lives: `~/.local/share/unkai/default`.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UNKAI_DEFAULT_DIR") {
        return PathBuf::from(d);
    }
    dirs::data_dir()
        .unwrap_or_else(|| PathBuf::from("/var/lib"))
        .join("unkai")
        .join("default")
}

/// The cache directories a mount or a command uses: `given` (paths separated by ':'), or
/// /var/cache/unkai for root and ~/.cache/unkai for others.
pub fn cache_dirs(given: Option<&str>) -> anyhow::Result<Vec<PathBuf>> {
    let dirs: Vec<PathBuf> = match given {
        Some(g) => g
            .split(':')
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect(),
        None if nix::unistd::geteuid().is_root() => vec![PathBuf::from("/var/cache/unkai")],
        None => vec![
            dirs::cache_dir()
                .unwrap_or_else(|| PathBuf::from("/var/tmp"))
                .join("unkai"),
        ],
    };
    if dirs.is_empty() {
        bail!("invalid --cache-dir '': give one or more directories separated by ':'");
    }
    if let Some(d) = dirs.iter().find(|d| d.is_relative()) {
        bail!(
            "invalid --cache-dir {}: use an absolute path, e.g. /var/cache/unkai",
            d.display()
        );
    }
    Ok(dirs)
}

pub fn default_meta_url() -> String {
    format!("sqlite://{}", default_dir().join("meta.db").display())
}

/// Settings for a new volume.
#[derive(Clone, Debug)]
pub struct FormatSpec {
    pub name: String,
    pub storage: String,
    pub block_size: u32,
    pub trash_days: u32,
    pub capacity: u64,
    /// Most inodes (0: unlimited).
    pub inodes: u64,
    /// Spread keys over 256 hashed prefixes (S3 partitions).
    pub hash_prefix: bool,
    /// How blocks are compressed.
    pub compress: Compression,
    /// Encryption at rest, and the key that wraps the data key.
    pub encrypt: Option<EncryptWith>,
    pub force: bool,
}

/// The key a user gives `format` to wrap a new volume's data key (`data::keys`).
#[derive(Clone, Debug)]
pub enum EncryptWith {
    /// An RSA private key's PEM file, its passphrase from the environment. A key without a
    /// passphrase is refused unless `unrecorded`, which records it nowhere (every command is
    /// then given the file).
    RsaKey { pem: PathBuf, unrecorded: bool },
    /// A key file: 32 random bytes or 64 hex digits.
    KeyFile(PathBuf),
}

/// The passphrase of an RSA key, from UNKAI_RSA_PASSPHRASE or else JFS_RSA_PASSPHRASE, and the
/// variable it came from.
fn passphrase() -> Option<(zeroize::Zeroizing<String>, &'static str)> {
    ["UNKAI_RSA_PASSPHRASE", "JFS_RSA_PASSPHRASE"]
        .into_iter()
        .find_map(|var| Some((zeroize::Zeroizing::new(std::env::var(var).ok()?), var)))
}

/// The data key of volume `fmt` (None: not encrypted), unwrapped with what the user gives:
/// the key file `key_file` (flags take UNKAI_ENCRYPT_KEY_FILE too; the PEM file of an RSA
/// key recorded nowhere), or the RSA key's passphrase from UNKAI_RSA_PASSPHRASE (or
/// JFS_RSA_PASSPHRASE). A wrong or missing one is an error of one line saying what to give.
/// A volume whose RSA key is recorded in the clear (formatted by an older unkai) opens, with
/// a warning of one line saying how to protect it.
pub fn data_key(fmt: &Format, key_file: Option<&Path>) -> anyhow::Result<Option<Arc<DataKey>>> {
    if fmt
        .encryption
        .as_ref()
        .is_some_and(|e| e.rsa_key_in_clear())
    {
        eprintln!(
            "unkai: warning: volume '{}' holds its RSA private key in the clear in its metadata \
             (formatted by an older unkai), so whoever reads the metadata, a dump or a backup \
             can decrypt its data: encrypt it with `UNKAI_RSA_PASSPHRASE=... unkai config \
             --protect-rsa-key META-URL`",
            fmt.name
        );
    }
    let unlock = Unlock {
        passphrase: passphrase(),
        key_file: key_file.map(Path::to_path_buf),
    };
    Ok(keys::unwrap(fmt, &unlock)?.map(Arc::new))
}

/// Checks a volume name: 2–63 characters of a-z, 0-9 and '-', not starting or ending with '-'.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = (2..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        bail!(
            "invalid volume name '{name}': use 2 to 63 characters of a-z, 0-9 and '-' \
             (not at either end), e.g. 'myvol'"
        );
    }
    Ok(())
}

/// Parses a size such as `4M`, `64K`, `1G` or `4194304`.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_uppercase();
            let mult: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                "P" => 1 << 50,
                _ => bail!("invalid size '{s}': unknown unit; use e.g. 64K, 4M, 1G"),
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: u64 = num.trim().parse().with_context(|| {
        format!("invalid size '{s}': expected a number with an optional unit, e.g. 4M")
    })?;
    n.checked_mul(mult)
        .with_context(|| format!("size '{s}' is too large"))
}

/// Parses the size given to `flag` (e.g. `--capacity`), where JuiceFS takes a bare number in
/// `juicefs_unit` (GiB for `--capacity`, MiB for `--buffer-size`...): a bare number other than
/// 0 is refused with a hint instead of being taken as bytes.
pub fn parse_size_flag(flag: &str, s: &str, juicefs_unit: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) && t.bytes().any(|b| b != b'0') {
        bail!(
            "invalid {flag} {t}: give a unit, e.g. {flag} {t}{unit} (a bare number is not \
             taken as bytes: JuiceFS reads it as {juicefs_unit})",
            unit = &juicefs_unit[..1]
        );
    }
    parse_size(t).with_context(|| format!("invalid {flag}"))
}

/// Creates a volume; refuses to overwrite one unless `spec.force`.
pub fn format(meta_url: &str, spec: &FormatSpec) -> anyhow::Result<Format> {
    let url = MetaUrl::parse(meta_url)?;
    check_name(&spec.name)?;
    if !(64 << 10..=16 << 20).contains(&spec.block_size) {
        bail!(
            "invalid block size {}: it must be between 64K and 16M (e.g. --block-size 4M)",
            spec.block_size
        );
    }
    // The keys first: a bad key file or passphrase is refused before the bucket is touched.
    let uuid = uuid();
    let encryption = match &spec.encrypt {
        None => None,
        Some(with) => {
            let key = DataKey::generate();
            Some(match with {
                EncryptWith::KeyFile(path) => keys::wrap_with_key_file(&key, path, &uuid)?,
                EncryptWith::RsaKey { pem, unrecorded } => {
                    let pass = passphrase();
                    keys::wrap_with_rsa(
                        &key,
                        pem,
                        pass.as_ref().map(|(p, _)| p.as_str()),
                        &uuid,
                        *unrecorded,
                    )?
                }
            })
        }
    };
    let obj = ObjectStorage::open(&spec.storage, true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Err(e) = rt.block_on(obj.check(&spec.name)) {
        if !object::is_missing_bucket(&e) {
            return Err(e.into());
        }
        // The bucket does not exist: create it if the backend and credentials allow.
        rt.block_on(obj.create_bucket()).map_err(|why| {
            anyhow::anyhow!(
                "{e}; creating the bucket failed too: {}",
                object::one_line(&why)
            )
        })?;
        eprintln!("unkai: created the bucket of {}", spec.storage);
        rt.block_on(obj.check(&spec.name))?;
    }
    let earlier = rt.block_on(object_under(&obj, &spec.name))?;
    if let Some(key) = &earlier {
        if !spec.force {
            bail!(
                "the bucket {} already holds objects of a volume named '{}' (e.g. {key}): \
                 choose another name or bucket, or pass --force to format beside them (this \
                 volume's keys carry its own id: it never reads, overwrites or deletes theirs)",
                spec.storage,
                spec.name
            );
        }
    }
    let encoded = spec.compress != Compression::None || encryption.is_some();
    let fmt = Format {
        name: spec.name.clone(),
        uuid,
        storage: spec.storage.clone(),
        block_size: spec.block_size,
        trash_days: spec.trash_days,
        capacity: spec.capacity,
        inodes: spec.inodes,
        created: meta::now_nanos(),
        schema: SCHEMA_VERSION,
        checksums: true,
        hash_prefix: spec.hash_prefix,
        // Volumes that neither compress nor encrypt keep the objects older binaries read.
        layout: if encoded {
            crate::meta::format::LAYOUT_ENCODED
        } else {
            crate::meta::format::LAYOUT_PLAIN
        },
        compress: spec.compress,
        encryption,
        quotas: false,
    };
    match &url {
        MetaUrl::Sqlite(path) => {
            meta::sqlite::SqliteMeta::create(path, meta_url, &fmt, spec.force)?
        }
        MetaUrl::Postgres(pg) => meta::postgres::PgMeta::create(pg, &fmt, spec.force)?,
    }
    if let Some(key) = earlier {
        eprintln!(
            "unkai: the bucket holds objects of an earlier volume named '{}' (e.g. {key}): \
             left as they are; this volume never touches them",
            spec.name
        );
    }
    Ok(fmt)
}

/// One object of a volume named `name` in the bucket, if any: under `NAME/`, or under
/// `HH/NAME/` (hashed keys). Probe objects (`.probe-*`) do not count.
async fn object_under(obj: &ObjectStorage, name: &str) -> anyhow::Result<Option<String>> {
    let prefixes =
        std::iter::once(format!("{name}/")).chain((0..=255u8).map(|h| format!("{h:02x}/{name}/")));
    for prefix in prefixes {
        let listed = obj.list(&prefix).await?;
        if let Some(o) = listed
            .into_iter()
            .find(|o| !o.key.rsplit('/').next().unwrap_or("").starts_with('.'))
        {
            return Ok(Some(o.key));
        }
    }
    Ok(None)
}

fn uuid() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Opens the metadata of an existing volume.
pub fn open_meta(meta_url: &str) -> anyhow::Result<Arc<dyn Meta>> {
    let url = MetaUrl::parse(meta_url)?;
    Ok(url.open()?)
}

/// The inode of the directory `path` of the volume (`mount --subdir`): `/a/b` or `a/b`, from
/// the volume's root. It must exist and be a directory; `..` is refused (a subdir mount must
/// not name what lies above it), and so is the trash (it stays the volume's own: deletions
/// in a subdir mount still go to `/.trash`, reachable from a mount of the whole volume).
pub fn subdir_ino(meta: &dyn Meta, path: &str) -> anyhow::Result<meta::Ino> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        bail!(
            "invalid --subdir {path}: give a path from the volume's root without '..', e.g. /projects/a"
        );
    }
    if parts.first().map(|p| p.as_bytes()) == Some(meta::trash::TRASH_NAME) {
        bail!(
            "invalid --subdir {path}: the trash cannot be mounted on its own; mount the whole \
             volume and use `unkai restore`"
        );
    }
    let mut ino = meta::ROOT_INO;
    for (i, part) in parts.iter().enumerate() {
        let shown = format!("/{}", parts[..=i].join("/"));
        let a = match meta.lookup(&meta::Ctx::ROOT, ino, part.as_bytes()) {
            Ok(a) => a,
            Err(e) if e.errno() == libc::ENOENT => bail!(
                "--subdir {path}: volume '{}' has no directory {shown}: create it through a \
                 mount of the whole volume (`mkdir -p MOUNTPOINT/{}`)",
                meta.format().name,
                parts.join("/")
            ),
            Err(e) => bail!("--subdir {path}: looking up {shown}: {e}"),
        };
        if a.kind != meta::Kind::Dir {
            bail!(
                "--subdir {path}: {shown} is not a directory in volume '{}'",
                meta.format().name
            );
        }
        ino = a.ino;
    }
    Ok(ino)
}

/// Opens the bucket a volume records, proving it usable. A bucket whose disk is full is
/// still opened (with a warning): mounting is how a user gets to delete files.
pub fn open_storage(fmt: &Format) -> anyhow::Result<ObjectStorage> {
    open_storage_with(fmt, Policy::default())
}

/// [`open_storage`], its requests run under `policy` (timeouts, retries, deadline).
pub fn open_storage_with(fmt: &Format, policy: Policy) -> anyhow::Result<ObjectStorage> {
    let obj = ObjectStorage::open_with(&fmt.storage, false, policy)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match rt.block_on(obj.check(&fmt.name)) {
        Ok(()) => {}
        Err(e) if e.errno() == libc::ENOSPC => {
            tracing::warn!("{e}: the bucket's disk is full; writes will fail until space is freed");
        }
        Err(e) => return Err(e.into()),
    }
    Ok(obj)
}

/// Opens the data layer of a volume; an encrypted one's data key is unwrapped first (see
/// [`data_key`]).
pub fn open_data(
    fmt: &Format,
    cfg: data::Config,
    key_file: Option<&Path>,
) -> anyhow::Result<DataStore> {
    open_data_with(fmt, cfg, key_file, Policy::default())
}

/// [`open_data`], its requests to the store run under `policy`.
pub fn open_data_with(
    fmt: &Format,
    mut cfg: data::Config,
    key_file: Option<&Path>,
    policy: Policy,
) -> anyhow::Result<DataStore> {
    if cfg.key.is_none() {
        cfg.key = data_key(fmt, key_file)?;
    }
    let obj = open_storage_with(fmt, policy)?;
    Ok(DataStore::new(obj, fmt.clone(), cfg)?)
}

/// Creates the embedded default volume if it does not exist yet; returns its META-URL.
pub fn ensure_default() -> anyhow::Result<String> {
    let url = default_meta_url();
    let dir = default_dir();
    if !dir.join("meta.db").exists() {
        let spec = FormatSpec {
            name: "default".into(),
            storage: format!("file://{}", dir.join("bucket").display()),
            block_size: 4 << 20,
            trash_days: 1,
            capacity: 0,
            inodes: 0,
            hash_prefix: false,
            compress: Compression::None,
            encrypt: None,
            force: false,
        };
        format(&url, &spec).context("creating the default volume")?;
        eprintln!("unkai: created the default volume in {}", dir.display());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("4X").is_err());
        assert!(parse_size("M").is_err());
        assert_eq!(
            parse_size_flag("--capacity", "100G", "GiB").unwrap(),
            100 << 30
        );
        assert_eq!(parse_size_flag("--capacity", "0", "GiB").unwrap(), 0);
        let e = parse_size_flag("--capacity", "100", "GiB")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--capacity 100G") && e.contains("GiB"), "{e}");
    }

    #[test]
    fn names() {
        assert!(check_name("myvol").is_ok());
        assert!(check_name("a-1").is_ok());
        for bad in ["", "a", "-a", "a-", "Vol", "a_b", &"x".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
