//! Storage URLs: `file:///dir`, `memory://`, `s3://bucket[/prefix][?endpoint=...&region=...]`,
//! `gs://bucket[/prefix]`, `az://container[/prefix]`.
//!
//! Not for: building clients (the backend modules do that).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::Error;

/// A parsed storage URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageUrl {
    Local(PathBuf),
    Memory,
    S3 {
        bucket: String,
        prefix: String,
        params: BTreeMap<String, String>,
    },
    Gcs {
        bucket: String,
        prefix: String,
        params: BTreeMap<String, String>,
    },
    Azure {
        container: String,
        prefix: String,
        params: BTreeMap<String, String>,
    },
}

const EXPECTED: &str = "expected file:///abs/dir, s3://bucket[/prefix], gs://bucket[/prefix], \
                        az://container[/prefix] or memory://";

/// Query parameters each cloud scheme accepts.
const S3_PARAMS: &[&str] = &["endpoint", "region", "path_style", "allow_http"];
const GCS_PARAMS: &[&str] = &[];
const AZURE_PARAMS: &[&str] = &["account", "emulator"];

impl StorageUrl {
    pub fn parse(url: &str) -> Result<StorageUrl, Error> {
        let bad =
            |why: &str| Error::BadUrl(format!("invalid storage URL '{url}': {why}; {EXPECTED}"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let cloud =
            |allowed: &[&str]| -> Result<(String, String, BTreeMap<String, String>), Error> {
                let (bucket, prefix) = match rest.split_once('/') {
                    Some((b, p)) => (b, p.trim_matches('/')),
                    None => (rest, ""),
                };
                if bucket.is_empty() {
                    return Err(bad("no bucket name"));
                }
                if bucket.contains('@') || bucket.contains(':') {
                    return Err(bad(
                        "credentials do not belong in the URL: use the standard environment variables",
                    ));
                }
                let mut params = BTreeMap::new();
                for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
                    if !allowed.contains(&k) {
                        return Err(bad(&format!(
                            "unknown parameter '{k}' (known: {})",
                            if allowed.is_empty() {
                                "none".to_string()
                            } else {
                                allowed.join(", ")
                            }
                        )));
                    }
                    let v = percent_decode(v);
                    params.insert(k.to_string(), v);
                }
                Ok((bucket.to_string(), prefix.to_string(), params))
            };
        match scheme {
            "file" => {
                if query.is_some() {
                    return Err(bad("file:// takes no parameters"));
                }
                if !rest.starts_with('/') {
                    return Err(bad(
                        "the path must be absolute (three slashes: file:///abs/dir)",
                    ));
                }
                Ok(StorageUrl::Local(PathBuf::from(rest)))
            }
            "memory" => Ok(StorageUrl::Memory),
            "s3" => {
                let (bucket, prefix, params) = cloud(S3_PARAMS)?;
                Ok(StorageUrl::S3 {
                    bucket,
                    prefix,
                    params,
                })
            }
            "gs" => {
                let (bucket, prefix, params) = cloud(GCS_PARAMS)?;
                Ok(StorageUrl::Gcs {
                    bucket,
                    prefix,
                    params,
                })
            }
            "az" => {
                let (container, prefix, params) = cloud(AZURE_PARAMS)?;
                Ok(StorageUrl::Azure {
                    container,
                    prefix,
                    params,
                })
            }
            other => Err(bad(&format!("unknown scheme '{other}'"))),
        }
    }

    /// Whether objects live on a remote service (they are durable once put returns).
    pub fn is_remote(&self) -> bool {
        !matches!(self, StorageUrl::Local(_) | StorageUrl::Memory)
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme() {
        assert_eq!(
            StorageUrl::parse("file:///a/b").unwrap(),
            StorageUrl::Local("/a/b".into())
        );
        assert_eq!(StorageUrl::parse("memory://").unwrap(), StorageUrl::Memory);
        match StorageUrl::parse(
            "s3://bkt/some/prefix/?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=eu-west-1",
        )
        .unwrap()
        {
            StorageUrl::S3 {
                bucket,
                prefix,
                params,
            } => {
                assert_eq!(bucket, "bkt");
                assert_eq!(prefix, "some/prefix");
                assert_eq!(params["endpoint"], "http://127.0.0.1:9000");
                assert_eq!(params["region"], "eu-west-1");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(StorageUrl::parse("gs://b").unwrap(), StorageUrl::Gcs { prefix, .. } if prefix.is_empty())
        );
        assert!(
            matches!(StorageUrl::parse("az://c/p").unwrap(), StorageUrl::Azure { prefix, .. } if prefix == "p")
        );
        assert!(StorageUrl::parse("s3://b").unwrap().is_remote());
        assert!(!StorageUrl::parse("file:///x").unwrap().is_remote());
    }

    #[test]
    fn refuses_bad_urls_with_a_hint() {
        for u in [
            "bucket",
            "file://rel",
            "ftp://x",
            "s3://",
            "s3://key:secret@bucket",
            "s3://b?nope=1",
            "gs://b?endpoint=x",
        ] {
            let e = StorageUrl::parse(u).unwrap_err().to_string();
            assert!(
                e.contains("invalid storage URL") && e.contains("expected"),
                "{u}: {e}"
            );
        }
    }
}
