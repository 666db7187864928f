//! Asking a member of the group for a block: one HTTP GET (reqwest, the client the object
//! stores use; HTTP/1.1 over a pooled connection) signed with the group's key, within a time
//! limit, its answer the object as the bucket stores it.
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
        let res = self
            .client
            .get(format!("http://{member}{path}"))
            .header(auth::HEADER, self.auth.sign("GET", &path))
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = res.status();
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        res.bytes().await.map_err(|e| describe(&e))
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
