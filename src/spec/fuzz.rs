//! Property test of the spec loader with a deterministic generator: for any
//! input it never panics, and every spec it accepts can be planned,
//! reported, scheduled and watched (the agent's pure decisions) without a
//! panic either. Structured specs reach deep into validation; mutated ones
//! (bytes inserted, deleted, lines repeated) reach the YAML reader.

use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Instant;

use super::{parse, MountSpec, Persist, Spec};
use crate::agent::decide::{self, Budget, Limits, MemView, PressureView, Tracker};
use crate::backend::{tmpfs, Live};
use crate::host::meminfo::MemInfo;
use crate::host::mountinfo::MountTable;
use crate::host::usage::Usage;
use crate::mount::RootAttrs;
use crate::observe::{AtPath, Observed, SideBind, World};
use crate::state::{Record, State};

/// xorshift64*: the same inputs on every run, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }
}

/// Values no field wants: wrong types, limits and one past them, YAML
/// features, control characters, unicode.
const WEIRD: &[&str] = &[
    "",
    "~",
    "null",
    "0",
    "-1",
    "1.5",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "99999999999999999999999",
    "1e999",
    ".nan",
    "-.inf",
    "0x10",
    "0o17",
    "0750",
    "yes",
    "true",
    "\"true\"",
    "1025TiB",
    "1024TiB",
    "0.0000000000001%",
    "nan%",
    "inf%",
    "-5%",
    "101%",
    "1e2%",
    "every 9s",
    "every 31d",
    "every 106751991167301d",
    "every 99999999999999999999d",
    "every ",
    "3600001ms",
    "99ms",
    "1025g",
    "[]",
    "{}",
    "[[[[[[]]]]]]",
    "{a: {b: {c: {d: 1}}}}",
    "[evict, evict]",
    "[fallback, grow]",
    "[warn, evict]",
    "\"a\\nb\"",
    "\"\\e[2J\"",
    "\"\\u0085x\"",
    "\"\\x7f\"",
    "\"\\0\"",
    "\"é日本\"",
    "\"/\"",
    "/etc",
    "/root/.ssh",
    "/var/lib/dpkg/info",
    "/var/spool/cron",
    "/boot",
    "relative/path",
    "'it''s'",
    "!!str 5",
    "!!int x",
    "!!binary aGk=",
    "&anchor 1",
    "*nowhere",
    "|\n      literal\n      block",
    ">\n      folded",
    "[\"@x.service\"]",
    "[\"a b.service\"]",
    "[nginx]",
];

const TOP: &[&str] = &["version", "max_total", "defaults", "mounts", "agent", "bogus"];
const MOUNT: &[&str] = &[
    "name",
    "path",
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
    "sise",
];
const WATCHDOG: &[&str] = &[
    "warn",
    "high",
    "low",
    "inodes",
    "action",
    "grow_step",
    "max_size",
    "reoffload_after",
    "pressure",
    "priority",
    "evict_group",
    "hihg",
];
const AGENT: &[&str] = &[
    "interval",
    "metrics",
    "min_available",
    "max_pressure",
    "grow_floor",
    "cooldown",
    "intervall",
];

/// Values a field accepts, or nearly: the bounds themselves included.
fn good(field: &str, rng: &mut Rng) -> String {
    let pool: &[&str] = match field {
        "version" => &["1"],
        "max_total" | "max_size" | "min_available" | "grow_floor" => {
            &["1024TiB", "100%", "50%", "1", "4GiB", "0.5%"]
        }
        "size" | "grow_step" => &["1MiB", "10%", "1", "4096", "1024TiB", "1k", "0.001%"],
        "inodes" => &["1", "200k", "1024g", "1m"],
        "owner" | "group" => &["0", "root", "4294967294", "65534", "\"33\""],
        "mode" => &["\"0750\"", "\"07777\"", "\"0\"", "\"1777\"", "0o700"],
        "create" | "takeover" | "noswap" => &["true", "false"],
        "options" => &[
            "[nosuid]",
            "[]",
            "[nosuid, nodev, noexec, strictatime]",
            "[noatime]",
        ],
        "huge" => &["never", "always", "within_size", "advise"],
        "seed" => &["copy", "empty"],
        "persist" => &["none", "on-stop", "every 10s", "every 30d", "every 1h30m"],
        "on_failure" => &["keep-disk", "fail"],
        "before" => &[
            "[nginx.service]",
            "[\"tpl@x.service\", \"my\\\\x2dapp.service\", web.target]",
            "[\"tpl@.service\"]",
        ],
        "warn" | "high" | "low" | "max_pressure" => &["80%", "95%", "70%", "100%", "0.001%", "50%"],
        "action" => &[
            "warn",
            "evict",
            "grow",
            "fallback",
            "[grow, evict]",
            "[grow, fallback]",
        ],
        "reoffload_after" => &["never", "10s", "30d", "10m"],
        "pressure" => &["none", "[shrink, fallback]", "[evict, shrink, fallback]", "[]"],
        "priority" => &["0", "50", "100"],
        "evict_group" => &["stem", "directory", "file"],
        "interval" | "cooldown" => &["100ms", "1h", "1s", "2s500ms"],
        "metrics" => &["off", "/tmp/tmpfsctl-fuzz.prom"],
        _ => &["x"],
    };
    rng.pick(pool).to_string()
}

