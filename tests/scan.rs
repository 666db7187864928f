//! Antivirus scanning through a real mount and a real clamd (Debian's clamav-daemon, with a
//! signature made here for the EICAR test string): an infected file is moved to
//! /.quarantine and refused to every open, the event is in the log and the access log, a
//! clean file is left alone; with clamd down, `--scan-fail closed` refuses what was written
//! until clamd is back and finds it clean, `--scan-fail open` leaves it readable. The
//! kernel forgets an infected file's name as it is moved (it would cache it for 30 s).

use crate::common;

use crate::common::clamd::{self, Clamd, EICAR, SIGNATURE};
use crate::common::*;
use std::fs;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

/// The names in `p`, none if it does not exist (yet).
fn listing(p: &std::path::Path) -> std::collections::BTreeSet<String> {
    match p.exists() {
        true => names(p),
        false => Default::default(),
    }
}

/// Waits until the mount's log says the scanner moved `path` (its move and the kernel's
/// notifications are done by then); the log, if it does not.
fn moved_to_quarantine(m: &Mount, path: &str) -> Result<(), String> {
    let said = |log: &str| {
        log.lines()
            .any(|l| l.contains(path) && l.contains("is infected") && l.contains("moved to"))
    };
    match eventually(LONG, || said(&m.log_text())) {
        true => Ok(()),
        false => Err(tail(&m.log_text(), 30)),
    }
}

fn refused(p: &std::path::Path) -> bool {
    fs::File::open(p).is_err_and(|e| e.raw_os_error() == Some(libc::EACCES))
}

#[test]
fn an_infected_file_is_quarantined_and_refused_and_logged() {
    if !clamd::available() {
        return;
    }
    let av = Clamd::start();
    let vol = Volume::new();
    let access = vol.dir.path().join("access.log");
    let m = vol.mount_with(&[
        "--scan",
        &av.url(),
        "--access-log",
        access.to_str().unwrap(),
    ]);
    fs::create_dir(m.p("in")).unwrap();
    let clean = pattern(3 << 20, 7);
    fs::write(m.p("in/clean.bin"), &clean).unwrap();
    // The test string inside a larger file, past the first chunk sent.
    let mut bad = pattern(1 << 20, 9);
    bad.extend_from_slice(EICAR);
    fs::write(m.p("in/report.pdf"), &bad).unwrap();

    let q = m.p(".quarantine");
    if let Err(log) = moved_to_quarantine(&m, "/in/report.pdf") {
        panic!("not quarantined; log:\n{log}");
    }
    // Gone from its name at once: the kernel's cached entry was dropped with the move.
    assert!(
        !m.p("in/report.pdf").exists(),
        "the kernel still shows the quarantined file under its name"
    );
    assert!(listing(&q).iter().any(|n| n.ends_with("report.pdf")));
    let name = listing(&q)
        .into_iter()
        .find(|n| n.ends_with("report.pdf"))
        .unwrap();
    // Nobody opens it, root included, for reading or writing; it can still be removed.
    assert!(refused(&q.join(&name)), "an infected file opened");
    assert!(
        fs::OpenOptions::new()
            .write(true)
            .open(q.join(&name))
            .is_err_and(|e| e.raw_os_error() == Some(libc::EACCES))
    );
    // The clean file is untouched and reads back whole.
    assert_eq!(fs::read(m.p("in/clean.bin")).unwrap(), clean);
    let log = m.log_text();
    assert!(
        log.contains(SIGNATURE) && log.contains("/in/report.pdf"),
        "the log names neither the file nor the signature:\n{}",
        tail(&log, 30)
    );
    let access_log = fs::read_to_string(&access).unwrap();
    assert!(
        access_log
            .lines()
            .any(|l| l.contains("[scan]") && l.contains("INFECTED") && l.contains(SIGNATURE)),
        "not in the access log:\n{}",
        tail(&access_log, 20)
    );
    fs::remove_file(q.join(&name)).unwrap();
    assert!(!q.join(&name).exists());
    // Written again through a rename over a clean name: scanned again, caught again.
    fs::write(m.p("in/tmp"), EICAR).unwrap();
    fs::rename(m.p("in/tmp"), m.p("in/clean.bin")).unwrap();
    if let Err(log) = moved_to_quarantine(&m, "/in/clean.bin") {
        panic!("a renamed infected file stayed; log:\n{log}");
    }
    assert!(
        !m.p("in/clean.bin").exists(),
        "the kernel still shows the renamed infected file under its name"
    );
    drop(m);
    // A later mount without scanning still refuses it: the mark is the volume's.
    let m = vol.mount();
    let q = m.p(".quarantine");
    let n = listing(&q);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(refused(&q.join(n.iter().next().unwrap())));
}

