//! `gs://bucket[/prefix]`: Google Cloud Storage.
//!
//! Credentials: a service account from `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_APPLICATION_CREDENTIALS`
//! (a key file path) or `GOOGLE_SERVICE_ACCOUNT_KEY` (its JSON), else the metadata server.
//! An emulator (fake-gcs-server) is reached through a key file with `"gcs_base_url"` and
//! `"disable_oauth": true`, as object_store supports.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder};

use super::Error;
use super::retry::Policy;
use super::s3::{client_options, retry_config};

pub fn build(bucket: &str, policy: &Policy) -> Result<GoogleCloudStorage, Error> {
    Ok(GoogleCloudStorageBuilder::from_env()
        .with_bucket_name(bucket)
        .with_client_options(client_options(policy))
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
