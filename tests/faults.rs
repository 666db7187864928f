//! Robustness against a misbehaving object store, on a real S3 server (versitygw) with faults
//! injected into every request of the unkai processes (`UNKAI_FAULTS`, see
//! `src/object/faulty.rs`):
//!
//! 1. transient failures (errors, 503 SlowDown, latency) are hidden by the retry policy;
//! 2. a read never returns wrong bytes: truncated or corrupted answers are fetched again, and
//!    a block that stays damaged (flipped byte in the server's own storage) fails with EIO;
//! 3. while the store is down, operations needing it fail with EIO once the retry budget is
//!    spent (they do not hang), nothing fsynced is lost, the volume stays consistent, and the
//!    same mount works again as soon as the store is back;
//! 4. a crash (SIGKILL) while the store is flaky loses nothing fsynced, and fsck and gc leave
//!    a clean volume.
//!
//! Faults are added to `Volume::env`, so every unkai command of the volume started while they
//! are set (mounts, fsck, gc) sees them; commands run after they are removed see a healthy
//! store. Verification (final remounts, fsck, gc) runs without faults.
//!
//! Rates: a request fails for good only if all 6 attempts of the default retry policy fail.
//! With `error=0.1,slowdown=0.1` an attempt fails with probability 0.19, a request with
//! 0.19^6 ≈ 5e-5; the workloads below make a few hundred requests, so a spurious EIO from an
//! exhausted budget is possible but rare (≈0.5% of runs). Such a failure shows in the mount
//! log as "failed after 6 attempts".

use crate::common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Transient failures: ~19% of attempts fail (reset connections and 503 SlowDown), every
/// attempt takes 2 ms longer.
const TRANSIENT: &str = "error=0.1,slowdown=0.1,latency_ms=2";

/// Logs every retry (`retry::run` logs them at debug level), so tests can see that faults
/// were injected and hidden.
const RETRY_LOG: &str = "info,unkai::object::retry=debug";

// ---------------------------------------------------------------------------------------------
// Helpers

/// A volume on a fresh versitygw bucket, formatted without faults.
/// Close and fsync wait for the store on it (`--writeback off`): these tests are about what
/// a failing store does to the application; tests/writeback.rs covers staging.
fn s3_volume(server: &servers::Server, block_size: &str) -> Volume {
    let mut env = server.env.clone();
    env.push(("UNKAI_WRITEBACK".into(), "off".into()));
    Volume::with_env(
        &["--storage", &server.storage, "--block-size", block_size],
        env,
    )
}

/// Sets (or with `None` removes) the faults of every later command of `vol`.
fn set_faults(vol: &mut Volume, spec: Option<&str>) {
    vol.env
        .retain(|(k, _)| k != "UNKAI_FAULTS" && k != "UNKAI_LOG");
    if let Some(spec) = spec {
        vol.env.push(("UNKAI_FAULTS".into(), spec.into()));
        vol.env.push(("UNKAI_LOG".into(), RETRY_LOG.into()));
    }
}

/// The mount log of `vol` (all mounts append to it) from byte `from`.
fn mount_log(vol: &Volume, from: usize) -> String {
    let all = fs::read(vol.dir.path().join("mount.log")).unwrap_or_default();
    String::from_utf8_lossy(&all[from.min(all.len())..]).into_owned()
}

fn mount_log_len(vol: &Volume) -> usize {
    fs::metadata(vol.dir.path().join("mount.log")).map_or(0, |m| m.len() as usize)
}

/// Runs a test body; if it panics, prints the end of the mount log first (it lives in a
/// temporary directory that is gone afterwards).
fn show_log_on_panic<R>(log: &Path, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(e) => {
            let text = fs::read_to_string(log).unwrap_or_default();
            eprintln!("--- end of the mount log ---\n{}", tail(&text, 40));
            std::panic::resume_unwind(e)
        }
    }
}

/// Runs fsck; says what is wrong unless the volume is consistent (exit 0, no ERROR line)
/// and, with `no_leaks`, has no LEAKED line either.
fn fsck_problem(vol: &Volume, when: &str, no_leaks: bool) -> Option<String> {
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    let errors = out.lines().any(|l| l.starts_with("ERROR"));
    let leaks = out.lines().any(|l| l.starts_with("LEAKED"));
    (!ok || errors || (no_leaks && leaks)).then(|| format!("fsck {when}: exit ok={ok}\n{out}{err}"))
}

/// Runs fsck; panics unless the volume is consistent (exit 0, no ERROR line) and, with
/// `no_leaks`, has no LEAKED line either.
fn assert_fsck(vol: &Volume, when: &str, no_leaks: bool) {
    if let Some(p) = fsck_problem(vol, when, no_leaks) {
        panic!("{p}");
    }
}

fn write_fsync(path: &Path, data: &[u8]) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    f.sync_all()
        .unwrap_or_else(|e| panic!("fsync {}: {e}", path.display()));
}

/// Where two byte strings first differ, for messages.
fn first_diff(got: &[u8], want: &[u8]) -> String {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => format!("first difference at byte {i}"),
        None => "one is a prefix of the other".into(),
    }
}

fn assert_content(path: &Path, want: &[u8]) {
    let got = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        got == want,
        "{}: {} bytes read, {} expected; {}",
        path.display(),
        got.len(),
        want.len(),
        first_diff(&got, want)
    );
}

