//! Command-line types (clap derive), cargo-style.
//!
//! Owns flag names, help text and parsing only: no hashing, JSON-RPC or spawning. Cargo invokes
//! a subcommand binary as `cargo-mcp-dev mcp-dev ARGS…`, hence `bin_name = "cargo"` and the outer
//! [`Cargo::McpDev`] wrapper (the nextest layout).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::identity::build::CargoSelection;
pub use crate::identity::config::RestartMode;

#[derive(Debug, Parser)]
#[command(name = "cargo", bin_name = "cargo", styles = clap_cargo_styles())]
pub enum Cargo {
    /// cargo run for MCP servers: build, fingerprint, supervise and hot-swap with execution epochs.
    #[command(
        name = "mcp-dev",
        version,
        after_help = docs_help(),
        after_long_help = format!("{}\n{}", crate::base::exit_codes::help_table(), docs_help())
    )]
    McpDev(McpDev),
}

/// `cargo mcp-dev`: cargo run for MCP servers, with execution epochs, catalog revisions and
/// approvals that do not carry over to code nobody approved.
#[derive(Debug, Args)]
#[command(
    about = "cargo run for MCP servers: build, fingerprint, supervise and hot-swap with execution epochs",
    long_about = "cargo run for MCP servers.\n\n\
        Point your MCP host at `cargo mcp-dev run` instead of `cargo run`: it builds the server, \
        captures the identity of exactly what will run, starts it under supervision, proxies the \
        host's JSON-RPC, rebuilds on change and makes each rebuild visible: a new execution epoch \
        for new code, a new catalog revision when the tool metadata changes, and approvals that do \
        not silently carry over to code nobody approved. Status goes to stderr; stdout of `run` \
        belongs to JSON-RPC."
)]
pub struct McpDev {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Help headings, in the order cargo shows them (`cargo run --help`), then ours.
pub mod heading {
    pub const PACKAGE: &str = "Package Selection";
    pub const COMPILATION: &str = "Compilation Options";
    pub const MANIFEST: &str = "Manifest Options";
    /// `run`'s own options: restart mode, debounce, watching, approvals, first start.
    pub const RUN: &str = "Run Options";
    pub const OUTPUT: &str = "Output";
    /// The build `new` and `init` end with.
    pub const FIRST_BUILD: &str = "First Build";
}

/// The one help text of `--message-format`, in every command that has it.
pub const MESSAGE_FORMAT_HELP: &str = "How status is reported: `human` lines on stderr, or `json` \
    (one JSON object per event, on stdout for `build` and `check`, on stderr for `run`, whose \
    stdout is JSON-RPC)";

#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Use verbose output (-vv very verbose).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = heading::OUTPUT)]
    pub verbose: u8,
    /// Do not print cargo log messages or progress (status lines are still printed).
    #[arg(short, long, global = true, help_heading = heading::OUTPUT)]
    pub quiet: bool,
    /// Coloring: auto, always, never (default from CARGO_TERM_COLOR, else auto).
    #[arg(
        long,
        global = true,
        value_name = "WHEN",
        env = "CARGO_TERM_COLOR",
        help_heading = heading::OUTPUT
    )]
    pub color: Option<ColorChoice>,
}

impl GlobalArgs {
    /// The status lines' options as plain data.
    pub fn status_options(&self) -> crate::screen::stderr::Options {
        crate::screen::stderr::Options {
            color: match self.color.unwrap_or(ColorChoice::Auto) {
                ColorChoice::Always => Some(true),
                ColorChoice::Never => Some(false),
                ColorChoice::Auto => None,
            },
            quiet: self.quiet,
            verbose: self.verbose,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum MessageFormat {
    /// Status lines on stderr.
    #[default]
    Human,
    /// One JSON object per event on stdout (`run`: on stderr, since stdout is JSON-RPC).
    Json,
}

/// An approval channel (`--approval-channels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ChannelArg {
    /// `cargo mcp-dev approve` over the owner-only control socket.
    Terminal,
    /// A prompt in the host (elicitation).
    Host,
}

impl RunArgs {
    /// The approval channels: `--approval-channels` wins over the config's `approval-channels`
    /// (validated when the table was read); `None` when neither is set (the session's default
    /// applies).
    pub fn approval_channel_set(
        &self,
        config: &crate::identity::config::McpDevConfig,
    ) -> Option<std::collections::BTreeSet<crate::policy::approval::Channel>> {
        use crate::policy::approval::Channel;
        if !self.approval_channels.is_empty() {
            return Some(
                self.approval_channels
                    .iter()
                    .map(|f| match f {
                        ChannelArg::Terminal => Channel::Terminal,
                        ChannelArg::Host => Channel::Host,
                    })
                    .collect(),
            );
        }
        config.approval_channels.as_ref().map(|s| {
            s.names()
                .into_iter()
                .filter_map(|n| match n {
                    "terminal" => Some(Channel::Terminal),
                    "host" => Some(Channel::Host),
                    _ => None,
                })
                .collect()
        })
    }
}

/// `--restart` takes the config's restart modes (help text per mode below).
impl ValueEnum for RestartMode {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            RestartMode::Supervise,
            RestartMode::Disconnect,
            RestartMode::Manual,
        ]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            RestartMode::Supervise => {
                "Keep the host connection, replace the child, publish the new epoch and gate calls until catalog and grants are current"
            }
            RestartMode::Disconnect => {
                "On a new build, fail in-flight calls and close the connection: the host must reconnect"
            }
            RestartMode::Manual => {
                "Never restart by itself; `cargo mcp-dev restart` applies the latest build"
            }
        };
        Some(clap::builder::PossibleValue::new(self.as_str()).help(help))
    }
}

