//! Commands see what a mount on this machine has acknowledged: each runs right after a
//! change made through the mount and finds it. A mount that has its SQLite volume to itself
//! commits namespace changes in groups, up to 10 ms after it answered them; a command that
//! read the file in between missed them (`mkdir /mnt/v/q && unkai quota set --path /q ...`
//! said "no such directory"). Each check runs many times, to meet that window.

use crate::common::*;
use std::fs;
use std::path::Path;

/// The number after `before` and before `after` in `text` ("in 42 inodes").
fn number(text: &str, before: &str, after: &str) -> u64 {
    text.split(before)
        .nth(1)
        .and_then(|s| s.split(after).next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{before}N{after}' in: {text}"))
}

#[test]
fn commands_see_what_a_mount_just_acknowledged() {
    // Heartbeats every 0.4 s: the first quota waits for two of them from each mount.
    let env = vec![("UNKAI_SESSION_TIMEOUT".into(), "6".into())];
    let vol = Volume::with_env(&["--trash-days", "1"], env);
    let m = vol.mount();
    let url = vol.meta_url.as_str();
    let cmd = |args: &[&str]| {
        let (ok, out, err) = run_env(args, &vol.env);
        assert!(ok, "unkai {args:?}: {out}{err}");
        (out, err)
    };
    // What status and fsck count at first (each its own way), then the inodes made since.
    let (out, _) = cmd(&["status", url]);
    let status_base = number(&out, " in ", " inodes");
    let (out, _) = cmd(&["fsck", url]);
    let fsck_base = number(&out, "checked ", " inodes");
    let mut made = 0;

    // Commands that only read: nothing they do stops the mount's grouping.
    for i in 0..25 {
        fs::create_dir(m.p(&format!("dump{i}"))).unwrap();
        let (out, _) = cmd(&["dump", "-q", url, "-"]);
        assert!(
            out.contains(&format!("\"name\":\"dump{i}\"")),
            "dump {i} missed it"
        );
        made += 1;

        fs::create_dir(m.p(&format!("status{i}"))).unwrap();
        made += 1;
        let (out, _) = cmd(&["status", url]);
        let n = number(&out, " in ", " inodes");
        assert_eq!(n, status_base + made, "status {i}: {out}");

        fs::create_dir(m.p(&format!("fsck{i}"))).unwrap();
        made += 1;
        let (out, _) = cmd(&["fsck", url]);
        let n = number(&out, "checked ", " inodes");
        assert_eq!(n, fsck_base + made, "fsck {i}: {out}");
        assert!(out.contains("volume is consistent"), "fsck {i}: {out}");

        fs::write(m.p(&format!("gc{i}")), pattern(5000, i)).unwrap();
        made += 1;
        let (out, _) = cmd(&["gc", url]);
        assert!(out.contains("0 leaked objects"), "gc {i}: {out}");

        // Through the mount itself (its own virtual xattrs).
        fs::create_dir(m.p(&format!("sum{i}"))).unwrap();
        made += 1;
        let (out, _) = cmd(&["summary", m.path.to_str().unwrap()]);
        // The root itself is not counted: every directory made so far is.
        assert_eq!(
            number(&out, "directories: ", ","),
            4 * (i + 1),
            "summary {i}: {out}"
        );
        let (out, _) = cmd(&["info", m.p(&format!("gc{i}")).to_str().unwrap()]);
        assert!(out.contains("(5000 bytes)"), "info {i}: {out}");
    }

    // Commands that write (and so end the grouping for a while), and those through the
    // mount that change it.
    for i in 0..10 {
        // The issue's own case.
        fs::create_dir(m.p(&format!("q{i}"))).unwrap();
        cmd(&[
            "quota",
            "set",
            "--path",
            &format!("/q{i}"),
            "--capacity",
            "10M",
            url,
        ]);
        fs::create_dir(m.p(&format!("q{i}/in"))).unwrap();
        let (out, _) = cmd(&["quota", "get", "--path", &format!("/q{i}"), "--json", url]);
        assert!(out.contains("\"used_inodes\": 1"), "quota get {i}: {out}");

        // A limit of what the volume held before the mkdir is said to be exceeded.
        let (out, _) = cmd(&["status", url]);
        let before = number(&out, " in ", " inodes");
        fs::create_dir(m.p(&format!("config{i}"))).unwrap();
        let (_, err) = cmd(&["config", "--inodes", &before.to_string(), url]);
        assert!(
            err.contains(&format!("already holds {} inodes", before + 1)),
            "config {i}: {err}"
        );
        cmd(&["config", "--inodes", "0", url]);

        // The mount reads the volume's settings at its heartbeat: one may have come between
        // the two `config` runs and given it the limit, which the next one takes back. Until
        // then a create through the mount fails with ENOSPC, and makes nothing.
        let src = m.p(&format!("c{i}"));
        let created = eventually(std::time::Duration::from_secs(30), || {
            match fs::write(&src, pattern(3000, 100 + i)) {
                Ok(()) => true,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => false,
                Err(e) => panic!("write {i}: {e}"),
            }
        });
        assert!(
            created,
            "the inode limit taken back never reached the mount"
        );
        let dst = m.p(&format!("c{i}.clone"));
        cmd(&["clone", src.to_str().unwrap(), dst.to_str().unwrap()]);
        assert_eq!(fs::read(&dst).unwrap(), pattern(3000, 100 + i), "clone {i}");

        let gone = m.p(&format!("r{i}"));
        fs::write(&gone, b"back again").unwrap();
        fs::remove_file(&gone).unwrap();
        cmd(&["restore", m.path.to_str().unwrap()]);
        assert_eq!(fs::read(&gone).unwrap(), b"back again", "restore {i}");
        assert!(Path::new(&gone).exists());
    }
    m.unmount();
}