#[test]
fn clamd_down_fails_closed_or_open_as_asked() {
    if !clamd::available() {
        return;
    }
    let mut av = Clamd::start();
    av.stop();
    let vol = Volume::new();
    let m = vol.mount_with(&["--scan", &av.url(), "--scan-fail", "closed"]);
    fs::write(m.p("held.txt"), b"nothing wrong with me").unwrap();
    assert!(
        eventually(LONG, || refused(&m.p("held.txt"))),
        "clamd down, --scan-fail closed: the file is not refused; log:\n{}",
        tail(&m.log_text(), 30)
    );
    assert!(m.log_text().contains("--scan-fail closed"));
    av.run();
    // Scanned again once clamd answers: clean, so let through, and in place.
    assert!(
        eventually(Duration::from_secs(400), || fs::read(m.p("held.txt"))
            .is_ok_and(|b| b == b"nothing wrong with me")),
        "not let through once clamd was back; log:\n{}",
        tail(&m.log_text(), 30)
    );
    drop(m);

    av.stop();
    let m = vol.mount_with(&["--scan", &av.url(), "--scan-fail", "open"]);
    fs::write(m.p("open.txt"), EICAR).unwrap();
    assert!(
        eventually(LONG, || m.log_text().contains("NOT SCANNED")
            || m.log_text().contains("--scan-fail open")),
        "no word of the scanner being down; log:\n{}",
        tail(&m.log_text(), 30)
    );
    // Readable, unscanned, while clamd is down.
    assert_eq!(fs::read(m.p("open.txt")).unwrap(), EICAR);
    av.run();
    assert!(
        eventually(Duration::from_secs(400), || !m.p("open.txt").exists()),
        "not caught once clamd was back; log:\n{}",
        tail(&m.log_text(), 30)
    );
}

#[test]
fn a_bad_scan_address_is_one_line() {
    let vol = Volume::new();
    let mp = tempfile::tempdir().unwrap();
    let (ok, _, err) = run_env(
        &[
            "mount",
            "--scan",
            "http://clamd",
            &vol.meta_url,
            mp.path().to_str().unwrap(),
        ],
        &vol.env,
    );
    assert!(!ok);
    assert!(
        err.contains("invalid --scan 'http://clamd'") && err.contains("clamd:///"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// A network server's scan events go to its access log as a mount's do: an infected file
/// put over WebDAV is quarantined, and `[scan] ... INFECTED` is in `--access-log`.
#[test]
fn a_servers_scan_events_are_in_its_access_log() {
    use common::fronts::{Front, dav, have};
    if !clamd::available() || !have("curl") {
        return;
    }
    let av = Clamd::start();
    let vol = Volume::new();
    let access = vol.dir.path().join("access.log");
    let srv = Front::start(
        &vol,
        "webdav",
        &[
            "--user",
            "alice",
            "--scan",
            &av.url(),
            "--access-log",
            access.to_str().unwrap(),
        ],
    );
    let bad = vol.dir.path().join("bad.txt");
    fs::write(&bad, EICAR).unwrap();
    let upload = format!("@{}", bad.display());
    assert_eq!(
        dav(
            "alice",
            &["-X", "PUT", "--data-binary", &upload],
            &srv.url("/eicar.txt")
        ),
        201
    );
    let logged = eventually(LONG, || {
        fs::read_to_string(&access)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains("[scan]")
                    && l.contains("INFECTED")
                    && l.contains(SIGNATURE)
                    && l.contains("/eicar.txt")
            })
    });
    assert!(
        logged,
        "no scan event in the server's access log:\n{}\nserver log:\n{}",
        tail(&fs::read_to_string(&access).unwrap_or_default(), 20),
        tail(&srv.log_text(), 30)
    );
    srv.stop();
}
