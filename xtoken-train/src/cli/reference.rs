//! The command-line reference of the book (`docs/src/reference/cli.md`), written from clap's own
//! description of every command, so that the page cannot drift from the parser: a test compares
//! the checked-in page with what this writes.

use clap::{Arg, ArgAction, Command};

/// The whole reference: every command, depth first, in the order `xtoken --help` lists them.
pub fn markdown(root: &Command) -> String {
    let mut root = root.clone();
    root.build();
    let mut out = String::from(
        "# Command line\n\n\
         Every command and option of `xtoken`, as `xtoken <command> --help` prints them. This \
         page is generated from the command line's definition (a test fails when it differs; \
         `XTOKEN_WRITE_REFERENCE=1 cargo test -p xtoken-train --bin xtoken reference` writes \
         it).\n",
    );
    section(&root, "xtoken", 2, &mut out);
    out
}

/// One command's section, then its subcommands' one level deeper (at most `####`).
fn section(cmd: &Command, path: &str, depth: usize, out: &mut String) {
    let hashes = "#".repeat(depth.min(4));
    out.push_str(&format!("\n{hashes} `{path}`\n\n"));
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        out.push_str(&format!("{}\n\n", one_paragraph(&about.to_string())));
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ").trim();
    out.push_str(&format!("```text\n{usage}\n```\n"));
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !is_builtin(a))
        .collect();
    if !args.is_empty() {
        out.push('\n');
        for arg in args {
            out.push_str(&format!("- {}\n", describe(arg)));
        }
    }
    let subcommands: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    if !subcommands.is_empty() {
        out.push_str("\nCommands:\n\n");
        for sub in &subcommands {
            let name = format!("{path} {}", sub.get_name());
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            let first = about.split(". ").next().unwrap_or_default();
            out.push_str(&format!(
                "- [`{name}`](#{}): {}\n",
                anchor(&name),
                one_paragraph(first).trim_end_matches('.')
            ));
        }
    }
    for sub in subcommands {
        section(sub, &format!("{path} {}", sub.get_name()), depth + 1, out);
    }
}

/// `--help` and `--version`, which every command has.
fn is_builtin(arg: &Arg) -> bool {
    matches!(
        arg.get_action(),
        ArgAction::Help | ArgAction::HelpLong | ArgAction::Version
    )
}

/// An option as one list item: its spelling, its value, whether it is required, its default and
/// choices, and its help.
fn describe(arg: &Arg) -> String {
    let values: Vec<String> = arg
        .get_value_names()
        .map(|names| names.iter().map(|n| format!("<{n}>")).collect())
        .unwrap_or_else(|| vec![format!("<{}>", arg.get_id().as_str().to_uppercase())]);
    let takes_value = arg.get_action().takes_values();
    let mut spelling = match (arg.get_long(), arg.get_short()) {
        (Some(long), Some(short)) => format!("-{short}, --{long}"),
        (Some(long), None) => format!("--{long}"),
        (None, Some(short)) => format!("-{short}"),
        (None, None) => String::new(),
    };
    if takes_value {
        if !spelling.is_empty() {
            spelling.push(' ');
        }
        spelling.push_str(&values.join(" "));
        if matches!(arg.get_action(), ArgAction::Append) {
            spelling.push('…');
        }
    }
    let mut notes = Vec::new();
    if arg.is_required_set() {
        notes.push("required".to_string());
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if takes_value && !defaults.is_empty() {
        notes.push(format!("default `{}`", defaults.join(",")));
    }
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if takes_value && !choices.is_empty() {
        notes.push(format!("one of {}", choices.join(", ")));
    }
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| one_paragraph(&h.to_string()))
        .unwrap_or_default();
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    format!("`{spelling}`{notes}: {help}")
}

/// Help text on one line, so that it stays one Markdown list item.
fn one_paragraph(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The id mdBook gives a heading `` `xtoken bench train` ``.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use crate::cli::Cli;

    /// The checked-in page is what the command line's definition writes.
    #[test]
    fn the_cli_reference_is_the_command_line() {
        let page =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference/cli.md");
        let written = super::markdown(&Cli::command());
        if std::env::var_os("XTOKEN_WRITE_REFERENCE").is_some() {
            std::fs::write(&page, &written).unwrap();
        }
        let checked_in = std::fs::read_to_string(&page).unwrap_or_default();
        assert!(
            checked_in == written,
            "{} differs from the command line's definition: run \
             `XTOKEN_WRITE_REFERENCE=1 cargo test -p xtoken-train --bin xtoken reference` and \
             commit the page",
            page.display()
        );
    }

    #[test]
    fn anchors_are_mdbook_heading_ids() {
        assert_eq!(super::anchor("xtoken bench train"), "xtoken-bench-train");
        assert_eq!(super::anchor("xtoken cache show"), "xtoken-cache-show");
    }
}
