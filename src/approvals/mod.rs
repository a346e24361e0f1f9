//! Approval cases at work: opening a case and posting its card, deciding on a click, running
//! the decision in a worker against E2B, expiring cases nobody decided, and the audit trail.
//!
//! `cases/` says which moves are legal, `store/` makes them atomic, `jobs/` runs plans step by
//! step; this module joins them to Slack and E2B. It must never call a destructive E2B
//! endpoint except from the worker, for a case whose decision the store recorded.
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::cases::{ApprovalPolicy, Card, Case, CaseDraft, DraftError, Opener};
use crate::e2b::E2bClient;
use crate::ids::SlackChannelId;
use crate::slack::client::{SlackClient, SlackError};
use crate::slack::render::Templates;
use crate::store::{Actor, AuditEvent, Opened, Store, StoreError};

pub mod card;
pub mod decide;
pub mod evidence;
pub mod history;
pub mod lifetime;
pub mod list;
pub mod outside;
pub mod push_card;
pub mod push_case;
pub mod repair;
pub mod request;
pub mod run_card;
pub mod run_case;
pub mod watch;
pub mod worker;

/// How long one replica may hold the right to post a case's card. Whoever opens or asks about a
/// case without a card takes it first, so two requests never post two cards; a poster that
/// failed releases it at once, and one that crashed loses it after this.
pub const CARD_POST_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// The handles the approval flow works with; cheap to clone.
#[derive(Clone, Debug)]
pub struct Services {
    pub store: Store,
    pub slack: SlackClient,
    /// `None` when `E2B_API_KEY` is not set: decisions then fail with a sentence saying so.
    pub e2b: Option<E2bClient>,
    pub templates: Arc<Templates>,
    pub policy: Arc<ApprovalPolicy>,
    /// The CPU share that tells the worker's re-check a busy sandbox from an idle one.
    pub busy_above: BusyThreshold,
    /// `[channels] approvals`; `None` posts cards where the command was typed.
    pub approvals_channel: Option<SlackChannelId>,
    /// Where follow-up work (card updates after a decision) is spawned, so shutdown waits for it.
    pub tasks: tokio_util::task::TaskTracker,
    /// The bound on follow-up work: past it, a decision's card update runs in the task that
    /// recorded it instead of a new one.
    pub limits: Arc<crate::slack::limits::Limits>,
    /// How approved list decisions are carried out (`[hygiene] list_*`).
    pub lists: list::ListSettings,
    /// Cancelled when this replica starts stopping: decided work finishes the step in flight
    /// and leaves the rest to another replica.
    pub draining: tokio_util::sync::CancellationToken,
    /// `[[watch]]`: the rules E2B's lifecycle events are checked against.
    pub watch: Arc<Vec<crate::watch::WatchRule>>,
}

/// The CPU percentage above which a sandbox of a template counts as busy (`[hygiene.idle]`). The
/// assembler fills it, so approvals need not know the sweep's policy types.
#[derive(Clone)]
pub struct BusyThreshold(Arc<dyn Fn(&str) -> f64 + Send + Sync>);

impl BusyThreshold {
    pub fn new(by_template: impl Fn(&str) -> f64 + Send + Sync + 'static) -> Self {
        Self(Arc::new(by_template))
    }

    /// The threshold for sandboxes of `template_id`.
    pub fn for_template(&self, template_id: &str) -> f64 {
        (self.0)(template_id)
    }
}

impl std::fmt::Debug for BusyThreshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BusyThreshold")
    }
}

/// Where a case card goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardTarget {
    pub channel: SlackChannelId,
    /// Post as a reply in this thread; `None` posts at the top level.
    pub thread_ts: Option<String>,
}

/// Why an approval step could not be done. `Display` is a sentence for a Slack user.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error(
        "Steward can't reach its database (Redis), so nothing was done. Try again in a minute."
    )]
    StoreUnavailable(String),
    #[error("Steward's database refused the change: {0}")]
    Store(StoreError),
    #[error("The case could not be opened: {0}.")]
    Draft(#[from] DraftError),
    #[error("The case was opened but its card could not be posted to Slack: {0}.")]
    Slack(#[from] SlackError),
    #[error("The case card could not be formatted: {0}.")]
    Render(String),
    #[error(
        "No channel is configured for the card ([channels] runs or approvals in steward.toml), so no case was opened."
    )]
    NoChannel,
    #[error("E2B is not configured (E2B_API_KEY is not set), so no case was opened.")]
    E2bNotConfigured,
    /// What is gone, e.g. `Sandbox sbx1`.
    #[error("{0} is already gone, so there is nothing to decide and no case was opened.")]
    Gone(String),
    /// E2B could not be read; the sentence says why. `transient`: it may pass (a 429, a 5xx,
    /// E2B unreachable).
    #[error("{sentence} No case was opened.")]
    E2b { sentence: String, transient: bool },
}

