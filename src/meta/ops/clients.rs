//! This client among others: its session (registered, heartbeated, closed, and those of
//! dead clients cleaned up), the opens it records so that other clients' unlinks keep its
//! files, POSIX locks, and when it answers from memory (alone, or with changes pushed).
//!
//! Not for: how opens are counted in memory (`meta::opens`), lock ranges and conflicts
//! (`meta::lock`), what a session row says (`meta::session`), the cache itself
//! (`meta::cache`), or SQL (the engines).

use super::*;

impl<E: Engine> EngineMeta<E> {
    /// Once another client shares the volume, records this client's opens (those open now,
    /// and every first open from now on) so that its unlinks keep them. Never goes back: the
    /// cost is one write per first open and last close. (Engines that record every open
    /// from the start have nothing to do.)
    pub(super) fn share_opens(&self) -> Result<()> {
        if E::RECORDS_OPENS || self.opens.is_recorded() {
            return Ok(());
        }
        if !self.engine.read(|tx| self.company(tx))? {
            return Ok(());
        }
        let sid = self.sid();
        let n = self.engine.write(&[], false, |tx| {
            // Inside the write transaction: a first open or last close that saw `recorded`
            // false has written nothing, and one that sees it true writes its row after this.
            let open = self.opens.record_all();
            for ino in &open {
                tx.insert_open(*ino, sid)?;
            }
            Ok(open.len())
        })?;
        tracing::info!("another client shares the volume: recording opens ({n} open now)");
        Ok(())
    }

    /// Deletes a session, its open records and its reserved slice ids (what it uploaded and
    /// did not commit is garbage from now on); the unlinked inodes no other client has open
    /// any more are deleted.
    fn end_session(&self, sid: u64) -> Result<()> {
        let now = now_nanos();
        // The inodes it deletes are not known here: everything is forgotten.
        self.cache.clear();
        self.engine.write(&[], false, |tx| {
            tx.release_slices(sid, None)?;
            for ino in tx.take_session_opens(sid)? {
                if let Some(a) = unless_gone(tx.lock_node(ino))? {
                    if a.nlink == 0 && !tx.open_anywhere(ino)? {
                        self.delete_inode(tx, &a, now)?;
                    }
                }
            }
            tx.delete_session(sid)
        })
    }

    /// Whether a session stopped: its row is gone, or its client is known dead.
    fn session_is_dead(&self, id: u64) -> Result<bool> {
        Ok(match self.engine.read(|tx| tx.session(id))? {
            None => true,
            Some((_, info, hb)) => row_dead(&info, hb, now_nanos()),
        })
    }

    /// Cleans up after sessions whose process is gone (or that stopped heartbeating): their
    /// open records, and the unlinked inodes only they had open.
    fn clean_dead_sessions(&self) -> Result<usize> {
        let now = now_nanos();
        let sessions = self.engine.read(|tx| tx.sessions())?;
        let mut cleaned = 0;
        for (id, info, hb) in sessions {
            if id == self.sid() || !row_dead(&info, hb, now) {
                continue;
            }
            self.end_session(id)?;
            tracing::info!("cleaned up after dead session {id}");
            cleaned += 1;
        }
        Ok(cleaned)
    }

    fn lock_owner(&self, owner: u64) -> LockOwner {
        LockOwner {
            session: self.sid(),
            owner,
        }
    }

    pub(super) fn watch(&self, sink: ChangeSink) -> Result<bool> {
        // Pushed changes reach the cache first, then the caller: while they flow, the cache
        // answers; when they stop, it is off (and forgets) until they flow again.
        let (cache, pushed) = (self.cache.clone(), self.pushed.clone());
        let sink: ChangeSink = Box::new(move |c| {
            match &c {
                Change::Up => pushed.store(true, Ordering::Release),
                Change::Down => {
                    pushed.store(false, Ordering::Release);
                    cache.set_on(false);
                }
                _ => cache.changed(&c),
            }
            sink(c)
        });
        self.engine.watch(self.sid(), sink)
    }

    pub(super) fn new_session(&self, mut info: SessionInfo) -> Result<u64> {
        self.clean_dead_sessions()?;
        let now = now_nanos();
        info.started = now;
        info.heartbeat = now;
        let json = serde_json::to_string(&info).unwrap_or_default();
        let id = self.engine.single(|tx| tx.insert_session(&json, now))?;
        *self.session.lock() = id;
        // Slice ids taken before are not reserved by this session: start a fresh batch.
        *self.slices.lock() = IdPool { next: 0, end: 0 };
        self.share_opens()?;
        Ok(id)
    }

