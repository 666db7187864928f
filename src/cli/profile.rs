//! `unkai profile PATH`: a summary of an access log (a mount's live `.accesslog`, or a file
//! written with `mount --access-log`): the operations by count and time, the processes
//! behind them, the slowest requests, as `juicefs profile`.
//!
//! Not for: writing the log (`vfs::export::log`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Summarise what a mount is doing, or did, from its access log.
///
/// Given a mountpoint, reads its live `.accesslog` (root only) for `--interval` seconds and
/// prints a summary, `--count` times (until Ctrl-C without it). Given a file (from
/// `mount --access-log FILE`), summarises all of it once.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai profile /mnt/unkai                          # live, a summary every 2 s\n  unkai profile --interval 10 --count 1 /mnt/unkai  # 10 s of requests, then exit\n  unkai profile /var/log/unkai/access.log           # a whole log file"
)]
pub struct Args {
    /// A mountpoint of unkai (its live log), or an access log file.
    path: PathBuf,
    /// Seconds of requests each live summary covers.
    #[arg(long, default_value_t = 2.0)]
    interval: f64,
    /// Live summaries to print before exiting (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// Rows of each table.
    #[arg(long, default_value_t = 10)]
    top: usize,
}

/// One request of the log.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// Its protocol (`fuse` in a log of before protocols were named).
    pub proto: String,
    pub uid: u32,
    /// The process (FUSE), or 0 for a network client.
    pub pid: u32,
    /// The process's name (FUSE), or the network client: its protocol and address
    /// (`webdav 127.0.0.1`).
    pub comm: String,
    pub op: String,
    pub args: String,
    pub ok: bool,
    pub secs: f64,
}

/// Parses a line of the access log; None for comments and lines of another shape (the
/// scanner's events). Lines from before the protocol was named (`[uid:0,gid:0,pid:1,comm:x]`)
/// are FUSE's.
pub fn parse(l: &str) -> Option<Line> {
    let l = l.trim_end();
    if l.starts_with('#') {
        return None;
    }
    let open = l.find(" [")?;
    let close = l[open..].find("] ")? + open;
    let who = &l[open + 2..close];
    let rest = &l[close + 2..];
    let mut uid = 0;
    let mut pid = 0;
    let mut comm = String::new();
    let mut proto = "fuse".to_string();
    let mut client = None;
    for kv in who.split(',') {
        let (k, v) = kv.split_once(':')?;
        match k {
            "proto" => proto = v.to_string(),
            "uid" => uid = v.parse().ok()?,
            "pid" => pid = v.parse().ok()?,
            "comm" => comm = v.to_string(),
            "client" => client = Some(v),
            _ => {}
        }
    }
    if let Some(c) = client {
        // Its address without the port: a client's connections are one client.
        let host = match c.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => c,
        };
        comm = format!(
            "{proto} {}",
            host.trim_start_matches('[').trim_end_matches(']')
        );
    }
    let (op, rest) = rest.split_once(' ')?;
    let dur_at = rest.rfind(" <")?;
    let secs: f64 = rest[dur_at + 2..].strip_suffix('>')?.parse().ok()?;
    let (args, result) = rest[..dur_at].rsplit_once("): ")?;
    Some(Line {
        proto,
        uid,
        pid,
        comm,
        op: op.to_string(),
        args: format!("{args})"),
        ok: result == "OK",
        secs,
    })
}

#[derive(Default)]
struct Tally {
    count: u64,
    errors: u64,
    secs: f64,
}

/// What a stretch of the log holds.
#[derive(Default)]
pub struct Profile {
    ops: HashMap<String, Tally>,
    procs: HashMap<(u32, String), Tally>,
    slowest: Vec<Line>,
    total: u64,
}

