//! Clients of one PostgreSQL volume (each its own mount, its own unkai process) racing on the
//! same names get the answers POSIX allows, as if their calls had run one after the other:
//! O_CREAT|O_EXCL and mkdir have exactly one winner; rename, unlink, link and create race
//! on a few names and the outcome (each call's answer and the names left) is one of the
//! serial orders; rmdir never succeeds beside a create in the directory; two renames of
//! directories into each other never both succeed; links made and removed from both clients
//! leave the inode's link count right. Meanwhile each client keeps changing files of its own,
//! so that its changes are in flight (grouped) while it races. At the end both mounts show one
//! tree (names, kinds, sizes, link counts, inode numbers, contents), the inode count `df`
//! shows is the tree's, and `unkai fsck` finds the volume consistent.
//!
//! What another mount shows may lag (its kernel caches, a pushed invalidation on its way):
//! every cross-mount check waits for its condition with a generous deadline. Skipped, saying
//! so, when UNKAI_TEST_POSTGRES is unset (see tests/common/postgres.rs).

use crate::common::rng::SplitMix;
use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

/// How long a mount may take to show another mount's change.
const SETTLE: Duration = Duration::from_secs(30);

/// Racing threads on each mount.
const PER_MOUNT: usize = 2;

/// The choices of a run (which calls race, from which mount): new each run, printed;
/// `UNKAI_RACES_SEED=<seed>` makes the same ones again (the races themselves are timing).
fn seed() -> u64 {
    match std::env::var("UNKAI_RACES_SEED") {
        Ok(s) => s.parse().expect("UNKAI_RACES_SEED must be a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

/// The errno of a call's result (0 for success).
fn code<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => errno(&e).max(1),
    }
}

fn ename(e: i32) -> String {
    match e {
        0 => "ok".into(),
        libc::ENOENT => "ENOENT".into(),
        libc::EEXIST => "EEXIST".into(),
        libc::ENOTEMPTY => "ENOTEMPTY".into(),
        libc::EINVAL => "EINVAL".into(),
        e => format!("errno {e}"),
    }
}

/// The names in a directory, None if it cannot be listed (not there yet, or no longer).
fn listing(p: &Path) -> Option<BTreeSet<String>> {
    fs::read_dir(p)
        .ok()?
        .map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect()
}

/// What a directory of plain files shows on a mount: name → (content, link count, inode).
/// None if something is half-visible (a listed name that no longer resolves): look again.
fn files_in(dir: &Path) -> Option<BTreeMap<String, (String, u64, u64)>> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir).ok()? {
        let name = e.ok()?.file_name().to_string_lossy().into_owned();
        let p = dir.join(&name);
        let md = fs::symlink_metadata(&p).ok()?;
        let content = fs::read_to_string(&p).ok()?;
        out.insert(name, (content, md.nlink(), md.ino()));
    }
    Some(out)
}

/// Waits until both mounts show one tree under `rel` that `ok` accepts; returns it, or panics
/// saying what each mount showed last.
fn settle<T: PartialEq + std::fmt::Debug>(
    mounts: &[&Mount],
    what: &str,
    read: impl Fn(&Mount) -> Option<T>,
    ok: impl Fn(&T) -> bool,
) -> T {
    let mut last: Vec<Option<T>> = Vec::new();
    let agreed = eventually(SETTLE, || {
        last = mounts.iter().map(|m| read(m)).collect();
        match &last[0] {
            Some(first) => ok(first) && last.iter().all(|x| x.as_ref() == Some(first)),
            None => false,
        }
    });
    assert!(
        agreed,
        "{what}: the mounts did not come to show one allowed state within {SETTLE:?}; \
         they show {last:#?}"
    );
    last.swap_remove(0).unwrap()
}

// ---- a model of a directory of plain files, for the two-call races ----

/// A directory of plain files: name → the file (a tag, also its content).
type Names = BTreeMap<String, String>;

