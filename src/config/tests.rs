use super::*;

fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
    let mut argv = vec!["crr-proxy", "run"];
    argv.extend_from_slice(args);
    Cli::try_parse_from(argv).map(|cli| match cli.command {
        Command::Run(run) => run,
        other => panic!("parsed `run` as {other:?}"),
    })
}

#[test]
fn defaults_match_the_documented_paths() {
    let run = parse(&[]).unwrap();
    assert_eq!(run.listen, PathBuf::from("/run/crr-proxy/crr-proxy.sock"));
    assert_eq!(
        run.runtime_endpoint.to_string(),
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(run.agent, AgentMode::Off);
    assert_eq!(run.log_format, LogFormat::Text);
    let config = run.validate().unwrap();
    assert!(config.routes.image.is_none());
}

#[test]
fn restart_waits_on_a_terminal_unless_told() {
    let wait = |args: &[&str], terminal: bool| {
        let mut argv = vec!["crr-proxy", "restart", "web-0", "-c", "app"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Restart(restart) => restart.options(terminal, false).wait,
            other => panic!("parsed `restart` as {other:?}"),
        }
    };
    assert!(wait(&[], true));
    assert!(!wait(&[], false));
    assert!(!wait(&["--no-wait"], true));
    assert!(wait(&["--wait"], false));
    assert!(wait(&["--no-wait", "--wait"], false), "the last one wins");
    assert!(!wait(&["--wait=false"], true), "kubectl's spelling");
    assert!(wait(&["--wait=true"], false));
    assert!(!wait(&["--wait", "--no-wait"], true));
}

#[test]
fn the_lease_defaults_and_its_timing_is_checked() {
    let agent = |args: &[&str]| {
        let mut all = vec!["--agent", "standalone", "--node-name", "node-a"];
        all.extend_from_slice(args);
        parse(&all)
            .unwrap()
            .validate()
            .map(|c| c.agent.unwrap().lease)
    };
    assert_eq!(agent(&[]).unwrap(), crate::agent::LeaseSettings::default());
    let lease = agent(&[
        "--lease-name",
        "crr",
        "--lease-namespace",
        "ops",
        "--lease-duration",
        "1m",
        "--lease-renew-period",
        "1500ms",
    ])
    .unwrap();
    assert_eq!(
        (lease.name.as_str(), lease.namespace.as_str()),
        ("crr", "ops")
    );
    assert_eq!(lease.duration, std::time::Duration::from_secs(60));
    assert_eq!(lease.renew_period, std::time::Duration::from_millis(1500));
    for (duration, renew) in [("5s", "5s"), ("5s", "10s"), ("500ms", "100ms"), ("5s", "0")] {
        assert!(
            matches!(
                agent(&["--lease-duration", duration, "--lease-renew-period", renew]),
                Err(ConfigError::LeaseTiming { .. })
            ),
            "{duration} {renew}"
        );
    }
    for bad in ["", "s", "-1s", "1.5x", "5 parsecs", "1s2"] {
        assert!(parse(&["--lease-duration", bad]).is_err(), "{bad:?}");
    }
    // As kubectl writes them, and the old spellings.
    for (text, seconds) in [
        ("15", 15.0),
        ("15s", 15.0),
        ("1.5s", 1.5),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1h30m", 5400.0),
        ("1m30s", 90.0),
        ("2 mins", 120.0),
    ] {
        let parsed: Seconds = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(parsed.0.as_secs_f64(), seconds, "{text}");
    }
}

#[test]
fn metrics_are_on_loopback_unless_moved_or_off() {
    let config = parse(&[]).unwrap().validate().unwrap();
    assert_eq!(
        config.metrics_addr,
        Some("127.0.0.1:10221".parse().unwrap())
    );
    let config = parse(&["--metrics-addr", "off"])
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(config.metrics_addr, None);
    let config = parse(&["--metrics-addr", "[::1]:9"])
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(config.metrics_addr, Some("[::1]:9".parse().unwrap()));
    assert!(parse(&["--metrics-addr", "nowhere"]).is_err());
}

#[test]
fn the_reason_rewrite_keeps_its_record_in_the_state_dir_unless_off() {
    let config = parse(&[]).unwrap().validate().unwrap();
    assert_eq!(
        config.recreated_file,
        Some(PathBuf::from("/var/lib/crr-proxy/recreated"))
    );
    let config = parse(&["--state-dir", "/tmp/s"])
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(
        config.recreated_file,
        Some(PathBuf::from("/tmp/s/recreated"))
    );
    let config = parse(&["--reason-rewrite", "false"])
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(config.recreated_file, None);
    assert!(parse(&["--reason-rewrite", "maybe"]).is_err());
}

#[test]
fn image_endpoint_routes_separately_unless_identical() {
    let run = parse(&[
        "--runtime-endpoint",
        "unix:///a.sock",
        "--image-endpoint",
        "unix:///b.sock",
    ])
    .unwrap();
    assert_eq!(
        run.validate().unwrap().routes.image.unwrap().to_string(),
        "unix:///b.sock"
    );
    let same = parse(&[
        "--runtime-endpoint",
        "/a.sock",
        "--image-endpoint",
        "unix:///a.sock",
    ])
    .unwrap();
    assert!(same.validate().unwrap().routes.image.is_none());
}

#[test]
fn agent_modes_parse() {
    let run = parse(&["--agent", "standalone", "--node-name", "n"]).unwrap();
    assert_eq!(
        run.validate().unwrap().agent.unwrap().mode,
        crate::agent::Mode::Standalone
    );
    let err = parse(&["--agent", "bogus"]).unwrap_err();
    assert!(
        err.to_string()
            .contains("possible values: off, kruise, standalone"),
        "{err}"
    );
}

#[test]
fn kruise_mode_takes_the_node_name_or_the_host_name() {
    let run = parse(&["--agent", "kruise", "--node-name", "node-7"]).unwrap();
    let agent = run.validate().unwrap().agent.unwrap();
    assert_eq!(agent.node_name, "node-7");
    assert!(agent.kubeconfig.is_none());
    let run = parse(&["--agent", "kruise"]).unwrap();
    assert_eq!(
        run.validate().unwrap().agent.unwrap().node_name,
        host_name().unwrap()
    );
    assert!(parse(&[]).unwrap().validate().unwrap().agent.is_none());
}

fn settings_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "crr-proxy-config-{}-{name}.toml",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap();
    path
}

