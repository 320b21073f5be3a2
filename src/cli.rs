//! Command line: parses arguments, runs one view of the pipeline, prints,
//! and maps the result to an exit status.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use crate::error::ExitCode;
use crate::host::Host;
use crate::out::{self, escape};
use crate::spec::{self, Spec, SpecLoadError};
use crate::state::{self, LockError, State};
use crate::{
    advise, agent, boot, diskbench, down, execute, keeper, observe, plan, report, residency, status, sync,
};

#[derive(Parser)]
#[command(
    name = "tmpfsctl",
    version,
    about = "Put application cache directories into size-limited tmpfs, declaratively and safely"
)]
struct Cli {
    /// State directory: lock, side paths to the on-disk directories, records.
    #[arg(long, global = true, env = "TMPFSCTL_STATE_DIR", default_value = state::DEFAULT_DIR)]
    state_dir: PathBuf,
    /// Seconds to wait for another tmpfsctl holding the lock.
    #[arg(long, global = true, default_value_t = 10, value_name = "SECONDS")]
    wait: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Human,
    Json,
}

/// `--format`, declared once for every command that reports.
#[derive(clap::Args, Clone, Copy)]
struct Output {
    /// human: a report for people (progress on a terminal); json: one document.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
}

impl Output {
    fn json(self) -> bool {
        self.format == Format::Json
    }

