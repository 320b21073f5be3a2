//! The spec as written: every scalar keeps its YAML position so validation
//! errors can point at it. Enumerations are read as strings and checked in
//! `validate`, which lists the accepted values in its errors.
//!
//! The YAML is read into a positioned tree first ([`Node`]) and the fields
//! are taken from it by hand rather than by serde's derive, which stops at
//! the first unknown field, wrong type or missing field: here every one of
//! them is reported, each with its full field path (`mounts[0].size`).

use std::collections::HashMap;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, Spanned};

use super::schema::*;
use super::validate::diagnostic;
use crate::error::Diagnostic;
use schemars::JsonSchema;

pub type S<T> = Spanned<T>;

#[derive(Debug, Default, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawSpec {
    #[schemars(required, range(min = 1, max = 1))]
    #[schemars(with = "Option<u8>")]
    pub version: Option<S<i64>>,
    #[schemars(with = "Option<Size>")]
    pub max_total: Option<S<String>>,
    pub defaults: Option<RawDefaults>,
    // `None` items were not mappings (already reported); indices stay those
    // of the YAML list.
    #[schemars(required)]
    #[schemars(with = "Option<Vec<RawMount>>")]
    pub mounts: Option<S<Vec<Option<RawMount>>>>,
    pub agent: Option<RawAgent>,
}

#[derive(Debug, Default, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawDefaults {
    #[schemars(with = "Option<BackendName>")]
    pub backend: Option<S<String>>,
    #[schemars(with = "Option<Vec<OptionName>>")]
    pub options: Option<S<Vec<S<String>>>>,
    #[schemars(with = "Option<HugeName>")]
    pub huge: Option<S<String>>,
    #[schemars(with = "Option<bool>")]
    pub noswap: Option<S<bool>>,
    #[schemars(with = "Option<SeedName>")]
    pub seed: Option<S<String>>,
    #[schemars(with = "Option<OnFailureName>")]
    pub on_failure: Option<S<String>>,
    pub watchdog: Option<RawWatchdog>,
}

/// A mount. `name`, `path` and `size` are required; when one is `None` its
/// absence (or bad type) has been reported already.
#[derive(Debug, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawMount {
    #[schemars(required)]
    #[schemars(with = "Option<MountName>")]
    pub name: Option<S<String>>,
    #[schemars(required)]
    #[schemars(with = "Option<AbsPath>")]
    pub path: Option<S<String>>,
    #[schemars(with = "Option<BackendName>")]
    pub backend: Option<S<String>>,
    #[schemars(with = "Option<CompressionName>")]
    pub compression: Option<S<String>>,
    #[schemars(with = "Option<FsName>")]
    pub fs: Option<S<String>>,
    #[schemars(required)]
    #[schemars(with = "Option<Size>")]
    pub size: Option<S<String>>,
    #[schemars(with = "Option<Inodes>")]
    pub inodes: Option<S<String>>,
    #[schemars(with = "Option<Id>")]
    pub owner: Option<S<String>>,
    #[schemars(with = "Option<Id>")]
    pub group: Option<S<String>>,
    #[schemars(with = "Option<Mode>")]
    pub mode: Option<S<String>>,
    #[schemars(with = "Option<bool>")]
    pub create: Option<S<bool>>,
    #[schemars(with = "Option<bool>")]
    pub takeover: Option<S<bool>>,
    #[schemars(with = "Option<Vec<OptionName>>")]
    pub options: Option<S<Vec<S<String>>>>,
    #[schemars(with = "Option<HugeName>")]
    pub huge: Option<S<String>>,
    #[schemars(with = "Option<bool>")]
    pub noswap: Option<S<bool>>,
    #[schemars(with = "Option<SeedName>")]
    pub seed: Option<S<String>>,
    #[schemars(with = "Option<Persist>")]
    pub persist: Option<S<String>>,
    #[schemars(with = "Option<OnFailureName>")]
    pub on_failure: Option<S<String>>,
    #[schemars(with = "Option<Vec<Unit>>")]
    pub before: Option<S<Vec<S<String>>>>,
    pub watchdog: Option<RawWatchdog>,
}

