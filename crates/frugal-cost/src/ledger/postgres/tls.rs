//! TLS to PostgreSQL as libpq's URL parameters ask for it, through rustls.
//!
//! `sslmode=require`, `verify-ca` and `verify-full` all connect over TLS and check the
//! server's certificate and name: rustls has no unchecked mode, and a ledger that bills is
//! not worth a man in the middle (libpq's `require` alone would not check). The roots are
//! the Web PKI's, or with `sslrootcert=FILE` the PEM certificates in that file only, as
//! libpq reads it: what a private CA (Amazon RDS's bundle, a company's own) needs.
//! `sslrootcert=system` names the Web PKI's roots explicitly. The parameter is taken out of
//! the URL before the client parses it, as the client does not know it.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

/// What the URL asks of TLS, and the URL left for the client to parse.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TlsParams {
    /// The URL without `sslrootcert`, its `sslmode` one the client knows.
    pub url: String,
    /// `sslmode` was given: without it, TLS is off (libpq's default `prefer` would try TLS
    /// against roots it cannot know).
    pub asked: bool,
    /// `sslrootcert=FILE`, not `system`.
    pub roots: Option<PathBuf>,
}

/// Splits libpq's TLS parameters out of a URL's query.
pub(super) fn params(url: &str) -> TlsParams {
    // The query starts after the user part: a password may hold a raw `?`.
    let (head, query) = crate::secret_url::SecretUrl::parse(url).split_query();
    let Some(query) = query else {
        return TlsParams {
            url: url.to_owned(),
            asked: false,
            roots: None,
        };
    };
    let mut asked = false;
    let mut roots = None;
    let kept: Vec<String> = query
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "sslrootcert" => {
                    roots = (v != "system").then(|| PathBuf::from(percent_decode(v)));
                    None
                }
                "sslmode" => {
                    asked = true;
                    // The client knows disable, prefer and require; it checks as verify-full.
                    Some(match v {
                        "verify-ca" | "verify-full" => "sslmode=require".to_owned(),
                        _ => kv.to_owned(),
                    })
                }
                _ => Some(kv.to_owned()),
            }
        })
        .collect();
    let url = if kept.is_empty() {
        head.to_owned()
    } else {
        format!("{head}?{}", kept.join("&"))
    };
    TlsParams { url, asked, roots }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Rustls over aws-lc-rs (the provider the workspace's HTTP client builds), trusting the
/// Web PKI's roots, or the certificates of `roots`.
pub(super) fn connector(roots: Option<&PathBuf>) -> Result<MakeRustlsConnect, String> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        None => {
            store.add_parsable_certificates(
                webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned(),
            );
        }
        Some(path) => {
            let shown = path.display();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect())
                .map_err(|e| format!("cannot read sslrootcert {shown}: {e}"))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "sslrootcert {shown} holds no certificate (PEM, -----BEGIN CERTIFICATE-----)"
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(store)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn libpq_parameters_are_taken_out_of_the_url() {
        let p = params(
            "postgres://u:pw@db/l?sslmode=verify-full&sslrootcert=%2Fetc%2Frds.pem&application_name=x",
        );
        assert_eq!(
            p.url,
            "postgres://u:pw@db/l?sslmode=require&application_name=x"
        );
        assert!(p.asked);
        assert_eq!(p.roots, Some(PathBuf::from("/etc/rds.pem")));
        let p = params("postgres://db/l?sslrootcert=system&sslmode=require");
        assert_eq!(
            (p.url.as_str(), p.roots),
            ("postgres://db/l?sslmode=require", None)
        );
        let p = params("postgres://db/l");
        assert_eq!((p.url.as_str(), p.asked), ("postgres://db/l", false));
    }

    #[test]
    fn a_root_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = connector(Some(&path)).err().unwrap();
        assert!(err.contains("holds no certificate"), "{err}");
        let err = connector(Some(&dir.path().join("missing.pem")))
            .err()
            .unwrap();
        assert!(err.contains("cannot read sslrootcert"), "{err}");
    }
}

#[cfg(test)]
mod server_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::Path;
    use std::process::Command;

    use crate::Ledger;
    use crate::ledger::Location;
    use frugal_testkit::postgres::Server;

    /// A CA, and a certificate it signed for 127.0.0.1 and localhost, made by `openssl`.
    fn certificates(dir: &Path, name: &str) {
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .current_dir(dir)
                .args(args)
                .output()
                .expect("openssl is needed for this test (Debian: apt-get install openssl)");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        // A new P-256 key in `key`, and a request (or with `-x509`, a certificate) for it.
        let new_key = |key: &str, out: &str, subject: &str, extra: &[&str]| {
            let mut args = vec!["req"];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]);
            args.extend_from_slice(&["-nodes", "-keyout", key, "-out", out, "-subj", subject]);
            run(&args);
        };
        let ca = format!("{name}-ca");
        new_key(
            &format!("{ca}.key"),
            &format!("{ca}.pem"),
            &format!("/CN={ca}"),
            &["-x509", "-days", "2"],
        );
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        new_key(
            &format!("{name}.key"),
            &format!("{name}.csr"),
            "/CN=localhost",
            &[],
        );
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            &format!("{name}.crt"),
        ]);
    }

    #[test]
    fn a_private_ca_is_trusted_through_sslrootcert_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        certificates(dir.path(), "server");
        certificates(dir.path(), "other");
        let server = Server::start().unwrap();
        let url = server.database().unwrap();
        server
            .require_tls(
                &dir.path().join("server.crt"),
                &dir.path().join("server.key"),
            )
            .unwrap();
        let root = |ca: &str| {
            dir.path()
                .join(format!("{ca}-ca.pem"))
                .display()
                .to_string()
        };

        let trusted = format!("{url}?sslmode=verify-full&sslrootcert={}", root("server"));
        let ledger = Ledger::open(Location::parse(&trusted)).expect("TLS with the private CA");
        assert_eq!(ledger.info().unwrap().events, 0);

        // The server's certificate chains to neither the Web PKI nor another CA; and without
        // sslmode, TLS is not tried, which the server refuses.
        for refused in [
            format!("{url}?sslmode=require"),
            format!("{url}?sslmode=require&sslrootcert={}", root("other")),
            url.clone(),
        ] {
            let err = Ledger::open(Location::parse(&refused)).err().unwrap();
            let text = format!("{err:#}");
            assert!(!text.contains(frugal_testkit::postgres::PASSWORD), "{text}");
        }
    }
}