    /// Prints `r` as the report `human` writes, or as its JSON form.
    fn print<T: serde::Serialize>(self, r: &T, human: impl FnOnce(&T) -> String) -> Result<()> {
        match self.format {
            Format::Human => {
                out::print(&human(r));
                Ok(())
            }
            Format::Json => print_json(r),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Check a spec; change nothing.
    Validate {
        spec: PathBuf,
        /// Check paths, users and groups against this image or container
        /// tree (its files and its etc/passwd, etc/group) instead of the host.
        #[arg(long)]
        root: Option<PathBuf>,
    },
    /// Print the JSON Schema (draft 2020-12) of the spec, for editors and CI.
    Schema,
    /// Show the steps `apply` would take.
    Plan {
        spec: PathBuf,
        #[command(flatten)]
        output: Output,
    },
    /// Bring the host to the spec (idempotent).
    Apply {
        spec: PathBuf,
        #[command(flatten)]
        output: Output,
    },
    /// Show managed mounts: state, size, usage, inodes, and host memory.
    Status {
        spec: Option<PathBuf>,
        #[command(flatten)]
        output: Output,
    },
    /// Install or remove what re-applies the spec at boot.
    Boot {
        #[command(subcommand)]
        action: BootAction,
    },
    /// Write the RAM contents of persisted mounts back to disk now.
    Sync {
        spec: PathBuf,
        /// Mount names (default: every persisted mount of the spec).
        names: Vec<String>,
        /// Read the whole tree, even where the agent's change tracker knows which
        /// directories changed (it cannot see writes through a shared mapping made
        /// after the file was closed).
        #[arg(long)]
        full: bool,
        #[command(flatten)]
        output: Output,
    },
    /// Watch the spec's mounts and act on them: usage thresholds (warn, evict,
    /// grow, fallback), memory pressure, periodic write-back; reloads the spec
    /// on change or SIGHUP. Runs until SIGTERM (as a systemd Type=notify service).
    Agent {
        spec: PathBuf,
        /// Usage poll interval such as 1s or 500ms [default: the spec's
        /// `agent.interval`, else 1s].
        #[arg(long, value_parser = parse_interval, value_name = "DURATION")]
        interval: Option<Duration>,
        /// Prometheus textfile to write, or `off` [default: the spec's
        /// `agent.metrics`, else /var/lib/prometheus/node-exporter/tmpfsctl.prom
        /// when that directory exists].
        #[arg(long, value_parser = parse_metrics, value_name = "PATH")]
        metrics: Option<spec::MetricsTarget>,
        /// Poll only; do not wake early on fanotify write events.
        #[arg(long)]
        no_fanotify: bool,
    },
    /// Write back persisted mounts, then unmount managed tmpfs safely; the
    /// application is back on its disk directory.
    Down {
        spec: PathBuf,
        /// Mount names (default: all mounts of the spec).
        names: Vec<String>,
        #[command(flatten)]
        output: Output,
    },
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff) to stdout.
    Manpage,
    /// Page-cache residency of files and directory trees (like fincore, vmtouch).
    Residency {
        #[command(flatten)]
        args: residency::ResidencyArgs,
        #[command(flatten)]
        output: Output,
    },
    /// Measure a disk directory against a private temporary tmpfs, side by side
    /// (with --backend zram: DIR's own files in a tmpfs against a zram device).
    Bench {
        #[command(flatten)]
        args: diskbench::BenchArgs,
        #[command(flatten)]
        output: Output,
    },
    /// Watch a directory while the application runs and recommend a mount entry
    /// for it (size, inodes, watchdog), with the disk writes it would save.
    Advise {
        #[command(flatten)]
        args: advise::AdviseArgs,
        #[command(flatten)]
        output: Output,
    },
    /// Internal: watches a held mount's disk directory for deletions between two
    /// write-back attempts (see src/keeper.rs); started by tmpfsctl itself.
    #[command(name = "keep-deletions", hide = true)]
    KeepDeletions { name: String, parent: i32 },
}

#[derive(Subcommand)]
enum BootAction {
    /// Write (and enable) the boot artifacts for SPEC; idempotent.
    Install {
        spec: PathBuf,
        #[arg(long, value_enum, default_value_t = boot::Mode::Systemd)]
        mode: boot::Mode,
        /// Install into this root directory (an image or container tree).
        #[arg(long, default_value = "/")]
        root: PathBuf,
        /// Path of tmpfsctl as the booted system sees it (default: this binary).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Path of the spec as the booted system sees it (default: SPEC, made absolute).
        #[arg(long)]
        spec_path: Option<PathBuf>,
        /// Start and stop timeout of the apply unit (seeding, write-back)
        /// [default: from the spec's sizes, at least 15min; see docs/boot.md].
        #[arg(long)]
        timeout: Option<String>,
        #[command(flatten)]
        output: Output,
    },
    /// Remove everything `boot install` wrote under the root.
    Remove {
        /// Accepted for symmetry with install; the manifest says what to remove.
        spec: Option<PathBuf>,
        #[arg(long, default_value = "/")]
        root: PathBuf,
        #[command(flatten)]
        output: Output,
    },
}

/// Runs the command line and returns the exit status.
pub fn main() -> i32 {
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    if Path::new(&argv0).file_name() == Some(boot::helper::NAME.as_ref()) {
        return boot::helper::main(args.collect());
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap's own printing returns write errors rather than panicking.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::BadInput
            } else {
                ExitCode::Ok
            }
            .code();
        }
    };
    if !matches!(cli.command, Command::Agent { .. }) {
        // Warnings of a command (a conflict kept, a watch that overflowed) reach the
        // operator; the agent sets up its own logging.
        crate::logging::init("warn", false);
    }
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            let (code, text) = describe_error(&e);
            out::eprint(&text);
            code
        }
    };
    crate::logging::flush(std::time::Duration::from_secs(2));
    match out::stdout_failure() {
        Some(why) => {
            out::eprint(&format!("error: writing the output: {}\n", escape(&why)));
            code.max(ExitCode::Failed).code()
        }
        None => code.code(),
    }
}

/// The exit status of an error and its message, host strings escaped.
fn describe_error(e: &anyhow::Error) -> (ExitCode, String) {
    if let Some(SpecLoadError::Invalid(se)) = e.downcast_ref::<SpecLoadError>() {
        return (ExitCode::BadInput, escape_lines(&se.to_string()));
    }
    let plain = |code| (code, format!("error: {}\n", escape(&e.to_string())));
    if let Some(SpecLoadError::Read { .. } | SpecLoadError::Untrusted { .. }) =
        e.downcast_ref::<SpecLoadError>()
    {
        return plain(ExitCode::BadInput);
    }
    if let Some(LockError::Unsafe(_)) = e.downcast_ref::<LockError>() {
        return plain(ExitCode::BadInput);
    }
    if e.downcast_ref::<crate::error::UnknownName>().is_some()
        || e.downcast_ref::<crate::error::BadInput>().is_some()
    {
        return plain(ExitCode::BadInput);
    }
    if let Some(LockError::Busy { .. }) = e.downcast_ref::<LockError>() {
        return plain(ExitCode::Busy);
    }
    (
        ExitCode::Failed,
        format!("error: {}\n", escape(&format!("{e:#}"))),
    )
}

