//! `filesystem.Filesystem` as envd serves it, on the sandbox's scratch directory: `Stat`,
//! `ListDir`, `MakeDir`, `Move`, `Remove` (unary), the polled watchers (`CreateWatcher`,
//! `GetWatcherEvents`, `RemoveWatcher`) and `WatchDir` (a server stream).
//!
//! Answers follow envd's code (`entryInfo`, `walkDir`, `EnsureDirs`): a missing path is
//! `not_found`, an existing directory on `MakeDir` is `already_exists` (the SDK's `False`), a file
//! where a directory is wanted `invalid_argument`, a symlink reports its target's type with
//! `symlinkTarget`, `Remove` of a missing path succeeds. Every path is resolved by
//! `exec::resolve`, so a symlink pointing out of the sandbox lands inside its scratch directory,
//! and `..` is refused before anything is touched. Watchers differ from envd's inotify in one
//! way: they compare the directory between looks (every `GetWatcherEvents`, or every
//! [`WATCH_POLL`] on a stream), so a file made and removed between two looks is not seen, and a
//! rename shows as `RENAME` of the old name and `CREATE` of the new, as inotify reports it.
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::exec::{self, EntrySig, HOME, ResolveError, Resolved, Watcher};
use super::super::{Sim, now_ms};
use super::Target;
use super::rpc::{
    self, Code, Message, RpcError, answer, end_frame, field, frame, stream_request,
    stream_response, unary_request,
};

/// Entries one `ListDir` answers with at most.
const MAX_LIST_ENTRIES: usize = 10_000;
/// Entries a watcher compares at most (the rest of a huge tree is not watched).
const MAX_WATCH_ENTRIES: usize = 20_000;
/// How often a `WatchDir` stream looks at its directory.
pub(super) const WATCH_POLL: Duration = Duration::from_millis(100);
/// The sandbox's user, who owns everything in the simulated sandbox.
const OWNER: &str = "user";

type Answer = Result<Value, RpcError>;

/// Runs blocking filesystem work off the runtime's threads and answers with its result.
async fn blocking(work: impl FnOnce() -> Answer + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(message)) => answer(message),
        Ok(Err(error)) => error.into_response(),
        Err(e) => RpcError::new(Code::Internal, format!("the handler failed: {e}")).into_response(),
    }
}

/// A request's path, canonical: `~` expanded, relative to the home directory, empty meaning the
/// home directory (envd's default working directory).
fn requested(message: &Value, json_name: &str, proto_name: &str) -> Result<String, RpcError> {
    let raw = rpc::string(field(message, json_name, proto_name)).unwrap_or_default();
    let raw = if raw.trim().is_empty() { HOME } else { raw };
    exec::sandbox_path(raw).map_err(|m| RpcError::new(Code::InvalidArgument, m))
}

fn resolved(dir: &Path, path: &str, follow_last: bool) -> Result<Resolved, RpcError> {
    exec::resolve(dir, path, follow_last).map_err(|e| match e {
        ResolveError::Loop => RpcError::new(
            Code::FailedPrecondition,
            format!("cyclic symlink or chain >40 links at \"{path}\""),
        ),
        ResolveError::BadLink(why) => RpcError::new(
            Code::Internal,
            format!("error resolving symlink at \"{path}\": {why}"),
        ),
    })
}

fn workspace(sim: &Sim, id: &str) -> Result<PathBuf, RpcError> {
    sim.exec()
        .workspace(id)
        .map_err(|e| RpcError::new(Code::Internal, format!("no scratch directory: {e}")))
}