fn value(field: &str, rng: &mut Rng, weird_pct: usize) -> String {
    if rng.percent(weird_pct) {
        rng.pick(WEIRD).to_string()
    } else {
        good(field, rng)
    }
}

/// A flow mapping of some of `fields`.
fn flow(fields: &[&str], rng: &mut Rng, weird_pct: usize, depth: usize) -> String {
    let mut parts = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..rng.below(4) {
        let f = *rng.pick(fields);
        if (seen.contains(&f) || f == fields[fields.len() - 1]) && !rng.percent(weird_pct) {
            continue;
        }
        seen.push(f);
        let v = if f == "inodes" && depth == 0 && rng.percent(70) {
            flow(&["warn", "high", "low"], rng, weird_pct, 1)
        } else {
            value(f, rng, weird_pct)
        };
        // Block scalars and anchors do not fit in a flow mapping.
        if v.contains('\n') || v.starts_with('&') || v.starts_with('*') {
            continue;
        }
        parts.push(format!("{f}: {v}"));
    }
    format!("{{ {} }}", parts.join(", "))
}

fn spec_text(rng: &mut Rng, dir: &Path, weird_pct: usize) -> String {
    let mut t = String::new();
    for f in TOP {
        let keep = match *f {
            "version" | "mounts" => 100 - weird_pct / 4,
            "max_total" => 70,
            "bogus" => weird_pct / 4,
            _ => 25,
        };
        if rng.percent(keep) {
            match *f {
                "mounts" => {
                    t.push_str("mounts:\n");
                    for i in 0..rng.below(4) + usize::from(rng.percent(90)) {
                        let mut first = true;
                        for m in MOUNT {
                            let keep = match *m {
                                "name" | "path" | "size" | "create" => 100 - weird_pct / 4,
                                "sise" => weird_pct / 4,
                                _ => 15,
                            };
                            if !rng.percent(keep) {
                                continue;
                            }
                            let v = match *m {
                                "name" if !rng.percent(weird_pct) => format!("m{i}"),
                                "path" if !rng.percent(weird_pct) => {
                                    format!("\"{}/m{i}\"", dir.display())
                                }
                                "create" if !rng.percent(weird_pct) => "true".into(),
                                "watchdog" if !rng.percent(weird_pct) => flow(WATCHDOG, rng, weird_pct, 0),
                                _ => value(m, rng, weird_pct),
                            };
                            let lead = if first { "  - " } else { "    " };
                            first = false;
                            let _ = writeln!(t, "{lead}{m}: {v}");
                        }
                        if first {
                            t.push_str("  - {}\n");
                        }
                    }
                }
                "defaults" => {
                    let _ = writeln!(
                        t,
                        "defaults: {{ options: {}, huge: {}, seed: {}, watchdog: {} }}",
                        value("options", rng, weird_pct).replace('\n', " "),
                        value("huge", rng, weird_pct).replace('\n', " "),
                        value("seed", rng, weird_pct).replace('\n', " "),
                        flow(WATCHDOG, rng, weird_pct, 0)
                    );
                }
                "agent" => {
                    let _ = writeln!(t, "agent: {}", flow(AGENT, rng, weird_pct, 0));
                }
                "max_total" if !rng.percent(weird_pct) => t.push_str("max_total: 1024TiB\n"),
                f => {
                    let _ = writeln!(t, "{f}: {}", value(f, rng, weird_pct));
                }
            }
        }
    }
    t
}