/// Escapes each line of a message whose line breaks are its own layout (a
/// spec diagnostic with its snippet).
fn escape_lines(text: &str) -> String {
    text.split('\n').map(escape).collect::<Vec<_>>().join("\n")
}

fn load(path: &Path, host: &Host) -> Result<Spec> {
    let mem = host.meminfo()?;
    Ok(spec::load(path, mem.mem_total)?)
}

/// [`load`], with paths, users and groups checked in the tree `root`
/// (an image or container) unless it is `None` or `/`.
fn load_in(path: &Path, host: &Host, root: Option<&Path>) -> Result<Spec> {
    let paths = match root {
        None => spec::Paths::Check,
        Some(r) if r == Path::new("/") => spec::Paths::Check,
        Some(r) => spec::Paths::Under(r.to_path_buf()),
    };
    let mem = host.meminfo()?;
    Ok(spec::load_with(path, mem.mem_total, paths)?)
}

/// For the commands that find their mounts in the mount table: a renamed or
/// missing managed path is that mount's problem, not the whole spec's.
fn load_as_written(path: &Path, host: &Host) -> Result<Spec> {
    let mem = host.meminfo()?;
    Ok(spec::load_with(path, mem.mem_total, spec::Paths::AsWritten)?)
}

/// Paths read from the host are written lossily (see [`out::lossy`]); one
/// that only the command line or the state directory could make non-UTF-8
/// ends the report with an error instead.
fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut text = serde_json::to_string_pretty(v).context("writing the JSON report")?;
    text.push('\n');
    out::print(&text);
    Ok(())
}

fn need_root(what: &str) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("`tmpfsctl {what}` mounts and unmounts filesystems and must run as root");
    }
    Ok(())
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    match spec::parse_duration_ms(text)? {
        ms @ 100..=3_600_000 => Ok(Duration::from_millis(ms)),
        _ => Err("the interval must be from 100ms to 1h".into()),
    }
}

fn parse_metrics(text: &str) -> Result<spec::MetricsTarget, String> {
    spec::metrics_target(text)
}

