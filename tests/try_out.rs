//! The try-out (scripts/try.sh) runs the whole loop and says what happened.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::demo::Demo;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_try_out_restarts_a_container_and_a_workload_and_says_what_happened() {
    support::init_logging();
    let dir = std::env::temp_dir().join(format!("crr-try-test-{}", std::process::id()));
    let demo = Demo::start(std::path::Path::new(env!("CARGO_BIN_EXE_crr-proxy")), &dir)
        .await
        .unwrap();
    let mut out = Vec::new();
    let shown = demo.show(&mut out).await;
    let out = String::from_utf8(out).unwrap();
    eprintln!("{out}");
    shown.unwrap();
    for line in [
        "$ crr-proxy restart demo -c app --wait",
        "event Killing: Stopping container app by ContainerRecreateRequest demo-restart-",
        ": succeeded in ",
        "(exit status 0)",
        "What happened to Pod demo (read back from the API server)",
        "CRR per-container states: app: Succeeded",
        "$ crr-proxy restart deployment/web -c app --max-unavailable 2",
        "restarting app in 3 Pods of deployment/web, at most 2 at a time",
        "deployment/web: 3 restarted, 0 skipped, 0 failed",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    // The app was restarted once, lastState from crr-proxy's reason edit;
    // the sidecar was left alone.
    let app = out
        .lines()
        .find(|l| l.trim_start().starts_with("app "))
        .unwrap();
    assert!(app.contains("  0 -> 1  ContainerRecreateRequest"), "{app}");
    let (before, after) = app.split_once(" -> ").unwrap();
    assert_ne!(
        before.split_whitespace().nth(1),
        after.split_whitespace().next(),
        "{app}"
    );
    let sidecar = out
        .lines()
        .find(|l| l.trim_start().starts_with("sidecar "))
        .unwrap();
    assert!(sidecar.contains("  0 -> 0  -"), "{sidecar}");
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}
