//! Volume maintenance: `fsck` (check and repair invariants), `gc` (delete garbage objects),
//! `destroy` (delete a whole volume), `dump` (the metadata as JSON lines, and back),
//! `backup` (dumps into the bucket, scheduled by a mount) and `objbench` (measure the bucket
//! itself, and with `codecs` what compression makes of a tree).
//!
//! Works on a volume's metadata and bucket directly, usually while it is not mounted (a
//! mount only schedules `backup`).
//! Not for: anything a mount does in its normal course (that is `vfs`).

pub mod backup;
pub mod codecs;
pub mod destroy;
pub mod dump;
pub mod fsck;
pub mod gc;
pub mod objbench;
pub mod quota;
