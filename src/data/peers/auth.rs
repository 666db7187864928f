//! How members of a peer cache group prove they hold the group's key: each request carries
//! the time it was made and an HMAC-SHA256 (ring's) of its method, path and that time under
//! the key; an answer goes only to a request whose HMAC is right and whose time is within
//! [`SKEW`] of the server's clock.
//!
//! Not for: where the key comes from (the volume's settings, `meta::Meta::peer_key`), or the
//! answers' integrity (every block a peer answers is checked like any stored object).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;

/// The request header that carries `TIME.HMAC` (seconds since the epoch, hex).
pub const HEADER: &str = "x-unkai-peer-auth";

/// How far a request's time may be from the server's clock.
pub const SKEW: Duration = Duration::from_secs(120);

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials at all (answered 401).
    Missing,
    /// Credentials that do not hold (wrong key, too old, unreadable; answered 403).
    Wrong(&'static str),
}

/// The group's key, ready to sign and check requests. Its bytes are never shown.
pub struct Auth {
    key: hmac::Key,
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

fn message(method: &str, path: &str, time: u64) -> String {
    format!("unkai-peer-v1\n{method}\n{path}\n{time}")
}

impl Auth {
    /// The key as the volume records it (hex); its bytes as given when not hex.
    pub fn new(key: &str) -> Auth {
        let bytes = hex::decode(key.trim()).unwrap_or_else(|_| key.as_bytes().to_vec());
        Auth {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
        }
    }

    /// The header value for a request `method path` made now.
    pub fn sign(&self, method: &str, path: &str) -> String {
        self.sign_at(method, path, now_secs())
    }

    fn sign_at(&self, method: &str, path: &str, time: u64) -> String {
        let tag = hmac::sign(&self.key, message(method, path, time).as_bytes());
        format!("{time}.{}", hex::encode(tag.as_ref()))
    }

    /// Checks the header value `given` (None: the request had none) of request `method path`.
    pub fn check(&self, method: &str, path: &str, given: Option<&str>) -> Result<(), Refusal> {
        self.check_at(method, path, given, now_secs())
    }

    fn check_at(
        &self,
        method: &str,
        path: &str,
        given: Option<&str>,
        now: u64,
    ) -> Result<(), Refusal> {
        let given = given.ok_or(Refusal::Missing)?;
        let (time, tag) = given
            .split_once('.')
            .ok_or(Refusal::Wrong("unreadable credentials"))?;
        let time: u64 = time
            .parse()
            .map_err(|_| Refusal::Wrong("unreadable credentials"))?;
        let tag = hex::decode(tag).map_err(|_| Refusal::Wrong("unreadable credentials"))?;
        if time.abs_diff(now) > SKEW.as_secs() {
            return Err(Refusal::Wrong(
                "request too old or from the future (clocks apart?)",
            ));
        }
        hmac::verify(&self.key, message(method, path, time).as_bytes(), &tag)
            .map_err(|_| Refusal::Wrong("wrong key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_signed_with_the_key_passes_and_nothing_else_does() {
        let a = Auth::new(&hex::encode([7u8; 32]));
        let other = Auth::new(&hex::encode([8u8; 32]));
        let now = 1_800_000_000;
        let sig = a.sign_at("GET", "/v1/blocks/k", now);
        assert_eq!(
            a.check_at("GET", "/v1/blocks/k", Some(&sig), now + 5),
            Ok(())
        );
        // Another path, another key, no credentials, too old, garbage.
        assert!(a.check_at("GET", "/v1/blocks/j", Some(&sig), now).is_err());
        let forged = other.sign_at("GET", "/v1/blocks/k", now);
        assert_eq!(
            a.check_at("GET", "/v1/blocks/k", Some(&forged), now),
            Err(Refusal::Wrong("wrong key"))
        );
        assert_eq!(
            a.check_at("GET", "/v1/blocks/k", None, now),
            Err(Refusal::Missing)
        );
        assert!(
            a.check_at("GET", "/v1/blocks/k", Some(&sig), now + 3600)
                .is_err()
        );
        assert!(a.check_at("GET", "/v1/blocks/k", Some("x.y"), now).is_err());
        assert!(!format!("{a:?}").contains("07"));
    }
}
