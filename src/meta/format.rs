//! The volume's settings, written once by `format` and read by every later command.
//!
//! Not for: runtime options of a mount (those are flags of `mount`).

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
}

/// The metadata schema this binary writes and understands. 2: opens are recorded in the
/// volume (table `open`/`unkai_open`), so that a file open on one client survives an unlink
/// on another; volumes of schema 1 are upgraded when opened.
pub const SCHEMA_VERSION: u32 = 2;

impl Format {
    /// The key of block `index` (of length `len`) of slice `id`.
    ///
    /// Slices are spread over directories by id so that no directory (or list prefix) grows
    /// without bound: `NAME/chunks/<id/1M>/<id/1K>/<id>_<index>_<len>`.
    pub fn block_key(&self, id: u64, index: u32, len: u32) -> String {
        let hashed = if self.hash_prefix {
            format!("{:02x}/", Self::key_hash(id))
        } else {
            String::new()
        };
        format!(
            "{hashed}{}/chunks/{}/{}/{}_{}_{}",
            self.name,
            id / 1_000_000,
            id / 1_000,
            id,
            index,
            len
        )
    }

    /// The hashed prefix of a slice's keys: spread evenly over 256 values.
    fn key_hash(id: u64) -> u8 {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
    }

    /// The prefixes under which the block objects of this volume live (256 with hashed keys).
    pub fn chunks_prefixes(&self) -> Vec<String> {
        if self.hash_prefix {
            (0..=255u8)
                .map(|h| format!("{h:02x}/{}/chunks/", self.name))
                .collect()
        } else {
            vec![format!("{}/chunks/", self.name)]
        }
    }

    /// Size in the bucket of a block holding `len` bytes of data.
    pub fn object_size(&self, len: u32) -> u64 {
        len as u64
            + if self.checksums {
                crate::data::block::trailer_len(len as usize) as u64
            } else {
                0
            }
    }

    /// Parses a block key back into `(slice id, block index, length)`.
    pub fn parse_block_key(key: &str) -> Option<(u64, u32, u32)> {
        let file = key.rsplit('/').next()?;
        let mut it = file.split('_');
        let id = it.next()?.parse().ok()?;
        let index = it.next()?.parse().ok()?;
        let len = it.next()?.parse().ok()?;
        if it.next().is_some() {
            return None;
        }
        Some((id, index, len))
    }

    /// Number of blocks of a slice of `size` bytes, and the length of block `i`.
    pub fn blocks_of(&self, size: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        let bs = self.block_size;
        let n = size.div_ceil(bs);
        (0..n).map(move |i| (i, (size - i * bs).min(bs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_roundtrip() {
        let f = Format {
            name: "vol".into(),
            uuid: "u".into(),
            storage: "memory://".into(),
            block_size: 4 << 20,
            trash_days: 0,
            capacity: 0,
            created: 0,
            schema: SCHEMA_VERSION,
            checksums: true,
            hash_prefix: false,
        };
        let k = f.block_key(1_234_567, 3, 4096);
        assert_eq!(k, "vol/chunks/1/1234/1234567_3_4096");
        assert_eq!(Format::parse_block_key(&k), Some((1_234_567, 3, 4096)));
        assert_eq!(Format::parse_block_key("vol/chunks/x"), None);
        let blocks: Vec<_> = f.blocks_of((4 << 20) + 10).collect();
        assert_eq!(blocks, vec![(0, 4 << 20), (1, 10)]);
        assert_eq!(f.blocks_of(0).count(), 0);
    }
}
