//! Inodes, names and extended attributes answered from memory while they cannot change
//! behind this client's back: while it has the volume to itself (no other session), or while
//! other clients' changes are pushed to it (PostgreSQL's notifications).
//!
//! Kept exact by this client's own writes: each write reports what it now knows (the
//! inode it changed, the parent it stamped, the name it added or removed) as [`Fact`]s, and
//! other clients' pushed changes make their inodes and names forgotten. A read that missed
//! fills the cache only if nothing it read changed while it read (an epoch, moved by every
//! write and every pushed change, and for each inode the epoch of its last change), so a
//! value read before a change never outlives it; two writes that overlap forget what they
//! touched instead of racing to record it. A change pushed by another client counts only
//! for the inodes it names (the notification names every inode and entry it changed, which
//! is all that keeps caches right anyway): with other clients busy on the volume, a change
//! pushed during nearly every read or write made this client learn nothing (measured: four
//! clients 1 ms from PostgreSQL, each in its own directories, paid a round trip for most
//! lookups and getattrs, where one alone paid none). A write of this client's own still
//! counts for everything, as every change did before. A directory made here
//! starts *complete* (every name it holds is known), so the lookup of a name it lacks (the
//! one before every create) is answered too.
//!
//! Bounded: an LRU of inodes, each with its known names and extended attributes; the
//! least recently used inodes go when the count of entries passes the limit.
//!
//! Pages of listings are kept too (the caller decides when: `ops` only while other
//! clients' changes are pushed), each until a change touches it: a write of this client or
//! a pushed change of the directory, of its own inode, or of an inode it lists (the
//! attributes a listing with attributes carries). Meanwhile a page is answered from memory
//! exactly as the engine would answer it (`rm -rf` opens each directory twice, `ls` then
//! `ls -l`; the pages of a whole subtree read at once, see `ops::readdir`, serve a walk).
//! The `..` entry's attributes alone are not kept with the page: they are the parent's as
//! known now, and without them the page is not answered. Bounded in pages and entries.
//!
//! Not for: file contents (`data`), the kernel's caches (`fuse`), or deciding when the
//! volume is shared (the mount decides and calls [`Cache::set_on`]).

use std::collections::{HashMap, VecDeque};

use lru::LruCache;
use parking_lot::Mutex;

use super::{Attr, Change, DirEntry, Ino};

/// Entries (an inode, a name, an extended attribute) kept by default: about 20 MiB.
pub const DEFAULT_ENTRIES: usize = 100_000;
/// Extended attribute values longer than this are not kept.
const MAX_XATTR_KEPT: usize = 512;
/// Pages of listings kept at most, the most entries one may have, and the most entries
/// of all pages together (about 3 MiB).
const PAGES_KEPT: usize = 512;
const PAGE_ENTRIES_KEPT: usize = 1024;
const PAGES_ENTRIES_KEPT: usize = 16_384;

/// What a page of a listing answers: the directory, the cookie it starts after, the most
/// entries asked, and whether with attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageKey {
    pub dir: Ino,
    pub cookie: u64,
    pub limit: usize,
    pub plus: bool,
}

