//! Stress: 32 threads of mixed operations on one mount for a bounded time (STRESS_SECS,
//! default 20), then a clean unmount, fsck (consistent, nothing leaked), a remount that finds
//! everything as it was left, and the deletion of everything, after which no block object may
//! remain in the bucket.
//!
//! Each thread works mostly in its own subtree `t<N>/`, where it is the only writer and keeps
//! a model (names, hard links, contents, extended attributes, directories): everything it
//! reads there must match the model exactly, and every outcome (ENOTEMPTY from rmdir...) must
//! be the expected one. Some operations go to shared directories `shared/s<K>/` that all
//! threads race on; there the outcome is not deterministic, but published files (written
//! under a private name, then renamed over a shared one) carry their own seed and length, so
//! whatever a reader opens must be one complete file.
//!
//! The seed is printed at the start and in every failure: `STRESS_SEED=<seed>` replays the
//! same choices (thread scheduling aside).

use crate::common::rng::noise;
use crate::common::{Mount, Volume, errno, tail, xattr};

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const THREADS: usize = 32;
const SHARED_DIRS: usize = 4;
const SHARED_NAMES: usize = 8;
/// Bytes of file data a thread keeps in its subtree at most (new files stop beyond).
const THREAD_BYTES: usize = 8 << 20;

// ---------------------------------------------------------------------------------------------
// Data.

/// A file for the shared directories: seed and length, then that many bytes of noise.
fn published(seed: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + len);
    v.extend_from_slice(&seed.to_le_bytes());
    v.extend_from_slice(&(len as u64).to_le_bytes());
    v.extend_from_slice(&noise(len, seed));
    v
}

/// Whether `d` is one complete published file.
fn check_published(d: &[u8]) -> Result<(), String> {
    if d.len() < 16 {
        return Err(format!("{} bytes: shorter than the header", d.len()));
    }
    let seed = u64::from_le_bytes(d[..8].try_into().unwrap());
    let len = u64::from_le_bytes(d[8..16].try_into().unwrap()) as usize;
    if d.len() != 16 + len {
        return Err(format!(
            "header says {len} bytes of body (seed {seed}), file has {}",
            d.len() - 16
        ));
    }
    let want = noise(len, seed);
    if let Some(i) = (0..len).find(|&i| d[16 + i] != want[i]) {
        return Err(format!(
            "body (seed {seed}, {len} bytes) differs from byte {i} of the body on"
        ));
    }
    Ok(())
}