/// The cargo flags passed through to `cargo build` / `cargo metadata`, under cargo's headings.
#[derive(Debug, Args, Clone, Default)]
pub struct CargoArgs {
    /// Package with the server binary.
    #[arg(short, long, value_name = "SPEC", help_heading = heading::PACKAGE)]
    pub package: Option<String>,
    /// Server binary target (default: `bin` from [package.metadata.mcp-dev], else the only bin, else the package's `default-run`).
    #[arg(long, value_name = "NAME", help_heading = heading::PACKAGE)]
    pub bin: Option<String>,
    /// Build with the release profile.
    #[arg(short = 'r', long, conflicts_with = "profile", help_heading = heading::COMPILATION)]
    pub release: bool,
    /// Build with the given profile.
    #[arg(long, value_name = "PROFILE-NAME", help_heading = heading::COMPILATION)]
    pub profile: Option<String>,
    /// Space or comma separated list of features to activate.
    #[arg(short = 'F', long, value_name = "FEATURES", help_heading = heading::COMPILATION)]
    pub features: Vec<String>,
    /// Activate all available features.
    #[arg(long, help_heading = heading::COMPILATION)]
    pub all_features: bool,
    /// Do not activate the `default` feature.
    #[arg(long, help_heading = heading::COMPILATION)]
    pub no_default_features: bool,
    /// Build for the target triple.
    #[arg(long, value_name = "TRIPLE", help_heading = heading::COMPILATION)]
    pub target: Option<String>,
    /// Directory for all generated artifacts.
    #[arg(long, value_name = "DIRECTORY", help_heading = heading::COMPILATION)]
    pub target_dir: Option<PathBuf>,
    /// Path to Cargo.toml.
    #[arg(long, value_name = "PATH", help_heading = heading::MANIFEST)]
    pub manifest_path: Option<PathBuf>,
    /// Assert that Cargo.lock will remain unchanged.
    #[arg(long, help_heading = heading::MANIFEST)]
    pub locked: bool,
    /// Run without accessing the network.
    #[arg(long, help_heading = heading::MANIFEST)]
    pub offline: bool,
    /// Equivalent to specifying both --locked and --offline.
    #[arg(long, help_heading = heading::MANIFEST)]
    pub frozen: bool,
}

