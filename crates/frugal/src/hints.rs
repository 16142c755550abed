//! Every flag an error or hint suggests parses on the command that prints it (issue 32:
//! `batch run` suggested an `--embedder` it rejected). The messages are read from the
//! source: each command's own files, and the library files whose messages it passes on;
//! a `frugal ...` command quoted in backticks is parsed whole on its own command.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::cli::Cli;

/// Whether a flag must parse on every command listed or on one of them: a file that serves
/// sibling commands (`eval ppl` and `eval tasks`; `train`'s supervisor, which `tune` and
/// `batch run` share in part) holds flags of each.
#[derive(Clone, Copy, PartialEq)]
enum Need {
    All,
    Any,
}

const SERVE: &[&str] = &["serve"];
const BATCH: &[&str] = &["batch", "run"];
const TRAIN: &[&str] = &["train"];
const TUNE: &[&str] = &["tune"];

/// The gateway `frugal serve` builds, which `batch run` builds too (`FILE!f`: FILE without
/// its function `f`, which only `frugal serve` runs).
const GATEWAY: &[&str] = &[
    "frugal/src/serve.rs!run",
    "frugal-gateway/src/backend/mod.rs",
    "frugal-gateway/src/assemble.rs",
    "frugal-gateway/src/gateway.rs",
];

/// A file list, the commands that print their messages, and how many must parse a flag.
type Source = (Vec<&'static str>, Vec<&'static [&'static str]>, Need);

/// [`Source`] with its commands as owned paths.
type Row = (Vec<&'static str>, Vec<Vec<String>>, Need);

/// The files under crates/ whose messages each command prints; what every command may
/// print (the config, the ledger's location) is [`EVERY`].
fn sources() -> Vec<Source> {
    vec![
        (GATEWAY.to_vec(), vec![SERVE, BATCH], Need::All),
        (vec!["frugal/src/serve.rs"], vec![SERVE], Need::All),
        (
            vec!["frugal-cloud/src/price.rs"],
            vec![SERVE, BATCH, TRAIN, TUNE, &["bench"]],
            Need::All,
        ),
        (vec!["frugal/src/batch.rs"], vec![BATCH], Need::All),
        (
            vec!["frugal/src/train.rs", "frugal-train/src/watchdog.rs"],
            vec![TRAIN, TUNE, BATCH],
            Need::Any,
        ),
        (vec!["frugal/src/tune.rs"], vec![TUNE], Need::All),
        (
            vec![
                "frugal/src/commands/plan.rs",
                "frugal-cost/src/plan/backtest.rs",
                "frugal-cost/src/plan/commit.rs",
                "frugal-cost/src/plan/demand.rs",
                "frugal-cost/src/plan/size.rs",
                "frugal-cost/src/plan/spot.rs",
                "frugal-cost/src/plan/whole.rs",
            ],
            vec![&["plan"]],
            Need::All,
        ),
        (
            vec![
                "frugal/src/commands/report.rs",
                "frugal-cost/src/report.rs",
                "frugal-cost/src/report/advisor.rs",
                "frugal-cost/src/report/pools.rs",
                "frugal-cost/src/report/servers.rs",
                "frugal-cost/src/report/reserve.rs",
            ],
            vec![&["report"]],
            Need::All,
        ),
        (
            vec![
                "frugal/src/commands/ledger.rs",
                "frugal-cost/src/import/native.rs",
                "frugal-cost/src/import/error.rs",
            ],
            vec![
                &["ledger", "import"],
                &["ledger", "info"],
                &["ledger", "migrate"],
            ],
            Need::Any,
        ),
        (
            vec![
                "frugal/src/commands/eval.rs",
                "frugal-engine/src/eval.rs",
                "frugal-engine/src/eval/saved.rs",
                "frugal-engine/src/eval/quality.rs",
            ],
            vec![&["eval", "ppl"], &["eval", "tasks"], &["eval", "embedder"]],
            Need::Any,
        ),
        (
            vec![
                "frugal/src/commands/deploy.rs",
                "frugal-gateway/src/deploy.rs",
            ],
            vec![&["deploy", "kubernetes"]],
            Need::All,
        ),
        (
            vec!["frugal/src/commands/quantize.rs"],
            vec![&["quantize"]],
            Need::All,
        ),
        (
            vec![
                "frugal/src/commands/prices.rs",
                "frugal-cost/src/catalog/hosted.rs",
            ],
            vec![&["prices"], &["prices", "refresh"]],
            Need::Any,
        ),
        (
            vec!["frugal/src/commands/keys.rs"],
            vec![&["keys", "new"]],
            Need::All,
        ),
        (
            vec!["frugal/src/commands/eval_cache.rs"],
            vec![&["eval-cache"]],
            Need::All,
        ),
        (
            vec![
                "frugal/src/commands/eval_route.rs",
                "frugal-gateway/src/cascade/eval.rs",
            ],
            vec![&["eval-route"]],
            Need::All,
        ),
        (
            vec![
                "frugal/src/commands/route.rs",
                "frugal-gateway/src/cascade/learned.rs",
            ],
            vec![&["route", "train"]],
            Need::All,
        ),
        (vec!["frugal/src/bench.rs"], vec![&["bench"]], Need::All),
        (vec!["frugal/src/watch.rs"], vec![&["watch"]], Need::All),
    ]
}

const EVERY: &[&str] = &[
    "frugal/src/main.rs",
    "frugal/src/config.rs",
    "frugal/src/commands/mod.rs",
    "frugal-cost/src/ledger.rs",
];

/// Flags of other programs quoted in frugal's messages.
const FOREIGN: &[&str] = &[
    // `kubectl create secret generic NAME --from-literal=KEY=VALUE`
    "from-literal",
];

/// Every command path that runs something (`["batch", "run"]`).
fn leaf_commands() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        let subs: Vec<_> = cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help")
            .collect();
        if subs.is_empty() {
            out.push(path.clone());
        }
        for s in subs {
            path.push(s.get_name().to_owned());
            walk(s, path, out);
            path.pop();
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), &mut Vec::new(), &mut out);
    out
}

/// The string literals of `source` before its tests, with the line each starts on.
fn literals(source: &str) -> Vec<(usize, String)> {
    let code = source
        .find("#[cfg(test)]")
        .map_or(source, |at| &source[..at]);
    let chars: Vec<char> = code.chars().collect();
    let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            // A comment, doc comments included: up to the end of the line.
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3; // a char literal such as '"'
            continue;
        }
        if c == '\'' && chars.get(i + 1) == Some(&'\\') {
            i += 4; // '\"' or '\n'
            continue;
        }
        if c == '"' {
            let (start, mut text) = (line, String::new());
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if chars[i] == '\n' {
                    line += 1;
                }
                text.push(chars[i]);
                i += 1;
            }
            out.push((start, text));
        }
        i += 1;
    }
    out
}

