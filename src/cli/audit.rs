//! `steward audit export [--since 7d]`: the audit log as JSON lines on stdout, oldest first.
//!
//! It reads Redis with the service's settings (`REDIS_URL`, `STEWARD_REDIS_PREFIX`) and must
//! never write to it.
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::config::{ProcessEnv, Settings};
use crate::duration::parse as parse_duration;
use crate::store::Store;

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: AuditCommand,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Write audit events as JSON lines (time, case, subject, actor, action, outcome).
    Export {
        /// Only events from this long ago until now, e.g. 90m, 7d.
        #[arg(long, default_value = "7d")]
        since: String,
    },
}

pub async fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        AuditCommand::Export { since } => {
            let window = parse_duration("--since", &since)?;
            let since = chrono::Utc::now()
                - chrono::Duration::from_std(window)
                    .map_err(|_| anyhow::anyhow!("--since {since} is too long"))?;
            let settings = Settings::load(&ProcessEnv)?;
            let store = Store::from_settings(&settings.redis).await?;
            let stdout = std::io::stdout();
            let count =
                crate::approvals::history::export(&store, since, &mut stdout.lock()).await?;
            tracing::info!(count, "audit events exported");
            Ok(ExitCode::SUCCESS)
        }
    }
}
