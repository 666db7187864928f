//! Group commit on PostgreSQL: this client's namespace and attribute changes share one open
//! transaction, and those whose answer is certain from what the group holds are answered
//! without waiting for the server.
//!
//! A group is a transaction left open on a connection of its own. It holds locked every
//! inode row its changes locked or made (a row another transaction inserted and has not
//! committed is invisible to others; one locked `FOR UPDATE` cannot be changed by them). So
//! while it is open, what this client knows of those rows is what every other client will
//! find, and a change that touches only them is decided here: a create in a directory made
//! in the group, or read whole with its lock by the create that opened the group (every
//! entry of it is known: "complete"), cannot find its name taken unless this client took
//! it; a chown of a file made in the group cannot meet another client's change. Such a
//! change is answered at once and its statements are held back, sent with the
//! group's next message ("joined"). Any change that needs an answer from the server runs the
//! ordinary way, after the group has committed ("no lock is held while waiting": nothing of
//! the group can then be undone by a deadlock of it), except a deletion into the trash and
//! a contained create (no quota kept, no inode limit) in a directory the group does not
//! hold: each runs inside the group, under a savepoint, its locks taken without waiting
//! (`NOWAIT`: a row another client holds sends it the ordinary way), and leaves the group
//! holding its directory whole, so that the deletions or creates after it there join. The
//! trash's hour directory, where every client's deletions go, is held only under a shared
//! lock, and its times and links are changed at the commit.
//!
//! A group commits (lazily: no WAL flush waited for) [`MAX_AGE`] after it opened, after
//! [`MAX_OPS`] changes, before a change that cannot join, before a snapshot, at `sync`, at
//! unmount; a durable commit of file data on inodes it holds (close or fsync of a written
//! file) commits it with that data, waiting for the flush. After a commit made while changes
//! keep coming, the same message locks again the rows the group held that its last few
//! commits' changes wrote ([`KEEP_COMMITS`], more for directories; `SKIP LOCKED`: a row
//! another client is waiting for is left to it) and keeps those still as the group left
//! them, so that a `tar -x` keeps its directories from one close to the next. Another
//! client that wants such a row waits for the next commit, [`MAX_AGE`] at most.
//!
//! Reads of this client run inside the open group (they see it); other clients see it once
//! committed, and are told of its changes then (notifications wait for the commit). What a
//! crash of the client loses is the open group: changes no close, fsync or fsyncdir covered,
//! at most [`MAX_AGE`] old. A group whose commit fails (the connection lost, a server that
//! stopped) is said in the log with how many changes it held: they had been answered.
//!
//! Not for: what operations do (`ops`), the guesses of rows not held (`known`), connections
//! (`pool`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hashlink::LinkedHashMap;
use parking_lot::{Condvar, Mutex};

use super::known::{Learned, has_default_acl};
use super::pool::{Answer, Conn, P, Pool, Step};
use super::watch::Watch;
use super::{
    Held, Outcome, PRELOCK_COLUMNS, Shared, coalesce, commit_end, held_params, held_steps,
    merge_touches, row_attr, shared_sql, text_attr_at,
};
use crate::meta::engine::node_cols;
use crate::meta::{Attr, Change, Error, Ino, Kind, Result};

/// Changes a group takes at most before it commits.
pub(super) const MAX_OPS: usize = 128;

/// How long a group stays open at most (and so how long another client may wait for a row
/// it holds). `UNKAI_PG_GROUP_MS` sets another (tests that count round trips: on a loaded
/// machine more than this passes between one file's calls, and the group commits between
/// them).
pub(super) const MAX_AGE: Duration = Duration::from_millis(10);

/// Savepoints a group takes at most before it commits (each change run in it rather than
/// joined takes one, a subtransaction: past 64 in one transaction, PostgreSQL's snapshots
/// of every session overflow to a slower path while it stays open).
pub(super) const MAX_SAVEPOINTS: usize = 48;