#[derive(Clone, Debug)]
enum Op {
    /// rename(from, to)
    Rename(&'static str, &'static str),
    /// unlink(name)
    Unlink(&'static str),
    /// link(from, to)
    Link(&'static str, &'static str),
    /// open(name, O_CREAT|O_EXCL), writing the tag, for a new file
    CreateExcl(&'static str, &'static str),
}

impl Op {
    /// The steps of the call as the kernel makes them. link(2) resolves its source first and
    /// makes the new name later, as on any Linux file system; rename(2) too, and when the
    /// target then names the file the source resolved to, the kernel answers success itself
    /// (two names of one file). The source may come from the kernel's cache of names, as it
    /// was a moment earlier (until the other client's change is pushed, or the entry TTL);
    /// so may the target, and the two need not be as old: the other client's rename of `a`
    /// onto `b` told to this one, the kernel may resolve `b` anew (now `a`'s file) while its
    /// entry of `a` still waits to be dropped, names the same file, and the rename of `b`
    /// onto `a` is answered by the kernel alone (a run under the full suite's load saw it).
    /// The other calls are one step each, by name, on the server.
    fn steps(&self) -> usize {
        match self {
            Op::Link(..) | Op::Rename(..) => 2,
            _ => 1,
        }
    }

    /// Step `k` of the call on `s`, as POSIX says; the answer once it is known. `held` is
    /// what the first step resolved; `stale`, the names a kernel's cache may still show for
    /// the target (as the race began), if it does.
    fn step(
        &self,
        k: usize,
        s: &mut Names,
        held: &mut Option<String>,
        stale: Option<&Names>,
    ) -> Option<i32> {
        Some(match *self {
            Op::Rename(from, _) | Op::Link(from, _) if k == 0 => {
                *held = s.get(from).cloned();
                return held.is_none().then_some(libc::ENOENT);
            }
            Op::Rename(from, to) => {
                let cached = stale.unwrap_or(&*s).get(to);
                if cached == held.as_ref() {
                    // Two names of one file, as now or as the kernel's cache may still show
                    // the target: nothing happens (the kernel's own answer).
                    return Some(0);
                }
                // The server renames by name.
                let Some(v) = s.get(from).cloned() else {
                    return Some(libc::ENOENT);
                };
                if s.get(to) != Some(&v) {
                    s.remove(from);
                    s.insert(to.into(), v);
                }
                0
            }
            Op::Unlink(n) => match s.remove(n) {
                Some(_) => 0,
                None => libc::ENOENT,
            },
            Op::Link(_, to) => {
                let v = held.clone()?;
                if !s.values().any(|t| *t == v) {
                    // Its last name went meanwhile (a link count of 0).
                    libc::ENOENT
                } else if s.contains_key(to) {
                    libc::EEXIST
                } else {
                    s.insert(to.into(), v);
                    0
                }
            }
            Op::CreateExcl(n, tag) => {
                if s.contains_key(n) {
                    libc::EEXIST
                } else {
                    s.insert(n.into(), tag.into());
                    0
                }
            }
        })
    }

    /// Makes the call in directory `dir` of a mount; its errno (0 for success).
    fn call(&self, dir: &Path) -> i32 {
        match *self {
            Op::Rename(from, to) => code(fs::rename(dir.join(from), dir.join(to))),
            Op::Unlink(n) => code(fs::remove_file(dir.join(n))),
            Op::Link(from, to) => code(fs::hard_link(dir.join(from), dir.join(to))),
            Op::CreateExcl(n, tag) => code(
                fs::File::create_new(dir.join(n))
                    .and_then(|mut f| std::io::Write::write_all(&mut f, tag.as_bytes())),
            ),
        }
    }
}

/// Every outcome (both answers and the names left) of running the steps of `x` and `y` on
/// `start` in any interleaving (for one-step calls: one after the other, in either order).
fn serial_outcomes(start: &Names, x: &Op, y: &Op) -> Vec<((i32, i32), Names)> {
    let (nx, ny) = (x.steps(), y.steps());
    let mut out = Vec::new();
    // Each interleaving: a bit per step, set where it is one of y's; and for each call,
    // whether its kernel resolves the target from the names as the race began.
    for (bits, st) in (0u32..1 << (nx + ny)).flat_map(|b| (0..4).map(move |st| (b, st))) {
        if bits.count_ones() as usize != ny {
            continue;
        }
        let (sx, sy) = (
            (st & 1 == 1).then_some(start),
            (st & 2 == 2).then_some(start),
        );
        let mut s = start.clone();
        let (mut kx, mut ky, mut hx, mut hy) = (0, 0, None, None);
        let (mut rx, mut ry) = (None, None);
        for i in 0..nx + ny {
            if bits & (1 << i) == 0 {
                if rx.is_none() {
                    rx = x.step(kx, &mut s, &mut hx, sx);
                }
                kx += 1;
            } else {
                if ry.is_none() {
                    ry = y.step(ky, &mut s, &mut hy, sy);
                }
                ky += 1;
            }
        }
        let outcome = ((rx.unwrap(), ry.unwrap()), s);
        if !out.contains(&outcome) {
            out.push(outcome);
        }
    }
    out
}

/// Whether a directory as shown (content, link count, inode per name) is `names`: each name
/// holds its file's content, names of one file share its inode and count its links, and
/// names of different files have different inodes.
fn shows(seen: &BTreeMap<String, (String, u64, u64)>, names: &Names) -> bool {
    if !seen.keys().eq(names.keys()) {
        return false;
    }
    let mut inode_of: BTreeMap<&str, u64> = BTreeMap::new();
    let mut tag_of: BTreeMap<u64, &str> = BTreeMap::new();
    for (name, tag) in names {
        let (content, nlink, ino) = &seen[name];
        let links = names.values().filter(|t| *t == tag).count() as u64;
        if content != tag || *nlink != links {
            return false;
        }
        if *inode_of.entry(tag).or_insert(*ino) != *ino
            || *tag_of.entry(*ino).or_insert(tag) != tag.as_str()
        {
            return false;
        }
    }
    true
}

/// Runs `x` and `y` at once, each on its own thread, released together; returns their
/// answers.
fn at_once<A: Send, B: Send>(x: impl FnOnce() -> A + Send, y: impl FnOnce() -> B + Send) -> (A, B) {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let tx = s.spawn(|| {
            barrier.wait();
            x()
        });
        let ty = s.spawn(|| {
            barrier.wait();
            y()
        });
        (tx.join().unwrap(), ty.join().unwrap())
    })
}

