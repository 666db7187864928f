//! The block cache on local disk, through real mounts: it survives a remount (no GET the
//! second time, by the mount's own traffic counters), a damaged cache file is refetched and
//! never returned, it stays under its size, and a cache directory that fills up or
//! disappears under a mount leaves applications working, and random reads fetch little more
//! than they read.

use crate::common::*;
use std::fs;
use std::path::{Path, PathBuf};

/// The bytes and GETs (objects) of the last mount's traffic summary in `log`
/// ("... N bytes got in M objects").
fn got(log: &str) -> (u64, u64) {
    let line = log
        .lines()
        .rfind(|l| l.contains("this mount: applications wrote"))
        .unwrap_or_else(|| panic!("no traffic summary in the log:\n{}", tail(log, 30)));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .len()
        .checked_sub(6)
        .unwrap_or_else(|| panic!("{line}"));
    match &words[at..] {
        [bytes, "bytes", "got", "in", objects, "objects"] => (
            bytes.parse().unwrap_or_else(|_| panic!("{line}")),
            objects.parse().unwrap_or_else(|_| panic!("{line}")),
        ),
        _ => panic!("unexpected traffic summary: {line}"),
    }
}

/// The GETs of the last mount's traffic summary in `log`.
fn gets(log: &str) -> u64 {
    got(log).1
}

/// The log of `vol`'s mounts since `from` bytes of it.
fn log_since(vol: &Volume, from: usize) -> String {
    let all = fs::read_to_string(vol.dir.path().join("mount.log")).unwrap_or_default();
    all.get(from..).unwrap_or_default().to_string()
}

fn log_len(vol: &Volume) -> usize {
    fs::metadata(vol.dir.path().join("mount.log")).map_or(0, |m| m.len() as usize)
}

/// Mounts `vol` with `args`, runs `f` on it, unmounts, and returns what the mount logged.
fn mounted(vol: &Volume, args: &[&str], f: impl FnOnce(&Mount)) -> String {
    let from = log_len(vol);
    let m = vol.mount_with(args);
    f(&m);
    m.unmount();
    log_since(vol, from)
}

/// The files of the disk cache under `cache` (the blocks of every volume).
fn cache_files(cache: &Path) -> Vec<PathBuf> {
    files_under(cache)
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "blocks"))
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect()
}

/// Files of several blocks and of less than one, with their contents.
fn files() -> Vec<(String, Vec<u8>)> {
    vec![
        ("big".into(), pattern(9 << 20, 1)),
        ("small".into(), pattern(100_000, 2)),
        ("tiny".into(), pattern(10, 3)),
    ]
}

fn write_all(m: &Mount, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        fs::write(m.p(name), data).unwrap();
    }
}

fn check_all(m: &Mount, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        assert!(fs::read(m.p(name)).unwrap() == *data, "{name} differs");
    }
}

/// Written with write-back, the blocks move into the cache as they are uploaded; read after
/// a remount, they come from the cache (no GET). Without write-back, the first read fetches
/// and caches, the second makes no GET. A cache file with a byte flipped is detected: the
/// read returns the right bytes, fetched again.
#[test]
fn the_cache_survives_a_remount_and_damage_is_refetched() {
    let vol = Volume::new();
    let cache = vol.dir.path().join("cache");
    let files = files();
    let on = ["--cache-size", "256M"];
    mounted(&vol, &["--cache-size", "256M", "--writeback", "on"], |m| {
        write_all(m, &files)
    });
    assert!(!cache_files(&cache).is_empty(), "nothing cached on upload");
    // Cached and staged blocks are file data: readable by the mount's owner alone.
    for vdir in fs::read_dir(&cache).unwrap().flatten() {
        use std::os::unix::fs::PermissionsExt;
        let mode = vdir.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", vdir.path().display());
    }
    let log = mounted(&vol, &on, |m| check_all(m, &files));
    assert_eq!(gets(&log), 0, "read after a remount:\n{}", tail(&log, 20));

    // Without write-back: cached by the first read after a cold start.
    fs::remove_dir_all(&cache).unwrap();
    mounted(&vol, &["--cache-size", "0", "--writeback", "off"], |m| {
        fs::write(m.p("later"), pattern(5 << 20, 4)).unwrap()
    });
    let mut files = files;
    files.push(("later".into(), pattern(5 << 20, 4)));
    let log = mounted(&vol, &on, |m| check_all(m, &files));
    assert!(gets(&log) >= 5, "a cold read fetches:\n{}", tail(&log, 20));
    let log = mounted(&vol, &on, |m| check_all(m, &files));
    assert_eq!(gets(&log), 0, "second read:\n{}", tail(&log, 20));

    // One byte flipped in the middle of every cached file of the big file's first block.
    let mut flipped = 0;
    for p in cache_files(&cache) {
        let mut b = fs::read(&p).unwrap();
        if b.len() < 4 << 20 {
            continue;
        }
        let i = b.len() / 2;
        b[i] ^= 0x01;
        fs::write(&p, &b).unwrap();
        flipped += 1;
    }
    assert!(flipped >= 2, "{flipped} whole blocks cached");
    let log = mounted(&vol, &on, |m| check_all(m, &files));
    assert!(log.contains("is damaged"), "{}", tail(&log, 20));
    assert_eq!(
        gets(&log),
        flipped,
        "each damaged block fetched again, once"
    );
    let log = mounted(&vol, &on, |m| check_all(m, &files));
    assert_eq!(
        gets(&log),
        0,
        "refetched blocks cached again:\n{}",
        tail(&log, 20)
    );
}

