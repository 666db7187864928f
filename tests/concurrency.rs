//! Many threads at once through one FUSE mount: different files, different ranges of one file,
//! creates and unlinks racing in one directory. Every result is checked against what each
//! thread wrote.

use crate::common::rng::XorShift;
use crate::common::*;
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Reads a whole file from the file system (not the page cache).
fn read_uncached(p: &Path) -> Vec<u8> {
    let f = File::open(p).unwrap();
    drop_cache(&f);
    let len = f.metadata().unwrap().len() as usize;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

fn file_size(t: usize, i: usize) -> usize {
    // 0 to ~100 KB, some exactly empty, some a page.
    match (t * 50 + i) % 10 {
        0 => 0,
        1 => 4096,
        _ => (t * 50 + i) * 7919 % 100_000,
    }
}

#[test]
fn sixteen_threads_fifty_files_each() {
    let vol = Volume::new();
    let m = vol.mount();
    fs::create_dir(m.p("shared")).unwrap();
    let root = m.path.clone();
    let handles: Vec<_> = (0..16)
        .map(|t| {
            let root = root.clone();
            thread::spawn(move || {
                let own = root.join(format!("t{t}"));
                fs::create_dir(&own).unwrap();
                for i in 0..50 {
                    let data = pattern(file_size(t, i), (t * 1000 + i) as u64);
                    // Half in the thread's own directory, half in one shared directory.
                    let p = if i % 2 == 0 {
                        own.join(format!("f{i}"))
                    } else {
                        root.join("shared").join(format!("t{t}-f{i}"))
                    };
                    let mut f = File::create(&p).unwrap();
                    // Several writes per file, so that writes of threads interleave.
                    for part in data.chunks(16 * 1024) {
                        f.write_all(part).unwrap();
                    }
                    drop(f);
                }
                // Each thread checks its own files.
                for i in (0..50).step_by(2) {
                    let want = pattern(file_size(t, i), (t * 1000 + i) as u64);
                    assert!(
                        read_uncached(&own.join(format!("f{i}"))) == want,
                        "thread {t} file {i}"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }

    let check = |root: &Path| {
        assert_eq!(names(&root.join("shared")).len(), 16 * 25);
        for t in 0..16 {
            assert_eq!(names(&root.join(format!("t{t}"))).len(), 25);
            for i in 0..50 {
                let p = if i % 2 == 0 {
                    root.join(format!("t{t}/f{i}"))
                } else {
                    root.join(format!("shared/t{t}-f{i}"))
                };
                let want = pattern(file_size(t, i), (t * 1000 + i) as u64);
                assert_eq!(fs::metadata(&p).unwrap().len(), want.len() as u64);
                assert!(read_uncached(&p) == want, "{} differs", p.display());
            }
        }
    };
    check(&m.path);
    m.unmount();
    let m = vol.mount();
    check(&m.path);
}

#[test]
fn threads_writing_disjoint_ranges_of_one_file() {
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("shared-file");
    let total = 12 * MIB + 777;
    let stripe = 37_000; // odd-sized, so that stripes straddle the 4 MiB blocks
    let model = Arc::new(pattern(total, 99));
    File::create(&p).unwrap();

    // Phase 1: each thread has its own descriptor and writes every 8th stripe, in a random
    // order.
    let threads = 8;
    let stripes = total.div_ceil(stripe);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (p, model) = (p.clone(), model.clone());
            thread::spawn(move || {
                let f = OpenOptions::new().write(true).open(&p).unwrap();
                let mut mine: Vec<usize> = (0..stripes).filter(|s| s % threads == t).collect();
                let mut rng = XorShift(t as u64 * 7 + 1);
                for i in (1..mine.len()).rev() {
                    mine.swap(i, rng.below(i as u64 + 1) as usize);
                }
                for s in mine {
                    let (a, b) = (s * stripe, ((s + 1) * stripe).min(total));
                    f.write_all_at(&model[a..b], a as u64).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(fs::metadata(&p).unwrap().len(), total as u64);
    assert!(read_uncached(&p) == *model, "phase 1: file differs");

    // Phase 2: one shared descriptor; each thread overwrites its own small, unaligned pieces.
    let mut model2 = (*model).clone();
    let f = Arc::new(OpenOptions::new().write(true).open(&p).unwrap());
    let pieces: Vec<(usize, usize, u64)> = (0..400)
        .map(|i| {
            let off = i * (total / 400) + (i * 131) % 1000;
            (off, 1 + (i * 7919) % 20_000, 5000 + i as u64)
        })
        .collect();
    for &(off, len, seed) in &pieces {
        model2[off..off + len].copy_from_slice(&pattern(len, seed));
    }
    let pieces = Arc::new(pieces);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (f, pieces) = (f.clone(), pieces.clone());
            thread::spawn(move || {
                for &(off, len, seed) in pieces.iter().skip(t).step_by(threads) {
                    f.write_all_at(&pattern(len, seed), off as u64).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    drop(f);
    assert!(read_uncached(&p) == model2, "phase 2: file differs");
    m.unmount();
    let m = vol.mount();
    assert!(
        read_uncached(&m.p("shared-file")) == model2,
        "file differs after remount"
    );
}

#[test]
fn concurrent_create_and_unlink_in_one_directory() {
    let vol = Volume::new();
    let m = vol.mount();
    let d = m.p("d");
    fs::create_dir(&d).unwrap();
    let stop = Arc::new(AtomicBool::new(false));

    // A lister that runs all along: no listing may fail or name an entry twice.
    let lister = {
        let (d, stop) = (d.clone(), stop.clone());
        thread::spawn(move || {
            let mut listings = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut seen = BTreeSet::new();
                for e in fs::read_dir(&d).unwrap() {
                    let n = e.unwrap().file_name();
                    assert!(seen.insert(n.clone()), "{n:?} listed twice");
                }
                listings += 1;
            }
            listings
        })
    };

    // Writers: create t-i, and unlink every file whose number is not a multiple of 3.
    let threads = 8;
    let per = 150;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let d = d.clone();
            thread::spawn(move || {
                for i in 0..per {
                    let p = d.join(format!("t{t}-{i}"));
                    let mut f = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&p)
                        .unwrap();
                    f.write_all(format!("{t}:{i}").as_bytes()).unwrap();
                    drop(f);
                    if i > 0 && (i - 1) % 3 != 0 {
                        fs::remove_file(d.join(format!("t{t}-{}", i - 1))).unwrap();
                    }
                }
                if (per - 1) % 3 != 0 {
                    fs::remove_file(d.join(format!("t{t}-{}", per - 1))).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(lister.join().unwrap() > 0);

    let want: BTreeSet<String> = (0..threads)
        .flat_map(|t| {
            (0..per)
                .filter(|i| i % 3 == 0)
                .map(move |i| format!("t{t}-{i}"))
        })
        .collect();
    assert_eq!(names(&d), want);
    let mut bad = Vec::new();
    for n in &want {
        let (t, i) = n[1..].split_once('-').unwrap();
        let got = fs::read_to_string(d.join(n)).unwrap();
        if got != format!("{t}:{i}") {
            let md = fs::metadata(d.join(n)).unwrap();
            let statx_size = {
                let c = cpath(&d.join(n));
                let mut sx: libc::statx = unsafe { std::mem::zeroed() };
                unsafe {
                    libc::statx(
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        libc::AT_STATX_FORCE_SYNC,
                        libc::STATX_SIZE,
                        &mut sx,
                    )
                };
                sx.stx_size
            };
            bad.push(format!(
                "{n}: got {got:?} size {} forced {statx_size}",
                md.len()
            ));
        }
    }
    if !bad.is_empty() {
        let log = m.log_text();
        drop(m);
        panic!(
            "{bad:?}\nlog tail: {}",
            log.lines().rev().take(5).collect::<Vec<_>>().join("\n")
        );
    }

    // Races on the same names: O_EXCL lets exactly one thread create each name, and exactly
    // one unlink of each name succeeds.
    let names_n = 100;
    let created: Arc<Vec<AtomicUsize>> =
        Arc::new((0..names_n).map(|_| AtomicUsize::new(0)).collect());
    let removed: Arc<Vec<AtomicUsize>> =
        Arc::new((0..names_n).map(|_| AtomicUsize::new(0)).collect());
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (d, created, removed) = (d.clone(), created.clone(), removed.clone());
            let barrier = barrier.clone();
            thread::spawn(move || {
                for k in 0..names_n {
                    let p = d.join(format!("race-{k}"));
                    match OpenOptions::new().write(true).create_new(true).open(&p) {
                        Ok(mut f) => {
                            f.write_all(format!("winner {t}").as_bytes()).unwrap();
                            created[k].fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => assert_eq!(errno(&e), libc::EEXIST, "create race-{k}: {e}"),
                    }
                }
                // Every create has been tried before anyone unlinks.
                barrier.wait();
                for k in 0..names_n {
                    match fs::remove_file(d.join(format!("race-{k}"))) {
                        Ok(()) => {
                            removed[k].fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => assert_eq!(errno(&e), libc::ENOENT, "unlink race-{k}: {e}"),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for k in 0..names_n {
        assert_eq!(created[k].load(Ordering::SeqCst), 1, "race-{k} created");
        assert_eq!(removed[k].load(Ordering::SeqCst), 1, "race-{k} removed");
    }
    assert_eq!(names(&d), want, "after the races");
    assert_eq!(fs::metadata(&d).unwrap().nlink(), 2);

    m.unmount();
    let m = vol.mount();
    assert_eq!(names(&m.p("d")), want, "after remount");
}

#[test]
fn concurrent_renames_between_directories() {
    let vol = Volume::new();
    let m = vol.mount();
    let (a, b) = (m.p("a"), m.p("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    let files = 200;
    for i in 0..files {
        fs::write(a.join(format!("f{i}")), format!("file {i}")).unwrap();
    }
    // Each file i moves a -> b -> a ... (i % 5 + 1) times; directories move too.
    for i in 0..8 {
        fs::create_dir(a.join(format!("dir{i}"))).unwrap();
        fs::write(a.join(format!("dir{i}/inner")), format!("inner {i}")).unwrap();
    }
    let threads = 8;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (a, b) = (a.clone(), b.clone());
            thread::spawn(move || {
                for i in (0..files).filter(|i| i % threads == t) {
                    let moves = i % 5 + 1;
                    for k in 0..moves {
                        let (from, to) = if k % 2 == 0 { (&a, &b) } else { (&b, &a) };
                        fs::rename(from.join(format!("f{i}")), to.join(format!("f{i}"))).unwrap();
                    }
                }
                for k in 0..3 {
                    let (from, to) = if k % 2 == 0 { (&a, &b) } else { (&b, &a) };
                    fs::rename(from.join(format!("dir{t}")), to.join(format!("dir{t}"))).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let check = |a: &Path, b: &Path| {
        for i in 0..files {
            let in_b = (i % 5 + 1) % 2 == 1;
            let (here, there) = if in_b { (b, a) } else { (a, b) };
            assert_eq!(
                fs::read_to_string(here.join(format!("f{i}"))).unwrap(),
                format!("file {i}")
            );
            assert!(
                fs::metadata(there.join(format!("f{i}"))).is_err(),
                "f{i} in both"
            );
        }
        for t in 0..8 {
            assert_eq!(
                fs::read_to_string(b.join(format!("dir{t}/inner"))).unwrap(),
                format!("inner {t}")
            );
            assert_eq!(
                fs::metadata(b.join(format!("dir{t}/.."))).unwrap().ino(),
                fs::metadata(b).unwrap().ino()
            );
        }
        assert_eq!(names(a).len() + names(b).len(), files + 8);
        assert_eq!(fs::metadata(a).unwrap().nlink(), 2);
        assert_eq!(fs::metadata(b).unwrap().nlink(), 2 + 8);
    };
    check(&a, &b);
    m.unmount();
    let m = vol.mount();
    check(&m.p("a"), &m.p("b"));
}

#[test]
fn appends_and_reads_at_once() {
    let vol = Volume::new();
    let m = vol.mount();
    let p = m.p("log");
    let total = 8 * MIB;
    let data = Arc::new(pattern(total, 77));
    File::create(&p).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (p, data, done) = (p.clone(), data.clone(), done.clone());
        thread::spawn(move || {
            let mut f = OpenOptions::new().append(true).open(&p).unwrap();
            for part in data.chunks(33_333) {
                f.write_all(part).unwrap();
            }
            drop(f);
            done.store(true, Ordering::SeqCst);
        })
    };
    // Readers: whatever they see is a prefix of what is being written.
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (p, data, done) = (p.clone(), data.clone(), done.clone());
            thread::spawn(move || -> io::Result<usize> {
                let f = File::open(&p)?;
                let mut checks = 0;
                loop {
                    let finished = done.load(Ordering::SeqCst);
                    drop_cache(&f);
                    let len = f.metadata()?.len() as usize;
                    assert!(len <= total);
                    // A window near the current end, and one at a random spot.
                    for (o, n) in [
                        (len.saturating_sub(100_000), 100_000),
                        ((checks * 7919 * (r + 1)) % (len + 1), 50_000),
                    ] {
                        let n = n.min(len - o.min(len));
                        let mut buf = vec![0u8; n];
                        let got = f.read_at(&mut buf, o as u64)?;
                        assert!(
                            buf[..got] == data[o..o + got],
                            "reader {r}: bytes at {o}+{got} are wrong"
                        );
                    }
                    checks += 1;
                    if finished {
                        return Ok(checks);
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        assert!(r.join().unwrap().unwrap() > 0);
    }
    assert!(read_uncached(&p) == *data);
}

/// Two mounts create the same new names at once with open(O_CREAT) (no O_EXCL): each must
/// open the file, whichever mount created it; none may fail with EEXIST.
fn racing_creates_open_the_same_file(vol: &Volume) {
    let (a, b) = (vol.mount(), vol.mount());
    const N: usize = 300;
    let barrier = std::sync::Barrier::new(2);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for (side, m) in [(0u8, &a), (1u8, &b)] {
            let (barrier, failures) = (&barrier, &failures);
            s.spawn(move || {
                for i in 0..N {
                    barrier.wait();
                    let p = m.p(&format!("f{i}"));
                    match std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(&p)
                    {
                        Ok(f) => f.write_all_at(&[b'a' + side], side as u64).unwrap(),
                        Err(e) => failures.lock().unwrap().push(format!("f{i}: {e}")),
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} racing open(O_CREAT) failed: {:?}",
        failures.len(),
        2 * N,
        &failures[..failures.len().min(5)]
    );
    // Both opened the same file: both bytes are in it (read back through a fresh mount).
    drop((a, b));
    let c = vol.mount();
    for i in 0..N {
        let got = read_uncached(&c.p(&format!("f{i}")));
        assert_eq!(got, b"ab", "f{i}");
    }
}

#[test]
fn racing_creates_open_the_same_file_on_sqlite() {
    racing_creates_open_the_same_file(&Volume::new());
}

#[test]
fn racing_creates_open_the_same_file_on_postgres() {
    match Volume::postgres(&[], |u| u.to_string(), Vec::new()) {
        Some(vol) => racing_creates_open_the_same_file(&vol),
        None => eprintln!("skipped: UNKAI_TEST_POSTGRES is unset"),
    }
}
