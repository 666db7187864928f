//! File locks shared by every client of a volume: fcntl (POSIX record) locks and flock, as
//! byte ranges held by an owner. The engines store the ranges (one row per range) and call
//! [`decide`] inside the transaction that reads an inode's locks, so that the outcome is the
//! same on every engine.
//!
//! An owner is (session, the kernel's lock owner): a process's file table for fcntl locks, an
//! open file description for flock and OFD locks. Like NFS, flock is a whole-file lock in the
//! same space as fcntl locks (the FUSE interface of fuser does not say which call a request
//! came from), so a process holding both kinds on one file conflicts with itself.
//!
//! Not for: waiting for a lock (the vfs polls), SQL.

/// Read (shared) or write (exclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    Read,
    Write,
}

impl LockKind {
    pub fn code(self) -> i64 {
        match self {
            LockKind::Read => 0,
            LockKind::Write => 1,
        }
    }

    pub fn from_code(c: i64) -> LockKind {
        if c == 0 {
            LockKind::Read
        } else {
            LockKind::Write
        }
    }
}

/// Who holds a lock: a client session and the kernel's lock owner inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockOwner {
    pub session: u64,
    pub owner: u64,
}

/// A locked byte range, `start..=end` (end `u64::MAX` or the kernel's `OFFSET_MAX`: to the
/// end of any file). `pid` is the process that set it, as reported by F_GETLK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRange {
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

impl LockRange {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

/// What a request does: lock (`Some`) or unlock (`None`) `start..=end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRequest {
    pub kind: Option<LockKind>,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// The outcome of a request against the locks an inode has.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Another owner holds this conflicting lock: nothing changes.
    Conflict(LockOwner, LockRange),
    /// The owner's ranges on the inode become these (replace all of its rows).
    Store(Vec<LockRange>),
}

/// The first lock of another owner that conflicts with `kind` over `start..=end`.
pub(crate) fn conflict(
    held: &[(LockOwner, LockRange)],
    me: LockOwner,
    kind: LockKind,
    start: u64,
    end: u64,
) -> Option<(LockOwner, LockRange)> {
    held.iter()
        .filter(|(o, r)| {
            *o != me
                && r.overlaps(start, end)
                && (kind == LockKind::Write || r.kind == LockKind::Write)
        })
        .min_by_key(|(_, r)| r.start)
        .copied()
}

/// Decides a request of `me` against every lock held on the inode (all owners).
pub(crate) fn decide(held: &[(LockOwner, LockRange)], me: LockOwner, req: LockRequest) -> Decision {
    if let Some(kind) = req.kind
        && let Some((o, r)) = conflict(held, me, kind, req.start, req.end)
    {
        return Decision::Conflict(o, r);
    }
    let own: Vec<LockRange> = held
        .iter()
        .filter(|(o, _)| *o == me)
        .map(|(_, r)| *r)
        .collect();
    Decision::Store(apply(&own, req))
}

/// Runs `attempt` (one transaction that decides a request and stores its outcome) until it is
/// settled: granted (`None`) or refused with the conflicting lock. A conflict with a holder
/// whose session is `dead` reclaims what dead sessions left (`reclaim`) and tries once more.
pub(crate) fn settle(
    mut attempt: impl FnMut() -> super::Result<Decision>,
    dead: impl Fn(u64) -> super::Result<bool>,
    reclaim: impl Fn() -> super::Result<usize>,
) -> super::Result<Option<LockRange>> {
    for first in [true, false] {
        match attempt()? {
            Decision::Store(_) => return Ok(None),
            Decision::Conflict(holder, r) => {
                if first && dead(holder.session)? {
                    reclaim()?;
                    continue;
                }
                return Ok(Some(r));
            }
        }
    }
    unreachable!("the second attempt returns")
}