impl Profile {
    pub fn add(&mut self, l: Line, top: usize) {
        self.total += 1;
        for t in [
            self.ops.entry(l.op.clone()).or_default(),
            self.procs.entry((l.pid, l.comm.clone())).or_default(),
        ] {
            t.count += 1;
            t.secs += l.secs;
            t.errors += u64::from(!l.ok);
        }
        if self.slowest.len() < top || self.slowest.last().is_some_and(|s| s.secs < l.secs) {
            self.slowest.push(l);
            self.slowest.sort_by(|a, b| {
                b.secs
                    .partial_cmp(&a.secs)
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            self.slowest.truncate(top);
        }
    }

    fn print(&self, over: Option<Duration>, top: usize) {
        let rate = |n: u64| match over {
            Some(d) if d.as_secs_f64() > 0.0 => format!("{:.0}/s", n as f64 / d.as_secs_f64()),
            _ => String::new(),
        };
        println!("{} requests {}", self.total, rate(self.total));
        let table = |title: &str, rows: Vec<(String, &Tally)>| {
            println!(
                "{title:<28} {:>9} {:>8} {:>7} {:>11} {:>10}",
                "COUNT", "RATE", "ERRORS", "TOTAL(s)", "AVG(us)"
            );
            for (name, t) in rows.into_iter().take(top) {
                println!(
                    "{name:<28} {:>9} {:>8} {:>7} {:>11.3} {:>10.1}",
                    t.count,
                    rate(t.count),
                    t.errors,
                    t.secs,
                    t.secs * 1e6 / t.count.max(1) as f64
                );
            }
        };
        let mut ops: Vec<_> = self.ops.iter().map(|(k, v)| (k.clone(), v)).collect();
        ops.sort_by(|a, b| {
            b.1.secs
                .partial_cmp(&a.1.secs)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        table("OPERATION", ops);
        let mut procs: Vec<_> = self
            .procs
            .iter()
            .map(|((pid, comm), v)| (format!("{comm} ({pid})"), v))
            .collect();
        procs.sort_by(|a, b| {
            b.1.secs
                .partial_cmp(&a.1.secs)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        table("PROCESS OR CLIENT", procs);
        println!("SLOWEST");
        for l in &self.slowest {
            println!(
                "  {:>10.6}s {} {} by {} ({}){}",
                l.secs,
                l.op,
                l.args,
                l.comm,
                l.pid,
                if l.ok { "" } else { " failed" }
            );
        }
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.path.is_file() {
        let f = std::fs::File::open(&a.path)
            .with_context(|| format!("cannot read {}", a.path.display()))?;
        let mut p = Profile::default();
        for l in BufReader::new(f).lines() {
            if let Some(l) = parse(&l?) {
                p.add(l, a.top);
            }
        }
        p.print(None, a.top);
        return Ok(());
    }
    let live = a.path.join(".accesslog");
    let f = std::fs::File::open(&live).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) => {
            anyhow::anyhow!("{}: only root reads a mount's access log", live.display())
        }
        _ => anyhow::anyhow!(
            "{} is neither an access log file nor a mounted unkai volume ({e})",
            a.path.display()
        ),
    })?;
    if a.interval.is_nan() || a.interval <= 0.0 {
        bail!("--interval must be above 0 seconds, e.g. --interval 2");
    }
    let every = Duration::from_secs_f64(a.interval);
    let mut r = BufReader::new(f);
    let mut n = 0;
    loop {
        let start = Instant::now();
        let mut p = Profile::default();
        let mut buf = String::new();
        while start.elapsed() < every {
            buf.clear();
            // The mount answers within a second, with `#` when nothing happened.
            if r.read_line(&mut buf)? == 0 {
                bail!("the mount at {} went away", a.path.display());
            }
            if let Some(l) = parse(&buf) {
                p.add(l, a.top);
            }
        }
        p.print(Some(start.elapsed()), a.top);
        n += 1;
        if a.count > 0 && n >= a.count {
            return Ok(());
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_line() {
        let l = parse(
            "2026.11.26 20:36:44.476982 [uid:0,gid:0,pid:28387,comm:bash] create (2,f,33206,18,33345): OK <0.000061>",
        )
        .unwrap();
        assert_eq!(
            (l.pid, l.comm.as_str(), l.op.as_str()),
            (28387, "bash", "create")
        );
        assert_eq!(l.args, "(2,f,33206,18,33345)");
        assert!(l.ok);
        assert!((l.secs - 0.000061).abs() < 1e-9);
        let e = parse(
            "2026.11.26 20:36:44.477150 [uid:0,gid:0,pid:7,comm:x] getxattr (3,security.capability,0): No data available <0.000011>",
        )
        .unwrap();
        assert!(!e.ok);
        assert_eq!(parse("#"), None);
        let w = parse(
            "2026.11.26 20:36:45.000001 [proto:webdav,uid:1000,gid:1000,client:127.0.0.1:50412,user:alice] PUT (/a/b.txt): 403 Forbidden <0.000200>",
        )
        .unwrap();
        assert_eq!(
            (
                w.proto.as_str(),
                w.uid,
                w.pid,
                w.comm.as_str(),
                w.op.as_str()
            ),
            ("webdav", 1000, 0, "webdav 127.0.0.1", "PUT")
        );
        assert_eq!(w.args, "(/a/b.txt)");
        assert!(!w.ok);
        let f = parse(
            "2026.11.26 20:36:45.000002 [proto:fuse,uid:0,gid:0,pid:9,comm:cp] write (17,0,4096): OK <0.000012>",
        )
        .unwrap();
        assert_eq!(
            (f.proto.as_str(), f.pid, f.comm.as_str()),
            ("fuse", 9, "cp")
        );
        assert_eq!(
            l.proto, "fuse",
            "a line of before protocols were named is FUSE's"
        );
        let v6 = parse(
            "2026.11.26 20:36:45.000003 [proto:s3,uid:0,gid:0,client:[::1]:5000] PutObject (b/k): OK <0.1>",
        )
        .unwrap();
        assert_eq!(v6.comm, "s3 ::1");
        assert_eq!(
            parse("2026.11.26 20:36:45.000004 [scan] /f (inode 3): INFECTED X"),
            None
        );
        assert_eq!(parse("# 3 lines dropped: read faster"), None);
    }
}
