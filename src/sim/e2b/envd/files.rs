//! envd's `/files` endpoint (uploads and downloads in the sandbox's scratch directory) and `/envs`.
//!
//! An upload comes in either encoding envd takes (`envd.yaml` lists both): `multipart/form-data`,
//! which every envd version reads and the SDKs send to an envd older than 0.5.7 (each part named
//! `file` is one file, at the `path` parameter when given, else at the part's filename, which
//! the SDKs set to the full path), or `application/octet-stream` with a `path` parameter. Errors
//! are envd's `{"message","code"}` bodies: 400 for a bad path, a directory, an unknown encoding or
//! two parts for one path; 404 for a missing download. Paths are resolved by `exec::resolve`, so
//! neither `..` nor a symlink reaches outside the sandbox's scratch directory.
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::Sim;
use super::super::exec::{self, Resolved};
use super::super::wire::Params;
use super::{Target, envd_error};

/// The request's `path`, canonical, or why it is refused (envd answers that with a 400).
fn file_path(raw: Option<&str>) -> Result<String, String> {
    exec::sandbox_path(raw.ok_or("the path parameter is required")?)
}

/// Where `path` is in the scratch directory `dir`, its symlinks followed inside the sandbox.
fn locate(dir: &std::path::Path, path: &str) -> Result<Resolved, String> {
    exec::resolve(dir, path, true).map_err(|e| format!("error resolving path '{path}': {e}"))
}

pub(super) async fn download(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    RawQuery(raw): RawQuery,
) -> Response {
    let params = Params::parse(raw.as_deref());
    let path = match file_path(params.get("path")) {
        Ok(path) => path,
        Err(message) => return envd_error(StatusCode::BAD_REQUEST, message),
    };
    let dir = match sim.exec().workspace(&id) {
        Ok(dir) => dir,
        Err(e) => return envd_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let host = match locate(&dir, &path) {
        Ok(found) => found.host,
        Err(message) => return envd_error(StatusCode::BAD_REQUEST, message),
    };
    match tokio::fs::metadata(&host).await {
        Ok(meta) if meta.is_dir() => {
            return envd_error(
                StatusCode::BAD_REQUEST,
                format!("path '{path}' is a directory"),
            );
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return envd_error(
                StatusCode::NOT_FOUND,
                format!("path '{path}' does not exist"),
            );
        }
        Err(e) => {
            return envd_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error opening file '{path}': {e}"),
            );
        }
    }
    match tokio::fs::read(&host).await {
        Ok(content) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            content,
        )
            .into_response(),
        Err(e) => envd_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error reading file '{path}': {e}"),
        ),
    }
}

/// One file of an upload: where it goes and what it holds.
struct Incoming {
    path: String,
    content: Bytes,
}

pub(super) async fn upload(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header_text = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let content_type = header_text(header::CONTENT_TYPE);
    let encoding = header_text(header::CONTENT_ENCODING);
    if !encoding.trim().is_empty() && !encoding.trim().eq_ignore_ascii_case("identity") {
        return envd_error(
            StatusCode::BAD_REQUEST,
            format!(
                "this simulator does not decompress uploads (Content-Encoding: {encoding}); send the file uncompressed"
            ),
        );
    }
    let params = Params::parse(raw.as_deref());
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let files = if media == "application/octet-stream" {
        match params.get("path") {
            None => {
                return envd_error(
                    StatusCode::BAD_REQUEST,
                    "path query parameter is required for raw body upload",
                );
            }
            Some(path) => vec![Incoming {
                path: path.to_owned(),
                content: body,
            }],
        }
    } else if media.starts_with("multipart/") {
        match multipart_files(&content_type, &body, params.get("path")) {
            Ok(files) => files,
            Err(message) => return envd_error(StatusCode::BAD_REQUEST, message),
        }
    } else {
        return envd_error(
            StatusCode::BAD_REQUEST,
            format!(
                "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
            ),
        );
    };
    let dir = match sim.exec().workspace(&id) {
        Ok(dir) => dir,
        Err(e) => return envd_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mut written: Vec<Value> = Vec::new();
    for file in files {
        let path = match file_path(Some(&file.path)) {
            Ok(path) => path,
            Err(message) => return envd_error(StatusCode::BAD_REQUEST, message),
        };
        if written.iter().any(|w| w["path"] == path.as_str()) {
            return envd_error(
                StatusCode::BAD_REQUEST,
                format!(
                    "you cannot upload multiple files to the same path '{path}' in one upload request, only the first specified file was uploaded"
                ),
            );
        }
        if let Err((status, message)) = write_file(&dir, &path, &file.content).await {
            return envd_error(status, message);
        }
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        written.push(json!({ "path": path, "name": name, "type": "file" }));
    }
    let size = tokio::task::spawn_blocking(move || exec::dir_size(&dir))
        .await
        .unwrap_or(0);
    sim.exec().set_disk_used(&id, size);
    Json(Value::Array(written)).into_response()
}

/// Writes one uploaded file, making its parent directories as envd's `EnsureDirs` does; an
/// error is the status and message envd answers with.
async fn write_file(
    dir: &std::path::Path,
    path: &str,
    content: &[u8],
) -> Result<(), (StatusCode, String)> {
    let host = locate(dir, path)
        .map_err(|message| (StatusCode::BAD_REQUEST, message))?
        .host;
    if tokio::fs::metadata(&host).await.is_ok_and(|m| m.is_dir()) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("path is a directory: {path}"),
        ));
    }
    if let Some(parent) = host.parent()
        && let Err(e) = tokio::fs::create_dir_all(parent).await
    {
        return Err((
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error ensuring directories: cannot create the parents of '{path}': {e}"),
        ));
    }
    tokio::fs::write(&host, content).await.map_err(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error writing file '{path}': {e}"),
        )
    })
}

