//! Data and machine safety through a real mount (issue #11): the mount options that protect
//! the machine (nosuid, nodev, noexec, noatime) reach the kernel, from `unkai mount -o` and
//! from the mount(8) helper; fallocate by an ordinary user clears setuid/setgid as a local
//! file system does; a read after an O_DIRECT write sees the new bytes.

use crate::common::*;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;

/// The per-mount flags (the sixth field of /proc/self/mountinfo) of the mount at `path`.
fn mount_flags(path: &Path) -> Vec<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy().replace(' ', "\\040");
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(p.as_str()))
        .unwrap_or_else(|| panic!("{} not in the mount table", path.display()));
    line.split(' ')
        .nth(5)
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect()
}

/// Runs `prog args` as nobody (no supplementary groups); returns (exit success, stdout, stderr).
/// Retried while the program is "busy": another test's forked child may hold, until it
/// execs, a copy of the descriptor that wrote it.
fn run_as_nobody(prog: &Path, args: &[&str]) -> (bool, String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(prog)
            .args(args)
            .output()
            .expect("run setpriv");
        let res = (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        );
        if res.0 || !res.2.contains("busy") || Instant::now() > deadline {
            return res;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A copy of /usr/bin/id on the mount, owned by root, setuid (mode 04755).
fn setuid_id(mp: &Path) -> PathBuf {
    let id = mp.join("id");
    fs::copy("/usr/bin/id", &id).unwrap();
    std::os::unix::fs::chown(&id, Some(0), Some(0)).unwrap();
    fs::set_permissions(&id, fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(fs::metadata(&id).unwrap().mode() & 0o7777, 0o4755);
    id
}

/// The effective uid `id -u` prints when nobody runs the setuid copy on the mount.
fn euid_of_setuid_copy(mp: &Path) -> String {
    let (ok, out, err) = run_as_nobody(&setuid_id(mp), &["-u"]);
    assert!(ok, "id failed: {err}");
    out
}

#[test]
fn default_mount_keeps_suid_dev_exec() {
    // The defaults are unchanged: a setuid-root program runs as root (this is what makes
    // the nosuid test below able to fail).
    let vol = Volume::new();
    let m = vol.mount();
    let flags = mount_flags(&m.path);
    for f in ["nosuid", "nodev", "noexec", "noatime"] {
        assert!(!flags.contains(&f.to_string()), "{f} in {flags:?}");
    }
    assert_eq!(euid_of_setuid_copy(&m.path), "0");
    m.unmount();
}

#[test]
fn mount_o_nosuid_nodev_noexec_noatime_are_honoured() {
    let vol = Volume::new();
    let m = vol.mount_with(&["-o", "nosuid,nodev,noexec,noatime"]);
    let flags = mount_flags(&m.path);
    for f in ["nosuid", "nodev", "noexec", "noatime"] {
        assert!(flags.contains(&f.to_string()), "{f} missing in {flags:?}");
    }
    // noexec: the copy cannot be executed at all, by root either.
    let id = setuid_id(&m.path);
    let err = Command::new(&id).output().unwrap_err();
    assert_eq!(errno(&err), libc::EACCES, "exec on a noexec mount: {err}");
    m.unmount();

    // nosuid alone: the program runs, but not as root.
    let m = vol.mount_with(&["-o", "nosuid"]);
    let flags = mount_flags(&m.path);
    assert!(flags.contains(&"nosuid".to_string()), "{flags:?}");
    assert!(!flags.contains(&"noexec".to_string()), "{flags:?}");
    assert_eq!(euid_of_setuid_copy(&m.path), NOBODY.to_string());
    m.unmount();

    // A later option overrides an earlier one, as in mount(8); strictatime clears relatime.
    let m = vol.mount_with(&["-o", "noexec,exec,strictatime"]);
    let flags = mount_flags(&m.path);
    assert!(!flags.contains(&"noexec".to_string()), "{flags:?}");
    assert!(!flags.iter().any(|f| f.ends_with("atime")), "{flags:?}");
    m.unmount();

    // Unknown options are refused rather than dropped.
    let mp = tempfile::tempdir().unwrap();
    let (ok, _, err) = run_env(
        &[
            "mount",
            "-o",
            "nosiud",
            &vol.meta_url,
            mp.path().to_str().unwrap(),
        ],
        &vol.env,
    );
    assert!(!ok && err.contains("nosiud"), "{err}");
}

/// A mount made by the mount(8) helper form (`unkai SOURCE MOUNTPOINT -o OPTS`, what
/// `mount -t fuse.unkai` and fstab run); unmounted on drop.
struct HelperMount {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for HelperMount {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !run(&["umount", self.path.to_str().unwrap()]).0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn mount_helper_passes_nosuid_noexec() {
    let vol = Volume::new();
    let dir = tempfile::tempdir().unwrap();
    let path = fs::canonicalize(dir.path()).unwrap();
    let m = HelperMount { path, _dir: dir };
    let mut env = vol.env.clone();
    env.push((
        "UNKAI_LOG_FILE".into(),
        vol.dir.path().join("helper.log").to_string_lossy().into(),
    ));
    let (ok, out, err) = run_env(
        &[
            &vol.meta_url,
            m.path.to_str().unwrap(),
            "-o",
            "rw,nosuid,nodev,_netdev,noatime",
        ],
        &env,
    );
    assert!(ok, "helper mount failed: {out}{err}");
    let flags = mount_flags(&m.path);
    for f in ["nosuid", "nodev", "noatime"] {
        assert!(flags.contains(&f.to_string()), "{f} missing in {flags:?}");
    }
    assert!(!flags.contains(&"noexec".to_string()), "{flags:?}");
    assert_eq!(euid_of_setuid_copy(&m.path), NOBODY.to_string());
}

/// A world-writable (sticky) directory under `root`, for files nobody creates.
fn open_dir(root: &Path) -> PathBuf {
    let d = root.join("w");
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

/// Creates `dir/name` with 4 bytes, owned by nobody and group root (nobody is not in it),
/// with `mode`; then nobody runs fallocate(`op`) on it. Returns the mode bits afterwards,
/// or the errno of fallocate.
fn fallocate_as_nobody(dir: &Path, name: &str, mode: u32, op: i32) -> Result<u32, i32> {
    let p = dir.join(name);
    fs::write(&p, b"abcd").unwrap();
    std::os::unix::fs::chown(&p, Some(NOBODY), Some(0)).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, mode);
    let keep = if op == 0 {
        0
    } else {
        libc::FALLOC_FL_KEEP_SIZE
    };
    let res = as_user(NOBODY, NOBODY, || {
        let f = OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| errno(&e))?;
        fallocate(&f, op | keep, 0, 8192).map_err(|e| errno(&e))
    });
    res.map(|()| fs::metadata(&p).unwrap().mode() & 0o7777)
}

#[test]
fn fallocate_by_an_ordinary_user_clears_setuid_and_setgid_like_a_local_fs() {
    unsafe { libc::umask(0o022) };
    let vol = Volume::new();
    let m = vol.mount();
    let dir = open_dir(&m.path);
    let local = tempfile::Builder::new()
        .prefix("unkai-safety-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let local_dir = open_dir(local.path());
    let ops = [
        ("allocate", 0),
        ("punch-hole", libc::FALLOC_FL_PUNCH_HOLE),
        ("zero-range", libc::FALLOC_FL_ZERO_RANGE),
    ];
    for mode in [0o2644, 0o6744, 0o2654, 0o4755, 0o6755] {
        // The reference: a plain allocation on tmpfs (which has no zero-range; the kernel
        // treats every fallocate mode alike here, by file_modified()).
        let want = fallocate_as_nobody(&local_dir, "ref", mode, 0).unwrap();
        assert_eq!(want & libc::S_ISUID, 0, "tmpfs kept setuid of {mode:o}");
        for (what, op) in ops {
            let got = fallocate_as_nobody(&dir, &format!("f{mode:o}-{what}"), mode, op)
                .unwrap_or_else(|e| panic!("{what} on {mode:o}: errno {e}"));
            assert_eq!(
                got, want,
                "{what} by nobody on a file of mode {mode:o}: {got:o}, tmpfs gives {want:o}"
            );
        }
    }
    m.unmount();
}

#[test]
fn cached_read_after_direct_write_sees_the_new_bytes() {
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("direct");
    let old = pattern(64 << 10, 1);
    fs::write(&p, &old).unwrap();
    // Pages cached by an ordinary read.
    let mut seen = Vec::new();
    File::open(&p).unwrap().read_to_end(&mut seen).unwrap();
    assert_eq!(seen, old);

    // An aligned O_DIRECT write of new bytes at 4096..12288.
    let new = pattern(8192, 2);
    let layout = std::alloc::Layout::from_size_align(new.len(), 4096).unwrap();
    let buf = unsafe { std::alloc::alloc(layout) };
    assert!(!buf.is_null());
    unsafe { std::ptr::copy_nonoverlapping(new.as_ptr(), buf, new.len()) };
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .unwrap();
    let n = unsafe { libc::pwrite(f.as_raw_fd(), buf as *const libc::c_void, new.len(), 4096) };
    unsafe { std::alloc::dealloc(buf, layout) };
    assert_eq!(n, new.len() as isize, "{}", std::io::Error::last_os_error());
    drop(f);

    let mut want = old.clone();
    want[4096..12288].copy_from_slice(&new);
    let mut seen = Vec::new();
    File::open(&p).unwrap().read_to_end(&mut seen).unwrap();
    assert!(
        seen == want,
        "a fresh open read stale bytes after the direct write"
    );
    m.unmount();
}

/// `mount -o remount,ro` through the helper keeps the flags the mount had (a remount sets
/// every per-mount flag: ro alone cleared nosuid and noexec).
#[test]
fn a_read_only_remount_through_the_helper_keeps_nosuid_and_noexec() {
    let vol = Volume::new();
    let m = vol.mount_with(&["-o", "nosuid,noexec,noatime"]);
    let mp = m.path.to_str().unwrap().to_string();
    let (ok, out, err) = run_env(&[&vol.meta_url, &mp, "-o", "remount,ro"], &vol.env);
    assert!(ok, "remount failed: {out}{err}");
    let flags = mount_flags(&m.path);
    for f in ["ro", "nosuid", "noexec", "noatime"] {
        assert!(
            flags.contains(&f.to_string()),
            "{f} missing after remount,ro: {flags:?}"
        );
    }
    let (ok, out, err) = run_env(&[&vol.meta_url, &mp, "-o", "remount,rw"], &vol.env);
    assert!(ok, "remount failed: {out}{err}");
    let flags = mount_flags(&m.path);
    assert!(flags.contains(&"rw".to_string()), "{flags:?}");
    assert!(flags.contains(&"nosuid".to_string()), "{flags:?}");
    fs::write(m.p("writable"), b"again").unwrap();
    m.unmount();
}

/// As a mount helper (what mount(8) runs for an fstab line), unkai mounts in the background
/// and prints nothing on stdout.
#[test]
fn the_mount_helper_mounts_quietly() {
    /// Unmounts (lazily) on drop, whatever happened.
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let vol = Volume::new();
    let mp = tempfile::tempdir().unwrap();
    let mps = mp.path().to_str().unwrap();
    let _unmount = Unmount(mp.path());
    // Its log in the volume's directory, not a file of its own in /var/log/unkai.
    let log = format!("log={}", vol.dir.path().join("helper.log").display());
    let opts = format!("nosuid,_netdev,{log}");
    let (ok, out, err) = run_env(&[&vol.meta_url, mps, "-o", &opts], &vol.env);
    assert!(ok, "helper mount failed: {out}{err}");
    assert_eq!(out, "", "the helper printed on stdout");
    let flags = mount_flags(mp.path());
    assert!(flags.contains(&"nosuid".to_string()), "{flags:?}");
    let (ok, _, err) = run_env(&["umount", mps], &vol.env);
    assert!(ok, "{err}");
}
