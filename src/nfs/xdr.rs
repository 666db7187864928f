//! The XDR forms of what an NFS client sends: the call header and credentials, and each
//! procedure's arguments, decoded with `nfs3_types`' codec (its derive and its fixed-size
//! types: `sattr3`, `createhow3`, `stable_how`, ...). Every variable-length field is a
//! [`Bounded`] here, never `nfs3_types`' own `Opaque`, whose decoder allocates whatever
//! length the client claims before reading a byte of it.
//!
//! Not for: record marking or replies (`rpc`), what the calls do (`proto`).

use std::io::{Read, Write};

use nfs3_types::nfs3::{createhow3, mknoddata3, sattr3, sattrguard3, stable_how};
use nfs3_types::xdr_codec::{Error, Pack, Unpack, XdrCodec};

/// Variable-length opaque data (or a string) of at most `MAX` bytes: a longer length is
/// refused before anything is allocated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bounded<const MAX: usize>(pub Vec<u8>);

impl<const MAX: usize> Pack for Bounded<MAX> {
    fn packed_size(&self) -> usize {
        4 + self.0.len().div_ceil(4) * 4
    }

    fn pack(&self, out: &mut impl Write) -> nfs3_types::xdr_codec::Result<usize> {
        let n = (self.0.len() as u32).pack(out)?;
        out.write_all(&self.0).map_err(Error::Io)?;
        let pad = (4 - self.0.len() % 4) % 4;
        out.write_all(&[0u8; 3][..pad]).map_err(Error::Io)?;
        Ok(n + self.0.len() + pad)
    }
}

impl<const MAX: usize> Unpack for Bounded<MAX> {
    fn unpack(input: &mut impl Read) -> nfs3_types::xdr_codec::Result<(Self, usize)> {
        let (len, _) = u32::unpack(input)?;
        let len = len as usize;
        if len > MAX {
            return Err(Error::InvalidLength(len));
        }
        let padded = len.div_ceil(4) * 4;
        let mut buf = Vec::new();
        let got = input
            .take(padded as u64)
            .read_to_end(&mut buf)
            .map_err(Error::Io)?;
        if got != padded {
            return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        buf.truncate(len);
        Ok((Bounded(buf), 4 + padded))
    }
}

/// The supplementary groups of an AUTH_UNIX credential (RFC 5531: at most 16).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gids(pub Vec<u32>);

impl Pack for Gids {
    fn packed_size(&self) -> usize {
        4 + 4 * self.0.len()
    }

