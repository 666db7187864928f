//! The NFSv3 and MOUNT procedures (RFC 1813): each call's arguments decoded (`xdr`), its
//! file handles turned into inodes (`handle`), the work done by `fs` as the call's identity
//! (`export`), and the results encoded with `nfs3_types`' reply types.
//!
//! Not for: the RPC layer (`rpc`: record marks, call headers, credentials), permissions and
//! vfs calls (`fs`).

use nfs3_types::mount::{dirpath, export_node, fhandle3, mountres3, mountres3_ok, mountstat3};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{BoundedList, List, Opaque, Pack, Void};

use super::MAX_IO;
use super::export::Identity;
use super::fs::{Change, Fs, NOT_SYNC};
use super::handle::{Handles, Refused};
use super::xdr::{self, *};
use crate::meta::{Attr, Ino, Kind, MAX_NAME_LEN, Nanos, SetTime};
use crate::vfs;

/// Why a call gets no results: the RPC layer answers it with this accept status.
#[derive(Debug, PartialEq, Eq)]
pub enum Fault {
    /// The arguments do not decode (GARBAGE_ARGS).
    Garbage,
    /// No such procedure (PROC_UNAVAIL).
    NoProc,
}

/// The preferred size of a READDIR reply (FSINFO's dtpref).
const DIR_PREF: u32 = 64 << 10;

/// The protocol's error for a vfs error: the one place errnos become NFS errors.
pub fn status(e: &vfs::Error) -> nfsstat3 {
    match e.errno() {
        libc::ENOENT => nfsstat3::NFS3ERR_NOENT,
        libc::EACCES => nfsstat3::NFS3ERR_ACCES,
        libc::EPERM => nfsstat3::NFS3ERR_PERM,
        libc::EEXIST => nfsstat3::NFS3ERR_EXIST,
        libc::ENOTDIR => nfsstat3::NFS3ERR_NOTDIR,
        libc::EISDIR => nfsstat3::NFS3ERR_ISDIR,
        libc::ENOTEMPTY => nfsstat3::NFS3ERR_NOTEMPTY,
        libc::ENOSPC => nfsstat3::NFS3ERR_NOSPC,
        libc::EDQUOT => nfsstat3::NFS3ERR_DQUOT,
        libc::EROFS => nfsstat3::NFS3ERR_ROFS,
        libc::ENAMETOOLONG => nfsstat3::NFS3ERR_NAMETOOLONG,
        libc::ESTALE => nfsstat3::NFS3ERR_STALE,
        libc::EFBIG => nfsstat3::NFS3ERR_FBIG,
        libc::EINVAL => nfsstat3::NFS3ERR_INVAL,
        libc::EXDEV => nfsstat3::NFS3ERR_XDEV,
        libc::EMLINK => nfsstat3::NFS3ERR_MLINK,
        NOT_SYNC => nfsstat3::NFS3ERR_NOT_SYNC,
        _ => nfsstat3::NFS3ERR_IO,
    }
}

/// NFS attributes of an inode.
pub fn fattr(a: &Attr) -> fattr3 {
    let size = if a.kind == Kind::Dir { 4096 } else { a.length };
    let used = if a.kind == Kind::File { a.stored } else { size };
    fattr3 {
        type_: match a.kind {
            Kind::File => ftype3::NF3REG,
            Kind::Dir => ftype3::NF3DIR,
            Kind::Symlink => ftype3::NF3LNK,
            Kind::Fifo => ftype3::NF3FIFO,
            Kind::CharDev => ftype3::NF3CHR,
            Kind::BlockDev => ftype3::NF3BLK,
            Kind::Socket => ftype3::NF3SOCK,
        },
        mode: a.mode & 0o7777,
        nlink: a.visible_nlink(),
        uid: a.uid,
        gid: a.gid,
        size,
        used,
        rdev: specdata3 {
            specdata1: libc::major(a.rdev as libc::dev_t),
            specdata2: libc::minor(a.rdev as libc::dev_t),
        },
        fsid: 0,
        fileid: a.ino,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
    }
}

