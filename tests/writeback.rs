//! The kernel's writeback cache (`mount --writeback-cache on`): writes gather in the page cache
//! and reach unkai later, yet what close and fsync acknowledged is committed, sizes, times
//! and contents survive a remount, and SEEK_DATA never calls unwritten data a hole.

use crate::common;

use crate::common::*;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn mount(vol: &Volume) -> Mount {
    let m = vol.mount_with(&["--writeback-cache", "on"]);
    assert!(
        m.log_text().contains("writeback cache on"),
        "the mount did not turn the writeback cache on:\n{}",
        m.log_text()
    );
    m
}

/// The first mount of `vol`, with default settings: alone on its SQLite volume, so with the
/// writeback cache.
fn first_mount(vol: &Volume) -> Mount {
    let m = vol.mount();
    assert!(
        m.log_text().contains("writeback cache on"),
        "a mount alone has the writeback cache by default:\n{}",
        m.log_text()
    );
    m
}

#[test]
fn random_writes_match_a_model_across_remounts() {
    let vol = Volume::new();
    let mut model: Vec<u8> = Vec::new();
    let mut rng = StdRng::seed_from_u64(42);
    for round in 0..3 {
        let m = mount(&vol);
        let p = m.p("f");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .unwrap();
        for _ in 0..400 {
            let op = rng.random_range(0..10);
            if op < 7 {
                let off = rng.random_range(0..3 << 20) as usize;
                let len = rng.random_range(1..20_000);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                f.write_all_at(&data, off as u64).unwrap();
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&data);
            } else if op < 8 {
                let len = rng.random_range(0..(3 << 20)) as usize;
                f.set_len(len as u64).unwrap();
                model.resize(len, 0);
            } else {
                let off = rng.random_range(0..(model.len() + 1)) as u64;
                let mut buf = vec![0u8; 50_000];
                let n = f.read_at(&mut buf, off).unwrap();
                let end = (off as usize + 50_000).min(model.len());
                assert_eq!(&buf[..n], &model[off as usize..end], "round {round}");
            }
        }
        assert_eq!(f.metadata().unwrap().len(), model.len() as u64);
        drop(f);
        assert_eq!(fs::read(&p).unwrap(), model, "after close, round {round}");
        m.unmount();
    }
    let m = mount(&vol);
    assert_eq!(fs::read(m.p("f")).unwrap(), model, "after the last remount");
}

#[test]
fn appends_times_and_small_files_survive_a_remount() {
    let vol = Volume::new();
    let m = mount(&vol);
    // O_APPEND from two descriptors: the kernel places the bytes.
    let a = m.p("log");
    for i in 0..50u32 {
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&a)
            .unwrap();
        writeln!(f, "line {i}").unwrap();
    }
    let want: String = (0..50).map(|i| format!("line {i}\n")).collect();
    // Many small files, closed at once.
    for i in 0..200 {
        fs::write(m.p(&format!("s{i}")), pattern(i * 37 + 1, i as u64)).unwrap();
    }
    // Times set after writing, before closing (cp -p).
    let t = m.p("timed");
    let mut f = File::create(&t).unwrap();
    f.write_all(&pattern(70_000, 9)).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 1_234_567_890,
            tv_nsec: 5,
        },
    ];
    assert_eq!(unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) }, 0);
    drop(f);
    let before = fs::metadata(&t).unwrap();
    assert_eq!((before.mtime(), before.mtime_nsec()), (1_234_567_890, 5));
    m.unmount();

    let m = mount(&vol);
    assert_eq!(fs::read_to_string(m.p("log")).unwrap(), want);
    for i in 0..200 {
        assert_eq!(
            fs::read(m.p(&format!("s{i}"))).unwrap(),
            pattern(i * 37 + 1, i as u64),
            "s{i}"
        );
    }
    let after = fs::metadata(m.p("timed")).unwrap();
    assert_eq!((after.mtime(), after.mtime_nsec()), (1_234_567_890, 5));
    assert_eq!(after.len(), 70_000);
}

