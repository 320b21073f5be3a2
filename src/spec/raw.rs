//! The spec as written: every scalar keeps its YAML position so validation
//! errors can point at it. Enumerations are read as strings and checked in
//! `validate`, which lists the accepted values in its errors.

use serde::Deserialize;
use serde_saphyr::Spanned;

pub type S<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpec {
    pub version: S<u32>,
    #[serde(default)]
    pub max_total: Option<S<String>>,
    #[serde(default)]
    pub defaults: Option<RawDefaults>,
    pub mounts: S<Vec<RawMount>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    #[serde(default)]
    pub options: Option<S<Vec<S<String>>>>,
    #[serde(default)]
    pub huge: Option<S<String>>,
    #[serde(default)]
    pub noswap: Option<S<bool>>,
    #[serde(default)]
    pub seed: Option<S<String>>,
    #[serde(default)]
    pub on_failure: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMount {
    pub name: S<String>,
    pub path: S<String>,
    pub size: S<String>,
    #[serde(default)]
    pub inodes: Option<S<String>>,
    #[serde(default)]
    pub owner: Option<S<String>>,
    #[serde(default)]
    pub group: Option<S<String>>,
    #[serde(default)]
    pub mode: Option<S<String>>,
    #[serde(default)]
    pub create: Option<S<bool>>,
    #[serde(default)]
    pub takeover: Option<S<bool>>,
    #[serde(default)]
    pub options: Option<S<Vec<S<String>>>>,
    #[serde(default)]
    pub huge: Option<S<String>>,
    #[serde(default)]
    pub noswap: Option<S<bool>>,
    #[serde(default)]
    pub seed: Option<S<String>>,
    #[serde(default)]
    pub persist: Option<S<String>>,
    #[serde(default)]
    pub on_failure: Option<S<String>>,
    #[serde(default)]
    pub before: Option<S<Vec<S<String>>>>,
}
