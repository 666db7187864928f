//! Object bytes between HTTP bodies and vfs handles, ~1 MiB at a time: a request body
//! written into an open file (hashing it with MD5 on the way, for the ETag), and a range of
//! an open file streamed out as a response body. Never a whole object in memory; every vfs
//! call on a blocking thread.
//!
//! Not for: which file is opened, or what happens to it afterwards (`objects`).

use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use md5::{Digest, Md5};
use s3s::dto::StreamingBlob;
use s3s::{S3Error, S3ErrorCode, S3Result};

use super::error::{Missing, s3_error};
use crate::vfs::{self, Vfs};

/// Bytes per vfs call.
pub const CHUNK: usize = 1 << 20;

/// Runs `f` (vfs calls) on a blocking thread.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> S3Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        S3Error::with_message(S3ErrorCode::InternalError, format!("a request failed: {e}"))
    })
}

/// Writes `data` at `off` of open file `fh`, all of it.
fn write_all(vfs: &Vfs, fh: u64, mut off: u64, mut data: &[u8]) -> vfs::Result<()> {
    while !data.is_empty() {
        let (n, _) = vfs.write(fh, off, data, None)?;
        if n == 0 {
            return Err(vfs::Error::Sys(libc::EIO));
        }
        off += n as u64;
        data = &data[n as usize..];
    }
    Ok(())
}

/// Writes `body` into open file `fh` from offset 0: one chunk written while the next is
/// received. Returns the bytes written and their MD5.
pub async fn write_body(
    vfs: &Arc<Vfs>,
    fh: u64,
    mut body: StreamingBlob,
) -> S3Result<(u64, [u8; 16])> {
    type Pending = tokio::task::JoinHandle<(Md5, vfs::Result<()>)>;
    async fn settle(p: Pending) -> S3Result<Md5> {
        let (md5, res) = p.await.map_err(|e| {
            S3Error::with_message(S3ErrorCode::InternalError, format!("a write failed: {e}"))
        })?;
        res.map_err(|e| s3_error(&e, Missing::Key))?;
        Ok(md5)
    }
    let mut md5 = Some(Md5::new());
    let mut pending: Option<Pending> = None;
    let mut off = 0u64;
    let mut buf = Vec::with_capacity(CHUNK + (64 << 10));
    loop {
        let next = body.next().await;
        let end = next.is_none();
        if let Some(chunk) = next {
            let chunk = chunk.map_err(|e| {
                S3Error::with_message(
                    S3ErrorCode::IncompleteBody,
                    format!("reading the body: {e}"),
                )
            })?;
            buf.extend_from_slice(&chunk);
        }
        if buf.len() >= CHUNK || (end && !buf.is_empty()) {
            if let Some(p) = pending.take() {
                md5 = Some(settle(p).await?);
            }
            let data = std::mem::replace(&mut buf, Vec::with_capacity(CHUNK + (64 << 10)));
            let (vfs, at) = (vfs.clone(), off);
            off += data.len() as u64;
            let mut h = md5.take().expect("settled");
            pending = Some(tokio::task::spawn_blocking(move || {
                h.update(&data);
                let res = write_all(&vfs, fh, at, &data);
                (h, res)
            }));
        }
        if end {
            break;
        }
    }
    if let Some(p) = pending.take() {
        md5 = Some(settle(p).await?);
    }
    let digest = md5.expect("settled").finalize();
    Ok((off, digest.into()))
}

/// Reads in flight per response body, as the kernel keeps several reads of a stream going.
const READS_IN_FLIGHT: usize = 8;

/// Reads `want` bytes at `off` of open file `fh` (fewer only at the end of the file).
fn read_full(vfs: &Vfs, fh: u64, off: u64, want: usize) -> vfs::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(want);
    while out.len() < want {
        let part = vfs.read(fh, off + out.len() as u64, (want - out.len()) as u32)?;
        if part.is_empty() {
            break;
        }
        out.extend_from_slice(&part);
    }
    Ok(out)
}

/// The bytes of `range` of open file `fh`, read a few chunks ahead of the client; the
/// handle is released at the end, or when the client goes away. A file found shorter than
/// `range` (cut meanwhile) ends the body with an error: the client sees a short body, never
/// a wrong byte.
pub fn read_body(vfs: Arc<Vfs>, fh: u64, range: Range<u64>) -> StreamingBlob {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    tokio::spawn(async move {
        type Read = tokio::task::JoinHandle<vfs::Result<Vec<u8>>>;
        let mut reads: std::collections::VecDeque<(usize, Read)> = Default::default();
        let mut next = range.start;
        loop {
            while reads.len() < READS_IN_FLIGHT && next < range.end {
                let want = (range.end - next).min(CHUNK as u64) as usize;
                let (v, at) = (vfs.clone(), next);
                reads.push_back((
                    want,
                    tokio::task::spawn_blocking(move || read_full(&v, fh, at, want)),
                ));
                next += want as u64;
            }
            let Some((want, read)) = reads.pop_front() else {
                break;
            };
            let item = match read.await {
                Ok(Ok(data)) if data.len() == want => Ok(Bytes::from(data)),
                Ok(Ok(_)) => Err(std::io::Error::other("the file was cut while it was read")),
                Ok(Err(e)) => Err(std::io::Error::from_raw_os_error(e.errno())),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                break;
            }
        }
        // Reads still running end before the handle goes.
        for (_, r) in reads {
            let _ = r.await;
        }
        let _ = tokio::task::spawn_blocking(move || vfs.release(fh)).await;
    });
    StreamingBlob::wrap(Chunks(rx))
}

/// The receiving end of [`read_body`]'s reader, as a stream.
struct Chunks(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl Stream for Chunks {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}
