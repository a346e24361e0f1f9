//! Socket Mode's round trip: a slash command typed on the Slack simulator's page, delivered to
//! Steward as an envelope over the WebSocket, marked in Redis (exactly once), answered by the same
//! handler as over HTTP, and acknowledged with the reply as the ack's payload, which the simulator
//! reads and shows. Slack gives an app 3 seconds for that acknowledgement.
//!
//! Starts the Slack simulator (with an app token), the E2B simulator and Steward in this process,
//! against Redis at `REDIS_URL` (a fresh key prefix), waits for Steward's connection, then sends
//! `/sandbox help` through `POST /_sim/act/command` (which waits for the ack): first
//! `STEWARD_BENCH_SERIAL` (default 500) one at a time, then `STEWARD_BENCH_REQUESTS` (default
//! 10,000) from `STEWARD_BENCH_CONCURRENCY` (default 32) senders at once. Prints p50/p99/max and
//! the rate. Everything shares the machine's cores, the simulator's own bookkeeping included, so
//! read the figures as the whole loop's, not Steward's alone. Run with `cargo bench --bench
//! socket_ack`.
//!
//! Then the harness's own floor: the same senders against a second Slack simulator whose Socket
//! Mode client only acknowledges each envelope at once with a fixed reply, so the figure is what
//! the page, the simulator and the WebSocket carry on these cores with no app behind them; and
//! again with Steward's own help reply as that fixed reply (the simulator reads, keeps and shows
//! every ack's payload, and Steward's is larger), the floor to read Steward's figure against.
//!
//! Then what each costs Redis: with `redis-server` on the PATH the bench runs against a Redis of
//! its own (`--port <free> --save ''`, instead of `REDIS_URL`), and counts the commands
//! (`INFO commandstats`, commands run inside scripts included) over `STEWARD_BENCH_COUNTED`
//! (default 1,000) helps, then over as many clicks on a case card (a `block_actions` envelope
//! sent with `POST /_sim/socket/send`, each with its own `action_ts`, naming a case that does
//! not exist, so a click ends at its first store call: the click script's answer). Per
//! operation it prints `EVALSHA`s (one round trip each), `SET`s (the envelope's mark is a
//! top-level `SET NX`; the click script sets its own mark inside) and every command in all.
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_steward::config::Settings;
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{Person, SlackSim, SlackSimOptions};
use sandbox_steward::startup::Application;
use secrecy::SecretString;
use serde_json::{Value, json};

mod support;
use support::{OwnRedis, env_or, ms, percentile, redis_and_prefix, steward_env};

/// The allocator `steward` itself runs with (`src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const APP_TOKEN: &str = "xapp-1-A0BENCH-socket-ack";
const E2B_KEY: &str = "e2b_bench";
const USER: &str = "U0BENCH01";
/// How long Steward may take to connect, and one command to be acknowledged, before the bench
/// gives up.
const PATIENCE: Duration = Duration::from_secs(30);

/// One `/sandbox help` through the page, until the simulator has read its ack and shown the reply.
async fn help(client: &reqwest::Client, url: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let answer: Value = client
        .post(url)
        .json(&json!({"user": USER, "channel": "C0BENCH01", "text": "/sandbox help"}))
        .timeout(PATIENCE)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let took = started.elapsed();
    anyhow::ensure!(
        answer["status"] == 200 && answer["shown"] == "ephemeral",
        "the help was not acknowledged with its reply: {answer}"
    );
    Ok(took)
}

/// The least a Socket Mode app can do: open a connection with the app token and acknowledge
/// every envelope at once with `reply` as the ack's payload.
async fn ack_at_once(client: reqwest::Client, api_url: String, reply: Value) -> anyhow::Result<()> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let opened: Value = client
        .post(format!("{api_url}/apps.connections.open"))
        .bearer_auth(APP_TOKEN)
        .send()
        .await?
        .json()
        .await?;
    let url = opened["url"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("apps.connections.open: {opened}"))?;
    let (mut socket, _) = tokio_tungstenite::connect_async(url).await?;
    while let Some(message) = socket.next().await {
        let Message::Text(text) = message? else {
            continue;
        };
        let envelope: Value = serde_json::from_str(&text)?;
        if let Some(id) = envelope["envelope_id"].as_str() {
            let ack = json!({"envelope_id": id, "payload": reply});
            socket.send(Message::text(ack.to_string())).await?;
        }
    }
    Ok(())
}

