//! `unkai webdav`: a WebDAV server of a volume (dav-server's protocol handling, on hyper),
//! behind HTTP Basic authentication ([`auth`]) and, optionally, TLS (tokio-rustls). Requests
//! become vfs calls in [`fs`].
//!
//! Not for: opening the volume or handling signals (`volume::client`), file-system logic
//! (`vfs`), the command line (`cli::webdav`).

pub mod auth;
pub mod fs;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use dav_server::body::Body;
use dav_server::{DavConfig, DavHandler, DavMethodSet};
use hyper::{Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::meta::Ctx;
use crate::vfs::export::{Caller, Export, Proto, log};

pub use auth::Auth;

/// How the server serves.
pub struct Options {
    /// Where to listen (`host:port`).
    pub listen: String,
    pub auth: Auth,
    /// HTTPS instead of HTTP (see [`tls_config`]).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Who the server is on the volume (uid, gid, umask of what it creates).
    pub ctx: Ctx,
}

/// A TLS configuration of the certificate chain and key in PEM files.
pub fn tls_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .with_context(|| {
            format!(
                "cannot read certificates from {} (--tls-cert)",
                cert.display()
            )
        })?;
    if certs.is_empty() {
        anyhow::bail!(
            "{} has no PEM certificate (--tls-cert takes a PEM file of the chain)",
            cert.display()
        );
    }
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| {
        format!(
            "cannot read a PEM private key from {} (--tls-key)",
            key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the --tls-cert and --tls-key do not make a usable certificate")?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// How long a client may take over a TLS handshake or a request's head (a connection that
/// sends nothing is closed: it holds no task forever).
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The answer to a request without valid credentials.
fn unauthorized() -> Response<Body> {
    Response::builder()
        .status(StatusCode::UNAUTHORIZED)
        .header(
            hyper::header::WWW_AUTHENTICATE,
            format!("Basic realm=\"{}\"", auth::REALM),
        )
        .header(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from("authentication required\n"))
        .expect("a response of fixed parts")
}

/// The dav-server handler of an export.
pub fn handler(export: &Arc<Export>, ctx: Ctx) -> DavHandler {
    let fs = fs::VolumeFs::new(export.clone(), ctx);
    DavHandler::builder()
        .filesystem(Box::new(fs))
        // LOCK/UNLOCK (macOS Finder and Windows need them): locks kept in this server's
        // memory, seen by its WebDAV clients only.
        .locksystem(dav_server::memls::MemLs::new())
        .methods(if export.read_only() {
            DavMethodSet::WEBDAV_RO
        } else {
            DavMethodSet::WEBDAV_RW
        })
        .read_buf_size(1 << 20)
        .autoindex(true)
        .build_handler()
}

/// Serves the export until the future is dropped (or listening fails).
pub async fn serve(export: Arc<Export>, opts: Options) -> anyhow::Result<()> {
    let tls = opts.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let listener = tokio::net::TcpListener::bind(&opts.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (--listen): choose another address or port",
                opts.listen
            )
        })?;
    let addr = listener.local_addr()?;
    tracing::info!("webdav serving volume '{}' at {addr}", export.name());
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!("webdav: the volume's URL is {scheme}://{addr}/");
    match (&opts.auth, &tls) {
        (Auth::Off, _) => tracing::warn!(
            "webdav: authentication is off (--no-auth): anyone who can reach {addr} may read \
             and change the volume as uid {}",
            opts.ctx.uid
        ),
        (Auth::Basic { .. }, None) if !addr.ip().is_loopback() => tracing::warn!(
            "webdav: without TLS, Basic authentication sends the password in clear over the \
             network: give --tls-cert and --tls-key, or listen on 127.0.0.1"
        ),
        _ => {}
    }
    let dav = handler(&export, opts.ctx);
    let auth = Arc::new(opts.auth);
    let ctx = opts.ctx;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("webdav: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (dav, auth, tls) = (dav.clone(), auth.clone(), tls.clone());
        let server = Server {
            dav,
            auth,
            export: export.clone(),
            ctx,
        };
        tokio::spawn(async move {
            match tls {
                None => connection(stream, peer, server).await,
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => connection(s, peer, server).await,
                        Ok(Err(e)) => tracing::debug!("webdav: TLS handshake with {peer}: {e}"),
                        Err(_) => tracing::debug!("webdav: TLS handshake with {peer} timed out"),
                    }
                }
            }
        });
    }
}

/// What serves each request of a connection.
#[derive(Clone)]
struct Server {
    dav: DavHandler,
    auth: Arc<Auth>,
    export: Arc<Export>,
    /// Who the server is on the volume.
    ctx: Ctx,
}

