//! Value parsers for the libraries' plain enums (`IndexKind`, `KvRole`, `GeneratedWorkload`, …):
//! the libraries do not depend on clap, so instead of `clap::ValueEnum` each enum has `ALL`,
//! `name` (and `help` where its variants are explained), and the flags here list and parse them
//! as `#[arg(value_enum)]` would.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

/// A parser accepting the names of `all`, listed in `--help` with their help, as
/// `#[arg(value_enum)]` lists a `ValueEnum`'s documented variants.
pub fn one_of<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: fn(T) -> &'static str,
) -> impl TypedValueParser<Value = T> {
    parser(all, name, Some(help))
}

/// A parser accepting the names of `all`, listed in `--help` as `[possible values: …]`, as
/// `#[arg(value_enum)]` lists a `ValueEnum`'s undocumented variants.
pub fn one_of_names<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
) -> impl TypedValueParser<Value = T> {
    parser(all, name, None)
}

fn parser<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: Option<fn(T) -> &'static str>,
) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(all.iter().map(move |&v| {
        let value = PossibleValue::new(name(v));
        match help {
            Some(help) => value.help(help(v)),
            None => value,
        }
    }))
    .try_map(move |s: String| {
        all.iter()
            .copied()
            .find(|&v| name(v) == s)
            .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::InvalidValue))
    })
}