fn is_missing(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// Go's `FileMode.String()` of an entry: type letters (`d`, `L`, `p`, `S`, `D`, `c`, `u`, `g`,
/// `t`, or `-` for none) and `rwx` bits.
fn mode_string(meta: &std::fs::Metadata) -> String {
    let kind = meta.file_type();
    let mode = meta.permissions().mode();
    let mut out = String::new();
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_dir() {
            out.push('d');
        }
        if kind.is_symlink() {
            out.push('L');
        }
        if kind.is_block_device() || kind.is_char_device() {
            out.push('D');
        }
        if kind.is_fifo() {
            out.push('p');
        }
        if kind.is_socket() {
            out.push('S');
        }
        if mode & 0o4000 != 0 {
            out.push('u');
        }
        if mode & 0o2000 != 0 {
            out.push('g');
        }
        if kind.is_char_device() {
            out.push('c');
        }
        if mode & 0o1000 != 0 {
            out.push('t');
        }
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, letter) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (1 << (8 - i)) != 0 {
            letter
        } else {
            '-'
        });
    }
    out
}

fn file_type(meta: &std::fs::Metadata) -> &'static str {
    if meta.is_dir() {
        "FILE_TYPE_DIRECTORY"
    } else if meta.is_file() {
        "FILE_TYPE_FILE"
    } else if meta.file_type().is_symlink() {
        "FILE_TYPE_SYMLINK"
    } else {
        ""
    }
}

fn timestamp(meta: &std::fs::Metadata) -> String {
    meta.modified()
        .map(|t| {
            chrono::DateTime::<chrono::Utc>::from(t)
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        })
        .unwrap_or_default()
}

/// envd's `EntryInfo` for the entry at canonical sandbox path `real` (its parents already
/// resolved; a symlink there is the link itself), shown as `shown`.
fn entry_info(dir: &Path, real: &str, shown: &str) -> Answer {
    let host = exec::host_path(dir, real);
    let meta = std::fs::symlink_metadata(&host).map_err(|e| {
        if is_missing(&e) {
            RpcError::new(
                Code::NotFound,
                format!("file not found: lstat {shown}: no such file or directory"),
            )
        } else {
            RpcError::new(
                Code::Internal,
                format!("error getting file info: lstat {shown}: {e}"),
            )
        }
    })?;
    let name = shown.rsplit('/').find(|p| !p.is_empty()).unwrap_or("/");
    let (kind, mode, target) = if meta.file_type().is_symlink() {
        // Like envd: the type and mode are the target's, and a dangling link's target is itself.
        let target = exec::resolve(dir, real, true).ok();
        match target
            .as_ref()
            .and_then(|t| std::fs::metadata(&t.host).ok().map(|m| (t, m)))
        {
            Some((t, target_meta)) => (
                file_type(&target_meta),
                target_meta.permissions().mode() & 0o777,
                Some(t.sandbox.clone()),
            ),
            None => ("", 0, Some(shown.to_owned())),
        }
    } else {
        (file_type(&meta), meta.permissions().mode() & 0o777, None)
    };
    Ok(Message::new()
        .string("name", name)
        .string("type", kind)
        .string("path", shown)
        .int64("size", i64::try_from(meta.len()).unwrap_or(i64::MAX))
        .uint32("mode", mode)
        .string("permissions", &mode_string(&meta))
        .string("owner", OWNER)
        .string("group", OWNER)
        .string("modifiedTime", &timestamp(&meta))
        .optional("symlinkTarget", target.as_deref())
        .done())
}

// ---- Stat, ListDir, MakeDir, Move, Remove ----

pub(super) async fn stat(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "filesystem.StatRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let work = move || {
        let path = requested(&request, "path", "path")?;
        let dir = workspace(&sim, &id)?;
        let real = resolved(&dir, &path, false)?;
        let entry = entry_info(&dir, &real.sandbox, &path)?;
        Ok(json!({ "entry": entry }))
    };
    blocking(work).await
}

pub(super) async fn list_dir(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "filesystem.ListDirRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let work = move || {
        let path = requested(&request, "path", "path")?;
        // Depth 0 is proto3's "unset": the directory's own entries, as envd's default.
        let depth = rpc::uint32(&request["depth"]).unwrap_or(0).max(1) as usize;
        let dir = workspace(&sim, &id)?;
        let real = resolved(&dir, &path, true)?;
        match std::fs::metadata(&real.host) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    format!("path is not a directory: {path}"),
                ));
            }
            Err(e) if is_missing(&e) => {
                return Err(RpcError::new(
                    Code::NotFound,
                    format!("path not found: lstat {path}: no such file or directory"),
                ));
            }
            Err(e) => {
                return Err(RpcError::new(
                    Code::Internal,
                    format!("error getting file info: {e}"),
                ));
            }
        }
        let mut entries = Vec::new();
        walk(&dir, &real.sandbox, &path, depth, &mut entries)?;
        Ok(Message::new().value("entries", json!(entries)).done())
    };
    blocking(work).await
}

