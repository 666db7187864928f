//! What this client last knew of inodes its own transactions locked, as their commits left
//! them, so that a later transaction may take an inode as if it had read it under its lock,
//! and check in its first statement, with the lock, that it still stands ("optimistic
//! locking"). A create in a directory this client created or changed last is then one round
//! trip: BEGIN, the lock and its check, the inserts and COMMIT in one message. If another
//! client changed the inode meanwhile, the check fails the transaction (a division by zero:
//! nothing was changed) and it runs again the ordinary way, reading under its lock first.
//!
//! Correctness rests on the check alone: it compares every column the transaction reads of
//! each inode, and whether it has a default ACL. What is kept here may be stale or wrong; a
//! wrong guess costs a round trip, never a wrong answer. So learning is cautious but need not
//! be complete: a transaction that ran a statement on inodes this module does not recognize
//! teaches nothing.
//!
//! Entries are known the same way (a name's entry id and inode, learned when this client
//! created or locked it), so that an unlink or rmdir of a name whose entry and inode are
//! known is one round trip too: the check then also says that the entry still names the
//! inode, that a directory to remove is empty, and that the trash names looked up are free.
//!
//! Not for: the attributes the kernel is told (`meta::cache`), other rows.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::Mutex;

use crate::meta::engine::{Val, node_cols, node_vals};
use crate::meta::{Attr, Ino};

/// Inodes known at most (an inode's row is about 150 bytes here).
const CAPACITY: usize = 4096;

/// How long an inode whose check failed (another client changes it too) is read under its
/// lock first again, instead of guessed.
const COOL: Duration = Duration::from_secs(1);

/// An inode as this client's last commit that locked it left it, and whether it has no
/// default ACL.
pub(super) type State = (Attr, bool);

/// Whether inode `n.ino` has a default ACL (what a create in it reads): a column of the
/// statement that locks inodes, and of the one that checks a guess of them.
macro_rules! has_default_acl {
    () => {
        "EXISTS (SELECT 1 FROM unkai_xattr x WHERE x.ino = n.ino AND x.name = \
         'system.posix_acl_default'::bytea)"
    };
}
pub(super) use has_default_acl;

/// An entry by its directory and name.
type Name = (Ino, Vec<u8>);

/// An entry's id and inode.
pub(super) type Edge = (i64, Ino);

/// The inodes known, and those found changed by other clients lately.
pub(super) struct Known {
    map: Mutex<LruCache<Ino, State>>,
    /// Entries: (directory, name) → (entry id, inode).
    edges: Mutex<LruCache<Name, Edge>>,
    cold: Mutex<LruCache<Ino, Instant>>,
    /// Off with `UNKAI_PG_OPTIMISTIC=0` (to measure what it saves).
    on: bool,
}

impl Default for Known {
    fn default() -> Self {
        Known::new(true)
    }
}

impl Known {
    /// Guessing on (`on`, the default) or off (`UNKAI_PG_OPTIMISTIC=0`, see `Knobs`).
    pub(super) fn new(on: bool) -> Known {
        let cap = NonZeroUsize::new(CAPACITY).expect("a capacity");
        Known {
            map: Mutex::new(LruCache::new(cap)),
            edges: Mutex::new(LruCache::new(cap)),
            cold: Mutex::new(LruCache::new(cap)),
            on,
        }
    }
}

impl Known {
    /// The states of `inos` (sorted, distinct), if every one is known and none was found
    /// changed by another client lately.
    pub(super) fn guess(&self, inos: &[Ino]) -> Option<Vec<State>> {
        if !self.on || inos.is_empty() {
            return None;
        }
        {
            let mut cold = self.cold.lock();
            for i in inos {
                match cold.peek(i) {
                    Some(t) if t.elapsed() < COOL => return None,
                    Some(_) => {
                        cold.pop(i);
                    }
                    None => {}
                }
            }
        }
        let mut map = self.map.lock();
        inos.iter().map(|i| map.get(i).cloned()).collect()
    }

    /// The entry `name` of `parent` (its id and inode), if known.
    pub(super) fn entry(&self, parent: Ino, name: &[u8]) -> Option<Edge> {
        if !self.on {
            return None;
        }
        self.edges.lock().get(&(parent, name.to_vec())).copied()
    }

