//! unlink(2) (pjdfstest unlink/*).

use crate::common::pattern;
use crate::harness::*;
use crate::sys;

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "unlink",
            needs: Needs::File,
            follows: false,
            prep: &no_prep,
            op: &|_, p| sys::unlink(p),
        },
    );

    env.case("unlink removes every non-directory type", |d| {
        for k in NOT_DIR {
            let p = d.p(&format!("{k:?}"));
            create(k, &p);
            assert_eq!(lst(&p).fmt(), k.fmt());
            ok(sys::unlink(&p), format!("unlink {k:?}"));
            gone(&p, format!("{k:?} after unlink"));
            create(k, &p);
        }
    });

    env.case(
        "unlink of a symlink removes the link, not its target",
        |d| {
            write_file(d.p("f"), b"x");
            ok(sys::symlink("f", d.p("l")), "symlink");
            ok(sys::unlink(d.p("l")), "unlink");
            gone(d.p("l"), "link");
            assert_eq!(read_file(d.p("f")), b"x");
        },
    );

    env.case(
        "unlink of one link updates the inode's ctime (every type)",
        |d| {
            for k in PLAIN {
                let n0 = d.p(&format!("{k:?}0"));
                let n1 = d.p(&format!("{k:?}1"));
                create(k, &n0);
                ok(sys::link(&n0, &n1), "link");
                let b = st(&n0);
                ok(sys::unlink(&n1), "unlink");
                let a = st(&n0);
                later(b.ctime, a.ctime, format!("{k:?}: ctime"));
                assert_eq!(a.nlink, 1, "{k:?}: nlink");
            }
        },
    );

    env.case(
        "unlink updates the parent's mtime and ctime (every type)",
        |d| {
            for k in NOT_DIR {
                let n = d.p(&format!("{k:?}"));
                create(k, &n);
                let b = st(&d.path);
                ok(sys::unlink(&n), "unlink");
                let a = st(&d.path);
                later(b.mtime, a.mtime, format!("{k:?}: parent mtime"));
                later(b.ctime, a.ctime, format!("{k:?}: parent ctime"));
                assert_eq!(a.nlink, b.nlink, "{k:?}: parent nlink");
            }
        },
    );

    env.case(
        "EACCES in a directory not writable by the user; nothing changes",
        |d| {
            for k in NOT_DIR {
                let n = d.p(&format!("{k:?}"));
                create(k, &n);
                let b = lst(&n);
                let db = st(&d.path);
                fails(
                    as_nobody(|| sys::unlink(&n)),
                    libc::EACCES,
                    format!("{k:?}: unlink as 65534 in root's 0755 dir"),
                );
                let a = lst(&n);
                same(b.ctime, a.ctime, format!("{k:?}: ctime"));
                same(db.mtime, st(&d.path).mtime, format!("{k:?}: parent mtime"));
            }
            // Owning the file is not enough.
            let n = d.p("mine");
            create_owned(Reg, &n, NOBODY, NOBODY);
            fails(
                as_nobody(|| sys::unlink(&n)),
                libc::EACCES,
                "own file in root's dir",
            );
            ok(sys::chmod(&d.path, 0o777), "chmod");
            // With write permission on the directory, anyone's file can go.
            ok(
                as_nobody(|| sys::unlink(d.p("Reg"))),
                "root's file in a 0777 dir",
            );
        },
    );

    env.case(
        "EISDIR for a directory (Linux), as root and as the owner",
        |d| {
            let n = d.p("dir");
            create(Dir, &n);
            fails(sys::unlink(&n), libc::EISDIR, "unlink of a dir as root");
            ok(sys::chown(&d.path, NOBODY, NOBODY), "chown");
            ok(sys::chown(&n, NOBODY, NOBODY), "chown");
            fails(as_nobody(|| sys::unlink(&n)), libc::EISDIR, "as the owner");
            assert!(lst(&n).is_dir());
            ok(sys::rmdir(&n), "rmdir");
        },
    );

    env.case("ENOTDIR for a file named with a trailing slash", |d| {
        create(Reg, d.p("f"));
        fails(sys::unlink(d.p("f/")), libc::ENOTDIR, "unlink f/");
        lst(d.p("f"));
    });

    env.case(
        "sticky directory: EPERM unless owning the file or the directory",
        |d| {
            let n0 = d.p("n0");
            ok(sys::mkdir(&n0, 0o755), "mkdir");
            ok(sys::chmod(&n0, 0o1777), "chmod");
            let n1 = n0.join("n1");
            for k in NOT_DIR {
                for (downer, owner, allowed) in [
                    (NOBODY, NOBODY, true),
                    (NOBODY, 0, true),
                    (NOBODY, OTHER, true),
                    (0, NOBODY, true),
                    (OTHER, NOBODY, true),
                    (0, 0, false),
                    (OTHER, OTHER, false),
                ] {
                    ok(sys::chown(&n0, downer, downer), "chown");
                    create_owned(k, &n1, owner, owner);
                    let what = format!("{k:?} of {owner} in sticky dir of {downer}");
                    let r = as_nobody(|| sys::unlink(&n1));
                    if allowed {
                        ok(r, &what);
                        gone(&n1, &what);
                    } else {
                        fails_any(r, &[libc::EPERM, libc::EACCES], &what);
                        let s = lst(&n1);
                        assert_eq!((s.fmt(), s.uid), (k.fmt(), owner), "{what}: kept");
                        ok(sys::unlink(&n1), "cleanup");
                    }
                }
            }
        },
    );

    env.case(
        "an open file outlives its name: data readable and writable",
        |d| {
            let p = d.p("f");
            write_file(&p, b"Hello, World!");
            let fd = ok(sys::open(&p, libc::O_RDONLY, 0), "open");
            ok(sys::unlink(&p), "unlink");
            gone(&p, "name");
            assert_eq!(ok(sys::fstat(&fd), "fstat").nlink, 0);
            assert_eq!(ok(sys::pread(&fd, 100, 0), "pread"), b"Hello, World!");
            let fd = ok(
                sys::open(&p, libc::O_CREAT | libc::O_RDWR, 0o644),
                "create again",
            );
            ok(sys::write(&fd, b"Hello,_World!"), "write");
            ok(sys::unlink(&p), "unlink");
            assert_eq!(
                ok(sys::pread(&fd, 13, 0), "pread after unlink"),
                b"Hello,_World!"
            );
            let big = pattern(3 << 20, 4);
            ok(sys::pwrite(&fd, &big, 100), "write after unlink");
            assert_eq!(ok(sys::pread(&fd, big.len(), 100), "pread"), big);
            assert_eq!(ok(sys::fstat(&fd), "fstat").size as usize, 100 + big.len());
            // The name is free for a new, unrelated file.
            write_file(&p, b"new");
            assert_eq!(read_file(&p), b"new");
            assert_eq!(ok(sys::pread(&fd, 5, 0), "old file still intact"), b"Hello");
        },
    );

    env.case("unlink of a file with other links keeps the data", |d| {
        write_file(d.p("a"), b"shared");
        ok(sys::link(d.p("a"), d.p("b")), "link");
        ok(sys::unlink(d.p("a")), "unlink");
        assert_eq!(read_file(d.p("b")), b"shared");
        assert_eq!(lst(d.p("b")).nlink, 1);
    });

    env.case(
        "readdir lists each of 600 entries once, before and after unlinking half",
        |d| {
            for i in 0..600 {
                create(Reg, d.p(&format!("entry-{i:04}")));
            }
            let list = || {
                let mut v: Vec<String> = std::fs::read_dir(&d.path)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            };
            let want: Vec<String> = (0..600).map(|i| format!("entry-{i:04}")).collect();
            assert_eq!(list(), want);
            for i in (0..600).step_by(2) {
                ok(sys::unlink(d.p(&format!("entry-{i:04}"))), "unlink");
            }
            let want: Vec<String> = (1..600)
                .step_by(2)
                .map(|i| format!("entry-{i:04}"))
                .collect();
            assert_eq!(list(), want);
            assert_eq!(st(&d.path).nlink, 2, "only files: nlink stays 2");
        },
    );
}
