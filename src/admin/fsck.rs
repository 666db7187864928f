//! `fsck`: check a volume's invariants, say what is wrong and where, and fix what is safe.
//!
//! Checks, each reported with the path it affects: directory entries pointing nowhere or
//! recording the wrong kind; link counts; inodes no directory reaches (and unlinked inodes
//! nobody holds open); directories' parent links; chunks that cannot be decoded, lie beyond
//! their file's end, or hold records out of bounds; slice reference counts; slices whose
//! objects are missing or the wrong size; objects no slice references (leaked: harmless
//! garbage, `unkai gc` deletes them); open-file records of sessions that are gone; usage
//! counters. [`check`] runs one function per invariant, in a fixed order, and reports in it;
//! the slice table and what counts as leaked come from `garbage`, as for `gc` and a mount.
//!
//! Not for: deleting leaked objects (that is `gc`).

use std::collections::{HashMap, HashSet};

use indicatif::{ProgressBar, ProgressStyle};

use crate::data::ObjectCheck;
use crate::data::layout::Layout;
use crate::garbage::{self, Reserved, SliceTable};
use crate::meta::{Attr, CHUNK_SIZE, Fix, Format, Ino, Kind, Meta, ROOT_INO, SliceRec};
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
    /// Objects no slice references yet, of slice ids a live session reserved: uploads it may
    /// still commit (not garbage, not a problem).
    pub in_flight: Vec<ObjectInfo>,
    /// Blocks of committed slices not in the bucket yet, staged for upload (write-back) on
    /// this machine or by a live client: not a problem.
    pub staged: u64,
    /// External slices referenced (`unkai import`: bytes of objects outside the volume).
    pub external_slices: u64,
    /// Imported objects changed or gone behind unkai, each with the file it feeds and what
    /// changed (their files read as EIO until `unkai import --refresh`; the volume itself is
    /// consistent).
    pub external_changed: Vec<String>,
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

impl Report {
    /// Records an inconsistency and the repairs that fix it.
    fn error(&mut self, message: String, fixes: Vec<Fix>) {
        self.problems.push(Problem {
            severity: Severity::Error,
            message,
            fixes,
        });
    }
}

/// A directory entry: (parent, name, inode, kind recorded in the entry).
type Entry = (Ino, Vec<u8>, Ino, Option<Kind>);

/// The namespace as read once: every inode, every entry, and the paths they give.
struct Namespace {
    nodes: HashMap<Ino, Attr>,
    entries: Vec<Entry>,
    names: Names,
}

/// What the valid directory entries say about their inodes.
#[derive(Default)]
struct Links {
    /// Inode -> how many entries name it.
    refs: HashMap<Ino, u32>,
    /// Directory -> how many subdirectories it holds.
    subdirs: HashMap<Ino, u32>,
    /// Directory -> the directories that name it.
    dir_parents: HashMap<Ino, Vec<Ino>>,
}

/// What the chunks say about slices.
#[derive(Default)]
struct SliceRefs {
    /// Slice -> (size, references), counted over all chunks.
    counted: HashMap<u64, (u32, u32)>,
    /// Slice -> the first file found referencing it.
    owner: HashMap<u64, Ino>,
    /// File -> bytes its decodable chunks cover.
    covered: HashMap<Ino, u64>,
}

/// Checks a volume. `objects`: the bucket, to check objects too (None: metadata only).
/// The checks run in this order, and report in it.
/// With `verify`, every referenced object is also read and its contents checked. `staged`:
/// the keys staged for upload on this machine (`data::stage`), present though not in the bucket.
pub fn check(
    meta: &dyn Meta,
    objects: Option<&ObjectStorage>,
    staged: &HashSet<String>,
    verify: Option<&ObjectCheck>,
    quiet: bool,
) -> anyhow::Result<Report> {
    let fmt = meta.format().clone();
    let mut r = Report::default();
    let ns = read_namespace(meta, quiet, &mut r)?;
    let links = check_entries(&ns, &mut r);
    let held = check_open_files(meta, &mut r)?;
    check_inodes(&ns, &links, &held, &mut r);
    check_dirs_reachable(&ns, &links, &mut r);
    let slices = check_chunks(meta, &ns, quiet, &mut r)?;
    let table = SliceTable::load(meta)?;
    check_slice_table(&ns, &slices, &table, &mut r);
    check_stored(&ns, &slices, &mut r);
    check_externals(meta, &ns, &slices, objects.is_some(), &mut r)?;
    if let Some(obj) = objects {
        let listed = list_objects(obj, &fmt, quiet)?;
        let reserved = Reserved::load(meta)?;
        r.objects = listed.len() as u64;
        check_objects_present(&fmt, &listed, &ns, &slices, staged, &reserved, &mut r);
        if let Some(check) = verify {
            verify_objects(obj, &fmt, check, &listed, &ns, &slices, quiet, &mut r)?;
        }
        report_leaked(&fmt, &listed, &slices, &table, &reserved, &mut r);
    }
    check_usage(meta, &ns, &mut r)?;
    Ok(r)
}

