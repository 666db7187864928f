//! `unkai csi`, the Kubernetes CSI driver, on a real volume over its Unix socket: the
//! kubernetes-csi sanity suite (csi-sanity, built by scripts/test.sh with `go install`)
//! passes; a published volume is a real FUSE mount whose files a second mount of the volume
//! sees, that outlives a restart of the driver, and that unpublishing unmounts; the quota is
//! the capacity (NodeGetVolumeStats, ControllerExpandVolume); the secrets never reach the
//! driver's log; the socket is its owner's only.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use unkai::csi::proto;

/// A secret of the StorageClass that must never be logged (given to mounts as environment).
const SECRET_VALUE: &str = "not-for-logs-5f3a9c";

/// A running `unkai csi`, stopped on drop; every target path it was given is unmounted then.
struct Driver {
    child: Option<Child>,
    sock: PathBuf,
    dir: PathBuf,
    log: PathBuf,
}

impl Driver {
    fn start(dir: &Path, extra: &[&str]) -> Driver {
        let sock = dir.join("csi.sock");
        let log = dir.join("csi.log");
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = unkai()
            .args(["csi", "--endpoint"])
            .arg(format!("unix://{}", sock.display()))
            .args(["--node-id", "test-node", "--state-dir"])
            .arg(dir.join("state"))
            .args(["--log-level", "debug"])
            .args(extra)
            .env_remove("UNKAI_META_URL")
            .env("UNKAI_CACHE_DIR", dir.join("cache"))
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("spawn unkai csi");
        let mut d = Driver {
            child: Some(child),
            sock,
            dir: dir.to_path_buf(),
            log,
        };
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&d.sock).is_err() {
            if let Ok(Some(st)) = d.child.as_mut().unwrap().try_wait() {
                panic!("unkai csi exited ({st}):\n{}", d.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "unkai csi did not listen in 30 s:\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the driver (as a crash or an upgrade would), leaving its mounts.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.kill();
        // Whatever is still mounted below the test's directory (a failed test's targets).
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = self.dir.to_string_lossy().to_string();
        for mp in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if mp.starts_with(&prefix) {
                let _ = run(&["umount", mp]);
                let _ = nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        // The logs of the mounts it started (/var/log/unkai/NAME@MOUNTPOINT.log, the
        // mountpoint's '/' as '-'): the test's own directory is in their names.
        let ours = self
            .dir
            .to_string_lossy()
            .trim_start_matches('/')
            .replace('/', "-");
        if let Ok(logs) = std::fs::read_dir("/var/log/unkai") {
            for f in logs.flatten() {
                if f.file_name().to_string_lossy().contains(&ours) {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
    }
}

fn mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()) && l.contains(" - fuse"))
}

/// The secrets a StorageClass's Secret would give: the META-URL and a credential.
fn secrets(vol: &Volume) -> std::collections::HashMap<String, String> {
    [
        ("metaurl".to_string(), vol.meta_url.clone()),
        (
            "UNKAI_TEST_CREDENTIAL".to_string(),
            SECRET_VALUE.to_string(),
        ),
    ]
    .into()
}

fn assert_no_secrets(log: &str, vol: &Volume) {
    assert!(!log.contains(SECRET_VALUE), "a secret in the log:\n{log}");
    assert!(
        !log.contains(&vol.meta_url),
        "the META-URL in the log:\n{log}"
    );
}

/// csi-sanity: the tools dir of scripts/test.sh, or the PATH. None: skip (unless required).
fn csi_sanity() -> Option<PathBuf> {
    let tools = match std::env::var_os("UNKAI_TOOLS") {
        Some(d) => PathBuf::from(d),
        None => dirs::home_dir().unwrap().join(".cache/unkai-tools"),
    };
    let there = tools.join("bin/csi-sanity");
    if there.is_file() {
        return Some(there);
    }
    if fronts::have("csi-sanity") {
        return Some(PathBuf::from("csi-sanity"));
    }
    None
}

#[test]
fn csi_sanity_passes_on_a_real_volume() {
    let Some(sanity) = csi_sanity() else { return };
    let vol = Volume::new();
    let dir = tempfile::Builder::new()
        .prefix("unkai-csi-")
        .tempdir()
        .unwrap();
    let dir = std::fs::canonicalize(dir.path()).map(|p| (dir, p)).unwrap();
    let (_keep, dir) = dir;
    // The mounts run through a prefix command, as the DaemonSet's enter the host.
    let driver = Driver::start(&dir, &["--mount-prefix", "env --"]);
    let s = secrets(&vol);
    let one = format!(
        "{{metaurl: \"{}\", UNKAI_TEST_CREDENTIAL: \"{}\"}}",
        s["metaurl"], SECRET_VALUE
    );
    let yaml: String = [
        "CreateVolumeSecret",
        "DeleteVolumeSecret",
        "NodePublishVolumeSecret",
        "ControllerExpandVolumeSecret",
        "ControllerValidateVolumeCapabilitiesSecret",
    ]
    .iter()
    .map(|k| format!("{k}: {one}\n"))
    .collect();
    std::fs::write(dir.join("secrets.yaml"), yaml).unwrap();
    let out = std::process::Command::new(&sanity)
        .arg("--csi.endpoint")
        .arg(&driver.sock)
        .arg("--csi.mountdir")
        .arg(dir.join("mnt"))
        .arg("--csi.stagingdir")
        .arg(dir.join("stage"))
        .arg("--csi.secrets")
        .arg(dir.join("secrets.yaml"))
        .args(["--csi.testvolumesize", "1073741824", "--ginkgo.no-color"])
        .args(["--ginkgo.timeout", "10m"])
        .output()
        .expect("run csi-sanity");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "csi-sanity failed:\n{}\nthe driver's log:\n{}",
        tail(&text, 200),
        tail(&driver.log_text(), 100)
    );
    // It did publish: volumes were mounted and unmounted, and the suite ran its specs.
    let log = driver.log_text();
    assert!(log.contains("NodePublishVolume"), "no publish in:\n{log}");
    assert!(text.contains("0 Failed"), "{}", tail(&text, 20));
    let passed: u32 = text
        .split(" Passed")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        passed >= 30,
        "only {passed} specs passed:\n{}",
        tail(&text, 20)
    );
    assert_no_secrets(&log, &vol);
    eprintln!("csi-sanity: {}", tail(&text, 2).trim());
}

/// A gRPC client of the driver's socket.
struct Client {
    rt: tokio::runtime::Runtime,
    channel: tonic::transport::Channel,
}

impl Client {
    fn connect(sock: &Path) -> Client {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let path = sock.to_path_buf();
        let channel = rt
            .block_on(
                tonic::transport::Endpoint::try_from("http://[::]:50051")
                    .unwrap()
                    .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    })),
            )
            .expect("connect to the driver");
        Client { rt, channel }
    }

    fn controller(&self) -> proto::controller_client::ControllerClient<tonic::transport::Channel> {
        proto::controller_client::ControllerClient::new(self.channel.clone())
    }

    fn node(&self) -> proto::node_client::NodeClient<tonic::transport::Channel> {
        proto::node_client::NodeClient::new(self.channel.clone())
    }
}

