//! The bytes of a block object on a volume that compresses or encrypts (layout 3,
//! [`Format::encoded`]): the block's data compressed (unless that does not make it smaller),
//! then encrypted with the volume's data key, behind a small header, and the whole followed by
//! the checksum trailer of `data::block`, which covers the stored bytes:
//!
//! ```text
//! object = body ‖ CRC32C per 4 KiB of body (sealed with the key, data::block)
//! body   = header ‖ payload                                  (plaintext volume)
//!        = header ‖ salt ‖ nonce ‖ AES-256-GCM(payload) ‖ tag  (encrypted volume)
//! header = version 1 ‖ codec (0 stored, 1 lz4, 2 zstd) ‖ encrypted (0/1) ‖ 0 ‖ length (u32 LE)
//! ```
//!
//! Damage is caught by the checksums before anything is decrypted or decompressed; on an
//! encrypted volume the tag authenticates the payload, the header and the object's key
//! (associated data), so a block swapped under another key, or forged, fails like a damaged
//! one. Each object is encrypted under its own key, derived by HKDF-SHA256 from the data key
//! and the object's random 128-bit salt, with a random 96-bit nonce: AES-GCM's bound of 2^32
//! random nonces per key then applies per object, not per volume (docs/design.md).
//!
//! Not for: volumes that neither compress nor encrypt (their objects are `data::block`'s
//! alone, ranged reads included), where the data key comes from (`data::keys`), or where
//! objects live (`data::layout`).

use std::sync::Arc;

use bytes::Bytes;
use ring::aead;
use ring::rand::SecureRandom;

use super::block::Sums;
use super::keys::DataKey;
use crate::meta::format::{Compression, Format};

/// The version of the header.
const VERSION: u8 = 1;
/// Bytes of the header.
pub const HEADER: usize = 8;
const SALT: usize = 16;
const NONCE: usize = 12;
const TAG: usize = 16;
/// Bytes encryption adds to a body: the salt, the nonce and the tag.
pub const SEALED: usize = SALT + NONCE + TAG;
/// zstd's level: its fastest but one, as JuiceFS's; level 3 (zstd's default) costs about
/// twice the time for a few percent.
const ZSTD_LEVEL: i32 = 1;

/// The codec byte of the header.
const STORED: u8 = 0;
const LZ4: u8 = 1;
const ZSTD: u8 = 2;

/// Why an object does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error("{0} bytes, checksum mismatch or impossible size")]
    Checksum(usize),
    #[error("unknown header {0:02x?}")]
    Header([u8; 4]),
    #[error("stored unencrypted on an encrypted volume")]
    Unencrypted,
    #[error("encrypted, on a volume without a data key")]
    NoKey,
    #[error("fails authentication: damaged, forged or another block's object")]
    Auth,
    #[error("does not decompress ({0})")]
    Decompress(String),
    #[error("holds {got} bytes where its key says {want}")]
    Length { got: usize, want: usize },
}

/// How one volume encodes its block objects. Cheap to clone.
#[derive(Clone)]
pub struct Codec {
    compress: Compression,
    /// The data key, on an encrypted volume.
    key: Option<Arc<DataKey>>,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec")
            .field("compress", &self.compress)
            .field("encrypted", &self.key.is_some())
            .finish()
    }
}

/// The per-object key: HKDF-SHA256 of the data key with the object's salt.
fn object_key(key: &DataKey, salt: &[u8]) -> aead::LessSafeKey {
    let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, salt).extract(key.bytes());
    let okm = prk
        .expand(&[b"unkai block key v1"], &aead::AES_256_GCM)
        .expect("32 bytes is within HKDF's bound");
    aead::LessSafeKey::new(aead::UnboundKey::from(okm))
}

/// The associated data of an object: its header and its key in the bucket.
fn aad(header: &[u8], key: &str) -> Vec<u8> {
    let mut a = Vec::with_capacity(header.len() + key.len());
    a.extend_from_slice(header);
    a.extend_from_slice(key.as_bytes());
    a
}

thread_local! {
    static ZSTD_C: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_D: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// `data` compressed by `codec`; `None` if that fails (the block is then stored as it is).
fn compress(codec: u8, data: &[u8]) -> Option<Vec<u8>> {
    match codec {
        LZ4 => Some(lz4_flex::block::compress(data)),
        ZSTD => ZSTD_C.with(|c| {
            let mut c = c.borrow_mut();
            if c.is_none() {
                *c = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?);
            }
            c.as_mut()?.compress(data).ok()
        }),
        _ => None,
    }
}