    /// What a committed transaction learned.
    pub(super) fn learn(&self, l: Learned) {
        if !l.edges.is_empty() {
            let mut edges = self.edges.lock();
            for (k, v) in l.edges {
                match v {
                    Some(v) => edges.put(k, v),
                    None => edges.pop(&k),
                };
            }
        }
        let mut map = self.map.lock();
        for i in &l.gone {
            map.pop(i);
        }
        if l.unsure {
            for i in l.nodes.keys() {
                map.pop(i);
            }
            return;
        }
        for (ino, (a, no_acl)) in l.nodes {
            // Whether it has a default ACL, where not read: guessed none (the check says).
            map.put(ino, (a, no_acl.unwrap_or(true)));
        }
    }

    /// The entry `name` of `parent` was guessed wrong.
    pub(super) fn stale_entry(&self, parent: Ino, name: &[u8]) {
        self.edges.lock().pop(&(parent, name.to_vec()));
    }

    /// `inos` were guessed wrong: another client changed one of them.
    pub(super) fn stale(&self, inos: &[Ino]) {
        let mut map = self.map.lock();
        let mut cold = self.cold.lock();
        for i in inos {
            map.pop(i);
            cold.put(*i, Instant::now());
        }
    }
}

/// What one transaction learned of inodes, for [`Known::learn`] once it committed.
#[derive(Default)]
pub(super) struct Learned {
    /// Inodes as the transaction leaves them (and whether they have no default ACL, where
    /// read).
    nodes: HashMap<Ino, (Attr, Option<bool>)>,
    /// Inodes it deleted.
    gone: Vec<Ino>,
    /// Entries it found or made (Some) or removed (None).
    edges: Vec<(Name, Option<Edge>)>,
    /// It ran a statement on inodes whose effect is not recorded here.
    unsure: bool,
}

impl Learned {
    /// Inodes as the transaction leaves them, and whether they have no default ACL where
    /// read.
    pub(super) fn nodes(&self) -> impl Iterator<Item = (&Attr, Option<bool>)> {
        self.nodes.values().map(|(a, n)| (a, *n))
    }

    /// Inodes it deleted.
    pub(super) fn gone(&self) -> &[Ino] {
        &self.gone
    }

    /// Entries it found or made (Some) or removed (None), in order.
    pub(super) fn edges(&self) -> impl Iterator<Item = (Ino, &[u8], Option<Edge>)> {
        self.edges.iter().map(|((p, n), e)| (*p, n.as_slice(), *e))
    }

    /// Whether it ran a statement on inodes whose effect is not recorded.
    pub(super) fn unsure(&self) -> bool {
        self.unsure
    }

    /// `a` read under the transaction's lock, with whether it has no default ACL.
    pub(super) fn read(&mut self, a: &Attr, no_acl: bool) {
        self.nodes.insert(a.ino, (a.clone(), Some(no_acl)));
    }

    /// `a` written by the transaction (whole).
    pub(super) fn wrote(&mut self, a: &Attr) {
        let acl = self.nodes.get(&a.ino).and_then(|(_, n)| *n);
        self.nodes.insert(a.ino, (a.clone(), acl));
    }

    /// The entry `name` of `parent` is `id`, of inode `ino` (None: it is gone).
    pub(super) fn entry(&mut self, parent: Ino, name: &[u8], e: Option<Edge>) {
        self.edges.push(((parent, name.to_vec()), e));
    }

    /// `ino`'s rows deleted.
    pub(super) fn deleted(&mut self, ino: Ino) {
        self.nodes.remove(&ino);
        self.gone.push(ino);
    }

    /// Notes a statement the transaction runs: one that changes inodes or xattrs other than
    /// through the statements whose effects are recorded (`recorded`) makes it unsure (what
    /// it learned of inodes is dropped: likely stale).
    pub(super) fn note(&mut self, sql: &str, recorded: &[&str]) {
        if self.unsure || recorded.contains(&sql) {
            return;
        }
        // (Xattrs need not: whether an inode has a default ACL is checked with every guess.)
        let writes = [
            "UPDATE unkai_node",
            "DELETE FROM unkai_node",
            "INSERT INTO unkai_node",
        ]
        .iter()
        .any(|w| sql.contains(w));
        if writes {
            self.unsure = true;
        }
    }
}