/// Runs `race(t, mount, barrier)` on PER_MOUNT threads on each mount at once (`t` numbers the
/// threads); `barrier` holds each thread until all have reached it.
fn race_on_every_mount<'m>(mounts: &[&'m Mount], race: impl Fn(usize, &'m Mount, &Barrier) + Sync) {
    let racers: Vec<(usize, &Mount)> = mounts
        .iter()
        .flat_map(|m| std::iter::repeat_n(*m, PER_MOUNT))
        .enumerate()
        .collect();
    let barrier = Barrier::new(racers.len());
    std::thread::scope(|s| {
        for &(t, m) in &racers {
            let (barrier, race) = (&barrier, &race);
            s.spawn(move || race(t, m, barrier));
        }
    });
}

/// Two clients race one call each on a few names (a, b, c) of a fresh directory, many rounds,
/// with random calls and starting states: each round's answers and the names left must be
/// those of one serial order, on both mounts.
fn two_call_races(a: &Mount, b: &Mount, rng: &mut SplitMix) {
    let ops = [
        Op::Rename("a", "b"),
        Op::Rename("a", "c"),
        Op::Rename("b", "a"),
        Op::Unlink("a"),
        Op::Unlink("b"),
        Op::Link("a", "c"),
        Op::Link("b", "c"),
        Op::CreateExcl("b", "new-b"),
        Op::CreateExcl("c", "new-c"),
    ];
    let rounds = 150;
    let mut both_ok = 0;
    for round in 0..rounds {
        let dir = format!("two/{round}");
        fs::create_dir_all(a.p(&dir)).unwrap();
        // The starting state: a always, b sometimes, made on either mount.
        let mut start = Names::new();
        start.insert("a".into(), format!("a{round}"));
        if rng.below(2) == 1 {
            start.insert("b".into(), format!("b{round}"));
        }
        for (n, tag) in &start {
            let m = if rng.below(2) == 0 { a } else { b };
            let p = m.p(&format!("{dir}/{n}"));
            // The directory may not show on the other mount yet.
            assert!(
                eventually(SETTLE, || fs::write(&p, tag).is_ok()),
                "{dir}/{n}: could not write it"
            );
        }
        settle(
            &[a, b],
            &format!("round {round}, start"),
            |m| files_in(&m.p(&dir)),
            |seen| shows(seen, &start),
        );
        let x = ops[rng.below(ops.len() as u64) as usize].clone();
        let y = ops[rng.below(ops.len() as u64) as usize].clone();
        let (mx, my) = if rng.below(2) == 0 { (a, b) } else { (b, a) };
        let (rx, ry) = at_once(|| x.call(&mx.p(&dir)), || y.call(&my.p(&dir)));
        let allowed: Vec<Names> = serial_outcomes(&start, &x, &y)
            .into_iter()
            .filter(|(r, _)| *r == (rx, ry))
            .map(|(_, names)| names)
            .collect();
        assert!(
            !allowed.is_empty(),
            "round {round}: from {start:?}, {x:?} answered {} and {y:?} answered {}: no serial \
             order answers so ({:?})",
            ename(rx),
            ename(ry),
            serial_outcomes(&start, &x, &y)
        );
        settle(
            &[a, b],
            &format!(
                "round {round}: from {start:?}, {x:?} → {}, {y:?} → {}; allowed {allowed:?}",
                ename(rx),
                ename(ry)
            ),
            |m| files_in(&m.p(&dir)),
            |seen| allowed.iter().any(|names| shows(seen, names)),
        );
        both_ok += usize::from(rx == 0 && ry == 0);
    }
    eprintln!("two-call races: both calls succeeded in {both_ok} of {rounds} rounds");
}