/// Rows a group holds at most (the oldest are let go).
const MAX_OWNED: usize = 768;

/// Commits a held file's row is locked again after the last change that wrote it: a file
/// no change of the last [`KEEP_COMMITS`] groups wrote is let go at the next commit (a
/// directory after [`KEEP_DIR_COMMITS`]: the changes after it in a tree's walk come back to
/// it, and what the group knows of its entries goes with its row). Locking again every row
/// held (up to [`MAX_OWNED`]) at each commit cost the server a tuple lock per row and the
/// client the rows' text: at a `tar -x` 1 ms from the database, where each file's close
/// commits, half of each file's time (1.5-2.5 ms of 5) went to locking again 256 rows of
/// files closed and directories left long before.
const KEEP_COMMITS: u64 = 3;

/// See [`KEEP_COMMITS`].
const KEEP_DIR_COMMITS: u64 = 48;

/// Commits a row locked ahead of the changes (see [`Own::ahead`]) is locked again after it
/// was, while no change touches it: long enough for a walk on a loaded machine to come to
/// it, short of holding up to hundreds of rows no change will come to, a directory's whole
/// [`KEEP_DIR_COMMITS`].
const KEEP_AHEAD_COMMITS: u64 = 16;

/// Locks again the rows of the inodes in `$1` still free, as at a write's first statement
/// (see `PRELOCK_COLUMNS`).
const RELOCK: &str = concat!(
    "SELECT ",
    node_cols!(),
    ", ",
    has_default_acl!(),
    " FROM unkai_node n WHERE n.ino = ANY($1) ORDER BY n.ino FOR UPDATE SKIP LOCKED"
);

/// An inode row the group holds, as the group leaves it.
#[derive(Clone, Debug)]
pub(super) struct Own {
    pub(super) attr: Attr,
    /// It has no default ACL (certain).
    pub(super) no_dacl: bool,
    /// It has no access ACL (certain: made in the group without one).
    pub(super) no_acl: bool,
    /// The commit count ([`Track::commits`]) when a change last wrote or made it.
    pub(super) used: u64,
    /// Locked ahead of the changes (a deletion's read-ahead, see `Db::hold_listing`) and
    /// touched by none since: held again for [`KEEP_AHEAD_COMMITS`], a directory too.
    pub(super) ahead: bool,
}

/// What a group holds.
#[derive(Default)]
pub(super) struct Track {
    /// Rows held, oldest first.
    pub(super) owned: LinkedHashMap<Ino, Own>,
    /// Directories held whose every entry is known (made in the group, or read whole under
    /// the lock, and held since): name → inode.
    pub(super) complete: HashMap<Ino, HashMap<Vec<u8>, Ino>>,
    /// Inodes made since the group last committed: their last close commits it (as a
    /// close-to-open file system promises, another client opening one after that close
    /// finds it).
    pub(super) fresh: std::collections::HashSet<Ino>,
    /// Commits (with the rows locked again) since the group first opened.
    pub(super) commits: u64,
    /// Rows it holds under a shared lock (the trash's hour, see `shared_sql`), as read.
    pub(super) shared: HashMap<Ino, Attr>,
    /// The directory of the group's latest deletion (kept across commits): a deletion next
    /// in a subdirectory of it is `rm -rf` walking down (see `Reach::Around`).
    pub(super) last_deletion: Option<Ino>,
}

impl Track {
    /// Holds `o` (the newest), written or made by a change now.
    pub(super) fn own(&mut self, o: Own) {
        let o = Own {
            used: self.commits,
            ..o
        };
        self.keep(o);
    }

    /// Holds `o` as it was held (its `used` kept).
    fn keep(&mut self, o: Own) {
        let ino = o.attr.ino;
        self.owned.remove(&ino);
        self.owned.insert(ino, o);
        while self.owned.len() > MAX_OWNED {
            if let Some((i, _)) = self.owned.pop_front() {
                self.complete.remove(&i);
            }
        }
    }

