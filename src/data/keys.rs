//! The data key of an encrypted volume: 256 random bits made by `format`, under which every
//! block object is encrypted (`data::codec`), recorded in the volume's settings only wrapped
//! by a key the user holds:
//!
//! - an RSA private key (`--encrypt-rsa-key`, as JuiceFS): the data key is wrapped with
//!   RSA-OAEP (SHA-256, the volume's uuid as label), and the key's PEM, encrypted by its
//!   passphrase, is recorded beside it, so that opening the volume needs only the passphrase.
//!   A key without a passphrase is refused, unless `format` is told to record it nowhere
//!   (`--allow-unencrypted-rsa-key`): then every command is given its PEM file, as a key file.
//!   A private key is never recorded in the clear (volumes formatted before that was refused
//!   are read, and [`protect`] encrypts their key in place);
//! - a key file (`--encrypt-key-file`: 32 random bytes, or 64 hex digits): the data key is
//!   wrapped with AES-256-GCM under it (the volume's uuid as associated data), and the file
//!   is recorded nowhere.
//!
//! Unwrapping happens once, when a command opens the volume's data; the errors say in one
//! line what is missing or wrong and how to give it, and never print key material.
//!
//! Not for: encrypting blocks (`data::codec`), or reading secrets from the environment and
//! flags (`volume`, `cli`).

use std::path::{Path, PathBuf};

use ring::aead;
use ring::rand::SecureRandom;
use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPublicKey};
use rsa::pkcs8::der::SecretDocument;
use rsa::pkcs8::der::pem::PemLabel;
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncryptedPrivateKeyInfo, LineEnding};
use rsa::traits::PublicKeyParts;
use rsa::{Oaep, RsaPrivateKey, RsaPublicKey};
use zeroize::Zeroizing;

use crate::meta::format::{Encryption, Format, KeyWrap};

/// The cipher of block objects, as recorded in [`Encryption::cipher`].
pub const CIPHER: &str = "aes-256-gcm";
/// The smallest RSA key taken.
const MIN_RSA_BITS: usize = 2048;

/// A volume's data key, wiped from memory when dropped; its `Debug` shows nothing.
pub struct DataKey(Zeroizing<[u8; 32]>);

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

impl DataKey {
    /// A new random key, from the system's random number generator.
    pub fn generate() -> DataKey {
        let mut k = Zeroizing::new([0u8; 32]);
        ring::rand::SystemRandom::new()
            .fill(&mut k[..])
            .expect("the system's random number generator works");
        DataKey(k)
    }

    pub(crate) fn from_bytes(b: [u8; 32]) -> DataKey {
        DataKey(Zeroizing::new(b))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0[..]
    }
}

/// What the user gives to unwrap a volume's data key.
#[derive(Default)]
pub struct Unlock {
    /// The passphrase of the RSA key, and the environment variable it came from (named in
    /// errors).
    pub passphrase: Option<(Zeroizing<String>, &'static str)>,
    /// The key file (`--encrypt-key-file`).
    pub key_file: Option<PathBuf>,
}

/// Why a data key cannot be made, wrapped or unwrapped. Each says what to do, on one line.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "volume '{volume}' is encrypted with an RSA key protected by a passphrase: set \
         UNKAI_RSA_PASSPHRASE (or JFS_RSA_PASSPHRASE) to it"
    )]
    NoPassphrase { volume: String },
    #[error(
        "the passphrase in {var} does not decrypt the RSA key of volume '{volume}': set it \
         to the passphrase the key was made with"
    )]
    WrongPassphrase { volume: String, var: &'static str },
    #[error(
        "volume '{volume}' is encrypted with a key file: give it with --encrypt-key-file FILE \
         (or UNKAI_ENCRYPT_KEY_FILE=FILE)"
    )]
    NoKeyFile { volume: String },
    #[error(
        "volume '{volume}' is encrypted with an RSA key recorded nowhere: give its PEM file \
         with --encrypt-key-file FILE.pem (or UNKAI_ENCRYPT_KEY_FILE=FILE.pem)"
    )]
    NoRsaKeyFile { volume: String },
    #[error(
        "the key file {} does not unlock volume '{volume}': give the key file the volume was \
         formatted with",
        path.display()
    )]
    WrongKeyFile { volume: String, path: PathBuf },
    #[error("key file {}: {problem}", path.display())]
    KeyFile { path: PathBuf, problem: String },
    #[error("RSA key {}: {problem}", path.display())]
    RsaKey { path: PathBuf, problem: String },
    #[error(
        "the RSA key {} has no passphrase, and a private key is never recorded in the clear: \
         protect it (`openssl pkcs8 -topk8 -v2 aes256 -in {} -out NEW.pem`) and format with \
         NEW.pem and UNKAI_RSA_PASSPHRASE set, or pass --allow-unencrypted-rsa-key to record it \
         nowhere and give the PEM file to every mount (--encrypt-key-file)",
        path.display(),
        path.display()
    )]
    UnprotectedRsaKey { path: PathBuf },
    #[error(
        "volume '{volume}' holds its RSA key in the clear (unkai config --protect-rsa-key \
         encrypts it): {problem}"
    )]
    Protect { volume: String, problem: String },
    #[error(
        "the encryption settings of volume '{volume}' are damaged ({problem}): its data cannot \
         be decrypted"
    )]
    Damaged { volume: String, problem: String },
}

