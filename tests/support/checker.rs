//! The `checker` module of `locksmith-testkit` (in `testkit/src/checker.rs`), for test files that
//! include it as `#[path = "support/checker.rs"] mod checker;`.

#![allow(unused_imports)]

pub use locksmith_testkit::checker::*;
