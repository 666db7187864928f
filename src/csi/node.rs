//! The CSI Node service: NodePublishVolume mounts a volume's directory (`unkai mount -d
//! --subdir /csi/ID`) at the pod's target path, NodeUnpublishVolume unmounts it (`unkai
//! umount`), NodeGetVolumeStats reports what the mount's statfs says (a subdir mount with a
//! quota shows the quota).
//!
//! Each mount is a process of its own, detached from the plugin (its own session, as every
//! `mount -d`): the plugin can stop, crash or be upgraded while pods use their volumes, and a
//! new plugin finds the mounts again (the kernel's mount table, and a state file per target
//! path saying which volume is there). The META-URL reaches the mount in its environment,
//! never on its command line (which every user can read).
//!
//! Not for: volumes (`csi::controller`), the mount itself (`cli::mount`, `fuse`).

use std::path::{Path, PathBuf};
use std::process::Command;

use tonic::{Request, Response, Status};

use super::proto::{self, node_server::Node};
use super::{Secrets, blocking, check_name, request_path, volume_dir};
use crate::fuse::mounts;

pub struct NodeService {
    node_id: String,
    state_dir: PathBuf,
    exe: Exe,
}

/// How the node service runs `unkai mount` and `unkai umount`: `prefix` words first (e.g.
/// `nsenter --target 1 --mount -- systemd-run --scope --collect --quiet`, so that a mount
/// runs in a scope of the host's, outside the plugin container's cgroup), then the binary.
#[derive(Clone)]
pub struct Exe {
    pub prefix: Vec<String>,
    pub unkai: PathBuf,
}

impl NodeService {
    pub fn new(node_id: String, state_dir: PathBuf, exe: Exe) -> NodeService {
        NodeService {
            node_id,
            state_dir,
            exe,
        }
    }
}

/// The state file of a target path: which volume is published there.
fn state_file(state_dir: &Path, target: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    state_dir.join(format!(
        "{}.volume",
        hex::encode(target.as_os_str().as_bytes())
    ))
}