/// What is wrong with an RSA key's PEM.
enum PemProblem {
    NeedsPassphrase,
    WrongPassphrase,
    Other(String),
}

/// The private key of `pem`, and whether it was protected by a passphrase.
fn read_rsa(pem: &str, passphrase: Option<&str>) -> Result<(RsaPrivateKey, bool), PemProblem> {
    let label = pem
        .lines()
        .find_map(|l| l.trim().strip_prefix("-----BEGIN "))
        .and_then(|l| l.strip_suffix("-----"))
        .ok_or_else(|| {
            PemProblem::Other(
                "not a PEM file: make one with `openssl genrsa -aes256 -out key.pem 2048`".into(),
            )
        })?;
    let key = match label {
        "ENCRYPTED PRIVATE KEY" => {
            let pass = passphrase.ok_or(PemProblem::NeedsPassphrase)?;
            let k = RsaPrivateKey::from_pkcs8_encrypted_pem(pem, pass.as_bytes())
                .map_err(|_| PemProblem::WrongPassphrase)?;
            return Ok((k, true));
        }
        "PRIVATE KEY" => RsaPrivateKey::from_pkcs8_pem(pem).map_err(|e| e.to_string()),
        "RSA PRIVATE KEY" if pem.contains("ENCRYPTED") => {
            return Err(PemProblem::Other(
                "encrypted in OpenSSL's legacy format, which is not read: convert it with \
                 `openssl pkcs8 -topk8 -v2 aes256 -in OLD.pem -out NEW.pem`"
                    .into(),
            ));
        }
        "RSA PRIVATE KEY" => RsaPrivateKey::from_pkcs1_pem(pem).map_err(|e| e.to_string()),
        other => Err(format!("holds a {other}, not an RSA private key")),
    };
    key.map(|k| (k, false)).map_err(|e| {
        PemProblem::Other(format!(
            "not a readable RSA private key ({e}): make one with `openssl genrsa -aes256 -out \
             key.pem 2048`"
        ))
    })
}

fn oaep(uuid: &str) -> Oaep {
    Oaep::new_with_label::<rsa::sha2::Sha256, _>(format!("unkai data key {uuid}"))
}

/// SHA-256 of an RSA public key (PKCS#1 DER), in hex: names the key without revealing it.
fn fingerprint(public: &RsaPublicKey) -> String {
    let der = public
        .to_pkcs1_der()
        .expect("an RSA public key encodes as PKCS#1");
    hex::encode(ring::digest::digest(&ring::digest::SHA256, der.as_bytes()))
}

/// Reads the RSA key in the PEM file `path` (its passphrase, if any, `passphrase`); errors
/// name the file.
fn read_rsa_file(
    path: &Path,
    passphrase: Option<&str>,
) -> Result<(Zeroizing<String>, RsaPrivateKey, bool), KeyError> {
    let err = |problem: String| KeyError::RsaKey {
        path: path.to_path_buf(),
        problem,
    };
    let pem = Zeroizing::new(
        std::fs::read_to_string(path).map_err(|e| err(format!("cannot be read: {e}")))?,
    );
    let (private, protected) = read_rsa(&pem, passphrase).map_err(|p| {
        err(match p {
            PemProblem::NeedsPassphrase => {
                "it is protected by a passphrase: set UNKAI_RSA_PASSPHRASE to it".into()
            }
            PemProblem::WrongPassphrase => {
                "the passphrase in UNKAI_RSA_PASSPHRASE (or JFS_RSA_PASSPHRASE) does not \
                 decrypt it: set the one it was made with"
                    .into()
            }
            PemProblem::Other(s) => s,
        })
    })?;
    Ok((pem, private, protected))
}

