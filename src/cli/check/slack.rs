//! `steward check`'s Slack findings: the bot token (`auth.test`), the app token in Socket Mode,
//! every channel `steward.toml` names (`conversations.info`: it exists and the bot is in it, or
//! the `/invite` to type), and every approver user (`users.info`) and user group
//! (`usergroups.users.list`). Reads only.
use std::collections::BTreeMap;

use super::{Findings, REACH_TIMEOUT, unreachable};
use crate::cases::ApproverRule;
use crate::config::Settings;
use crate::ids::SlackChannelId;
use crate::slack::client::{BotIdentity, SlackClient, SlackError};

/// What Slack answers for a bot token it does not take: none sent, unknown, revoked, or of a
/// deactivated account.
const REFUSED_TOKEN: [&str; 4] = [
    "not_authed",
    "invalid_auth",
    "token_revoked",
    "account_inactive",
];

/// Every Slack finding, in the order a person fixes them: the token, then what it reaches.
pub(super) async fn check(settings: &Settings, found: &mut Findings) {
    open_socket(settings, found).await;
    if settings.slack.bot_token.is_none() {
        return;
    }
    let url = &settings.slack.api_url;
    let client = match SlackClient::new(&settings.slack) {
        Ok(client) => client,
        Err(e) => {
            return found.problem(
                "slack",
                unreachable("Slack", url, &e),
                Some("check SLACK_API_URL".into()),
            );
        }
    };
    let bot = match tokio::time::timeout(REACH_TIMEOUT, client.auth_test()).await {
        Ok(Ok(bot)) => bot,
        Ok(Err(SlackError::Api { code })) if REFUSED_TOKEN.contains(&code.as_str()) => {
            return found.problem(
                "slack",
                format!("Slack refused SLACK_BOT_TOKEN ({code})"),
                Some("set it to the Bot User OAuth Token (xoxb-…) of this app, installed in the workspace, from the app's OAuth & Permissions page".into()),
            );
        }
        Ok(Err(e)) => {
            return found.problem(
                "slack",
                unreachable("Slack", url, &e),
                Some("check SLACK_API_URL and that this machine can reach it".into()),
            );
        }
        Err(_) => {
            return found.problem(
                "slack",
                format!(
                    "Slack at {url} did not answer auth.test within {} s",
                    REACH_TIMEOUT.as_secs()
                ),
                Some("check SLACK_API_URL and that this machine can reach it".into()),
            );
        }
    };
    found.ok(
        "slack",
        format!(
            "Slack accepts SLACK_BOT_TOKEN: the bot is {} in the {} workspace",
            mention(&bot),
            bot.team
        ),
    );
    channels(settings, &client, &bot, found).await;
    approvers(settings, &client, found).await;
}

/// `@name` as a person types it in `/invite`; the user id when Slack gave no name.
fn mention(bot: &BotIdentity) -> String {
    match &bot.user {
        Some(name) if !name.is_empty() => format!("@{name}"),
        _ => format!("<@{}>", bot.user_id),
    }
}

/// In Socket Mode, `apps.connections.open` with `SLACK_APP_TOKEN`: proves the token, its scope
/// and that Socket Mode is on. The URL it returns is never connected to and expires unused.
async fn open_socket(settings: &Settings, found: &mut Findings) {
    use crate::slack::socket::{OpenError, SocketClient};
    let Some(socket) = &settings.socket else {
        return;
    };
    let url = &settings.slack.api_url;
    let opened = match SocketClient::new(socket, url) {
        Ok(client) => tokio::time::timeout(REACH_TIMEOUT, client.open()).await,
        Err(e) => Ok(Err(e)),
    };
    let network = Some("check SLACK_API_URL and that this machine can reach it".to_owned());
    match opened {
        Ok(Ok(_url)) => found.ok(
            "slack",
            "Slack accepts SLACK_APP_TOKEN: Socket Mode is on for this app",
        ),
        // The refusal already says what the token must be.
        Ok(Err(e @ OpenError::Refused { .. })) => found.problem("slack", e.to_string(), None),
        Ok(Err(e)) => found.problem(
            "slack",
            unreachable("Slack (Socket Mode)", url, &e),
            network,
        ),
        Err(_) => found.problem(
            "slack",
            format!(
                "Slack at {url} did not answer apps.connections.open within {} s",
                REACH_TIMEOUT.as_secs()
            ),
            network,
        ),
    }
}

