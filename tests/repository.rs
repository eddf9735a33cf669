//! What the repository itself holds: scripts that take package mirrors
//! from the machine's own configuration, no file naming a package
//! registry's host, the license Cargo.toml names, and docs that agree
//! with the command line.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `_debian_mirror` of `scripts/lib/sid.sh` over an apt folder.
fn debian_mirror(apt: &Path, codename: &str) -> (bool, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/lib/sid.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source '{script}' && _debian_mirror \"$0\" \"$1\""))
        .arg(apt)
        .arg(codename)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// A fresh apt folder holding `files` (paths relative to it).
fn apt_folder(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crr-scripts-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sources.list.d")).unwrap();
    for (path, text) in files {
        std::fs::write(dir.join(path), text).unwrap();
    }
    dir
}

#[test]
fn containerd2_takes_the_mirror_from_the_machines_apt_sources() {
    // One-line style with options, a deb-src line before it.
    let one_line = apt_folder(
        "one-line",
        &[(
            "sources.list",
            "# the mirror\ndeb-src http://src.invalid/debian bookworm main\n\
         deb [arch=amd64 signed-by=/k.gpg] http://one.invalid/debian/ bookworm main contrib\n",
        )],
    );
    assert_eq!(
        debian_mirror(&one_line, "bookworm"),
        (true, "http://one.invalid/debian".into())
    );
    // deb822, the security archive first, no blank line at the end.
    let deb822 = apt_folder(
        "deb822",
        &[(
            "sources.list.d/debian.sources",
            "Types: deb\nURIs: http://security.invalid/debian-security\nSuites: bookworm-security\n\
         Components: main\n\nTypes: deb deb-src\nURIs: http://two.invalid/debian\n\
         Suites: bookworm bookworm-updates\nComponents: main",
        )],
    );
    assert_eq!(
        debian_mirror(&deb822, "bookworm"),
        (true, "http://two.invalid/debian".into())
    );
    // A source of another release, or a disabled file, is no answer.
    let none = apt_folder(
        "none",
        &[
            (
                "sources.list",
                "deb http://old.invalid/debian bullseye main\n",
            ),
            (
                "sources.list.d/x.sources.disabled",
                "Types: deb\nURIs: http://off.invalid/debian\nSuites: bookworm\n",
            ),
        ],
    );
    assert_eq!(debian_mirror(&none, "bookworm").1, "");
}

#[test]
fn no_tracked_file_names_a_package_registrys_host() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("git")
        .args(["-C", root, "ls-files", "-z"])
        .output()
        .unwrap();
    assert!(out.status.success(), "git ls-files failed");
    let hosts = [
        "deb.debian.org",
        "security.debian.org",
        "archive.ubuntu.com",
        "pypi.org",
        "files.pythonhosted.org",
        "static.crates.io",
        "index.crates.io",
        "docker.io",
        "ghcr.io",
        "quay.io",
        "registry.k8s.io",
        // The Go module proxy, which builds the real Kubernetes, OpenKruise
        // and containerd: the go command takes it from the machine's GOPROXY.
        "proxy.golang.org",
        "sum.golang.org",
    ];
    let mut found = Vec::new();
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name);
        // cargo's lock files name their source by its fixed id, not a mirror.
        if name.ends_with("Cargo.lock") || name == "tests/repository.rs" {
            continue;
        }
        let Ok(text) = std::fs::read(Path::new(root).join(&*name)) else {
            continue;
        };
        let text = String::from_utf8_lossy(&text);
        for host in hosts.iter().filter(|h| text.contains(*h)) {
            found.push(format!("{name}: {host}"));
        }
    }
    assert!(found.is_empty(), "registry hosts named: {found:?}");
}

#[test]
fn the_license_file_holds_the_license_cargo_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("license = \"Apache-2.0\""),
        "Cargo.toml's license changed"
    );
    let license = std::fs::read_to_string(root.join("LICENSE")).unwrap();
    let head: Vec<&str> = license
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(2)
        .collect();
    assert_eq!(head, ["Apache License", "Version 2.0, January 2004"]);
    assert!(
        license.contains("END OF TERMS AND CONDITIONS"),
        "the license text is cut short"
    );
}