/// `payload` decompressed by `codec` into exactly `len` bytes.
fn decompress(codec: u8, payload: &[u8], len: usize) -> Result<Vec<u8>, Damage> {
    let out = match codec {
        LZ4 => lz4_flex::block::decompress(payload, len)
            .map_err(|e| Damage::Decompress(e.to_string()))?,
        ZSTD => ZSTD_D.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(
                    zstd::bulk::Decompressor::new()
                        .map_err(|e| Damage::Decompress(e.to_string()))?,
                );
            }
            d.as_mut()
                .expect("made above")
                .decompress(payload, len)
                .map_err(|e| Damage::Decompress(e.to_string()))
        })?,
        _ => unreachable!("checked with the header"),
    };
    if out.len() != len {
        return Err(Damage::Length {
            got: out.len(),
            want: len,
        });
    }
    Ok(out)
}

impl Codec {
    /// The codec of volume `fmt`, with its data key if it is encrypted (the caller checks
    /// that one is given: see `DataStore::new`).
    pub fn new(fmt: &Format, key: Option<Arc<DataKey>>) -> Codec {
        Codec::with(fmt.compress, key.filter(|_| fmt.encryption.is_some()))
    }

    /// A codec compressing with `compress`, encrypting under `key` if given.
    pub fn with(compress: Compression, key: Option<Arc<DataKey>>) -> Codec {
        Codec { compress, key }
    }

    pub fn encrypts(&self) -> bool {
        self.key.is_some()
    }

    /// The object of block `data` stored under `key`, its checksums made with `sums`.
    pub fn encode(&self, key: &str, sums: Sums, data: &[u8]) -> Bytes {
        let wanted = match self.compress {
            Compression::None => STORED,
            Compression::Lz4 => LZ4,
            Compression::Zstd => ZSTD,
        };
        // Stored as it is where compressing does not make it smaller.
        let packed = compress(wanted, data).filter(|c| c.len() < data.len());
        let (codec, payload): (u8, &[u8]) = match &packed {
            Some(c) => (wanted, c),
            None => (STORED, data),
        };
        let mut header = [VERSION, codec, self.key.is_some() as u8, 0, 0, 0, 0, 0];
        header[4..].copy_from_slice(&(data.len() as u32).to_le_bytes());
        let sealed = if self.key.is_some() { SEALED } else { 0 };
        let body_len = HEADER + sealed + payload.len();
        let mut out = Vec::with_capacity(body_len + sums.trailer_len(body_len));
        out.extend_from_slice(&header);
        if let Some(dk) = &self.key {
            let mut salt_nonce = [0u8; SALT + NONCE];
            ring::rand::SystemRandom::new()
                .fill(&mut salt_nonce)
                .expect("the system's random number generator works");
            out.extend_from_slice(&salt_nonce);
            let start = out.len();
            out.extend_from_slice(payload);
            let (salt, nonce) = salt_nonce.split_at(SALT);
            let nonce = aead::Nonce::try_assume_unique_for_key(nonce).expect("12 bytes");
            let tag = object_key(dk, salt)
                .seal_in_place_separate_tag(
                    nonce,
                    aead::Aad::from(aad(&header, key)),
                    &mut out[start..],
                )
                .expect("a block is within AES-GCM's bound");
            out.extend_from_slice(tag.as_ref());
        } else {
            out.extend_from_slice(payload);
        }
        debug_assert_eq!(out.len(), body_len);
        let trailer = sums.trailer(&out);
        out.extend_from_slice(&trailer);
        Bytes::from(out)
    }