fn time(ns: Nanos) -> nfstime3 {
    let ns = ns.max(0);
    nfstime3 {
        seconds: (ns / 1_000_000_000).min(u32::MAX as i64) as u32,
        nseconds: (ns % 1_000_000_000) as u32,
    }
}

fn nanos(t: nfstime3) -> Nanos {
    t.seconds as i64 * 1_000_000_000 + t.nseconds.min(999_999_999) as i64
}

fn wcc_attr_of(a: &Attr) -> wcc_attr {
    let f = fattr(a);
    wcc_attr {
        size: f.size,
        mtime: f.mtime,
        ctime: f.ctime,
    }
}

fn pre(a: Option<&Attr>) -> pre_op_attr {
    a.map_or(pre_op_attr::None, |a| pre_op_attr::Some(wcc_attr_of(a)))
}

fn post_of(a: Option<&Attr>) -> post_op_attr {
    a.map_or(post_op_attr::None, |a| post_op_attr::Some(fattr(a)))
}

/// A SETATTR's (or a create's) attributes as a [`Change`].
pub fn change(s: &sattr3) -> Change {
    let t = |set: Option<Option<nfstime3>>| {
        set.map(|c| c.map_or(SetTime::Now, |t| SetTime::At(nanos(t))))
    };
    Change {
        mode: match s.mode {
            Nfs3Option::Some(m) => Some(m),
            Nfs3Option::None => None,
        },
        uid: match s.uid {
            Nfs3Option::Some(u) => Some(u),
            Nfs3Option::None => None,
        },
        gid: match s.gid {
            Nfs3Option::Some(g) => Some(g),
            Nfs3Option::None => None,
        },
        size: match s.size {
            Nfs3Option::Some(n) => Some(n),
            Nfs3Option::None => None,
        },
        atime: t(match s.atime {
            set_atime::DONT_CHANGE => None,
            set_atime::SET_TO_SERVER_TIME => Some(None),
            set_atime::SET_TO_CLIENT_TIME(t) => Some(Some(t)),
        }),
        mtime: t(match s.mtime {
            set_mtime::DONT_CHANGE => None,
            set_mtime::SET_TO_SERVER_TIME => Some(None),
            set_mtime::SET_TO_CLIENT_TIME(t) => Some(Some(t)),
        }),
    }
}

/// One export's procedures.
pub struct Proto {
    pub fs: Fs,
    pub handles: Handles,
    pub read_only: bool,
    /// This run's write verifier.
    pub verf: [u8; 8],
}

type Res<T> = Result<T, nfsstat3>;

impl Proto {
    /// The inode a handle names.
    fn ino(&self, fh: &Fh) -> Res<Ino> {
        match self.handles.inode(&fh.0) {
            Ok(i) => Ok(i),
            Err(Refused::Bad) => Err(nfsstat3::NFS3ERR_BADHANDLE),
            Err(Refused::Stale) => Err(nfsstat3::NFS3ERR_STALE),
        }
    }

    fn fh(&self, ino: Ino) -> nfs_fh3 {
        nfs_fh3 {
            data: Opaque::owned(self.handles.handle(ino)),
        }
    }

    /// The attributes of `ino` (an inode gone is stale: its handle names nothing now).
    fn attr(&self, ino: Ino) -> Res<Attr> {
        self.fs.getattr(ino).map_err(|e| match status(&e) {
            nfsstat3::NFS3ERR_NOENT => nfsstat3::NFS3ERR_STALE,
            s => s,
        })
    }

    fn post(&self, ino: Ino) -> post_op_attr {
        post_of(self.fs.getattr(ino).ok().as_ref())
    }

    fn writable(&self) -> Res<()> {
        if self.read_only {
            Err(nfsstat3::NFS3ERR_ROFS)
        } else {
            Ok(())
        }
    }