/// docs/configuration.md's table and `crr-proxy run --help` name the same
/// flags, each with the same variable and, where the flag has a plain
/// default value, the same default.
#[test]
fn the_configuration_table_agrees_with_the_command_lines_help() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    // "--flag <VALUE>" then its description: "... [env: VAR=] [default: X]".
    let mut flags = BTreeMap::new();
    let mut lines = help.lines();
    while let Some(line) = lines.next() {
        let Some(flag) = line.trim().strip_prefix("--") else {
            continue;
        };
        let name = flag.split_whitespace().next().unwrap().to_owned();
        let about = lines.next().unwrap_or_default();
        let env = about
            .split_once("[env: ")
            .map(|(_, rest)| rest.split('=').next().unwrap().to_owned());
        // A default after the variable is clap's own value; one before it is
        // a sentence written for the help.
        let default = about
            .split_once("[env: ")
            .and_then(|(_, rest)| rest.split_once("[default: "))
            .map(|(_, rest)| rest.split(']').next().unwrap().to_owned());
        flags.insert(name, (env, default));
    }
    assert!(flags.len() > 10, "{help}");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let mut table = BTreeMap::new();
    for row in text.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let name = cells[0]
            .trim_start_matches("| `--")
            .split([' ', '`'])
            .next()
            .unwrap();
        let env = cells[1].trim_matches('`').to_owned();
        table.insert(name.to_owned(), (env, cells[2].to_owned()));
    }
    assert_eq!(
        flags.keys().collect::<Vec<_>>(),
        table.keys().collect::<Vec<_>>(),
        "flags in --help vs docs/configuration.md"
    );
    for (name, (env, default)) in &flags {
        let (doc_env, doc_default) = &table[name];
        assert_eq!(
            env.as_deref(),
            Some(doc_env.as_str()),
            "--{name}'s variable"
        );
        if let Some(default) = default {
            assert_eq!(doc_default, &format!("`{default}`"), "--{name}'s default");
        }
    }
}

/// docs/operating.md's scrape configuration is YAML of Prometheus's shape,
/// and its Metrics list names every metric crr-proxy exports (the shipped
/// rules and dashboard are tests/monitoring.rs's).
#[test]
fn the_monitoring_docs_name_the_metrics_crr_proxy_exports() {
    let exported: Vec<String> = crr_proxy::metrics::Metrics::default()
        .render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert!(exported.len() > 15, "{exported:?}");
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md")).unwrap();
    let (listed, monitoring) = text.split_once("## Monitoring").unwrap();
    for name in &exported {
        assert!(
            listed.contains(&format!("`{name}")),
            "{name} is not in the Metrics list"
        );
    }
    let blocks: Vec<&str> = monitoring
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(blocks.len(), 1);
    let scrape: serde_json::Value = serde_saphyr::from_str(blocks[0]).unwrap();
    assert_eq!(
        scrape["scrape_configs"][0]["static_configs"][0]["targets"][0],
        "127.0.0.1:10221"
    );
    assert_eq!(scrape["scrape_configs"][0]["job_name"], "crr-proxy");
}

/// Every `.rs` file under `dir`, unit tests kept in a `tests.rs` aside.
fn source_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !is_tests(&path) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `file`'s code outside comments and its `#[cfg(test)]` module.
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first name of each path `code` takes through `prefix` (`crate::`,
/// `super::`): `prefix` `x::...`, and each first name of `prefix`
/// `{x, y::{z}}`. A `super::` after another is the grandparent's, and not
/// counted.
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let rest = &code[i + prefix.len()..];
        if code[..i].ends_with("super::") || rest.starts_with("super::") {
            continue;
        }
        let Some(list) = rest.strip_prefix('{') else {
            names.push(identifier(rest));
            continue;
        };
        let (mut depth, mut start) = (0, true);
        for (j, c) in list.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => start = true,
                c if start && (c.is_alphanumeric() || c == '_') => {
                    names.push(identifier(&list[j..]));
                    start = false;
                }
                _ => {}
            }
        }
    }
    names
}

