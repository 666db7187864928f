//! The access log of an export: one line per request (time, uid, gid, pid and process
//! name, operation, its inodes and names, result, duration), as JuiceFS's `.accesslog`. Read
//! live through [`Reader`]s (the mount's virtual file `.accesslog`: each open of it follows
//! the log from then on), and written to a file with `--access-log FILE`. Costs nothing
//! while nobody reads it and no file is set: requests then build no line.
//!
//! A line: `2026.11.26 20:31:02.123456 [proto:fuse,uid:0,gid:0,pid:4403,comm:cp] write
//! (17,0,4096): OK <0.000012>` (a network client has `client:ADDR` and perhaps `user:NAME`
//! in place of `pid` and `comm`); the antivirus scanner's events are lines
//! `STAMP [scan] EVENT`.
//!
//! Not for: counting requests (`requests`), the virtual file itself (`fuse::adapter`), or
//! summarising the log (`cli::profile`).

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Lines a reader that does not keep up may fall behind by before older ones are dropped.
const BACKLOG: usize = 100_000;

/// One reader of `.accesslog`: the lines logged since it opened, not read yet.
pub struct Reader {
    lines: Mutex<(VecDeque<String>, u64)>,
    ready: Condvar,
}

impl Reader {
    /// Up to about `max` bytes of whole lines; waits up to `wait` for the first one, then
    /// returns `#\n` (a line readers skip) so that a `cat` of the log stays open without
    /// holding a request forever.
    pub fn read(&self, max: usize, wait: Duration) -> Vec<u8> {
        let deadline = Instant::now() + wait;
        let mut g = self.lines.lock();
        while g.0.is_empty() && g.1 == 0 {
            if self.ready.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        let mut out = Vec::new();
        if g.1 > 0 {
            out.extend_from_slice(format!("# {} lines dropped: read faster\n", g.1).as_bytes());
            g.1 = 0;
        }
        while let Some(l) = g.0.front() {
            if !out.is_empty() && out.len() + l.len() > max {
                break;
            }
            out.extend_from_slice(l.as_bytes());
            g.0.pop_front();
        }
        if out.is_empty() {
            out.extend_from_slice(b"#\n");
        }
        out
    }
}

/// Where an export's access log goes.
#[derive(Default)]
pub struct AccessLog {
    readers: Mutex<Vec<Weak<Reader>>>,
    /// Readers open and the file: requests build lines only while it is above zero.
    sinks: AtomicUsize,
    /// The file (`--access-log`), and its path for [`AccessLog::reopen`].
    file: Option<(PathBuf, Mutex<File>)>,
}

fn append(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl AccessLog {
    /// A log also written to `path` (appended), if given.
    pub fn new(path: Option<&Path>) -> std::io::Result<AccessLog> {
        let file = match path {
            Some(p) => Some((p.to_path_buf(), Mutex::new(append(p)?))),
            None => None,
        };
        Ok(AccessLog {
            sinks: AtomicUsize::new(usize::from(file.is_some())),
            file,
            readers: Mutex::new(Vec::new()),
        })
    }

    /// Opens the file again (after logrotate moved the old one away: SIGHUP); lines go on
    /// to the old one if that fails, which is warned about.
    pub fn reopen(&self) {
        let Some((path, f)) = &self.file else {
            return;
        };
        match append(path) {
            Ok(new) => {
                *f.lock() = new;
                tracing::info!("SIGHUP: access log {} reopened", path.display());
            }
            Err(e) => tracing::warn!(
                "SIGHUP: cannot reopen the access log {}: {e}",
                path.display()
            ),
        }
    }

    /// Whether anything takes lines now.
    pub fn on(&self) -> bool {
        self.sinks.load(Ordering::Relaxed) > 0
    }

    /// A new reader, taking the lines logged from now on.
    pub fn open_reader(&self) -> Arc<Reader> {
        let r = Arc::new(Reader {
            lines: Mutex::new((VecDeque::new(), 0)),
            ready: Condvar::new(),
        });
        self.readers.lock().push(Arc::downgrade(&r));
        self.sinks.fetch_add(1, Ordering::Relaxed);
        r
    }

    /// A reader closed (its last reference is dropped by the caller).
    pub fn close_reader(&self, r: Arc<Reader>) {
        drop(r);
        let mut rs = self.readers.lock();
        let before = rs.len();
        rs.retain(|w| w.strong_count() > 0);
        self.sinks.fetch_sub(before - rs.len(), Ordering::Relaxed);
    }

    /// Logs an event of the antivirus scanner (`vfs::scan`): `STAMP [scan] LINE`.
    pub fn scan_event(&self, line: &str) {
        self.record(format!("{} [scan] {line}", stamp()));
    }

    /// Logs one line (without its newline).
    pub fn record(&self, line: String) {
        let line = line + "\n";
        if let Some((_, f)) = &self.file {
            // One write(2) of the whole line: appended whole, whoever else writes.
            let _ = f.lock().write_all(line.as_bytes());
        }
        for r in self.readers.lock().iter().filter_map(Weak::upgrade) {
            let mut g = r.lines.lock();
            if g.0.len() >= BACKLOG {
                g.0.pop_front();
                g.1 += 1;
            }
            g.0.push_back(line.clone());
            r.ready.notify_one();
        }
    }
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("sinks", &self.sinks.load(Ordering::Relaxed))
            .field("file", &self.file.is_some())
            .finish()
    }
}

/// The process name of `pid` (its `comm`), `?` if it is gone.
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| field(&s.trim().replace(']', "_")))
        .unwrap_or_else(|_| "?".into())
}

/// `s` as a field of the caller's brackets: what would end it (a space or `,`) or the line
/// (a control character) becomes `_`.
pub fn field(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            ' ' | ',' => '_',
            c if c.is_control() => '_',
            c => c,
        })
        .collect()
}

/// A name or path of a request's arguments as the log shows it: control characters (a
/// newline would end the line) escaped as `\xNN`, bytes that are not UTF-8 replaced.
pub fn name(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for c in String::from_utf8_lossy(b).chars() {
        if c.is_control() {
            out += &format!("\\x{:02x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// The words of `errno` as the log gives a failure: `No such file or directory`.
pub fn errno_words(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno)
        .to_string()
        .split(" (os error")
        .next()
        .unwrap_or("error")
        .to_string()
}

/// The local time as the log writes it (`YYYY.MM.DD HH:MM:SS.micros`).
pub fn stamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as libc::time_t;
    // SAFETY: an all-zero `tm` is a valid value of the plain C struct.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r reads `secs` and writes only into `tm`, both outliving the call.
    unsafe { libc::localtime_r(&secs, &mut tm) };
    format!(
        "{:04}.{:02}.{:02} {:02}:{:02}:{:02}.{:06}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_micros()
    )
}