    /// Runs NFSv3 procedure `procedure` with `args` as `who`, its results appended to `out`.
    pub fn nfs(
        &self,
        who: &Identity,
        procedure: u32,
        args: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Fault> {
        fn args_of<T: nfs3_types::xdr_codec::Unpack>(b: &[u8]) -> Result<T, Fault> {
            xdr::decode(b).ok_or(Fault::Garbage)
        }
        match procedure {
            0 => Ok(()),
            1 => {
                let a: FhArgs = args_of(args)?;
                let r = match self.ino(&a.fh).and_then(|i| self.attr(i)) {
                    Ok(at) => GETATTR3res::Ok(GETATTR3resok {
                        obj_attributes: fattr(&at),
                    }),
                    Err(s) => GETATTR3res::Err((s, Void)),
                };
                xdr::encode(&r, out);
                Ok(())
            }
            2 => {
                let a: SetattrArgs = args_of(args)?;
                xdr::encode(&self.setattr(who, a), out);
                Ok(())
            }
            3 => {
                let a: DirOp = args_of(args)?;
                xdr::encode(&self.lookup(who, a), out);
                Ok(())
            }
            4 => {
                let a: AccessArgs = args_of(args)?;
                xdr::encode(&self.access(who, a), out);
                Ok(())
            }
            5 => {
                let a: FhArgs = args_of(args)?;
                let r = match self.ino(&a.fh).and_then(|i| {
                    self.attr(i)?;
                    self.fs.readlink(i).map_err(|e| status(&e)).map(|t| (i, t))
                }) {
                    Ok((i, t)) => READLINK3res::Ok(READLINK3resok {
                        symlink_attributes: self.post(i),
                        data: nfspath3(Opaque::owned(t)),
                    }),
                    Err(s) => READLINK3res::Err((s, READLINK3resfail::default())),
                };
                xdr::encode(&r, out);
                Ok(())
            }
            6 => {
                let a: ReadArgs = args_of(args)?;
                self.read(who, a, out);
                Ok(())
            }
            7 => {
                let a: WriteArgs = args_of(args)?;
                xdr::encode(&self.write(who, a), out);
                Ok(())
            }
            8 => {
                let a: CreateArgs = args_of(args)?;
                xdr::encode(&self.create(who, a), out);
                Ok(())
            }
            9 => {
                let a: MkdirArgs = args_of(args)?;
                let mode = change(&a.attr).mode.unwrap_or(0o755);
                let r = self.make(who, &a.to, Kind::Dir, mode, 0, None, &a.attr);
                xdr::encode(&r, out);
                Ok(())
            }
            10 => {
                let a: SymlinkArgs = args_of(args)?;
                let r = self.make(
                    who,
                    &a.to,
                    Kind::Symlink,
                    0o777,
                    0,
                    Some(&a.target.0),
                    &a.attr,
                );
                xdr::encode(&r, out);
                Ok(())
            }
            11 => {
                let a: MknodArgs = args_of(args)?;
                let (kind, attr, rdev) = match a.what {
                    mknoddata3::NF3CHR(d) => (Kind::CharDev, d.dev_attributes, dev(&d.spec)),
                    mknoddata3::NF3BLK(d) => (Kind::BlockDev, d.dev_attributes, dev(&d.spec)),
                    mknoddata3::NF3SOCK(s) => (Kind::Socket, s, 0),
                    mknoddata3::NF3FIFO(s) => (Kind::Fifo, s, 0),
                    mknoddata3::default => {
                        let r = MKNOD3res::Err((
                            nfsstat3::NFS3ERR_BADTYPE,
                            MKNOD3resfail {
                                dir_wcc: wcc_data::default(),
                            },
                        ));
                        xdr::encode(&r, out);
                        return Ok(());
                    }
                };
                let mode = change(&attr).mode.unwrap_or(0o644);
                let r = self.make(who, &a.to, kind, mode, rdev, None, &attr);
                xdr::encode(&r, out);
                Ok(())
            }
            12 | 13 => {
                let a: DirOp = args_of(args)?;
                let (r, w) = self.dir_change(&a.dir, |dir| {
                    self.writable()?;
                    self.fs
                        .remove(who, dir, &a.name.0, procedure == 13)
                        .map_err(|e| status(&e))
                });
                // REMOVE3res and RMDIR3res are alike: a status and the directory's wcc.
                match r {
                    Ok(()) => xdr::encode(&REMOVE3res::Ok(REMOVE3resok { dir_wcc: w }), out),
                    Err(s) => {
                        xdr::encode(&REMOVE3res::Err((s, REMOVE3resfail { dir_wcc: w })), out)
                    }
                }
                Ok(())
            }
            14 => {
                let a: RenameArgs = args_of(args)?;
                xdr::encode(&self.rename(who, a), out);
                Ok(())
            }
            15 => {
                let a: LinkArgs = args_of(args)?;
                xdr::encode(&self.link(who, a), out);
                Ok(())
            }
            16 => {
                let a: ReaddirArgs = args_of(args)?;
                self.readdir(who, &a.fh, a.cookie, a.count, None, out);
                Ok(())
            }
            17 => {
                let a: ReaddirplusArgs = args_of(args)?;
                self.readdir(who, &a.fh, a.cookie, a.maxcount, Some(a.dircount), out);
                Ok(())
            }
            18 => {
                let a: FhArgs = args_of(args)?;
                let r = match self.ino(&a.fh).and_then(|i| {
                    self.attr(i)?;
                    self.fs.statfs().map_err(|e| status(&e)).map(|s| (i, s))
                }) {
                    Ok((i, s)) => FSSTAT3res::Ok(FSSTAT3resok {
                        obj_attributes: self.post(i),
                        tbytes: s.total_bytes,
                        fbytes: s.free_bytes,
                        abytes: s.free_bytes,
                        tfiles: s.files,
                        ffiles: s.free_files,
                        afiles: s.free_files,
                        invarsec: 0,
                    }),
                    Err(s) => FSSTAT3res::Err((s, FSSTAT3resfail::default())),
                };
                xdr::encode(&r, out);
                Ok(())
            }
            19 => {
                let a: FhArgs = args_of(args)?;
                let r = match self.ino(&a.fh).and_then(|i| self.attr(i)) {
                    Ok(at) => FSINFO3res::Ok(FSINFO3resok {
                        obj_attributes: post_op_attr::Some(fattr(&at)),
                        rtmax: MAX_IO,
                        rtpref: MAX_IO,
                        rtmult: 4096,
                        wtmax: MAX_IO,
                        wtpref: MAX_IO,
                        wtmult: 4096,
                        dtpref: DIR_PREF,
                        maxfilesize: crate::meta::MAX_FILE_SIZE,
                        time_delta: nfstime3 {
                            seconds: 0,
                            nseconds: 1,
                        },
                        properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
                    }),
                    Err(s) => FSINFO3res::Err((s, FSINFO3resfail::default())),
                };
                xdr::encode(&r, out);
                Ok(())
            }
            20 => {
                let a: FhArgs = args_of(args)?;
                let r = match self.ino(&a.fh).and_then(|i| self.attr(i)) {
                    Ok(at) => PATHCONF3res::Ok(PATHCONF3resok {
                        obj_attributes: post_op_attr::Some(fattr(&at)),
                        linkmax: u32::MAX,
                        name_max: MAX_NAME_LEN as u32,
                        no_trunc: true,
                        chown_restricted: true,
                        case_insensitive: false,
                        case_preserving: true,
                    }),
                    Err(s) => PATHCONF3res::Err((s, PATHCONF3resfail::default())),
                };
                xdr::encode(&r, out);
                Ok(())
            }
            21 => {
                let a: CommitArgs = args_of(args)?;
                let r = match self.ino(&a.fh).and_then(|i| {
                    let before = self.attr(i)?;
                    self.writable()?;
                    match self.fs.commit(i) {
                        Ok(after) => Ok((before, after)),
                        Err(e) => Err(status(&e)),
                    }
                }) {
                    Ok((b, a)) => COMMIT3res::Ok(COMMIT3resok {
                        file_wcc: wcc_data {
                            before: pre(Some(&b)),
                            after: post_of(Some(&a)),
                        },
                        verf: writeverf3(self.verf),
                    }),
                    Err(s) => COMMIT3res::Err((
                        s,
                        COMMIT3resfail {
                            file_wcc: wcc_data::default(),
                        },
                    )),
                };
                xdr::encode(&r, out);
                Ok(())
            }
            _ => Err(Fault::NoProc),
        }
    }

    /// Runs `f` on the directory `dir` names: its result, and the directory's weak cache
    /// consistency data either way.
    fn dir_change(&self, dir: &Fh, f: impl FnOnce(Ino) -> Res<()>) -> (Res<()>, wcc_data) {
        let ino = match self.ino(dir) {
            Ok(i) => i,
            Err(s) => return (Err(s), wcc_data::default()),
        };
        let before = self.fs.getattr(ino).ok();
        let r = f(ino);
        let w = wcc_data {
            before: pre(before.as_ref()),
            after: self.post(ino),
        };
        (r, w)
    }

    fn setattr(&self, who: &Identity, a: SetattrArgs) -> SETATTR3res {
        let guard = match a.guard {
            Nfs3Option::Some(t) => Some(nanos(t)),
            Nfs3Option::None => None,
        };
        let r = self.ino(&a.fh).and_then(|i| {
            self.attr(i)?;
            self.writable()?;
            self.fs
                .setattr(who, i, &change(&a.attr), guard)
                .map_err(|e| status(&e))
        });
        match r {
            Ok((b, after)) => SETATTR3res::Ok(SETATTR3resok {
                obj_wcc: wcc_data {
                    before: pre(Some(&b)),
                    after: post_of(Some(&after)),
                },
            }),
            Err(s) => {
                let after = self.ino(&a.fh).map(|i| self.post(i)).unwrap_or_default();
                SETATTR3res::Err((
                    s,
                    SETATTR3resfail {
                        obj_wcc: wcc_data {
                            before: pre_op_attr::None,
                            after,
                        },
                    },
                ))
            }
        }
    }

    fn lookup(&self, who: &Identity, a: DirOp) -> LOOKUP3res {
        let dir = match self.ino(&a.dir) {
            Ok(d) => d,
            Err(s) => return LOOKUP3res::Err((s, LOOKUP3resfail::default())),
        };
        if let Err(s) = self.attr(dir) {
            return LOOKUP3res::Err((s, LOOKUP3resfail::default()));
        }
        match self.fs.lookup(who, dir, &a.name.0) {
            Ok(at) => LOOKUP3res::Ok(LOOKUP3resok {
                object: self.fh(at.ino),
                obj_attributes: post_op_attr::Some(fattr(&at)),
                dir_attributes: self.post(dir),
            }),
            Err(e) => LOOKUP3res::Err((
                status(&e),
                LOOKUP3resfail {
                    dir_attributes: self.post(dir),
                },
            )),
        }
    }

    fn access(&self, who: &Identity, a: AccessArgs) -> ACCESS3res {
        let at = match self.ino(&a.fh).and_then(|i| self.attr(i)) {
            Ok(at) => at,
            Err(s) => return ACCESS3res::Err((s, ACCESS3resfail::default())),
        };
        let dir = at.kind == Kind::Dir;
        let mut granted = 0;
        for (bit, want) in [
            (ACCESS3_READ, 4),
            (ACCESS3_LOOKUP, 1),
            (ACCESS3_MODIFY, 2),
            (ACCESS3_EXTEND, 2),
            (ACCESS3_DELETE, 2),
            (ACCESS3_EXECUTE, 1),
        ] {
            if a.access & bit == 0 {
                continue;
            }
            let applies = match bit {
                ACCESS3_LOOKUP | ACCESS3_DELETE => dir,
                ACCESS3_EXECUTE => !dir,
                _ => true,
            };
            let writes = want == 2;
            if applies && !(writes && self.read_only) && self.fs.may(who, &at, want) {
                granted |= bit;
            }
        }
        ACCESS3res::Ok(ACCESS3resok {
            obj_attributes: post_op_attr::Some(fattr(&at)),
            access: granted,
        })
    }

    fn read(&self, who: &Identity, a: ReadArgs, out: &mut Vec<u8>) {
        let count = a.count.min(MAX_IO);
        let r = self.ino(&a.fh).and_then(|i| {
            self.attr(i)?;
            self.fs
                .read(who, i, a.offset, count)
                .map_err(|e| status(&e))
        });
        let r = match &r {
            Ok((data, eof, at)) => READ3res::Ok(READ3resok {
                file_attributes: post_op_attr::Some(fattr(at)),
                count: data.len() as u32,
                eof: *eof,
                data: Opaque::borrowed(data),
            }),
            Err(s) => READ3res::Err((*s, READ3resfail::default())),
        };
        out.reserve(r.packed_size());
        xdr::encode(&r, out);
    }

    fn write(&self, who: &Identity, a: WriteArgs) -> WRITE3res {
        let fail = |s| {
            WRITE3res::Err((
                s,
                WRITE3resfail {
                    file_wcc: wcc_data::default(),
                },
            ))
        };
        let ino = match self.ino(&a.fh).and_then(|i| self.attr(i).map(|_| i)) {
            Ok(i) => i,
            Err(s) => return fail(s),
        };
        if let Err(s) = self.writable() {
            return fail(s);
        }
        if (a.count as usize) > a.data.0.len() {
            return fail(nfsstat3::NFS3ERR_INVAL);
        }
        let data = &a.data.0[..a.count as usize];
        let sync = a.stable != stable_how::UNSTABLE;
        match self.fs.write(who, ino, a.offset, data, sync) {
            Ok((before, after)) => WRITE3res::Ok(WRITE3resok {
                file_wcc: wcc_data {
                    before: pre(Some(&before)),
                    after: post_of(Some(&after)),
                },
                count: a.count,
                committed: if sync {
                    stable_how::FILE_SYNC
                } else {
                    stable_how::UNSTABLE
                },
                verf: writeverf3(self.verf),
            }),
            Err(e) => WRITE3res::Err((
                status(&e),
                WRITE3resfail {
                    file_wcc: wcc_data {
                        before: pre_op_attr::None,
                        after: self.post(ino),
                    },
                },
            )),
        }
    }

    fn create(&self, who: &Identity, a: CreateArgs) -> CREATE3res {
        let mut made = None;
        let (r, w) = self.dir_change(&a.to.dir, |dir| {
            self.writable()?;
            let at = match &a.how {
                createhow3::UNCHECKED(s) | createhow3::GUARDED(s) => {
                    let c = change(s);
                    let exclusive = matches!(a.how, createhow3::GUARDED(_));
                    self.fs.create(
                        who,
                        dir,
                        &a.to.name.0,
                        c.mode.unwrap_or(0o644),
                        exclusive,
                        &c,
                    )
                }
                createhow3::EXCLUSIVE(v) => self.fs.create_exclusive(who, dir, &a.to.name.0, v.0),
            }
            .map_err(|e| status(&e))?;
            made = Some(at);
            Ok(())
        });
        match r {
            Ok(()) => {
                let at = made.expect("made");
                CREATE3res::Ok(CREATE3resok {
                    obj: post_op_fh3::Some(self.fh(at.ino)),
                    obj_attributes: post_op_attr::Some(fattr(&at)),
                    dir_wcc: w,
                })
            }
            Err(s) => CREATE3res::Err((s, CREATE3resfail { dir_wcc: w })),
        }
    }

    /// MKDIR, SYMLINK and MKNOD (their replies are alike: MKDIR3res stands for all three).
    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        who: &Identity,
        to: &DirOp,
        kind: Kind,
        mode: u32,
        rdev: u32,
        target: Option<&[u8]>,
        attr: &sattr3,
    ) -> MKDIR3res {
        let mut made = None;
        let (r, w) = self.dir_change(&to.dir, |dir| {
            self.writable()?;
            let at = self
                .fs
                .make(
                    who,
                    dir,
                    &to.name.0,
                    kind,
                    mode,
                    rdev,
                    target,
                    &change(attr),
                )
                .map_err(|e| status(&e))?;
            made = Some(at);
            Ok(())
        });
        match r {
            Ok(()) => {
                let at = made.expect("made");
                MKDIR3res::Ok(MKDIR3resok {
                    obj: post_op_fh3::Some(self.fh(at.ino)),
                    obj_attributes: post_op_attr::Some(fattr(&at)),
                    dir_wcc: w,
                })
            }
            Err(s) => MKDIR3res::Err((s, MKDIR3resfail { dir_wcc: w })),
        }
    }

