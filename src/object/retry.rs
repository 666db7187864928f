//! [`Retried`]: a timeout per attempt, retries of transient failures with exponential
//! backoff and full jitter, and a deadline for the whole request, under a [`Policy`] (which
//! also carries the bound on requests in flight that `limit::Limited` applies). A store that
//! stops answering is logged once (and once again when it answers), not per request. This
//! is the one retry layer of a request: the HTTP clients of object_store are built without
//! retries of their own (`s3::retry_config`).
//!
//! Not for: which errors an application sees (mapped in `object::Error::errno`), or the bound
//! on requests in flight (that is `limit`).

use std::future::Future;
use std::ops::Range;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use rand::Rng;

use super::bucket::{Bucket, StoreResult};
use super::{ObjectInfo, Payload, Pin};

/// How requests are run.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Attempts per request (the first included).
    pub attempts: u32,
    /// First backoff; doubles each retry, up to `max_backoff`, with full jitter.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    /// Time limit of one attempt.
    pub timeout: Duration,
    /// Time limit of a whole request, its retries included: past it the request fails (an
    /// application sees EIO) instead of waiting for a store that does not answer.
    pub deadline: Duration,
    /// Requests in flight at most.
    pub max_inflight: usize,
    /// Puts in flight at most (`--max-uploads`), within `max_inflight`.
    pub max_uploads: usize,
    /// Bytes per second sent to the store (`--upload-limit`) and read from it
    /// (`--download-limit`) at most; None: unlimited.
    pub upload_limit: Option<u64>,
    pub download_limit: Option<u64>,
}

/// Puts in flight by default, as JuiceFS's `--max-uploads`.
pub const MAX_UPLOADS: usize = 20;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            attempts: 6,
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            timeout: Duration::from_secs(20),
            deadline: Duration::from_secs(60),
            max_inflight: 64,
            max_uploads: MAX_UPLOADS,
            upload_limit: None,
            download_limit: None,
        }
    }
}

impl Policy {
    /// Backoff before retry number `n` (1-based): random in [0, min(max, base * 2^(n-1))].
    pub fn backoff(&self, n: u32) -> Duration {
        let cap = self
            .base_backoff
            .saturating_mul(1u32 << (n - 1).min(20))
            .min(self.max_backoff);
        let ms = cap.as_millis() as u64;
        Duration::from_millis(if ms == 0 {
            0
        } else {
            rand::rng().random_range(0..=ms)
        })
    }
}

/// Whether a failure may go away if the request is repeated.
pub fn transient(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    match e {
        E::NotFound { .. }
        | E::AlreadyExists { .. }
        | E::Precondition { .. }
        | E::NotModified { .. }
        | E::NotImplemented { .. }
        | E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::InvalidPath { .. }
        | E::UnknownConfigurationKey { .. } => false,
        E::Generic { source, .. } => {
            // A local disk that is full or read-only stays so: fail at once.
            let io = super::find_io(source.as_ref()).and_then(|io| io.raw_os_error());
            !matches!(
                io,
                Some(
                    libc::ENOSPC
                        | libc::EDQUOT
                        | libc::EROFS
                        | libc::EACCES
                        | libc::EPERM
                        | libc::EISDIR
                        | libc::ENOTDIR
                )
            )
        }
        _ => true,
    }
}

/// Whether the store has stopped answering (an attempt timed out and none succeeded since),
/// and whether requests fail for good (their retries spent, none succeeded since): each said
/// once in the log when it starts and once when it ends, not per request.
#[derive(Debug, Default)]
pub struct Stall {
    silent: AtomicBool,
    failing: AtomicBool,
}

impl Stall {
    fn timed_out(&self, what: &str, policy: &Policy) {
        if !self.silent.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the object store does not answer ({what}: nothing in {:?}); requests are \
                 retried, and fail with EIO after {:?}",
                policy.timeout,
                policy.deadline
            );
        }
    }

    fn answered(&self) {
        if self.silent.swap(false, Ordering::Relaxed) {
            tracing::warn!("the object store answers again");
        }
        if self.failing.swap(false, Ordering::Relaxed) {
            tracing::warn!("requests to the object store succeed again");
        }
    }

    /// A request failed for good; the first of a run is a warning, the rest are details.
    fn failed(&self, what: &str, n: u32, err: &object_store::Error) {
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "{what} failed after {n} attempts: {err} (until a request succeeds, further \
                 failures are logged at debug level)"
            );
        } else {
            tracing::debug!("{what} failed after {n} attempts: {err}");
        }
    }
}

/// Runs `op` under the policy. `what` names the request in logs and errors.
pub async fn run<T, F, Fut>(
    policy: &Policy,
    stall: &Stall,
    what: &str,
    op: F,
) -> Result<T, object_store::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, object_store::Error>>,
{
    match tokio::time::timeout(policy.deadline, attempts(policy, stall, what, op)).await {
        Ok(res) => res,
        Err(_) => {
            stall.timed_out(what, policy);
            Err(object_store::Error::Generic {
                store: "unkai",
                source: format!(
                    "{what}: no answer within the deadline of {:?}",
                    policy.deadline
                )
                .into(),
            })
        }
    }
}

