//! `unkai restore`: put what the trash holds back where it was, through the mount (so that
//! every client's caches follow, as for any rename).
//!
//! Not for: what goes to the trash or when it expires (`meta::trash`).

use std::ffi::{CString, OsStr};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::meta::trash::{ORIGIN, TRASH_NAME, parse_hour};

/// Put files and directories from the trash back where they were.
///
/// Restores everything deleted in the hours named (all hours if none), directories before
/// what they held; a missing parent directory is made again. An entry whose path is taken
/// meanwhile stays in the trash and is reported. Run as root on a mounted volume.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  ls -a /mnt/unkai/.trash                          # the hours that hold something\n  unkai restore /mnt/unkai 2026-11-26-17\n  unkai restore --dry-run /mnt/unkai                # what would go back, and where"
)]
pub struct Args {
    /// The mountpoint of the volume.
    mountpoint: PathBuf,
    /// Hour directories of the trash to restore from (YYYY-MM-DD-HH, UTC); default: all.
    hours: Vec<String>,
    /// Only show what would be restored, and where.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let trash = a.mountpoint.join(OsStr::from_bytes(TRASH_NAME));
    if fs::symlink_metadata(&trash).is_err() {
        bail!(
            "{} holds no trash: nothing to restore (is it an unkai mount of a volume with \
             --trash-days above 0?)",
            a.mountpoint.display()
        );
    }
    let hours: Vec<String> = if a.hours.is_empty() {
        let mut h: Vec<String> = fs::read_dir(&trash)
            .with_context(|| format!("listing {}", trash.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| parse_hour(n.as_bytes()).is_some())
            .collect();
        h.sort();
        h
    } else {
        for h in &a.hours {
            if parse_hour(h.as_bytes()).is_none() {
                bail!("invalid hour '{h}': give it as YYYY-MM-DD-HH (UTC), e.g. 2026-11-26-17");
            }
        }
        a.hours.clone()
    };
    // Every entry with where it goes back to; shallower paths first, so that a directory
    // is back before what it held.
    let mut todo: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    for h in &hours {
        let dir = trash.join(h);
        let entries = fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?;
        for e in entries {
            let path = e?.path();
            match get_origin(&path) {
                Ok(o) => todo.push((path, o)),
                Err(err) => eprintln!("unkai: skipped {}: {err}", path.display()),
            }
        }
    }
    // Of two entries from one path, the one deleted last goes back.
    let changed = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        fs::symlink_metadata(p).map_or(0, |m| m.ctime() * 1_000_000_000 + m.ctime_nsec())
    };
    todo.sort_by_key(|(p, o)| {
        (
            o.iter().filter(|b| **b == b'/').count(),
            o.clone(),
            std::cmp::Reverse(changed(p)),
        )
    });
    let (mut restored, mut taken, mut made) = (0u64, Vec::new(), 0u64);
    for (src, origin) in &todo {
        let rel = OsStr::from_bytes(origin.strip_prefix(b"/").unwrap_or(origin));
        let dst = a.mountpoint.join(rel);
        if a.dry_run {
            println!("{} -> {}", src.display(), dst.display());
            continue;
        }
        if fs::symlink_metadata(&dst).is_ok() {
            taken.push(dst);
            continue;
        }
        if let Some(parent) = dst.parent() {
            if fs::symlink_metadata(parent).is_err() {
                fs::create_dir_all(parent)
                    .with_context(|| format!("making {} again", parent.display()))?;
                made += 1;
            }
        }
        fs::rename(src, &dst)
            .with_context(|| format!("restoring {} to {}", src.display(), dst.display()))?;
        remove_origin(&dst)?;
        restored += 1;
    }
    if a.dry_run {
        return Ok(());
    }
    for t in &taken {
        eprintln!(
            "unkai: left in the trash: {} exists (move it away and restore again)",
            t.display()
        );
    }
    println!(
        "restored {restored} entries from {} hour(s); {} left in the trash (path taken); {made} \
         missing directories made again",
        hours.len(),
        taken.len()
    );
    Ok(())
}

fn get_origin(p: &Path) -> std::io::Result<Vec<u8>> {
    let c = super::cstr(p.as_os_str())?;
    let name = CString::new(ORIGIN).expect("no NUL");
    let mut buf = vec![0u8; 8192];
    // SAFETY: valid C strings and a buffer of the length given.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn remove_origin(p: &Path) -> anyhow::Result<()> {
    let c = super::cstr(p.as_os_str())?;
    let name = CString::new(ORIGIN).expect("no NUL");
    // SAFETY: valid C strings.
    if unsafe { libc::lremovexattr(c.as_ptr(), name.as_ptr()) } < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENODATA) {
            return Err(e).with_context(|| format!("clearing the trash mark of {}", p.display()));
        }
    }
    Ok(())
}
