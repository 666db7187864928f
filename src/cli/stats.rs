//! `unkai stats MOUNTPOINT`: what a mount is doing, a line a second, as `juicefs stats` shows
//! it: FUSE requests and throughput, metadata transactions, the block cache's hit ratio,
//! object requests and their latency, what is staged, memory.
//!
//! The figures come from the mount's stats socket (`volume::metrics`), found from the
//! mountpoint as `unkai umount` finds the server: no address to give.
//!
//! Not for: counting or serving figures (each layer counts, `volume::metrics` serves).

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::fuse::mounts;

/// Show what a mount is doing, refreshed every second (rates per second, as `juicefs stats`).
#[derive(clap::Args)]
#[command(
    after_help = "Columns: fuse ops/s, their mean latency (ms), bytes read and written per second \
through the mount; meta transactions/s, their mean latency (ms), retries/s, round trips to the \
database/s and per FUSE request (PostgreSQL); the block cache's \
hit ratio; object GET and PUT requests/s, their mean latency (ms), errors/s, bytes got and put \
per second; bytes staged (write-back) and blocks being uploaded; memory in use.\n\n\
Examples:\n  unkai stats /mnt/unkai                       # until Ctrl-C\n  unkai stats --interval 5 /mnt/unkai\n  unkai stats --count 10 /mnt/unkai > stats.txt  # 10 lines, then exit"
)]
pub struct Args {
    /// Where the volume is mounted.
    mountpoint: PathBuf,
    /// Seconds between two lines.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print this many lines, then exit [default: until interrupted].
    #[arg(long, short = 'c')]
    count: Option<u64>,
}

/// The figures of a mount at one moment (the JSON of its stats socket).
struct Sample {
    at: Instant,
    json: Value,
}

impl Sample {
    /// The sum of `field` ("value", "count" or "sum") over the samples of `name` whose labels
    /// include `label` (any, with None).
    fn sum(&self, name: &str, field: &str, label: Option<(&str, &str)>) -> f64 {
        let Some(samples) = self.json.get(name).and_then(Value::as_array) else {
            return 0.0;
        };
        samples
            .iter()
            .filter(|s| label.is_none_or(|(k, v)| s["labels"][k] == v))
            .filter_map(|s| s[field].as_f64())
            .sum()
    }
}

/// Where the mount's server serves its figures: the socket beside its pid file (the
/// caller's runtime directory, else root's, for a mount made by root).
fn socket_of(mp: &Path) -> anyhow::Result<PathBuf> {
    let own = super::pid_file(mp);
    let root = Path::new("/run/unkai/mounts").join(own.file_name().unwrap_or_default());
    for pid_file in [own, root] {
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if let Some(pid) = pid {
            let sock = crate::volume::metrics::socket_path(&pid_file, pid);
            if sock.exists() {
                return Ok(sock);
            }
        }
    }
    bail!(
        "the server of {} serves no figures (it runs an older unkai, or as another user: run \
         `unkai stats` as that user or root)",
        mp.display()
    )
}

