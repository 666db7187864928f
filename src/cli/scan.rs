//! The antivirus flags every front end takes (`mount`, `nfs`, `gateway`, `webdav`).
//!
//! Not for: scanning itself (`vfs::scan`).

use crate::vfs::scan::{FailPolicy, clamd::Clamd};
use crate::volume::open::ScanConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fail {
    Open,
    Closed,
}

/// Antivirus scanning of files written.
#[derive(clap::Args, Clone)]
pub struct ScanArgs {
    /// Scan every file written, after its last close, with clamd: its unix socket
    /// (clamd:///run/clamav/clamd.ctl) or TCP address (tcp://127.0.0.1:3310). An infected
    /// file is moved to /.quarantine at the volume's root and every open of it is refused
    /// (EACCES); the event goes to the log and the access log.
    #[arg(long, value_name = "URL", env = "UNKAI_SCAN")]
    scan: Option<String>,
    /// When clamd cannot answer: `open` leaves files written readable unscanned, `closed`
    /// refuses every open of them (EACCES) until clamd answers and finds them clean. Either
    /// way they are scanned again later.
    #[arg(long, value_enum, default_value_t = Fail::Open, env = "UNKAI_SCAN_FAIL")]
    scan_fail: Fail,
}

impl ScanArgs {
    /// The scanning asked for (None: off); a bad address is a one-line error.
    pub fn check(&self) -> anyhow::Result<Option<ScanConfig>> {
        let Some(url) = &self.scan else {
            return Ok(None);
        };
        Clamd::new(url).map_err(anyhow::Error::msg)?;
        Ok(Some(ScanConfig {
            url: url.clone(),
            fail: match self.scan_fail {
                Fail::Open => FailPolicy::Open,
                Fail::Closed => FailPolicy::Closed,
            },
        }))
    }
}
