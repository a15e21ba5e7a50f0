//! `definitions`: the saga definitions a server can start, read through its HTTP API
//! (`GET /v1/definitions`), since the definitions are linked into the application that serves
//! them and not into the `saga` binary.

use std::io::Write;

use comfy_table::{presets, ContentArrangement, Table};

use super::address::Target;
use super::args::DefinitionsArgs;
use super::error::CliError;
use super::render;
use crate::model::{Definition, DefinitionList, StepKind};

/// How many characters of the step-list hash the table shows: enough to tell versions apart
/// at a glance (the whole hash is in `--json` and in `saga show`).
const SHORT_HASH: usize = 8;

/// Runs `definitions`: asks the server (`--server`, else the one running on `database_url`,
/// see [`open_and_run`](super::open_and_run)) for its definitions and prints them as a table,
/// or with `--json` as the API answered them. Opens no database.
pub async fn run_definitions(
    a: &DefinitionsArgs,
    database_url: Option<&str>,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let server = Target::find(a.server.url.as_deref(), database_url);
    let client = server.client(a.auth.token.clone())?;
    let list = client.definitions().await.map_err(|e| server.error(e))?;
    if a.output.json {
        render::json(out, &list)?;
    } else {
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<u16>().ok());
        table(out, &list, width)?;
    }
    Ok(())
}

/// One row per definition: name, version, short hash, the stages in order with the kinds of
/// those that cannot be compensated marked, and the input's required fields. Long step lists
/// wrap inside their cell when the terminal's `width` is known.
fn table(out: &mut impl Write, list: &DefinitionList, width: Option<u16>) -> std::io::Result<()> {
    if list.definitions.is_empty() {
        return writeln!(out, "no saga definitions are registered on this server");
    }
    let mut t = Table::new();
    t.load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(vec!["NAME", "VERSION", "HASH", "STAGES", "REQUIRED INPUT"]);
    if let Some(width) = width {
        t.set_width(width);
    }
    for def in &list.definitions {
        t.add_row(vec![
            def.name.clone(),
            def.version.to_string(),
            def.hash.chars().take(SHORT_HASH).collect(),
            stages(def),
            required(def),
        ]);
    }
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "Stages are compensatable unless marked (pivot: the point of no return; retriable: \
         retried until it succeeds)."
    )
}

/// `reserve_stock → charge_payment (pivot) → send_receipt (retriable)`.
pub(crate) fn stages(def: &Definition) -> String {
    def.stages
        .iter()
        .map(|s| match s.kind {
            StepKind::Compensatable => s.name.clone(),
            kind => format!("{} ({kind})", s.name),
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

/// The required fields, or what the input is when it names none.
fn required(def: &Definition) -> String {
    let fields = def.required_fields();
    if !fields.is_empty() {
        return fields.join(", ");
    }
    if def.input_schema == serde_json::Value::Bool(true) {
        "any JSON".to_owned()
    } else {
        "-".to_owned()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::model::Stage;

    fn def(name: &str, stages: &[(&str, StepKind)], schema: serde_json::Value) -> Definition {
        Definition {
            name: name.to_owned(),
            version: 2,
            hash: "0123456789abcdef".to_owned(),
            stages: stages
                .iter()
                .map(|(n, k)| Stage {
                    name: (*n).to_owned(),
                    kind: *k,
                })
                .collect(),
            input_schema: schema,
            attrs: Vec::new(),
        }
    }

    #[test]
    fn the_table_shows_stages_kinds_and_required_fields() {
        let list = DefinitionList {
            definitions: vec![
                def(
                    "trip",
                    &[
                        ("book", StepKind::Compensatable),
                        ("charge", StepKind::Pivot),
                        ("mail", StepKind::Retriable),
                    ],
                    json!({"type": "object", "required": ["trip_id", "traveller"]}),
                ),
                def("free", &[("only", StepKind::Pivot)], json!(true)),
            ],
        };
        let mut out = Vec::new();
        table(&mut out, &list, None).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("book → charge (pivot) → mail (retriable)"),
            "{text}"
        );
        assert!(text.contains("trip_id, traveller"), "{text}");
        assert!(
            text.contains("01234567") && !text.contains("0123456789"),
            "{text}"
        );
        assert!(text.contains("any JSON"), "{text}");

        let mut out = Vec::new();
        table(
            &mut out,
            &DefinitionList {
                definitions: vec![],
            },
            None,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "no saga definitions are registered on this server\n"
        );
    }
}
