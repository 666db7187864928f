//! EROFS on a read-only mount (pjdfstest */EROFS cases): every call that would modify the
//! volume fails with EROFS and changes nothing; reading still works.

use crate::common::Volume;
use crate::harness::*;
use crate::sys::{self, KEEP, NOW};
use libc::{O_CREAT, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};

pub fn run() {
    let _serial = serial();
    let vol = Volume::new();
    let m = vol.mount();
    let root = m.p("ro");
    sys::mkdir(&root, 0o755).unwrap();
    std::fs::write(root.join("f"), b"read-only data").unwrap();
    sys::mkdir(root.join("dir"), 0o755).unwrap();
    sys::mkdir(root.join("empty"), 0o755).unwrap();
    sys::symlink("f", root.join("l")).unwrap();
    sys::mkfifo(root.join("fifo"), 0o644).unwrap();
    m.unmount();
    let m = vol.mount_with(&["--read-only"]);
    let root = m.p("ro");
    run_in("erofs", root, |env| {
        env.case("reading works on a read-only mount", |d| {
            assert_eq!(read_file(d.p("f")), b"read-only data");
            assert_eq!(read_file(d.p("l")), b"read-only data");
            assert_eq!(ok(sys::readlink(d.p("l")), "readlink"), b"f");
            assert!(st(d.p("dir")).is_dir());
            ok(sys::access(d.p("f"), libc::R_OK), "access R_OK");
            fails(
                sys::access(d.p("f"), libc::W_OK),
                libc::EROFS,
                "access W_OK",
            );
        });
        env.case("EROFS for every modifying call", |d| {
            let f = d.p("f");
            let before = lst(&f);
            type Call<'a> = Box<dyn Fn() -> sys::R<()> + 'a>;
            let calls: Vec<(&str, Call)> = vec![
                ("chmod", Box::new(|| sys::chmod(&f, 0o600))),
                ("chown", Box::new(|| sys::chown(&f, NOBODY, KEEP))),
                ("lchown", Box::new(|| sys::lchown(d.p("l"), NOBODY, NOBODY))),
                ("truncate", Box::new(|| sys::truncate(&f, 1))),
                (
                    "open O_WRONLY",
                    Box::new(|| sys::open_close(&f, O_WRONLY, 0)),
                ),
                ("open O_RDWR", Box::new(|| sys::open_close(&f, O_RDWR, 0))),
                (
                    "open O_RDONLY|O_TRUNC",
                    Box::new(|| sys::open_close(&f, O_RDONLY | O_TRUNC, 0)),
                ),
                (
                    "open O_CREAT",
                    Box::new(|| sys::open_close(d.p("new"), O_CREAT | O_RDONLY, 0o644)),
                ),
                ("link", Box::new(|| sys::link(&f, d.p("new")))),
                ("mkdir", Box::new(|| sys::mkdir(d.p("new"), 0o755))),
                ("mkfifo", Box::new(|| sys::mkfifo(d.p("new"), 0o644))),
                (
                    "mknod",
                    Box::new(|| sys::mknod(d.p("new"), libc::S_IFCHR | 0o644, 1, 2)),
                ),
                ("rename", Box::new(|| sys::rename(&f, d.p("new")))),
                ("rename over", Box::new(|| sys::rename(&f, d.p("fifo")))),
                ("rmdir", Box::new(|| sys::rmdir(d.p("empty")))),
                ("symlink", Box::new(|| sys::symlink("x", d.p("new")))),
                ("unlink", Box::new(|| sys::unlink(&f))),
                (
                    "utimensat times",
                    Box::new(|| sys::utimensat(&f, Some([(1, 0), (2, 0)]), 0)),
                ),
                (
                    "utimensat now",
                    Box::new(|| sys::utimensat(&f, Some([NOW, NOW]), 0)),
                ),
            ];
            for (name, call) in calls {
                fails(call(), libc::EROFS, name);
            }
            let after = lst(&f);
            assert_eq!(
                (after.perm(), after.uid, after.size, after.nlink),
                (before.perm(), before.uid, before.size, before.nlink)
            );
            same(before.ctime, after.ctime, "ctime");
            same(before.mtime, after.mtime, "mtime");
            gone(d.p("new"), "nothing created");
            lst(d.p("empty"));
        });
    });
    m.unmount();
}