/// What a write of this client made true.
#[derive(Clone, Debug)]
pub enum Fact {
    /// The inode's attributes now.
    Attr(Attr),
    /// The inode's attributes and extended attributes changed, to values not known here.
    Stale(Ino),
    /// The inode is gone (deleted, or its link count fell to zero).
    Gone(Ino),
    /// A name in a directory now names this inode (`None`: nothing).
    Name(Ino, Vec<u8>, Option<Ino>),
    /// A name changed to something not known here.
    NameStale(Ino, Vec<u8>),
    /// A directory made here: it holds no name.
    NewDir(Ino),
    /// The inode has no extended attribute of this name.
    NoXattr(Ino, &'static [u8]),
}

/// An extended attribute's name and value (`None`: absent).
type Xattr = (Box<[u8]>, Option<Box<[u8]>>);

#[derive(Default)]
struct Node {
    attr: Option<Attr>,
    /// Names known in this directory: `Some(ino)` present, `None` absent.
    names: HashMap<Box<[u8]>, Option<Ino>>,
    /// Whether every present name of the directory is in `names`.
    complete: bool,
    /// Extended attributes known: `None`, absent.
    xattrs: Vec<Xattr>,
}

impl Node {
    fn weight(&self) -> usize {
        1 + self.names.len() + self.xattrs.len()
    }
}

struct Inner {
    on: bool,
    epoch: u64,
    /// The epoch of each inode's last change pushed by another client (of its attributes,
    /// extended attributes or names), kept for [`SINCE_KEPT`] inodes at most.
    since: HashMap<Ino, u64>,
    /// A read or write that began before this epoch is taken as overlapping every change:
    /// this client wrote since, or changes pushed were forgotten or may have been missed.
    floor: u64,
    nodes: LruCache<Ino, Node>,
    /// Sum of the nodes' weights.
    weight: usize,
    limit: usize,
    pages: Pages,
}

/// Pages of listings, each kept until a change touches it.
#[derive(Default)]
struct Pages {
    map: HashMap<PageKey, Vec<DirEntry>>,
    /// Keys in the order they were kept, oldest first (a key may be here once more after
    /// its page went: skipped then).
    order: VecDeque<PageKey>,
    /// The pages each inode's change ends: its directory's, and those listing it.
    by_ino: HashMap<Ino, Vec<PageKey>>,
    /// Entries of all pages.
    entries: usize,
    /// Directories listed lately, newest last (a walk lists their subdirectories next).
    lately: VecDeque<Ino>,
}

/// Inodes whose last change's epoch is kept (then all are forgotten at once, [`Inner::floor`]
/// moving up): a few hundred KiB.
const SINCE_KEPT: usize = 16_384;

/// Directories remembered as listed lately.
const LATELY_KEPT: usize = 64;

/// The inodes whose change ends page `key` of `entries`: the directory and what it lists
/// (not `..`: its attributes are taken when answered).
fn page_inos(key: &PageKey, entries: &[DirEntry]) -> impl Iterator<Item = Ino> {
    std::iter::once(key.dir).chain(
        entries
            .iter()
            .filter(|e| e.name != b"..")
            .map(|e| e.ino)
            .collect::<Vec<_>>(),
    )
}

impl Pages {
    fn clear(&mut self) {
        *self = Pages::default();
    }

    fn remove(&mut self, key: &PageKey) {
        let Some(entries) = self.map.remove(key) else {
            return;
        };
        self.entries -= entries.len();
        for ino in page_inos(key, &entries) {
            if let Some(keys) = self.by_ino.get_mut(&ino) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.by_ino.remove(&ino);
                }
            }
        }
    }

    fn insert(&mut self, key: PageKey, entries: Vec<DirEntry>) {
        self.remove(&key);
        while self.map.len() >= PAGES_KEPT || self.entries + entries.len() > PAGES_ENTRIES_KEPT {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.remove(&old);
        }
        for ino in page_inos(&key, &entries) {
            let keys = self.by_ino.entry(ino).or_default();
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        self.entries += entries.len();
        self.map.insert(key, entries);
        self.order.push_back(key);
        if self.order.len() > 2 * PAGES_KEPT {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
    }

    /// A change of `ino` ends the pages it touches.
    fn touched(&mut self, ino: Ino) {
        if let Some(keys) = self.by_ino.remove(&ino) {
            for k in keys {
                self.remove(&k);
            }
        }
    }
}

impl Fact {
    /// The inodes whose change makes this fact uncertain (see [`Inner::unchanged`]).
    fn keys(&self) -> [Option<Ino>; 2] {
        match self {
            Fact::NoXattr(i, _) => [Some(*i), None],
            other => other.touches(),
        }
    }

    /// The inodes whose pages this fact ends.
    fn touches(&self) -> [Option<Ino>; 2] {
        match self {
            Fact::Attr(a) => [Some(a.ino), None],
            Fact::Stale(i) | Fact::Gone(i) | Fact::NewDir(i) => [Some(*i), None],
            Fact::Name(p, _, i) => [Some(*p), *i],
            Fact::NameStale(p, _) => [Some(*p), None],
            Fact::NoXattr(..) => [None, None],
        }
    }
}

pub struct Cache {
    inner: Mutex<Inner>,
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new(DEFAULT_ENTRIES)
    }
}

impl Cache {
    /// An empty cache, off, of up to `limit` entries.
    pub fn new(limit: usize) -> Cache {
        Cache {
            inner: Mutex::new(Inner {
                on: false,
                epoch: 0,
                since: HashMap::new(),
                floor: 0,
                nodes: LruCache::unbounded(),
                weight: 0,
                limit: limit.max(1),
                pages: Pages::default(),
            }),
        }
    }

