//! mkdir(2) (pjdfstest mkdir/*).

use crate::harness::*;
use crate::sys;

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "mkdir",
            needs: Needs::Nothing,
            follows: false,
            prep: &no_prep,
            op: &|_, p| sys::mkdir(p, 0o755),
        },
    );
    creation_rules(env, "mkdir", Dir, &|p, mode| sys::mkdir(p, mode));

    env.case(
        "a new directory has nlink 2, adds one to its parent, is empty",
        |d| {
            let before = st(&d.path).nlink;
            let n = d.p("n");
            ok(sys::mkdir(&n, 0o755), "mkdir");
            let s = lst(&n);
            assert_eq!((s.fmt(), s.nlink), (libc::S_IFDIR, 2));
            assert_eq!(st(&d.path).nlink, before + 1, "parent nlink");
            let names: Vec<_> = std::fs::read_dir(&n).unwrap().collect();
            assert!(names.is_empty(), "new directory not empty");
            assert_eq!(lst(n.join(".")).ino, s.ino, "'.' is itself");
            assert_eq!(
                lst(n.join("..")).ino,
                lst(&d.path).ino,
                "'..' is the parent"
            );
        },
    );

    env.case(
        "EACCES without write permission on the parent (mkdir/06)",
        |d| {
            let n1 = d.p("n1");
            ok(sys::mkdir(&n1, 0o755), "mkdir");
            ok(sys::chown(&n1, NOBODY, NOBODY), "chown");
            ok(
                as_nobody(|| sys::mkdir(n1.join("x"), 0o755)),
                "mkdir as owner",
            );
            ok(as_nobody(|| sys::rmdir(n1.join("x"))), "rmdir as owner");
            ok(sys::chmod(&n1, 0o555), "chmod");
            let b = st(&n1);
            fails(
                as_nobody(|| sys::mkdir(n1.join("x"), 0o755)),
                libc::EACCES,
                "mkdir in a 0555 dir",
            );
            let a = st(&n1);
            same(b.mtime, a.mtime, "parent mtime after the failure");
            same(b.ctime, a.ctime, "parent ctime after the failure");
            ok(sys::chmod(&n1, 0o755), "chmod");
            ok(as_nobody(|| sys::mkdir(n1.join("x"), 0o755)), "mkdir again");
        },
    );

    env.case(
        "EEXIST for every existing type; the parent is not changed",
        |d| {
            for k in ALL {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                let b = st(&d.path);
                fails(
                    sys::mkdir(&p, 0o755),
                    libc::EEXIST,
                    format!("mkdir over a {k:?}"),
                );
                let a = st(&d.path);
                same(b.mtime, a.mtime, format!("{k:?}: parent mtime"));
                assert_eq!(lst(&p).fmt(), k.fmt(), "{k:?}: unchanged");
            }
            ok(sys::symlink("nowhere", d.p("dangling")), "symlink");
            fails(
                sys::mkdir(d.p("dangling"), 0o755),
                libc::EEXIST,
                "mkdir over a dangling symlink",
            );
            gone(d.p("nowhere"), "symlink target not created");
        },
    );

    env.case(
        "setgid parent: new directories inherit its group and setgid",
        |d| {
            let p = d.p("p");
            ok(sys::mkdir(&p, 0o777), "mkdir");
            ok(sys::chown(&p, 0, OTHER), "chown");
            ok(sys::chmod(&p, 0o2777), "chmod");
            ok(
                as_nobody(|| sys::mkdir(p.join("sub"), 0o755)),
                "mkdir as 65534",
            );
            let s = lst(p.join("sub"));
            assert_eq!((s.uid, s.gid), (NOBODY, OTHER), "group from the parent");
            assert_eq!(s.perm(), 0o2755, "setgid inherited");
            ok(
                as_nobody(|| sys::open_close(p.join("f"), libc::O_CREAT | libc::O_WRONLY, 0o644)),
                "create a file",
            );
            let s = lst(p.join("f"));
            assert_eq!((s.gid, s.perm()), (OTHER, 0o644), "file: group, no setgid");
            // A file asking for setgid (with group execute) keeps it only for a group member.
            ok(
                as_nobody(|| sys::open_close(p.join("g"), libc::O_CREAT | libc::O_WRONLY, 0o2755)),
                "create 02755 as a non-member",
            );
            assert_eq!(
                lst(p.join("g")).perm(),
                0o755,
                "setgid stripped for a non-member"
            );
            ok(
                as_user(NOBODY, OTHER, || {
                    sys::open_close(p.join("h"), libc::O_CREAT | libc::O_WRONLY, 0o2755)
                }),
                "create 02755 as a member",
            );
            assert_eq!(lst(p.join("h")).perm(), 0o2755, "setgid kept for a member");
            ok(sys::mkdir(p.join("rootdir"), 0o700), "mkdir as root");
            assert_eq!(
                lst(p.join("rootdir")).perm(),
                0o2700,
                "root's subdir inherits setgid"
            );
        },
    );

    env.case("mkdir with a trailing slash works", |d| {
        ok(sys::mkdir(d.p("n/"), 0o755), "mkdir n/");
        assert!(lst(d.p("n")).is_dir());
    });

    env.case("EEXIST for '.' and '..'", |d| {
        fails(sys::mkdir(d.p("."), 0o755), libc::EEXIST, "mkdir .");
        fails(sys::mkdir(d.p(".."), 0o755), libc::EEXIST, "mkdir ..");
    });

    env.case("ENOENT through a dangling symlink prefix", |d| {
        ok(sys::symlink("nowhere", d.p("dl")), "symlink");
        fails(sys::mkdir(d.p("dl/x"), 0o755), libc::ENOENT, "mkdir dl/x");
    });
}

