//! chown(2), lchown(2), fchown(2), with -1 arguments (pjdfstest chown/*).

use crate::harness::*;
use crate::sys::{self, KEEP};

fn ids(p: &std::path::Path) -> (u32, u32) {
    let s = lst(p);
    (s.uid, s.gid)
}

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "chown",
            needs: Needs::File,
            follows: true,
            prep: &no_prep,
            op: &|_, p| sys::chown(p, NOBODY, NOBODY),
        },
    );
    path_errors(
        env,
        &PathOp {
            name: "lchown",
            needs: Needs::File,
            follows: false,
            prep: &no_prep,
            op: &|_, p| sys::lchown(p, NOBODY, NOBODY),
        },
    );

    env.case("root changes owner and group of every type", |d| {
        for k in NOT_SYMLINK {
            let p = d.p(&format!("{k:?}"));
            let l = d.p(&format!("{k:?}-link"));
            create(k, &p);
            ok(sys::chown(&p, 123, 456), "chown 123:456");
            assert_eq!(ids(&p), (123, 456), "{k:?}");
            ok(sys::chown(&p, 0, 0), "chown 0:0");
            assert_eq!(ids(&p), (0, 0), "{k:?}");
            ok(sys::symlink(&p, &l), "symlink");
            let link_ids = ids(&l);
            ok(sys::chown(&l, 123, 456), "chown through a symlink");
            let s = st(&l);
            assert_eq!((s.uid, s.gid), (123, 456), "{k:?}: target via symlink");
            assert_eq!(ids(&p), (123, 456), "{k:?}: target");
            assert_eq!(ids(&l), link_ids, "{k:?}: the symlink itself unchanged");
        }
        for k in ALL {
            let p = d.p(&format!("l-{k:?}"));
            create(k, &p);
            ok(sys::lchown(&p, 123, 456), "lchown");
            assert_eq!(ids(&p), (123, 456), "{k:?}: lchown");
        }
    });

    env.case("root: -1 leaves owner or group unchanged", |d| {
        let f = d.p("f");
        create(Reg, &f);
        ok(sys::chown(&f, 123, 456), "chown");
        ok(sys::chown(&f, KEEP, 789), "chown -1 789");
        assert_eq!(ids(&f), (123, 789));
        ok(sys::chown(&f, 321, KEEP), "chown 321 -1");
        assert_eq!(ids(&f), (321, 789));
        ok(sys::chown(&f, KEEP, KEEP), "chown -1 -1");
        assert_eq!(ids(&f), (321, 789));
        ok(sys::lchown(&f, KEEP, 7), "lchown -1 7");
        assert_eq!(ids(&f), (321, 7));
    });

    env.case(
        "the owner may change the group to one of its groups (chown, via symlink, lchown)",
        |d| {
            for k in NOT_SYMLINK {
                let p = d.p(&format!("{k:?}"));
                create_owned(k, &p, NOBODY, OTHER);
                let groups = [G3, G4];
                ok(
                    in_child(NOBODY, &groups, None, || sys::chown(&p, KEEP, G3)),
                    format!("{k:?}: chown -1 65532 by the owner"),
                );
                assert_eq!(ids(&p), (NOBODY, G3), "{k:?}");
                ok(
                    in_child(NOBODY, &groups, None, || sys::chown(&p, NOBODY, G4)),
                    format!("{k:?}: chown 65534 65531 by the owner"),
                );
                assert_eq!(ids(&p), (NOBODY, G4), "{k:?}");
                let l = d.p(&format!("{k:?}-link"));
                ok(sys::symlink(&p, &l), "symlink");
                let link_ids = ids(&l);
                ok(
                    in_child(NOBODY, &groups, None, || sys::chown(&l, KEEP, G3)),
                    format!("{k:?}: chown via symlink"),
                );
                assert_eq!(ids(&p), (NOBODY, G3), "{k:?} via symlink");
                assert_eq!(ids(&l), link_ids, "{k:?}: symlink itself unchanged");
            }
            for k in ALL {
                let p = d.p(&format!("l-{k:?}"));
                create_owned(k, &p, NOBODY, OTHER);
                ok(
                    in_child(NOBODY, &[G3, G4], None, || sys::lchown(&p, KEEP, G3)),
                    format!("{k:?}: lchown -1 65532 by the owner"),
                );
                assert_eq!(ids(&p), (NOBODY, G3), "{k:?}: lchown");
            }
        },
    );

    env.case(
        "uid 1000 may chgrp to a supplementary group, not give away",
        |d| {
            let f = d.p("f");
            create_owned(Reg, &f, 1000, 1000);
            ok(
                in_child(1000, &[1000, 1001], None, || sys::chown(&f, KEEP, 1001)),
                "chgrp to a supplementary group",
            );
            assert_eq!(ids(&f), (1000, 1001));
            ok(
                in_child(1000, &[1000, 1001], None, || sys::chown(&f, 1000, 1000)),
                "chgrp back to the primary group, own uid given",
            );
            assert_eq!(ids(&f), (1000, 1000));
            fails(
                in_child(1000, &[1000, 1001], None, || sys::chown(&f, KEEP, 1002)),
                libc::EPERM,
                "chgrp to a group the owner is not in",
            );
            fails(
                in_child(1000, &[1000, 1001], None, || sys::chown(&f, 1001, KEEP)),
                libc::EPERM,
                "giving the file away",
            );
            assert_eq!(ids(&f), (1000, 1000));
        },
    );

    env.case(
        "chown -1 -1 by a non-owner succeeds and changes nothing",
        |d| {
            for k in NOT_SYMLINK {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                ok(
                    as_nobody(|| sys::chown(&p, KEEP, KEEP)),
                    format!("{k:?}: chown -1 -1 as 65534"),
                );
                assert_eq!(ids(&p), (0, 0), "{k:?}");
                let l = d.p(&format!("{k:?}-link"));
                ok(sys::symlink(&p, &l), "symlink");
                ok(
                    as_nobody(|| sys::chown(&l, KEEP, KEEP)),
                    format!("{k:?}: chown -1 -1 via symlink"),
                );
                assert_eq!(ids(&p), (0, 0), "{k:?}");
                assert_eq!(ids(&l), (0, 0), "{k:?}: symlink");
            }
            for k in ALL {
                let p = d.p(&format!("l-{k:?}"));
                create(k, &p);
                ok(
                    as_nobody(|| sys::lchown(&p, KEEP, KEEP)),
                    format!("{k:?}: lchown -1 -1 as 65534"),
                );
                assert_eq!(ids(&p), (0, 0), "{k:?}");
            }
        },
    );

    env.case(
        "root's chown clears SUID/SGID on non-directories, keeps them on directories",
        |d| {
            for k in NOT_SYMLINK {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                ok(sys::chown(&p, NOBODY, OTHER), "chown");
                ok(sys::chmod(&p, 0o6555), "chmod 06555");
                assert_eq!(st(&p).perm(), 0o6555, "{k:?}");
                ok(sys::chown(&p, G3, G4), "chown 65532:65531");
                let want = if k == Dir { 0o6555 } else { 0o555 };
                let s = st(&p);
                assert_eq!(
                    (s.perm(), s.uid, s.gid),
                    (want, G3, G4),
                    "{k:?}: mode after root's chown"
                );
            }
        },
    );

    env.case(
        "the owner's chown clears SUID/SGID on non-directories (also with -1 -1)",
        |d| {
            for k in NOT_SYMLINK {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                ok(sys::chown(&p, NOBODY, OTHER), "chown");
                let want = if k == Dir { 0o6555 } else { 0o555 };
                let groups = [OTHER, G3];
                ok(sys::chmod(&p, 0o6555), "chmod");
                ok(
                    in_child(NOBODY, &groups, None, || sys::chown(&p, NOBODY, G3)),
                    format!("{k:?}: owner chown 65534 65532"),
                );
                let s = st(&p);
                assert_eq!((s.perm(), s.gid), (want, G3), "{k:?}: after chown");
                ok(sys::chmod(&p, 0o6555), "chmod");
                ok(
                    in_child(NOBODY, &groups, None, || sys::chown(&p, KEEP, OTHER)),
                    format!("{k:?}: owner chown -1 65533"),
                );
                let s = st(&p);
                assert_eq!((s.perm(), s.gid), (want, OTHER), "{k:?}: after chgrp");
                ok(sys::chmod(&p, 0o6555), "chmod");
                ok(
                    in_child(NOBODY, &groups, None, || sys::chown(&p, KEEP, KEEP)),
                    format!("{k:?}: owner chown -1 -1"),
                );
                assert_eq!(st(&p).perm(), want, "{k:?}: after chown -1 -1");
            }
        },
    );

    env.case(
        "SGID without group execute survives the owner's chgrp",
        |d| {
            let f = d.p("f");
            create_owned(Reg, &f, NOBODY, OTHER);
            ok(sys::chmod(&f, 0o2745), "chmod 02745");
            ok(
                in_child(NOBODY, &[OTHER, G3], None, || sys::chown(&f, KEEP, G3)),
                "chgrp",
            );
            assert_eq!(st(&f).perm(), 0o2745);
        },
    );

    env.case(
        "chown updates ctime (root, owner, via symlink, lchown)",
        |d| {
            for k in NOT_SYMLINK {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                let b = st(&p);
                ok(sys::chown(&p, NOBODY, OTHER), "chown");
                let a = st(&p);
                later(b.ctime, a.ctime, format!("{k:?}: root chown"));
                same(b.mtime, a.mtime, format!("{k:?}: mtime after chown"));
                let b = a;
                ok(
                    as_user(NOBODY, G3, || sys::chown(&p, NOBODY, G3)),
                    "owner chgrp",
                );
                let a = st(&p);
                assert_eq!((a.uid, a.gid), (NOBODY, G3));
                later(b.ctime, a.ctime, format!("{k:?}: owner chgrp"));
                let l = d.p(&format!("{k:?}-link"));
                ok(sys::symlink(&p, &l), "symlink");
                let b = st(&l);
                ok(sys::chown(&l, OTHER, G3), "chown via symlink");
                let a = st(&l);
                assert_eq!((a.uid, a.gid), (OTHER, G3));
                later(b.ctime, a.ctime, format!("{k:?}: chown via symlink"));
            }
            for k in ALL {
                let p = d.p(&format!("l-{k:?}"));
                create(k, &p);
                let b = lst(&p);
                ok(sys::lchown(&p, NOBODY, OTHER), "lchown");
                let a = lst(&p);
                later(b.ctime, a.ctime, format!("{k:?}: lchown"));
                let b = a;
                ok(
                    as_user(NOBODY, G3, || sys::lchown(&p, NOBODY, G3)),
                    "owner lchown",
                );
                let a = lst(&p);
                assert_eq!((a.uid, a.gid), (NOBODY, G3));
                later(b.ctime, a.ctime, format!("{k:?}: owner lchown"));
            }
        },
    );

    env.case("EPERM for a non-owner; ctime and ids unchanged", |d| {
        for k in NOT_SYMLINK {
            let p = d.p(&format!("{k:?}"));
            let l = d.p(&format!("{k:?}-link"));
            create(k, &p);
            ok(sys::symlink(&p, &l), "symlink");
            for target in [&p, &l] {
                let b = st(target);
                fails(
                    as_user(NOBODY, 0, || sys::chown(target, NOBODY, KEEP)),
                    libc::EPERM,
                    format!("{k:?}: chown 65534 -1 of root's file"),
                );
                fails(
                    as_nobody(|| sys::chown(target, KEEP, NOBODY)),
                    libc::EPERM,
                    format!("{k:?}: chown -1 65534 of root's file"),
                );
                fails(
                    as_nobody(|| sys::chown(target, NOBODY, NOBODY)),
                    libc::EPERM,
                    format!("{k:?}: chown 65534 65534 of root's file"),
                );
                let a = st(target);
                same(b.ctime, a.ctime, format!("{k:?}: ctime"));
                assert_eq!((a.uid, a.gid), (0, 0), "{k:?}");
            }
        }
        for k in ALL {
            let p = d.p(&format!("l-{k:?}"));
            create(k, &p);
            let b = lst(&p);
            fails(
                as_user(NOBODY, 0, || sys::lchown(&p, NOBODY, KEEP)),
                libc::EPERM,
                format!("{k:?}: lchown 65534 -1"),
            );
            fails(
                as_nobody(|| sys::lchown(&p, KEEP, NOBODY)),
                libc::EPERM,
                format!("{k:?}: lchown -1 65534"),
            );
            let a = lst(&p);
            same(b.ctime, a.ctime, format!("{k:?}: ctime"));
            assert_eq!((a.uid, a.gid), (0, 0), "{k:?}");
        }
    });

    env.case(
        "EPERM giving a file away or to a foreign group (chown/07)",
        |d| {
            let dir = d.p("dir");
            ok(sys::mkdir(&dir, 0o755), "mkdir");
            ok(sys::chown(&dir, NOBODY, NOBODY), "chown");
            for k in ALL {
                let p = dir.join(format!("{k:?}"));
                create_owned(k, &p, NOBODY, NOBODY);
                let l = dir.join(format!("{k:?}-link"));
                ok(sys::symlink(format!("{k:?}"), &l), "symlink");
                ok(sys::lchown(&l, NOBODY, NOBODY), "lchown");
                let mut calls: Vec<(&str, &std::path::Path, bool)> = vec![("lchown", &p, false)];
                if k != Symlink {
                    calls.push(("chown", &p, true));
                    calls.push(("chown via symlink", &l, true));
                }
                for (name, target, follow) in calls {
                    let call = |u: u32, g: u32| {
                        if follow {
                            sys::chown(target, u, g)
                        } else {
                            sys::lchown(target, u, g)
                        }
                    };
                    fails(
                        as_nobody(|| call(OTHER, OTHER)),
                        libc::EPERM,
                        format!("{k:?} {name}: owner gives away"),
                    );
                    fails(
                        as_user(OTHER, OTHER, || call(NOBODY, NOBODY)),
                        libc::EPERM,
                        format!("{k:?} {name}: non-owner sets the owner's ids"),
                    );
                    fails(
                        as_user(OTHER, OTHER, || call(OTHER, OTHER)),
                        libc::EPERM,
                        format!("{k:?} {name}: non-owner takes"),
                    );
                    fails(
                        as_nobody(|| call(KEEP, OTHER)),
                        libc::EPERM,
                        format!("{k:?} {name}: chgrp to a foreign group"),
                    );
                    assert_eq!(ids(&p), (NOBODY, NOBODY), "{k:?} {name}");
                }
            }
        },
    );

    env.case("fchown changes owner and ctime of an open file", |d| {
        let f = d.p("f");
        create(Reg, &f);
        let fd = ok(sys::open(&f, libc::O_RDONLY, 0), "open");
        let b = st(&f);
        ok(sys::fchown(&fd, NOBODY, OTHER), "fchown");
        let a = st(&f);
        assert_eq!((a.uid, a.gid), (NOBODY, OTHER));
        later(b.ctime, a.ctime, "ctime");
        fails(
            as_user(OTHER, OTHER, || {
                let fd = sys::open(&f, libc::O_RDONLY, 0)?;
                sys::fchown(&fd, OTHER, OTHER)
            }),
            libc::EPERM,
            "fchown by a non-owner",
        );
    });
}