impl ApprovalError {
    /// Whether asking again later may succeed (Redis, Slack or E2B briefly unavailable), as
    /// opposed to a setting or a gone subject that no retry changes. A run's hand-over retries
    /// on the first and gives up on the second.
    pub fn worth_retrying(&self) -> bool {
        match self {
            ApprovalError::StoreUnavailable(_) | ApprovalError::Store(_) => true,
            // `not_in_channel` too: once someone invites the app, the next try posts the card.
            ApprovalError::Slack(_) => true,
            ApprovalError::E2b { transient, .. } => *transient,
            ApprovalError::Draft(_)
            | ApprovalError::Render(_)
            | ApprovalError::NoChannel
            | ApprovalError::E2bNotConfigured
            | ApprovalError::Gone(_) => false,
        }
    }
}

impl From<StoreError> for ApprovalError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(reason) => ApprovalError::StoreUnavailable(reason),
            other => ApprovalError::Store(other),
        }
    }
}

/// Who did it, for the audit log.
pub fn actor_of(opener: &Opener) -> Actor {
    match opener {
        Opener::Person { user } => Actor::Person { user: user.clone() },
        Opener::Sweep => Actor::Steward {
            part: "sweep".into(),
        },
        Opener::Agent { name } => Actor::Agent { name: name.clone() },
        Opener::Watch { rule } => Actor::Steward {
            part: format!("watch rule {rule}"),
        },
    }
}

/// Appends one audit event about `case`. A failed append is logged, not raised: the action it
/// records has already happened and must still be reported to people.
pub async fn audit(store: &Store, case: &Case, actor: Actor, action: &str, outcome: &str) {
    let event = AuditEvent {
        time: Utc::now(),
        case: Some(case.id.clone()),
        subject: Some(case.subject.clone()),
        actor,
        action: action.to_owned(),
        outcome: outcome.to_owned(),
    };
    if let Err(e) = store.append_audit(&event).await {
        tracing::error!(case = %case.id, action, outcome, error = %e, "could not write the audit log");
    }
}

/// Renders the card of `case` as it stands now: a push-test alert for a failed push's
/// sandbox, the case card for anything else.
pub fn render_card(
    templates: &Templates,
    case: &Case,
) -> Result<crate::slack::render::Message, ApprovalError> {
    let rendered = match (&case.evidence.push, &case.evidence.run) {
        (Some(push), Some(run)) => templates.render(&push_card::push_card_params(case, push, run)),
        _ => templates.render(&card::card_params(case)),
    };
    rendered.map_err(|e| ApprovalError::Render(e.to_string()))
}

/// Opens a case (or finds the open one for the same subject), posts its card to `target`,
/// records the card, writes the audit event.
///
/// An existing case is returned as it is: its card is not posted again and its deadline is not
/// extended (unless its card was never posted, or its posting failed: then it is posted now).
pub async fn open_case(
    store: &Store,
    slack: &SlackClient,
    templates: &Templates,
    draft: CaseDraft,
    target: CardTarget,
    now: DateTime<Utc>,
) -> Result<Opened, ApprovalError> {
    open_built_case(store, slack, templates, draft.into_case(now)?, target).await
}

/// [`open_case`] for a case already built from its draft, for a caller that sets what a draft
/// does not carry (the timeout a shortening asks for).
pub async fn open_built_case(
    store: &Store,
    slack: &SlackClient,
    templates: &Templates,
    case: Case,
    target: CardTarget,
) -> Result<Opened, ApprovalError> {
    let actor = actor_of(&case.opener);
    let case = with_lifecycle(store, case).await;
    let (case, created) = match store.open_case(case).await? {
        Opened::Created(case) => {
            audit(store, &case, actor, "open", &case.reason.clone()).await;
            (case, true)
        }
        Opened::Existing(existing) => {
            if existing.card.is_some() {
                return Ok(Opened::Existing(existing));
            }
            (existing, false)
        }
    };
    let stored = match post_card(store, slack, templates, &case, &target).await? {
        Some(stored) => stored,
        // Someone else is posting this card right now.
        None => case,
    };
    Ok(if created {
        Opened::Created(stored)
    } else {
        Opened::Existing(stored)
    })
}

