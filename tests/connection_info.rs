//! What `Client::open` and `Client::builder` take besides a `&str` URL: a `String`, a
//! `&String`, a `redis::ConnectionInfo` (with its password and database used), an address and
//! a `(host, port)` pair; and a server that cannot be used, reported by `build()` as a bad
//! URL is.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{RedisServer, unique_name};
use locksmith::{Client, Error};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

/// A lock taken and released through `client`.
fn locks(client: &Client) {
    let m = client.mutex(&unique_name("info")).unwrap();
    let g = m.lock().unwrap();
    assert!(m.is_locked().unwrap());
    g.unlock().unwrap();
    assert!(!m.is_locked().unwrap());
}

#[test]
fn a_string_and_a_connection_info_take_a_lock() {
    let server = RedisServer::start();
    let url: String = server.url();
    locks(&Client::open(&url).unwrap());
    locks(&Client::builder(url.clone()).build().unwrap());
    locks(&Client::open(url).unwrap());
    locks(&Client::open(("127.0.0.1", server.port())).unwrap());
    locks(&Client::open(ConnectionAddr::Tcp("127.0.0.1".into(), server.port())).unwrap());

    // A password and a database, as a program that has its redis settings already gives them.
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("info-pw")
        .exec(&mut server.conn())
        .unwrap();
    let info = ConnectionAddr::Tcp("127.0.0.1".into(), server.port())
        .into_connection_info()
        .unwrap()
        .set_redis_settings(
            RedisConnectionInfo::default()
                .set_password("info-pw")
                .set_db(3),
        );
    let client = Client::builder(info.clone())
        .key_prefix("info:")
        .build()
        .unwrap();
    locks(&client);
    // The lock lives in database 3.
    let m = client.mutex("in-db-3").unwrap();
    let _g = m.lock().unwrap();
    let mut db3 = redis::Client::open(info).unwrap().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("info:*").query(&mut db3).unwrap();
    assert!(keys.iter().any(|k| k.contains("in-db-3")), "{keys:?}");

    // A wrong password in a ConnectionInfo is the server's refusal, as in a URL.
    let wrong = ConnectionAddr::Tcp("127.0.0.1".into(), server.port())
        .into_connection_info()
        .unwrap()
        .set_redis_settings(RedisConnectionInfo::default().set_password("wrong"));
    let e = Client::open(wrong).unwrap_err();
    assert!(!e.is_invalid_config(), "{e:?}");
}

/// A bad URL, as a `String` too, and a `ConnectionInfo` that names no usable server: the
/// builder is made, and `build()` (or `open`) returns `InvalidUrl`, naming the bad part.
#[test]
fn an_unusable_server_is_reported_by_build() {
    let b = Client::builder(String::from("redis://127.0.0.1:notaport/"));
    let e = b.build().unwrap_err();
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
    assert!(e.to_string().contains("port `notaport`"), "{e}");
    let e = Client::open("http://127.0.0.1/").unwrap_err();
    assert!(e.to_string().contains("scheme `http`"), "{e}");
    let no_port = ConnectionAddr::Tcp("127.0.0.1".into(), 0)
        .into_connection_info()
        .unwrap();
    let e = Client::open(no_port).unwrap_err();
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
    assert!(e.to_string().contains("port `0`"), "{e}");
    let no_host = ConnectionAddr::Tcp(String::new(), 6379);
    let e = Client::builder(no_host).build().unwrap_err();
    assert!(e.to_string().contains("host is missing"), "{e}");
}
