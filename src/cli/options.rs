//! Mount options as `-o` gives them (`/etc/fstab`, `mount -t fuse.unkai ... -o OPTS`,
//! `unkai mount -o OPTS`): the kernel's flags, every option mount(8) documents as file-system
//! independent, and every flag of `unkai mount` as `name=value` (`cache_size=100G`,
//! `subdir=/a`) or `name` for a switch.
//!
//! The flags come from the clap definition of `unkai mount` itself, so the options cannot
//! drift from the flags: `-o` is expanded into the very command line clap then parses. An
//! option that is none of these is a one-line error naming it, never dropped.
//!
//! Not for: what the options do (that is `cli::mount` and below), or the mount helper's
//! remount (`cli::helper`).

use anyhow::bail;

/// Options `unkai mount -o` keeps as they are (`cli::mount` reads them): the kernel's flags
/// (see `fuse::MountFlags`), read-only or not, allow_other, `remount`, and SELinux's labels.
fn is_kernel(o: &str) -> bool {
    matches!(o, "ro" | "rw" | "allow_other" | "remount")
        || is_label(o)
        || crate::fuse::MountFlags::default().apply(o)
}

/// SELinux's labels of a mount (`context=`, `fscontext=`, `defcontext=`, `rootcontext=`),
/// which go to the kernel as they are.
pub fn is_label(o: &str) -> bool {
    ["context=", "fscontext=", "defcontext=", "rootcontext="]
        .iter()
        .any(|p| o.starts_with(p))
}

/// Options for mount(8), fstab or systemd, not for the file system: left out. `silent` and
/// `loud` only quieten the kernel's messages about mounting.
fn is_generic(o: &str) -> bool {
    matches!(
        o,
        "defaults"
            | "_netdev"
            | "nofail"
            | "noauto"
            | "auto"
            | "user"
            | "users"
            | "nouser"
            | "owner"
            | "group"
            | "loud"
            | "silent"
    ) || o.starts_with("x-")
        || o.starts_with("X-")
        || o.starts_with("comment=")
}

/// Splits an option list at its commas, but not inside double quotes (mount(8)'s way of
/// giving a value with commas, e.g. an SELinux `context="...:c127,c456"`).
pub fn split(list: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    for c in list.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                out.last_mut().expect("one at least").push(c);
            }
            ',' if !quoted => out.push(String::new()),
            c => out.last_mut().expect("one at least").push(c),
        }
    }
    out
}

/// Flags of `unkai mount` with no `-o` form: the mountpoint and volume, `-d` (the helper
/// always runs in the background), `-o` itself, and help.
const NOT_OPTIONS: &[&str] = &["targets", "background", "options", "help"];

/// `unkai mount`'s flags as options: (option name, flag, takes a value).
pub fn flags() -> Vec<(String, String, bool)> {
    let cmd = super::mount_command();
    cmd.get_arguments()
        .filter(|a| !NOT_OPTIONS.contains(&a.get_id().as_str()))
        .filter_map(|a| {
            let long = a.get_long()?;
            let takes = a.get_action().takes_values();
            Some((long.replace('-', "_"), format!("--{long}"), takes))
        })
        .collect()
}

/// The `-o` options `opts` as a command line for `unkai mount`: the flags they stand for,
/// then `-o` with those left as options (the kernel's), if any.
pub fn expand(opts: &[String]) -> anyhow::Result<Vec<String>> {
    let flags = flags();
    let mut argv = Vec::new();
    let mut kept = Vec::new();
    for o in opts.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        if is_label(o) && !std::path::Path::new("/sys/fs/selinux/enforce").exists() {
            bail!(
                "mount option '{o}' is an SELinux label, and SELinux is not enabled on this \
                 machine (Linux refuses it on every file system then): leave it out"
            );
        }
        if is_kernel(o) {
            kept.push(o.to_string());
            continue;
        }
        if is_generic(o) {
            continue;
        }
        let (name, value) = match o.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (o, None),
        };
        let Some((_, flag, takes)) = flags.iter().find(|(n, _, _)| *n == name.replace('-', "_"))
        else {
            let names: Vec<&str> = flags.iter().map(|(n, _, _)| n.as_str()).collect();
            bail!(
                "unknown mount option '{o}': give a kernel flag (nosuid, nodev, noexec, \
                 noatime, nodiratime, relatime, strictatime, lazytime, sync, dirsync, \
                 nosymfollow, ro, rw, allow_other), one of mount(8)'s (_netdev, nofail, \
                 noauto, defaults, x-...), or a flag of `unkai mount` as NAME=VALUE: {}",
                names.join(", ")
            );
        };
        match (takes, value) {
            (true, Some(v)) => argv.extend([flag.clone(), v.to_string()]),
            (true, None) => {
                bail!("mount option '{name}' needs a value: {name}=VALUE (as {flag} VALUE)")
            }
            (false, None) => argv.push(flag.clone()),
            (false, Some(_)) => bail!("mount option '{name}' takes no value: give '{name}' alone"),
        }
    }
    if !kept.is_empty() {
        argv.extend(["-o".to_string(), kept.join(",")]);
    }
    Ok(argv)
}