impl CargoArgs {
    /// The same flags as plain data, for the layers below the command line.
    pub fn selection(&self) -> CargoSelection {
        CargoSelection {
            package: self.package.clone(),
            bin: self.bin.clone(),
            release: self.release,
            profile: self.profile.clone(),
            features: self.features.clone(),
            all_features: self.all_features,
            no_default_features: self.no_default_features,
            target: self.target.clone(),
            target_dir: self.target_dir.clone(),
            manifest_path: self.manifest_path.clone(),
            locked: self.locked,
            offline: self.offline,
            frozen: self.frozen,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the server, capture its identity and print the status line (for bacon, cargo-watch, watchexec).
    Build(BuildArgs),
    /// Print the identity record of the current build (`--json`, `--deps`, `--diff OLD.json`).
    Identity(IdentityArgs),
    /// CI gate: build with --locked and fail when identity cannot be captured or differs from --expect.
    Check(CheckArgs),
    /// Build, start and supervise the server, proxying the host's JSON-RPC on stdin/stdout.
    Run(RunArgs),
    /// Ask the running supervisor to apply the latest build now (restart mode `manual`).
    Restart(ControlArgs),
    /// Approve tools for the current execution epoch of the running supervisor (human channel).
    Approve(ApproveArgs),
    /// Show the running supervisor's state: epoch, catalog revisions, grants, recent denials;
    /// `--follow`: its status lines as they are written (hosts hide them after connect).
    Status(StatusArgs),
    /// Verify or show the audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Add cargo mcp-dev configuration, host snippets and CI templates to an existing server
    /// package, then build it once (`--no-build` skips) so the first host connect is warm.
    Init(InitArgs),
    /// Create a new MCP server package (rmcp) ready for `cargo mcp-dev run`, then build it once
    /// (`--no-build` skips) so the first host connect is warm.
    New(NewArgs),
    /// Play a whole session on a throwaway server: approve, call, rebuild, stale denial, re-approve, audit.
    Demo(DemoArgs),
    /// Internal: finish a build a host abandoned, bounded in time (started by `run`).
    #[command(hide = true)]
    BackgroundBuild(BackgroundBuildArgs),
}

#[derive(Debug, Args)]
pub struct BackgroundBuildArgs {
    /// Where cargo's output goes.
    #[arg(long, value_name = "PATH")]
    pub log: PathBuf,
    /// The build is stopped after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub timeout_secs: u64,
    /// The cargo command line.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    #[command(flatten)]
    pub cargo: CargoArgs,
    #[arg(long, value_enum, default_value_t = MessageFormat::Human, value_name = "FMT", help = MESSAGE_FORMAT_HELP, help_heading = heading::OUTPUT)]
    pub message_format: MessageFormat,
}

#[derive(Debug, Args)]
pub struct IdentityArgs {
    #[command(flatten)]
    pub cargo: CargoArgs,
    /// Print the whole record as JSON.
    #[arg(long)]
    pub json: bool,
    /// List the resolved dependency set (package id, version, source, checksum, features).
    #[arg(long)]
    pub deps: bool,
    /// Say what changed between OLD.json and the current identity (or NEW with --against).
    #[arg(long, value_name = "OLD.json")]
    pub diff: Option<PathBuf>,
    /// With --diff: compare against this record instead of building.
    #[arg(long, value_name = "NEW.json", requires = "diff")]
    pub against: Option<PathBuf>,
    /// Read the last recorded identity instead of building.
    #[arg(long)]
    pub no_build: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub cargo: CargoArgs,
    /// Fail unless the identity matches this record: every component, and the launch arguments;
    /// the launch directory only with --include-launch-dir (names what differs).
    #[arg(long, value_name = "FILE")]
    pub expect: Option<PathBuf>,
    /// With --expect: also compare the directory the command was started from.
    #[arg(long, requires = "expect")]
    pub include_launch_dir: bool,
    /// Write the captured identity record here (for CI artifacts).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Do not pass --locked to cargo (the lockfile must still exist).
    #[arg(long)]
    pub no_locked: bool,
    #[arg(long, value_enum, default_value_t = MessageFormat::Human, value_name = "FMT", help = MESSAGE_FORMAT_HELP, help_heading = heading::OUTPUT)]
    pub message_format: MessageFormat,
}

#[derive(Debug, Args)]
#[command(next_help_heading = heading::RUN)]
pub struct RunArgs {
    #[command(flatten)]
    pub cargo: CargoArgs,
    // Run Options (the heading above): restart mode, debounce and watching, approvals, first
    // start. New `run` options go with these.
    /// What to do when a new build changes the identity.
    #[arg(long, value_enum, value_name = "MODE")]
    pub restart: Option<RestartMode>,
    /// Quiet period after the last file change, in milliseconds [default: 50]: a new build is
    /// served only once the sources were quiet this long. The build itself starts at the first
    /// change (a save is built while the quiet period runs) and is set aside if a change came
    /// after it began. A change during a build queues exactly one more build.
    #[arg(long, value_name = "MS")]
    pub debounce: Option<u64>,
    /// Do not watch sources (build once, restart only on `cargo mcp-dev restart`).
    #[arg(long)]
    pub no_watch: bool,
    /// Gate no tool (recorded in the status line and the audit log).
    #[arg(long)]
    pub no_gating: bool,
    /// Exempt this tool from approval, on top of `exempt` in the config (repeatable).
    #[arg(long = "exempt", value_name = "TOOL", conflicts_with = "no_gating")]
    pub exempt: Vec<String>,
    /// Require a decision for every call of this tool, on top of `per-call` (repeatable).
    #[arg(long = "per-call", value_name = "TOOL", conflicts_with = "no_gating")]
    pub per_call: Vec<String>,
    /// Audit log path (default: target/mcp-dev/audit/<label>.jsonl).
    #[arg(long, value_name = "PATH")]
    pub audit_log: Option<PathBuf>,
    /// When the audit log is fsynced: `never`; `boundaries` (each new epoch and exit); `every`
    /// (every write; survives a power loss at a cost per call). Every setting survives a crash
    /// of the supervisor: records are written before a call is forwarded.
    /// [config: audit-fsync] [default: boundaries]
    #[arg(long, value_name = "WHEN", value_parser = ["never", "boundaries", "every"])]
    pub audit_fsync: Option<String>,
    /// How long requests wait for the first server of the session (e.g. `25s`, `90s`); then
    /// `tools/list` gets the last catalog a real server of this package returned, or an error
    /// that says the server is still building. A server that has not answered `initialize`
    /// in this time (at least 5 s) is stopped as one that cannot serve. Keep it under your
    /// host's connect timeout (Claude Code: 30 s by default). [config: first-start-budget]
    /// [default: 25s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub first_start_budget: Option<std::time::Duration>,
    /// How long `initialize` waits for the server's own answer before it is given the answer
    /// a server of this package gave to the same protocol version in an earlier run (when one
    /// is recorded; otherwise it waits up to the first-start budget, then gets an error that
    /// says the server is still building). [config: handshake-wait] [default: 5s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub handshake_wait: Option<std::time::Duration>,
    /// How long a host's `server/discover` probe (2026-07-28 clients) waits for a real server's
    /// answer before the host is told to use `initialize`. Keep it under your host's probe
    /// timeout (Claude Code gives up after about 3 s). [config: discover-wait] [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub discover_wait: Option<std::time::Duration>,
    /// When the first build fails: `none` answers requests with the compiler error until a
    /// build succeeds; `last-good` runs the last successfully built server from the store
    /// (said in the status line and the launch record). [config: fallback] [default: none]
    #[arg(long, value_enum, value_name = "WHAT")]
    pub fallback: Option<FallbackMode>,
    /// Who may grant approvals, comma-separated: `terminal` (`cargo mcp-dev approve`, the strict
    /// setting), `host` (a prompt in the host via elicitation: whoever answers the host's
    /// prompts approves). [config: approval-channels] [default: both when the host declared
    /// elicitation, else terminal]
    #[arg(
        long,
        value_enum,
        value_name = "CHANNELS",
        value_delimiter = ',',
        conflicts_with = "no_gating"
    )]
    pub approval_channels: Vec<ChannelArg>,
    /// How long a gated call waits for an answer to its prompt in the host before it is
    /// refused (keep it under the host's request timeout, 60 s in the MCP SDKs).
    /// [config: approval-timeout] [default: 45s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub approval_timeout: Option<std::time::Duration>,
    #[arg(long, value_enum, default_value_t = MessageFormat::Human, value_name = "FMT", help = MESSAGE_FORMAT_HELP, help_heading = heading::OUTPUT)]
    pub message_format: MessageFormat,
    /// Arguments passed to the server.
    #[arg(last = true, value_name = "ARGS")]
    pub server_args: Vec<String>,
}

