//! A list decision as Slack shows it: the digest and its thread messages
//! (`list_digest.json.j2`), and the exclude modal (`list_exclude_modal.json.j2`), as typed
//! params. Pure: it reads the list and its groups' progress, and calls nothing.
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::super::card::{ButtonParams, ConfirmParams, sample_button};
use crate::cases::DecisionOption;
use crate::cases::list::{GroupDecision, ListCase, ListGroup, Progress, progress_line, thousands};
use crate::ids::{SandboxId, SlackUserId};
use crate::slack::format::{human_bytes, human_duration, when};
use crate::slack::payload::{
    CASE_UNTIL_ACTION, CASE_UNTIL_BLOCK, ListTarget, SWEEP_LIST_APPROVE, SWEEP_LIST_APPROVE_ALL,
    SWEEP_LIST_CHOOSE, SWEEP_LIST_EXCLUDE, SWEEP_LIST_EXCLUDE_MODAL, SWEEP_LIST_PASTE_ACTION,
    SWEEP_LIST_PASTE_BLOCK, SWEEP_LIST_PICK_ACTION, SWEEP_LIST_RETRY, SWEEP_LIST_REVIEW,
};
use crate::slack::render::{MessageParams, Mrkdwn, RenderError, SAMPLE_TEXT, Templates};

/// Groups per message: three blocks each, under Slack's 50 with the digest's header.
pub const GROUPS_PER_MESSAGE: usize = 14;
/// Sandboxes per page of the exclude modal: eight checkbox blocks of ten (Slack's most).
pub const EXCLUDE_PAGE: usize = 80;
const CHECKBOXES_PER_BLOCK: usize = 10;
/// An owner name (metadata) is cut to this many characters.
const OWNER_MAX_CHARS: usize = 80;