async fn attempts<T, F, Fut>(
    policy: &Policy,
    stall: &Stall,
    what: &str,
    mut op: F,
) -> Result<T, object_store::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, object_store::Error>>,
{
    let mut n = 1;
    loop {
        let err = match tokio::time::timeout(policy.timeout, op()).await {
            Ok(Ok(v)) => {
                stall.answered();
                return Ok(v);
            }
            Ok(Err(e)) if !transient(&e) => return Err(e),
            Ok(Err(e)) => e,
            Err(_) => {
                stall.timed_out(what, policy);
                object_store::Error::Generic {
                    store: "unkai",
                    source: format!("{what} timed out after {:?}", policy.timeout).into(),
                }
            }
        };
        if n >= policy.attempts {
            stall.failed(what, n, &err);
            return Err(err);
        }
        let wait = policy.backoff(n);
        tracing::debug!("{what} failed (attempt {n}), retrying in {wait:?}: {err}");
        tokio::time::sleep(wait).await;
        n += 1;
    }
}

/// Runs every request of `inner` under a [`Policy`] (timeout per attempt, retries), naming
/// it in logs as `put KEY`, `get KEY`, `get KEY RANGE`, `delete KEY` or `list PREFIX`.
pub struct Retried<B> {
    inner: B,
    policy: Policy,
    /// Shared by the stacks over one store (the probe's and the data's), so that a stall is
    /// said once whichever request meets it.
    stall: std::sync::Arc<Stall>,
}

impl<B: Bucket> Retried<B> {
    pub fn new(inner: B, policy: Policy) -> Self {
        Self::sharing(inner, policy, Default::default())
    }

    /// As [`Retried::new`], saying a stall of the store through `stall`.
    pub fn sharing(inner: B, policy: Policy, stall: std::sync::Arc<Stall>) -> Self {
        Retried {
            inner,
            policy,
            stall,
        }
    }
}

#[async_trait::async_trait]
impl<B: Bucket> Bucket for Retried<B> {
    async fn put(&self, key: &str, data: Payload) -> StoreResult<()> {
        run(&self.policy, &self.stall, &format!("put {key}"), || {
            self.inner.put(key, data.clone())
        })
        .await
    }

    async fn get(&self, key: &str) -> StoreResult<Bytes> {
        run(&self.policy, &self.stall, &format!("get {key}"), || {
            self.inner.get(key)
        })
        .await
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        pin: Option<&Pin>,
    ) -> StoreResult<Bytes> {
        run(
            &self.policy,
            &self.stall,
            &format!("get {key} {range:?}"),
            || self.inner.get_range(key, range.clone(), pin),
        )
        .await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        run(&self.policy, &self.stall, &format!("delete {key}"), || {
            self.inner.delete(key)
        })
        .await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        run(&self.policy, &self.stall, &format!("list {prefix}"), || {
            self.inner.list(prefix)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn fast() -> Policy {
        Policy {
            attempts: 4,
            base_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            timeout: Duration::from_millis(200),
            deadline: Duration::from_secs(30),
            max_inflight: 4,
            ..Policy::default()
        }
    }

    fn generic(msg: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "t",
            source: msg.to_string().into(),
        }
    }

    #[tokio::test]
    async fn retries_transient_failures_then_succeeds() {
        let calls = AtomicU32::new(0);
        let r = run(&fast(), &Stall::default(), "get x", || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(generic("503 SlowDown"))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(r.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn gives_up_after_the_budget_and_never_retries_permanent_errors() {
        let calls = AtomicU32::new(0);
        let r: Result<(), _> = run(&fast(), &Stall::default(), "put x", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(generic("connection reset"))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        calls.store(0, Ordering::SeqCst);
        let r: Result<(), _> = run(&fast(), &Stall::default(), "get y", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(object_store::Error::NotFound {
                path: "y".into(),
                source: "gone".into(),
            })
        })
        .await;
        assert!(matches!(r, Err(object_store::Error::NotFound { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_hung_attempt_times_out_and_is_retried() {
        let calls = AtomicU32::new(0);
        let r = run(&fast(), &Stall::default(), "get z", || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Ok(1)
        })
        .await;
        assert_eq!(r.unwrap(), 1);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_store_that_never_answers_fails_at_the_deadline() {
        let p = Policy {
            attempts: 100,
            deadline: Duration::from_millis(500),
            ..fast()
        };
        let stall = Stall::default();
        let start = std::time::Instant::now();
        let r: Result<(), _> = run(&p, &stall, "get hung", || async {
            std::future::pending::<()>().await;
            Ok(())
        })
        .await;
        assert!(r.unwrap_err().to_string().contains("deadline"));
        assert!(start.elapsed() < Duration::from_secs(20));
        assert!(
            stall.silent.load(Ordering::Relaxed),
            "the stall was not noted"
        );
        run(&p, &stall, "get ok", || async { Ok(()) })
            .await
            .unwrap();
        assert!(
            !stall.silent.load(Ordering::Relaxed),
            "the recovery was not noted"
        );
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = Policy {
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
            ..fast()
        };
        for n in 1..10 {
            assert!(p.backoff(n) <= Duration::from_millis(300));
        }
        assert!(p.backoff(1) <= Duration::from_millis(100));
    }
}
