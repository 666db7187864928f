//! Uploading the blocks of one slice: each block is put in the background as soon as it is
//! complete (or, given just before the wait, by the waiting thread itself); `wait` returns
//! once all are in the bucket, or staged on local disk with write-back (`data::stage`), or
//! reports the failure (the data stays with the caller, who may retry). A slice counts as in
//! flight from its start until its upload is dropped (after its commit, or once abandoned):
//! see [`DataStore::in_flight_floor`].
//!
//! Not for: deciding when a block is complete (that is `vfs::writer`).

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::{DataStore, Error, Result};
use crate::object::Payload;

pub struct SliceUpload {
    store: DataStore,
    id: u64,
    /// Blocks not yet known to be stored, each with its running upload. A failed block is
    /// started again at once, in the background; `wait` gives a block whose upload already
    /// failed one more fresh attempt, so an `fsync` after the store came back succeeds
    /// even if the background attempt failed while it was still down.
    tasks: Vec<(u32, Bytes, JoinHandle<Result<String>>)>,
    /// The block given with [`SliceUpload::put_block_at_wait`], not started yet.
    at_wait: Option<(u32, Bytes)>,
    done: Vec<String>,
}

impl SliceUpload {
    /// Starts a slice whose id `alloc` takes (from the metadata), counted in flight until
    /// the upload is dropped: keep it until the slice is committed. The id is taken under the
    /// lock of what is in flight, so that [`DataStore::in_flight_floor`] never misses it.
    pub fn start<E>(
        store: &DataStore,
        alloc: impl FnOnce() -> std::result::Result<u64, E>,
    ) -> std::result::Result<SliceUpload, E> {
        let mut live = store.shared.in_flight.lock();
        let id = alloc()?;
        *live.entry(id).or_default() += 1;
        drop(live);
        Ok(SliceUpload {
            store: store.clone(),
            id,
            tasks: Vec::new(),
            at_wait: None,
            done: Vec::new(),
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Starts uploading block `index` of the slice.
    pub fn put_block(&mut self, index: u32, block: Bytes) {
        let handle = self.spawn(index, block.clone());
        self.tasks.push((index, block, handle));
    }

    /// Gives block `index` of the slice to upload at the next [`SliceUpload::wait`], which
    /// follows at once, on the waiting thread itself, not handed to the runtime's threads
    /// and waited for (one given before it goes up in the background now). A small file's one block at its
    /// flush (a `tar -x` on PostgreSQL, write-through: one put per file, in the chain of
    /// each file's calls) saves the hops between threads, two wake-ups each.
    pub fn put_block_at_wait(&mut self, index: u32, block: Bytes) {
        if let Some((i, b)) = self.at_wait.replace((index, block)) {
            self.put_block(i, b);
        }
    }

    fn spawn(&self, index: u32, block: Bytes) -> JoinHandle<Result<String>> {
        self.store.runtime().spawn(self.upload(index, block))
    }

    /// The upload of block `index`: its key once stored (staged, with write-back), or the
    /// final failure.
    fn upload(
        &self,
        index: u32,
        block: Bytes,
    ) -> impl std::future::Future<Output = Result<String>> + Send + 'static {
        let shared = self.store.shared.clone();
        let id = self.id;
        let key = shared.layout.block_key(id, index, block.len() as u32);
        // The object layer retries transient failures; what comes back here is final.
        async move {
            // The object (the block, which its parts share, not copy, and its checksums; or
            // its encoded copy beside it) is in flight until stored.
            let most = *shared.layout.object_sizes(block.len() as u32).end() as usize;
            let room = match shared.whole_only() {
                true => block.len() + most,
                false => most,
            };
            let mut budget = Some(shared.budget.take(room).await);
            let body: Payload = shared
                .encode_async(&key, block.clone())
                .await
                .into_iter()
                .collect();
            let staged = match shared.stage.clone().filter(|_| shared.stages_blocks) {
                Some(st) => {
                    // Held before the block is visible, so its upload cannot release first;
                    // staged and queued in one step, so that a task aborted meanwhile (a
                    // discarded write) leaves no block staged that nothing will upload.
                    shared.hold(id);
                    let (sh, k, b, wait) =
                        (shared.clone(), key.clone(), body.clone(), shared.stage_wait);
                    let res = tokio::task::spawn_blocking(move || {
                        if let Err(e) = st.put(&k, id, b.as_ref(), wait) {
                            sh.release(id);
                            return Err(e);
                        }
                        if let Some(up) = &sh.uploader {
                            up.enqueue(k);
                        }
                        Ok(())
                    })
                    .await
                    .unwrap_or_else(|e| {
                        Err(super::stage::StageError::Io {
                            key: key.clone(),
                            dir: Default::default(),
                            source: std::io::Error::other(e.to_string()),
                        })
                    });
                    match res {
                        Ok(()) => {
                            shared.cache.put(&key, block);
                            return Ok(key);
                        }
                        Err(e) => Some(e),
                    }
                }
                None => None,
            };
            if let Some(e) = &staged {
                tracing::warn!("{e}: storing the block directly in the bucket");
            }
            // A local disk out of room: the block waits for room to be made (the oldest
            // trash deleted, `data::room`), its bytes no longer counted in flight meanwhile.
            let mut refused = None;
            let put = loop {
                match shared.obj.put(&key, body.clone()).await {
                    Err(e) if e.errno() == libc::ENOSPC => {
                        let since = *refused.get_or_insert_with(tokio::time::Instant::now);
                        budget = None;
                        if !shared.room.wait(since).await {
                            break Err(e);
                        }
                        budget = Some(shared.budget.take(room).await);
                    }
                    res => break res,
                }
            };
            drop(budget);
            match put {
                Ok(()) => {}
                Err(put) => {
                    return Err(match staged {
                        Some(stage) => Error::NoRoom {
                            stage: stage.to_string(),
                            put: put.to_string(),
                        },
                        None => put.into(),
                    });
                }
            }
            shared.cache.put(&key, block);
            Ok(key)
        }
    }

    /// Takes the result of a finished upload: the key, or the failure (the block is then
    /// started again in the background).
    fn settle(
        &mut self,
        index: u32,
        block: Bytes,
        handle: JoinHandle<Result<String>>,
    ) -> Result<()> {
        let res = self
            .store
            .block_on(handle)
            .unwrap_or_else(|e| Err(Error::Task(e.to_string())));
        match res {
            Ok(key) => {
                self.done.push(key);
                Ok(())
            }
            Err(e) => {
                tracing::error!("block {index} of slice {} not stored: {e}", self.id);
                let again = self.spawn(index, block.clone());
                self.tasks.push((index, block, again));
                Err(e)
            }
        }
    }

    /// Collects uploads that already finished without waiting for the others; returns the
    /// first new failure.
    pub fn poll(&mut self) -> Result<()> {
        let mut first_err = None;
        for (index, block, handle) in std::mem::take(&mut self.tasks) {
            if handle.is_finished() {
                if let Err(e) = self.settle(index, block, handle) {
                    first_err.get_or_insert(e);
                }
            } else {
                self.tasks.push((index, block, handle));
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for every block and returns the keys written. A block whose background upload
    /// already failed is tried once more first. On failure the failed blocks are kept (and
    /// started again) for the next call.
    pub fn wait(&mut self) -> Result<Vec<String>> {
        let mut first_err = None;
        let mut again = None;
        if let Some((index, block)) = self.at_wait.take() {
            match self.store.block_on(self.upload(index, block.clone())) {
                Ok(key) => self.done.push(key),
                Err(e) => {
                    // Started again in the background, as a failed block waited for is.
                    tracing::error!("block {index} of slice {} not stored: {e}", self.id);
                    again = Some((index, block));
                    first_err = Some(e);
                }
            }
        }
        // Failures that happened before this call were reported already (by `poll` or an
        // earlier `wait`): they get a fresh attempt now instead.
        for (index, block, handle) in std::mem::take(&mut self.tasks) {
            if handle.is_finished() {
                let _ = self.settle(index, block, handle);
            } else {
                self.tasks.push((index, block, handle));
            }
        }
        for (index, block, handle) in std::mem::take(&mut self.tasks) {
            if let Err(e) = self.settle(index, block, handle) {
                first_err.get_or_insert(e);
            }
        }
        if let Some((index, block)) = again {
            self.put_block(index, block);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(self.done.clone()),
        }
    }

    /// Stops every upload still running (with write-back: waits for them) and returns the
    /// keys of all blocks that did reach the bucket or the stage (so that the caller can
    /// delete them).
    pub fn cancel(&mut self) -> Vec<String> {
        // Never started: nothing of them was stored.
        self.at_wait = None;
        let running: Vec<_> = std::mem::take(&mut self.tasks)
            .into_iter()
            .map(|(_, _, h)| h)
            .collect();
        // A staging write is not stopped by an abort (it runs on a blocking thread and goes
        // on): its block would stay staged and go up with nothing to delete it. Staging is
        // local and quick, so with write-back the tasks are waited for instead, and every
        // block they stored is returned.
        if !self.store.stages_blocks() {
            for h in &running {
                h.abort();
            }
        }
        for h in running {
            if let Ok(Ok(key)) = self.store.block_on(h) {
                self.done.push(key);
            }
        }
        std::mem::take(&mut self.done)
    }

    /// Keys of blocks uploaded so far.
    pub fn keys(&self) -> &[String] {
        &self.done
    }
}

impl Drop for SliceUpload {
    fn drop(&mut self) {
        self.store.shared.release(self.id);
    }
}
