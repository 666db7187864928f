//! symlink(2) and readlink(2) (pjdfstest symlink/*).

use crate::harness::*;
use crate::sys;

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "symlink",
            needs: Needs::Nothing,
            follows: false,
            prep: &no_prep,
            op: &|_, p| sys::symlink("test", p),
        },
    );

    env.case(
        "symlink creates a link: lstat sees it, stat and open follow it",
        |d| {
            let f = d.p("f");
            write_file(&f, b"data");
            ok(sys::chmod(&f, 0o644), "chmod");
            ok(sys::symlink(&f, d.p("l")), "symlink");
            let l = lst(d.p("l"));
            assert_eq!(l.fmt(), libc::S_IFLNK);
            assert_eq!(l.perm(), 0o777, "symlinks are 0777");
            assert_eq!(
                l.size as usize,
                f.as_os_str().len(),
                "size is the target length"
            );
            assert_eq!(l.nlink, 1);
            let s = st(d.p("l"));
            assert_eq!(
                (s.fmt(), s.perm(), s.ino),
                (libc::S_IFREG, 0o644, lst(&f).ino)
            );
            assert_eq!(read_file(d.p("l")), b"data");
            ok(sys::unlink(&f), "unlink the target");
            fails(sys::stat(d.p("l")), libc::ENOENT, "stat of a dangling link");
            lst(d.p("l"));
            ok(sys::unlink(d.p("l")), "unlink the link");
        },
    );

    env.case("readlink returns the target exactly, whatever it is", |d| {
        let long = "t/".repeat(1000) + "end";
        let targets: Vec<&str> = vec![
            "x",
            "../relative/path",
            "/absolute/path",
            "with space and\ttab",
            "trailing/",
            ".",
            "..",
            "\u{e9}t\u{e9}",
            &long,
        ];
        for (i, t) in targets.iter().enumerate() {
            let p = d.p(&format!("l{i}"));
            ok(sys::symlink(t, &p), format!("symlink to {t:?}"));
            assert_eq!(
                ok(sys::readlink(&p), "readlink"),
                t.as_bytes(),
                "target {t:?}"
            );
            assert_eq!(lst(&p).size as usize, t.len());
        }
        fails(
            sys::readlink(d.p("l0/")),
            libc::ENOENT,
            "readlink through a dangling link",
        );
        create(Reg, d.p("f"));
        fails(sys::readlink(d.p("f")), libc::EINVAL, "readlink of a file");
        create(Dir, d.p("dir"));
        fails(sys::readlink(d.p("dir")), libc::EINVAL, "readlink of a dir");
    });

    env.case(
        "a target of PATH_MAX - 1 bytes works; PATH_MAX is ENAMETOOLONG",
        |d| {
            let t = "x".repeat(PATH_MAX - 1);
            ok(sys::symlink(&t, d.p("l")), "symlink to a 4095-byte target");
            assert_eq!(ok(sys::readlink(d.p("l")), "readlink").len(), PATH_MAX - 1);
            let t = "x".repeat(PATH_MAX);
            fails(
                sys::symlink(&t, d.p("l2")),
                libc::ENAMETOOLONG,
                "4096-byte target",
            );
            gone(d.p("l2"), "not created");
        },
    );

    env.case("ENOENT for an empty target", |d| {
        fails(sys::symlink("", d.p("l")), libc::ENOENT, "empty target");
        gone(d.p("l"), "not created");
    });

    env.case("relative targets resolve from the link's directory", |d| {
        create(Dir, d.p("a"));
        create(Dir, d.p("a/b"));
        write_file(d.p("a/f"), b"in a");
        ok(sys::symlink("../f", d.p("a/b/l")), "symlink");
        assert_eq!(read_file(d.p("a/b/l")), b"in a");
        ok(sys::symlink("a/b", d.p("lb")), "symlink to a dir");
        assert_eq!(read_file(d.p("lb/l")), b"in a", "through two links");
        create(Reg, d.p("lb/new"));
        lst(d.p("a/b/new"));
    });

    env.case(
        "symlink updates the parent's mtime and ctime; new times are now",
        |d| {
            let b = st(&d.path);
            tick();
            ok(sys::symlink("test", d.p("l")), "symlink");
            let a = st(&d.path);
            later(b.mtime, a.mtime, "parent mtime");
            later(b.ctime, a.ctime, "parent ctime");
            let l = lst(d.p("l"));
            later(b.ctime, l.mtime, "link mtime");
            later(b.ctime, l.ctime, "link ctime");
        },
    );

    env.case("the link belongs to the caller", |d| {
        ok(sys::chmod(&d.path, 0o777), "chmod");
        ok(
            as_user(NOBODY, OTHER, || sys::symlink("x", d.p("l"))),
            "symlink as 65534",
        );
        let l = lst(d.p("l"));
        assert_eq!((l.uid, l.gid), (NOBODY, OTHER));
        ok(
            as_user(1000, 1000, || sys::symlink("x", d.p("m"))),
            "symlink as 1000",
        );
        let l = lst(d.p("m"));
        assert_eq!((l.uid, l.gid), (1000, 1000));
    });

    env.case("EACCES without write permission on the parent", |d| {
        let n = d.p("n");
        ok(sys::mkdir(&n, 0o755), "mkdir");
        ok(sys::chown(&n, NOBODY, NOBODY), "chown");
        ok(as_nobody(|| sys::symlink("test", n.join("l"))), "as owner");
        ok(as_nobody(|| sys::unlink(n.join("l"))), "unlink");
        ok(sys::chmod(&n, 0o555), "chmod");
        fails(
            as_nobody(|| sys::symlink("test", n.join("l"))),
            libc::EACCES,
            "symlink in a 0555 dir",
        );
        gone(n.join("l"), "not created");
    });

    env.case("EEXIST for every existing type", |d| {
        for k in ALL {
            let p = d.p(&format!("{k:?}"));
            create(k, &p);
            let b = st(&d.path);
            fails(
                sys::symlink("test", &p),
                libc::EEXIST,
                format!("over a {k:?}"),
            );
            same(b.mtime, st(&d.path).mtime, "parent mtime");
            assert_eq!(lst(&p).fmt(), k.fmt());
        }
        ok(sys::symlink("nowhere", d.p("dl")), "symlink");
        fails(
            sys::symlink("x", d.p("dl")),
            libc::EEXIST,
            "over a dangling symlink",
        );
    });

    env.case(
        "a symlink to a directory can be followed with a trailing slash",
        |d| {
            create(Dir, d.p("dir"));
            ok(sys::symlink("dir", d.p("l")), "symlink");
            assert!(st(d.p("l/")).is_dir());
            assert!(
                lst(d.p("l/")).is_dir(),
                "lstat with a trailing slash follows"
            );
            assert_eq!(lst(d.p("l")).fmt(), libc::S_IFLNK);
        },
    );
}
