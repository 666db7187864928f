//! `unkai quota set|get|list|delete|check`: directory quotas, as JuiceFS's `juicefs quota`.
//!
//! Not for: how usage is kept (`meta::quota`) or found by path (`admin::quota`).

use anyhow::bail;

use crate::admin::quota;
use crate::meta::{Meta, Quota};
use crate::volume;

/// Limit what a directory's tree may hold (bytes and inodes).
///
/// A write, create, link or rename that would pass a limit fails with EDQUOT ("Disk quota
/// exceeded") and changes nothing. What counts: every entry below the directory counts one
/// inode, and a file also its length (rounded up to 4 KiB); a file with several names counts
/// once per name. Deleted entries in the trash no longer count. Mounted clients keep the
/// usage exact in every change; the first quota of a volume waits until each of them has
/// heard of quotas (two heartbeats, about 40 s by default).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  unkai quota set --path /projects/a --capacity 100G --inodes 1000000 sqlite:///var/lib/unkai/vol.db\n  unkai quota get --path /projects/a sqlite:///var/lib/unkai/vol.db\n  unkai quota list postgres://unkai@db.example/unkai\n  unkai quota delete --path /projects/a sqlite:///var/lib/unkai/vol.db\n  unkai quota check --repair sqlite:///var/lib/unkai/vol.db"
)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Set (or change) a directory's limits; a new quota counts the tree first.
    Set {
        /// The volume's META-URL (default: the embedded default volume).
        meta_url: Option<String>,
        /// The directory, from the volume's root (e.g. /projects/a).
        #[arg(long)]
        path: String,
        /// Most bytes the tree may hold, e.g. 100G (0: no limit).
        #[arg(long)]
        capacity: Option<String>,
        /// Most inodes (files, directories, links...) the tree may hold (0: no limit).
        #[arg(long)]
        inodes: Option<u64>,
    },
    /// Show a directory's quota and what its tree holds.
    Get {
        meta_url: Option<String>,
        #[arg(long)]
        path: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show every quota of the volume.
    #[command(alias = "ls")]
    List {
        meta_url: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a directory's quota.
    #[command(alias = "rm")]
    Delete {
        meta_url: Option<String>,
        #[arg(long)]
        path: String,
    },
    /// Count the trees of the quotas (or one) and compare with what the quotas say.
    Check {
        meta_url: Option<String>,
        /// Only this directory's quota.
        #[arg(long)]
        path: Option<String>,
        /// Store the counts as the quotas' usage.
        #[arg(long)]
        repair: bool,
    },
}

fn open(url: Option<String>) -> anyhow::Result<std::sync::Arc<dyn Meta>> {
    volume::open_meta(&url.unwrap_or_else(volume::default_meta_url))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match a.cmd {
        Cmd::Set {
            meta_url,
            path,
            capacity,
            inodes,
        } => {
            if capacity.is_none() && inodes.is_none() {
                bail!("quota set needs a limit: --capacity SIZE (e.g. 100G) and/or --inodes N");
            }
            let bytes = capacity
                .map(|c| volume::parse_size_flag("--capacity", &c, "GiB"))
                .transpose()?;
            let meta = open(meta_url)?;
            let q = quota::set(meta.as_ref(), &path, bytes, inodes, &|m| {
                eprintln!("unkai: {m}")
            })?;
            print_table(&[(quota::path_of(meta.as_ref(), q.ino), q)]);
            if over(&q) {
                eprintln!(
                    "unkai: warning: {path} already holds more than its limit: writes and \
                     creates under it fail until files are deleted"
                );
            }
        }
        Cmd::Get {
            meta_url,
            path,
            json,
        } => {
            let meta = open(meta_url)?;
            let dir = quota::resolve(meta.as_ref(), &path)?;
            let Some(q) = meta.quotas()?.into_iter().find(|q| q.ino == dir) else {
                bail!(
                    "{path}: no quota is set there (set one with `unkai quota set --path {path} --capacity SIZE`)"
                );
            };
            show(&[(quota::path_of(meta.as_ref(), dir), q)], json)?;
        }
        Cmd::List { meta_url, json } => {
            let meta = open(meta_url)?;
            let rows: Vec<_> = meta
                .quotas()?
                .into_iter()
                .map(|q| (quota::path_of(meta.as_ref(), q.ino), q))
                .collect();
            show(&rows, json)?;
        }
        Cmd::Delete { meta_url, path } => {
            let meta = open(meta_url)?;
            let dir = quota::resolve(meta.as_ref(), &path)?;
            if !meta.delete_quota(dir)? {
                bail!("{path}: no quota is set there");
            }
            eprintln!("unkai: quota of {path} deleted");
        }
        Cmd::Check {
            meta_url,
            path,
            repair,
        } => {
            let meta = open(meta_url)?;
            let checked = quota::check(meta.as_ref(), path.as_deref(), repair)?;
            let mut wrong = 0;
            for c in &checked {
                if c.agrees() {
                    println!(
                        "{}: ok ({}, {} inodes)",
                        c.path,
                        super::human_bytes(c.counted.0.max(0) as u64),
                        c.counted.1
                    );
                } else {
                    wrong += 1;
                    println!(
                        "{}: quota says {} bytes, {} inodes; the tree holds {} bytes, {} inodes{}",
                        c.path,
                        c.quota.used_bytes,
                        c.quota.used_inodes,
                        c.counted.0,
                        c.counted.1,
                        if repair { " (repaired)" } else { "" }
                    );
                }
            }
            if wrong > 0 && !repair {
                bail!(
                    "{wrong} quota(s) differ from their trees: run `unkai quota check --repair` \
                     to store the counts"
                );
            }
        }
    }
    Ok(())
}

fn over(q: &Quota) -> bool {
    (q.max_bytes > 0 && q.used_bytes > q.max_bytes as i64)
        || (q.max_inodes > 0 && q.used_inodes > q.max_inodes as i64)
}

fn show(rows: &[(String, Quota)], json: bool) -> anyhow::Result<()> {
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(p, q)| {
                serde_json::json!({
                    "path": p, "inode": q.ino,
                    "max_bytes": q.max_bytes, "max_inodes": q.max_inodes,
                    "used_bytes": q.used_bytes, "used_inodes": q.used_inodes,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_table(rows);
    }
    Ok(())
}

fn print_table(rows: &[(String, Quota)]) {
    let pct = |used: i64, max: u64| {
        if max == 0 {
            String::new()
        } else {
            format!("{}%", (used.max(0) as u128 * 100 / max as u128))
        }
    };
    let lim = |max: u64, f: &dyn Fn(u64) -> String| {
        if max == 0 {
            "unlimited".to_string()
        } else {
            f(max)
        }
    };
    let table: Vec<[String; 7]> = rows
        .iter()
        .map(|(p, q)| {
            [
                p.clone(),
                lim(q.max_bytes, &super::human_bytes),
                super::human_bytes(q.used_bytes.max(0) as u64),
                pct(q.used_bytes, q.max_bytes),
                lim(q.max_inodes, &|n| n.to_string()),
                q.used_inodes.to_string(),
                pct(q.used_inodes, q.max_inodes),
            ]
        })
        .collect();
    let head = ["PATH", "SIZE", "USED", "USE%", "INODES", "IUSED", "IUSE%"];
    let mut w = head.map(str::len);
    for r in &table {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: [&str; 7]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i == 0 {
                s.push_str(&format!("{c:<width$}", width = w[0]));
            } else {
                s.push_str(&format!("  {c:>width$}", width = w[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(head);
    for r in &table {
        line(std::array::from_fn(|i| r[i].as_str()));
    }
}
