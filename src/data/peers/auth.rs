//! How members of a peer cache group prove to each other that they hold the group's key, on
//! every exchange and in both directions, so that nothing seen on the network can be used
//! again:
//! - a request carries the time it was made, a random nonce and an HMAC-SHA256 (ring's) of
//!   its method, path, time and nonce under the key; it is answered only when the HMAC is
//!   right, its time within [`SKEW`] of the server's clock, and its nonce not seen before
//!   (a request captured and sent again is refused: [`Refusal::Wrong`] "replayed");
//! - an answer is sealed with AES-256-GCM under a key made from the group's key, the request's
//!   path and its nonce, so that the asker takes only bytes the member it asked sent for that
//!   very request (an answer altered on the way, or one captured and replayed to another
//!   request, does not open), and no one without the key reads them. AES-GCM rather than an
//!   HMAC of the body: with AES-NI it costs a quarter of SHA-256's time per byte, and the
//!   HMAC of 4 MiB on both sides was most of a block's time from a peer (docs/benchmarks.md).
//!
//! What is not hidden: the requests (which blocks are asked) and the members' addresses.
//!
//! Not for: where the key comes from (the volume's settings, `meta::Meta::peer_key`), or the
//! blocks' own checks (every block a peer answers is also verified like any stored object).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use ring::rand::{SecureRandom, SystemRandom};
use ring::{aead, hmac};

/// The request header that carries `TIME.NONCE.HMAC` (seconds since the epoch; hex).
pub const HEADER: &str = "x-unkai-peer-auth";

/// The answer header that carries the IV and tag of the sealed answer (`IV.TAG`, hex).
pub const ANSWER_HEADER: &str = "x-unkai-peer-seal";

/// How far a request's time may be from the server's clock.
pub const SKEW: Duration = Duration::from_secs(120);

/// Bytes of a request's nonce.
const NONCE: usize = 16;

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials at all (answered 401).
    Missing,
    /// Credentials that do not hold (wrong key, too old, replayed, unreadable; answered 403).
    Wrong(&'static str),
}

/// A request's credentials: the header's value, and the nonce its answer is bound to.
pub struct Signed {
    pub header: String,
    pub nonce: String,
}

/// The group's key, ready to sign and check requests and answers. Its bytes are never shown.
pub struct Auth {
    key: hmac::Key,
    rng: SystemRandom,
    /// The nonces of requests answered within the last [`SKEW`]s or so, with their times.
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    nonces: HashMap<[u8; NONCE], u64>,
    /// Size at which the nonces too old to be accepted anyway are dropped.
    prune_at: usize,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth(key hidden)")
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn message(method: &str, path: &str, time: u64, nonce: &str) -> String {
    format!("unkai-peer-v2\n{method}\n{path}\n{time}\n{nonce}")
}

impl Auth {
    /// The key as the volume records it (hex); its bytes as given when not hex.
    pub fn new(key: &str) -> Auth {
        let bytes = hex::decode(key.trim()).unwrap_or_else(|_| key.as_bytes().to_vec());
        Auth {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
            rng: SystemRandom::new(),
            seen: Mutex::default(),
        }
    }

    /// The credentials of a request `method path` made now.
    pub fn sign(&self, method: &str, path: &str) -> Signed {
        let mut nonce = [0u8; NONCE];
        // The system's random numbers; were they ever to fail, the time still varies the
        // nonce, and a repeated one is refused by the server, never accepted twice.
        if self.rng.fill(&mut nonce).is_err() {
            nonce[..8].copy_from_slice(&(now_nanos()).to_le_bytes());
        }
        self.sign_at(method, path, now_secs(), &hex::encode(nonce))
    }

    fn sign_at(&self, method: &str, path: &str, time: u64, nonce: &str) -> Signed {
        let tag = hmac::sign(&self.key, message(method, path, time, nonce).as_bytes());
        Signed {
            header: format!("{time}.{nonce}.{}", hex::encode(tag.as_ref())),
            nonce: nonce.to_string(),
        }
    }

    /// Checks the header value `given` (None: the request had none) of request `method
    /// path`, and that it was not seen before. Returns the nonce to bind the answer to.
    pub fn check(&self, method: &str, path: &str, given: Option<&str>) -> Result<String, Refusal> {
        self.check_at(method, path, given, now_secs())
    }

