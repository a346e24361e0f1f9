//! A choice on a group that offers several (a burst alert's Pause all of these, Kill all of
//! these, Leave them): the person must be allowed to choose that option, the choice is recorded
//! once (of two concurrent clicks one wins, the other is told who), and carrying it out is the
//! same per-item, exactly-once, re-checked execution an approved sweep group gets.
use chrono::Utc;

use super::{ListClick, allowed, audit_list, clicked_list, kick, refresh, refused_sentence};
use crate::approvals::Services;
use crate::approvals::decide::Reply;
use crate::cases::DecisionOption;
use crate::cases::list::ListEvent;
use crate::store::ListUpdated;

pub async fn choose_clicked(svc: &Services, click: ListClick<'_>, option: DecisionOption) -> Reply {
    let list = match clicked_list(svc, &click).await {
        Ok(list) => list,
        Err(reply) => return reply,
    };
    let Some(group) = click.group else {
        return Reply::Ephemeral("This button names no group, so nothing was done.".into());
    };
    if let Err(sentence) = allowed(svc, &list, click.user, option).await {
        audit_list(
            svc,
            &list,
            click.user,
            "choose",
            &format!("refused: {sentence}"),
        )
        .await;
        crate::metrics::decision(option.as_str(), "not_allowed");
        return Reply::Ephemeral(sentence);
    }
    let event = ListEvent::Choose {
        group,
        option,
        by: click.user.clone(),
    };
    match svc.store.update_list(click.list, event, Utc::now()).await {
        Ok(ListUpdated::Applied(list)) => {
            audit_list(
                svc,
                &list,
                click.user,
                "choose",
                &format!("ok: {} for group {group}", option.as_str()),
            )
            .await;
            refresh(svc, &list).await;
            kick(svc, &list.id);
            Reply::Nothing
        }
        Ok(ListUpdated::Refused { refusal, .. }) => Reply::Mentioning(refused_sentence(&refusal)),
        Err(e) => Reply::Ephemeral(super::unavailable(&e)),
    }
}
