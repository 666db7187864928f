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
    /// 64 KiB (`data::block`), so that a small random read fetches little more than it reads.
    #[serde(default)]
    pub layout: u32,
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
        }
    }
}

/// The key layout `format` gives new volumes (see [`Format::layout`]).
pub const LAYOUT_VERSION: u32 = 2;

/// The metadata schema this binary writes and understands. 2: opens are recorded in the
/// volume (table `open`/`unkai_open`), so that a file open on one client survives an unlink
/// on another. 3: the slice ids each session took are recorded (`reserved`/`unkai_reserved`),
/// so that `gc` leaves alone uploads a live client may still commit. Volumes of older schemas
/// are upgraded when opened (binaries that do not record what they need then refuse them).
/// 4: inodes carry their `chattr` flags and the bytes their data really covers (`flags`,
/// `stored`), counted from the chunks when an older volume is upgraded.
pub const SCHEMA_VERSION: u32 = 4;