    fn pack(&self, out: &mut impl Write) -> nfs3_types::xdr_codec::Result<usize> {
        let mut n = (self.0.len() as u32).pack(out)?;
        for g in &self.0 {
            n += g.pack(out)?;
        }
        Ok(n)
    }
}

impl Unpack for Gids {
    fn unpack(input: &mut impl Read) -> nfs3_types::xdr_codec::Result<(Self, usize)> {
        let (len, mut n) = u32::unpack(input)?;
        if len > 16 {
            return Err(Error::InvalidLength(len as usize));
        }
        let mut gids = Vec::with_capacity(len as usize);
        for _ in 0..len {
            let (g, m) = u32::unpack(input)?;
            gids.push(g);
            n += m;
        }
        Ok((Gids(gids), n))
    }
}

/// A file handle (NFS3_FHSIZE).
pub type Fh = Bounded<64>;
/// A file name: longer than any name the volume takes, so that a long one gets
/// NFS3ERR_NAMETOOLONG rather than a garbage-arguments error.
pub type Name = Bounded<4096>;
/// A symbolic link's target, or a MOUNT path.
pub type Path = Bounded<4096>;

/// An RPC credential or verifier (RFC 5531: at most 400 bytes of body).
#[derive(Debug, XdrCodec)]
pub struct Auth {
    pub flavor: u32,
    pub body: Bounded<400>,
}

/// The header of an RPC call (`rpc_msg` with a CALL body), up to the procedure's arguments.
#[derive(Debug, XdrCodec)]
pub struct CallHead {
    pub xid: u32,
    pub mtype: u32,
    pub rpcvers: u32,
    pub prog: u32,
    pub vers: u32,
    pub procedure: u32,
    pub cred: Auth,
    pub verf: Auth,
}

/// An AUTH_UNIX (AUTH_SYS) credential's body.
#[derive(Debug, XdrCodec)]
pub struct AuthUnix {
    pub stamp: u32,
    pub machine: Bounded<255>,
    pub uid: u32,
    pub gid: u32,
    pub gids: Gids,
}

#[derive(Debug, XdrCodec)]
pub struct FhArgs {
    pub fh: Fh,
}

#[derive(Debug, XdrCodec)]
pub struct DirOp {
    pub dir: Fh,
    pub name: Name,
}

#[derive(Debug, XdrCodec)]
pub struct SetattrArgs {
    pub fh: Fh,
    pub attr: sattr3,
    pub guard: sattrguard3,
}

#[derive(Debug, XdrCodec)]
pub struct AccessArgs {
    pub fh: Fh,
    pub access: u32,
}

#[derive(Debug, XdrCodec)]
pub struct ReadArgs {
    pub fh: Fh,
    pub offset: u64,
    pub count: u32,
}

#[derive(Debug, XdrCodec)]
pub struct WriteArgs {
    pub fh: Fh,
    pub offset: u64,
    pub count: u32,
    pub stable: stable_how,
    pub data: Bounded<{ super::MAX_IO as usize }>,
}

#[derive(Debug, XdrCodec)]
pub struct CreateArgs {
    pub to: DirOp,
    pub how: createhow3,
}

#[derive(Debug, XdrCodec)]
pub struct MkdirArgs {
    pub to: DirOp,
    pub attr: sattr3,
}

#[derive(Debug, XdrCodec)]
pub struct SymlinkArgs {
    pub to: DirOp,
    pub attr: sattr3,
    pub target: Path,
}

#[derive(Debug, XdrCodec)]
pub struct MknodArgs {
    pub to: DirOp,
    pub what: mknoddata3,
}

#[derive(Debug, XdrCodec)]
pub struct RenameArgs {
    pub from: DirOp,
    pub to: DirOp,
}

#[derive(Debug, XdrCodec)]
pub struct LinkArgs {
    pub fh: Fh,
    pub to: DirOp,
}

#[derive(Debug, XdrCodec)]
pub struct ReaddirArgs {
    pub fh: Fh,
    pub cookie: u64,
    pub verf: [u8; 8],
    pub count: u32,
}

#[derive(Debug, XdrCodec)]
pub struct ReaddirplusArgs {
    pub fh: Fh,
    pub cookie: u64,
    pub verf: [u8; 8],
    pub dircount: u32,
    pub maxcount: u32,
}

#[derive(Debug, XdrCodec)]
pub struct CommitArgs {
    pub fh: Fh,
    pub offset: u64,
    pub count: u32,
}

/// Decodes `T` from all of `bytes` (trailing bytes are an error).
pub fn decode<T: Unpack>(bytes: &[u8]) -> Option<T> {
    let mut c = std::io::Cursor::new(bytes);
    let (v, _) = T::unpack(&mut c).ok()?;
    (c.position() as usize == bytes.len()).then_some(v)
}

/// Encodes `v`.
pub fn encode(v: &impl Pack, out: &mut Vec<u8>) {
    // Packing into a Vec cannot fail but for lengths past 4 GiB, which replies never have.
    let _ = v.pack(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_past_the_bound_are_refused_before_allocating() {
        // A name claiming 4 GiB - 1 in a tiny buffer.
        let mut b = Vec::new();
        encode(&Bounded::<64>(vec![1, 2, 3]), &mut b);
        b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert!(decode::<DirOp>(&b).is_none());
        // Within the bound but longer than what is there.
        let mut b = Vec::new();
        encode(&Bounded::<64>(vec![1, 2, 3]), &mut b);
        b.extend_from_slice(&100u32.to_be_bytes());
        b.extend_from_slice(b"short");
        assert!(decode::<DirOp>(&b).is_none());
        // Round trip, padding included.
        let mut b = Vec::new();
        encode(&Bounded::<64>(vec![9; 5]), &mut b);
        encode(&Bounded::<4096>(b"name".to_vec()), &mut b);
        assert_eq!(b.len(), 4 + 8 + 4 + 4);
        let d: DirOp = decode(&b).unwrap();
        assert_eq!((d.dir.0, d.name.0), (vec![9; 5], b"name".to_vec()));
        // Too many groups.
        let mut b = Vec::new();
        for v in [0u32, 0, 5, 6, 17] {
            encode(&v, &mut b);
        }
        assert!(decode::<AuthUnix>(&b).is_none());
    }
}
