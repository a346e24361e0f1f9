//! A run's record in the store: read it, and change it by compare-and-swap so that two
//! replicas (a worker and a takeover) never overwrite each other's step. The store keeps the
//! JSON opaque; this file is the only one that turns it into a [`Run`] and back.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::model::{FileSpec, Run, SetupStep};
use crate::ids::RunId;
use crate::store::{Store, StoreError, StoredRun};

/// How many times [`update`] re-reads after losing a race before giving up.
const MAX_UPDATE_ATTEMPTS: usize = 32;

/// What a run needs once, before its command starts, and that must not stay in its record:
/// file contents (large) and environment values (they may be secrets). Deleted from the store
/// once the process has started.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RunInputs {
    pub files: Vec<FileSpec>,
    pub env: BTreeMap<String, String>,
    /// Names of `env` entries whose values are scrubbed from the output.
    #[serde(default)]
    pub secret_env: Vec<String>,
    /// Steward's own step before the command (a push test's clone), with its credential.
    #[serde(default)]
    pub setup: Option<SetupStep>,
}

/// Once the command has started, the run's inputs shrink to the values of its secret
/// variables (kept so that a replica taking the run over can still scrub them from the rest of
/// the output): file contents, other env values and the setup step's credential leave Redis.
/// The rest goes when the run ends.
pub(crate) async fn keep_only_secrets(store: &Store, id: &RunId) -> Result<(), StoreError> {
    let Some(inputs) = inputs(store, id).await? else {
        return Ok(());
    };
    let env: BTreeMap<String, String> = inputs
        .secret_env
        .iter()
        .filter_map(|name| inputs.env.get(name).map(|v| (name.clone(), v.clone())))
        .collect();
    if env.is_empty() {
        return store.delete_run_files(id).await;
    }
    let kept = RunInputs {
        files: Vec::new(),
        secret_env: env.keys().cloned().collect(),
        env,
        setup: None,
    };
    let json = serde_json::to_string(&kept).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    store.replace_run_files(id, &json).await
}

/// The stored run with its output counters filled in from the store.
fn decode(id: &RunId, stored: StoredRun) -> Result<(Run, u64), StoreError> {
    let mut run: Run = serde_json::from_str(&stored.json)
        .map_err(|e| StoreError::Corrupt(format!("run {id}: {e}")))?;
    run.output_bytes = stored.output_total;
    run.output_truncated = stored.output_total > stored.output_kept;
    Ok((run, stored.version))
}

fn encode(run: &Run) -> Result<String, StoreError> {
    serde_json::to_string(run).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Stores a new run and its inputs.
pub(crate) async fn create(store: &Store, run: &Run, inputs: &RunInputs) -> Result<(), StoreError> {
    let inputs = serde_json::to_string(inputs).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    store.create_run(&run.id, &encode(run)?, &inputs).await
}

/// The run with this id, if it exists.
pub(crate) async fn load(store: &Store, id: &RunId) -> Result<Option<Run>, StoreError> {
    match store.load_run(id).await? {
        None => Ok(None),
        Some(stored) => Ok(Some(decode(id, stored)?.0)),
    }
}

/// The run's inputs, until they are deleted.
pub(crate) async fn inputs(store: &Store, id: &RunId) -> Result<Option<RunInputs>, StoreError> {
    match store.run_files(id).await? {
        None => Ok(None),
        Some(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("inputs of run {id}: {e}"))),
    }
}

/// Reads the run, computes its next state with `change` (`None`: leave it as it is) and writes
/// it only if nobody wrote in between; on a lost race, reads again and asks `change` again.
/// Returns the run as stored afterwards.
pub(crate) async fn update<F>(store: &Store, id: &RunId, mut change: F) -> Result<Run, StoreError>
where
    F: FnMut(&Run) -> Option<Run>,
{
    for _ in 0..MAX_UPDATE_ATTEMPTS {
        let stored = store
            .load_run(id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("run {id}")))?;
        let (current, version) = decode(id, stored)?;
        let Some(mut next) = change(&current) else {
            return Ok(current);
        };
        // The counters live beside the record; the JSON copy is only informative.
        next.output_bytes = current.output_bytes;
        next.output_truncated = current.output_truncated;
        if store.swap_run(id, version, &encode(&next)?).await? {
            return Ok(next);
        }
    }
    Err(StoreError::Conflict(format!(
        "run {id} kept changing; gave up after {MAX_UPDATE_ATTEMPTS} attempts"
    )))
}
