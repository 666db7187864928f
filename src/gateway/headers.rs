//! What the gateway keeps of an object besides its bytes, as S3 does: the headers stored with
//! it (Content-Type, Cache-Control, Content-Disposition, Content-Encoding, Content-Language,
//! Expires) and its user metadata (`x-amz-meta-*`). They live in one xattr of the object's
//! file, `user.s3.meta`, a small JSON object, written on the temporary file before it is put
//! in place (so an object appears with its metadata or not at all), and on a multipart
//! upload's directory from its creation to its completion.
//!
//! Not for: the ETag (`objects`), parsing or writing HTTP headers (s3s).

use std::collections::BTreeMap;

use s3s::dto::{Metadata, Timestamp, TimestampFormat};
use s3s::{S3Result, s3_error};
use serde::{Deserialize, Serialize};

use crate::meta::{Ctx, Ino};
use crate::vfs::{self, Vfs};

/// The xattr that holds an object's headers and metadata.
pub const XATTR: &[u8] = b"user.s3.meta";
/// What S3 answers for an object stored without a Content-Type.
pub const DEFAULT_CONTENT_TYPE: &str = "binary/octet-stream";
/// S3's limit on user metadata: the bytes (UTF-8) of its keys and values, summed.
pub const MAX_USER_METADATA: usize = 2 << 10;

/// An object's stored headers and user metadata (keys lowercase, without `x-amz-meta-`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    /// As an HTTP date.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
}

/// The headers a request gives for its object (PutObject, CreateMultipartUpload, CopyObject
/// with REPLACE), refused with S3's error if its user metadata is over S3's limit.
macro_rules! requested {
    ($input:expr) => {
        $crate::gateway::headers::Headers::checked(
            $input.content_type,
            $input.cache_control,
            $input.content_disposition,
            $input.content_encoding,
            $input.content_language,
            $input.expires,
            $input.metadata,
        )
    };
}
pub(crate) use requested;

/// Sets the fields of a HeadObject or GetObject answer from an object's `Headers`: its
/// Content-Type is S3's default when none was stored.
macro_rules! answer {
    ($out:expr, $headers:expr) => {{
        let h: $crate::gateway::headers::Headers = $headers;
        $out.expires = h.expires();
        $out.content_type = Some(
            h.content_type
                .unwrap_or_else(|| $crate::gateway::headers::DEFAULT_CONTENT_TYPE.into()),
        );
        $out.cache_control = h.cache_control;
        $out.content_disposition = h.content_disposition;
        $out.content_encoding = h.content_encoding;
        $out.content_language = h.content_language;
        $out.metadata = (!h.meta.is_empty()).then(|| h.meta.into_iter().collect());
    }};
}
pub(crate) use answer;

impl Headers {
    /// The headers given, checked: the user metadata within [`MAX_USER_METADATA`] bytes
    /// (S3's `MetadataTooLarge` otherwise).
    pub fn checked(
        content_type: Option<String>,
        cache_control: Option<String>,
        content_disposition: Option<String>,
        content_encoding: Option<String>,
        content_language: Option<String>,
        expires: Option<Timestamp>,
        metadata: Option<Metadata>,
    ) -> S3Result<Headers> {
        let meta: BTreeMap<String, String> = metadata
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        let size: usize = meta.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > MAX_USER_METADATA {
            return Err(s3_error!(
                MetadataTooLarge,
                "Your metadata headers exceed the maximum allowed metadata size: {size} bytes \
                 of keys and values, at most {MAX_USER_METADATA}"
            ));
        }
        let expires = expires.and_then(|t| {
            let mut b = Vec::new();
            t.format(TimestampFormat::HttpDate, &mut b).ok()?;
            String::from_utf8(b).ok()
        });
        Ok(Headers {
            content_type,
            cache_control,
            content_disposition,
            content_encoding,
            content_language,
            expires,
            meta,
        })
    }