/// Reads every inode and every directory entry.
fn read_namespace(meta: &dyn Meta, quiet: bool, r: &mut Report) -> anyhow::Result<Namespace> {
    let pb = spinner("reading inodes", quiet);
    let mut nodes: HashMap<Ino, Attr> = HashMap::new();
    meta.scan_nodes(&mut |a| {
        nodes.insert(a.ino, a.clone());
        pb.inc(1);
    })?;
    pb.finish_and_clear();
    r.inodes = nodes.len() as u64;

    let pb = spinner("reading directory entries", quiet);
    let mut entries: Vec<Entry> = Vec::new();
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
    Ok(Namespace {
        nodes,
        entries,
        names,
    })
}

/// Entries live in existing directories, point to existing inodes and record their kind;
/// counts the names of inodes (valid entries only).
fn check_entries(ns: &Namespace, r: &mut Report) -> Links {
    let mut links = Links::default();
    for entry in &ns.entries {
        let Some(node) = check_entry(ns, entry, r) else {
            continue;
        };
        let (parent, _, ino, _) = entry;
        *links.refs.entry(*ino).or_default() += 1;
        if node.kind == Kind::Dir {
            *links.subdirs.entry(*parent).or_default() += 1;
            links.dir_parents.entry(*ino).or_default().push(*parent);
        }
    }
    links
}

