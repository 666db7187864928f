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
use s3s::S3Result;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::SimpleAuth;
use s3s::service::{S3Service, S3ServiceBuilder};

pub use objects::{Gateway, STATE_DIR};

use std::sync::Arc;

use crate::meta::Ctx;
use crate::vfs::export::{Caller, Export, Proto, log};

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

/// The S3 operation s3s resolved a request to (`PutObject`), put in the request's
/// extensions for the server's log to find: s3s names it to the access check alone.
#[derive(Clone, Default)]
struct OpName(Arc<parking_lot::Mutex<Option<String>>>);

/// The access check of signed requests: s3s's own (a signature is required), noting the
/// operation's name on the way.
struct NameOps;

#[async_trait::async_trait]
impl S3Access for NameOps {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let name = cx.s3_op().name().to_string();
        if let Some(slot) = cx.extensions_mut().get::<OpName>() {
            *slot.0.lock() = Some(name);
        }
        match cx.credentials() {
            Some(_) => Ok(()),
            None => Err(s3s::s3_error!(AccessDenied, "Signature is required")),
        }
    }
}

/// What serves each request: s3s, then the request counted and logged by the export (as
/// its S3 operation; with `--no-auth`, as its HTTP method: s3s names operations to signed
/// requests only).
#[derive(Clone)]
struct Server {
    s3: S3Service,
    export: Arc<Export>,
    ctx: Ctx,
}

impl Server {
    async fn call(
        &self,
        peer: SocketAddr,
        mut req: hyper::Request<hyper::body::Incoming>,
    ) -> Result<s3s::HttpResponse, s3s::HttpError> {
        let begun = self.export.begin(Caller {
            proto: Proto::S3,
            ctx: self.ctx,
            client: Some(peer.to_string()),
            user: None,
        });
        let name = OpName::default();
        req.extensions_mut().insert(name.clone());
        let method = req.method().clone();
        let path = req.uri().path().trim_start_matches('/').to_string();
        let res = self.s3.call(req.map(s3s::Body::from)).await;
        let failed = match &res {
            Ok(r) if r.status().is_client_error() || r.status().is_server_error() => Some(format!(
                "{} {}",
                r.status().as_u16(),
                r.status().canonical_reason().unwrap_or("")
            )),
            Ok(_) => None,
            Err(_) => Some("no answer: the request failed".into()),
        };
        let op = name.0.lock().take();
        let op = op.as_deref().unwrap_or(match method.as_str() {
            "GET" => "GET",
            "HEAD" => "HEAD",
            "PUT" => "PUT",
            "POST" => "POST",
            "DELETE" => "DELETE",
            _ => "other",
        });
        let args = || {
            let p: Vec<u8> = percent_encoding::percent_decode_str(&path).collect();
            format!("({})", log::name(&p))
        };
        begun.end(&self.export, op, args, failed);
        res
    }
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
        builder.set_access(NameOps);
    }
    let server = Server {
        s3: builder.build(),
        ctx: Ctx {
            uid: opts.uid,
            gid: opts.gid,
            pid: 0,
            umask: 0o022,
        },
        export: export.clone(),
    };
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
        let server = server.clone();
        let service = hyper::service::service_fn(move |req| {
            let server = server.clone();
            async move { server.call(peer, req).await }
        });
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
