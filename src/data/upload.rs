//! Uploading the blocks of one slice: each block is put in the background as soon as it is
//! complete; `wait` returns once all are in the bucket (or reports the failure; the data stays
//! with the caller, who may retry).
//!
//! Not for: deciding when a block is complete (that is `vfs::writer`).

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::{DataStore, Error, Result};

pub struct SliceUpload {
    store: DataStore,
    id: u64,
    tasks: Vec<(u32, Bytes, JoinHandle<Result<String>>)>,
    done: Vec<String>,
}

impl SliceUpload {
    pub fn new(store: &DataStore, id: u64) -> SliceUpload {
        SliceUpload {
            store: store.clone(),
            id,
            tasks: Vec::new(),
            done: Vec::new(),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Starts uploading block `index` of the slice.
    pub fn put_block(&mut self, index: u32, block: Bytes) {
        let handle = self.spawn(index, block.clone());
        self.tasks.push((index, block, handle));
    }

    fn spawn(&self, index: u32, block: Bytes) -> JoinHandle<Result<String>> {
        let shared = self.store.shared.clone();
        let key = shared.format.block_key(self.id, index, block.len() as u32);
        // The object layer retries transient failures; what comes back here is final.
        self.store.runtime().spawn(async move {
            let body = if shared.format.checksums {
                super::block::encode(&block)
            } else {
                block.clone()
            };
            shared.obj.put(&key, body).await?;
            shared.cache.put(&key, block);
            Ok(key)
        })
    }

    /// Collects uploads that already finished without waiting for the others; returns the
    /// first failure (the failed block is started again, as in `wait`).
    pub fn poll(&mut self) -> Result<()> {
        let mut first_err = None;
        for (index, block, handle) in std::mem::take(&mut self.tasks) {
            if !handle.is_finished() {
                self.tasks.push((index, block, handle));
                continue;
            }
            match self
                .store
                .block_on(handle)
                .unwrap_or_else(|e| Err(Error::Task(e.to_string())))
            {
                Ok(key) => self.done.push(key),
                Err(e) => {
                    tracing::error!("block {index} of slice {} not stored: {e}", self.id);
                    let again = self.spawn_later(index, block);
                    self.tasks.push(again);
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for every block; returns the keys written. On failure the failed blocks are
    /// kept and started again by the next call.
    pub fn wait(&mut self) -> Result<Vec<String>> {
        let tasks = std::mem::take(&mut self.tasks);
        let mut first_err = None;
        for (index, block, handle) in tasks {
            let res = self
                .store
                .block_on(handle)
                .unwrap_or_else(|e| Err(Error::Task(e.to_string())));
            match res {
                Ok(key) => self.done.push(key),
                Err(e) => {
                    tracing::error!("block {index} of slice {} not stored: {e}", self.id);
                    // Keep it for a retry: a fresh upload of the same bytes.
                    let again = self.spawn_later(index, block);
                    self.tasks.push(again);
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(self.done.clone()),
        }
    }

    /// A failed block, queued to be uploaded again at the next `wait`.
    fn spawn_later(&self, index: u32, block: Bytes) -> (u32, Bytes, JoinHandle<Result<String>>) {
        let handle = self.spawn(index, block.clone());
        (index, block, handle)
    }

    /// Stops every upload still running and returns the keys of all blocks that did reach
    /// the bucket (so that the caller can delete them).
    pub fn cancel(&mut self) -> Vec<String> {
        for (_, _, handle) in &self.tasks {
            handle.abort();
        }
        for (_, _, handle) in std::mem::take(&mut self.tasks) {
            if let Ok(Ok(key)) = self.store.block_on(handle) {
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
