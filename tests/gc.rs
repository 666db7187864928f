//! `unkai gc --delete` on a mounted volume: it never deletes what a live client may still
//! commit (the uploaded blocks of a file still being written), whatever `--min-age` says, and
//! still deletes what a dead client left uncommitted. Each test body runs on SQLite and, with
//! UNKAI_TEST_POSTGRES set, on PostgreSQL.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;

/// Generous: uploads to a local bucket on a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(120);

both_engines!(
    gc_leaves_a_file_being_written_and_takes_a_dead_clients_uploads(Vec::new()),
    gc_takes_what_a_live_client_gave_back(super::fast_heartbeat()),
);

/// Heartbeats (and so the giving back of reserved slice ids) every few tenths of a second.
fn fast_heartbeat() -> Vec<(String, String)> {
    vec![("UNKAI_SESSION_TIMEOUT".into(), "15".into())]
}

const MIB: usize = 1 << 20;

/// A process that writes a file and keeps it open until told to close it: a forked child,
/// so that no other process holds a copy of its descriptor (every close of a copy, e.g. by a
/// process this test binary spawns, would commit the file early). Killed if dropped.
struct Writer {
    pid: nix::unistd::Pid,
    go: PathBuf,
    done: bool,
}

impl Writer {
    fn start(path: &Path, data: &[u8], go: PathBuf) -> Writer {
        use nix::unistd::{ForkResult, fork};
        let cfile = cpath(path);
        let cgo = cpath(&go);
        // SAFETY: the child makes only async-signal-safe calls (open, write,
        // sync_file_range, access, nanosleep, close, _exit) on memory prepared before the fork.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => unsafe {
                let fd = libc::open(
                    cfile.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    libc::_exit(101);
                }
                let mut done = 0;
                while done < data.len() {
                    let n = libc::write(fd, data[done..].as_ptr().cast(), data.len() - done);
                    if n <= 0 {
                        libc::_exit(102);
                    }
                    done += n as usize;
                }
                // Under the kernel's writeback cache the bytes wait in its pages until it
                // writes them back (seconds, or 30 s and more on a loaded machine): handed
                // over now, without an fsync, which would commit the file.
                libc::sync_file_range(
                    fd,
                    0,
                    0,
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE
                        | libc::SYNC_FILE_RANGE_WRITE
                        | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                );
                let pause = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 10_000_000,
                };
                while libc::access(cgo.as_ptr(), libc::F_OK) != 0 {
                    libc::nanosleep(&pause, std::ptr::null_mut());
                }
                libc::_exit(if libc::close(fd) == 0 { 0 } else { 103 });
            },
            ForkResult::Parent { child } => Writer {
                pid: child,
                go,
                done: false,
            },
        }
    }

    /// Tells the writer to close the file; returns whether the close succeeded.
    fn close(mut self) -> bool {
        std::fs::write(&self.go, b"").unwrap();
        self.done = true;
        match nix::sys::wait::waitpid(self.pid, None).expect("waitpid") {
            nix::sys::wait::WaitStatus::Exited(_, 0) => true,
            other => {
                eprintln!("writer ended with {other:?}");
                false
            }
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.done {
            let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(self.pid, None);
        }
    }
}

/// Block objects in the bucket (a local store's half-written staging files aside).
fn blocks(vol: &Volume) -> BTreeSet<PathBuf> {
    vol.objects()
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        })
        .collect()
}

/// Waits until the bucket holds at least `n` block objects; returns them.
fn wait_blocks(vol: &Volume, n: usize, what: &str) -> BTreeSet<PathBuf> {
    let mut seen = BTreeSet::new();
    let ok = eventually(WAIT, || {
        seen = blocks(vol);
        seen.len() >= n
    });
    assert!(ok, "{what}: {} block objects, expected {n}", seen.len());
    seen
}

