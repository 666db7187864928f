//! FUSE passthrough (`--passthrough on`, issue 36 item 1), through real mounts: a file
//! opened for reading is served by the kernel from a local copy (counted, and said at
//! unmount), mixed with ordinary opens of the same file; mmap; a truncate and a fallocate
//! while open; a second mount reading after a close; a kill -9 while a copy is open; and
//! another client's change reaching a reader of a copy (PostgreSQL, skipped without it).

use crate::common::*;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

const PT: &[&str] = &["--passthrough", "on"];

/// The figures of the unmount's summary line: opens on local copies, opens for writing
/// refused, copies filled again.
fn summary(log: &str) -> (u64, u64, u64) {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("passthrough: "))
        .unwrap_or_else(|| panic!("no passthrough summary in the log:\n{}", tail(log, 30)));
    let nums: Vec<u64> = line
        .split("passthrough: ")
        .nth(1)
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert!(nums.len() >= 3, "{line}");
    (nums[0], nums[1], nums[2])
}

fn read_all(f: &File) -> Vec<u8> {
    let len = f.metadata().unwrap().len() as usize;
    let mut buf = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let n = f.read_at(&mut buf[at..], at as u64).unwrap();
        if n == 0 {
            break;
        }
        at += n;
    }
    buf.truncate(at);
    buf
}

fn open_rw(p: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).open(p)
}

/// Opens that wait for the kernel's RELEASE of handles closed before. close(2) returns once
/// the kernel sent FLUSH; RELEASE comes after, asynchronously, and until it does the mount
/// counts the handle as open: a reader opened just after a writer's close is ordinary, and
/// a writer opened just after a passthrough reader's close is refused. Counts the refusals
/// it met, so the tests can still check the mount's own count exactly.
#[derive(Default)]
struct Opens {
    refused: u64,
}

impl Opens {
    /// An open for writing, once no passthrough reader is left (ETXTBSY until then).
    fn rw(&mut self, p: &Path) -> File {
        let mut last = None;
        let ok =
            eventually_every(
                Duration::from_secs(30),
                Duration::from_millis(10),
                || match open_rw(p) {
                    Ok(f) => {
                        last = Some(f);
                        true
                    }
                    Err(e) => {
                        assert_eq!(errno(&e), libc::ETXTBSY, "open for writing: {e}");
                        self.refused += 1;
                        false
                    }
                },
            );
        assert!(
            ok,
            "an open for writing still refused 30 s after the readers closed"
        );
        last.unwrap()
    }

    /// An open for reading in passthrough mode, once no ordinary open is left: a probe open
    /// for writing beside it is refused (and counted) only when it is in passthrough mode.
    fn backed(&mut self, p: &Path) -> File {
        let mut last = None;
        let ok = eventually_every(Duration::from_secs(30), Duration::from_millis(10), || {
            let r = File::open(p).unwrap();
            match open_rw(p) {
                Ok(_ordinary) => false,
                Err(e) => {
                    assert_eq!(errno(&e), libc::ETXTBSY, "probe open for writing: {e}");
                    self.refused += 1;
                    last = Some(r);
                    true
                }
            }
        });
        assert!(
            ok,
            "no passthrough open 30 s after the ordinary opens closed"
        );
        last.unwrap()
    }
}

