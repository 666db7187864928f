//! Asking a member of the group for a block: one HTTP GET (reqwest, the client the object
//! stores use; HTTP/1.1 over a pooled connection) signed with the group's key, within a time
//! limit, its answer the object as the bucket stores it, sealed by the member for this very
//! request and taken only if it opens (`auth`); or ranges of it, only if the member holds it
//! (a small read's segments and their checksums).
//!
//! Not for: checking the answer (the caller decodes it as any stored object), or what to
//! do when a member fails (`peers` bypasses it).

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::auth::{self, Auth};

/// Where blocks are served: `/v1/blocks/KEY`.
pub const PREFIX: &str = "/v1/blocks/";

/// The query of a request for ranges of a block the member holds:
/// `/v1/blocks/KEY?held_ranges=A-B,C-D` (byte ranges of the object, answered one after the
/// other; 404 when the member does not hold the block: it fetches nothing for it).
pub const HELD_RANGES: &str = "held_ranges";

/// Time to connect to a member before it counts as gone.
const CONNECT: Duration = Duration::from_secs(1);

/// The longest answer taken: a block of the largest size a volume may have (16 MiB), with
/// ample room for its checksums and encoding. A longer one is refused, not collected.
const MAX_ANSWER: u64 = 32 << 20;

/// The client side of the group's protocol.
pub struct Asker {
    client: reqwest::Client,
    auth: Arc<Auth>,
}

impl Asker {
    /// A client whose requests take `timeout` at most.
    pub fn new(auth: Arc<Auth>, timeout: Duration) -> std::io::Result<Asker> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT)
            .timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Asker { client, auth })
    }

    /// The object of block `key` as `member` has it, or why not.
    pub async fn ask(&self, member: SocketAddr, key: &str) -> Result<Bytes, String> {
        let path = format!("{PREFIX}{key}");
        self.get(member, path)
            .await?
            .ok_or_else(|| "answered 404 Not Found".into())
    }

    /// Byte ranges `ranges` of the object of block `key`, one after the other, if `member`
    /// holds it (Ok(None): it does not; it fetches nothing for this).
    pub async fn ask_held_ranges(
        &self,
        member: SocketAddr,
        key: &str,
        ranges: &[Range<usize>],
    ) -> Result<Option<Bytes>, String> {
        let list: Vec<String> = ranges
            .iter()
            .map(|r| format!("{}-{}", r.start, r.end))
            .collect();
        let path = format!("{PREFIX}{key}?{HELD_RANGES}={}", list.join(","));
        self.get(member, path).await
    }

    /// GET `path` (and query) of `member`, signed; the answer's body, opened, if it was
    /// sealed with the group's key for this request (None: 404, the member has no such
    /// block).
    async fn get(&self, member: SocketAddr, path: String) -> Result<Option<Bytes>, String> {
        let start = Instant::now();
        let signed = self.auth.sign("GET", &path);
        let mut res = self
            .client
            .get(format!("http://{member}{path}"))
            .header(auth::HEADER, &signed.header)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = res.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        let seal = res
            .headers()
            .get(auth::ANSWER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let head = start.elapsed();
        // Taken chunk by chunk into one buffer of the answer's length, from the pool of
        // block buffers: each chunk dropped at once lets the HTTP stack read the next into
        // the same memory, where collecting the body kept every chunk (fresh memory, about
        // 4 MiB) and then copied them all into one more fresh buffer. On this VM a first
        // touch of fresh memory costs about ten times a copy (docs/design.md, "Disk cache:
        // written out"): a block from its owner 6.5-8.0 ms before, 5.0-5.8 ms after.
        let cap = res
            .content_length()
            .filter(|&n| n <= MAX_ANSWER)
            .unwrap_or(0) as usize;
        let mut body = crate::data::buffers::take(cap);
        while let Some(chunk) = res.chunk().await.map_err(|e| describe(&e))? {
            if (body.len() + chunk.len()) as u64 > MAX_ANSWER {
                return Err(format!("its answer is longer than {MAX_ANSWER} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let got = start.elapsed();
        if !self
            .auth
            .open_answer(&path, &signed.nonce, &mut body, seal.as_deref())
        {
            return Err(
                "its answer is not sealed with the group's key for this request \
                        (altered on the way, or not a member)"
                    .into(),
            );
        }
        tracing::debug!(
            "peer cache: {path} from {member}: {} bytes; headers in {head:?}, body in {:?}, \
             opened in {:?}",
            body.len(),
            got - head,
            start.elapsed() - got
        );
        Ok(Some(crate::data::buffers::freeze(body, cap)))
    }
}

/// A request's failure, with its cause (reqwest's top line alone says little).
fn describe(e: &reqwest::Error) -> String {
    let mut s = if e.is_timeout() {
        "timed out".to_string()
    } else {
        e.to_string()
    };
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::{Request, Response};

    /// A member's answers as the asker takes them, from a real HTTP server on 127.0.0.1:
    /// a sealed block sent in many chunks comes back whole and opened; an answer longer than
    /// any block is refused rather than collected.
    #[test]
    fn answers_are_taken_whole_and_bounded() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let key = hex::encode([9u8; 32]);
        let block: Vec<u8> = (0..(4 << 20) + 4096u32).map(|i| (i % 253) as u8).collect();
        let server_auth = Arc::new(Auth::new(&key));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let plain = block.clone();
        rt.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (auth, plain) = (server_auth.clone(), plain.clone());
                let answer = hyper::service::service_fn(move |req: Request<_>| {
                    let (auth, mut body) = (auth.clone(), plain.clone());
                    async move {
                        let path = req.uri().path().to_string();
                        let given = req
                            .headers()
                            .get(auth::HEADER)
                            .and_then(|v| v.to_str().ok());
                        let nonce = auth.check("GET", &path, given).expect("a signed request");
                        let res = match path.ends_with("/big") {
                            // Longer than any block: refused before it is opened.
                            true => Response::new(Full::new(Bytes::from(vec![1u8; 33 << 20]))),
                            false => {
                                let seal = auth.seal_answer(&path, &nonce, &mut body);
                                let mut res = Response::new(Full::new(Bytes::from(body)));
                                res.headers_mut()
                                    .insert(auth::ANSWER_HEADER, seal.parse().unwrap());
                                res
                            }
                        };
                        Ok::<_, std::convert::Infallible>(res)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), answer),
                );
            }
        });
        let asker = Asker::new(Arc::new(Auth::new(&key)), Duration::from_secs(60)).unwrap();
        for _ in 0..2 {
            let got = rt.block_on(asker.ask(addr, "k")).expect("the block");
            assert!(got[..] == block[..], "the block came back altered");
        }
        let err = rt.block_on(asker.ask(addr, "big")).unwrap_err();
        assert!(err.contains("longer than"), "{err}");
    }
}
