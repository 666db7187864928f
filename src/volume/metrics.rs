//! A mount's figures, served: gathered from the layers that own them (the FUSE requests, and
//! through `vfs` the write buffers, the data layer, the bucket's traffic and the metadata
//! engine), labelled with the volume's name, and served two ways, from one thread:
//!
//! - `/metrics` in Prometheus' text format, over HTTP, where `mount --metrics ADDR` says
//!   (nowhere by default);
//! - always, as JSON on a unix socket in the runtime directory beside the mount's pid file
//!   ([`socket_path`]), which `unkai stats` reads: a client connects and reads to the end.
//!
//! Not for: counting anything (each layer counts its own; `crate::metrics` is their
//! vocabulary), or showing figures to a person (that is `cli::stats`).

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;

use crate::metrics::Families;
use crate::vfs::export::Export;

/// What a scrape reads: the client's layers, through its export.
pub struct Figures {
    pub volume: String,
    pub export: Arc<Export>,
}

impl Figures {
    /// Every figure of the client now, each sample labelled `volume="NAME"`.
    pub fn families(&self) -> Families {
        let mut out = Families::default();
        self.export.figures(&mut out);
        out.label_all("volume", &self.volume);
        out
    }
}

/// Parses `--metrics ADDR`: an IP address and a port (`127.0.0.1:9567`, `[::1]:9567`), or a
/// host name that resolves to one (`localhost:9567`).
fn parse_addr(s: &str) -> anyhow::Result<SocketAddr> {
    let bad = || {
        format!(
            "invalid --metrics '{s}': give the address and port to serve /metrics on, e.g. \
             127.0.0.1:9567 (0.0.0.0:9567 for every interface)"
        )
    };
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let mut addrs = s.to_socket_addrs().with_context(bad)?;
    addrs.next().with_context(bad)
}

/// Listens on `addr` for `/metrics` (before the mount, so that an address taken is said on
/// the terminal).
pub fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).with_context(|| {
        format!(
            "cannot serve metrics on {addr} (--metrics): choose another address or port, or \
             leave --metrics out"
        )
    })
}

/// The unix socket of the mount whose pid file is `pid_file`, as its server names it: by
/// its pid, beside the pid file (a socket's path is limited to 107 bytes; a mountpoint's is
/// not).
pub fn socket_path(pid_file: &Path, pid: u32) -> PathBuf {
    pid_file.with_file_name(format!("stats-{pid}.sock"))
}

/// The server of a client's figures; dropping it stops it and removes its socket.
pub struct Exporter {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    socket: Option<PathBuf>,
    http_addr: Option<SocketAddr>,
}

