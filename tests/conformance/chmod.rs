//! chmod(2) and fchmod(2) (pjdfstest chmod/*).

use crate::harness::*;
use crate::sys;

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "chmod",
            needs: Needs::File,
            follows: true,
            prep: &no_prep,
            op: &|_, p| sys::chmod(p, 0o620),
        },
    );

    env.case(
        "chmod sets the mode of every type, following symlinks",
        |d| {
            for k in NOT_SYMLINK {
                let p = d.p(&format!("{k:?}"));
                let l = d.p(&format!("{k:?}-link"));
                create(k, &p);
                ok(sys::chmod(&p, 0o111), "chmod 0111");
                assert_eq!(st(&p).perm(), 0o111, "{k:?}: mode after chmod 0111");
                assert_eq!(st(&p).fmt(), k.fmt(), "{k:?}: type kept");
                ok(sys::symlink(&p, &l), "symlink");
                let link_mode = lst(&l).mode;
                ok(sys::chmod(&l, 0o222), "chmod through a symlink");
                assert_eq!(st(&p).perm(), 0o222, "{k:?}: target mode via symlink");
                assert_eq!(lst(&l).mode, link_mode, "{k:?}: the symlink's own mode");
            }
        },
    );

    env.case("chmod updates ctime, not mtime", |d| {
        for k in NOT_SYMLINK {
            let p = d.p(&format!("{k:?}"));
            create(k, &p);
            let before = st(&p);
            ok(sys::chmod(&p, 0o111), "chmod");
            let after = st(&p);
            later(before.ctime, after.ctime, format!("{k:?}: ctime"));
            same(before.mtime, after.mtime, format!("{k:?}: mtime"));
        }
    });

    env.case("chmod by a non-owner: EPERM, nothing changes", |d| {
        for k in NOT_SYMLINK {
            let p = d.p(&format!("{k:?}"));
            create(k, &p);
            let before = st(&p);
            fails(
                as_user(NOBODY, NOBODY, || sys::chmod(&p, 0o111)),
                libc::EPERM,
                format!("{k:?}: chmod as 65534 of root's file"),
            );
            let after = st(&p);
            same(before.ctime, after.ctime, format!("{k:?}: ctime"));
            assert_eq!(before.perm(), after.perm(), "{k:?}: mode");
        }
    });

    env.case("chmod by the owner (65534) works; by others EPERM", |d| {
        let dir = d.p("dir");
        ok(sys::mkdir(&dir, 0o755), "mkdir");
        ok(sys::chown(&dir, NOBODY, NOBODY), "chown");
        let f = dir.join("f");
        ok(
            as_nobody(|| sys::open_close(&f, libc::O_CREAT | libc::O_WRONLY, 0o644)),
            "create as 65534",
        );
        ok(as_nobody(|| sys::chmod(&f, 0o642)), "chmod by the owner");
        assert_eq!(st(&f).perm(), 0o642);
        fails(
            as_user(OTHER, OTHER, || sys::chmod(&f, 0o641)),
            libc::EPERM,
            "chmod by 65533 of 65534's file",
        );
        assert_eq!(st(&f).perm(), 0o642);
        ok(sys::chown(&f, 0, 0), "chown to root");
        fails(
            as_nobody(|| sys::chmod(&f, 0o641)),
            libc::EPERM,
            "chmod by 65534 of root's file",
        );
        assert_eq!(st(&f).perm(), 0o642);
        // Through a symlink owned by the user: what counts is the target's owner.
        let l = dir.join("l");
        ok(sys::symlink("f", &l), "symlink");
        ok(sys::lchown(&l, NOBODY, NOBODY), "lchown");
        fails(
            as_nobody(|| sys::chmod(&l, 0o641)),
            libc::EPERM,
            "chmod via own symlink of root's file",
        );
        ok(sys::chown(&f, NOBODY, NOBODY), "chown back");
        ok(as_nobody(|| sys::chmod(&l, 0o640)), "chmod via symlink");
        assert_eq!(st(&f).perm(), 0o640);
    });

    env.case(
        "setgid is kept by a group member and silently cleared for a non-member",
        |d| {
            let f = d.p("f");
            create(Reg, &f);
            ok(sys::chmod(&f, 0o755), "chmod");
            ok(sys::chown(&f, NOBODY, NOBODY), "chown");
            ok(
                as_nobody(|| sys::chmod(&f, 0o2755)),
                "chmod 02755 as member",
            );
            assert_eq!(st(&f).perm(), 0o2755, "member keeps setgid");
            ok(as_nobody(|| sys::chmod(&f, 0o755)), "chmod 0755");
            assert_eq!(st(&f).perm(), 0o755);
            ok(
                as_user(NOBODY, OTHER, || sys::chmod(&f, 0o2755)),
                "chmod 02755 as owner outside the group",
            );
            assert_eq!(st(&f).perm(), 0o755, "setgid cleared for a non-member");
            // Root keeps it whatever the group.
            ok(sys::chmod(&f, 0o2755), "chmod as root");
            assert_eq!(st(&f).perm(), 0o2755, "root sets setgid");
        },
    );

    env.case(
        "sticky bit: set by root on any type, by owners on files (Linux)",
        |d| {
            for k in NOT_SYMLINK {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                ok(sys::chmod(&p, 0o1621), "chmod 01621");
                assert_eq!(st(&p).perm(), 0o1621, "{k:?}: sticky by root");
            }
            let dir = d.p("userdir");
            ok(sys::mkdir(&dir, 0o755), "mkdir");
            ok(sys::chown(&dir, NOBODY, NOBODY), "chown");
            ok(
                as_nobody(|| sys::chmod(&dir, 0o1755)),
                "owner sets sticky on dir",
            );
            assert_eq!(st(&dir).perm(), 0o1755);
            for k in PLAIN {
                let p = d.p(&format!("user-{k:?}"));
                create(k, &p);
                ok(sys::chmod(&p, 0o640), "chmod");
                ok(sys::chown(&p, NOBODY, NOBODY), "chown");
                ok(
                    as_nobody(|| sys::chmod(&p, 0o1644)),
                    format!("{k:?}: owner sets sticky"),
                );
                assert_eq!(st(&p).perm(), 0o1644, "{k:?}: sticky kept (Linux)");
            }
        },
    );

    env.case("all mode bits round-trip (07777 and 0)", |d| {
        let f = d.p("f");
        create(Reg, &f);
        for m in [0o7777, 0, 0o4000, 0o2000, 0o1000, 0o777, 0o7070] {
            ok(sys::chmod(&f, m), format!("chmod {m:o}"));
            assert_eq!(st(&f).perm(), m, "mode after chmod {m:o}");
        }
        // Only the permission bits are taken: the type stays.
        ok(
            sys::chmod(&f, libc::S_IFDIR | 0o644),
            "chmod with type bits",
        );
        assert_eq!(st(&f).mode, libc::S_IFREG | 0o644);
    });

    env.case("fchmod changes the mode and ctime of an open file", |d| {
        let f = d.p("f");
        create(Reg, &f);
        let fd = ok(sys::open(&f, libc::O_RDONLY, 0), "open");
        let before = st(&f);
        ok(sys::fchmod(&fd, 0o600), "fchmod");
        let after = st(&f);
        assert_eq!(after.perm(), 0o600);
        later(before.ctime, after.ctime, "ctime");
    });

    env.case("a root-run chmod is not limited by the mode itself", |d| {
        let f = d.p("f");
        create(Reg, &f);
        ok(sys::chmod(&f, 0), "chmod 0");
        // Root still opens it for writing (DAC override), and may change it back.
        ok(
            sys::open_close(&f, libc::O_RDWR, 0),
            "root opens a 0000 file",
        );
        ok(sys::chmod(&f, 0o644), "chmod back");
    });

    env.case(
        "SUID/SGID cleared when a non-root user writes (chmod/12)",
        |d| {
            for (mode, flags) in [
                (0o4777, libc::O_WRONLY),
                (0o2777, libc::O_RDWR),
                (0o6777, libc::O_RDWR),
            ] {
                let f = d.p(&format!("f{mode:o}"));
                create(Reg, &f);
                ok(sys::chmod(&f, mode), "chmod");
                let r = as_nobody(|| {
                    let fd = sys::open(&f, flags, 0)?;
                    sys::write(&fd, b"x")?;
                    let s = sys::fstat(&fd)?;
                    if s.perm() == 0o777 {
                        Ok(())
                    } else {
                        Err(MISMATCH)
                    }
                });
                ok(r, format!("{mode:o}: write, then fstat shows 0777"));
                assert_eq!(st(&f).perm(), 0o777, "{mode:o}: mode after the write");
            }
        },
    );

    env.case("SUID kept when root writes (CAP_FSETID)", |d| {
        let f = d.p("f");
        create(Reg, &f);
        ok(sys::chmod(&f, 0o6777), "chmod");
        let fd = ok(sys::open(&f, libc::O_WRONLY, 0), "open");
        ok(sys::write(&fd, b"x"), "write");
        drop(fd);
        assert_eq!(st(&f).perm(), 0o6777);
    });

    env.case("SUID/SGID cleared when a non-root user truncates", |d| {
        let f = d.p("f");
        write_file(&f, b"hello");
        ok(sys::chmod(&f, 0o6777), "chmod");
        ok(as_nobody(|| sys::truncate(&f, 2)), "truncate as 65534");
        let s = st(&f);
        assert_eq!(s.size, 2);
        assert_eq!(s.perm(), 0o777, "mode after truncate by 65534");
    });

    env.case(
        "the ctime of a chmod after a write is kept when the file is closed",
        |d| {
            let p = d.p("f");
            let fd = ok(sys::open(&p, libc::O_CREAT | libc::O_WRONLY, 0o644), "open");
            ok(sys::write(&fd, b"data"), "write");
            ok(sys::chmod(&p, 0o600), "chmod");
            let b = st(&p);
            drop(fd);
            let a = st(&p);
            same(b.ctime, a.ctime, "ctime across close");
            assert_eq!((a.perm(), a.size), (0o600, 4));
        },
    );
}
