//! The access log through a real mount: `.accesslog` at the root shows, live, each request
//! of a scripted sequence exactly (operation, inodes and names, result), with the process
//! that made it; `--access-log FILE` writes the same lines; `unkai profile` summarises both.

use crate::common;

use crate::common::*;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The requests of the log made by this thread, in the order they began (the kernel names a request's thread), the
/// ones a script decides: lookups, getattrs and xattr reads depend on the kernel's caches.
fn mine(lines: &[String]) -> Vec<String> {
    let me = format!("pid:{},", unsafe { libc::gettid() });
    // A line is written when its request ends, stamped with its start: a request whose
    // reply went out before its end is logged after the next one began.
    let mut lines = lines.to_vec();
    lines.sort_by(|a, b| a[..26].cmp(&b[..26]));
    lines
        .iter()
        .filter(|l| l.contains(&me))
        .filter_map(|l| l.split("] ").nth(1).map(str::to_string))
        .filter(|l| {
            ![
                "lookup ",
                "getattr ",
                "getxattr ",
                "access ",
                "open ",
                "release ",
                "opendir ",
                "readdir",
                "releasedir ",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .map(|l| l[..l.rfind(" <").unwrap()].to_string())
        .collect()
}

#[test]
fn the_access_log_records_a_script_exactly() {
    let vol = Volume::new();
    let file_log = vol.dir.path().join("access.log");
    // Without the kernel's writeback cache: the script's requests are then exactly its own
    // (with it, the kernel writes the pages back as requests of its flusher, another pid, and
    // hands over the times it kept with a setattr of its own).
    let m = vol.mount_with(&[
        "--access-log",
        file_log.to_str().unwrap(),
        "--writeback-cache",
        "off",
    ]);
    assert!(
        !names(&m.path).contains(".accesslog"),
        "the log is not listed"
    );
    // A reader of the live log, from before the script on.
    let (tx, rx) = mpsc::channel::<String>();
    let live = File::open(m.p(".accesslog")).unwrap();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(live).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    fs::create_dir(m.p("d")).unwrap();
    let d = fs::metadata(m.p("d")).unwrap();
    let d_ino = std::os::unix::fs::MetadataExt::ino(&d);
    let mut f = File::create(m.p("d/f")).unwrap();
    f.write_all(b"hello").unwrap();
    drop(f);
    fs::rename(m.p("d/f"), m.p("d/g")).unwrap();
    assert!(fs::remove_file(m.p("d/nope")).is_err());
    fs::remove_file(m.p("d/g")).unwrap();
    fs::remove_dir(m.p("d")).unwrap();

    let want = [
        "mkdir (1,d,".to_string(),
        format!("create ({d_ino},f,"),
        "write (".to_string(),
        "flush (".to_string(),
        format!("rename ({d_ino},f,{d_ino},g): OK"),
        format!("unlink ({d_ino},g): OK"),
        "rmdir (1,d): OK".to_string(),
    ];
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while mine(&lines).len() < want.len() && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_secs(1)) {
            lines.push(l);
        }
    }
    let got = mine(&lines);
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (g, w) in got.iter().zip(&want) {
        assert!(g.starts_with(w.as_str()), "{g} is not {w}: {got:#?}");
        assert!(g.ends_with(": OK"), "{g}");
    }
    let comm = fs::read_to_string("/proc/thread-self/comm").unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("comm:{}]", comm.trim()))),
        "the process name is logged"
    );
    let failed = format!("lookup ({d_ino},nope): No such file");
    while !lines.iter().any(|l| l.contains(&failed)) && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_secs(1)) {
            lines.push(l);
        }
    }
    assert!(
        lines.iter().any(|l| l.contains(&failed)),
        "a failure is logged with its error: {lines:#?}"
    );

    // The file holds the same lines.
    assert!(eventually(Duration::from_secs(30), || {
        let text = fs::read_to_string(&file_log).unwrap_or_default();
        let all: Vec<String> = text.lines().map(str::to_string).collect();
        mine(&all) == got
    }));
    let (ok, out, err) = run(&["profile", "--top", "50", file_log.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    for op in ["mkdir", "create", "rename", "unlink", "rmdir", "SLOWEST"] {
        assert!(out.contains(op), "profile lacks {op}: {out}");
    }
    let (ok, out, err) = run(&[
        "profile",
        "--interval",
        "1",
        "--count",
        "1",
        m.path.to_str().unwrap(),
    ]);
    assert!(ok && out.contains("requests"), "live profile: {out}{err}");
    drop(rx);
    m.unmount();
    reader.join().unwrap();
}

/// A port of 127.0.0.1 free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The requests of `proto` a server's `/metrics` at `port` counts: `op` -> count.
fn counted(port: u16, proto: &str) -> std::collections::HashMap<String, f64> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let mut out = std::collections::HashMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("unkai_op_duration_seconds_count{") else {
            continue;
        };
        let (labels, value) = rest.rsplit_once("} ").unwrap();
        if !labels.contains(&format!("proto=\"{proto}\"")) {
            continue;
        }
        let op = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("op=\""))
            .unwrap()
            .trim_end_matches('"');
        out.insert(op.to_string(), value.parse().unwrap());
    }
    out
}

