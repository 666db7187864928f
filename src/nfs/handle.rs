//! NFS file handles and the write verifier.
//!
//! A handle is 24 bytes: the volume's id (8 bytes of a digest of its uuid), the inode number,
//! and a tag (8 bytes of an HMAC-SHA256, keyed by the volume's uuid, over the volume id, the
//! export's root inode and the inode). Nothing in it changes when the server restarts, so a
//! client's handles outlive a restart. The metadata keeps no per-inode generation; none is
//! needed, because inode numbers come from a counter that never goes back, so a number is
//! never reused for another file, and a handle of a deleted inode is stale (its lookup finds
//! nothing). The tag makes a handle unforgeable without the uuid (which no NFS reply shows):
//! a client holds only handles this export gave out, so with `--subdir` it cannot name an
//! inode outside the export by guessing its number, and a handle of another export root
//! (another `--subdir`, or the whole volume) is stale here.
//!
//! The write verifier is drawn anew each time the server starts: a client that sees it
//! change between an UNSTABLE WRITE and its COMMIT sends the data again (RFC 1813 §3.3.7).
//!
//! Not for: what a handle's inode holds (`fs`).

use ring::{digest, hmac};
use subtle::ConstantTimeEq;

use crate::meta::Ino;

/// The length of every handle this server gives out.
pub const LEN: usize = 24;

/// Why a handle is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not of this server's form (NFS3ERR_BADHANDLE).
    Bad,
    /// Of another volume or export, or forged (NFS3ERR_STALE).
    Stale,
}

/// Makes and checks the handles of one export.
pub struct Handles {
    volume: [u8; 8],
    root: Ino,
    key: hmac::Key,
}

impl Handles {
    /// The handles of the export rooted at `root` of the volume whose uuid is `uuid`.
    pub fn new(uuid: &str, root: Ino) -> Handles {
        let d = digest::digest(
            &digest::SHA256,
            format!("unkai nfs volume {uuid}").as_bytes(),
        );
        let mut volume = [0u8; 8];
        volume.copy_from_slice(&d.as_ref()[..8]);
        let key = hmac::Key::new(
            hmac::HMAC_SHA256,
            format!("unkai nfs handles {uuid}").as_bytes(),
        );
        Handles { volume, root, key }
    }

    fn tag(&self, ino: Ino) -> [u8; 8] {
        let mut msg = [0u8; 24];
        msg[..8].copy_from_slice(&self.volume);
        msg[8..16].copy_from_slice(&self.root.to_be_bytes());
        msg[16..].copy_from_slice(&ino.to_be_bytes());
        let t = hmac::sign(&self.key, &msg);
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&t.as_ref()[..8]);
        tag
    }

    /// The handle of `ino`.
    pub fn handle(&self, ino: Ino) -> Vec<u8> {
        let mut h = Vec::with_capacity(LEN);
        h.extend_from_slice(&self.volume);
        h.extend_from_slice(&ino.to_be_bytes());
        h.extend_from_slice(&self.tag(ino));
        h
    }

    /// The inode `h` names, if it is one of this export's handles.
    pub fn inode(&self, h: &[u8]) -> Result<Ino, Refused> {
        if h.len() != LEN {
            return Err(Refused::Bad);
        }
        let ino = Ino::from_be_bytes(h[8..16].try_into().expect("8 bytes"));
        let ok = h[..8] == self.volume && ino != 0 && bool::from(h[16..].ct_eq(&self.tag(ino)));
        if ok { Ok(ino) } else { Err(Refused::Stale) }
    }
}

/// This run's write verifier: random, so it differs from every earlier run's.
pub fn write_verifier() -> [u8; 8] {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_outlive_a_restart_and_resist_forgery() {
        let a = Handles::new("uuid-a", 1);
        let h = a.handle(42);
        assert_eq!(h.len(), LEN);
        // Another run of the same export: the same handle, the same inode.
        let again = Handles::new("uuid-a", 1);
        assert_eq!(again.handle(42), h);
        assert_eq!(again.inode(&h), Ok(42));
        // Another inode number put in: stale.
        let mut forged = h.clone();
        forged[15] ^= 1;
        assert_eq!(a.inode(&forged), Err(Refused::Stale));
        // Another volume, or another export root of this one: stale.
        assert_eq!(Handles::new("uuid-b", 1).inode(&h), Err(Refused::Stale));
        assert_eq!(Handles::new("uuid-a", 9).inode(&h), Err(Refused::Stale));
        assert_eq!(a.inode(&h[..16]), Err(Refused::Bad));
        assert_ne!(write_verifier(), write_verifier());
    }
}