/// Wraps `key` for volume `uuid` with the RSA key in `path`, and returns the settings to
/// record. A key protected by a passphrase is recorded (its encrypted PKCS#8 document only,
/// whatever else the file holds). A key without one is refused unless `unrecorded` (format's
/// `--allow-unencrypted-rsa-key`); then only its public key's fingerprint is recorded, and
/// every command needs the PEM file. A private key in the clear is never recorded.
pub fn wrap_with_rsa(
    key: &DataKey,
    path: &Path,
    passphrase: Option<&str>,
    uuid: &str,
    unrecorded: bool,
) -> Result<Encryption, KeyError> {
    let err = |problem: String| KeyError::RsaKey {
        path: path.to_path_buf(),
        problem,
    };
    let (pem, private, protected) = read_rsa_file(path, passphrase)?;
    if !protected && !unrecorded {
        return Err(KeyError::UnprotectedRsaKey {
            path: path.to_path_buf(),
        });
    }
    let bits = private.size() * 8;
    if bits < MIN_RSA_BITS {
        return Err(err(format!(
            "{bits} bits is too small: use at least {MIN_RSA_BITS} (`openssl genrsa -aes256 \
             -out key.pem 2048`)"
        )));
    }
    let public = RsaPublicKey::from(&private);
    let wrapped = public
        .encrypt(&mut rsa::rand_core::OsRng, oaep(uuid), key.bytes())
        .map_err(|e| err(format!("cannot wrap the data key: {e}")))?;
    let (wrap, rsa_key, rsa_fingerprint) = if protected {
        // The encrypted document alone, as PEM: nothing else of the file goes in.
        let (_, doc) = SecretDocument::from_pem(&pem)
            .map_err(|e| err(format!("not a readable PEM document ({e})")))?;
        let pem = doc
            .to_pem(EncryptedPrivateKeyInfo::PEM_LABEL, LineEnding::LF)
            .map_err(|e| err(format!("cannot be encoded ({e})")))?;
        (KeyWrap::RsaOaep, Some(pem.to_string()), None)
    } else {
        (KeyWrap::RsaOaepKeyFile, None, Some(fingerprint(&public)))
    };
    Ok(Encryption {
        cipher: CIPHER.into(),
        wrap,
        wrapped_key: hex::encode(&wrapped),
        rsa_key,
        rsa_fingerprint,
    })
}

/// The settings of a volume whose RSA key is recorded in the clear (formatted before that
/// was refused), that key now encrypted by `passphrase` (PKCS#8, scrypt and AES-256-CBC, as
/// `openssl genrsa -aes256` reads it). The wrapped data key is unchanged.
pub fn protect(fmt: &Format, passphrase: &str) -> Result<Encryption, KeyError> {
    let fail = |problem: &str| KeyError::Protect {
        volume: fmt.name.clone(),
        problem: problem.into(),
    };
    let enc = fmt
        .encryption
        .as_ref()
        .filter(|e| e.rsa_key_in_clear())
        .ok_or_else(|| fail("it does not: nothing to protect"))?;
    if passphrase.is_empty() {
        return Err(fail(
            "set UNKAI_RSA_PASSPHRASE to the passphrase to protect it with",
        ));
    }
    let pem = enc.rsa_key.as_deref().expect("in the clear");
    let (private, _) = read_rsa(pem, None).map_err(|_| fail("the key recorded is unreadable"))?;
    let pem = private
        .to_pkcs8_encrypted_pem(&mut rsa::rand_core::OsRng, passphrase, LineEnding::LF)
        .map_err(|e| fail(&format!("the key cannot be encrypted ({e})")))?;
    Ok(Encryption {
        rsa_key: Some(pem.to_string()),
        ..enc.clone()
    })
}

/// Reads a key file: 32 bytes, or 64 hex digits (surrounding whitespace ignored).
fn read_key_file(path: &Path) -> Result<Zeroizing<[u8; 32]>, KeyError> {
    let err = |problem: String| KeyError::KeyFile {
        path: path.to_path_buf(),
        problem,
    };
    let raw = Zeroizing::new(
        std::fs::read(path)
            .map_err(|e| err(format!("cannot be read ({e}): give a readable file")))?,
    );
    let mut key = Zeroizing::new([0u8; 32]);
    if raw.len() == 32 {
        key.copy_from_slice(&raw);
        return Ok(key);
    }
    let text = raw.trim_ascii();
    let parsed = (text.len() == 64)
        .then(|| hex::decode(text).ok())
        .flatten()
        .map(Zeroizing::new);
    match parsed {
        Some(b) => {
            key.copy_from_slice(&b);
            Ok(key)
        }
        None => Err(err(format!(
            "holds {} bytes: it must hold 32 random bytes or 64 hex digits (make one with \
             `head -c 32 /dev/urandom > FILE` or `openssl rand -hex 32 > FILE`)",
            raw.len()
        ))),
    }
}

