//! One table of permission cases run over every front end with its real client: the FUSE
//! mount (the kernel's own rules, as the user itself), NFS (libnfs, the library of Debian's
//! nfs-cp, with `uid=`/`gid=`), WebDAV (curl) and S3 (boto3), each acting as uid 1000 on the
//! same layout that root made and gave to uid 1001. Every front end must give each case the
//! answer Linux gives a local caller: the errno where the protocol carries one (FUSE, NFS;
//! S3 names it in its AccessDenied message), 403 for a refusal over WebDAV (whose protocol
//! has one status for EACCES and EPERM). The rules the servers apply are written once
//! (`vfs::export::rules`); the kernel applies its own in front of the mount.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::common::fronts::{Front, boto3, dav, have, s3};
use crate::common::*;

/// Who the cases run as, and whose the things they try are.
const ME: u32 = 1000;
const THEM: u32 = 1001;

/// What a case tries.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// Removes a file.
    Remove(&'static str),
    /// Renames (moves) an entry.
    Rename(&'static str, &'static str),
    /// Writes to an existing file.
    Write(&'static str),
    /// Creates a new file.
    Create(&'static str),
    /// Reads a file.
    Read(&'static str),
    /// chmod 0600.
    Chmod(&'static str),
}

struct Case {
    what: &'static str,
    op: Op,
    /// Linux's answer: 0 or an errno.
    want: i32,
}

const CASES: &[Case] = &[
    Case {
        what: "a non-owner deletes in a sticky directory",
        op: Op::Remove("sticky/theirs"),
        want: libc::EPERM,
    },
    Case {
        what: "the owner deletes in a sticky directory",
        op: Op::Remove("sticky/mine"),
        want: 0,
    },
    Case {
        what: "a directory moves to another parent without write permission on it",
        op: Op::Rename("from/dir", "to/dir"),
        want: libc::EACCES,
    },
    Case {
        what: "that directory is renamed within its parent",
        op: Op::Rename("from/dir", "from/renamed"),
        want: 0,
    },
    Case {
        what: "a write to a read-only file",
        op: Op::Write("ro"),
        want: libc::EACCES,
    },
    Case {
        what: "a file created in a directory without write permission",
        op: Op::Create("closed/new"),
        want: libc::EACCES,
    },
    Case {
        what: "a read of somebody else's 0600 file",
        op: Op::Read("secret"),
        want: libc::EACCES,
    },
    Case {
        what: "a chmod of somebody else's file",
        op: Op::Chmod("ro"),
        want: libc::EPERM,
    },
    Case {
        what: "a file created in an open directory",
        op: Op::Create("from/new"),
        want: 0,
    },
];

/// An answer as the table prints it.
fn name(errno: i32) -> String {
    match errno {
        0 => "OK".into(),
        libc::EPERM => "EPERM".into(),
        libc::EACCES => "EACCES".into(),
        e => format!("errno {e}"),
    }
}

/// Lays out the cases' files under `top` (as root, on the mount), owned as they say.
fn lay_out(top: &Path) {
    let mkdir = |p: &str, mode: u32, uid: u32| {
        let path = top.join(p);
        std::fs::create_dir(&path).unwrap();
        std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let file = |p: &str, mode: u32, uid: u32| {
        let path = top.join(p);
        std::fs::write(&path, b"unchanged").unwrap();
        std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    std::fs::create_dir(top).unwrap();
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o777)).unwrap();
    mkdir("sticky", 0o1777, 0);
    file("sticky/theirs", 0o666, THEM);
    file("sticky/mine", 0o644, ME);
    mkdir("from", 0o777, 0);
    mkdir("to", 0o777, 0);
    mkdir("from/dir", 0o755, THEM);
    mkdir("closed", 0o755, 0);
    file("ro", 0o444, THEM);
    file("secret", 0o600, THEM);
}

/// Over the FUSE mount, as uid 1000 itself.
fn over_fuse(top: &Path) -> Vec<String> {
    CASES
        .iter()
        .map(|c| {
            let r = as_user(ME, ME, || {
                let e = |r: std::io::Result<()>| r.map_err(|e| errno(&e));
                match c.op {
                    Op::Remove(p) => e(std::fs::remove_file(top.join(p))),
                    Op::Rename(a, b) => e(std::fs::rename(top.join(a), top.join(b))),
                    Op::Write(p) => e(std::fs::OpenOptions::new()
                        .write(true)
                        .open(top.join(p))
                        .and_then(|mut f| std::io::Write::write_all(&mut f, b"x"))),
                    Op::Create(p) => e(std::fs::write(top.join(p), b"new")),
                    Op::Read(p) => e(std::fs::read(top.join(p)).map(|_| ())),
                    Op::Chmod(p) => e(std::fs::set_permissions(
                        top.join(p),
                        std::fs::Permissions::from_mode(0o600),
                    )),
                }
            });
            name(r.err().unwrap_or(0))
        })
        .collect()
}

/// Over NFS with libnfs (through Python's ctypes: the library nfs-cp is made of, whose
/// calls return the errno of the server's NFS status), as uid 1000.
fn over_nfs(addr: &str, top: &str) -> Vec<String> {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let url = format!("nfs://{host}/?nfsport={port}&mountport={port}&uid={ME}&gid={ME}");
    let ops: Vec<String> = CASES
        .iter()
        .map(|c| match c.op {
            Op::Remove(p) => format!("('remove', '/{top}/{p}', '')"),
            Op::Rename(a, b) => format!("('rename', '/{top}/{a}', '/{top}/{b}')"),
            Op::Write(p) => format!("('write', '/{top}/{p}', '')"),
            Op::Create(p) => format!("('create', '/{top}/{p}', '')"),
            Op::Read(p) => format!("('read', '/{top}/{p}', '')"),
            Op::Chmod(p) => format!("('chmod', '/{top}/{p}', '')"),
        })
        .collect();
    let script = format!(
        r#"
import ctypes, os, sys
lib = ctypes.CDLL('libnfs.so.13')
class Url(ctypes.Structure):
    _fields_ = [('server', ctypes.c_char_p), ('path', ctypes.c_char_p), ('file', ctypes.c_char_p)]
lib.nfs_init_context.restype = ctypes.c_void_p
lib.nfs_parse_url_dir.restype = ctypes.POINTER(Url)
lib.nfs_parse_url_dir.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
lib.nfs_get_error.restype = ctypes.c_char_p
lib.nfs_get_error.argtypes = [ctypes.c_void_p]
for f in ('nfs_mount', 'nfs_unlink', 'nfs_rename', 'nfs_open', 'nfs_creat', 'nfs_write', 'nfs_read', 'nfs_close', 'nfs_chmod'):
    getattr(lib, f).restype = ctypes.c_int
lib.nfs_mount.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
lib.nfs_unlink.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
lib.nfs_rename.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
lib.nfs_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
lib.nfs_creat.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
lib.nfs_write.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p]
lib.nfs_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p]
lib.nfs_close.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.nfs_chmod.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
nfs = lib.nfs_init_context()
url = lib.nfs_parse_url_dir(nfs, sys.argv[1].encode())
if not url:
    sys.exit('bad url: ' + lib.nfs_get_error(nfs).decode())
rc = lib.nfs_mount(nfs, url.contents.server, url.contents.path)
if rc != 0:
    sys.exit('mount: ' + lib.nfs_get_error(nfs).decode())
def opened(path, flags, then):
    fh = ctypes.c_void_p()
    rc = lib.nfs_open(nfs, path, flags, ctypes.byref(fh))
    if rc < 0:
        return rc
    rc = then(fh)
    closed = lib.nfs_close(nfs, fh)
    return rc if rc < 0 else min(closed, 0)
def run(op, a, b):
    a, b = a.encode(), b.encode()
    if op == 'remove':
        return lib.nfs_unlink(nfs, a)
    if op == 'rename':
        return lib.nfs_rename(nfs, a, b)
    if op == 'chmod':
        return lib.nfs_chmod(nfs, a, 0o600)
    if op == 'write':
        return opened(a, os.O_WRONLY, lambda fh: min(lib.nfs_write(nfs, fh, 1, b'x'), 0))
    if op == 'read':
        buf = ctypes.create_string_buffer(64)
        return opened(a, os.O_RDONLY, lambda fh: min(lib.nfs_read(nfs, fh, 64, buf), 0))
    if op == 'create':
        fh = ctypes.c_void_p()
        rc = lib.nfs_creat(nfs, a, 0o644, ctypes.byref(fh))
        if rc < 0:
            return rc
        return min(lib.nfs_close(nfs, fh), 0)
for op in [{ops}]:
    print(-run(*op))
"#,
        ops = ops.join(", ")
    );
    let out = Command::new("/usr/bin/python3")
        .args(["-c", &script, &url])
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "libnfs script failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .map(|l| name(l.trim().parse().unwrap()))
        .collect()
}

/// Over WebDAV with curl, the server acting as uid 1000: each answer as its status says it
/// (`OK` for 2xx; 403 is the one status of a refusal, whatever its errno).
fn over_webdav(srv: &Front, top: &str) -> Vec<String> {
    CASES
        .iter()
        .map(|c| {
            let url = |p: &str| srv.url(&format!("/{top}/{p}"));
            let status = match c.op {
                Op::Remove(p) => dav("tester", &["-X", "DELETE"], &url(p)),
                Op::Rename(a, b) => {
                    let dest = format!("Destination: {}", url(b));
                    dav("tester", &["-X", "MOVE", "-H", &dest], &url(a))
                }
                Op::Write(p) | Op::Create(p) => {
                    dav("tester", &["-X", "PUT", "--data-binary", "x"], &url(p))
                }
                Op::Read(p) => dav("tester", &[], &url(p)),
                // WebDAV changes no mode.
                Op::Chmod(_) => return "-".into(),
            };
            match status {
                200..=299 => "OK".into(),
                403 => "403".into(),
                s => format!("HTTP {s}"),
            }
        })
        .collect()
}

/// Over S3 with boto3, the gateway acting as uid 1000, `top` its bucket: the errno its
/// AccessDenied names (the volume's words in the message).
fn over_s3(py: &str, endpoint: &str, top: &str) -> Vec<String> {
    let calls: Vec<String> = CASES
        .iter()
        .map(|c| match c.op {
            Op::Remove(p) => format!("lambda: s3.delete_object(Bucket='{top}', Key='{p}')"),
            Op::Write(p) | Op::Create(p) => {
                format!("lambda: s3.put_object(Bucket='{top}', Key='{p}', Body=b'x')")
            }
            Op::Read(p) => {
                format!("lambda: s3.get_object(Bucket='{top}', Key='{p}')['Body'].read()")
            }
            // S3 moves no directory and changes no mode.
            Op::Rename(..) | Op::Chmod(_) => "None".into(),
        })
        .collect();
    let script = format!(
        "for f in [{}]:\n    if f is None:\n        print('-')\n        continue\n    try:\n        f()\n        print('OK')\n    except botocore.exceptions.ClientError as e:\n        err = e.response['Error']\n        print(err['Code'] + ':' + err.get('Message', ''))\n",
        calls.join(", ")
    );
    s3(py, endpoint, &script)
        .lines()
        .map(|l| match l.split_once(':') {
            None => l.to_string(),
            Some(("AccessDenied", m)) if m.contains("Operation not permitted") => "EPERM".into(),
            Some(("AccessDenied", m)) if m.contains("Permission denied") => "EACCES".into(),
            Some(_) => l.to_string(),
        })
        .collect()
}

#[test]
fn every_front_end_answers_the_permission_cases_as_linux() {
    if !have("nfs-cp") || !have("curl") {
        return;
    }
    let Some(py) = boto3() else { return };
    let vol = Volume::new();
    let m = vol.mount();
    // The gateway keeps its temporary files in a directory it makes at the served root, as
    // its own identity: the root is open to it, as a deployment's would be.
    std::fs::set_permissions(m.p(""), std::fs::Permissions::from_mode(0o777)).unwrap();
    for top in ["fuse", "nfs", "webdav", "s3-bucket"] {
        lay_out(&m.p(top));
    }
    let fuse = over_fuse(&m.p("fuse"));
    let nfs = {
        let log = vol.dir.path().join("nfs-access.log");
        let srv = Front::start(&vol, "nfs", &["--access-log", log.to_str().unwrap()]);
        let got = over_nfs(&srv.addr, "nfs");
        srv.stop();
        eprintln!("{}", std::fs::read_to_string(&log).unwrap_or_default());
        got
    };
    let webdav = {
        let uid = ME.to_string();
        let srv = Front::start(
            &vol,
            "webdav",
            &["--user", "tester", "--uid", &uid, "--gid", &uid],
        );
        let got = over_webdav(&srv, "webdav");
        srv.stop();
        got
    };
    let s3_answers = {
        let uid = ME.to_string();
        let log = vol.dir.path().join("s3-access.log");
        let srv = Front::start(
            &vol,
            "gateway",
            &[
                "--uid",
                &uid,
                "--gid",
                &uid,
                "--access-log",
                log.to_str().unwrap(),
            ],
        );
        let got = over_s3(py, &srv.url(""), "s3-bucket");
        srv.stop();
        eprintln!("{}", std::fs::read_to_string(&log).unwrap_or_default());
        got
    };
    let mut table = String::from("case | Linux | FUSE | NFS | WebDAV | S3\n");
    for (i, c) in CASES.iter().enumerate() {
        table += &format!(
            "{} | {} | {} | {} | {} | {}\n",
            c.what,
            name(c.want),
            fuse[i],
            nfs[i],
            webdav[i],
            s3_answers[i]
        );
    }
    eprintln!("{table}");
    for (i, c) in CASES.iter().enumerate() {
        let want = name(c.want);
        assert_eq!(fuse[i], want, "FUSE: {}\n{table}", c.what);
        assert_eq!(nfs[i], want, "NFS: {}\n{table}", c.what);
        let dav_want = if c.want == 0 { "OK" } else { "403" };
        assert!(
            webdav[i] == dav_want || webdav[i] == "-",
            "WebDAV: {}\n{table}",
            c.what
        );
        assert!(
            s3_answers[i] == want || s3_answers[i] == "-",
            "S3: {}\n{table}",
            c.what
        );
    }
    // What the refused cases tried is as it was, and what the allowed ones did is done, on
    // every front end: seen by a new mount (the first one's metadata cache took itself for
    // the volume's only client, as an SQLite volume's first mount does, and the servers came
    // and went between its checks for other sessions).
    m.unmount();
    let m = vol.mount();
    for top in ["fuse", "nfs", "webdav", "s3-bucket"] {
        let t = m.p(top);
        let state = (
            t.join("sticky/theirs").exists(),
            t.join("sticky/mine").exists(),
            t.join("closed/new").exists(),
            std::fs::read(t.join("ro")).unwrap_or_default(),
            t.join("to/dir").exists(),
            t.join("from/new").exists(),
        );
        let want = (true, false, false, b"unchanged".to_vec(), false, true);
        assert_eq!(state, want, "{top}");
    }
    m.unmount();
}
