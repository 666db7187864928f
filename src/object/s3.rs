//! `s3://bucket[/prefix]`: AWS S3 and every S3-compatible store (MinIO, Ceph RGW, R2, Wasabi,
//! versitygw, ...).
//!
//! Credentials come from the standard AWS environment variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), else from the shared credentials file
//! (`~/.aws/credentials`, profile `AWS_PROFILE` or `default`), else from the instance
//! metadata service. They are never printed or logged. The endpoint comes from `?endpoint=`,
//! `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (as the AWS SDKs read it); a custom endpoint
//! uses path-style addressing unless `?path_style=false`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::signer::Signer;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use super::Error;
use super::retry::Policy;

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// A profile of an AWS-style INI file (`[name]` or `[profile name]`).
fn ini_profile(path: &std::path::Path, profile: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return out;
    };
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') && line.ends_with(']') {
            let name = line[1..line.len() - 1].trim();
            inside =
                name == profile || name.strip_prefix("profile ").map(str::trim) == Some(profile);
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_string(), v.trim().to_string());
            }
        }
    }
    out
}

pub fn build(
    bucket: &str,
    params: &BTreeMap<String, String>,
    policy: &Policy,
) -> Result<AmazonS3, Error> {
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let endpoint = params
        .get("endpoint")
        .cloned()
        .or_else(|| env("AWS_ENDPOINT_URL_S3"))
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .or_else(|| env("AWS_ENDPOINT"));
    let home = dirs::home_dir().unwrap_or_default();
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    if env("AWS_ACCESS_KEY_ID").is_none() {
        let file = env("AWS_SHARED_CREDENTIALS_FILE")
            .map(Into::into)
            .unwrap_or(home.join(".aws/credentials"));
        let creds = ini_profile(&file, &profile);
        if let (Some(k), Some(s)) = (
            creds.get("aws_access_key_id"),
            creds.get("aws_secret_access_key"),
        ) {
            b = b.with_access_key_id(k).with_secret_access_key(s);
            if let Some(t) = creds.get("aws_session_token") {
                b = b.with_token(t);
            }
        }
    }
    let region = params
        .get("region")
        .cloned()
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .or_else(|| {
            let file = env("AWS_CONFIG_FILE")
                .map(Into::into)
                .unwrap_or(home.join(".aws/config"));
            ini_profile(&file, &profile).get("region").cloned()
        })
        .unwrap_or_else(|| "us-east-1".into());
    b = b.with_region(region);
    let allow_http = endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"))
        || params.get("allow_http").is_some_and(|v| v == "true");
    // Client options first: they carry allow_http, which a later call would reset.
    b = b
        .with_client_options(client_options(policy, allow_http))
        .with_retry(retry_config(policy));
    if let Some(ep) = &endpoint {
        b = b.with_endpoint(ep.clone());
    }
    let path_style = match params.get("path_style").map(String::as_str) {
        Some("false") => false,
        Some(_) => true,
        None => endpoint.is_some(),
    };
    b = b.with_virtual_hosted_style_request(!path_style);
    Ok(b.build()?)
}

/// HTTP client settings: per-request timeouts, and plain HTTP only where asked for (local
/// test servers, emulators).
pub(super) fn client_options(policy: &Policy, allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_timeout(policy.timeout)
        .with_connect_timeout(Duration::from_secs(10))
        .with_allow_http(allow_http)
}

/// No HTTP-level retries in object_store's client (S3, GCS and Azure alike): a request is
/// retried by `retry::Retried` alone, which logs each retry, keeps the budget of
/// `Policy::attempts` and puts a timeout on each attempt. Retries here would run inside each
/// of those attempts and multiply the budget.
pub(super) fn retry_config(policy: &Policy) -> RetryConfig {
    RetryConfig {
        max_retries: 0,
        retry_timeout: policy.timeout,
        ..RetryConfig::default()
    }
}

/// Creates the bucket (a presigned CreateBucket request: the credentials must allow it).
pub async fn create_bucket(s3: &AmazonS3) -> Result<(), String> {
    let url = s3
        .signed_url(
            reqwest::Method::PUT,
            &ObjPath::from(""),
            Duration::from_secs(300),
        )
        .await
        .map_err(|e| e.to_string())?;
    let resp = reqwest::Client::new()
        .put(url)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if status.is_success() || body.contains("BucketAlreadyOwnedByYou") {
        Ok(())
    } else {
        Err(format!(
            "CreateBucket answered {status}: {}",
            body.chars().take(300).collect::<String>()
        ))
    }
}

/// Keeps `Arc<dyn ObjectStore>` and the concrete S3 store side by side.
pub fn erase(s3: AmazonS3) -> (Arc<dyn ObjectStore>, Arc<AmazonS3>) {
    let s = Arc::new(s3);
    (s.clone(), s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("credentials");
        std::fs::write(
            &p,
            "[default]\naws_access_key_id = A\naws_secret_access_key = B\n[profile work]\nregion=eu-west-3\n",
        )
        .unwrap();
        let d = ini_profile(&p, "default");
        assert_eq!(d["aws_access_key_id"], "A");
        assert_eq!(d["aws_secret_access_key"], "B");
        assert_eq!(ini_profile(&p, "work")["region"], "eu-west-3");
        assert!(ini_profile(&p, "none").is_empty());
    }
}
