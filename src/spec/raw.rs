//! The spec as written: every scalar keeps its YAML position so validation
//! errors can point at it. Enumerations are read as strings and checked in
//! `validate`, which lists the accepted values in its errors.

use serde::{Deserialize, Deserializer};
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
    #[serde(default)]
    pub agent: Option<RawAgent>,
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
    #[serde(default)]
    pub watchdog: Option<RawWatchdog>,
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
    #[serde(default)]
    pub watchdog: Option<RawWatchdog>,
}

/// `watchdog:` of a mount or of `defaults`; a mount's fields override the
/// defaults' one by one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWatchdog {
    #[serde(default)]
    pub warn: Option<S<String>>,
    #[serde(default)]
    pub high: Option<S<String>>,
    #[serde(default)]
    pub low: Option<S<String>>,
    #[serde(default)]
    pub inodes: Option<RawThresholds>,
    #[serde(default)]
    pub action: Option<S<NameList>>,
    #[serde(default)]
    pub grow_step: Option<S<String>>,
    #[serde(default)]
    pub max_size: Option<S<String>>,
    #[serde(default)]
    pub reoffload_after: Option<S<String>>,
    #[serde(default)]
    pub pressure: Option<S<NameList>>,
    #[serde(default)]
    pub priority: Option<S<u32>>,
    #[serde(default)]
    pub evict_group: Option<S<String>>,
}

/// Inode thresholds; unset ones follow the byte thresholds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawThresholds {
    #[serde(default)]
    pub warn: Option<S<String>>,
    #[serde(default)]
    pub high: Option<S<String>>,
    #[serde(default)]
    pub low: Option<S<String>>,
}

/// Top-level `agent:`: settings only `tmpfsctl agent` reads.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAgent {
    #[serde(default)]
    pub interval: Option<S<String>>,
    #[serde(default)]
    pub metrics: Option<S<String>>,
    #[serde(default)]
    pub min_available: Option<S<String>>,
    #[serde(default)]
    pub max_pressure: Option<S<String>>,
    #[serde(default)]
    pub grow_floor: Option<S<String>>,
    #[serde(default)]
    pub cooldown: Option<S<String>>,
}

/// A name or a list of names (`action: evict`, `action: [grow, evict]`).
/// Elements of a list keep their own positions; a single name is located by
/// the enclosing `Spanned`.
#[derive(Debug, Clone, PartialEq)]
pub enum NameList {
    One(String),
    Many(Vec<S<String>>),
}

impl<'de> Deserialize<'de> for NameList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = NameList;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a name or a list of names")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<NameList, E> {
                Ok(NameList::One(s.to_string()))
            }
            // Other scalars become names too, so validation can say which
            // names are accepted, at the right line.
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<NameList, E> {
                Ok(NameList::One(b.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<NameList, E> {
                Ok(NameList::One(n.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<NameList, E> {
                Ok(NameList::One(n.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<NameList, E> {
                Ok(NameList::One(n.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<NameList, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element::<S<String>>()? {
                    v.push(x);
                }
                Ok(NameList::Many(v))
            }
        }
        d.deserialize_any(V)
    }
}
