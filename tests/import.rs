//! `unkai import`'s layers against a real S3 server (versitygw). So far its first layer:
//! reads pinned to the version of an object that was imported (`object::get_pinned`), which
//! must never return bytes of another version.

mod common;

use bytes::Bytes;
use common::*;
use unkai::object::{Error, ObjectStorage, Pin};

#[test]
fn pinned_reads_on_s3_never_return_another_version() {
    let server = servers::s3("pinned");
    // The only test of this binary: the store reads its endpoint and keys from the
    // environment, set before any other thread runs.
    for (k, v) in &server.env {
        unsafe { std::env::set_var(k, v) };
    }
    let s = ObjectStorage::open("s3://pinned", false).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        s.create_bucket().await.unwrap();
        let (one, two) = (pattern(100_000, 1), pattern(100_000, 2));
        s.put("data/obj", Bytes::from(one.clone())).await.unwrap();
        let listed = s.list("data").await.unwrap();
        assert_eq!(
            (listed[0].key.as_str(), listed[0].size),
            ("data/obj", 100_000)
        );
        let etag = listed[0].etag.clone().expect("S3 lists ETags");
        let pin = Pin {
            etag,
            size: 100_000,
        };
        let got = s.get_pinned("data/obj", 1000..5000, &pin).await.unwrap();
        assert_eq!(&got[..], &one[1000..5000]);
        // Replaced behind the reader with the same size and other bytes: the ETag tells.
        s.put("data/obj", Bytes::from(two)).await.unwrap();
        let e = s
            .get_pinned("data/obj", 1000..5000, &pin)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::Changed { key, .. } if key == "data/obj"),
            "{e}"
        );
        assert_eq!(e.errno(), libc::EIO);
        assert!(e.to_string().contains("changed behind unkai"), "{e}");
        // Gone.
        s.delete("data/obj").await.unwrap();
        let e = s.get_pinned("data/obj", 0..10, &pin).await.unwrap_err();
        assert!(e.to_string().contains("deleted"), "{e}");
        // An unpinned read of a missing object is still NotFound.
        assert!(matches!(
            s.get_range("data/obj", 0..10).await,
            Err(Error::NotFound(_))
        ));
    });
}