/// An owner's ranges after a request: the request's range is cut out of every range, then
/// added with its kind (unless it unlocks); neighbouring ranges of one kind merge, as POSIX
/// requires of one owner's locks.
pub(crate) fn apply(own: &[LockRange], req: LockRequest) -> Vec<LockRange> {
    let mut out: Vec<LockRange> = Vec::with_capacity(own.len() + 2);
    for r in own {
        if !r.overlaps(req.start, req.end) {
            out.push(*r);
            continue;
        }
        if r.start < req.start {
            out.push(LockRange {
                end: req.start - 1,
                ..*r
            });
        }
        if r.end > req.end {
            out.push(LockRange {
                start: req.end + 1,
                ..*r
            });
        }
    }
    if let Some(kind) = req.kind {
        out.push(LockRange {
            kind,
            start: req.start,
            end: req.end,
            pid: req.pid,
        });
    }
    out.sort_by_key(|r| r.start);
    let mut merged: Vec<LockRange> = Vec::with_capacity(out.len());
    for r in out {
        if let Some(last) = merged.last_mut()
            && last.kind == r.kind
            && last.end.checked_add(1).is_none_or(|next| next >= r.start)
        {
            last.end = last.end.max(r.end);
            if req.kind == Some(r.kind) && r.start == req.start {
                last.pid = r.pid;
            }
            continue;
        }
        merged.push(r);
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: LockOwner = LockOwner {
        session: 1,
        owner: 10,
    };
    const B: LockOwner = LockOwner {
        session: 2,
        owner: 10,
    };

    fn r(kind: LockKind, start: u64, end: u64) -> LockRange {
        LockRange {
            kind,
            start,
            end,
            pid: 7,
        }
    }

    fn req(kind: Option<LockKind>, start: u64, end: u64) -> LockRequest {
        LockRequest {
            kind,
            start,
            end,
            pid: 7,
        }
    }

    use LockKind::{Read, Write};

    #[test]
    fn readers_share_writers_exclude() {
        let held = vec![(A, r(Read, 0, 99))];
        assert!(matches!(
            decide(&held, B, req(Some(Read), 50, 60)),
            Decision::Store(_)
        ));
        assert_eq!(
            decide(&held, B, req(Some(Write), 99, 200)),
            Decision::Conflict(A, r(Read, 0, 99))
        );
        // No overlap, no conflict.
        assert!(matches!(
            decide(&held, B, req(Some(Write), 100, 200)),
            Decision::Store(_)
        ));
        // The same owner never conflicts with itself: it converts.
        assert_eq!(
            decide(&held, A, req(Some(Write), 0, 99)),
            Decision::Store(vec![r(Write, 0, 99)])
        );
        // The same kernel owner in another session is another owner.
        let held = vec![(A, r(Write, 0, u64::MAX))];
        assert!(matches!(
            decide(&held, B, req(Some(Read), 5, 5)),
            Decision::Conflict(..)
        ));
        // Unlocking never conflicts.
        assert_eq!(
            decide(&held, B, req(None, 0, u64::MAX)),
            Decision::Store(vec![])
        );
    }

    #[test]
    fn unlock_splits_and_lock_merges() {
        let own = vec![r(Write, 0, 99)];
        assert_eq!(
            apply(&own, req(None, 10, 19)),
            vec![r(Write, 0, 9), r(Write, 20, 99)]
        );
        assert_eq!(
            apply(&own, req(Some(Read), 10, 19)),
            vec![r(Write, 0, 9), r(Read, 10, 19), r(Write, 20, 99)]
        );
        // Adjacent ranges of one kind merge; of two kinds they do not.
        let own = vec![r(Write, 0, 9), r(Read, 10, 19), r(Write, 20, 99)];
        assert_eq!(apply(&own, req(Some(Write), 10, 19)), vec![r(Write, 0, 99)]);
        assert_eq!(apply(&own, req(None, 0, u64::MAX)), vec![]);
        // Whole-file locks to the end of every file.
        assert_eq!(
            apply(&[], req(Some(Write), 0, u64::MAX)),
            vec![r(Write, 0, u64::MAX)]
        );
        assert_eq!(
            apply(&[r(Write, 0, u64::MAX)], req(None, 100, u64::MAX)),
            vec![r(Write, 0, 99)]
        );
        assert_eq!(
            apply(&[r(Read, 0, 9)], req(Some(Read), 20, 29)),
            vec![r(Read, 0, 9), r(Read, 20, 29)]
        );
    }
}