/// The `--flags` in `text`, outside backticks.
fn bare_flags(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let name: String = text[start + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        let boundary = before.is_none_or(|b| b" ([`,'\"\n".contains(&b));
        if boundary && name.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.push(name.clone());
        }
        i = start + 2 + name.len();
    }
    out
}

/// Whether `flag` is a long flag of the command at `path` (globals included).
fn has_flag<S: AsRef<str>>(path: &[S], flag: &str) -> bool {
    let mut root = Cli::command();
    root.build();
    let mut cmd = &root;
    for name in path {
        match cmd.find_subcommand(name.as_ref()) {
            Some(sub) => cmd = sub,
            None => return false,
        }
    }
    flag == "help"
        || cmd
            .get_arguments()
            .chain(root.get_arguments())
            .any(|a| a.get_long() == Some(flag))
}

/// `source` without the function `name` (its lines blanked, so line numbers hold).
fn without_fn(source: &str, name: &str) -> String {
    if name.is_empty() {
        return source.to_owned();
    }
    let mut out = Vec::new();
    let mut inside = false;
    for line in source.lines() {
        if line.starts_with(&format!("pub fn {name}(")) || line.starts_with(&format!("fn {name}("))
        {
            inside = true;
        }
        out.push(if inside { "" } else { line });
        if inside && line == "}" {
            inside = false;
        }
    }
    out.join("\n")
}

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_owned()
}

