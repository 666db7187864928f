//! unkai: a shared POSIX file system whose data lives in object storage.
//!
//! Layers, top to bottom (data flows downward only): [`cli`] → [`fuse`] → [`vfs`] →
//! [`meta`] and [`data`] → [`object`]. [`admin`] (fsck, gc) sits beside [`vfs`]; both reclaim
//! dead slices and tell leaked objects through [`garbage`], which uses [`meta`] and [`data`].
//! [`volume`] opens, formats and serves volumes for the CLI ([`webdav`] is a network front end
//! beside [`fuse`], over [`vfs`] too); [`metrics`] is the vocabulary of
//! the figures every layer keeps (served by [`volume`]); [`bench`] runs the benchmark
//! suite against any directories; [`sync`] (beside [`cli`]) copies trees between directories
//! and buckets through [`object`].

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod admin;
pub mod bench;
pub mod cli;
#[cfg(unkai_csi)]
pub mod csi;
pub mod data;
pub mod fuse;
pub mod garbage;
pub mod gateway;
pub mod import;
pub mod meta;
pub mod metrics;
pub mod nfs;
pub mod object;
pub mod sync;
pub mod vfs;
pub mod volume;
pub mod webdav;