/// What mkdir, mkfifo, mknod and open(O_CREAT) share (pjdfstest */00.t): the mode with and
/// without umask, the owner and group of the new file, and the timestamps.
pub fn creation_rules(
    env: &Env,
    name: &str,
    kind: Kind,
    make: &dyn Fn(&std::path::Path, u32) -> sys::R<()>,
) {
    let fmt = kind.fmt();
    env.case(
        &format!("{name}: the mode is the one given (umask 0)"),
        |d| {
            for mode in [0o755, 0o151, 0o000, 0o777, 0o700] {
                let p = d.p(&format!("m{mode:o}"));
                ok(make(&p, mode), format!("create with {mode:o}"));
                let s = lst(&p);
                assert_eq!(
                    (s.fmt(), s.perm()),
                    (fmt, mode),
                    "type and mode for {mode:o}"
                );
            }
        },
    );
    env.case(&format!("{name}: the umask is applied"), |d| {
        for (umask, mode, want) in [
            (0o077, 0o151, 0o100),
            (0o070, 0o345, 0o305),
            (0o501, 0o345, 0o244),
        ] {
            let p = d.p(&format!("u{umask:o}"));
            ok(
                with_umask(umask, || make(&p, mode)),
                format!("create {mode:o} with umask {umask:o}"),
            );
            let s = lst(&p);
            assert_eq!(
                (s.fmt(), s.perm()),
                (fmt, want),
                "umask {umask:o} mode {mode:o}"
            );
        }
    });
    // Only root may create devices.
    let users_may = !matches!(kind, Chr | Blk);
    env.case(
        &format!("{name}: owner is the caller's uid, group its gid"),
        |d| {
            if !users_may {
                ok(make(&d.p("r"), 0o755), "create as root");
                assert_eq!((lst(d.p("r")).uid, lst(d.p("r")).gid), (0, 0));
                return;
            }
            ok(sys::chown(&d.path, NOBODY, NOBODY), "chown dir");
            let p = d.p("a");
            ok(as_nobody(|| make(&p, 0o755)), "create as 65534:65534");
            let s = lst(&p);
            assert_eq!((s.uid, s.gid), (NOBODY, NOBODY));
            let p = d.p("b");
            ok(
                as_user(NOBODY, OTHER, || make(&p, 0o755)),
                "create as 65534:65533",
            );
            let s = lst(&p);
            assert_eq!((s.uid, s.gid), (NOBODY, OTHER), "gid from the process");
            ok(sys::chmod(&d.path, 0o777), "chmod dir");
            let p = d.p("c");
            ok(
                as_user(OTHER, G3, || make(&p, 0o755)),
                "create as 65533:65532",
            );
            let s = lst(&p);
            assert_eq!((s.uid, s.gid), (OTHER, G3));
            ok(
                as_user(1000, 1000, || make(&d.p("e"), 0o755)),
                "create as 1000",
            );
            let s = lst(d.p("e"));
            assert_eq!((s.uid, s.gid), (1000, 1000));
        },
    );
    env.case(
        &format!("{name}: new times are now; the parent's mtime and ctime change"),
        |d| {
            let before = st(&d.path);
            tick();
            let p = d.p("n");
            ok(make(&p, 0o755), "create");
            let s = lst(&p);
            let after = st(&d.path);
            later(before.ctime, s.atime, "new atime");
            later(before.ctime, s.mtime, "new mtime");
            later(before.ctime, s.ctime, "new ctime");
            later(before.mtime, after.mtime, "parent mtime");
            later(before.ctime, after.ctime, "parent ctime");
        },
    );
    env.case(&format!("{name}: a failed creation changes nothing"), |d| {
        let p = d.p("n");
        ok(make(&p, 0o755), "create");
        let b = st(&d.path);
        let f = lst(&p);
        fails(make(&p, 0o700), libc::EEXIST, "creating it again");
        let a = st(&d.path);
        same(b.mtime, a.mtime, "parent mtime");
        same(b.ctime, a.ctime, "parent ctime");
        let f2 = lst(&p);
        same(f.ctime, f2.ctime, "existing file's ctime");
        assert_eq!(f2.perm(), f.perm(), "existing file's mode");
    });
}