/// envd's `walkDir`: entries in lexical order, depth first, symlinks not followed, entries that
/// vanished meanwhile skipped; each shown under the requested path.
fn walk(
    dir: &Path,
    real: &str,
    shown: &str,
    depth: usize,
    out: &mut Vec<Value>,
) -> Result<(), RpcError> {
    let host = exec::host_path(dir, real);
    let mut names: Vec<String> = std::fs::read_dir(&host)
        .map_err(|e| {
            RpcError::new(
                Code::Internal,
                format!("error reading directory {shown}: {e}"),
            )
        })?
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    names.sort();
    for name in names {
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "the listing of {shown} holds more than {MAX_LIST_ENTRIES} entries; ask for less depth"
                ),
            ));
        }
        let real_child = join(real, &name);
        let shown_child = join(shown, &name);
        match entry_info(dir, &real_child, &shown_child) {
            Ok(entry) => out.push(entry),
            Err(e) if e.code == Code::NotFound => continue,
            Err(e) => return Err(e),
        }
        let is_dir =
            std::fs::symlink_metadata(exec::host_path(dir, &real_child)).is_ok_and(|m| m.is_dir());
        if depth > 1 && is_dir {
            walk(dir, &real_child, &shown_child, depth - 1, out)?;
        }
    }
    Ok(())
}

fn join(parent: &str, name: &str) -> String {
    format!("{}/{name}", parent.trim_end_matches('/'))
}

pub(super) async fn make_dir(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "filesystem.MakeDirRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let work = move || {
        let path = requested(&request, "path", "path")?;
        let dir = workspace(&sim, &id)?;
        let real = resolved(&dir, &path, true)?;
        match std::fs::metadata(&real.host) {
            Ok(meta) if meta.is_dir() => {
                return Err(RpcError::new(
                    Code::AlreadyExists,
                    format!("directory already exists: {path}"),
                ));
            }
            Ok(_) => {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    format!("path already exists but it is not a directory: {path}"),
                ));
            }
            Err(e) if is_missing(&e) => {}
            Err(e) => {
                return Err(RpcError::new(
                    Code::Internal,
                    format!("error getting file info: {e}"),
                ));
            }
        }
        std::fs::create_dir_all(&real.host).map_err(|e| {
            RpcError::new(
                Code::Internal,
                format!("failed to create directory {path}: {e}"),
            )
        })?;
        let entry = entry_info(&dir, &real.sandbox, &path)?;
        Ok(json!({ "entry": entry }))
    };
    blocking(work).await
}

pub(super) async fn move_entry(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "filesystem.MoveRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let work = move || {
        let source = requested(&request, "source", "source")?;
        let destination = requested(&request, "destination", "destination")?;
        let dir = workspace(&sim, &id)?;
        // Renaming a symlink renames the link, and one at the destination is replaced, not
        // written through: the last components are not followed.
        let from = resolved(&dir, &source, false)?;
        let to = resolved(&dir, &destination, false)?;
        if from.sandbox == "/" || to.sandbox == "/" {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "the sandbox's root cannot be moved or replaced",
            ));
        }
        if let Some(parent) = to.host.parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                RpcError::new(
                    Code::Internal,
                    format!("failed to create the parent directories of {destination}: {e}"),
                )
            })?;
        }
        std::fs::rename(&from.host, &to.host).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                RpcError::new(
                    Code::NotFound,
                    format!("source file not found: rename {source} {destination}: no such file or directory"),
                )
            } else {
                RpcError::new(
                    Code::Internal,
                    format!("error renaming: rename {source} {destination}: {e}"),
                )
            }
        })?;
        let entry = entry_info(&dir, &to.sandbox, &destination)?;
        Ok(json!({ "entry": entry }))
    };
    blocking(work).await
}

