//! A full local disk: ENOSPC reaches the application, nothing half-written is committed, and
//! the volume stays consistent.

use crate::common::*;
use std::io::Write;

#[test]
fn full_bucket_disk_gives_enospc_and_commits_nothing() {
    let disk = SmallDisk::new("8m");
    let storage = format!("file://{}/bucket", disk.path.display());
    let vol = Volume::with_args(&["--storage", &storage, "--block-size", "1M"]);
    let m = vol.mount();
    std::fs::write(m.p("fits"), pattern(1 << 20, 1)).unwrap();

    // 32 MiB cannot fit in 8 MiB: some write or the close must fail with ENOSPC.
    let res = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(m.p("toobig"))?;
        for i in 0..32 {
            f.write_all(&pattern(1 << 20, 100 + i))?;
        }
        f.sync_all()?;
        drop(f);
        Ok(())
    })();
    let err = res.expect_err("writing 32 MiB into 8 MiB must fail");
    assert_eq!(errno(&err), libc::ENOSPC, "{err}");

    // What fit before is intact; deleting the failed file frees its buffers.
    assert_eq!(std::fs::read(m.p("fits")).unwrap(), pattern(1 << 20, 1));
    std::fs::remove_file(m.p("toobig")).unwrap();
    m.unmount();

    // Nothing of the failed file was committed.
    let m = vol.mount();
    assert!(!m.p("toobig").exists());
    assert_eq!(std::fs::read(m.p("fits")).unwrap(), pattern(1 << 20, 1));
    drop(m);
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = vol.cmd("gc", &["-q", "--delete"]);
    assert!(ok, "{out}{err}");
    let (ok, out, _) = vol.cmd("fsck", &["-q"]);
    assert!(ok && !out.contains("LEAKED"), "{out}");
}

#[test]
fn read_only_bucket_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &ro,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_RDONLY,
        Some("size=1m"),
    )
    .expect("mount read-only tmpfs");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _guard = Unmount(ro.clone());
    let meta = format!("sqlite://{}/meta.db", dir.path().display());
    let storage = format!("file://{}", ro.display());
    let (ok, out, err) = run(&["format", "--storage", &storage, &meta, "rovol"]);
    assert!(!ok, "{out}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("unkai: error:") && lines[0].contains(&storage),
        "{err}"
    );
    assert!(err.contains("Read-only file system"), "{err}");
    // Nothing was created: the volume is still unformatted.
    let (ok, _, err) = run(&["status", &meta]);
    assert!(!ok && err.contains("not formatted"), "{err}");
}

/// fallocate promises space: more than the volume has free (its --capacity here) is ENOSPC,
/// with nothing changed; within it, the file grows as asked.
#[test]
fn fallocate_past_the_free_space_is_enospc() {
    let vol = Volume::with_args(&["--capacity", "64M"]);
    let m = vol.mount();
    let f = std::fs::File::create(m.p("f")).unwrap();
    let e = fallocate(&f, 0, 0, 128 << 20).unwrap_err();
    assert_eq!(errno(&e), libc::ENOSPC, "{e}");
    let e = fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 40).unwrap_err();
    assert_eq!(errno(&e), libc::ENOSPC, "{e}");
    assert_eq!(
        f.metadata().unwrap().len(),
        0,
        "a refused fallocate changed the size"
    );
    fallocate(&f, 0, 0, 8 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 8 << 20);
    // Punching a hole never needs space.
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        0,
        1 << 40,
    )
    .unwrap();
}