/// A request's method as the log and the metrics name it (another is `other`: a client
/// cannot make up kinds of its own).
fn method_name(m: &hyper::Method) -> &'static str {
    const KNOWN: &[&str] = &[
        "GET",
        "HEAD",
        "PUT",
        "DELETE",
        "OPTIONS",
        "POST",
        "PROPFIND",
        "PROPPATCH",
        "MKCOL",
        "COPY",
        "MOVE",
        "LOCK",
        "UNLOCK",
    ];
    KNOWN
        .iter()
        .find(|k| **k == m.as_str())
        .copied()
        .unwrap_or("other")
}

/// A request's path (decoded), and for COPY and MOVE its destination, as the access log
/// shows them: `(/a/b.txt)`, `(/a,/b)`.
fn request_args<B>(req: &Request<B>) -> String {
    let decode = |p: &str| log::name(&percent_encoding::percent_decode_str(p).collect::<Vec<u8>>());
    let mut args = decode(req.uri().path());
    if let Some(d) = req
        .headers()
        .get("destination")
        .and_then(|v| v.to_str().ok())
    {
        let path = d
            .parse::<hyper::Uri>()
            .map_or(d.to_string(), |u| u.path().to_string());
        args = format!("{args},{}", decode(&path));
    }
    format!("({args})")
}

