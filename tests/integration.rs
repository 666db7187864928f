//! The integration tests, one module per file beside this one, built as one test binary:
//! a binary per file cost 8-11 s of build each (51 of them: 923 CPU-seconds, where this one
//! and conformance's take 250), and tests of different files now share the run's threads
//! instead of waiting for each other's binaries. Not here: tests/conformance.rs, its own
//! binary because CI runs it a second time against PostgreSQL (`UNKAI_TEST_ENGINE=postgres`).
//!
//! Run one file's tests with `cargo test --release --test integration posix_ops::`.
//!
//! Every test shares the process with every other: process-wide state (the environment,
//! the umask, the current directory) is left alone, or changed only in a process of the
//! test's own (`common::in_own_process`), which is also the place for a test that must not
//! see other tests' forks copy its descriptors.

#[macro_use]
mod common;

mod accesslog;
mod acknowledged;
mod acl;
mod at_rest;
mod atime;
mod backends;
mod bandwidth;
mod bench;
mod cache;
mod cli;
mod compaction;
mod concurrency;
mod crash;
mod csi;
mod direct_io;
mod dump;
mod engine;
mod enospc;
mod failover;
mod faults;
mod fsck;
mod fsx_model;
mod gateway;
mod gc;
mod import;
mod limits;
mod locks;
mod memory;
mod metrics;
mod mount_options;
mod namespace_model;
mod nfs;
mod objbench;
mod ops;
mod passthrough;
mod peer_cache;
mod permissions_everywhere;
mod persistence;
mod posix_ops;
mod postgres;
mod quota;
mod safety;
mod scan;
mod shared_races;
mod staging;
mod stress;
mod sync;
mod trash;
mod webdav;
mod writeback;
