use std::process::ExitCode;

use anyhow::Context;
use crr_proxy::config::Command;
use tokio::signal::unix::{SignalKind, signal};

/// Exit status for a configuration the user has to fix (as clap's own).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match crr_proxy::config::parse(std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(crr_proxy::config::ParseError::Clap(error)) => error.exit(),
        Err(error) => {
            eprintln!("crr-proxy: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match cli.command {
        Command::Check(args) => {
            let config = match args.run.validate() {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("crr-proxy: {error}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let report = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|runtime| {
                    runtime.block_on(async {
                        if args.before_switch {
                            crr_proxy::check::before_switch(&config).await
                        } else {
                            crr_proxy::check::run(&config, &args.run.kubelet_config).await
                        }
                    })
                });
            match report {
                Ok(report) => {
                    print!("{report}");
                    if report.failed() {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(error) => {
                    eprintln!("crr-proxy: start the async runtime: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Restart(args) => restart(&args),
        Command::Crd => match crr_proxy::crr::crd_manifest() {
            Ok(manifest) => {
                print!("{manifest}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("crr-proxy: render the CRD: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Manifests(args) => match args.lease.lease().and_then(|lease| {
            Ok(crr_proxy::manifests::render(
                args.agent.overlay(),
                &lease,
                args.identity.identity(),
            )?)
        }) {
            Ok(rendered) => {
                print!("{rendered}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("crr-proxy: {error}");
                ExitCode::from(EXIT_USAGE)
            }
        },
        Command::Run(args) => {
            crr_proxy::telemetry::init(args.log_format);
            let config = match args.validate() {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("crr-proxy: {error}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            match serve(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("crr-proxy: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `restart`: exit 0 only when everything asked for succeeded; 1 on an
/// error or a failed restart; 130 when Ctrl-C stopped the following.
fn restart(args: &crr_proxy::config::RestartArgs) -> ExitCode {
    use crr_proxy::restart::Ended;
    use std::io::IsTerminal;
    let stdout_terminal = std::io::stdout().is_terminal();
    // Progress goes to stdout, or to stderr when stdout holds the object.
    let live = if args.output.is_some() {
        std::io::stderr().is_terminal()
    } else {
        stdout_terminal
    };
    let options = args.options(stdout_terminal, live);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("crr-proxy: start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let ended = runtime.block_on(async {
        // With -o, stdout holds the object alone.
        let progress: &mut (dyn std::io::Write + Send) = if options.output.is_some() {
            &mut err
        } else {
            &mut std::io::stdout()
        };
        crr_proxy::restart::run(&options, &mut out, progress).await
    });
    match ended {
        Ok(Ended::Done) => ExitCode::SUCCESS,
        Ok(Ended::Failed(_)) => ExitCode::FAILURE,
        Ok(Ended::Interrupted) => ExitCode::from(130),
        Err(error) => {
            eprintln!("error: {:#}", anyhow::Error::new(error));
            ExitCode::FAILURE
        }
    }
}

fn serve(config: crr_proxy::RunConfig) -> anyhow::Result<()> {
    // One thread: a passthrough call is a few microseconds of work, and
    // handing frames between worker threads (futex wake-ups) cost more
    // latency than it bought in the latency benchmark (benches/latency.rs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async {
        let shutdown = shutdown_signal().context("install signal handlers")?;
        crr_proxy::run(config, shutdown).await.context("serve")
    })
}

/// Resolves on the first SIGTERM or SIGINT.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}