fn run_from(argv: &[&str]) -> Result<RunArgs, ParseError> {
    super::parse(argv.iter().map(Into::into).collect()).map(|cli| match cli.command {
        Command::Run(run) => run,
        other => panic!("not run: {other:?}"),
    })
}

#[test]
fn the_settings_file_fills_what_flags_leave_unset() {
    let file = settings_file(
        "fill",
        "listen = \"/tmp/from-file.sock\"\nruntime-endpoint = \"unix:///file.sock\"\nagent = \"kruise\"\n",
    );
    let run = run_from(&[
        "crr-proxy",
        "run",
        "--config",
        file.to_str().unwrap(),
        "--listen",
        "/tmp/flag.sock",
    ])
    .unwrap();
    assert_eq!(
        run.listen,
        PathBuf::from("/tmp/flag.sock"),
        "a flag wins over the file"
    );
    assert_eq!(run.runtime_endpoint.to_string(), "unix:///file.sock");
    assert_eq!(run.agent, AgentMode::Kruise);
    let _ = std::fs::remove_file(file);
}

#[test]
fn check_takes_the_services_environment_file_below_flags_and_above_the_settings_file() {
    let env = settings_file(
        "env",
        "# as install.sh writes it\nCRR_PROXY_AGENT=standalone\nCRR_PROXY_AGENT=kruise\n; a comment\n\
         CRR_PROXY_KUBECONFIG=\"/etc/crr-proxy/kubeconfig\"\nCRR_PROXY_NODE_NAME='node-a'\n\
         CRR_PROXY_LOG_FORMAT=json\nCRR_PROXY_LISTEN=/tmp/env.sock\nnot a setting\n",
    );
    let toml = settings_file(
        "env-toml",
        "node-name = \"from-toml\"\nmetrics-addr = \"off\"\n",
    );
    let cli = super::parse(
        [
            "crr-proxy",
            "check",
            "--env-file",
            env.to_str().unwrap(),
            "--config",
            toml.to_str().unwrap(),
            "--listen",
            "/tmp/flag.sock",
        ]
        .iter()
        .map(Into::into)
        .collect(),
    )
    .unwrap();
    let Command::Check(check) = cli.command else {
        panic!("not check: {:?}", cli.command);
    };
    let run = check.run;
    assert_eq!(run.agent, AgentMode::Kruise);
    assert_eq!(
        run.kubeconfig,
        Some(PathBuf::from("/etc/crr-proxy/kubeconfig"))
    );
    assert_eq!(
        run.node_name.as_deref(),
        Some("node-a"),
        "the env file wins over --config"
    );
    assert_eq!(
        run.listen,
        PathBuf::from("/tmp/flag.sock"),
        "a flag wins over the env file"
    );
    assert_eq!(
        run.metrics_addr.0, None,
        "the settings file still fills the rest"
    );

    // A file named that is not there is an error; `run` has no such flag.
    let missing = super::parse(
        [
            "crr-proxy",
            "check",
            "--env-file",
            "/nonexistent/crr-proxy.env",
        ]
        .iter()
        .map(Into::into)
        .collect(),
    );
    assert!(
        matches!(&missing, Err(ParseError::Config(e)) if e.to_string().contains("/nonexistent/crr-proxy.env")),
        "{missing:?}"
    );
    assert!(run_from(&["crr-proxy", "run", "--env-file", "/x"]).is_err());
    let _ = std::fs::remove_file(env);
    let _ = std::fs::remove_file(toml);
}

#[test]
fn settings_file_errors_are_clear() {
    let file = settings_file("unknown", "no-such-setting = 1\n");
    let err = run_from(&["crr-proxy", "run", "--config", file.to_str().unwrap()]).unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown setting \"no-such-setting\""),
        "{err}"
    );
    let _ = std::fs::remove_file(&file);
    let err = run_from(&["crr-proxy", "run", "--config", "/nonexistent/crr.toml"]).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/crr.toml"), "{err}");
    // The default file may be absent.
    assert!(
        run_from(&["crr-proxy", "run"]).is_ok()
            || std::path::Path::new(DEFAULT_CONFIG_FILE).exists()
    );
}

#[test]
fn bad_endpoints_are_rejected_at_parse_time() {
    let err = parse(&["--runtime-endpoint", "tcp://1.2.3.4:5"]).unwrap_err();
    assert!(err.to_string().contains("only unix://"), "{err}");
}
