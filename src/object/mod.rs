//! The bucket: a thin wrapper over the `object_store` crate.
//!
//! [`ObjectStorage`] is built from a storage URL ([`url`]) with one module per backend
//! ([`local`], [`s3`], [`gcs`], [`azure`]; `memory://` for tests). Every request goes through
//! a stack of wrappers of one concern each ([`bucket`] explains the stack), under a
//! [`retry::Policy`]: [`limit`] bounds the requests in flight, [`retry`] puts a timeout on
//! each attempt and retries transient failures with backoff and jitter, [`faulty`] injects
//! failures for tests (`UNKAI_FAULTS`), [`traffic`] counts objects and bytes.
//!
//! Not for: block layout, checksums or caching (that is `data`).

pub mod azure;
pub mod bucket;
pub mod faulty;
pub mod gcs;
pub mod limit;
pub mod local;
pub mod retry;
pub mod s3;
pub mod throttle;
pub mod traffic;
pub mod url;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::prefix::PrefixStore;

use bucket::Bucket;
use faulty::{Faults, Faulty};
use limit::Limited;
use retry::Retried;
use throttle::{Rates, Throttled};
use traffic::Counted;

/// What a put sends: one buffer or several, stored as one object (object_store's type).
pub use object_store::PutPayload as Payload;
pub use retry::Policy;
pub use traffic::Traffic;
pub use url::StorageUrl;

/// Errors of the object layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    BadUrl(String),
    #[error("object {0} not found")]
    NotFound(String),
    /// An object read by its [`Pin`] is no longer that version (or is gone).
    #[error("object {key} changed behind unkai ({what})")]
    Changed { key: String, what: String },
    #[error("object storage {url}: {step} failed: {msg}")]
    Unusable {
        url: String,
        step: &'static str,
        msg: String,
        /// The errno an application would see for the failure.
        errno: i32,
    },
    #[error("object storage: {0}")]
    Store(#[from] object_store::Error),
    #[error("object storage: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The errno an application should see for this failure.
    pub fn errno(&self) -> i32 {
        let io = match self {
            Error::Io(e) => Some(e),
            Error::Store(object_store::Error::Generic { source, .. }) => find_io(source.as_ref()),
            Error::Unusable { errno, .. } => return *errno,
            _ => None,
        };
        match io.and_then(|e| e.raw_os_error()) {
            Some(libc::ENOSPC) => libc::ENOSPC,
            Some(libc::EDQUOT) => libc::EDQUOT,
            Some(libc::EROFS) => libc::EROFS,
            _ => libc::EIO,
        }
    }
}

pub(crate) fn find_io<'a>(
    mut e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a std::io::Error> {
    loop {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        e = e.source()?;
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// An object as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Last modification, ns since the epoch.
    pub modified: i64,
    /// The version's ETag, as the store gives it (quotes included), where it gives one.
    pub etag: Option<String>,
}

/// The version of an object a read insists on (an object imported by reference): its ETag
/// and size when it was imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    pub etag: String,
    pub size: u64,
}

/// The concrete client, for what `ObjectStore` does not cover (creating a bucket).
enum Native {
    None,
    S3(Arc<object_store::aws::AmazonS3>),
    Gcs(Arc<object_store::gcp::GoogleCloudStorage>, String),
}

/// A bucket (or a local directory used as one).
pub struct ObjectStorage {
    /// The store's requests, wrapped (see [`stack`]).
    bucket: Box<dyn Bucket>,
    /// The same, counted apart: the probe of [`ObjectStorage::check`], which is not the
    /// traffic of what the store is used for.
    probe: Box<dyn Bucket>,
    url: String,
    kind: StorageUrl,
    native: Native,
    /// For `file://`: the directory, so that written objects can be fsynced.
    local_root: Option<PathBuf>,
    /// The faults the stack injects (`UNKAI_FAULTS`), to count them.
    faults: Option<Arc<Faults>>,
    /// What the stack counted.
    traffic: Arc<Traffic>,
    /// Puts in flight at most (`Policy::max_uploads`).
    max_uploads: usize,
}