fn gc_leaves_a_file_being_written_and_takes_a_dead_clients_uploads(vol: &Volume) {
    let live = vol.mount();

    let flags = vol.dir.path();

    // A client that dies while writing: its uploaded blocks were never committed.
    let dying = vol.mount();
    let lost = Writer::start(
        &dying.p("lost"),
        &pattern(8 * MIB, 1),
        flags.join("go-lost"),
    );
    wait_blocks(vol, 2, "blocks of the dying client's file");
    dying.kill9();
    drop(lost);
    let dead_blocks = blocks(vol);

    // A file being written on the live client: 20 MiB (five 4 MiB blocks) are uploaded as
    // they fill, and committed only at close.
    let data = pattern(20 * MIB, 2);
    let big = Writer::start(&live.p("big"), &data, flags.join("go-big"));
    let all = wait_blocks(
        vol,
        dead_blocks.len() + 5,
        "blocks of the file being written",
    );
    let writing: BTreeSet<_> = all.difference(&dead_blocks).cloned().collect();

    // fsck does not call them leaked: they are in flight.
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(ok, "fsck while writing: {out}{err}");
    assert!(out.contains("5 objects (20.0 MiB) in flight"), "{out}");
    for b in &writing {
        let name = b.file_name().unwrap().to_string_lossy();
        assert!(
            !out.contains(&*name),
            "fsck names a block in flight: {name}\n{out}"
        );
    }

    // Without an age margin, gc would take any unreferenced object.
    let (ok, out, err) = vol.cmd("gc", &["-q", "--delete", "--min-age", "0"]);
    assert!(ok, "gc failed: {out}{err}");
    let left = blocks(vol);
    let gone: Vec<_> = writing.difference(&left).collect();
    assert!(
        gone.is_empty(),
        "gc deleted blocks of a file still being written: {gone:?}\n{out}"
    );
    assert!(
        out.contains("in flight"),
        "gc names the uploads in flight: {out}"
    );
    let kept: Vec<_> = dead_blocks.intersection(&left).collect();
    assert!(
        kept.is_empty(),
        "gc left the uncommitted blocks of a dead client: {kept:?}\n{out}"
    );

    // The file is committed at close and reads back whole after a remount.
    assert!(big.close(), "close of the file being written failed");
    live.unmount();
    let m = vol.mount();
    let mut back = Vec::new();
    std::fs::File::open(m.p("big"))
        .unwrap()
        .read_to_end(&mut back)
        .expect("read the file back after gc");
    assert!(
        back == data,
        "file differs after gc ({} bytes read)",
        back.len()
    );
    m.unmount();

    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(ok, "fsck after gc: {out}{err}");
    assert!(!out.contains("LEAKED"), "{out}");
    assert!(
        !out.contains("in flight"),
        "nothing is in flight after unmount: {out}"
    );
}

/// A live client reserves the slice ids it takes, and gives back those below what it still
/// has in flight at each heartbeat: an object of an id it committed long ago that no record
/// references (what an abandoned upload leaves) is garbage again, for gc, while it is mounted.
fn gc_takes_what_a_live_client_gave_back(vol: &Volume) {
    let m = vol.mount();
    let data = pattern(MIB, 3);
    std::fs::write(m.p("f"), &data).unwrap();
    let obj = wait_blocks(vol, 1, "the committed file's block")
        .into_iter()
        .next()
        .unwrap();
    let name = obj.file_name().unwrap().to_string_lossy().into_owned();
    let id = name.split('_').next().unwrap();
    let stray = obj.with_file_name(format!("{id}_9_100"));
    std::fs::write(&stray, [0u8; 100]).unwrap();
    let mut out = String::new();
    let gone = eventually_every(WAIT, Duration::from_millis(500), || {
        let (ok, o, err) = vol.cmd("gc", &["-q", "--delete", "--min-age", "0"]);
        assert!(ok, "gc failed: {o}{err}");
        out = o;
        !stray.exists()
    });
    assert!(
        gone,
        "gc never took an unreferenced object of a committed slice: {out}"
    );
    assert!(obj.exists(), "gc took the file's block");
    assert!(std::fs::read(m.p("f")).unwrap() == data, "file changed");
    m.unmount();
}