pub(super) async fn remove(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "filesystem.RemoveRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let work = move || {
        let path = requested(&request, "path", "path")?;
        let dir = workspace(&sim, &id)?;
        // A symlink is removed itself, never what it points at.
        let real = resolved(&dir, &path, false)?;
        if real.sandbox == "/" {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "the sandbox's root cannot be removed",
            ));
        }
        let removed = match std::fs::symlink_metadata(&real.host) {
            // Like Go's `os.RemoveAll`: nothing there is no error.
            Err(e) if is_missing(&e) => Ok(()),
            Err(e) => Err(e),
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&real.host),
            Ok(_) => std::fs::remove_file(&real.host),
        };
        removed.map_err(|e| {
            RpcError::new(
                Code::Internal,
                format!("error removing file or directory: {path}: {e}"),
            )
        })?;
        let size = exec::dir_size(&dir);
        sim.exec().set_disk_used(&id, size);
        Ok(json!({}))
    };
    blocking(work).await
}

// ---- watchers ----

/// What a watched directory holds now: entries by path relative to it, symlinks not followed.
fn look(host_dir: &Path, recursive: bool) -> BTreeMap<String, EntrySig> {
    let mut seen = BTreeMap::new();
    let mut stack = vec![(host_dir.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if seen.len() >= MAX_WATCH_ENTRIES {
                return seen;
            }
            let (Ok(name), Ok(meta)) = (entry.file_name().into_string(), entry.metadata()) else {
                continue;
            };
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let is_dir = meta.is_dir();
            seen.insert(
                rel.clone(),
                EntrySig {
                    is_dir,
                    ino: meta.ino(),
                    len: meta.len(),
                    mtime_ns: i128::from(meta.mtime()) * 1_000_000_000
                        + i128::from(meta.mtime_nsec()),
                    mode: meta.mode(),
                },
            );
            if recursive && is_dir {
                stack.push((entry.path(), rel));
            }
        }
    }
    seen
}

/// The events between two looks, as inotify would name them: a name gone whose entry shows up
/// under another is `RENAME` (old name) and `CREATE` (new name).
fn changes(
    before: &BTreeMap<String, EntrySig>,
    after: &BTreeMap<String, EntrySig>,
) -> Vec<(String, &'static str)> {
    let mut events = Vec::new();
    let arrived: Vec<&EntrySig> = after
        .iter()
        .filter(|(name, _)| !before.contains_key(*name))
        .map(|(_, sig)| sig)
        .collect();
    for (name, sig) in before {
        if !after.contains_key(name) {
            let renamed = arrived.iter().any(|a| a.ino == sig.ino);
            events.push((
                name.clone(),
                if renamed {
                    "EVENT_TYPE_RENAME"
                } else {
                    "EVENT_TYPE_REMOVE"
                },
            ));
        }
    }
    for (name, sig) in after {
        match before.get(name) {
            None => events.push((name.clone(), "EVENT_TYPE_CREATE")),
            Some(old) if old.ino != sig.ino => events.push((name.clone(), "EVENT_TYPE_CREATE")),
            Some(old) => {
                if !sig.is_dir && (old.len != sig.len || old.mtime_ns != sig.mtime_ns) {
                    events.push((name.clone(), "EVENT_TYPE_WRITE"));
                }
                if old.mode != sig.mode {
                    events.push((name.clone(), "EVENT_TYPE_CHMOD"));
                }
            }
        }
    }
    events
}

