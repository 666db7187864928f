//! Asking a member of the group for a block: one HTTP GET (reqwest, the client the object
//! stores use; HTTP/1.1 over a pooled connection) signed with the group's key, within a time
//! limit, its answer the object as the bucket stores it, taken only with the member's HMAC
//! of it for this very request (`auth`).
//!
//! Not for: checking the answer (the caller decodes it as any stored object), or what to
//! do when a member fails (`peers` bypasses it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::auth::{self, Auth};

/// Where blocks are served: `/v1/blocks/KEY`.
pub const PREFIX: &str = "/v1/blocks/";

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
        let signed = self.auth.sign("GET", &path);
        let res = self
            .client
            .get(format!("http://{member}{path}"))
            .header(auth::HEADER, &signed.header)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = res.status();
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        let tag = res
            .headers()
            .get(auth::ANSWER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = res.bytes().await.map_err(|e| describe(&e))?;
        if !self
            .auth
            .check_answer(&path, &signed.nonce, &body, tag.as_deref())
        {
            return Err("its answer is not signed with the group's key for this request                         (altered on the way, or not a member)"
                .into());
        }
        Ok(body)
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