#[test]
fn fsync_is_durable_through_a_crash_and_seek_data_sees_dirty_pages() {
    let vol = Volume::new();
    let m = mount(&vol);
    let p = m.p("f");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    let far = 100u64 << 20;
    f.write_all_at(b"unwritten yet", far).unwrap();
    // The bytes are still in the kernel's page cache: SEEK_DATA must not skip them.
    // SAFETY: lseek on an open descriptor.
    let off = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert_eq!(off as u64, far, "SEEK_DATA: the dirty bytes, past the hole");
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_HOLE) };
    assert_eq!(hole, 0, "SEEK_HOLE: the file starts with a hole");
    let data = pattern(5 << 20, 3);
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    m.kill9();
    let m = mount(&vol);
    let mut got = Vec::new();
    File::open(m.p("f")).unwrap().read_to_end(&mut got).unwrap();
    assert_eq!(got.len() as u64, far + 13);
    assert_eq!(&got[..data.len()], &data[..]);
    assert_eq!(&got[far as usize..], b"unwritten yet");
    assert!(got[data.len()..far as usize].iter().all(|b| *b == 0));
}

/// The kernel writes a file's pages back in parts when something writes its inode back
/// before the close (its flusher under memory pressure, or a syncfs, as here), and hands its
/// times over between the parts. The file must still go up as one object, as without the
/// cache: the times' setattr used to commit the head, and the tail went up apart (with the
/// cache the default, tests/fsck.rs found 3 objects for two files of 600,000 bytes, not 2).
/// In a process of its own: another test's fork while the file is open closes a copy of its
/// descriptor, and that close (a FLUSH) commits the head rightly (CI saw it so).
#[test]
fn a_file_written_back_in_parts_goes_up_whole() {
    if common::in_own_process("writeback::a_file_written_back_in_parts_goes_up_whole") {
        return;
    }
    let vol = Volume::new();
    let m = mount(&vol);
    let (head, len) = (512 << 10, 600_000);
    for (name, seed) in [("one", 51), ("two", 52)] {
        let data = pattern(len, seed);
        let mut f = File::create(m.p(name)).unwrap();
        // A time in the past, so that the write moves it: the inode's times are dirty when
        // the syncfs writes it back (the setattr comes between the two parts).
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
            .unwrap();
        f.write_all(&data[..head]).unwrap();
        // SAFETY: syncfs on an open descriptor.
        assert_eq!(unsafe { libc::syncfs(f.as_raw_fd()) }, 0);
        f.write_all(&data[head..]).unwrap();
        drop(f);
        assert_eq!(fs::read(m.p(name)).unwrap(), data);
    }
    m.unmount();
    let objects = vol.objects();
    assert_eq!(objects.len(), 2, "one object per file: {objects:?}");
    let sizes: Vec<u64> = objects
        .iter()
        .map(|o| fs::metadata(o).unwrap().len())
        .collect();
    assert_eq!(sizes[0], sizes[1], "{objects:?}");
    let m = mount(&vol);
    for (name, seed) in [("one", 51), ("two", 52)] {
        assert_eq!(fs::read(m.p(name)).unwrap(), pattern(len, seed), "{name}");
    }
    m.unmount();
}

