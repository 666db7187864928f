//! Where a volume's blocks live in the bucket and how big their objects are: the key of each
//! block of a slice, the prefixes its objects are listed under, the size of a block object,
//! and the split of a slice into blocks.
//!
//! The key strings never change meaning: existing volumes must keep finding their blocks.
//!
//! Not for: the volume's settings themselves (`meta::Format`, read here), the bytes inside a
//! block object (`data::block`), or talking to the bucket (`object`).

use super::block::Sums;
use crate::meta::Format;

/// The block layout of one volume, taken from its [`Format`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The key prefix of the volume's objects: its name, then its uuid (layout 1).
    root: String,
    /// Size of a block, bytes.
    block_size: u32,
    /// Block objects carry a checksum trailer (`data::block`).
    checksums: bool,
    /// Keys start with a hashed two-hex-digit prefix.
    hash_prefix: bool,
    /// Checksums are sealed with each block's key (layout 1 and later: `data::block`).
    sealed: bool,
    /// Bytes covered by one checksum (`data::block`): 4 KiB from layout 2, 64 KiB before.
    segment: usize,
    /// Objects are encoded (layout 3: `data::codec`), and encrypted.
    encoded: bool,
    encrypted: bool,
}

impl Layout {
    pub fn new(fmt: &Format) -> Layout {
        Layout {
            root: if fmt.layout >= 1 {
                format!("{}/{}", fmt.name, fmt.uuid)
            } else {
                fmt.name.clone()
            },
            block_size: fmt.block_size,
            checksums: fmt.checksums,
            hash_prefix: fmt.hash_prefix,
            sealed: fmt.layout >= 1,
            segment: if fmt.layout >= 2 {
                super::block::SEGMENT
            } else {
                super::block::OLD_SEGMENT
            },
            encoded: fmt.encoded(),
            encrypted: fmt.encryption.is_some(),
        }
    }

    /// Whether block objects are encoded (compressed and/or encrypted: `data::codec`), so
    /// that they are read whole, never by ranges.
    pub fn encoded(&self) -> bool {
        self.encoded
    }

    /// How the checksums of the block stored under `key` are made.
    pub fn sums(&self, key: &str) -> Sums {
        Sums {
            seal: if self.sealed {
                super::block::seal_of(key)
            } else {
                0
            },
            ..self.plain_sums()
        }
    }

    /// The volume's checksums without a block's seal: what sizes depend on.
    fn plain_sums(&self) -> Sums {
        Sums {
            seal: 0,
            segment: self.segment,
        }
    }

    /// The key of block `index` (of length `len`) of slice `id`.
    ///
    /// Slices are spread over directories by id so that no directory (or list prefix) grows
    /// without bound: `ROOT/chunks/<id/1M>/<id/1K>/<id>_<index>_<len>`, ROOT being the
    /// volume's name (layout 0) or `NAME/UUID` (layout 1).
    pub fn block_key(&self, id: u64, index: u32, len: u32) -> String {
        let hashed = if self.hash_prefix {
            format!("{:02x}/", key_hash(id))
        } else {
            String::new()
        };
        format!(
            "{hashed}{}/chunks/{}/{}/{}_{}_{}",
            self.root,
            id / 1_000_000,
            id / 1_000,
            id,
            index,
            len
        )
    }

    /// The prefixes under which the block objects of this volume live (256 with hashed keys).
    pub fn chunks_prefixes(&self) -> Vec<String> {
        if self.hash_prefix {
            (0..=255u8)
                .map(|h| format!("{h:02x}/{}/chunks/", self.root))
                .collect()
        } else {
            vec![format!("{}/chunks/", self.root)]
        }
    }

    /// The prefix of the volume's metadata backups (`mount --backup-meta`):
    /// `NAME/UUID/meta/`, whatever the layout (a layout-0 volume's name may be shared, its
    /// uuid is its own). Outside every prefix of [`Layout::chunks_prefixes`], so that `gc`
    /// and `fsck`, which list only those, never see a backup.
    pub fn backups_prefix(fmt: &Format) -> String {
        format!("{}/{}/meta/", fmt.name, fmt.uuid)
    }

    /// The sizes the object of a block holding `len` bytes may have in the bucket: one size,
    /// or a range for encoded objects (compressed to any size, or stored as they are).
    pub fn object_sizes(&self, len: u32) -> std::ops::RangeInclusive<u64> {
        if self.encoded {
            return super::codec::Codec::object_sizes(self.encrypted, self.plain_sums(), len);
        }
        let size = self.object_size(len);
        size..=size
    }

    /// Size in the bucket of a block holding `len` bytes of data (not encoded).
    fn object_size(&self, len: u32) -> u64 {
        len as u64
            + if self.checksums {
                self.plain_sums().trailer_len(len as usize) as u64
            } else {
                0
            }
    }

    /// Number of blocks of a slice of `size` bytes, and the length of block `i`.
    pub fn blocks_of(&self, size: u32) -> impl Iterator<Item = (u32, u32)> + use<> {
        let bs = self.block_size;
        let n = size.div_ceil(bs);
        (0..n).map(move |i| (i, (size - i * bs).min(bs)))
    }
}

