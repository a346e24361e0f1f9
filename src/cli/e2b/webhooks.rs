//! `steward e2b webhooks register|list|delete`: E2B's lifecycle webhook registrations
//! (`/events/webhooks`). The signature secret comes from `E2B_WEBHOOK_SECRET` (the first, while
//! several are set for a rotation), is sent to E2B once and never printed; E2B never reads it back.
use secrecy::SecretString;

use super::output::Output;
use crate::e2b::{E2bClient, Webhook};

/// The event types Steward acts on, as E2B names them.
const EVENTS: [&str; 5] = [
    "sandbox.lifecycle.created",
    "sandbox.lifecycle.updated",
    "sandbox.lifecycle.paused",
    "sandbox.lifecycle.resumed",
    "sandbox.lifecycle.killed",
];

#[derive(Debug, clap::Subcommand)]
pub enum WebhookAction {
    /// Register this deployment's `/e2b/webhook` with E2B, signed with E2B_WEBHOOK_SECRET.
    Register {
        /// Steward's public base URL (https://steward.example.com) or the full webhook URL;
        /// default STEWARD_PUBLIC_URL.
        #[arg(long, env = "STEWARD_PUBLIC_URL")]
        url: String,
        /// The registration's name in E2B.
        #[arg(long, default_value = "steward")]
        name: String,
    },
    /// List the team's webhook registrations.
    List,
    /// Delete a registration by id (E2B then delivers nothing more to it).
    Delete {
        /// The registration's id, as `steward e2b webhooks list` shows it.
        id: String,
    },
}

/// `https://host` becomes `https://host/e2b/webhook`; a URL that already ends in it stays.
fn webhook_url(url: &str) -> anyhow::Result<String> {
    let url = url.trim().trim_end_matches('/');
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        anyhow::bail!("--url must start with https:// (or http:// for a local rehearsal): {url:?}");
    }
    Ok(if url.ends_with("/e2b/webhook") {
        url.to_owned()
    } else {
        format!("{url}/e2b/webhook")
    })
}

/// The secret a registration is signed with: the first of `E2B_WEBHOOK_SECRET`'s.
fn secret() -> anyhow::Result<SecretString> {
    std::env::var("E2B_WEBHOOK_SECRET")
        .ok()
        .and_then(|v| {
            v.split(',')
                .map(str::trim)
                .find(|s| !s.is_empty())
                .map(|s| SecretString::from(s.to_owned()))
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "E2B_WEBHOOK_SECRET is not set: set it to the secret every replica verifies deliveries with, then register again. Nothing was sent"
            )
        })
}

pub(super) async fn run(
    action: WebhookAction,
    client: &E2bClient,
    out: &Output,
) -> anyhow::Result<()> {
    match action {
        WebhookAction::Register { url, name } => {
            let url = webhook_url(&url)?;
            let secret = secret()?;
            let events: Vec<String> = EVENTS.iter().map(|e| (*e).to_owned()).collect();
            let hook = client
                .register_webhook(&name, &url, &events, &secret)
                .await?;
            out.show(&hook, || pairs(&hook))
        }
        WebhookAction::List => {
            let hooks = client.webhooks().await?;
            out.table(&hooks, &["ID", "NAME", "ENABLED", "URL", "EVENTS"], |h| {
                vec![
                    h.id.clone(),
                    h.name.clone(),
                    if h.enabled { "yes" } else { "no" }.to_owned(),
                    h.url.clone(),
                    short_events(&h.events),
                ]
            })
        }
        WebhookAction::Delete { id } => {
            client.delete_webhook(&id).await?;
            if out.json {
                super::output::print_json(&serde_json::json!({
                    "action": "delete-webhook", "id": id, "ok": true
                }))
            } else {
                println!("Deleted webhook {id}: E2B delivers nothing more to it.");
                Ok(())
            }
        }
    }
}

fn pairs(hook: &Webhook) -> Vec<(&'static str, String)> {
    vec![
        ("registered", hook.id.clone()),
        ("url", hook.url.clone()),
        ("events", short_events(&hook.events)),
        ("secret", "E2B_WEBHOOK_SECRET (not shown)".to_owned()),
    ]
}

/// `created, killed` for E2B's long type names.
fn short_events(events: &[String]) -> String {
    events
        .iter()
        .map(|e| e.strip_prefix("sandbox.lifecycle.").unwrap_or(e))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_gets_the_webhook_path_once() {
        assert_eq!(
            webhook_url("https://s.example.com/").unwrap(),
            "https://s.example.com/e2b/webhook"
        );
        assert_eq!(
            webhook_url("https://s.example.com/e2b/webhook").unwrap(),
            "https://s.example.com/e2b/webhook"
        );
        assert!(webhook_url("s.example.com").is_err());
    }
}