/// Every racing thread (PER_MOUNT on each mount) tries to make one new name at once: with
/// O_CREAT|O_EXCL, or (every third round) some with mkdir; exactly one wins, the others get
/// EEXIST, and the winner's file or directory is what both mounts show.
fn exclusive_creates(mounts: &[&Mount]) {
    fs::create_dir(mounts[0].p("excl")).unwrap();
    settle(
        mounts,
        "excl",
        |m| fs::metadata(m.p("excl")).ok().map(|md| md.ino()),
        |_| true,
    );
    let rounds = 120;
    let answers = Mutex::new(vec![Vec::new(); rounds]);
    race_on_every_mount(mounts, |t, m, barrier| {
        for round in 0..rounds {
            let p = m.p(&format!("excl/n{round}"));
            let dir = round % 3 == 2 && t % 2 == 0;
            barrier.wait();
            let r = if dir {
                code(fs::create_dir(&p))
            } else {
                code(fs::File::create_new(&p).and_then(|mut f| {
                    std::io::Write::write_all(&mut f, format!("t{t}").as_bytes())
                }))
            };
            answers.lock().unwrap()[round].push((t, dir, r));
        }
    });
    for (round, answers) in answers.into_inner().unwrap().into_iter().enumerate() {
        let winners: Vec<_> = answers.iter().filter(|(_, _, r)| *r == 0).collect();
        assert_eq!(
            winners.len(),
            1,
            "n{round}: exactly one of the racing creates must win: {answers:?}"
        );
        assert!(
            answers
                .iter()
                .all(|(_, _, r)| *r == 0 || *r == libc::EEXIST),
            "n{round}: the losers must get EEXIST: {answers:?}"
        );
        let (t, dir, _) = *winners[0];
        let want = if dir { None } else { Some(format!("t{t}")) };
        settle(
            mounts,
            &format!("n{round} (won by racer {t})"),
            |m| {
                let p = m.p(&format!("excl/n{round}"));
                let md = fs::symlink_metadata(&p).ok()?;
                let content = if md.is_dir() {
                    None
                } else {
                    Some(fs::read_to_string(&p).ok()?)
                };
                Some((md.is_dir(), content))
            },
            |got| *got == (dir, want.clone()),
        );
    }
}

/// rmdir(d) on one client against a create in d on another (open O_CREAT|O_EXCL, mkdir, or
/// rename of a file into d): never do both succeed. Either rmdir fails with ENOTEMPTY and the
/// new name is in d, or the other call fails with ENOENT and d is gone, on both mounts.
fn rmdir_against_creates(a: &Mount, b: &Mount, rng: &mut SplitMix) {
    fs::create_dir(a.p("rmdir")).unwrap();
    let rounds = 60;
    let mut removed = 0;
    for round in 0..rounds {
        let (mr, mc) = if rng.below(2) == 0 { (a, b) } else { (b, a) };
        let d = format!("rmdir/d{round}");
        let src = format!("rmdir/x{round}");
        let kind = round % 3;
        assert!(
            eventually(SETTLE, || fs::create_dir(mr.p(&d)).is_ok()),
            "mkdir {d}"
        );
        if kind == 2 {
            fs::write(mr.p(&src), "x").unwrap();
        }
        settle(
            &[a, b],
            &format!("{d} made"),
            |m| {
                Some((
                    fs::metadata(m.p(&d)).ok()?.is_dir(),
                    kind != 2 || fs::metadata(m.p(&src)).is_ok(),
                ))
            },
            |x| *x == (true, true),
        );
        let inner = mc.p(&format!("{d}/f"));
        let (rr, rc) = at_once(
            || code(fs::remove_dir(mr.p(&d))),
            || match kind {
                0 => code(fs::File::create_new(&inner)),
                1 => code(fs::create_dir(&inner)),
                _ => code(fs::rename(mc.p(&src), &inner)),
            },
        );
        let what = ["create", "mkdir", "rename into"][kind];
        let outcome = format!("{d}: rmdir → {}, {what} {d}/f → {}", ename(rr), ename(rc));
        match (rr, rc) {
            (0, libc::ENOENT) => {
                removed += 1;
                settle(
                    &[a, b],
                    &outcome,
                    |m| {
                        Some((
                            fs::symlink_metadata(m.p(&d)).is_ok(),
                            kind == 2 && fs::symlink_metadata(m.p(&src)).is_ok(),
                        ))
                    },
                    |x| *x == (false, kind == 2),
                );
            }
            (libc::ENOTEMPTY, 0) => {
                settle(
                    &[a, b],
                    &outcome,
                    |m| {
                        let md = fs::symlink_metadata(m.p(&format!("{d}/f"))).ok()?;
                        Some((
                            md.is_dir(),
                            listing(&m.p(&d))?.len(),
                            fs::symlink_metadata(m.p(&src)).is_ok(),
                        ))
                    },
                    |x| *x == (kind == 1, 1, false),
                );
            }
            _ => panic!("{outcome}: not an answer POSIX allows"),
        }
    }
    eprintln!("rmdir against creates: rmdir won {removed} of {rounds} rounds");
}