/// What is wrong with the flags `literal` suggests on `commands`.
fn check_literal<S: AsRef<str>>(
    literal: &str,
    commands: &[Vec<S>],
    need: Need,
    bare_allowed: bool,
) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut prose = String::new();
    for (n, part) in literal.split('`').enumerate() {
        if n % 2 == 0 {
            prose.push_str(part);
            prose.push(' ');
            continue;
        }
        // Quoted code: a frugal command parses whole; any other program's flags are its own.
        let Some(rest) = part.strip_prefix("frugal ") else {
            continue;
        };
        // Placeholders of format strings (`{}`, `{flags}`) stand for values.
        let argv: Vec<String> = std::iter::once("frugal")
            .chain(rest.split_whitespace())
            .map(|w| {
                let mut word = String::new();
                let mut inside = false;
                for c in w.chars() {
                    match c {
                        '{' => {
                            inside = true;
                            word.push('x');
                        }
                        '}' => inside = false,
                        c if !inside => word.push(c),
                        _ => {}
                    }
                }
                word
            })
            .collect();
        if let Err(e) = <Cli as clap::Parser>::try_parse_from(&argv) {
            use clap::error::ErrorKind as K;
            // A message may name a command without its required arguments (`frugal keys
            // new`, `frugal eval`); what it does give must parse.
            let named = matches!(
                e.kind(),
                K::MissingRequiredArgument
                    | K::DisplayHelpOnMissingArgumentOrSubcommand
                    | K::DisplayHelp
                    | K::DisplayVersion
            );
            if !named {
                wrong.push(format!("`{part}` does not parse: {}", e.render()));
            }
        }
    }
    let spaced = literal.contains(char::is_whitespace);
    if !spaced && !bare_allowed {
        return wrong;
    }
    for flag in bare_flags(&prose) {
        if FOREIGN.contains(&flag.as_str()) {
            continue;
        }
        let on: Vec<bool> = commands.iter().map(|c| has_flag(c, &flag)).collect();
        let ok = match need {
            Need::All => on.iter().all(|&b| b),
            Need::Any => on.iter().any(|&b| b),
        };
        if !ok {
            let missing: Vec<String> = commands
                .iter()
                .zip(&on)
                .filter(|(_, b)| !**b)
                .map(|(c, _)| c.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(" "))
                .collect();
            wrong.push(format!(
                "--{flag} is not a flag of `frugal {}`",
                missing.join("`, `frugal ")
            ));
        }
    }
    wrong
}

#[test]
fn every_flag_a_message_suggests_parses_on_the_command_that_prints_it() {
    let dir = crates_dir();
    let every: Vec<Vec<String>> = leaf_commands();
    let mut rows: Vec<Row> = sources()
        .into_iter()
        .map(|(files, commands, need)| {
            let commands = commands
                .iter()
                .map(|c| c.iter().map(|s| (*s).to_owned()).collect())
                .collect();
            (files, commands, need)
        })
        .collect();
    // Every command is in the table, so a new one's messages are read too.
    for leaf in &every {
        assert!(
            rows.iter().any(|(_, c, _)| c.contains(leaf)),
            "`frugal {}` has no row",
            leaf.join(" ")
        );
    }
    rows.push((EVERY.to_vec(), every, Need::All));
    let mut wrong = Vec::new();
    let mut flags_seen = 0;
    for (files, commands, need) in &rows {
        for spec in files {
            let (file, without) = spec.split_once('!').unwrap_or((spec, ""));
            let path = dir.join(file);
            let source = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let source = without_fn(&source, without);
            // The CLI's own files name flags in bare literals (`seconds("--poll", ..)`);
            // a library's literal without a space builds a command line, not a message.
            let bare_allowed = file.starts_with("frugal/");
            for (line, literal) in literals(&source) {
                flags_seen += bare_flags(&literal).len();
                for w in check_literal(&literal, commands, *need, bare_allowed) {
                    wrong.push(format!("{file}:{line}: {w}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(flags_seen > 50, "the scan found only {flags_seen} flags");
}

#[test]
fn the_scan_catches_a_flag_the_command_lacks() {
    // The message `batch run` printed before issue 32 was fixed, on a command without it.
    let literal = "no embedding model in {}: run `scripts/fetch-models.sh minilm`, pass --embedder DIR, or --no-semantic-cache";
    let wrong = check_literal(literal, &[vec!["train"]], Need::All, false);
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    let printers = [SERVE.to_vec(), BATCH.to_vec()];
    assert!(check_literal(literal, &printers, Need::All, false).is_empty());
    let quoted = "`frugal plan --workload chat --instance g5.xlarge --fit 30x`";
    assert_eq!(
        check_literal::<&str>(quoted, &[], Need::All, false).len(),
        1
    );
    let (line, text) = literals("let a = 1;\n// \"--nope\"\nbail!(\"x {} --scale y\", '\"');")
        .pop()
        .unwrap();
    assert_eq!((line, bare_flags(&text)), (3, vec!["scale".to_owned()]));
}
