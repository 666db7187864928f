//! posix_fallocate(3) and fallocate(2) (pjdfstest posix_fallocate/*).

use crate::common::pattern;
use crate::harness::*;
use crate::sys;
use libc::{O_CREAT, O_RDONLY, O_RDWR, O_WRONLY};

pub fn run(env: &Env) {
    env.case(
        "posix_fallocate grows the file; data kept, growth reads as zeros",
        |d| {
            let f = d.p("f");
            create(Reg, &f);
            let fd = ok(sys::open(&f, O_RDWR, 0), "open");
            ok(sys::posix_fallocate(&fd, 0, 567), "posix_fallocate 0 567");
            assert_eq!(lst(&f).size, 567);
            let g = d.p("g");
            let data = pattern(12345, 5);
            write_file(&g, &data);
            let fd = ok(sys::open(&g, O_RDWR, 0), "open");
            ok(
                sys::posix_fallocate(&fd, 20000, 3456),
                "posix_fallocate 20000 3456",
            );
            assert_eq!(lst(&g).size, 23456);
            let got = read_file(&g);
            assert!(got[..12345] == data[..], "data kept");
            assert!(got[12345..].iter().all(|b| *b == 0), "zeros beyond");
        },
    );

    env.case(
        "posix_fallocate within the file changes neither size nor data",
        |d| {
            let f = d.p("f");
            let data = pattern(10000, 2);
            write_file(&f, &data);
            let fd = ok(sys::open(&f, O_RDWR, 0), "open");
            ok(
                sys::posix_fallocate(&fd, 100, 5000),
                "posix_fallocate inside",
            );
            assert_eq!(lst(&f).size, 10000);
            assert_eq!(read_file(&f), data);
            ok(sys::posix_fallocate(&fd, 9000, 2000), "straddling the end");
            assert_eq!(lst(&f).size, 11000);
            assert_eq!(read_file(&f)[..10000], data[..]);
        },
    );

    env.case("posix_fallocate updates ctime when the size changes", |d| {
        let f = d.p("f");
        create(Reg, &f);
        let b = st(&f);
        let fd = ok(sys::open(&f, O_RDWR, 0), "open");
        ok(sys::posix_fallocate(&fd, 0, 123), "posix_fallocate");
        let a = st(&f);
        later(b.ctime, a.ctime, "ctime");
        assert_eq!(a.size, 123);
    });

    env.case(
        "EINVAL for a zero or negative length or offset; nothing changes",
        |d| {
            let f = d.p("f");
            create(Reg, &f);
            let b = st(&f);
            let fd = ok(sys::open(&f, O_WRONLY, 0), "open");
            fails(sys::posix_fallocate(&fd, 0, 0), libc::EINVAL, "length 0");
            fails(sys::posix_fallocate(&fd, 0, -1), libc::EINVAL, "length -1");
            fails(sys::posix_fallocate(&fd, -1, 10), libc::EINVAL, "offset -1");
            let a = st(&f);
            same(b.ctime, a.ctime, "ctime");
            assert_eq!(a.size, 0);
        },
    );

    env.case("EBADF on a read-only descriptor", |d| {
        let f = d.p("f");
        create(Reg, &f);
        let fd = ok(sys::open(&f, O_RDONLY, 0), "open");
        fails(sys::posix_fallocate(&fd, 0, 10), libc::EBADF, "O_RDONLY fd");
        assert_eq!(lst(&f).size, 0);
    });

    env.case(
        "on a descriptor of a file created with mode 0 (root and 65534)",
        |d| {
            let f = d.p("f");
            let fd = ok(sys::open(&f, O_CREAT | O_RDWR, 0), "create mode 0");
            ok(sys::posix_fallocate(&fd, 0, 1), "posix_fallocate");
            assert_eq!(lst(&f).size, 1);
            ok(sys::chmod(&d.path, 0o777), "chmod");
            let g = d.p("g");
            ok(
                as_nobody(|| {
                    let fd = sys::open(&g, O_CREAT | O_RDWR, 0)?;
                    sys::posix_fallocate(&fd, 0, 1)
                }),
                "as 65534",
            );
            assert_eq!(lst(&g).size, 1);
        },
    );

    env.case("fallocate KEEP_SIZE beyond the end keeps the size", |d| {
        let f = d.p("f");
        write_file(&f, b"abc");
        let fd = ok(sys::open(&f, O_RDWR, 0), "open");
        ok(
            sys::fallocate(&fd, libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20),
            "FALLOC_FL_KEEP_SIZE",
        );
        assert_eq!(lst(&f).size, 3);
        assert_eq!(read_file(&f), b"abc");
    });

    env.case(
        "fallocate PUNCH_HOLE zeroes the range and keeps the size",
        |d| {
            let f = d.p("f");
            let data = pattern(3 * 4096, 8);
            write_file(&f, &data);
            let fd = ok(sys::open(&f, O_RDWR, 0), "open");
            let b = st(&f);
            ok(
                sys::fallocate(
                    &fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    4096,
                    4096,
                ),
                "punch a hole",
            );
            let a = st(&f);
            assert_eq!(a.size, 3 * 4096);
            later(b.mtime, a.mtime, "mtime after punching");
            later(b.ctime, a.ctime, "ctime after punching");
            let got = read_file(&f);
            assert!(got[..4096] == data[..4096]);
            assert!(got[4096..8192].iter().all(|b| *b == 0), "hole reads zeros");
            assert!(got[8192..] == data[8192..]);
            fails(
                sys::fallocate(&fd, libc::FALLOC_FL_PUNCH_HOLE, 0, 10),
                libc::EOPNOTSUPP,
                "PUNCH_HOLE without KEEP_SIZE",
            );
        },
    );

    env.case("fallocate ZERO_RANGE zeroes and may extend", |d| {
        let f = d.p("f");
        let data = pattern(10000, 4);
        write_file(&f, &data);
        let fd = ok(sys::open(&f, O_RDWR, 0), "open");
        ok(
            sys::fallocate(&fd, libc::FALLOC_FL_ZERO_RANGE, 1000, 2000),
            "zero a range",
        );
        let got = read_file(&f);
        assert_eq!(got.len(), 10000);
        assert!(got[..1000] == data[..1000]);
        assert!(got[1000..3000].iter().all(|b| *b == 0));
        assert!(got[3000..] == data[3000..]);
        ok(
            sys::fallocate(&fd, libc::FALLOC_FL_ZERO_RANGE, 9000, 2000),
            "zero across the end",
        );
        assert_eq!(lst(&f).size, 11000);
    });

    env.case(
        "fallocate on a directory descriptor: EBADF; on a fifo: ESPIPE",
        |d| {
            let fd = ok(sys::open(&d.path, O_RDONLY, 0), "open dir");
            fails(sys::fallocate(&fd, 0, 0, 10), libc::EBADF, "directory");
            ok(sys::mkfifo(d.p("fifo"), 0o644), "mkfifo");
            let fd = ok(sys::open(d.p("fifo"), O_RDWR, 0), "open fifo");
            fails(sys::fallocate(&fd, 0, 0, 10), libc::ESPIPE, "fifo");
        },
    );

    env.case("posix_fallocate with unflushed writes keeps them", |d| {
        let f = d.p("f");
        let fd = ok(sys::open(&f, O_CREAT | O_RDWR, 0o644), "open");
        ok(sys::write(&fd, b"0123456789"), "write");
        ok(sys::posix_fallocate(&fd, 0, 100), "posix_fallocate");
        assert_eq!(ok(sys::fstat(&fd), "fstat").size, 100);
        drop(fd);
        let got = read_file(&f);
        assert_eq!(got.len(), 100);
        assert_eq!(&got[..10], b"0123456789");
        assert!(got[10..].iter().all(|b| *b == 0));
    });
}
