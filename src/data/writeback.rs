//! Write-back: staged blocks uploaded behind the application.
//!
//! Each key staged (see `data::stage`) is queued here; a bounded number of uploads run at
//! once, each retried with backoff for as long as the store refuses it (a store down for
//! minutes delays uploads, never drops one); the log says once that uploads fail and once
//! that they work again. A block is removed from the stage after its upload (and, for a
//! local-directory bucket, its fsync); a block whose slice was dropped meanwhile is deleted
//! from the bucket again.
//!
//! Not for: where blocks are staged (`data::stage`), or which slices exist (that is `meta`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::Shared;

/// The queue of staged keys and the state of their uploads.
pub(crate) struct Uploader {
    queue: mpsc::UnboundedSender<String>,
    /// Uploads are failing (logged once when it starts, once when it ends).
    failing: AtomicBool,
    /// Why uploads fail, while they do (see [`Uploader::trouble`]).
    trouble: parking_lot::Mutex<Option<String>>,
    /// Blocks uploaded from the stage since the start.
    pub(crate) uploaded: AtomicU64,
    /// Keys queued or being uploaded. A block unstaged while its upload runs leaves the
    /// stage empty before the upload ends (and deletes the object it put): unmount waits
    /// for this to reach zero too.
    pub(crate) busy: Arc<AtomicU64>,
}

impl Uploader {
    /// Starts the upload loop on `rt`; it runs until the runtime stops. `shared` is reached
    /// through a weak reference, so the loop does not keep the data store alive (it is
    /// made inside `Arc::new_cyclic`: the loop upgrades only once a key comes).
    /// `at_once` uploads run at a time (the store's `--max-uploads`).
    pub(crate) fn start(
        rt: &tokio::runtime::Runtime,
        shared: std::sync::Weak<Shared>,
        at_once: usize,
    ) -> Uploader {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let busy = Arc::new(AtomicU64::new(0));
        let done = busy.clone();
        rt.spawn(async move {
            let permits = Arc::new(Semaphore::new(at_once.max(1)));
            while let Some(key) = rx.recv().await {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let done = done.clone();
                tokio::spawn(async move {
                    upload(&shared, &key).await;
                    done.fetch_sub(1, Ordering::AcqRel);
                    drop(permit);
                });
            }
        });
        Uploader {
            queue: tx,
            failing: AtomicBool::new(false),
            trouble: parking_lot::Mutex::new(None),
            uploaded: AtomicU64::new(0),
            busy,
        }
    }

