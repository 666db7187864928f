//! `gs://bucket[/prefix]`: Google Cloud Storage.
//!
//! Credentials: a service account from `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_APPLICATION_CREDENTIALS`
//! (a key file path) or `GOOGLE_SERVICE_ACCOUNT_KEY` (its JSON), else the metadata server.
//! An emulator (fake-gcs-server) is reached through a key file with `"gcs_base_url"` and
//! `"disable_oauth": true`, as object_store supports.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder};

use super::Error;
use super::retry::Policy;
use super::s3::{client_options, retry_config};

pub fn build(bucket: &str, policy: &Policy) -> Result<GoogleCloudStorage, Error> {
    let emulator = base_url().0.starts_with("http://");
    let mut b = GoogleCloudStorageBuilder::from_env();
    if emulator {
        b = b.with_http_connector(EmulatorConnector);
    }
    Ok(b.with_bucket_name(bucket)
        .with_client_options(client_options(policy, base_url().0.starts_with("http://")))
        .with_retry(retry_config(policy))
        .build()?)
}

/// The JSON API base and whether OAuth is off, from the service account key (emulators).
fn base_url() -> (String, bool) {
    let json = std::env::var("GOOGLE_SERVICE_ACCOUNT_KEY")
        .ok()
        .or_else(|| {
            [
                "GOOGLE_SERVICE_ACCOUNT",
                "GOOGLE_APPLICATION_CREDENTIALS",
                "GOOGLE_SERVICE_ACCOUNT_PATH",
            ]
            .iter()
            .find_map(|k| std::env::var(k).ok())
            .and_then(|p| std::fs::read_to_string(p).ok())
        });
    let v: serde_json::Value = json
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_default();
    let base = v["gcs_base_url"]
        .as_str()
        .unwrap_or("https://storage.googleapis.com")
        .trim_end_matches('/')
        .to_string();
    (base, v["disable_oauth"].as_bool().unwrap_or(false))
}

/// Creates the bucket in project `GOOGLE_CLOUD_PROJECT` (JSON API `buckets.insert`).
pub async fn create_bucket(gcs: &GoogleCloudStorage, bucket: &str) -> Result<(), String> {
    let (base, no_oauth) = base_url();
    let project = std::env::var("GOOGLE_CLOUD_PROJECT").unwrap_or_else(|_| "unkai".into());
    let mut req = reqwest::Client::new()
        .post(format!("{base}/storage/v1/b?project={project}"))
        .header("content-type", "application/json")
        .body(serde_json::json!({ "name": bucket }).to_string());
    if !no_oauth {
        let cred = gcs
            .credentials()
            .get_credential()
            .await
            .map_err(|e| e.to_string())?;
        req = req.bearer_auth(&cred.bearer);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    if status.is_success() || status.as_u16() == 409 {
        Ok(())
    } else {
        let body = resp.text().await.unwrap_or_default();
        Err(format!(
            "buckets.insert answered {status}: {}",
            body.chars().take(300).collect::<String>()
        ))
    }
}

pub fn erase(g: GoogleCloudStorage) -> (Arc<dyn ObjectStore>, Arc<GoogleCloudStorage>) {
    let s = Arc::new(g);
    (s.clone(), s)
}

/// For GCS emulators (a plain-http `gcs_base_url`): fake-gcs-server serves the XML API's
/// GET, LIST and DELETE, but stores an object PUT only when it carries the query of a signed
/// upload. This connector adds that marker to PUTs and changes nothing else. Never used with
/// Google's service (https).
#[derive(Debug)]
struct EmulatorConnector;

#[derive(Debug)]
struct EmulatorService(HttpClient);

impl HttpConnector for EmulatorConnector {
    fn connect(&self, options: &object_store::ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(EmulatorService(inner)))
    }
}

#[async_trait::async_trait]
impl HttpService for EmulatorService {
    async fn call(&self, mut req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let put = req.method() == http::Method::PUT && req.uri().scheme_str() == Some("http");
        if put {
            let uri = req.uri().to_string();
            let sep = if uri.contains('?') { '&' } else { '?' };
            if let Ok(u) = format!("{uri}{sep}X-Goog-Algorithm=emulator").parse() {
                *req.uri_mut() = u;
            }
        }
        let mut resp = self.0.execute(req).await?;
        // That route answers in JSON, without the ETag header an XML PUT returns.
        if put && resp.status().is_success() && !resp.headers().contains_key(http::header::ETAG) {
            resp.headers_mut().insert(
                http::header::ETAG,
                http::HeaderValue::from_static("\"emulator\""),
            );
        }
        Ok(resp)
    }
}