fn fs_capability(mode: proto::volume_capability::access_mode::Mode) -> proto::VolumeCapability {
    proto::VolumeCapability {
        access_mode: Some(proto::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(proto::volume_capability::AccessType::Mount(
            proto::volume_capability::MountVolume {
                mount_flags: vec!["noatime".into()],
                ..Default::default()
            },
        )),
    }
}

fn bytes_total(c: &Client, id: &str, path: &Path) -> i64 {
    let stats =
        c.rt.block_on(
            c.node()
                .node_get_volume_stats(proto::NodeGetVolumeStatsRequest {
                    volume_id: id.into(),
                    volume_path: path.to_string_lossy().into(),
                    ..Default::default()
                }),
        )
        .expect("NodeGetVolumeStats")
        .into_inner();
    stats
        .usage
        .iter()
        .find(|u| u.unit == proto::volume_usage::Unit::Bytes as i32)
        .expect("bytes usage")
        .total
}

#[test]
fn a_published_volume_is_a_mount_seen_by_other_mounts_and_unpublish_unmounts_it() {
    use proto::volume_capability::access_mode::Mode;
    const MIB: i64 = 1 << 20;
    let vol = Volume::new();
    let tmp = tempfile::Builder::new()
        .prefix("unkai-csi-")
        .tempdir()
        .unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let mut driver = Driver::start(&dir, &[]);

    // The socket is the driver's owner's only: another user cannot even connect.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&driver.sock)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let sock = driver.sock.clone();
    let other = as_user(65534, 65534, || {
        std::os::unix::net::UnixStream::connect(&sock)
            .map(drop)
            .map_err(|e| errno(&e))
    });
    assert_eq!(other, Err(libc::EACCES), "nobody connected to the socket");

    let c = Client::connect(&driver.sock);
    let cap = fs_capability(Mode::MultiNodeMultiWriter);
    let id = "pvc-0f2e";
    let created =
        c.rt.block_on(c.controller().create_volume(proto::CreateVolumeRequest {
            name: id.into(),
            capacity_range: Some(proto::CapacityRange {
                required_bytes: 64 * MIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            parameters: [("onDelete".to_string(), "remove".to_string())].into(),
            secrets: secrets(&vol),
            ..Default::default()
        }))
        .expect("CreateVolume")
        .into_inner();
    let v = created.volume.unwrap();
    assert_eq!((v.volume_id.as_str(), v.capacity_bytes), (id, 64 * MIB));

    let target = dir.join("pods/a/volumes/target");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let publish = |target: &Path, readonly: bool| proto::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(cap.clone()),
        readonly,
        secrets: secrets(&vol),
        ..Default::default()
    };
    c.rt.block_on(c.node().node_publish_volume(publish(&target, false)))
        .expect("NodePublishVolume");
    assert!(mounted(&target), "{} is not a FUSE mount", target.display());

    // A file written through the published volume is seen by a second mount of the volume,
    // in the volume's directory /csi/ID.
    std::fs::write(target.join("hello.txt"), b"from the pod").unwrap();
    let whole = vol.mount();
    let seen = whole.p("csi").join(id).join("hello.txt");
    assert!(
        eventually(Duration::from_secs(30), || std::fs::read(&seen)
            .ok()
            .as_deref()
            == Some(&b"from the pod"[..])),
        "the second mount does not see the file"
    );
    // And the other way round.
    std::fs::write(whole.p("csi").join(id).join("back.txt"), b"from outside").unwrap();
    assert!(eventually(Duration::from_secs(30), || std::fs::read(
        target.join("back.txt")
    )
    .ok()
    .as_deref()
        == Some(&b"from outside"[..])));

    // The capacity is the quota, as the pod's statfs and NodeGetVolumeStats see it.
    assert_eq!(bytes_total(&c, id, &target), 64 * MIB);
    let grown =
        c.rt.block_on(c.controller().controller_expand_volume(
            proto::ControllerExpandVolumeRequest {
                volume_id: id.into(),
                capacity_range: Some(proto::CapacityRange {
                    required_bytes: 128 * MIB,
                    limit_bytes: 0,
                }),
                secrets: secrets(&vol),
                ..Default::default()
            },
        ))
        .expect("ControllerExpandVolume")
        .into_inner();
    assert_eq!(grown.capacity_bytes, 128 * MIB);
    assert!(
        eventually(Duration::from_secs(30), || bytes_total(&c, id, &target)
            == 128 * MIB),
        "the mount does not show the expanded quota: {}",
        bytes_total(&c, id, &target)
    );

    // Read-only when asked: a second target of the same volume refuses writes.
    let ro = dir.join("pods/b/volumes/target");
    std::fs::create_dir_all(ro.parent().unwrap()).unwrap();
    c.rt.block_on(c.node().node_publish_volume(publish(&ro, true)))
        .expect("NodePublishVolume read-only");
    assert_eq!(
        std::fs::read(ro.join("hello.txt")).unwrap(),
        b"from the pod"
    );
    let err = std::fs::write(ro.join("no.txt"), b"x").unwrap_err();
    assert_eq!(errno(&err), libc::EROFS);

    // The mounts outlive the driver: killed and started again, the pod's files still work
    // and the new driver unpublishes what the old one published.
    drop(c);
    driver.kill();
    std::fs::write(target.join("during.txt"), b"no driver").unwrap();
    assert_eq!(
        std::fs::read(target.join("hello.txt")).unwrap(),
        b"from the pod"
    );
    let first_log = driver.log_text();
    driver = Driver::start(&dir, &[]);
    let c = Client::connect(&driver.sock);
    // Publishing again at the same target is answered as done (the CO retries).
    c.rt.block_on(c.node().node_publish_volume(publish(&target, false)))
        .expect("NodePublishVolume again");
    for t in [&target, &ro] {
        c.rt.block_on(
            c.node()
                .node_unpublish_volume(proto::NodeUnpublishVolumeRequest {
                    volume_id: id.into(),
                    target_path: t.to_string_lossy().into(),
                }),
        )
        .expect("NodeUnpublishVolume");
        assert!(!mounted(t), "{} is still mounted", t.display());
        assert!(!t.exists(), "{} was not removed", t.display());
    }
    assert_eq!(
        std::fs::read(whole.p("csi").join(id).join("during.txt")).unwrap(),
        b"no driver"
    );

    // DeleteVolume (onDelete: remove) takes the directory away for good.
    c.rt.block_on(c.controller().delete_volume(proto::DeleteVolumeRequest {
        volume_id: id.into(),
        secrets: secrets(&vol),
    }))
    .expect("DeleteVolume");
    assert!(
        eventually(Duration::from_secs(30), || !whole
            .p("csi")
            .join(id)
            .exists()),
        "the volume's directory is still there"
    );
    whole.unmount();
    let log = first_log + &driver.log_text();
    assert_no_secrets(&log, &vol);
    assert!(log.contains("NodePublishVolume pvc-0f2e"), "{log}");
}