/// `text` with a few bytes inserted, deleted or lines repeated.
fn mutate(text: &str, rng: &mut Rng) -> String {
    const INSERT: &[&str] = &[
        ":", " ", "\n", "- ", "[", "]", "{", "}", "\"", "'", "&a ", "*a", "!!", "%", "#", "\t", "\\", "é",
        "\u{1b}", "\u{0}", "0", "9", "<<: ", ",", "|", ">", "?", "@", "`",
    ];
    let mut chars: Vec<char> = text.chars().collect();
    for _ in 0..rng.below(4) + 1 {
        let at = rng.below(chars.len() + 1);
        match rng.below(4) {
            0 if !chars.is_empty() => {
                chars.remove(at.min(chars.len() - 1));
            }
            1 => {
                let lines: Vec<String> = chars
                    .iter()
                    .collect::<String>()
                    .lines()
                    .map(String::from)
                    .collect();
                if !lines.is_empty() {
                    let l = rng.below(lines.len());
                    let mut out = lines.clone();
                    out.insert(l, lines[l].clone());
                    chars = (out.join("\n") + "\n").chars().collect();
                }
            }
            _ => {
                let ins: Vec<char> = rng.pick(INSERT).chars().collect();
                for (k, c) in ins.into_iter().enumerate() {
                    chars.insert(at + k, c);
                }
            }
        }
    }
    chars.into_iter().collect()
}

const PAGE: u64 = 4096;
const GIB: u64 = 1 << 30;

/// Plans `spec` against hosts in every state a mount can be in, renders the
/// plans, and runs the agent's schedule and watchdog decisions on it.
fn exercise(spec: &Spec, rng: &mut Rng) {
    plan_on_random_hosts(spec, rng);
    schedule_and_decide(spec, rng);
}

const EXTREMES: [u64; 6] = [0, 1, PAGE, 16 * GIB, 1 << 50, 1 << 60];

fn plan_on_random_hosts(spec: &Spec, rng: &mut Rng) {
    let state = State::new("/run/tmpfsctl");
    for _ in 0..4 {
        let mounts: Vec<Observed> = spec.mounts.iter().map(|m| observed(m, rng)).collect();
        let world = World {
            table: MountTable::default(),
            mem: MemInfo {
                mem_total: 16 * GIB,
                mem_available: *rng.pick(&EXTREMES),
                shmem: 0,
            },
            page_size: PAGE,
            mounts,
            leftovers: vec![],
            orphans: vec![],
            state_not_private: vec![],
        };
        let p = crate::plan::plan(spec, &world, &state);
        crate::report::plan(&p);
        serde_json::to_string(&p).expect("plans serialise");
    }
}

/// A mount of `spec` as a host in some random state shows it.
fn observed(m: &MountSpec, rng: &mut Rng) -> Observed {
    let size = *rng.pick(&EXTREMES);
    let live = tmpfs::LiveTmpfs {
        dev: (0, 40),
        size,
        nr_inodes: *rng.pick(&EXTREMES),
        huge: None,
        noswap: rng.percent(50),
        flags: m.flags,
        root: RootAttrs {
            uid: u32::MAX - 1,
            gid: 0,
            mode: 0o7777,
        },
        usage: Usage {
            size,
            used: *rng.pick(&EXTREMES),
            inodes: *rng.pick(&EXTREMES),
            inodes_used: *rng.pick(&EXTREMES),
        },
    };
    let at_path = match rng.below(4) {
        0 => AtPath::Disk,
        1 => AtPath::Ours(Live::Tmpfs(live)),
        2 => AtPath::OtherManaged {
            source: "tmpfsctl-other".into(),
        },
        _ => AtPath::Foreign {
            fstype: "ext4".into(),
            source: "/dev/sda1".into(),
        },
    };
    Observed {
        name: m.name.clone(),
        path_exists: rng.percent(70),
        at_path,
        ours_elsewhere: rng.percent(10).then(|| "/elsewhere".into()),
        stage_mounted: rng.percent(20),
        stage_holds_upper: rng.percent(5),
        side: *rng.pick(&[
            SideBind::Absent,
            SideBind::Bound,
            SideBind::Shared,
            SideBind::Stale,
        ]),
        disk: rng.percent(80).then_some(RootAttrs {
            uid: 0,
            gid: u32::MAX - 1,
            mode: 0o755,
        }),
        record: rng.percent(50).then(|| Record {
            name: m.name.clone(),
            path: m.path.clone(),
            persist: rng.pick(&["none", "on-stop", "every 60s"]).to_string(),
            seed: rng.percent(50).then_some(m.seed),
            backend: rng.percent(50).then_some(m.backend),
            applied_at: 0,
        }),
        nested: rng.percent(5).then(|| ("other".into(), "/elsewhere".into())),
    }
}

