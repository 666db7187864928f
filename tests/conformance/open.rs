//! open(2) with every flag and errno pjdfstest covers, plus O_APPEND/O_TRUNC semantics,
//! ETXTBSY, names as bytes and offsets beyond 2 GiB (pjdfstest open/*).

use crate::common::pattern;
use crate::harness::*;
use crate::mkdir::creation_rules;
use crate::sys::{self, R};
use libc::{
    O_APPEND, O_CREAT, O_DIRECTORY, O_EXCL, O_NOFOLLOW, O_NONBLOCK, O_PATH, O_RDONLY, O_RDWR,
    O_TRUNC, O_WRONLY,
};
use std::path::Path;

/// Modes of pjdfstest open/06 and open/07.
const MODES: [u32; 15] = [
    0o600, 0o060, 0o006, 0o477, 0o747, 0o774, 0o277, 0o727, 0o772, 0o177, 0o717, 0o771, 0o077,
    0o707, 0o770,
];

/// The three identities against a file owned by 65534:65534: (name, uid, gid, shift of the
/// class of permission bits that applies).
const WHO: [(&str, u32, u32, u32); 3] = [
    ("owner 65534:65534", NOBODY, NOBODY, 6),
    ("group member 65533:65534", OTHER, NOBODY, 3),
    ("other 65533:65533", OTHER, OTHER, 0),
];

