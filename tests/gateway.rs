//! `unkai gateway`: the volume through the S3 API, driven by real S3 clients (object_store's
//! AmazonS3 client, and boto3), then checked through a FUSE mount of the same volume.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

const AK: &str = "gatewaytester";
const SK: &str = "secret-of-the-gateway-test";

/// A gateway serving a volume, stopped on drop (killed if it does not stop).
struct Gateway {
    child: Option<Child>,
    addr: String,
    log: std::path::PathBuf,
}

impl Gateway {
    fn start(vol: &Volume, extra: &[&str]) -> Gateway {
        let log = vol.dir.path().join("gateway.log");
        let _ = std::fs::remove_file(&log);
        let logf = std::fs::File::create(&log).unwrap();
        let mut cmd = unkai();
        cmd.arg("gateway")
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .arg(&vol.meta_url)
            .envs(vol.env.iter().cloned())
            .env("UNKAI_GATEWAY_ACCESS_KEY", AK)
            .env("UNKAI_GATEWAY_SECRET_KEY", SK)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf);
        let mut child = cmd.spawn().expect("spawn unkai gateway");
        let start = Instant::now();
        let addr = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(l) = text.lines().find(|l| l.contains("gateway serving volume")) {
                break l.rsplit(" at ").next().unwrap().trim().to_string();
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!("unkai gateway exited ({st}) before serving:\n{text}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the gateway did not start in 60 s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Gateway {
            child: Some(child),
            addr,
            log,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn store(&self, bucket: &str, secret: &str) -> AmazonS3 {
        // reqwest is built without a default TLS provider (as unkai's object module does).
        let _ = rustls::crypto::ring::default_provider().install_default();
        AmazonS3Builder::new()
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_access_key_id(AK)
            .with_secret_access_key(secret)
            .with_bucket_name(bucket)
            .with_virtual_hosted_style_request(false)
            .build()
            .unwrap()
    }

    /// Stops it with SIGTERM, as a service manager would; it must exit cleanly.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let start = Instant::now();
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the gateway did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            st.success(),
            "the gateway exited with {st}:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The Debian python with its boto3 (the `python3` on PATH may be another), or None when it
/// is missing and clients may be skipped.
fn boto3() -> Option<&'static str> {
    let py = "/usr/bin/python3";
    let ok = Command::new(py)
        .args(["-c", "import boto3"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    assert!(
        std::env::var_os("UNKAI_REQUIRE_CLIENTS").is_none(),
        "boto3 is missing (apt-get install python3-boto3) and UNKAI_REQUIRE_CLIENTS is set"
    );
    eprintln!("SKIPPED: /usr/bin/python3 with boto3 is missing (apt-get install python3-boto3)");
    None
}

/// Runs `script` with boto3 against the gateway (`s3`: a client; `ENDPOINT`, `AK`, `SK`
/// set); returns its stdout, panicking with its stderr if it fails.
fn python(py: &str, gw: &Gateway, secret: &str, script: &str) -> String {
    let prelude = "import boto3, botocore, json, os, sys\n\
        from botocore.config import Config\n\
        ENDPOINT = os.environ['ENDPOINT']; AK = os.environ['AK']; SK = os.environ['SK']\n\
        s3 = boto3.client('s3', endpoint_url=ENDPOINT, aws_access_key_id=AK, \
        aws_secret_access_key=SK, region_name='us-east-1', \
        config=Config(s3={'addressing_style': 'path'}, retries={'max_attempts': 1}))\n\
        def code(f):\n    try:\n        f()\n        return 'OK'\n    except botocore.exceptions.ClientError as e:\n        return e.response['Error']['Code']\n";
    let out = Command::new(py)
        .args(["-c", &format!("{prelude}{script}")])
        .env("ENDPOINT", gw.endpoint())
        .env("AK", AK)
        .env("SK", secret)
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "python failed:\n{o}\n{e}");
    o
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn objects_round_trip_and_are_files_on_the_volume() {
    round_trip(&Volume::new());
}

#[test]
fn objects_round_trip_on_a_postgresql_volume() {
    match Volume::postgres(&[], |u| u.to_string(), Vec::new()) {
        Some(vol) => round_trip(&vol),
        None => eprintln!("skipped: UNKAI_TEST_POSTGRES is unset"),
    }
}

fn round_trip(vol: &Volume) {
    let Some(py) = boto3() else { return };
    let gw = Gateway::start(vol, &[]);
    // boto3: buckets made, listed, one deleted only once empty.
    let out = python(
        py,
        &gw,
        SK,
        "s3.create_bucket(Bucket='photos')\n\
         s3.create_bucket(Bucket='scratch')\n\
         print(code(lambda: s3.create_bucket(Bucket='photos')))\n\
         s3.put_object(Bucket='scratch', Key='x/y.txt', Body=b'temporary')\n\
         print(code(lambda: s3.delete_bucket(Bucket='scratch')))\n\
         s3.delete_object(Bucket='scratch', Key='x/y.txt')\n\
         s3.delete_bucket(Bucket='scratch')\n\
         print(sorted(b['Name'] for b in s3.list_buckets()['Buckets']))\n\
         s3.put_object(Bucket='photos', Key='hello.txt', Body=b'hello, world')\n\
         r = s3.get_object(Bucket='photos', Key='hello.txt')\n\
         print(r['Body'].read().decode(), r['ETag'])\n\
         print(code(lambda: s3.head_object(Bucket='photos', Key='nope')))\n\
         print(code(lambda: s3.get_object(Bucket='nobucket', Key='x')))\n",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "BucketAlreadyOwnedByYou", "{out}");
    assert_eq!(lines[1], "BucketNotEmpty", "{out}");
    assert_eq!(lines[2], "['photos']", "{out}");
    // S3's ETag of a single-part object: the MD5 of its bytes.
    assert_eq!(
        lines[3], "hello, world \"e4d7f1b4ed2e42d15898f4b27b019da4\"",
        "{out}"
    );
    assert_eq!(lines[4], "404", "{out}");
    assert_eq!(lines[5], "NoSuchBucket", "{out}");

    // object_store: puts, listing with a delimiter, whole and ranged gets, copy, delete.
    let big = pattern(6 << 20, 7);
    let small = pattern(1000, 8);
    let store = gw.store("photos", SK);
    rt().block_on(async {
        store
            .put(&Key::from("a/one.txt"), PutPayload::from(small.clone()))
            .await
            .unwrap();
        store
            .put(&Key::from("a/b/two.bin"), PutPayload::from(big.clone()))
            .await
            .unwrap();
        store
            .put(&Key::from("a/c/three"), PutPayload::from(small.clone()))
            .await
            .unwrap();
        store
            .put(&Key::from("a-z"), PutPayload::from(vec![1u8; 10]))
            .await
            .unwrap();
        let l = store
            .list_with_delimiter(Some(&Key::from("a")))
            .await
            .unwrap();
        let keys: Vec<String> = l.objects.iter().map(|o| o.location.to_string()).collect();
        let prefixes: Vec<String> = l.common_prefixes.iter().map(|p| p.to_string()).collect();
        assert_eq!(keys, ["a/one.txt"]);
        assert_eq!(prefixes, ["a/b", "a/c"]);
        assert_eq!(l.objects[0].size, 1000);
        // Everything, sorted by key as S3 sorts: "a-z" before "a/...", "hello.txt" last.
        use futures::TryStreamExt;
        let all: Vec<String> = store
            .list(None)
            .map_ok(|o| o.location.to_string())
            .try_collect()
            .await
            .unwrap();
        assert_eq!(
            all,
            ["a-z", "a/b/two.bin", "a/c/three", "a/one.txt", "hello.txt"]
        );
        let got = store
            .get(&Key::from("a/b/two.bin"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(got == big, "the object read back differs");
        let r = store
            .get_range(&Key::from("a/b/two.bin"), 3_000_000..5_500_123)
            .await
            .unwrap();
        assert!(
            r == big[3_000_000..5_500_123],
            "the range read back differs"
        );
        store
            .copy(&Key::from("a/b/two.bin"), &Key::from("copies/two.bin"))
            .await
            .unwrap();
        store.delete(&Key::from("a/c/three")).await.unwrap();
        let head = store.head(&Key::from("copies/two.bin")).await.unwrap();
        assert_eq!(head.size, big.len() as u64);
        let e = store.get(&Key::from("a/c/three")).await.unwrap_err();
        assert!(
            matches!(e, object_store::Error::NotFound { .. }),
            "a deleted object: {e}"
        );
    });
    gw.stop();

    // The same files through a mount: what S3 said they hold.
    let m = vol.mount();
    assert!(std::fs::read(m.p("photos/copies/two.bin")).unwrap() == big);
    assert!(std::fs::read(m.p("photos/a/b/two.bin")).unwrap() == big);
    assert_eq!(std::fs::read(m.p("photos/a/one.txt")).unwrap(), small);
    assert_eq!(
        std::fs::read(m.p("photos/hello.txt")).unwrap(),
        b"hello, world"
    );
    // A delete takes the directories it empties; the removed bucket is gone.
    assert!(!m.p("photos/a/c").exists());
    assert!(!m.p("scratch").exists());
    assert_eq!(
        names(&m.p(".unkai-s3/tmp")),
        BTreeSetOf::new(),
        "temporary files left behind"
    );
    m.unmount();
}

type BTreeSetOf = std::collections::BTreeSet<String>;

#[test]
fn multipart_uploads_complete_whole_and_aborted_ones_leave_nothing() {
    let Some(py) = boto3() else { return };
    let vol = Volume::new();
    let gw = Gateway::start(&vol, &[]);
    python(py, &gw, SK, "s3.create_bucket(Bucket='big')\n");
    let store = gw.store("big", SK);
    let parts = [
        pattern(5 << 20, 1),
        pattern(5 << 20, 2),
        pattern(1 << 20, 3),
    ];
    let whole: Vec<u8> = parts.concat();
    rt().block_on(async {
        let mut up = store
            .put_multipart(&Key::from("dir/joined.bin"))
            .await
            .unwrap();
        // Parts sent one after another (object_store numbers them in order).
        for p in &parts {
            up.put_part(PutPayload::from(p.clone())).await.unwrap();
        }
        up.complete().await.unwrap();
        let got = store
            .get(&Key::from("dir/joined.bin"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(got == whole, "the completed upload reads back differently");

        let mut up = store
            .put_multipart(&Key::from("dir/aborted.bin"))
            .await
            .unwrap();
        up.put_part(PutPayload::from(parts[0].clone()))
            .await
            .unwrap();
        up.abort().await.unwrap();
        let e = store.head(&Key::from("dir/aborted.bin")).await.unwrap_err();
        assert!(matches!(e, object_store::Error::NotFound { .. }), "{e}");
    });
    // boto3: the multipart ETag (MD5 of the parts' MD5s, "-3"), and ListParts.
    let out = python(
        py,
        &gw,
        SK,
        "import hashlib\n\
         r = s3.head_object(Bucket='big', Key='dir/joined.bin')\n\
         print(r['ETag'], r['ContentLength'])\n\
         u = s3.create_multipart_upload(Bucket='big', Key='k')['UploadId']\n\
         s3.upload_part(Bucket='big', Key='k', UploadId=u, PartNumber=1, Body=b'x' * 100)\n\
         print([(p['PartNumber'], p['Size']) for p in s3.list_parts(Bucket='big', Key='k', UploadId=u)['Parts']])\n\
         print(code(lambda: s3.list_parts(Bucket='big', Key='other', UploadId=u)))\n\
         s3.abort_multipart_upload(Bucket='big', Key='k', UploadId=u)\n\
         print(code(lambda: s3.list_parts(Bucket='big', Key='k', UploadId=u)))\n",
    );
    let md5 = |b: &[u8]| -> [u8; 16] {
        use md5::Digest;
        md5::Md5::digest(b).into()
    };
    let joined: Vec<u8> = parts.iter().flat_map(|p| md5(p)).collect();
    let hex: String = md5(&joined).iter().map(|b| format!("{b:02x}")).collect();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("\"{hex}-3\" {}", whole.len()), "{out}");
    assert_eq!(lines[1], "[(1, 100)]", "{out}");
    assert_eq!(lines[2], "NoSuchUpload", "{out}");
    assert_eq!(lines[3], "NoSuchUpload", "{out}");
    gw.stop();

    let m = vol.mount();
    assert!(std::fs::read(m.p("big/dir/joined.bin")).unwrap() == whole);
    assert!(!m.p("big/dir/aborted.bin").exists());
    assert!(!m.p("big/k").exists());
    assert!(
        names(&m.p(".unkai-s3/uploads")).is_empty(),
        "uploads left: {:?}",
        names(&m.p(".unkai-s3/uploads"))
    );
    m.unmount();
}

/// The files and directories under `dir` (relative paths), at any depth.
fn tree(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &std::path::Path, d: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if p.is_dir() {
                walk(base, &p, out);
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn bad_requests_get_s3_errors_and_change_nothing() {
    let Some(py) = boto3() else { return };
    let vol = Volume::new();
    // The export is /export; /secret is beside it, out of the gateway's reach.
    let m = vol.mount();
    std::fs::create_dir_all(m.p("export/bkt")).unwrap();
    std::fs::write(m.p("export/bkt/inside.txt"), b"inside").unwrap();
    std::fs::create_dir_all(m.p("secret")).unwrap();
    std::fs::write(m.p("secret/passwd"), b"untouched").unwrap();
    m.unmount();
    let gw = Gateway::start(&vol, &["--subdir", "/export"]);

    // A wrong secret: refused, nothing created.
    let bad = gw.store("bkt", "not-the-secret");
    rt().block_on(async {
        let e = bad
            .put(&Key::from("intruder.txt"), PutPayload::from(vec![1u8; 10]))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SignatureDoesNotMatch") || e.contains("403"),
            "a wrong secret: {e}"
        );
        assert!(bad.get(&Key::from("inside.txt")).await.is_err());
    });
    let out = python(
        py,
        &gw,
        "not-the-secret",
        "print(code(lambda: s3.create_bucket(Bucket='intruders')))\n\
         print(code(lambda: s3.list_buckets()))\n",
    );
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["SignatureDoesNotMatch", "SignatureDoesNotMatch"],
        "{out}"
    );

    // Keys that would climb out of the bucket or the export, and absolute ones.
    let out = python(
        py,
        &gw,
        SK,
        "for k in ['../../secret/passwd', '../bkt/inside.txt', '/secret/passwd', 'a/../../x', 'a//b', './inside.txt']:\n\
         \x20   print(k, code(lambda: s3.put_object(Bucket='bkt', Key=k, Body=b'overwritten')), \
         code(lambda: s3.get_object(Bucket='bkt', Key=k)), code(lambda: s3.delete_object(Bucket='bkt', Key=k)))\n\
         print(code(lambda: s3.copy_object(Bucket='bkt', Key='stolen', CopySource={'Bucket': 'bkt', 'Key': '../../secret/passwd'})))\n\
         print(code(lambda: s3.create_bucket(Bucket='..')))\n\
         print(code(lambda: s3.get_object(Bucket='.unkai-s3', Key='tmp')))\n\
         print(sorted(b['Name'] for b in s3.list_buckets()['Buckets']))\n",
    );
    for l in out.lines().take(6) {
        let codes: Vec<&str> = l.split(' ').skip(1).collect();
        assert!(
            codes.iter().all(|c| *c == "InvalidArgument"),
            "a key out of bounds was not refused: {l}\n{out}"
        );
    }
    let rest: Vec<&str> = out.lines().skip(6).collect();
    assert_ne!(rest[0], "OK", "{out}");
    assert_ne!(rest[1], "OK", "{out}");
    assert_ne!(rest[2], "OK", "{out}");
    assert_eq!(rest[3], "['bkt']", "{out}");

    // Garbage on the socket: an HTTP error or a closed connection; the server lives on.
    let mut s = TcpStream::connect(&gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(b"\x00\x01GARBAGE / NOT-HTTP\r\n\r\n\xff\xfe")
        .unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 4"),
        "garbage got: {reply}"
    );
    // A signed but malformed CompleteMultipartUpload body: MalformedXML, upload intact.
    let out = python(
        py,
        &gw,
        SK,
        "from botocore.auth import S3SigV4Auth\n\
         from botocore.awsrequest import AWSRequest\n\
         from botocore.credentials import Credentials\n\
         import urllib.request, urllib.error\n\
         u = s3.create_multipart_upload(Bucket='bkt', Key='mp')['UploadId']\n\
         s3.upload_part(Bucket='bkt', Key='mp', UploadId=u, PartNumber=1, Body=b'y' * 10)\n\
         url = ENDPOINT + '/bkt/mp?uploadId=' + u\n\
         body = b'<CompleteMultipartUpload><Part><PartNumber>1</Part'\n\
         req = AWSRequest(method='POST', url=url, data=body)\n\
         S3SigV4Auth(Credentials(AK, SK), 's3', 'us-east-1').add_auth(req)\n\
         p = req.prepare()\n\
         r = urllib.request.Request(p.url, data=body, headers=dict(p.headers), method='POST')\n\
         try:\n\
         \x20   urllib.request.urlopen(r)\n\
         \x20   print('OK')\n\
         except urllib.error.HTTPError as e:\n\
         \x20   b = e.read().decode(); print(e.code, 'MalformedXML' in b or b)\n\
         print(code(lambda: s3.head_object(Bucket='bkt', Key='mp')))\n\
         print(len(s3.list_parts(Bucket='bkt', Key='mp', UploadId=u)['Parts']))\n\
         s3.abort_multipart_upload(Bucket='bkt', Key='mp', UploadId=u)\n\
         print(s3.get_object(Bucket='bkt', Key='inside.txt')['Body'].read().decode())\n",
    );
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["400 True", "404", "1", "inside"],
        "{out}"
    );
    gw.stop();

    let m = vol.mount();
    assert_eq!(std::fs::read(m.p("secret/passwd")).unwrap(), b"untouched");
    assert_eq!(
        tree(&m.path)
            .into_iter()
            .filter(|p| !p.starts_with("export/.unkai-s3"))
            .collect::<Vec<_>>(),
        [
            "export",
            "export/bkt",
            "export/bkt/inside.txt",
            "secret",
            "secret/passwd"
        ]
    );
    m.unmount();
}

#[test]
fn a_read_only_gateway_serves_and_refuses_changes() {
    let Some(py) = boto3() else { return };
    let vol = Volume::new();
    let m = vol.mount();
    std::fs::create_dir_all(m.p("docs")).unwrap();
    std::fs::write(m.p("docs/a.txt"), b"kept").unwrap();
    m.unmount();
    let gw = Gateway::start(&vol, &["--read-only"]);
    let out = python(
        py,
        &gw,
        SK,
        "print(s3.get_object(Bucket='docs', Key='a.txt')['Body'].read().decode())\n\
         print(code(lambda: s3.put_object(Bucket='docs', Key='b.txt', Body=b'new')))\n\
         print(code(lambda: s3.delete_object(Bucket='docs', Key='a.txt')))\n\
         print(code(lambda: s3.create_bucket(Bucket='more')))\n\
         print(code(lambda: s3.create_multipart_upload(Bucket='docs', Key='c')))\n",
    );
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "kept",
            "AccessDenied",
            "AccessDenied",
            "AccessDenied",
            "AccessDenied"
        ],
        "{out}"
    );
    gw.stop();
    let m = vol.mount();
    assert_eq!(tree(&m.path), ["docs", "docs/a.txt"]);
    m.unmount();
}

#[test]
fn refuses_to_start_without_keys_unless_told() {
    let vol = Volume::new();
    let out = unkai()
        .args(["gateway", "--listen", "127.0.0.1:0", &vol.meta_url])
        .envs(vol.env.iter().cloned())
        .env_remove("UNKAI_GATEWAY_ACCESS_KEY")
        .env_remove("UNKAI_GATEWAY_SECRET_KEY")
        .env_remove("MINIO_ROOT_USER")
        .env_remove("MINIO_ROOT_PASSWORD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("UNKAI_GATEWAY_ACCESS_KEY") && err.contains("--no-auth"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

/// An infected object put through the gateway is scanned as a file written through a mount
/// is: moved to /.quarantine, refused to every open; a clean one is served.
#[test]
fn objects_put_are_scanned_and_infected_ones_quarantined() {
    if !common::clamd::available() {
        return;
    }
    let av = common::clamd::Clamd::start();
    let vol = Volume::new();
    let m = vol.mount();
    std::fs::create_dir(m.p("inbox")).unwrap();
    m.unmount();
    let gw = Gateway::start(&vol, &["--scan", &av.url()]);
    let s3 = gw.store("inbox", SK);
    let rt = rt();
    let clean = pattern(2 << 20, 3);
    rt.block_on(async {
        s3.put(&Key::from("ok.bin"), PutPayload::from(clean.clone()))
            .await
            .unwrap();
        s3.put(
            &Key::from("docs/x.txt"),
            PutPayload::from(common::clamd::EICAR.to_vec()),
        )
        .await
        .unwrap();
    });
    let gone = eventually(Duration::from_secs(120), || {
        rt.block_on(s3.get(&Key::from("docs/x.txt")))
            .is_err_and(|e| matches!(e, object_store::Error::NotFound { .. }))
    });
    let log = std::fs::read_to_string(&gw.log).unwrap_or_default();
    assert!(
        gone,
        "the infected object is still served; log:\n{}",
        tail(&log, 30)
    );
    assert!(log.contains(common::clamd::SIGNATURE), "{}", tail(&log, 30));
    let got = rt.block_on(async {
        s3.get(&Key::from("ok.bin"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
    });
    assert_eq!(&got[..], &clean[..]);
    gw.stop();
    let m = vol.mount();
    let q: Vec<String> = names(&m.p(".quarantine")).into_iter().collect();
    assert!(
        q.len() == 1 && q[0].ends_with("x.txt"),
        "quarantine holds {q:?}"
    );
    let e = std::fs::File::open(m.p(".quarantine").join(&q[0])).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    m.unmount();
}

/// Content-Type, the other headers S3 stores (Cache-Control, Content-Disposition,
/// Content-Encoding, Content-Language) and `x-amz-meta-*` metadata are kept with an object
/// (the `user.s3.meta` xattr of its file) and returned by HeadObject and GetObject, to boto3
/// and to object_store's attributes: set by PutObject, by CreateMultipartUpload until the
/// upload completes, and by CopyObject (COPY keeps the source's, REPLACE takes the
/// request's, a copy onto itself needs REPLACE). Metadata over S3's 2 KB is refused with
/// MetadataTooLarge and stores nothing. A file written through a mount heads with S3's
/// default type; one given the xattr by hand is served with it.
#[test]
fn content_type_and_user_metadata_are_kept_and_returned() {
    let Some(py) = boto3() else { return };
    let vol = Volume::new();
    let m = vol.mount();
    std::fs::create_dir_all(m.p("web")).unwrap();
    std::fs::write(m.p("web/fuse.txt"), b"written through FUSE").unwrap();
    std::fs::write(m.p("web/style.css"), b"h1 { color: red }").unwrap();
    common::xattr::setxattr(
        &m.p("web/style.css"),
        "user.s3.meta",
        br#"{"content-type":"text/css","meta":{"origin":"mount"}}"#,
        0,
    )
    .unwrap();
    m.unmount();
    let gw = Gateway::start(&vol, &[]);
    let out = python(
        py,
        &gw,
        SK,
        "def show(r):\n\
         \x20   return json.dumps([r['ContentType'], r['Metadata'], r.get('CacheControl'), r.get('ContentDisposition'), r.get('ContentEncoding'), r.get('ContentLanguage')], sort_keys=True)\n\
         page = {'Bucket': 'web', 'Key': 'page.html'}\n\
         s3.put_object(Body=b'<h1>hi</h1>', ContentType='text/html; charset=utf-8', Metadata={'author': 'Ana', 'Build-Id': '42'}, CacheControl='max-age=60', ContentDisposition='inline', ContentEncoding='identity', ContentLanguage='de', **page)\n\
         print(show(s3.head_object(**page)))\n\
         g = s3.get_object(**page)\n\
         print(show(g), g['Body'].read().decode())\n\
         g = s3.get_object(ResponseContentType='text/plain', ResponseContentDisposition='attachment; filename=\"p.html\"', **page)\n\
         print(show(g))\n\
         s3.put_object(Bucket='web', Key='raw', Body=b'x')\n\
         print(show(s3.head_object(Bucket='web', Key='raw')))\n\
         print(show(s3.head_object(Bucket='web', Key='fuse.txt')))\n\
         print(show(s3.get_object(Bucket='web', Key='style.css')))\n\
         s3.copy_object(Bucket='web', Key='copy.html', CopySource=page, Metadata={'ignored': 'yes'}, ContentType='text/plain')\n\
         print(show(s3.head_object(Bucket='web', Key='copy.html')))\n\
         s3.copy_object(Bucket='web', Key='replaced.html', CopySource=page, MetadataDirective='REPLACE', ContentType='text/plain', Metadata={'new': 'one'})\n\
         print(show(s3.head_object(Bucket='web', Key='replaced.html')))\n\
         s3.copy_object(Bucket='web', Key='bare', CopySource=page, MetadataDirective='REPLACE')\n\
         print(show(s3.head_object(Bucket='web', Key='bare')))\n\
         print(code(lambda: s3.copy_object(CopySource=page, **page)))\n\
         s3.copy_object(CopySource=page, MetadataDirective='REPLACE', ContentType='text/markdown', Metadata={'v': '2'}, **page)\n\
         g = s3.get_object(**page)\n\
         print(show(g), g['Body'].read().decode())\n\
         print(code(lambda: s3.put_object(Bucket='web', Key='full', Body=b'x', Metadata={'k': 'v' * 2047})))\n\
         print(len(s3.head_object(Bucket='web', Key='full')['Metadata']['k']))\n\
         print(code(lambda: s3.put_object(Bucket='web', Key='over', Body=b'x', Metadata={'k': 'v' * 1000, 'l': 'w' * 1047})))\n\
         print(code(lambda: s3.head_object(Bucket='web', Key='over')))\n\
         print(code(lambda: s3.create_multipart_upload(Bucket='web', Key='over', Metadata={'k': 'v' * 3000})))\n\
         print(code(lambda: s3.copy_object(Bucket='web', Key='over', CopySource=page, MetadataDirective='REPLACE', Metadata={'k': 'v' * 3000})))\n\
         print(code(lambda: s3.head_object(Bucket='web', Key='over')))\n\
         mp = {'Bucket': 'web', 'Key': 'archive.tar'}\n\
         u = s3.create_multipart_upload(ContentType='application/x-tar', Metadata={'parts': '2'}, **mp)['UploadId']\n\
         e1 = s3.upload_part(UploadId=u, PartNumber=1, Body=b'a' * (5 << 20), **mp)['ETag']\n\
         e2 = s3.upload_part(UploadId=u, PartNumber=2, Body=b'b' * 10, **mp)['ETag']\n\
         s3.complete_multipart_upload(UploadId=u, MultipartUpload={'Parts': [{'PartNumber': 1, 'ETag': e1}, {'PartNumber': 2, 'ETag': e2}]}, **mp)\n\
         h = s3.head_object(**mp)\n\
         print(show(h), h['ContentLength'])\n",
    );
    let lines: Vec<&str> = out.lines().collect();
    let page = r#"["text/html; charset=utf-8", {"author": "Ana", "build-id": "42"}, "max-age=60", "inline", "identity", "de"]"#;
    let want = [
        page.to_string(),
        format!("{page} <h1>hi</h1>"),
        r#"["text/plain", {"author": "Ana", "build-id": "42"}, "max-age=60", "attachment; filename=\"p.html\"", "identity", "de"]"#.into(),
        r#"["binary/octet-stream", {}, null, null, null, null]"#.into(),
        r#"["binary/octet-stream", {}, null, null, null, null]"#.into(),
        r#"["text/css", {"origin": "mount"}, null, null, null, null]"#.into(),
        page.to_string(),
        r#"["text/plain", {"new": "one"}, null, null, null, null]"#.into(),
        r#"["binary/octet-stream", {}, null, null, null, null]"#.into(),
        "InvalidRequest".into(),
        r#"["text/markdown", {"v": "2"}, null, null, null, null] <h1>hi</h1>"#.into(),
        "OK".into(),
        "2047".into(),
        "MetadataTooLarge".into(),
        "404".into(),
        "MetadataTooLarge".into(),
        "MetadataTooLarge".into(),
        "404".into(),
        format!(
            r#"["application/x-tar", {{"parts": "2"}}, null, null, null, null] {}"#,
            (5 << 20) + 10
        ),
    ];
    assert_eq!(lines, want, "{out}");

    // object_store: attributes on a put and a multipart upload come back on a get, and a
    // copy keeps them.
    use object_store::{Attribute, Attributes, PutMultipartOptions, PutOptions};
    let attrs = Attributes::from_iter([
        (Attribute::ContentType, "image/png"),
        (Attribute::CacheControl, "no-cache"),
        (Attribute::ContentDisposition, "attachment"),
        (Attribute::Metadata("camera".into()), "x100"),
    ]);
    let store = gw.store("web", SK);
    rt().block_on(async {
        let shown = |a: &Attributes| {
            let mut v: Vec<(String, String)> = a
                .iter()
                .map(|(k, v)| (format!("{k:?}"), v.as_ref().to_string()))
                .collect();
            v.sort();
            v
        };
        store
            .put_opts(
                &Key::from("img/a.png"),
                PutPayload::from(vec![7u8; 100]),
                PutOptions {
                    attributes: attrs.clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut up = store
            .put_multipart_opts(
                &Key::from("img/b.png"),
                PutMultipartOptions {
                    attributes: attrs.clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        up.put_part(PutPayload::from(vec![8u8; 1000]))
            .await
            .unwrap();
        up.complete().await.unwrap();
        store
            .copy(&Key::from("img/a.png"), &Key::from("img/c.png"))
            .await
            .unwrap();
        for k in ["img/a.png", "img/b.png", "img/c.png"] {
            let got = store.get(&Key::from(k)).await.unwrap();
            assert_eq!(shown(&got.attributes), shown(&attrs), "{k}");
        }
        // Without attributes: S3's default type, nothing else.
        store
            .put(&Key::from("img/plain"), PutPayload::from(vec![1u8; 3]))
            .await
            .unwrap();
        let got = store.get(&Key::from("img/plain")).await.unwrap();
        assert_eq!(
            shown(&got.attributes),
            [("ContentType".to_string(), "binary/octet-stream".to_string())]
        );
    });
    gw.stop();

    // Through the mount: the metadata is the file's xattr; the gateway's state is gone.
    let m = vol.mount();
    let x = common::xattr::getxattr(&m.p("web/archive.tar"), "user.s3.meta").unwrap();
    let x = String::from_utf8(x).unwrap();
    assert!(
        x.contains("application/x-tar") && x.contains("\"parts\":\"2\""),
        "{x}"
    );
    assert!(common::xattr::getxattr(&m.p("web/fuse.txt"), "user.s3.meta").is_err());
    assert!(!m.p("web/over").exists());
    assert!(
        names(&m.p(".unkai-s3/uploads")).is_empty(),
        "uploads left: {:?}",
        names(&m.p(".unkai-s3/uploads"))
    );
    m.unmount();
}
