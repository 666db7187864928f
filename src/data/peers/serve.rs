//! Serving the group: an HTTP/1.1 server (hyper, as `/metrics`) on the address the member
//! was told to listen on, answering `GET /v1/blocks/KEY` with the block's object as the
//! bucket stores it (an encrypted volume's stays encrypted), sealed for that request (`auth`),
//! to requests signed with the group's key and not seen before, within the serving bandwidth
//! limit; or byte ranges of a block it holds (`?held_ranges=`, a small read's). Anything else
//! is refused.
//!
//! Not for: where the object comes from (`Group::serve_object`), or the key (`auth`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Weak;
use std::sync::atomic::Ordering::Relaxed;

use bytes::{Bytes, BytesMut};
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};

use super::Group;
use super::ask::{HELD_RANGES, PREFIX};
use super::auth::{self, Refusal};

/// Accepts connections until the group is gone.
pub async fn run(listener: tokio::net::TcpListener, group: Weak<Group>) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("peer cache listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        if group.strong_count() == 0 {
            return;
        }
        // An answer's last segment is sent at once, not held for the ACK of those before
        // (Nagle; the asker's side, reqwest, sets it too).
        let _ = stream.set_nodelay(true);
        let group = group.clone();
        tokio::spawn(async move {
            let answer = hyper::service::service_fn(move |req| {
                let group = group.clone();
                async move { Ok::<_, Infallible>(answer(group, req, from).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), answer)
                .await;
        });
    }
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
        .body(Full::new(body))
        .expect("a response of fixed parts")
}

async fn answer<B>(group: Weak<Group>, req: Request<B>, from: SocketAddr) -> Response<Full<Bytes>> {
    let Some(group) = group.upgrade() else {
        return reply(StatusCode::SERVICE_UNAVAILABLE, Bytes::new());
    };
    // What is signed: the path and its query.
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    let given = req
        .headers()
        .get(auth::HEADER)
        .and_then(|v| v.to_str().ok());
    let nonce = match group.auth.check(req.method().as_str(), &path, given) {
        Ok(nonce) => nonce,
        Err(r) => {
            group.stats.refused.fetch_add(1, Relaxed);
            let (status, why) = match r {
                Refusal::Missing => (StatusCode::UNAUTHORIZED, "no credentials"),
                Refusal::Wrong(why) => (StatusCode::FORBIDDEN, why),
            };
            tracing::warn!("peer cache: refused a request from {from} ({why})");
            return reply(status, Bytes::from(format!("refused: {why}\n")));
        }
    };
    let (key, query) = req
        .uri()
        .path()
        .strip_prefix(PREFIX)
        .map_or((None, None), |k| (Some(k), req.uri().query()));
    let key = match key {
        Some(k) if req.method() == Method::GET && group.holder.is_block(k) => k,
        _ => {
            return reply(
                StatusCode::NOT_FOUND,
                Bytes::from_static(b"no such block\n"),
            );
        }
    };
    if let Some(q) = query {
        return held_ranges(&group, key, q, &path, &nonce).await;
    }
    let start = std::time::Instant::now();
    match group.serve_object(key).await {
        Some(obj) => {
            let got = start.elapsed();
            served(&group, obj.len()).await;
            let obj = match group.corrupt {
                true => super::corrupt(obj),
                false => obj,
            };
            let res = sealed(&group, &path, &nonce, obj);
            tracing::debug!(
                "peer cache: served block {key} to {from}: had it in {got:?}, sealed in {:?}",
                start.elapsed() - got
            );
            res
        }
        None => reply(
            StatusCode::BAD_GATEWAY,
            Bytes::from_static(b"unavailable\n"),
        ),
    }
}

/// A 200 answer of `obj`, sealed for the request of `path` and `nonce` (in place when this
/// is its only holder, else a copy).
fn sealed(group: &Group, path: &str, nonce: &str, obj: Bytes) -> Response<Full<Bytes>> {
    let mut body = obj
        .try_into_mut()
        .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    let seal = group.auth.seal_answer(path, nonce, &mut body);
    let body = match group.forge {
        true => super::corrupt(body.freeze()),
        false => body.freeze(),
    };
    let mut res = reply(StatusCode::OK, body);
    res.headers_mut().insert(
        auth::ANSWER_HEADER,
        hyper::header::HeaderValue::from_str(&seal).expect("hex"),
    );
    res
}

/// The answer to `?held_ranges=A-B,...` for block `key`: those bytes of its object, one after
/// the other, if this member holds it (404 if not: nothing is fetched for a small read).
async fn held_ranges(
    group: &Group,
    key: &str,
    query: &str,
    path: &str,
    nonce: &str,
) -> Response<Full<Bytes>> {
    let bad = || reply(StatusCode::BAD_REQUEST, Bytes::from_static(b"bad ranges\n"));
    let Some(list) = query
        .strip_prefix(HELD_RANGES)
        .and_then(|q| q.strip_prefix('='))
    else {
        return bad();
    };
    let ranges: Option<Vec<std::ops::Range<usize>>> = list
        .split(',')
        .take(4)
        .map(|r| {
            let (a, b) = r.split_once('-')?;
            let (a, b) = (a.parse().ok()?, b.parse().ok()?);
            (a <= b).then_some(a..b)
        })
        .collect();
    let Some(ranges) = ranges else {
        return bad();
    };
    // Only those bytes are read, never the whole object for a small read.
    let Some(body) = group.holder.held_ranges(key, ranges).await else {
        return reply(StatusCode::NOT_FOUND, Bytes::from_static(b"not held\n"));
    };
    served(group, body.len()).await;
    let body = match group.corrupt {
        true => super::corrupt(Bytes::from(body)),
        false => Bytes::from(body),
    };
    sealed(group, path, nonce, body)
}

/// An answer of `len` bytes about to be sent: the serving limit waited for, and counted.
async fn served(group: &Group, len: usize) {
    if let Some(rate) = &group.rate {
        rate.take(len as u64).await;
    }
    group.stats.served.fetch_add(1, Relaxed);
    group.stats.served_bytes.fetch_add(len as u64, Relaxed);
}
