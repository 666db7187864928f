//! unkai as a mount helper: `mount -t fuse.unkai SOURCE MOUNTPOINT -o OPTS` (and so
//! `/etc/fstab` lines and `mount -o remount,ro`) runs `unkai SOURCE MOUNTPOINT -o OPTS`
//! through the FUSE helper `mount.fuse3`.
//!
//! A remount is done here with the mount(2) remount call; a new mount takes SOURCE as the
//! META-URL and runs `unkai mount -d` (`-o encrypt_key_file=FILE` becomes its
//! `--encrypt-key-file FILE`, `-o metrics=ADDR` its `--metrics ADDR`).

use anyhow::{Context, bail};
use nix::mount::MsFlags;

/// The helper's arguments, if the command line has that shape (`SOURCE MOUNTPOINT -o OPTS`).
pub fn parse(args: &[String]) -> Option<(String, String, Vec<String>)> {
    const SUBCOMMANDS: &[&str] = &["format", "mount", "umount", "status", "fsck", "gc", "help"];
    if args.len() < 3
        || args[1].starts_with('-')
        || SUBCOMMANDS.contains(&args[1].as_str())
        || !args.iter().any(|a| a == "-o")
    {
        return None;
    }
    let mut opts = Vec::new();
    let mut it = args[3..].iter();
    while let Some(a) = it.next() {
        if a == "-o" {
            if let Some(o) = it.next() {
                opts.extend(o.split(',').map(str::to_string));
            }
        }
    }
    Some((args[1].clone(), args[2].clone(), opts))
}

pub fn run(source: &str, mountpoint: &str, opts: &[String]) -> anyhow::Result<()> {
    let has = |o: &str| opts.iter().any(|x| x == o);
    if has("remount") {
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
    if !source.contains("://") {
        bail!("mount source '{source}' is not a META-URL (e.g. sqlite:///var/lib/unkai/vol.db)");
    }
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["mount", "-d"]);
    if has("ro") {
        cmd.arg("--read-only");
    }
    if has("allow_other") {
        cmd.arg("--allow-other");
    }
    // An encrypted volume's key file, from an /etc/fstab line (`encrypt_key_file=/etc/x.key`).
    if let Some(f) = opts
        .iter()
        .rev()
        .find_map(|o| o.strip_prefix("encrypt_key_file="))
    {
        cmd.arg("--encrypt-key-file").arg(f);
    }
    // Where to serve the mount's metrics (`metrics=127.0.0.1:9567`).
    if let Some(a) = opts.iter().rev().find_map(|o| o.strip_prefix("metrics=")) {
        cmd.arg("--metrics").arg(a);
    }
    let flags = mount_flags(opts);
    if !flags.is_empty() {
        cmd.arg("-o").arg(flags.join(","));
    }
    // mount(8) and its callers expect nothing on stdout; errors still reach stderr.
    let st = cmd
        .arg(source)
        .arg(mountpoint)
        .stdout(std::process::Stdio::null())
        .status()?;
    if !st.success() {
        bail!("unkai mount failed ({st})");
    }
    Ok(())
}

/// The flags of a remount of `mountpoint` with `opts`: the mount's present flags (nosuid,
/// nodev, noexec, atime, ro), changed by those `opts` name. A remount sets every per-mount
/// flag, so one not carried over would be cleared (`remount,ro` dropped nosuid).
fn remount_flags(mountpoint: &str, opts: &[String]) -> MsFlags {
    let present = crate::fuse::mounts::find(std::path::Path::new(mountpoint))
        .map(|m| m.options)
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

/// The kernel flags among `opts` (nosuid, nodev, noexec, noatime, ...), for `unkai mount -o`:
/// only those that differ from the default, the last one of each kind winning. Options the
/// helper has no use for (`_netdev`, `nofail`, ...) are left out as before.
fn mount_flags(opts: &[String]) -> Vec<&'static str> {
    let mut flags = crate::fuse::MountFlags::default();
    for o in opts {
        flags.apply(o);
    }
    flags.to_options()
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

    #[test]
    fn passes_the_kernel_flags_on() {
        assert_eq!(
            mount_flags(&s(&[
                "rw", "nosuid", "_netdev", "nodev", "noexec", "noatime"
            ])),
            ["nosuid", "nodev", "noexec", "noatime"]
        );
        assert_eq!(
            mount_flags(&s(&["nosuid", "suid", "relatime"])),
            Vec::<&str>::new()
        );
        assert_eq!(
            mount_flags(&s(&["noatime", "strictatime"])),
            ["strictatime"]
        );
    }
}
