//! How the command prints the objects it made or followed (`--output`).

use std::io::Write;

use super::RestartError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Json,
    Yaml,
    /// `RESOURCE.GROUP/NAME` per object, as `kubectl -o name` prints it.
    Name,
}

/// Writes `object` to `out` as `output` says.
pub(super) fn print(
    out: &mut (dyn Write + Send),
    output: Output,
    object: &serde_json::Value,
) -> Result<(), RestartError> {
    let text = match output {
        Output::Json => serde_json::to_string_pretty(object)
            .map(|t| t + "\n")
            .map_err(|e| RestartError::Render(Box::new(e)))?,
        Output::Yaml => {
            serde_saphyr::to_string(object).map_err(|e| RestartError::Render(Box::new(e)))?
        }
        Output::Name => {
            let items = match object["items"].as_array() {
                Some(items) => items.iter().collect(),
                None => vec![object],
            };
            items
                .iter()
                .map(|item| {
                    format!(
                        "{}.{}/{}\n",
                        crate::crr::KIND.to_lowercase(),
                        crate::crr::GROUP,
                        item["metadata"]["name"].as_str().unwrap_or_default()
                    )
                })
                .collect()
        }
    };
    out.write_all(text.as_bytes()).map_err(RestartError::Output)
}
