//! The export options of `unkai nfs`, as exports(5) names them: which client networks may
//! connect (`--allow`), and whom each call acts as: the AUTH_UNIX uid, gid and supplementary
//! groups the client sends, with `root_squash` (the default), `no_root_squash` or
//! `all_squash` mapping them to `anonuid`/`anongid`; AUTH_NONE calls act as the anonymous
//! identity. An [`Identity`] then says what it may do with an inode: its mode bits (through
//! `vfs::may`) and its POSIX ACL, as the kernel checks them for a local caller.
//!
//! Not for: the protocol (`rpc`, `proto`), the file system calls (`fs`), or flags every
//! server shares (`cli::front`).

use std::net::IpAddr;
use std::str::FromStr;

use crate::meta::acl::Acl;
use crate::meta::{Attr, Ctx, Kind};

/// A client network: an address and how many leading bits of it must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl FromStr for Net {
    type Err = String;

    /// `10.0.0.0/8`, `192.168.1.7` (one address), `fd00::/8`, `::1`.
    fn from_str(s: &str) -> Result<Net, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not a network (e.g. 10.0.0.0/8 or 192.168.1.7)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("'{s}': the prefix length must be 0 to {max}")),
            },
        };
        Ok(Net { addr, prefix })
    }
}

impl Net {
    /// Whether `ip` is in this network (an IPv4 address mapped into IPv6 counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        fn head(bits: u128, width: u32, prefix: u8) -> u128 {
            if prefix == 0 {
                0
            } else {
                bits >> (width - prefix as u32)
            }
        }
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                head(u32::from(n) as u128, 32, self.prefix)
                    == head(u32::from(a) as u128, 32, self.prefix)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                head(u128::from(n), 128, self.prefix) == head(u128::from(a), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// How calls from uid 0, or from anybody, are mapped to the anonymous identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Squash {
    /// `root_squash` (the default): uid 0 and gid 0 become anonuid and anongid.
    Root,
    /// `no_root_squash`: the client's root is root on the volume.
    None,
    /// `all_squash`: every call acts as anonuid/anongid.
    All,
}

/// How a volume is exported.
#[derive(Clone, Debug)]
pub struct Export {
    /// Client networks allowed to connect.
    pub allow: Vec<Net>,
    pub squash: Squash,
    /// The anonymous identity (`anonuid`/`anongid`).
    pub anon_uid: u32,
    pub anon_gid: u32,
}

/// The credentials a call carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cred {
    /// AUTH_NONE (or AUTH_NULL): nobody in particular.
    None,
    /// AUTH_UNIX: the caller's uid, gid and supplementary groups.
    Unix { uid: u32, gid: u32, gids: Vec<u32> },
}

impl Export {
    /// The default: loopback clients only, root squashed to 65534:65534.
    pub fn local() -> Export {
        Export {
            allow: vec!["127.0.0.1/32".parse().unwrap(), "::1/128".parse().unwrap()],
            squash: Squash::Root,
            anon_uid: 65534,
            anon_gid: 65534,
        }
    }

    /// Whether a client at `ip` may connect.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(ip))
    }

    fn anonymous(&self) -> Identity {
        Identity {
            uid: self.anon_uid,
            gid: self.anon_gid,
            groups: Vec::new(),
        }
    }

    /// Whom a call with `cred` acts as (exports(5)): AUTH_NONE and `all_squash` as the
    /// anonymous identity; under `root_squash` uid 0 becomes anonuid, and gid 0 (primary or
    /// supplementary) anongid.
    pub fn identity(&self, cred: &Cred) -> Identity {
        match (cred, self.squash) {
            (Cred::None, _) | (_, Squash::All) => self.anonymous(),
            (Cred::Unix { uid, gid, gids }, Squash::None) => Identity {
                uid: *uid,
                gid: *gid,
                groups: gids.clone(),
            },
            (Cred::Unix { uid, gid, gids }, Squash::Root) => {
                let g = |g: u32| if g == 0 { self.anon_gid } else { g };
                Identity {
                    uid: if *uid == 0 { self.anon_uid } else { *uid },
                    gid: g(*gid),
                    groups: gids.iter().map(|&x| g(x)).collect(),
                }
            }
        }
    }
}

