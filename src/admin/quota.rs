//! `unkai quota`: directory quotas by path. Finds the directory a path names, turns the
//! keeping of quotas on for every mounted client before the first quota is counted, and
//! checks (and repairs) what quotas say their trees hold.
//!
//! Not for: keeping the usage as files change (`meta::quota`, in each transaction), or
//! printing (`cli::quota`).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::meta::session::{heartbeat_interval, session_dead};
use crate::meta::{Ctx, Ino, Meta, Quota, ROOT_INO, now_nanos};

/// The inode of the directory `path` names, from the volume's root (`/a/b` or `a/b`).
pub fn resolve(meta: &dyn Meta, path: &str) -> anyhow::Result<Ino> {
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        let a = meta
            .lookup(&Ctx::ROOT, ino, part.as_bytes())
            .with_context(|| format!("{path}: no such directory in the volume"))?;
        ino = a.ino;
    }
    let a = meta.getattr(ino)?;
    if a.kind != crate::meta::Kind::Dir {
        bail!("{path} is not a directory: quotas are set on directories");
    }
    Ok(ino)
}

/// The path of a quota's directory, for reports (`?INO` if it has none now).
pub fn path_of(meta: &dyn Meta, dir: Ino) -> String {
    match meta.dir_path(dir) {
        Ok(p) => String::from_utf8_lossy(&p).into_owned(),
        Err(_) => format!("?{dir}"),
    }
}

/// Sets the limits of the directory `path` (None keeps a limit as it is; 0 removes it).
/// The first quota of a volume waits until every mounted client keeps quotas, so that no
/// change made meanwhile goes uncounted (two heartbeats of each: `say` tells the user).
pub fn set(
    meta: &dyn Meta,
    path: &str,
    max_bytes: Option<u64>,
    max_inodes: Option<u64>,
    say: &dyn Fn(&str),
) -> anyhow::Result<Quota> {
    let dir = resolve(meta, path)?;
    if dir == ROOT_INO {
        bail!("the root's limits are the volume's: use `unkai config --capacity SIZE --inodes N`");
    }
    if meta.start_quotas()? {
        wait_for_clients(meta, say)?;
    }
    Ok(meta.set_quota(dir, max_bytes, max_inodes)?)
}

/// Waits until every live client has heartbeaten twice since now: the second beat's
/// reading of the settings came after the first beat, so it saw quotas turned on.
fn wait_for_clients(meta: &dyn Meta, say: &dyn Fn(&str)) -> anyhow::Result<()> {
    let start = now_nanos();
    let beat = heartbeat_interval();
    let deadline = Instant::now() + beat * 4 + Duration::from_secs(5);
    let mut first: std::collections::HashMap<u64, i64> = Default::default();
    let mut told = false;
    loop {
        let now = now_nanos();
        let live: Vec<_> = meta
            .sessions()?
            .into_iter()
            .filter(|s| !session_dead(s, s.heartbeat, now))
            .collect();
        let mut waiting = 0;
        for s in &live {
            let seen = first.get(&s.id).copied();
            match seen {
                None if s.heartbeat > start => {
                    first.insert(s.id, s.heartbeat);
                    waiting += 1;
                }
                Some(h) if s.heartbeat > h => {}
                _ => waiting += 1,
            }
        }
        if waiting == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            say(&format!(
                "warning: {waiting} mounted client(s) did not answer in time; what they change \
                 before their next heartbeat may be missed: run `unkai quota check --repair` \
                 later if so"
            ));
            return Ok(());
        }
        if !told {
            say(&format!(
                "first quota of the volume: waiting for {} mounted client(s) to start keeping \
                 quotas (about {} s)",
                live.len(),
                (beat * 2).as_secs().max(1)
            ));
            told = true;
        }
        std::thread::sleep((beat / 4).clamp(Duration::from_millis(20), Duration::from_secs(1)));
    }
}

/// A quota checked against its tree: as stored, and what the tree holds.
pub struct Checked {
    pub path: String,
    pub quota: Quota,
    pub counted: (i64, i64),
}

impl Checked {
    pub fn agrees(&self) -> bool {
        (self.quota.used_bytes, self.quota.used_inodes) == self.counted
    }
}

/// Counts the trees of every quota (or the one of `path`); with `repair`, the counts become
/// their usage.
pub fn check(meta: &dyn Meta, path: Option<&str>, repair: bool) -> anyhow::Result<Vec<Checked>> {
    let dirs: Vec<Ino> = match path {
        Some(p) => vec![resolve(meta, p)?],
        None => meta.quotas()?.iter().map(|q| q.ino).collect(),
    };
    let mut out = Vec::new();
    for dir in dirs {
        let (q, counted) = meta.recount_quota(dir, repair)?;
        let Some(quota) = q else {
            bail!("{}: no quota is set there", path.unwrap_or("?"));
        };
        out.push(Checked {
            path: path_of(meta, dir),
            quota,
            counted,
        });
    }
    Ok(out)
}
