//! The `proxy` module of `locksmith-testkit` (in `testkit/src/proxy.rs`), for test files that
//! include it as `#[path = "support/proxy.rs"] mod proxy;`.

#![allow(unused_imports)]

pub use locksmith_testkit::proxy::*;