/// One entry: its parent is an existing directory, its inode exists and has the kind the
/// entry records. Returns the inode if the entry counts as a name of it.
fn check_entry<'a>(ns: &'a Namespace, entry: &Entry, r: &mut Report) -> Option<&'a Attr> {
    let (parent, name, ino, kind) = entry;
    let path = ns.names.entry_path(*parent, name);
    let remove = || {
        vec![Fix::RemoveEntry {
            parent: *parent,
            name: name.clone(),
        }]
    };
    match ns.nodes.get(parent) {
        Some(p) if p.kind == Kind::Dir => {}
        Some(_) => {
            r.error(
                format!("entry {path}: its parent (inode {parent}) is not a directory"),
                remove(),
            );
            return None;
        }
        None => {
            r.error(
                format!("entry {path}: its parent directory (inode {parent}) does not exist"),
                remove(),
            );
            return None;
        }
    }
    let Some(node) = ns.nodes.get(ino) else {
        r.error(
            format!("entry {path} points to inode {ino}, which does not exist"),
            remove(),
        );
        return None;
    };
    if *kind != Some(node.kind) {
        r.error(
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
    Some(node)
}

/// Open-file records belong to live sessions. Returns the inodes live sessions hold open
/// (an unlinked inode open in a live session is alive; one only sessions that no longer
/// exist held is reclaimed).
fn check_open_files(meta: &dyn Meta, r: &mut Report) -> anyhow::Result<HashSet<Ino>> {
    let live: HashSet<u64> = meta.sessions()?.iter().map(|s| s.id).collect();
    let opens = meta.sustained()?;
    let held: HashSet<Ino> = opens
        .iter()
        .filter(|(session, _)| live.contains(session))
        .map(|(_, ino)| *ino)
        .collect();
    for (session, ino) in opens {
        if !live.contains(&session) {
            // An unlinked inode nothing else holds is reclaimed by `check_unlinked_reclaimed`
            // (once, however many dead sessions had it open).
            let fixes = vec![Fix::RemoveSustained { session, ino }];
            r.error(
                format!("inode {ino} is held open by session {session}, which no longer exists"),
                fixes,
            );
        }
    }
    Ok(held)
}

/// Every inode, in order of number: the root has no names; unlinked inodes are reclaimed
/// unless held open; link counts; directories' parents. Then inodes in no directory.
fn check_inodes(ns: &Namespace, links: &Links, held: &HashSet<Ino>, r: &mut Report) {
    let mut lost: Vec<&Attr> = Vec::new();
    let mut ids: Vec<&Ino> = ns.nodes.keys().collect();
    ids.sort();
    for ino in ids {
        let a = &ns.nodes[ino];
        let n = links.refs.get(ino).copied().unwrap_or(0);
        if *ino == ROOT_INO {
            check_root_has_no_names(n, r);
        } else if n == 0 {
            if a.nlink == 0 {
                check_unlinked_reclaimed(a, held, r);
            } else {
                lost.push(a);
            }
            continue;
        }
        check_link_count(ns, links, a, n, r);
        if a.kind == Kind::Dir && *ino != ROOT_INO {
            check_dir_parent(ns, links, a, r);
        }
    }
    for a in lost {
        report_in_no_directory(a, r);
    }
}

/// No entry names the root directory.
fn check_root_has_no_names(n: u32, r: &mut Report) {
    if n != 0 {
        r.error(
            format!("the root directory has {n} names; it should have none"),
            vec![],
        );
    }
}

/// An unlinked inode is gone once nobody holds it open.
fn check_unlinked_reclaimed(a: &Attr, held: &HashSet<Ino>, r: &mut Report) {
    if !held.contains(&a.ino) {
        r.error(
            format!(
                "inode {} ({:?}, {} bytes) was unlinked but never reclaimed",
                a.ino, a.kind, a.length
            ),
            vec![Fix::DeleteInode { ino: a.ino }],
        );
    }
}

/// The link count of an inode with `n` names: `n` for a file, 2 + its subdirectories for a
/// directory.
fn check_link_count(ns: &Namespace, links: &Links, a: &Attr, n: u32, r: &mut Report) {
    let want = if a.kind == Kind::Dir {
        2 + links.subdirs.get(&a.ino).copied().unwrap_or(0)
    } else {
        n
    };
    if a.nlink != want {
        r.error(
            format!(
                "link count of {} is {}, should be {want}",
                ns.names.path(a.ino),
                a.nlink
            ),
            vec![Fix::SetNlink {
                ino: a.ino,
                nlink: want,
            }],
        );
    }
}

/// A directory (not the root) has one name, in the parent it records.
fn check_dir_parent(ns: &Namespace, links: &Links, a: &Attr, r: &mut Report) {
    let ps = &links.dir_parents[&a.ino];
    if ps.len() > 1 {
        r.error(
            format!(
                "directory {} has {} names (hard-linked directory)",
                ns.names.path(a.ino),
                ps.len()
            ),
            vec![],
        );
    } else if a.parent != ps[0] {
        r.error(
            format!(
                "directory {} records parent {} but lives in {}",
                ns.names.path(a.ino),
                a.parent,
                ps[0]
            ),
            vec![Fix::SetParent {
                ino: a.ino,
                parent: ps[0],
            }],
        );
    }
}

/// A linked inode no entry names goes to /lost+found (parent 0 stands for it until
/// `repair` creates it).
fn report_in_no_directory(a: &Attr, r: &mut Report) {
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
    r.error(
        format!(
            "inode {} ({:?}, {} bytes) is in no directory (will go to /lost+found)",
            a.ino, a.kind, a.length
        ),
        fixes,
    );
}

/// Every named directory is reachable from the root (no cycles).
fn check_dirs_reachable(ns: &Namespace, links: &Links, r: &mut Report) {
    let mut reach: HashSet<Ino> = HashSet::from([ROOT_INO]);
    let mut children: HashMap<Ino, Vec<Ino>> = HashMap::new();
    for (p, _, i, _) in &ns.entries {
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
    for (ino, _) in links.refs.iter().filter(|(i, _)| !reach.contains(i)) {
        if ns.nodes.get(ino).is_some_and(|a| a.kind == Kind::Dir) {
            r.error(
                format!("directory inode {ino} is not reachable from the root (a cycle)"),
                vec![],
            );
        }
    }
}

/// Every chunk (see `check_chunk`); counts the references of slices.
fn check_chunks(
    meta: &dyn Meta,
    ns: &Namespace,
    quiet: bool,
    r: &mut Report,
) -> anyhow::Result<SliceRefs> {
    let pb = spinner("reading chunks", quiet);
    let mut refs = SliceRefs::default();
    meta.scan_chunks(&mut |ino, index, recs| {
        pb.inc(1);
        r.chunks += 1;
        check_chunk(ns, ino, index, recs, &mut refs, r);
    })?;
    pb.finish_and_clear();
    Ok(refs)
}

/// One chunk belongs to an existing file, decodes, lies within the file and holds records
/// within bounds, each slice with one size; counts its slices' references.
fn check_chunk(
    ns: &Namespace,
    ino: Ino,
    index: u32,
    recs: Option<Vec<SliceRec>>,
    refs: &mut SliceRefs,
    r: &mut Report,
) {
    let fix = vec![Fix::DropChunk { ino, index }];
    let Some(node) = ns.nodes.get(&ino) else {
        r.error(
            format!("chunk {index} belongs to inode {ino}, which does not exist"),
            fix,
        );
        return;
    };
    let path = ns.names.path(ino);
    let Some(recs) = recs else {
        r.error(format!("chunk {index} of {path} cannot be decoded"), fix);
        return;
    };
    if node.kind != Kind::File {
        r.error(
            format!("{path} is a {:?} but has data chunk {index}", node.kind),
            fix,
        );
        return;
    }
    if index as u64 * CHUNK_SIZE >= node.length && recs.iter().any(|x| x.id != 0) {
        r.error(
            format!(
                "chunk {index} of {path} lies beyond the end of the file ({} bytes)",
                node.length
            ),
            fix,
        );
        return;
    }
    *refs.covered.entry(ino).or_insert(0) += crate::meta::slice::covered(&recs);
    for x in &recs {
        if x.end() > CHUNK_SIZE || (x.id != 0 && x.off as u64 + x.len as u64 > x.size as u64) {
            r.error(
                format!("chunk {index} of {path} has a record out of bounds: {x:?}"),
                vec![],
            );
        }
        if x.id != 0 {
            let e = refs.counted.entry(x.id).or_insert((x.size, 0));
            if e.0 != x.size {
                r.error(
                    format!(
                        "slice {} has two sizes ({} and {}) in {path}",
                        x.id, e.0, x.size
                    ),
                    vec![],
                );
            }
            e.1 += 1;
            refs.owner.entry(x.id).or_insert(ino);
        }
    }
}

/// Each file's count of bytes stored (its `st_blocks`) is what its chunks cover.
fn check_stored(ns: &Namespace, slices: &SliceRefs, r: &mut Report) {
    let mut files: Vec<&Attr> = ns.nodes.values().filter(|a| a.kind == Kind::File).collect();
    files.sort_by_key(|a| a.ino);
    for a in files {
        let covered = slices.covered.get(&a.ino).copied().unwrap_or(0);
        if a.stored != covered {
            r.error(
                format!(
                    "{} counts {} bytes stored; its chunks hold {covered}",
                    ns.names.path(a.ino),
                    a.stored
                ),
                vec![Fix::SetStored {
                    ino: a.ino,
                    stored: covered,
                }],
            );
        }
    }
}

/// The slice table agrees with the chunks: recorded reference counts, every referenced
/// slice recorded and none of them queued for deletion.
fn check_slice_table(ns: &Namespace, slices: &SliceRefs, table: &SliceTable, r: &mut Report) {
    check_recorded_refs(slices, table, r);
    for (id, (size, n)) in &slices.counted {
        check_slice_recorded(ns, slices, table, *id, *size, *n, r);
        check_slice_not_dead(ns, slices, table, *id, r);
    }
    r.slices = slices.counted.len() as u64;
}

/// Each recorded slice has the references it is recorded with.
fn check_recorded_refs(slices: &SliceRefs, table: &SliceTable, r: &mut Report) {
    for (id, (size, refs)) in &table.live {
        let actual = slices.counted.get(id).map(|c| c.1).unwrap_or(0);
        if actual != *refs {
            r.error(
                format!("slice {id} is recorded with {refs} references but has {actual}"),
                vec![Fix::SetSliceRefs {
                    id: *id,
                    size: *size,
                    refs: actual,
                }],
            );
        }
    }
}

/// A slice the chunks reference `n` times is recorded.
fn check_slice_recorded(
    ns: &Namespace,
    slices: &SliceRefs,
    table: &SliceTable,
    id: u64,
    size: u32,
    n: u32,
    r: &mut Report,
) {
    if !table.live.contains_key(&id) {
        r.error(
            format!(
                "slice {id} of {} is referenced {n} times but not recorded",
                ns.names.path(slices.owner[&id])
            ),
            vec![Fix::SetSliceRefs { id, size, refs: n }],
        );
    }
}

/// A slice the chunks reference is not queued for deletion.
fn check_slice_not_dead(
    ns: &Namespace,
    slices: &SliceRefs,
    table: &SliceTable,
    id: u64,
    r: &mut Report,
) {
    if table.dead.contains_key(&id) {
        r.error(
            format!(
                "slice {id} of {} is still referenced but queued for deletion",
                ns.names.path(slices.owner[&id])
            ),
            vec![Fix::UndeadSlice { id }],
        );
    }
}

/// Lists the objects where slices' blocks live.
fn list_objects(obj: &ObjectStorage, fmt: &Format, quiet: bool) -> anyhow::Result<Vec<ObjectInfo>> {
    let pb = spinner("listing objects", quiet);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listed = rt.block_on(crate::data::list_blocks(obj, &Layout::new(fmt)))?;
    pb.finish_and_clear();
    Ok(listed)
}

/// A block of a referenced slice: its slice id, index, length and key.
struct BlockRef {
    id: u64,
    index: u32,
    len: u32,
    key: String,
}

/// External slices (`unkai import`): each referenced one has its row; with `probe`, each
/// imported object is read (one byte, pinned to its imported version) and those changed or
/// gone behind unkai are reported with the files they feed.
fn check_externals(
    meta: &dyn Meta,
    ns: &Namespace,
    slices: &SliceRefs,
    probe: bool,
    r: &mut Report,
) -> anyhow::Result<()> {
    let mut ids: Vec<u64> = slices
        .counted
        .keys()
        .copied()
        .filter(|id| crate::meta::slice::is_external(*id))
        .collect();
    r.external_slices = ids.len() as u64;
    if ids.is_empty() {
        return Ok(());
    }
    ids.sort();
    let rows: HashMap<u64, crate::meta::External> =
        meta.externals()?.into_iter().map(|e| (e.id, e)).collect();
    let mut objects: std::collections::BTreeMap<(String, String, String, u64), u64> =
        Default::default();
    for id in &ids {
        let owner = ns.names.path(slices.owner[id]);
        match rows.get(id) {
            Some(e) => {
                let k = (e.url.clone(), e.key.clone(), e.etag.clone(), e.object_size);
                objects.entry(k).or_insert(*id);
            }
            None => r.error(
                format!("external slice {id} of {owner} has no row: its bytes cannot be read"),
                vec![],
            ),
        }
    }
    if !probe {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut stores: HashMap<String, Option<ObjectStorage>> = HashMap::new();
    for ((url, key, etag, size), id) in objects {
        if size == 0 {
            continue;
        }
        let name = crate::data::external::object_name(&rows[&id]);
        let owner = ns.names.path(slices.owner[&id]);
        let store = stores
            .entry(url.clone())
            .or_insert_with(|| ObjectStorage::open(&url, false).ok());
        let Some(store) = store else {
            r.external_changed.push(format!(
                "imported object {name} of {owner}: its store cannot be opened"
            ));
            continue;
        };
        let pin = crate::object::Pin { etag, size };
        match rt.block_on(store.get_pinned(&key, 0..1, &pin)) {
            Ok(_) => {}
            Err(crate::object::Error::Changed { what, .. }) => r.external_changed.push(format!(
                "imported object {name} of {owner} changed behind unkai ({what}): its reads \
                 fail with EIO until unkai import --refresh"
            )),
            Err(e) => r.external_changed.push(format!(
                "imported object {name} of {owner} cannot be read: {}",
                crate::object::one_line(&e.to_string())
            )),
        }
    }
    Ok(())
}

/// Every block of every referenced slice, slices in order of id (external slices' objects
/// are not the volume's: left out).
fn referenced_blocks(layout: &Layout, slices: &SliceRefs) -> Vec<BlockRef> {
    let mut ids: Vec<_> = slices
        .counted
        .iter()
        .filter(|(id, _)| !crate::meta::slice::is_external(**id))
        .collect();
    ids.sort();
    ids.into_iter()
        .flat_map(|(&id, &(size, _))| {
            layout.blocks_of(size).map(move |(index, len)| BlockRef {
                id,
                index,
                len,
                key: layout.block_key(id, index, len),
            })
        })
        .collect()
}

/// Every block of every referenced slice is in the bucket, with the right size (slices in
/// order of id), or staged for upload (on this machine, or by a live client that reserved its
/// slice id).
fn check_objects_present(
    fmt: &Format,
    listed: &[ObjectInfo],
    ns: &Namespace,
    slices: &SliceRefs,
    staged: &HashSet<String>,
    reserved: &Reserved,
    r: &mut Report,
) {
    let layout = Layout::new(fmt);
    let sizes: HashMap<&str, u64> = listed.iter().map(|o| (o.key.as_str(), o.size)).collect();
    for BlockRef {
        id,
        index,
        len,
        key,
    } in referenced_blocks(&layout, slices)
    {
        let owner = || ns.names.path(slices.owner[&id]);
        match sizes.get(key.as_str()) {
            Some(s) if layout.object_sizes(len).contains(s) => {}
            Some(s) => r.error(
                format!(
                    "object {key} of {} is {s} bytes, should be {}",
                    owner(),
                    match layout.object_sizes(len) {
                        r if r.start() == r.end() => r.start().to_string(),
                        r => format!("{} to {}", r.start(), r.end()),
                    }
                ),
                vec![],
            ),
            None if staged.contains(&key) || reserved.contains(id) => r.staged += 1,
            None => r.error(
                format!(
                    "object {key} of {} is missing (slice {id}, block {index})",
                    owner()
                ),
                vec![],
            ),
        }
    }
}

/// Reads every referenced block object present and checks its contents: its checksums and,
/// on volumes of layout 1, that it is the block its key names (a swapped, misdirected or
/// stale object reads as EIO; this names it).
#[allow(clippy::too_many_arguments)]
fn verify_objects(
    obj: &ObjectStorage,
    fmt: &Format,
    check: &ObjectCheck,
    listed: &[ObjectInfo],
    ns: &Namespace,
    slices: &SliceRefs,
    quiet: bool,
    r: &mut Report,
) -> anyhow::Result<()> {
    if !check.can_check() {
        r.problems.push(Problem {
            severity: Severity::Garbage,
            message: "the volume has no checksums: --verify checks sizes only".into(),
            fixes: vec![],
        });
        return Ok(());
    }
    let layout = Layout::new(fmt);
    let present: HashSet<&str> = listed.iter().map(|o| o.key.as_str()).collect();
    let todo: Vec<BlockRef> = referenced_blocks(&layout, slices)
        .into_iter()
        .filter(|b| present.contains(b.key.as_str()))
        .collect();
    let pb = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(todo.len() as u64)
    };
    pb.set_style(
        ProgressStyle::with_template("verifying objects {bar:30} {pos}/{len} {eta}").unwrap(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for BlockRef { id, len, key, .. } in todo {
        let owner = ns.names.path(slices.owner[&id]);
        let got = rt
            .block_on(obj.get(&key))
            .map(|b| check.check(&key, b, len as usize));
        match got {
            Ok(Ok(())) => {}
            Ok(Err(why)) => r.error(
                format!(
                    "object {key} of {owner} fails verification ({why}): damaged, or another \
                     block's content (reads of it fail with EIO)"
                ),
                vec![],
            ),
            Err(e) => r.error(
                format!("object {key} of {owner} cannot be read: {e}"),
                vec![],
            ),
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(())
}

/// Objects no referenced or dying slice owns: harmless garbage, for `gc`, unless a live
/// session reserved their slice id (in flight: it may still commit them).
fn report_leaked(
    fmt: &Format,
    listed: &[ObjectInfo],
    slices: &SliceRefs,
    table: &SliceTable,
    reserved: &Reserved,
    r: &mut Report,
) {
    let unreferenced = garbage::leaked_objects(fmt, listed, &slices.counted, &table.dead);
    (r.in_flight, r.leaked) = reserved.split(unreferenced);
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

/// The usage counters match the files' sizes (rounded up to 4 KiB) and the inode count.
fn check_usage(meta: &dyn Meta, ns: &Namespace, r: &mut Report) -> anyhow::Result<()> {
    let used: u64 = ns
        .nodes
        .values()
        .filter(|a| a.kind == Kind::File)
        .map(|a| align4k(a.length))
        .sum();
    let u = meta.usage()?;
    let inodes = ns.nodes.len() as u64;
    if u.used_bytes != used || u.inodes != inodes {
        r.error(
            format!(
                "usage counters say {} bytes in {} inodes; the volume holds {used} bytes in {} inodes",
                u.used_bytes, u.inodes, inodes
            ),
            vec![Fix::SetUsage {
                used_bytes: used,
                inodes,
            }],
        );
    }
    Ok(())
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
