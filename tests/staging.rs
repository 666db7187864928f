//! Write-back staging (`mount --writeback`, on by default for an SQLite volume whose store is
//! not a plain local directory, and for small files only where it is one): close and fsync wait for local disk only, blocks go up behind
//! the application, and nothing acknowledged is lost — not to a store that is down, not to a
//! full staging area, not to a client killed with -9. Unmounting uploads everything staged.
//! On a PostgreSQL volume close still waits for the store, so another client that opens a
//! file after a close reads the new data.

use crate::common;

use crate::common::*;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Files fsynced: name and contents.
type Synced = Vec<(String, Vec<u8>)>;

/// A volume whose commands see `faults` (UNKAI_FAULTS) and stage under its own directory.
fn faulty_volume(faults: &str, extra_env: Vec<(String, String)>) -> Volume {
    let mut vol = Volume::with_args(&[]);
    vol.env.push(("UNKAI_FAULTS".into(), faults.into()));
    vol.env.extend(extra_env);
    vol
}

fn cache_dir(vol: &Volume) -> PathBuf {
    vol.dir.path().join("cache")
}

/// Files staged under the volume's cache directory (blocks not uploaded yet; the disk
/// cache's blocks aside).
fn staged_files(vol: &Volume) -> Vec<PathBuf> {
    let staged = |p: &PathBuf| {
        p.components()
            .any(|c| c.as_os_str().to_string_lossy().starts_with("stage-"))
    };
    files_under(&cache_dir(vol))
        .into_iter()
        .filter(staged)
        .collect()
}

/// A volume whose store is down while the returned file exists (and answers 5 ms late).
fn volume_with_down_switch() -> (tempfile::TempDir, PathBuf, Volume) {
    let tmp = tempfile::tempdir().unwrap();
    let down = tmp.path().join("down");
    let vol = faulty_volume(
        &format!("latency_ms=5,down_file={}", down.display()),
        Vec::new(),
    );
    (tmp, down, vol)
}

fn without_faults(vol: &mut Volume) {
    vol.env.retain(|(k, _)| k != "UNKAI_FAULTS");
}

fn fsck_clean(vol: &Volume) {
    let (ok, out, err) = vol.cmd("fsck", &["--quiet"]);
    assert!(ok && out.contains("volume is consistent"), "{out}{err}");
}

