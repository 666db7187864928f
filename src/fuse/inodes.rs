//! The kernel's inode numbers and the volume's: the same, but for the mount's root.
//!
//! The kernel calls the root of every FUSE mount inode 1 (`FUSE_ROOT_ID`). A mount of the
//! whole volume serves the volume's root there ([`ROOT_INO`], also 1); a mount of a
//! directory (`unkai mount --subdir`) serves that directory instead. Every inode number that
//! crosses the FUSE boundary goes through [`Inodes`], in both directions, so the rest of the
//! adapter, `vfs` and `meta` see the volume's numbers only.
//!
//! A subdir mount cannot reach outside its directory: the kernel names inodes only by the
//! numbers replies gave it, the mount root's own number and the volume root's are both
//! answered as 1, and the mount root's `..` is the mount root (see [`Inodes::is_root_parent`]).
//!
//! Not for: which directory is mounted (resolved from a path by `volume`), or anything else
//! about a request.

use fuser::INodeNo;

use crate::meta::{Ino, ROOT_INO};

/// The kernel's root is the kernel's inode 1.
const KERNEL_ROOT: u64 = 1;

/// The mapping of one mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inodes {
    /// The volume's inode served as the mount's root.
    root: Ino,
}

impl Default for Inodes {
    fn default() -> Self {
        Inodes::at(ROOT_INO)
    }
}

impl Inodes {
    /// A mount whose root is the volume's inode `root` ([`ROOT_INO`] for the whole volume).
    pub fn at(root: Ino) -> Inodes {
        Inodes { root }
    }

    /// Whether this mount serves a directory of the volume rather than its root.
    pub fn is_subdir(self) -> bool {
        self.root != ROOT_INO
    }

    /// The volume's inode the kernel means by `k`.
    pub fn volume(self, k: INodeNo) -> Ino {
        if k.0 == KERNEL_ROOT { self.root } else { k.0 }
    }

    /// The kernel's number of the volume's inode `v`. The volume's root, in a subdir mount,
    /// only ever shows as the mount root's parent (`..`), which is the mount root.
    pub fn kernel(self, v: Ino) -> INodeNo {
        if v == self.root || v == ROOT_INO {
            INodeNo(KERNEL_ROOT)
        } else {
            INodeNo(v)
        }
    }

    /// The kernel's number of `v` for a change another client made (None: nothing this mount
    /// can show, the volume's root outside a subdir mount).
    pub fn notified(self, v: Ino) -> Option<INodeNo> {
        if v == ROOT_INO && self.is_subdir() {
            None
        } else {
            Some(self.kernel(v))
        }
    }

    /// Whether `name` in the volume's directory `dir` is the mount root's parent: `..` of a
    /// subdir mount's root, which is answered as the mount root itself (as `/..` is `/`).
    pub fn is_root_parent(self, dir: Ino, name: &[u8]) -> bool {
        self.is_subdir() && dir == self.root && name == b".."
    }

    /// The kernel's number of the entry `name` (inode `v`) of directory `dir` in a listing.
    pub fn entry(self, dir: Ino, name: &[u8], v: Ino) -> INodeNo {
        if self.is_root_parent(dir, name) {
            INodeNo(KERNEL_ROOT)
        } else {
            self.kernel(v)
        }
    }

    /// The mount's root, as the volume numbers it.
    pub fn root(self) -> Ino {
        self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_volume_is_the_identity() {
        let m = Inodes::default();
        assert!(!m.is_subdir());
        for i in [1, 2, 77] {
            assert_eq!(m.volume(INodeNo(i)), i);
            assert_eq!(m.kernel(i), INodeNo(i));
            assert_eq!(m.notified(i), Some(INodeNo(i)));
        }
        assert!(!m.is_root_parent(1, b".."));
    }

    #[test]
    fn a_subdir_is_the_kernels_root_and_the_volume_root_is_out_of_reach() {
        let m = Inodes::at(42);
        assert!(m.is_subdir());
        assert_eq!(m.volume(INodeNo(1)), 42);
        assert_eq!(m.kernel(42), INodeNo(1));
        // The volume's root never gets a number of its own.
        assert_eq!(m.kernel(1), INodeNo(1));
        assert_eq!(m.notified(1), None);
        assert_eq!(m.notified(42), Some(INodeNo(1)));
        assert_eq!(m.volume(INodeNo(7)), 7);
        assert!(m.is_root_parent(42, b".."));
        assert!(!m.is_root_parent(42, b"x"));
        assert!(!m.is_root_parent(7, b".."));
        assert_eq!(m.entry(42, b"..", 9), INodeNo(1));
        assert_eq!(m.entry(42, b"a", 9), INodeNo(9));
    }
}