    pub(super) fn heartbeat(&self) -> Result<()> {
        let sid = self.sid();
        let alive = self
            .engine
            .single(|tx| tx.touch_session(sid, now_nanos()))?;
        if !alive && sid != 0 {
            tracing::warn!(
                "session {sid} was ended by another client (heartbeat too late?): files open \
                 here are no longer protected from unlinks elsewhere"
            );
        }
        self.clean_dead_sessions()?;
        self.reload_format()?;
        match self.purge_expired() {
            Ok(0) => {}
            Ok(n) => tracing::info!("trash: {n} expired entries deleted"),
            Err(e) => tracing::warn!("trash: purging expired entries: {e}"),
        }
        self.share_opens()
    }

    pub(super) fn report_staged(&self, blocks: u64, bytes: u64) -> Result<()> {
        let sid = self.sid();
        if sid == 0 {
            return Ok(());
        }
        self.engine.single(|tx| {
            let Some((_, info, _)) = tx.session(sid)? else {
                return Ok(());
            };
            let Ok(mut s) = serde_json::from_str::<SessionInfo>(&info) else {
                return Ok(());
            };
            s.staged_blocks = blocks;
            s.staged_bytes = bytes;
            let json = serde_json::to_string(&s).unwrap_or(info);
            tx.set_session_info(sid, &json)
        })
    }

    pub(super) fn close_session(&self) -> Result<()> {
        self.engine.unwatch();
        let sid = self.sid();
        if sid == 0 {
            return Ok(());
        }
        self.end_session(sid)?;
        *self.session.lock() = 0;
        *self.slices.lock() = IdPool { next: 0, end: 0 };
        self.sync()
    }

