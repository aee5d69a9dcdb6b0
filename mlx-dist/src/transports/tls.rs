//! The job's TLS 1.3 identity, shared by the encrypted transports (the
//! ring over TLS, in `tls_link.rs`, and QUIC): the launcher creates one
//! self-signed certificate per job and gives every rank its DER and key
//! (`MLX_DIST_QUIC_CERT`, `MLX_DIST_QUIC_KEY`) and its SHA-256 fingerprint
//! (`MLX_DIST_QUIC_FINGERPRINT`), on ssh's standard input for remote ranks.
//! Both ends of every connection present that certificate and accept exactly
//! it (mutual TLS, pinned by fingerprint), so traffic is encrypted and only
//! the job's ranks can join.

use std::sync::{Arc, Once};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::config::QuicCert;

/// The name both ends use for the server (the certificate's subject).
pub(crate) const SERVER_NAME: &str = "mlx-dist";

/// Installs the process-wide rustls crypto provider (ring) once; a provider
/// installed earlier by someone else is left as it is. Our configurations name
/// their provider explicitly, so they never depend on the global one.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A fresh self-signed certificate for one job: (DER certificate, PKCS#8 DER key).
pub fn generate_job_certificate() -> std::result::Result<(Vec<u8>, Vec<u8>), String> {
    let ck = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
        .map_err(|e| e.to_string())?;
    Ok((ck.cert.der().to_vec(), ck.key_pair.serialize_der()))
}

/// SHA-256 of a DER certificate.
pub fn fingerprint(cert_der: &[u8]) -> [u8; 32] {
    Sha256::digest(cert_der).into()
}

/// Accepts exactly one certificate (by fingerprint), as server or client.
#[derive(Debug)]
struct PinnedCert {
    fingerprint: [u8; 32],
    algs: WebPkiSupportedAlgorithms,
}

impl PinnedCert {
    fn check(&self, cert: &CertificateDer<'_>) -> std::result::Result<(), rustls::Error> {
        if fingerprint(cert.as_ref()) == self.fingerprint {
            Ok(())
        } else {
            Err(rustls::Error::General(
                "certificate is not this job's (fingerprint differs)".into(),
            ))
        }
    }
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

impl ClientCertVerifier for PinnedCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// rustls configurations for both ends of a connection with the job's
/// certificate: TLS 1.3 only, each end presenting the certificate and
/// accepting only it; no session tickets (connections live as long as the job).
pub(crate) fn rustls_configs(
    id: &QuicCert,
) -> std::result::Result<(rustls::ServerConfig, rustls::ClientConfig), String> {
    let p = provider();
    let pinned = Arc::new(PinnedCert {
        fingerprint: id.fingerprint,
        algs: p.signature_verification_algorithms,
    });
    let chain = vec![CertificateDer::from(id.cert_der.clone())];
    let key = || PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(id.key_der.clone()));
    let e = |e: rustls::Error| e.to_string();
    let mut server = rustls::ServerConfig::builder_with_provider(p.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(e)?
        .with_client_cert_verifier(pinned.clone())
        .with_single_cert(chain.clone(), key())
        .map_err(e)?;
    server.send_tls13_tickets = 0;
    let client = rustls::ClientConfig::builder_with_provider(p)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(e)?
        .dangerous()
        .with_custom_certificate_verifier(pinned)
        .with_client_auth_cert(chain, key())
        .map_err(e)?;
    Ok((server, client))
}

/// A fresh job certificate, for tests.
#[cfg(test)]
pub(crate) fn test_certificate() -> QuicCert {
    let (cert_der, key_der) = generate_job_certificate().expect("rcgen");
    QuicCert {
        fingerprint: fingerprint(&cert_der),
        cert_der,
        key_der,
    }
}
