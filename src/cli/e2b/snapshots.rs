//! `steward e2b` actions on what sandboxes are made from: snapshot, snapshots, templates, template
//! and delete-template.
//!
//! `delete-template` is confirmed in `super::execute` before this module is called, so it only sends.
use super::output::{Output, Subject, print_json, time};
use crate::cli::table::{print_pairs, print_table};
use crate::e2b::E2bClient;
use crate::ids::{SandboxId, TemplateId};

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotAction {
    /// Snapshot a sandbox into a reusable template.
    Snapshot {
        /// The sandbox to snapshot.
        id: SandboxId,
        /// A name for the snapshot, so it is easy to find and start from.
        #[arg(long)]
        name: Option<String>,
    },
    /// List snapshots.
    Snapshots {
        /// Only snapshots of this sandbox.
        #[arg(long)]
        sandbox: Option<SandboxId>,
        /// Stop the listing after N pages (default 10000).
        #[arg(long, value_name = "N")]
        max_pages: Option<u32>,
    },
    /// List templates.
    Templates {
        /// Stop the listing after N pages (default 10000).
        #[arg(long, value_name = "N")]
        max_pages: Option<u32>,
    },
    /// Show a template and its builds.
    Template {
        /// The template id or alias.
        id: TemplateId,
    },
    /// Delete a template or snapshot. Cannot be undone.
    DeleteTemplate {
        /// The template or snapshot id.
        id: TemplateId,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// Runs one snapshot or template action.
pub(super) async fn run(
    action: SnapshotAction,
    client: &E2bClient,
    out: &Output,
) -> anyhow::Result<()> {
    match action {
        SnapshotAction::Snapshot { id, name } => {
            let snap = client.create_snapshot(&id, name.as_deref()).await?;
            let taken = time(chrono::Utc::now());
            out.show(&snap, || {
                vec![
                    ("snapshot", snap.snapshot_id.to_string()),
                    ("names", names(&snap.names)),
                    ("of sandbox", id.to_string()),
                    ("taken", taken),
                ]
            })?;
        }
        SnapshotAction::Snapshots { sandbox, .. } => {
            let listing = client.list_snapshots(sandbox.as_ref()).await?;
            // E2B's listing carries no source or date; with --sandbox the source is known.
            match &sandbox {
                Some(of) => out.listing(&listing, &["SNAPSHOT", "NAMES", "OF SANDBOX"], |s| {
                    vec![s.snapshot_id.to_string(), names(&s.names), of.to_string()]
                })?,
                None => out.listing(&listing, &["SNAPSHOT", "NAMES"], |s| {
                    vec![s.snapshot_id.to_string(), names(&s.names)]
                })?,
            }
        }
        SnapshotAction::Templates { .. } => {
            let listing = client.list_templates().await?;
            let headers = [
                "TEMPLATE",
                "NAMES",
                "STATUS",
                "CPUS",
                "MEMORY",
                "SPAWNS",
                "LAST SPAWNED",
            ];
            out.listing(&listing, &headers, |t| {
                vec![
                    t.template_id.to_string(),
                    names(&t.names),
                    t.build_status.as_str().into(),
                    t.cpu_count.to_string(),
                    format!("{} MiB", t.memory_mb),
                    t.spawn_count.to_string(),
                    t.last_spawned_at
                        .map(time)
                        .unwrap_or_else(|| "never".into()),
                ]
            })?;
        }
        SnapshotAction::Template { id } => {
            let t = client.get_template(&id).await?;
            if out.json {
                return print_json(&t);
            }
            // The template's own fields, a blank line, then one row per build.
            print_pairs(&[
                ("template", t.template_id.to_string()),
                ("names", t.names.join(", ")),
                ("public", t.public.to_string()),
                ("created", time(t.created_at)),
                ("spawns", t.spawn_count.to_string()),
                ("builds", t.builds.len().to_string()),
            ]);
            println!();
            let rows = t
                .builds
                .iter()
                .map(|b| {
                    vec![
                        b.build_id.to_string(),
                        b.status.as_str().into(),
                        time(b.created_at),
                        b.finished_at.map(time).unwrap_or_else(|| "-".into()),
                        b.cpu_count.to_string(),
                        format!("{} MiB", b.memory_mb),
                    ]
                })
                .collect();
            print_table(
                &["BUILD", "STATUS", "CREATED", "FINISHED", "CPUS", "MEMORY"],
                rows,
            );
        }
        SnapshotAction::DeleteTemplate { id, .. } => {
            client.delete_template(&id).await?;
            let text = format!("Deleted template {id}.");
            out.done("delete-template", Subject::Template(&id), &text)?;
        }
    }
    Ok(())
}

/// A snapshot's or template's names, or a plain "(no name)" instead of an empty cell.
fn names(names: &[String]) -> String {
    if names.is_empty() {
        "(no name)".into()
    } else {
        names.join(", ")
    }
}
