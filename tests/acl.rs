//! POSIX ACLs through a real mount, with tmpfs as the oracle: the same commands (setfacl,
//! chmod, creates under a umask, in directories with default ACLs, setgid ones included) run
//! on both, then the modes, owners, ACLs (getfacl) and what other users may do must agree.
//! Run as root (the unprivileged users are 65534, 65533 and 1000).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// A tmpfs mounted in a temporary directory (unmounted on drop): Linux's own ACL rules.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new() -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("unkai-acl-oracle-")
            .tempdir()
            .expect("tempdir");
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=755,size=16m"),
        )
        .expect("mount tmpfs (run as root)");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Runs a shell script in `dir`; panics with its output if it fails.
fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "in {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a path shows: type, mode, owner, group, and its ACLs as getfacl prints them.
fn shows(dir: &Path, rel: &str) -> String {
    let st = Command::new("stat")
        .args(["-c", "%F %a %u %g", rel])
        .current_dir(dir)
        .output()
        .expect("stat");
    let acl = Command::new("getfacl")
        .args(["-n", "-p", rel])
        .current_dir(dir)
        .output()
        .expect("getfacl (package acl)");
    assert!(acl.status.success(), "getfacl {rel}: {acl:?}");
    format!(
        "{}{}",
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&acl.stdout)
    )
}

/// Whether each user may read, write and search/execute each path (access(2)), and open
/// each regular file for reading and for writing.
fn may(dir: &Path, paths: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for rel in paths {
        let p: PathBuf = dir.join(rel);
        let file = p.is_file();
        for (uid, gid) in [(65534, 65534), (65533, 65533), (1000, 1000)] {
            let mut line = format!("{rel} as {uid}:");
            for (what, mode) in [("r", libc::R_OK), ("w", libc::W_OK), ("x", libc::X_OK)] {
                let c = cpath(&p);
                let r = as_user(uid, gid, || {
                    // SAFETY: a valid C string.
                    match unsafe { libc::access(c.as_ptr(), mode) } {
                        0 => Ok(()),
                        _ => Err(errno(&std::io::Error::last_os_error())),
                    }
                });
                line.push_str(&format!(" {what}={}", r.is_ok()));
            }
            if file {
                let q = p.clone();
                let r = as_user(uid, gid, || {
                    std::fs::File::open(&q).map(|_| ()).map_err(|e| errno(&e))
                });
                line.push_str(&format!(" open-r={:?}", r));
                let q = p.clone();
                let r = as_user(uid, gid, || {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&q)
                        .map(|_| ())
                        .map_err(|e| errno(&e))
                });
                line.push_str(&format!(" open-w={:?}", r));
            }
            out.push(line);
        }
    }
    out
}

/// Every path the scripts below make, compared one by one.
const PATHS: &[&str] = &[
    "f",
    "d",
    "d/f",
    "d/w",
    "d/p",
    "d/sub",
    "d/sub/deeper",
    "d/sub/deeper/g",
    "min",
    "base",
    "plain",
    "plaindir",
    "s",
    "s/x",
    "s/y",
    "s/x/z",
];

/// setfacl and chmod, creates under a umask with and without a default ACL, and a setgid
/// directory with a default ACL.
const SCRIPT: &str = r#"
umask 022
printf secret > f
setfacl -m u:65534:---,u:1000:r f
mkdir d
setfacl -m u:65534:rx,g:65533:rwx d
setfacl -d -m u:65534:rwx,g:65533:rx,m::rwx d
umask 077
touch d/f
echo hi > d/w
mkfifo d/p
mkdir d/sub
mkdir d/sub/deeper
touch d/sub/deeper/g
chmod 640 d/f
chmod 604 d/w
umask 022
touch min
setfacl -m u:65534:r min
setfacl -x u:65534 min
touch base
setfacl --set u::rw,g::r,o::- base
umask 027
touch plain
mkdir plaindir
umask 022
mkdir s
chgrp 65533 s
chmod 2775 s
setfacl -d -m g:65534:rw,o::- s
umask 077
mkdir s/x
touch s/y
touch s/x/z
"#;

fn compare(oracle: &Path, mount: &Path, when: &str) {
    for rel in PATHS {
        assert_eq!(
            shows(mount, rel),
            shows(oracle, rel),
            "{when}: {rel} differs from tmpfs"
        );
    }
    assert_eq!(
        may(mount, PATHS),
        may(oracle, PATHS),
        "{when}: access differs"
    );
}