/// Every file under `root` (relative paths), directories aside.
fn files_under(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// Checks that the mount holds exactly the files of `model`, byte for byte.
fn assert_model(m: &Mount, model: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in model {
        assert_content(&m.p(name), data);
    }
    let names: BTreeSet<String> = model.keys().cloned().collect();
    assert_eq!(files_under(&m.path), names, "the files of the volume");
}

/// Reads `want.len()` bytes at `off` (pread, as many calls as it takes). Every byte returned
/// must be the expected one: a wrong byte, or an end of file before the end, panics. Returns
/// the first error.
fn checked_pread(f: &File, what: &str, off: u64, want: &[u8]) -> io::Result<()> {
    let mut buf = vec![0u8; want.len()];
    let mut done = 0;
    while done < want.len() {
        let n = f.read_at(&mut buf[done..], off + done as u64)?;
        assert!(
            n > 0,
            "{what}: end of file at {} (expected {} more bytes)",
            off + done as u64,
            want.len() - done
        );
        assert!(
            buf[done..done + n] == want[done..done + n],
            "{what}: WRONG BYTES returned by pread({}, {}) at offset {}: {}",
            off + done as u64,
            want.len() - done,
            off,
            first_diff(&buf[done..done + n], &want[done..done + n])
        );
        done += n;
    }
    Ok(())
}

/// Reads a whole file sequentially (read(2) until end of file). Every byte returned must be
/// the expected one and the file must end where expected. Returns the first error.
fn checked_read_all(f: &mut File, what: &str, want: &[u8]) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0usize;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            assert_eq!(pos, want.len(), "{what}: end of file too early");
            return Ok(());
        }
        assert!(
            pos + n <= want.len(),
            "{what}: read past the end ({} bytes)",
            pos + n
        );
        assert!(
            buf[..n] == want[pos..pos + n],
            "{what}: WRONG BYTES returned by read at offset {pos}: {}",
            first_diff(&buf[..n], &want[pos..pos + n])
        );
        pos += n;
    }
}

/// The only acceptable failure of a read from a store that misbehaves.
fn assert_eio(e: &io::Error, what: &str) {
    assert_eq!(errno(e), libc::EIO, "{what}: expected EIO, got {e}");
}

/// Runs `f` on a thread of its own and waits for it at most a minute: an operation on a
/// store that is down must end (with an error) once the retry budget is spent, not hang.
/// Returns its result and how long it took (reported, not asserted).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> (T, Duration) {
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(v) => (v, start.elapsed()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still blocked after 60 s with the store down")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked (see above)"),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Transient failures