#[derive(Debug, Clone, Serialize)]
pub struct ListHeader {
    pub title: String,
    pub summary: Mrkdwn,
    pub guard: Option<String>,
    pub status: Mrkdwn,
    pub approve_all: Option<ButtonParams>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupView {
    pub index: usize,
    pub title: Mrkdwn,
    pub facts: String,
    pub top: String,
    /// Who excluded which sandboxes until when ([`exclusions_line`]); `None` when nobody did.
    pub excluded: Option<Mrkdwn>,
    pub status: Mrkdwn,
    pub buttons: Vec<ButtonParams>,
}

/// People-and-dates entries the exclusions line names before "and N more".
const EXCLUSION_ENTRIES_SHOWN: usize = 4;
/// Sandbox ids one entry names before "and N more".
const EXCLUDED_IDS_SHOWN: usize = 3;

/// One entry of the exclusions line: who, until when, and which sandboxes.
type ExclusionEntry<'a> = (&'a SlackUserId, Option<DateTime<Utc>>, Vec<&'a SandboxId>);

/// Who excluded what until when: one entry per person and date, in the order they excluded
/// (`` `a`, `b` and 3 more by @erin until 2026-12-31 00:00 UTC ``), the first few, so the line
/// stays short however many were excluded. `None` when nothing was excluded.
pub fn exclusions_line(g: &ListGroup) -> Option<Mrkdwn> {
    let mut entries: Vec<ExclusionEntry<'_>> = Vec::new();
    for e in &g.excluded {
        match entries
            .iter_mut()
            .find(|(by, until, _)| *by == &e.by && *until == e.until)
        {
            Some((_, _, ids)) => ids.push(&e.sandbox),
            None => entries.push((&e.by, e.until, vec![&e.sandbox])),
        }
    }
    if entries.is_empty() {
        return None;
    }
    let mut line = Mrkdwn::text("Excluded: ");
    for (i, (by, until, ids)) in entries.iter().take(EXCLUSION_ENTRIES_SHOWN).enumerate() {
        if i > 0 {
            line = line.and("; ");
        }
        let mut named = ids
            .iter()
            .take(EXCLUDED_IDS_SHOWN)
            .map(|id| format!("`{id}`"))
            .collect::<Vec<_>>()
            .join(", ");
        if ids.len() > EXCLUDED_IDS_SHOWN {
            named.push_str(&format!(
                " and {} more",
                thousands(ids.len() - EXCLUDED_IDS_SHOWN)
            ));
        }
        line = line
            .and(format!("{named} by "))
            .and(Mrkdwn::user(by))
            .and(match until {
                Some(until) => format!(" until {}", when(*until)),
                None => " with no end date".to_owned(),
            });
    }
    if entries.len() > EXCLUSION_ENTRIES_SHOWN {
        line = line.and(format!(
            "; and {} more",
            thousands(entries.len() - EXCLUSION_ENTRIES_SHOWN)
        ));
    }
    Some(line.and("."))
}

/// One message of a list: the digest (with `header`) or a thread message (with `continued`).
#[derive(Debug, Clone, Serialize)]
pub struct ListMessageParams {
    pub text: String,
    pub header: Option<ListHeader>,
    pub continued: Option<String>,
    pub groups: Vec<GroupView>,
}

impl MessageParams for ListMessageParams {
    const TEMPLATE: &'static str = "list_digest.json.j2";
}

/// How many messages a list of `groups` groups takes (at least the digest).
pub fn message_count(groups: usize) -> usize {
    groups.div_ceil(GROUPS_PER_MESSAGE).max(1)
}

/// Which message shows group `index`.
pub fn message_of(index: usize) -> usize {
    index / GROUPS_PER_MESSAGE
}

/// Every message of `list`; `progress[i]` is group i's progress once it was approved.
pub fn list_messages(
    list: &ListCase,
    progress: &[Option<Progress>],
    now: DateTime<Utc>,
) -> Vec<ListMessageParams> {
    let count = message_count(list.groups.len());
    (0..count)
        .map(|m| {
            let first = m * GROUPS_PER_MESSAGE;
            let groups: Vec<GroupView> = list
                .groups
                .iter()
                .enumerate()
                .skip(first)
                .take(GROUPS_PER_MESSAGE)
                .map(|(i, g)| group_view(list, i, g, progress.get(i).copied().flatten(), now))
                .collect();
            let last = first + groups.len();
            ListMessageParams {
                text: headline(list),
                header: (m == 0).then(|| header(list, now)),
                continued: (m > 0).then(|| {
                    format!(
                        "Groups {}–{last} of {} of the list above.",
                        first + 1,
                        list.groups.len()
                    )
                }),
                groups,
            }
        })
        .collect()
}

fn headline(list: &ListCase) -> String {
    let sandboxes: usize = list.groups.iter().map(|g| g.items.len()).sum();
    if let Some(b) = &list.burst {
        return format!(
            "Burst: {} sandboxes created for {} {} within {} (watch rule {})",
            thousands(b.count.max(sandboxes)),
            b.by,
            b.value,
            human_duration(std::time::Duration::from_secs(b.within_secs)),
            b.rule
        );
    }
    format!(
        "Fleet hygiene: {} idle sandboxes in {} groups to decide",
        thousands(sandboxes),
        list.groups.len()
    )
}

fn open(list: &ListCase, now: DateTime<Utc>) -> bool {
    list.expired_at.is_none() && now < list.decide_by
}

fn header(list: &ListCase, now: DateTime<Utc>) -> ListHeader {
    let sandboxes: usize = list.groups.iter().map(|g| g.items.len()).sum();
    let undecided = list
        .groups
        .iter()
        .filter(|g| g.decision == GroupDecision::Open)
        .count();
    let held: Vec<&ListGroup> = list.groups.iter().filter(|g| g.held_by_guard).collect();
    let guard = (!held.is_empty()).then(|| {
        let n: usize = held.iter().map(|g| g.items.len()).sum();
        format!(
            "*Blast-radius guard:* {} kill recommendations are more than the share of the fleet \
             Steward may kill at once. Their {} groups are held: *Approve all* leaves them out, \
             and only someone allowed to kill can approve each one with its own button.",
            thousands(n),
            held.len()
        )
    });
    let status = if !open(list, now) {
        Mrkdwn::text(&format!(
            ":zzz: This list expired {}: undecided groups were left alone. The next sweep lists them again.",
            when(list.expired_at.unwrap_or(list.decide_by))
        ))
    } else if undecided == 0 {
        Mrkdwn::text("Every group is decided.")
    } else {
        Mrkdwn::text(&format!(
            ":hourglass_flowing_sand: {undecided} of {} groups wait for a decision by {}. Nothing is \
             done to a sandbox until its group is approved; each is re-checked just before.",
            list.groups.len(),
            when(list.decide_by)
        ))
    };
    let approvable: usize = list
        .groups
        .iter()
        .filter(|g| g.decision == GroupDecision::Open && !g.held_by_guard)
        .map(|g| g.included().count())
        .sum();
    let approve_all = (open(list, now) && approvable > 0).then(|| ButtonParams {
        action_id: SWEEP_LIST_APPROVE_ALL.into(),
        text: "Approve all recommendations".into(),
        value: ListTarget {
            list: list.id.clone(),
            group: None,
        }
        .encode(),
        style: Some("primary"),
        confirm: Some(ConfirmParams {
            title: "Approve all?".into(),
            text: format!(
                "Steward will act on {} sandboxes, each as its group recommends, re-checking \
                 each one just before.{}",
                thousands(approvable),
                if held.is_empty() {
                    ""
                } else {
                    " Groups held by the guard are left out."
                }
            ),
            confirm: "Approve all".into(),
            deny: "Cancel".into(),
        }),
    });
    if let Some(b) = &list.burst {
        return burst_header(list, b, sandboxes, now);
    }
    ListHeader {
        title: format!(
            "Fleet hygiene · {} idle sandboxes to decide",
            thousands(sandboxes)
        ),
        summary: Mrkdwn::text(&list.summary),
        guard,
        status,
        approve_all,
    }
}

/// Sandbox ids a choosing group names before "and N more".
const ITEMS_NAMED: usize = 6;

/// `` `a`, `b` and 4 more ``: the sandboxes of a group answered by choosing.
fn named_items(g: &ListGroup) -> String {
    let mut named = g
        .items
        .iter()
        .take(ITEMS_NAMED)
        .map(|i| format!("`{}`", i.sandbox))
        .collect::<Vec<_>>()
        .join(", ");
    if g.items.len() > ITEMS_NAMED {
        named.push_str(&format!(
            " and {} more",
            thousands(g.items.len() - ITEMS_NAMED)
        ));
    }
    named
}

/// A burst alert's header: what the rule saw, and where the decision stands.
fn burst_header(
    list: &ListCase,
    b: &crate::cases::list::BurstAlert,
    sandboxes: usize,
    now: DateTime<Utc>,
) -> ListHeader {
    let within = human_duration(std::time::Duration::from_secs(b.within_secs));
    let count = b.count.max(sandboxes);
    // The group holds metadata an agent wrote: quoted data, never formatting.
    let summary = Mrkdwn::text(&format!(
        ":rotating_light: *{}* sandboxes were created for {} ",
        thousands(count),
        b.by
    ))
    .and(Mrkdwn::quoted(&b.value, OWNER_MAX_CHARS))
    .and(Mrkdwn::text(&format!(
        " {}: more than {} within {} (watch rule `{}`). {}",
        if when(b.first_at) == when(b.last_at) {
            format!("at {}", when(b.first_at))
        } else {
            format!("between {} and {}", when(b.first_at), when(b.last_at))
        },
        thousands(b.more_than),
        within,
        b.rule,
        if count > sandboxes {
            format!(
                "The first {} are listed; the rest are counted.",
                thousands(sandboxes)
            )
        } else {
            "This alert grows as more arrive.".to_owned()
        }
    )));
    let status = if !open(list, now) {
        Mrkdwn::text(&format!(
            ":zzz: This alert expired {}: nothing was done.",
            when(list.expired_at.unwrap_or(list.decide_by))
        ))
    } else if list
        .groups
        .iter()
        .all(|g| g.decision != GroupDecision::Open)
    {
        Mrkdwn::text("Decided.")
    } else {
        Mrkdwn::text(&format!(
            ":hourglass_flowing_sand: Waiting for a decision by {}. Nothing is done to a sandbox \
             until someone chooses; each is re-checked just before.",
            when(list.decide_by)
        ))
    };
    ListHeader {
        title: format!("Burst · {} sandboxes in {within}", thousands(count)),
        summary,
        guard: None,
        status,
        approve_all: None,
    }
}

/// The buttons of a group answered by choosing (a burst alert's), most cautious first.
fn choice_buttons(g: &ListGroup, target: &str) -> Vec<ButtonParams> {
    let included = g.included().count();
    g.choices
        .iter()
        .map(|&option| {
            let (text, style) = match option {
                DecisionOption::Pause => ("Pause all of these", Some("primary")),
                DecisionOption::Kill => ("Kill all of these", Some("danger")),
                DecisionOption::SnapshotThenKill => ("Snapshot, then kill all", Some("danger")),
                _ => ("Leave them", None),
            };
            let confirm = matches!(
                option,
                DecisionOption::Kill | DecisionOption::SnapshotThenKill
            )
            .then(|| ConfirmParams {
                title: "Kill all of these?".into(),
                text: format!(
                    "Kill {} {}. A killed sandbox and its files cannot be brought back. Each is \
                     re-checked just before; one that changed is left alone.",
                    thousands(included),
                    if included == 1 {
                        "sandbox"
                    } else {
                        "sandboxes"
                    }
                ),
                confirm: "Kill all".into(),
                deny: "Cancel".into(),
            });
            ButtonParams {
                action_id: SWEEP_LIST_CHOOSE.into(),
                text: text.into(),
                value: format!("{target}:{}", option.as_str()),
                style,
                confirm,
            }
        })
        .collect()
}

fn option_label(option: DecisionOption) -> &'static str {
    match option {
        DecisionOption::Pause => "Pause",
        DecisionOption::SnapshotThenKill => "Snapshot, then kill",
        DecisionOption::Kill => "Kill",
        _ => "Leave",
    }
}

