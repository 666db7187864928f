//! `unkai nfs`: the volume (or `--subdir` of it) served over NFSv3 and MOUNT on one TCP
//! port, each request turned into `vfs` calls as the FUSE adapter turns the kernel's.
//!
//! The server is unkai's own dispatch over the `nfs3_types` crate's XDR types and codec
//! (published NFS server crates hand the file system neither the caller's credentials nor
//! a COMMIT of its own, and listen on ports of their own). The one listener is
//! [`serve`]'s: a client outside `--allow` is closed before a byte is read, and every
//! accepted connection is served in this process (`rpc`), so nothing reaches the volume
//! past that check. The module's parts, one job each:
//!
//! - `rpc`: record marking (bounded), call headers, credentials, replies, one connection;
//! - `xdr`: the XDR forms of calls and arguments (every length bounded before allocating);
//! - `proto`: the NFSv3 and MOUNT procedures;
//! - `handle`: file handles (volume id, inode, tag: they outlive a restart) and the write
//!   verifier (new at each start);
//! - `export`: export options and identities, as exports(5) defines them;
//! - `fs`: every call into the vfs, with the permission checks a local caller gets.
//!
//! Not for: flags (`cli::nfs`), opening the volume (`volume::front`), NFSv4 or locking (NLM).

pub mod export;
pub mod fs;
pub mod handle;
pub mod proto;
pub mod rpc;
pub mod xdr;

use std::sync::Arc;
use std::time::Duration;

use crate::volume::front::Front;
use export::Export;
use fs::{Fs, IDLE};
use handle::Handles;
use proto::Proto;
use rpc::Service;

/// The most a READ returns and a WRITE may carry (FSINFO's rtmax and wtmax).
pub const MAX_IO: u32 = 1 << 20;

/// Serves `front` over NFSv3 at `listen` until the runtime stops it; then every handle is
/// released (the caller flushes the volume).
pub async fn serve(
    front: Front,
    listen: std::net::SocketAddr,
    export: Export,
) -> anyhow::Result<()> {
    let fs = Fs::new(front.vfs.clone(), front.root);
    let handles = Handles::new(&fs.volume_uuid(), front.root);
    let service = Arc::new(Service {
        proto: Proto {
            fs,
            handles,
            read_only: front.read_only,
            verf: handle::write_verifier(),
        },
        export: export.clone(),
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen at {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    tracing::info!("nfs serving volume '{}' at {addr}", front.name);
    // Handles idle for a while are released; all of them when the server stops.
    let _release = Releaser(service.clone());
    let _reaper = {
        let service = service.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(IDLE / 3).await;
                let s = service.clone();
                let _ = tokio::task::spawn_blocking(move || s.proto.fs.release_idle(IDLE)).await;
            }
        })
    };
    let mut refused = 0u64;
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: the listener itself stays.
                tracing::warn!("accepting an NFS client: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if !export.allows(peer.ip()) {
            // Said for the first refusals, then every thousandth (a scan must not flood).
            if refused < 10 || refused % 1000 == 0 {
                tracing::warn!("refused an NFS client at {peer}: not in --allow");
            }
            refused += 1;
            drop(client);
            continue;
        }
        let service = service.clone();
        tokio::spawn(async move {
            if let Err(e) = rpc::connection(service, client).await {
                tracing::debug!("NFS client {peer}: {e}");
            }
        });
    }
}

/// Releases every handle of the server when dropped (the server's task ends: a signal, or
/// an error).
struct Releaser(Arc<Service>);

impl Drop for Releaser {
    fn drop(&mut self) {
        // Off the runtime's threads: the vfs may block (and PostgreSQL's runs its own).
        let service = self.0.clone();
        let _ = std::thread::spawn(move || service.proto.fs.release_idle(Duration::ZERO)).join();
    }
}
