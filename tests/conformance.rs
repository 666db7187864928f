//! POSIX conformance, syscall by syscall, after pjdfstest: chmod, chown/lchown, truncate and
//! ftruncate, link, mkdir, mkfifo, mknod, open, posix_fallocate, rename, rmdir, symlink,
//! unlink, utimensat, write (with what a concurrent close does to it), and EROFS on a
//! read-only mount; with the timestamp rules of each call and permission checks as
//! unprivileged users (uid 65534 "nobody", 65533, 1000).
//!
//! Each family is one test that mounts its own volume (`on_unkai::<family>`), runs every case
//! in its own directory, and reports every failing case by name at the end. The same cases run
//! on the host's local file system too (`on_local::<family>`): that is the reference for
//! "what Linux does"; a case failing there is a wrong expectation, not an unkai bug.
//!
//! Run as root (the cases switch users and create devices): `cargo test --test conformance`.

mod common;

#[path = "conformance/harness.rs"]
mod harness;
#[path = "conformance/sys.rs"]
mod sys;

#[path = "conformance/chmod.rs"]
mod chmod;
#[path = "conformance/chown.rs"]
mod chown;
#[path = "conformance/erofs.rs"]
mod erofs;
#[path = "conformance/fallocate.rs"]
mod fallocate;
#[path = "conformance/link.rs"]
mod link;
#[path = "conformance/mkdir.rs"]
mod mkdir;
#[path = "conformance/mkfifo.rs"]
mod mkfifo;
#[path = "conformance/mknod.rs"]
mod mknod;
#[path = "conformance/open.rs"]
mod open;
#[path = "conformance/rename.rs"]
mod rename;
#[path = "conformance/rmdir.rs"]
mod rmdir;
#[path = "conformance/symlink.rs"]
mod symlink;
#[path = "conformance/truncate.rs"]
mod truncate;
#[path = "conformance/unlink.rs"]
mod unlink;
#[path = "conformance/utimensat.rs"]
mod utimensat;
#[path = "conformance/write.rs"]
mod write;

/// One test per family on unkai, and the same on the local reference file system.
macro_rules! families {
    ($($family:ident),* $(,)?) => {
        mod on_unkai {
            $(
                #[test]
                fn $family() {
                    crate::harness::run_on_unkai(stringify!($family), crate::$family::run);
                }
            )*
        }
        mod on_local {
            $(
                #[test]
                fn $family() {
                    crate::harness::run_on_local(stringify!($family), crate::$family::run);
                }
            )*
        }
    };
}

families!(
    chmod, chown, truncate, link, mkdir, mkfifo, mknod, open, fallocate, rename, rmdir, symlink,
    unlink, utimensat, write,
);

/// EROFS needs a read-only mount: unkai only (the reference has no read-only file system).
#[test]
fn erofs_on_unkai() {
    erofs::run();
}