/// Which of `src/`'s top-level modules each one uses (`crate::x`), read
/// from the code outside comments and test modules; `main` and `lib` (the
/// edges, which may use anything) are left out.
fn module_uses() -> BTreeMap<String, Vec<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut uses: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in source_files(&src) {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap();
        let top = first.as_os_str().to_str().unwrap().trim_end_matches(".rs");
        if matches!(top, "main" | "lib" | "fuzzing") {
            continue;
        }
        let names = names_after(&code_of(&file), "crate::");
        let entry = uses.entry(top.to_owned()).or_default();
        entry.extend(names.into_iter().filter(|n| n != top && !n.is_empty()));
    }
    let modules: Vec<String> = uses.keys().cloned().collect();
    for used in uses.values_mut() {
        used.retain(|m| modules.contains(m));
        used.sort();
        used.dedup();
    }
    uses
}

/// A module's unit tests kept beside it (`relay/tests.rs`): test code, as
/// an inline `#[cfg(test)]` module is.
fn is_tests(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
}

/// The identifier `text` begins with.
fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The modules on a cycle of `uses`, if any (a depth-first search).
fn a_cycle(uses: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        uses: &BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if done.iter().any(|m| m == module) {
            return None;
        }
        path.push(module.to_owned());
        for used in uses.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(used, uses, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.push(module.to_owned());
        None
    }
    let mut done = Vec::new();
    uses.keys()
        .find_map(|m| visit(m, uses, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_use_each_other_without_a_cycle_and_only_the_edges_use_the_command_line() {
    let uses = module_uses();
    // The reading finds what it should: the command line uses the agent,
    // and the agent the kill engine.
    assert!(uses["config"].contains(&"agent".to_owned()), "{uses:?}");
    assert!(uses["agent"].contains(&"kill".to_owned()), "{uses:?}");
    assert_eq!(a_cycle(&uses), None, "{uses:#?}");
    let below: Vec<&String> = uses
        .iter()
        .filter(|(_, used)| used.contains(&"config".to_owned()))
        .map(|(module, _)| module)
        .collect();
    assert!(
        below.is_empty(),
        "modules that use the command line: {below:?}"
    );
    // The search itself finds a cycle where there is one.
    let looped = BTreeMap::from([
        ("a".to_owned(), vec!["b".to_owned()]),
        ("b".to_owned(), vec!["a".to_owned()]),
    ]);
    assert_eq!(
        a_cycle(&looped),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
}

/// docs/development.md's layout names every file under `src/` (unit tests
/// kept in a `tests.rs` aside), by its path below `src/` (`agent/claim.rs`),
/// as a word of the layout's `src/` block.
#[test]
fn the_layout_doc_names_every_source_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/development.md")).unwrap();
    let layout = doc
        .split_once("## Layout of the source")
        .and_then(|(_, rest)| rest.split_once("\nsrc/ "))
        .and_then(|(_, rest)| rest.split_once("\nproto/"))
        .map(|(block, _)| block)
        .expect("docs/development.md has a layout block from src/ to proto/");
    let words: std::collections::BTreeSet<&str> = layout
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')' | ':'))
        .filter(|w| !w.is_empty())
        .collect();
    let src = root.join("src");
    let files: Vec<String> = source_files(&src)
        .iter()
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    let unnamed: Vec<&String> = files
        .iter()
        .filter(|f| !words.contains(f.as_str()))
        .collect();
    assert!(
        unnamed.is_empty(),
        "docs/development.md's layout does not name {unnamed:?}"
    );
    assert!(files.len() > 60, "{files:?}");
}

/// Which sibling modules each file of the folder `dir` (below `src/`) uses
/// through `super::x`, read from the code outside comments and test
/// modules. A file's siblings are the other files and folders beside it.
fn sibling_uses(dir: &Path) -> BTreeMap<String, Vec<String>> {
    let mut siblings = Vec::new();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if path.is_dir() {
            siblings.push(name);
        } else if path.extension().is_some_and(|e| e == "rs") && !is_tests(&path) {
            siblings.push(name);
            files.push(path);
        }
    }
    let mut uses = BTreeMap::new();
    for file in files {
        let me = file.file_stem().unwrap().to_str().unwrap().to_owned();
        let mut names = names_after(&code_of(&file), "super::");
        names.retain(|n| *n != me && siblings.contains(n));
        names.sort();
        names.dedup();
        uses.insert(me, names);
    }
    uses
}

