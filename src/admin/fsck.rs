//! `fsck`: check a volume's invariants, say what is wrong and where, and fix what is safe.
//!
//! Checks, each reported with the path it affects: directory entries pointing nowhere or
//! recording the wrong kind; link counts; inodes no directory reaches (and unlinked inodes
//! nobody holds open); directories' parent links; chunks that cannot be decoded, lie beyond
//! their file's end, or hold records out of bounds; slice reference counts; slices whose
//! objects are missing or the wrong size; objects no slice references (leaked: harmless
//! garbage, `unkai gc` deletes them); usage counters.
//!
//! Not for: deleting leaked objects (that is `gc`).

use std::collections::{HashMap, HashSet};

use indicatif::{ProgressBar, ProgressStyle};

use crate::data::layout::{self, Layout};
use crate::meta::{Attr, CHUNK_SIZE, Fix, Format, Ino, Kind, Meta, ROOT_INO};
use crate::object::{ObjectInfo, ObjectStorage};

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The volume is inconsistent.
    Error,
    /// Harmless garbage (a leaked object).
    Garbage,
}

/// One finding.
#[derive(Clone, Debug)]
pub struct Problem {
    pub severity: Severity,
    pub message: String,
    /// The repairs that fix it, if a safe fix exists.
    pub fixes: Vec<Fix>,
}

/// What a check found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub problems: Vec<Problem>,
    pub inodes: u64,
    pub entries: u64,
    pub chunks: u64,
    pub slices: u64,
    pub objects: u64,
    /// Objects no slice references: (key, size).
    pub leaked: Vec<ObjectInfo>,
}

impl Report {
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
    }

    pub fn is_consistent(&self) -> bool {
        self.errors().next().is_none()
    }
}

/// Name of the directory fsck links unreachable inodes into.
pub const LOST_FOUND: &[u8] = b"lost+found";

fn spinner(msg: &'static str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} {msg}: {pos}").unwrap());
    pb.set_message(msg);
    pb
}

/// Paths of inodes, from the directory entries.
struct Names {
    first: HashMap<Ino, (Ino, Vec<u8>)>,
}