    /// These headers with those a GetObject asks to answer instead (`response-content-type`
    /// and the like, as S3 takes them).
    pub fn overridden(
        mut self,
        content_type: Option<String>,
        cache_control: Option<String>,
        content_disposition: Option<String>,
        content_encoding: Option<String>,
        content_language: Option<String>,
        expires: Option<Timestamp>,
    ) -> Headers {
        let over = |mine: &mut Option<String>, theirs: Option<String>| {
            if theirs.is_some() {
                *mine = theirs;
            }
        };
        over(&mut self.content_type, content_type);
        over(&mut self.cache_control, cache_control);
        over(&mut self.content_disposition, content_disposition);
        over(&mut self.content_encoding, content_encoding);
        over(&mut self.content_language, content_language);
        if let Some(t) = expires {
            let mut b = Vec::new();
            if t.format(TimestampFormat::HttpDate, &mut b).is_ok() {
                self.expires = String::from_utf8(b).ok();
            }
        }
        self
    }

    /// Expires, as s3s answers it.
    pub fn expires(&self) -> Option<Timestamp> {
        self.expires
            .as_deref()
            .and_then(|s| Timestamp::parse(TimestampFormat::HttpDate, s).ok())
    }

    /// The headers recorded on `ino`: none when it has none (a file written through a mount)
    /// or when what it has is not ours to read (set by hand, and unreadable).
    pub fn read(vfs: &Vfs, ino: Ino) -> vfs::Result<Headers> {
        match vfs.get_xattr(ino, XATTR) {
            Ok(v) => Ok(serde_json::from_slice(&v).unwrap_or_else(|e| {
                tracing::debug!("gateway: inode {ino}: unreadable {XATTR:?} ignored: {e}");
                Headers::default()
            })),
            Err(e) if e.errno() == libc::ENODATA => Ok(Headers::default()),
            Err(e) => Err(e),
        }
    }

    /// Records these headers on `ino` (nothing when there are none).
    pub fn save(&self, vfs: &Vfs, ctx: &Ctx, ino: Ino) -> vfs::Result<()> {
        if *self == Headers::default() {
            return Ok(());
        }
        let json = serde_json::to_vec(self).expect("headers serialize");
        vfs.set_xattr(ctx, ino, XATTR, &json, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_metadata_over_two_kib_is_refused() {
        let meta = |v: usize| Some(Metadata::from_iter([("k".to_string(), "v".repeat(v))]));
        let h = Headers::checked(None, None, None, None, None, None, meta(2047)).unwrap();
        assert_eq!(h.meta["k"].len(), 2047);
        let e = Headers::checked(None, None, None, None, None, None, meta(2048)).unwrap_err();
        assert_eq!(e.code(), &s3s::S3ErrorCode::MetadataTooLarge);
    }

    #[test]
    fn headers_round_trip_as_json() {
        let mut h = Headers::checked(
            Some("text/html; charset=utf-8".into()),
            Some("max-age=60".into()),
            None,
            Some("gzip".into()),
            None,
            Some(
                Timestamp::parse(TimestampFormat::HttpDate, "Wed, 21 Oct 2037 07:28:00 GMT")
                    .unwrap(),
            ),
            Some(Metadata::from_iter([(
                "Color".to_string(),
                "blau – ü".to_string(),
            )])),
        )
        .unwrap();
        assert_eq!(h.meta["color"], "blau – ü");
        let json = serde_json::to_string(&h).unwrap();
        assert!(
            json.contains("\"content-type\":\"text/html; charset=utf-8\""),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Headers>(&json).unwrap(), h);
        assert!(h.expires().is_some());
        h = h.overridden(
            Some("text/plain".into()),
            None,
            Some("attachment".into()),
            None,
            None,
            None,
        );
        assert_eq!(h.content_type.as_deref(), Some("text/plain"));
        assert_eq!(h.content_disposition.as_deref(), Some("attachment"));
        assert_eq!(h.cache_control.as_deref(), Some("max-age=60"));
    }
}