/// The identity a call acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Identity {
    /// As a `Ctx` for the vfs (no umask: NFS clients apply their own to the mode they send).
    /// What it creates gets this uid and gid.
    pub fn ctx(&self) -> Ctx {
        Ctx {
            uid: self.uid,
            gid: self.gid,
            pid: 0,
            umask: 0,
        }
    }

    /// Whether it belongs to `gid`, supplementary groups included.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// A `Ctx` for rules about inode `a` that the vfs applies by the caller's group
    /// (`vfs::may`, the setgid bit a write or chmod drops): a `Ctx` carries one group and
    /// no supplementary ones, so where this identity belongs to `a`'s group by a
    /// supplementary group, that group stands as its primary one.
    pub fn ctx_for(&self, a: &Attr) -> Ctx {
        let mut c = self.ctx();
        if self.in_group(a.gid) {
            c.gid = a.gid;
        }
        c
    }

    /// Whether it may access `a` for `want` (r=4, w=2, x=1): the mode bits as `vfs::may`
    /// checks them, or `acl`, the inode's access ACL if it has one, as the kernel's
    /// `posix_acl_permission` does (root and the owner are decided by the mode bits alone).
    pub fn may(&self, a: &Attr, want: u32, acl: Option<&Acl>) -> bool {
        match acl {
            Some(acl) if self.uid != 0 && self.uid != a.uid => {
                acl.permits(a.uid, a.gid, self.uid, &|g| self.in_group(g), want)
            }
            _ => crate::vfs::may(&self.ctx_for(a), a, want),
        }
    }

    /// Whether it owns `a` (or is root): chmod, and times set explicitly.
    pub fn owns(&self, a: &Attr) -> bool {
        self.uid == 0 || self.uid == a.uid
    }

    /// Whether the sticky bit of `dir` lets it remove or replace `victim`.
    pub fn may_delete(&self, dir: &Attr, victim: &Attr) -> bool {
        crate::vfs::sticky_allows(&self.ctx(), dir, victim)
    }

    /// Whether it may create a device node (CAP_MKNOD: root only).
    pub fn may_mknod(&self, kind: Kind) -> bool {
        self.uid == 0 || !matches!(kind, Kind::CharDev | Kind::BlockDev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn networks_match_by_prefix() {
        let n: Net = "10.0.0.0/8".parse().unwrap();
        assert!(n.contains("10.200.3.4".parse().unwrap()));
        assert!(!n.contains("11.0.0.1".parse().unwrap()));
        assert!(!n.contains("127.0.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.1.1".parse().unwrap()));
        let one: Net = "192.168.1.7".parse().unwrap();
        assert!(one.contains("192.168.1.7".parse().unwrap()));
        assert!(!one.contains("192.168.1.8".parse().unwrap()));
        let all: Net = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let v6: Net = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Net>().is_err());
        assert!("ten".parse::<Net>().is_err());
        let e = Export::local();
        assert!(e.allows("127.0.0.1".parse().unwrap()));
        assert!(e.allows("::1".parse().unwrap()));
        assert!(!e.allows("127.0.0.2".parse().unwrap()));
        assert!(!e.allows("192.168.0.1".parse().unwrap()));
    }

    #[test]
    fn credentials_map_as_exports_5_says() {
        let unix = |uid, gid, gids: &[u32]| Cred::Unix {
            uid,
            gid,
            gids: gids.to_vec(),
        };
        let id = |uid, gid, groups: &[u32]| Identity {
            uid,
            gid,
            groups: groups.to_vec(),
        };
        let mut e = Export::local();
        // root_squash by default: uid 0 and group 0 become the anonymous ones.
        assert_eq!(
            e.identity(&unix(0, 0, &[0, 5])),
            id(65534, 65534, &[65534, 5])
        );
        assert_eq!(e.identity(&unix(1000, 100, &[7])), id(1000, 100, &[7]));
        assert_eq!(e.identity(&Cred::None), id(65534, 65534, &[]));
        e.squash = Squash::None;
        assert_eq!(e.identity(&unix(0, 0, &[])), id(0, 0, &[]));
        assert_eq!(e.identity(&Cred::None), id(65534, 65534, &[]));
        e.squash = Squash::All;
        e.anon_uid = 1234;
        e.anon_gid = 99;
        assert_eq!(e.identity(&unix(1000, 100, &[7])), id(1234, 99, &[]));
        // Supplementary groups count for the group bits.
        let a = Attr {
            ino: 5,
            kind: Kind::File,
            mode: 0o640,
            uid: 1,
            gid: 7,
            nlink: 1,
            length: 0,
            rdev: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            parent: 0,
            flags: 0,
            stored: 0,
        };
        let member = id(1000, 100, &[7]);
        assert!(member.may(&a, 4, None) && !member.may(&a, 2, None));
        assert!(!id(1000, 100, &[8]).may(&a, 4, None));
        assert!(member.ctx_for(&a).gid == 7 && member.ctx().gid == 100);
    }
}
