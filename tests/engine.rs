//! The embedded engine under concurrency from several processes: no operation ever fails
//! with "database is locked".

mod common;

use common::*;
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
