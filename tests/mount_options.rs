//! mount(8)'s file-system independent options on real mounts: every one is taken (from
//! fstab through mount(8) too), and those a FUSE file system can honour are: `sync` and
//! `dirsync` (durable before the call returns: a kill -9 right after loses nothing),
//! `nosymfollow` (the kernel follows no symlink), `nodiratime` and `diratime` (listing a
//! directory moves its access time, or not), `lazytime` (the kernel's flag).

use crate::common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The mountinfo line of the mount at `path`: (per-mount options, file system options).
fn options_of(path: &Path) -> (Vec<String>, Vec<String>) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy().replace(' ', "\\040");
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .unwrap_or_else(|| panic!("{} is not mounted", path.display()));
    let split = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
    let (left, right) = line.split_once(" - ").unwrap();
    (
        split(left.split(' ').nth(5).unwrap()),
        split(right.split(' ').nth(2).unwrap_or_default()),
    )
}

fn is_mounted(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

/// A mount in the background at `path` (however made), unmounted on drop.
struct Unmounts {
    path: PathBuf,
}

impl Drop for Unmounts {
    fn drop(&mut self) {
        if is_mounted(&self.path) {
            let ok = eventually(Duration::from_secs(30), || {
                run(&["umount", self.path.to_str().unwrap()]).0 || !is_mounted(&self.path)
            });
            if !ok {
                let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// A fresh mountpoint (canonical) in its own temporary directory.
fn mountpoint() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mp = fs::canonicalize(dir.path()).unwrap().join("mp");
    fs::create_dir(&mp).unwrap();
    (dir, mp)
}

/// Every option mount(8) lists under FILESYSTEM-INDEPENDENT MOUNT OPTIONS (but `remount`
/// and SELinux's `context=` family, below), given at once to the helper as mount(8) and
/// fstab run it: the mount comes up, each flag is in the mount table as the last of its kind
/// said, and each option unkai cannot honour (as Linux cannot: `iversion`, `mand`) is one
/// warning line. Was: "unknown mount option 'diratime'" (and nodiratime, lazytime, sync...).
#[test]
fn every_filesystem_independent_option_is_taken() {
    let vol = Volume::new();
    let (_dir, mp) = mountpoint();
    let opts = "rw,async,atime,noatime,auto,noauto,defaults,dev,nodev,diratime,nodiratime,\
                dirsync,exec,noexec,group,iversion,noiversion,mand,nomand,_netdev,nofail,\
                relatime,norelatime,strictatime,nostrictatime,nolazytime,lazytime,suid,\
                nosuid,silent,loud,owner,sync,user,nouser,users,X-mount.mkdir,\
                x-systemd.automount,nosymfollow";
    let (ok, out, err) = run_env(&[&vol.meta_url, mp.to_str().unwrap(), "-o", opts], &vol.env);
    let _guard = Unmounts { path: mp.clone() };
    assert!(ok, "helper mount failed: {out}{err}");
    assert!(out.is_empty(), "mount(8) expects nothing on stdout: {out}");
    let (per_mount, fs_opts) = options_of(&mp);
    for f in [
        "nodev",
        "noexec",
        "nosuid",
        "relatime",
        "nodiratime",
        "nosymfollow",
    ] {
        assert!(
            per_mount.contains(&f.to_string()),
            "{f} missing: {per_mount:?}"
        );
    }
    for f in ["sync", "dirsync", "lazytime"] {
        assert!(fs_opts.contains(&f.to_string()), "{f} missing: {fs_opts:?}");
    }
    // One line each for what is taken and ignored, naming it; nothing else.
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 2, "{err}");
    assert!(warnings[0].contains("'iversion' is ignored"), "{err}");
    assert!(warnings[1].contains("'mand' is ignored"), "{err}");

    // `remount` through `unkai mount -o` too: the flags given change, the others stay.
    let (ok, _, err) = run_env(
        &["mount", "-o", "remount,ro,exec", mp.to_str().unwrap()],
        &vol.env,
    );
    assert!(ok, "remount: {err}");
    let (per_mount, fs_opts) = options_of(&mp);
    assert!(per_mount.contains(&"ro".to_string()), "{per_mount:?}");
    assert!(!per_mount.contains(&"noexec".to_string()), "{per_mount:?}");
    for f in ["nosuid", "nodiratime", "nosymfollow"] {
        assert!(
            per_mount.contains(&f.to_string()),
            "{f} lost: {per_mount:?}"
        );
    }
    assert!(fs_opts.contains(&"sync".to_string()), "{fs_opts:?}");

    // SELinux's labels go to the kernel, which refuses them without SELinux: one line.
    if !Path::new("/sys/fs/selinux/enforce").exists() {
        let (_d2, mp2) = mountpoint();
        let (ok, _, err) = run_env(
            &[
                &vol.meta_url,
                mp2.to_str().unwrap(),
                "-o",
                "rw,context=\"system_u:object_r:tmp_t:s0:c127,c456\"",
            ],
            &vol.env,
        );
        assert!(!ok && err.contains("SELinux"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!is_mounted(&mp2));
    }
}

/// An fstab line with the options fstab files carry, mounted by mount(8) itself (`mount -T
/// FSTAB MOUNTPOINT`, so the machine's /etc/fstab is never touched): mount(8) runs
/// mount.fuse3, which runs `unkai` from root's PATH. mount(8) clears PATH, so the test runs
/// in a mount namespace of its own where /usr/local/bin holds the binary under test; the
/// mounts live and end there. A second line asks for sync, dirsync, lazytime and
/// nosymfollow. Was: "unknown mount option 'nodiratime'".
#[test]
fn an_fstab_line_mounts_through_mount8() {
    let vol = Volume::new();
    let m = vol.mount();
    fs::write(m.p("target"), b"pointed at\n").unwrap();
    std::os::unix::fs::symlink("target", m.p("link")).unwrap();
    m.unmount();

    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    let bin = root.join("bin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_unkai"), bin.join("unkai")).unwrap();
    let (a, b) = (root.join("a"), root.join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    let fstab = root.join("fstab");
    fs::write(
        &fstab,
        format!(
            "# test fstab\n\
             {url}  {a}  fuse.unkai  noatime,nodiratime,_netdev,nofail  0 0\n\
             {url}  {b}  fuse.unkai  sync,dirsync,lazytime,nosymfollow,_netdev,nofail,x-systemd.automount  0 0\n",
            url = vol.meta_url,
            a = a.display(),
            b = b.display()
        ),
    )
    .unwrap();
    // Each step prints a line the test reads; every mount is unmounted on the way out.
    let script = format!(
        r#"set -u
mount --bind {bin} /usr/local/bin || exit 90
trap 'umount {a} 2>/dev/null; umount {b} 2>/dev/null' EXIT
mount -T {fstab} {a} 2>&1 || exit 91
echo "A $(grep " {a} " /proc/self/mountinfo)"
echo "A-read $(cat {a}/link)"
umount {a} || exit 92
mount -T {fstab} {b} 2>&1 || exit 93
echo "B $(grep " {b} " /proc/self/mountinfo)"
echo "B-follow $(cat {b}/link 2>&1)"
echo "B-readlink $(readlink {b}/link)"
umount {b} || exit 94
echo done
"#,
        bin = bin.display(),
        a = a.display(),
        b = b.display(),
        fstab = fstab.display()
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "slave", "sh", "-c", &script])
        .envs(vol.env.iter().cloned())
        .output()
        .expect("unshare");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {text}", out.status);
    let line = |tag: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{tag} ")))
            .unwrap_or_else(|| panic!("no {tag} line: {text}"))
            .to_string()
    };
    let a_line = line("A");
    assert!(a_line.contains("fuse.unkai"), "{text}");
    assert!(
        a_line.contains("noatime,nodiratime"),
        "not the flags asked: {a_line}"
    );
    assert_eq!(line("A-read"), "pointed at", "{text}");
    let b_line = line("B");
    assert!(b_line.contains("nosymfollow"), "{b_line}");
    assert!(
        b_line.contains("sync") && b_line.contains("dirsync") && b_line.contains("lazytime"),
        "{b_line}"
    );
    assert!(
        line("B-follow").contains("Too many levels of symbolic links"),
        "nosymfollow followed: {text}"
    );
    assert_eq!(line("B-readlink"), "target", "{text}");
    assert!(text.lines().any(|l| l == "done"), "{text}");
}

/// Under `sync` a write is durable when it returns, and so is a directory change: the
/// server killed with -9 while the file is still open, nothing written is lost. (Without
/// it, the write sits in the mount's buffers until close or fsync, and the last grouped
/// namespace changes are up to 10 ms from their commit.) Was refused: "unknown mount option".
#[test]
fn sync_makes_each_write_and_directory_change_durable_before_it_returns() {
    let vol = Volume::new();
    let m = vol.mount_with(&["-o", "sync"]);
    let mut f = fs::File::create(m.p("open")).unwrap();
    f.write_all(b"written, not closed, not synced\n").unwrap();
    for i in 0..50 {
        fs::create_dir(m.p(&format!("d{i}"))).unwrap();
    }
    m.kill9();
    drop(f);
    let m = vol.mount();
    assert_eq!(
        fs::read(m.p("open")).unwrap(),
        b"written, not closed, not synced\n"
    );
    for i in 0..50 {
        assert!(m.p(&format!("d{i}")).is_dir(), "d{i} lost");
    }
}

/// Under `dirsync` each change of a directory is durable when it returns: created, renamed
/// and removed names all survive a kill -9 that follows at once.
#[test]
fn dirsync_makes_each_directory_change_durable_before_it_returns() {
    let vol = Volume::new();
    let m = vol.mount();
    for i in 0..20 {
        fs::write(m.p(&format!("old{i}")), b"x").unwrap();
    }
    m.unmount();
    let m = vol.mount_with(&["-o", "dirsync"]);
    for i in 0..40 {
        fs::create_dir(m.p(&format!("d{i}"))).unwrap();
    }
    for i in 0..20 {
        if i % 2 == 0 {
            fs::remove_file(m.p(&format!("old{i}"))).unwrap();
        } else {
            fs::rename(m.p(&format!("old{i}")), m.p(&format!("new{i}"))).unwrap();
        }
    }
    std::os::unix::fs::symlink("d0", m.p("last")).unwrap();
    m.kill9();
    let m = vol.mount();
    for i in 0..40 {
        assert!(m.p(&format!("d{i}")).is_dir(), "d{i} lost");
    }
    for i in 0..20 {
        assert!(!m.p(&format!("old{i}")).exists(), "old{i} came back");
        assert_eq!(m.p(&format!("new{i}")).exists(), i % 2 == 1, "new{i}");
    }
    assert_eq!(fs::read_link(m.p("last")).unwrap(), Path::new("d0"));
}

/// `nosymfollow`: the kernel follows no symlink on the mount (ELOOP), in the last part of a
/// path or inside it; symlinks are still made and read.
#[test]
fn nosymfollow_follows_no_symlink() {
    let vol = Volume::new();
    let m = vol.mount_with(&["-o", "nosymfollow"]);
    fs::create_dir(m.p("dir")).unwrap();
    fs::write(m.p("dir/file"), b"x").unwrap();
    std::os::unix::fs::symlink("dir", m.p("dlink")).unwrap();
    std::os::unix::fs::symlink("dir/file", m.p("flink")).unwrap();
    assert_eq!(fs::read_link(m.p("flink")).unwrap(), Path::new("dir/file"));
    for p in ["flink", "dlink/file"] {
        let e = fs::read(m.p(p)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{p}: {e}");
    }
    // O_NOFOLLOW|O_PATH still opens the link itself; the real names still work.
    assert_eq!(fs::read(m.p("dir/file")).unwrap(), b"x");
    assert!(
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(m.p("flink"))
            .is_ok()
    );
}

/// Listing a directory is an access of it, as on Linux: under relatime (the default) it
/// moves an access time older than the last change or a day old; `nodiratime` and
/// `noatime` never. (Was: listing never moved it, and nodiratime was refused.)
#[test]
fn listing_moves_a_directorys_access_time_unless_nodiratime() {
    let vol = Volume::new();
    let long_ago = 1_000_000_000; // 2001
    let set_old = |d: &Path| {
        let t = libc::timespec {
            tv_sec: long_ago,
            tv_nsec: 0,
        };
        let omit = libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        };
        // SAFETY: utimensat of a valid path with two timespecs.
        let r =
            unsafe { libc::utimensat(libc::AT_FDCWD, cpath(d).as_ptr(), [t, omit].as_ptr(), 0) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        assert_eq!(fs::metadata(d).unwrap().atime(), long_ago);
    };
    for (opts, moves) in [
        ("relatime", true),
        ("nodiratime", false),
        ("noatime", false),
    ] {
        let m = vol.mount_with(&["-o", opts]);
        let d = m.p(opts);
        fs::create_dir(&d).unwrap();
        fs::write(d.join("f"), b"x").unwrap();
        set_old(&d);
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
        let after = fs::metadata(&d).unwrap().atime();
        assert_eq!(after != long_ago, moves, "-o {opts}: atime {after}");
        m.unmount();
        // Stored: another mount sees the same.
        let m = vol.mount();
        assert_eq!(fs::metadata(m.p(opts)).unwrap().atime() != long_ago, moves);
        m.unmount();
    }
}
