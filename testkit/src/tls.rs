//! Certificates for TLS tests, made with the `openssl` command: a test CA, a server
//! certificate for `127.0.0.1`/`localhost`, a client certificate, and the bad ones (another
//! CA, an expired server certificate, one for another host). EC P-256 keys, so generation is
//! fast (a few ms per certificate).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::names::unique_suffix;

/// A directory of PEM files made by [`TlsFiles::generate`]; removed on drop.
#[derive(Debug)]
pub struct TlsFiles {
    dir: PathBuf,
}

/// Which server certificate a TLS server presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCert {
    /// Valid, signed by the test CA, for `127.0.0.1` and `localhost`.
    Good,
    /// Signed by the test CA, for `127.0.0.1`, but its validity ended yesterday.
    Expired,
    /// Valid and signed by the test CA, but for the host `wrong.example` only.
    WrongHost,
}

impl TlsFiles {
    /// Makes a fresh set of keys and certificates in a temporary directory.
    ///
    /// # Panics
    /// If `openssl` is missing or fails.
    pub fn generate() -> TlsFiles {
        let dir = std::env::temp_dir().join(format!("locksmith-tls-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = TlsFiles { dir };
        files.ca("ca");
        files.ca("other-ca");
        let server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
                          basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n";
        files.leaf("server", "127.0.0.1", server_ext, "2");
        files.leaf("expired", "127.0.0.1", server_ext, "-1");
        files.leaf(
            "wrong-host",
            "wrong.example",
            "subjectAltName=DNS:wrong.example\nbasicConstraints=CA:FALSE\n\
             extendedKeyUsage=serverAuth\n",
            "2",
        );
        files.leaf(
            "client",
            "locksmith-client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
            "2",
        );
        files
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of `name` (e.g. `ca.crt`, `server.key`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The PEM bytes of `name`.
    pub fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }

    /// The test CA's certificate (PEM), the one every server and client certificate is
    /// signed by.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.pem("ca.crt")
    }

    /// Another CA's certificate (PEM), that signed nothing the servers present.
    pub fn other_ca_pem(&self) -> Vec<u8> {
        self.pem("other-ca.crt")
    }

    /// The client certificate and key (PEM) for mutual TLS.
    pub fn client_pem(&self) -> (Vec<u8>, Vec<u8>) {
        (self.pem("client.crt"), self.pem("client.key"))
    }

    /// The certificate and key files of a server certificate.
    pub fn server_files(&self, which: ServerCert) -> (PathBuf, PathBuf) {
        let stem = match which {
            ServerCert::Good => "server",
            ServerCert::Expired => "expired",
            ServerCert::WrongHost => "wrong-host",
        };
        (
            self.path(&format!("{stem}.crt")),
            self.path(&format!("{stem}.key")),
        )
    }

    fn ca(&self, stem: &str) {
        openssl(
            &self.dir,
            &[
                "req",
                "-x509",
                "-new",
                "-nodes",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-keyout",
                &format!("{stem}.key"),
                "-out",
                &format!("{stem}.crt"),
                "-days",
                "2",
                "-subj",
                &format!("/CN=locksmith test {stem}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }

    /// A certificate signed by the test CA; `days` may be negative (already expired).
    fn leaf(&self, stem: &str, cn: &str, ext: &str, days: &str) {
        std::fs::write(self.path(&format!("{stem}.ext")), ext).unwrap();
        openssl(
            &self.dir,
            &[
                "req",
                "-new",
                "-nodes",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-keyout",
                &format!("{stem}.key"),
                "-out",
                &format!("{stem}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{stem}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{stem}.crt"),
                "-days",
                days,
                "-extfile",
                &format!("{stem}.ext"),
            ],
        );
    }
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `openssl` (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
