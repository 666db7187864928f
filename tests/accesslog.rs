//! The access log through a real mount: `.accesslog` at the root shows, live, each request
//! of a scripted sequence exactly (operation, inodes and names, result), with the process
//! that made it; `--access-log FILE` writes the same lines; `unkai profile` summarises both.

mod common;

use common::*;
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
    let m = vol.mount_with(&["--access-log", file_log.to_str().unwrap()]);
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
