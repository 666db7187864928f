//! The volume's settings, written once by `format` and read by every later command.
//!
//! Not for: runtime options of a mount (those are flags of `mount`), or where and how blocks
//! are stored in the bucket (keys, object sizes: `data::layout`).

use serde::{Deserialize, Serialize};

/// Settings recorded in the metadata by `unkai format`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Format {
    /// The volume's name; also the key prefix of its objects in the bucket.
    pub name: String,
    /// A unique id, so that two volumes of the same name are told apart.
    pub uuid: String,
    /// Where the blocks live: `file:///dir`, `memory://`, later `s3://`...
    pub storage: String,
    /// Size of a block (the unit of object storage), bytes.
    pub block_size: u32,
    /// Days deleted data is kept before its objects are deleted (0 = delete at once).
    pub trash_days: u32,
    /// Size the volume reports to `df` (bytes); 0 = unlimited (reported as 1 PiB).
    #[serde(default)]
    pub capacity: u64,
    /// Most inodes the volume may hold (files, directories, links...); 0 = unlimited.
    #[serde(default)]
    pub inodes: u64,
    /// When it was formatted (ns since the epoch).
    pub created: i64,
    /// Version of the metadata schema.
    pub schema: u32,
    /// Block objects carry CRC32C checksums (see `data::block`).
    #[serde(default)]
    pub checksums: bool,
    /// Keys start with a hashed two-hex-digit prefix, spreading load over S3 partitions.
    #[serde(default)]
    pub hash_prefix: bool,
    /// How block keys are made (`data::layout`): 0, `NAME/chunks/...` (volumes formatted
    /// before the volume's id was part of its keys); 1, `NAME/UUID/chunks/...`, so that two
    /// volumes sharing a bucket and a name can never share, read or delete each other's keys,
    /// and checksums sealed with the key; 2, the same with a checksum per 4 KiB instead of per
    /// 64 KiB (`data::block`), so that a small random read fetches little more than it reads;
    /// 3, the same with each object encoded (compressed and/or encrypted: `data::codec`).
    #[serde(default)]
    pub layout: u32,
    /// How block data is compressed before it is stored (`data::codec`); volumes formatted
    /// before compression existed read as `none`.
    #[serde(default)]
    pub compress: Compression,
    /// Encryption at rest of the block objects (`data::codec`, `data::keys`): `None`, blocks
    /// are stored as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
    /// Some directory has a quota (`unkai quota`): every client then keeps the quotas'
    /// usage in the transactions that change it (see `meta::quota`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quotas: bool,
}

impl Format {
    /// Whether block objects are encoded (a header, then compressed and/or encrypted data:
    /// `data::codec`), which layout 3 means. Volumes that neither compress nor encrypt keep
    /// the layout-2 objects, readable by binaries that predate the codec.
    pub fn encoded(&self) -> bool {
        self.layout >= LAYOUT_ENCODED
    }
}

/// How a volume compresses its blocks (`format --compress`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
}

impl Compression {
    /// Parses the value of `--compress`; the error is one line naming the choices.
    pub fn parse(s: &str) -> Result<Compression, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            _ => Err(format!(
                "invalid --compress {s}: use lz4 (fast), zstd (smaller) or none, e.g. \
                 --compress zstd"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// How a volume's data key is wrapped (`data::keys`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyWrap {
    /// RSA-OAEP (SHA-256) under the RSA key stored beside it, itself encrypted by a
    /// passphrase the user holds (`format --encrypt-rsa-key`, as JuiceFS). Volumes formatted
    /// before unkai refused unprotected keys may hold the key in the clear
    /// ([`Encryption::rsa_key_in_clear`]).
    RsaOaep,
    /// RSA-OAEP (SHA-256) under an RSA key without a passphrase, recorded nowhere: every
    /// command that reads data is given its PEM file (`format --encrypt-rsa-key
    /// --allow-unencrypted-rsa-key`, then `--encrypt-key-file`).
    RsaOaepKeyFile,
    /// AES-256-GCM under a key file the user holds, stored nowhere (`--encrypt-key-file`).
    KeyFile,
}

/// Encryption at rest of a volume: the cipher of its block objects and its data key, wrapped.
/// Never holds the data key itself; its `Debug` shows no key material.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encryption {
    /// The cipher of block objects: `aes-256-gcm` (`data::codec`).
    pub cipher: String,
    pub wrap: KeyWrap,
    /// The data key wrapped (`wrap`), in hex.
    pub wrapped_key: String,
    /// With [`KeyWrap::RsaOaep`]: the RSA private key, encrypted by its passphrase (PKCS#8
    /// PEM), so that a mount needs only the passphrase. Never a key in the clear, except on
    /// volumes formatted before that was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rsa_key: Option<String>,
    /// With [`KeyWrap::RsaOaepKeyFile`]: SHA-256 of the RSA public key (PKCS#1 DER), in hex,
    /// so that a PEM file of another key is told apart from damage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rsa_fingerprint: Option<String>,
}

impl Encryption {
    /// What `status` says of it: the cipher and how the key is wrapped, no key material.
    pub fn describe(&self) -> String {
        let wrap = match self.wrap {
            KeyWrap::RsaOaep if self.rsa_key_in_clear() => {
                "data key wrapped by an RSA key (RSA-OAEP) that the metadata holds UNPROTECTED \
                 (protect it: `unkai config --protect-rsa-key`)"
            }
            KeyWrap::RsaOaep => {
                "data key wrapped by an RSA key (RSA-OAEP) recorded encrypted by its passphrase, \
                 the passphrase needed (UNKAI_RSA_PASSPHRASE)"
            }
            KeyWrap::RsaOaepKeyFile => {
                "data key wrapped by an RSA key (RSA-OAEP) recorded nowhere, its PEM file \
                 needed (--encrypt-key-file)"
            }
            KeyWrap::KeyFile => {
                "data key wrapped by a key file (AES-256-GCM) recorded nowhere, the file needed \
                 (--encrypt-key-file)"
            }
        };
        format!("{}, {wrap}", self.cipher)
    }

