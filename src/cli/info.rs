//! `unkai info PATH...` and `unkai summary PATH...`: what a mount says of a file (chunks,
//! slices, objects) or a tree (files, directories, bytes), read through the mount's virtual
//! xattrs (`vfs::inspect`), so any user who can read the path may ask, with no META-URL.
//!
//! Not for: computing any of it (the mount does, from its metadata).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::vfs::inspect;

/// Show an inode of a mounted volume: attributes, and for a file its chunks, slices and the
/// objects holding its data; for a directory what its tree holds.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai info /mnt/unkai/data/big.bin\n  unkai info --json /mnt/unkai/data"
)]
pub struct InfoArgs {
    /// Files or directories in a mounted unkai volume.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Print JSON (one object per path).
    #[arg(long)]
    json: bool,
}

/// Show what directory trees of a mounted volume hold: files, directories and bytes, fast
/// (one aggregate per directory in the metadata, not a stat of every file).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai summary /mnt/unkai/projects\n  unkai summary --json /mnt/unkai/a /mnt/unkai/b"
)]
pub struct SummaryArgs {
    /// Directories in a mounted unkai volume.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Print JSON (one object per path).
    #[arg(long)]
    json: bool,
}

/// The virtual xattr `name` of `path`, parsed.
fn read(path: &Path, name: &[u8]) -> anyhow::Result<serde_json::Value> {
    let p = super::cstr(path.as_os_str())?;
    let n = std::ffi::CString::new(name).expect("no NUL in the names");
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // SAFETY: both strings are NUL-terminated; the buffer is valid for its length.
        let r =
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if r >= 0 {
            buf.truncate(r as usize);
            return serde_json::from_slice(&buf)
                .with_context(|| format!("{}: unreadable answer", path.display()));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) => buf.resize(buf.len() * 4, 0),
            Some(libc::ENODATA) | Some(libc::EOPNOTSUPP) => bail!(
                "{} is not in a mounted unkai volume (or its mount predates `unkai info`)",
                path.display()
            ),
            Some(libc::ENOTDIR) => bail!("{} is not a directory", path.display()),
            _ => return Err(e).with_context(|| format!("{}", path.display())),
        }
    }
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn bytes(n: u64) -> String {
    format!("{} ({n} bytes)", super::human_bytes(n))
}

pub fn info(a: InfoArgs) -> anyhow::Result<()> {
    for path in &a.paths {
        let v = read(path, inspect::INFO)?;
        if a.json {
            println!("{}", serde_json::to_string(&v)?);
            continue;
        }
        println!("{}:", path.display());
        println!("  inode:   {}", n(&v, "inode"));
        println!(
            "  kind:    {}, mode {}, links {}, owner {}:{}",
            v["kind"].as_str().unwrap_or("?"),
            v["mode"].as_str().unwrap_or("?"),
            n(&v, "nlink"),
            n(&v, "uid"),
            n(&v, "gid")
        );
        if let Some(t) = v["target"].as_str() {
            println!("  target:  {t}");
        }
        if let Some(s) = v.get("summary") {
            print_summary(s, "  ");
            continue;
        }
        if v["kind"] != "file" {
            continue;
        }
        println!("  length:  {}", bytes(n(&v, "length")));
        println!("  stored:  {}", bytes(n(&v, "stored")));
        let chunks = v["chunks"].as_array().cloned().unwrap_or_default();
        println!(
            "  chunks:  {}, slices: {}, objects: {}",
            chunks.len(),
            n(&v, "slices"),
            n(&v, "objects")
        );
        for c in &chunks {
            println!("  chunk {}:", n(c, "index"));
            for s in c["slices"].as_array().into_iter().flatten() {
                let keys: Vec<&str> = s["objects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|k| k.as_str())
                    .collect();
                if let Some(e) = s.get("external").filter(|e| e.is_object()) {
                    println!(
                        "    imported at {}: {} bytes from byte {} of {} (ETag {}, not \
                         copied: never deleted by unkai)",
                        n(s, "pos"),
                        n(s, "len"),
                        n(e, "from"),
                        e["object"].as_str().unwrap_or(""),
                        e["etag"].as_str().unwrap_or("")
                    );
                } else if n(s, "id") == 0 {
                    println!("    zeros at {}: {} bytes", n(s, "pos"), n(s, "len"));
                } else {
                    println!(
                        "    slice {} at {}: {} bytes (from {} of {}) in {}",
                        n(s, "id"),
                        n(s, "pos"),
                        n(s, "len"),
                        n(s, "off"),
                        n(s, "size"),
                        keys.join(", ")
                    );
                }
            }
        }
    }
    Ok(())
}

fn print_summary(s: &serde_json::Value, indent: &str) {
    println!(
        "{indent}files:   {}, directories: {}, symlinks: {}, others: {}",
        n(s, "files"),
        n(s, "dirs"),
        n(s, "symlinks"),
        n(s, "others")
    );
    println!("{indent}length:  {}", bytes(n(s, "length")));
    println!(
        "{indent}size:    {} (each file rounded up to 4 KiB, as quotas count)",
        bytes(n(s, "size"))
    );
    println!(
        "{indent}stored:  {} (holes not counted, as du)",
        bytes(n(s, "stored"))
    );
}

pub fn summary(a: SummaryArgs) -> anyhow::Result<()> {
    for path in &a.paths {
        let mut v = read(path, inspect::SUMMARY)?;
        if a.json {
            v["path"] = serde_json::json!(path.display().to_string());
            println!("{}", serde_json::to_string(&v)?);
            continue;
        }
        println!("{}:", path.display());
        print_summary(&v, "  ");
    }
    Ok(())
}