/// `--fallback`: what runs when the first build fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FallbackMode {
    None,
    LastGood,
}

#[derive(Debug, Args, Clone)]
pub struct ControlArgs {
    /// Path to Cargo.toml of the server package.
    #[arg(long, value_name = "PATH")]
    pub manifest_path: Option<PathBuf>,
    /// Package with the server binary.
    #[arg(short, long, value_name = "SPEC")]
    pub package: Option<String>,
    /// Server label (default: from the package's configuration).
    #[arg(long, value_name = "LABEL")]
    pub label: Option<String>,
    /// Directory for all generated artifacts (where the supervisor's status file lives).
    #[arg(long, value_name = "DIRECTORY")]
    pub target_dir: Option<PathBuf>,
    /// Connect to this control socket instead of finding it from the status file.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub control: ControlArgs,
    /// Approve without asking (scripted use). Needs `--tool` or `--all-requested`: the agent
    /// chooses which tools it asks for, so `--yes` alone would grant whatever it asked.
    #[arg(short, long)]
    pub yes: bool,
    /// Tool to approve (repeatable; default when asking interactively: the tools requested by
    /// pending denials).
    #[arg(long = "tool", value_name = "NAME")]
    pub tools: Vec<String>,
    /// Approve every tool requested by pending denials (with `--yes`: lists them on stderr
    /// before granting).
    #[arg(long, conflicts_with = "tools")]
    pub all_requested: bool,
    /// Credential scope to approve (repeatable; default: the scopes the approved tools use).
    #[arg(long = "credential-scope", value_name = "SCOPE")]
    pub credential_scopes: Vec<String>,
    /// Approve exactly one denied call (its id as `status` lists it): the same tool with the
    /// same arguments, in this epoch, once. Shows the call's arguments first.
    #[arg(long = "call", value_name = "CALL_ID", conflicts_with_all = ["tools", "all_requested", "credential_scopes"])]
    pub call: Option<String>,
    /// List live grants instead of approving.
    #[arg(long, conflicts_with_all = ["revoke", "tools"])]
    pub list: bool,
    /// Stay open as a terminal inbox: show each call waiting for a grant as it arrives (what
    /// changed since the last approved epoch, the call's arguments) and take one key per
    /// decision: o = this call once, t = this tool for this epoch, a = all requested tools,
    /// d = deny (nothing granted), q = quit. Needs a terminal.
    #[arg(long, conflicts_with_all = ["list", "revoke", "tools", "all_requested", "call", "yes", "json"])]
    pub follow: bool,
    /// Revoke a grant by id (or `all`).
    #[arg(long, value_name = "GRANT")]
    pub revoke: Option<String>,
    /// Accept the package's policy (`[package.metadata.mcp-dev]`, with the `run` flags given
    /// here): a change that weakens gating (gate off, a new exempt entry, per-call to
    /// per-epoch) applies only once a human accepted it. Shows what changes and asks; applies
    /// at the next `run`.
    #[arg(long, conflicts_with_all = ["tools", "all_requested", "call", "list", "revoke", "follow", "credential_scopes"])]
    pub policy: bool,
    /// With --policy: accept `run --no-gating` too.
    #[arg(long, requires = "policy")]
    pub no_gating: bool,
    /// With --policy: accept `run --exempt TOOL` too (repeatable).
    #[arg(long = "exempt", value_name = "TOOL", requires = "policy")]
    pub exempt: Vec<String>,
    /// With --policy: the `run --per-call TOOL` flags (repeatable).
    #[arg(long = "per-call", value_name = "TOOL", requires = "policy")]
    pub per_call: Vec<String>,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub control: ControlArgs,
    /// Print the status as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Keep printing the running session's status lines (and its server's stderr) as they are
    /// written, on stdout: across rebuilds, and on to the next `run` when this one ends. Waits
    /// for a session when none runs. Ctrl-C stops.
    #[arg(short, long, conflicts_with = "json")]
    pub follow: bool,
    /// With --follow: the earlier lines of a running session shown first.
    #[arg(
        short = 'n',
        long,
        value_name = "N",
        default_value_t = 10,
        requires = "follow"
    )]
    pub lines: usize,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Verify chain, MACs and anchor; names the first bad record. With `--checkpoint`, also
    /// prove the log still extends a checkpoint kept elsewhere.
    Verify(AuditVerifyArgs),
    /// Print a signed checkpoint of the log's head (seq, hash, epoch, time) on stdout, to keep
    /// where nothing on this machine can change it (a CI artifact, a ticket, another machine);
    /// `audit verify --checkpoint FILE` later proves the log still extends it.
    Checkpoint(AuditPathArgs),
    /// Print the session journal (runs, epochs, grants) and the activity journal (calls and epochs).
    Show(AuditShowArgs),
    /// Print the last records, one line each; with `--follow`, keep printing records as they
    /// are written (`tail -f` cannot follow a live log: see README, "Audit log").
    Tail(AuditTailArgs),
}

