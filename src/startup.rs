//! Assembly: `Application::build` binds the server and starts its workers.
use std::process::ExitCode;

pub async fn serve_from_env() -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
