//! CPU time to read a click's form body: the `payload` field's percent-decoding alone, and the
//! whole `Interaction::parse` (decoding plus JSON), on one core with no I/O.
//!
//! The body is shaped as Slack sends a block_actions click (and as `../shared/bench/` sends
//! it): about 1.5 KB, a fifth of it escapes. Prints nanoseconds per body in the fastest and the median of
//! `STEWARD_BENCH_ROUNDS` (default 9) rounds of `STEWARD_BENCH_REQUESTS` (default 50,000).
//! Run with `cargo bench --bench interaction_parse`.
use std::hint::black_box;
use std::time::Instant;

use sandbox_steward::slack::form;
use sandbox_steward::slack::payload::Interaction;

mod support;
use support::env_or;

/// A click on a case card's Pause button, with the message and state Slack includes.
fn click_body() -> String {
    let payload = serde_json::json!({
        "type": "block_actions",
        "user": {"id": "U0BENCH", "username": "bench", "name": "bench", "team_id": "T0BENCH"},
        "api_app_id": "A0BENCH",
        "token": "deprecatedverificationtoken",
        "container": {"type": "message", "message_ts": "1700000000.000100",
                      "channel_id": "C0BENCH", "is_ephemeral": false},
        "trigger_id": "1.2.checkd0edafba.0",
        "team": {"id": "T0BENCH", "domain": "bench"},
        "enterprise": null,
        "is_enterprise_install": false,
        "channel": {"id": "C0BENCH", "name": "bench"},
        "message": {
            "type": "message", "user": "U0FAKEBOT", "ts": "1700000000.000100",
            "bot_id": "B0FAKEBOT", "text": "Case case_checkd0edafba-0",
            "blocks": [{"type": "actions", "block_id": "case", "elements": [{
                "type": "button", "action_id": "case_pause",
                "text": {"type": "plain_text", "text": "Pause"},
                "value": "case_checkd0edafba-0"}]}]
        },
        "state": {"values": {}},
        "response_url": "https://hooks.slack.com/actions/T0BENCH/1/abc",
        "actions": [{"type": "button", "action_id": "case_pause", "block_id": "case",
                     "text": {"type": "plain_text", "text": "Pause", "emoji": true},
                     "value": "case_checkd0edafba-0", "action_ts": "1700000001.000000"}]
    });
    form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
}

/// Nanoseconds per call of `f` in the fastest and the median of `rounds` rounds of `n` calls.
/// The fastest round is the steadier figure on a shared machine: other work only slows a round.
fn time_ns(rounds: usize, n: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut per_call: Vec<f64> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..n {
                f();
            }
            started.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    (per_call[0], per_call[per_call.len() / 2])
}

fn main() {
    let rounds = env_or::<usize>("STEWARD_BENCH_ROUNDS", 9).max(1);
    let n = env_or::<usize>("STEWARD_BENCH_REQUESTS", 50_000).max(1);
    let body = click_body();
    let raw_payload = body.strip_prefix("payload=").expect("one field");
    let escapes = raw_payload.bytes().filter(|b| *b == b'%').count();
    // Check once that the body reads as the click it is before timing it.
    let parsed = Interaction::parse(body.as_bytes()).expect("the bench body parses");
    assert_eq!(parsed.actions[0].action_id, "case_pause");

    let decode = time_ns(rounds, n, || {
        black_box(form::decode(black_box(raw_payload.as_bytes())));
    });
    let parse = time_ns(rounds, n, || {
        black_box(Interaction::parse(black_box(body.as_bytes())).ok());
    });
    println!(
        "interaction_parse: body {} bytes ({} escapes); {rounds} rounds of {n}, ns per body",
        body.len(),
        escapes
    );
    println!("                            fastest   median");
    println!(
        "  decode the payload field  {:>7.0}  {:>7.0}",
        decode.0, decode.1
    );
    println!(
        "  Interaction::parse        {:>7.0}  {:>7.0}  (decode + JSON)",
        parse.0, parse.1
    );
}