/// While the store is down, applications go on writing and reading (from the staging area);
/// status shows what waits; when the store is back the uploads catch up, with one log line
/// each way; unmounting leaves nothing staged, and everything reads back after a remount.
#[test]
fn a_store_down_for_30_seconds_loses_nothing() {
    let (_tmp, down, mut vol) = volume_with_down_switch();
    let m = vol.mount();
    assert!(
        m.log_text().contains("write-back on"),
        "write-back is not on for a store that answers late:\n{}",
        m.log_text()
    );
    File::create(&down).unwrap();
    let start = Instant::now();
    let mut want = BTreeMap::new();
    let mut i = 0u64;
    // Writes go on for 30 s with the store down, each file closed and half of them fsynced.
    while start.elapsed() < Duration::from_secs(30) {
        let data = pattern(20_000 + (i as usize % 7) * 50_000, i);
        let p = m.p(&format!("f{i}"));
        let mut f = File::create(&p).unwrap();
        f.write_all(&data).unwrap();
        if i % 2 == 0 {
            f.sync_all().unwrap();
        }
        drop(f);
        assert_eq!(
            fs::read(&p).unwrap(),
            data,
            "f{i} read back while the store is down"
        );
        want.insert(format!("f{i}"), data);
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(i >= 20, "only {i} files written in 30 s");
    assert!(
        vol.objects().is_empty(),
        "objects reached a store that is down"
    );
    // `status` shows what this client has staged (reported at its heartbeat).
    assert!(
        eventually(Duration::from_secs(60), || {
            let (_, out, _) = vol.cmd("status", &[]);
            out.lines()
                .any(|l| l.contains("staged for upload") && !l.contains("upload: 0 blocks"))
        }),
        "status never showed staged blocks"
    );
    fs::remove_file(&down).unwrap();
    assert!(
        eventually(Duration::from_secs(120), || staged_files(&vol).is_empty()),
        "uploads did not catch up: {} files still staged",
        staged_files(&vol).len()
    );
    m.unmount();
    let log = fs::read_to_string(vol.dir.path().join("mount.log")).unwrap();
    assert_eq!(
        log.matches("uploading staged blocks fails").count(),
        1,
        "the outage is logged once:\n{log}"
    );
    assert_eq!(log.matches("work again").count(), 1, "{log}");
    without_faults(&mut vol);
    let m = vol.mount();
    for (name, data) in &want {
        assert_eq!(
            &fs::read(m.p(name)).unwrap(),
            data,
            "{name} after the remount"
        );
    }
    m.unmount();
    fsck_clean(&vol);
}

/// A client killed with -9 at random points while programs write and fsync, on a real S3
/// server that answers 20 ms late: after each remount every fsynced file is there, byte for
/// byte; blocks left staged go up at the next mount; the volume ends consistent.
#[test]
fn kill_9_while_writing_loses_nothing_fsynced_on_s3() {
    let server = servers::s3("staging");
    let mut env = server.env.clone();
    env.push(("UNKAI_FAULTS".into(), "latency_ms=20".into()));
    let mut vol = Volume::with_env(&["--storage", &server.storage], env);
    let mut rng = common::rng::SplitMix(7);
    let mut synced: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for round in 0..3 {
        let m = vol.mount();
        // Every file fsynced in an earlier round is there.
        for (name, data) in &synced {
            let got = fs::read(m.p(name)).unwrap_or_else(|e| {
                panic!(
                    "{name} in round {round}: {e}; present: {:?}\nlog:\n{}",
                    names(&m.path),
                    tail(&m.log_text(), 60)
                )
            });
            assert_eq!(&got, data, "{name} in round {round}");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let done: Arc<Mutex<Synced>> = Arc::default();
        let writers: Vec<_> = (0..3)
            .map(|w| {
                let (root, stop, done) = (m.path.clone(), stop.clone(), done.clone());
                let seed = rng.next();
                std::thread::spawn(move || {
                    // Once the dead mount is detached its path is a plain directory: files
                    // written there are not on the volume and must not count.
                    let dev = fs::metadata(&root).unwrap().dev();
                    let mut r = common::rng::SplitMix(seed);
                    for i in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let name = format!("r{round}-w{w}-{i}");
                        let len = r.between(1, 300_000) as usize;
                        let data = r.fill(len);
                        let res = (|| -> std::io::Result<()> {
                            let mut f = File::create(root.join(&name))?;
                            f.write_all(&data)?;
                            f.sync_all()?;
                            if f.metadata()?.dev() != dev {
                                return Err(std::io::Error::other("not on the volume"));
                            }
                            Ok(())
                        })();
                        match res {
                            Ok(()) => done.lock().unwrap().push((name, data)),
                            Err(_) => return, // the mount is gone
                        }
                    }
                })
            })
            .collect();
        // Kill once some files are fsynced, at a random moment after.
        assert!(
            eventually(Duration::from_secs(60), || done.lock().unwrap().len() >= 5),
            "no file was fsynced"
        );
        std::thread::sleep(Duration::from_millis(rng.between(0, 1500)));
        m.kill9();
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        synced.extend(done.lock().unwrap().drain(..));
    }
    let m = vol.mount();
    for (name, data) in &synced {
        assert_eq!(&fs::read(m.p(name)).unwrap(), data, "{name} at the end");
    }
    m.unmount();
    assert!(staged_files(&vol).is_empty(), "{:?}", staged_files(&vol));
    without_faults(&mut vol);
    fsck_clean(&vol);
}

/// A staging area smaller than what is written: writers wait for uploads to make room
/// (nothing fails, nothing goes around the stage), and everything reads back.
#[test]
fn a_full_staging_area_makes_writers_wait() {
    let vol = faulty_volume("latency_ms=50", Vec::new());
    let m = vol.mount_with(&["--stage-size", "1M"]);
    let mut want = Vec::new();
    for i in 0..24 {
        let data = pattern(300_000, 1000 + i);
        fs::write(m.p(&format!("g{i}")), &data).unwrap();
        want.push(data);
    }
    for (i, data) in want.iter().enumerate() {
        assert_eq!(&fs::read(m.p(&format!("g{i}"))).unwrap(), data);
    }
    m.unmount();
    let log = fs::read_to_string(vol.dir.path().join("mount.log")).unwrap();
    assert!(!log.contains("storing the block directly"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
    assert!(staged_files(&vol).is_empty());
    fsck_clean(&vol);
}

/// Unmounting waits for every staged block, saying what is left while the store is down:
/// after `umount` returns, the bucket holds them all and the staging area is empty.
#[test]
fn umount_drains_the_staging_area() {
    let (_tmp, down, vol) = volume_with_down_switch();
    let m = vol.mount();
    File::create(&down).unwrap();
    for i in 0..60 {
        fs::write(m.p(&format!("h{i}")), pattern(10_000, i)).unwrap();
    }
    assert!(vol.objects().is_empty());
    // `umount`'s messages go to a file, to be read while it runs.
    let said = down.with_file_name("umount-said");
    let mut umount = std::process::Command::new(env!("CARGO_BIN_EXE_unkai"))
        .args(["umount", m.path.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(File::create(&said).unwrap())
        .spawn()
        .unwrap();
    // The server tells `umount` what it has left (pid file + ".staged", once a second), and
    // why uploads fail; `umount` passes it on, with what the user may do.
    let hex: String = m
        .path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let progress = PathBuf::from("/run/unkai/mounts").join(format!("{hex}.staged"));
    let told = || fs::read_to_string(&said).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(60), || told().contains("refuses")),
        "umount did not say why it waits: {}\nserver log:\n{}",
        told(),
        tail(&m.log_text(), 20)
    );
    assert!(progress.exists());
    let err = told();
    assert!(err.contains("uploading what is staged: "), "{err}");
    assert!(
        err.contains("store is down") && err.contains("loses nothing"),
        "{err}"
    );
    fs::remove_file(&down).unwrap();
    let status = umount.wait().unwrap();
    assert!(status.success(), "{}", told());
    drop(m);
    // The 60 small files travel together, in a few packs.
    let objects = vol.objects();
    assert!(
        (1..=6).contains(&objects.len()),
        "objects in the bucket after umount: {objects:?}"
    );
    assert!(staged_files(&vol).is_empty(), "{:?}", staged_files(&vol));
    assert!(!progress.exists());
    let (ok, out, err) = vol.cmd("status", &[]);
    assert!(ok && out.contains("mounts: none"), "{out}{err}");
    let m = vol.mount();
    for i in 0..60 {
        assert_eq!(fs::read(m.p(&format!("h{i}"))).unwrap(), pattern(10_000, i));
    }
}

/// Small files travel together: extracting N of them makes at most N/20 PUTs (the mount's
/// own count), every byte reads back after a remount (from the bucket), and deleting them
/// reclaims every pack they shared (nothing left in the bucket, `gc` finds nothing leaked).
#[test]
fn small_files_make_few_puts() {
    let mut vol = faulty_volume("latency_ms=5", Vec::new());
    let m = vol.mount();
    let mut rng = common::rng::SplitMix(13);
    let mut want = Vec::new();
    for i in 0..400 {
        let dir = format!("d{}", i % 7);
        fs::create_dir_all(m.p(&dir)).unwrap();
        let name = format!("{dir}/f{i}");
        let len = rng.between(1, 8_000) as usize;
        let data = rng.fill(len);
        fs::write(m.p(&name), &data).unwrap();
        want.push((name, data));
    }
    let log = m.log.clone();
    m.unmount();
    let log = fs::read_to_string(log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("this mount: applications wrote"))
        .unwrap_or_else(|| panic!("no traffic summary in the log:\n{log}"));
    let puts: usize = line
        .split(" objects")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        (1..=400 / 20).contains(&puts),
        "{puts} PUTs for 400 files: {line}"
    );
    assert!(staged_files(&vol).is_empty(), "{:?}", staged_files(&vol));
    // Read back from the bucket, not the disk cache the uploads moved them into.
    let m = vol.mount_with(&["--cache-size", "0"]);
    for (name, data) in &want {
        assert_eq!(&fs::read(m.p(name)).unwrap(), data, "{name}");
    }
    for i in 0..7 {
        fs::remove_dir_all(m.p(&format!("d{i}"))).unwrap();
    }
    m.unmount();
    assert!(vol.objects().is_empty(), "{:?}", vol.objects());
    without_faults(&mut vol);
    fsck_clean(&vol);
    let (ok, out, err) = vol.cmd("gc", &[]);
    assert!(ok && out.contains("0 leaked objects"), "{out}{err}");
}

/// On the default local-directory bucket, small files are staged and packed (one object for
/// many, instead of an object file created per file at each close), while whole blocks go
/// straight to the bucket; a client killed with -9 loses nothing closed, and the next mount
/// uploads the packs it left.
#[test]
fn on_a_local_bucket_only_small_files_are_staged_and_packed() {
    let vol = Volume::with_args(&[]);
    let m = vol.mount();
    let mut rng = common::rng::SplitMix(29);
    let mut want = Vec::new();
    for i in 0..300 {
        let name = format!("f{i}");
        let len = rng.between(1, 8_000) as usize;
        let data = rng.fill(len);
        fs::write(m.p(&name), &data).unwrap();
        want.push((name, data));
    }
    // Two whole blocks and a tail (4 MiB blocks by default).
    let before: std::collections::BTreeSet<PathBuf> = vol.objects().into_iter().collect();
    let big = pattern(9 << 20, 5);
    fs::write(m.p("big"), &big).unwrap();
    want.push(("big".to_string(), big));
    let log = fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("small files, packed together"), "{log}");
    // The big file's bytes are in the bucket already, and nothing of them is staged: what is
    // staged is packs (raw files while they fill, or sealed ones waiting to go up). Its
    // slices need not be whole blocks: the kernel's writeback cache (when on) writes
    // the pages back in runs of its own, each a slice (a pack sealed meanwhile may add an
    // object of its own here, which only adds to the sum).
    let len_of = |p: &PathBuf| -> u64 {
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        n.rsplit('_').next().unwrap().parse().unwrap()
    };
    let new: Vec<PathBuf> = vol
        .objects()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    let staged: Vec<String> = staged_files(&vol)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        new.iter().map(len_of).sum::<u64>() >= 9 << 20,
        "{new:?} (staged: {staged:?})"
    );
    assert!(
        staged_files(&vol)
            .iter()
            .all(|p| !p.to_string_lossy().ends_with("_4194304")),
        "{:?}",
        staged_files(&vol)
    );
    m.kill9();
    let m = vol.mount();
    for (name, data) in &want {
        assert_eq!(&fs::read(m.p(name)).unwrap(), data, "{name}");
    }
    m.unmount();
    assert!(staged_files(&vol).is_empty(), "{:?}", staged_files(&vol));
    // 300 small files went up in a few packs, not one object each.
    assert!(
        vol.objects().len() < 300 / 10,
        "{} objects: {:?}",
        vol.objects().len(),
        vol.objects()
    );
    fsck_clean(&vol);
}

