//! The export API: what every front end (the FUSE mount; the NFS, S3 and WebDAV servers;
//! the in-process Python client) serves of a volume, and the parts of serving it that are
//! the same whatever the protocol: the directory served as the root, read-only or not, who
//! a request comes from ([`Caller`]), the kernel's permission rules for the servers
//! ([`rules`]: the kernel applies them itself in front of a FUSE mount), and each request
//! counted ([`requests`]) and logged ([`log`]) with its protocol, as [`Export::request`] (or
//! [`Export::begin`], for a front end that learns a request's kind only once it has answered
//! it) says.
//!
//! Not for: any protocol (each front end translates its own requests), opening the volume or
//! the life of a client (`volume::client`).

pub mod log;
pub mod requests;
pub mod rules;

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::Vfs;
use crate::meta::{Ctx, Ino};

pub use log::AccessLog;
pub use requests::{Answering, Requests};

/// The protocol a request came by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    Fuse,
    Nfs,
    S3,
    Webdav,
    /// The in-process Python client (the `unkai` package: its fsspec file system).
    Python,
}

impl Proto {
    pub const ALL: [Proto; 5] = [
        Proto::Fuse,
        Proto::Nfs,
        Proto::S3,
        Proto::Webdav,
        Proto::Python,
    ];

    /// As the access log and the metrics name it.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Fuse => "fuse",
            Proto::Nfs => "nfs",
            Proto::S3 => "s3",
            Proto::Webdav => "webdav",
            Proto::Python => "python",
        }
    }

    /// As a person writes it.
    pub fn title(self) -> &'static str {
        match self {
            Proto::Fuse => "FUSE",
            Proto::Nfs => "NFS",
            Proto::S3 => "S3",
            Proto::Webdav => "WebDAV",
            Proto::Python => "Python",
        }
    }
}

/// Who a request comes from: its protocol, the identity it acts as on the volume, and for a
/// network client, where it connects from and the name it signed in with.
#[derive(Clone, Debug)]
pub struct Caller {
    pub proto: Proto,
    /// The identity (the FUSE caller's process as the kernel names it; a network client's
    /// as its server maps it).
    pub ctx: Ctx,
    /// A network client's address.
    pub client: Option<String>,
    /// The name a network client signed in with (a WebDAV user, an S3 access key).
    pub user: Option<String>,
}

impl Caller {
    /// A FUSE caller: the process the kernel names.
    pub fn fuse(ctx: Ctx) -> Caller {
        Caller {
            proto: Proto::Fuse,
            ctx,
            client: None,
            user: None,
        }
    }

    /// Who the access log says made a request: `proto:fuse,uid:0,gid:0,pid:4403,comm:cp`,
    /// or `proto:webdav,uid:1000,gid:1000,client:127.0.0.1:50412,user:alice`.
    fn describe(&self) -> String {
        let c = &self.ctx;
        let mut s = format!("proto:{},uid:{},gid:{}", self.proto.name(), c.uid, c.gid);
        match &self.client {
            None => s += &format!(",pid:{},comm:{}", c.pid, log::comm(c.pid)),
            Some(a) => s += &format!(",client:{}", log::field(a)),
        }
        if let Some(u) = &self.user {
            s += &format!(",user:{}", log::field(u));
        }
        s
    }
}

/// A volume as a front end serves it.
pub struct Export {
    vfs: Arc<Vfs>,
    root: Ino,
    read_only: bool,
    name: String,
    log: AccessLog,
    requests: Requests,
}

/// What became of a request, as the log says it: an errno's words, or the front end's own
/// (an HTTP status).
const OK: i32 = 0;

/// A request being answered: counted and timed (`requests`), and logged if the access log is
/// on, when it is dropped (when the front end has replied).
pub struct Request<'a> {
    export: &'a Export,
    answering: Option<Answering>,
    /// The line's head (time, who, operation and arguments) and when it began, if logged.
    head: Option<String>,
    start: Instant,
    errno: AtomicI32,
    text: Mutex<Option<String>>,
}

impl Request<'_> {
    /// Notes the result of a request answered from `r`; returns it.
    pub fn noted<T>(&self, r: super::Result<T>) -> super::Result<T> {
        if let Err(e) = &r {
            self.failed(e.errno());
        }
        r
    }

    /// Notes the request failed with `errno`.
    pub fn failed(&self, errno: i32) {
        self.errno.store(errno, Ordering::Relaxed);
    }

    /// Notes the request failed as `why` says (a protocol's own words, e.g. `403 Forbidden`).
    pub fn failed_as(&self, why: impl Into<String>) {
        *self.text.lock() = Some(why.into());
    }

    /// The export the request is for.
    pub fn export(&self) -> &Export {
        self.export
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.answering.take() {
            a.done();
        }
        if let Some(head) = self.head.take() {
            let res = match (self.text.lock().take(), self.errno.load(Ordering::Relaxed)) {
                (Some(t), _) => t,
                (None, OK) => "OK".to_string(),
                (None, e) => log::errno_words(e),
            };
            self.export.log.record(format!(
                "{head}: {res} <{:.6}>",
                self.start.elapsed().as_secs_f64()
            ));
        }
    }
}

/// A request begun whose kind is not known yet (an S3 server learns it from its protocol
/// library once answered): [`Begun::end`] counts and logs it.
pub struct Begun {
    who: Caller,
    stamp: Option<String>,
    start: Instant,
}

impl Begun {
    /// Ends the request `op` (with `args`, its names) of `export`: `failed` is None if it
    /// succeeded, else what failed in the protocol's own words.
    pub fn end(
        self,
        export: &Export,
        op: &str,
        args: impl FnOnce() -> String,
        failed: Option<String>,
    ) {
        let answering = export.requests.start_at(self.who.proto, op, self.start);
        let head = match (self.stamp, export.log.on()) {
            (Some(stamp), true) => {
                Some(format!("{stamp} [{}] {op} {}", self.who.describe(), args()))
            }
            _ => None,
        };
        drop(Request {
            export,
            answering: Some(answering),
            head,
            start: self.start,
            errno: AtomicI32::new(OK),
            text: Mutex::new(failed),
        });
    }
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

    /// Starts answering a request `op` from `who`; `args` (its inodes, names, offsets) is
    /// made only if the access log is on. Counted and logged when the result is dropped.
    pub fn request(&self, who: &Caller, op: &str, args: impl FnOnce() -> String) -> Request<'_> {
        let start = Instant::now();
        let head = self
            .log
            .on()
            .then(|| format!("{} [{}] {op} {}", log::stamp(), who.describe(), args()));
        Request {
            export: self,
            answering: Some(self.requests.start_at(who.proto, op, start)),
            head,
            start,
            errno: AtomicI32::new(OK),
            text: Mutex::new(None),
        }
    }

    /// Begins a request from `who` whose kind is known only at its end ([`Begun::end`]).
    pub fn begin(&self, who: Caller) -> Begun {
        Begun {
            stamp: self.log.on().then(log::stamp),
            start: Instant::now(),
            who,
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

    /// The requests served, by protocol and kind.
    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    /// The export's figures (its requests, then the vfs's) as metrics.
    pub fn figures(&self, out: &mut crate::metrics::Families) {
        self.requests.figures(out);
        self.vfs.figures(out);
    }
}