both_engines!(
    acls_are_kept_inherited_and_enforced_as_on_tmpfs(Vec::new()),
    an_acl_set_on_one_mount_is_enforced_on_another(Vec::new()),
);

fn acls_are_kept_inherited_and_enforced_as_on_tmpfs(vol: &Volume) {
    let oracle = Tmpfs::new();
    let m = vol.mount();
    sh(oracle.path(), SCRIPT);
    sh(&m.path, SCRIPT);
    // The issue's case first: a user denied by an ACL entry cannot read, one granted can.
    let f = m.p("f");
    assert_eq!(
        as_user(65534, 65534, || std::fs::read(&f)
            .map(|_| ())
            .map_err(|e| errno(&e))),
        Err(libc::EACCES)
    );
    assert_eq!(
        as_user(1000, 1000, || std::fs::read(&f)
            .map(|_| ())
            .map_err(|e| errno(&e))),
        Ok(())
    );
    compare(oracle.path(), &m.path, "after the script");
    // An ACL of the owner, owning group and other alone is not kept: the mode bits say it all.
    let names = Command::new("getfattr")
        .args(["-m", "-", "-d", "base"])
        .current_dir(&m.path)
        .output()
        .expect("getfattr (package attr)");
    assert!(
        !String::from_utf8_lossy(&names.stdout).contains("posix_acl"),
        "{names:?}"
    );
    // Kept in the volume: the same after a remount.
    m.unmount();
    let m = vol.mount();
    compare(oracle.path(), &m.path, "after a remount");
    // Removed, and the ACLs no longer decide.
    let undo = "setfacl -b f d s\nchmod 600 f";
    sh(oracle.path(), undo);
    sh(&m.path, undo);
    compare(oracle.path(), &m.path, "after setfacl -b");
    let f = m.p("f");
    assert_eq!(
        as_user(1000, 1000, || std::fs::read(&f)
            .map(|_| ())
            .map_err(|e| errno(&e))),
        Err(libc::EACCES)
    );
}

#[test]
fn only_the_owner_sets_an_acl_and_a_default_acl_is_for_directories() {
    let vol = Volume::new();
    let m = vol.mount();
    sh(&m.path, "touch f\nchown 1000:1000 f\nmkdir d");
    let set = |uid: u32, what: &str, path: &str| {
        let p = m.p(path);
        let what = what.to_string();
        as_user(uid, uid, move || {
            let st = Command::new("setfacl")
                .args(["-m", &what])
                .arg(&p)
                .stderr(std::process::Stdio::null())
                .status()
                .map_err(|e| errno(&e))?;
            if st.success() { Ok(()) } else { Err(1) }
        })
    };
    assert_eq!(
        set(65534, "u:65534:rw", "f"),
        Err(1),
        "a stranger set an ACL"
    );
    assert_eq!(set(1000, "u:65534:rw", "f"), Ok(()), "the owner could not");
    let out = Command::new("setfacl")
        .args(["-d", "-m", "u:65534:rw"])
        .arg(m.p("f"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "a default ACL was set on a file");
    assert!(
        Command::new("setfacl")
            .args(["-d", "-m", "u:65534:rw"])
            .arg(m.p("d"))
            .status()
            .unwrap()
            .success()
    );
}

/// Whether uid 65534 may read `p`.
fn nobody_reads(p: &Path) -> bool {
    let q = p.to_path_buf();
    as_user(65534, 65534, || {
        std::fs::read(&q).map(|_| ()).map_err(|e| errno(&e))
    })
    .is_ok()
}

fn an_acl_set_on_one_mount_is_enforced_on_another(vol: &Volume) {
    let a = vol.mount();
    let b = vol.mount();
    std::fs::write(a.p("f"), b"shared").unwrap();
    // B has checked (and its kernel cached) the file without an ACL.
    assert!(eventually(std::time::Duration::from_secs(60), || {
        nobody_reads(&b.p("f"))
    }));
    sh(&a.path, "setfacl -m u:65534:--- f");
    assert!(!nobody_reads(&a.p("f")));
    assert!(
        eventually(std::time::Duration::from_secs(60), || !nobody_reads(
            &b.p("f")
        )),
        "the other mount still lets a denied user read"
    );
    // And the way back.
    sh(&b.path, "setfacl -x u:65534 f");
    assert!(eventually(std::time::Duration::from_secs(60), || {
        nobody_reads(&a.p("f"))
    }));
}