fn group_view(
    list: &ListCase,
    index: usize,
    g: &ListGroup,
    progress: Option<Progress>,
    now: DateTime<Utc>,
) -> GroupView {
    // The owner is metadata an agent wrote: quoted data, never formatting.
    let owner = match (&g.owner, &g.owner_slack) {
        (Some(owner), Some(user)) => Mrkdwn::quoted(owner, OWNER_MAX_CHARS)
            .and(Mrkdwn::text(" ("))
            .and(Mrkdwn::user(user))
            .and(Mrkdwn::text(")")),
        (Some(owner), None) => Mrkdwn::quoted(owner, OWNER_MAX_CHARS),
        (None, _) => Mrkdwn::text("*No owner in metadata*"),
    };
    let choosing = !g.choices.is_empty();
    let title = if choosing {
        Mrkdwn::text(&format!(
            "*{} sandbox{}* in this alert",
            thousands(g.items.len()),
            if g.items.len() == 1 { "" } else { "es" }
        ))
    } else {
        owner
    };
    let title = if choosing {
        title
    } else {
        title.and(Mrkdwn::text(&format!(
            " · *{}* · {} sandbox{}",
            option_label(g.option),
            thousands(g.items.len()),
            if g.items.len() == 1 { "" } else { "es" }
        )))
    };
    let cost = if g.cost_per_day_usd.abs() < 0.005 {
        0.0
    } else {
        g.cost_per_day_usd
    };
    let mut facts = if choosing {
        vec![named_items(g)]
    } else {
        vec![format!("${cost:.2} a day")]
    };
    if g.paused_disk_bytes > 0 {
        facts.push(format!(
            "{} of disk held while paused",
            human_bytes(g.paused_disk_bytes)
        ));
    }
    if !g.excluded.is_empty() {
        facts.push(format!("{} excluded", thousands(g.excluded.len())));
    }
    let top = g
        .top
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let target = ListTarget {
        list: list.id.clone(),
        group: Some(index),
    }
    .encode();
    let button = |action_id: &str, text: &str, style: Option<&'static str>| ButtonParams {
        action_id: action_id.into(),
        text: text.into(),
        value: target.clone(),
        style,
        confirm: None,
    };
    let mut buttons = Vec::new();
    let status = match (&g.decision, progress) {
        (GroupDecision::Open, _) if !open(list, now) => {
            Mrkdwn::text("Expired undecided: nothing was done.")
        }
        (GroupDecision::Open, _) if choosing => {
            buttons = choice_buttons(g, &target);
            Mrkdwn::text(
                "Pause all of these or kill all of these: one decision for every sandbox listed, \
                 carried out once each. Leave them and nothing is done.",
            )
        }
        (GroupDecision::Open, _) => {
            let included = g.included().count();
            let mut approve = button(
                SWEEP_LIST_APPROVE,
                if g.held_by_guard {
                    "Approve despite the guard"
                } else {
                    "Approve group"
                },
                Some(if g.held_by_guard { "danger" } else { "primary" }),
            );
            if g.is_kill() {
                approve.confirm = Some(ConfirmParams {
                    title: format!("{}?", option_label(g.option)),
                    text: format!(
                        "{} {} {} of {}. A killed sandbox and its files cannot be \
                         brought back{}.",
                        option_label(g.option),
                        thousands(included),
                        if included == 1 {
                            "sandbox"
                        } else {
                            "sandboxes"
                        },
                        g.owner.as_deref().unwrap_or("no owner"),
                        if g.option == DecisionOption::SnapshotThenKill {
                            " except from its snapshot"
                        } else {
                            ""
                        }
                    ),
                    confirm: option_label(g.option).into(),
                    deny: "Cancel".into(),
                });
            }
            buttons.push(approve);
            buttons.push(button(SWEEP_LIST_REVIEW, "Review individually", None));
            buttons.push(button(SWEEP_LIST_EXCLUDE, "Exclude…", None));
            if g.held_by_guard {
                Mrkdwn::text(
                    ":warning: Held by the blast-radius guard: waiting for someone allowed to kill.",
                )
            } else {
                Mrkdwn::text(&format!(
                    "Recommended: {} {}.",
                    option_label(g.option).to_lowercase(),
                    if included == 1 {
                        "this one".to_owned()
                    } else {
                        format!("these {}", thousands(included))
                    }
                ))
            }
        }
        (GroupDecision::Reviewing { by, .. }, _) => Mrkdwn::user(by).and(Mrkdwn::text(
            " chose to review these one by one: their cards are in this thread.",
        )),
        (GroupDecision::Approved { by, .. }, p) => {
            let p = p.unwrap_or_default();
            if p.failed > 0 && p.finished() {
                buttons.push(button(SWEEP_LIST_RETRY, "Retry failed", Some("primary")));
            }
            let icon = if !p.finished() {
                ":gear:"
            } else if p.failed > 0 {
                ":x:"
            } else {
                ":white_check_mark:"
            };
            Mrkdwn::text(&format!("{icon} Approved by "))
                .and(Mrkdwn::user(by))
                .and(Mrkdwn::text(&format!(" · {}", progress_line(g.option, &p))))
        }
    };
    GroupView {
        index,
        title,
        facts: facts.join(" · "),
        top,
        excluded: exclusions_line(g),
        status,
        buttons,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckboxOption {
    pub text: String,
    pub value: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckboxChunk {
    pub label: String,
    pub options: Vec<CheckboxOption>,
}

/// The exclude modal, page `page` (0-based) of group `index`.
#[derive(Debug, Clone, Serialize)]
pub struct ExcludeModalParams {
    pub callback_id: &'static str,
    pub metadata: String,
    pub submit: String,
    pub prompt: Mrkdwn,
    pub pages: Vec<CheckboxChunk>,
    pub pick_action: &'static str,
    pub paste_block: &'static str,
    pub paste_action: &'static str,
    pub until_block: &'static str,
    pub until_action: &'static str,
    pub footer: String,
}

impl MessageParams for ExcludeModalParams {
    const TEMPLATE: &'static str = "list_exclude_modal.json.j2";
}

/// The modal's metadata: `<list>:<group>:<page>`.
pub fn exclude_metadata(list: &ListCase, group: usize, page: usize) -> String {
    format!("{}:{group}:{page}", list.id)
}

/// Reads [`exclude_metadata`] back.
pub fn parse_exclude_metadata(text: &str) -> Option<(ListTarget, usize)> {
    let (target, page) = text.rsplit_once(':')?;
    Some((ListTarget::decode(target)?, page.parse().ok()?))
}

/// How many pages the exclude modal of a group has (its sandboxes not yet excluded).
pub fn exclude_pages(g: &ListGroup) -> usize {
    g.included().count().div_ceil(EXCLUDE_PAGE).max(1)
}

/// Page `page` of group `index`'s exclude modal; `max` is `[hygiene] max_exclude_for`, which
/// the prompt states.
pub fn exclude_modal(
    list: &ListCase,
    index: usize,
    g: &ListGroup,
    page: usize,
    note: Option<&str>,
    max: std::time::Duration,
) -> ExcludeModalParams {
    let remaining: Vec<_> = g.included().collect();
    let pages = exclude_pages(g);
    let page = page.min(pages - 1);
    let shown: Vec<_> = remaining
        .iter()
        .skip(page * EXCLUDE_PAGE)
        .take(EXCLUDE_PAGE)
        .collect();
    let chunks = shown
        .chunks(CHECKBOXES_PER_BLOCK)
        .enumerate()
        .map(|(n, chunk)| CheckboxChunk {
            label: format!(
                "Sandboxes {}–{}",
                page * EXCLUDE_PAGE + n * CHECKBOXES_PER_BLOCK + 1,
                page * EXCLUDE_PAGE + n * CHECKBOXES_PER_BLOCK + chunk.len()
            ),
            options: chunk
                .iter()
                .map(|item| CheckboxOption {
                    text: format!("`{}`", item.sandbox),
                    value: item.sandbox.to_string(),
                })
                .collect(),
        })
        .collect();
    let more = page + 1 < pages;
    let whose = match &g.owner {
        Some(owner) => Mrkdwn::quoted(owner, OWNER_MAX_CHARS),
        None => Mrkdwn::text("no owner"),
    };
    let mut prompt = Mrkdwn::text("Exclude sandboxes of ")
        .and(whose)
        .and(Mrkdwn::text(&format!(
            " · *{}* from this list: they are left alone, like a Leave, and \
             sweeps do not raise them again before the date below: at most {} ahead, and no date \
             means {} (`[hygiene] max_exclude_for`). Most expensive first.",
            g.option,
            human_duration(max),
            human_duration(max)
        )));
    if let Some(note) = note {
        prompt = Mrkdwn::text(&format!("{note}\n")).and(prompt);
    }
    ExcludeModalParams {
        callback_id: SWEEP_LIST_EXCLUDE_MODAL,
        metadata: exclude_metadata(list, index, page),
        submit: if more {
            "Exclude, next page".into()
        } else {
            "Exclude".into()
        },
        prompt,
        pages: chunks,
        pick_action: SWEEP_LIST_PICK_ACTION,
        paste_block: SWEEP_LIST_PASTE_BLOCK,
        paste_action: SWEEP_LIST_PASTE_ACTION,
        until_block: CASE_UNTIL_BLOCK,
        until_action: CASE_UNTIL_ACTION,
        footer: format!(
            "Page {} of {pages} · {} sandboxes not excluded · {} excluded",
            page + 1,
            thousands(remaining.len()),
            thousands(g.excluded.len())
        ),
    }
}

/// The start check of this module's templates: a list's digest and a thread message, with every
/// optional part or none, and the exclude modal with checkboxes and without.
pub fn check_templates(templates: &Templates) -> Result<(), RenderError> {
    let s = || SAMPLE_TEXT.to_owned();
    let text = || Mrkdwn::text(SAMPLE_TEXT);
    for full in [true, false] {
        let button = |style| sample_button(Some(style), full);
        let group = |index| GroupView {
            index,
            title: text(),
            facts: s(),
            top: s(),
            excluded: full.then(text),
            status: text(),
            buttons: if full {
                vec![button("primary"), button("danger")]
            } else {
                Vec::new()
            },
        };
        let groups = if full {
            vec![group(0), group(1)]
        } else {
            Vec::new()
        };
        templates.render(&ListMessageParams {
            text: s(),
            header: Some(ListHeader {
                title: s(),
                summary: text(),
                guard: full.then(s),
                status: text(),
                approve_all: full.then(|| button("primary")),
            }),
            continued: None,
            groups: groups.clone(),
        })?;
        templates.render(&ListMessageParams {
            text: s(),
            header: None,
            continued: Some(s()),
            groups,
        })?;
        let option = || CheckboxOption {
            text: s(),
            value: s(),
        };
        templates.render_view(&ExcludeModalParams {
            callback_id: SWEEP_LIST_EXCLUDE_MODAL,
            metadata: s(),
            submit: s(),
            prompt: text(),
            pages: if full {
                vec![CheckboxChunk {
                    label: s(),
                    options: vec![option(), option()],
                }]
            } else {
                Vec::new()
            },
            pick_action: SWEEP_LIST_PICK_ACTION,
            paste_block: SWEEP_LIST_PASTE_BLOCK,
            paste_action: SWEEP_LIST_PASTE_ACTION,
            until_block: CASE_UNTIL_BLOCK,
            until_action: CASE_UNTIL_ACTION,
            footer: s(),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::list::{ListGroup, ListItem};
    use crate::ids::{CaseId, ListId, SandboxId, SlackUserId};
    use crate::slack::render::Templates;

    fn group(owner: Option<&str>, option: DecisionOption, n: usize, held: bool) -> ListGroup {
        let items: Vec<ListItem> = (0..n)
            .map(|i| ListItem {
                sandbox: SandboxId::parse(format!("i{i:04}{}", owner.unwrap_or("x"))).unwrap(),
                case: CaseId::parse(format!("case_{i}")).unwrap(),
            })
            .collect();
        ListGroup {
            owner: owner.map(str::to_owned),
            owner_slack: owner
                .filter(|o| *o == "alice")
                .map(|_| SlackUserId::parse("U0ALICE").unwrap()),
            option,
            top: items.iter().take(3).map(|i| i.sandbox.clone()).collect(),
            items,
            cost_per_day_usd: n as f64 * 0.41,
            paused_disk_bytes: if option == DecisionOption::Pause {
                0
            } else {
                (n as u64 * 3) << 30
            },
            held_by_guard: held,
            decision: GroupDecision::Open,
            excluded: vec![],
            message: 0,
            choices: Vec::new(),
        }
    }

    /// The digest as a person reads it: headers, texts, context lines, and buttons in brackets
    /// (`[*Approve group*]` is the highlighted one, `!` asks to confirm first).
    fn picture(message: &crate::slack::render::Message) -> String {
        let blocks = serde_json::to_value(&message.blocks).unwrap();
        let mut out = Vec::new();
        for b in blocks.as_array().unwrap() {
            match b["type"].as_str().unwrap() {
                "header" => out.push(format!("# {}", b["text"]["text"].as_str().unwrap())),
                "section" => out.push(b["text"]["text"].as_str().unwrap().to_owned()),
                "context" => out.push(format!(
                    "  ({})",
                    b["elements"][0]["text"].as_str().unwrap()
                )),
                "actions" => out.push(
                    b["elements"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|e| {
                            let text = e["text"]["text"].as_str().unwrap();
                            let confirm = if e.get("confirm").is_some() { "!" } else { "" };
                            match e["style"].as_str() {
                                Some("primary") => format!("[*{text}*{confirm}]"),
                                Some("danger") => format!("[{text} (red){confirm}]"),
                                _ => format!("[{text}{confirm}]"),
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                other => out.push(format!("<{other}>")),
            }
        }
        out.join("\n")
    }

    #[test]
    fn the_digest_reads_as_groups_with_their_figures_progress_and_buttons() {
        let now = DateTime::parse_from_rfc3339("2026-12-03T09:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut list = ListCase {
            id: ListId::parse("list_1").unwrap(),
            version: 1,
            created_at: now,
            decide_by: now + chrono::Duration::days(2),
            requester: None,
            groups: vec![
                group(Some("alice"), DecisionOption::SnapshotThenKill, 412, true),
                group(Some("alice"), DecisionOption::Pause, 1892, false),
                group(Some("bob"), DecisionOption::Pause, 37, false),
                group(None, DecisionOption::Kill, 5, true),
            ],
            messages: vec![],
            summary: "*Fleet:* 10,000 sandboxes (6,120 running · 3,880 paused) · *Idle:* 2,346 \
                      costing $961.86 a day (1,929 pause · 412 snapshot, then kill · 5 kill)"
                .into(),
            expired_at: None,
            burst: None,
        };
        list.groups[1].decision = GroupDecision::Approved {
            by: SlackUserId::parse("U0ERIN").unwrap(),
            at: now,
            over_guard: false,
        };
        let first = list.groups[2].items[0].sandbox.clone();
        list.groups[2].excluded.push(crate::cases::list::Exclusion {
            sandbox: first,
            by: SlackUserId::parse("U0ERIN").unwrap(),
            until: None,
            at: now,
        });
        // Five more by bob, dated: one entry, three named.
        for item in list.groups[2].items.clone().iter().skip(1).take(5) {
            list.groups[2].excluded.push(crate::cases::list::Exclusion {
                sandbox: item.sandbox.clone(),
                by: SlackUserId::parse("U0BOB").unwrap(),
                until: Some(now + chrono::Duration::days(10)),
                at: now,
            });
        }
        let running = Progress {
            total: 1892,
            done: 1204,
            skipped: 3,
            failed: 2,
            running: 8,
            waiting: 675,
            expired: 0,
        };
        let messages = list_messages(&list, &[None, Some(running), None, None], now);
        assert_eq!(messages.len(), 1);
        let rendered = Templates::embedded().render(&messages[0]).unwrap();
        insta::assert_snapshot!("list_digest", picture(&rendered));
    }

    /// Groups are set apart: a divider before each, and a group's buttons right under its own
    /// section, so no button row sits above another group's title; a group of one says so.
    #[test]
    fn each_groups_buttons_sit_under_its_own_title_and_a_group_of_one_is_singular() {
        let now = DateTime::parse_from_rfc3339("2026-12-03T09:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut groups: Vec<ListGroup> = (0..GROUPS_PER_MESSAGE)
            .map(|i| group(Some(&format!("o{i}")), DecisionOption::Pause, 3, false))
            .collect();
        groups[0] = group(Some("solo"), DecisionOption::Pause, 1, false);
        groups[1] = group(Some("one"), DecisionOption::Kill, 1, false);
        let list = ListCase {
            id: ListId::parse("list_1").unwrap(),
            version: 1,
            created_at: now,
            decide_by: now + chrono::Duration::days(2),
            requester: None,
            groups,
            messages: vec![],
            summary: "*Idle:* 42".into(),
            expired_at: None,
            burst: None,
        };
        let messages = list_messages(&list, &[], now);
        let rendered = Templates::embedded().render(&messages[0]).unwrap();
        let blocks = serde_json::to_value(&rendered.blocks).unwrap();
        let blocks = blocks.as_array().unwrap();
        assert!(blocks.len() <= 50, "Slack's cap: {}", blocks.len());
        let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
        for (i, kind) in kinds.iter().enumerate() {
            if *kind == "actions" {
                assert!(
                    matches!(kinds.get(i + 1), None | Some(&"divider")),
                    "a button row above another block than a divider: {kinds:?}"
                );
            }
        }
        assert_eq!(
            kinds.iter().filter(|k| **k == "divider").count(),
            GROUPS_PER_MESSAGE,
            "{kinds:?}"
        );
        let text = picture(&rendered);
        assert!(text.contains("Recommended: pause this one."), "{text}");
        assert!(!text.contains("these 1."), "{text}");
        assert!(text.contains("Recommended: pause these 3."), "{text}");
        let json = serde_json::to_string(&rendered.blocks).unwrap();
        assert!(json.contains("Kill 1 sandbox of one."), "{json}");
    }
}
