//! mknod(2) (pjdfstest mknod/*).

use crate::harness::*;
use crate::mkdir::creation_rules;
use crate::sys;

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "mknod",
            needs: Needs::Nothing,
            follows: false,
            prep: &no_prep,
            op: &|_, p| sys::mknod(p, libc::S_IFIFO | 0o644, 0, 0),
        },
    );
    creation_rules(env, "mknod fifo", Fifo, &|p, mode| {
        sys::mknod(p, libc::S_IFIFO | mode, 0, 0)
    });
    creation_rules(env, "mknod char device", Chr, &|p, mode| {
        sys::mknod(p, libc::S_IFCHR | mode, 1, 2)
    });
    creation_rules(env, "mknod block device", Blk, &|p, mode| {
        sys::mknod(p, libc::S_IFBLK | mode, 1, 2)
    });

    env.case(
        "device files keep their type, mode and major/minor numbers",
        |d| {
            for (fmt, name) in [(libc::S_IFCHR, "char"), (libc::S_IFBLK, "block")] {
                for (major, minor) in [
                    (1, 2),
                    (0, 0),
                    (255, 255),
                    (4095, 4095),
                    (300, 70000),
                    (4095, 1048575),
                ] {
                    let p = d.p(&format!("{name}-{major}-{minor}"));
                    ok(
                        sys::mknod(&p, fmt | 0o755, major, minor),
                        format!("mknod {name} {major},{minor}"),
                    );
                    let s = lst(&p);
                    assert_eq!(
                        (s.fmt(), s.perm(), s.major(), s.minor()),
                        (fmt, 0o755, major, minor),
                        "{name} {major},{minor}"
                    );
                    fails(
                        sys::mknod(&p, fmt | 0o777, 3, 4),
                        libc::EEXIST,
                        format!("{name}: mknod over it"),
                    );
                    assert_eq!(lst(&p).minor(), minor, "unchanged after EEXIST");
                }
            }
        },
    );

    env.case(
        "S_IFREG and type 0 create regular files; S_IFSOCK a socket",
        |d| {
            ok(
                sys::mknod(d.p("r"), libc::S_IFREG | 0o640, 0, 0),
                "mknod S_IFREG",
            );
            let s = lst(d.p("r"));
            assert_eq!((s.fmt(), s.perm(), s.size), (libc::S_IFREG, 0o640, 0));
            ok(sys::mknod(d.p("z"), 0o600, 0, 0), "mknod with no type");
            assert_eq!(lst(d.p("z")).fmt(), libc::S_IFREG);
            ok(
                sys::mknod(d.p("s"), libc::S_IFSOCK | 0o600, 0, 0),
                "mknod S_IFSOCK",
            );
            assert_eq!(lst(d.p("s")).fmt(), libc::S_IFSOCK);
        },
    );

    env.case("EPERM for S_IFDIR, EINVAL for an unknown type", |d| {
        fails(
            sys::mknod(d.p("dir"), libc::S_IFDIR | 0o755, 0, 0),
            libc::EPERM,
            "mknod S_IFDIR",
        );
        fails(
            sys::mknod(d.p("bad"), 0o170000 | 0o644, 0, 0),
            libc::EINVAL,
            "mknod with type 0170000",
        );
        gone(d.p("dir"), "nothing created");
        gone(d.p("bad"), "nothing created");
    });

    env.case(
        "non-root: EPERM for devices; fifos and sockets allowed",
        |d| {
            ok(sys::chmod(&d.path, 0o777), "chmod");
            fails(
                as_nobody(|| sys::mknod(d.p("c"), libc::S_IFCHR | 0o644, 1, 2)),
                libc::EPERM,
                "char device as 65534",
            );
            fails(
                as_nobody(|| sys::mknod(d.p("b"), libc::S_IFBLK | 0o644, 1, 2)),
                libc::EPERM,
                "block device as 65534",
            );
            ok(
                as_nobody(|| sys::mknod(d.p("f"), libc::S_IFIFO | 0o644, 0, 0)),
                "fifo as 65534",
            );
            ok(
                as_nobody(|| sys::mknod(d.p("s"), libc::S_IFSOCK | 0o644, 0, 0)),
                "socket as 65534",
            );
            gone(d.p("c"), "no char device");
            assert_eq!(lst(d.p("f")).uid, NOBODY);
        },
    );

    env.case("EACCES without write permission on the parent", |d| {
        let n1 = d.p("n1");
        ok(sys::mkdir(&n1, 0o755), "mkdir");
        ok(sys::chown(&n1, NOBODY, NOBODY), "chown");
        ok(sys::chmod(&n1, 0o555), "chmod");
        fails(
            as_nobody(|| sys::mknod(n1.join("x"), libc::S_IFIFO | 0o644, 0, 0)),
            libc::EACCES,
            "mknod in a 0555 dir",
        );
    });

    env.case("EEXIST for every existing type", |d| {
        for k in ALL {
            let p = d.p(&format!("{k:?}"));
            create(k, &p);
            fails(
                sys::mknod(&p, libc::S_IFIFO | 0o644, 0, 0),
                libc::EEXIST,
                format!("over a {k:?}"),
            );
        }
    });
}