    pub(crate) fn enqueue(&self, key: String) {
        self.busy.fetch_add(1, Ordering::AcqRel);
        // The loop ends only with the runtime; a key sent after stays staged for the next mount.
        if self.queue.send(key).is_err() {
            self.busy.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Keys queued or being uploaded (see `busy`).
    pub(crate) fn busy(&self) -> u64 {
        self.busy.load(Ordering::Acquire)
    }

    /// Why uploads fail, while the last attempt failed: the store's error, on one line.
    pub(crate) fn trouble(&self) -> Option<String> {
        self.trouble.lock().clone()
    }
}

/// Uploads one staged block, retrying until it is in the bucket or no longer staged.
async fn upload(shared: &Shared, key: &str) {
    let (Some(stage), Some(up)) = (&shared.stage, &shared.uploader) else {
        return;
    };
    let mut backoff = Duration::from_millis(200);
    let len = super::layout::parse_block_key(key).map_or(0, |(_, _, l)| l as usize);
    loop {
        // The block read back from the stage (and, for a pack, its encoded copy) is in
        // flight during each attempt; not while waiting to try again (a store down for
        // minutes must not starve readers of room).
        let room = shared.budget.take(len * 2).await;
        let raw = stage.is_raw(key);
        let read = {
            let (stage, key) = (stage.clone(), key.to_string());
            tokio::task::spawn_blocking(move || stage.read(&key)).await
        };
        let body = match read {
            Ok(Ok(Some(b))) if raw => encode_raw(shared, key, b).await,
            Ok(Ok(Some(b))) => b,
            Ok(Ok(None)) => return, // its slice was dropped meanwhile
            _ if !stage.contains(key) => return, // removed while being read
            Ok(Err(e)) => return lost(shared, key, &e.to_string()).await,
            Err(e) => return lost(shared, key, &e.to_string()).await,
        };
        let put = async {
            shared.obj.put(key, body.clone()).await?;
            shared.obj.sync(&[key.to_string()])
        };
        match put.await {
            Ok(()) => {
                let (left, copy) = leave_stage(shared, stage, key, raw);
                if copy {
                    // Without checksums the object put is the data itself.
                    shared.cache_on_disk(key, &body, Some(body.clone())).await;
                }
                match left {
                    Some(id) => shared.release(id),
                    // Dropped while uploading: the object has no slice left.
                    None => {
                        let _ = shared.obj.delete(key).await;
                    }
                }
                up.uploaded.fetch_add(1, Ordering::Relaxed);
                *up.trouble.lock() = None;
                if up.failing.swap(false, Ordering::Relaxed) {
                    let (blocks, bytes) = stage.usage();
                    tracing::info!(
                        "uploads of staged blocks work again; {blocks} blocks ({bytes} bytes) \
                         still to upload"
                    );
                }
                return;
            }
            Err(e) => {
                if e.errno() == libc::ENOSPC {
                    // A local disk out of room: made at the next round (`data::room`).
                    shared.room.ask();
                }
                *up.trouble.lock() = Some(crate::object::one_line(&e.to_string()));
                if !up.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "uploading staged blocks fails ({e}); they stay staged on local disk \
                         and are retried until the store takes them; writes go on into the \
                         staging area"
                    );
                }
                drop(room);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Removes an uploaded block from the stage, into the disk cache if there is one: the file
/// itself moves where it already holds the object as the cache keeps it (checksums on, not
/// raw). Returns its slice id, if it was still staged, and whether the object put must be
/// written into the cache instead.
fn leave_stage(
    shared: &Shared,
    stage: &super::stage::Stage,
    key: &str,
    raw: bool,
) -> (Option<u64>, bool) {
    let Some(disk) = &shared.disk else {
        return (stage.remove(key), false);
    };
    if shared.format.checksums && !raw {
        return (stage.remove_with(key, |path| disk.adopt(key, path)), false);
    }
    let id = stage.remove(key);
    (id, id.is_some())
}

/// The object of a raw staged block (a pack, `data::pack`): its bytes padded with zeros to
/// the length its key declares, then encoded as any block.
async fn encode_raw(shared: &Shared, key: &str, raw: bytes::Bytes) -> bytes::Bytes {
    let len = super::layout::parse_block_key(key).map_or(raw.len(), |(_, _, l)| l as usize);
    let mut data = raw.to_vec();
    data.resize(len, 0);
    let parts = shared.encode_async(key, data.into()).await;
    match parts.len() {
        1 => parts.into_iter().next().expect("one part"),
        _ => parts.concat().into(),
    }
}

/// A staged block that can no longer be read: its data is gone unless the bucket has it.
async fn lost(shared: &Shared, key: &str, problem: &str) {
    match shared.obj.get_range(key, 0..1).await {
        Ok(_) => {}
        Err(crate::object::Error::NotFound(_)) => tracing::error!(
            "staged block {key} cannot be read ({problem}) and is not in the bucket: the files \
             holding it read as EIO (`unkai fsck` names them)"
        ),
        Err(e) => tracing::error!(
            "staged block {key} cannot be read ({problem}), and whether the bucket has it is \
             unknown ({e}): if it does not, the files holding it read as EIO (`unkai fsck` \
             names them)"
        ),
    }
    shared.unstage(key);
}
