//! `unkai gateway`: the volume as an S3 service. The S3 protocol (requests, Signature V4,
//! XML, error codes) is the `s3s` crate's; this module binds the listener, serves HTTP/1
//! connections with hyper, and gives s3s the access keys from the environment.
//!
//! Not for: the S3 operations themselves (`objects`), the volume's life (`volume::client`),
//! flags (`cli::gateway`).

mod error;
mod headers;
mod io;
mod listing;
mod objects;

use std::net::SocketAddr;

use anyhow::Context;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

pub use objects::{Gateway, STATE_DIR};

use std::sync::Arc;

use crate::vfs::export::Export;

/// The environment variables the access key is read from, in order of preference (the
/// second pair as JuiceFS's and MinIO's gateways take it).
pub const ACCESS_KEY_ENV: [&str; 2] = ["UNKAI_GATEWAY_ACCESS_KEY", "MINIO_ROOT_USER"];
pub const SECRET_KEY_ENV: [&str; 2] = ["UNKAI_GATEWAY_SECRET_KEY", "MINIO_ROOT_PASSWORD"];

/// An access key and its secret (never printed: no Debug).
pub struct Keys {
    pub access: String,
    pub secret: String,
}

impl Keys {
    /// The keys set in the environment (a pair from the same family), if any.
    pub fn from_env() -> Option<Keys> {
        ACCESS_KEY_ENV
            .iter()
            .zip(SECRET_KEY_ENV.iter())
            .find_map(|(a, s)| {
                let access = std::env::var(a).ok().filter(|v| !v.is_empty())?;
                let secret = std::env::var(s).ok().filter(|v| !v.is_empty())?;
                Some(Keys { access, secret })
            })
    }
}

/// How the gateway serves.
pub struct Options {
    pub listen: SocketAddr,
    /// None: every request is served unsigned (`--no-auth`).
    pub keys: Option<Keys>,
    /// Who the gateway acts as on the volume.
    pub uid: u32,
    pub gid: u32,
}

/// Serves `export` as S3 at `opts.listen` until the runtime stops it.
pub async fn serve(export: Arc<Export>, opts: Options) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("cannot listen at {}", opts.listen))?;
    let addr = listener.local_addr()?;
    let mut builder = S3ServiceBuilder::new(Gateway::new(&export, opts.uid, opts.gid));
    if let Some(k) = opts.keys {
        builder.set_auth(SimpleAuth::from_single(k.access, k.secret));
    }
    let service = builder.build();
    tracing::info!("gateway serving volume '{}' at {addr}", export.name());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was taken: go on.
                tracing::warn!("gateway: accepting a connection: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        tokio::spawn(async move {
            // A client that never finishes its headers is dropped (not held forever).
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(60))
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!("gateway: connection from {peer}: {e}");
            }
        });
    }
}
