//! truncate(2) and ftruncate(2) (pjdfstest truncate/* and ftruncate/*).

use crate::common::pattern;
use crate::harness::*;
use crate::sys;

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "truncate",
            needs: Needs::File,
            follows: true,
            prep: &no_prep,
            op: &|_, p| sys::truncate(p, 123),
        },
    );

    env.case(
        "truncate grows and shrinks; data kept, growth reads as zeros",
        |d| {
            let f = d.p("f");
            create(Reg, &f);
            ok(sys::truncate(&f, 1234567), "grow");
            assert_eq!(lst(&f).size, 1234567);
            ok(sys::truncate(&f, 567), "shrink");
            assert_eq!(lst(&f).size, 567);
            assert_eq!(read_file(&f), vec![0u8; 567]);
            let data = pattern(12345, 7);
            let g = d.p("g");
            write_file(&g, &data);
            ok(sys::truncate(&g, 23456), "grow a file with data");
            let got = read_file(&g);
            assert_eq!(got.len(), 23456);
            assert!(got[..12345] == data[..], "data before the old end kept");
            assert!(
                got[12345..].iter().all(|b| *b == 0),
                "zeros after the old end"
            );
            ok(sys::truncate(&g, 1), "shrink to 1");
            assert_eq!(read_file(&g), data[..1].to_vec());
            // Shrink then grow: the cut-off bytes do not come back.
            write_file(&g, &data);
            ok(sys::truncate(&g, 100), "shrink");
            ok(sys::truncate(&g, 9000), "grow");
            let got = read_file(&g);
            assert!(got[..100] == data[..100]);
            assert!(got[100..].iter().all(|b| *b == 0), "old bytes came back");
            ok(sys::truncate(&g, 0), "to 0");
            assert_eq!(lst(&g).size, 0);
        },
    );

    env.case("ftruncate on O_RDWR and O_WRONLY descriptors", |d| {
        let f = d.p("f");
        create(Reg, &f);
        let fd = ok(sys::open(&f, libc::O_RDWR, 0), "open");
        ok(sys::ftruncate(&fd, 1234567), "ftruncate");
        assert_eq!(lst(&f).size, 1234567);
        let fd = ok(sys::open(&f, libc::O_WRONLY, 0), "open");
        ok(sys::ftruncate(&fd, 567), "ftruncate");
        assert_eq!(lst(&f).size, 567);
        assert_eq!(ok(sys::fstat(&fd), "fstat").size, 567);
        let data = pattern(12345, 3);
        write_file(&f, &data);
        let fd = ok(sys::open(&f, libc::O_RDWR, 0), "open");
        ok(sys::ftruncate(&fd, 23456), "ftruncate");
        assert_eq!(lst(&f).size, 23456);
        assert_eq!(
            ok(sys::pread(&fd, 100, 12300), "pread")[..45],
            data[12300..]
        );
        ok(sys::ftruncate(&fd, 1), "ftruncate");
        assert_eq!(lst(&f).size, 1);
    });

    env.case("truncate and ftruncate update mtime and ctime", |d| {
        let f = d.p("f");
        create(Reg, &f);
        let b = st(&f);
        ok(sys::truncate(&f, 123), "truncate");
        let a = st(&f);
        later(b.ctime, a.ctime, "ctime after truncate");
        later(b.mtime, a.mtime, "mtime after truncate");
        let fd = ok(sys::open(&f, libc::O_RDWR, 0), "open");
        let b = st(&f);
        ok(sys::ftruncate(&fd, 12), "ftruncate");
        let a = st(&f);
        later(b.ctime, a.ctime, "ctime after ftruncate");
        later(b.mtime, a.mtime, "mtime after ftruncate");
        // The parent directory is not changed.
        let pb = st(&d.path);
        ok(sys::truncate(&f, 5), "truncate");
        let pa = st(&d.path);
        same(pb.mtime, pa.mtime, "parent mtime");
        same(pb.ctime, pa.ctime, "parent ctime");
    });

    env.case("EACCES without write permission; nothing changes", |d| {
        let f = d.p("f");
        write_file(&f, b"hello");
        let b = st(&f);
        fails(
            as_nobody(|| sys::truncate(&f, 123)),
            libc::EACCES,
            "truncate of root's 0644 file as 65534",
        );
        let a = st(&f);
        same(b.ctime, a.ctime, "ctime");
        same(b.mtime, a.mtime, "mtime");
        assert_eq!(a.size, 5);
        ok(sys::chown(&f, NOBODY, NOBODY), "chown");
        ok(sys::chmod(&f, 0o444), "chmod");
        fails(
            as_nobody(|| sys::truncate(&f, 123)),
            libc::EACCES,
            "truncate of an own 0444 file",
        );
        ok(sys::chmod(&f, 0o644), "chmod");
        ok(
            as_nobody(|| sys::truncate(&f, 123)),
            "owner with write permission",
        );
        assert_eq!(lst(&f).size, 123);
        // Write permission via the group or others.
        let g = d.p("g");
        create(Reg, &g);
        ok(sys::chmod(&g, 0o606), "chmod");
        ok(as_nobody(|| sys::truncate(&g, 7)), "write for others");
        ok(sys::chmod(&g, 0o660), "chmod");
        fails(
            as_nobody(|| sys::truncate(&g, 8)),
            libc::EACCES,
            "no write for others",
        );
        ok(
            as_user(NOBODY, 0, || sys::truncate(&g, 9)),
            "write for the group",
        );
        assert_eq!(lst(&g).size, 9);
    });

    env.case(
        "ftruncate of a read-only descriptor: EINVAL, ctime unchanged",
        |d| {
            let f = d.p("f");
            create(Reg, &f);
            let b = st(&f);
            fails(
                as_nobody(|| {
                    let fd = sys::open(&f, libc::O_RDONLY, 0)?;
                    sys::ftruncate(&fd, 123)
                }),
                libc::EINVAL,
                "ftruncate of O_RDONLY fd as 65534",
            );
            let fd = ok(sys::open(&f, libc::O_RDONLY, 0), "open");
            fails(sys::ftruncate(&fd, 123), libc::EINVAL, "as root");
            let a = st(&f);
            same(b.ctime, a.ctime, "ctime");
            assert_eq!(a.size, 0);
        },
    );

    env.case(
        "ftruncate of a file created with mode 0 through its descriptor",
        |d| {
            let f = d.p("f");
            let fd = ok(
                sys::open(&f, libc::O_CREAT | libc::O_RDWR, 0),
                "create mode 0",
            );
            ok(sys::ftruncate(&fd, 0), "ftruncate as root");
            ok(sys::chmod(&d.path, 0o777), "chmod dir");
            let g = d.p("g");
            ok(
                as_nobody(|| {
                    let fd = sys::open(&g, libc::O_CREAT | libc::O_RDWR, 0)?;
                    sys::ftruncate(&fd, 10)
                }),
                "as 65534: create mode 0 and ftruncate",
            );
            let s = lst(&g);
            assert_eq!((s.size, s.perm(), s.uid), (10, 0, NOBODY));
        },
    );

    env.case(
        "EISDIR on a directory; EINVAL on other non-regular files",
        |d| {
            let dir = d.p("dir");
            create(Dir, &dir);
            fails(
                sys::truncate(&dir, 123),
                libc::EISDIR,
                "truncate of a directory",
            );
            for k in [Fifo, Sock] {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                fails(sys::truncate(&p, 0), libc::EINVAL, format!("{k:?}"));
            }
        },
    );

    env.case("EINVAL for a negative length", |d| {
        let f = d.p("f");
        write_file(&f, b"abc");
        fails(sys::truncate(&f, -1), libc::EINVAL, "truncate -1");
        let fd = ok(sys::open(&f, libc::O_RDWR, 0), "open");
        fails(sys::ftruncate(&fd, -1), libc::EINVAL, "ftruncate -1");
        let fd = ok(sys::open(&f, libc::O_WRONLY, 0), "open");
        fails(
            sys::ftruncate(&fd, -999999),
            libc::EINVAL,
            "ftruncate -999999",
        );
        assert_eq!(lst(&f).size, 3);
    });

    env.case(
        "huge length: EFBIG/EINVAL with nothing changed, or exactly that size",
        |d| {
            let f = d.p("f");
            create(Reg, &f);
            let len = 999_999_999_999_999i64;
            match sys::truncate(&f, len) {
                Ok(()) => assert_eq!(lst(&f).size, len),
                Err(e) if e == libc::EFBIG || e == libc::EINVAL => assert_eq!(lst(&f).size, 0),
                Err(e) => panic!("truncate {len}: unexpected {}", errname(e)),
            }
            fails(
                sys::truncate(&f, i64::MAX),
                libc::EFBIG,
                "truncate to i64::MAX",
            );
        },
    );

    env.case("ETXTBSY truncating a program being executed", |d| {
        let prog = Running::start(&d.path);
        fails(sys::truncate(&prog.path, 123), libc::ETXTBSY, "truncate");
        assert!(lst(&prog.path).size > 123, "size unchanged");
    });

    env.case("a file opened for reading sees the new size at once", |d| {
        let f = d.p("f");
        write_file(&f, &pattern(5000, 1));
        let r = ok(sys::open(&f, libc::O_RDONLY, 0), "open");
        ok(sys::truncate(&f, 10), "truncate");
        assert_eq!(ok(sys::fstat(&r), "fstat").size, 10);
        assert_eq!(ok(sys::pread(&r, 100, 0), "pread").len(), 10);
    });

    env.case(
        "truncate while another descriptor has unflushed writes",
        |d| {
            let p = d.p("f");
            let fd = ok(sys::open(&p, libc::O_CREAT | libc::O_RDWR, 0o644), "open");
            ok(sys::write(&fd, b"0123456789"), "write");
            ok(sys::truncate(&p, 4), "truncate by path");
            assert_eq!(ok(sys::fstat(&fd), "fstat").size, 4);
            assert_eq!(ok(sys::pread(&fd, 100, 0), "pread"), b"0123");
            ok(sys::pwrite(&fd, b"X", 6), "write past the new end");
            drop(fd);
            assert_eq!(read_file(&p), b"0123\0\0X");
            let fd = ok(
                sys::open(&p, libc::O_WRONLY | libc::O_TRUNC, 0),
                "open O_TRUNC",
            );
            assert_eq!(st(&p).size, 0);
            ok(sys::write(&fd, b"ab"), "write");
            drop(fd);
            assert_eq!(read_file(&p), b"ab");
        },
    );
}
