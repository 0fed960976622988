//! A build without the default feature `tls` (`--no-default-features`): `build()` refuses
//! every TLS setting before any I/O, with `InvalidConfig` naming the feature. With the feature,
//! `tests/tls.rs` covers TLS. CI runs this file with `--no-default-features`.

#![cfg(not(feature = "tls"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use locksmith::Client;

/// Nothing listens on port 1: an error other than the feature's would mean a connection was
/// tried.
const NOWHERE: &str = "redis://127.0.0.1:1/";

fn assert_needs_tls(e: locksmith::Error) {
    assert!(e.is_invalid_config(), "{e:?}");
    assert!(e.to_string().contains("`tls` feature"), "{e}");
}

#[test]
fn rediss_urls_need_the_tls_feature() {
    assert_needs_tls(Client::open("rediss://127.0.0.1:1/").unwrap_err());
    assert_needs_tls(Client::open("valkeys://127.0.0.1:1/").unwrap_err());
    assert_needs_tls(
        Client::cluster(["rediss://127.0.0.1:1/"])
            .build()
            .unwrap_err(),
    );
    assert_needs_tls(
        Client::redlock([
            "rediss://127.0.0.1:1/",
            "rediss://127.0.0.1:2/",
            "rediss://127.0.0.1:3/",
        ])
        .build()
        .unwrap_err(),
    );
}

#[test]
fn certificates_need_the_tls_feature() {
    let pem = b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".to_vec();
    assert_needs_tls(
        Client::builder(NOWHERE)
            .tls_root_cert(pem.clone())
            .build()
            .unwrap_err(),
    );
    assert_needs_tls(
        Client::builder(NOWHERE)
            .tls_client_cert(pem.clone(), pem)
            .build()
            .unwrap_err(),
    );
}