/// One `FilesystemEvent`; with `include_entry`, the entry of a create, write or chmod (never of
/// a remove or rename, whose entry is gone), as envd's `opCarriesEntry` decides.
fn event_message(dir: &Path, watcher: &Watcher, name: &str, kind: &str) -> Value {
    let carries = matches!(
        kind,
        "EVENT_TYPE_CREATE" | "EVENT_TYPE_WRITE" | "EVENT_TYPE_CHMOD"
    );
    let entry = (watcher.include_entry && carries)
        .then(|| {
            entry_info(
                dir,
                &join(&watcher.real_dir, name),
                &join(&watcher.shown_dir, name),
            )
            .ok()
        })
        .flatten();
    Message::new()
        .string("name", name)
        .string("type", kind)
        .value("entry", entry.unwrap_or(Value::Null))
        .done()
}

/// A new watcher on the request's directory, as it is now.
fn new_watcher(sim: &Sim, id: &str, request: &Value) -> Result<(PathBuf, Watcher), RpcError> {
    let path = requested(request, "path", "path")?;
    let dir = workspace(sim, id)?;
    let real = resolved(&dir, &path, true)?;
    match std::fs::metadata(&real.host) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!("path {path} not a directory"),
            ));
        }
        Err(e) if is_missing(&e) => {
            return Err(RpcError::new(
                Code::NotFound,
                format!("path {path} not found: stat {path}: no such file or directory"),
            ));
        }
        Err(e) => {
            return Err(RpcError::new(
                Code::Internal,
                format!("error statting path {path}: {e}"),
            ));
        }
    }
    let recursive = rpc::boolean(&request["recursive"]);
    let watcher = Watcher {
        seen: look(&real.host, recursive),
        shown_dir: path,
        real_dir: real.sandbox,
        recursive,
        include_entry: rpc::boolean(field(request, "includeEntry", "include_entry")),
    };
    Ok((dir, watcher))
}

fn watcher_id(request: &Value) -> String {
    rpc::string(field(request, "watcherId", "watcher_id"))
        .unwrap_or_default()
        .to_owned()
}

fn no_watcher(id: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("watcher with id {id} not found"))
}

pub(super) async fn create_watcher(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "filesystem.CreateWatcherRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let work = move || {
        let (_, watcher) = new_watcher(&sim, &id, &request)?;
        let watcher_id = format!("w{}", uuid::Uuid::new_v4().simple());
        if !sim.exec().add_watcher(&id, watcher_id.clone(), watcher) {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "this sandbox already has {} watchers; remove one first",
                    exec::MAX_WATCHERS
                ),
            ));
        }
        Ok(json!({ "watcherId": watcher_id }))
    };
    blocking(work).await
}

pub(super) async fn get_watcher_events(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "filesystem.GetWatcherEventsRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let work = move || {
        let watcher_id = watcher_id(&request);
        let watcher = sim
            .exec()
            .watcher(&id, &watcher_id)
            .ok_or_else(|| no_watcher(&watcher_id))?;
        let dir = workspace(&sim, &id)?;
        let now = look(&exec::host_path(&dir, &watcher.real_dir), watcher.recursive);
        let events: Vec<Value> = changes(&watcher.seen, &now)
            .into_iter()
            .map(|(name, kind)| event_message(&dir, &watcher, &name, kind))
            .collect();
        sim.exec().set_seen(&id, &watcher_id, now);
        Ok(Message::new().value("events", json!(events)).done())
    };
    blocking(work).await
}

pub(super) async fn remove_watcher(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "filesystem.RemoveWatcherRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let watcher_id = watcher_id(&request);
    if !sim.exec().remove_watcher(&id, &watcher_id) {
        return no_watcher(&watcher_id).into_response();
    }
    answer(json!({}))
}

