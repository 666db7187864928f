//! mkfifo(3) (pjdfstest mkfifo/*).

use crate::harness::*;
use crate::mkdir::creation_rules;
use crate::sys;

pub fn run(env: &Env) {
    path_errors(
        env,
        &PathOp {
            name: "mkfifo",
            needs: Needs::Nothing,
            follows: false,
            prep: &no_prep,
            op: &|_, p| sys::mkfifo(p, 0o644),
        },
    );
    creation_rules(env, "mkfifo", Fifo, &|p, mode| sys::mkfifo(p, mode));

    env.case("EACCES without write permission on the parent", |d| {
        let n1 = d.p("n1");
        ok(sys::mkdir(&n1, 0o755), "mkdir");
        ok(sys::chown(&n1, NOBODY, NOBODY), "chown");
        ok(as_nobody(|| sys::mkfifo(n1.join("x"), 0o644)), "as owner");
        ok(as_nobody(|| sys::unlink(n1.join("x"))), "unlink");
        ok(sys::chmod(&n1, 0o555), "chmod");
        fails(
            as_nobody(|| sys::mkfifo(n1.join("x"), 0o644)),
            libc::EACCES,
            "mkfifo in a 0555 dir",
        );
        gone(n1.join("x"), "not created");
    });

    env.case("EEXIST for every existing type", |d| {
        for k in ALL {
            let p = d.p(&format!("{k:?}"));
            create(k, &p);
            fails(
                sys::mkfifo(&p, 0o644),
                libc::EEXIST,
                format!("over a {k:?}"),
            );
            assert_eq!(lst(&p).fmt(), k.fmt());
        }
    });

    env.case("the fifo carries data between descriptors", |d| {
        let p = d.p("fifo");
        ok(sys::mkfifo(&p, 0o666), "mkfifo");
        // O_RDWR on a fifo never blocks on Linux.
        let rw = ok(sys::open(&p, libc::O_RDWR, 0), "open O_RDWR");
        let r = ok(
            sys::open(&p, libc::O_RDONLY | libc::O_NONBLOCK, 0),
            "open reader",
        );
        let w = ok(
            sys::open(&p, libc::O_WRONLY | libc::O_NONBLOCK, 0),
            "open writer",
        );
        ok(sys::write(&w, b"through the pipe"), "write");
        assert_eq!(ok(sys::read(&r, 100), "read"), b"through the pipe");
        ok(sys::write(&rw, b"again"), "write");
        assert_eq!(ok(sys::read(&rw, 100), "read"), b"again");
        assert_eq!(lst(&p).size, 0, "a fifo has no size");
    });
}