    /// The data of the object `obj` of `key` (a block of `len` bytes), its checksums made with
    /// `sums`, if it is intact and that block's.
    pub fn decode(&self, key: &str, sums: Sums, obj: Bytes, len: usize) -> Result<Bytes, Damage> {
        let size = obj.len();
        let body = sums.decode_sized(obj).ok_or(Damage::Checksum(size))?;
        if body.len() < HEADER {
            return Err(Damage::Checksum(size));
        }
        let header: [u8; HEADER] = body[..HEADER].try_into().expect("HEADER bytes");
        let (version, codec, encrypted, zero) = (header[0], header[1], header[2], header[3]);
        if version != VERSION || codec > ZSTD || encrypted > 1 || zero != 0 {
            return Err(Damage::Header(header[..4].try_into().expect("4 bytes")));
        }
        let said = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
        if said != len {
            return Err(Damage::Length {
                got: said,
                want: len,
            });
        }
        let payload = match (&self.key, encrypted == 1) {
            (Some(_), false) => return Err(Damage::Unencrypted),
            (None, true) => return Err(Damage::NoKey),
            (None, false) => body.slice(HEADER..),
            (Some(dk), true) => {
                if body.len() < HEADER + SEALED {
                    return Err(Damage::Auth);
                }
                let (salt, rest) = body[HEADER..].split_at(SALT);
                let (nonce, sealed) = rest.split_at(NONCE);
                let nonce = aead::Nonce::try_assume_unique_for_key(nonce).expect("12 bytes");
                let mut buf = sealed.to_vec();
                let plain = object_key(dk, salt)
                    .open_in_place(nonce, aead::Aad::from(aad(&header, key)), &mut buf)
                    .map_err(|_| Damage::Auth)?
                    .len();
                buf.truncate(plain);
                Bytes::from(buf)
            }
        };
        match codec {
            STORED if payload.len() == len => Ok(payload),
            STORED => Err(Damage::Length {
                got: payload.len(),
                want: len,
            }),
            c => decompress(c, &payload, len).map(Bytes::from),
        }
    }

    /// The sizes an object of a `len`-byte block can have (its checksums made with `sums`):
    /// from an empty payload to the data stored as it is.
    pub fn object_sizes(encrypted: bool, sums: Sums, len: u32) -> std::ops::RangeInclusive<u64> {
        let fixed = HEADER + if encrypted { SEALED } else { 0 };
        let size = |body: usize| (body + sums.trailer_len(body)) as u64;
        size(fixed)..=size(fixed + len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::block::{SEGMENT, seal_of};

    fn fmt(compress: Compression, encrypted: bool) -> Format {
        let mut f = Format::for_tests("v", "memory://", 4 << 20);
        f.layout = crate::meta::format::LAYOUT_ENCODED;
        f.compress = compress;
        if encrypted {
            f.encryption = Some(crate::meta::format::Encryption {
                cipher: "aes-256-gcm".into(),
                wrap: crate::meta::format::KeyWrap::KeyFile,
                wrapped_key: String::new(),
                rsa_key: None,
                rsa_fingerprint: None,
            });
        }
        f
    }

    fn codec(compress: Compression, key: Option<[u8; 32]>) -> Codec {
        Codec::new(
            &fmt(compress, key.is_some()),
            key.map(|k| Arc::new(DataKey::from_bytes(k))),
        )
    }

    fn sums(key: &str) -> Sums {
        Sums {
            seal: seal_of(key),
            segment: SEGMENT,
        }
    }

    /// Text-like data that compresses well.
    fn text(n: usize) -> Vec<u8> {
        let words = [
            "fn ", "let ", "mut ", "self", ".read(", "buf", ");\n", "    ", "Ok(())",
        ];
        let mut out = Vec::with_capacity(n);
        let mut i = 0usize;
        while out.len() < n {
            out.extend_from_slice(words[(i * 7 + i / 3) % words.len()].as_bytes());
            i += 1;
        }
        out.truncate(n);
        out
    }

    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    const K: &str = "v/u/chunks/0/0/7_0_100";

    #[test]
    fn every_codec_round_trips_every_size() {
        for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
            for key in [None, Some([7u8; 32])] {
                let cd = codec(c, key);
                for n in [0, 1, 100, 4095, 4096, 4097, 65_536, 4 << 20] {
                    for d in [text(n), noise(n), vec![0u8; n]] {
                        let obj = cd.encode(K, sums(K), &d);
                        let size = obj.len() as u64;
                        let range = Codec::object_sizes(key.is_some(), sums(K), n as u32);
                        assert!(range.contains(&size), "{c:?} {n}: {size} not in {range:?}");
                        let back = cd.decode(K, sums(K), obj, n).unwrap();
                        assert_eq!(back, Bytes::from(d), "{c:?} {key:?} {n}");
                    }
                }
            }
        }
    }

    #[test]
    fn compressible_blocks_shrink_and_incompressible_ones_are_stored_raw() {
        for c in [Compression::Lz4, Compression::Zstd] {
            let cd = codec(c, None);
            let d = text(1 << 20);
            let obj = cd.encode(K, sums(K), &d);
            assert!(
                obj.len() < d.len() / 3,
                "{c:?}: {} of {}",
                obj.len(),
                d.len()
            );
            assert_eq!(obj[1], if c == Compression::Lz4 { LZ4 } else { ZSTD });
            let n = noise(1 << 20);
            let obj = cd.encode(K, sums(K), &n);
            assert_eq!(obj[1], STORED, "{c:?}: noise stored as it is");
            let body = sums(K).data_len(obj.len()).unwrap();
            assert_eq!(body, HEADER + n.len(), "{c:?}: the header alone is added");
            assert_eq!(
                &obj[HEADER..HEADER + n.len()],
                &n[..],
                "raw after the header"
            );
            assert_eq!(cd.decode(K, sums(K), obj, n.len()).unwrap(), Bytes::from(n));
        }
    }

    #[test]
    fn encrypted_objects_hide_their_data_and_differ_each_time() {
        let cd = codec(Compression::None, Some([1u8; 32]));
        let marker = b"UNKAI-SECRET-MARKER-".repeat(1000);
        let a = cd.encode(K, sums(K), &marker);
        let b = cd.encode(K, sums(K), &marker);
        assert_ne!(a, b, "a random salt and nonce per object");
        for o in [&a, &b] {
            assert!(!o.windows(20).any(|w| w == b"UNKAI-SECRET-MARKER-"));
        }
        let cz = codec(Compression::Zstd, Some([1u8; 32]));
        let z = cz.encode(K, sums(K), &marker);
        assert!(
            z.len() < marker.len() / 10,
            "compressed before it is encrypted"
        );
        assert_eq!(cz.decode(K, sums(K), z, marker.len()).unwrap(), &marker[..]);
    }

    #[test]
    fn tampering_is_detected() {
        for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
            for key in [None, Some([3u8; 32])] {
                let cd = codec(c, key);
                let d = text(20_000);
                let obj = cd.encode(K, sums(K), &d);
                for at in [0, 1, 4, HEADER, HEADER + 20, obj.len() / 2, obj.len() - 1] {
                    let mut bad = obj.to_vec();
                    bad[at] ^= 0x10;
                    let got = cd.decode(K, sums(K), Bytes::from(bad), d.len());
                    assert!(got.is_err(), "{c:?} {key:?}: flip at {at} went unnoticed");
                }
                assert!(
                    cd.decode(K, sums(K), obj.slice(..obj.len() - 1), d.len())
                        .is_err()
                );
                assert!(cd.decode(K, sums(K), obj, d.len() + 1).is_err());
            }
        }
    }

