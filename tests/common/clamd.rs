//! A private clamd for tests (Debian's clamav-daemon): its own directory, unix socket and
//! signature database, made here (one signature, for the EICAR test string: nothing is
//! downloaded). Stopped when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The EICAR test file: harmless, detected by every antivirus as a test.
pub const EICAR: &[u8] = br"X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*";

/// The name clamd gives what our one signature finds.
pub const SIGNATURE: &str = "Unkai.Test.EICAR.UNOFFICIAL";

pub struct Clamd {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

/// Whether the tests that need clamd may run: clamd is installed, or the run requires it
/// (UNKAI_REQUIRE_CLIENTS, set by scripts/test.sh), in which case its absence fails them.
pub fn available() -> bool {
    let there = Command::new("clamd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !there && std::env::var_os("UNKAI_REQUIRE_CLIENTS").is_none() {
        eprintln!("SKIPPED: clamd is not installed (apt-get install clamav-daemon)");
        return false;
    }
    true
}

impl Clamd {
    pub fn start() -> Clamd {
        let dir = tempfile::Builder::new()
            .prefix("unkai-clamd-")
            .tempdir()
            .unwrap();
        std::fs::create_dir(dir.path().join("db")).unwrap();
        let hex: String = b"EICAR-STANDARD-ANTIVIRUS-TEST-FILE"
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        std::fs::write(
            dir.path().join("db/unkai.ndb"),
            format!("Unkai.Test.EICAR:0:*:{hex}\n"),
        )
        .unwrap();
        let mut c = Clamd { dir, child: None };
        c.run();
        c
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("clamd.sock")
    }

    /// `clamd://SOCKET`, as `--scan` takes it.
    pub fn url(&self) -> String {
        format!("clamd://{}", self.socket().display())
    }

    /// Starts clamd (again) and waits until it answers.
    pub fn run(&mut self) {
        let d = self.dir.path();
        let conf = d.join("clamd.conf");
        std::fs::write(
            &conf,
            format!(
                "Foreground yes\nLocalSocket {sock}\nDatabaseDirectory {d}/db\n\
                 LogFile {d}/clamd.log\nTemporaryDirectory {d}\nBytecode no\n",
                sock = self.socket().display(),
                d = d.display()
            ),
        )
        .unwrap();
        let _ = std::fs::remove_file(self.socket());
        let child = Command::new("clamd")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("clamd (apt-get install clamav-daemon)");
        self.child = Some(child);
        let sock = self.socket();
        let up = super::eventually(Duration::from_secs(120), || {
            use std::io::{Read, Write};
            let Ok(mut s) = std::os::unix::net::UnixStream::connect(&sock) else {
                return false;
            };
            let mut r = Vec::new();
            s.write_all(b"zPING\0").is_ok() && s.read_to_end(&mut r).is_ok() && r == b"PONG\0"
        });
        let log = std::fs::read_to_string(d.join("clamd.log")).unwrap_or_default();
        assert!(up, "clamd did not answer PING; its log:\n{log}");
    }

    /// Stops clamd (its socket then refuses connections).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }
}

impl Drop for Clamd {
    fn drop(&mut self) {
        self.stop();
    }
}