/// Readers of one file share its copy; an open for writing while they are open is refused
/// (ETXTBSY, the kernel allows no ordinary open beside passthrough ones); a writer's open
/// makes readers opened meanwhile ordinary (they read its writes), and the next reader
/// after it closes reads them from a new copy. Passthrough is really used: the mount counts
/// its passthrough opens, and the reads of a copy never reach unkai.
#[test]
fn passthrough_and_ordinary_opens_of_one_file_mix() {
    let vol = Volume::new();
    let m = vol.mount_with(PT);
    let p = m.p("f");
    let v1 = pattern(3_000_000, 1);
    fs::write(&p, &v1).unwrap();

    let mut opens = Opens::default();
    let r1 = opens.backed(&p);
    let r2 = File::open(&p).unwrap();
    assert!(read_all(&r1) == v1, "first reader");
    assert!(read_all(&r2) == v1, "second reader");
    let e = open_rw(&p).expect_err("an open for writing beside passthrough readers");
    assert_eq!(errno(&e), libc::ETXTBSY, "{e}");
    drop((r1, r2));

    let w = opens.rw(&p);
    w.write_all_at(b"written through an ordinary open", 1000)
        .unwrap();
    let r3 = File::open(&p).unwrap();
    let mut v2 = v1.clone();
    v2[1000..1032].copy_from_slice(b"written through an ordinary open");
    assert!(
        read_all(&r3) == v2,
        "a reader beside a writer reads its writes"
    );
    drop((w, r3));

    let r4 = opens.backed(&p);
    assert!(read_all(&r4) == v2, "a new copy after the writer closed");
    drop(r4);

    let log = {
        let log = m.log.clone();
        m.unmount();
        fs::read_to_string(log).unwrap()
    };
    let (opened, refused, _) = summary(&log);
    assert_eq!(
        opened,
        3,
        "passthrough opens (r1, r2, r4):\n{}",
        tail(&log, 20)
    );
    assert_eq!(refused, 1 + opens.refused, "refused opens for writing");
    assert!(
        log.contains("FUSE passthrough on"),
        "the kernel took passthrough:\n{}",
        tail(&log, 30)
    );
    let m = vol.mount();
    assert!(fs::read(m.p("f")).unwrap() == v2);
    m.unmount();
}

/// A file mapped while open in passthrough mode reads as the file does; a mapping outlives
/// its descriptor's close.
#[test]
fn mmap_of_a_passthrough_open() {
    let vol = Volume::new();
    let m = vol.mount_with(PT);
    let p = m.p("mapped");
    let data = pattern(1_234_567, 2);
    fs::write(&p, &data).unwrap();
    let f = Opens::default().backed(&p);
    let len = data.len();
    let got = unsafe {
        use std::os::fd::AsRawFd;
        let at = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(at, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        drop(f);
        let v = std::slice::from_raw_parts(at as *const u8, len).to_vec();
        libc::munmap(at, len);
        v
    };
    assert!(got == data, "the mapping reads the file");
    let log = m.log.clone();
    m.unmount();
    let (opened, _, _) = summary(&fs::read_to_string(log).unwrap());
    assert_eq!(opened, 1);
}

/// A truncate by path while a reader has the file open in passthrough mode: the reader sees
/// the file's new length and bytes at once. A fallocate and an ftruncate through an
/// ordinary open: a reader opened after the writer closes sees them.
#[test]
fn truncate_and_fallocate_while_open() {
    let vol = Volume::new();
    let m = vol.mount_with(PT);
    let p = m.p("t");
    let data = pattern(2_000_000, 3);
    fs::write(&p, &data).unwrap();
    let mut opens = Opens::default();
    let r = opens.backed(&p);
    assert!(read_all(&r) == data);
    let c = cpath(&p);
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 5000) }, 0);
    assert_eq!(r.metadata().unwrap().len(), 5000);
    let mut buf = vec![0u8; 10_000];
    let n = r.read_at(&mut buf, 0).unwrap();
    assert_eq!(n, 5000, "the reader's copy was cut");
    assert!(buf[..5000] == data[..5000]);
    drop(r);

    let w = opens.rw(&p);
    fallocate(&w, 0, 0, 100_000).unwrap();
    w.set_len(80_000).unwrap();
    w.write_all_at(b"tail", 79_996).unwrap();
    drop(w);
    let r = opens.backed(&p);
    let got = read_all(&r);
    assert_eq!(got.len(), 80_000);
    assert!(got[..5000] == data[..5000]);
    assert!(got[5000..79_996].iter().all(|&b| b == 0));
    assert_eq!(&got[79_996..], b"tail");
    drop(r);
    let log = m.log.clone();
    m.unmount();
    let (opened, _, refilled) = summary(&fs::read_to_string(log).unwrap());
    assert_eq!(opened, 2);
    assert!(refilled >= 1, "the truncate filled the copy again");
}

