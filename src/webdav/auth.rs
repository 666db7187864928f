//! HTTP Basic authentication of the WebDAV server: who may use it, and the check of each
//! request's `Authorization` header (in constant time: names and passwords are compared as
//! SHA-256 digests with `subtle`, every user each time).
//!
//! Only digests of the secret are kept; it is never logged or printed.
//!
//! Not for: what an authenticated user may do (the server acts as one identity on the
//! volume, see `webdav::fs`), TLS.

use headers::HeaderMapExt;
use headers::authorization::{Authorization, Basic};
use ring::digest::{SHA256, digest};
use subtle::ConstantTimeEq;

/// The realm named in `WWW-Authenticate`.
pub const REALM: &str = "unkai";

/// Who may use the server.
#[derive(Clone)]
pub enum Auth {
    /// Anyone (`--no-auth`).
    Off,
    /// These users, with this password (digests only).
    Basic {
        users: Vec<(String, [u8; 32])>,
        password: [u8; 32],
    },
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, b).as_ref());
    out
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No Basic credentials in the request.
    Missing,
    /// Credentials that are not a user's.
    Wrong,
}

impl Auth {
    /// `users` sharing `password`.
    pub fn basic(users: &[String], password: &[u8]) -> Auth {
        Auth::Basic {
            users: users
                .iter()
                .map(|u| (u.clone(), sha256(u.as_bytes())))
                .collect(),
            password: sha256(password),
        }
    }

    /// The user a request authenticates as (`None` with authentication off).
    pub fn check(&self, headers: &http::HeaderMap) -> Result<Option<String>, Refused> {
        let Auth::Basic { users, password } = self else {
            return Ok(None);
        };
        let Some(creds) = headers.typed_get::<Authorization<Basic>>() else {
            return Err(Refused::Missing);
        };
        let name = sha256(creds.username().as_bytes());
        let good_password = sha256(creds.password().as_bytes()).ct_eq(password);
        // Every user compared, whichever matches: the time says nothing about which.
        let mut who = None;
        for (user, digest) in users {
            if bool::from(name.ct_eq(digest) & good_password) {
                who = Some(user.clone());
            }
        }
        who.map(Some).ok_or(Refused::Wrong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(user: &str, password: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.typed_insert(Authorization::basic(user, password));
        h
    }

    #[test]
    fn only_a_listed_user_with_the_password_passes() {
        let a = Auth::basic(&["alice".into(), "bob".into()], b"s3cret");
        assert_eq!(a.check(&with("alice", "s3cret")), Ok(Some("alice".into())));
        assert_eq!(a.check(&with("bob", "s3cret")), Ok(Some("bob".into())));
        assert_eq!(a.check(&with("alice", "s3cre")), Err(Refused::Wrong));
        assert_eq!(a.check(&with("alice", "s3cret ")), Err(Refused::Wrong));
        assert_eq!(a.check(&with("carol", "s3cret")), Err(Refused::Wrong));
        assert_eq!(a.check(&http::HeaderMap::new()), Err(Refused::Missing));
        let mut bearer = http::HeaderMap::new();
        bearer.insert(http::header::AUTHORIZATION, "Bearer xyz".parse().unwrap());
        assert_eq!(a.check(&bearer), Err(Refused::Missing));
        assert_eq!(Auth::Off.check(&http::HeaderMap::new()), Ok(None));
    }
}