/// Every channel `steward.toml` names, each with the keys that name it.
fn configured_channels(settings: &Settings, found: &mut Findings) -> BTreeMap<String, Vec<String>> {
    let policy = &settings.policy;
    let mut named: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |key: &str, id: String| {
        let keys = named.entry(id).or_default();
        if !keys.iter().any(|k| k == key) {
            keys.push(key.to_owned());
        }
    };
    // `approvals` and the hygiene channel are checked (and their mistakes said) with the policy.
    if let Ok(Some(id)) = policy.approvals_channel() {
        add("[channels] approvals", id.as_str().to_owned());
    }
    if let Ok((hygiene, Some(id))) = policy.sweep() {
        let key = if hygiene.channel.is_some() {
            "[hygiene] channel"
        } else {
            "[channels] hygiene"
        };
        add(key, id.as_str().to_owned());
    }
    for (key, text) in [
        ("[channels] runs", &policy.channels.runs),
        ("[channels] engineering", &policy.channels.engineering),
    ] {
        let Some(text) = text else { continue };
        match SlackChannelId::parse(text) {
            Ok(id) => add(key, id.as_str().to_owned()),
            Err(e) => found.problem(
                "channels",
                format!("{key} in steward.toml is not a channel id: {e}"),
                Some("use the channel's id (C…): open the channel's name, the id is at the bottom of About".into()),
            ),
        }
    }
    for rule in &settings.github.push_tests {
        if let Some(id) = &rule.channel {
            add(
                &format!("the push test of {}", rule.repository),
                id.as_str().to_owned(),
            );
        }
    }
    named
}

/// `conversations.info` for each configured channel: it exists, is not archived, and the bot is
/// in it (else the `/invite` to type there).
async fn channels(
    settings: &Settings,
    client: &SlackClient,
    bot: &BotIdentity,
    found: &mut Findings,
) {
    let invite = format!("/invite {}", mention(bot));
    for (id, keys) in configured_channels(settings, found) {
        let keys = keys.join(", ");
        let answer = tokio::time::timeout(REACH_TIMEOUT, client.channel_info(&id)).await;
        match answer {
            Ok(Ok(info)) => {
                let name = info
                    .name
                    .as_deref()
                    .map_or_else(|| id.clone(), |n| format!("#{n} ({id})"));
                let place = info
                    .name
                    .as_deref()
                    .map_or_else(|| format!("channel {id}"), |n| format!("#{n}"));
                if info.is_archived {
                    found.problem(
                        "channels",
                        format!("{name}, named by {keys}, is archived: nothing can be posted there"),
                        Some("unarchive it, or name another channel in steward.toml".into()),
                    );
                } else if !info.is_member {
                    found.problem(
                        "channels",
                        format!("the bot is not in {name}, named by {keys}: it cannot post there"),
                        Some(format!("type `{invite}` in {place}")),
                    );
                } else {
                    found.ok("channels", format!("{place} ({id}, {keys}): the bot is in it"));
                }
            }
            Ok(Err(SlackError::Api { code })) if code == "channel_not_found" => found.problem(
                "channels",
                format!("Slack knows no channel {id} ({keys}), or it is private and the bot is not in it"),
                Some(format!(
                    "check the id (open the channel's name: it is at the bottom of About); for a private channel, type `{invite}` in it"
                )),
            ),
            Ok(Err(SlackError::Api { code })) if code == "missing_scope" => found.problem(
                "channels",
                format!("Slack refused conversations.info for {id} ({keys}): the app lacks a scope (missing_scope)"),
                Some("add the channels:read and groups:read bot scopes (as manifest.yml has them) and reinstall the app".into()),
            ),
            Ok(Err(e)) => found.problem(
                "channels",
                format!("could not look up channel {id} ({keys}): {e}"),
                None,
            ),
            Err(_) => found.problem(
                "channels",
                format!(
                    "Slack did not answer conversations.info for {id} within {} s",
                    REACH_TIMEOUT.as_secs()
                ),
                None,
            ),
        }
    }
}

/// Ids, each with the approver options that name it.
type Named = BTreeMap<String, Vec<&'static str>>;