/// Where two contents first differ, for messages.
fn diff(got: &[u8], want: &[u8]) -> String {
    let n = got.len().min(want.len());
    match (0..n).find(|&i| got[i] != want[i]) {
        Some(i) => {
            let bad = (i..n).filter(|&k| got[k] != want[k]).count();
            let zeros = (i..n).filter(|&k| got[k] != want[k] && got[k] == 0).count();
            format!(
                "got {} bytes, expected {}; first difference at byte {i}, {bad} bytes differ ({zeros} read as zero)",
                got.len(),
                want.len()
            )
        }
        None => format!(
            "got {} bytes, expected {} (the common prefix is identical)",
            got.len(),
            want.len()
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Extended attributes (std has no API for them).

fn setx(p: &Path, k: &str, v: &[u8]) -> io::Result<()> {
    xattr::setxattr(p, k, v, 0)
}

fn getx(p: &Path, k: &str) -> io::Result<Vec<u8>> {
    xattr::getxattr_sized(p, k, 64 << 10).map(|(_, v)| v)
}

/// The `user.` attributes of `p`.
fn listx(p: &Path) -> io::Result<BTreeSet<String>> {
    let (_, buf) = xattr::listxattr_sized(p, 64 << 10)?;
    Ok(xattr::user_names(&buf).collect())
}

fn rmx(p: &Path, k: &str) -> io::Result<()> {
    xattr::removexattr(p, k)
}

/// Ok(Some) on success, Ok(None) for an error the racing threads make expected, Err else.
fn allow<T>(r: io::Result<T>, allowed: &[i32]) -> Result<Option<T>, String> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if allowed.contains(&errno(&e)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// A thread's model of its own subtree.

#[derive(Clone, Default, Debug)]
struct Inode {
    data: Vec<u8>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

#[derive(Clone, Default, Debug)]
struct Tree {
    /// The subtree's directory under the mount root: `t<N>`.
    base: String,
    /// Directories, relative to the base ("" is the base itself).
    dirs: BTreeSet<String>,
    /// Files (relative path) and the inode each name is a link to.
    names: BTreeMap<String, usize>,
    inodes: HashMap<usize, Inode>,
    next_ino: usize,
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn parent(rel: &str) -> &str {
    rel.rfind('/').map(|i| &rel[..i]).unwrap_or("")
}

fn below(rel: &str, dir: &str) -> bool {
    dir.is_empty() || rel.starts_with(&format!("{dir}/"))
}

impl Tree {
    fn path(&self, mnt: &Path, rel: &str) -> PathBuf {
        let p = mnt.join(&self.base);
        if rel.is_empty() { p } else { p.join(rel) }
    }

    fn bytes(&self) -> usize {
        self.inodes.values().map(|i| i.data.len()).sum()
    }

    fn links(&self, ino: usize) -> usize {
        self.names.values().filter(|&&i| i == ino).count()
    }

    /// Names directly in `dir` (files and directories).
    fn children(&self, dir: &str) -> BTreeSet<String> {
        let direct = |rel: &String| rel != dir && parent(rel) == dir;
        self.names
            .keys()
            .chain(self.dirs.iter())
            .filter(|r| direct(r))
            .map(|r| r.rsplit('/').next().unwrap().to_string())
            .collect()
    }

    fn unlink(&mut self, rel: &str) {
        let ino = self.names.remove(rel).unwrap();
        if self.links(ino) == 0 {
            self.inodes.remove(&ino);
        }
    }

    fn new_inode(&mut self, data: Vec<u8>) -> usize {
        self.next_ino += 1;
        self.inodes.insert(
            self.next_ino,
            Inode {
                data,
                xattrs: BTreeMap::new(),
            },
        );
        self.next_ino
    }

    /// Compares the whole subtree on the mount with the model.
    fn verify(&self, mnt: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for d in &self.dirs {
            let p = self.path(mnt, d);
            match std::fs::read_dir(&p) {
                Ok(rd) => {
                    let got: Result<BTreeSet<String>, _> = rd
                        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                        .collect();
                    match got {
                        Ok(got) if got == self.children(d) => {}
                        Ok(got) => out.push(format!(
                            "{}: lists {got:?}, expected {:?}",
                            p.display(),
                            self.children(d)
                        )),
                        Err(e) => out.push(format!("readdir {}: {e}", p.display())),
                    }
                }
                Err(e) => out.push(format!("readdir {}: {e}", p.display())),
            }
        }
        for (rel, ino) in &self.names {
            let p = self.path(mnt, rel);
            let want = &self.inodes[ino];
            match std::fs::read(&p) {
                Ok(got) if got == want.data => {}
                Ok(got) => out.push(format!("{}: {}", p.display(), diff(&got, &want.data))),
                Err(e) => out.push(format!("read {}: {e}", p.display())),
            }
            match std::fs::metadata(&p) {
                Ok(md) if md.nlink() as usize != self.links(*ino) => out.push(format!(
                    "{}: {} links, expected {}",
                    p.display(),
                    md.nlink(),
                    self.links(*ino)
                )),
                Ok(_) => {}
                Err(e) => out.push(format!("stat {}: {e}", p.display())),
            }
            match listx(&p) {
                Ok(keys) if keys.iter().eq(want.xattrs.keys()) => {
                    for (k, v) in &want.xattrs {
                        match getx(&p, k) {
                            Ok(got) if &got == v => {}
                            other => out.push(format!(
                                "{}: xattr {k} is {other:?}, expected {} bytes",
                                p.display(),
                                v.len()
                            )),
                        }
                    }
                }
                Ok(keys) => out.push(format!(
                    "{}: xattrs {keys:?}, expected {:?}",
                    p.display(),
                    want.xattrs.keys().collect::<Vec<_>>()
                )),
                Err(e) => out.push(format!("listxattr {}: {e}", p.display())),
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// One thread.

struct Worker<'a> {
    id: usize,
    mnt: &'a Path,
    rng: StdRng,
    tree: Tree,
    /// The last operations, for failure messages.
    recent: VecDeque<String>,
    counter: usize,
    counts: BTreeMap<&'static str, usize>,
}

fn pick_size(rng: &mut StdRng) -> usize {
    match rng.random_range(0..100) {
        0..10 => 0,
        10..50 => rng.random_range(1..=4096),
        50..85 => rng.random_range(4097..=128 << 10),
        85..98 => rng.random_range((128 << 10) + 1..=1 << 20),
        _ => rng.random_range((1 << 20) + 1..=5 << 20),
    }
}

impl Worker<'_> {
    fn note(&mut self, op: &'static str, what: String) {
        *self.counts.entry(op).or_default() += 1;
        if self.recent.len() == 12 {
            self.recent.pop_front();
        }
        self.recent.push_back(format!("{op} {what}"));
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.tree.path(self.mnt, rel)
    }

    fn any_file(&mut self) -> Option<String> {
        if self.tree.names.is_empty() {
            return None;
        }
        let k = self.rng.random_range(0..self.tree.names.len());
        self.tree.names.keys().nth(k).cloned()
    }

    fn any_dir(&mut self) -> String {
        let k = self.rng.random_range(0..self.tree.dirs.len());
        self.tree.dirs.iter().nth(k).cloned().unwrap()
    }

    /// One random operation; Err is a failure (the model can no longer be trusted).
    fn step(&mut self) -> Result<(), String> {
        let roll = self.rng.random_range(0..100);
        match roll {
            0..12 => self.create(),
            12..24 => self.read_verify(),
            24..30 => self.append(),
            30..36 => self.overwrite(),
            36..40 => self.truncate(),
            40..45 => self.rename(),
            45..48 => self.link(),
            48..53 => self.unlink(),
            53..56 => self.mkdir(),
            56..59 => self.rmdir(),
            59..61 => self.rename_dir(),
            61..65 => self.readdir(),
            65..70 => self.xattr(),
            70..72 => self.fsync(),
            72..73 => self.fragment(),
            73..75 => self.open_unlinked(),
            75..78 => self.stat(),
            78..86 => self.publish(),
            86..93 => self.consume(),
            _ => self.shared_misc(),
        }
    }

    fn create(&mut self) -> Result<(), String> {
        if self.tree.bytes() > THREAD_BYTES {
            return self.unlink();
        }
        let dir = self.any_dir();
        let rel = join(&dir, &self.fresh("f"));
        let data = noise(pick_size(&mut self.rng), self.rng.random());
        self.note("create", format!("{rel} {} bytes", data.len()));
        let mut f = File::create(self.p(&rel)).map_err(|e| format!("create {rel}: {e}"))?;
        // In pieces, as programs write.
        let mut pos = 0;
        while pos < data.len() {
            let n = self.rng.random_range(1..=256 << 10).min(data.len() - pos);
            f.write_all(&data[pos..pos + n])
                .map_err(|e| format!("write {rel}: {e}"))?;
            pos += n;
        }
        if self.rng.random_bool(0.2) {
            f.sync_all().map_err(|e| format!("fsync {rel}: {e}"))?;
        }
        drop(f);
        let ino = self.tree.new_inode(data);
        self.tree.names.insert(rel, ino);
        Ok(())
    }

    fn read_verify(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        self.note("read", rel.clone());
        let want = &self.tree.inodes[&self.tree.names[&rel]].data;
        if self.rng.random_bool(0.5) {
            let got = std::fs::read(self.p(&rel)).map_err(|e| format!("read {rel}: {e}"))?;
            if &got != want {
                return Err(format!("read {rel}: {}", diff(&got, want)));
            }
        } else {
            // A random range.
            let off = self.rng.random_range(0..=want.len());
            let len = self
                .rng
                .random_range(0..=(want.len() - off).min(1 << 20) + 100);
            let mut buf = vec![0u8; len];
            let f = File::open(self.p(&rel)).map_err(|e| format!("open {rel}: {e}"))?;
            let mut got = 0;
            while got < len {
                let n = f
                    .read_at(&mut buf[got..], (off + got) as u64)
                    .map_err(|e| format!("pread {rel} at {}: {e}", off + got))?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            let end = (off + len).min(want.len());
            if buf[..got] != want[off..end] {
                return Err(format!(
                    "pread {rel} [{off}, +{len}): {}",
                    diff(&buf[..got], &want[off..end])
                ));
            }
        }
        Ok(())
    }

    fn append(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        let d = noise(self.rng.random_range(1..=256 << 10), self.rng.random());
        self.note("append", format!("{rel} {} bytes", d.len()));
        let mut f = OpenOptions::new()
            .append(true)
            .open(self.p(&rel))
            .map_err(|e| format!("open {rel} O_APPEND: {e}"))?;
        f.write_all(&d).map_err(|e| format!("append {rel}: {e}"))?;
        drop(f);
        let ino = self.tree.names[&rel];
        self.tree.inodes.get_mut(&ino).unwrap().data.extend(d);
        Ok(())
    }

    fn overwrite(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        let ino = self.tree.names[&rel];
        let len = self.tree.inodes[&ino].data.len();
        let off = self.rng.random_range(0..=len + (16 << 10));
        let d = noise(self.rng.random_range(1..=128 << 10), self.rng.random());
        self.note("overwrite", format!("{rel} at {off}, {} bytes", d.len()));
        let f = OpenOptions::new()
            .write(true)
            .open(self.p(&rel))
            .map_err(|e| format!("open {rel}: {e}"))?;
        f.write_all_at(&d, off as u64)
            .map_err(|e| format!("pwrite {rel}: {e}"))?;
        drop(f);
        let data = &mut self.tree.inodes.get_mut(&ino).unwrap().data;
        if data.len() < off + d.len() {
            data.resize(off + d.len(), 0);
        }
        data[off..off + d.len()].copy_from_slice(&d);
        Ok(())
    }

    fn truncate(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        let ino = self.tree.names[&rel];
        let len = self.tree.inodes[&ino].data.len();
        let to = self.rng.random_range(0..=len + (64 << 10));
        self.note("truncate", format!("{rel} {len} -> {to}"));
        let f = OpenOptions::new()
            .write(true)
            .open(self.p(&rel))
            .map_err(|e| format!("open {rel}: {e}"))?;
        f.set_len(to as u64)
            .map_err(|e| format!("truncate {rel}: {e}"))?;
        drop(f);
        self.tree.inodes.get_mut(&ino).unwrap().data.resize(to, 0);
        Ok(())
    }

    fn rename(&mut self) -> Result<(), String> {
        let Some(from) = self.any_file() else {
            return self.create();
        };
        // Sometimes over another file (replacing it), else to a new name.
        let to = match self.any_file() {
            Some(t) if self.rng.random_bool(0.3) => t,
            _ => {
                let d = self.any_dir();
                join(&d, &self.fresh("r"))
            }
        };
        self.note("rename", format!("{from} -> {to}"));
        std::fs::rename(self.p(&from), self.p(&to))
            .map_err(|e| format!("rename {from} -> {to}: {e}"))?;
        if from == to {
            return Ok(());
        }
        let ino = self.tree.names[&from];
        if self.tree.names.get(&to) == Some(&ino) {
            // Both names link the same inode: POSIX says rename does nothing.
            return Ok(());
        }
        if self.tree.names.contains_key(&to) {
            self.tree.unlink(&to);
        }
        self.tree.names.remove(&from);
        self.tree.names.insert(to, ino);
        Ok(())
    }

    fn link(&mut self) -> Result<(), String> {
        let Some(from) = self.any_file() else {
            return self.create();
        };
        let d = self.any_dir();
        let to = join(&d, &self.fresh("l"));
        self.note("link", format!("{from} -> {to}"));
        std::fs::hard_link(self.p(&from), self.p(&to))
            .map_err(|e| format!("link {from} -> {to}: {e}"))?;
        let ino = self.tree.names[&from];
        self.tree.names.insert(to, ino);
        Ok(())
    }

    fn unlink(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return Ok(());
        };
        self.note("unlink", rel.clone());
        std::fs::remove_file(self.p(&rel)).map_err(|e| format!("unlink {rel}: {e}"))?;
        self.tree.unlink(&rel);
        Ok(())
    }

    fn mkdir(&mut self) -> Result<(), String> {
        let d = self.any_dir();
        if d.matches('/').count() >= 3 {
            return Ok(());
        }
        let rel = join(&d, &self.fresh("d"));
        self.note("mkdir", rel.clone());
        std::fs::create_dir(self.p(&rel)).map_err(|e| format!("mkdir {rel}: {e}"))?;
        self.tree.dirs.insert(rel);
        Ok(())
    }

    fn rmdir(&mut self) -> Result<(), String> {
        let d = self.any_dir();
        if d.is_empty() {
            return Ok(());
        }
        let empty = self.tree.children(&d).is_empty();
        self.note("rmdir", format!("{d} (empty: {empty})"));
        match std::fs::remove_dir(self.p(&d)) {
            Ok(()) if empty => {
                self.tree.dirs.remove(&d);
                Ok(())
            }
            Ok(()) => Err(format!(
                "rmdir {d} succeeded, but it holds {:?}",
                self.tree.children(&d)
            )),
            Err(e) if !empty && errno(&e) == libc::ENOTEMPTY => Ok(()),
            Err(e) => Err(format!("rmdir {d} (empty: {empty}): {e}")),
        }
    }

    fn rename_dir(&mut self) -> Result<(), String> {
        let d = self.any_dir();
        let target_parent = self.any_dir();
        if d.is_empty() || target_parent == d || below(&target_parent, &d) {
            return Ok(());
        }
        if target_parent.matches('/').count() + 1 + d.matches('/').count() >= 4 {
            return Ok(());
        }
        let to = join(&target_parent, &self.fresh("m"));
        self.note("rename dir", format!("{d} -> {to}"));
        std::fs::rename(self.p(&d), self.p(&to))
            .map_err(|e| format!("rename dir {d} -> {to}: {e}"))?;
        let moved = |rel: &String| -> String {
            if rel == &d {
                to.clone()
            } else if below(rel, &d) {
                format!("{to}{}", &rel[d.len()..])
            } else {
                rel.clone()
            }
        };
        self.tree.dirs = self.tree.dirs.iter().map(moved).collect();
        self.tree.names = self
            .tree
            .names
            .iter()
            .map(|(r, i)| (moved(r), *i))
            .collect();
        Ok(())
    }

    fn readdir(&mut self) -> Result<(), String> {
        let d = self.any_dir();
        self.note("readdir", d.clone());
        let got: BTreeSet<String> = std::fs::read_dir(self.p(&d))
            .map_err(|e| format!("opendir {d}: {e}"))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("readdir {d}: {e}"))?;
        let want = self.tree.children(&d);
        if got != want {
            return Err(format!("readdir {d}: got {got:?}, expected {want:?}"));
        }
        Ok(())
    }

    fn xattr(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        let ino = self.tree.names[&rel];
        let p = self.p(&rel);
        let key = format!("user.k{}", self.rng.random_range(0..4));
        match self.rng.random_range(0..10) {
            0..5 => {
                let v = noise(self.rng.random_range(0..=200), self.rng.random());
                self.note("setxattr", format!("{rel} {key} {} bytes", v.len()));
                setx(&p, &key, &v).map_err(|e| format!("setxattr {rel} {key}: {e}"))?;
                self.tree
                    .inodes
                    .get_mut(&ino)
                    .unwrap()
                    .xattrs
                    .insert(key, v);
            }
            5..8 => {
                self.note("getxattr", format!("{rel} {key}"));
                let want = self.tree.inodes[&ino].xattrs.get(&key);
                match (getx(&p, &key), want) {
                    (Ok(got), Some(w)) if &got == w => {}
                    (Err(e), None) if errno(&e) == libc::ENODATA => {}
                    (got, want) => {
                        return Err(format!(
                            "getxattr {rel} {key}: got {got:?}, expected {want:?}"
                        ));
                    }
                }
                let keys = listx(&p).map_err(|e| format!("listxattr {rel}: {e}"))?;
                let want: BTreeSet<String> =
                    self.tree.inodes[&ino].xattrs.keys().cloned().collect();
                if keys != want {
                    return Err(format!("listxattr {rel}: got {keys:?}, expected {want:?}"));
                }
            }
            _ => {
                self.note("removexattr", format!("{rel} {key}"));
                let had = self.tree.inodes[&ino].xattrs.contains_key(&key);
                match rmx(&p, &key) {
                    Ok(()) if had => {
                        self.tree.inodes.get_mut(&ino).unwrap().xattrs.remove(&key);
                    }
                    Err(e) if !had && errno(&e) == libc::ENODATA => {}
                    other => {
                        return Err(format!(
                            "removexattr {rel} {key} (present: {had}): {other:?}"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn fsync(&mut self) -> Result<(), String> {
        if self.rng.random_bool(0.3) {
            let d = self.any_dir();
            self.note("fsyncdir", d.clone());
            return File::open(self.p(&d))
                .and_then(|f| f.sync_all())
                .map_err(|e| format!("fsync dir {d}: {e}"));
        }
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        let ino = self.tree.names[&rel];
        let d = noise(self.rng.random_range(1..=64 << 10), self.rng.random());
        let off = self.tree.inodes[&ino].data.len() / 2;
        self.note("write+fsync", format!("{rel} at {off}, {} bytes", d.len()));
        let f = OpenOptions::new()
            .write(true)
            .open(self.p(&rel))
            .map_err(|e| format!("open {rel}: {e}"))?;
        f.write_all_at(&d, off as u64)
            .map_err(|e| format!("pwrite {rel}: {e}"))?;
        f.sync_all().map_err(|e| format!("fsync {rel}: {e}"))?;
        drop(f);
        let data = &mut self.tree.inodes.get_mut(&ino).unwrap().data;
        if data.len() < off + d.len() {
            data.resize(off + d.len(), 0);
        }
        data[off..off + d.len()].copy_from_slice(&d);
        Ok(())
    }

    /// Many small writes, each committed on its own (fsync, or close and reopen): the chunk
    /// gets enough slices to be compacted in the background while the storm goes on.
    fn fragment(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        let ino = self.tree.names[&rel];
        let n = self.rng.random_range(16..=32);
        self.note("fragment", format!("{rel}: {n} small committed writes"));
        let open = |p: &Path| OpenOptions::new().write(true).open(p);
        let mut f = open(&self.p(&rel)).map_err(|e| format!("open {rel}: {e}"))?;
        for _ in 0..n {
            let len = self.tree.inodes[&ino].data.len();
            let off = self.rng.random_range(0..=len + 1024);
            let d = noise(self.rng.random_range(1..=4096), self.rng.random());
            f.write_all_at(&d, off as u64)
                .map_err(|e| format!("pwrite {rel}: {e}"))?;
            if self.rng.random_bool(0.5) {
                f.sync_data().map_err(|e| format!("fdatasync {rel}: {e}"))?;
            } else {
                drop(f);
                f = open(&self.p(&rel)).map_err(|e| format!("reopen {rel}: {e}"))?;
            }
            let data = &mut self.tree.inodes.get_mut(&ino).unwrap().data;
            if data.len() < off + d.len() {
                data.resize(off + d.len(), 0);
            }
            data[off..off + d.len()].copy_from_slice(&d);
        }
        Ok(())
    }

    /// Opens a file, unlinks its name, then writes and reads through the descriptor.
    fn open_unlinked(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        let ino = self.tree.names[&rel];
        self.note("open+unlink", rel.clone());
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.p(&rel))
            .map_err(|e| format!("open {rel}: {e}"))?;
        std::fs::remove_file(self.p(&rel)).map_err(|e| format!("unlink {rel}: {e}"))?;
        let mut data = self.tree.inodes[&ino].data.clone();
        self.tree.unlink(&rel);
        let d = noise(self.rng.random_range(1..=256 << 10), self.rng.random());
        let off = self.rng.random_range(0..=data.len());
        f.write_all_at(&d, off as u64)
            .map_err(|e| format!("pwrite unlinked {rel}: {e}"))?;
        if data.len() < off + d.len() {
            data.resize(off + d.len(), 0);
        }
        data[off..off + d.len()].copy_from_slice(&d);
        let mut got = vec![0u8; data.len() + 10];
        let mut n = 0;
        while n < got.len() {
            let k = f
                .read_at(&mut got[n..], n as u64)
                .map_err(|e| format!("pread unlinked {rel}: {e}"))?;
            if k == 0 {
                break;
            }
            n += k;
        }
        got.truncate(n);
        if got != data {
            return Err(format!("unlinked {rel} read back: {}", diff(&got, &data)));
        }
        if let Some(i) = self.tree.inodes.get_mut(&ino) {
            // Other names still link it: they see the write.
            i.data = data;
        }
        Ok(())
    }

    fn stat(&mut self) -> Result<(), String> {
        let Some(rel) = self.any_file() else {
            return self.create();
        };
        let ino = self.tree.names[&rel];
        self.note("stat", rel.clone());
        let md = std::fs::metadata(self.p(&rel)).map_err(|e| format!("stat {rel}: {e}"))?;
        let (len, links) = (self.tree.inodes[&ino].data.len(), self.tree.links(ino));
        if !md.is_file() || md.len() as usize != len || md.nlink() as usize != links {
            return Err(format!(
                "stat {rel}: file {} size {} nlink {}, expected a file of {len} bytes with {links} links",
                md.is_file(),
                md.len(),
                md.nlink()
            ));
        }
        Ok(())
    }

    // ---- shared directories: racing with every other thread ----

    fn shared(&mut self) -> PathBuf {
        self.mnt
            .join("shared")
            .join(format!("s{}", self.rng.random_range(0..SHARED_DIRS)))
    }

    /// Writes a complete file under a private name, then renames it over a shared name.
    fn publish(&mut self) -> Result<(), String> {
        let dir = self.shared();
        let n = self.fresh("");
        let tmp = dir.join(format!("tmp.{}.{n}", self.id));
        let to = dir.join(format!("p{}", self.rng.random_range(0..SHARED_NAMES)));
        let len = pick_size(&mut self.rng).min(1 << 20);
        let data = published(self.rng.random(), len);
        self.note("publish", format!("{} -> {}", tmp.display(), to.display()));
        let mut f = File::create(&tmp).map_err(|e| format!("create {}: {e}", tmp.display()))?;
        f.write_all(&data)
            .map_err(|e| format!("write {}: {e}", tmp.display()))?;
        if self.rng.random_bool(0.1) {
            f.sync_all()
                .map_err(|e| format!("fsync {}: {e}", tmp.display()))?;
        }
        drop(f);
        std::fs::rename(&tmp, &to)
            .map_err(|e| format!("rename {} -> {}: {e}", tmp.display(), to.display()))
    }

    /// Reads a shared file (maybe replaced or unlinked meanwhile): it must be one whole file.
    fn consume(&mut self) -> Result<(), String> {
        let dir = self.shared();
        let name = if self.rng.random_bool(0.7) {
            format!("p{}", self.rng.random_range(0..SHARED_NAMES))
        } else {
            format!("l{}", self.rng.random_range(0..SHARED_NAMES))
        };
        let p = dir.join(&name);
        self.note("consume", p.display().to_string());
        let Some(mut f) = allow(File::open(&p), &[libc::ENOENT])
            .map_err(|e| format!("open {}: {e}", p.display()))?
        else {
            return Ok(());
        };
        // Read in two goes with a pause, so that renames over the name happen meanwhile.
        let mut d = vec![0u8; 16];
        let mut head = 0;
        while head < 16 {
            let n = f
                .read(&mut d[head..])
                .map_err(|e| format!("read {}: {e}", p.display()))?;
            if n == 0 {
                break;
            }
            head += n;
        }
        d.truncate(head);
        if self.rng.random_bool(0.3) {
            std::thread::sleep(Duration::from_millis(self.rng.random_range(1..20)));
        }
        f.read_to_end(&mut d)
            .map_err(|e| format!("read {}: {e}", p.display()))?;
        check_published(&d).map_err(|e| format!("{} is not one whole file: {e}", p.display()))
    }

    /// Directories created and removed by several threads at once, files in them, hard links
    /// to published files, readdir and xattrs on shared names: errors that races explain
    /// (ENOENT, EEXIST, ENOTEMPTY) are expected, any other is a failure.
    fn shared_misc(&mut self) -> Result<(), String> {
        use libc::{EEXIST, ENODATA, ENOENT, ENOTEMPTY};
        let dir = self.shared();
        let j = self.rng.random_range(0..SHARED_NAMES);
        let sub = dir.join(format!("d{}", j % 3));
        let roll = self.rng.random_range(0..8);
        let r = match roll {
            0 => {
                self.note("shared mkdir", sub.display().to_string());
                allow(std::fs::create_dir(&sub), &[EEXIST]).map(|_| ())
            }
            1 => {
                self.note("shared rmdir", sub.display().to_string());
                allow(std::fs::remove_dir(&sub), &[ENOENT, ENOTEMPTY]).map(|_| ())
            }
            2 => {
                let f = sub.join(format!("x{}", self.id));
                self.note("shared create", f.display().to_string());
                let data = published(self.rng.random(), self.rng.random_range(0..5000));
                match allow(File::create(&f), &[ENOENT]) {
                    Ok(Some(mut h)) => h.write_all(&data).map_err(|e| e.to_string()),
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            3 => {
                let f = sub.join(format!("x{}", self.id));
                self.note("shared unlink", f.display().to_string());
                allow(std::fs::remove_file(&f), &[ENOENT]).map(|_| ())
            }
            4 => {
                let (from, to) = (dir.join(format!("p{j}")), dir.join(format!("l{j}")));
                self.note(
                    "shared link",
                    format!("{} -> {}", from.display(), to.display()),
                );
                allow(std::fs::hard_link(&from, &to), &[ENOENT, EEXIST]).map(|_| ())
            }
            5 => {
                let to = dir.join(format!("l{j}"));
                self.note("shared unlink", to.display().to_string());
                allow(std::fs::remove_file(&to), &[ENOENT]).map(|_| ())
            }
            6 => {
                self.note("shared readdir", dir.display().to_string());
                match std::fs::read_dir(&dir) {
                    Ok(mut rd) => rd
                        .try_for_each(|e| e.map(|_| ()))
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            _ => {
                let p = dir.join(format!("p{j}"));
                self.note("shared xattr", p.display().to_string());
                let v = format!("t{}", self.id);
                allow(setx(&p, "user.owner", v.as_bytes()), &[ENOENT])
                    .and_then(|_| allow(getx(&p, "user.owner"), &[ENOENT, ENODATA]))
                    .map(|_| ())
            }
        };
        r.map_err(|e| format!("{}: {e}", self.recent.back().unwrap()))
    }
}

// ---------------------------------------------------------------------------------------------
// The test.

fn seed() -> u64 {
    match std::env::var("STRESS_SEED") {
        Ok(s) => s.parse().expect("STRESS_SEED must be a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

/// fsck must find the volume consistent and without leaked objects.
fn check_fsck(vol: &Volume, when: &str, problems: &mut Vec<String>) {
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    let out = out + &err;
    if !ok
        || out
            .lines()
            .any(|l| l.starts_with("ERROR") || l.starts_with("LEAKED"))
    {
        problems.push(format!("fsck {when}: exit ok={ok}\n{out}"));
    }
}

/// Runs the threads against a mount; returns their models and failures.
fn run_threads(m: &Mount, seed: u64, secs: u64) -> (Vec<Tree>, Vec<String>) {
    for k in 0..SHARED_DIRS {
        std::fs::create_dir_all(m.p(&format!("shared/s{k}"))).unwrap();
    }
    let stop_at = Instant::now() + Duration::from_secs(secs);
    let abort = AtomicBool::new(false);
    let failures = Mutex::new(Vec::new());
    let counts = Mutex::new(BTreeMap::<&'static str, usize>::new());
    let trees: Vec<Tree> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|id| {
                let (abort, failures, counts) = (&abort, &failures, &counts);
                let mnt = m.path.as_path();
                s.spawn(move || {
                    let base = format!("t{id}");
                    std::fs::create_dir(mnt.join(&base)).unwrap();
                    let mut w = Worker {
                        id,
                        mnt,
                        rng: StdRng::seed_from_u64(seed ^ (id as u64).wrapping_mul(0x9E37_79B9)),
                        tree: Tree {
                            base,
                            dirs: BTreeSet::from([String::new()]),
                            ..Tree::default()
                        },
                        recent: VecDeque::new(),
                        counter: 0,
                        counts: BTreeMap::new(),
                    };
                    while Instant::now() < stop_at && !abort.load(Ordering::Relaxed) {
                        if let Err(e) = w.step() {
                            let recent: Vec<&String> = w.recent.iter().collect();
                            failures.lock().unwrap().push(format!(
                                "thread {id}: {e}\n  its last operations: {recent:#?}"
                            ));
                            // The model may be off from here on: this thread stops.
                            if failures.lock().unwrap().len() >= 10 {
                                abort.store(true, Ordering::Relaxed);
                            }
                            break;
                        }
                    }
                    let mut c = counts.lock().unwrap();
                    for (k, v) in &w.counts {
                        *c.entry(k).or_default() += v;
                    }
                    w.tree
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let counts = counts.into_inner().unwrap();
    println!("{} operations: {counts:?}", counts.values().sum::<usize>());
    (trees, failures.into_inner().unwrap())
}

#[test]
fn stress_mixed_operations() {
    let seed = seed();
    let secs: u64 = std::env::var("STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    println!("stress seed = {seed} (rerun with STRESS_SEED={seed}), {THREADS} threads, {secs} s");
    let vol = Volume::new();
    let mut problems = Vec::new();
    let mut mount_log = String::new();
    let fail = |problems: &Vec<String>, what: &str, log: &str| {
        assert!(
            problems.is_empty(),
            "{what} (seed {seed}; rerun with STRESS_SEED={seed}): {} problems:\n{}\n--- mount log (tail) ---\n{}",
            problems.len(),
            problems.join("\n"),
            tail(log, 40)
        );
    };

    // 1. The storm, then every thread's subtree checked against its model. Write buffers of
    //    16 MiB (all files together): most files are committed at close, but the threads
    //    writing at once also fill the buffers, and writers flush themselves (back-pressure).
    let m = vol.mount_with(&["--buffer-size", "16M"]);
    let (trees, failures) = run_threads(&m, seed, secs);
    problems.extend(failures);
    for t in &trees {
        problems.extend(t.verify(&m.path));
    }
    let files: usize = trees.iter().map(|t| t.names.len()).sum();
    let bytes: usize = trees.iter().map(|t| t.bytes()).sum();
    println!(
        "after the storm: {files} files ({bytes} bytes) in the threads' subtrees, {} objects",
        vol.objects().len()
    );
    mount_log += &m.log_text();
    if problems.is_empty() {
        m.unmount();
    } else {
        drop(m);
    }
    fail(&problems, "during the storm", &mount_log);

    // 2. A clean unmount leaves a consistent volume with no garbage.
    check_fsck(&vol, "after the storm and a clean unmount", &mut problems);
    fail(&problems, "after unmount", "");

    // 3. Everything is there after a remount; then everything is deleted.
    let m = vol.mount();
    for t in &trees {
        problems.extend(t.verify(&m.path));
    }
    for e in std::fs::read_dir(&m.path).unwrap() {
        let p = e.unwrap().path();
        if let Err(e) = std::fs::remove_dir_all(&p) {
            problems.push(format!("rm -rf {}: {e}", p.display()));
        }
    }
    let left: Vec<String> = std::fs::read_dir(&m.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    if !left.is_empty() {
        problems.push(format!("after rm -rf the root still lists {left:?}"));
    }
    // The background job reclaims the dead slices' objects while mounted.
    let start = Instant::now();
    while !vol.objects().is_empty() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let lingering = vol.objects();
    let log = m.log_text();
    if problems.is_empty() {
        m.unmount();
    } else {
        drop(m);
    }
    fail(&problems, "after remount", &log);
    if !lingering.is_empty() {
        println!(
            "note: {} objects still in the bucket 30 s after deleting everything (mounted); running gc --delete",
            lingering.len()
        );
        let (ok, out, err) = vol.cmd("gc", &["-q", "--delete"]);
        if !ok {
            problems.push(format!("gc --delete: {out}{err}"));
        }
    }
    let objs = vol.objects();
    if !objs.is_empty() {
        let (_, out, err) = vol.cmd("fsck", &["-q"]);
        problems.push(format!(
            "{} block objects left after deleting everything (and gc --delete): {:?}\nfsck says:\n{out}{err}",
            objs.len(),
            &objs[..objs.len().min(10)]
        ));
    }
    check_fsck(&vol, "after deleting everything", &mut problems);
    fail(&problems, "after deleting everything", &log);
}
