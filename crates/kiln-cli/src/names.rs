//! A clap value parser for settings named by a fixed list (`--strategy`, `--schedule`): `--help`
//! lists the names, and a bad name gets the setting's own one-line error.

use std::ffi::OsStr;
use std::marker::PhantomData;
use std::str::FromStr;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::error::ErrorKind;

/// Parses a `T` by name with `T::from_str`, offering `names` in `--help`.
#[derive(Clone)]
pub struct Named<T> {
    names: &'static [&'static str],
    value: PhantomData<fn() -> T>,
}

impl<T> Named<T> {
    /// A parser offering `names`.
    pub fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            value: PhantomData,
        }
    }
}

impl<T> TypedValueParser for Named<T>
where
    T: FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let flag = arg.map_or_else(String::new, |a| format!("--{}: ", a.get_id()));
        let text = value.to_string_lossy();
        text.parse().map_err(|reason: String| {
            clap::Error::raw(ErrorKind::InvalidValue, format!("{flag}{reason}\n")).with_cmd(cmd)
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.names.iter().map(|n| PossibleValue::new(*n))))
    }
}

/// The `--schedule` parser: `gpipe` or `1f1b`, listed in `--help`.
pub fn schedule_parser() -> Named<kiln_core::strategy::Schedule> {
    const NAMES: [&str; 2] = kiln_core::strategy::Schedule::ALL_NAMES;
    Named::new(&NAMES)
}

/// The `--shard-state` parser: `none`, `optimizer`, `gradients` or `parameters`, listed in
/// `--help`.
pub fn shard_state_parser() -> Named<kiln_core::strategy::ShardState> {
    const NAMES: [&str; 4] = kiln_core::strategy::ShardState::ALL_NAMES;
    Named::new(&NAMES)
}

/// The `--strategy` parser: the names `StrategyKind` knows, listed in `--help`.
pub fn strategy_parser() -> Named<kiln_core::strategy::StrategyKind> {
    const NAMES: [&str; 6] = kiln_core::strategy::StrategyKind::ALL_NAMES;
    Named::new(&NAMES)
}

/// The `--nan-policy` parser: `skip` or `halt`, listed in `--help`.
pub fn nan_policy_parser() -> Named<kiln_core::optim::NanPolicy> {
    const NAMES: [&str; 2] = kiln_core::optim::NanPolicy::ALL_NAMES;
    Named::new(&NAMES)
}

/// The `--precision` parser: `f32`, `bf16` or `f16`, listed in `--help`.
pub fn precision_parser() -> Named<kiln_core::optim::Precision> {
    const NAMES: [&str; 3] = kiln_core::optim::Precision::ALL_NAMES;
    Named::new(&NAMES)
}
