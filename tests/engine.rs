//! The embedded engine under concurrency from several processes: no operation ever fails
//! with "database is locked", and a file open in one mount survives an unlink in another.

use crate::common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn admin_commands_beside_a_busy_mount_never_see_a_locked_database() {
    let vol = Volume::new();
    let m = vol.mount();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for t in 0..4 {
        let dir = m.p(&format!("t{t}"));
        let stop = stop.clone();
        writers.push(std::thread::spawn(move || {
            std::fs::create_dir(&dir).unwrap();
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let p = dir.join(format!("f{n}"));
                std::fs::write(&p, b"data").unwrap();
                if n % 3 == 0 {
                    std::fs::remove_file(&p).unwrap();
                }
                n += 1;
            }
            n
        }));
    }
    // Meanwhile other processes read (status, fsck) and write (fsck takes the read path;
    // a second mount of the same volume writes) the same database.
    let m2 = vol.mount();
    for i in 0..15 {
        let (ok, out, err) = vol.cmd("status", &[]);
        assert!(ok, "status: {out}{err}");
        assert!(!err.contains("locked"), "{err}");
        let (_, out, err) = vol.cmd("fsck", &["-q", "--skip-objects"]);
        assert!(
            !out.contains("locked") && !err.contains("locked"),
            "fsck: {out}{err}"
        );
        std::fs::write(m2.p(&format!("other{i}")), b"x").unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let total: u32 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(total > 0);
    drop(m2);
    let log = m.log_text();
    assert!(!log.contains("locked"), "{log}");
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(ok, "{out}{err}");
}

/// Two mounts (two processes) of one SQLite volume: a file open in one survives an unlink in
/// the other, both ways, including a file opened while its mount was still alone on the
/// volume; the last close deletes it and its objects.
#[test]
fn a_file_open_on_one_mount_survives_an_unlink_on_another() {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let eventually = |f: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !f() {
            if start.elapsed() > Duration::from_secs(10) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    };
    let flags = ["--attr-ttl", "1", "--no-keep-cache"];
    let vol = Volume::with_args(&["--block-size", "64K"]);
    let a = vol.mount_with(&flags);
    let early = pattern(400_000, 61);
    std::fs::write(a.p("early"), &early).unwrap();
    // Opened while A is the only mount: A counts it in memory only.
    let mut held_a = std::fs::File::open(a.p("early")).unwrap();
    let b = vol.mount_with(&flags);
    // A notices B within a background tick (0.5 s) and records its opens from then on.
    a.wait_noticed_another_client("B");
    let late = pattern(300_000, 62);
    std::fs::write(b.p("late"), &late).unwrap();
    let mut held_b = std::fs::File::open(b.p("late")).unwrap();
    let objects = vol.objects().len();
    std::fs::remove_file(b.p("early")).unwrap();
    let a_sees = eventually(&|| std::fs::metadata(a.p("late")).is_ok());
    std::fs::remove_file(a.p("late")).unwrap();
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let ra = held_a.read_to_end(&mut got_a);
    let rb = held_b.read_to_end(&mut got_b);
    let during = vol.objects().len();
    drop(held_a);
    drop(held_b);
    let gone = eventually(&|| vol.objects().is_empty());
    let left = vol.objects().len();
    a.unmount();
    b.unmount();
    let (ok, out, err) = vol.cmd("fsck", &[]);
    assert!(a_sees);
    ra.unwrap();
    rb.unwrap();
    assert!(got_a == early, "A's descriptor lost the file B unlinked");
    assert!(got_b == late, "B's descriptor lost the file A unlinked");
    assert_eq!(during, objects, "objects deleted while open");
    assert!(gone, "{left} objects left after the last closes");
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
}
