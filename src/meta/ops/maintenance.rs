//! What gc and fsck read and mend: dead slices (after the trash's days, or early when the
//! disk is short), every slice's references, scans of every inode, entry and chunk, the
//! names an inode has, raw row access for checks, and the repairs fsck decides.
//!
//! Not for: deciding what is garbage or damaged (`garbage`, `admin::gc`, `admin::fsck`), the
//! trash's purges (`meta::trash`), or SQL (the engines).

use super::*;

impl<E: Engine> EngineMeta<E> {
    /// Runs `f`, which only reads, on committed changes only (grouped ones committed first):
    /// what is deleted from the bucket is decided from them.
    pub(super) fn read_committed<T>(
        &self,
        f: impl FnMut(&mut dyn Txn) -> TxResult<T>,
    ) -> Result<T> {
        self.engine.commit_group()?;
        self.engine.read(f)
    }

    pub(super) fn dead_slices(&self, limit: usize) -> Result<Vec<DeadSlice>> {
        let cutoff = now_nanos() - self.format.read().trash_days as i64 * 86_400 * 1_000_000_000;
        self.read_committed(|tx| tx.dead_slices(Some(cutoff), limit))
    }

    pub(super) fn read_rows(&self, f: &mut dyn FnMut(&mut dyn Txn) -> TxResult<()>) -> Result<()> {
        self.engine.commit_group()?;
        self.engine.snapshot(|tx| f(tx))
    }

    pub(super) fn repair(&self, fix: &Fix) -> Result<()> {
        let now = now_nanos();
        self.cache.clear();
        self.engine.write(&[], false, |tx| {
            match fix {
                Fix::RemoveEntry { parent, name } => tx.remove_edge_named(*parent, name)?,
                Fix::SetEntryKind { parent, name, kind } => {
                    tx.set_edge_kind(*parent, name, *kind)?
                }
                Fix::SetNlink { ino, nlink } => {
                    if let Some(mut a) = unless_gone(tx.lock_node(*ino))? {
                        a.nlink = *nlink;
                        tx.update_node(&a)?;
                    }
                }
                Fix::SetParent { ino, parent } => {
                    if let Some(mut a) = unless_gone(tx.lock_node(*ino))? {
                        a.parent = *parent;
                        tx.update_node(&a)?;
                    }
                }
                Fix::DeleteInode { ino } => {
                    let a = tx.lock_node(*ino)?;
                    self.delete_inode(tx, &a, now)?;
                    tx.delete_sustained(*ino, None)?;
                    tx.delete_open(*ino, None)?;
                }
                Fix::Link {
                    ino,
                    parent,
                    name,
                    kind,
                } => tx.insert_edge(*parent, name, *ino, *kind)?,
                Fix::DropChunk { ino, index } => {
                    let recs = tx.drop_chunks(*ino, *index as u64, *index as u64 + 1)?;
                    tx.decref(&recs.concat(), now)?;
                }
                Fix::SetSliceRefs { id, size, refs } => {
                    tx.set_slice_refs(*id, *size, *refs, now)?
                }
                Fix::UndeadSlice { id } => tx.forget_dead(&[*id])?,
                Fix::RemoveSustained { session, ino } => {
                    tx.delete_sustained(*ino, Some(*session))?;
                    tx.delete_open(*ino, Some(*session))?;
                }
                Fix::SetUsage { used_bytes, inodes } => tx.set_usage(*used_bytes, *inodes)?,
                Fix::SetStored { ino, stored } => {
                    if let Some(mut a) = unless_gone(tx.lock_node(*ino))? {
                        a.stored = *stored;
                        tx.update_node(&a)?;
                    }
                }
            }
            Ok(())
        })
    }
}