    /// Whether `parent` certainly has no entry `name` (Some(false): certainly has one).
    pub(super) fn absent(&self, parent: Ino, name: &[u8]) -> Option<bool> {
        if !self.owned.contains_key(&parent) {
            return None;
        }
        self.complete.get(&parent).map(|m| !m.contains_key(name))
    }

    /// What a change that joined (or opened) the group leaves held: the rows it wrote or
    /// read under its locks, the inodes and entries it made (`made`: parent, name, inode,
    /// kind), without what it deleted. With `xattrs` (it wrote extended attributes), the
    /// inodes it made are not known to be without ACLs.
    /// Entries it removed leave the directories known whole; a directory it moved an entry
    /// into (`moved_into`: the trash's hour) is no longer known whole. Rows in `ahead` were
    /// only locked ahead of the changes to come (see [`Own::ahead`]).
    pub(super) fn apply(
        &mut self,
        l: &Learned,
        made: &[(Ino, Vec<u8>, Ino, Kind)],
        moved_into: &[Ino],
        xattrs: bool,
        ahead: &std::collections::HashSet<Ino>,
    ) {
        for i in l.gone() {
            self.owned.remove(i);
            self.complete.remove(i);
        }
        for d in moved_into {
            self.complete.remove(d);
        }
        for (p, n, e) in l.edges() {
            if e.is_none() {
                if let Some(m) = self.complete.get_mut(&p) {
                    m.remove(n);
                }
            }
        }
        for (p, n, i, _) in made {
            if let Some(m) = self.complete.get_mut(p) {
                m.insert(n.clone(), *i);
            }
            self.fresh.insert(*i);
        }
        for (a, dacl) in l.nodes() {
            let new = made.iter().find(|m| m.2 == a.ino);
            let o = match (self.owned.get(&a.ino), new) {
                (_, Some(_)) => Own {
                    attr: a.clone(),
                    no_dacl: !xattrs,
                    no_acl: !xattrs,
                    used: 0,
                    ahead: false,
                },
                (Some(o), None) => Own {
                    attr: a.clone(),
                    no_dacl: dacl.unwrap_or(o.no_dacl),
                    no_acl: o.no_acl && !xattrs,
                    used: 0,
                    ahead: o.ahead && ahead.contains(&a.ino),
                },
                (None, None) => Own {
                    attr: a.clone(),
                    no_dacl: dacl.unwrap_or(false),
                    no_acl: false,
                    used: 0,
                    ahead: ahead.contains(&a.ino),
                },
            };
            self.own(o);
            if let Some((_, _, i, Kind::Dir)) = new {
                self.complete.insert(*i, HashMap::new());
            }
        }
    }
}

/// The open group.
pub(super) struct Group {
    /// Its connection, detached from the pool while the group is open.
    pub(super) conn: Conn,
    /// Statements of changes that joined, not sent yet.
    pub(super) held: Vec<Held>,
    /// Counter changes, sent with COMMIT.
    pub(super) used: i64,
    pub(super) inodes: i64,
    pub(super) track: Track,
    pub(super) since: Instant,
    /// Changes since it opened (or was locked again).
    pub(super) ops: usize,
    /// Savepoints taken since it opened (or was locked again).
    pub(super) savepoints: usize,
    /// In-place updates of its shared rows, sent with COMMIT (see `shared_sql`).
    pub(super) touches: HashMap<Ino, (crate::meta::Nanos, i32)>,
    /// What to tell other clients once it has committed.
    pub(super) changes: Vec<Change>,
}