/// `requests` helps from `concurrency` senders at once: every one's latency, and the wall time.
async fn flood(
    client: &reqwest::Client,
    url: &Arc<String>,
    requests: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let wall = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..concurrency {
        let (client, url) = (client.clone(), Arc::clone(url));
        let share = requests / concurrency + usize::from(sender < requests % concurrency);
        senders.spawn(async move {
            let mut took = Vec::with_capacity(share);
            for _ in 0..share {
                took.push(help(&client, &url).await?);
            }
            anyhow::Ok(took)
        });
    }
    let mut latencies = Vec::with_capacity(requests);
    while let Some(done) = senders.join_next().await {
        latencies.extend(done??);
    }
    Ok((latencies, wall.elapsed()))
}

/// A Slack simulator that takes the bench's app token and knows its one user.
async fn slack_sim() -> anyhow::Result<SlackSim> {
    Ok(SlackSim::start(SlackSimOptions {
        app_token: Some(SecretString::from(APP_TOKEN)),
        people: vec![Person {
            id: USER.into(),
            label: "Bench".into(),
        }],
        ..SlackSimOptions::default()
    })
    .await?)
}

/// The harness's own floor: the same senders against a second simulator (a fresh one, as the
/// simulator keeps every ack it reads) whose Socket Mode client is [`ack_at_once`] with `reply`
/// (no Redis, no handler). What is left of the loop is the page, the simulator and the WebSocket.
async fn floor(
    client: &reqwest::Client,
    reply: Value,
    requests: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let floor_slack = slack_sim().await?;
    let acker = tokio::spawn(ack_at_once(client.clone(), floor_slack.api_url(), reply));
    let floor_url = Arc::new(format!("{}/_sim/act/command", floor_slack.base_url()));
    let started = Instant::now();
    while help(client, &floor_url).await.is_err() {
        anyhow::ensure!(
            started.elapsed() < PATIENCE,
            "the floor's client never connected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let flooded = flood(client, &floor_url, requests, concurrency).await;
    acker.abort();
    flooded
}

fn report(label: &str, mut latencies: Vec<Duration>, wall: Duration) {
    latencies.sort();
    println!(
        "  {label:<22} p50 {:.2} ms · p99 {:.2} ms · max {:.2} ms · {:.0} commands/s",
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.99)),
        ms(latencies.last().copied().unwrap_or_default()),
        latencies.len() as f64 / wall.as_secs_f64()
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let serial = env_or::<usize>("STEWARD_BENCH_SERIAL", 500).max(1);
    let requests = env_or::<usize>("STEWARD_BENCH_REQUESTS", 10_000).max(1);
    let concurrency = env_or::<usize>("STEWARD_BENCH_CONCURRENCY", 32).max(1);
    let (redis_url, prefix) = redis_and_prefix("socket");
    let own_redis = OwnRedis::start().ok();
    let redis_url = own_redis.as_ref().map_or(redis_url, |r| r.url.clone());

    let e2b = SimServer::start(SimOptions {
        sandboxes: 0,
        api_key: Some(E2B_KEY.into()),
        ..SimOptions::default()
    })
    .await?;
    let slack = slack_sim().await?;
    let env = steward_env([
        ("SLACK_API_URL", slack.api_url()),
        ("SLACK_BOT_TOKEN", "xoxb-bench".to_owned()),
        ("SLACK_APP_TOKEN", APP_TOKEN.to_owned()),
        ("E2B_API_URL", e2b.base_url()),
        ("E2B_API_KEY", E2B_KEY.to_owned()),
        ("E2B_PROJECT_ID", e2b.team_id().to_owned()),
        ("REDIS_URL", redis_url),
        ("STEWARD_REDIS_PREFIX", prefix),
    ]);
    let app = Application::build(Settings::load(&env)?).await?;
    tokio::spawn(app.run_until_stopped(std::future::pending()));

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    let connections = format!("{}/_sim/socket/connections", slack.base_url());
    let started = Instant::now();
    loop {
        let open: Value = client.get(&connections).send().await?.json().await?;
        if open["open"].as_array().is_some_and(|o| !o.is_empty()) {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < PATIENCE,
            "Steward never connected: {open}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let url = Arc::new(format!("{}/_sim/act/command", slack.base_url()));
    for _ in 0..100 {
        help(&client, &url).await?;
    }

    println!(
        "/sandbox help over Socket Mode, page -> envelope -> Redis mark -> handler -> ack -> page"
    );
    let wall = Instant::now();
    let mut latencies = Vec::with_capacity(serial);
    for _ in 0..serial {
        latencies.push(help(&client, &url).await?);
    }
    report(
        &format!("{serial} one at a time"),
        latencies,
        wall.elapsed(),
    );
    // The payload of Steward's last ack, as the simulator read it.
    let acks: Value = client
        .get(format!("{}/_sim/socket/acks", slack.base_url()))
        .send()
        .await?
        .json()
        .await?;
    let stewards_reply = acks
        .as_array()
        .and_then(|acks| acks.last())
        .map(|ack| ack["payload"].clone())
        .filter(Value::is_object)
        .ok_or_else(|| anyhow::anyhow!("no ack with a payload was read: {acks}"))?;
    println!(
        "  Steward's help reply: {} bytes of JSON",
        stewards_reply.to_string().len()
    );

    let (latencies, wall) = flood(&client, &url, requests, concurrency).await?;
    report(
        &format!("{requests}, {concurrency} in flight"),
        latencies,
        wall,
    );

    // The harness's own floor, twice: acking with a short fixed reply, and with the very reply
    // Steward acked the last serial help with (the simulator reads, keeps and shows each ack's
    // payload, so a larger reply costs the harness more).
    let fixed = json!({"response_type": "ephemeral", "text": "help"});
    let (latencies, wall) = floor(&client, fixed, requests, concurrency).await?;
    report(&format!("floor, {concurrency} in flight"), latencies, wall);
    let (latencies, wall) = floor(&client, stewards_reply, requests, concurrency).await?;
    report("floor, Steward's reply", latencies, wall);

    let Some(redis) = own_redis else {
        println!("  Redis per operation: skipped (no redis-server for a Redis of the bench's own)");
        return Ok(());
    };
    let counted = env_or::<usize>("STEWARD_BENCH_COUNTED", 1_000).max(1);
    let before = redis.stats()?;
    for _ in 0..counted {
        help(&client, &url).await?;
    }
    let after = redis.stats()?;
    per_operation("per /sandbox help", &before, &after, counted);

    let send = format!("{}/_sim/socket/send", slack.base_url());
    let before = redis.stats()?;
    for n in 0..counted {
        let payload = json!({
            "type": "block_actions",
            "user": {"id": USER},
            "trigger_id": format!("trigger-{n}"),
            "response_url": slack.response_url("bench-click"),
            "actions": [{
                "action_id": "case_pause",
                "block_id": "b",
                "value": format!("case_{:032x}", n + 1),
                "action_ts": format!("1700000000.{n:06}"),
            }],
        });
        client
            .post(&send)
            .json(&json!({"type": "interactive", "payload": payload}))
            .send()
            .await?
            .error_for_status()?;
    }
    // Each click ends with its script's answer: wait until every one has run.
    let started = Instant::now();
    loop {
        let now = redis.stats()?;
        if count(&now, "evalsha") >= count(&before, "evalsha") + counted as u64 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < PATIENCE,
            "the clicks never all reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = redis.stats()?;
    per_operation("per click on a case card", &before, &after, counted);
    Ok(())
}

/// `INFO commandstats` as (command, calls).
type Stats = Vec<(String, u64)>;

fn count(stats: &Stats, command: &str) -> u64 {
    stats
        .iter()
        .find(|(name, _)| name == command)
        .map_or(0, |(_, n)| *n)
}

fn per_operation(label: &str, before: &Stats, after: &Stats, n: usize) {
    let delta = |command: &str| (count(after, command) - count(before, command)) as f64 / n as f64;
    let all: u64 = after
        .iter()
        .filter(|(name, _)| name != "info")
        .map(|(name, calls)| calls - count(before, name))
        .sum();
    println!(
        "  Redis {label:<26} EVALSHA {:.2} · SET {:.2} · all commands {:.2}",
        delta("evalsha"),
        delta("set"),
        all as f64 / n as f64
    );
}

impl OwnRedis {
    fn stats(&self) -> anyhow::Result<Stats> {
        let mut conn = redis::Client::open(self.url.as_str())?.get_connection()?;
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut conn)?;
        Ok(info
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
                Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
            })
            .collect())
    }
}
