//! The CSI Controller service: a volume is the directory `/csi/NAME` of the shared volume
//! named by the request's META-URL, its capacity a directory quota. CreateVolume makes it,
//! DeleteVolume moves its tree to the trash or removes it for good (the StorageClass's
//! `onDelete`, kept on the directory), ControllerExpandVolume raises the quota.
//!
//! Not for: mounting (`csi::node`), how quotas are kept (`meta::quota`, `admin::quota`).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::proto::{self, controller_server::Controller};
use super::{Secrets, VOLUMES_DIR, blocking, check_name};
use crate::meta::{Ctx, Ino, Kind, Meta, ROOT_INO, XattrSet};

/// The xattr of a volume's directory that says what DeleteVolume does (`trash`, `remove`).
const ON_DELETE_XATTR: &[u8] = b"trusted.unkai.csi.on_delete";

pub struct ControllerService;

/// What DeleteVolume does with a volume's tree.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OnDelete {
    /// Every entry to the volume's trash (kept `trash_days`, `unkai restore` brings it back).
    Trash,
    /// Removed for good, bypassing the trash.
    Remove,
}

impl OnDelete {
    fn parse(v: &str) -> Result<OnDelete, Status> {
        match v {
            "" | "trash" => Ok(OnDelete::Trash),
            "remove" => Ok(OnDelete::Remove),
            _ => Err(Status::invalid_argument(format!(
                "invalid StorageClass parameter onDelete '{v}': give trash (the default) or remove"
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            OnDelete::Trash => "trash",
            OnDelete::Remove => "remove",
        }
    }
}

/// Opens the volume the secrets name (one connection per request: the controller is rare
/// and holds no cache another client's changes could make stale).
fn open(secrets: &Secrets) -> Result<Arc<dyn Meta>, Status> {
    let url = secrets.meta_url()?;
    crate::volume::open_meta(&url).map_err(|e| {
        Status::unavailable(format!(
            "cannot open the volume: {}",
            secrets.scrub(&format!("{e:#}"))
        ))
    })
}

fn meta_err(what: &str, e: crate::meta::Error) -> Status {
    Status::internal(format!("{what}: {e}"))
}

/// The inode of `/csi`, made if `make` (None if it does not exist).
fn volumes_dir(meta: &dyn Meta, make: bool) -> Result<Option<Ino>, Status> {
    let name = VOLUMES_DIR.trim_start_matches('/').as_bytes();
    match meta.lookup(&Ctx::ROOT, ROOT_INO, name) {
        Ok(a) => Ok(Some(a.ino)),
        Err(e) if e.errno() == libc::ENOENT && make => {
            match meta.mknod(&Ctx::ROOT, ROOT_INO, name, Kind::Dir, 0o755, 0, None) {
                Ok(a) => Ok(Some(a.ino)),
                Err(e) if e.errno() == libc::EEXIST => volumes_dir(meta, false),
                Err(e) => Err(meta_err("making /csi", e)),
            }
        }
        Err(e) if e.errno() == libc::ENOENT => Ok(None),
        Err(e) => Err(meta_err("looking up /csi", e)),
    }
}

/// The inode of volume `id`'s directory, if it exists.
fn find(meta: &dyn Meta, id: &str) -> Result<Option<(Ino, Ino)>, Status> {
    let Some(dir) = volumes_dir(meta, false)? else {
        return Ok(None);
    };
    match meta.lookup(&Ctx::ROOT, dir, id.as_bytes()) {
        Ok(a) if a.kind == Kind::Dir => Ok(Some((dir, a.ino))),
        Ok(_) => Err(Status::failed_precondition(format!(
            "{VOLUMES_DIR}/{id} is not a directory: remove it from the volume"
        ))),
        Err(e) if e.errno() == libc::ENOENT => Ok(None),
        Err(e) => Err(meta_err("looking up the volume", e)),
    }
}

/// The quota's limit of bytes on `ino` (0: none).
fn capacity(meta: &dyn Meta, ino: Ino) -> Result<u64, Status> {
    Ok(meta
        .quotas()
        .map_err(|e| meta_err("reading quotas", e))?
        .into_iter()
        .find(|q| q.ino == ino)
        .map_or(0, |q| q.max_bytes))
}

fn set_quota(meta: &dyn Meta, id: &str, bytes: u64) -> Result<(), Status> {
    let path = format!("{VOLUMES_DIR}/{id}");
    crate::admin::quota::set(meta, &path, Some(bytes), None, &|m| {
        tracing::info!("volume {id}: {m}")
    })
    .map_err(|e| Status::internal(format!("setting the quota of {path}: {e:#}")))?;
    Ok(())
}

/// The bytes a capacity range asks for (0: no limit), or an error for a range that is empty.
fn wanted(range: Option<&proto::CapacityRange>) -> Result<u64, Status> {
    let Some(r) = range else { return Ok(0) };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(Status::out_of_range("a negative capacity"));
    }
    if r.limit_bytes > 0 && r.required_bytes > r.limit_bytes {
        return Err(Status::out_of_range(format!(
            "required_bytes {} is more than limit_bytes {}",
            r.required_bytes, r.limit_bytes
        )));
    }
    Ok(if r.required_bytes > 0 {
        r.required_bytes
    } else {
        r.limit_bytes
    } as u64)
}

/// Whether a volume of `have` bytes (0: no limit) fits the range asked.
fn fits(have: u64, range: Option<&proto::CapacityRange>) -> bool {
    let Some(r) = range else { return true };
    let (req, lim) = (r.required_bytes.max(0) as u64, r.limit_bytes.max(0) as u64);
    if have == 0 {
        return req == 0 && lim == 0;
    }
    have >= req && (lim == 0 || have <= lim)
}

/// Checks the capabilities asked: a file system (not a block device), any access mode.
fn check_capabilities(caps: &[proto::VolumeCapability]) -> Result<(), Status> {
    use proto::volume_capability::AccessType;
    if caps.is_empty() {
        return Err(Status::invalid_argument(
            "the volume capabilities are missing",
        ));
    }
    for c in caps {
        match c.access_type {
            Some(AccessType::Mount(_)) => {}
            Some(AccessType::Block(_)) => {
                return Err(Status::invalid_argument(
                    "unkai volumes are file systems: use volumeMode Filesystem, not Block",
                ));
            }
            None => return Err(Status::invalid_argument("a capability has no access type")),
        }
        if c.access_mode.is_none() {
            return Err(Status::invalid_argument("a capability has no access mode"));
        }
    }
    Ok(())
}

/// Deletes `name` of `parent` (inode `ino`) and its tree through the trash: every file and
/// directory goes there with its origin, as `rm -rf` through a mount would.
fn trash_tree(meta: &dyn Meta, parent: Ino, name: &[u8], ino: Ino) -> crate::meta::Result<()> {
    let gone = |r: crate::meta::Result<()>| match r {
        Err(e) if e.errno() == libc::ENOENT => Ok(()),
        r => r,
    };
    let mut children = Vec::new();
    let mut cookie = 0;
    loop {
        let page = match meta.readdir(ino, cookie, 1024, false) {
            Err(e) if e.errno() == libc::ENOENT => return Ok(()),
            r => r?,
        };
        let Some(last) = page.last() else { break };
        cookie = last.cookie;
        children.extend(
            page.into_iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .map(|e| (e.name, e.ino, e.kind)),
        );
    }
    for (n, i, kind) in children {
        if kind == Kind::Dir {
            trash_tree(meta, ino, &n, i)?;
        } else {
            gone(meta.unlink(&Ctx::ROOT, ino, &n).map(drop))?;
        }
    }
    gone(meta.rmdir(&Ctx::ROOT, parent, name))
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<proto::CreateVolumeRequest>,
    ) -> Result<Response<proto::CreateVolumeResponse>, Status> {
        let r = req.into_inner();
        let secrets = Secrets::new(r.secrets);
        check_name(&r.name, "volume name")?;
        check_capabilities(&r.volume_capabilities)?;
        if r.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volumes from snapshots or clones are not supported",
            ));
        }
        let mut on_delete = OnDelete::Trash;
        for (k, v) in &r.parameters {
            match k.as_str() {
                "onDelete" => on_delete = OnDelete::parse(v)?,
                // Kubernetes' own (csi.storage.k8s.io/..., the external-provisioner's).
                k if k.contains('/') => {}
                k => {
                    return Err(Status::invalid_argument(format!(
                        "unknown StorageClass parameter '{k}': unkai knows onDelete \
                         (trash or remove)"
                    )));
                }
            }
        }
        let bytes = wanted(r.capacity_range.as_ref())?;
        let name = r.name.clone();
        let range = r.capacity_range;
        let capacity = blocking(move || {
            let meta = open(&secrets)?;
            let meta = meta.as_ref();
            if let Some((_, ino)) = find(meta, &name)? {
                let have = capacity(meta, ino)?;
                if !fits(have, range.as_ref()) {
                    return Err(Status::already_exists(format!(
                        "volume {name} exists with another capacity ({have} bytes)"
                    )));
                }
                return Ok(have);
            }
            let dir = volumes_dir(meta, true)?.expect("made");
            let a = match meta.mknod(&Ctx::ROOT, dir, name.as_bytes(), Kind::Dir, 0o777, 0, None) {
                Ok(a) => a,
                // Made by a request racing this one: answered as a retry.
                Err(e) if e.errno() == libc::EEXIST => {
                    let (_, ino) = find(meta, &name)?.ok_or_else(|| {
                        Status::aborted(format!("volume {name} was deleted meanwhile"))
                    })?;
                    let have = capacity(meta, ino)?;
                    return if fits(have, range.as_ref()) {
                        Ok(have)
                    } else {
                        Err(Status::already_exists(format!(
                            "volume {name} exists with another capacity ({have} bytes)"
                        )))
                    };
                }
                Err(e) => return Err(meta_err("making the volume's directory", e)),
            };
            meta.set_xattr(
                &Ctx::ROOT,
                a.ino,
                ON_DELETE_XATTR,
                on_delete.as_str().as_bytes(),
                XattrSet::Any,
            )
            .map_err(|e| meta_err("recording onDelete", e))?;
            if bytes > 0 {
                set_quota(meta, &name, bytes)?;
            }
            Ok(bytes)
        })
        .await?;
        tracing::info!(
            "CreateVolume {}: {VOLUMES_DIR}/{}, {} bytes, onDelete {}",
            r.name,
            r.name,
            capacity,
            on_delete.as_str()
        );
        Ok(Response::new(proto::CreateVolumeResponse {
            volume: Some(proto::Volume {
                capacity_bytes: capacity as i64,
                volume_id: r.name,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<proto::DeleteVolumeRequest>,
    ) -> Result<Response<proto::DeleteVolumeResponse>, Status> {
        let r = req.into_inner();
        let secrets = Secrets::new(r.secrets);
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        if check_name(&r.volume_id, "volume id").is_err() {
            // Not one of ours: nothing to delete.
            return Ok(Response::new(proto::DeleteVolumeResponse {}));
        }
        let id = r.volume_id.clone();
        let how = blocking(move || {
            let meta = open(&secrets)?;
            let meta = meta.as_ref();
            let Some((dir, ino)) = find(meta, &id)? else {
                return Ok(None);
            };
            let how = match meta.get_xattr(ino, ON_DELETE_XATTR) {
                Ok(v) => OnDelete::parse(&String::from_utf8_lossy(&v))?,
                Err(_) => OnDelete::Trash,
            };
            match how {
                OnDelete::Trash => trash_tree(meta, dir, id.as_bytes(), ino),
                OnDelete::Remove => match meta.purge(dir, id.as_bytes()) {
                    Err(e) if e.errno() == libc::ENOENT => Ok(()),
                    r => r.map(drop),
                },
            }
            .map_err(|e| meta_err("deleting the volume's tree", e))?;
            Ok(Some(how))
        })
        .await?;
        match how {
            Some(how) => tracing::info!(
                "DeleteVolume {}: {} ({})",
                r.volume_id,
                if how == OnDelete::Trash {
                    "moved to the trash"
                } else {
                    "removed"
                },
                how.as_str()
            ),
            None => tracing::info!("DeleteVolume {}: no such volume", r.volume_id),
        }
        Ok(Response::new(proto::DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<proto::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<proto::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        let secrets = Secrets::new(r.secrets);
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        if r.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument(
                "the volume capabilities are missing",
            ));
        }
        check_name(&r.volume_id, "volume id")
            .map_err(|_| Status::not_found(format!("no volume {}", r.volume_id)))?;
        let id = r.volume_id.clone();
        let exists = blocking(move || Ok(find(open(&secrets)?.as_ref(), &id)?.is_some())).await?;
        if !exists {
            return Err(Status::not_found(format!("no volume {}", r.volume_id)));
        }
        Ok(Response::new(
            match check_capabilities(&r.volume_capabilities) {
                Ok(()) => proto::ValidateVolumeCapabilitiesResponse {
                    confirmed: Some(proto::validate_volume_capabilities_response::Confirmed {
                        volume_context: r.volume_context,
                        volume_capabilities: r.volume_capabilities,
                        parameters: r.parameters,
                        mutable_parameters: Default::default(),
                    }),
                    message: String::new(),
                },
                Err(e) => proto::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: e.message().to_string(),
                },
            },
        ))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<proto::ControllerGetCapabilitiesResponse>, Status> {
        use proto::controller_service_capability::{Rpc, Type, rpc};
        let capabilities = [rpc::Type::CreateDeleteVolume, rpc::Type::ExpandVolume]
            .into_iter()
            .map(|t| proto::ControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(proto::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn controller_expand_volume(
        &self,
        req: Request<proto::ControllerExpandVolumeRequest>,
    ) -> Result<Response<proto::ControllerExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        let secrets = Secrets::new(r.secrets);
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("the volume id is missing"));
        }
        let Some(range) = r.capacity_range else {
            return Err(Status::invalid_argument("the capacity range is missing"));
        };
        check_name(&r.volume_id, "volume id")
            .map_err(|_| Status::not_found(format!("no volume {}", r.volume_id)))?;
        let bytes = wanted(Some(&range))?;
        let id = r.volume_id.clone();
        let (before, after) = blocking(move || {
            let meta = open(&secrets)?;
            let meta = meta.as_ref();
            let Some((_, ino)) = find(meta, &id)? else {
                return Err(Status::not_found(format!("no volume {id}")));
            };
            let have = capacity(meta, ino)?;
            // Never shrunk, and a volume without limit stays so.
            if have == 0 || bytes <= have {
                return Ok((have, have));
            }
            set_quota(meta, &id, bytes)?;
            Ok((have, bytes))
        })
        .await?;
        tracing::info!(
            "ControllerExpandVolume {}: {before} -> {after} bytes",
            r.volume_id
        );
        Ok(Response::new(proto::ControllerExpandVolumeResponse {
            capacity_bytes: after as i64,
            node_expansion_required: false,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(req: i64, lim: i64) -> proto::CapacityRange {
        proto::CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        }
    }

    #[test]
    fn capacities() {
        assert_eq!(wanted(None).unwrap(), 0);
        assert_eq!(wanted(Some(&range(10, 0))).unwrap(), 10);
        assert_eq!(wanted(Some(&range(0, 20))).unwrap(), 20);
        assert!(wanted(Some(&range(30, 20))).is_err());
        assert!(fits(10, Some(&range(10, 0))));
        assert!(!fits(10, Some(&range(11, 0))));
        assert!(!fits(0, Some(&range(11, 0))));
        assert!(fits(0, None));
        assert!(!fits(30, Some(&range(10, 20))));
    }
}