    /// Checksums are not a MAC: a forger who recomputes them still fails authentication on an
    /// encrypted volume, where a body with its payload changed is refused by the tag.
    #[test]
    fn forged_objects_with_good_checksums_fail_authentication() {
        let cd = codec(Compression::None, Some([5u8; 32]));
        let d = text(10_000);
        let obj = cd.encode(K, sums(K), &d);
        let body_len = sums(K).data_len(obj.len()).unwrap();
        let mut body = obj[..body_len].to_vec();
        body[HEADER + SALT + NONCE + 5] ^= 1;
        let forged = sums(K).encode(&body);
        assert_eq!(
            cd.decode(K, sums(K), forged, d.len()),
            Err(Damage::Auth),
            "payload changed"
        );
        // A plaintext body claiming to be stored unencrypted.
        let plain = codec(Compression::None, None).encode(K, sums(K), &d);
        assert_eq!(
            cd.decode(K, sums(K), plain, d.len()),
            Err(Damage::Unencrypted)
        );
    }

    /// The object's key is associated data: another block's object, even with checksums
    /// made for this key, fails; so does the right object under the wrong data key.
    #[test]
    fn objects_are_bound_to_their_key_and_data_key() {
        let cd = codec(Compression::Lz4, Some([9u8; 32]));
        let other = "v/u/chunks/0/0/8_0_100";
        let d = text(5000);
        let obj = cd.encode(other, sums(other), &d);
        assert_eq!(
            cd.decode(K, sums(K), obj.clone(), d.len()),
            Err(Damage::Checksum(obj.len())),
            "sealed checksums"
        );
        let body_len = sums(other).data_len(obj.len()).unwrap();
        let moved = sums(K).encode(&obj[..body_len]);
        assert_eq!(cd.decode(K, sums(K), moved, d.len()), Err(Damage::Auth));
        let wrong = codec(Compression::Lz4, Some([8u8; 32]));
        assert_eq!(
            wrong.decode(other, sums(other), obj, d.len()),
            Err(Damage::Auth)
        );
    }
}