/// 4 KiB `O_SYNC` writes, each a piece of a staged pack made durable with the engine's own
/// flush (one disk flush per write, see `data::stage`), interleaved over three files so packs
/// hold pieces of each and fill past the first: every byte acknowledged is there after a
/// kill -9 with the store down (nothing went up), read back after the remount, and fsck is
/// clean once it uploaded them.
#[test]
fn o_sync_writes_survive_kill_9_with_the_store_down() {
    use std::os::unix::fs::OpenOptionsExt;
    let (_tmp, down, mut vol) = volume_with_down_switch();
    let m = vol.mount();
    File::create(&down).unwrap();
    let mut files: Vec<File> = (0..3)
        .map(|i| {
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .custom_flags(libc::O_SYNC)
                .open(m.p(&format!("s{i}")))
                .unwrap()
        })
        .collect();
    let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // 300 writes, 1.2 MiB: several packs (the first is 64 KiB, each next one twice as large).
    for round in 0..100u64 {
        for (i, f) in files.iter_mut().enumerate() {
            let piece = pattern(4096, round * 3 + i as u64 + 1);
            f.write_all(&piece).unwrap();
            want.entry(format!("s{i}")).or_default().extend(&piece);
        }
    }
    assert!(vol.objects().is_empty(), "{:?}", vol.objects());
    assert!(!staged_files(&vol).is_empty());
    // Killed with the descriptors open: no close, no flush.
    m.kill9();
    drop(files);
    fs::remove_file(&down).unwrap();
    without_faults(&mut vol);
    let m = vol.mount();
    for (name, data) in &want {
        let got = fs::read(m.p(name)).unwrap();
        assert_eq!(got.len(), data.len(), "{name}");
        let first = got.iter().zip(data).position(|(a, b)| a != b);
        assert_eq!(first, None, "{name}: first byte lost");
    }
    m.unmount();
    assert!(staged_files(&vol).is_empty(), "{:?}", staged_files(&vol));
    fsck_clean(&vol);
}