/// The hashed prefix of a slice's keys: spread evenly over 256 values.
fn key_hash(id: u64) -> u8 {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
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

/// Makes `dir`, a volume's directory under a cache directory (`CACHE/UUID`, holding its
/// staging area and its disk cache), readable by its owner alone: the blocks there are file
/// data that the mount's permissions guard, and must not be readable around them.
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// The name of a local file holding the object of `key` (the staging area's and the disk
/// cache's): keys hold '/', names cannot.
pub fn local_name(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

/// The key of a local file named by [`local_name`].
pub fn local_key(name: &str) -> String {
    name.replace("%2F", "/").replace("%25", "%")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::format::SCHEMA_VERSION;

    fn format(hash_prefix: bool) -> Format {
        Format {
            name: "vol".into(),
            uuid: "u".into(),
            storage: "memory://".into(),
            block_size: 4 << 20,
            trash_days: 0,
            capacity: 0,
            inodes: 0,
            created: 0,
            schema: SCHEMA_VERSION,
            checksums: true,
            hash_prefix,
            layout: 0,
            compress: Default::default(),
            encryption: None,
            quotas: false,
        }
    }

    #[test]
    fn keys_roundtrip() {
        let l = Layout::new(&format(false));
        let k = l.block_key(1_234_567, 3, 4096);
        assert_eq!(k, "vol/chunks/1/1234/1234567_3_4096");
        assert_eq!(parse_block_key(&k), Some((1_234_567, 3, 4096)));
        assert_eq!(parse_block_key("vol/chunks/x"), None);
        let blocks: Vec<_> = l.blocks_of((4 << 20) + 10).collect();
        assert_eq!(blocks, vec![(0, 4 << 20), (1, 10)]);
        assert_eq!(l.blocks_of(0).count(), 0);
    }

    /// The keys of existing volumes: these strings must never change.
    #[test]
    fn keys_and_sizes_are_stable() {
        let l = Layout::new(&format(false));
        assert_eq!(l.chunks_prefixes(), vec!["vol/chunks/".to_string()]);
        assert_eq!(l.object_size(4096), 4096 + 4);
        assert_eq!(l.object_size(0), 0);
        let mut no_sums = format(false);
        no_sums.checksums = false;
        assert_eq!(Layout::new(&no_sums).object_size(4096), 4096);
        let h = Layout::new(&format(true));
        assert_eq!(h.block_key(7, 0, 10), "53/vol/chunks/0/0/7_0_10");
        let p = h.chunks_prefixes();
        assert_eq!((p.len(), p[0].as_str()), (256, "00/vol/chunks/"));
        assert_eq!(parse_block_key(&h.block_key(7, 0, 10)), Some((7, 0, 10)));
        // Layout 1: the volume's uuid under its name, hashed or not.
        let mut v1 = format(false);
        v1.layout = 1;
        let l = Layout::new(&v1);
        assert_eq!(l.block_key(7, 0, 10), "vol/u/chunks/0/0/7_0_10");
        assert_eq!(l.chunks_prefixes(), vec!["vol/u/chunks/".to_string()]);
        v1.hash_prefix = true;
        let l = Layout::new(&v1);
        assert_eq!(l.block_key(7, 0, 10), "53/vol/u/chunks/0/0/7_0_10");
        assert_eq!(l.chunks_prefixes()[255], "ff/vol/u/chunks/");
        assert_eq!(
            l.object_size(1 << 20),
            (1 << 20) + 16 * 4,
            "64 KiB segments"
        );
        // Layout 2: the same keys, a checksum per 4 KiB.
        let mut v2 = format(false);
        v2.layout = 2;
        let l = Layout::new(&v2);
        assert_eq!(l.block_key(7, 0, 10), "vol/u/chunks/0/0/7_0_10");
        assert_eq!(l.object_size(1 << 20), (1 << 20) + 256 * 4);
        assert_eq!(l.object_size(4097), 4097 + 8);
        assert_eq!(l.object_sizes(4097), 4097 + 8..=4097 + 8);
        assert!(!l.encoded());
        // Layout 3 (compressed or encrypted): the same keys, objects of any size up to the
        // data stored as it is behind the header (and the salt, nonce and tag).
        let mut v3 = v2.clone();
        v3.layout = 3;
        v3.compress = crate::meta::format::Compression::Zstd;
        let l3 = Layout::new(&v3);
        assert!(l3.encoded());
        assert_eq!(l3.block_key(7, 0, 10), "vol/u/chunks/0/0/7_0_10");
        assert_eq!(l3.object_sizes(4096), 8 + 4..=4096 + 8 + 8);
        // Backups: under the volume's own prefix, never under a prefix gc lists.
        for f in [format(false), format(true), v1.clone(), v3.clone()] {
            let b = Layout::backups_prefix(&f);
            assert_eq!(b, "vol/u/meta/");
            assert!(
                Layout::new(&f)
                    .chunks_prefixes()
                    .iter()
                    .all(|p| !b.starts_with(p.as_str()) && !p.starts_with(b.as_str()))
            );
        }
    }
}
