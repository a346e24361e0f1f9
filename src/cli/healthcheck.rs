//! `steward healthcheck`: asks a running Steward whether it is alive (`GET /healthz`), for the
//! container image's `HEALTHCHECK`, so the image needs no curl or wget.
//!
//! It asks liveness only, never `/readyz`: a replica whose Redis is down is not restarted for it.
//! It must not read settings beyond the listen address, and never prints a secret (it has none).
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

/// How long the probe waits for an answer; Docker's own timeout is longer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, clap::Args)]
pub struct HealthcheckArgs {
    /// The address `steward serve` listens on; an unspecified one (`0.0.0.0`) is asked on
    /// 127.0.0.1.
    #[arg(long, env = "STEWARD_LISTEN", default_value = crate::config::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Ask this URL instead of `/healthz` on `--listen`.
    #[arg(long)]
    pub url: Option<String>,
}

/// The URL a probe of `listen` asks.
pub fn healthz_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/healthz", SocketAddr::new(ip, listen.port()))
}

/// Exit 0 when the answer is a 2xx, 1 (with one line on stderr) otherwise.
pub async fn run(args: HealthcheckArgs) -> anyhow::Result<ExitCode> {
    let url = args.url.unwrap_or_else(|| healthz_url(args.listen));
    // Never through a proxy: HTTP_PROXY set for Steward's outbound calls must not route a probe
    // of its own loopback elsewhere.
    let client = reqwest::Client::builder()
        .timeout(PROBE_TIMEOUT)
        .no_proxy()
        .build()?;
    match client.get(&url).send().await {
        Ok(resp) if resp.status().is_success() => Ok(ExitCode::SUCCESS),
        Ok(resp) => {
            eprintln!("Steward at {url} answered HTTP {}.", resp.status().as_u16());
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            let why = if e.is_connect() {
                "nothing accepted the connection".to_owned()
            } else if e.is_timeout() {
                format!("no answer within {} s", PROBE_TIMEOUT.as_secs())
            } else {
                e.without_url().to_string()
            };
            eprintln!("Steward at {url} did not answer: {why}.");
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_listen_address_is_asked_on_loopback() {
        assert_eq!(
            healthz_url("0.0.0.0:3000".parse().unwrap()),
            "http://127.0.0.1:3000/healthz"
        );
        assert_eq!(
            healthz_url("[::]:8080".parse().unwrap()),
            "http://127.0.0.1:8080/healthz"
        );
        assert_eq!(
            healthz_url("10.1.2.3:3000".parse().unwrap()),
            "http://10.1.2.3:3000/healthz"
        );
    }
}