    /// Turns answering from memory on or off; what was known is forgotten either way.
    pub fn set_on(&self, on: bool) {
        self.inner.lock().set_on(on);
    }

    /// Forgets everything (a change of unknown extent: a repair, a dead session cleaned up,
    /// a lost group of writes).
    pub fn clear(&self) {
        self.inner.lock().clear();
    }

    /// The epoch to pass to [`Cache::fill`] or [`Cache::learn`], taken before reading or
    /// writing (`None`: off).
    #[cfg(test)]
    pub fn epoch(&self) -> Option<u64> {
        let c = self.inner.lock();
        c.on.then_some(c.epoch)
    }

    /// [`Cache::set_on`], then the epoch to pass to [`Cache::fill`] or [`Cache::learn`]
    /// (`None`: off), taken before reading or writing; under one lock (once per operation).
    pub fn begin(&self, on: bool) -> Option<u64> {
        let mut c = self.inner.lock();
        c.set_on(on);
        c.on.then_some(c.epoch)
    }

    /// An inode's attributes, if known.
    pub fn attr(&self, ino: Ino) -> Option<Attr> {
        let mut c = self.inner.lock();
        if !c.on {
            return None;
        }
        c.nodes.get(&ino)?.attr.clone()
    }

    /// What `name` in `parent` names, if known: `Some(None)`, nothing.
    pub fn name(&self, parent: Ino, name: &[u8]) -> Option<Option<Ino>> {
        let mut c = self.inner.lock();
        if !c.on {
            return None;
        }
        let n = c.nodes.get(&parent)?;
        match n.names.get(name) {
            Some(v) => Some(*v),
            None if n.complete => Some(None),
            None => None,
        }
    }

    /// An extended attribute, if known: `Some(None)`, absent.
    pub fn xattr(&self, ino: Ino, name: &[u8]) -> Option<Option<Vec<u8>>> {
        let mut c = self.inner.lock();
        if !c.on {
            return None;
        }
        let n = c.nodes.get(&ino)?;
        let (_, v) = n.xattrs.iter().find(|(k, _)| &**k == name)?;
        Some(v.as_ref().map(|v| v.to_vec()))
    }

    /// A page of a listing, if kept (nothing touched it since it was read), with its `..`
    /// entry's attributes as known now.
    pub fn page(&self, key: PageKey) -> Option<Vec<DirEntry>> {
        let mut c = self.inner.lock();
        if !c.on {
            return None;
        }
        let mut page = c.pages.map.get(&key)?.clone();
        for e in page
            .iter_mut()
            .filter(|e| e.name == b".." && e.attr.is_some())
        {
            e.attr = Some(c.nodes.get(&e.ino)?.attr.clone()?);
        }
        Some(page)
    }

    /// Notes that directory `dir` was listed (its first page).
    pub fn listed(&self, dir: Ino) {
        let mut c = self.inner.lock();
        let l = &mut c.pages.lately;
        l.retain(|d| *d != dir);
        if l.len() == LATELY_KEPT {
            l.pop_front();
        }
        l.push_back(dir);
    }

    /// Whether directory `dir` was listed lately (see [`Cache::listed`]).
    pub fn listed_lately(&self, dir: Ino) -> bool {
        self.inner.lock().pages.lately.contains(&dir)
    }

    /// The cookie of inode `ino`'s entry in a page kept of directory `dir`, if any.
    pub fn cookie_in(&self, dir: Ino, ino: Ino) -> Option<u64> {
        let c = self.inner.lock();
        c.pages
            .map
            .iter()
            .filter(|(k, _)| k.dir == dir)
            .find_map(|(_, v)| {
                v.iter()
                    .find(|e| e.ino == ino && e.name != b"." && e.name != b"..")
                    .map(|e| e.cookie)
            })
    }

    /// Keeps a page of a listing, unless anything changed since `epoch` was taken (before
    /// the read).
    pub fn fill_page(&self, epoch: Option<u64>, key: PageKey, entries: &[DirEntry]) {
        let mut c = self.inner.lock();
        if !c.on || entries.len() > PAGE_ENTRIES_KEPT {
            return;
        }
        if !page_inos(&key, entries).all(|i| c.unchanged(epoch, i)) {
            return;
        }
        c.pages.insert(key, entries.to_vec());
    }