    fn rename(&self, who: &Identity, a: RenameArgs) -> RENAME3res {
        let (from, to) = match (self.ino(&a.from.dir), self.ino(&a.to.dir)) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(s), _) | (_, Err(s)) => {
                return RENAME3res::Err((s, RENAME3resfail::default()));
            }
        };
        let (fb, tb) = (self.fs.getattr(from).ok(), self.fs.getattr(to).ok());
        let r = self.writable().and_then(|()| {
            self.fs
                .rename(who, from, &a.from.name.0, to, &a.to.name.0)
                .map_err(|e| status(&e))
        });
        let fromdir_wcc = wcc_data {
            before: pre(fb.as_ref()),
            after: self.post(from),
        };
        let todir_wcc = wcc_data {
            before: pre(tb.as_ref()),
            after: self.post(to),
        };
        match r {
            Ok(()) => RENAME3res::Ok(RENAME3resok {
                fromdir_wcc,
                todir_wcc,
            }),
            Err(s) => RENAME3res::Err((
                s,
                RENAME3resfail {
                    fromdir_wcc,
                    todir_wcc,
                },
            )),
        }
    }

    fn link(&self, who: &Identity, a: LinkArgs) -> LINK3res {
        let ino = match self.ino(&a.fh) {
            Ok(i) => i,
            Err(s) => {
                return LINK3res::Err((
                    s,
                    LINK3resfail {
                        file_attributes: post_op_attr::None,
                        linkdir_wcc: wcc_data::default(),
                    },
                ));
            }
        };
        let (r, w) = self.dir_change(&a.to.dir, |dir| {
            self.writable()?;
            self.fs
                .link(who, ino, dir, &a.to.name.0)
                .map(|_| ())
                .map_err(|e| status(&e))
        });
        match r {
            Ok(()) => LINK3res::Ok(LINK3resok {
                file_attributes: self.post(ino),
                linkdir_wcc: w,
            }),
            Err(s) => LINK3res::Err((
                s,
                LINK3resfail {
                    file_attributes: self.post(ino),
                    linkdir_wcc: w,
                },
            )),
        }
    }

    /// READDIR (`dircount` None) or READDIRPLUS: the entries after `cookie` that fit in
    /// `max` bytes of reply. Cookies are the vfs's, so a listing resumes where it left off
    /// (the cookie verifier is not used: always zero).
    fn readdir(
        &self,
        who: &Identity,
        fh: &Fh,
        cookie: u64,
        max: u32,
        dircount: Option<u32>,
        out: &mut Vec<u8>,
    ) {
        let plus = dircount.is_some();
        let listed = self.ino(fh).and_then(|d| {
            self.attr(d)?;
            // Room for the status, the directory's attributes, the verifier and the end.
            let room = (max.min(MAX_IO) as usize).saturating_sub(128);
            let each = if plus { 200 } else { 40 };
            let n = (room / each).clamp(1, 4096);
            self.fs
                .list(who, d, cookie, n)
                .map_err(|e| status(&e))
                .map(|l| (d, l, room))
        });
        let (dir, (entries, mut eof), room) = match listed {
            Ok(l) => l,
            Err(s) => {
                let r = READDIR3res::Err((s, READDIR3resfail::default()));
                xdr::encode(&r, out);
                return;
            }
        };
        let dir_attributes = self.post(dir);
        let cookieverf = cookieverf3([0; 8]);
        if plus {
            let mut list = BoundedList::new(room);
            for (i, (e, a)) in entries.iter().enumerate() {
                let entry = entryplus3 {
                    fileid: e.ino,
                    name: filename3(Opaque::borrowed(&e.name)),
                    cookie: e.cookie,
                    name_attributes: post_op_attr::Some(fattr(a)),
                    name_handle: post_op_fh3::Some(self.fh(e.ino)),
                };
                if list.try_push(entry).is_err() {
                    if i == 0 {
                        let r = READDIRPLUS3res::Err((
                            nfsstat3::NFS3ERR_TOOSMALL,
                            READDIRPLUS3resfail { dir_attributes },
                        ));
                        xdr::encode(&r, out);
                        return;
                    }
                    eof = false;
                    break;
                }
            }
            let r = READDIRPLUS3res::Ok(READDIRPLUS3resok {
                dir_attributes,
                cookieverf,
                reply: dirlistplus3 {
                    entries: list.into_inner(),
                    eof,
                },
            });
            xdr::encode(&r, out);
        } else {
            let mut list = BoundedList::new(room);
            for (i, (e, _)) in entries.iter().enumerate() {
                let entry = entry3 {
                    fileid: e.ino,
                    name: filename3(Opaque::borrowed(&e.name)),
                    cookie: e.cookie,
                };
                if list.try_push(entry).is_err() {
                    if i == 0 {
                        let r = READDIR3res::Err((
                            nfsstat3::NFS3ERR_TOOSMALL,
                            READDIR3resfail { dir_attributes },
                        ));
                        xdr::encode(&r, out);
                        return;
                    }
                    eof = false;
                    break;
                }
            }
            let r = READDIR3res::Ok(READDIR3resok {
                dir_attributes,
                cookieverf,
                reply: dirlist3 {
                    entries: list.into_inner(),
                    eof,
                },
            });
            xdr::encode(&r, out);
        }
    }

    /// Runs MOUNT procedure `procedure` as `who`.
    pub fn mount(
        &self,
        who: &Identity,
        procedure: u32,
        args: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Fault> {
        match procedure {
            // NULL, UMNT, UMNTALL: nothing to do, nothing kept.
            0 | 4 => Ok(()),
            3 => xdr::decode::<Path>(args).map(|_| ()).ok_or(Fault::Garbage),
            1 => {
                let path: Path = xdr::decode(args).ok_or(Fault::Garbage)?;
                let r = match self.walk(who, &path.0) {
                    Ok(ino) => mountres3::Ok(mountres3_ok {
                        fhandle: fhandle3(Opaque::owned(self.handles.handle(ino))),
                        auth_flavors: vec![1, 0],
                    }),
                    Err(e) => mountres3::Err(match e.errno() {
                        libc::ENOENT => mountstat3::MNT3ERR_NOENT,
                        libc::EACCES => mountstat3::MNT3ERR_ACCES,
                        libc::ENOTDIR => mountstat3::MNT3ERR_NOTDIR,
                        libc::ENAMETOOLONG => mountstat3::MNT3ERR_NAMETOOLONG,
                        libc::EINVAL => mountstat3::MNT3ERR_INVAL,
                        _ => mountstat3::MNT3ERR_IO,
                    }),
                };
                xdr::encode(&r, out);
                Ok(())
            }
            // DUMP: no list of mounts is kept.
            2 => {
                xdr::encode(&false, out);
                Ok(())
            }
            5 => {
                let exports: List<export_node> = List(vec![export_node {
                    ex_dir: dirpath(Opaque::borrowed(b"/")),
                    ex_groups: List(Vec::new()),
                }]);
                xdr::encode(&exports, out);
                Ok(())
            }
            _ => Err(Fault::NoProc),
        }
    }

    /// The directory `path` names under the export's root, looked up as `who`.
    fn walk(&self, who: &Identity, path: &[u8]) -> vfs::Result<Ino> {
        let mut ino = self.fs.root;
        for part in path.split(|&b| b == b'/') {
            if part.is_empty() || part == b"." {
                continue;
            }
            ino = self.fs.lookup(who, ino, part)?.ino;
        }
        if self.fs.getattr(ino)?.kind != Kind::Dir {
            return Err(vfs::Error::Sys(libc::ENOTDIR));
        }
        Ok(ino)
    }
}

fn dev(s: &specdata3) -> u32 {
    libc::makedev(s.specdata1, s.specdata2) as u32
}