/// The statement that locks `states`' inodes (in inode order) and fails (a division by
/// zero) unless each still is as guessed; of those in `loose`, only that they still have
/// links (the trash's hour directory: every client deletes into it, so its times and link
/// count change under other clients' deletions, and a deletion reads nothing else of it and
/// changes it in place, `Txn::touch_dir`). Integers and booleans only: no quoting.
pub(super) fn guard_sql(states: &[State], loose: &[Ino]) -> String {
    let rows: Vec<String> = states
        .iter()
        .filter(|(a, _)| !loose.contains(&a.ino))
        .map(|(a, no_acl)| {
            let cols: Vec<String> = node_vals(a)
                .iter()
                .map(|v| match v {
                    Val::Int(i) => i.to_string(),
                    _ => unreachable!("an inode's columns are integers"),
                })
                .collect();
            format!("({}, {})", cols.join(", "), !no_acl)
        })
        .collect();
    let ino = |a: &Attr| (a.ino as i64).to_string();
    let strict = format!(
        concat!("(", node_cols!(), ", ", has_default_acl!(), ") IN ({})"),
        rows.join(", ")
    );
    let loose_inos: Vec<String> = states
        .iter()
        .filter(|(a, _)| loose.contains(&a.ino))
        .map(|(a, _)| ino(a))
        .collect();
    let strict_inos: Vec<String> = states
        .iter()
        .filter(|(a, _)| !loose.contains(&a.ino))
        .map(|(a, _)| ino(a))
        .collect();
    let mut sql = String::new();
    if !strict_inos.is_empty() {
        sql.push_str(&format!(
            "; SELECT 1 / (count(*) FILTER (WHERE s.ok) = {n})::int FROM (SELECT {strict} AS ok \
             FROM unkai_node n WHERE n.ino IN ({inos}) ORDER BY n.ino FOR UPDATE) s",
            n = strict_inos.len(),
            inos = strict_inos.join(", ")
        ));
    }
    // Shared: the deletion changes them in place (`Txn::touch_dir`), when it commits.
    if !loose_inos.is_empty() {
        sql.push_str(&format!(
            "; SELECT 1 / (count(*) FILTER (WHERE s.ok) = {n})::int FROM (SELECT n.nlink > 0 AS ok \
             FROM unkai_node n WHERE n.ino IN ({inos}) ORDER BY n.ino FOR KEY SHARE) s",
            n = loose_inos.len(),
            inos = loose_inos.join(", ")
        ));
    }
    sql
}

/// Fails (a division by zero) if inode `ino` has an access ACL.
pub(super) fn no_access_acl_sql(ino: Ino) -> String {
    format!(
        "; SELECT 1 / (NOT EXISTS (SELECT 1 FROM unkai_xattr WHERE ino = {} AND name = \
         'system.posix_acl_access'::bytea))::int",
        ino as i64
    )
}

/// The hex of `b` (names go as hex in statements built here: no quoting).
pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|c| format!("{c:02x}")).collect()
}

/// Fails (a division by zero) unless entry `id` is `name` of `parent` and names `ino`.
pub(super) fn entry_guard_sql(parent: Ino, name: &[u8], id: i64, ino: Ino) -> String {
    format!(
        "; SELECT 1 / (EXISTS (SELECT 1 FROM unkai_edge WHERE id = {id} AND parent = {} AND \
         name = decode('{}', 'hex') AND ino = {}))::int",
        parent as i64,
        hex(name),
        ino as i64
    )
}

/// Fails (a division by zero) unless directory `dir` has no entries.
pub(super) fn empty_guard_sql(dir: Ino) -> String {
    format!(
        "; SELECT 1 / (NOT EXISTS (SELECT 1 FROM unkai_edge WHERE parent = {}))::int",
        dir as i64
    )
}

/// Fails (a division by zero) unless `parent` has no entry `name`.
pub(super) fn absent_guard_sql(parent: Ino, name: &[u8]) -> String {
    format!(
        "; SELECT 1 / (NOT EXISTS (SELECT 1 FROM unkai_edge WHERE parent = {} AND name = \
         decode('{}', 'hex')))::int",
        parent as i64,
        hex(name)
    )
}