/// Every approver user and group, each with the options (`kill`, `pause`, …) that name it.
fn configured_approvers(settings: &Settings) -> (Named, Named) {
    let a = &settings.policy.approvals.approvers;
    let rules: [(&'static str, Option<&ApproverRule>); 8] = [
        ("kill", Some(&a.kill)),
        ("snapshot_then_kill", a.snapshot_then_kill.as_ref()),
        ("pause", Some(&a.pause)),
        ("leave", Some(&a.leave)),
        ("delete_template", Some(&a.delete_template)),
        ("keep", Some(&a.keep)),
        ("sweep", a.sweep.as_ref()),
        ("restore", a.restore.as_ref()),
    ];
    let mut users: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    let mut groups: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    for (option, rule) in rules {
        let Some(rule) = rule else { continue };
        for user in &rule.users {
            users
                .entry(user.as_str().to_owned())
                .or_default()
                .push(option);
        }
        for group in &rule.groups {
            groups
                .entry(group.as_str().to_owned())
                .or_default()
                .push(option);
        }
    }
    (users, groups)
}

/// `users.info` for each approver user, `usergroups.users.list` for each approver group.
async fn approvers(settings: &Settings, client: &SlackClient, found: &mut Findings) {
    let (users, groups) = configured_approvers(settings);
    for (id, options) in users {
        let keys = format!("[approvals.approvers] {}", options.join(", "));
        let Ok(user) = crate::ids::SlackUserId::parse(&id) else {
            continue;
        };
        match tokio::time::timeout(REACH_TIMEOUT, client.user_info(&user)).await {
            Ok(Ok(info)) if info.deleted => found.problem(
                "approvers",
                format!("{id} ({}{keys}) is deactivated: they can no longer decide", named(&info.name)),
                Some("remove them, or name someone else".into()),
            ),
            Ok(Ok(info)) => found.ok(
                "approvers",
                format!("{id} ({}{keys}) is a member of the workspace", named(&info.name)),
            ),
            Ok(Err(SlackError::Api { code })) if code == "user_not_found" => found.problem(
                "approvers",
                format!("Slack knows no user {id} ({keys}): nobody can decide as them"),
                Some("copy the member ID from their Slack profile (⋯, Copy member ID)".into()),
            ),
            Ok(Err(SlackError::Api { code })) if code == "missing_scope" => found.problem(
                "approvers",
                format!("Slack refused users.info for {id}: the app lacks the users:read scope (missing_scope)"),
                Some("add the users:read bot scope (as manifest.yml has it) and reinstall the app".into()),
            ),
            Ok(Err(e)) => found.problem(
                "approvers",
                format!("could not look up user {id} ({keys}): {e}"),
                None,
            ),
            Err(_) => found.problem(
                "approvers",
                format!("Slack did not answer users.info for {id} within {} s", REACH_TIMEOUT.as_secs()),
                None,
            ),
        }
    }
    for (id, options) in groups {
        let keys = format!("[approvals.approvers] {}", options.join(", "));
        match tokio::time::timeout(REACH_TIMEOUT, client.usergroup_members(&id)).await {
            Ok(Ok(members)) if members.is_empty() => found.warning(
                "approvers",
                format!("user group {id} ({keys}) has no members: it lets nobody decide"),
                Some("add people to the group in Slack, or name users instead".into()),
            ),
            Ok(Ok(members)) => found.ok(
                "approvers",
                format!(
                    "user group {id} ({keys}) has {} {}",
                    members.len(),
                    if members.len() == 1 { "member" } else { "members" }
                ),
            ),
            Ok(Err(SlackError::Api { code })) if code == "no_such_subteam" => found.problem(
                "approvers",
                format!("Slack knows no user group {id} ({keys}): nobody can decide through it"),
                Some("copy the group's id (S…) from Slack's People, User groups page; user groups need a paid Slack plan, else name users".into()),
            ),
            Ok(Err(SlackError::Api { code })) if code == "paid_teams_only" || code == "plan_upgrade_required" => found.problem(
                "approvers",
                format!("this Slack workspace has no user groups ({code}), so {id} ({keys}) lets nobody decide"),
                Some("name users instead; user groups need a paid Slack plan".into()),
            ),
            Ok(Err(SlackError::Api { code })) if code == "missing_scope" => found.problem(
                "approvers",
                format!("Slack refused usergroups.users.list for {id}: the app lacks the usergroups:read scope (missing_scope)"),
                Some("add the usergroups:read bot scope (as manifest.yml has it) and reinstall the app".into()),
            ),
            Ok(Err(e)) => found.problem(
                "approvers",
                format!("could not look up user group {id} ({keys}): {e}"),
                None,
            ),
            Err(_) => found.problem(
                "approvers",
                format!(
                    "Slack did not answer usergroups.users.list for {id} within {} s",
                    REACH_TIMEOUT.as_secs()
                ),
                None,
            ),
        }
    }
}

/// `@name, ` before the keys naming a user, when Slack gave a name.
fn named(name: &Option<String>) -> String {
    match name {
        Some(n) if !n.is_empty() => format!("@{n}, "),
        _ => String::new(),
    }
}