/// The wrappers around every request of `store`, from the outside in: [`Limited`] (one
/// permit per request, held through its retries; puts' own bound), [`Retried`] (a timeout
/// per attempt, the retries), [`Faulty`] (per attempt, only with faults), [`Throttled`]
/// (the bandwidth limits, per attempt), [`Counted`] (what the store moved).
fn stack(
    store: Arc<dyn ObjectStore>,
    policy: &Policy,
    faults: Option<Arc<Faults>>,
    traffic: Arc<Traffic>,
    stall: Arc<retry::Stall>,
    rates: Arc<Rates>,
) -> Box<dyn Bucket> {
    let inner = Throttled::new(Counted::new(bucket::Native(store), traffic), rates);
    let (max, puts) = (policy.max_inflight, policy.max_uploads);
    match faults {
        None => Box::new(Limited::new(
            Retried::sharing(inner, policy.clone(), stall),
            max,
            puts,
        )),
        Some(f) => Box::new(Limited::new(
            Retried::sharing(Faulty::new(inner, f), policy.clone(), stall),
            max,
            puts,
        )),
    }
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectStorage({})", self.url)
    }
}

/// The TLS crypto provider of the HTTP client (ring), installed once per process.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl ObjectStorage {
    /// Opens the storage a URL names. `create` makes a missing local directory.
    pub fn open(url: &str, create: bool) -> Result<ObjectStorage> {
        Self::open_with(url, create, Policy::default())
    }

    pub fn open_with(url: &str, create: bool, policy: Policy) -> Result<ObjectStorage> {
        Self::open_faulty(url, create, policy, Faults::from_env().map(Arc::new))
    }

    /// Opens `url` with the faults given instead of those of `UNKAI_FAULTS`.
    #[cfg(test)]
    pub(crate) fn with_faults(url: &str, faults: Arc<Faults>) -> Result<ObjectStorage> {
        Self::open_faulty(url, true, Policy::default(), Some(faults))
    }

    fn open_faulty(
        url: &str,
        create: bool,
        policy: Policy,
        faults: Option<Arc<Faults>>,
    ) -> Result<ObjectStorage> {
        let kind = StorageUrl::parse(url)?;
        let with_prefix = |s: Arc<dyn ObjectStore>, prefix: &str| -> Arc<dyn ObjectStore> {
            if prefix.is_empty() {
                s
            } else {
                Arc::new(PrefixStore::new(s, prefix))
            }
        };
        let (store, native, local_root) = match &kind {
            StorageUrl::Local(dir) => (
                local::build(url, dir, create)?,
                Native::None,
                Some(dir.clone()),
            ),
            StorageUrl::Memory => (
                Arc::new(object_store::memory::InMemory::new()) as Arc<dyn ObjectStore>,
                Native::None,
                None,
            ),
            StorageUrl::S3 {
                bucket,
                prefix,
                params,
            } => {
                install_tls_provider();
                let (store, s3) = s3::erase(s3::build(bucket, params, &policy)?);
                (with_prefix(store, prefix), Native::S3(s3), None)
            }
            StorageUrl::Gcs { bucket, prefix, .. } => {
                install_tls_provider();
                let (store, g) = gcs::erase(gcs::build(bucket, &policy)?);
                (
                    with_prefix(store, prefix),
                    Native::Gcs(g, bucket.clone()),
                    None,
                )
            }
            StorageUrl::Azure {
                container,
                prefix,
                params,
            } => {
                install_tls_provider();
                let store: Arc<dyn ObjectStore> =
                    Arc::new(azure::build(container, params, &policy)?);
                (with_prefix(store, prefix), Native::None, None)
            }
        };
        let traffic = Arc::<Traffic>::default();
        let stall = Arc::<retry::Stall>::default();
        let rates = Arc::new(Rates::new(policy.upload_limit, policy.download_limit));
        Ok(ObjectStorage {
            probe: stack(
                store.clone(),
                &policy,
                faults.clone(),
                Arc::default(),
                stall.clone(),
                rates.clone(),
            ),
            bucket: stack(
                store,
                &policy,
                faults.clone(),
                traffic.clone(),
                stall,
                rates,
            ),
            max_uploads: policy.max_uploads,
            url: url.into(),
            kind,
            native,
            local_root,
            faults,
            traffic,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Puts in flight at most (`--max-uploads`).
    pub fn max_uploads(&self) -> usize {
        self.max_uploads
    }

    /// Whether objects live on a remote service.
    pub fn is_remote(&self) -> bool {
        self.kind.is_remote()
    }

    /// Whether every request is made to wait (`UNKAI_FAULTS=latency_ms=N`): a local
    /// directory standing in for a store far away, treated as one.
    pub fn answers_late(&self) -> bool {
        self.faults.as_ref().is_some_and(|f| !f.latency.is_zero())
    }

    /// The local directory, for `file://` storage.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local_root.as_deref()
    }

    /// Stores `data` (one buffer, or parts sent as one object without being copied
    /// together) under `key`.
    pub async fn put(&self, key: &str, data: impl Into<Payload>) -> Result<()> {
        let data = data.into();
        let large = data.content_length() >= local::WRITE_OUT_EARLY;
        self.bucket.put(key, data).await?;
        if let Some(root) = self.local_root.as_ref().filter(|_| large) {
            // A large object in a local directory: its disk writes start now, beside the
            // writes still coming, rather than all at the fsync (see `local::write_out_early`).
            let path = root.join(key);
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(move || local::write_out_early(&path))),
                Err(_) => local::write_out_early(&path),
            }
        }
        Ok(())
    }

    /// What this storage put and got so far (write amplification: `put_bytes` against the
    /// bytes applications wrote).
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    pub async fn get(&self, key: &str) -> Result<Bytes> {
        match self.bucket.get(key).await {
            Ok(b) => Ok(b),
            Err(object_store::Error::NotFound { .. }) => Err(Error::NotFound(key.into())),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        match self.bucket.get_range(key, range, None).await {
            Ok(b) => Ok(b),
            Err(object_store::Error::NotFound { .. }) => Err(Error::NotFound(key.into())),
            Err(e) => Err(e.into()),
        }
    }

    /// Bytes `range` of the version of `key` that `pin` names (a ranged GET with If-Match,
    /// and the answer's ETag and size compared): [`Error::Changed`], saying what changed,
    /// if the object is another version or gone; never bytes of another version.
    pub async fn get_pinned(&self, key: &str, range: Range<u64>, pin: &Pin) -> Result<Bytes> {
        match self.bucket.get_range(key, range, Some(pin)).await {
            Ok(b) => Ok(b),
            Err(object_store::Error::NotFound { .. }) => Err(Error::Changed {
                key: key.into(),
                what: format!("deleted; it was ETag {}, size {}", pin.etag, pin.size),
            }),
            Err(object_store::Error::Precondition { source, .. }) => {
                let said = source.to_string();
                Err(Error::Changed {
                    key: key.into(),
                    // Ours names both versions; a server's 412 only that it is not this one.
                    what: if said.starts_with("ETag ") {
                        said
                    } else {
                        format!("no longer ETag {}, size {}", pin.etag, pin.size)
                    },
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes an object; a missing object is not an error.
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.bucket.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Every object under `prefix`.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        Ok(self.bucket.list(prefix).await?)
    }

    /// Makes the given objects durable (fsync for a local directory; nothing otherwise).
    pub fn sync(&self, keys: &[String]) -> Result<()> {
        if let Some(root) = &self.local_root {
            let n = local::sync(root, keys)?;
            self.traffic
                .synced
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Makes every object of a local-directory bucket durable (`syncfs` of its file system):
    /// for objects whose keys were not kept.
    pub fn sync_everything(&self) -> Result<()> {
        match &self.local_root {
            Some(root) => Ok(local::sync_file_system(root)?),
            None => Ok(()),
        }
    }

    /// Proves the storage usable: put, get, list and delete a probe object (through a stack
    /// of its own: not counted in [`ObjectStorage::traffic`]).
    pub async fn check(&self, prefix: &str) -> Result<()> {
        let key = format!(
            "{prefix}/.probe-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        );
        let fail = |step: &'static str, e: Error| Error::Unusable {
            url: self.url.clone(),
            step,
            msg: no_credentials(&self.kind, &e.to_string())
                .unwrap_or_else(|| clipped(&e.to_string(), 500)),
            errno: e.errno(),
        };
        let body = Bytes::from_static(b"unkai probe");
        let probe = &self.probe;
        probe
            .put(&key, body.clone().into())
            .await
            .map_err(|e| fail("writing a probe object", e.into()))?;
        let got = match probe.get(&key).await {
            Err(object_store::Error::NotFound { .. }) => Err(Error::NotFound(key.clone())),
            other => other.map_err(Error::from),
        }
        .map_err(|e| fail("reading the probe object", e))?;
        if got != body {
            return Err(fail(
                "reading the probe object",
                Error::NotFound("content differs".into()),
            ));
        }
        let listed = probe
            .list(prefix)
            .await
            .map_err(|e| fail("listing", e.into()))?;
        if !listed.iter().any(|o| o.key == key) {
            return Err(fail("listing", Error::NotFound(key.clone())));
        }
        match probe.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(fail("deleting the probe object", e.into())),
        }
    }

    /// Creates the bucket, where the backend and the credentials allow it.
    pub async fn create_bucket(&self) -> std::result::Result<(), String> {
        match &self.native {
            Native::S3(s3) => s3::create_bucket(s3).await,
            Native::Gcs(g, bucket) => gcs::create_bucket(g, bucket).await,
            Native::None => match &self.kind {
                StorageUrl::Azure { container, .. } => Err(format!(
                    "unkai does not create Azure containers: create '{container}' (e.g. `az storage \
                     container create --name {container}`) and format again"
                )),
                _ => Ok(()),
            },
        }
    }

    /// Faults injected so far (tests).
    pub fn faults_injected(&self) -> u64 {
        self.faults
            .as_ref()
            .map_or(0, |f| f.injected.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Reduces a store's error to one line: a server's raw answer (often an XML document) is
/// cut to its status, its error code and its message.
pub fn one_line(msg: &str) -> String {
    const STATUS: &str = "Server returned non-2xx status code: ";
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let from = msg.find(&open)? + open.len();
        let to = from + msg[from..].find('<')?;
        // Azure appends "RequestId:..., Time:..." lines to its message: keep the first.
        Some(
            msg[from..to]
                .trim()
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        )
    };
    // "... status code: 403 Forbidden: <?xml ...>...</Error> and more": the status stays,
    // the document becomes "(Code: Message)", what follows it stays.
    let body = msg.find(STATUS).and_then(|at| {
        let open = at + msg[at..].find('<')?;
        let close = msg.rfind('>')? + 1;
        (close > open).then_some((open, close))
    });
    let mut out = match body {
        Some((open, close)) => {
            let head = msg[..open].trim_end().trim_end_matches(':');
            let mut s = head.to_string();
            match (tag("Code"), tag("Message")) {
                (Some(c), Some(m)) => s.push_str(&format!(" ({c}: {m})")),
                (Some(c), None) => s.push_str(&format!(" ({c})")),
                _ => {}
            }
            s.push_str(&msg[close..]);
            s
        }
        None => msg.to_string(),
    };
    out = out.split_whitespace().collect::<Vec<_>>().join(" ");
    out
}

/// What to say when a store's client found no credentials where the user can put them and
/// fell back to the cloud's instance metadata service, which failed (not a cloud VM, or one
/// without a role): which variables to set, instead of the metadata service's error.
fn no_credentials(kind: &StorageUrl, msg: &str) -> Option<String> {
    // The metadata address of EC2, Azure and (besides metadata.google.internal) GCE.
    if !msg.contains("169.254.169.254") && !msg.contains("metadata.google.internal") {
        return None;
    }
    let set = match kind {
        StorageUrl::S3 { .. } => {
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in \
             ~/.aws/credentials (AWS_PROFILE)"
        }
        StorageUrl::Gcs { .. } => {
            "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or \
             GOOGLE_SERVICE_ACCOUNT_KEY to its JSON"
        }
        StorageUrl::Azure { .. } => {
            "set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or \
             AZURE_STORAGE_SAS_KEY"
        }
        _ => return None,
    };
    Some(format!(
        "no credentials found ({set}); this machine's instance metadata service, the last \
         place looked, gave none"
    ))
}

/// `one_line`, cut to at most `max` bytes.
fn clipped(msg: &str, max: usize) -> String {
    let mut out = one_line(msg);
    if out.len() > max {
        let mut cut = max;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

/// Whether a failed check means the bucket itself does not exist.
pub fn is_missing_bucket(e: &Error) -> bool {
    let s = e.to_string();
    [
        "NoSuchBucket",
        "bucket does not exist",
        "ContainerNotFound",
        "The specified bucket",
        "404 Not Found",
    ]
    .iter()
    .any(|m| s.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_credentials_are_named_instead_of_the_metadata_service_error() {
        let imds = "Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/\
                    token in 1ms - Server returned non-2xx status code: 403 Forbidden";
        let s3 = StorageUrl::parse("s3://b").unwrap();
        let got = no_credentials(&s3, imds).unwrap();
        assert!(
            got.starts_with("no credentials found (set AWS_ACCESS_KEY_ID"),
            "{got}"
        );
        let gs = StorageUrl::parse("gs://b").unwrap();
        let got = no_credentials(&gs, "http://metadata.google.internal/x: refused").unwrap();
        assert!(got.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{got}");
        // Any other failure keeps its own words.
        assert_eq!(no_credentials(&s3, "403 Forbidden (AccessDenied)"), None);
    }

    #[test]
    fn one_line_keeps_status_code_and_message() {
        let raw = "Error performing PUT http://h/b/k in 1ms - Server returned non-2xx status \
                   code: 403 Forbidden: <?xml version=\"1.0\"?>\n<Error>\n  \
                   <Code>SignatureDoesNotMatch</Code>\n  <Message>The request signature \
                   does not match.</Message>\n</Error>\n";
        assert_eq!(
            one_line(raw),
            "Error performing PUT http://h/b/k in 1ms - Server returned non-2xx status code: \
             403 Forbidden (SignatureDoesNotMatch: The request signature does not match.)"
        );
        assert_eq!(one_line("a\n  b"), "a b");
        // What follows the document stays; a second pass changes nothing.
        let twice = format!("{}; creating the bucket failed too: why", raw.trim_end());
        assert!(
            one_line(&twice).ends_with("does not match.); creating the bucket failed too: why")
        );
        assert_eq!(one_line(&one_line(&twice)), one_line(&twice));
        assert!(clipped(&"x".repeat(5000), 600).chars().count() <= 601);
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn local_roundtrip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/bucket", dir.path().display());
        assert!(
            ObjectStorage::open(&url, false).is_err(),
            "missing dir must be refused"
        );
        let s = ObjectStorage::open(&url, true).unwrap();
        let rt = rt();
        rt.block_on(async {
            s.check("vol").await.unwrap();
            s.put("vol/a/b", Bytes::from_static(b"hello world"))
                .await
                .unwrap();
            assert_eq!(
                s.get("vol/a/b").await.unwrap(),
                Bytes::from_static(b"hello world")
            );
            assert_eq!(
                s.get_range("vol/a/b", 6..11).await.unwrap(),
                Bytes::from_static(b"world")
            );
            let listed = s.list("vol").await.unwrap();
            assert_eq!(listed.len(), 1);
            assert_eq!((listed[0].key.as_str(), listed[0].size), ("vol/a/b", 11));
            assert!(listed[0].modified > 0);
            assert!(matches!(s.get("vol/nope").await, Err(Error::NotFound(_))));
            // A read pinned to the version listed; then the object is replaced, then gone.
            let etag = listed[0].etag.clone().expect("a local store gives ETags");
            let pin = Pin { etag, size: 11 };
            assert_eq!(
                s.get_pinned("vol/a/b", 0..5, &pin).await.unwrap(),
                Bytes::from_static(b"hello")
            );
            s.put("vol/a/b", Bytes::from_static(b"HELLO world!"))
                .await
                .unwrap();
            let e = s.get_pinned("vol/a/b", 0..5, &pin).await.unwrap_err();
            assert!(
                matches!(&e, Error::Changed { key, .. } if key == "vol/a/b"),
                "{e}"
            );
            assert_eq!(e.errno(), libc::EIO);
            // Same size, other bytes: the ETag tells.
            let pin = Pin {
                etag: s.list("vol").await.unwrap()[0].etag.clone().unwrap(),
                size: 12,
            };
            std::thread::sleep(std::time::Duration::from_millis(20));
            s.put("vol/a/b", Bytes::from_static(b"hello WORLD!"))
                .await
                .unwrap();
            let e = s.get_pinned("vol/a/b", 0..5, &pin).await.unwrap_err();
            assert!(matches!(e, Error::Changed { .. }), "{e}");
            s.delete("vol/a/b").await.unwrap();
            let e = s.get_pinned("vol/a/b", 0..5, &pin).await.unwrap_err();
            assert!(e.to_string().contains("deleted"), "{e}");
            s.put("vol/a/b", Bytes::from_static(b"hello world"))
                .await
                .unwrap();
            s.delete("vol/a/b").await.unwrap();
            s.delete("vol/a/b").await.unwrap();
            assert!(s.list("vol").await.unwrap().is_empty());
        });
        assert!(dir.path().join("bucket").is_dir());
        s.sync(&["vol/gone".to_string()]).unwrap();
        assert!(!s.is_remote());
    }

    /// The order of the wrappers: faults act per attempt inside the retries, the traffic
    /// counts what the store moved (before a read is damaged), failed attempts count nothing.
    #[test]
    fn the_stack_retries_injected_faults_and_counts_what_the_store_moved() {
        let policy = Policy {
            attempts: 3,
            base_backoff: std::time::Duration::from_millis(1),
            max_backoff: std::time::Duration::from_millis(2),
            ..Policy::default()
        };
        let mem = || Arc::new(object_store::memory::InMemory::new()) as Arc<dyn ObjectStore>;
        rt().block_on(async {
            let faults = Arc::new(Faults::parse("error=1.0").unwrap());
            let traffic = Arc::<Traffic>::default();
            let b = stack(
                mem(),
                &policy,
                Some(faults.clone()),
                traffic.clone(),
                Arc::default(),
                Arc::default(),
            );
            assert!(
                b.put("k", Bytes::from_static(b"abcdef").into())
                    .await
                    .is_err()
            );
            let injected = faults.injected.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(injected, 3, "one fault per attempt");
            assert_eq!(traffic.puts.load(std::sync::atomic::Ordering::Relaxed), 0);

            let faults = Arc::new(Faults::parse("truncate=1.0").unwrap());
            let traffic = Arc::<Traffic>::default();
            let b = stack(
                mem(),
                &policy,
                Some(faults),
                traffic.clone(),
                Arc::default(),
                Arc::default(),
            );
            b.put("k", Bytes::from_static(b"abcdef").into())
                .await
                .unwrap();
            assert_eq!(b.get("k").await.unwrap().len(), 3);
            let t = &traffic;
            let load =
                |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!((load(&t.puts), load(&t.put_bytes)), (1, 6));
            assert_eq!((load(&t.gets), load(&t.get_bytes)), (1, 6));
        });
    }

    #[test]
    fn bad_urls() {
        for u in ["bucket", "file://rel/dir", "ftp://x"] {
            let e = ObjectStorage::open(u, false).unwrap_err().to_string();
            assert!(e.contains("storage URL"), "{u}: {e}");
        }
    }
}