/// `watchdog:` of a mount or of `defaults`; a mount's fields override the
/// defaults' one by one.
#[derive(Debug, Default, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawWatchdog {
    #[schemars(with = "Option<Percent>")]
    pub warn: Option<S<String>>,
    #[schemars(with = "Option<Percent>")]
    pub high: Option<S<String>>,
    #[schemars(with = "Option<Percent>")]
    pub low: Option<S<String>>,
    pub inodes: Option<RawThresholds>,
    pub memory: Option<RawMemory>,
    #[schemars(with = "Option<Actions>")]
    pub action: Option<S<NameList>>,
    #[schemars(with = "Option<Size>")]
    pub grow_step: Option<S<String>>,
    #[schemars(with = "Option<Size>")]
    pub max_size: Option<S<String>>,
    #[schemars(with = "Option<Duration>")]
    pub reoffload_after: Option<S<String>>,
    #[schemars(with = "Option<PressureNames>")]
    pub pressure: Option<S<NameList>>,
    #[schemars(range(max = 100))]
    #[schemars(with = "Option<u8>")]
    pub priority: Option<S<i64>>,
    #[schemars(with = "Option<EvictGroupName>")]
    pub evict_group: Option<S<String>>,
}

/// Inode thresholds; unset ones follow the byte thresholds.
#[derive(Debug, Default, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawThresholds {
    #[schemars(with = "Option<Percent>")]
    pub warn: Option<S<String>>,
    #[schemars(with = "Option<Percent>")]
    pub high: Option<S<String>>,
    #[schemars(with = "Option<Percent>")]
    pub low: Option<S<String>>,
}

/// Memory thresholds (zram only): sizes of RAM, or percentages of the
/// mount's size.
#[derive(Debug, Default, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawMemory {
    #[schemars(with = "Option<MemorySize>")]
    pub warn: Option<S<String>>,
    #[schemars(with = "Option<MemorySize>")]
    pub high: Option<S<String>>,
    #[schemars(with = "Option<MemorySize>")]
    pub low: Option<S<String>>,
}

/// Top-level `agent:`: settings only `tmpfsctl agent` reads.
#[derive(Debug, Default, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawAgent {
    #[schemars(with = "Option<Duration>")]
    pub interval: Option<S<String>>,
    #[schemars(with = "Option<Text>")]
    pub metrics: Option<S<String>>,
    #[schemars(with = "Option<Size>")]
    pub min_available: Option<S<String>>,
    #[schemars(with = "Option<Percent>")]
    pub max_pressure: Option<S<String>>,
    #[schemars(with = "Option<Size>")]
    pub grow_floor: Option<S<String>>,
    #[schemars(with = "Option<Duration>")]
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

