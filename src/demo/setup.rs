//! What the demo is made of: its people, channels and secrets, the `steward.toml` it writes,
//! the environment Steward's [`Settings`](crate::config::Settings) load from, and the Slack
//! simulator's options. Pure values (the one exception is the random secrets); it starts nothing.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

use super::DemoOptions;
use crate::sim::e2b::SimServer;
use crate::sim::slack::{SlackSim, SlackSimOptions};

/// Someone on the demo's page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Person {
    pub id: &'static str,
    pub name: &'static str,
    /// What the page's people menu says about them.
    pub label: &'static str,
}

/// May decide every option, Kill included.
pub const APPROVER: Person = Person {
    id: "U0DEMOERIN",
    name: "erin",
    label: "approver",
};
/// Asks for things (and owns some of the fleet); not an approver of Kill.
pub const REQUESTER: Person = Person {
    id: "U0DEMODANA",
    name: "dana",
    label: "requester",
};
/// Neither: Kill is refused.
pub const NON_APPROVER: Person = Person {
    id: "U0DEMOFRANK",
    name: "frank",
    label: "not an approver",
};
/// Everyone, in the page's menu order.
pub const PEOPLE: [Person; 3] = [APPROVER, REQUESTER, NON_APPROVER];

/// The demo's channels: `(name, id)`.
pub const CHANNELS: [(&str, &str); 4] = [
    ("approvals", APPROVALS_CHANNEL),
    ("hygiene", HYGIENE_CHANNEL),
    ("engineering", ENGINEERING_CHANNEL),
    ("runs", RUNS_CHANNEL),
];
pub const APPROVALS_CHANNEL: &str = "C0DEMOAPPROVALS";
pub const HYGIENE_CHANNEL: &str = "C0DEMOHYGIENE";
pub const ENGINEERING_CHANNEL: &str = "C0DEMOENG";
pub const RUNS_CHANNEL: &str = "C0DEMORUNS";

/// The demo's `[hygiene] list_from`: the story fleet's opening sweep finds 17 idle sandboxes
/// to decide (10 to pause, 7 to snapshot, then kill), under the default 25, so without this the
/// newcomer would only ever see one card per sandbox and never the list decision Steward makes
/// for a large fleet (a group at a time: Approve, Review individually, Exclude…).
pub const DEMO_LIST_FROM: usize = 10;

/// The bot token Steward sends the Slack simulator (which checks only its `xoxb-` shape).
pub const BOT_TOKEN: &str = "xoxb-demo";
/// The `[api.tokens]` name of the demo's agent: the requester on its run card.
pub const AGENT_NAME: &str = "demo-agent";
/// The push test's repository, as GitHub would name it.
pub const REPOSITORY: &str = "demo/checkout";

/// Secrets made up for one demo, never printed (the agent token excepted: it is the demo's
/// to hand out).
#[derive(Clone)]
pub struct Secrets {
    pub signing: SecretString,
    pub e2b_key: SecretString,
    pub webhook: SecretString,
    pub agent_token: SecretString,
    /// The app-level token (`xapp-…`) the Slack simulator accepts and Steward connects over
    /// Socket Mode with; used only with `--socket-mode`.
    pub app_token: SecretString,
}

impl Secrets {
    pub fn generate() -> Secrets {
        let random = || uuid::Uuid::new_v4().simple().to_string();
        Secrets {
            signing: SecretString::from(random()),
            e2b_key: SecretString::from(format!("e2b_demo_{}", random())),
            webhook: SecretString::from(random()),
            agent_token: SecretString::from(format!("demo-agent-{}", random())),
            app_token: SecretString::from(format!("xapp-demo-{}", random())),
        }
    }
}

/// The demo's `steward.toml`: channels, the approver, the owners the digest mentions, the
/// agent's token (as its SHA-256, as always) and, when a repository was made, its push test.
pub fn policy(secrets: &Secrets, clone_url: Option<&str>) -> String {
    let token_hash = hex::encode(Sha256::digest(
        secrets.agent_token.expose_secret().as_bytes(),
    ));
    let approver = APPROVER.id;
    let mut text = format!(
        r#"# Written by `steward demo`.
[channels]
approvals = "{APPROVALS_CHANNEL}"
hygiene = "{HYGIENE_CHANNEL}"
runs = "{RUNS_CHANNEL}"
engineering = "{ENGINEERING_CHANNEL}"

[approvals]
decide_within = "24h"
two_person_rule = true

[approvals.approvers]
snapshot_then_kill = {{ users = ["{approver}"] }}
kill = {{ users = ["{approver}"] }}
delete_template = {{ users = ["{approver}"] }}

[hygiene]
list_from = {DEMO_LIST_FROM}

[hygiene.owners]
dana = "{dana}"
erin = "{approver}"

[runs]
default_timeout = "2m"
max_timeout = "10m"

[api.tokens.{AGENT_NAME}]
sha256 = ["{token_hash}"]
allow = ["run", "read", "request_kill", "request_delete_template"]
"#,
        dana = REQUESTER.id,
    );
    if let Some(url) = clone_url {
        text.push_str(&format!(
            r#"
[[push_tests]]
repository = "{REPOSITORY}"
branches = ["main"]
template = "base"
command = "sh run-tests.sh"
timeout = "2m"
channel = "{ENGINEERING_CHANNEL}"
clone_url = "{url}"
authors = {{ "dana@example.com" = "{dana}" }}
"#,
            dana = REQUESTER.id,
        ));
    }
    text
}

