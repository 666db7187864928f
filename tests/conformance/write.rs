//! write(2) and pwrite(2): timestamps, descriptors' access modes, offsets, and what other
//! descriptors of the same file see while writes are in flight (a close elsewhere commits
//! buffered writes: sizes must not go backwards, appends must not overwrite, the server must
//! survive).

use crate::common::pattern;
use crate::harness::*;
use crate::sys;
use libc::{O_APPEND, O_CREAT, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};
use std::sync::atomic::{AtomicBool, Ordering};

pub fn run(env: &Env) {
    env.case(
        "write updates mtime and ctime; read does not; parent untouched",
        |d| {
            let p = d.p("f");
            write_file(&p, b"hello");
            let dir = st(&d.path);
            let b = st(&p);
            let fd = ok(sys::open(&p, O_RDWR, 0), "open");
            let after_open = st(&p);
            same(b.mtime, after_open.mtime, "mtime after a plain open");
            same(b.ctime, after_open.ctime, "ctime after a plain open");
            ok(sys::write(&fd, b"HE"), "write");
            let a = ok(sys::fstat(&fd), "fstat");
            later(b.mtime, a.mtime, "mtime seen by fstat before close");
            later(b.ctime, a.ctime, "ctime seen by fstat before close");
            drop(fd);
            let a = st(&p);
            later(b.mtime, a.mtime, "mtime after close");
            later(b.ctime, a.ctime, "ctime after close");
            let fd = ok(sys::open(&p, O_RDONLY, 0), "open");
            assert_eq!(ok(sys::read(&fd, 100), "read"), b"HEllo");
            drop(fd);
            let r = st(&p);
            same(a.mtime, r.mtime, "mtime after a read");
            same(a.ctime, r.ctime, "ctime after a read");
            let dir2 = st(&d.path);
            same(dir.mtime, dir2.mtime, "parent mtime");
            same(dir.ctime, dir2.ctime, "parent ctime");
        },
    );

    env.case(
        "EBADF: writing a read-only descriptor, reading a write-only one",
        |d| {
            let p = d.p("f");
            write_file(&p, b"abc");
            let r = ok(sys::open(&p, O_RDONLY, 0), "open");
            fails(sys::write(&r, b"x"), libc::EBADF, "write to O_RDONLY");
            let w = ok(sys::open(&p, O_WRONLY, 0), "open");
            fails(sys::read(&w, 10), libc::EBADF, "read from O_WRONLY");
            assert_eq!(read_file(&p), b"abc");
        },
    );

    env.case("reading and writing at offsets round-trips", |d| {
        let p = d.p("f");
        let data = pattern(300_000, 9);
        let fd = ok(sys::open(&p, O_CREAT | O_RDWR, 0o644), "open");
        ok(sys::pwrite(&fd, &data, 0), "pwrite");
        ok(sys::pwrite(&fd, b"XYZ", 150_000), "overwrite in the middle");
        let got = ok(sys::pread(&fd, 10, 149_998), "pread");
        assert_eq!(&got[2..5], b"XYZ");
        assert_eq!(got[..2], data[149_998..150_000]);
        drop(fd);
        let all = read_file(&p);
        assert_eq!(all.len(), data.len());
        assert_eq!(all[..150_000], data[..150_000]);
        assert_eq!(all[150_003..], data[150_003..]);
    });

    env.case(
        "fstat's size keeps up with completed writes while another descriptor is closed",
        |d| {
            let p = d.p("f");
            let fd = ok(sys::open(&p, O_CREAT | O_WRONLY | O_TRUNC, 0o644), "open");
            let stop = AtomicBool::new(false);
            let mut lagging = Vec::new();
            std::thread::scope(|s| {
                // Another descriptor of the same file opened and closed over and over (as
                // any process holding an inherited copy does when it exits).
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = sys::open_close(&p, O_RDONLY, 0);
                    }
                });
                for i in 0..1000i64 {
                    if sys::pwrite(&fd, b"x", i).is_err() {
                        lagging.push((i, -1));
                        break;
                    }
                    let size = sys::fstat(&fd).map_or(-1, |s| s.size);
                    if size != i + 1 {
                        lagging.push((i, size));
                    }
                }
                stop.store(true, Ordering::Relaxed);
            });
            assert!(
                lagging.is_empty(),
                "{} of 1000 fstat calls right after pwrite(1 byte at i) reported a size \
                 other than i + 1; first (i, size): {:?}",
                lagging.len(),
                &lagging[..lagging.len().min(5)]
            );
        },
    );

    env.case(
        "O_APPEND loses nothing while another descriptor is closed",
        |d| {
            let p = d.p("log");
            let fd = ok(
                sys::open(&p, O_CREAT | O_WRONLY | O_TRUNC | O_APPEND, 0o644),
                "open",
            );
            let stop = AtomicBool::new(false);
            let mut want = Vec::new();
            std::thread::scope(|s| {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = sys::open_close(&p, O_RDONLY, 0);
                    }
                });
                for i in 0..1000 {
                    let rec = format!("{i},");
                    let _ = sys::write(&fd, rec.as_bytes());
                    let _ = sys::fstat(&fd);
                    want.extend_from_slice(rec.as_bytes());
                }
                stop.store(true, Ordering::Relaxed);
            });
            drop(fd);
            let got = read_file(&p);
            assert!(
                got == want,
                "appended {} bytes, the file has {} (records overwritten)",
                want.len(),
                got.len()
            );
        },
    );

    env.case(
        "mtime and ctime of a write are kept when the file is closed",
        |d| {
            let p = d.p("f");
            let fd = ok(sys::open(&p, O_CREAT | O_WRONLY, 0o644), "open");
            ok(sys::write(&fd, b"data"), "write");
            let b = ok(sys::fstat(&fd), "fstat");
            drop(fd);
            let a = st(&p);
            same(b.mtime, a.mtime, "mtime across close");
            same(b.ctime, a.ctime, "ctime across close");
        },
    );

    env.case(
        "concurrent writers and closers: every byte lands and the server survives",
        |d| {
            let p = d.p("f");
            let fd = ok(sys::open(&p, O_CREAT | O_RDWR | O_TRUNC, 0o644), "open");
            let stop = AtomicBool::new(false);
            let errors = std::sync::Mutex::new(Vec::new());
            const PER: i64 = 3000;
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        while !stop.load(Ordering::Relaxed) {
                            let _ = sys::open_close(&p, O_RDONLY, 0);
                        }
                    });
                }
                let writers: Vec<_> = (0..4u8)
                    .map(|k| {
                        let (fd, errors) = (&fd, &errors);
                        s.spawn(move || {
                            for i in 0..PER {
                                if let Err(e) = sys::pwrite(fd, &[b'A' + k], k as i64 * PER + i) {
                                    errors.lock().unwrap().push((k, i, errname(e)));
                                    return;
                                }
                            }
                        })
                    })
                    .collect();
                for w in writers {
                    let _ = w.join();
                }
                stop.store(true, Ordering::Relaxed);
            });
            let errors = errors.into_inner().unwrap();
            assert!(
                errors.is_empty(),
                "pwrite failed (writer, index, errno): {errors:?}"
            );
            drop(fd);
            let got = read_file(&p);
            let want: Vec<u8> = (0..4u8)
                .flat_map(|k| std::iter::repeat_n(b'A' + k, PER as usize))
                .collect();
            assert!(got == want, "file content differs ({} bytes)", got.len());
        },
    );
}