/// The requests `proto:PROTO` of an access log, as `op (args): result`, in order.
fn requests_of(log: &std::path::Path, proto: &str) -> Vec<String> {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&format!("[proto:{proto},")))
        .filter_map(|l| l.split_once("] ").map(|(_, r)| r.to_string()))
        .map(|r| r[..r.rfind(" <").unwrap()].to_string())
        .collect()
}

/// Waits until the requests of `proto` in `log` hold `want` in order (others may come
/// between); the requests.
fn wait_for_requests(log: &std::path::Path, proto: &str, want: &[&str]) -> Vec<String> {
    let mut got = Vec::new();
    let found = eventually(Duration::from_secs(30), || {
        got = requests_of(log, proto);
        let mut it = got.iter();
        want.iter().all(|w| it.any(|g| g == w))
    });
    assert!(
        found,
        "{want:#?} not all in the {proto} log, in order: {got:#?}"
    );
    got
}

/// Each network server logs every request of a scripted sequence (`--access-log FILE`)
/// naming its protocol, its client and its result, and counts it in `/metrics` under its
/// protocol; `unkai profile` summarises the log.
#[test]
fn each_server_logs_and_counts_every_request_with_its_protocol() {
    use common::fronts::{Front, boto3, dav, have, s3};
    let vol = Volume::new();
    if have("curl") {
        let log = vol.dir.path().join("webdav-access.log");
        let port = free_port();
        let srv = Front::start(
            &vol,
            "webdav",
            &[
                "--user",
                "alice",
                "--access-log",
                log.to_str().unwrap(),
                "--metrics",
                &format!("127.0.0.1:{port}"),
            ],
        );
        let before = counted(port, "webdav");
        let dest = format!("Destination: {}", srv.url("/d/g"));
        let script: [(&[&str], &str, u16); 6] = [
            (&["-X", "MKCOL"], "/d", 201),
            (&["-X", "PUT", "--data-binary", "hello"], "/d/f", 201),
            (&[], "/d/f", 200),
            (&["-X", "MOVE", "-H", &dest], "/d/f", 201),
            (&["-X", "DELETE"], "/d/g", 204),
            (&[], "/d/nope", 404),
        ];
        for (args, path, status) in script {
            assert_eq!(
                dav("alice", args, &srv.url(path)),
                status,
                "{args:?} {path}"
            );
        }
        wait_for_requests(
            &log,
            "webdav",
            &[
                "MKCOL (/d): OK",
                "PUT (/d/f): OK",
                "GET (/d/f): OK",
                "MOVE (/d/f,/d/g): OK",
                "DELETE (/d/g): OK",
                "GET (/d/nope): 404 Not Found",
            ],
        );
        let text = fs::read_to_string(&log).unwrap();
        assert!(
            text.lines()
                .filter(|l| l.contains("[proto:webdav,"))
                .all(|l| l.contains(",client:127.0.0.1:") && l.contains(",user:alice]")),
            "each line names the client and the user:\n{text}"
        );
        let after = counted(port, "webdav");
        let moved = |op: &str| after.get(op).unwrap_or(&0.0) - before.get(op).unwrap_or(&0.0);
        for (op, n) in [
            ("MKCOL", 1.0),
            ("PUT", 1.0),
            ("GET", 2.0),
            ("MOVE", 1.0),
            ("DELETE", 1.0),
        ] {
            assert_eq!(moved(op), n, "{op}: {after:?}");
        }
        let (ok, out, err) = run(&["profile", log.to_str().unwrap()]);
        assert!(
            ok && out.contains("MKCOL") && out.contains("webdav 127.0.0.1"),
            "{out}{err}"
        );
        srv.stop();
    }
    if let Some(py) = boto3() {
        let log = vol.dir.path().join("s3-access.log");
        let port = free_port();
        let gw = Front::start(
            &vol,
            "gateway",
            &[
                "--access-log",
                log.to_str().unwrap(),
                "--metrics",
                &format!("127.0.0.1:{port}"),
            ],
        );
        let before = counted(port, "s3");
        let out = s3(
            py,
            &gw.url(""),
            "s3.create_bucket(Bucket='bkt')\n\
             s3.put_object(Bucket='bkt', Key='k/x.txt', Body=b'hello')\n\
             print(s3.get_object(Bucket='bkt', Key='k/x.txt')['Body'].read().decode())\n\
             print(code(lambda: s3.head_object(Bucket='bkt', Key='nope')))\n\
             s3.delete_object(Bucket='bkt', Key='k/x.txt')\n",
        );
        assert_eq!(out.lines().collect::<Vec<_>>(), ["hello", "404"], "{out}");
        wait_for_requests(
            &log,
            "s3",
            &[
                "CreateBucket (bkt): OK",
                "PutObject (bkt/k/x.txt): OK",
                "GetObject (bkt/k/x.txt): OK",
                "HeadObject (bkt/nope): 404 Not Found",
                "DeleteObject (bkt/k/x.txt): OK",
            ],
        );
        let after = counted(port, "s3");
        let moved = |op: &str| after.get(op).unwrap_or(&0.0) - before.get(op).unwrap_or(&0.0);
        for op in [
            "CreateBucket",
            "PutObject",
            "GetObject",
            "HeadObject",
            "DeleteObject",
        ] {
            assert_eq!(moved(op), 1.0, "{op}: {after:?}");
        }
        gw.stop();
    }
}

