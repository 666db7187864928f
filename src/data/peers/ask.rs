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

use bytes::{Bytes, BytesMut};

use super::auth::{self, Auth};

/// Where blocks are served: `/v1/blocks/KEY`.
pub const PREFIX: &str = "/v1/blocks/";

/// The query of a request for ranges of a block the member holds:
/// `/v1/blocks/KEY?held_ranges=A-B,C-D` (byte ranges of the object, answered one after the
/// other; 404 when the member does not hold the block: it fetches nothing for it).
pub const HELD_RANGES: &str = "held_ranges";

/// Time to connect to a member before it counts as gone.
const CONNECT: Duration = Duration::from_secs(1);

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
        let res = self
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
        let body = res.bytes().await.map_err(|e| describe(&e))?;
        let got = start.elapsed();
        // Opened in place: the body is ours alone unless the HTTP stack kept a share of it.
        let mut body = body
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
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
        Ok(Some(body.freeze()))
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
