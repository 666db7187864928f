//! Volume maintenance: `fsck` (check and repair invariants) and `gc` (delete garbage objects).
//!
//! Works on a volume's metadata and bucket directly, usually while it is not mounted.
//! Not for: anything a mount does in its normal course (that is `vfs`).

pub mod fsck;
pub mod gc;