/// The unix socket `path`, readable by every user with `public` (else by the client's
/// user only).
fn stats_socket(path: &Path, public: bool) -> anyhow::Result<std::os::unix::net::UnixListener> {
    let _ = std::fs::remove_file(path);
    let unix = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("cannot create the stats socket {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    let mode = if public { 0o666 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    unix.set_nonblocking(true)?;
    Ok(unix)
}

impl Exporter {
    /// Serves `figures` on the unix socket `socket` (its path, and whether every user may
    /// read it), and on `http` if given; None if neither is. A socket that cannot be made
    /// is warned about (`unkai stats` then cannot show this client) and left out.
    pub fn start(
        figures: Figures,
        socket: Option<(PathBuf, bool)>,
        http: Option<TcpListener>,
    ) -> anyhow::Result<Option<Exporter>> {
        let unix = socket.and_then(|(path, public)| match stats_socket(&path, public) {
            Ok(l) => Some((l, path)),
            Err(e) => {
                tracing::warn!("{e:#}: `unkai stats` cannot show this client");
                None
            }
        });
        if unix.is_none() && http.is_none() {
            return Ok(None);
        }
        let (unix, socket) = match unix {
            Some((l, p)) => (Some(l), Some(p)),
            None => (None, None),
        };
        let http_addr = http.as_ref().and_then(|l| l.local_addr().ok());
        if let Some(l) = &http {
            l.set_nonblocking(true)?;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let figures = Arc::new(figures);
        let thread = std::thread::Builder::new()
            .name("unkai-metrics".into())
            .spawn(move || {
                rt.block_on(async move {
                    let serving = async {
                        let unix = unix.map(tokio::net::UnixListener::from_std).transpose()?;
                        let http = http.map(tokio::net::TcpListener::from_std).transpose()?;
                        tokio::join!(
                            serve_socket(unix, figures.clone()),
                            serve_http(http, figures)
                        );
                        std::io::Result::Ok(())
                    };
                    tokio::select! {
                        res = serving => {
                            if let Err(e) = res {
                                tracing::warn!("metrics are not served: {e}");
                            }
                        }
                        _ = stopped => {}
                    }
                })
            })?;
        Ok(Some(Exporter {
            stop: Some(stop),
            thread: Some(thread),
            socket,
            http_addr,
        }))
    }

    /// Where `/metrics` is served, if it is.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(s) = &self.socket {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// Each client of the unix socket gets the figures as JSON, then the end of the stream
/// (nothing without a socket).
async fn serve_socket(unix: Option<tokio::net::UnixListener>, figures: Arc<Figures>) {
    let Some(unix) = unix else {
        return std::future::pending().await;
    };
    loop {
        match unix.accept().await {
            Ok((mut conn, _)) => {
                let json = figures.families().json().to_string();
                tokio::spawn(async move {
                    let _ = conn.write_all(json.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
            Err(e) => {
                tracing::debug!("stats socket: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// `/metrics` over HTTP/1 (nothing without a listener).
async fn serve_http(http: Option<tokio::net::TcpListener>, figures: Arc<Figures>) {
    let Some(http) = http else {
        return std::future::pending().await;
    };
    loop {
        let stream = match http.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::debug!("metrics listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let figures = figures.clone();
        tokio::spawn(async move {
            let answer = hyper::service::service_fn(move |req| {
                let res = answer(&figures, &req);
                async move { Ok::<_, Infallible>(res) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), answer)
                .await;
        });
    }
}

/// The answer to one HTTP request: the figures at `/metrics`, a pointer to it at `/`.
fn answer<B>(figures: &Figures, req: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, kind: &str, body: String| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, kind)
            .body(Full::new(Bytes::from(body)))
            .expect("a response of fixed parts")
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "only GET /metrics\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            prometheus::TEXT_FORMAT,
            figures.families().text(),
        ),
        "/" => reply(
            StatusCode::OK,
            TEXT,
            format!(
                "unkai: the figures of volume '{}' are at /metrics\n",
                figures.volume
            ),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /metrics\n".into(),
        ),
    }
}

/// Parses `--metrics ADDR` as [`parse_addr`] does, naming what a user most likely meant when
/// a part is missing (a bare port, a bare address).
pub fn check_addr(s: &str) -> anyhow::Result<SocketAddr> {
    if s.parse::<u16>().is_ok() {
        bail!("invalid --metrics '{s}': give an address too, e.g. 127.0.0.1:{s}");
    }
    if !s.contains(':') {
        bail!("invalid --metrics '{s}': give a port too, e.g. {s}:9567");
    }
    parse_addr(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_addresses() {
        assert_eq!(
            check_addr("127.0.0.1:9567").unwrap(),
            "127.0.0.1:9567".parse().unwrap()
        );
        assert_eq!(
            check_addr("[::1]:9567").unwrap(),
            "[::1]:9567".parse().unwrap()
        );
        let e = check_addr("127.0.0.1").unwrap_err().to_string();
        assert!(e.contains("127.0.0.1:9567"), "{e}");
        let e = check_addr("9567").unwrap_err().to_string();
        assert!(e.contains("e.g. 127.0.0.1:9567"), "{e}");
        let e = format!("{:#}", check_addr("127.0.0.1:notaport").unwrap_err());
        assert!(e.contains("e.g. 127.0.0.1:9567"), "{e}");
        assert_eq!(
            socket_path(Path::new("/run/unkai/mounts/2f6d6e74.pid"), 42),
            Path::new("/run/unkai/mounts/stats-42.sock")
        );
    }
}
