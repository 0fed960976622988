//! The insides of `locksmith`, the operator's command-line tool of the locksmith library:
//! the command line ([`args`]), the exit codes ([`exit`]), what is shown as plain data
//! ([`model`]) and how ([`render`]), `unlock`'s choice and confirmation ([`prompt`]), and
//! `watch`'s loop ([`watch`]) and release-channel listener ([`listen`]).
//!
//! The binary (`src/main.rs`) connects through the library and runs the commands with
//! these; everything here but [`listen`] works on plain data and is tested without a server.

pub mod args;
pub mod exit;
pub mod listen;
pub mod model;
pub mod prompt;
pub mod render;
pub mod watch;
