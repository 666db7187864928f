//! The mount table: is a path mounted, by whom, and unmounting it.
//!
//! Not for: mounting (that is fuser's job, via `fuse::mount`).

use std::path::{Path, PathBuf};

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// The file system's device, `MAJOR:MINOR` (a FUSE mount's names its writeback state in
    /// `/sys/class/bdi`).
    pub dev: String,
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
    /// The per-mount options (`rw,nosuid,nodev,relatime`).
    pub options: Vec<String>,
    /// The file system's options (`rw,sync,lazytime,user_id=0,...`).
    pub super_options: Vec<String>,
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut l = left.split(' ');
            let dev = l.nth(2)?.to_string();
            let mp = l.nth(1)?;
            let options = l.next().unwrap_or_default();
            let mut r = right.split(' ');
            let fstype = r.next()?.to_string();
            let source = r.next().unwrap_or_default().to_string();
            let super_options = r.next().unwrap_or_default();
            Some(MountEntry {
                dev,
                mountpoint: PathBuf::from(unescape(mp)),
                fstype,
                source,
                options: options.split(',').map(str::to_string).collect(),
                super_options: super_options.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

pub fn table() -> Vec<MountEntry> {
    parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// The mount at exactly `path` (the last one, if stacked).
pub fn find(path: &Path) -> Option<MountEntry> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    table().into_iter().rev().find(|m| m.mountpoint == path)
}

/// The mount holding `path` (the deepest mountpoint above it; the last one, if stacked).
pub fn containing(path: &Path) -> Option<MountEntry> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    table()
        .into_iter()
        .rev()
        .filter(|m| path.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.components().count())
}

/// Whether `m` is an unkai mount.
pub fn is_unkai(m: &MountEntry) -> bool {
    m.fstype.starts_with("fuse") && m.source.starts_with(super::FSNAME_PREFIX)
}

/// A FUSE mount whose server is gone ("Transport endpoint is not connected").
pub fn is_stale(path: &Path) -> bool {
    matches!(std::fs::metadata(path), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN))
}

/// Unmounts `path`; `lazy` detaches it even while busy.
pub fn unmount(path: &Path, lazy: bool) -> std::io::Result<()> {
    let flags = if lazy {
        nix::mount::MntFlags::MNT_DETACH
    } else {
        nix::mount::MntFlags::empty()
    };
    match nix::mount::umount2(path, flags) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => {
            // Not root: ask fusermount, which is setuid.
            let mut cmd = std::process::Command::new("fusermount3");
            cmd.arg("-u");
            if lazy {
                cmd.arg("-z");
            }
            let out = cmd.arg(path).output()?;
            if out.status.success() {
                Ok(())
            } else {
                Err(std::io::Error::other(
                    String::from_utf8_lossy(&out.stderr).trim().to_string(),
                ))
            }
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo() {
        let t = "36 35 98:0 / /mnt/with\\040space rw,noatime master:1 - fuse unkai:vol rw,user_id=0\n\
                 37 35 8:1 / / rw - ext4 /dev/vda rw\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mountpoint, PathBuf::from("/mnt/with space"));
        assert_eq!((m[0].dev.as_str(), m[1].dev.as_str()), ("98:0", "8:1"));
        assert!(is_unkai(&m[0]));
        assert_eq!(m[0].super_options, ["rw", "user_id=0"]);
        assert!(!is_unkai(&m[1]));
    }
}
