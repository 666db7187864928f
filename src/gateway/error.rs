//! The S3 error an outcome of the volume becomes: every `vfs::Error` the gateway meets is
//! turned into S3's own error code here, and only here.
//!
//! Not for: errors s3s itself answers (signatures, malformed requests, bad names), or
//! deciding what a missing thing is (the caller says: a bucket, a key or an upload).

use s3s::{S3Error, S3ErrorCode};

use crate::vfs;

/// What the request named that may be missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    Bucket,
    Key,
    Upload,
    /// Putting an object in place: its bucket may be gone, or its path may cross a file or
    /// name a directory.
    Place,
}

/// S3's error for a failed vfs call on a request about `missing`.
pub fn s3_error(e: &vfs::Error, missing: Missing) -> S3Error {
    s3_errno(e.errno(), missing, &e.to_string())
}

/// S3's error for `errno` (see [`s3_error`]); `what` is the volume's own words, for the
/// message.
pub fn s3_errno(errno: i32, missing: Missing, what: &str) -> S3Error {
    let missing_code = || match missing {
        Missing::Bucket => S3ErrorCode::NoSuchBucket,
        Missing::Key => S3ErrorCode::NoSuchKey,
        Missing::Upload => S3ErrorCode::NoSuchUpload,
        Missing::Place => S3ErrorCode::NoSuchBucket,
    };
    let conflict =
        matches!(errno, libc::ENOTDIR | libc::EISDIR | libc::EEXIST) && missing == Missing::Place;
    let (code, msg): (S3ErrorCode, String) = match errno {
        // A key through a file (ENOTDIR), or naming a directory (EISDIR), is no object.
        _ if conflict => (
            S3ErrorCode::Custom("KeyConflict".into()),
            "the key's path crosses a file or names a directory on the volume".into(),
        ),
        libc::ENOENT | libc::ENOTDIR | libc::EISDIR => (missing_code(), what.into()),
        libc::EACCES | libc::EPERM => (S3ErrorCode::AccessDenied, what.into()),
        libc::EROFS => (
            S3ErrorCode::AccessDenied,
            "the volume is served read-only".into(),
        ),
        libc::ENOTEMPTY => (S3ErrorCode::BucketNotEmpty, what.into()),
        libc::ENAMETOOLONG => (
            S3ErrorCode::KeyTooLongError,
            "a component of the key is longer than the volume allows (255 bytes)".into(),
        ),
        libc::EFBIG => (S3ErrorCode::EntityTooLarge, what.into()),
        libc::EINVAL => (S3ErrorCode::InvalidArgument, what.into()),
        libc::ENOSPC | libc::EDQUOT => {
            let mut e = S3Error::with_message(
                S3ErrorCode::Custom("InsufficientStorage".into()),
                format!("the volume is full or over its quota: {what}"),
            );
            e.set_status_code(http::StatusCode::INSUFFICIENT_STORAGE);
            return e;
        }
        _ => {
            tracing::warn!("gateway: {what} (errno {errno})");
            (
                S3ErrorCode::InternalError,
                format!("the volume failed: {what}"),
            )
        }
    };
    let mut e = S3Error::with_message(code, msg);
    if conflict {
        e.set_status_code(http::StatusCode::CONFLICT);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_become_s3_codes() {
        let code = |n, m| s3_errno(n, m, "x").code().clone();
        assert_eq!(code(libc::ENOENT, Missing::Key), S3ErrorCode::NoSuchKey);
        assert_eq!(
            code(libc::ENOENT, Missing::Bucket),
            S3ErrorCode::NoSuchBucket
        );
        assert_eq!(
            code(libc::ENOENT, Missing::Upload),
            S3ErrorCode::NoSuchUpload
        );
        assert_eq!(code(libc::EISDIR, Missing::Key), S3ErrorCode::NoSuchKey);
        assert_eq!(code(libc::EACCES, Missing::Key), S3ErrorCode::AccessDenied);
        assert_eq!(
            code(libc::ENOTEMPTY, Missing::Bucket),
            S3ErrorCode::BucketNotEmpty
        );
        assert_eq!(
            code(libc::EISDIR, Missing::Place),
            S3ErrorCode::Custom("KeyConflict".into())
        );
        assert_eq!(
            code(libc::ENOENT, Missing::Place),
            S3ErrorCode::NoSuchBucket
        );
        assert_eq!(code(libc::EIO, Missing::Key), S3ErrorCode::InternalError);
        let full = s3_errno(libc::EDQUOT, Missing::Key, "quota");
        assert_eq!(
            full.status_code(),
            Some(http::StatusCode::INSUFFICIENT_STORAGE)
        );
    }
}
