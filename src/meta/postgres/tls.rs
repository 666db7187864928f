//! TLS to PostgreSQL, with libpq's `sslmode` semantics, on rustls (ring provider):
//! - `disable`: plain; `allow` and `prefer`: TLS when the server offers it, else plain, the
//!   certificate unchecked (`allow` tries TLS first too, unlike libpq);
//! - `require`: TLS, the certificate unchecked, unless a root is given (`sslrootcert` or
//!   `PGSSLROOTCERT`): then as `verify-ca`;
//! - `verify-ca`: the chain must lead to a trusted root; `verify-full`: and name the host.
//!
//! The roots: the PEM file of `sslrootcert` (or `PGSSLROOTCERT`), else (and for
//! `sslrootcert=system`) the system's, as rustls-native-certs finds them. A client certificate
//! comes from `sslcert` and `sslkey`. Unix sockets never use TLS (as libpq).
//!
//! Not for: connecting (postgres.rs, postgres_watch.rs take the [`Tls`] made here).

use std::path::Path;
use std::sync::Arc;

use ::postgres::config::SslMode;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::url::PgUrl;

/// What a connection is given to speak TLS (cheap to clone: the configuration is shared).
pub type Tls = MakeRustlsConnect;

/// How the connections to one URL speak TLS.
#[derive(Clone)]
pub struct TlsPlan {
    pub mode: SslMode,
    pub connector: Tls,
    /// What the certificate is checked against, for messages: `sslrootcert=...`, "the
    /// system's roots", or None when it is not checked.
    pub roots: Option<String>,
    /// `sslmode=...` as the URL says.
    sslmode: String,
    host: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsPlan {
    /// The plan for `u`; an error (one line) names the file that cannot be used.
    pub fn new(u: &PgUrl) -> Result<TlsPlan, String> {
        let rootcert = u.sslrootcert.clone().or_else(|| {
            std::env::var("PGSSLROOTCERT")
                .ok()
                .filter(|v| !v.is_empty())
        });
        let unix = u.host.starts_with('/');
        let (mode, check) = match u.sslmode.as_str() {
            _ if unix => (SslMode::Disable, Check::Nothing),
            "disable" => (SslMode::Disable, Check::Nothing),
            "allow" | "prefer" => (SslMode::Prefer, Check::Nothing),
            "require" if rootcert.is_none() => (SslMode::Require, Check::Nothing),
            "require" | "verify-ca" => (SslMode::Require, Check::Chain),
            "verify-full" => (SslMode::Require, Check::ChainAndName),
            other => return Err(format!("unknown sslmode '{other}'")),
        };
        if rootcert.as_deref() == Some("system") && u.sslmode != "verify-full" && !unix {
            return Err(format!(
                "weak sslmode={} may not be used with sslrootcert=system (PGSSLROOTCERT); use \
                 sslmode=verify-full",
                u.sslmode
            ));
        }
        let provider = provider();
        let (verifier, roots): (Arc<dyn ServerCertVerifier>, _) = if check == Check::Nothing {
            (
                Arc::new(NoCheck(provider.signature_verification_algorithms)),
                None,
            )
        } else {
            let (store, what) = match rootcert.as_deref() {
                Some(path) if path != "system" => {
                    (load_roots(Path::new(path))?, format!("sslrootcert={path}"))
                }
                _ => (system_roots()?, "the system's roots".to_string()),
            };
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
                    .build()
                    .map_err(|e| format!("cannot use the roots of {what}: {e}"))?;
            let v: Arc<dyn ServerCertVerifier> = if check == Check::Chain {
                Arc::new(ChainOnly(webpki))
            } else {
                webpki
            };
            (v, Some(what))
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&u.sslcert, &u.sslkey) {
            (Some(cert), Some(key)) => {
                let certs = read_pem_certs(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    format!(
                        "sslkey={}: cannot read a PEM private key ({e})",
                        key.display()
                    )
                })?;
                builder.with_client_auth_cert(certs, key).map_err(|e| {
                    format!(
                        "sslcert={} with sslkey={}: {e}",
                        cert.display(),
                        key_name(u)
                    )
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(TlsPlan {
            mode,
            connector: MakeRustlsConnect::new(config),
            roots,
            sslmode: u.sslmode.clone(),
            host: u.host.clone(),
        })
    }

    /// A one-line explanation of a connection that failed for a reason of TLS (None for any
    /// other reason), saying what to do.
    pub fn explain(&self, e: &::postgres::Error) -> Option<String> {
        let mode = &self.sslmode;
        let roots = self.roots.as_deref().unwrap_or("no roots");
        let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(s) = src {
            if s.to_string() == "server does not support TLS" {
                return Some(format!(
                    "the server does not accept TLS connections (sslmode={mode}); turn ssl on \
                     in the server, or use sslmode=prefer or disable on a trusted network"
                ));
            }
            let tls = s.downcast_ref::<rustls::Error>().or_else(|| {
                s.downcast_ref::<std::io::Error>()
                    .and_then(|io| io.get_ref())
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            });
            if let Some(t) = tls {
                return Some(self.explain_rustls(t, roots));
            }
            src = s.source();
        }
        None
    }

    fn explain_rustls(&self, t: &rustls::Error, roots: &str) -> String {
        let mode = &self.sslmode;
        match t {
            rustls::Error::InvalidCertificate(c) => match c {
                // BadSignature: a root of the issuer's name, but not the key that signed it.
                CertificateError::UnknownIssuer | CertificateError::BadSignature => format!(
                    "the server's certificate is not signed by a trusted root ({roots}, \
                     sslmode={mode}); give the CA that signed it with sslrootcert=/path/ca.pem"
                ),
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => format!(
                    "the server's certificate is not valid for the host '{}' (sslmode={mode}); \
                     connect by a name or address it lists, or use sslmode=verify-ca",
                    self.host
                ),
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => format!(
                    "the server's certificate has expired (sslmode={mode}); renew it on the \
                     server"
                ),
                other => format!(
                    "the server's certificate is refused ({other:?}; {roots}, \
                     sslmode={mode})"
                ),
            },
            other => format!("the TLS handshake failed ({other}; sslmode={mode})"),
        }
    }
}

fn key_name(u: &PgUrl) -> String {
    u.sslkey
        .as_deref()
        .map(|k| k.display().to_string())
        .unwrap_or_default()
}

fn read_pem_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "{what}={}: cannot read PEM certificates ({e})",
                path.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{what}={}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    for c in read_pem_certs(path, "sslrootcert")? {
        store.add(c).map_err(|e| {
            format!(
                "sslrootcert={}: a certificate in it cannot be a root ({e})",
                path.display()
            )
        })?;
    }
    Ok(store)
}

fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return Err(format!(
            "no system roots found to check the server's certificate{why}; install \
             ca-certificates or give the CA with sslrootcert=/path/ca.pem"
        ));
    }
    Ok(store)
}

/// `sslmode=require` (no root given), `prefer`, `allow`: any certificate, but the handshake
/// itself must be signed by its key.
#[derive(Debug)]
struct NoCheck(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain is checked (webpki checks it before the name), a name that
/// does not match is let through.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