/// Two mounts of one volume (SQLite, one machine): what A writes and closes, B reads from a
/// copy; A's rewrite while B still has the file open reaches B's next open (close-to-open),
/// and that open fills the shared copy again.
#[test]
fn a_second_mount_reads_after_close() {
    let vol = Volume::new();
    let a = vol.mount_as(&[], &[], "a.log");
    let b = vol.mount_as(PT, &[], "b.log");
    let v1 = pattern(700_000, 4);
    fs::write(a.p("shared"), &v1).unwrap();
    let r1 = File::open(b.p("shared")).unwrap();
    assert!(read_all(&r1) == v1);
    let v2 = pattern(700_000, 5);
    fs::write(a.p("shared"), &v2).unwrap();
    // B's kernel may have the old attributes for its TTL; the open asks the volume.
    let fresh = eventually(Duration::from_secs(20), || {
        let r2 = File::open(b.p("shared")).unwrap();
        read_all(&r2) == v2
    });
    assert!(fresh, "B reads A's rewrite after A's close");
    drop(r1);
    a.unmount();
    let log = b.log.clone();
    b.unmount();
    let (opened, _, refilled) = summary(&fs::read_to_string(log).unwrap());
    assert!(opened >= 2, "{opened} passthrough opens");
    assert!(refilled >= 1, "the reopen filled the copy again");
}

/// kill -9 of a mount with a file open in passthrough mode and another written and fsynced
/// (then written more, not synced): the fsynced bytes are there after a remount, fsck finds
/// the volume consistent, and no copy is left on disk (copies are unlinked files).
#[test]
fn kill9_with_a_passthrough_open_keeps_what_was_fsynced() {
    let vol = Volume::new();
    let m = vol.mount_with(PT);
    let read = pattern(1_500_000, 6);
    fs::write(m.p("read"), &read).unwrap();
    let r = File::open(m.p("read")).unwrap();
    assert!(read_all(&r) == read);
    let synced = pattern(900_000, 7);
    let w = File::create(m.p("written")).unwrap();
    w.write_all_at(&synced, 0).unwrap();
    w.sync_all().unwrap();
    w.write_all_at(&pattern(100_000, 8), 900_000).unwrap();
    let copies: Vec<_> = files_under(vol.dir.path())
        .into_iter()
        .filter(|f| f.components().any(|c| c.as_os_str() == "passthrough"))
        .collect();
    m.kill9();
    drop((r, w));
    assert!(copies.is_empty(), "copies left as named files: {copies:?}");
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(
        ok && !out.lines().any(|l| l.starts_with("ERROR")),
        "{out}{err}"
    );
    let m = remount(&vol);
    let got = fs::read(m.p("written")).unwrap();
    assert!(got.len() >= synced.len(), "{} bytes", got.len());
    assert!(got[..synced.len()] == synced, "the fsynced bytes");
    assert!(fs::read(m.p("read")).unwrap() == read);
    m.unmount();
}

/// Two mounts of one PostgreSQL volume: A rewrites a file B reads from a copy; the change
/// pushed to B fills B's copy again, so B's open reader reads the new bytes (as a reader of
/// the page cache would), without reopening.
#[test]
fn another_clients_change_reaches_a_passthrough_reader() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let a = vol.mount_as(&[], &[], "a.log");
    let b = vol.mount_as(PT, &[], "b.log");
    let v1 = pattern(1_000_000, 9);
    fs::write(a.p("shared"), &v1).unwrap();
    assert!(
        eventually(Duration::from_secs(20), || fs::read(b.p("shared"))
            .map(|d| d == v1)
            .unwrap_or(false)),
        "B reads A's file"
    );
    let r = File::open(b.p("shared")).unwrap();
    assert!(read_all(&r) == v1);
    let v2 = pattern(1_000_000, 10);
    let w = open_rw(&a.p("shared")).unwrap();
    w.write_all_at(&v2, 0).unwrap();
    drop(w);
    let fresh = eventually(Duration::from_secs(20), || {
        let mut buf = vec![0u8; v2.len()];
        r.read_exact_at(&mut buf, 0).is_ok() && buf == v2
    });
    assert!(fresh, "B's open reader still reads the old bytes");
    drop(r);
    a.unmount();
    let log = b.log.clone();
    b.unmount();
    let (opened, _, refilled) = summary(&fs::read_to_string(log).unwrap());
    assert!(
        opened >= 1 && refilled >= 1,
        "{opened} opens, {refilled} refills"
    );
}
