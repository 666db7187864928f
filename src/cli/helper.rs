//! unkai as a mount helper: `mount -t fuse.unkai SOURCE MOUNTPOINT -o OPTS` (and so
//! `/etc/fstab` lines and `mount -o remount,ro`) runs `unkai SOURCE MOUNTPOINT -o OPTS`
//! through the FUSE helper `mount.fuse3`.
//!
//! A remount is done here with the mount(2) remount call; a new mount takes SOURCE as the
//! META-URL and runs `unkai mount -d` with the options as its flags (`cli::options`:
//! `cache_size=100G` becomes `--cache-size 100G`, `_netdev` and the like are left out, an
//! unknown option is an error). The command line is checked here first, so that a bad value
//! is one line from mount(8) too.

use anyhow::{Context, bail};
use nix::mount::MsFlags;

/// The helper's arguments, if the command line has that shape (`SOURCE MOUNTPOINT -o OPTS`).
pub fn parse(args: &[String]) -> Option<(String, String, Vec<String>)> {
    use clap::CommandFactory;
    if args.len() < 3
        || args[1].starts_with('-')
        || args[1] == "help"
        || super::Cli::command()
            .get_subcommands()
            .any(|c| c.get_name() == args[1])
        || !args.iter().any(|a| a == "-o")
    {
        return None;
    }
    let mut opts = Vec::new();
    let mut it = args[3..].iter();
    while let Some(a) = it.next() {
        if a == "-o" {
            if let Some(o) = it.next() {
                opts.extend(super::options::split(o));
            }
        }
    }
    Some((args[1].clone(), args[2].clone(), opts))
}

pub fn run(source: &str, mountpoint: &str, opts: &[String]) -> anyhow::Result<()> {
    if opts.iter().any(|x| x == "remount") {
        return remount(mountpoint, opts);
    }
    if !source.contains("://") {
        bail!("mount source '{source}' is not a META-URL (e.g. sqlite:///var/lib/unkai/vol.db)");
    }
    // Checked as `unkai mount` will take it, so that a bad option or value is one line.
    let mut argv: Vec<String> = vec!["unkai".into(), "mount".into(), "-d".into()];
    argv.extend(super::options::expand(opts)?);
    argv.extend([source.to_string(), mountpoint.to_string()]);
    if let Err(e) = <super::Cli as clap::Parser>::try_parse_from(&argv) {
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or_default();
        bail!(
            "{} (from -o {})",
            first.strip_prefix("error: ").unwrap_or(first),
            opts.join(",")
        );
    }
    // mount(8) and its callers expect nothing on stdout; errors still reach stderr.
    let st = std::process::Command::new(std::env::current_exe()?)
        .args(&argv[1..])
        .stdout(std::process::Stdio::null())
        .status()?;
    if !st.success() {
        bail!("unkai mount failed ({st})");
    }
    Ok(())
}

/// Remounts the mount at `mountpoint` with the flags `opts` change (mount(2)'s remount).
pub fn remount(mountpoint: &str, opts: &[String]) -> anyhow::Result<()> {
    let flags = MsFlags::MS_REMOUNT | remount_flags(mountpoint, opts);
    // Read-only is refused (EBUSY) while a file is still open for writing; a file just
    // closed may take a moment to be released: retry for a little while.
    let mut tries = 0;
    loop {
        match nix::mount::mount(None::<&str>, mountpoint, None::<&str>, flags, None::<&str>) {
            Err(nix::errno::Errno::EBUSY) if tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            res => {
                res.with_context(|| format!("remounting {mountpoint}"))?;
                return Ok(());
            }
        }
    }
}

/// The flags of a remount of `mountpoint` with `opts`: the mount's present flags (nosuid,
/// nodev, noexec, atime, nodiratime, nosymfollow, ro) and its file system's (sync, dirsync,
/// lazytime), changed by those `opts` name. A remount sets every one of them, so one not
/// carried over would be cleared (`remount,ro` dropped nosuid).
fn remount_flags(mountpoint: &str, opts: &[String]) -> MsFlags {
    let present = crate::fuse::mounts::find(std::path::Path::new(mountpoint))
        .map(|m| {
            let sb = m
                .super_options
                .into_iter()
                .filter(|o| matches!(o.as_str(), "sync" | "dirsync" | "lazytime"));
            m.options.into_iter().chain(sb).collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let mut flags = crate::fuse::MountFlags::default();
    if !present.is_empty() && !present.iter().any(|o| o == "relatime" || o == "noatime") {
        // The mount table names relatime and noatime; neither means strictatime.
        flags.apply("strictatime");
    }
    let mut ro = false;
    for o in present.iter().chain(opts) {
        match o.as_str() {
            "ro" => ro = true,
            "rw" => ro = false,
            o => {
                flags.apply(o);
            }
        }
    }
    flags.ms_flags(ro)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn recognises_helper_invocations_only() {
        let (src, mp, opts) =
            parse(&s(&["unkai", "unkai:vol", "/mnt/x", "-o", "rw,remount,ro"])).unwrap();
        assert_eq!((src.as_str(), mp.as_str()), ("unkai:vol", "/mnt/x"));
        assert_eq!(opts, s(&["rw", "remount", "ro"]));
        assert!(parse(&s(&["unkai", "mount", "-d", "/mnt/x"])).is_none());
        assert!(parse(&s(&["unkai", "status"])).is_none());
        assert!(parse(&s(&["unkai", "--help"])).is_none());
    }
}