    fn check_at(
        &self,
        method: &str,
        path: &str,
        given: Option<&str>,
        now: u64,
    ) -> Result<String, Refusal> {
        const UNREADABLE: Refusal = Refusal::Wrong("unreadable credentials");
        let given = given.ok_or(Refusal::Missing)?;
        let mut parts = given.splitn(3, '.');
        let (Some(time), Some(nonce), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(UNREADABLE);
        };
        let time: u64 = time.parse().map_err(|_| UNREADABLE)?;
        let tag = hex::decode(tag).map_err(|_| UNREADABLE)?;
        let nonce_bytes: [u8; NONCE] = hex::decode(nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or(UNREADABLE)?;
        if time.abs_diff(now) > SKEW.as_secs() {
            return Err(Refusal::Wrong(
                "request too old or from the future (clocks apart?)",
            ));
        }
        hmac::verify(
            &self.key,
            message(method, path, time, nonce).as_bytes(),
            &tag,
        )
        .map_err(|_| Refusal::Wrong("wrong key"))?;
        // Only requests signed with the key are remembered: no one else can fill this.
        let mut seen = self.seen.lock();
        if seen.nonces.insert(nonce_bytes, time).is_some() {
            return Err(Refusal::Wrong("replayed request (nonce seen before)"));
        }
        if seen.nonces.len() >= seen.prune_at {
            // A nonce older than the skew would be refused by its time: no need to keep it.
            let oldest = now.saturating_sub(SKEW.as_secs() + 1);
            seen.nonces.retain(|_, t| *t >= oldest);
            seen.prune_at = (seen.nonces.len() * 2).max(4096);
        }
        Ok(nonce.to_string())
    }

    /// The key of the answer to the request of `path` and `nonce`: HMAC-SHA256 of them under
    /// the group's key (a PRF, as HKDF's expand step), so that each answer has a key of its
    /// own that only members can make.
    fn answer_key(&self, path: &str, nonce: &str) -> aead::LessSafeKey {
        let derived = hmac::sign(
            &self.key,
            format!("unkai-peer-v3-answer\n{path}\n{nonce}").as_bytes(),
        );
        let key = aead::UnboundKey::new(&aead::AES_256_GCM, derived.as_ref())
            .expect("HMAC-SHA256 gives the 32 bytes of an AES-256 key");
        aead::LessSafeKey::new(key)
    }

    /// Seals `body` in place as the answer to the request of `path` and `nonce`: encrypted
    /// and authenticated (AES-256-GCM) under that answer's key, with a random IV. Returns the
    /// answer header's value, `IV.TAG` (hex).
    pub fn seal_answer(&self, path: &str, nonce: &str, body: &mut [u8]) -> String {
        let mut iv = [0u8; aead::NONCE_LEN];
        // The key is the request's own: an IV that failed to be random would be used once
        // anyway (a replayed request is refused); the time varies it still.
        if self.rng.fill(&mut iv).is_err() {
            iv[..8].copy_from_slice(&now_nanos().to_le_bytes());
        }
        let tag = self
            .answer_key(path, nonce)
            .seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(iv),
                aead::Aad::empty(),
                body,
            )
            .expect("AES-GCM seals up to 64 GiB");
        format!("{}.{}", hex::encode(iv), hex::encode(tag.as_ref()))
    }

    /// Opens `body` in place, the answer to the request of `path` and `nonce` whose header
    /// was `given`: whether it was sealed with the group's key for that very request and not
    /// altered since (then `body` holds the answer's bytes in the clear).
    pub fn open_answer(
        &self,
        path: &str,
        nonce: &str,
        body: &mut [u8],
        given: Option<&str>,
    ) -> bool {
        let Some((iv, tag)) = given.and_then(|g| g.split_once('.')) else {
            return false;
        };
        let (Ok(iv), Ok(tag)) = (hex::decode(iv), hex::decode(tag)) else {
            return false;
        };
        let (Ok(iv), Ok(tag)) = (
            aead::Nonce::try_assume_unique_for_key(&iv),
            <[u8; aead::MAX_TAG_LEN]>::try_from(tag.as_slice()),
        ) else {
            return false;
        };
        // The tag is compared in constant time by ring.
        self.answer_key(path, nonce)
            .open_in_place_separate_tag(iv, aead::Aad::empty(), aead::Tag::from(tag), body, 0..)
            .is_ok()
    }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE_A: &str = "000102030405060708090a0b0c0d0e0f";

