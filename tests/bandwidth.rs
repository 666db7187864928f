//! `--upload-limit`, `--download-limit` (Mbps, as JuiceFS) and `--max-uploads` on real
//! mounts: the limits hold the bytes a mount sends and reads to the bandwidth given, through
//! each way of giving a flag (`-o` as fstab does, the environment), and bad values are one-line
//! errors. Only lower bounds on time are asserted (a loaded machine only makes them longer).

use crate::common::*;
use std::fs;
use std::io::Write;
use std::time::{Duration, Instant};

/// 16 Mbps in bytes per second.
const LIMIT: f64 = 2_000_000.0;

#[test]
fn upload_and_download_limits_hold_the_bytes_to_the_bandwidth() {
    let mut vol = Volume::new();
    let n = 6 << 20;
    let data = pattern(n, 36);
    // N bytes at L take N / L; the limiter lets a quarter of a second pass at once.
    let least = Duration::from_secs_f64(0.6 * n as f64 / LIMIT);

    // Written through (a local bucket stages no whole blocks): fsync waits for the puts.
    let m = vol.mount_with(&["-o", "upload_limit=16,max_uploads=4"]);
    let start = Instant::now();
    let mut f = fs::File::create(m.p("f")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let up = start.elapsed();
    assert!(
        up >= least,
        "{n} bytes went up in {up:?} at 16 Mbps, under {least:?}"
    );
    m.unmount();

    // A fresh mount has nothing of it in memory (and a local bucket has no disk cache).
    vol.env
        .push(("UNKAI_DOWNLOAD_LIMIT".to_string(), "16".to_string()));
    let m = vol.mount();
    let start = Instant::now();
    let back = fs::read(m.p("f")).unwrap();
    let down = start.elapsed();
    assert!(back == data, "the file read back differs");
    assert!(
        down >= least,
        "{n} bytes came down in {down:?} at 16 Mbps, under {least:?}"
    );
    m.unmount();
}

#[test]
fn bad_limits_are_one_line_errors() {
    let vol = Volume::new();
    let mp = tempfile::tempdir().unwrap();
    let mps = mp.path().to_str().unwrap();
    let log = vol.dir.path().join("bad.log");
    for (flag, bad) in [
        ("--upload-limit", "abc"),
        ("--upload-limit", "-1"),
        ("--download-limit", "10M"),
        ("--download-limit", "1e9"),
        ("--max-uploads", "0"),
        ("--max-uploads", "many"),
    ] {
        let given = format!("{flag}={bad}");
        let args = [
            "mount",
            "-d",
            "--log",
            log.to_str().unwrap(),
            &given,
            &vol.meta_url,
            mps,
        ];
        let (ok, out, err) = run_env(&args, &vol.env);
        if ok {
            let _ = run(&["umount", mps]);
        }
        assert!(!ok, "{flag} {bad} was taken: {out}{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{flag} {bad}: not one line:\n{err}");
        assert!(
            lines[0].starts_with("unkai: error:") && lines[0].contains(flag),
            "{flag} {bad}: the error does not name the flag: {err}"
        );
    }
}
