//! File contents as slices: writes of slices, reads of a chunk's records, truncate,
//! fallocate, copy_file_range, compaction's replacement of a chunk's slices, the chunks seen
//! fragmenting, and slice ids (taken in batches and reserved by this session).
//!
//! Not for: the bytes themselves (`data`), encoding a chunk's records (`meta::slice`),
//! attributes other than size and times (`attrs`), or SQL (the engines).

use super::*;

/// Records a chunk may gather before it is offered to compaction.
const FRAGMENTED_AT: usize = 16;

fn data_changed(ino: Ino) -> Change {
    Change::Inode { ino, data: true }
}

impl<E: Engine> EngineMeta<E> {
    /// After a change of a file's contents or size, now `a`.
    fn stored(&self, epoch: Option<u64>, a: &Attr) {
        self.cache.learn(epoch, &[Fact::Attr(a.clone())]);
        self.engine.publish(|| vec![data_changed(a.ino)])
    }

    /// A slice id. A batch taken from the counter is recorded, in the same transaction, as
    /// reserved by this session: until the session ends (or trims it, see
    /// [`Meta::trim_reserved`]), `gc` leaves the objects of these ids alone, since an upload
    /// of them may still be committed. (Without a session, e.g. in tools, nothing is reserved.)
    pub(super) fn alloc_slice(&self) -> Result<u64> {
        let mut p = self.slices.lock();
        if p.next >= p.end {
            let sid = self.sid();
            let start = self.engine.write(&[], false, |tx| {
                let start = tx.take_ids("nextSlice", ID_BATCH)?;
                if sid != 0 {
                    tx.reserve_slices(sid, start, start + ID_BATCH)?;
                }
                Ok(start)
            })?;
            p.next = start;
            p.end = start + ID_BATCH;
        }
        let id = p.next;
        p.next += 1;
        Ok(id)
    }

    fn note_fragmented(&self, ino: Ino, index: u32, count: usize) {
        if count >= FRAGMENTED_AT {
            self.fragmented.lock().insert((ino, index), count);
        }
    }

    /// Locks a regular file: EISDIR for a directory, `other` for any other kind.
    fn lock_file(tx: &mut dyn Txn, ino: Ino, other: i32) -> TxResult<Attr> {
        let a = tx.lock_node(ino)?;
        match a.kind {
            Kind::File => Ok(a),
            Kind::Dir => fail(libc::EISDIR),
            _ => fail(other),
        }
    }

    /// Writes a file's new length and (if `time`) its mtime and ctime, counting the change of
    /// its size from `old_len` in the volume's usage.
    fn store_file(
        &self,
        tx: &mut dyn Txn,
        a: &mut Attr,
        old_len: u64,
        time: Option<Nanos>,
    ) -> TxResult<()> {
        let max = self.format.read().capacity;
        let grown = align4k(a.length) - align4k(old_len);
        tx.charge(grown, 0, max, 0)?;
        self.quota_file_grew(tx, a.ino, grown)?;
        if let Some(t) = time {
            a.mtime = t;
            a.ctime = t;
        }
        tx.update_node(a)
    }

    /// Appends records to chunks of `a`, `(chunk index, record)` sorted by chunk, and counts
    /// in `a.stored` the holes they fill and the data they zero.
    fn append(&self, tx: &mut dyn Txn, a: &mut Attr, recs: &[(u32, SliceRec)]) -> TxResult<()> {
        for (index, recs) in slice::by_chunk(recs) {
            let list = tx.append_chunk(a.ino, index, &recs)?;
            self.note_fragmented(a.ino, index, list.len());
            let before = &list[..list.len().saturating_sub(recs.len())];
            let (after, was) = slice::covered_change(before, &list[before.len()..]);
            a.stored = (a.stored + after).saturating_sub(was);
        }
        Ok(())
    }

    pub(super) fn truncate(&self, _ctx: &Ctx, ino: Ino, length: u64) -> Result<Attr> {
        if length > MAX_FILE_SIZE {
            return sys(libc::EFBIG);
        }
        let e = self.epoch();
        self.engine
            .write(&[ino], false, |tx| {
                let mut a = Self::lock_file(tx, ino, libc::EINVAL)?;
                check_protected(&a)?;
                let now = now_nanos();
                if length < a.length {
                    let dropped = tx.drop_chunks(ino, length.div_ceil(CHUNK_SIZE), u64::MAX)?;
                    let gone: u64 = dropped.iter().map(|c| slice::covered(c)).sum();
                    a.stored = a.stored.saturating_sub(gone);
                    tx.decref(&dropped.concat(), now)?;
                    let pos = length % CHUNK_SIZE;
                    if pos != 0 {
                        let index = (length / CHUNK_SIZE) as u32;
                        let recs = tx.chunk(ino, index)?;
                        if recs.iter().any(|r| r.end() > pos) {
                            let z = SliceRec::zero(pos as u32, (CHUNK_SIZE - pos) as u32);
                            self.append(tx, &mut a, &[(index, z)])?;
                        }
                    }
                }
                let old = a.length;
                a.length = length;
                self.store_file(tx, &mut a, old, Some(now))?;
                Ok(a)
            })
            .inspect(|a| self.stored(e, a))
    }