    pub(super) fn sessions(&self) -> Result<Vec<SessionInfo>> {
        let rows = self.engine.read(|tx| tx.sessions())?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, info, hb)| {
                let mut s: SessionInfo = serde_json::from_str(&info).ok()?;
                s.id = id;
                s.heartbeat = hb;
                Some(s)
            })
            .collect())
    }

    pub(super) fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<LockRange>> {
        let me = self.lock_owner(owner);
        let held = self.engine.read(|tx| tx.locks(ino))?;
        Ok(lock::conflict(&held, me, kind, start, end).map(|(_, r)| r))
    }

    pub(super) fn setlk(
        &self,
        ino: Ino,
        owner: u64,
        req: LockRequest,
    ) -> Result<Option<LockRange>> {
        let me = self.lock_owner(owner);
        lock::settle(
            || {
                // The inode's lock orders the lockers of one inode across clients.
                self.engine.write(&[ino], false, |tx| {
                    tx.lock_node(ino)?;
                    // Locks of sessions that ended are void.
                    tx.drop_orphan_locks(ino)?;
                    let held = tx.locks(ino)?;
                    let d = lock::decide(&held, me, req);
                    if let lock::Decision::Store(ranges) = &d {
                        tx.store_locks(ino, me, ranges)?;
                    }
                    Ok(d)
                })
            },
            |s| self.session_is_dead(s),
            || self.clean_dead_sessions(),
        )
        .inspect(|_| {
            // Programs that coordinate with locks read what the last holder wrote: a change
            // another client made may not have been pushed here yet, so after a lock
            // nothing is answered from what was known before it.
            if self.pushed.load(Ordering::Acquire) {
                self.cache.clear();
            }
        })
    }

    pub(super) fn open_inode(&self, ino: Ino) -> Result<Attr> {
        let t = self.opens.transition(ino);
        // Counted before the lookup: an unlink or a rename over the name committing after the
        // lookup then sees the open and keeps the inode.
        let (first, recorded) = self.opens.add(ino);
        if !(first && recorded) {
            drop(t);
            // Counting first is not enough where opens are counted in memory: a write
            // transaction in flight (an unlink, a rename over the name) may have found the
            // inode not open just before the count and be about to commit its deletion. Once
            // it has committed, the lookup below fails, or it saw the count and kept the inode.
            self.engine.settle_writes();
            // From the engine, not from memory: a write that committed its deletion before
            // the settle tells the cache after releasing the writer, so the cache may not
            // know yet (and close-to-open: an open sees what the last close elsewhere
            // committed, even before its change is pushed here).
            return self.fresh_attr(ino).inspect_err(|_| {
                let _ = self.close_inode(ino);
            });
        }
        // The first open here, recorded for other clients' unlinks to see: an unlink that
        // commits first leaves nothing to open (ENOENT) or an inode another client keeps; one
        // after sees the record and keeps the inode.
        let sid = self.sid();
        self.engine
            .single(|tx| tx.open_node(ino, sid))
            .inspect_err(|_| {
                self.opens.remove(ino);
            })
    }

    pub(super) fn close_inode(&self, ino: Ino) -> Result<()> {
        let _t = self.opens.transition(ino);
        let (last, recorded) = self.opens.remove(ino);
        if !last {
            return Ok(());
        }
        // The last close here. Most are of linked files: one statement forgets the open and
        // reads the link count (after any unlink holding the inode has committed).
        let sid = self.sid();
        // Not recorded (an engine that counts opens in memory): a read, after the writes in
        // flight, and among the changes grouped with them.
        let nlink = match recorded {
            true => self.engine.single(|tx| tx.close_node(ino, sid, recorded))?,
            false => self
                .engine
                .write_grouped(&[ino], false, |tx| tx.close_node(ino, sid, recorded))?,
        };
        if nlink.is_none_or(|n| n > 0) {
            return Ok(());
        }
        // Unlinked: the last close anywhere deletes it. Another client closing at the same
        // time waits for this lock, and the one that finds no open left deletes.
        self.reclaim_closed(ino)
    }

    /// The last close here of inode `ino`, unlinked: deletes it unless another client still
    /// has it open.
    fn reclaim_closed(&self, ino: Ino) -> Result<()> {
        let sid = self.sid();
        let e = self.epoch();
        let res = self.engine.write(&[ino], false, |tx| {
            let Some(a) = unless_gone(tx.lock_node(ino))? else {
                return Ok(());
            };
            if a.nlink == 0 {
                tx.delete_sustained(ino, Some(sid))?;
                if !tx.open_anywhere(ino)? {
                    tx.delete_sustained(ino, None)?;
                    self.delete_inode(tx, &a, now_nanos())?;
                }
            }
            Ok(())
        });
        self.cache.learn(e, &[Fact::Gone(ino)]);
        res
    }

    /// Notes that this client opened directory `ino`, and answers its attributes (from the
    /// cache when they are fresh). Unlike a file's, a directory's opens are counted here only,
    /// never recorded in the volume: a recorded open costs a round trip at opendir and
    /// another at releasedir (four of the ten a directory cost `rm -rf` on PostgreSQL), and a
    /// removed directory has nothing left to read. A directory removed here while open here is
    /// kept (nlink 0) until its last close here, as a file is; one removed by another client
    /// is gone at once for this one (its open handle lists nothing, and its attributes are
    /// ENOENT once the kernel asks again), as on NFS and JuiceFS.
    pub(super) fn open_dir(&self, ino: Ino) -> Result<Attr> {
        // Counted before the lookup, as a file's open is (an rmdir here committing after
        // the lookup sees it and keeps the inode).
        self.opens.add_dir(ino);
        self.getattr(ino).inspect_err(|_| {
            let _ = self.close_dir(ino);
        })
    }

    /// Notes a close of a directory: the last close here of one removed here while open
    /// deletes its kept inode (unless another client's file-like record holds it).
    pub(super) fn close_dir(&self, ino: Ino) -> Result<()> {
        if !self.opens.remove_dir(ino) {
            return Ok(());
        }
        self.reclaim_closed(ino)
    }

    /// Whether another client's live session is in the volume (read in `tx`).
    fn company(&self, tx: &mut dyn Txn) -> TxResult<bool> {
        let (sid, now) = (self.sid(), now_nanos());
        Ok(tx
            .sessions()?
            .iter()
            .any(|(id, info, hb)| *id != sid && !row_dead(info, *hb, now)))
    }

    /// See [`Meta::others_wrote`]. A process without a session that wrote (`quota set`,
    /// `fsck --repair`) is not company: this client stays alone, and forgets what its cache
    /// held (that process's change is of unknown extent).
    pub(super) fn others_wrote(&self) -> bool {
        match self.engine.others_wrote(&mut |tx| self.company(tx)) {
            None => false,
            Some(false) => {
                self.cache.clear();
                false
            }
            Some(true) => true,
        }
    }

    pub(super) fn set_alone(&self, alone: bool) {
        self.engine.group_writes(alone);
        self.alone.store(alone, Ordering::Release);
        self.epoch();
    }
}