#[test]
fn transient_failures_are_hidden_by_retries() {
    let server = servers::s3("faults-transient");
    let mut vol = s3_volume(&server, "256K");
    let log = vol.dir.path().join("mount.log");
    show_log_on_panic(&log, || {
        set_faults(&mut vol, Some(TRANSIENT));
        let log_start = mount_log_len(&vol);
        let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();

        // Writes of every shape: empty, tiny, a block exactly, a block and a byte, many blocks.
        let m = vol.mount();
        fs::create_dir(m.p("d")).unwrap();
        let sizes = [
            0usize, 1, 4096, 100_000, 262_144, 262_145, 700_000, 1_300_000,
        ];
        for (i, &n) in sizes.iter().enumerate() {
            let name = format!("f{i}");
            let data = pattern(n, i as u64 + 1);
            write_fsync(&m.p(&name), &data);
            model.insert(name, data);
        }
        for i in 0..4usize {
            let name = format!("d/g{i}");
            let data = pattern(50_000 * i + 7, 100 + i as u64);
            write_fsync(&m.p(&name), &data);
            model.insert(name, data);
        }
        // Overwrites: inside a file, across a block boundary, and extending a file.
        for (name, off, len, seed) in [
            ("f6", 1000u64, 5000usize, 201u64),
            ("f7", 262_000, 300_000, 202),
            ("f5", 262_000, 100_000, 203),
        ] {
            let patch = pattern(len, seed);
            let f = OpenOptions::new().write(true).open(m.p(name)).unwrap();
            f.write_all_at(&patch, off).unwrap();
            f.sync_all().unwrap();
            let d = model.get_mut(name).unwrap();
            let end = off as usize + len;
            if d.len() < end {
                d.resize(end, 0);
            }
            d[off as usize..end].copy_from_slice(&patch);
        }
        assert_model(&m, &model);
        m.unmount();

        // A fresh mount has empty caches: every read goes to the flaky store.
        let m = vol.mount();
        assert_model(&m, &model);
        // Renames (one replacing a file, whose blocks then die), deletes, truncation, appends.
        fs::rename(m.p("f1"), m.p("d/f1")).unwrap();
        let v = model.remove("f1").unwrap();
        model.insert("d/f1".into(), v);
        fs::rename(m.p("f2"), m.p("f3")).unwrap();
        let v = model.remove("f2").unwrap();
        model.insert("f3".into(), v);
        fs::remove_file(m.p("f4")).unwrap();
        model.remove("f4");
        fs::remove_file(m.p("d/g0")).unwrap();
        model.remove("d/g0");
        {
            let f = OpenOptions::new().write(true).open(m.p("f7")).unwrap();
            f.set_len(500_000).unwrap();
            f.sync_all().unwrap();
            model.get_mut("f7").unwrap().truncate(500_000);
        }
        {
            let mut f = OpenOptions::new().append(true).open(m.p("f6")).unwrap();
            let more = pattern(400_000, 300);
            f.write_all(&more).unwrap();
            f.sync_all().unwrap();
            model.get_mut("f6").unwrap().extend_from_slice(&more);
        }
        File::open(m.p("d")).unwrap().sync_all().unwrap();
        File::open(&m.path).unwrap().sync_all().unwrap();
        assert_model(&m, &model);
        m.unmount();

        let log = mount_log(&vol, log_start);
        let retries = log.matches("failed (attempt").count();
        eprintln!("transient: {retries} failed attempts were retried");
        assert!(
            retries >= 3,
            "with ~19% of attempts failing, the workload should have retried many requests; the \
         mount log shows {retries} retries (are faults injected?):\n{}",
            tail(&log, 30)
        );
        assert!(
            !log.contains("I/O error") && !log.contains("failed after"),
            "a transient failure reached an application:\n{}",
            tail(&log, 30)
        );

        // The same files on a healthy store, after a remount.
        set_faults(&mut vol, None);
        let m = vol.mount();
        assert_model(&m, &model);
        m.unmount();
        assert_fsck(&vol, "after the flaky workload", false);
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Damaged reads

/// Sets read faults with the first seed whose first draws leave the probe object alone: the
/// mount (like `gc`) proves the store usable by reading back a probe, and a truncated probe
/// fails it. Faults are drawn from an RNG seeded per process, so `gc` (whose first read is
/// the same probe) tells whether a mount with the seed will start.
fn set_read_faults(vol: &mut Volume, spec: &str) -> String {
    for seed in 1..100 {
        let s = format!("{spec},seed={seed}");
        set_faults(vol, Some(&s));
        let (ok, _, err) = vol.cmd("gc", &["-q"]);
        if ok {
            return s;
        }
        assert!(
            err.contains("probe"),
            "gc failed for another reason than the probe: {err}"
        );
    }
    panic!("no seed lets the probe through {spec}");
}

#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    eio: usize,
}

/// Reads every file in whole and at random ranges, each read on a fresh open (the mount runs
/// with `--no-keep-cache` and no block cache, so every read goes to the store). Each read
/// returns exactly the right bytes or fails with EIO.
fn read_mix(m: &Mount, files: &[(String, Vec<u8>)], rounds: usize, rng: &mut StdRng) -> Tally {
    let mut t = Tally::default();
    let mut count = |res: io::Result<()>, what: &str| match res {
        Ok(()) => t.ok += 1,
        Err(e) => {
            assert_eio(&e, what);
            t.eio += 1
        }
    };
    for _ in 0..rounds {
        for (name, data) in files {
            let mut f = File::open(m.p(name)).unwrap();
            count(
                checked_read_all(&mut f, &format!("read {name}"), data),
                name,
            );
            let f = File::open(m.p(name)).unwrap();
            for _ in 0..2 {
                let off = rng.random_range(0..data.len());
                let len = rng.random_range(1..=(data.len() - off).min(200_000));
                let what = format!("pread {name} [{off}, +{len})");
                count(
                    checked_pread(&f, &what, off as u64, &data[off..off + len]),
                    &what,
                );
            }
        }
    }
    t
}

/// Object files of the volume in versitygw's posix storage.
fn stored_blocks(server: &servers::Server, vol: &Volume) -> BTreeSet<PathBuf> {
    fn walk(d: &Path, out: &mut BTreeSet<PathBuf>) {
        if let Ok(rd) = fs::read_dir(d) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    let parts: Vec<&str> = name.split('_').collect();
                    if parts.len() == 3 && parts.iter().all(|s| s.parse::<u64>().is_ok()) {
                        out.insert(p);
                    }
                }
            }
        }
    }
    // s3://BUCKET/PREFIX is stored under root/BUCKET/PREFIX.
    let bucket_and_prefix = server.storage.strip_prefix("s3://").unwrap();
    let root = server
        .dir
        .path()
        .join("root")
        .join(bucket_and_prefix)
        .join(&vol.name);
    let mut out = BTreeSet::new();
    walk(&root, &mut out);
    out
}

