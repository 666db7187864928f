//! rmdir(2) (pjdfstest rmdir/*).

use crate::harness::*;
use crate::sys;

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "rmdir",
            needs: Needs::Dir,
            follows: false,
            prep: &no_prep,
            op: &|_, p| sys::rmdir(p),
        },
    );

    env.case(
        "rmdir removes an empty directory; parent nlink, mtime, ctime",
        |d| {
            let n = d.p("n");
            create(Dir, &n);
            let b = st(&d.path);
            ok(sys::rmdir(&n), "rmdir");
            gone(&n, "removed dir");
            let a = st(&d.path);
            assert_eq!(a.nlink, b.nlink - 1, "parent nlink");
            later(b.mtime, a.mtime, "parent mtime");
            later(b.ctime, a.ctime, "parent ctime");
            ok(sys::mkdir(&n, 0o700), "the name is free again");
        },
    );

    env.case("an open directory can be removed; it reads as empty", |d| {
        let n = d.p("n");
        create(Dir, &n);
        let fd = ok(sys::open(&n, libc::O_RDONLY | libc::O_DIRECTORY, 0), "open");
        ok(sys::rmdir(&n), "rmdir");
        let s = ok(sys::fstat(&fd), "fstat");
        assert_eq!(s.nlink, 0, "nlink of a removed directory");
        gone(&n, "removed");
    });

    env.case(
        "ENOTDIR on non-directories and symlinks to directories",
        |d| {
            for k in NOT_DIR {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                fails(sys::rmdir(&p), libc::ENOTDIR, format!("rmdir of a {k:?}"));
                assert_eq!(lst(&p).fmt(), k.fmt());
            }
            create(Dir, d.p("dir"));
            ok(sys::symlink("dir", d.p("ld")), "symlink");
            fails(
                sys::rmdir(d.p("ld")),
                libc::ENOTDIR,
                "rmdir of a symlink to a dir",
            );
            lst(d.p("dir"));
            fails(
                sys::rmdir(d.p("ld/")),
                libc::ENOTDIR,
                "rmdir of a symlink to a dir, with a trailing slash",
            );
            lst(d.p("dir"));
        },
    );

    env.case("ENOTEMPTY for every child type; nothing changes", |d| {
        let n = d.p("n");
        create(Dir, &n);
        for k in ALL {
            let c = n.join("c");
            create(k, &c);
            let b = st(&d.path);
            fails(sys::rmdir(&n), libc::ENOTEMPTY, format!("child {k:?}"));
            let a = st(&d.path);
            same(b.mtime, a.mtime, "parent mtime");
            same(b.ctime, a.ctime, "parent ctime");
            ok(remove(&c), "remove child");
        }
        ok(sys::rmdir(&n), "rmdir once empty");
    });

    env.case("EINVAL for '.', ENOTEMPTY for '..'", |d| {
        create(Dir, d.p("n0"));
        create(Dir, d.p("n0/n1"));
        fails(sys::rmdir(d.p("n0/n1/.")), libc::EINVAL, "rmdir n0/n1/.");
        fails(
            sys::rmdir(d.p("n0/n1/..")),
            libc::ENOTEMPTY,
            "rmdir n0/n1/..",
        );
        lst(d.p("n0/n1"));
    });

    env.case("EACCES without write permission on the parent", |d| {
        let n = d.p("n");
        ok(sys::mkdir(&n, 0o755), "mkdir");
        ok(sys::chown(&n, NOBODY, NOBODY), "chown");
        ok(
            as_nobody(|| sys::mkdir(n.join("x"), 0o755)),
            "mkdir as owner",
        );
        ok(as_nobody(|| sys::rmdir(n.join("x"))), "rmdir as owner");
        ok(
            as_nobody(|| sys::mkdir(n.join("x"), 0o755)),
            "mkdir as owner",
        );
        ok(sys::chmod(&n, 0o555), "chmod");
        let b = st(&n);
        fails(
            as_nobody(|| sys::rmdir(n.join("x"))),
            libc::EACCES,
            "rmdir in a 0555 dir",
        );
        let a = st(&n);
        same(b.mtime, a.mtime, "parent mtime");
        assert_eq!(a.nlink, b.nlink);
        ok(sys::chmod(&n, 0o755), "chmod");
        ok(as_nobody(|| sys::rmdir(n.join("x"))), "rmdir again");
    });

    env.case(
        "sticky parent: EPERM unless owning the directory or the parent",
        |d| {
            let n0 = d.p("n0");
            ok(sys::mkdir(&n0, 0o755), "mkdir");
            ok(sys::chmod(&n0, 0o1777), "chmod");
            let n1 = n0.join("n1");
            for (downer, owner, allowed) in [
                (NOBODY, NOBODY, true),
                (0, NOBODY, true),
                (OTHER, NOBODY, true),
                (NOBODY, 0, true),
                (NOBODY, OTHER, true),
                (0, 0, false),
                (OTHER, OTHER, false),
            ] {
                ok(sys::chown(&n0, downer, downer), "chown");
                create_owned(Dir, &n1, owner, owner);
                let what = format!("dir of {owner} in sticky dir of {downer}");
                let r = as_nobody(|| sys::rmdir(&n1));
                if allowed {
                    ok(r, &what);
                    gone(&n1, &what);
                } else {
                    fails_any(r, &[libc::EPERM, libc::EACCES], &what);
                    assert_eq!(lst(&n1).uid, owner, "{what}: kept");
                    ok(sys::rmdir(&n1), "cleanup");
                }
            }
        },
    );

    env.case("ENOENT for a dangling symlink prefix", |d| {
        ok(sys::symlink("nowhere", d.p("dl")), "symlink");
        fails(sys::rmdir(d.p("dl/x")), libc::ENOENT, "rmdir dl/x");
    });

    env.case("EBUSY for the root of the mount (a mount point)", |d| {
        if !d.fuse {
            return;
        }
        let mut root = d.path.clone();
        root.pop();
        root.pop();
        fails_any(
            sys::rmdir(&root),
            &[libc::EBUSY],
            "rmdir of the mount point",
        );
    });
}
