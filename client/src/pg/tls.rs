//! TLS for the PostgreSQL engines, with libpq's `sslmode` meanings, over
//! rustls (ring): `disable`, `allow`/`prefer` (TLS if the server offers it),
//! `require` (TLS, the certificate not checked — unless `sslrootcert` is
//! given, which makes it `verify-ca`, as in libpq), `verify-ca` (the chain
//! checked against the root certificates, not the host name) and
//! `verify-full` (chain and host name). The roots are `sslrootcert` (a PEM
//! file) or the system's. tokio-postgres itself parses `sslmode` only up to
//! `require`, so both parameters are taken out of the URL here.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{Error, Result};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// A URL with its TLS parameters taken out.
#[derive(Debug)]
pub(crate) struct TlsUrl {
    pub url: String,
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
}

fn mode_of(v: &str) -> Result<SslMode> {
    Ok(match v {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(Error::Config(format!(
                "sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            )));
        }
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Takes `sslmode` and `sslrootcert` out of a URL (`postgresql://…?k=v&…`)
/// or a key=value string. The default mode is `prefer`, as in libpq.
pub(crate) fn split(url: &str) -> Result<TlsUrl> {
    let mut mode = SslMode::Prefer;
    let mut root_cert = None;
    let mut take = |k: &str, v: &str| -> Result<bool> {
        match k {
            "sslmode" => {
                mode = mode_of(v)?;
                Ok(true)
            }
            "sslrootcert" => {
                root_cert = Some(PathBuf::from(v));
                Ok(true)
            }
            _ => Ok(false),
        }
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    if !take(k, &percent_decode(v))? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for tok in url.split_whitespace() {
            let (k, v) = tok.split_once('=').unwrap_or((tok, ""));
            if !take(k, v.trim_matches('\''))? {
                kept.push(tok);
            }
        }
        kept.join(" ")
    };
    if root_cert.is_some() && mode == SslMode::Require {
        mode = SslMode::VerifyCa;
    }
    Ok(TlsUrl {
        url: rest,
        mode,
        root_cert,
    })
}

/// What tokio-postgres should do for `mode`.
pub(crate) fn driver_mode(mode: SslMode) -> tokio_postgres::config::SslMode {
    match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    }
}

fn roots(file: Option<&PathBuf>) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match file {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| {
                    Error::Config(format!("cannot read sslrootcert {}: {e}", path.display()))
                })?
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| {
                    Error::Config(format!(
                        "bad certificate in sslrootcert {}: {e}",
                        path.display()
                    ))
                })?;
            if certs.is_empty() {
                return Err(Error::Config(format!(
                    "sslrootcert {} holds no certificate",
                    path.display()
                )));
            }
            for c in certs {
                store.add(c).map_err(|e| {
                    Error::Config(format!("unusable certificate in {}: {e}", path.display()))
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = store.add(c);
            }
            if store.is_empty() {
                return Err(Error::Config(
                    "sslmode verify-ca/verify-full needs root certificates: give sslrootcert=<PEM file> (no system roots were found)".into(),
                ));
            }
        }
    }
    Ok(store)
}

/// The TLS connector for `mode`.
pub(crate) fn connector(t: &TlsUrl) -> Result<MakeRustlsConnect> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS setup: {e}")))?;
    let config = match t.mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require if t.root_cert.is_none() => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth(),
        SslMode::VerifyFull => builder
            .with_root_certificates(roots(t.root_cert.as_ref())?)
            .with_no_client_auth(),
        _ => {
            let inner = WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(t.root_cert.as_ref())?),
                provider.clone(),
            )
            .build()
            .map_err(|e| Error::Config(format!("TLS setup: {e}")))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
                .with_no_client_auth()
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// `require` without a root certificate: encryption, no verification
/// (libpq's meaning; `verify-full` is the mode that resists a
/// man-in-the-middle).
#[derive(Debug)]
struct NoVerify(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not
/// checked.
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
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_come_out_of_urls_and_keyword_strings() {
        let t = split("postgresql://u@h:5432/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x").unwrap();
        assert_eq!(t.mode, SslMode::VerifyFull);
        assert_eq!(
            t.root_cert.as_deref(),
            Some(std::path::Path::new("/tmp/ca.pem"))
        );
        assert_eq!(t.url, "postgresql://u@h:5432/db?application_name=x");
        let t = split("host=h dbname=db sslmode=require sslrootcert=/ca.pem").unwrap();
        assert_eq!(
            t.mode,
            SslMode::VerifyCa,
            "a root certificate makes require verify the chain, as in libpq"
        );
        assert_eq!(t.url, "host=h dbname=db");
        let t = split("postgresql://u@h/db").unwrap();
        assert_eq!(
            (t.mode, t.url.as_str()),
            (SslMode::Prefer, "postgresql://u@h/db")
        );
        assert!(matches!(
            split("postgresql://h/db?sslmode=bogus"),
            Err(Error::Config(_))
        ));
    }
}