    #[test]
    fn a_request_signed_with_the_key_passes_once_and_nothing_else_does() {
        let a = Auth::new(&hex::encode([7u8; 32]));
        let other = Auth::new(&hex::encode([8u8; 32]));
        let now = 1_800_000_000;
        let sig = a.sign_at("GET", "/v1/blocks/k", now, NONCE_A).header;
        assert_eq!(
            a.check_at("GET", "/v1/blocks/k", Some(&sig), now + 5),
            Ok(NONCE_A.to_string())
        );
        // The same request again: refused.
        assert_eq!(
            a.check_at("GET", "/v1/blocks/k", Some(&sig), now + 6),
            Err(Refusal::Wrong("replayed request (nonce seen before)"))
        );
        // Another path, another key, no credentials, too old, garbage.
        let fresh = a.sign("GET", "/v1/blocks/k").header;
        assert!(
            a.check_at("GET", "/v1/blocks/j", Some(&fresh), now_secs())
                .is_err()
        );
        let forged = other.sign("GET", "/v1/blocks/k").header;
        assert_eq!(
            a.check("GET", "/v1/blocks/k", Some(&forged)),
            Err(Refusal::Wrong("wrong key"))
        );
        assert_eq!(a.check("GET", "/v1/blocks/k", None), Err(Refusal::Missing));
        let old = a.sign_at("GET", "/v1/blocks/k", now, &hex::encode([1u8; 16]));
        assert!(
            a.check_at("GET", "/v1/blocks/k", Some(&old.header), now + 3600)
                .is_err()
        );
        assert!(a.check("GET", "/v1/blocks/k", Some("x.y.z")).is_err());
        assert!(a.check("GET", "/v1/blocks/k", Some("1.2")).is_err());
        // A fresh request passes; two requests never share a nonce.
        assert!(a.check("GET", "/v1/blocks/k", Some(&fresh)).is_ok());
        assert_ne!(a.sign("GET", "/").nonce, a.sign("GET", "/").nonce);
        assert!(!format!("{a:?}").contains("07"));
    }

    #[test]
    fn old_nonces_are_forgotten_but_still_refused_by_their_time() {
        let a = Auth::new(&hex::encode([7u8; 32]));
        let now = 1_800_000_000;
        let first = a.sign_at("GET", "/p", now, NONCE_A).header;
        assert!(a.check_at("GET", "/p", Some(&first), now).is_ok());
        for i in 0..5000u32 {
            let mut n = [0u8; NONCE];
            n[..4].copy_from_slice(&i.to_le_bytes());
            n[15] = 0xff;
            let later = now + 200;
            let s = a.sign_at("GET", "/p", later, &hex::encode(n)).header;
            assert!(a.check_at("GET", "/p", Some(&s), later).is_ok());
        }
        assert!(a.seen.lock().nonces.len() < 5001, "old nonces kept");
        assert!(
            a.check_at("GET", "/p", Some(&first), now + 200).is_err(),
            "a forgotten nonce is still too old"
        );
    }

    #[test]
    fn an_answer_is_hidden_and_bound_to_its_request_its_bytes_and_the_key() {
        let a = Auth::new(&hex::encode([7u8; 32]));
        let other = Auth::new(&hex::encode([8u8; 32]));
        let body: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let sealed = |auth: &Auth, path: &str| {
            let mut b = body.clone();
            let tag = auth.seal_answer(path, NONCE_A, &mut b);
            (b, tag)
        };
        let (wire, tag) = sealed(&a, "/v1/blocks/k");
        assert_ne!(wire, body, "the answer crosses the network in the clear");
        let opens = |path: &str, nonce: &str, wire: &[u8], tag: Option<&str>| {
            let mut b = wire.to_vec();
            a.open_answer(path, nonce, &mut b, tag).then_some(b)
        };
        assert_eq!(
            opens("/v1/blocks/k", NONCE_A, &wire, Some(&tag)).as_ref(),
            Some(&body)
        );
        let mut altered = wire.clone();
        altered[40_000] ^= 1;
        assert!(opens("/v1/blocks/k", NONCE_A, &altered, Some(&tag)).is_none());
        let other_nonce = "ff0102030405060708090a0b0c0d0e0f";
        assert!(opens("/v1/blocks/k", other_nonce, &wire, Some(&tag)).is_none());
        assert!(opens("/v1/blocks/j", NONCE_A, &wire, Some(&tag)).is_none());
        assert!(opens("/v1/blocks/k", NONCE_A, &wire, None).is_none());
        assert!(opens("/v1/blocks/k", NONCE_A, &wire, Some("00.11")).is_none());
        let (forged, ftag) = sealed(&other, "/v1/blocks/k");
        assert!(opens("/v1/blocks/k", NONCE_A, &forged, Some(&ftag)).is_none());
        // Two answers to the same request (a member restarted) differ: a fresh IV each.
        assert_ne!(sealed(&a, "/v1/blocks/k").0, wire);
    }
}