/// The first mount of an SQLite volume has the writeback cache (by default: it starts alone);
/// the kernel then keeps a cached file's size as its own. A file a second mount makes longer
/// must still show whole here after the close there (close-to-open), and appends under a lock
/// land after the other mount's.
#[test]
fn a_file_grown_by_another_mount_shows_its_new_size() {
    let vol = Volume::new();
    let a = first_mount(&vol);
    let b = vol.mount();
    assert!(
        b.log_text().contains("writeback cache off"),
        "a second mount has none:\n{}",
        b.log_text()
    );
    fs::write(a.p("f"), b"hello").unwrap();
    assert_eq!(fs::read(a.p("f")).unwrap(), b"hello");
    let mut g = OpenOptions::new().append(true).open(b.p("f")).unwrap();
    g.write_all(b", world").unwrap();
    drop(g);
    assert_eq!(
        fs::read(a.p("f")).unwrap(),
        b"hello, world",
        "close-to-open on A"
    );
    assert_eq!(fs::metadata(a.p("f")).unwrap().len(), 12);
    // Under a lock, with A's descriptor open all along.
    let fa = OpenOptions::new().append(true).open(a.p("f")).unwrap();
    let fb = OpenOptions::new().append(true).open(b.p("f")).unwrap();
    for (f, text) in [(&fb, &b"!"[..]), (&fa, &b"?"[..]), (&fb, &b"#"[..])] {
        // SAFETY: flock on an open descriptor.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        (&*f).write_all(text).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) }, 0);
    }
    drop((fa, fb));
    assert_eq!(fs::read(b.p("f")).unwrap(), b"hello, world!?#");
    // Read on A under a lock. (Without one, the close of A's descriptor after B's last
    // append can stamp B's change as seen, and the next open keeps A's old size: a gap
    // recorded in docs/design.md.)
    let mut fa = File::open(a.p("f")).unwrap();
    // SAFETY: flock on an open descriptor.
    assert_eq!(unsafe { libc::flock(fa.as_raw_fd(), libc::LOCK_SH) }, 0);
    let mut got = Vec::new();
    fa.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"hello, world!?#");
}

/// A writes bytes 0-99 and B bytes 100-199 of the 8 KiB file `f` (A's descriptor opened
/// first, B's closed first); both then read both writes. Returns the file's bytes.
fn writes_beside(a: &Mount, b: &Mount) -> Vec<u8> {
    let fa = OpenOptions::new().write(true).open(a.p("f")).unwrap();
    fa.write_all_at(&[b'A'; 100], 0).unwrap();
    let fb = OpenOptions::new().write(true).open(b.p("f")).unwrap();
    fb.write_all_at(&[b'B'; 100], 100).unwrap();
    drop(fb);
    drop(fa);
    let mut want = vec![b'o'; 8192];
    want[..100].fill(b'A');
    want[100..200].fill(b'B');
    assert!(fs::read(b.p("f")).unwrap() == want, "B's bytes were lost");
    assert!(fs::read(a.p("f")).unwrap() == want, "A reads what B reads");
    want
}

/// As below, right after the second mount started: the first has not checked sessions yet
/// (every 2 s), but the second's session row moved the database under it, so a file it opens
/// for writing bypasses the cache already: the second mount's bytes in the same page stay.
#[test]
fn a_mount_just_joined_by_another_writes_back_only_its_own_bytes() {
    let vol = Volume::new();
    let a = first_mount(&vol);
    fs::write(a.p("f"), vec![b'o'; 8192]).unwrap();
    let b = vol.mount();
    writes_beside(&a, &b);
}