    /// Records what a read found, unless anything changed since `epoch` was taken.
    pub fn fill(&self, epoch: Option<u64>, facts: &[Fact]) {
        let mut c = self.inner.lock();
        let unchanged = facts
            .iter()
            .flat_map(|f| f.keys())
            .flatten()
            .all(|i| c.unchanged(epoch, i));
        if c.on && unchanged {
            for f in facts {
                c.apply(f);
            }
            c.shrink();
        }
    }

    /// Records what a write of this client made true. If anything else changed since
    /// `epoch` was taken (before the write), the order of the two is not known here: what
    /// the write touched is forgotten instead.
    pub fn learn(&self, epoch: Option<u64>, facts: &[Fact]) {
        let mut c = self.inner.lock();
        if !c.on {
            return;
        }
        let exact: Vec<bool> = facts
            .iter()
            .map(|f| {
                f.keys()
                    .into_iter()
                    .flatten()
                    .all(|i| c.unchanged(epoch, i))
            })
            .collect();
        // Every read or write of this client begun before it is taken as overlapping it (what
        // a write changed is not always all in its facts), as every change was before.
        c.epoch += 1;
        c.floor = c.epoch;
        for (f, exact) in facts.iter().zip(exact) {
            for ino in f.touches().into_iter().flatten() {
                c.pages.touched(ino);
            }
            if exact {
                c.apply(f);
            } else {
                c.apply(&f.unknown());
            }
        }
        c.shrink();
    }

    /// Another client's change, pushed: what it touched is forgotten.
    pub fn changed(&self, change: &Change) {
        let mut c = self.inner.lock();
        match change {
            Change::Inode { ino, .. } => {
                c.bump([*ino]);
                c.pages.touched(*ino);
                c.apply(&Fact::Stale(*ino))
            }
            Change::Entry { parent, name } => {
                c.bump([*parent]);
                c.pages.touched(*parent);
                c.apply(&Fact::NameStale(*parent, name.clone()))
            }
            // Changes may have been missed: no page is certain, nor any read begun.
            Change::Up | Change::Down => {
                c.forget_changes();
                c.pages.clear()
            }
        }
    }
}

impl Fact {
    /// The same fact with its new value unknown.
    fn unknown(&self) -> Fact {
        match self {
            Fact::Attr(a) => Fact::Stale(a.ino),
            Fact::Name(p, n, _) => Fact::NameStale(*p, n.clone()),
            Fact::NewDir(ino) | Fact::NoXattr(ino, _) => Fact::Stale(*ino),
            other => other.clone(),
        }
    }
}

impl Inner {
    fn set_on(&mut self, on: bool) {
        if self.on != on {
            self.clear();
            self.on = on;
        }
    }

    fn clear(&mut self) {
        self.nodes.clear();
        self.pages.clear();
        self.weight = 0;
        self.forget_changes();
    }

    /// Moves the epoch: another client changed `inos` now.
    fn bump(&mut self, inos: impl IntoIterator<Item = Ino>) {
        self.epoch += 1;
        for i in inos {
            self.since.insert(i, self.epoch);
        }
        if self.since.len() > SINCE_KEPT {
            self.forget_changes();
        }
    }

    /// Moves the epoch, every read and write begun before it taken as overlapping every
    /// change.
    fn forget_changes(&mut self) {
        self.epoch += 1;
        self.floor = self.epoch;
        self.since.clear();
    }

    /// Whether `ino` is unchanged since `epoch` was taken (`None`: the cache was off).
    fn unchanged(&self, epoch: Option<u64>, ino: Ino) -> bool {
        epoch.is_some_and(|e| e >= self.floor && self.since.get(&ino).is_none_or(|&t| t <= e))
    }

    /// Changes the node of `ino` (made if missing and `make`), keeping the weight.
    fn node(&mut self, ino: Ino, make: bool, f: impl FnOnce(&mut Node)) {
        let before = match self.nodes.get_mut(&ino) {
            Some(n) => n.weight(),
            None if make => {
                self.nodes.put(ino, Node::default());
                0
            }
            None => return,
        };
        let n = self.nodes.get_mut(&ino).expect("just found or put");
        f(n);
        let after = n.weight();
        self.weight = self.weight + after - before;
    }

    fn forget(&mut self, ino: Ino) {
        if let Some(n) = self.nodes.pop(&ino) {
            self.weight -= n.weight();
        }
    }