/// The files of a `multipart/form-data` body: each part named `file`, at `path` when the request
/// gives one, else at the part's filename (kept whole, not cut to its last component, as envd's
/// `FileNameWithPath` does). Other parts are skipped, as envd skips them.
fn multipart_files(
    content_type: &str,
    body: &Bytes,
    path: Option<&str>,
) -> Result<Vec<Incoming>, String> {
    let boundary = media_params(content_type)
        .into_iter()
        .find(|(k, _)| k == "boundary")
        .map(|(_, v)| v)
        .filter(|b| !b.is_empty())
        .ok_or("error parsing multipart form: no multipart boundary param in Content-Type")?;
    let mut files = Vec::new();
    for part in parts(body, &boundary)? {
        let disposition = part
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-disposition"))
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        let params = media_params(disposition);
        let param = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        if param("name").as_deref() != Some("file") {
            continue;
        }
        let target = match path {
            Some(path) => path.to_owned(),
            None => param("filename").ok_or(
                "error getting multipart custom part file name: filename not found in Content-Disposition header",
            )?,
        };
        files.push(Incoming {
            path: target,
            content: part.content,
        });
    }
    Ok(files)
}

struct Part {
    headers: Vec<(String, String)>,
    content: Bytes,
}

/// Splits a multipart body at its boundary into parts (headers and content).
fn parts(body: &Bytes, boundary: &str) -> Result<Vec<Part>, String> {
    let bad = |why: &str| format!("error reading form: {why}");
    let delimiter = format!("--{boundary}");
    let next_delimiter = format!("\r\n--{boundary}");
    let finder = memchr::memmem::Finder::new(delimiter.as_bytes());
    let next_finder = memchr::memmem::Finder::new(next_delimiter.as_bytes());
    let mut at = finder
        .find(body)
        .ok_or_else(|| bad("the body holds no multipart boundary"))?
        + delimiter.len();
    let mut out = Vec::new();
    loop {
        let rest = &body[at..];
        if rest.starts_with(b"--") {
            return Ok(out);
        }
        let line_end = memchr::memmem::find(rest, b"\r\n")
            .ok_or_else(|| bad("a boundary line does not end"))?;
        let head_start = at + line_end + 2;
        let head_len = memchr::memmem::find(&body[head_start..], b"\r\n\r\n")
            .ok_or_else(|| bad("a part's headers do not end"))?;
        let head = String::from_utf8_lossy(&body[head_start..head_start + head_len]).into_owned();
        let content_start = head_start + head_len + 4;
        let content_len = next_finder
            .find(&body[content_start..])
            .ok_or_else(|| bad("a part does not end with the boundary"))?;
        out.push(Part {
            headers: head
                .split("\r\n")
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect(),
            content: body.slice(content_start..content_start + content_len),
        });
        at = content_start + content_len + next_delimiter.len();
    }
}

/// The parameters of a header value such as `form-data; name="file"; filename="/a b.txt"`, with
/// quoted strings unquoted as Go's `mime.ParseMediaType` unquotes them (backslash escapes).
fn media_params(value: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = match value.find(';') {
        Some(at) => &value[at + 1..],
        None => return out,
    };
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        let Some(eq) = rest.find('=') else {
            return out;
        };
        let key = rest[..eq].trim().to_ascii_lowercase();
        rest = &rest[eq + 1..];
        let mut val = String::new();
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            val.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => val.push(c),
                }
            }
            rest = &quoted[end.min(quoted.len())..];
        } else {
            let end = rest.find(';').unwrap_or(rest.len());
            val = rest[..end].trim().to_owned();
            rest = &rest[end..];
        }
        out.push((key, val));
    }
}

/// `GET /envs`: the variables every process of the sandbox starts with.
pub(super) async fn envs(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
) -> Response {
    Json(json!(super::process::sandbox_env(&sim, &id))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition_params_are_unquoted_as_go_unquotes_them() {
        assert_eq!(
            media_params(r#"form-data; name="file"; filename="/home/user/a \"b\".txt""#),
            vec![
                ("name".to_owned(), "file".to_owned()),
                ("filename".to_owned(), r#"/home/user/a "b".txt"#.to_owned())
            ]
        );
        assert_eq!(
            media_params("multipart/form-data; boundary=abc123"),
            vec![("boundary".to_owned(), "abc123".to_owned())]
        );
    }

    #[test]
    fn a_multipart_body_splits_into_its_file_parts() {
        let body = Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nskip\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b.bin\"\r\n\r\n\x00\r\n\x01\r\n--XyZ--\r\n",
        );
        let files = multipart_files("multipart/form-data; boundary=XyZ", &body, None).unwrap();
        let got: Vec<(&str, &[u8])> = files
            .iter()
            .map(|f| (f.path.as_str(), &f.content[..]))
            .collect();
        assert_eq!(
            got,
            vec![
                ("/home/user/a.txt", &b"hello"[..]),
                ("b.bin", &b"\x00\r\n\x01"[..])
            ]
        );
        let one = multipart_files("multipart/form-data; boundary=XyZ", &body, Some("x")).unwrap();
        assert_eq!(one[0].path, "x");
        assert!(multipart_files("multipart/form-data", &body, None).is_err());
        assert!(
            multipart_files(
                "multipart/form-data; boundary=XyZ",
                &Bytes::from_static(b"--XyZ\r\nbroken"),
                None
            )
            .is_err()
        );
    }
}