/// `WatchDir`: a start event, then the directory's changes as they are seen (every
/// [`WATCH_POLL`]), keepalives at the reader's interval, until the reader goes away or the
/// sandbox stops running.
pub(super) async fn watch_dir(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match stream_request(&headers, &body, "filesystem.WatchDirRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let made = {
        let (sim, id) = (sim.clone(), id.clone());
        tokio::task::spawn_blocking(move || new_watcher(&sim, &id, &request)).await
    };
    let (dir, watcher) = match made {
        Ok(Ok(made)) => made,
        Ok(Err(error)) => return error.into_stream(),
        Err(e) => {
            return RpcError::new(Code::Internal, format!("the handler failed: {e}")).into_stream();
        }
    };
    let keepalive = super::keepalive(&headers);
    let start = frame(0, &json!({ "start": {} }));
    let state = WatchStream {
        sim,
        id,
        dir,
        watcher,
        queued: vec![start],
        poll: tokio::time::interval(WATCH_POLL),
        keepalive: keepalive
            .map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every)),
        ended: false,
    };
    let frames = futures::stream::unfold(state, |mut st| async move {
        loop {
            if !st.queued.is_empty() {
                let next = st.queued.remove(0);
                return Some((Ok::<_, Infallible>(next), st));
            }
            if st.ended {
                return None;
            }
            tokio::select! {
                _ = st.poll.tick() => st.look().await,
                _ = super::tick(&mut st.keepalive) => st.queued.push(frame(0, &json!({ "keepalive": {} }))),
            }
        }
    });
    stream_response(Body::from_stream(frames))
}

struct WatchStream {
    sim: Arc<Sim>,
    id: String,
    dir: PathBuf,
    watcher: Watcher,
    queued: Vec<Bytes>,
    poll: tokio::time::Interval,
    keepalive: Option<tokio::time::Interval>,
    ended: bool,
}

impl WatchStream {
    /// One look at the directory: its changes become events; a sandbox no longer running ends
    /// the stream, as its envd would be gone.
    async fn look(&mut self) {
        let running = self
            .sim
            .world(now_ms())
            .live(&self.id)
            .is_ok_and(|s| s.state == super::super::model::SandboxState::Running);
        if !running {
            self.queued.push(end_frame(Some(&RpcError::new(
                Code::Unavailable,
                "the sandbox stopped running while its directory was watched",
            ))));
            self.ended = true;
            return;
        }
        let (dir, watcher) = (self.dir.clone(), self.watcher.clone());
        let looked = tokio::task::spawn_blocking(move || {
            let now = look(&exec::host_path(&dir, &watcher.real_dir), watcher.recursive);
            let events: Vec<Bytes> = changes(&watcher.seen, &now)
                .into_iter()
                .map(|(name, kind)| {
                    let event = event_message(&dir, &watcher, &name, kind);
                    frame(0, &json!({ "filesystem": event }))
                })
                .collect();
            (now, events)
        })
        .await;
        if let Ok((now, events)) = looked {
            self.watcher.seen = now;
            self.queued.extend(events);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(ino: u64, len: u64) -> EntrySig {
        EntrySig {
            is_dir: false,
            ino,
            len,
            mtime_ns: 0,
            mode: 0o100644,
        }
    }

    #[test]
    fn changes_are_named_as_inotify_names_them() {
        let before = BTreeMap::from([
            ("a".to_owned(), sig(1, 1)),
            ("b".to_owned(), sig(2, 1)),
            ("c".to_owned(), sig(3, 1)),
        ]);
        let after = BTreeMap::from([
            ("a".to_owned(), sig(1, 2)),
            ("d".to_owned(), sig(3, 1)),
            ("e".to_owned(), sig(4, 0)),
        ]);
        assert_eq!(
            changes(&before, &after),
            vec![
                ("b".to_owned(), "EVENT_TYPE_REMOVE"),
                ("c".to_owned(), "EVENT_TYPE_RENAME"),
                ("a".to_owned(), "EVENT_TYPE_WRITE"),
                ("d".to_owned(), "EVENT_TYPE_CREATE"),
                ("e".to_owned(), "EVENT_TYPE_CREATE"),
            ]
        );
    }

    #[test]
    fn modes_are_written_as_go_writes_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("f", &link).unwrap();
        assert_eq!(
            mode_string(&std::fs::metadata(&file).unwrap()),
            "-rw-r-----"
        );
        assert_eq!(
            mode_string(&std::fs::symlink_metadata(&link).unwrap()),
            "Lrwxrwxrwx"
        );
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            mode_string(&std::fs::metadata(dir.path()).unwrap()),
            "drwxr-xr-x"
        );
    }
}