#[derive(Debug, Args)]
pub struct AuditTailArgs {
    #[command(flatten)]
    pub log: AuditPathArgs,
    /// How many of the last records to print first.
    #[arg(short = 'n', long, value_name = "N", default_value_t = 10)]
    pub lines: usize,
    /// Keep printing records as they are written, across rotations, until interrupted
    /// (Ctrl-C). Each is checked against the one before it (chain, hash, MAC); a record that
    /// fails stops with an error. A log that does not exist yet is waited for.
    #[arg(short, long)]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct AuditPathArgs {
    /// Audit log (default: the package's log under target/mcp-dev/audit/).
    pub path: Option<PathBuf>,
    #[command(flatten)]
    pub control: ControlArgs,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AuditVerifyArgs {
    #[command(flatten)]
    pub log: AuditPathArgs,
    /// Also prove the log still extends this checkpoint (written by `audit checkpoint`; `-`
    /// reads standard input): a record rewritten at or before it, a cut or a rollback fails,
    /// even when done by someone who holds the key.
    #[arg(long, value_name = "FILE")]
    pub checkpoint: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct AuditShowArgs {
    #[command(flatten)]
    pub log: AuditPathArgs,
    /// Which journal to show.
    #[arg(long, value_enum, default_value_t = Journal::Both)]
    pub journal: Journal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Journal {
    Session,
    Activity,
    Both,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Path to Cargo.toml of the server package.
    #[arg(long, value_name = "PATH")]
    pub manifest_path: Option<PathBuf>,
    /// Server binary target, for packages with several (written as `bin` in the config block).
    #[arg(long, value_name = "NAME")]
    pub bin: Option<String>,
    /// Overwrite files that already exist.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub first_build: FirstBuildArgs,
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// Package name (also the directory created).
    pub name: String,
    /// Create the package here instead of ./NAME.
    #[arg(long, value_name = "DIR")]
    pub path: Option<PathBuf>,
    #[command(flatten)]
    pub first_build: FirstBuildArgs,
}

/// The build `new` and `init` end with: the one `cargo mcp-dev build` does, for what the
/// written host files run (default profile and features), so that a host's first `run`
/// starts warm. Exit code 101 when it fails (the files are written all the same).
#[derive(Debug, Args, Clone, Default)]
pub struct FirstBuildArgs {
    /// Do not build the server at the end (a host's first `run` then builds it, and the host
    /// waits for that build).
    #[arg(long, help_heading = heading::FIRST_BUILD)]
    pub no_build: bool,
    /// Build without accessing the network (passed to cargo).
    #[arg(long, conflicts_with = "no_build", help_heading = heading::FIRST_BUILD)]
    pub offline: bool,
    /// Assert that Cargo.lock will remain unchanged (passed to cargo).
    #[arg(long, conflicts_with = "no_build", help_heading = heading::FIRST_BUILD)]
    pub locked: bool,
    /// Equivalent to specifying both --locked and --offline (passed to cargo).
    #[arg(long, conflicts_with = "no_build", help_heading = heading::FIRST_BUILD)]
    pub frozen: bool,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the generated project (its path is printed) instead of deleting it.
    #[arg(long)]
    pub keep: bool,
    /// Create the demo project here instead of a temporary directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Target directory to reuse between demos (default: $CARGO_TARGET_DIR, else inside the project).
    #[arg(long, value_name = "DIRECTORY")]
    pub target_dir: Option<PathBuf>,
}

/// Sections of the README that `--help` points to, as their headings start.
pub const README_SECTIONS: &[&str] = &[
    "Prerequisites",
    "Install",
    "Run your server under a host",
    "What you see: status lines",
    "Approvals",
    "CI",
    "Benchmarks",
];

/// Where the documentation is: the README and docs/ of the source this binary was built from
/// (`cargo install --path .` and crates.io installs both keep that directory).
fn docs_help() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = root.join("README.md");
    let notes = root.join("docs/protocol-notes.md");
    let missing = |p: &std::path::Path| {
        if crate::base::beneath::followed::is_file(p) {
            String::new()
        } else {
            " (not found: the source was moved)".to_string()
        }
    };
    format!(
        "Documentation:\n  {}{}\n    sections: {}\n  {}{}\n    MCP protocol notes: the two eras, discovery, subscriptions, error codes, stdio framing",
        readme.display(),
        missing(&readme),
        README_SECTIONS.join(", "),
        notes.display(),
        missing(&notes),
    )
}

fn clap_cargo_styles() -> clap::builder::Styles {
    use clap::builder::styling::{AnsiColor, Effects, Styles};
    Styles::styled()
        .header(AnsiColor::Green.on_default() | Effects::BOLD)
        .usage(AnsiColor::Green.on_default() | Effects::BOLD)
        .literal(AnsiColor::Cyan.on_default() | Effects::BOLD)
        .placeholder(AnsiColor::Cyan.on_default())
}
