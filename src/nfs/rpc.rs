//! ONC RPC over TCP (RFC 5531) for the NFS server: one accepted connection's records read
//! (record marking, each record at most [`MAX_RECORD`] bytes, refused at its mark before
//! anything is allocated for it), each call's header and credentials decoded (`xdr`), the
//! call run off the runtime's threads (the vfs blocks), and its reply written back. Calls of
//! one connection run concurrently, [`IN_FLIGHT`] at most; their replies go out in the order
//! they finish, as RPC allows (each names its call's xid).
//!
//! Not for: accepting connections or `--allow` (`nfs::serve`), what a call does (`proto`).

use std::io::Cursor;
use std::sync::Arc;

use nfs3_types::rpc::{
    accept_stat_data, accepted_reply, auth_stat, msg_body, opaque_auth, rejected_reply, reply_body,
    rpc_msg,
};
use nfs3_types::xdr_codec::Unpack;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::export::{Cred, Export};
use super::proto::{Fault, Proto};
use super::xdr::{self, AuthUnix, CallHead};

/// The longest RPC record (all its fragments) a client may send: the largest WRITE FSINFO
/// allows plus room for the RPC header, credentials and arguments (a few hundred bytes).
pub const MAX_RECORD: usize = super::MAX_IO as usize + (64 << 10);

/// Calls of one connection run at once, at most (the next record is read when one ends).
pub const IN_FLIGHT: usize = 16;

const NFS: u32 = nfs3_types::nfs3::PROGRAM;
const MOUNT: u32 = nfs3_types::mount::PROGRAM;

/// A server: the export's procedures and whom its calls act as.
pub struct Service {
    pub proto: Proto,
    pub export: Export,
}

/// Reads one record (its fragments joined); None at a clean end of the stream. A fragment
/// that would take the record past [`MAX_RECORD`] is an error before a byte of it is read,
/// and the record's buffer grows only as its bytes arrive.
pub async fn read_record(r: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<Option<Vec<u8>>> {
    let mut rec = Vec::new();
    let mut first = true;
    loop {
        let mut mark = [0u8; 4];
        match r.read_exact(&mut mark).await {
            Ok(_) => {}
            Err(e) if first && e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        first = false;
        let mark = u32::from_be_bytes(mark);
        let len = (mark & 0x7fff_ffff) as usize;
        if rec.len() + len > MAX_RECORD {
            anyhow::bail!(
                "an RPC record of {} bytes or more (at most {MAX_RECORD}): disconnected",
                rec.len() + len
            );
        }
        let got = (&mut *r).take(len as u64).read_to_end(&mut rec).await?;
        if got < len {
            anyhow::bail!("the connection ended inside an RPC record");
        }
        if mark & 0x8000_0000 != 0 {
            return Ok(Some(rec));
        }
    }
}

/// A reply record (its mark included) to call `xid`: accepted with `data` (then `body`, the
/// results, follows), or denied.
fn reply(xid: u32, body: reply_body<'_>, results: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 4];
    xdr::encode(
        &rpc_msg {
            xid,
            body: msg_body::REPLY(body),
        },
        &mut out,
    );
    out.extend_from_slice(results);
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&(0x8000_0000 | len).to_be_bytes());
    out
}

fn accepted(data: accept_stat_data) -> reply_body<'static> {
    reply_body::MSG_ACCEPTED(accepted_reply {
        verf: opaque_auth::default(),
        reply_data: data,
    })
}

