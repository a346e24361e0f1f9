//! The envd client over real sockets. The server here is a stand-in for envd's wire format: a raw
//! TCP listener that writes hand-made HTTP answers and Connect frames, cut where a real network might
//! cut them, and records what the client sent.
use std::time::Duration;

use sandbox_steward::envd::connect::{END_STREAM_FLAG, encode};
use sandbox_steward::envd::{
    EnvdAddress, EnvdClient, EnvdError, EnvdVersion, ProcessEnd, ProcessEvent, ProcessSpec, Signal,
};
use sandbox_steward::ids::SandboxId;
use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const TOKEN: &str = "envd-token-do-not-show";
const WAIT: Duration = Duration::from_secs(10);

/// One request as the stand-in saw it.
#[derive(Debug)]
struct Seen {
    request_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How the stand-in answers one request.
enum Answer {
    /// `200` with a chunked body; each piece is written and flushed as its own HTTP chunk.
    Chunks(Vec<Vec<u8>>),
    /// A whole answer with this status and body.
    Whole(u16, &'static str, Vec<u8>),
    /// Only a status line and these header lines, then the connection closes.
    Head(u16, &'static str),
}

/// Serves one connection per answer, in order, and reports each request it read.
async fn stand_in(answers: Vec<Answer>) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (seen_tx, seen_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        for answer in answers {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let seen = read_request(&mut socket).await;
            let _ = seen_tx.send(seen);
            match answer {
                Answer::Chunks(pieces) => {
                    socket
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
                        .await
                        .expect("write head");
                    for piece in pieces {
                        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
                        chunk.extend_from_slice(&piece);
                        chunk.extend_from_slice(b"\r\n");
                        socket.write_all(&chunk).await.expect("write chunk");
                        socket.flush().await.expect("flush");
                    }
                    socket.write_all(b"0\r\n\r\n").await.expect("write end");
                }
                Answer::Whole(status, content_type, body) => {
                    let head = format!(
                        "HTTP/1.1 {status} Whatever\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    socket.write_all(head.as_bytes()).await.expect("write head");
                    socket.write_all(&body).await.expect("write body");
                }
                Answer::Head(status, headers) => {
                    let head = format!("HTTP/1.1 {status} Whatever\r\n{headers}\r\n\r\n");
                    socket.write_all(head.as_bytes()).await.expect("write head");
                }
            }
            socket.shutdown().await.ok();
        }
    });
    (base, seen_rx)
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Seen {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let read = socket.read(&mut chunk).await.expect("read");
        assert!(read > 0, "client closed before sending its headers");
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let read = socket.read(&mut chunk).await.expect("read body");
        assert!(read > 0, "client closed mid-body");
        buffer.extend_from_slice(&chunk[..read]);
    }
    Seen {
        request_line,
        headers,
        body: buffer[head_end..head_end + length].to_vec(),
    }
}

/// A client for a current envd (0.5.7: uploads as `application/octet-stream`).
fn client_through(base: &str, token: Option<&str>) -> EnvdClient {
    client_for(base, token, EnvdVersion::new(0, 5, 7))
}

fn client_for(base: &str, token: Option<&str>, version: EnvdVersion) -> EnvdClient {
    let id = SandboxId::parse("sbx-envd-1").unwrap();
    let address = EnvdAddress::resolve(Some(base), &id, Some("unused.example"));
    EnvdClient::new(
        id,
        address,
        token.map(|t| SecretString::from(t.to_owned())),
        version,
    )
    .unwrap()
}

async fn next_seen(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("the stand-in saw a request in time")
        .expect("the stand-in is running")
}

fn frame(json: &str) -> Vec<u8> {
    encode(0, json.as_bytes())
}

#[tokio::test]
async fn start_decodes_events_split_across_chunks_and_sends_the_sdk_headers() {
    let mut wire = Vec::new();
    wire.extend(frame(r#"{"event":{"start":{"pid":7}}}"#));
    wire.extend(frame(r#"{"event":{"keepalive":{}}}"#));
    wire.extend(frame(r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#));
    wire.extend(frame(r#"{"event":{"data":{"stderr":"b29wcw=="}}}"#));
    wire.extend(frame(r#"{"event":{"keepalive":{}}}"#));
    wire.extend(frame(
        r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
    ));
    wire.extend(encode(END_STREAM_FLAG, b"{}"));
    // Cuts: inside the first header, inside a body, and one piece holding several frames.
    let pieces = vec![
        wire[..3].to_vec(),
        wire[3..20].to_vec(),
        wire[20..90].to_vec(),
        wire[90..].to_vec(),
    ];
    let (base, mut seen) = stand_in(vec![Answer::Chunks(pieces)]).await;
    let client = client_through(&base, Some(TOKEN));

    let events = client
        .start(&ProcessSpec::shell("echo hello"))
        .await
        .expect("stream opens")
        .collect()
        .await
        .expect("stream ends cleanly");

    assert_eq!(
        events,
        [
            ProcessEvent::Start { pid: 7 },
            ProcessEvent::Keepalive,
            ProcessEvent::Stdout(b"hello\n".to_vec()),
            ProcessEvent::Stderr(b"oops".to_vec()),
            ProcessEvent::Keepalive,
            ProcessEvent::End(ProcessEnd {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            }),
        ]
    );
    let request = next_seen(&mut seen).await;
    assert_eq!(request.request_line, "POST /process.Process/Start HTTP/1.1");
    assert_eq!(
        request.header("content-type"),
        Some("application/connect+json")
    );
    assert_eq!(request.header("connect-protocol-version"), Some("1"));
    assert_eq!(request.header("keepalive-ping-interval"), Some("50"));
    assert_eq!(request.header("x-access-token"), Some(TOKEN));
    assert_eq!(request.header("e2b-sandbox-id"), Some("sbx-envd-1"));
    assert_eq!(request.header("e2b-sandbox-port"), Some("49983"));
    // The request is one envelope-framed JSON message.
    assert_eq!(request.body[0], 0);
    let length = u32::from_be_bytes(request.body[1..5].try_into().unwrap()) as usize;
    assert_eq!(length, request.body.len() - 5);
    let message: serde_json::Value = serde_json::from_slice(&request.body[5..]).unwrap();
    assert_eq!(
        message,
        serde_json::json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hello"], "envs": {}},
            "stdin": false
        })
    );
}

#[tokio::test]
async fn a_nonzero_exit_code_is_read_from_the_end_event() {
    let mut wire = frame(r#"{"event":{"start":{"pid":3}}}"#);
    wire.extend(frame(
        r#"{"event":{"end":{"exitCode":2,"exited":true,"status":"exit status 2"}}}"#,
    ));
    wire.extend(encode(END_STREAM_FLAG, b""));
    let (base, _seen) = stand_in(vec![Answer::Chunks(vec![wire])]).await;
    let events = client_through(&base, None)
        .start(&ProcessSpec::shell("false"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(
        matches!(events.last(), Some(ProcessEvent::End(end)) if end.exit_code == 2),
        "{events:?}"
    );
}

#[tokio::test]
async fn an_end_stream_error_becomes_an_rpc_error_after_the_events_before_it() {
    let mut wire = frame(r#"{"event":{"start":{"pid":9}}}"#);
    wire.extend(encode(
        END_STREAM_FLAG,
        br#"{"error":{"code":"unavailable","message":"process was killed"}}"#,
    ));
    let split = wire.len() - 10;
    let (base, mut seen) = stand_in(vec![Answer::Chunks(vec![
        wire[..split].to_vec(),
        wire[split..].to_vec(),
    ])])
    .await;
    let client = client_through(&base, None);
    let mut stream = client
        .start(&ProcessSpec::shell("sleep 100"))
        .await
        .unwrap();
    assert_eq!(
        stream.next_event().await.unwrap(),
        Some(ProcessEvent::Start { pid: 9 })
    );
    let error = stream
        .next_event()
        .await
        .expect_err("the stream ended with an error");
    assert!(
        matches!(&error, EnvdError::Rpc { code, message, .. } if code == "unavailable" && message == "process was killed"),
        "{error:?}"
    );
    assert_eq!(stream.next_event().await.unwrap(), None);
    // Without a token, none is sent.
    assert_eq!(next_seen(&mut seen).await.header("x-access-token"), None);
}

#[tokio::test]
async fn a_frame_over_the_cap_is_refused_instead_of_buffered() {
    let wire = frame(&format!(
        r#"{{"event":{{"data":{{"stdout":"{}"}}}}}}"#,
        "QUFB".repeat(64)
    ));
    let (base, _seen) = stand_in(vec![Answer::Chunks(vec![wire])]).await;
    let client = client_through(&base, None).with_max_frame_bytes(64);
    let error = client
        .start(&ProcessSpec::shell("yes"))
        .await
        .unwrap()
        .collect()
        .await
        .expect_err("an oversize frame is refused");
    assert!(error.to_string().contains("64-byte cap"), "{error}");
}

#[tokio::test]
async fn a_stream_cut_before_its_end_frame_is_an_error_not_a_clean_end() {
    let wire = frame(r#"{"event":{"start":{"pid":1}}}"#);
    let (base, _seen) = stand_in(vec![Answer::Chunks(vec![wire])]).await;
    let error = client_through(&base, None)
        .start(&ProcessSpec::shell("true"))
        .await
        .unwrap()
        .collect()
        .await
        .expect_err("no end-of-stream frame");
    assert!(matches!(error, EnvdError::StreamCut { .. }), "{error:?}");
}

#[tokio::test]
async fn a_502_from_the_proxy_says_the_sandbox_is_gone_or_paused() {
    let body = br#"{"sandboxId":"sbx-envd-1","message":"The sandbox was not found","code":502}"#;
    let (base, _seen) = stand_in(vec![
        Answer::Whole(502, "application/json", body.to_vec()),
        Answer::Whole(502, "application/json", body.to_vec()),
    ])
    .await;
    let client = client_through(&base, Some(TOKEN));

    let error = client
        .start(&ProcessSpec::shell("true"))
        .await
        .expect_err("502 is an error");
    let sentence = error.to_string();
    assert!(
        matches!(error, EnvdError::SandboxUnavailable { .. }),
        "{error:?}"
    );
    assert!(sentence.contains("sandbox sbx-envd-1"), "{sentence}");
    assert!(sentence.contains("gone or paused"), "{sentence}");
    assert!(!sentence.contains(TOKEN) && !format!("{error:?}").contains(TOKEN));

    let error = client
        .send_signal(9, Signal::Kill)
        .await
        .expect_err("502 on a unary call too");
    assert!(
        matches!(error, EnvdError::SandboxUnavailable { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn send_signal_is_a_unary_connect_json_call() {
    let (base, mut seen) =
        stand_in(vec![Answer::Whole(200, "application/json", b"{}".to_vec())]).await;
    client_through(&base, Some(TOKEN))
        .send_signal(42, Signal::Term)
        .await
        .expect("signal sent");
    let request = next_seen(&mut seen).await;
    assert_eq!(
        request.request_line,
        "POST /process.Process/SendSignal HTTP/1.1"
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("connect-protocol-version"), Some("1"));
    assert_eq!(request.header("x-access-token"), Some(TOKEN));
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"process": {"pid": 42}, "signal": "SIGNAL_SIGTERM"})
    );
}

#[tokio::test]
async fn a_unary_connect_error_keeps_its_code_and_message() {
    let (base, _seen) = stand_in(vec![Answer::Whole(
        404,
        "application/json",
        br#"{"code":"not_found","message":"process with pid 42 not found"}"#.to_vec(),
    )])
    .await;
    let error = client_through(&base, None)
        .send_signal(42, Signal::Kill)
        .await
        .expect_err("unknown pid");
    assert_eq!(
        error.to_string(),
        "envd ended process.Process/SendSignal with error not_found: process with pid 42 not found"
    );
}

#[tokio::test]
async fn connect_reattaches_to_a_pid_over_a_connect_stream_and_names_its_errors() {
    let mut wire = Vec::new();
    wire.extend(frame(r#"{"event":{"start":{"pid":31}}}"#));
    wire.extend(frame(r#"{"event":{"data":{"stdout":"bGF0ZXIK"}}}"#));
    wire.extend(frame(
        r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}"#,
    ));
    wire.extend(encode(END_STREAM_FLAG, b"{}"));
    let unknown = encode(
        END_STREAM_FLAG,
        br#"{"error":{"code":"not_found","message":"process with pid 32 not found"}}"#,
    );
    let (base, mut seen) = stand_in(vec![
        Answer::Chunks(vec![wire]),
        Answer::Chunks(vec![unknown]),
    ])
    .await;
    let client = client_through(&base, Some(TOKEN));

    let events = client
        .connect(31)
        .await
        .expect("stream opens")
        .collect()
        .await
        .expect("stream ends cleanly");
    assert_eq!(
        events,
        [
            ProcessEvent::Start { pid: 31 },
            ProcessEvent::Stdout(b"later\n".to_vec()),
            ProcessEvent::End(ProcessEnd {
                exit_code: 3,
                exited: true,
                status: "exit status 3".into(),
                error: Some("exit status 3".into()),
            }),
        ]
    );
    let request = next_seen(&mut seen).await;
    assert_eq!(
        request.request_line,
        "POST /process.Process/Connect HTTP/1.1"
    );
    assert_eq!(
        request.header("content-type"),
        Some("application/connect+json")
    );
    assert_eq!(request.header("keepalive-ping-interval"), Some("50"));
    assert_eq!(request.header("x-access-token"), Some(TOKEN));
    assert_eq!(request.body[0], 0);
    let message: serde_json::Value = serde_json::from_slice(&request.body[5..]).unwrap();
    assert_eq!(message, serde_json::json!({"process": {"pid": 31}}));

    let mut gone = client.connect(32).await.expect("stream opens");
    let error = gone.next_event().await.expect_err("not found");
    assert_eq!(
        error.to_string(),
        "envd ended process.Process/Connect with error not_found: process with pid 32 not found"
    );
}

#[tokio::test]
async fn an_envd_older_than_0_5_7_gets_the_upload_as_multipart_form_data() {
    let entry = br#"[{"path":"/home/user/run.sh","name":"run.sh","type":"file"}]"#.to_vec();
    let (base, mut seen) = stand_in(vec![
        Answer::Whole(200, "application/json", entry.clone()),
        Answer::Whole(200, "application/json", entry),
    ])
    .await;
    let content = b"echo one\r\n--not-a-boundary\n\x00\xff".to_vec();

    let old = client_for(&base, Some(TOKEN), EnvdVersion::announced("0.4.1"));
    let written = old
        .upload("/home/user/run.sh", content.clone())
        .await
        .expect("uploaded");
    assert_eq!(written[0].path, "/home/user/run.sh");
    let upload = next_seen(&mut seen).await;
    assert_eq!(
        upload.request_line,
        "POST /files?path=%2Fhome%2Fuser%2Frun.sh HTTP/1.1"
    );
    let content_type = upload.header("content-type").unwrap();
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .unwrap_or_else(|| panic!("not multipart: {content_type}"));
    // One part named `file`, its filename the sandbox path (as httpx sends the SDK's), the
    // content byte for byte, then the closing boundary.
    let mut expected = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/run.sh\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    expected.extend_from_slice(&content);
    expected.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    assert_eq!(upload.body, expected);

    let new = client_for(&base, Some(TOKEN), EnvdVersion::announced("0.5.7"));
    new.upload("/home/user/run.sh", content.clone())
        .await
        .expect("uploaded");
    let upload = next_seen(&mut seen).await;
    assert_eq!(
        upload.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(upload.body, content);
}

#[tokio::test]
async fn files_upload_and_download_go_through_envd_files_endpoint() {
    let (base, mut seen) = stand_in(vec![
        Answer::Whole(
            200,
            "application/json",
            br#"[{"path":"/home/user/a b.txt","name":"a b.txt","type":"file"}]"#.to_vec(),
        ),
        Answer::Whole(200, "application/octet-stream", b"file content".to_vec()),
    ])
    .await;
    let client = client_through(&base, Some(TOKEN));

    let written = client
        .upload("/home/user/a b.txt", b"file content".to_vec())
        .await
        .expect("uploaded");
    assert_eq!(written[0].path, "/home/user/a b.txt");
    assert_eq!(written[0].kind, "file");
    let upload = next_seen(&mut seen).await;
    assert_eq!(
        upload.request_line,
        "POST /files?path=%2Fhome%2Fuser%2Fa+b.txt HTTP/1.1"
    );
    assert_eq!(
        upload.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(upload.header("x-access-token"), Some(TOKEN));
    assert_eq!(upload.body, b"file content");

    let content = client
        .download("/home/user/a b.txt")
        .await
        .expect("downloaded");
    assert_eq!(content, b"file content");
    let download = next_seen(&mut seen).await;
    assert_eq!(
        download.request_line,
        "GET /files?path=%2Fhome%2Fuser%2Fa+b.txt HTTP/1.1"
    );
}

#[tokio::test]
async fn a_download_announced_over_the_cap_is_refused_before_reading_it() {
    let (base, _seen) = stand_in(vec![Answer::Head(
        200,
        "Content-Type: application/octet-stream\r\nContent-Length: 1099511627776\r\nConnection: close",
    )])
    .await;
    let error = client_through(&base, None)
        .download("/tmp/huge")
        .await
        .expect_err("a 1 TiB file is not held in memory");
    assert!(
        matches!(
            error,
            EnvdError::TooLarge {
                call: "files download",
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_refused_access_token_is_named_but_never_shown() {
    let (base, _seen) = stand_in(vec![Answer::Whole(
        401,
        "application/json",
        b"{\"code\":401,\"message\":\"invalid access token\"}".to_vec(),
    )])
    .await;
    let error = client_through(&base, Some(TOKEN))
        .download("/etc/hostname")
        .await
        .expect_err("401 is an error");
    assert!(
        matches!(error, EnvdError::AccessDenied { status: 401, .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("refused the access token"),
        "{error}"
    );
    assert!(!error.to_string().contains(TOKEN) && !format!("{error:?}").contains(TOKEN));
}