    fn apply(&mut self, f: &Fact) {
        match f {
            Fact::Attr(a) => self.node(a.ino, true, |n| n.attr = Some(a.clone())),
            Fact::Stale(ino) => self.node(*ino, false, |n| {
                n.attr = None;
                n.xattrs.clear();
            }),
            Fact::Gone(ino) => self.forget(*ino),
            Fact::Name(p, name, ino) => {
                let (name, ino) = (name.as_slice(), *ino);
                // A huge directory keeps a share of the names, not all: past it, the
                // directory is no longer complete and further names are not kept (rather
                // than the whole directory going at once, its attributes with it).
                let most = self.limit / 4;
                self.node(*p, true, |n| {
                    if n.names.len() < most || n.names.contains_key(name) {
                        n.names.insert(name.into(), ino);
                    } else {
                        n.complete = false;
                    }
                })
            }
            Fact::NameStale(p, name) => self.node(*p, false, |n| {
                n.names.remove(name.as_slice());
                n.complete = false;
            }),
            Fact::NewDir(ino) => self.node(*ino, true, |n| n.complete = n.names.is_empty()),
            Fact::NoXattr(ino, name) => self.node(*ino, false, |n| set_xattr(n, name, None)),
        }
    }

    /// Drops the least recently used nodes while over the limit.
    fn shrink(&mut self) {
        while self.weight > self.limit {
            match self.nodes.pop_lru() {
                Some((_, n)) => self.weight -= n.weight(),
                None => break,
            }
        }
    }
}

fn set_xattr(n: &mut Node, name: &[u8], v: Option<&[u8]>) {
    if v.is_some_and(|v| v.len() > MAX_XATTR_KEPT) {
        n.xattrs.retain(|(k, _)| &**k != name);
        return;
    }
    let v = v.map(Box::from);
    match n.xattrs.iter_mut().find(|(k, _)| &**k == name) {
        Some(slot) => slot.1 = v,
        None => n.xattrs.push((name.into(), v)),
    }
}

