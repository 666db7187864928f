//! The export options of `unkai nfs`: which client networks may connect (`--allow`), the one
//! identity every call acts as (`--anonuid`/`--anongid`: nfsserve does not hand the file
//! system a caller's AUTH_UNIX credentials), and what that identity may do by the mode bits
//! (as the kernel checks them for a mount with `default_permissions`).
//!
//! Not for: the protocol (`nfs`), or flags every server shares (`cli::front`). POSIX ACLs
//! are not consulted here (mode bits only).

use std::net::IpAddr;
use std::str::FromStr;

use crate::meta::{Attr, Ctx};

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

/// How a volume is exported.
#[derive(Clone, Debug)]
pub struct Export {
    /// Client networks allowed to connect.
    pub allow: Vec<Net>,
    /// The one identity every call acts as (`--anonuid`/`--anongid`).
    pub anon_uid: u32,
    pub anon_gid: u32,
}

impl Export {
    /// The default: loopback clients only, acting as 65534:65534.
    pub fn local() -> Export {
        Export {
            allow: vec!["127.0.0.1/32".parse().unwrap(), "::1/128".parse().unwrap()],
            anon_uid: 65534,
            anon_gid: 65534,
        }
    }

    /// Whether a client at `ip` may connect.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(ip))
    }

    /// Whom every call acts as. nfsserve parses a call's AUTH_UNIX credentials but does not
    /// hand them to the file system, so there is no per-caller identity to honour: each call
    /// is squashed to this one (as `all_squash` with `anonuid`/`anongid` in exports(5)).
    pub fn identity(&self) -> Identity {
        Identity {
            uid: self.anon_uid,
            gid: self.anon_gid,
        }
    }
}

/// The identity a call acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

impl Identity {
    /// As a `Ctx` for the vfs (no umask: NFS clients apply their own to the mode they send).
    pub fn ctx(&self) -> Ctx {
        Ctx {
            uid: self.uid,
            gid: self.gid,
            pid: 0,
            umask: 0,
        }
    }

    /// Whether it may access `a` for `want` (r=4, w=2, x=1) by the mode bits (`vfs::may`).
    pub fn may(&self, a: &Attr, want: u32) -> bool {
        crate::vfs::may(&self.ctx(), a, want)
    }

    /// Whether it owns `a` (or is root): chmod, and times set explicitly.
    pub fn owns(&self, a: &Attr) -> bool {
        self.uid == 0 || self.uid == a.uid
    }

    /// Whether the sticky bit of `dir` lets it remove or replace `victim`.
    pub fn may_delete(&self, dir: &Attr, victim: &Attr) -> bool {
        crate::vfs::sticky_allows(&self.ctx(), dir, victim)
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
    fn every_call_acts_as_the_anonymous_identity() {
        let mut e = Export::local();
        assert_eq!(
            e.identity(),
            Identity {
                uid: 65534,
                gid: 65534,
            }
        );
        e.anon_uid = 0;
        e.anon_gid = 7;
        let root = e.identity();
        assert_eq!((root.uid, root.gid), (0, 7));
        assert!(root.ctx().in_group(7) && !root.ctx().in_group(0));
    }
}