/// One level down: in every folder of `src/` (the agent's parts, the
/// relay's, the kill engine's...), the files beside each other use each
/// other without a cycle.
#[test]
fn the_modules_of_each_folder_use_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![src.clone()];
    let mut seen = BTreeMap::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            }
        }
        if dir == src {
            continue;
        }
        let uses = sibling_uses(&dir);
        let name = dir.strip_prefix(&src).unwrap().display().to_string();
        assert_eq!(a_cycle(&uses), None, "src/{name}: {uses:#?}");
        seen.insert(name, uses);
    }
    // The reading finds what it should.
    assert!(
        seen["agent"]["manager"].contains(&"standalone".to_owned()),
        "{seen:#?}"
    );
    assert!(
        seen["proxy/relay"]["answers"].contains(&"streams".to_owned()),
        "{seen:#?}"
    );
}

/// The functions `file` declares at its top level (not methods), outside
/// comments and its test module.
fn top_level_functions(file: &Path) -> Vec<String> {
    code_of(file)
        .lines()
        .filter_map(|line| {
            let line = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub(super) "))
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            let line = line.strip_prefix("async ").unwrap_or(line);
            line.strip_prefix("fn ").map(identifier)
        })
        .collect()
}

/// For each folder of `src/` beside a file of its name (`agent/` and
/// `agent.rs`), the names each file in the folder takes from that parent
/// file through `super::` (siblings aside), as "file: name".
fn taken_from_parent(src: &Path) -> BTreeMap<String, Vec<String>> {
    let mut taken = BTreeMap::new();
    for parent in source_files(src) {
        let dir = parent.with_extension("");
        if !dir.is_dir() {
            continue;
        }
        let siblings: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| p.file_stem().unwrap().to_str().unwrap().to_owned())
            .collect();
        let mut names = Vec::new();
        for child in std::fs::read_dir(&dir).unwrap() {
            let child = child.unwrap().path();
            if child.extension().is_none_or(|e| e != "rs") || is_tests(&child) {
                continue;
            }
            let me = child.file_stem().unwrap().to_str().unwrap().to_owned();
            names.extend(
                names_after(&code_of(&child), "super::")
                    .into_iter()
                    .filter(|n| !n.is_empty() && !siblings.contains(n))
                    .map(|n| format!("{me}: {n}")),
            );
        }
        names.sort();
        names.dedup();
        let name = dir.strip_prefix(src).unwrap().display().to_string();
        taken.insert(name, names);
    }
    taken
}

/// A folder's files take their parent's vocabulary (its types, constants
/// and errors) but never its functions: those are the parent's own work
/// (`agent.rs` starts the agent, `relay.rs` runs a connection), and a
/// child that calls back into them is a circle through the parent.
#[test]
fn a_folders_files_call_no_function_of_their_parent() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let taken = taken_from_parent(&src);
    let mut calls = Vec::new();
    for (dir, names) in &taken {
        let functions = top_level_functions(&src.join(format!("{dir}.rs")));
        calls.extend(
            names
                .iter()
                .filter(|n| {
                    n.split_once(": ")
                        .is_some_and(|(_, n)| functions.contains(&n.to_owned()))
                })
                .map(|n| format!("{dir}/{n}")),
        );
    }
    assert!(calls.is_empty(), "children calling their parent: {calls:?}");
    // The reading finds what it should: a type taken from the parent, and
    // the parent's functions.
    assert!(
        taken["restart"].contains(&"workload: Options".to_owned()),
        "{taken:#?}"
    );
    let agent = top_level_functions(&src.join("agent.rs"));
    assert!(
        agent.contains(&"spawn".to_owned()) && agent.contains(&"run".to_owned()),
        "{agent:?}"
    );
}