impl Cache {
    /// Records an extended attribute read (`None`: absent), unless anything changed since
    /// `epoch`.
    pub fn fill_xattr(&self, epoch: Option<u64>, ino: Ino, name: &[u8], v: Option<&[u8]>) {
        let mut c = self.inner.lock();
        if c.on && c.unchanged(epoch, ino) {
            c.node(ino, true, |n| set_xattr(n, name, v));
            c.shrink();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Kind;

    fn attr(ino: Ino, mtime: i64) -> Attr {
        Attr {
            ino,
            kind: Kind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            length: 0,
            rdev: 0,
            atime: 0,
            mtime,
            ctime: mtime,
            parent: 1,
            flags: 0,
            stored: 0,
        }
    }

    #[test]
    fn off_answers_nothing_and_keeps_nothing() {
        let c = Cache::new(100);
        c.learn(c.epoch(), &[Fact::Attr(attr(5, 1))]);
        assert!(c.attr(5).is_none());
        c.set_on(true);
        assert!(c.attr(5).is_none());
        c.learn(c.epoch(), &[Fact::Attr(attr(5, 1))]);
        assert_eq!(c.attr(5).unwrap().mtime, 1);
        c.set_on(false);
        c.set_on(true);
        assert!(c.attr(5).is_none(), "turning off forgets");
    }

    #[test]
    fn a_read_that_overlapped_a_change_is_not_kept() {
        let c = Cache::new(100);
        c.set_on(true);
        let before = c.epoch();
        c.learn(c.epoch(), &[Fact::Attr(attr(5, 2))]);
        c.fill(before, &[Fact::Attr(attr(5, 1))]);
        assert_eq!(c.attr(5).unwrap().mtime, 2);
        c.changed(&Change::Inode {
            ino: 5,
            data: false,
        });
        c.fill(before, &[Fact::Attr(attr(5, 1))]);
        assert!(c.attr(5).is_none());
    }

    #[test]
    fn another_clients_change_counts_only_for_what_it_names() {
        let c = Cache::new(100);
        c.set_on(true);
        let e = c.epoch();
        // Pushed while this client wrote and read: of other inodes, then of its own.
        c.changed(&Change::Inode {
            ino: 8,
            data: false,
        });
        c.changed(&Change::Entry {
            parent: 9,
            name: b"x".to_vec(),
        });
        c.learn(e, &[Fact::Attr(attr(5, 2)), Fact::NewDir(5)]);
        assert_eq!(
            c.attr(5).unwrap().mtime,
            2,
            "an unrelated change made it forget"
        );
        assert_eq!(
            c.name(5, b"new"),
            Some(None),
            "a directory made here is complete"
        );
        let e = c.epoch();
        c.changed(&Change::Entry {
            parent: 5,
            name: b"y".to_vec(),
        });
        c.fill(e, &[Fact::Name(5, b"y".to_vec(), None)]);
        assert_eq!(
            c.name(5, b"y"),
            None,
            "a read overlapping a change of it was kept"
        );
        c.fill(e, &[Fact::Attr(attr(6, 1))]);
        assert_eq!(c.attr(6).unwrap().mtime, 1);
        c.changed(&Change::Inode {
            ino: 6,
            data: false,
        });
        c.fill(e, &[Fact::Attr(attr(6, 1))]);
        assert!(
            c.attr(6).is_none(),
            "a read overlapping a change of it was kept"
        );
        // Changes possibly missed: nothing read before is kept.
        let e = c.epoch();
        c.changed(&Change::Up);
        c.fill(e, &[Fact::Attr(attr(7, 1))]);
        assert!(c.attr(7).is_none());
    }

    #[test]
    fn overlapping_writes_forget_what_they_touched() {
        let c = Cache::new(100);
        c.set_on(true);
        let (a, b) = (c.epoch(), c.epoch());
        c.learn(b, &[Fact::Attr(attr(5, 2))]);
        c.learn(a, &[Fact::Attr(attr(5, 1))]);
        assert!(c.attr(5).is_none());
    }

    fn page(name: &[u8], cookie: u64) -> DirEntry {
        DirEntry {
            name: name.to_vec(),
            ino: 9,
            kind: Kind::File,
            cookie,
            attr: None,
        }
    }

    #[test]
    fn a_page_of_a_listing_lasts_until_a_change_touches_it() {
        let c = Cache::new(100);
        let key = PageKey {
            dir: 7,
            cookie: 0,
            limit: 100,
            plus: true,
        };
        let e = c.epoch();
        c.fill_page(e, key, &[page(b"a", 3)]);
        assert!(c.page(key).is_none(), "off keeps nothing");
        c.set_on(true);
        let e = c.epoch();
        c.fill_page(e, key, &[page(b"a", 3)]);
        assert_eq!(c.page(key).unwrap()[0].name, b"a");
        assert!(c.page(PageKey { plus: false, ..key }).is_none());
        assert!(c.page(PageKey { cookie: 3, ..key }).is_none());
        // A change of something else leaves it; of the directory, or of an inode it
        // lists (here 9), ends it: a write of this client or a pushed change.
        c.learn(c.epoch(), &[Fact::Attr(attr(5, 1))]);
        assert!(c.page(key).is_some(), "another inode's change");
        c.changed(&Change::Entry {
            parent: 1,
            name: b"x".to_vec(),
        });
        assert!(c.page(key).is_some(), "another directory's entry");
        c.learn(c.epoch(), &[Fact::Attr(attr(9, 1))]);
        assert!(c.page(key).is_none(), "a listed inode's change");
        c.fill_page(c.epoch(), key, &[page(b"b", 3)]);
        c.learn(c.epoch(), &[Fact::Name(7, b"new".to_vec(), Some(11))]);
        assert!(c.page(key).is_none(), "a name made in the directory");
        c.fill_page(c.epoch(), key, &[page(b"b", 3)]);
        c.changed(&Change::Entry {
            parent: 7,
            name: b"x".to_vec(),
        });
        assert!(
            c.page(key).is_none(),
            "another client's entry in the directory"
        );
        c.fill_page(c.epoch(), key, &[page(b"b", 3)]);
        c.changed(&Change::Inode { ino: 9, data: true });
        assert!(
            c.page(key).is_none(),
            "another client's change of a listed inode"
        );
        c.fill_page(c.epoch(), key, &[page(b"b", 3)]);
        c.changed(&Change::Down);
        assert!(c.page(key).is_none(), "changes maybe missed");
        // A read that overlapped a change is not kept.
        let before = c.epoch();
        c.learn(c.epoch(), &[Fact::Attr(attr(5, 2))]);
        c.fill_page(before, key, &[page(b"c", 3)]);
        assert!(c.page(key).is_none());
        // `..` is answered with its attributes as known now, or not at all.
        let dotdot = DirEntry {
            name: b"..".to_vec(),
            ino: 4,
            kind: Kind::Dir,
            cookie: 2,
            attr: Some(attr(4, 1)),
        };
        c.fill_page(c.epoch(), key, &[dotdot.clone(), page(b"d", 3)]);
        assert!(c.page(key).is_none(), "the parent's attributes unknown");
        c.learn(c.epoch(), &[Fact::Attr(attr(4, 2))]);
        let got = c
            .page(key)
            .expect("the parent's change does not end the page");
        assert_eq!(got[0].attr.as_ref().unwrap().mtime, 2);
        // Bounded: the oldest go first.
        let e = c.epoch();
        for d in 0..=PAGES_KEPT as u64 {
            c.fill_page(
                e,
                PageKey {
                    dir: 1000 + d,
                    ..key
                },
                &[page(b"d", 3)],
            );
        }
        assert!(c.page(PageKey { dir: 1000, ..key }).is_none());
        assert!(c.page(PageKey { dir: 1001, ..key }).is_some());
        let inner = c.inner.lock();
        assert!(inner.pages.map.len() <= PAGES_KEPT);
        assert!(inner.pages.order.len() <= 2 * PAGES_KEPT + 1);
        assert!(inner.pages.entries <= PAGES_ENTRIES_KEPT);
    }

    #[test]
    fn a_complete_directory_answers_absent_names() {
        let c = Cache::new(100);
        c.set_on(true);
        assert_eq!(c.name(7, b"x"), None);
        c.learn(c.epoch(), &[Fact::NewDir(7)]);
        assert_eq!(c.name(7, b"x"), Some(None));
        c.learn(c.epoch(), &[Fact::Name(7, b"x".to_vec(), Some(9))]);
        assert_eq!(c.name(7, b"x"), Some(Some(9)));
        assert_eq!(c.name(7, b"y"), Some(None));
        c.changed(&Change::Entry {
            parent: 7,
            name: b"y".to_vec(),
        });
        assert_eq!(c.name(7, b"y"), None, "a pushed change ends completeness");
        assert_eq!(c.name(7, b"x"), Some(Some(9)));
    }

    #[test]
    fn the_least_recently_used_go_past_the_limit() {
        let c = Cache::new(10);
        c.set_on(true);
        for i in 1..=20 {
            c.learn(c.epoch(), &[Fact::Attr(attr(i, 1))]);
        }
        assert!(c.attr(1).is_none());
        assert!(c.attr(20).is_some());
        assert!(c.inner.lock().weight <= 10);
        c.learn(c.epoch(), &[Fact::Gone(20)]);
        assert!(c.attr(20).is_none());
    }

    #[test]
    fn a_huge_directory_keeps_a_share_of_its_names_and_stops_being_complete() {
        let c = Cache::new(40);
        c.set_on(true);
        c.learn(c.epoch(), &[Fact::Attr(attr(7, 1)), Fact::NewDir(7)]);
        for i in 0..20u64 {
            c.learn(
                c.epoch(),
                &[Fact::Name(7, i.to_string().into_bytes(), Some(100 + i))],
            );
        }
        assert_eq!(c.name(7, b"3"), Some(Some(103)));
        assert_eq!(c.name(7, b"19"), None, "not kept past the share");
        assert_eq!(c.name(7, b"absent"), None, "no longer complete");
        assert!(c.attr(7).is_some(), "the directory itself stays");
    }

    #[test]
    fn xattrs_known_absent_and_present() {
        let c = Cache::new(100);
        c.set_on(true);
        c.learn(
            c.epoch(),
            &[
                Fact::Attr(attr(5, 1)),
                Fact::NoXattr(5, b"security.capability"),
            ],
        );
        assert_eq!(c.xattr(5, b"security.capability"), Some(None));
        assert_eq!(c.xattr(5, b"user.x"), None);
        c.fill_xattr(c.epoch(), 5, b"user.x", Some(b"v"));
        assert_eq!(c.xattr(5, b"user.x"), Some(Some(b"v".to_vec())));
        c.learn(c.epoch(), &[Fact::Stale(5)]);
        assert_eq!(c.xattr(5, b"user.x"), None);
    }
}