impl Group {
    /// Hands the held rows of `sorted` to the next transaction on the group's connection, as
    /// if its first statement had locked and read them; None if one is not held.
    pub(super) fn prelock(&mut self, sorted: &[Ino]) -> Option<()> {
        self.conn.forget_prefetched();
        for i in sorted {
            if let Some(a) = self.track.shared.get(i) {
                self.conn.prelocked.insert(*i, a.clone());
                self.conn.shared.insert(*i, a.clone());
                continue;
            }
            let o = self.track.owned.get(i)?;
            self.conn.prelocked.insert(*i, o.attr.clone());
            if o.no_dacl {
                self.conn.no_default_acl.insert(*i);
            }
        }
        Some(())
    }

    /// Nothing in it is uncommitted: it only holds rows locked again after its last commit.
    pub(super) fn clean(&self) -> bool {
        self.ops == 0
            && self.held.is_empty()
            && self.touches.is_empty()
            && self.used == 0
            && self.inodes == 0
            && self.changes.is_empty()
    }

    /// Adds what a change left (see [`Outcome`]) to the group: its counter changes, its
    /// in-place updates, what it made, moved and learned (`l`), a directory it read whole.
    pub(super) fn absorb(&mut self, o: Outcome, l: &Learned) {
        self.used += o.used;
        self.inodes += o.inodes;
        merge_touches(&mut self.touches, o.touches);
        for (d, names) in o.listed {
            self.track.complete.insert(d, names.into_iter().collect());
        }
        self.track.apply(l, &o.made, &o.moved, o.xattrs, &o.ahead);
    }

    pub(super) fn new(conn: Conn, track: Track) -> Group {
        Group {
            conn,
            held: Vec::new(),
            used: 0,
            inodes: 0,
            track,
            since: Instant::now(),
            ops: 0,
            savepoints: 0,
            touches: HashMap::new(),
            changes: Vec::new(),
        }
    }
}

/// The group slot of one engine and the thread that commits old groups.
pub(super) struct Grouper {
    pub(super) slot: Mutex<Option<Group>>,
    cv: Condvar,
    /// Off with `UNKAI_PG_GROUP=0`.
    pub(super) on: bool,
    /// [`MAX_AGE`] unless `UNKAI_PG_GROUP_MS` says otherwise.
    age: Duration,
    stop: AtomicBool,
    timer: Mutex<Option<JoinHandle<()>>>,
    pool: Arc<Pool>,
    shared: Arc<Shared>,
    watch: Arc<Watch>,
}

impl Grouper {
    /// Groups `on` or not, committed `age` after they open (see `Knobs`).
    pub(super) fn new(
        pool: Arc<Pool>,
        shared: Arc<Shared>,
        watch: Arc<Watch>,
        on: bool,
        age: Duration,
    ) -> Arc<Grouper> {
        let g = Arc::new(Grouper {
            slot: Mutex::new(None),
            cv: Condvar::new(),
            on,
            age,
            stop: AtomicBool::new(false),
            timer: Mutex::new(None),
            pool,
            shared,
            watch,
        });
        if on {
            let weak = Arc::downgrade(&g);
            let h = crate::meta::spawn_background("unkai-pg-group", move || run(weak));
            *g.timer.lock() = Some(h.expect("a thread"));
        }
        g
    }

    /// Whether groups may open (on, and not stopped).
    pub(super) fn active(&self) -> bool {
        self.on && !self.stop.load(Ordering::Acquire)
    }

    /// A group was opened or joined: the timer should know.
    pub(super) fn opened(&self) {
        self.cv.notify_one();
    }

    /// Tells other clients of `changes` now, or once the open group commits.
    pub(super) fn publish(&self, f: impl FnOnce() -> Vec<Change>) {
        if self.on {
            let mut slot = self.slot.lock();
            if let Some(g) = slot.as_mut() {
                g.changes.extend(f());
                return;
            }
        }
        self.watch.publish(f)
    }

