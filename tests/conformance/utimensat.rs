//! utimensat(2) and futimens(3) (pjdfstest utimensat/*).

use crate::harness::*;
use crate::sys::{self, NOW, OMIT, Ts};

const DATE1: i64 = 1_900_000_000;
const DATE2: i64 = 1_950_000_000;

fn ts(sec: i64, nsec: i64) -> Ts {
    Ts { sec, nsec }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "utimensat",
            needs: Needs::File,
            follows: true,
            prep: &no_prep,
            op: &|_, p| sys::utimensat(p, Some([(DATE1, 0), (DATE2, 0)]), 0),
        },
    );

    env.case("sets atime and mtime on every type", |d| {
        for k in NOT_SYMLINK {
            let p = d.p(&format!("{k:?}"));
            create(k, &p);
            ok(
                sys::utimensat(&p, Some([(DATE1, 0), (DATE2, 0)]), 0),
                "utimensat",
            );
            let s = lst(&p);
            assert_eq!((s.atime, s.mtime), (ts(DATE1, 0), ts(DATE2, 0)), "{k:?}");
        }
    });

    env.case("UTIME_NOW sets the current time; NULL times too", |d| {
        let p = d.p("f");
        create(Reg, &p);
        ok(
            sys::utimensat(&p, Some([(DATE1, 0), (DATE2, 0)]), 0),
            "set to the future",
        );
        ok(sys::utimensat(&p, Some([(1, 0), (1, 0)]), 0), "set to 1970");
        let b = lst(&p);
        ok(sys::utimensat(&p, Some([NOW, NOW]), 0), "UTIME_NOW");
        let a = lst(&p);
        let now = now_secs();
        for (name, t) in [("atime", a.atime), ("mtime", a.mtime)] {
            assert!(
                (now - 300..=now + 300).contains(&t.sec),
                "{name} {t:?} not near now ({now})"
            );
        }
        later(b.ctime, a.ctime, "ctime");
        ok(sys::utimensat(&p, Some([(1, 0), (1, 0)]), 0), "set to 1970");
        ok(sys::utimensat(&p, None, 0), "NULL times");
        let a = lst(&p);
        assert!(
            (now - 300..=now + 300).contains(&a.atime.sec),
            "atime after NULL"
        );
        assert!(
            (now - 300..=now + 300).contains(&a.mtime.sec),
            "mtime after NULL"
        );
    });

    env.case("UTIME_OMIT leaves that time unchanged", |d| {
        let p = d.p("f");
        create(Reg, &p);
        let orig = lst(&p);
        ok(
            sys::utimensat(&p, Some([(DATE1, 0), OMIT]), 0),
            "atime only",
        );
        let s = lst(&p);
        assert_eq!((s.atime, s.mtime), (ts(DATE1, 0), orig.mtime));
        ok(
            sys::utimensat(&p, Some([OMIT, (DATE2, 0)]), 0),
            "mtime only",
        );
        let s = lst(&p);
        assert_eq!((s.atime, s.mtime), (ts(DATE1, 0), ts(DATE2, 0)));
        ok(sys::utimensat(&p, Some([NOW, OMIT]), 0), "atime now");
        let s2 = lst(&p);
        assert_eq!(s2.mtime, ts(DATE2, 0), "mtime kept with (NOW, OMIT)");
        assert!(s2.atime.sec < DATE1, "atime set to now");
    });

    env.case(
        "both UTIME_OMIT: success and nothing changes, ctime included",
        |d| {
            let p = d.p("f");
            create(Reg, &p);
            ok(sys::utimensat(&p, Some([(DATE1, 0), (DATE2, 0)]), 0), "set");
            let b = lst(&p);
            ok(sys::utimensat(&p, Some([OMIT, OMIT]), 0), "both omitted");
            let a = lst(&p);
            same(b.ctime, a.ctime, "ctime");
            assert_eq!((a.atime, a.mtime), (b.atime, b.mtime));
        },
    );

    env.case(
        "setting times updates ctime (to now, not to the times given)",
        |d| {
            let p = d.p("f");
            create(Reg, &p);
            let b = lst(&p);
            ok(
                sys::utimensat(&p, Some([(DATE1, 0), (DATE2, 0)]), 0),
                "utimensat",
            );
            let a = lst(&p);
            later(b.ctime, a.ctime, "ctime");
            assert!(a.ctime.sec < DATE1, "ctime is now, not a given time");
        },
    );

    env.case("mtime may be before atime and the other way round", |d| {
        let p = d.p("f");
        create(Reg, &p);
        let (d1, d2) = (100_000_000, 200_000_000);
        ok(sys::utimensat(&p, Some([(d1, 0), (d2, 0)]), 0), "utimensat");
        let s = lst(&p);
        assert_eq!((s.atime, s.mtime), (ts(d1, 0), ts(d2, 0)));
        ok(sys::utimensat(&p, Some([(d2, 0), (d1, 0)]), 0), "utimensat");
        let s = lst(&p);
        assert_eq!((s.atime, s.mtime), (ts(d2, 0), ts(d1, 0)));
    });

    env.case("follows symlinks unless AT_SYMLINK_NOFOLLOW", |d| {
        let f = d.p("f");
        create(Reg, &f);
        ok(sys::symlink("f", d.p("l")), "symlink");
        let l = d.p("l");
        ok(
            sys::utimensat(&f, Some([(DATE1, 0), (DATE2, 0)]), 0),
            "on the file",
        );
        ok(
            sys::utimensat(
                &l,
                Some([(1_960_000_000, 0), (1_970_000_000, 0)]),
                libc::AT_SYMLINK_NOFOLLOW,
            ),
            "on the link itself",
        );
        let s = lst(&f);
        assert_eq!(
            (s.atime, s.mtime),
            (ts(DATE1, 0), ts(DATE2, 0)),
            "file untouched"
        );
        let s = lst(&l);
        assert_eq!(
            (s.atime, s.mtime),
            (ts(1_960_000_000, 0), ts(1_970_000_000, 0)),
            "link's own times"
        );
        ok(
            sys::utimensat(&l, Some([(1_980_000_000, 0), (1_990_000_000, 0)]), 0),
            "through the link",
        );
        let s = lst(&f);
        assert_eq!(
            (s.atime, s.mtime),
            (ts(1_980_000_000, 0), ts(1_990_000_000, 0))
        );
        assert_eq!(lst(&l).mtime, ts(1_970_000_000, 0), "link's own mtime kept");
    });

    env.case(
        "UTIME_NOW needs ownership or write permission (EACCES otherwise)",
        |d| {
            let p = d.p("f");
            create(Reg, &p);
            ok(sys::utimensat(&p, Some([(DATE1, 0), (DATE2, 0)]), 0), "set");
            let b = lst(&p);
            fails(
                as_nobody(|| sys::utimensat(&p, Some([NOW, NOW]), 0)),
                libc::EACCES,
                "UTIME_NOW on root's 0644 file",
            );
            fails(
                as_nobody(|| sys::utimensat(&p, None, 0)),
                libc::EACCES,
                "NULL times on root's 0644 file",
            );
            let a = lst(&p);
            same(b.ctime, a.ctime, "ctime after the failure");
            assert_eq!(
                (a.atime, a.mtime),
                (b.atime, b.mtime),
                "times after the failure"
            );
            ok(sys::chown(&p, NOBODY, NOBODY), "chown");
            ok(sys::chmod(&p, 0o444), "chmod");
            ok(
                as_nobody(|| sys::utimensat(&p, Some([NOW, NOW]), 0)),
                "the owner without write permission",
            );
            ok(
                sys::utimensat(&p, Some([OMIT, OMIT]), 0),
                "root, both omitted",
            );
            ok(sys::chown(&p, 0, 0), "chown");
            ok(sys::chmod(&p, 0o666), "chmod");
            ok(
                as_nobody(|| sys::utimensat(&p, Some([NOW, NOW]), 0)),
                "non-owner with write permission",
            );
            ok(
                as_nobody(|| sys::utimensat(&p, None, 0)),
                "NULL times, with write permission",
            );
            // Anything but (NOW, NOW) counts as setting explicit times (Linux).
            fails(
                as_nobody(|| sys::utimensat(&p, Some([NOW, OMIT]), 0)),
                libc::EPERM,
                "(NOW, OMIT) with write permission, not the owner",
            );
        },
    );

    env.case(
        "explicit times need ownership: EPERM even with write permission",
        |d| {
            let p = d.p("f");
            create(Reg, &p);
            for mode in [0o644, 0o666] {
                ok(sys::chmod(&p, mode), "chmod");
                let b = lst(&p);
                for (times, name) in [
                    ([OMIT, (DATE2, 0)], "(OMIT, DATE2)"),
                    ([(DATE1, 0), OMIT], "(DATE1, OMIT)"),
                    ([(DATE1, 0), (DATE2, 0)], "(DATE1, DATE2)"),
                    ([NOW, (DATE2, 0)], "(NOW, DATE2)"),
                    ([OMIT, NOW], "(OMIT, NOW)"),
                ] {
                    fails(
                        as_nobody(|| sys::utimensat(&p, Some(times), 0)),
                        libc::EPERM,
                        format!("{mode:o}: {name} as a non-owner"),
                    );
                }
                let a = lst(&p);
                same(b.ctime, a.ctime, "ctime after the failures");
                assert_eq!((a.atime, a.mtime), (b.atime, b.mtime));
            }
            ok(sys::chown(&p, NOBODY, NOBODY), "chown");
            ok(sys::chmod(&p, 0o444), "chmod");
            ok(
                as_nobody(|| sys::utimensat(&p, Some([(DATE1, 0), (DATE2, 0)]), 0)),
                "the owner",
            );
            ok(
                sys::utimensat(&p, Some([(DATE2, 0), (DATE1, 0)]), 0),
                "root",
            );
            let s = lst(&p);
            assert_eq!((s.atime, s.mtime), (ts(DATE2, 0), ts(DATE1, 0)));
        },
    );

    env.case("nanoseconds are kept", |d| {
        let p = d.p("f");
        create(Reg, &p);
        for (a, m) in [
            ((100_000_000, 100_000_000), (200_000_000, 200_000_000)),
            ((DATE1, 1), (DATE2, 999_999_999)),
            ((1_700_000_000, 123_456_789), (1_700_000_001, 987_654_321)),
        ] {
            ok(sys::utimensat(&p, Some([a, m]), 0), "utimensat");
            let s = lst(&p);
            assert_eq!(
                (s.atime, s.mtime),
                (ts(a.0, a.1), ts(m.0, m.1)),
                "{a:?} {m:?}"
            );
        }
    });

    env.case("times past 2038 and 2106 (y2038)", |d| {
        let p = d.p("f");
        create(Reg, &p);
        let (d1, d2) = (1i64 << 31, 1i64 << 32);
        ok(sys::utimensat(&p, Some([(d1, 0), (d2, 0)]), 0), "utimensat");
        let s = lst(&p);
        assert_eq!((s.atime, s.mtime), (ts(d1, 0), ts(d2, 0)));
    });

    env.case("times before 1970 are kept", |d| {
        let p = d.p("f");
        create(Reg, &p);
        let (a, m) = ((-100_000_000, 500_000_000), (-1, 0));
        ok(sys::utimensat(&p, Some([a, m]), 0), "utimensat");
        let s = lst(&p);
        assert_eq!((s.atime, s.mtime), (ts(a.0, a.1), ts(m.0, m.1)));
    });

    env.case("EINVAL for nanoseconds out of range", |d| {
        let p = d.p("f");
        create(Reg, &p);
        let b = lst(&p);
        fails(
            sys::utimensat(&p, Some([(DATE1, 1_000_000_000), OMIT]), 0),
            libc::EINVAL,
            "tv_nsec = 1e9",
        );
        fails(
            sys::utimensat(&p, Some([OMIT, (DATE1, -5)]), 0),
            libc::EINVAL,
            "tv_nsec = -5",
        );
        same(b.mtime, lst(&p).mtime, "mtime");
    });

    env.case("futimens on an open descriptor", |d| {
        let p = d.p("f");
        create(Reg, &p);
        let fd = ok(sys::open(&p, libc::O_RDONLY, 0), "open");
        ok(sys::futimens(&fd, [(DATE1, 5), (DATE2, 6)]), "futimens");
        let s = lst(&p);
        assert_eq!((s.atime, s.mtime), (ts(DATE1, 5), ts(DATE2, 6)));
    });

    env.case(
        "the times survive other changes (chmod, rename, link)",
        |d| {
            let p = d.p("f");
            create(Reg, &p);
            ok(sys::utimensat(&p, Some([(DATE1, 7), (DATE2, 8)]), 0), "set");
            ok(sys::chmod(&p, 0o600), "chmod");
            ok(sys::rename(&p, d.p("g")), "rename");
            ok(sys::link(d.p("g"), d.p("h")), "link");
            let s = lst(d.p("h"));
            assert_eq!((s.atime, s.mtime), (ts(DATE1, 7), ts(DATE2, 8)));
        },
    );

    env.case(
        "times set on a descriptor with unflushed writes survive the close",
        |d| {
            let p = d.p("f");
            let fd = ok(sys::open(&p, libc::O_CREAT | libc::O_WRONLY, 0o644), "open");
            ok(sys::write(&fd, b"hello"), "write");
            ok(sys::futimens(&fd, [(DATE1, 1), (DATE2, 2)]), "futimens");
            drop(fd);
            let s = lst(&p);
            assert_eq!(
                (s.atime, s.mtime),
                (ts(DATE1, 1), ts(DATE2, 2)),
                "after close"
            );
            assert_eq!(s.size, 5);
            let fd = ok(sys::open(&p, libc::O_WRONLY, 0), "open");
            ok(sys::write(&fd, b"HE"), "write");
            ok(
                sys::utimensat(&p, Some([(DATE2, 3), (DATE1, 4)]), 0),
                "utimensat by path",
            );
            drop(fd);
            let s = lst(&p);
            assert_eq!(
                (s.atime, s.mtime),
                (ts(DATE2, 3), ts(DATE1, 4)),
                "after close"
            );
        },
    );
}