#[test]
fn reads_never_return_wrong_bytes() {
    let server = servers::s3("faults-damage");
    let mut vol = s3_volume(&server, "256K");
    let log = vol.dir.path().join("mount.log");
    show_log_on_panic(&log, || {
        // Files of several blocks (256 KiB, checksummed per 4 KiB), written on a healthy store.
        let files: Vec<(String, Vec<u8>)> = [
            ("a", 1_048_576 + 5),
            ("b", 700_000),
            ("c", 65_536),
            ("d", 3000),
        ]
        .iter()
        .enumerate()
        .map(|(i, (n, len))| (n.to_string(), pattern(*len, 40 + i as u64)))
        .collect();
        let m = vol.mount();
        for (name, data) in &files {
            write_fsync(&m.p(name), data);
        }
        m.unmount();
        let mut rng = StdRng::seed_from_u64(7);
        let uncached = [
            "--memory-cache-size",
            "0",
            "--cache-size",
            "0",
            "--no-keep-cache",
        ];

        // Heavy damage: about half the answers are cut short or have a flipped byte. Many reads
        // fail, none returns a wrong byte.
        let spec = set_read_faults(&mut vol, "truncate=0.3,corrupt=0.3");
        let from = mount_log_len(&vol);
        let m = vol.mount_with(&uncached);
        let heavy = read_mix(&m, &files, 4, &mut rng);
        m.unmount();
        let log = mount_log(&vol, from);
        eprintln!("heavy damage ({spec}): {heavy:?}");
        assert!(
            heavy.eio > 0 && heavy.ok > 0,
            "with ~half the answers damaged, some reads should fail and some succeed: {heavy:?}"
        );
        assert!(
            log.contains("is damaged in the bucket"),
            "the mount log should say which block was damaged:\n{}",
            tail(&log, 20)
        );
        // Both ways of reading were checked: whole blocks (sequential reads) and verified
        // segment ranges (small random reads).
        let whole = log
            .lines()
            .filter(|l| l.contains("failed verification") && l.contains("checksums on"))
            .count();
        let ranges = log
            .lines()
            .filter(|l| l.contains("failed verification (range"))
            .count();
        eprintln!("heavy damage: refetched {whole} whole blocks and {ranges} ranges");
        assert!(
            whole > 0 && ranges > 0,
            "damaged whole-block reads ({whole}) and damaged range reads ({ranges}) should both \
         have been caught:\n{}",
            tail(&log, 20)
        );

        // Moderate damage: fetching a damaged block again makes nearly every read succeed.
        let spec = set_read_faults(&mut vol, "truncate=0.05,corrupt=0.02");
        let from = mount_log_len(&vol);
        let m = vol.mount_with(&uncached);
        let moderate = read_mix(&m, &files, 6, &mut rng);
        m.unmount();
        let log = mount_log(&vol, from);
        let refetched = log.matches("fetching it again").count();
        eprintln!("moderate damage ({spec}): {moderate:?}, {refetched} blocks fetched again");
        assert!(
            refetched > 0,
            "no block was fetched again: were faults injected?\n{}",
            tail(&log, 20)
        );
        assert!(
            moderate.eio * 10 <= moderate.ok + moderate.eio,
            "refetching should make at least 90% of the reads succeed: {moderate:?}\n{}",
            tail(&log, 20)
        );

        // A block damaged in the store itself: a byte flipped in its object file. Blocks are
        // immutable, so the volume cannot repair it; reads covering it fail with EIO and the log
        // names it, the other blocks of the file stay readable.
        set_faults(&mut vol, None);
        let before = stored_blocks(&server, &vol);
        let victim = pattern(3 * 262_144 + 1000, 99);
        let m = vol.mount();
        write_fsync(&m.p("victim"), &victim);
        m.unmount();
        let new: Vec<PathBuf> = stored_blocks(&server, &vol)
            .difference(&before)
            .cloned()
            .collect();
        assert_eq!(new.len(), 4, "the blocks of 'victim': {new:?}");
        let damaged = new
            .iter()
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.split('_').nth(1) == Some("1")
            })
            .expect("block 1 of 'victim'")
            .clone();
        let block_name = damaged.file_name().unwrap().to_string_lossy().into_owned();
        let flip_at = 100_000u64; // in the 25th 4 KiB segment of the block
        {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&damaged)
                .unwrap();
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, flip_at).unwrap();
            b[0] ^= 0x01;
            f.write_all_at(&b, flip_at).unwrap();
        }
        let from = mount_log_len(&vol);
        let m = vol.mount(); // fresh caches
        let f = File::open(m.p("victim")).unwrap();
        let bs = 262_144usize;
        // Blocks 0, 2 and 3 are intact.
        for (off, len) in [(0usize, bs), (2 * bs, bs), (3 * bs, 1000)] {
            let what = format!("pread victim [{off}, +{len})");
            checked_pread(&f, &what, off as u64, &victim[off..off + len])
                .unwrap_or_else(|e| panic!("{what}: {e} (an intact block)"));
        }
        drop(f);
        // A small read around the flipped byte, then the whole block.
        let at = bs + flip_at as usize - 10;
        for (off, len) in [(at, 20), (bs, bs)] {
            let f = File::open(m.p("victim")).unwrap();
            let what = format!("pread victim [{off}, +{len})");
            match checked_pread(&f, &what, off as u64, &victim[off..off + len]) {
                Ok(()) => panic!("{what}: read succeeded over a damaged block"),
                Err(e) => assert_eio(&e, &what),
            }
        }
        let mut f = File::open(m.p("victim")).unwrap();
        match checked_read_all(&mut f, "read victim", &victim) {
            Ok(()) => panic!("reading the whole of 'victim' succeeded over a damaged block"),
            Err(e) => assert_eio(&e, "read victim"),
        }
        drop(f);
        m.unmount();
        let log = mount_log(&vol, from);
        assert!(
            log.lines()
                .any(|l| l.contains("is damaged in the bucket") && l.contains(&block_name)),
            "the mount log should name the damaged block {block_name}:\n{}",
            tail(&log, 20)
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 3. The store is down

#[test]
fn outage_fails_with_eio_then_recovers_in_the_same_mount() {
    let server = servers::s3("faults-outage");
    let mut vol = s3_volume(&server, "1M");
    let log = vol.dir.path().join("mount.log");
    show_log_on_panic(&log, || {
        let down = vol.dir.path().join("store-is-down");
        set_faults(&mut vol, Some(&format!("down_file={}", down.display())));

        // Before the outage: fsynced files, then a fresh mount (empty caches).
        let a = pattern(2_500_000, 1);
        let b = pattern(70_000, 2);
        let c = pattern(1_200_000, 3);
        let d_old = pattern(1_500_000, 4);
        let m = vol.mount();
        for (name, data) in [("a", &a), ("b", &b), ("c", &c), ("d", &d_old)] {
            write_fsync(&m.p(name), data);
        }
        m.unmount();
        let from = mount_log_len(&vol);
        let m = vol.mount();
        let mp = m.path.clone();

        // A blip: the store is down until unkai has noticed (one failed attempt of an upload
        // of an fsync); the retries that follow hide it.
        let blip = pattern(600_000, 8);
        fs::write(&down, b"").unwrap();
        let (p, data) = (mp.join("blip"), blip.clone());
        let fsync = std::thread::spawn(move || -> io::Result<()> {
            let mut f = File::create(p)?;
            f.write_all(&data)?;
            f.sync_all()
        });
        let start = Instant::now();
        while !mount_log(&vol, from).contains("store is down (Put)") {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the fsync of 'blip' made no request to the store"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        fs::remove_file(&down).unwrap();
        fsync
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("an outage of one failed attempt reached fsync: {e}"));
        assert_content(&mp.join("blip"), &blip);

        // The outage.
        fs::write(&down, b"").unwrap();
        let mut timings = Vec::new();

        // Reads of data not cached need the store.
        let p = mp.join("a");
        let (res, t) = bounded("read a", move || fs::read(p));
        timings.push(("read a", t));
        match res {
            Ok(_) => panic!("read a succeeded with the store down (and nothing cached)"),
            Err(e) => assert_eio(&e, "read a"),
        }
        let p = mp.join("b");
        let (res, t) = bounded("pread b", move || {
            let f = File::open(p)?;
            let mut buf = vec![0u8; 1000];
            f.read_exact_at(&mut buf, 5000)
        });
        timings.push(("pread b", t));
        match res {
            Ok(()) => panic!("pread b succeeded with the store down"),
            Err(e) => assert_eio(&e, "pread b"),
        }

        // A new file: writes are buffered, fsync needs the store.
        let n_data = pattern(1_500_000, 5);
        let p = mp.join("n");
        let nd = n_data.clone();
        let (res, t) = bounded("write+fsync n", move || {
            let mut f = File::create(p)?;
            f.write_all(&nd)?;
            let r = f.sync_all();
            // close(2) flushes again; it may fail as well: only EIO is acceptable.
            let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
            let c = nix::unistd::close(fd);
            Ok::<_, io::Error>((r, c))
        });
        timings.push(("write+fsync+close n", t));
        match res {
            Ok((Err(e), close)) => {
                assert_eio(&e, "fsync n");
                if let Err(c) = close {
                    assert_eq!(c, nix::errno::Errno::EIO, "close n");
                }
            }
            Ok((Ok(()), _)) => panic!("fsync of a new file succeeded with the store down"),
            Err(e) => assert_eio(&e, "write n"),
        }

        // An overwrite of a fsynced file, whose fsync fails: the file must end up with its old
        // content or the new one, never a mix.
        let patch = pattern(300_000, 6);
        let mut d_new = d_old.clone();
        d_new[900_000..1_200_000].copy_from_slice(&patch);
        let p = mp.join("d");
        let (res, t) = bounded("overwrite+fsync d", move || {
            let f = OpenOptions::new().write(true).open(p)?;
            f.write_all_at(&patch, 900_000)?;
            f.sync_all()
        });
        timings.push(("overwrite+fsync d", t));
        match res {
            Ok(()) => panic!("fsync of an overwrite succeeded with the store down"),
            Err(e) => assert_eio(&e, "overwrite+fsync d"),
        }

        // The namespace lives in the metadata engine: it needs no store.
        let p = mp.clone();
        type Op = Box<dyn FnOnce() -> io::Result<()> + Send>;
        let ops: Vec<(&str, Op)> = vec![
            (
                "mkdir",
                Box::new({
                    let p = p.clone();
                    move || fs::create_dir(p.join("dir"))
                }),
            ),
            (
                "rename",
                Box::new({
                    let p = p.clone();
                    move || fs::rename(p.join("b"), p.join("dir/b2"))
                }),
            ),
            (
                "unlink",
                Box::new({
                    let p = p.clone();
                    move || fs::remove_file(p.join("c"))
                }),
            ),
            (
                "symlink",
                Box::new({
                    let p = p.clone();
                    move || std::os::unix::fs::symlink("dir/b2", p.join("link"))
                }),
            ),
            (
                "stat",
                Box::new({
                    let p = p.clone();
                    move || {
                        assert_eq!(fs::metadata(p.join("a"))?.len(), 2_500_000);
                        Ok(())
                    }
                }),
            ),
            (
                "readdir",
                Box::new({
                    let p = p.clone();
                    move || {
                        let names: BTreeSet<String> = fs::read_dir(&p)?
                            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                            .collect::<io::Result<_>>()?;
                        let want: BTreeSet<String> = ["a", "blip", "d", "dir", "link", "n"]
                            .iter()
                            .map(|s| s.to_string())
                            .collect();
                        assert_eq!(names, want, "the root directory during the outage");
                        Ok(())
                    }
                }),
            ),
            ("fsyncdir", Box::new(move || File::open(&p)?.sync_all())),
        ];
        for (what, op) in ops {
            let (res, t) = bounded(what, op);
            timings.push((what, t));
            res.unwrap_or_else(|e| panic!("{what} failed with the store down: {e}"));
        }

        // The metadata is consistent during the outage (objects cannot be checked).
        let (ok, out, err) = vol.cmd("fsck", &["-q", "--skip-objects"]);
        assert!(ok, "fsck --skip-objects during the outage:\n{out}{err}");

        // A writer that keeps its descriptor through the outage: its fsync fails, the upload
        // is started again in the background and fails again (the store is still down).
        let s_old = pattern(777, 12);
        let mut s_file = File::create(mp.join("s")).unwrap();
        s_file.write_all(&s_old).unwrap();
        let ((s_back, res), t) = bounded("fsync s", move || {
            let r = s_file.sync_all();
            (s_file, r)
        });
        let s_file = s_back;
        timings.push(("fsync s", t));
        match res {
            Ok(()) => panic!("fsync of s succeeded with the store down"),
            Err(e) => assert_eio(&e, "fsync s"),
        }
        let start = Instant::now();
        while mount_log(&vol, from).matches("_0_777 failed after").count() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the upload of s was not tried again in the background:\n{}",
                tail(&mount_log(&vol, from), 20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }

        eprintln!("outage: {timings:?}");

        // The store is back: the same mount works again.
        fs::remove_file(&down).unwrap();
        // The descriptor of s too: what it writes now and fsyncs is durable; what it wrote
        // before the failed fsync is there or not (a hole), not damaged. Problems found here
        // are reported at the end, after the other checks.
        let mut problems: Vec<String> = Vec::new();
        let s_more = pattern(5000, 13);
        let check_s = |got: io::Result<Vec<u8>>, when: &str| -> Result<Vec<u8>, String> {
            let got = got.map_err(|e| format!("s {when}: fsynced, but reading it fails: {e}"))?;
            if got.len() != 777 + 5000
                || !(got[..777] == s_old[..] || got[..777].iter().all(|&b| b == 0))
                || got[777..] != s_more[..]
            {
                return Err(format!(
                    "s {when}: {} bytes, expected 777 (old or zeros) + 5000 (fsynced)",
                    got.len()
                ));
            }
            Ok(got)
        };
        let got_s = (|| -> Result<Vec<u8>, String> {
            // The first write may report the background retry that failed during the outage
            // (EIO, once); written again, it must succeed.
            match s_file.write_all_at(&s_more, 777) {
                Ok(()) => eprintln!("outage: the first write of s after the store came back: ok"),
                Err(e) if errno(&e) == libc::EIO => eprintln!(
                    "outage: the first write of s after the store came back reports the failed \
                     background retry: {e}"
                ),
                Err(e) => return Err(format!("write s after the store came back: {e}")),
            }
            s_file
                .write_all_at(&s_more, 777)
                .map_err(|e| format!("write s again after the store came back: {e}"))?;
            s_file
                .sync_all()
                .map_err(|e| format!("fsync s after the store came back: {e}"))?;
            check_s(fs::read(mp.join("s")), "after the store came back")
        })();
        drop(s_file);
        if let Err(p) = &got_s {
            problems.push(p.clone());
        }
        assert_content(&mp.join("a"), &a);
        assert_content(&mp.join("dir/b2"), &b);
        let got_d = fs::read(mp.join("d")).unwrap();
        assert!(
            got_d == d_old || got_d == d_new,
            "d after the outage: neither its old nor its new content ({} bytes; vs old: {}; vs new: {})",
            got_d.len(),
            first_diff(&got_d, &d_old),
            first_diff(&got_d, &d_new)
        );
        let got_n = fs::read(mp.join("n")).unwrap();
        assert!(
            got_n.is_empty() || got_n == n_data,
            "n after the outage: neither empty nor what was written ({} bytes)",
            got_n.len()
        );
        let w = pattern(2_100_000, 7);
        write_fsync(&mp.join("w"), &w);
        assert_content(&mp.join("w"), &w);
        // The writes whose fsync failed can be made durable now.
        for name in ["n", "d"] {
            OpenOptions::new()
                .write(true)
                .open(mp.join(name))
                .unwrap()
                .sync_all()
                .unwrap_or_else(|e| panic!("fsync {name} after the outage: {e}"));
        }
        let got_n = fs::read(mp.join("n")).unwrap();
        let got_d = fs::read(mp.join("d")).unwrap();
        eprintln!(
            "outage: after recovery, n holds {} bytes (written: {}), d holds its {} content",
            got_n.len(),
            n_data.len(),
            if got_d == d_new { "new" } else { "old" }
        );
        m.unmount();
        let log = mount_log(&vol, from);
        assert!(
            log.contains("store is down"),
            "the mount log should show the injected outage:\n{}",
            tail(&log, 20)
        );

        // After a remount on a healthy store: everything fsynced before the outage, and
        // everything written after it, is there.
        set_faults(&mut vol, None);
        let m = vol.mount();
        assert_content(&m.p("a"), &a);
        assert_content(&m.p("dir/b2"), &b);
        assert_content(&m.p("w"), &w);
        assert_content(&m.p("n"), &got_n);
        assert_content(&m.p("d"), &got_d);
        match &got_s {
            Ok(got) => {
                if let Err(p) = check_s(fs::read(m.p("s")), "after a remount") {
                    problems.push(p);
                } else if fs::read(m.p("s")).unwrap() != *got {
                    problems.push("s changed across the remount".into());
                }
            }
            Err(_) => {
                if let Err(p) = check_s(fs::read(m.p("s")), "after a remount") {
                    problems.push(p);
                }
            }
        }
        assert_content(&m.p("blip"), &blip);
        assert!(!m.p("c").exists(), "c was deleted during the outage");
        assert_eq!(fs::read_link(m.p("link")).unwrap(), Path::new("dir/b2"));
        m.unmount();
        problems.extend(fsck_problem(&vol, "after the outage", false));
        let (ok, out, err) = vol.cmd("gc", &["-q", "--delete"]);
        assert!(ok, "gc --delete: {out}{err}");
        problems.extend(fsck_problem(&vol, "after gc --delete", true));
        assert!(
            problems.is_empty(),
            "after the outage:\n{}",
            problems.join("\n")
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 4. A crash while the store is flaky

/// What a writer thread knows to be durable: per file, the fsynced content and, while an
/// overwrite is in flight, the range it may have changed and the new bytes.
#[derive(Clone, Default)]
struct Durable {
    data: Vec<u8>,
    pending: Option<(usize, Vec<u8>)>,
}

type Journal = Arc<Mutex<BTreeMap<String, Durable>>>;

/// Creates, fsyncs and overwrites files until an operation fails (the mount is killed).
/// Returns the error that stopped it.
fn crash_writer(mp: PathBuf, tag: u64, journal: Journal) -> io::Error {
    let mut rng = StdRng::seed_from_u64(tag);
    let mut mine: Vec<String> = Vec::new();
    for i in 0.. {
        let res: io::Result<()> = (|| {
            if mine.is_empty() || rng.random_bool(0.6) {
                let name = format!("t{tag}-{i}");
                let len = match rng.random_range(0..10) {
                    0 => 0,
                    1..4 => rng.random_range(1..5000),
                    _ => rng.random_range(5000..700_000),
                };
                let data = pattern(len, tag * 1000 + i);
                let mut f = File::create(mp.join(&name))?;
                f.write_all(&data)?;
                f.sync_all()?;
                journal.lock().unwrap().insert(
                    name.clone(),
                    Durable {
                        data,
                        pending: None,
                    },
                );
                mine.push(name);
            } else {
                let name = mine[rng.random_range(0..mine.len())].clone();
                let len = journal.lock().unwrap()[&name].data.len();
                if len == 0 {
                    return Ok(());
                }
                let off = rng.random_range(0..len);
                let n = rng.random_range(1..=(len - off).min(300_000));
                let patch = pattern(n, tag * 1000 + i + 500_000);
                journal.lock().unwrap().get_mut(&name).unwrap().pending =
                    Some((off, patch.clone()));
                let f = OpenOptions::new().write(true).open(mp.join(&name))?;
                f.write_all_at(&patch, off as u64)?;
                f.sync_all()?;
                let mut j = journal.lock().unwrap();
                let e = j.get_mut(&name).unwrap();
                e.data[off..off + n].copy_from_slice(&patch);
                e.pending = None;
            }
            Ok(())
        })();
        if let Err(e) = res {
            return e;
        }
    }
    unreachable!()
}

#[test]
fn crash_while_flaky_loses_nothing_fsynced() {
    let server = servers::s3("faults-crash");
    let mut vol = s3_volume(&server, "256K");
    let log = vol.dir.path().join("mount.log");
    show_log_on_panic(&log, || {
        set_faults(&mut vol, Some(TRANSIENT));
        let from = mount_log_len(&vol);
        let m = vol.mount();
        let journal: Journal = Arc::default();
        let writers: Vec<_> = (1..=2u64)
            .map(|tag| {
                let (mp, j) = (m.path.clone(), journal.clone());
                std::thread::spawn(move || crash_writer(mp, tag, j))
            })
            .collect();
        // An unfsynced writer too: a big file whose blocks upload while the crash comes.
        let mp = m.path.clone();
        let big = std::thread::spawn(move || {
            if let Ok(mut f) = File::create(mp.join("unsynced")) {
                for i in 0..100 {
                    if f.write_all(&pattern(256 << 10, 9000 + i)).is_err() {
                        return;
                    }
                }
            }
        });
        // Let the writers get going (their progress depends on the machine's load), then crash
        // at a moment that varies from run to run.
        let start = Instant::now();
        while journal.lock().unwrap().len() < 20 && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(rand::random_range(0..500)));
        m.kill9();
        // They stop at the crash (ENOTCONN), or earlier on an exhausted retry budget (EIO).
        let stopped: Vec<String> = writers
            .into_iter()
            .map(|w| w.join().unwrap().to_string())
            .collect();
        big.join().unwrap();
        let log = mount_log(&vol, from);
        let journal = journal.lock().unwrap().clone();
        let retries = log.matches("failed (attempt").count();
        eprintln!(
            "crash: {} files journaled, {retries} retried attempts before the kill; writers \
             stopped by {stopped:?}",
            journal.len()
        );
        assert!(
            journal.len() >= 20,
            "the writers fsynced only {} files in 30 s on the flaky store:\n{}",
            journal.len(),
            tail(&log, 20)
        );
        assert!(
            retries > 0,
            "no request was retried before the crash: were faults injected?"
        );

        set_faults(&mut vol, None);
        assert_fsck(&vol, "of the crashed volume", false);
        let m = vol.mount();
        for (name, d) in &journal {
            let got = fs::read(m.p(name)).unwrap_or_else(|e| panic!("{name}: fsynced, now {e}"));
            assert_eq!(got.len(), d.data.len(), "{name}: length of fsynced file");
            match &d.pending {
                None => assert!(
                    got == d.data,
                    "{name}: fsynced content lost: {}",
                    first_diff(&got, &d.data)
                ),
                // An overwrite in flight: outside its range the fsynced bytes, inside old or new.
                Some((off, patch)) => {
                    for (i, &g) in got.iter().enumerate() {
                        let ok = g == d.data[i]
                            || (i >= *off && i < off + patch.len() && g == patch[i - off]);
                        assert!(
                            ok,
                            "{name}: byte {i} is neither fsynced nor being written (overwrite at \
                         {off}, {} bytes)",
                            patch.len()
                        );
                    }
                }
            }
        }
        m.unmount();
        assert_fsck(&vol, "after remount", false);
        let (ok, out, err) = vol.cmd("gc", &["-q", "--delete"]);
        assert!(ok, "gc --delete: {out}{err}");
        eprintln!("crash: gc --delete: {}", out.trim());
        assert_fsck(&vol, "after gc --delete", true);
    });
}

// ---------------------------------------------------------------------------------------------
// 5. A store that accepts requests and never answers
// ---------------------------------------------------------------------------------------------

/// A hung store (every request waits for an answer that never comes) makes reads and fsync
/// fail with EIO once the deadline set by --io-deadline has passed, instead of blocking for as
/// long as it hangs; the stall is logged once, and so is the recovery.
#[test]
fn a_hung_store_fails_with_eio_at_the_deadline_and_is_logged_once() {
    let server = servers::s3("faults-hung");
    let mut vol = s3_volume(&server, "1M");
    let log = vol.dir.path().join("mount.log");
    show_log_on_panic(&log, || {
        let hang = vol.dir.path().join("store-hangs");
        set_faults(&mut vol, Some(&format!("hang_file={}", hang.display())));
        let a = pattern(2_500_000, 11);
        let m = vol.mount();
        write_fsync(&m.p("a"), &a);
        m.unmount();
        let from = mount_log_len(&vol);
        let m = vol.mount_with(&["--io-timeout", "1", "--io-deadline", "3"]);
        let mp = m.path.clone();

        fs::write(&hang, b"").unwrap();
        let p = mp.join("a");
        let (res, _) = bounded("read a", move || fs::read(p));
        assert_eio(
            &res.expect_err("a read succeeded with a hung store"),
            "read a",
        );
        let p = mp.join("n");
        let (res, _) = bounded("write+fsync n", move || {
            let mut f = File::create(p)?;
            f.write_all(&pattern(1_500_000, 12))?;
            f.sync_all()
        });
        assert_eio(
            &res.expect_err("fsync succeeded with a hung store"),
            "fsync n",
        );
        let text = mount_log(&vol, from);
        assert_eq!(
            text.matches("does not answer").count(),
            1,
            "the stall should be logged once:\n{}",
            tail(&text, 20)
        );

        fs::remove_file(&hang).unwrap();
        assert_content(&mp.join("a"), &a);
        assert!(
            mount_log(&vol, from).contains("answers again"),
            "the recovery was not logged"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 6. What close(2) said failed is not stored later
// ---------------------------------------------------------------------------------------------

/// close(2) reports EIO when the writes cannot be stored (the store is down past the
/// deadline); once the store is back those writes must not appear: an application told they
/// failed would otherwise find them written. A file still open after a failed fsync keeps its
/// writes for a later fsync, which says whether they were stored.
#[test]
fn writes_close_reported_failed_are_never_stored_later() {
    writes_close_reported_failed(&[]);
}

/// With the kernel's writeback cache the written bytes and the size they made are in the
/// kernel's pages, which take no size from unkai: it makes the kernel forget the inode.
#[test]
fn writes_close_reported_failed_are_never_stored_later_with_the_writeback_cache() {
    writes_close_reported_failed(&["--writeback-cache", "on"]);
}

fn writes_close_reported_failed(flags: &[&str]) {
    let server = servers::s3("faults-close");
    let mut vol = s3_volume(&server, "1M");
    let log = vol.dir.path().join("mount.log");
    show_log_on_panic(&log, || {
        let down = vol.dir.path().join("store-is-down");
        set_faults(&mut vol, Some(&format!("down_file={}", down.display())));
        let old = pattern(300_000, 21);
        let m = vol.mount_with(&[&["--io-timeout", "1", "--io-deadline", "3"], flags].concat());
        let mp = m.path.clone();
        write_fsync(&m.p("old"), &old);

        fs::write(&down, b"").unwrap();
        // A new file and an overwrite, each closed while the store is down.
        let (p, q) = (mp.join("new"), mp.join("old"));
        let (res, _) = bounded("write+close", move || {
            let mut f = File::create(p)?;
            f.write_all(&pattern(1_500_000, 22))?;
            let new = nix::unistd::close(std::os::fd::IntoRawFd::into_raw_fd(f));
            let g = OpenOptions::new().write(true).open(q)?;
            g.write_all_at(&pattern(100_000, 23), 50_000)?;
            let over = nix::unistd::close(std::os::fd::IntoRawFd::into_raw_fd(g));
            Ok::<_, io::Error>((new, over))
        });
        let (new, over) = res.expect("writes are buffered while the store is down");
        assert_eq!(new, Err(nix::errno::Errno::EIO), "close of the new file");
        assert_eq!(over, Err(nix::errno::Errno::EIO), "close of the overwrite");
        // A descriptor kept open: its fsync fails; a later fsync decides.
        let mut kept = File::create(mp.join("kept")).unwrap();
        let k = pattern(200_000, 24);
        kept.write_all(&k).unwrap();
        let (kept_back, res) = {
            let ((f, r), _) = bounded("fsync kept", move || {
                let r = kept.sync_all();
                (kept, r)
            });
            (f, r)
        };
        assert_eio(
            &res.expect_err("fsync succeeded with the store down"),
            "fsync kept",
        );

        fs::remove_file(&down).unwrap();
        kept_back
            .sync_all()
            .expect("fsync of the kept descriptor once the store is back");
        drop(kept_back);
        // In this mount (whose kernel cached the pages written) and after a remount.
        assert_eq!(
            fs::read(mp.join("new")).unwrap().len(),
            0,
            "writes close reported failed are visible"
        );
        assert_content(&mp.join("old"), &old);
        m.unmount();
        set_faults(&mut vol, None);
        let m = vol.mount();
        assert_eq!(
            fs::read(m.p("new")).unwrap().len(),
            0,
            "writes close reported failed were stored later"
        );
        assert_content(&m.p("old"), &old);
        assert_content(&m.p("kept"), &k);
    });
}