/// A YAML node as the parser resolved it. Aliases and merge keys are already
/// expanded; duplicate keys are kept (and reported when read).
#[derive(Debug)]
pub enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<S<Node>>),
    Map(Vec<(S<Node>, S<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a YAML value")
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
                Ok(Node::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Node, E> {
                Ok(Node::Int(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Node, E> {
                Ok(Node::Int(n.into()))
            }
            fn visit_i128<E>(self, n: i128) -> Result<Node, E> {
                Ok(Node::Int(n))
            }
            fn visit_u128<E>(self, n: u128) -> Result<Node, E> {
                Ok(i128::try_from(n).map_or(Node::Float(n as f64), Node::Int))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Node, E> {
                Ok(Node::Float(n))
            }
            fn visit_str<E>(self, s: &str) -> Result<Node, E> {
                Ok(Node::Str(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Node, E> {
                Ok(Node::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Node::Seq(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                let mut v = Vec::new();
                while let Some(k) = a.next_key()? {
                    v.push((k, a.next_value()?));
                }
                Ok(Node::Map(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::Null => "nothing",
            Node::Bool(_) => "a boolean",
            Node::Int(_) | Node::Float(_) => "a number",
            Node::Str(_) => "text",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }
}

const BOOL_ACCEPTED: &str = "true or false (yes/no/on/off are not booleans in a tmpfsctl spec)";

/// Takes the fields out of the tree, reporting what it cannot use.
struct Reader<'a> {
    text: &'a str,
    diags: &'a mut Vec<Diagnostic>,
}

/// The entries of one mapping, as they are taken by name.
struct Fields<'t> {
    path: String,
    at: Location,
    entries: Vec<(String, &'t S<Node>, &'t S<Node>)>,
    taken: Vec<bool>,
}

impl<'t> Fields<'t> {
    fn field(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

/// Reads `root` (the whole document) into a [`RawSpec`]; every problem found
/// is appended to `diags`.
pub fn read(text: &str, root: &S<Node>, diags: &mut Vec<Diagnostic>) -> RawSpec {
    let mut rd = Reader { text, diags };
    let Some(mut f) = rd.fields(root, "") else {
        return RawSpec::default();
    };
    let version = rd.required(&mut f, "version").and_then(|(n, p)| rd.int(n, &p));
    let max_total = rd.opt_text(&mut f, "max_total");
    let defaults = rd.opt(&mut f, "defaults").and_then(|(n, p)| rd.defaults(n, &p));
    let mounts = rd.required(&mut f, "mounts").and_then(|(n, p)| rd.mounts(n, &p));
    let agent = rd.opt(&mut f, "agent").and_then(|(n, p)| rd.agent(n, &p));
    rd.finish(f, &["version", "max_total", "defaults", "mounts", "agent"]);
    RawSpec {
        version,
        max_total,
        defaults,
        mounts,
        agent,
    }
}

impl<'a> Reader<'a> {
    fn report(&mut self, loc: &Location, field: &str, message: String, accepted: Option<&str>) {
        self.diags.push(diagnostic(loc, field, message, accepted));
    }

    fn wrong(&mut self, n: &S<Node>, field: &str, expected: &str) {
        let found = match self.scalar_text(n) {
            Some(t) => format!("{} `{t}`", n.value.kind()),
            None => n.value.kind().to_string(),
        };
        self.report(
            &n.referenced,
            field,
            format!("expected {expected}, found {found}"),
            None,
        );
    }

    /// A scalar as written: the parsed text of a string, the source spelling
    /// of a plain number or boolean (`0750` stays `0750`).
    fn scalar_text(&self, n: &S<Node>) -> Option<String> {
        let spelled = || {
            let span = n.defined.span();
            let start = usize::try_from(span.byte_offset()?).ok()?;
            let len = usize::try_from(span.byte_len()?).ok()?;
            self.text.get(start..start.checked_add(len)?).map(str::to_string)
        };
        match &n.value {
            Node::Str(s) => Some(s.clone()),
            Node::Bool(b) => Some(spelled().unwrap_or_else(|| b.to_string())),
            Node::Int(i) => Some(spelled().unwrap_or_else(|| i.to_string())),
            Node::Float(x) => Some(spelled().unwrap_or_else(|| x.to_string())),
            Node::Null | Node::Seq(_) | Node::Map(_) => None,
        }
    }

    fn fields<'t>(&mut self, n: &'t S<Node>, path: &str) -> Option<Fields<'t>> {
        let Node::Map(entries) = &n.value else {
            let what = if path.is_empty() {
                "a mapping with `version` and `mounts`"
            } else {
                "a mapping of fields"
            };
            self.wrong(n, if path.is_empty() { "(document)" } else { path }, what);
            return None;
        };
        let mut out: Vec<(String, &S<Node>, &S<Node>)> = Vec::new();
        let mut first_line: HashMap<String, u64> = HashMap::new();
        for (k, v) in entries {
            let Some(key) = self
                .scalar_text(k)
                .filter(|_| matches!(k.value, Node::Str(_) | Node::Int(_)))
            else {
                self.wrong(k, path, "a field name");
                continue;
            };
            let field = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            if let Some(line) = first_line.get(&key) {
                self.report(
                    &k.referenced,
                    &field,
                    format!("duplicate field `{key}` (first at line {line})"),
                    Some("each field once"),
                );
                continue;
            }
            first_line.insert(key.clone(), k.referenced.line());
            out.push((key, k, v));
        }
        let taken = vec![false; out.len()];
        Some(Fields {
            path: path.to_string(),
            at: n.referenced,
            entries: out,
            taken,
        })
    }

    /// The value of `key` with its field path; a YAML null counts as unset.
    fn opt<'t>(&mut self, f: &mut Fields<'t>, key: &str) -> Option<(&'t S<Node>, String)> {
        let i = f.entries.iter().position(|(k, _, _)| k == key)?;
        f.taken[i] = true;
        let v = f.entries[i].2;
        (!matches!(v.value, Node::Null)).then(|| (v, f.field(key)))
    }

    fn required<'t>(&mut self, f: &mut Fields<'t>, key: &str) -> Option<(&'t S<Node>, String)> {
        let present = f
            .entries
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, k, _)| k.referenced);
        let found = self.opt(f, key);
        if found.is_none() {
            let field = f.field(key);
            let (at, message) = match present {
                Some(k) => (k, format!("`{key}` has no value")),
                None => (f.at, format!("missing field `{key}`")),
            };
            self.report(&at, &field, message, None);
        }
        found
    }

    /// Reports the fields nobody took.
    fn finish(&mut self, f: Fields<'_>, known: &[&str]) {
        for (i, (key, k, _)) in f.entries.iter().enumerate() {
            if !f.taken[i] {
                self.report(
                    &k.referenced,
                    &f.field(key),
                    format!("unknown field `{key}`"),
                    Some(&known.join(", ")),
                );
            }
        }
    }

    /// Text without control characters: every value of a spec is one line
    /// of plain text, and many end up in unit files, fstab or a terminal.
    fn text(&mut self, n: &S<Node>, field: &str) -> Option<S<String>> {
        let Some(t) = self.scalar_text(n) else {
            self.wrong(n, field, "text");
            return None;
        };
        if let Some(c) = t.chars().find(|c| c.is_control()) {
            self.report(
                &n.referenced,
                field,
                format!(
                    "`{}` contains the control character U+{:04X}",
                    crate::out::escape(&t),
                    c as u32
                ),
                Some("plain text without control characters (U+0000-U+001F, U+007F-U+009F)"),
            );
            return None;
        }
        Some(Spanned::new(t, n.referenced, n.defined))
    }

    fn opt_text(&mut self, f: &mut Fields<'_>, key: &str) -> Option<S<String>> {
        self.opt(f, key).and_then(|(n, p)| self.text(n, &p))
    }

    fn req_text(&mut self, f: &mut Fields<'_>, key: &str) -> Option<S<String>> {
        self.required(f, key).and_then(|(n, p)| self.text(n, &p))
    }

    fn opt_bool(&mut self, f: &mut Fields<'_>, key: &str) -> Option<S<bool>> {
        let (n, field) = self.opt(f, key)?;
        match n.value {
            Node::Bool(b) => Some(Spanned::new(b, n.referenced, n.defined)),
            _ => {
                let shown = self.scalar_text(n).unwrap_or_else(|| n.value.kind().to_string());
                self.report(
                    &n.referenced,
                    &field,
                    format!("invalid boolean `{}`", crate::out::escape(&shown)),
                    Some(BOOL_ACCEPTED),
                );
                None
            }
        }
    }

    fn int(&mut self, n: &S<Node>, field: &str) -> Option<S<i64>> {
        match n.value {
            Node::Int(i) => match i64::try_from(i) {
                Ok(v) => Some(Spanned::new(v, n.referenced, n.defined)),
                Err(_) => {
                    self.report(&n.referenced, field, format!("number {i} is out of range"), None);
                    None
                }
            },
            // Beyond 64 bits the parser gives a float.
            Node::Float(_)
                if self.scalar_text(n).is_some_and(|t| {
                    t.trim_start_matches(['-', '+'])
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                }) =>
            {
                let t = self.scalar_text(n).unwrap_or_default();
                self.report(&n.referenced, field, format!("number {t} is out of range"), None);
                None
            }
            _ => {
                self.wrong(n, field, "a whole number");
                None
            }
        }
    }

    fn text_list(&mut self, f: &mut Fields<'_>, key: &str, example: &str) -> Option<S<Vec<S<String>>>> {
        let (n, field) = self.opt(f, key)?;
        let Node::Seq(items) = &n.value else {
            self.wrong(n, &field, &format!("a list such as {example}"));
            return None;
        };
        let out: Vec<Option<S<String>>> = items
            .iter()
            .enumerate()
            .map(|(k, item)| self.text(item, &format!("{field}[{k}]")))
            .collect();
        let out = out.into_iter().collect::<Option<_>>()?;
        Some(Spanned::new(out, n.referenced, n.defined))
    }

    fn names(&mut self, f: &mut Fields<'_>, key: &str) -> Option<S<NameList>> {
        let (n, field) = self.opt(f, key)?;
        let list = match &n.value {
            Node::Seq(items) => {
                let out: Vec<Option<S<String>>> = items
                    .iter()
                    .enumerate()
                    .map(|(k, item)| self.text(item, &format!("{field}[{k}]")))
                    .collect();
                NameList::Many(out.into_iter().collect::<Option<_>>()?)
            }
            _ => NameList::One(self.text(n, &field)?.value),
        };
        Some(Spanned::new(list, n.referenced, n.defined))
    }

    fn defaults(&mut self, n: &S<Node>, path: &str) -> Option<RawDefaults> {
        let mut f = self.fields(n, path)?;
        let d = RawDefaults {
            backend: self.opt_text(&mut f, "backend"),
            options: self.text_list(&mut f, "options", "[nosuid, nodev]"),
            huge: self.opt_text(&mut f, "huge"),
            noswap: self.opt_bool(&mut f, "noswap"),
            seed: self.opt_text(&mut f, "seed"),
            on_failure: self.opt_text(&mut f, "on_failure"),
            watchdog: self
                .opt(&mut f, "watchdog")
                .and_then(|(n, p)| self.watchdog(n, &p)),
        };
        self.finish(
            f,
            &[
                "backend",
                "options",
                "huge",
                "noswap",
                "seed",
                "on_failure",
                "watchdog",
            ],
        );
        Some(d)
    }

    fn mounts(&mut self, n: &S<Node>, path: &str) -> Option<S<Vec<Option<RawMount>>>> {
        let Node::Seq(items) = &n.value else {
            self.wrong(n, path, "a list of mounts");
            return None;
        };
        let list = items
            .iter()
            .enumerate()
            .map(|(i, m)| self.mount(m, &format!("{path}[{i}]")))
            .collect();
        Some(Spanned::new(list, n.referenced, n.defined))
    }

    fn mount(&mut self, n: &S<Node>, path: &str) -> Option<RawMount> {
        let mut f = self.fields(n, path)?;
        let m = RawMount {
            name: self.req_text(&mut f, "name"),
            path: self.req_text(&mut f, "path"),
            backend: self.opt_text(&mut f, "backend"),
            compression: self.opt_text(&mut f, "compression"),
            fs: self.opt_text(&mut f, "fs"),
            size: self.req_text(&mut f, "size"),
            inodes: self.opt_text(&mut f, "inodes"),
            owner: self.opt_text(&mut f, "owner"),
            group: self.opt_text(&mut f, "group"),
            mode: self.opt_text(&mut f, "mode"),
            create: self.opt_bool(&mut f, "create"),
            takeover: self.opt_bool(&mut f, "takeover"),
            options: self.text_list(&mut f, "options", "[nosuid, nodev]"),
            huge: self.opt_text(&mut f, "huge"),
            noswap: self.opt_bool(&mut f, "noswap"),
            seed: self.opt_text(&mut f, "seed"),
            persist: self.opt_text(&mut f, "persist"),
            on_failure: self.opt_text(&mut f, "on_failure"),
            before: self.text_list(&mut f, "before", "[nginx.service]"),
            watchdog: self
                .opt(&mut f, "watchdog")
                .and_then(|(n, p)| self.watchdog(n, &p)),
        };
        self.finish(
            f,
            &[
                "name",
                "path",
                "backend",
                "compression",
                "fs",
                "size",
                "inodes",
                "owner",
                "group",
                "mode",
                "create",
                "takeover",
                "options",
                "huge",
                "noswap",
                "seed",
                "persist",
                "on_failure",
                "before",
                "watchdog",
            ],
        );
        Some(m)
    }

    fn watchdog(&mut self, n: &S<Node>, path: &str) -> Option<RawWatchdog> {
        let mut f = self.fields(n, path)?;
        let w = RawWatchdog {
            warn: self.opt_text(&mut f, "warn"),
            high: self.opt_text(&mut f, "high"),
            low: self.opt_text(&mut f, "low"),
            inodes: self
                .opt(&mut f, "inodes")
                .and_then(|(n, p)| self.thresholds(n, &p)),
            memory: self
                .opt(&mut f, "memory")
                .and_then(|(n, p)| self.thresholds(n, &p))
                .map(|t| RawMemory {
                    warn: t.warn,
                    high: t.high,
                    low: t.low,
                }),
            action: self.names(&mut f, "action"),
            grow_step: self.opt_text(&mut f, "grow_step"),
            max_size: self.opt_text(&mut f, "max_size"),
            reoffload_after: self.opt_text(&mut f, "reoffload_after"),
            pressure: self.names(&mut f, "pressure"),
            priority: self.opt(&mut f, "priority").and_then(|(n, p)| self.int(n, &p)),
            evict_group: self.opt_text(&mut f, "evict_group"),
        };
        self.finish(
            f,
            &[
                "warn",
                "high",
                "low",
                "inodes",
                "memory",
                "action",
                "grow_step",
                "max_size",
                "reoffload_after",
                "pressure",
                "priority",
                "evict_group",
            ],
        );
        Some(w)
    }

    fn thresholds(&mut self, n: &S<Node>, path: &str) -> Option<RawThresholds> {
        let mut f = self.fields(n, path)?;
        let t = RawThresholds {
            warn: self.opt_text(&mut f, "warn"),
            high: self.opt_text(&mut f, "high"),
            low: self.opt_text(&mut f, "low"),
        };
        self.finish(f, &["warn", "high", "low"]);
        Some(t)
    }

    fn agent(&mut self, n: &S<Node>, path: &str) -> Option<RawAgent> {
        let mut f = self.fields(n, path)?;
        let a = RawAgent {
            interval: self.opt_text(&mut f, "interval"),
            metrics: self.opt_text(&mut f, "metrics"),
            min_available: self.opt_text(&mut f, "min_available"),
            max_pressure: self.opt_text(&mut f, "max_pressure"),
            grow_floor: self.opt_text(&mut f, "grow_floor"),
            cooldown: self.opt_text(&mut f, "cooldown"),
        };
        self.finish(
            f,
            &[
                "interval",
                "metrics",
                "min_available",
                "max_pressure",
                "grow_floor",
                "cooldown",
            ],
        );
        Some(a)
    }
}
