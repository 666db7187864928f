//! The export API: what every front end (the FUSE mount; the NFS, S3 and WebDAV servers)
//! serves of a volume, and the parts of serving it that are the same whatever the protocol:
//! the directory served as the root, read-only or not, the access log ([`log`]) and the
//! request counters ([`requests`]).
//!
//! Not for: any protocol (each front end translates its own requests), opening the volume or
//! the life of a client (`volume::client`).

pub mod log;
pub mod requests;

use std::sync::Arc;

use super::Vfs;
use crate::meta::Ino;

pub use log::AccessLog;
pub use requests::Requests;

/// A volume as a front end serves it.
pub struct Export {
    vfs: Arc<Vfs>,
    root: Ino,
    read_only: bool,
    name: String,
    log: AccessLog,
    requests: Requests,
}

impl Export {
    /// Serves `root` of `vfs` (a volume named `name`), read-only or not, logging to `log`.
    pub fn new(vfs: Arc<Vfs>, root: Ino, read_only: bool, name: String, log: AccessLog) -> Export {
        Export {
            vfs,
            root,
            read_only,
            name,
            log,
            requests: Requests::default(),
        }
    }

    pub fn vfs(&self) -> &Arc<Vfs> {
        &self.vfs
    }

    /// The directory served as the root: `--subdir`'s inode, or the volume's root.
    pub fn root(&self) -> Ino {
        self.root
    }

    /// Whether every change is to be refused.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The access log.
    pub fn log(&self) -> &AccessLog {
        &self.log
    }

    /// The requests served, by kind.
    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    /// The export's figures (its requests, then the vfs's) as metrics.
    pub fn figures(&self, out: &mut crate::metrics::Families) {
        self.requests.figures(out);
        self.vfs.figures(out);
    }
}