/// Two clients rename two sibling directories each into the other at once: one succeeds, the
/// other fails (ENOENT: its source is gone; or EINVAL: the target is inside the source), and
/// no loop is left behind.
fn crossed_directory_renames(a: &Mount, b: &Mount) {
    fs::create_dir(a.p("cross")).unwrap();
    let rounds = 40;
    for round in 0..rounds {
        let (p, q) = (format!("cross/{round}/p"), format!("cross/{round}/q"));
        fs::create_dir_all(a.p(&p)).unwrap();
        fs::create_dir_all(a.p(&q)).unwrap();
        settle(
            &[a, b],
            &format!("cross/{round}"),
            |m| listing(&m.p(&format!("cross/{round}"))),
            |n| n.len() == 2,
        );
        let (ra, rb) = at_once(
            || code(fs::rename(a.p(&p), a.p(&format!("{q}/x")))),
            || code(fs::rename(b.p(&q), b.p(&format!("{p}/y")))),
        );
        let outcome = format!(
            "cross/{round}: rename p → q/x: {}, rename q → p/y: {}",
            ename(ra),
            ename(rb)
        );
        let lost = |r: i32| r == libc::ENOENT || r == libc::EINVAL;
        let want = match (ra, rb) {
            (0, r) if lost(r) => ("q", "x"),
            (r, 0) if lost(r) => ("p", "y"),
            _ => panic!("{outcome}: exactly one must succeed"),
        };
        settle(
            &[a, b],
            &outcome,
            |m| {
                let top = listing(&m.p(&format!("cross/{round}")))?;
                let inner = listing(&m.p(&format!("cross/{round}/{}", want.0)))?;
                Some((top, inner))
            },
            |(top, inner)| top.iter().eq([want.0].iter()) && inner.iter().eq([want.1].iter()),
        );
    }
}

/// Threads on both clients make and remove hard links of one file at once: its link count
/// ends at 1 + the links left, on both mounts, and every link is the file.
fn links_of_one_inode(mounts: &[&Mount]) {
    fs::create_dir(mounts[0].p("links")).unwrap();
    fs::write(mounts[0].p("links/f"), "the file").unwrap();
    let ino = settle(
        mounts,
        "links/f",
        |m| fs::metadata(m.p("links/f")).ok().map(|md| md.ino()),
        |_| true,
    );
    let steps = 40;
    let left = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::new());
    race_on_every_mount(mounts, |t, m, barrier| {
        let mut mine = Vec::new();
        barrier.wait();
        for i in 0..steps {
            let name = format!("links/l{t}-{i}");
            match fs::hard_link(m.p("links/f"), m.p(&name)) {
                Ok(()) => mine.push(name),
                Err(e) => errors.lock().unwrap().push(format!("link {name}: {e}")),
            }
            // Remove every other link soon after making it.
            if i % 2 == 1 && mine.len() >= 2 {
                let name = mine.remove(mine.len() - 2);
                if let Err(e) = fs::remove_file(m.p(&name)) {
                    errors.lock().unwrap().push(format!("unlink {name}: {e}"));
                }
            }
        }
        left.lock().unwrap().extend(mine);
    });
    let errors = errors.into_inner().unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    let mut left = left.into_inner().unwrap();
    left.push("links/f".into());
    left.sort();
    let want_links = left.len() as u64;
    settle(
        mounts,
        "links",
        |m| {
            let mut v = Vec::new();
            for n in listing(&m.p("links"))? {
                let md = fs::metadata(m.p(&format!("links/{n}"))).ok()?;
                v.push((format!("links/{n}"), md.ino(), md.nlink()));
            }
            Some(v)
        },
        |v| {
            v.iter().map(|(n, _, _)| n).eq(left.iter())
                && v.iter().all(|&(_, i, nl)| i == ino && nl == want_links)
        },
    );
}