/// Opens `p` with each of `flags` as uid/gid in one child; returns which opens succeeded (bit i
/// for flags[i]); EACCES counts as "denied", any other error is returned as such.
fn open_mask(uid: u32, gid: u32, p: &Path, flags: &[i32]) -> R<u32> {
    let r = as_user(uid, gid, || {
        let mut mask = 0;
        for (i, f) in flags.iter().enumerate() {
            match sys::open_close(p, *f, 0) {
                Ok(()) => mask |= 1 << i,
                Err(libc::EACCES) => {}
                Err(e) => return Err(e),
            }
        }
        Err(100 + mask)
    });
    match r {
        Err(c) if (100..100 + (1 << flags.len())).contains(&c) => Ok((c - 100) as u32),
        Err(e) => Err(e),
        Ok(()) => unreachable!(),
    }
}

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "open O_RDONLY",
            needs: Needs::File,
            follows: true,
            prep: &no_prep,
            op: &|_, p| sys::open_close(p, O_RDONLY, 0),
        },
    );
    path_errors(
        env,
        &PathOp {
            name: "open O_CREAT",
            needs: Needs::Nothing,
            follows: true,
            prep: &no_prep,
            op: &|_, p| sys::open_close(p, O_CREAT | O_WRONLY, 0o644),
        },
    );
    creation_rules(env, "open O_CREAT", Reg, &|p, mode| {
        sys::open_close(p, O_CREAT | O_EXCL | O_WRONLY, mode)
    });

    env.case(
        "O_CREAT with mode 0 for each access mode; the descriptor works",
        |d| {
            for (i, acc) in [O_WRONLY, O_RDWR, O_RDONLY].into_iter().enumerate() {
                let p = d.p(&format!("f{i}"));
                let fd = ok(sys::open(&p, O_CREAT | acc, 0), "create mode 0");
                let s = lst(&p);
                assert_eq!((s.fmt(), s.perm()), (libc::S_IFREG, 0));
                if acc != O_RDONLY {
                    assert_eq!(ok(sys::write(&fd, b"data"), "write to a 0000 file"), 4);
                }
            }
            ok(sys::chmod(&d.path, 0o777), "chmod");
            let p = d.p("user");
            ok(
                as_nobody(|| {
                    let fd = sys::open(&p, O_CREAT | O_RDWR, 0)?;
                    sys::write(&fd, b"abc")?;
                    if sys::pread(&fd, 3, 0)? == b"abc" {
                        Ok(())
                    } else {
                        Err(MISMATCH)
                    }
                }),
                "as 65534: create mode 0, write and read back",
            );
            fails(
                as_nobody(|| sys::open_close(&p, O_RDONLY, 0)),
                libc::EACCES,
                "reopening the 0000 file as its owner",
            );
        },
    );

    env.case(
        "O_CREAT of an existing file: opened as is, parent unchanged",
        |d| {
            let p = d.p("f");
            write_file(&p, b"keep me");
            ok(sys::chmod(&p, 0o640), "chmod");
            let b = st(&d.path);
            let fb = st(&p);
            ok(
                sys::open_close(&p, O_CREAT | O_RDONLY, 0o777),
                "O_CREAT|O_RDONLY",
            );
            ok(
                sys::open_close(&p, O_CREAT | O_WRONLY, 0o777),
                "O_CREAT|O_WRONLY",
            );
            let a = st(&d.path);
            let fa = st(&p);
            same(b.mtime, a.mtime, "parent mtime");
            same(b.ctime, a.ctime, "parent ctime");
            same(fb.ctime, fa.ctime, "file ctime");
            assert_eq!(fa.perm(), 0o640, "mode not taken from O_CREAT");
            assert_eq!(read_file(&p), b"keep me", "not truncated");
            // No write permission on the directory is needed for an existing file.
            fails(
                as_nobody(|| sys::open_close(d.p("new"), O_CREAT | O_RDONLY, 0o644)),
                libc::EACCES,
                "O_CREAT of a new file in root's 0755 dir as 65534 (open/08)",
            );
            let r = d.p("readable");
            create(Reg, &r);
            ok(
                as_nobody(|| sys::open_close(&r, O_CREAT | O_RDONLY, 0o600)),
                "O_CREAT of an existing readable file as 65534",
            );
            assert_eq!(lst(&r).perm(), 0o644);
        },
    );

    env.case(
        "O_CREAT through a dangling symlink creates its target",
        |d| {
            ok(sys::symlink("target", d.p("l")), "symlink");
            let fd = ok(
                sys::open(d.p("l"), O_CREAT | O_WRONLY, 0o600),
                "open O_CREAT",
            );
            ok(sys::write(&fd, b"x"), "write");
            drop(fd);
            let s = lst(d.p("target"));
            assert_eq!((s.fmt(), s.perm(), s.size), (libc::S_IFREG, 0o600, 1));
            assert_eq!(lst(d.p("l")).fmt(), libc::S_IFLNK, "link stays a link");
        },
    );

    env.case(
        "EEXIST with O_CREAT|O_EXCL for every type, dangling symlinks too",
        |d| {
            for k in ALL {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                fails(
                    sys::open_close(&p, O_CREAT | O_EXCL | O_RDONLY, 0o644),
                    libc::EEXIST,
                    format!("{k:?}"),
                );
                assert_eq!(lst(&p).fmt(), k.fmt(), "{k:?}: unchanged");
            }
            ok(sys::symlink("nowhere", d.p("dl")), "symlink");
            fails(
                sys::open_close(d.p("dl"), O_CREAT | O_EXCL | O_WRONLY, 0o644),
                libc::EEXIST,
                "dangling symlink",
            );
            gone(d.p("nowhere"), "the target is not created");
        },
    );

    env.case(
        "O_TRUNC empties the file and updates mtime and ctime",
        |d| {
            let p = d.p("f");
            write_file(&p, b"test\n");
            assert_eq!(st(&p).size, 5);
            let b = st(&p);
            ok(
                sys::open_close(&p, O_WRONLY | O_TRUNC, 0),
                "O_WRONLY|O_TRUNC",
            );
            let a = st(&p);
            assert_eq!(a.size, 0);
            later(b.mtime, a.mtime, "mtime");
            later(b.ctime, a.ctime, "ctime");
            write_file(&p, &pattern(100_000, 1));
            ok(sys::open_close(&p, O_RDWR | O_TRUNC, 0), "O_RDWR|O_TRUNC");
            assert_eq!(st(&p).size, 0);
            assert_eq!(read_file(&p), b"");
            // Linux truncates with O_RDONLY|O_TRUNC too (write permission is required).
            write_file(&p, b"abc");
            ok(
                sys::open_close(&p, O_RDONLY | O_TRUNC, 0),
                "O_RDONLY|O_TRUNC",
            );
            assert_eq!(st(&p).size, 0);
            // Data written after O_TRUNC starts at 0.
            write_file(&p, b"0123456789");
            let fd = ok(sys::open(&p, O_WRONLY | O_TRUNC, 0), "open");
            ok(sys::write(&fd, b"ab"), "write");
            drop(fd);
            assert_eq!(read_file(&p), b"ab");
        },
    );

    env.case(
        "EACCES for access modes the permission bits deny (open/06, files)",
        |d| {
            ok(sys::chown(&d.path, NOBODY, NOBODY), "chown");
            let p = d.p("f");
            create_owned(Reg, &p, NOBODY, NOBODY);
            let flags = [O_RDONLY, O_WRONLY, O_RDWR];
            for mode in MODES {
                ok(sys::chmod(&p, mode), "chmod");
                for (who, uid, gid, shift) in WHO {
                    let bits = (mode >> shift) & 7;
                    let want = u32::from(bits & 4 != 0)
                        | u32::from(bits & 2 != 0) << 1
                        | u32::from(bits & 6 == 6) << 2;
                    let got = ok(open_mask(uid, gid, &p, &flags), format!("{mode:o} {who}"));
                    assert_eq!(
                        got, want,
                        "mode {mode:o}, {who}: opens allowed (bit0 RDONLY, bit1 WRONLY, bit2 RDWR)"
                    );
                }
            }
        },
    );

    env.case(
        "EACCES for access modes the permission bits deny (open/06, fifos)",
        |d| {
            let p = d.p("fifo");
            ok(sys::mkfifo(&p, 0o644), "mkfifo");
            ok(sys::lchown(&p, NOBODY, NOBODY), "chown");
            for mode in MODES {
                ok(sys::chmod(&p, mode), "chmod");
                for (who, uid, gid, shift) in WHO {
                    let bits = (mode >> shift) & 7;
                    let want = u32::from(bits & 4 != 0) | u32::from(bits & 6 == 6) << 1;
                    let got = ok(
                        open_mask(uid, gid, &p, &[O_RDONLY | O_NONBLOCK, O_RDWR]),
                        format!("fifo {mode:o} {who}"),
                    );
                    assert_eq!(
                        got, want,
                        "fifo {mode:o}, {who}: bit0 RDONLY|NONBLOCK, bit1 RDWR"
                    );
                    // Write-only without a reader: ENXIO if allowed, EACCES if not.
                    let r = as_user(uid, gid, || sys::open_close(&p, O_WRONLY | O_NONBLOCK, 0));
                    let want = if bits & 2 != 0 {
                        libc::ENXIO
                    } else {
                        libc::EACCES
                    };
                    fails(
                        r,
                        want,
                        format!("fifo {mode:o}, {who}: O_WRONLY|O_NONBLOCK"),
                    );
                }
            }
        },
    );

    env.case(
        "EACCES for access modes the permission bits deny (open/06, dirs)",
        |d| {
            let p = d.p("dir");
            ok(sys::mkdir(&p, 0o755), "mkdir");
            ok(sys::chown(&p, NOBODY, NOBODY), "chown");
            for mode in MODES {
                ok(sys::chmod(&p, mode), "chmod");
                for (who, uid, gid, shift) in WHO {
                    let want = u32::from((mode >> shift) & 4 != 0);
                    let got = ok(
                        open_mask(uid, gid, &p, &[O_RDONLY]),
                        format!("dir {mode:o} {who}"),
                    );
                    assert_eq!(got, want, "dir {mode:o}, {who}: O_RDONLY allowed");
                }
            }
        },
    );

    env.case(
        "EACCES for O_TRUNC without write permission; size kept (open/07)",
        |d| {
            ok(sys::chown(&d.path, NOBODY, NOBODY), "chown");
            let p = d.p("f");
            create_owned(Reg, &p, NOBODY, NOBODY);
            ok(
                as_nobody(|| {
                    let fd = sys::open(&p, O_WRONLY, 0)?;
                    sys::write(&fd, b"x").map(drop)
                }),
                "write one byte",
            );
            for mode in [
                0o477, 0o747, 0o774, 0o177, 0o717, 0o771, 0o077, 0o707, 0o770,
            ] {
                ok(sys::chmod(&p, mode), "chmod");
                for (who, uid, gid, shift) in WHO {
                    if (mode >> shift) & 2 == 0 {
                        let r = as_user(uid, gid, || sys::open_close(&p, O_RDONLY | O_TRUNC, 0));
                        fails(r, libc::EACCES, format!("{mode:o} {who}: O_RDONLY|O_TRUNC"));
                    }
                }
                assert_eq!(lst(&p).size, 1, "{mode:o}: size kept");
            }
        },
    );

    env.case(
        "EISDIR opening a directory for writing or truncation",
        |d| {
            let p = d.p("dir");
            create(Dir, &p);
            ok(sys::open_close(&p, O_RDONLY, 0), "O_RDONLY");
            for (f, name) in [
                (O_WRONLY, "O_WRONLY"),
                (O_RDWR, "O_RDWR"),
                (O_RDONLY | O_TRUNC, "O_RDONLY|O_TRUNC"),
                (O_WRONLY | O_TRUNC, "O_WRONLY|O_TRUNC"),
                (O_RDWR | O_TRUNC, "O_RDWR|O_TRUNC"),
                (O_CREAT | O_RDONLY, "O_CREAT|O_RDONLY"),
                (O_CREAT | O_WRONLY, "O_CREAT|O_WRONLY"),
            ] {
                fails(sys::open_close(&p, f, 0o644), libc::EISDIR, name);
            }
            fails(
                sys::open_close(&p, O_CREAT | O_EXCL | O_RDONLY, 0o644),
                libc::EEXIST,
                "O_CREAT|O_EXCL on a directory",
            );
        },
    );

    env.case(
        "ELOOP with O_NOFOLLOW on a symlink; O_PATH|O_NOFOLLOW opens the link",
        |d| {
            create(Reg, d.p("f"));
            ok(sys::symlink("f", d.p("l")), "symlink");
            for (f, name) in [
                (
                    O_RDONLY | O_CREAT | O_NOFOLLOW,
                    "O_RDONLY|O_CREAT|O_NOFOLLOW",
                ),
                (O_RDONLY | O_NOFOLLOW, "O_RDONLY|O_NOFOLLOW"),
                (O_WRONLY | O_NOFOLLOW, "O_WRONLY|O_NOFOLLOW"),
                (O_RDWR | O_NOFOLLOW, "O_RDWR|O_NOFOLLOW"),
            ] {
                fails(sys::open_close(d.p("l"), f, 0o644), libc::ELOOP, name);
            }
            ok(sys::symlink("nowhere", d.p("dl")), "symlink");
            fails(
                sys::open_close(d.p("dl"), O_CREAT | O_WRONLY | O_NOFOLLOW, 0o644),
                libc::ELOOP,
                "O_CREAT|O_NOFOLLOW on a dangling symlink",
            );
            gone(d.p("nowhere"), "no target created");
            ok(
                sys::open_close(d.p("f"), O_RDONLY | O_NOFOLLOW, 0),
                "O_NOFOLLOW on a file",
            );
            // Only the last component counts.
            create(Dir, d.p("dir"));
            create(Reg, d.p("dir/g"));
            ok(sys::symlink("dir", d.p("ld")), "symlink");
            ok(
                sys::open_close(d.p("ld/g"), O_RDONLY | O_NOFOLLOW, 0),
                "O_NOFOLLOW with a symlink in the prefix",
            );
            let fd = ok(
                sys::open(d.p("l"), O_PATH | O_NOFOLLOW, 0),
                "O_PATH|O_NOFOLLOW",
            );
            assert_eq!(
                ok(sys::fstat(&fd), "fstat").mode & libc::S_IFMT,
                libc::S_IFLNK
            );
        },
    );

    env.case("ELOOP on a symlink loop, also with O_CREAT", |d| {
        ok(sys::symlink("b", d.p("a")), "symlink");
        ok(sys::symlink("a", d.p("b")), "symlink");
        fails(sys::open_close(d.p("a"), O_RDONLY, 0), libc::ELOOP, "a");
        fails(
            sys::open_close(d.p("b"), O_CREAT | O_WRONLY, 0o644),
            libc::ELOOP,
            "b O_CREAT",
        );
        ok(sys::symlink("self", d.p("self")), "symlink");
        fails(
            sys::open_close(d.p("self"), O_RDONLY, 0),
            libc::ELOOP,
            "self-loop",
        );
    });

    env.case(
        "O_DIRECTORY: ENOTDIR on non-directories, follows symlinks",
        |d| {
            create(Dir, d.p("dir"));
            ok(
                sys::open_close(d.p("dir"), O_RDONLY | O_DIRECTORY, 0),
                "on a dir",
            );
            ok(sys::symlink("dir", d.p("ld")), "symlink");
            ok(
                sys::open_close(d.p("ld"), O_RDONLY | O_DIRECTORY, 0),
                "via a symlink",
            );
            for k in PLAIN {
                let p = d.p(&format!("{k:?}"));
                create(k, &p);
                fails(
                    sys::open_close(&p, O_RDONLY | O_DIRECTORY | O_NONBLOCK, 0),
                    libc::ENOTDIR,
                    format!("{k:?}"),
                );
            }
            fails(
                sys::open_close(d.p("Reg/"), O_RDONLY, 0),
                libc::ENOTDIR,
                "a file with a trailing slash",
            );
            fails(
                sys::open_close(d.p("new/"), O_CREAT | O_WRONLY, 0o644),
                libc::EISDIR,
                "O_CREAT of a name with a trailing slash",
            );
        },
    );

    env.case("ENOENT without O_CREAT; O_CREAT of a missing prefix", |d| {
        fails(
            sys::open_close(d.p("missing"), O_RDONLY, 0),
            libc::ENOENT,
            "missing",
        );
        fails(
            sys::open_close(d.p("missing"), O_WRONLY | O_TRUNC, 0),
            libc::ENOENT,
            "O_TRUNC",
        );
        fails(
            sys::open_close(d.p("missing/f"), O_CREAT | O_WRONLY, 0o644),
            libc::ENOENT,
            "O_CREAT below a missing dir",
        );
        gone(d.p("missing"), "nothing created");
    });

    env.case(
        "ENXIO: a fifo without readers (O_WRONLY|O_NONBLOCK), a socket",
        |d| {
            ok(sys::mkfifo(d.p("fifo"), 0o644), "mkfifo");
            fails(
                sys::open_close(d.p("fifo"), O_WRONLY | O_NONBLOCK, 0),
                libc::ENXIO,
                "fifo",
            );
            create(Sock, d.p("sock"));
            for (f, name) in [
                (O_RDONLY, "O_RDONLY"),
                (O_WRONLY, "O_WRONLY"),
                (O_RDWR, "O_RDWR"),
            ] {
                fails(
                    sys::open_close(d.p("sock"), f, 0),
                    libc::ENXIO,
                    format!("socket {name}"),
                );
            }
        },
    );

    env.case(
        "ETXTBSY opening a program being executed for writing",
        |d| {
            let prog = Running::start(&d.path);
            for (f, name) in [
                (O_WRONLY, "O_WRONLY"),
                (O_RDWR, "O_RDWR"),
                (O_RDONLY | O_TRUNC, "O_RDONLY|O_TRUNC"),
            ] {
                fails(sys::open_close(&prog.path, f, 0), libc::ETXTBSY, name);
            }
            ok(sys::open_close(&prog.path, O_RDONLY, 0), "O_RDONLY is fine");
            assert!(lst(&prog.path).size > 0, "not truncated");
        },
    );

    env.case("O_RDWR|O_WRONLY (access mode 3): success or EINVAL", |d| {
        let p = d.p("f");
        create(Reg, &p);
        match sys::open_close(&p, O_RDWR | O_WRONLY, 0) {
            Ok(()) | Err(libc::EINVAL) => {}
            Err(e) => panic!(
                "O_RDWR|O_WRONLY: expected success or EINVAL, got {}",
                errname(e)
            ),
        }
    });

    env.case("O_APPEND writes at the end, whatever the offset", |d| {
        let p = d.p("f");
        write_file(&p, b"abc");
        let fd = ok(sys::open(&p, O_WRONLY | O_APPEND, 0), "open O_APPEND");
        ok(sys::write(&fd, b"def"), "write");
        assert_eq!(read_file(&p), b"abcdef");
        ok(sys::lseek(&fd, 0, libc::SEEK_SET), "lseek 0");
        ok(sys::write(&fd, b"g"), "write after lseek 0");
        assert_eq!(
            ok(sys::lseek(&fd, 0, libc::SEEK_CUR), "lseek"),
            7,
            "offset after the append"
        );
        // Linux: pwrite on an O_APPEND descriptor appends too.
        ok(sys::pwrite(&fd, b"h", 0), "pwrite at 0");
        assert_eq!(read_file(&p), b"abcdefgh");
        // Two appenders and a writer extending the file meanwhile.
        let fd2 = ok(sys::open(&p, O_WRONLY | O_APPEND, 0), "second appender");
        ok(sys::write(&fd, b"1"), "write");
        ok(sys::write(&fd2, b"2"), "write");
        ok(sys::write(&fd, b"3"), "write");
        assert_eq!(read_file(&p), b"abcdefgh123");
        let w = ok(sys::open(&p, O_WRONLY, 0), "plain writer");
        ok(sys::pwrite(&w, b"Z", 20), "pwrite beyond the end");
        ok(sys::write(&fd2, b"!"), "append after the extension");
        let got = read_file(&p);
        assert_eq!(got.len(), 22);
        assert_eq!(&got[20..], b"Z!");
        assert!(
            got[11..20].iter().all(|b| *b == 0),
            "the gap reads as zeros"
        );
    });

    env.case("O_APPEND|O_CREAT of a new file, then appending", |d| {
        let p = d.p("log");
        for i in 0..5u8 {
            let fd = ok(sys::open(&p, O_WRONLY | O_APPEND | O_CREAT, 0o644), "open");
            ok(sys::write(&fd, &[b'0' + i]), "write");
        }
        assert_eq!(read_file(&p), b"01234");
    });

    env.case("data beyond 2 GiB (open/25)", |d| {
        let p = d.p("big");
        let off = (2i64 << 30) + 1;
        let fd = ok(sys::open(&p, O_CREAT | O_WRONLY, 0o755), "open");
        ok(sys::pwrite(&fd, b"a", off), "pwrite beyond 2 GiB");
        drop(fd);
        assert_eq!(lst(&p).size, off + 1);
        let fd = ok(sys::open(&p, O_RDONLY, 0), "open");
        assert_eq!(ok(sys::pread(&fd, 1, off), "pread"), b"a");
        assert_eq!(ok(sys::pread(&fd, 4, off - 3), "pread"), b"\0\0\0a");
    });

    env.case(
        "names are bytes: non-UTF-8, control characters, case, multibyte",
        |d| {
            use std::os::unix::ffi::OsStrExt;
            let names: Vec<&[u8]> = vec![
                b"\xff\xfe\x80",
                b"line\nbreak",
                b"tab\there",
                b"Case",
                b"case",
                b" leading space",
                b"-dash",
                "\u{65e5}\u{672c}\u{8a9e}".as_bytes(),
            ];
            for (i, n) in names.iter().enumerate() {
                let p = d.path.join(std::ffi::OsStr::from_bytes(n));
                write_file(&p, format!("{i}").as_bytes());
            }
            // 85 three-byte characters: a 255-byte name.
            let long = "\u{65e5}".repeat(85);
            write_file(d.p(&long), b"long");
            for (i, n) in names.iter().enumerate() {
                let p = d.path.join(std::ffi::OsStr::from_bytes(n));
                assert_eq!(read_file(&p), format!("{i}").as_bytes(), "name {n:?}");
            }
            assert_eq!(read_file(d.p(&long)), b"long");
            let mut listed: Vec<Vec<u8>> = std::fs::read_dir(&d.path)
                .unwrap()
                .map(|e| e.unwrap().file_name().as_bytes().to_vec())
                .collect();
            listed.sort();
            let mut want: Vec<Vec<u8>> = names.iter().map(|n| n.to_vec()).collect();
            want.push(long.as_bytes().to_vec());
            want.sort();
            assert_eq!(listed, want, "readdir returns the exact bytes");
        },
    );
}