    /// Whether `new` is `old` with its RSA key, recorded in the clear, now encrypted by a
    /// passphrase (`unkai config --protect-rsa-key`): the one change of a volume's encryption
    /// that is allowed, as the data key stays the same.
    pub fn protected_in_place(old: Option<&Encryption>, new: Option<&Encryption>) -> bool {
        match (old, new) {
            (Some(o), Some(n)) => {
                o.rsa_key_in_clear()
                    && n.rsa_key.is_some()
                    && !n.rsa_key_in_clear()
                    && Encryption {
                        rsa_key: None,
                        ..o.clone()
                    } == Encryption {
                        rsa_key: None,
                        ..n.clone()
                    }
            }
            _ => false,
        }
    }

    /// Whether the recorded RSA private key is in the clear (a volume formatted before
    /// unprotected keys were refused): whoever reads the metadata can decrypt the data.
    pub fn rsa_key_in_clear(&self) -> bool {
        self.rsa_key
            .as_deref()
            .is_some_and(|pem| !pem.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----"))
    }
}

impl std::fmt::Debug for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encryption")
            .field("cipher", &self.cipher)
            .field("wrap", &self.wrap)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl Format {
    /// A volume for unit tests: layout 0, checksums on, nothing else set.
    pub fn for_tests(name: &str, storage: &str, block_size: u32) -> Format {
        Format {
            name: name.into(),
            uuid: "u".into(),
            storage: storage.into(),
            block_size,
            trash_days: 0,
            capacity: 0,
            inodes: 0,
            created: 0,
            schema: SCHEMA_VERSION,
            checksums: true,
            hash_prefix: false,
            layout: 0,
            compress: Compression::None,
            encryption: None,
            quotas: false,
        }
    }
}

/// The key layout `format` gives new volumes that neither compress nor encrypt (see
/// [`Format::layout`]).
pub const LAYOUT_PLAIN: u32 = 2;

/// The layout of volumes that compress or encrypt: the keys and checksum segments of layout
/// 2, each object encoded (`data::codec`) and read whole. Binaries that predate it refuse
/// such volumes (they would read the encoded bytes as data, or write plaintext).
pub const LAYOUT_ENCODED: u32 = 3;

/// The newest layout this binary understands; volumes of newer ones are refused.
pub const LAYOUT_VERSION: u32 = LAYOUT_ENCODED;

/// The metadata schema this binary writes and understands. 2: opens are recorded in the
/// volume (table `open`/`unkai_open`), so that a file open on one client survives an unlink
/// on another. 3: the slice ids each session took are recorded (`reserved`/`unkai_reserved`),
/// so that `gc` leaves alone uploads a live client may still commit. Volumes of older schemas
/// are upgraded when opened (binaries that do not record what they need then refuse them).
/// 4: inodes carry their `chattr` flags and the bytes their data really covers (`flags`,
/// `stored`), counted from the chunks when an older volume is upgraded. 5: directory quotas
/// (`quota`/`unkai_quota`) and an index of entries by inode (a file's parents, whose quotas
/// its writes count in); binaries that do not keep quotas' usage must refuse such volumes.
/// 6: external slices (`external`/`unkai_external`, `unkai import`): slice ids with bit 62
/// set whose bytes are an object outside the volume; older binaries would take them for
/// blocks of the volume, so they must refuse such volumes.
pub const SCHEMA_VERSION: u32 = 6;