/// The command line `args` (this program's, name first) with the `-o` options of an
/// `unkai mount` expanded ([`expand`]); any other command line as it is.
pub fn expand_mount_args(args: Vec<String>) -> anyhow::Result<Vec<String>> {
    // The subcommand: the first word that is neither an option nor the global flag's value.
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--log-level" => i += 2,
            a if a.starts_with('-') => i += 1,
            _ => break,
        }
    }
    if args.get(i).map(String::as_str) != Some("mount") {
        return Ok(args);
    }
    let mut out: Vec<String> = args[..=i].to_vec();
    let mut rest = args[i + 1..].iter();
    while let Some(a) = rest.next() {
        let given = match a.as_str() {
            "--" => {
                out.push(a.clone());
                out.extend(rest.cloned());
                break;
            }
            "-o" | "--options" => match rest.next() {
                Some(v) => v.clone(),
                None => {
                    out.push(a.clone());
                    continue;
                }
            },
            _ => match a
                .strip_prefix("--options=")
                .or_else(|| a.strip_prefix("-o").filter(|v| !v.is_empty()))
            {
                Some(v) => v.to_string(),
                None => {
                    out.push(a.clone());
                    continue;
                }
            },
        };
        out.extend(expand(&split(&given))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn every_mount_flag_is_an_option() {
        let names: Vec<String> = flags().into_iter().map(|(n, _, _)| n).collect();
        for n in [
            "cache_dir",
            "cache_size",
            "writeback",
            "subdir",
            "log",
            "read_only",
        ] {
            assert!(names.contains(&n.to_string()), "{n} missing: {names:?}");
        }
        assert!(!names.contains(&"background".to_string()));
        assert!(!names.contains(&"targets".to_string()));
    }

    #[test]
    fn options_become_flags_and_kernel_flags_stay() {
        assert_eq!(
            expand(&s(&[
                "rw",
                "_netdev",
                "cache_size=100G",
                "nosuid",
                "writeback=on",
                "subdir=/a",
                "no_keep_cache",
                "x-systemd.automount",
                "nofail"
            ]))
            .unwrap(),
            s(&[
                "--cache-size",
                "100G",
                "--writeback",
                "on",
                "--subdir",
                "/a",
                "--no-keep-cache",
                "-o",
                "rw,nosuid"
            ])
        );
        let e = expand(&s(&["cache_size=1G", "bogus=1"]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("unknown mount option 'bogus=1'"), "{e}");
        assert!(!e.contains('\n'));
        assert!(expand(&s(&["cache_size"])).is_err());
        assert!(expand(&s(&["read_only=yes"])).is_err());
        assert!(expand(&s(&["background"])).is_err());
    }

    #[test]
    fn only_mount_command_lines_are_expanded() {
        let a = s(&[
            "unkai",
            "--log-level",
            "debug",
            "mount",
            "-o",
            "noatime,threads=4",
        ]);
        assert_eq!(
            expand_mount_args(a).unwrap(),
            s(&[
                "unkai",
                "--log-level",
                "debug",
                "mount",
                "--threads",
                "4",
                "-o",
                "noatime"
            ])
        );
        let a = s(&[
            "unkai",
            "mount",
            "-ocache_size=1G",
            "--options=ro",
            "u",
            "/mp",
        ]);
        assert_eq!(
            expand_mount_args(a).unwrap(),
            s(&[
                "unkai",
                "mount",
                "--cache-size",
                "1G",
                "-o",
                "ro",
                "u",
                "/mp"
            ])
        );
        let a = s(&["unkai", "status", "-o", "x"]);
        assert_eq!(expand_mount_args(a.clone()).unwrap(), a);
    }
}