/// The NFS server logs every call of a scripted sequence of libnfs (nfs-cp in, nfs-cat
/// out, nfs-ls, a missing file) naming its protocol, client, identity, procedure, handle's
/// inode and names, and its NFS status, and counts it in `/metrics` under `nfs`.
#[test]
fn the_nfs_server_logs_and_counts_every_call() {
    use common::fronts::{Front, have};
    if !have("nfs-cp") {
        return;
    }
    let vol = Volume::new();
    let log = vol.dir.path().join("nfs-access.log");
    let port = free_port();
    let srv = Front::start(
        &vol,
        "nfs",
        &[
            "-o",
            "no_root_squash",
            "--access-log",
            log.to_str().unwrap(),
            "--metrics",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let before = counted(port, "nfs");
    let (host, nfs_port) = srv.addr.rsplit_once(':').unwrap();
    let url =
        |p: &str| format!("nfs://{host}/{p}?nfsport={nfs_port}&mountport={nfs_port}&uid=0&gid=0");
    let src = vol.dir.path().join("src.txt");
    fs::write(&src, b"hello over nfs").unwrap();
    let tool = |args: &[&str]| {
        let out = std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .unwrap();
        (out.status.success(), out.stdout)
    };
    let (ok, _) = tool(&["nfs-cp", src.to_str().unwrap(), &url("/f.txt")]);
    assert!(ok, "nfs-cp in:\n{}", srv.log_text());
    let (ok, out) = tool(&["nfs-cat", &url("/f.txt")]);
    assert!(ok && out == b"hello over nfs", "nfs-cat");
    let (ok, out) = tool(&["nfs-ls", &url("/")]);
    assert!(
        ok && String::from_utf8_lossy(&out).contains("f.txt"),
        "nfs-ls"
    );
    let (ok, _) = tool(&["nfs-cat", &url("/nope")]);
    assert!(!ok, "nfs-cat of a missing file");
    let got = wait_for_requests(
        &log,
        "nfs",
        &[
            "MNT (/): OK",
            "CREATE (1,f.txt): OK",
            "LOOKUP (1,nope): NFS3ERR_NOENT",
        ],
    );
    for op in ["WRITE", "READ", "READDIRPLUS"] {
        assert!(
            got.iter()
                .any(|r| r.starts_with(&format!("{op} (")) && r.ends_with(": OK")),
            "no {op} in {got:#?}"
        );
    }
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .filter(|l| l.contains("[proto:nfs,"))
            .all(|l| l.contains("[proto:nfs,uid:0,gid:0,client:127.0.0.1:")),
        "each line names the identity and the client:\n{text}"
    );
    let after = counted(port, "nfs");
    let moved = |op: &str| after.get(op).unwrap_or(&0.0) - before.get(op).unwrap_or(&0.0);
    for op in ["MNT", "CREATE", "WRITE", "READ", "READDIRPLUS", "LOOKUP"] {
        assert!(moved(op) >= 1.0, "{op}: {after:?}");
    }
    srv.stop();
}

/// SIGHUP makes a server reopen its access log (logrotate moves the file, then signals): the
/// requests after it go to the new file, and the server goes on serving.
#[test]
fn sighup_reopens_a_servers_access_log() {
    use common::fronts::{Front, dav, have};
    if !have("curl") {
        return;
    }
    let vol = Volume::new();
    let log = vol.dir.path().join("access.log");
    let rotated = vol.dir.path().join("access.log.1");
    let mut srv = Front::start(
        &vol,
        "webdav",
        &["--user", "alice", "--access-log", log.to_str().unwrap()],
    );
    assert_eq!(
        dav(
            "alice",
            &["-X", "PUT", "--data-binary", "1"],
            &srv.url("/before")
        ),
        201
    );
    wait_for_requests(&log, "webdav", &["PUT (/before): OK"]);
    fs::rename(&log, &rotated).unwrap();
    nix::sys::signal::kill(srv.pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || log.exists()),
        "no new access log after SIGHUP:\n{}",
        srv.log_text()
    );
    assert!(srv.alive(), "SIGHUP stopped the server");
    assert_eq!(
        dav(
            "alice",
            &["-X", "PUT", "--data-binary", "2"],
            &srv.url("/after")
        ),
        201
    );
    wait_for_requests(&log, "webdav", &["PUT (/after): OK"]);
    let old = requests_of(&rotated, "webdav");
    assert!(
        old.iter().any(|l| l == "PUT (/before): OK") && !old.iter().any(|l| l.contains("/after")),
        "{old:#?}"
    );
    srv.stop();
}
