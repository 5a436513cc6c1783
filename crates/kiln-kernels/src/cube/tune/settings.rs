//! Whether the matmul tuner times products, for how long, and where it keeps its choices: read
//! from the environment (`KILN_MATMUL_TUNE`, `KILN_MATMUL_TUNE_SECONDS`, `KILN_CACHE_DIR`) or
//! given by [`super::configure`].

use std::path::PathBuf;
use std::time::Duration;

/// The variable that turns the tuner on or off: `auto`, `always` or `off`.
pub const MODE_VAR: &str = "KILN_MATMUL_TUNE";
/// The variable that bounds the seconds one run spends timing products.
pub const SECONDS_VAR: &str = "KILN_MATMUL_TUNE_SECONDS";
/// The variable that names Kiln's cache folder (the tuner's choices go in `matmul/` in it).
pub const CACHE_VAR: &str = "KILN_CACHE_DIR";
/// What one run may spend timing products when nothing says otherwise: the first step of a
/// fine-tuning run stays within a few seconds, and later runs time what this one did not reach.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(3);

/// Which devices the tuner times products on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// CUDA devices only (see [`super::DeviceIdentity::tuned_by_default`]).
    Auto,
    /// Every device, CPU ones included.
    Always,
    /// None: every product runs Burn's default.
    Off,
}

/// The tuner's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Which devices are tuned.
    pub mode: Mode,
    /// The most one process spends timing products, over all devices.
    pub budget: Duration,
    /// The folder whose `matmul/` holds the choices between runs; `None` keeps them in memory.
    pub cache_dir: Option<PathBuf>,
}

/// A tuner setting in the environment that is not one.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SettingsError {
    /// `KILN_MATMUL_TUNE` is not a mode.
    #[error(
        "{MODE_VAR}={0:?} is not a mode of the matmul tuner: use `auto` (the default: time \
         products on CUDA devices), `always` or `off`"
    )]
    Mode(String),
    /// `KILN_MATMUL_TUNE_SECONDS` is not a number of seconds.
    #[error(
        "{SECONDS_VAR}={0:?} is not a number of seconds: give the most one run may spend \
         timing products, e.g. `3` (the default) or `0.5`"
    )]
    Seconds(String),
}

impl Settings {
    /// The settings the environment gives, defaults where it says nothing.
    pub fn from_env() -> Result<Self, SettingsError> {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Self::parse(var(MODE_VAR), var(SECONDS_VAR), default_cache_dir())
    }

    /// The settings given by a mode's and a budget's text (`None`: the defaults).
    pub fn parse(
        mode: Option<String>,
        seconds: Option<String>,
        cache_dir: Option<PathBuf>,
    ) -> Result<Self, SettingsError> {
        let mode = match mode.as_deref().map(str::trim) {
            None | Some("auto") => Mode::Auto,
            Some("always") => Mode::Always,
            Some("off") => Mode::Off,
            Some(_) => return Err(SettingsError::Mode(mode.unwrap_or_default())),
        };
        let budget = match seconds {
            None => DEFAULT_BUDGET,
            Some(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .ok_or(SettingsError::Seconds(text))?,
        };
        Ok(Self {
            mode,
            budget,
            cache_dir,
        })
    }

    /// Settings that never tune: Burn's default everywhere.
    pub fn off() -> Self {
        Self {
            mode: Mode::Off,
            budget: Duration::ZERO,
            cache_dir: None,
        }
    }
}

/// `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else `$HOME/.cache/kiln`.
fn default_cache_dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    var(CACHE_VAR)
        .map(PathBuf::from)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("kiln")))
        .or_else(|| var("HOME").map(|d| PathBuf::from(d).join(".cache").join("kiln")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_budgets_parse_and_bad_ones_say_what_to_use() {
        let parse = |m: Option<&str>, s: Option<&str>| {
            Settings::parse(m.map(Into::into), s.map(Into::into), None)
        };
        let default = parse(None, None).unwrap();
        assert_eq!((default.mode, default.budget), (Mode::Auto, DEFAULT_BUDGET));
        assert_eq!(parse(Some("always"), None).unwrap().mode, Mode::Always);
        assert_eq!(parse(Some(" off "), None).unwrap().mode, Mode::Off);
        let half = parse(None, Some("0.5")).unwrap().budget;
        assert_eq!(half, Duration::from_millis(500));
        let err = parse(Some("yes"), None).unwrap_err().to_string();
        assert!(
            err.contains("KILN_MATMUL_TUNE=\"yes\"") && err.contains("`off`"),
            "{err}"
        );
        for bad in ["-1", "soon", "NaN"] {
            let err = parse(None, Some(bad)).unwrap_err();
            assert_eq!(err, SettingsError::Seconds(bad.into()));
        }
    }
}
