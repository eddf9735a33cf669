//! A private certificate authority for a real test cluster, made with the
//! openssl command (scripts/lib/deps.sh installs it): the CA kube-apiserver
//! trusts for clients and kube-controller-manager signs kubelets' CSRs with,
//! the API server's serving certificate, client certificates, and the
//! service-account key pair. P-256 keys: quick to make, and accepted by every
//! part (TLS, and ES256 service-account tokens).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

pub struct Pki {
    dir: PathBuf,
}

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct KeyPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    /// Makes the CA and the service-account keys in `dir`.
    pub fn create(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let this = Self {
            dir: dir.to_owned(),
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "30",
            "-subj",
            "/CN=crr-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            "-keyout",
            path(&this.ca().key)?,
            "-out",
            path(&this.ca().cert)?,
        ])?;
        let sa = this.dir.join("sa.key");
        openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            path(&sa)?,
        ])?;
        openssl(&[
            "pkey",
            "-in",
            path(&sa)?,
            "-pubout",
            "-out",
            path(&this.service_account_public())?,
        ])?;
        Ok(this)
    }

    pub fn ca(&self) -> KeyPair {
        KeyPair {
            cert: self.dir.join("ca.crt"),
            key: self.dir.join("ca.key"),
        }
    }

    pub fn service_account_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }

    pub fn service_account_public(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }

    /// A client certificate for user `user` in `groups`, named `name`.
    pub fn client(&self, name: &str, user: &str, groups: &[&str]) -> Result<KeyPair> {
        let mut subject = format!("/CN={user}");
        for group in groups {
            subject.push_str(&format!("/O={group}"));
        }
        self.issue(
            name,
            &subject,
            "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n",
        )
    }

    /// A serving certificate for the given IP addresses and DNS names.
    pub fn server(&self, name: &str, ips: &[&str], dns: &[&str]) -> Result<KeyPair> {
        let names: Vec<String> = ips
            .iter()
            .map(|ip| format!("IP:{ip}"))
            .chain(dns.iter().map(|d| format!("DNS:{d}")))
            .collect();
        self.issue(
            name,
            &format!("/CN={name}"),
            &format!(
                "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\nsubjectAltName={}\n",
                names.join(",")
            ),
        )
    }

    /// A new key and a certificate request for `subject`, named `name`:
    /// (key, request), for a signer of the cluster's.
    pub fn request(&self, name: &str, subject: &str) -> Result<(PathBuf, PathBuf)> {
        let key = self.dir.join(format!("{name}.key"));
        let csr = self.dir.join(format!("{name}.csr"));
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
            path(&key)?,
            "-out",
            path(&csr)?,
        ])?;
        Ok((key, csr))
    }

    fn issue(&self, name: &str, subject: &str, extensions: &str) -> Result<KeyPair> {
        let pair = KeyPair {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        };
        let (_, csr) = self.request(name, subject)?;
        let ext = self.dir.join(format!("{name}.ext"));
        fs::write(&ext, extensions)?;
        let ca = self.ca();
        openssl(&[
            "x509",
            "-req",
            "-in",
            path(&csr)?,
            "-CA",
            path(&ca.cert)?,
            "-CAkey",
            path(&ca.key)?,
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            path(&ext)?,
            "-out",
            path(&pair.cert)?,
        ])?;
        Ok(pair)
    }
}

fn path(p: &Path) -> Result<&str> {
    p.to_str().context("a non-UTF-8 temp path")
}

fn openssl(args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("run openssl: the test command (scripts/test.sh) installs it")?;
    if !out.status.success() {
        bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
