//! Test certificates made at test time (rcgen): a CA, a server certificate it
//! signs for `localhost` and `127.0.0.1`, a client certificate it signs (mutual
//! TLS), and an unrelated CA to show that a
//! client trusting the wrong authority refuses the server. Written as PEM files in
//! a private directory (removed on drop), readable by the postgres user when the
//! tests run as root.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

pub struct TestPki {
    pub dir: PathBuf,
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
    pub client_cert_pem: String,
}

fn authority(name: &str) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params.self_signed(&key).expect("CA certificate"), key)
}

impl TestPki {
    pub fn new() -> Self {
        let (ca, ca_key) = authority("payment-worker test CA");
        let (wrong_ca, _) = authority("payment-worker unrelated CA");
        let server_key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server = params
            .signed_by(&server_key, &ca, &ca_key)
            .expect("server certificate");

        let client_key = KeyPair::generate().expect("client key");
        let mut params =
            CertificateParams::new(vec!["payment-worker".to_owned()]).expect("client params");
        params
            .distinguished_name
            .push(DnType::CommonName, "payment-worker");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client = params
            .signed_by(&client_key, &ca, &ca_key)
            .expect("client certificate");

        let dir = std::env::temp_dir().join(format!("pw-pki-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Self {
            dir,
            ca_pem: ca.pem(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
            client_cert_pem: client.pem(),
        };
        pki.write("ca.pem", &pki.ca_pem);
        pki.write("wrong-ca.pem", &wrong_ca.pem());
        pki.write("server.pem", &pki.server_cert_pem);
        pki.write("server.key", &pki.server_key_pem);
        pki.write("client.pem", &pki.client_cert_pem);
        pki.write("client.key", &client_key.serialize_pem());
        pki
    }

    fn write(&self, name: &str, contents: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.join(name);
        std::fs::write(&path, contents).unwrap();
        // Postgres refuses a key file readable by others.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn wrong_ca(&self) -> PathBuf {
        self.dir.join("wrong-ca.pem")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }

    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// Gives the files to `uid:gid` (a server that must read its own key).
    pub fn chown_all(&self, uid: u32, gid: u32) {
        for entry in std::fs::read_dir(&self.dir).unwrap().flatten() {
            std::os::unix::fs::chown(entry.path(), Some(uid), Some(gid)).unwrap();
        }
        std::os::unix::fs::chown(&self.dir, Some(uid), Some(gid)).unwrap();
    }

    /// A rustls server configuration presenting the server certificate.
    pub fn rustls_server(&self) -> Arc<rustls::ServerConfig> {
        self.server_config(false)
    }

    /// The same, also asking every client for a certificate this CA signed.
    pub fn rustls_server_requiring_clients(&self) -> Arc<rustls::ServerConfig> {
        self.server_config(true)
    }

    fn server_config(&self, client_auth: bool) -> Arc<rustls::ServerConfig> {
        let certs = rustls_pemfile_certs(&self.server_cert_pem);
        let key = rustls::pki_types::PrivateKeyDer::try_from(pem_der(
            &self.server_key_pem,
            "PRIVATE KEY",
        ))
        .expect("server key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("protocol versions");
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pemfile_certs(&self.ca_pem) {
                roots.add(cert).expect("CA root");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(builder.with_single_cert(certs, key).expect("server config"))
    }
}

fn pem_der(pem: &str, label: &str) -> Vec<u8> {
    let parsed = pem::parse(pem).expect("pem");
    assert!(
        parsed.tag().contains(label),
        "{} is not {label}",
        parsed.tag()
    );
    parsed.contents().to_vec()
}

fn rustls_pemfile_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    vec![rustls::pki_types::CertificateDer::from(pem_der(
        pem,
        "CERTIFICATE",
    ))]
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}
