//! Real storage servers for the tests, each on a free port of 127.0.0.1 in its own temporary
//! directory, killed on drop: versitygw (S3), fake-gcs-server (GCS), Azurite (Azure Blob).
//!
//! The binaries come from `scripts/servers.sh install` (run by `scripts/test.sh`), in
//! `$UNKAI_TOOLS` (default `~/.cache/unkai-tools`).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn tools_dir() -> PathBuf {
    match std::env::var_os("UNKAI_TOOLS") {
        Some(d) => PathBuf::from(d),
        None => dirs::home_dir().unwrap().join(".cache/unkai-tools"),
    }
}

fn tool(rel: &str) -> PathBuf {
    let p = tools_dir().join(rel);
    assert!(
        p.exists(),
        "{} is missing: install the test servers with `scripts/servers.sh install`",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running server; killed on drop.
pub struct Server {
    child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// Environment a client needs (credentials, endpoint).
    pub env: Vec<(String, String)>,
    /// The storage URL of a bucket (or container) on it, for `unkai format --storage`.
    pub storage: String,
}

impl Server {
    fn start(mut cmd: Command, dir: tempfile::TempDir, port: u16) -> (Child, tempfile::TempDir) {
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start server");
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "server exited ({st}): {}",
                    std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        (child, dir)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// versitygw with its posix backend. The bucket is created by `unkai format`.
pub fn s3(bucket: &str) -> Server {
    let dir = tempfile::Builder::new()
        .prefix("unkai-s3-")
        .tempdir()
        .unwrap();
    std::fs::create_dir(dir.path().join("root")).unwrap();
    let port = free_port();
    let mut cmd = Command::new(tool("bin/versitygw"));
    cmd.env("ROOT_ACCESS_KEY_ID", "unkaitest")
        .env("ROOT_SECRET_ACCESS_KEY", "unkaitestsecret")
        .arg("--port")
        .arg(format!("127.0.0.1:{port}"))
        .arg("posix")
        .arg(dir.path().join("root"));
    let (child, dir) = Server::start(cmd, dir, port);
    let env = vec![
        ("AWS_ACCESS_KEY_ID".into(), "unkaitest".into()),
        ("AWS_SECRET_ACCESS_KEY".into(), "unkaitestsecret".into()),
        (
            "AWS_ENDPOINT_URL".into(),
            format!("http://127.0.0.1:{port}"),
        ),
        ("AWS_REGION".into(), "us-east-1".into()),
    ];
    Server {
        child,
        dir,
        port,
        env,
        storage: format!("s3://{bucket}/vols"),
    }
}

/// fake-gcs-server in memory. The bucket is created by `unkai format`.
pub fn gcs(bucket: &str) -> Server {
    let dir = tempfile::Builder::new()
        .prefix("unkai-gcs-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let mut cmd = Command::new(tool("bin/fake-gcs-server"));
    cmd.args([
        "-host",
        "127.0.0.1",
        "-port",
        &port.to_string(),
        "-scheme",
        "http",
        "-backend",
        "memory",
    ])
    .args([
        "-public-host",
        &format!("127.0.0.1:{port}"),
        "-log-level",
        "error",
    ]);
    let (child, dir) = Server::start(cmd, dir, port);
    let sa = dir.path().join("service-account.json");
    std::fs::write(
        &sa,
        format!(
            r#"{{"gcs_base_url": "http://127.0.0.1:{port}", "disable_oauth": true,
                "client_email": "", "private_key": "", "private_key_id": ""}}"#
        ),
    )
    .unwrap();
    let env = vec![("GOOGLE_SERVICE_ACCOUNT".into(), sa.display().to_string())];
    Server {
        child,
        dir,
        port,
        env,
        storage: format!("gs://{bucket}/vols"),
    }
}

/// Azurite (blob service), with a container created through Azure's own SDK.
pub fn azure(container: &str) -> Server {
    let dir = tempfile::Builder::new()
        .prefix("unkai-az-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let mut cmd = Command::new(tool("node_modules/.bin/azurite-blob"));
    cmd.args([
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        &port.to_string(),
        "--location",
    ])
    .arg(dir.path())
    .args(["--disableTelemetry", "--skipApiVersionCheck", "--silent"]);
    let (child, dir) = Server::start(cmd, dir, port);
    let url = format!("http://127.0.0.1:{port}/devstoreaccount1");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/azure-mkcontainer.js");
    let out = Command::new("node")
        .arg(&script)
        .arg(container)
        .env("NODE_PATH", tools_dir().join("node_modules"))
        .env("AZURITE_BLOB_STORAGE_URL", &url)
        .output()
        .expect("run node");
    assert!(
        out.status.success(),
        "creating the container: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // object_store appends the account itself.
    let env = vec![(
        "AZURITE_BLOB_STORAGE_URL".into(),
        format!("http://127.0.0.1:{port}"),
    )];
    Server {
        child,
        dir,
        port,
        env,
        storage: format!("az://{container}/vols?emulator=true"),
    }
}