/// A whole tree as a mount shows it: path → (kind, size, link count, inode, content).
type Tree = BTreeMap<String, (char, u64, u64, u64, String)>;

fn tree(root: &Path) -> Option<Tree> {
    fn walk(root: &Path, dir: &Path, out: &mut Tree) -> Option<()> {
        for e in fs::read_dir(dir).ok()? {
            let p = e.ok()?.path();
            let md = fs::symlink_metadata(&p).ok()?;
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let (kind, content) = if md.is_dir() {
                walk(root, &p, out)?;
                ('d', String::new())
            } else {
                ('f', fs::read_to_string(&p).ok()?)
            };
            let size = if md.is_dir() { 0 } else { md.size() };
            out.insert(rel, (kind, size, md.nlink(), md.ino(), content));
        }
        Some(())
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out)?;
    Some(out)
}

/// Keeps changing files of its own on a mount (writes and closes them, removes older ones)
/// until `stop`, so that the mount has changes in flight during the races; returns the names
/// it left in `dir`.
fn churn(m: &Mount, dir: &str, stop: &AtomicBool) -> Vec<String> {
    fs::create_dir(m.p(dir)).unwrap();
    let mut kept = std::collections::VecDeque::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let name = format!("{dir}/c{i}");
        fs::write(m.p(&name), format!("churn {i}")).unwrap();
        kept.push_back(name);
        if kept.len() > 5 {
            fs::remove_file(m.p(&kept.pop_front().unwrap())).unwrap();
        }
        i += 1;
    }
    kept.into()
}

#[test]
fn clients_racing_on_shared_names_get_posix_answers() {
    if postgres::skip() {
        return;
    }
    let vol = Volume::postgres(&[], |u| u.to_string(), Vec::new()).unwrap();
    let (a, b) = (vol.mount(), vol.mount());
    let mounts = [&a, &b];
    let seed = seed();
    eprintln!("seed {seed} (UNKAI_RACES_SEED={seed} makes the same choices)");
    let mut rng = SplitMix::salted(seed, 0x5a1e_d0ac);
    let stop = AtomicBool::new(false);
    // Stops the churning threads also when a race check panics (else the scope waits on).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let churned = std::thread::scope(|s| {
        let ca = s.spawn(|| churn(&a, "churn-a", &stop));
        let cb = s.spawn(|| churn(&b, "churn-b", &stop));
        let _stop = StopOnDrop(&stop);
        exclusive_creates(&mounts);
        two_call_races(&a, &b, &mut rng);
        rmdir_against_creates(&a, &b, &mut rng);
        crossed_directory_renames(&a, &b);
        links_of_one_inode(&mounts);
        drop(_stop);
        [ca.join().unwrap(), cb.join().unwrap()]
    });
    // Both mounts show one tree, with what the churning threads left in it.
    let whole = settle(&mounts, "the whole tree", |m| tree(&m.path), |_| true);
    for left in churned.iter().flatten() {
        assert!(whole.contains_key(left), "{left} is missing");
    }
    // df's inode count is the tree's (its distinct inodes, and the root).
    let inodes = 1 + whole
        .values()
        .map(|(_, _, _, ino, _)| ino)
        .collect::<std::collections::BTreeSet<_>>()
        .len() as u64;
    settle(
        &mounts,
        "df's inodes in use",
        |m| {
            let s = nix::sys::statvfs::statvfs(&m.path).ok()?;
            Some(s.files() - s.files_free())
        },
        |used| *used == inodes,
    );
    a.unmount();
    b.unmount();
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    let errors = (out.clone() + &err).lines().any(|l| l.starts_with("ERROR"));
    assert!(ok && !errors, "fsck: {out}{err}");
}