impl Names {
    fn path(&self, ino: Ino) -> String {
        if ino == ROOT_INO {
            return "/".into();
        }
        let mut parts = Vec::new();
        let mut cur = ino;
        let mut seen = HashSet::new();
        while cur != ROOT_INO {
            if !seen.insert(cur) {
                return format!("<cycle at inode {cur}>/{}", parts.join("/"));
            }
            match self.first.get(&cur) {
                Some((p, name)) => {
                    parts.push(String::from_utf8_lossy(name).into_owned());
                    cur = *p;
                }
                None => return format!("<inode {ino}, in no directory>"),
            }
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    fn entry_path(&self, parent: Ino, name: &[u8]) -> String {
        let p = self.path(parent);
        let sep = if p.ends_with('/') { "" } else { "/" };
        format!("{p}{sep}{}", String::from_utf8_lossy(name))
    }
}

fn align4k(n: u64) -> u64 {
    n.div_ceil(4096) * 4096
}

/// Checks a volume. `objects`: the bucket, to check objects too (None: metadata only).
pub fn check(
    meta: &dyn Meta,
    objects: Option<&ObjectStorage>,
    quiet: bool,
) -> anyhow::Result<Report> {
    let fmt = meta.format().clone();
    let mut r = Report::default();
    let err = |r: &mut Report, message: String, fixes: Vec<Fix>| {
        r.problems.push(Problem {
            severity: Severity::Error,
            message,
            fixes,
        });
    };

    // Inodes.
    let pb = spinner("reading inodes", quiet);
    let mut nodes: HashMap<Ino, Attr> = HashMap::new();
    meta.scan_nodes(&mut |a| {
        nodes.insert(a.ino, a.clone());
        pb.inc(1);
    })?;
    pb.finish_and_clear();
    r.inodes = nodes.len() as u64;

    // Entries.
    let pb = spinner("reading directory entries", quiet);
    let mut entries: Vec<(Ino, Vec<u8>, Ino, Option<Kind>)> = Vec::new();
    meta.scan_entries(&mut |p, n, i, k| {
        entries.push((p, n.to_vec(), i, k));
        pb.inc(1);
    })?;
    pb.finish_and_clear();
    r.entries = entries.len() as u64;
    let mut names = Names {
        first: HashMap::new(),
    };
    for (p, n, i, _) in &entries {
        names.first.entry(*i).or_insert_with(|| (*p, n.clone()));
    }

    let mut refs: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    let mut dir_parents: HashMap<Ino, Vec<Ino>> = HashMap::new();
    for (parent, name, ino, kind) in &entries {
        let path = names.entry_path(*parent, name);
        match nodes.get(parent) {
            Some(p) if p.kind == Kind::Dir => {}
            Some(_) => {
                err(
                    &mut r,
                    format!("entry {path}: its parent (inode {parent}) is not a directory"),
                    vec![Fix::RemoveEntry {
                        parent: *parent,
                        name: name.clone(),
                    }],
                );
                continue;
            }
            None => {
                err(
                    &mut r,
                    format!("entry {path}: its parent directory (inode {parent}) does not exist"),
                    vec![Fix::RemoveEntry {
                        parent: *parent,
                        name: name.clone(),
                    }],
                );
                continue;
            }
        }
        let Some(node) = nodes.get(ino) else {
            err(
                &mut r,
                format!("entry {path} points to inode {ino}, which does not exist"),
                vec![Fix::RemoveEntry {
                    parent: *parent,
                    name: name.clone(),
                }],
            );
            continue;
        };
        if *kind != Some(node.kind) {
            err(
                &mut r,
                format!(
                    "entry {path} records kind {kind:?} but inode {ino} is {:?}",
                    node.kind
                ),
                vec![Fix::SetEntryKind {
                    parent: *parent,
                    name: name.clone(),
                    kind: node.kind,
                }],
            );
        }
        *refs.entry(*ino).or_default() += 1;
        if node.kind == Kind::Dir {
            *subdirs.entry(*parent).or_default() += 1;
            dir_parents.entry(*ino).or_default().push(*parent);
        }
    }

    // Sessions and the inodes they hold open (an unlinked inode open in a live session is
    // alive; one only sessions that no longer exist held is reclaimed).
    let live: HashSet<u64> = meta.sessions()?.iter().map(|s| s.id).collect();
    let opens = meta.sustained()?;
    let held: HashSet<Ino> = opens
        .iter()
        .filter(|(session, _)| live.contains(session))
        .map(|(_, ino)| *ino)
        .collect();
    for (session, ino) in opens {
        if !live.contains(&session) {
            // An unlinked inode nothing else holds is reclaimed below (once, however many
            // dead sessions had it open).
            let fixes = vec![Fix::RemoveSustained { session, ino }];
            err(
                &mut r,
                format!("inode {ino} is held open by session {session}, which no longer exists"),
                fixes,
            );
        }
    }

    // Link counts, reachability, parents.
    let mut lost: Vec<&Attr> = Vec::new();
    let mut ids: Vec<&Ino> = nodes.keys().collect();
    ids.sort();
    for ino in ids {
        let a = &nodes[ino];
        let n = refs.get(ino).copied().unwrap_or(0);
        if *ino == ROOT_INO {
            if n != 0 {
                err(
                    &mut r,
                    format!("the root directory has {n} names; it should have none"),
                    vec![],
                );
            }
        } else if n == 0 {
            if a.nlink == 0 {
                if !held.contains(ino) {
                    err(
                        &mut r,
                        format!(
                            "inode {ino} ({:?}, {} bytes) was unlinked but never reclaimed",
                            a.kind, a.length
                        ),
                        vec![Fix::DeleteInode { ino: *ino }],
                    );
                }
            } else {
                lost.push(a);
            }
            continue;
        }
        let want = if a.kind == Kind::Dir {
            2 + subdirs.get(ino).copied().unwrap_or(0)
        } else {
            n
        };
        if a.nlink != want {
            err(
                &mut r,
                format!(
                    "link count of {} is {}, should be {want}",
                    names.path(*ino),
                    a.nlink
                ),
                vec![Fix::SetNlink {
                    ino: *ino,
                    nlink: want,
                }],
            );
        }
        if a.kind == Kind::Dir && *ino != ROOT_INO {
            let ps = &dir_parents[ino];
            if ps.len() > 1 {
                err(
                    &mut r,
                    format!(
                        "directory {} has {} names (hard-linked directory)",
                        names.path(*ino),
                        ps.len()
                    ),
                    vec![],
                );
            } else if a.parent != ps[0] {
                err(
                    &mut r,
                    format!(
                        "directory {} records parent {} but lives in {}",
                        names.path(*ino),
                        a.parent,
                        ps[0]
                    ),
                    vec![Fix::SetParent {
                        ino: *ino,
                        parent: ps[0],
                    }],
                );
            }
        }
    }
    for a in lost {
        let name = format!("inode-{}", a.ino).into_bytes();
        let mut fixes = vec![Fix::Link {
            ino: a.ino,
            parent: 0,
            name,
            kind: a.kind,
        }];
        if a.kind == Kind::Dir {
            fixes.push(Fix::SetParent {
                ino: a.ino,
                parent: 0,
            });
        } else {
            fixes.push(Fix::SetNlink {
                ino: a.ino,
                nlink: 1,
            });
        }
        err(
            &mut r,
            format!(
                "inode {} ({:?}, {} bytes) is in no directory (will go to /lost+found)",
                a.ino, a.kind, a.length
            ),
            fixes,
        );
    }
    // Directories not reachable from the root (cycles).
    let mut reach: HashSet<Ino> = HashSet::from([ROOT_INO]);
    let mut children: HashMap<Ino, Vec<Ino>> = HashMap::new();
    for (p, _, i, _) in &entries {
        children.entry(*p).or_default().push(*i);
    }
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        for c in children.get(&d).into_iter().flatten() {
            if reach.insert(*c) {
                stack.push(*c);
            }
        }
    }
    for (ino, _) in refs.iter().filter(|(i, _)| !reach.contains(i)) {
        if nodes.get(ino).is_some_and(|a| a.kind == Kind::Dir) {
            err(
                &mut r,
                format!("directory inode {ino} is not reachable from the root (a cycle)"),
                vec![],
            );
        }
    }

    // Chunks and slice references.
    let pb = spinner("reading chunks", quiet);
    let mut counted: HashMap<u64, (u32, u32)> = HashMap::new(); // id -> (size, refs)
    let mut owner: HashMap<u64, Ino> = HashMap::new();
    let mut chunk_errs: Vec<(String, Vec<Fix>)> = Vec::new();
    meta.scan_chunks(&mut |ino, index, recs| {
        pb.inc(1);
        r.chunks += 1;
        let fix = vec![Fix::DropChunk { ino, index }];
        let Some(node) = nodes.get(&ino) else {
            chunk_errs.push((
                format!("chunk {index} belongs to inode {ino}, which does not exist"),
                fix,
            ));
            return;
        };
        let path = names.path(ino);
        let Some(recs) = recs else {
            chunk_errs.push((format!("chunk {index} of {path} cannot be decoded"), fix));
            return;
        };
        if node.kind != Kind::File {
            chunk_errs.push((
                format!("{path} is a {:?} but has data chunk {index}", node.kind),
                fix,
            ));
            return;
        }
        if index as u64 * CHUNK_SIZE >= node.length && recs.iter().any(|x| x.id != 0) {
            chunk_errs.push((
                format!(
                    "chunk {index} of {path} lies beyond the end of the file ({} bytes)",
                    node.length
                ),
                fix,
            ));
            return;
        }
        for x in &recs {
            if x.end() > CHUNK_SIZE || (x.id != 0 && x.off as u64 + x.len as u64 > x.size as u64) {
                chunk_errs.push((
                    format!("chunk {index} of {path} has a record out of bounds: {x:?}"),
                    vec![],
                ));
            }
            if x.id != 0 {
                let e = counted.entry(x.id).or_insert((x.size, 0));
                if e.0 != x.size {
                    chunk_errs.push((
                        format!(
                            "slice {} has two sizes ({} and {}) in {path}",
                            x.id, e.0, x.size
                        ),
                        vec![],
                    ));
                }
                e.1 += 1;
                owner.entry(x.id).or_insert(ino);
            }
        }
    })?;
    pb.finish_and_clear();
    for (m, f) in chunk_errs {
        err(&mut r, m, f);
    }
    let table: HashMap<u64, (u32, u32)> = meta
        .all_slices()?
        .into_iter()
        .map(|(id, size, refs)| (id, (size, refs)))
        .collect();
    let dead: HashMap<u64, u32> = meta
        .all_dead_slices()?
        .into_iter()
        .map(|d| (d.id, d.size))
        .collect();
    for (id, (size, refs)) in &table {
        let actual = counted.get(id).map(|c| c.1).unwrap_or(0);
        if actual != *refs {
            err(
                &mut r,
                format!("slice {id} is recorded with {refs} references but has {actual}"),
                vec![Fix::SetSliceRefs {
                    id: *id,
                    size: *size,
                    refs: actual,
                }],
            );
        }
    }
    for (id, (size, n)) in &counted {
        if !table.contains_key(id) {
            err(
                &mut r,
                format!(
                    "slice {id} of {} is referenced {n} times but not recorded",
                    names.path(owner[id])
                ),
                vec![Fix::SetSliceRefs {
                    id: *id,
                    size: *size,
                    refs: *n,
                }],
            );
        }
        if dead.contains_key(id) {
            err(
                &mut r,
                format!(
                    "slice {id} of {} is still referenced but queued for deletion",
                    names.path(owner[id])
                ),
                vec![Fix::UndeadSlice { id: *id }],
            );
        }
    }
    r.slices = counted.len() as u64;

    // Objects.
    if let Some(obj) = objects {
        let pb = spinner("listing objects", quiet);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let layout = Layout::new(&fmt);
        let mut listed = Vec::new();
        for prefix in layout.chunks_prefixes() {
            listed.extend(rt.block_on(obj.list(&prefix))?);
        }
        pb.finish_and_clear();
        r.objects = listed.len() as u64;
        let sizes: HashMap<&str, u64> = listed.iter().map(|o| (o.key.as_str(), o.size)).collect();
        let mut ids: Vec<_> = counted.iter().collect();
        ids.sort();
        for (id, (size, _)) in ids {
            for (i, len) in layout.blocks_of(*size) {
                let key = layout.block_key(*id, i, len);
                match sizes.get(key.as_str()) {
                    Some(s) if *s == layout.object_size(len) => {}
                    Some(s) => err(
                        &mut r,
                        format!(
                            "object {key} of {} is {s} bytes, should be {}",
                            names.path(owner[id]),
                            layout.object_size(len)
                        ),
                        vec![],
                    ),
                    None => err(
                        &mut r,
                        format!(
                            "object {key} of {} is missing (slice {id}, block {i})",
                            names.path(owner[id])
                        ),
                        vec![],
                    ),
                }
            }
        }
        r.leaked = leaked_objects(&fmt, &listed, &counted, &dead);
        for o in &r.leaked {
            r.problems.push(Problem {
                severity: Severity::Garbage,
                message: format!(
                    "object {} ({} bytes) is not referenced by any slice (leaked)",
                    o.key, o.size
                ),
                fixes: vec![],
            });
        }
    }

    // Usage counters.
    let used: u64 = nodes
        .values()
        .filter(|a| a.kind == Kind::File)
        .map(|a| align4k(a.length))
        .sum();
    let u = meta.usage()?;
    if u.used_bytes != used || u.inodes != nodes.len() as u64 {
        err(
            &mut r,
            format!(
                "usage counters say {} bytes in {} inodes; the volume holds {used} bytes in {} inodes",
                u.used_bytes,
                u.inodes,
                nodes.len()
            ),
            vec![Fix::SetUsage {
                used_bytes: used,
                inodes: nodes.len() as u64,
            }],
        );
    }
    Ok(r)
}

/// Objects under the chunks prefix that belong to no live or dying slice.
pub fn leaked_objects(
    fmt: &Format,
    listed: &[ObjectInfo],
    live: &HashMap<u64, (u32, u32)>,
    dead: &HashMap<u64, u32>,
) -> Vec<ObjectInfo> {
    let layout = Layout::new(fmt);
    listed
        .iter()
        .filter(|o| {
            let Some((id, index, len)) = layout::parse_block_key(&o.key) else {
                return !o.key.rsplit('/').next().unwrap_or("").starts_with('.');
            };
            let size = live
                .get(&id)
                .map(|x| x.0)
                .or_else(|| dead.get(&id).copied());
            match size {
                None => true,
                Some(size) => {
                    !layout.blocks_of(size).any(|(i, l)| i == index && l == len)
                        || layout.block_key(id, index, len) != o.key
                }
            }
        })
        .cloned()
        .collect()
}

/// Applies every fix of the report; returns how many were applied. Run `check` again after:
/// a fix may reveal or resolve other findings.
pub fn repair(meta: &dyn Meta, report: &Report) -> anyhow::Result<usize> {
    let mut lost_found: Option<Ino> = None;
    let mut applied = 0;
    for p in &report.problems {
        for f in &p.fixes {
            let f = match f {
                Fix::Link {
                    ino,
                    parent: 0,
                    name,
                    kind,
                } => {
                    let lf = match lost_found {
                        Some(d) => d,
                        None => {
                            let d = ensure_lost_found(meta)?;
                            lost_found = Some(d);
                            d
                        }
                    };
                    Fix::Link {
                        ino: *ino,
                        parent: lf,
                        name: name.clone(),
                        kind: *kind,
                    }
                }
                Fix::SetParent { ino, parent: 0 } => Fix::SetParent {
                    ino: *ino,
                    parent: lost_found.unwrap_or(ROOT_INO),
                },
                other => other.clone(),
            };
            meta.repair(&f)?;
            applied += 1;
        }
    }
    Ok(applied)
}

fn ensure_lost_found(meta: &dyn Meta) -> anyhow::Result<Ino> {
    let ctx = crate::meta::Ctx::ROOT;
    match meta.lookup(&ctx, ROOT_INO, LOST_FOUND) {
        Ok(a) => Ok(a.ino),
        Err(_) => Ok(meta
            .mknod(&ctx, ROOT_INO, LOST_FOUND, Kind::Dir, 0o700, 0, None)?
            .ino),
    }
}
