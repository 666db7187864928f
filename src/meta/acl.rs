//! POSIX.1e access control lists as Linux hands them over (the `system.posix_acl_access` and
//! `system.posix_acl_default` xattrs) and the rules that tie them to the mode bits: an access
//! ACL sets the mode (and goes when the mode says it all), chmod rewrites the ACL's owner,
//! mask and other entries, and a directory's default ACL becomes the access ACL (masked by the
//! mode asked for, without the umask) of what is created in it, and the default ACL of its
//! subdirectories. The rules are the kernel's own (`fs/posix_acl.c`), so that a FUSE mount
//! behaves as ext4 or tmpfs does.
//!
//! Not for: enforcing ACLs (the kernel does, given `FUSE_POSIX_ACL` and the xattrs), storing
//! them (`ops` keeps them as xattrs of the inode), or deciding who may set them (`ops`).
//!
//! The xattr format is Linux's `posix_acl_xattr_header` (version 2, little-endian) followed by
//! 8-byte entries `(tag: u16, perm: u16, id: u32)`. No maintained crate parses it apart from
//! the C library (libacl, which only works on paths), so it is read here, checked as strictly
//! as the kernel checks it.

/// The access ACL of an inode.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL of a directory (inherited by what is created in it).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// Whether `name` is one of the two ACL xattrs.
pub fn is_acl(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A valid ACL (the entries in the kernel's order, each base entry once, a mask where named
/// entries need one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Reads an ACL xattr; None if it is not a valid ACL (the caller answers EINVAL).
    pub fn parse(b: &[u8]) -> Option<Acl> {
        let (head, rest) = b.split_first_chunk::<4>()?;
        if u32::from_le_bytes(*head) != VERSION || rest.is_empty() || rest.len() % 8 != 0 {
            return None;
        }
        let entries: Vec<Entry> = rest
            .chunks_exact(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let acl = Acl { entries };
        acl.valid().then_some(acl)
    }

    /// The kernel's `posix_acl_valid`: base entries once each, in order, named entries between
    /// them, a mask if any named entry is there, permissions of rwx only.
    fn valid(&self) -> bool {
        // 1: expect USER_OBJ; 2: in users; 3: in groups; 4: after the mask; 0: done.
        let mut state = 1;
        let mut needs_mask = false;
        for e in &self.entries {
            if e.perm & !7 != 0 {
                return false;
            }
            state = match (e.tag, state) {
                (USER_OBJ, 1) => 2,
                (USER, 2) => {
                    needs_mask = true;
                    2
                }
                (GROUP_OBJ, 2) => 3,
                (GROUP, 3) => {
                    needs_mask = true;
                    3
                }
                (MASK, 3) => 4,
                (OTHER, 4) => 0,
                (OTHER, 3) if !needs_mask => 0,
                _ => return false,
            };
        }
        state == 0
    }

    /// The xattr form.
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    fn perm(&self, tag: u16) -> Option<u32> {
        self.entries
            .iter()
            .find(|e| e.tag == tag)
            .map(|e| u32::from(e.perm))
    }

    fn set_perm(&mut self, tag: u16, perm: u32) -> bool {
        match self.entries.iter_mut().find(|e| e.tag == tag) {
            Some(e) => {
                e.perm = (perm & 7) as u16;
                true
            }
            None => false,
        }
    }

    /// Whether the mode bits say all this ACL says (owner, owning group and other only, no
    /// mask): the kernel's `posix_acl_equiv_mode` returning 0. Such an access ACL is not kept.
    pub fn is_minimal(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// The permission bits (0o777) the ACL gives: owner, mask (or owning group), other.
    pub fn mode(&self) -> u32 {
        let group = self.perm(MASK).or(self.perm(GROUP_OBJ)).unwrap_or(0);
        (self.perm(USER_OBJ).unwrap_or(0) << 6) | (group << 3) | self.perm(OTHER).unwrap_or(0)
    }

    /// chmod: the owner, mask (or owning group, without a mask) and other entries take the
    /// new permission bits (`posix_acl_chmod`).
    pub fn chmod(&mut self, mode: u32) {
        self.set_perm(USER_OBJ, mode >> 6);
        if !self.set_perm(MASK, mode >> 3) {
            self.set_perm(GROUP_OBJ, mode >> 3);
        }
        self.set_perm(OTHER, mode);
    }

    /// Whether this access ACL lets `uid` (in the groups `in_group` says) access an inode
    /// owned by `owner`:`group` for `want` (r=4, w=2, x=1), as the kernel's
    /// `posix_acl_permission` decides for a caller other than root. For front ends that
    /// check permissions themselves (the NFS server); a FUSE mount leaves it to the kernel.
    pub fn permits(
        &self,
        owner: u32,
        group: u32,
        uid: u32,
        in_group: &dyn Fn(u32) -> bool,
        want: u32,
    ) -> bool {
        let masked = |p: u32| self.perm(MASK).map_or(p, |m| p & m) & want == want;
        let mut found = false;
        for e in &self.entries {
            let p = u32::from(e.perm);
            match e.tag {
                USER_OBJ if uid == owner => return p & want == want,
                USER if e.id == uid => return masked(p),
                GROUP_OBJ | GROUP => {
                    let gid = if e.tag == GROUP_OBJ { group } else { e.id };
                    if in_group(gid) {
                        found = true;
                        if p & want == want {
                            return masked(p);
                        }
                    }
                }
                OTHER => return !found && p & want == want,
                _ => {}
            }
        }
        false
    }

    /// Inheritance (`posix_acl_create_masq`): this default ACL, masked by the permission bits
    /// `mode` a create asked for, becomes the new inode's access ACL; returns it (None where
    /// the mode bits say it all) and the new permission bits.
    pub fn inherit(&self, mode: u32) -> (Option<Acl>, u32) {
        let mut acl = self.clone();
        let mut mode = mode & 0o777;
        let mut keep = false;
        for e in &mut acl.entries {
            let p = u32::from(e.perm);
            match e.tag {
                USER_OBJ => {
                    let p = p & (mode >> 6);
                    e.perm = p as u16;
                    mode &= (p << 6) | 0o077;
                }
                OTHER => {
                    let p = p & mode;
                    e.perm = p as u16;
                    mode &= p | 0o770;
                }
                USER | GROUP | MASK => keep = true,
                _ => {}
            }
        }
        let group_tag = if acl.perm(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        if let Some(e) = acl.entries.iter_mut().find(|e| e.tag == group_tag) {
            let p = u32::from(e.perm) & ((mode >> 3) & 7);
            e.perm = p as u16;
            mode &= (p << 3) | 0o707;
        }
        (keep.then_some(acl), mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, perm, id)| Entry { tag, perm, id })
                .collect(),
        }
    }

    /// The id of an entry that names nobody (owner, owning group, mask, other).
    const U: u32 = u32::MAX;

    #[test]
    fn an_acl_reads_back_as_it_was_written() {
        let a = acl(&[
            (USER_OBJ, 6, U),
            (USER, 4, 1000),
            (GROUP_OBJ, 4, U),
            (GROUP, 0, 65534),
            (MASK, 6, U),
            (OTHER, 0, U),
        ]);
        let b = a.to_xattr();
        assert_eq!(b.len(), 4 + 6 * 8);
        assert_eq!(Acl::parse(&b), Some(a.clone()));
        assert!(!a.is_minimal());
        assert_eq!(a.mode(), 0o660);
    }

    #[test]
    fn malformed_acls_are_refused() {
        let ok = acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (OTHER, 5, U)]);
        assert!(Acl::parse(&ok.to_xattr()).is_some());
        assert_eq!(ok.mode(), 0o755);
        assert!(ok.is_minimal());
        for bad in [
            // A named user without a mask.
            acl(&[
                (USER_OBJ, 7, U),
                (USER, 7, 1),
                (GROUP_OBJ, 5, U),
                (OTHER, 5, U),
            ]),
            // Out of order.
            acl(&[(GROUP_OBJ, 5, U), (USER_OBJ, 7, U), (OTHER, 5, U)]),
            // No other entry.
            acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 5, U)]),
            // A permission beyond rwx.
            acl(&[(USER_OBJ, 8, U), (GROUP_OBJ, 5, U), (OTHER, 5, U)]),
            // An unknown tag.
            acl(&[
                (USER_OBJ, 7, U),
                (GROUP_OBJ, 5, U),
                (0x40, 5, U),
                (OTHER, 5, U),
            ]),
        ] {
            assert_eq!(Acl::parse(&bad.to_xattr()), None, "{bad:?}");
        }
        let mut wrong_version = ok.to_xattr();
        wrong_version[0] = 1;
        assert_eq!(Acl::parse(&wrong_version), None);
        assert_eq!(Acl::parse(&ok.to_xattr()[..10]), None);
        assert_eq!(Acl::parse(&[]), None);
    }

    #[test]
    fn chmod_rewrites_the_mask_not_the_owning_group() {
        let mut a = acl(&[
            (USER_OBJ, 7, U),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, U),
            (MASK, 7, U),
            (OTHER, 5, U),
        ]);
        a.chmod(0o640);
        assert_eq!(a.perm(USER_OBJ), Some(6));
        assert_eq!(a.perm(MASK), Some(4));
        assert_eq!(a.perm(GROUP_OBJ), Some(5));
        assert_eq!(a.perm(USER), Some(7));
        assert_eq!(a.perm(OTHER), Some(0));
        assert_eq!(a.mode(), 0o640);
    }

    #[test]
    fn inheritance_masks_the_default_acl_with_the_mode_asked_for() {
        // setfacl -d -m u:1000:rwx,m::rwx on a 0755 directory.
        let d = acl(&[
            (USER_OBJ, 7, U),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, U),
            (MASK, 7, U),
            (OTHER, 5, U),
        ]);
        // open(O_CREAT, 0666): no umask, the mask keeps rw.
        let (a, mode) = d.inherit(0o666);
        let a = a.expect("named entries are kept");
        assert_eq!(mode, 0o664);
        assert_eq!(a.perm(USER_OBJ), Some(6));
        assert_eq!(a.perm(MASK), Some(6));
        assert_eq!(a.perm(USER), Some(7), "named entries are not masked");
        assert_eq!(a.perm(OTHER), Some(4));
        assert_eq!(a.mode(), 0o664);
        // A default ACL of base entries only is the mode bits alone.
        let base = acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 0, U), (OTHER, 0, U)]);
        assert_eq!(base.inherit(0o777), (None, 0o700));
    }

    #[test]
    fn permits_as_the_kernel_decides() {
        // user::rw- user:1001:r-- group::r-- group:50:rw- mask::r-- other::---
        let a = acl(&[
            (USER_OBJ, 6, 0),
            (USER, 4, 1001),
            (GROUP_OBJ, 4, 0),
            (GROUP, 6, 50),
            (MASK, 4, 0),
            (OTHER, 0, 0),
        ]);
        let none = |_: u32| false;
        let in50 = |g: u32| g == 50;
        let in7 = |g: u32| g == 7;
        assert!(a.permits(1000, 7, 1000, &none, 6)); // the owner
        assert!(a.permits(1000, 7, 1001, &none, 4)); // a named user
        assert!(!a.permits(1000, 7, 1001, &none, 2));
        assert!(!a.permits(1000, 7, 1002, &in50, 2)); // group:50 rw, but the mask says r
        assert!(a.permits(1000, 7, 1002, &in50, 4));
        assert!(a.permits(1000, 7, 1002, &in7, 4)); // the owning group
        assert!(!a.permits(1000, 7, 1002, &none, 4)); // other
    }
}