/// Serves the requests of one connection, each counted and logged by the export.
async fn connection<I>(io: I, peer: SocketAddr, server: Server)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let s = server.clone();
        async move {
            let checked = s.auth.check(req.headers());
            let begun = s.export.begin(Caller {
                proto: Proto::Webdav,
                ctx: s.ctx,
                client: Some(peer.to_string()),
                user: checked.as_ref().ok().cloned().flatten(),
            });
            let (op, args) = (method_name(req.method()), request_args(&req));
            let res = match checked {
                Ok(user) => {
                    let mut cfg = DavConfig::new();
                    if let Some(u) = user {
                        cfg = cfg.principal(u);
                    }
                    s.dav.handle_with(cfg, req).await
                }
                Err(why) => {
                    if why == auth::Refused::Wrong {
                        tracing::info!("webdav: wrong credentials from {peer}");
                    }
                    unauthorized()
                }
            };
            let st = res.status();
            let failed = (st.is_client_error() || st.is_server_error())
                .then(|| format!("{} {}", st.as_u16(), st.canonical_reason().unwrap_or("")));
            begun.end(&s.export, op, || args, failed);
            Ok::<_, Infallible>(res)
        }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await
    {
        tracing::debug!("webdav: connection from {peer}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    use super::*;
    use crate::data::{Config as DataConfig, DataStore};
    use crate::meta::Ino;
    use crate::meta::{Format, Kind, ROOT_INO};
    use crate::object::ObjectStorage;
    use crate::vfs::Vfs;

    /// A fresh volume, and the handler of an export of its directory `sub`.
    fn export(read_only: bool) -> (tempfile::TempDir, Arc<Vfs>, Ino, DavHandler) {
        let dir = tempfile::tempdir().unwrap();
        let storage = format!("file://{}", dir.path().join("bucket").display());
        let fmt = Format::for_tests("r", &storage, 64 << 10);
        let (mdir, meta) = crate::meta::sqlite::scratch(&fmt);
        std::mem::forget(mdir);
        let obj = ObjectStorage::open(&fmt.storage, true).unwrap();
        let store = DataStore::new(obj, fmt.clone(), DataConfig::default()).unwrap();
        let cfg = crate::vfs::Config {
            background: false,
            ..Default::default()
        };
        let vfs = Arc::new(Vfs::new(meta, store, cfg));
        let sub = vfs
            .mknod(&Ctx::ROOT, ROOT_INO, b"sub", Kind::Dir, 0o755, 0)
            .unwrap();
        let ex = Arc::new(Export::new(
            vfs.clone(),
            sub.ino,
            read_only,
            "r".into(),
            crate::vfs::export::AccessLog::new(None).unwrap(),
        ));
        let ctx = Ctx {
            umask: 0o022,
            ..Ctx::ROOT
        };
        let h = handler(&ex, ctx);
        (dir, vfs, sub.ino, h)
    }

    async fn call(
        h: &DavHandler,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, Vec<u8>) {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body))).unwrap();
        let res = h.handle(req).await;
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, body.to_vec())
    }

    /// Runs `f` on a runtime of its own (the volume's stores have theirs, which must not be
    /// dropped inside another).
    fn run<F: std::future::Future<Output = ()>>(f: F) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn requests_become_vfs_calls_inside_the_export() {
        let (_d, vfs, sub, h) = export(false);
        run(requests_inside(&vfs, sub, &h));
    }

    async fn requests_inside(vfs: &Vfs, sub: Ino, h: &DavHandler) {
        let h = h.clone();
        let data: Vec<u8> = (0..3_000_017u32).map(|i| (i * 7 % 251) as u8).collect();
        let (s, _) = call(&h, "PUT", "/a.bin", &[], data.clone()).await;
        assert_eq!(s, StatusCode::CREATED);
        let (s, got) = call(&h, "GET", "/a.bin", &[], vec![]).await;
        assert_eq!(s, StatusCode::OK);
        assert!(got == data, "GET returned other bytes");
        let (s, got) = call(
            &h,
            "GET",
            "/a.bin",
            &[("Range", "bytes=1000000-1000009")],
            vec![],
        )
        .await;
        assert_eq!(s, StatusCode::PARTIAL_CONTENT);
        assert_eq!(got, &data[1_000_000..1_000_010]);
        // In the volume: under the export's directory.
        let a = vfs.lookup(&Ctx::ROOT, sub, b"a.bin").unwrap();
        assert_eq!(a.length, data.len() as u64);
        assert_eq!(a.mode & 0o777, 0o644);

        let (s, _) = call(&h, "MKCOL", "/d", &[], vec![]).await;
        assert_eq!(s, StatusCode::CREATED);
        let (s, _) = call(&h, "MKCOL", "/d", &[], vec![]).await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        let (s, _) = call(&h, "COPY", "/a.bin", &[("Destination", "/d/c.bin")], vec![]).await;
        assert_eq!(s, StatusCode::CREATED);
        let (s, _) = call(&h, "MOVE", "/a.bin", &[("Destination", "/d/m.bin")], vec![]).await;
        assert_eq!(s, StatusCode::CREATED);
        assert!(vfs.lookup(&Ctx::ROOT, sub, b"a.bin").is_err());
        for name in ["/d/c.bin", "/d/m.bin"] {
            let (s, got) = call(&h, "GET", name, &[], vec![]).await;
            assert_eq!(s, StatusCode::OK);
            assert!(got == data, "{name}: other bytes");
        }
        let (s, body) = call(&h, "PROPFIND", "/d/", &[("Depth", "1")], vec![]).await;
        assert_eq!(s, StatusCode::MULTI_STATUS);
        let text = String::from_utf8(body).unwrap();
        assert!(
            text.contains("/d/c.bin") && text.contains("/d/m.bin"),
            "{text}"
        );
        assert!(text.contains("3000017"), "{text}");

        // Dead properties: kept (as xattrs) and listed.
        let patch = r#"<?xml version="1.0"?><D:propertyupdate xmlns:D="DAV:" xmlns:Z="urn:z"><D:set><D:prop><Z:color>blue</Z:color></D:prop></D:set></D:propertyupdate>"#;
        let (s, _) = call(&h, "PROPPATCH", "/d/c.bin", &[], patch.into()).await;
        assert_eq!(s, StatusCode::MULTI_STATUS);
        let find = r#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:" xmlns:Z="urn:z"><D:prop><Z:color/></D:prop></D:propfind>"#;
        let (s, body) = call(&h, "PROPFIND", "/d/c.bin", &[("Depth", "0")], find.into()).await;
        assert_eq!(s, StatusCode::MULTI_STATUS);
        assert!(String::from_utf8_lossy(&body).contains("blue"));

        // Malformed XML: a 400, nothing else.
        let (s, _) = call(
            &h,
            "PROPFIND",
            "/d/",
            &[("Depth", "1")],
            b"<D:propfind xmlns:D=".to_vec(),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        // Above the export: refused, whatever the spelling.
        for uri in ["/../x", "/d/../../x", "/%2e%2e/x", "/d/%2E%2E/%2e%2e/x"] {
            let (s, _) = call(&h, "PUT", uri, &[], b"escape".to_vec()).await;
            assert!(s.is_client_error(), "{uri}: {s}");
        }
        assert!(vfs.lookup(&Ctx::ROOT, ROOT_INO, b"x").is_err());

        let (s, _) = call(&h, "DELETE", "/d/", &[], vec![]).await;
        assert_eq!(s, StatusCode::NO_CONTENT);
        assert!(vfs.lookup(&Ctx::ROOT, sub, b"d").is_err());
        let (s, _) = call(&h, "GET", "/d/c.bin", &[], vec![]).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_read_only_export_changes_nothing() {
        let (_d, vfs, sub, h) = export(true);
        run(read_only(&vfs, sub, &h));
    }

    async fn read_only(vfs: &Vfs, sub: Ino, h: &DavHandler) {
        let h = h.clone();
        let (s, _) = call(&h, "PUT", "/a", &[], b"x".to_vec()).await;
        assert!(s.is_client_error(), "{s}");
        let (s, _) = call(&h, "MKCOL", "/d", &[], vec![]).await;
        assert!(s.is_client_error(), "{s}");
        assert!(vfs.lookup(&Ctx::ROOT, sub, b"a").is_err());
        assert!(vfs.lookup(&Ctx::ROOT, sub, b"d").is_err());
        let (s, _) = call(&h, "PROPFIND", "/", &[("Depth", "1")], vec![]).await;
        assert_eq!(s, StatusCode::MULTI_STATUS);
    }
}