impl Service {
    /// Answers the call `rec` (a whole record): its reply record, or None when it is not a
    /// call at all (the connection is then closed).
    pub fn call(&self, rec: &[u8]) -> Option<Vec<u8>> {
        let mut c = Cursor::new(rec);
        let (head, _) = CallHead::unpack(&mut c).ok()?;
        if head.mtype != 0 {
            return None;
        }
        let args = &rec[c.position() as usize..];
        let xid = head.xid;
        if head.rpcvers != 2 {
            let denied = reply_body::MSG_DENIED(rejected_reply::RPC_MISMATCH { low: 2, high: 2 });
            return Some(reply(xid, denied, &[]));
        }
        let cred = match head.cred.flavor {
            0 => Cred::None,
            1 => match xdr::decode::<AuthUnix>(&head.cred.body.0) {
                Some(u) => Cred::Unix {
                    uid: u.uid,
                    gid: u.gid,
                    gids: u.gids.0,
                },
                None => {
                    let d =
                        reply_body::MSG_DENIED(rejected_reply::AUTH_ERROR(auth_stat::AUTH_BADCRED));
                    return Some(reply(xid, d, &[]));
                }
            },
            _ => {
                let d = reply_body::MSG_DENIED(rejected_reply::AUTH_ERROR(
                    auth_stat::AUTH_REJECTEDCRED,
                ));
                return Some(reply(xid, d, &[]));
            }
        };
        let who = self.export.identity(&cred);
        let mut results = Vec::new();
        let done = match (head.prog, head.vers) {
            (NFS, 3) => self.proto.nfs(&who, head.procedure, args, &mut results),
            (MOUNT, 3) => self.proto.mount(&who, head.procedure, args, &mut results),
            (NFS | MOUNT, _) => {
                let m = accept_stat_data::PROG_MISMATCH { low: 3, high: 3 };
                return Some(reply(xid, accepted(m), &[]));
            }
            _ => return Some(reply(xid, accepted(accept_stat_data::PROG_UNAVAIL), &[])),
        };
        let data = match done {
            Ok(()) => accept_stat_data::SUCCESS,
            Err(Fault::Garbage) => {
                results.clear();
                accept_stat_data::GARBAGE_ARGS
            }
            Err(Fault::NoProc) => {
                results.clear();
                accept_stat_data::PROC_UNAVAIL
            }
        };
        Some(reply(xid, accepted(data), &results))
    }
}

/// Serves one accepted connection until the client closes it or breaks the protocol.
pub async fn connection(
    service: Arc<Service>,
    stream: tokio::net::TcpStream,
) -> anyhow::Result<()> {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(IN_FLIGHT);
    let writer = tokio::spawn(async move {
        while let Some(r) = rx.recv().await {
            wr.write_all(&r).await?;
        }
        let _ = wr.shutdown().await;
        anyhow::Ok(())
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let res = loop {
        let slot = slots.clone().acquire_owned().await?;
        let rec = match read_record(&mut rd).await {
            Ok(Some(rec)) => rec,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let service = service.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let r = tokio::task::spawn_blocking(move || service.call(&rec)).await;
            match r {
                Ok(Some(reply)) => {
                    let _ = tx.send(reply).await;
                }
                Ok(None) => tracing::debug!("an NFS client sent a record that is not a call"),
                Err(e) => tracing::error!("an NFS request failed: {e}"),
            }
            drop(slot);
        });
    };
    // Replies to the calls still running go out before the connection closes.
    let _ = slots.acquire_many(IN_FLIGHT as u32).await;
    drop(tx);
    let _ = writer.await;
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(last: bool, len: u32) -> Vec<u8> {
        ((last as u32) << 31 | len).to_be_bytes().to_vec()
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn records_are_joined_and_long_ones_refused_at_their_mark() {
        rt().block_on(async {
            let mut s = mark(false, 3);
            s.extend_from_slice(b"abc");
            s.extend(mark(true, 2));
            s.extend_from_slice(b"de");
            s.extend(mark(true, 0));
            let mut r = &s[..];
            assert_eq!(read_record(&mut r).await.unwrap().unwrap(), b"abcde");
            assert_eq!(read_record(&mut r).await.unwrap().unwrap(), b"");
            assert!(read_record(&mut r).await.unwrap().is_none());
            // 2 GiB claimed, and nothing sent: refused at once.
            let s = [0xffu8, 0xff, 0xff, 0xff];
            assert!(read_record(&mut &s[..]).await.is_err());
            // Fragments each small but too long together.
            let half = (MAX_RECORD / 2 + 1) as u32;
            let mut s = mark(false, half);
            s.resize(4 + half as usize, 0);
            s.extend(mark(true, half));
            assert!(read_record(&mut &s[..]).await.is_err());
            // Cut short.
            let mut s = mark(true, 10);
            s.extend_from_slice(b"abc");
            assert!(read_record(&mut &s[..]).await.is_err());
        });
    }
}
