//! A sweep's list decisions as the rest of Steward sees them: typed, each change applied by
//! `cases::list::apply_list` under compare-and-swap, so of two concurrent approvals of one group
//! exactly one is written.
use chrono::{DateTime, Utc};

use super::{MAX_UPDATE_ATTEMPTS, Store, StoreError, decode, encode};
use crate::cases::list::{ListCase, ListEvent, ListRefusal, apply_list};
use crate::cases::{Case, Subject};
use crate::ids::{CaseId, ListId};

/// The result of [`Store::update_list`].
#[derive(Debug, Clone, PartialEq)]
pub enum ListUpdated {
    Applied(ListCase),
    /// Not written: the event does not apply to the stored list (it is returned as it is).
    Refused {
        current: Box<ListCase>,
        refusal: ListRefusal,
    },
}

macro_rules! delegate {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            Store::Redis(s) => s.$method($($arg),*).await,
            Store::Memory(s) => s.$method($($arg),*).await,
        }
    };
}

impl Store {
    /// Stores a new list (version 1) and lists it as in play.
    pub async fn create_list(&self, list: &ListCase) -> Result<ListCase, StoreError> {
        let mut stored = list.clone();
        stored.version = 1;
        let json = encode(&stored)?;
        let score = stored.created_at.timestamp_millis();
        if delegate!(self.create_list(&stored.id, &json, score))? {
            Ok(stored)
        } else {
            Err(StoreError::Conflict(format!(
                "list {} already exists",
                stored.id
            )))
        }
    }

    pub async fn get_list(&self, id: &ListId) -> Result<ListCase, StoreError> {
        let Some((version, json)) = delegate!(self.load_list(id))? else {
            return Err(StoreError::NotFound(format!("list {id}")));
        };
        let mut list: ListCase = decode(&format!("list {id}"), &json)?;
        list.version = version;
        Ok(list)
    }

    /// Applies `event` to the stored list, re-reading and re-applying when another writer got
    /// there first.
    pub async fn update_list(
        &self,
        id: &ListId,
        event: ListEvent,
        now: DateTime<Utc>,
    ) -> Result<ListUpdated, StoreError> {
        for _ in 0..MAX_UPDATE_ATTEMPTS {
            let current = self.get_list(id).await?;
            let mut next = match apply_list(&current, event.clone(), now) {
                Ok(next) => next,
                Err(refusal) => {
                    return Ok(ListUpdated::Refused {
                        current: Box::new(current),
                        refusal,
                    });
                }
            };
            next.version = current.version;
            let json = encode(&next)?;
            if delegate!(self.swap_list(id, current.version, &json))? {
                next.version += 1;
                return Ok(ListUpdated::Applied(next));
            }
        }
        Err(StoreError::Conflict(format!(
            "list {id} kept changing under this update"
        )))
    }

    /// The ids of lists still in play, oldest first.
    pub async fn active_lists(&self) -> Result<Vec<ListId>, StoreError> {
        Ok(delegate!(self.active_lists())?
            .into_iter()
            .filter_map(|id| ListId::parse(id).ok())
            .collect())
    }

    /// Takes a list out of play: its work is finished (it stays readable until it ages out).
    pub async fn retire_list(&self, id: &ListId) -> Result<(), StoreError> {
        delegate!(self.retire_list(id))
    }

    /// Many cases at once (`None` for one that no longer exists), in the order asked.
    pub async fn cases_of(
        &self,
        items: &[(Subject, CaseId)],
    ) -> Result<Vec<Option<Case>>, StoreError> {
        delegate!(self.cases_of(items))
    }
}