/// The environment Steward's settings load from, as `steward serve` would find it.
pub fn environment(
    listen: SocketAddr,
    slack: &SlackSim,
    e2b: &SimServer,
    secrets: &Secrets,
    policy: &Path,
    opts: &DemoOptions,
) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = [
        ("STEWARD_LISTEN", listen.to_string()),
        ("STEWARD_CONFIG", policy.display().to_string()),
        ("SLACK_API_URL", slack.api_url()),
        ("SLACK_BOT_TOKEN", BOT_TOKEN.to_owned()),
        (
            "SLACK_SIGNING_SECRET",
            secrets.signing.expose_secret().to_owned(),
        ),
        ("E2B_API_URL", e2b.base_url()),
        ("E2B_API_KEY", secrets.e2b_key.expose_secret().to_owned()),
        ("E2B_PROJECT_ID", e2b.team_id().to_owned()),
        ("E2B_SANDBOX_URL", e2b.envd_url()),
        (
            "GITHUB_WEBHOOK_SECRET",
            secrets.webhook.expose_secret().to_owned(),
        ),
        ("HOSTNAME", "demo".to_owned()),
        // A fresh prefix, so a demo never finds another demo's cases in a shared Redis.
        (
            "STEWARD_REDIS_PREFIX",
            format!("steward-demo-{}", uuid::Uuid::new_v4().simple()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Some(url) = &opts.redis_url {
        env.insert("REDIS_URL".into(), url.expose_secret().to_owned());
    }
    if opts.socket_mode {
        env.insert(
            "SLACK_APP_TOKEN".into(),
            secrets.app_token.expose_secret().to_owned(),
        );
    }
    env
}

/// The options `steward demo` starts the Slack simulator with: its page lists the demo's
/// channels and people, and signs what they type and click with Steward's signing secret.
/// In Socket Mode the simulator accepts only the demo's app token and has no request URL, as
/// Slack ignores an app's request URLs once Socket Mode is on: the page acts over Steward's
/// connection alone.
pub fn slack_sim_options(
    listen: SocketAddr,
    steward_url: &str,
    secrets: &Secrets,
    socket_mode: bool,
) -> SlackSimOptions {
    SlackSimOptions {
        listen,
        users: PEOPLE
            .iter()
            .map(|p| (p.id.to_owned(), Some(p.name.to_owned())))
            .collect(),
        groups: Vec::new(),
        seed: None,
        channels: CHANNELS
            .iter()
            .map(|(name, id)| crate::sim::slack::SimChannel {
                id: (*id).to_owned(),
                name: (*name).to_owned(),
            })
            .collect(),
        people: PEOPLE
            .iter()
            .map(|p| crate::sim::slack::Person {
                id: p.id.to_owned(),
                label: p.label.to_owned(),
            })
            .collect(),
        steward_url: (!socket_mode).then(|| steward_url.to_owned()),
        signing_secret: Some(secrets.signing.clone()),
        app_token: socket_mode.then(|| secrets.app_token.clone()),
        ..SlackSimOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_policy_loads_and_names_the_approver_and_the_push_test() {
        let secrets = Secrets::generate();
        let text = policy(&secrets, Some("file:///tmp/checkout"));
        let parsed = crate::config::Policy::parse(&text).expect("the demo's policy parses");
        assert_eq!(
            parsed.channels.hygiene.as_deref(),
            Some(HYGIENE_CHANNEL),
            "{text}"
        );
        assert_eq!(parsed.push_tests.len(), 1);
        assert_eq!(parsed.hygiene.list_from, DEMO_LIST_FROM, "{text}");
        assert_eq!(parsed.push_tests[0].repository, REPOSITORY);
        assert!(text.contains(APPROVER.id));
        assert!(
            !text.contains(secrets.agent_token.expose_secret()),
            "only the token's hash is written"
        );
        let without = crate::config::Policy::parse(&policy(&secrets, None)).unwrap();
        assert!(without.push_tests.is_empty());
    }

    #[test]
    fn socket_mode_pins_the_app_token_and_leaves_the_simulator_no_request_url() {
        let secrets = Secrets::generate();
        let token = secrets.app_token.expose_secret();
        assert!(token.starts_with("xapp-demo-"), "an app-level token");
        assert_ne!(token, Secrets::generate().app_token.expose_secret());
        let listen = SocketAddr::from(([127, 0, 0, 1], 0));

        let socket = slack_sim_options(listen, "http://127.0.0.1:9", &secrets, true);
        assert_eq!(
            socket.app_token.as_ref().map(|t| t.expose_secret()),
            Some(token)
        );
        assert_eq!(socket.steward_url, None, "Slack sends nothing over HTTP");
        assert!(
            !format!("{socket:?}").contains(token),
            "the options' Debug hides the token"
        );

        let http = slack_sim_options(listen, "http://127.0.0.1:9", &secrets, false);
        assert!(http.app_token.is_none(), "without the flag nothing changes");
        assert_eq!(http.steward_url.as_deref(), Some("http://127.0.0.1:9"));
    }
}