fn read(sock: &Path) -> anyhow::Result<Sample> {
    let mut conn = std::os::unix::net::UnixStream::connect(sock)
        .with_context(|| format!("cannot reach the mount's stats socket {}", sock.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut text = String::new();
    conn.read_to_string(&mut text)
        .with_context(|| format!("reading {}", sock.display()))?;
    let json = serde_json::from_str(&text)
        .with_context(|| format!("the figures read from {} are not JSON", sock.display()))?;
    Ok(Sample {
        at: Instant::now(),
        json,
    })
}

/// A rate or a level, for a column of about 6 characters: 950, 12.5K, 3.1M, 2.0G.
fn short(v: f64) -> String {
    let units = ["", "K", "M", "G", "T"];
    let mut v = v.max(0.0);
    let mut u = 0;
    while v >= 1000.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 if v.fract() == 0.0 || v >= 100.0 => format!("{v:.0}"),
        0 => format!("{v:.1}"),
        _ => format!("{v:.1}{}", units[u]),
    }
}

/// The columns: (group, name, what it shows from two samples and the seconds between).
type Column = (
    &'static str,
    &'static str,
    fn(&Sample, &Sample, f64) -> String,
);

/// Per second: the increase of `field` of `name` (with `label`) between two samples.
fn rate(
    a: &Sample,
    b: &Sample,
    dt: f64,
    name: &str,
    field: &str,
    label: Option<(&str, &str)>,
) -> f64 {
    (b.sum(name, field, label) - a.sum(name, field, label)).max(0.0) / dt
}

/// The mean of a histogram's observations between two samples, in milliseconds ("-" when
/// there were none).
fn mean_ms(a: &Sample, b: &Sample, name: &str, label: Option<(&str, &str)>) -> String {
    let n = b.sum(name, "count", label) - a.sum(name, "count", label);
    if n <= 0.0 {
        return "-".into();
    }
    let s = b.sum(name, "sum", label) - a.sum(name, "sum", label);
    format!("{:.2}", s / n * 1000.0)
}

const FUSE: &str = "unkai_op_duration_seconds";
const META: &str = "unkai_meta_transaction_duration_seconds";
const OBJ: &str = "unkai_object_request_duration_seconds";

const COLUMNS: &[Column] = &[
    ("fuse", "ops", |a, b, dt| {
        short(rate(a, b, dt, FUSE, "count", None))
    }),
    ("fuse", "lat", |a, b, _| mean_ms(a, b, FUSE, None)),
    ("fuse", "read", |a, b, dt| {
        short(rate(a, b, dt, "unkai_read_bytes_total", "value", None))
    }),
    ("fuse", "write", |a, b, dt| {
        short(rate(a, b, dt, "unkai_written_bytes_total", "value", None))
    }),
    ("meta", "txn", |a, b, dt| {
        short(rate(a, b, dt, META, "count", None))
    }),
    ("meta", "lat", |a, b, _| mean_ms(a, b, META, None)),
    ("meta", "retry", |a, b, dt| {
        short(rate(a, b, dt, "unkai_meta_retries_total", "value", None))
    }),
    ("meta", "rtrip", |a, b, dt| {
        short(rate(
            a,
            b,
            dt,
            "unkai_meta_round_trips_total",
            "value",
            Some(("for", "operations")),
        ))
    }),
    ("meta", "rt/op", |a, b, _| {
        // Round trips per FUSE request answered ("-" when none was).
        let d = |name, field| b.sum(name, field, None) - a.sum(name, field, None);
        let ops = d(FUSE, "count");
        match ops > 0.0 {
            true => format!("{:.2}", d("unkai_op_round_trips_total", "value") / ops),
            false => "-".into(),
        }
    }),
    ("cache", "hit%", |a, b, _| {
        let d = |name, level| {
            b.sum(name, "value", Some(("level", level)))
                - a.sum(name, "value", Some(("level", level)))
        };
        // Every lookup asks memory first; a memory miss may hit on disk.
        let looked =
            d("unkai_cache_hits_total", "memory") + d("unkai_cache_misses_total", "memory");
        let hits = d("unkai_cache_hits_total", "memory") + d("unkai_cache_hits_total", "disk");
        match looked > 0.0 {
            true => format!("{:.1}", (hits / looked * 100.0).min(100.0)),
            false => "-".into(),
        }
    }),
    ("object", "get", |a, b, dt| {
        let g = rate(a, b, dt, OBJ, "count", Some(("op", "get")));
        short(g + rate(a, b, dt, OBJ, "count", Some(("op", "get_range"))))
    }),
    ("object", "put", |a, b, dt| {
        short(rate(a, b, dt, OBJ, "count", Some(("op", "put"))))
    }),
    ("object", "lat", |a, b, _| mean_ms(a, b, OBJ, None)),
    ("object", "err", |a, b, dt| {
        short(rate(
            a,
            b,
            dt,
            "unkai_object_request_errors_total",
            "value",
            None,
        ))
    }),
    ("object", "in", |a, b, dt| {
        short(rate(
            a,
            b,
            dt,
            "unkai_object_get_bytes_total",
            "value",
            None,
        ))
    }),
    ("object", "out", |a, b, dt| {
        short(rate(
            a,
            b,
            dt,
            "unkai_object_put_bytes_total",
            "value",
            None,
        ))
    }),
    ("peer", "hit", |a, b, dt| {
        short(rate(
            a,
            b,
            dt,
            "unkai_peer_requests_total",
            "value",
            Some(("result", "hit")),
        ))
    }),
    ("peer", "in", |a, b, dt| {
        short(rate(
            a,
            b,
            dt,
            "unkai_peer_received_bytes_total",
            "value",
            None,
        ))
    }),
    ("peer", "lat", |a, b, _| {
        mean_ms(a, b, "unkai_peer_request_duration_seconds", None)
    }),
    ("peer", "err", |a, b, dt| {
        let e = rate(
            a,
            b,
            dt,
            "unkai_peer_requests_total",
            "value",
            Some(("result", "error")),
        );
        short(
            e + rate(
                a,
                b,
                dt,
                "unkai_peer_requests_total",
                "value",
                Some(("result", "wrong")),
            ),
        )
    }),
    ("peer", "out", |a, b, dt| {
        short(rate(
            a,
            b,
            dt,
            "unkai_peer_served_bytes_total",
            "value",
            None,
        ))
    }),
    ("write-back", "staged", |_, b, _| {
        short(b.sum("unkai_staged_bytes", "value", None))
    }),
    ("write-back", "upload", |_, b, _| {
        short(b.sum("unkai_uploading_blocks", "value", None))
    }),
    ("mem", "used", |_, b, _| {
        short(b.sum("unkai_memory_bytes", "value", None))
    }),
];

/// Width of a column.
const W: usize = 7;

/// The two header lines: the groups (`---fuse---`), then the columns' names.
fn header() -> (String, String) {
    let mut groups = format!("{:8}", "");
    let mut names = format!("{:>8}", "time");
    let mut i = 0;
    while i < COLUMNS.len() {
        let g = COLUMNS[i].0;
        let n = COLUMNS[i..].iter().take_while(|c| c.0 == g).count();
        let width = n * W;
        let pad = width.saturating_sub(g.len() + 1);
        let left = pad / 2;
        groups.push(' ');
        groups.push_str(&"-".repeat(left));
        groups.push_str(g);
        groups.push_str(&"-".repeat(pad - left));
        for c in &COLUMNS[i..i + n] {
            names.push_str(&format!("{:>W$}", c.1));
        }
        i += n;
    }
    (groups, names)
}

fn line(a: &Sample, b: &Sample) -> String {
    let dt = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
    let now = crate::meta::now_nanos() / 1_000_000_000;
    let (h, m, s) = ((now / 3600) % 24, (now / 60) % 60, now % 60);
    let mut out = format!("{h:02}:{m:02}:{s:02}");
    for c in COLUMNS {
        out.push_str(&format!("{:>W$}", (c.2)(a, b, dt)));
    }
    out
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if !(a.interval.is_finite() && a.interval >= 0.1) {
        bail!(
            "invalid --interval {}: give seconds, at least 0.1, e.g. --interval 1",
            a.interval
        );
    }
    let mp = std::fs::canonicalize(&a.mountpoint).unwrap_or_else(|_| a.mountpoint.clone());
    match mounts::find(&mp) {
        Some(e) if mounts::is_unkai(&e) => {}
        Some(e) => bail!(
            "{} is not an unkai mount (it is {} {})",
            mp.display(),
            e.fstype,
            e.source
        ),
        None => bail!(
            "{} is not mounted: give the mountpoint of an unkai mount, e.g. `unkai stats \
             /mnt/unkai`",
            mp.display()
        ),
    }
    let sock = socket_of(&mp)?;
    let tty = std::io::stdout().is_terminal();
    let (groups, names) = header();
    let mut prev = read(&sock)?;
    let interval = Duration::from_secs_f64(a.interval);
    let mut printed = 0u64;
    while a.count.is_none_or(|n| printed < n) {
        // A terminal gets the header again every screenful; a pipe or file gets it once.
        if printed == 0 || (tty && printed % 20 == 0) {
            match tty {
                true => println!("\x1b[1m{groups}\n{names}\x1b[0m"),
                false => println!("{groups}\n{names}"),
            }
        }
        std::thread::sleep(interval.saturating_sub(prev.at.elapsed()));
        let next = read(&sock).with_context(|| format!("{} was unmounted", mp.display()))?;
        println!("{}", line(&prev, &next));
        prev = next;
        printed += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_and_units() {
        assert_eq!(short(0.0), "0");
        assert_eq!(short(12.5), "12.5");
        assert_eq!(short(950.0), "950");
        assert_eq!(short(5.0 * 1024.0 * 1024.0), "5.0M");
        let (groups, names) = header();
        assert_eq!(groups.len(), names.len(), "{groups}\n{names}");
        assert!(
            names.contains("  write") && groups.contains("-fuse-"),
            "{names}"
        );
        let at = Instant::now();
        let a = Sample {
            at,
            json: serde_json::json!({
                "unkai_written_bytes_total": [{"labels": {}, "value": 0.0}],
                "unkai_cache_hits_total": [{"labels": {"level": "memory"}, "value": 0.0}],
                "unkai_cache_misses_total": [{"labels": {"level": "memory"}, "value": 0.0}],
                FUSE: [{"labels": {"op": "write"}, "count": 0, "sum": 0.0}],
            }),
        };
        let b = Sample {
            at: at + Duration::from_secs(2),
            json: serde_json::json!({
                "unkai_written_bytes_total": [{"labels": {}, "value": 4194304.0}],
                "unkai_cache_hits_total": [{"labels": {"level": "memory"}, "value": 3.0},
                                           {"labels": {"level": "disk"}, "value": 1.0}],
                "unkai_cache_misses_total": [{"labels": {"level": "memory"}, "value": 1.0}],
                FUSE: [{"labels": {"op": "write"}, "count": 4, "sum": 0.004}],
            }),
        };
        let l = line(&a, &b);
        let cells: Vec<&str> = l.split_whitespace().collect();
        let at = |name: &str| {
            let i = names.split_whitespace().position(|n| n == name).unwrap();
            // Names repeat across groups ("lat"): the first is the FUSE one.
            cells[i]
        };
        assert_eq!(at("ops"), "2", "{l}");
        assert_eq!(at("lat"), "1.00", "{l}");
        assert_eq!(at("write"), "2.0M", "{l}");
        assert_eq!(at("hit%"), "100.0", "{l}");
        assert_eq!(at("txn"), "0", "{l}");
    }
}