/// The volume published at `target` by a plugin of this node, if `target` is mounted.
fn published(state_dir: &Path, target: &Path) -> Option<String> {
    let m = mounts::find(target).filter(mounts::is_unkai)?;
    if m.mountpoint != target {
        return None;
    }
    std::fs::read_to_string(state_file(state_dir, target))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The mount options of a capability, checked: `unkai mount -o` takes each (mount(8)'s and
/// unkai's own NAME=VALUE), but never one that would mount another directory or volume.
fn mount_flags(flags: &[String]) -> Result<Vec<String>, Status> {
    let mut out = Vec::new();
    for f in flags.iter().flat_map(|f| f.split(',')) {
        let f = f.trim();
        if f.is_empty() {
            continue;
        }
        let name = f.split('=').next().unwrap_or("").replace('_', "-");
        if matches!(name.as_str(), "subdir" | "background" | "log" | "remount") {
            return Err(Status::invalid_argument(format!(
                "mount option '{f}' is not allowed in a volume's mountOptions: the driver sets it"
            )));
        }
        out.push(f.to_string());
    }
    Ok(out)
}

/// Runs `unkai ARGS` with the secrets' environment; its error output, scrubbed, on failure.
fn run(exe: &Exe, args: &[String], secrets: Option<&Secrets>) -> Result<(), String> {
    let mut words = exe.prefix.iter().map(std::ffi::OsStr::new);
    let mut cmd = match words.next() {
        Some(first) => {
            let mut c = Command::new(first);
            c.args(words).arg(&exe.unkai);
            c
        }
        None => Command::new(&exe.unkai),
    };
    cmd.args(args).stdin(std::process::Stdio::null());
    if let Some(s) = secrets {
        cmd.env(
            crate::cli::META_URL_ENV,
            s.meta_url().map_err(|e| e.message().to_string())?,
        );
        for (k, v) in s.env() {
            cmd.env(k, v);
        }
    }
    let out = cmd
        .output()
        .map_err(|e| format!("running {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let err = err.trim();
    Err(match secrets {
        Some(s) => s.scrub(err),
        None => err.to_string(),
    })
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        req: Request<proto::NodePublishVolumeRequest>,
    ) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
        use proto::volume_capability::{AccessType, access_mode::Mode};
        let r = req.into_inner();
        let secrets = Secrets::new(r.secrets);
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        let target = request_path(&r.target_path, "target path")
            .map_err(|e| Status::invalid_argument(e.message()))?;
        let Some(cap) = r.volume_capability else {
            return Err(Status::invalid_argument("the volume capability is missing"));
        };
        let flags = match &cap.access_type {
            Some(AccessType::Mount(m)) => mount_flags(&m.mount_flags)?,
            _ => {
                return Err(Status::invalid_argument(
                    "unkai volumes are file systems: use volumeMode Filesystem, not Block",
                ));
            }
        };
        let mode = cap
            .access_mode
            .as_ref()
            .map(|m| m.mode())
            .unwrap_or(Mode::Unknown);
        let read_only =
            r.readonly || matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly);
        check_name(&r.volume_id, "volume id")
            .map_err(|_| Status::not_found(format!("no volume {}", r.volume_id)))?;
        let dir = volume_dir(&r.volume_id)?;
        let (state_dir, exe, id) = (
            self.state_dir.clone(),
            self.exe.clone(),
            r.volume_id.clone(),
        );
        blocking(move || {
            if let Some(there) = published(&state_dir, &target) {
                return if there == id {
                    Ok(())
                } else {
                    Err(Status::already_exists(format!(
                        "{} holds volume {there} already",
                        target.display()
                    )))
                };
            }
            // The volume's directory must exist (else NOT_FOUND, not a failed mount).
            {
                let url = secrets.meta_url()?;
                let meta = crate::volume::open_meta(&url).map_err(|e| {
                    Status::unavailable(format!(
                        "cannot open the volume: {}",
                        secrets.scrub(&format!("{e:#}"))
                    ))
                })?;
                if crate::volume::subdir_ino(&*meta, &dir).is_err() {
                    return Err(Status::not_found(format!("no volume {id}")));
                }
            }
            std::fs::create_dir_all(&target).map_err(|e| {
                Status::internal(format!("making the target path {}: {e}", target.display()))
            })?;
            std::fs::write(state_file(&state_dir, &target), &id)
                .map_err(|e| Status::internal(format!("recording the mount: {e}")))?;
            let mut args = vec!["mount".to_string(), "-d".into(), "--subdir".into(), dir];
            if read_only {
                args.push("--read-only".into());
            }
            for f in flags {
                args.extend(["-o".to_string(), f]);
            }
            args.push(target.to_string_lossy().into_owned());
            if let Err(e) = run(&exe, &args, Some(&secrets)) {
                let _ = std::fs::remove_file(state_file(&state_dir, &target));
                tracing::warn!("NodePublishVolume {id} at {}: {e}", target.display());
                return Err(Status::internal(format!("mounting volume {id}: {e}")));
            }
            tracing::info!(
                "NodePublishVolume {id}: mounted at {}{}",
                target.display(),
                if read_only { " read-only" } else { "" }
            );
            Ok(())
        })
        .await?;
        Ok(Response::new(proto::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<proto::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<proto::NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        let target = request_path(&r.target_path, "target path")
            .map_err(|e| Status::invalid_argument(e.message()))?;
        let (state_dir, exe, id) = (
            self.state_dir.clone(),
            self.exe.clone(),
            r.volume_id.clone(),
        );
        blocking(move || {
            let mounted = mounts::find(&target)
                .filter(mounts::is_unkai)
                .is_some_and(|m| m.mountpoint == target);
            if mounted {
                let args = ["umount".to_string(), target.to_string_lossy().into_owned()];
                if let Err(e) = run(&exe, &args, None) {
                    tracing::warn!("NodeUnpublishVolume {id} at {}: {e}", target.display());
                    return Err(Status::internal(format!("unmounting volume {id}: {e}")));
                }
                tracing::info!("NodeUnpublishVolume {id}: unmounted {}", target.display());
            }
            let _ = std::fs::remove_file(state_file(&state_dir, &target));
            match std::fs::remove_dir(&target) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Status::internal(
                    format!("removing the target path {}: {e}", target.display()),
                )),
                _ => Ok(()),
            }
        })
        .await?;
        Ok(Response::new(proto::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<proto::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        let r = req.into_inner();
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        if r.volume_path.is_empty() {
            return Err(Status::invalid_argument("the volume path is missing"));
        }
        let path = request_path(&r.volume_path, "volume path")?;
        let (state_dir, id) = (self.state_dir.clone(), r.volume_id.clone());
        let usage = blocking(move || {
            if published(&state_dir, &path).as_deref() != Some(id.as_str()) {
                return Err(Status::not_found(format!(
                    "volume {id} is not published at {}",
                    path.display()
                )));
            }
            let st = nix::sys::statvfs::statvfs(&path)
                .map_err(|e| Status::internal(format!("statfs of {}: {e}", path.display())))?;
            let f = st.fragment_size() as i64;
            let (total, free, avail) = (
                st.blocks() as i64 * f,
                st.blocks_free() as i64 * f,
                st.blocks_available() as i64 * f,
            );
            let (files, ffree) = (st.files() as i64, st.files_free() as i64);
            use proto::volume_usage::Unit;
            Ok(vec![
                proto::VolumeUsage {
                    available: avail,
                    total,
                    used: total - free,
                    unit: Unit::Bytes as i32,
                },
                proto::VolumeUsage {
                    available: ffree,
                    total: files,
                    used: files - ffree,
                    unit: Unit::Inodes as i32,
                },
            ])
        })
        .await?;
        Ok(Response::new(proto::NodeGetVolumeStatsResponse { usage }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        use proto::node_service_capability::{Rpc, Type, rpc};
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: vec![proto::NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc {
                    r#type: rpc::Type::GetVolumeStats as i32,
                })),
            }],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<proto::NodeGetInfoRequest>,
    ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        Ok(Response::new(proto::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_flags_pass_but_never_another_directory() {
        let f = mount_flags(&["noatime,cache_size=1G".into(), "nosuid".into()]).unwrap();
        assert_eq!(f, ["noatime", "cache_size=1G", "nosuid"]);
        assert!(mount_flags(&["subdir=/other".into()]).is_err());
        assert!(mount_flags(&["noatime,remount".into()]).is_err());
    }
}
