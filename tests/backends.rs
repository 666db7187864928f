//! The core file-system operations on each real object store: S3 (versitygw), GCS
//! (fake-gcs-server), Azure Blob (Azurite).

mod common;

use common::*;

fn roundtrip(server: &servers::Server) {
    let vol = Volume::with_env(&["--storage", &server.storage], server.env.clone());
    let m = vol.mount();
    let data = pattern(9 << 20, 11);
    std::fs::write(m.p("f"), &data).unwrap();
    std::fs::rename(m.p("f"), m.p("g")).unwrap();
    m.unmount();
    let m = vol.mount();
    assert_eq!(std::fs::read(m.p("g")).unwrap(), data);
    std::fs::remove_file(m.p("g")).unwrap();
    m.unmount();
    let (ok, out, err) = vol.cmd("fsck", &["-q"]);
    assert!(ok, "{out}{err}\nserver log:\n{}", server.log());
}

#[test]
fn s3_roundtrip() {
    roundtrip(&servers::s3("unkai-test"));
}

#[test]
fn gcs_roundtrip() {
    roundtrip(&servers::gcs("unkai-test"));
}

#[test]
fn azure_roundtrip() {
    roundtrip(&servers::azure("unkai-test"));
}
