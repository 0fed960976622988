//! `locksmith`: the operator's command-line tool of the locksmith library. The command line
//! is parsed here; the commands are run through the library in the next step.

use clap::Parser;

fn main() {
    let _ = locksmith_cli::args::Cli::parse();
}