    pub(super) fn fallocate(
        &self,
        _ctx: &Ctx,
        ino: Ino,
        mode: FallocMode,
        off: u64,
        len: u64,
    ) -> Result<Attr> {
        let end = off.checked_add(len).filter(|e| *e <= MAX_FILE_SIZE);
        let Some(end) = end else {
            return sys(libc::EFBIG);
        };
        if len == 0 {
            return sys(libc::EINVAL);
        }
        let e = self.epoch();
        self.engine
            .write(&[ino], false, |tx| {
                let mut a = Self::lock_file(tx, ino, libc::ENODEV)?;
                // As Linux: nothing on an immutable file, only allocation on an append-only.
                let reshapes = mode.punch_hole || mode.zero_range;
                if a.flags & flags::IMMUTABLE != 0 || (a.flags & flags::APPEND != 0 && reshapes) {
                    return fail(libc::EPERM);
                }
                let now = now_nanos();
                // As ext4: a punched hole is stored no more (and nothing is punched past the
                // end); a zeroed range stays allocated, as unwritten extents; an allocation
                // reserves the holes of the range, data left as it is. A reservation counts
                // as stored (`st_blocks`), so writing into it later grows nothing.
                let recs = if mode.punch_hole {
                    slice::zero_recs(off, end.min(a.length))
                } else if mode.zero_range {
                    slice::reserved_recs(off, end)
                } else {
                    slice::reserve_holes(off, end, |i| tx.chunk(ino, i))?
                };
                if !recs.is_empty() {
                    self.append(tx, &mut a, &recs)?;
                }
                let old = a.length;
                if !mode.keep_size && !mode.punch_hole && end > a.length {
                    a.length = end;
                }
                let touched = a.length != old || mode.punch_hole || mode.zero_range;
                self.store_file(tx, &mut a, old, touched.then_some(now))?;
                Ok(a)
            })
            .inspect(|a| self.stored(e, a))
    }

    pub(super) fn reserved_slices(&self) -> Result<Vec<(u64, u64, u64)>> {
        let now = now_nanos();
        let (sessions, ranges) = self
            .engine
            .snapshot(|tx| Ok((tx.sessions()?, tx.reserved_slices()?)))?;
        let live: std::collections::HashSet<u64> = sessions
            .into_iter()
            .filter(|(_, info, hb)| !row_dead(info, *hb, now))
            .map(|(id, _, _)| id)
            .collect();
        Ok(ranges
            .into_iter()
            .filter(|(s, _, _)| live.contains(s))
            .collect())
    }

    pub(super) fn slice_id_floor(&self) -> u64 {
        // Ids come from the pool in order; the next batch starts at or after its end.
        self.slices.lock().next
    }

    pub(super) fn trim_reserved(&self, below: u64) -> Result<()> {
        let sid = self.sid();
        if sid == 0 {
            return Ok(());
        }
        // Never past the ids this client still holds in its pool.
        let below = below.min(self.slices.lock().next);
        self.engine
            .write(&[], false, |tx| tx.release_slices(sid, Some(below)))
    }