fn wrap_aad(uuid: &str) -> Vec<u8> {
    format!("unkai data key v1 {uuid}").into_bytes()
}

/// Wraps `key` for volume `uuid` under the key file `path`.
pub fn wrap_with_key_file(key: &DataKey, path: &Path, uuid: &str) -> Result<Encryption, KeyError> {
    let kek = read_key_file(path)?;
    let sealing = aead::LessSafeKey::new(
        aead::UnboundKey::new(&aead::AES_256_GCM, &kek[..]).expect("32 bytes"),
    );
    let mut nonce = [0u8; 12];
    ring::rand::SystemRandom::new()
        .fill(&mut nonce)
        .expect("the system's random number generator works");
    let mut out = Zeroizing::new(key.bytes().to_vec());
    sealing
        .seal_in_place_append_tag(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(wrap_aad(uuid)),
            &mut *out,
        )
        .expect("32 bytes are within AES-GCM's bound");
    let mut wrapped = nonce.to_vec();
    wrapped.extend_from_slice(&out);
    Ok(Encryption {
        cipher: CIPHER.into(),
        wrap: KeyWrap::KeyFile,
        wrapped_key: hex::encode(&wrapped),
        rsa_key: None,
        rsa_fingerprint: None,
    })
}

/// The data key of volume `fmt`, unwrapped with what the user gave (`None`: the volume is
/// not encrypted).
pub fn unwrap(fmt: &Format, unlock: &Unlock) -> Result<Option<DataKey>, KeyError> {
    let Some(enc) = &fmt.encryption else {
        return Ok(None);
    };
    let volume = fmt.name.clone();
    let damaged = |problem: &str| KeyError::Damaged {
        volume: fmt.name.clone(),
        problem: problem.into(),
    };
    if enc.cipher != CIPHER {
        return Err(damaged(&format!(
            "unknown cipher '{}': upgrade unkai",
            enc.cipher
        )));
    }
    let wrapped = hex::decode(enc.wrapped_key.as_bytes())
        .ok()
        .ok_or_else(|| damaged("wrapped key"))?;
    let bytes: Zeroizing<Vec<u8>> = match enc.wrap {
        KeyWrap::RsaOaep => {
            let pem = enc
                .rsa_key
                .as_deref()
                .ok_or_else(|| damaged("no RSA key"))?;
            let pass = unlock.passphrase.as_ref();
            let (private, _) =
                read_rsa(pem, pass.map(|(p, _)| p.as_str())).map_err(|p| match p {
                    PemProblem::NeedsPassphrase => KeyError::NoPassphrase {
                        volume: volume.clone(),
                    },
                    PemProblem::WrongPassphrase => KeyError::WrongPassphrase {
                        volume: volume.clone(),
                        var: pass.map_or("UNKAI_RSA_PASSPHRASE", |(_, v)| v),
                    },
                    PemProblem::Other(s) => damaged(&format!("RSA key: {s}")),
                })?;
            Zeroizing::new(
                private
                    .decrypt(oaep(&fmt.uuid), &wrapped)
                    .map_err(|_| damaged("the wrapped key does not decrypt with the RSA key"))?,
            )
        }
        KeyWrap::RsaOaepKeyFile => {
            let path = unlock
                .key_file
                .as_ref()
                .ok_or_else(|| KeyError::NoRsaKeyFile {
                    volume: volume.clone(),
                })?;
            let pass = unlock.passphrase.as_ref().map(|(p, _)| p.as_str());
            let (_, private, _) = read_rsa_file(path, pass)?;
            let want = enc
                .rsa_fingerprint
                .as_deref()
                .ok_or_else(|| damaged("no RSA key fingerprint"))?;
            if fingerprint(&RsaPublicKey::from(&private)) != want {
                return Err(KeyError::WrongKeyFile {
                    volume,
                    path: path.clone(),
                });
            }
            Zeroizing::new(
                private
                    .decrypt(oaep(&fmt.uuid), &wrapped)
                    .map_err(|_| damaged("the wrapped key does not decrypt with the RSA key"))?,
            )
        }
        KeyWrap::KeyFile => {
            let path = unlock
                .key_file
                .as_ref()
                .ok_or_else(|| KeyError::NoKeyFile {
                    volume: volume.clone(),
                })?;
            let kek = read_key_file(path)?;
            if wrapped.len() != 12 + 32 + 16 {
                return Err(damaged("wrapped key of the wrong size"));
            }
            let opening = aead::LessSafeKey::new(
                aead::UnboundKey::new(&aead::AES_256_GCM, &kek[..]).expect("32 bytes"),
            );
            let (nonce, sealed) = wrapped.split_at(12);
            let mut buf = Zeroizing::new(sealed.to_vec());
            let n = opening
                .open_in_place(
                    aead::Nonce::try_assume_unique_for_key(nonce).expect("12 bytes"),
                    aead::Aad::from(wrap_aad(&fmt.uuid)),
                    &mut buf[..],
                )
                .map_err(|_| KeyError::WrongKeyFile {
                    volume: volume.clone(),
                    path: path.clone(),
                })?
                .len();
            buf.truncate(n);
            buf
        }
    };
    let key: [u8; 32] = bytes[..]
        .try_into()
        .map_err(|_| damaged("the data key is not 32 bytes"))?;
    Ok(Some(DataKey::from_bytes(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(enc: Encryption) -> Format {
        let mut f = Format::for_tests("vol", "memory://", 4 << 20);
        f.uuid = "uuid-1".into();
        f.encryption = Some(enc);
        f
    }

    #[test]
    fn key_files_wrap_and_unwrap_only_with_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let (raw, hexed, other) = (
            dir.path().join("raw"),
            dir.path().join("hex"),
            dir.path().join("other"),
        );
        let bytes: [u8; 32] = std::array::from_fn(|i| i as u8 * 7 + 1);
        std::fs::write(&raw, bytes).unwrap();
        std::fs::write(&hexed, format!("{}\n", hex::encode(bytes))).unwrap();
        std::fs::write(&other, [9u8; 32]).unwrap();
        let key = DataKey::generate();
        let enc = wrap_with_key_file(&key, &raw, "uuid-1").unwrap();
        assert!(!enc.wrapped_key.contains(&hex::encode(key.bytes())));
        let fmt = volume(enc);
        for f in [&raw, &hexed] {
            let unlock = Unlock {
                key_file: Some(f.clone()),
                ..Default::default()
            };
            let got = unwrap(&fmt, &unlock).unwrap().unwrap();
            assert_eq!(got.bytes(), key.bytes());
        }
        let e = unwrap(&fmt, &Unlock::default()).unwrap_err().to_string();
        assert!(e.contains("--encrypt-key-file") && !e.contains('\n'), "{e}");
        let wrong = Unlock {
            key_file: Some(other),
            ..Default::default()
        };
        let e = unwrap(&fmt, &wrong).unwrap_err();
        assert!(matches!(e, KeyError::WrongKeyFile { .. }), "{e}");
        // Bound to its volume: the same wrapped key under another uuid does not open.
        let mut moved = fmt.clone();
        moved.uuid = "uuid-2".into();
        let unlock = Unlock {
            key_file: Some(raw),
            ..Default::default()
        };
        assert!(unwrap(&moved, &unlock).is_err());
        std::fs::write(&hexed, "not a key").unwrap();
        let e = wrap_with_key_file(&key, &hexed, "u")
            .unwrap_err()
            .to_string();
        assert!(e.contains("32 random bytes or 64 hex digits"), "{e}");
    }

    /// An RSA key with a passphrase (PKCS#8, as `openssl genrsa -aes256` makes on OpenSSL 3)
    /// is recorded encrypted and unwraps with that passphrase only; one without is refused,
    /// or recorded nowhere when allowed (its PEM file then unwraps, another key's does not).
    #[test]
    fn rsa_keys_unwrap_only_with_their_passphrase() {
        let dir = tempfile::tempdir().unwrap();
        let private = RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
        let other = RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
        let (locked, open, wrong) = (
            dir.path().join("locked.pem"),
            dir.path().join("open.pem"),
            dir.path().join("wrong.pem"),
        );
        let pem = private
            .to_pkcs8_encrypted_pem(&mut rsa::rand_core::OsRng, b"s3cret", LineEnding::LF)
            .unwrap();
        std::fs::write(&locked, pem.as_bytes()).unwrap();
        let clear = private.to_pkcs8_pem(LineEnding::LF).unwrap();
        std::fs::write(&open, clear.as_bytes()).unwrap();
        std::fs::write(
            &wrong,
            other.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
        )
        .unwrap();
        let key = DataKey::generate();
        let e = wrap_with_rsa(&key, &locked, None, "uuid-1", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("UNKAI_RSA_PASSPHRASE"), "{e}");
        let e = wrap_with_rsa(&key, &locked, Some("nope"), "uuid-1", false).unwrap_err();
        assert!(e.to_string().contains("does not decrypt"), "{e}");
        let enc = wrap_with_rsa(&key, &locked, Some("s3cret"), "uuid-1", false).unwrap();
        assert_eq!(enc.wrap, KeyWrap::RsaOaep);
        assert_eq!(enc.rsa_key.as_deref(), Some(pem.as_str()));
        assert!(!enc.rsa_key_in_clear());
        let fmt = volume(enc);
        let with = |p: &str| Unlock {
            passphrase: Some((Zeroizing::new(p.to_string()), "UNKAI_RSA_PASSPHRASE")),
            key_file: None,
        };
        let got = unwrap(&fmt, &with("s3cret")).unwrap().unwrap();
        assert_eq!(got.bytes(), key.bytes());
        let e = unwrap(&fmt, &with("wrong")).unwrap_err();
        assert!(matches!(e, KeyError::WrongPassphrase { .. }), "{e}");
        let e = unwrap(&fmt, &Unlock::default()).unwrap_err();
        assert!(matches!(e, KeyError::NoPassphrase { .. }), "{e}");

        // Without a passphrase: refused in one line naming both ways out.
        let e = wrap_with_rsa(&key, &open, None, "uuid-1", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--allow-unencrypted-rsa-key")
                && e.contains("openssl pkcs8")
                && !e.contains('\n'),
            "{e}"
        );
        // Allowed: recorded nowhere; the PEM file unwraps, another key's does not.
        let enc = wrap_with_rsa(&key, &open, None, "uuid-1", true).unwrap();
        assert_eq!(enc.wrap, KeyWrap::RsaOaepKeyFile);
        assert!(enc.rsa_key.is_none() && !enc.rsa_key_in_clear());
        let fmt = volume(enc);
        let e = unwrap(&fmt, &Unlock::default()).unwrap_err().to_string();
        assert!(e.contains("--encrypt-key-file"), "{e}");
        let file = |f: &Path| Unlock {
            passphrase: None,
            key_file: Some(f.to_path_buf()),
        };
        let got = unwrap(&fmt, &file(&open)).unwrap().unwrap();
        assert_eq!(got.bytes(), key.bytes());
        let e = unwrap(&fmt, &file(&wrong)).unwrap_err();
        assert!(matches!(e, KeyError::WrongKeyFile { .. }), "{e}");

        // A volume of older binaries, its key recorded in the clear: read as it is, and
        // protected in place with a passphrase (the wrapped data key unchanged).
        let mut old = wrap_with_rsa(&key, &locked, Some("s3cret"), "uuid-1", false).unwrap();
        old.rsa_key = Some(clear.to_string());
        assert!(old.rsa_key_in_clear());
        let mut fmt = volume(old);
        let got = unwrap(&fmt, &Unlock::default()).unwrap().unwrap();
        assert_eq!(got.bytes(), key.bytes());
        let protected = protect(&fmt, "n3w").unwrap();
        assert!(!protected.rsa_key_in_clear());
        fmt.encryption = Some(protected);
        let e = unwrap(&fmt, &Unlock::default()).unwrap_err();
        assert!(matches!(e, KeyError::NoPassphrase { .. }), "{e}");
        let got = unwrap(&fmt, &with("n3w")).unwrap().unwrap();
        assert_eq!(got.bytes(), key.bytes());
        assert!(protect(&fmt, "n3w").is_err(), "protected twice");
    }

    #[test]
    fn debug_shows_no_key_material() {
        let key = DataKey::from_bytes([0xAB; 32]);
        assert_eq!(format!("{key:?}"), "DataKey(..)");
        let enc = Encryption {
            cipher: CIPHER.into(),
            wrap: KeyWrap::KeyFile,
            wrapped_key: "abababab".into(),
            rsa_key: Some("PEM".into()),
            rsa_fingerprint: Some("feedbeef".into()),
        };
        let f = volume(enc);
        let shown = format!("{f:?}");
        assert!(
            !shown.contains("abababab") && !shown.contains("PEM") && !shown.contains("feedbeef"),
            "{shown}"
        );
    }
}