/// `case` with its sandbox's recent lifecycle (E2B's events, as received) in its evidence, when
/// it has none yet; unchanged when the store cannot say (the card then shows no lifecycle).
pub async fn with_lifecycle(store: &Store, mut case: Case) -> Case {
    if let crate::cases::Subject::Sandbox(id) = &case.subject
        && case.evidence.lifecycle.is_empty()
    {
        match store.lifecycle_of(id).await {
            Ok(entries) => {
                case.evidence.lifecycle = entries
                    .into_iter()
                    .map(|(at, what)| crate::cases::LifecycleEntry { at, what })
                    .collect();
            }
            Err(e) => tracing::debug!(sandbox = %id, error = %e, "no lifecycle for the card"),
        }
    }
    case
}

/// Posts the card of `case` (which has none yet) to `target` and records it. `Ok(None)` when
/// another request is posting it at this moment. A failed post is audited and leaves the case
/// without a card, so the next request for the subject posts it again.
pub async fn post_card(
    store: &Store,
    slack: &SlackClient,
    templates: &Templates,
    case: &Case,
    target: &CardTarget,
) -> Result<Option<Case>, ApprovalError> {
    let lease = format!("card-post:{}", case.id);
    let holder = uuid::Uuid::new_v4().to_string();
    if !store
        .acquire_lease(&lease, &holder, CARD_POST_LEASE_TTL)
        .await?
    {
        return Ok(None);
    }
    let result = post_card_holding_lease(store, slack, templates, case, target).await;
    if let Err(e) = store.release_lease(&lease, &holder).await {
        // It ends by itself after CARD_POST_LEASE_TTL.
        tracing::warn!(case = %case.id, error = %e, "could not release the card-post lease");
    }
    result.map(Some)
}

async fn post_card_holding_lease(
    store: &Store,
    slack: &SlackClient,
    templates: &Templates,
    case: &Case,
    target: &CardTarget,
) -> Result<Case, ApprovalError> {
    // Another poster may have finished between our read and taking the lease.
    let current = store.get_case(&case.id).await?;
    if current.card.is_some() {
        return Ok(current);
    }
    let message = render_card(templates, &current)?;
    let posted = slack
        .post_message_in_thread(&target.channel, target.thread_ts.as_deref(), message)
        .await;
    let (channel, ts) = match posted {
        Ok(posted) => posted,
        Err(e) => {
            audit(
                store,
                &current,
                Actor::Steward {
                    part: "slack".into(),
                },
                "post_card",
                &format!("failed: {e}"),
            )
            .await;
            return Err(e.into());
        }
    };
    let stored = store.set_card(&case.id, Card { channel, ts }).await?;
    // A case that changed while the card was being posted (a very fast decision) needs the
    // card to match it.
    if stored.state != current.state {
        refresh_card(store, slack, templates, &stored).await;
    }
    Ok(stored)
}

/// Rewrites the case's card (`chat.update`, retried on transient failures) to show its
/// current state. Returns false (after logging what failed) when there is no card or the update
/// failed for good; the card is then recorded in the store as out of date and
/// [`repair::repair_cards`] (on any replica) rewrites it from the store on a later pass.
pub async fn refresh_card(
    store: &Store,
    slack: &SlackClient,
    templates: &Templates,
    case: &Case,
) -> bool {
    let Some(card) = &case.card else {
        return false;
    };
    let message = match render_card(templates, case) {
        Ok(message) => message,
        Err(e) => {
            tracing::error!(case = %case.id, error = %e, "could not render the case card");
            return false;
        }
    };
    match slack.update_message(&card.channel, &card.ts, message).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(
                case = %case.id,
                channel = %card.channel,
                ts = %card.ts,
                error = %e,
                "chat.update of the case card failed; a later repair pass rewrites it"
            );
            if let Err(e) = store.mark_card_stale(&case.id).await {
                tracing::error!(case = %case.id, error = %e, "could not record an out-of-date card either");
            }
            false
        }
    }
}