/// One arm per command: the whole dispatch in one place, so it stays long;
/// each command's work is in its own module.
fn run(cli: Cli) -> Result<ExitCode> {
    let host = Host::from_env();
    // Absolute, as the units and the deletion keeper it starts (which leaves the
    // working directory) must see it.
    let state_dir = std::path::absolute(&cli.state_dir)
        .with_context(|| format!("resolving the state directory {}", cli.state_dir.display()))?;
    let state = State::new(state_dir);
    let wait = Duration::from_secs(cli.wait);
    match cli.command {
        Command::Validate { spec, root } => {
            let s = load_in(&spec, &host, root.as_deref())?;
            out::print(&format!(
                "{}: valid, {}\n",
                escape(&spec),
                crate::plural::count(s.mounts.len(), "mount", "mounts")
            ));
            Ok(ExitCode::Ok)
        }
        Command::Schema => {
            out::print(&spec::schema::json());
            Ok(ExitCode::Ok)
        }
        Command::Plan { spec, output } => {
            let s = load(&spec, &host)?;
            let world = observe::observe(&s, &host, &state)?;
            let p = plan::plan(&s, &world, &state);
            if output.json() {
                let plan = serde_json::to_value(&p).context("writing the JSON report")?;
                print_json(&serde_json::json!({ "changed": p.changes(), "plan": plan }))?
            } else {
                out::print(&report::plan(&p));
            }
            Ok(ExitCode::Ok)
        }
        Command::Apply { spec, output } => {
            let s = load(&spec, &host)?;
            need_root("apply")?;
            let _lock = state.lock(wait)?;
            let world = observe::observe(&s, &host, &state)?;
            let p = plan::plan(&s, &world, &state);
            let r = execute::apply(
                &s,
                &p,
                &state,
                &execute::ApplyOptions {
                    progress: !output.json(),
                },
            )?;
            output.print(&r, report::apply)?;
            Ok(r.exit_code())
        }
        Command::Status { spec, output } => {
            let s = spec.as_deref().map(|p| load_as_written(p, &host)).transpose()?;
            let r = status::status(s.as_ref(), &host, &state)?;
            output.print(&r, report::status)?;
            Ok(ExitCode::Ok)
        }
        Command::Boot {
            action:
                BootAction::Install {
                    spec,
                    mode,
                    root,
                    binary,
                    spec_path,
                    timeout,
                    output,
                },
        } => {
            let s = load_in(&spec, &host, Some(&root))?;
            let r = boot_install(&s, &spec, mode, &root, binary, spec_path, timeout)?;
            output.print(&r, report::boot)?;
            Ok(ExitCode::Ok)
        }
        Command::Boot {
            action: BootAction::Remove { spec, root, output },
        } => {
            if let Some(spec) = &spec {
                load(spec, &host)?;
            }
            let r = boot::remove(&root)?;
            output.print(&r, report::boot)?;
            Ok(ExitCode::Ok)
        }
        Command::Sync {
            spec,
            names,
            full,
            output,
        } => {
            let s = load_as_written(&spec, &host)?;
            need_root("sync")?;
            let _lock = state.lock(wait)?;
            let r = sync::sync(&s, &names, &host, &state, "sync", full)?;
            output.print(&r, |r| report::sync(r))?;
            Ok(ExitCode::failed_if(
                r.iter().any(|x| x.result == sync::SyncOutcome::Failed),
            ))
        }
        Command::Completions { shell } => {
            out::print(&completions(shell));
            Ok(ExitCode::Ok)
        }
        Command::Manpage => {
            out::print(&manpage()?);
            Ok(ExitCode::Ok)
        }
        Command::Residency { args, output } => residency::run(&args, output.json()),
        Command::Bench { args, output } => diskbench::run(&args, output.json(), &state),
        Command::Advise { args, output } => advise::run(&args, output.json()),
        Command::Agent {
            spec,
            interval,
            metrics,
            no_fanotify,
        } => {
            load(&spec, &host)?;
            need_root("agent")?;
            agent::run(
                &spec,
                host,
                state,
                agent::AgentOptions {
                    interval,
                    metrics,
                    fanotify: !no_fanotify,
                    wait,
                },
            )
        }
        Command::KeepDeletions { name, parent } => keeper::run(&state, &name, parent),
        Command::Down { spec, names, output } => {
            let s = load_as_written(&spec, &host)?;
            need_root("down")?;
            let _lock = state.lock(wait)?;
            // systemd sends SIGTERM once the stop timeout is over and SIGKILL a
            // timeout later: what the write-back has not put on disk by then is
            // lost at the reboot, so it uses that second window too. SIGKILL (or
            // SIGINT) stops it; the RAM copy then stays held for a retry.
            let _finish = crate::signals::SignalGuard::install_for(&[
                nix::sys::signal::Signal::SIGTERM,
                nix::sys::signal::Signal::SIGHUP,
            ])?;
            let r = down::down(&s, &names, &host, &state)?;
            if crate::signals::interrupted() {
                tracing::warn!("SIGTERM or SIGHUP came during `down`: it finished first");
            }
            output.print(&r, |r| report::down(r))?;
            Ok(ExitCode::failed_if(r.iter().any(|d| {
                matches!(d.result, down::DownOutcome::Refused | down::DownOutcome::Failed)
                    || d.syncs.iter().any(|s| s.result == sync::SyncOutcome::Failed)
            })))
        }
    }
}

/// `boot install`: the paths as the booted system sees them default to the
/// spec's absolute path and this binary.
fn boot_install(
    s: &Spec,
    spec: &Path,
    mode: boot::Mode,
    root: &Path,
    binary: Option<PathBuf>,
    spec_path: Option<PathBuf>,
    timeout: Option<String>,
) -> Result<boot::BootReport> {
    let spec_path = match spec_path {
        Some(p) => p,
        None => std::path::absolute(spec).with_context(|| format!("resolving {}", spec.display()))?,
    };
    let binary = match binary {
        Some(b) => b,
        None => std::env::current_exe().context("finding this binary's path; pass --binary")?,
    };
    let timeout = timeout.unwrap_or_else(|| boot::default_timeout(s));
    let cx = boot::context(s, spec_path, binary, timeout)?;
    boot::install(&cx, mode, root)
}

/// Generated whole first: clap_complete panics on a failed write.
fn completions(shell: clap_complete::Shell) -> String {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut text = Vec::new();
    clap_complete::generate(shell, &mut cmd, "tmpfsctl", &mut text);
    String::from_utf8_lossy(&text).into_owned()
}

fn manpage() -> Result<String> {
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut text = Vec::new();
    clap_mangen::Man::new(cmd)
        .section("8")
        .render(&mut text)
        .context("rendering the manual page")?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}