    /// Commits the open group, if any (with `durable`, waiting for the WAL flush). With
    /// `relock`, the same message locks again what it held, and what still stands stays
    /// held in a new group. An error: the group's changes are lost (said in the log).
    pub(super) fn commit(
        &self,
        slot: &mut Option<Group>,
        relock: bool,
        durable: bool,
    ) -> Result<()> {
        let Some(mut g) = slot.take() else {
            return Ok(());
        };
        let mut held = std::mem::take(&mut g.held);
        let ops = held.len();
        coalesce(&mut held);
        let end = match commit_end(&mut g.conn, g.used, g.inodes, &g.touches, durable) {
            Ok((counters, end)) => {
                held.extend(counters);
                end
            }
            Err(e) => return Err(self.lost(g, ops, super::pool::pg_msg(&e))),
        };
        // The rows a change of the last few groups wrote (see [`KEEP_COMMITS`]), locked
        // again by a prepared statement (their list a parameter: a text with it would be
        // parsed and planned again at every commit).
        let recent = |o: &Own| {
            // Not a row in the trash: a deletion moved it there, and no change comes back
            // to it but the close of a file still open (which then locks it itself). `rm
            // -rf` held each removed file again for three commits: most of its relocks' rows.
            if o.attr.flags & crate::meta::flags::TRASHED != 0 {
                return false;
            }
            let keep = match o.attr.kind {
                _ if o.ahead => KEEP_AHEAD_COMMITS,
                Kind::Dir => KEEP_DIR_COMMITS,
                _ => KEEP_COMMITS,
            };
            g.track.commits - o.used < keep
        };
        let inos: Vec<i64> = match relock {
            true => g
                .track
                .owned
                .values()
                .filter(|o| recent(o))
                .map(|o| o.attr.ino as i64)
                .collect(),
            false => Vec::new(),
        };
        let relock = match inos.is_empty() {
            true => None,
            false => g.conn.stmt(RELOCK).ok(),
        };
        let shared: Vec<Ino> = g.track.shared.keys().copied().collect();
        let shared_q = shared_sql(&shared, " SKIP LOCKED");
        let relock_params: [P<'_>; 1] = [&inos];
        let params = held_params(&held);
        let mut steps = held_steps(&held, &params);
        steps.push(Step::Simple(&end));
        if let Some(stmt) = &relock {
            steps.push(Step::Simple("BEGIN; SET LOCAL synchronous_commit = off"));
            steps.push(Step::Rows(stmt, &relock_params));
            if !shared_q.is_empty() {
                steps.push(Step::Simple(shared_q.trim_start_matches("; ")));
            }
        }
        let answers = g.conn.pipeline(&steps);
        let mut learned = Learned::default();
        let mut failed = None;
        let mut answers = answers.into_iter();
        for h in &held {
            match answers.next() {
                Some(Ok(Answer::Rows(rows))) => {
                    if let (
                        Held::Stmt {
                            edge: Some((p, n, i)),
                            ..
                        },
                        Some(r),
                    ) = (h, rows.first())
                    {
                        if let Ok(id) = r.try_get::<_, i64>(0) {
                            learned.entry(*p, n, Some((id, *i)));
                        }
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    failed.get_or_insert(super::pool::pg_msg(&e));
                }
                None => {
                    failed.get_or_insert("not sent".into());
                }
            }
        }
        let committed = match answers.next() {
            Some(Ok(_)) if failed.is_none() => true,
            Some(Err(e)) => {
                failed.get_or_insert(super::pool::pg_msg(&e));
                false
            }
            _ => false,
        };
        drop(steps);
        drop(params);
        if !committed {
            return Err(self.lost(g, ops, failed.unwrap_or_else(|| "no answer".into())));
        }
        if !durable {
            g.conn.committed_lazily();
        }
        self.shared.known.learn(learned);
        let changes = std::mem::take(&mut g.changes);
        if !changes.is_empty() {
            self.watch.publish(|| changes);
        }
        if relock.is_none() {
            drop(self.pool.lend(g.conn));
            return Ok(());
        }
        // What was locked again, and whether it is as the group left it.
        let mut track = Track {
            commits: g.track.commits + 1,
            last_deletion: g.track.last_deletion,
            ..Track::default()
        };
        let begun = matches!(answers.next(), Some(Ok(Answer::Simple(_))));
        let rows = match answers.next() {
            Some(Ok(Answer::Rows(rows))) if begun => rows,
            _ => {
                // Not locked again: the connection goes back (its transaction, if any,
                // ended).
                self.give_back(g.conn);
                return Ok(());
            }
        };
        for r in &rows {
            let Ok(a) = row_attr(r, 0) else { continue };
            let no_dacl = r.try_get::<_, bool>(PRELOCK_COLUMNS - 1).is_ok_and(|d| !d);
            if let Some(o) = g.track.owned.get(&a.ino).filter(|o| o.attr == a) {
                if let Some(names) = g.track.complete.remove(&a.ino) {
                    track.complete.insert(a.ino, names);
                }
                track.keep(Own {
                    attr: a,
                    no_dacl,
                    no_acl: o.no_acl,
                    used: o.used,
                    ahead: o.ahead,
                });
            }
        }
        if !shared_q.is_empty() {
            let Some(Ok(Answer::Simple(msgs))) = answers.next() else {
                self.give_back(g.conn);
                return Ok(());
            };
            for m in msgs {
                if let ::postgres::SimpleQueryMessage::Row(r) = m {
                    if let Ok(a) = text_attr_at(&r, 1) {
                        track.shared.insert(a.ino, a);
                    }
                }
            }
        }
        // Complete directories need their row held.
        track.complete.retain(|i, _| track.owned.contains_key(i));
        *slot = Some(Group::new(g.conn, track));
        Ok(())
    }

    /// The group `g` could not commit (`why`): its `ops` changes, already answered, are lost
    /// (said in the log); what it held is no longer known; the error to answer.
    fn lost(&self, g: Group, ops: usize, why: String) -> Error {
        tracing::error!(
            "a group of {} namespace change(s) already answered could not be committed \
             ({why}): they are lost; nothing that close or fsync acknowledged is among them",
            g.ops.max(ops)
        );
        let inos: Vec<Ino> = g.track.owned.keys().copied().collect();
        self.shared.known.stale(&inos);
        self.give_back(g.conn);
        Error::Engine(format!("a group of changes could not be committed: {why}"))
    }

    /// `c` back to the pool, its transaction (if any) rolled back; dropped if it is lost.
    fn give_back(&self, c: Conn) {
        let closed = c.is_closed();
        let mut l = self.pool.lend(c);
        if closed {
            l.broken = true;
        } else {
            let _ = l.batch("ROLLBACK");
        }
    }

    /// Commits what is open and stops the timer (unmount, or the engine dropped).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        {
            let mut slot = self.slot.lock();
            let _ = self.commit(&mut slot, false, false);
        }
        self.cv.notify_all();
        if let Some(h) = self.timer.lock().take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// The timer: commits a group [`MAX_AGE`] (or `UNKAI_PG_GROUP_MS`) after it opened; one that
/// took no change since it was locked again is let go.
fn run(weak: Weak<Grouper>) {
    loop {
        let Some(g) = weak.upgrade() else { return };
        if g.stop.load(Ordering::Acquire) {
            return;
        }
        let mut slot = g.slot.lock();
        match slot.as_ref().map(|x| (x.since + g.age, x.ops)) {
            None => {
                g.cv.wait_for(&mut slot, Duration::from_millis(500));
            }
            Some((due, ops)) if Instant::now() >= due => {
                if let Err(e) = g.commit(&mut slot, ops > 0, false) {
                    tracing::debug!("group commit: {e}");
                }
            }
            Some((due, _)) => {
                g.cv.wait_until(&mut slot, due);
            }
        }
    }
}
