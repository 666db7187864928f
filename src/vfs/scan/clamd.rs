//! The clamd scanner: a file's bytes streamed to ClamAV's daemon with its INSTREAM command
//! (the `clamav-client` crate speaks the protocol), over its unix socket
//! (`clamd:///run/clamav/clamd.ctl`) or TCP (`tcp://127.0.0.1:3310`).
//!
//! Not for: what happens to an infected file (`vfs::scan`).

use std::path::PathBuf;

use super::{ScanError, Scanner, Verdict};

/// Where clamd listens.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Addr {
    Unix(PathBuf),
    Tcp(String),
}

/// A clamd to scan with.
pub struct Clamd {
    addr: Addr,
    rt: tokio::runtime::Runtime,
}

impl Clamd {
    /// From `clamd:///PATH` or `unix:///PATH` (its unix socket) or `tcp://HOST:PORT`; the
    /// error says what is accepted.
    pub fn new(url: &str) -> Result<Clamd, String> {
        let bad = || {
            format!(
                "invalid --scan '{url}': give clamd's unix socket as clamd:///run/clamav/clamd.ctl \
                 or its TCP address as tcp://127.0.0.1:3310"
            )
        };
        let addr = if let Some(p) = url
            .strip_prefix("clamd://")
            .or_else(|| url.strip_prefix("unix://"))
        {
            if !p.starts_with('/') {
                return Err(bad());
            }
            Addr::Unix(PathBuf::from(p))
        } else if let Some(a) = url.strip_prefix("tcp://") {
            let a = a.trim_end_matches('/');
            match a.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Addr::Tcp(a.into()),
                _ => return Err(bad()),
            }
        } else {
            return Err(bad());
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("cannot start the scanner's runtime: {e}"))?;
        Ok(Clamd { addr, rt })
    }

    /// Whether clamd answers PING.
    pub fn ping(&self) -> Result<(), ScanError> {
        use clamav_client::tokio as clam;
        let res = self.rt.block_on(async {
            match &self.addr {
                Addr::Unix(p) => clam::ping(clam::Socket { socket_path: p }).await,
                Addr::Tcp(a) => {
                    clam::ping(clam::Tcp {
                        host_address: a.as_str(),
                    })
                    .await
                }
            }
        });
        match res {
            Ok(r) if r == clamav_client::PONG => Ok(()),
            Ok(r) => Err(ScanError::Failed(self.describe(), answer(&r))),
            Err(e) => Err(ScanError::Unreachable(self.describe(), e)),
        }
    }
}

/// clamd's answer as text, without its terminating NUL.
fn answer(r: &[u8]) -> String {
    String::from_utf8_lossy(r)
        .trim_end_matches(['\0', '\n'])
        .to_string()
}

/// The verdict in clamd's answer to INSTREAM: `stream: OK`, `stream: NAME FOUND`, or an
/// error (`INSTREAM size limit exceeded. ERROR`, ...).
fn verdict(r: &str) -> Option<Verdict> {
    let r = r.strip_prefix("stream: ").unwrap_or(r);
    if r == "OK" {
        return Some(Verdict::Clean);
    }
    r.strip_suffix(" FOUND")
        .map(|sig| Verdict::Infected(sig.to_string()))
}

impl Scanner for Clamd {
    fn scan(
        &self,
        next: &mut dyn FnMut() -> Result<Option<Vec<u8>>, ScanError>,
    ) -> Result<Verdict, ScanError> {
        use clamav_client::tokio as clam;
        // The file is read here, on the caller's thread (reading may block on another
        // runtime), and streamed to clamd from a thread of the scanner's own runtime.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(2);
        let mut read_err = None;
        let res = std::thread::scope(|s| {
            let sender = s.spawn(|| {
                let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
                self.rt.block_on(async {
                    match &self.addr {
                        Addr::Unix(p) => {
                            let to = clam::Socket { socket_path: p };
                            clam::scan_stream(stream, to, Some(super::CHUNK)).await
                        }
                        Addr::Tcp(a) => {
                            let to = clam::Tcp {
                                host_address: a.as_str(),
                            };
                            clam::scan_stream(stream, to, Some(super::CHUNK)).await
                        }
                    }
                })
            });
            loop {
                let chunk = match next() {
                    Ok(Some(b)) => Ok(bytes::Bytes::from(b)),
                    Ok(None) => break,
                    Err(e) => {
                        read_err = Some(e);
                        Err(std::io::Error::other("reading the file failed"))
                    }
                };
                let failed = chunk.is_err();
                // clamd gone (the sender ended): its error is the sender's to tell.
                if tx.blocking_send(chunk).is_err() || failed {
                    break;
                }
            }
            drop(tx);
            sender
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the scanner's thread panicked")))
        });
        if let Some(e) = read_err {
            return Err(e);
        }
        match res {
            Ok(r) => {
                let r = answer(&r);
                verdict(&r).ok_or_else(|| ScanError::Failed(self.describe(), r))
            }
            Err(e) => Err(ScanError::Unreachable(self.describe(), e)),
        }
    }

    fn describe(&self) -> String {
        match &self.addr {
            Addr::Unix(p) => format!("clamd://{}", p.display()),
            Addr::Tcp(a) => format!("tcp://{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_answers() {
        assert_eq!(
            Clamd::new("clamd:///run/clamav/clamd.ctl").unwrap().addr,
            Addr::Unix("/run/clamav/clamd.ctl".into())
        );
        assert_eq!(
            Clamd::new("tcp://127.0.0.1:3310").unwrap().addr,
            Addr::Tcp("127.0.0.1:3310".into())
        );
        for bad in [
            "clamd://relative",
            "tcp://nohost",
            "tcp://:3310",
            "http://x:1",
            "",
        ] {
            let e = Clamd::new(bad).err().unwrap();
            assert!(e.contains("clamd:///run/clamav/clamd.ctl"), "{e}");
        }
        assert_eq!(verdict("stream: OK"), Some(Verdict::Clean));
        assert_eq!(
            verdict("stream: Eicar-Test-Signature FOUND"),
            Some(Verdict::Infected("Eicar-Test-Signature".into()))
        );
        assert_eq!(verdict("INSTREAM size limit exceeded. ERROR"), None);
        assert_eq!(answer(b"stream: OK\0"), "stream: OK");
    }
}