/// Blocks a killed client left staged are found by `fsck` (not missing) and uploaded by
/// `fsck --repair`, for a volume nobody mounts again.
#[test]
fn fsck_repair_uploads_what_a_killed_client_left_staged() {
    let (tmp, down, mut vol) = volume_with_down_switch();
    let m = vol.mount();
    File::create(&down).unwrap();
    let data = pattern(500_000, 77);
    let mut f = File::create(m.p("kept")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.kill9();
    fs::remove_file(&down).unwrap();
    without_faults(&mut vol);
    assert!(!staged_files(&vol).is_empty());
    let (ok, out, err) = vol.cmd("fsck", &["--quiet"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("staged for upload"), "{out}");
    let (ok, out, err) = vol.cmd("fsck", &["--quiet", "--repair"]);
    assert!(ok, "{out}{err}");
    assert!(staged_files(&vol).is_empty(), "{:?}", staged_files(&vol));
    assert!(!vol.objects().is_empty());
    // Read back with a mount whose cache directory is elsewhere: it comes from the bucket.
    let mut moved = vol;
    moved.env.push((
        "UNKAI_CACHE_DIR".into(),
        tmp.path().join("c2").display().to_string(),
    ));
    let m = moved.mount();
    assert_eq!(fs::read(m.p("kept")).unwrap(), data);
    m.unmount();
}

/// On a PostgreSQL volume, close waits for the store (write-back is off by default): a second
/// client that opens the file after the close reads the new data, even from a slow store.
#[test]
fn close_to_open_holds_across_postgres_clients() {
    let Some(mut vol) = Volume::postgres(&[], |u| u.to_string(), Vec::new()) else {
        eprintln!("skipped: UNKAI_TEST_POSTGRES is unset");
        return;
    };
    vol.env
        .push(("UNKAI_FAULTS".into(), "latency_ms=20".into()));
    let a = vol.mount();
    let b = vol.mount();
    assert!(a.log_text().contains("write-back off"), "{}", a.log_text());
    for i in 0..5u64 {
        let data = pattern(100_000 + i as usize * 1000, 500 + i);
        fs::write(a.p("shared"), &data).unwrap();
        assert_eq!(fs::read(b.p("shared")).unwrap(), data, "round {i}");
    }
    b.unmount();
    a.unmount();
}

/// A staging area deleted under a running mount: the log says which block is lost, the file
/// holding it reads as EIO after a remount (never wrong bytes), and fsck names it.
#[test]
fn a_staging_area_deleted_under_the_mount_is_named_not_hidden() {
    let (_tmp, down, mut vol) = volume_with_down_switch();
    let m = vol.mount();
    fs::write(m.p("safe"), pattern(50_000, 1)).unwrap();
    assert!(
        eventually(Duration::from_secs(60), || staged_files(&vol).is_empty()),
        "the first file was not uploaded"
    );
    File::create(&down).unwrap();
    fs::write(m.p("doomed"), pattern(50_000, 2)).unwrap();
    assert!(!staged_files(&vol).is_empty());
    fs::remove_dir_all(cache_dir(&vol)).unwrap();
    // The store is down: the log cannot say the bucket lacks the block, and says so.
    assert!(
        eventually(Duration::from_secs(60), || m
            .log_text()
            .contains("whether the bucket has it is unknown")),
        "the lost block was not reported:\n{}",
        tail(&m.log_text(), 20)
    );
    fs::remove_file(&down).unwrap();
    m.unmount();
    without_faults(&mut vol);
    let m = vol.mount();
    assert_eq!(fs::read(m.p("safe")).unwrap(), pattern(50_000, 1));
    let err = fs::read(m.p("doomed")).expect_err("a lost block read as data");
    assert_eq!(errno(&err), libc::EIO, "{err}");
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &["--quiet"]);
    assert!(!ok, "fsck found nothing: {out}");
    assert!(
        out.contains("/doomed") && out.contains("missing"),
        "{out}{err}"
    );
}