/// The agent's deadlines, watchdog decisions and pressure guard on `spec`.
fn schedule_and_decide(spec: &Spec, rng: &mut Rng) {
    let now = Instant::now();
    let unix_now = 1_750_000_000;
    let total: u64 = spec.mounts.iter().fold(0, |a, m| a.saturating_add(m.size));
    decide::deadline(now, spec.agent.interval_ms / 1000);
    decide::deadline(now, spec.agent.cooldown_ms / 1000);
    let mut views = Vec::new();
    for (index, m) in spec.mounts.iter().enumerate() {
        if let Persist::Every(secs) = m.persist {
            for last in [None, Some(0), Some(unix_now), Some(u64::MAX)] {
                decide::deadline(now, decide::sync_due_in(secs, last, unix_now));
            }
        }
        if let Some(after) = m.watchdog.reoffload_after {
            decide::deadline(now, after);
            let _ = unix_now.saturating_add(after);
        }
        let lim = Limits {
            spec_size: m.size,
            spec_inodes: m.inodes,
        };
        let mut tracker = Tracker::default();
        let size = m.size.div_ceil(PAGE) * PAGE;
        let inodes = m.inodes.unwrap_or(1 << 20);
        for (k, pct) in [0, 50, 80, 95, 100, 100, 100, 30, 100].into_iter().enumerate() {
            let u = Usage {
                size,
                used: size / 100 * pct,
                inodes,
                inodes_used: inodes / 100 * pct,
            };
            let mem = MemView {
                mem_total: 16 * GIB,
                mem_available: *rng.pick(&EXTREMES),
                psi_some_avg10: rng.percent(50).then_some(100.0),
            };
            let budget = Budget {
                max_total: spec.max_total,
                total_size: total,
                grow_floor: spec.agent.grow_floor,
                under_pressure: rng.percent(20),
                page_size: PAGE,
            };
            let memory = rng.percent(50).then(|| *rng.pick(&EXTREMES));
            decide::decide(
                &m.watchdog,
                &mut tracker,
                &u,
                memory,
                lim,
                &mem,
                &budget,
                k as u64 * 40_000,
            );
            views.push(PressureView {
                index,
                watchdog: &m.watchdog,
                usage: u,
                memory,
                limits: lim,
            });
        }
    }
    let mem = MemView {
        mem_total: 16 * GIB,
        mem_available: 0,
        psi_some_avg10: Some(100.0),
    };
    for since in [None, Some(0), Some(u64::MAX)] {
        decide::guard(&mem, &spec.agent, &views, since, PAGE);
    }
}

#[test]
fn the_loader_never_panics_and_what_it_accepts_plans_and_schedules() {
    let dir = tempfile::Builder::new()
        .prefix("tmpfsctl-fuzz-")
        .tempdir_in("/tmp")
        .unwrap();
    let mut rng = Rng(0x5EED_1E55_0F7A_CE11);
    let (mut accepted, mut total) = (0, 0);
    for round in 0..3000 {
        let weird = [0, 2, 10, 40][round % 4];
        let mut text = spec_text(&mut rng, dir.path(), weird);
        if round % 3 == 2 {
            text = mutate(&text, &mut rng);
        }
        let mem_total = *rng.pick(&[16 * GIB, 16 * GIB, 16 * GIB, 0, 1, 1 << 50]);
        total += 1;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let spec = parse(Path::new("fuzz.yaml"), &text, mem_total);
            if let Ok(s) = &spec {
                exercise(s, &mut Rng(round as u64 + 1));
            }
            spec.map(|_| ()).map_err(|e| e.to_string())
        }));
        match outcome {
            Ok(Ok(())) => accepted += 1,
            Ok(Err(shown)) => assert!(
                !shown.contains(|c: char| c.is_control() && c != '\n'),
                "an error shows a raw control character:\n{shown}\n--- input\n{text}"
            ),
            Err(_) => panic!("panicked on input (mem_total {mem_total}):\n{text}"),
        }
    }
    // The generator must get past validation often enough to test the rest.
    assert!(
        accepted * 10 >= total,
        "only {accepted} of {total} specs were valid"
    );
}