    pub(super) fn write_slices(
        &self,
        ino: Ino,
        slices: &[(u32, SliceRec)],
        mtime: Option<Nanos>,
    ) -> Result<Attr> {
        let e = self.epoch();
        self.engine
            .write(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                if a.kind != Kind::File {
                    return fail(libc::EBADF);
                }
                if a.flags & flags::IMMUTABLE != 0 {
                    return fail(libc::EPERM);
                }
                let old = a.length;
                let recs: Vec<SliceRec> = slices.iter().map(|(_, r)| *r).collect();
                tx.incref(&recs)?;
                for (index, r) in slices {
                    a.length = a.length.max(*index as u64 * CHUNK_SIZE + r.end());
                }
                self.append(tx, &mut a, slices)?;
                self.store_file(tx, &mut a, old, mtime)?;
                Ok(a)
            })
            .inspect(|a| self.stored(e, a))
    }

    /// See [`Meta::attach_external`].
    pub(super) fn attach_external(
        &self,
        ino: Ino,
        parts: &[External],
        mtime: Nanos,
    ) -> Result<Attr> {
        let e = self.epoch();
        // Grouped: an import's files commit many at a time (no byte waits on these rows: the
        // objects are already in their bucket). A kill between the group of a file's mknod and
        // that of its attach leaves it empty: `unkai import --refresh` attaches it again.
        self.engine
            .write_grouped(&[ino], false, |tx| {
                let mut a = tx.lock_node(ino)?;
                if a.kind != Kind::File {
                    return fail(libc::EBADF);
                }
                if a.length != 0 || a.flags & flags::IMMUTABLE != 0 {
                    return fail(libc::EPERM);
                }
                let first = tx.take_ids("nextSlice", parts.len() as u64)?;
                let mut slices = Vec::with_capacity(parts.len());
                for (i, p) in parts.iter().enumerate() {
                    let id = (first + i as u64) | slice::EXTERNAL;
                    tx.insert_external(&External { id, ..p.clone() })?;
                    let index = (p.base / CHUNK_SIZE) as u32;
                    let rec = SliceRec {
                        pos: 0,
                        id,
                        size: p.size,
                        off: 0,
                        len: p.size,
                    };
                    slices.push((index, rec));
                }
                let old = a.length;
                let recs: Vec<SliceRec> = slices.iter().map(|(_, r)| *r).collect();
                tx.incref(&recs)?;
                for (index, r) in &slices {
                    a.length = a.length.max(*index as u64 * CHUNK_SIZE + r.end());
                }
                self.append(tx, &mut a, &slices)?;
                self.store_file(tx, &mut a, old, Some(mtime))?;
                Ok(a)
            })
            .inspect(|a| self.stored(e, a))
    }

    pub(super) fn copy_range(
        &self,
        _ctx: &Ctx,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
    ) -> Result<(u64, Attr)> {
        let e = self.epoch();
        self.engine
            .write(&[src, dst], false, |tx| {
                let (s, mut d) = tx.lock_two(src, dst)?;
                if s.kind == Kind::Dir || d.kind == Kind::Dir {
                    return fail(libc::EISDIR);
                }
                if s.kind != Kind::File || d.kind != Kind::File {
                    return fail(libc::EINVAL);
                }
                if d.flags & flags::IMMUTABLE != 0 {
                    return fail(libc::EPERM);
                }
                if d.flags & flags::APPEND != 0 {
                    return fail(libc::EBADF);
                }
                if src_off >= s.length || len == 0 {
                    return Ok((0, d));
                }
                let len = len.min(s.length - src_off);
                if dst_off.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE) {
                    return fail(libc::EFBIG);
                }
                if src == dst && src_off < dst_off + len && dst_off < src_off + len {
                    return fail(libc::EINVAL);
                }
                // Destination records, computed from the source as it is before the copy.
                let out = slice::plan_copy(src_off, dst_off, len, |index| tx.chunk(src, index))?;
                let recs: Vec<SliceRec> = out.iter().map(|(_, r)| *r).collect();
                tx.incref(&recs)?;
                self.append(tx, &mut d, &out)?;
                let now = now_nanos();
                let old = d.length;
                d.length = d.length.max(dst_off + len);
                self.store_file(tx, &mut d, old, Some(now))?;
                Ok((len, d))
            })
            .inspect(|(_, d)| self.stored(e, d))
    }

    pub(super) fn replace_slices(
        &self,
        ino: Ino,
        index: u32,
        old: &[SliceRec],
        new: &[SliceRec],
    ) -> Result<bool> {
        let e = self.epoch();
        let res = self.engine.write(&[ino], false, |tx| {
            // The inode's lock keeps writers of this chunk out until we are done.
            let Some(mut a) = unless_gone(tx.lock_node(ino))? else {
                return Ok(false);
            };
            let cur = tx.chunk(ino, index)?;
            if cur.len() < old.len() || cur[..old.len()] != *old {
                return Ok(false);
            }
            let mut list = new.to_vec();
            list.extend_from_slice(&cur[old.len()..]);
            tx.incref(new)?;
            tx.decref(old, now_nanos())?;
            tx.set_chunk(ino, index, &list)?;
            let (after, before) = (slice::covered(&list), slice::covered(&cur));
            if after != before {
                a.stored = (a.stored + after).saturating_sub(before);
                tx.update_node(&a)?;
            }
            Ok(true)
        });
        self.cache.learn(e, &[Fact::Stale(ino)]);
        res
    }

    pub(super) fn fragmented_chunks(
        &self,
        min_records: usize,
        limit: usize,
    ) -> Result<Vec<(Ino, u32)>> {
        let mut f = self.fragmented.lock();
        let picked: Vec<(Ino, u32)> = f
            .iter()
            .filter(|(_, n)| **n >= min_records)
            .map(|(k, _)| *k)
            .take(limit)
            .collect();
        for k in &picked {
            f.remove(k);
        }
        Ok(picked)
    }
}