/// The first mount of an SQLite volume has the writeback cache (it starts alone). Once it has
/// noticed a second mount, a file it opens for writing bypasses the cache: the kernel hands
/// over the bytes written and no others. With the cache, it wrote back whole pages, and the
/// bytes the second mount had written beside its own in the same page (closed, so
/// acknowledged) went back to the values its page held: lost.
#[test]
fn a_mount_no_longer_alone_writes_back_only_its_own_bytes() {
    let vol = Volume::new();
    let a = first_mount(&vol);
    fs::write(a.p("f"), vec![b'o'; 8192]).unwrap();
    let b = vol.mount();
    a.wait_noticed_another_client("the second mount");
    assert!(
        a.log_text()
            .contains("files opened for writing bypass the writeback cache"),
        "{}",
        a.log_text()
    );
    let mut want = writes_beside(&a, &b);
    // A shared mapping of a file so opened still works (through the page cache).
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(a.p("f"))
        .unwrap();
    // SAFETY: a shared mapping of 8192 bytes of an open file, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: within the mapping.
    unsafe {
        *(p as *mut u8).add(4096) = b'M';
        assert_eq!(libc::msync(p, 8192, libc::MS_SYNC), 0);
        libc::munmap(p, 8192);
    }
    drop(f);
    want[4096] = b'M';
    assert!(
        fs::read(b.p("f")).unwrap() == want,
        "the mapped write reached B"
    );
    // Appends without a lock, B's after A's open: each lands at the end the volume knows
    // (A's kernel still counts the size A opened with).
    let fa = OpenOptions::new().append(true).open(a.p("f")).unwrap();
    let fb = OpenOptions::new().append(true).open(b.p("f")).unwrap();
    (&fb).write_all(b"x").unwrap();
    drop(fb);
    (&fa).write_all(b"y").unwrap();
    drop(fa);
    want.extend_from_slice(b"xy");
    let got = fs::read(b.p("f")).unwrap();
    assert!(
        got == want,
        "appends: {} bytes ending {:?}",
        got.len(),
        String::from_utf8_lossy(&got[got.len().saturating_sub(4)..])
    );
}

/// The kernel may hold as much of a mount's written pages as unkai's write buffers
/// (`--buffer-size`, 256 MiB by default; at most half the machine's dirty threshold) before it
/// makes the writer wait (`fuse::allow_dirty`): its own share for a FUSE mount, 1% of that
/// threshold, is a few MiB on a machine of a few GiB, and halved a sequential write there.
/// Half of it is promised from the start (`min_bytes`).
#[test]
fn the_kernel_may_hold_as_much_of_a_mounts_written_pages_as_its_write_buffers() {
    for (args, want) in [
        (&[][..], 256u64 << 20),
        (&["--buffer-size", "96M"][..], 96 << 20),
    ] {
        let vol = Volume::new();
        let m = vol.mount_as(args, &[("UNKAI_LOG", "debug")], "mount.log");
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let p = m.path.to_string_lossy().replace(' ', "\\040");
        let dev = info
            .lines()
            .rfind(|l| l.split(' ').nth(4) == Some(p.as_str()))
            .and_then(|l| l.split(' ').nth(2))
            .expect("the mount's line")
            .to_string();
        let read = |name: &str| -> u64 {
            let knob = format!("/sys/class/bdi/{dev}/{name}");
            let text = fs::read_to_string(&knob)
                .unwrap_or_else(|e| panic!("{knob}: {e} (a kernel of 6.2 or later has it)"));
            text.trim().parse().unwrap()
        };
        let (bytes, fine) = (read("max_bytes"), read("max_ratio_fine"));
        // The share in millionths of the machine's threshold, and in bytes.
        let threshold = bytes * 1_000_000 / fine;
        let expected = want.min(threshold / 2);
        // Kept by the kernel as a share of a threshold that moves with free memory.
        assert!(
            bytes >= expected / 100 * 98,
            "{args:?}: {bytes} bytes allowed ({fine} millionths of {threshold}), not {expected}"
        );
        // And half of it promised from the start, at most a sixteenth of the threshold: a new
        // mount has no share of the pages written out lately, which the kernel divides by.
        // Unless the floors of other devices (other tests' mounts) already add up to a
        // quarter of the threshold: then none, and the mount says so.
        let floor = (expected / 2).min(threshold / 16);
        let min = read("min_bytes");
        let skipped = m
            .log_text()
            .contains("no floor for the mount's written pages");
        assert!(
            min <= bytes && (min >= floor / 100 * 98 || (min == 0 && skipped)),
            "{args:?}: {min} bytes promised, not {floor} (at most {bytes}):\n{}",
            m.log_text()
        );
        fs::write(m.p("f"), pattern(1 << 20, 3)).unwrap();
        assert!(fs::read(m.p("f")).unwrap() == pattern(1 << 20, 3));
    }
}