/// A cache of 8 MiB holds at most 8 MiB of blocks, whatever is read or written through it.
#[test]
fn a_full_cache_stays_under_its_size() {
    let vol = Volume::new();
    let cache = vol.dir.path().join("cache");
    let files: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| (format!("f{i}"), pattern(5 << 20, 10 + i)))
        .collect();
    let args = ["--cache-size", "8M", "--writeback", "on"];
    let size = |c: &Path| -> u64 {
        cache_files(c)
            .iter()
            .map(|p| p.metadata().unwrap().len())
            .sum()
    };
    mounted(&vol, &args, |m| write_all(m, &files));
    assert!(size(&cache) <= 8 << 20, "{} bytes cached", size(&cache));
    let log = mounted(&vol, &args, |m| check_all(m, &files));
    let cached = size(&cache);
    assert!(
        (4 << 20..=8 << 20).contains(&cached),
        "{cached} bytes cached"
    );
    assert!(
        gets(&log) > 0,
        "not all of it fits: some blocks are fetched"
    );
}

/// The cache on a small disk keeps its free-space floor; when the disk fills up, then when
/// the cache directory disappears under a mount reading, every read still returns the right
/// bytes (from memory and the bucket), and the log says why once.
#[test]
fn a_cache_directory_that_fills_or_disappears_leaves_reads_working() {
    let vol = Volume::new();
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| (format!("f{i}"), pattern(4 << 20, 20 + i)))
        .collect();
    mounted(&vol, &["--writeback", "off"], |m| write_all(m, &files));
    let disk = SmallDisk::new("40m");
    let dir = disk.path.join("c");
    let cache_dir = dir.display().to_string();
    let args = [
        "--cache-dir",
        &cache_dir,
        "--cache-size",
        "1G",
        "--free-space-ratio",
        "0.5",
        "--memory-cache-size",
        "0",
        "--no-keep-cache",
    ];
    let log = mounted(&vol, &args, |m| {
        check_all(m, &files);
        // 32 MiB read, at most 20 MiB (half the disk) cached.
        let used = || -> u64 {
            cache_files(&dir)
                .iter()
                .filter_map(|p| p.metadata().ok())
                .map(|m| m.len())
                .sum()
        };
        assert!(eventually(std::time::Duration::from_secs(60), || used() > 0));
        assert!(
            used() <= 20 << 20,
            "{} bytes cached on a 40 MiB disk",
            used()
        );
        // Filled by someone else: nothing more is cached, reads go on.
        let mut filler = fs::File::create(disk.path.join("filler")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        while std::io::Write::write_all(&mut filler, &chunk).is_ok() {}
        drop(filler);
        check_all(m, &files);
        // Then the directory goes.
        fs::remove_dir_all(&dir).unwrap();
        check_all(m, &files);
        fs::remove_file(disk.path.join("filler")).unwrap();
        check_all(m, &files);
    });
    assert!(
        log.contains("down to its free-space floor"),
        "{}",
        tail(&log, 20)
    );
}

/// `unkai warmup` of a tree fills the disk cache: a remount then reads it with no GET. A path
/// elsewhere is refused in one line.
#[test]
fn warmup_fills_the_cache_for_a_later_mount() {
    let vol = Volume::new();
    let files: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| {
            (
                format!("d{}/f{i}", i % 2),
                pattern((i as usize + 1) * 1_500_000, 40 + i),
            )
        })
        .collect();
    mounted(&vol, &["--writeback", "off", "--cache-size", "0"], |m| {
        fs::create_dir_all(m.p("d0")).unwrap();
        fs::create_dir_all(m.p("d1")).unwrap();
        write_all(m, &files);
    });
    let on = ["--cache-size", "256M"];
    let log = mounted(&vol, &on, |m| {
        let (ok, out, err) = run(&["warmup", "-q", m.path.to_str().unwrap()]);
        assert!(ok, "{out}{err}");
        assert!(out.contains("warmed up 5 files"), "{out}");
    });
    assert!(
        gets(&log) > 0,
        "warmup read from the bucket:\n{}",
        tail(&log, 20)
    );
    let log = mounted(&vol, &on, |m| check_all(m, &files));
    assert_eq!(gets(&log), 0, "read after warmup:\n{}", tail(&log, 20));
    let elsewhere = tempfile::tempdir().unwrap();
    let (ok, _, err) = run(&["warmup", elsewhere.path().to_str().unwrap()]);
    assert!(!ok && err.contains("is not on an unkai mount"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Random 4 KiB reads of a cold file fetch about what they read: read-ahead starts no stream
/// for them and a part of a block is fetched with its checksums alone (bytes got / bytes read
/// at most 1.5, by the mount's own counters). Every byte read is checked.
#[test]
fn random_reads_fetch_little_more_than_they_read() {
    use rand::{Rng, SeedableRng};
    use std::os::unix::fs::FileExt;
    let vol = Volume::new();
    let len = 48 << 20;
    let data = pattern(len, 9);
    let off = ["--writeback", "off", "--cache-size", "0"];
    mounted(&vol, &off, |m| fs::write(m.p("f"), &data).unwrap());
    let (reads, bs) = (2000, 4096);
    let log = mounted(&vol, &off, |m| {
        let f = fs::File::open(m.p("f")).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        let mut buf = vec![0u8; bs];
        for _ in 0..reads {
            let at = rng.random_range(0..len / bs) * bs;
            f.read_exact_at(&mut buf, at as u64).unwrap();
            assert!(buf == data[at..at + bs], "bytes at {at} differ");
        }
    });
    let (bytes, objects) = got(&log);
    let read = (reads * bs) as u64;
    assert!(
        bytes as f64 <= 1.5 * read as f64,
        "{bytes} bytes got in {objects} objects for {read} bytes read:\n{}",
        tail(&log, 20)
    );
    assert!(objects > 0, "the reads reached the bucket");
}
